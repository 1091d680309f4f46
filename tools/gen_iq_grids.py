#!/usr/bin/env python3
"""Writes src/format/iq_grids.h, the i-quant lookup grids, from the tables the installed `gguf` package carries.

The grids are format constants: a byte of an IQ block is an index into one of them, so they must be exactly the
ones ggml uses. The `gguf` package (PyPI) ships them as packed hex strings (`grid_hex`, `grid_map`); this script
unpacks them with the package's own `init_grid()` and writes them in ggml's usual in-memory form:

  iq2xxs / iq2xs / iq2s grids: uint64, byte j = magnitude of element j (8, 25 or 43)
  iq3xxs / iq3s grids:         uint32, byte j = magnitude of element j
  iq1s grid:                   uint64, byte j = element j as int8 (-1, 0 or 1)
  ksigns_iq2xs:                uint8[128], the 7-bit sign index with the parity bit added as bit 7

Usage: tools/gen_iq_grids.py [--check]   (--check: exit 1 if the committed file differs from what would be written)
"""
import argparse
import importlib.metadata
import pathlib
import sys

import numpy as np
from gguf import quants

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "format" / "iq_grids.h"

# (C name, gguf class, bytes per entry as stored, whether values are signed int8)
GRIDS = [
    ("iq2xxs_grid", quants.IQ2_XXS, 8, False),
    ("iq2xs_grid", quants.IQ2_XS, 8, False),
    ("iq2s_grid", quants.IQ2_S, 8, False),
    ("iq3xxs_grid", quants.IQ3_XXS, 4, False),
    ("iq3s_grid", quants.IQ3_S, 4, False),
    ("iq1s_grid", quants.IQ1_S, 8, True),
]


def licence_line() -> str:
    dist = importlib.metadata.distribution("gguf")
    for f in dist.files or []:
        if f.name.upper().startswith("LICENSE"):
            for line in f.read_text().splitlines():
                if line.strip().lower().startswith("copyright"):
                    return line.strip()
    raise SystemExit("gguf package has no LICENSE file with a copyright line")


def grid_entries(cls, entry_bytes: int, signed: bool) -> list[int]:
    cls.init_grid()
    grid = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    assert grid.shape[1] == entry_bytes, cls.__name__
    ints = grid.astype(np.int64)
    assert np.array_equal(ints.astype(np.float32), grid), f"{cls.__name__}: non-integer grid values"
    if signed:
        assert ints.min() >= -128 and ints.max() <= 127
        ints = ints & 0xFF
    else:
        assert ints.min() >= 0 and ints.max() <= 255
    entries = []
    for row in ints:
        v = 0
        for j, b in enumerate(row):
            v |= int(b) << (8 * j)
        entries.append(v)
    return entries


def format_array(ctype: str, name: str, values: list[int], hex_digits: int, per_line: int) -> str:
    lines = [f"inline constexpr {ctype} {name}[{len(values)}] = {{"]
    for i in range(0, len(values), per_line):
        chunk = values[i:i + per_line]
        lines.append("    " + " ".join(f"0x{v:0{hex_digits}x}," for v in chunk))
    lines.append("};")
    return "\n".join(lines)


def render() -> str:
    version = importlib.metadata.version("gguf")
    parts = [
        "// i-quant lookup grids and the IQ2/IQ3 sign table: format constants, indexed by the bytes of IQ blocks.",
        "// Written by tools/gen_iq_grids.py from the tables in the gguf Python package (PyPI) version "
        f"{version};",
        f"// those tables are under the MIT licence, {licence_line()} and the ggml authors.",
        "// Do not edit: rerun tools/gen_iq_grids.py. tests/python/test_iq_grids.py checks this file is current.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        "namespace strata::iq {",
        "",
    ]
    for name, cls, nbytes, signed in GRIDS:
        values = grid_entries(cls, nbytes, signed)
        ctype = "uint64_t" if nbytes == 8 else "uint32_t"
        what = "int8 values -1/0/1" if signed else "magnitudes " + "/".join(str(int(v)) for v in cls.grid_map)
        parts.append(f"// {len(values)} entries of {nbytes} {what}, element j in byte j.")
        parts.append(format_array(ctype, name, values, 2 * nbytes, 5 if nbytes == 8 else 8))
        parts.append("")
    ksigns = list(quants.IQ2_XXS.ksigns)
    assert len(ksigns) == 128
    parts.append("// 7-bit sign index -> 8-bit sign mask (bit j set: element j negative); bit 7 makes the parity even.")
    parts.append(format_array("uint8_t", "ksigns_iq2xs", ksigns, 2, 16))
    parts.append("")
    parts.append("}  // namespace strata::iq")
    return "\n".join(parts) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    ap.add_argument("--stdout", action="store_true", help="print the file instead of writing it")
    args = ap.parse_args()
    text = render()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date: rerun tools/gen_iq_grids.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
