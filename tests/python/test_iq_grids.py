"""The committed i-quant grid table (src/format/iq_grids.h) is exactly what tools/gen_iq_grids.py writes from the
installed gguf package, so a change in either shows up here rather than as wrong IQ weights."""
import pathlib
import re
import subprocess
import sys

import numpy as np
from gguf import quants

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gen_iq_grids.py"
HEADER = ROOT / "src" / "format" / "iq_grids.h"


def test_committed_grids_are_current():
    r = subprocess.run([sys.executable, SCRIPT, "--stdout"], capture_output=True, text=True, check=True)
    assert r.stdout == HEADER.read_text(), "src/format/iq_grids.h is stale: rerun tools/gen_iq_grids.py"


def parse_array(text: str, name: str) -> np.ndarray:
    m = re.search(rf"{name}\[(\d+)\] = \{{(.*?)\}};", text, re.S)
    assert m, name
    values = [int(v, 16) for v in re.findall(r"0x[0-9a-f]+", m.group(2))]
    assert len(values) == int(m.group(1))
    return np.array(values, dtype=np.uint64)


def test_header_decodes_to_gguf_grids():
    """Independently of the script: unpack the header's integers and compare with gguf's float grids."""
    text = HEADER.read_text()
    grids = [("iq2xxs_grid", quants.IQ2_XXS, 8, False), ("iq2xs_grid", quants.IQ2_XS, 8, False),
             ("iq2s_grid", quants.IQ2_S, 8, False), ("iq3xxs_grid", quants.IQ3_XXS, 4, False),
             ("iq3s_grid", quants.IQ3_S, 4, False), ("iq1s_grid", quants.IQ1_S, 8, True)]
    for name, cls, nbytes, signed in grids:
        cls.init_grid()
        want = np.asarray(cls.grid).reshape(cls.grid_shape)
        raw = parse_array(text, name)
        b = ((raw[:, None] >> (8 * np.arange(nbytes, dtype=np.uint64))[None, :]) & 0xFF).astype(np.uint8)
        got = (b.view(np.int8) if signed else b).astype(np.float32)
        assert np.array_equal(got, want), name
    ksigns = parse_array(text, "ksigns_iq2xs").astype(np.uint8)
    assert bytes(ksigns) == quants.IQ2_XXS.ksigns
    # the sign table is the 7-bit index plus an even-parity bit
    idx = np.arange(128, dtype=np.uint8)
    parity = np.unpackbits(idx[:, None], axis=1).sum(axis=1) & 1
    assert np.array_equal(ksigns, idx | (parity.astype(np.uint8) << 7))
