"""Shared pytest fixtures: where the built binaries and the shared test data are."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("STRATA_BUILD_DIR", ROOT / "build"))


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    return _build_dir()


@pytest.fixture(scope="session")
def strata_bin() -> pathlib.Path:
    p = pathlib.Path(os.environ.get("STRATA_BIN", _build_dir() / "bin" / "strata"))
    if not p.exists():
        pytest.fail(f"strata binary not found at {p}: build first (cmake --build build)")
    return p


@pytest.fixture(scope="session")
def tool():
    """Path of a test-only program built from tests/tools/<name>.cpp."""
    def find(name: str) -> pathlib.Path:
        p = _build_dir() / "bin" / name
        if not p.exists():
            pytest.fail(f"test tool {name} not found at {p}: build first")
        return p
    return find


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    p = pathlib.Path(os.environ.get("STRATA_SHARED_DIR", ROOT.parent / "shared")).resolve()
    if not (p / "testdata").is_dir():
        pytest.skip(f"shared test data not found at {p}/testdata (it lives beside the project checkout)")
    return p
