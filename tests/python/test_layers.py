"""The layers of src/ and the one direction of their dependencies (docs/layers.md): every #include of a project header
is checked against what its file's layer may see, so no arrow runs back up. Reads the sources; builds nothing."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

# What each layer may include (its own headers always). backend/cpu and backend/cuda are two implementations of
# backend.h: neither sees the other, and nothing outside them sees their insides (the CUDA backend's public header,
# cuda_backend.h, is how the engine makes one; the CPU backend's is how tests and the engine reach it).
BELOW = {
    "core": set(),
    "format": {"core"},
    "jinja": {"core"},
    "tokenizer": {"core", "format", "jinja"},
    "backend": {"core", "format"},
    "backend/cpu": {"core", "format", "backend"},
    "backend/cuda": {"core", "format", "backend"},
    "model": {"core", "format", "backend"},
    "strata": {"core", "format", "backend", "model"},
    "synth": {"core", "format", "backend", "model"},
    "runtime": {"core", "format", "backend", "backend/cpu", "backend/cuda", "model", "strata"},
    "grammar": {"core", "format", "jinja", "tokenizer", "backend", "model", "strata", "runtime"},
    "server": {"core", "format", "jinja", "tokenizer", "backend", "model", "strata", "runtime", "grammar"},
    "cli": {"core", "format", "jinja", "tokenizer", "backend", "backend/cpu", "backend/cuda", "model", "strata",
            "synth", "runtime", "grammar", "server"},
}
PUBLIC = {"backend/cuda": {"backend/cuda/cuda_backend.h"}, "backend/cpu": {"backend/cpu/cpu_backend.h"}}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(rel: str) -> str:
    parts = rel.split("/")
    if parts[0] == "backend" and len(parts) > 2 and parts[1] in ("cpu", "cuda"):
        return "backend/" + parts[1]
    if parts[0] == "model":
        return "model"
    return parts[0]


def test_every_file_belongs_to_a_layer():
    for f in SRC.rglob("*"):
        if f.suffix in (".h", ".cpp", ".cu", ".cuh"):
            rel = f.relative_to(SRC).as_posix()
            assert layer_of(rel) in BELOW, f"{rel}: in no layer of docs/layers.md"


def test_includes_run_one_way():
    bad = []
    for f in sorted(SRC.rglob("*")):
        if f.suffix not in (".h", ".cpp", ".cu", ".cuh"):
            continue
        rel = f.relative_to(SRC).as_posix()
        mine = layer_of(rel)
        for inc in INCLUDE.findall(f.read_text(encoding="utf-8", errors="replace")):
            if not (SRC / inc).exists():
                continue  # a system or library header
            theirs = layer_of(inc)
            if theirs == mine:
                continue
            if theirs not in BELOW[mine]:
                bad.append(f"{rel} includes {inc} ({mine} may not see {theirs})")
            elif theirs in PUBLIC and inc not in PUBLIC[theirs]:
                bad.append(f"{rel} includes {inc} (inside {theirs}; only {sorted(PUBLIC[theirs])} is public)")
    assert not bad, "\n".join(bad)
