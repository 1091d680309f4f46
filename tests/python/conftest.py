"""Shared pytest fixtures: where the built binaries and the shared test data are."""
import os
import pathlib
import sys

import pytest

# The Python checks multiply small matrices: BLAS worker threads only contend with the build and each other (the golden
# numpy reference ran 20x slower with two threads than with one on a busy 2-core machine). Set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the tools/ packages (tools.golden) import from the project root
    sys.path.insert(0, str(ROOT))


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


@pytest.fixture(scope="session")
def golden_dir(build_dir: pathlib.Path) -> pathlib.Path:
    """The golden GGUF models (tools/golden), regenerated into <build>/golden from the seeded generator: F32, F16, BF16
    and Q8_0 always, the quantized mixes when the manifest records their hashes and $STRATA_BIN can quantize."""
    from tools.golden import generate, manifest

    out = build_dir / "golden"
    data = manifest.load()
    models = list(data["models"])
    generate.generate(out, models, generate.FLOAT_VARIANTS, log=lambda *_: None)
    strata = pathlib.Path(os.environ.get("STRATA_BIN", _build_dir() / "bin" / "strata"))
    for m in models:
        mixes = [v for v in generate.QUANT_VARIANTS if v in data["models"][m].get("files", {})]
        if mixes and strata.is_file():
            generate.generate(out, [m], mixes, strata, log=lambda *_: None)
    return out
