"""Our reference (de)quantizers against the gguf package's numpy code, bit for bit.

Dequantization: random blocks (random bytes, then scale fields overwritten with edge values: zero, negative,
subnormal and largest fp16, inf, NaN, E8M0 extremes) decode to exactly gguf's floats, compared as uint32 bits,
NaN payloads and signs included. Q8_1 and Q8_K, which gguf does not implement, are checked against the two-line
numpy definition written here.

Quantization: on Gaussian, uniform, outlier, scaled, all-zero and constant data, gguf decodes our bytes to exactly
what we decode them to (the bytes are valid and both readers agree), and where gguf has a quantizer our bytes are
gguf's bytes. The documented exceptions are asserted as such, not skipped.
"""
import subprocess

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

N_RANDOM_BLOCKS = 10_000

# Types gguf can dequantize, with the byte offsets of their scale fields (fp16 unless noted).
SCALE_FIELDS = {
    T.Q4_0: [(0, "f16")], T.Q4_1: [(0, "f16"), (2, "f16")], T.Q5_0: [(0, "f16")], T.Q5_1: [(0, "f16"), (2, "f16")],
    T.Q8_0: [(0, "f16")], T.IQ4_NL: [(0, "f16")], T.MXFP4: [(0, "e8m0")],
    T.Q2_K: [(80, "f16"), (82, "f16")], T.Q3_K: [(108, "f16")], T.Q4_K: [(0, "f16"), (2, "f16")],
    T.Q5_K: [(0, "f16"), (2, "f16")], T.Q6_K: [(208, "f16")],
    T.IQ2_XXS: [(0, "f16")], T.IQ2_XS: [(0, "f16")], T.IQ2_S: [(0, "f16")], T.IQ3_XXS: [(0, "f16")],
    T.IQ3_S: [(0, "f16")], T.IQ1_S: [(0, "f16")], T.IQ1_M: [(48, "iq1m")], T.IQ4_XS: [(0, "f16")],
    T.TQ1_0: [(52, "f16")], T.TQ2_0: [(64, "f16")],
    # not in gguf: checked against ref_dequant below
    T.Q8_1: [(0, "f16"), (2, "f16")], T.Q8_K: [(0, "f32")],
}
OUR_BLOCK_BYTES = {T.Q8_1: 36}  # gguf's table still says 40 for Q8_1; the format is 36 bytes

F16_EDGES = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
             0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7DFF]
E8M0_EDGES = [0, 1, 2, 3, 126, 127, 128, 129, 253, 254, 255]
F32_EDGES = [0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x3F800000, 0xBF800000, 0x7F7FFFFF,
             0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001]

QUANT_TYPES_GGUF = [T.BF16, T.F16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.MXFP4, T.TQ1_0, T.TQ2_0]
QUANT_TYPES_OURS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.Q8_1, T.Q8_K,
                    T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M]


def block_bytes(t):
    return OUR_BLOCK_BYTES.get(t, GGML_QUANT_SIZES[t][1])


def block_size(t):
    return GGML_QUANT_SIZES[t][0]


@pytest.fixture(scope="module")
def io(tool, tmp_path_factory):
    exe = tool("quant_io")
    tmp = tmp_path_factory.mktemp("quant")

    class IO:
        def dequant(self, t, blocks: np.ndarray) -> np.ndarray:
            src, dst = tmp / f"{t.name}.bin", tmp / f"{t.name}.f32"
            blocks.astype(np.uint8).tofile(src)
            subprocess.run([exe, "dequant", t.name, src, dst], check=True)
            return np.fromfile(dst, dtype=np.float32)

        def quant(self, t, x: np.ndarray) -> np.ndarray:
            src, dst = tmp / f"{t.name}.f32", tmp / f"{t.name}.q"
            x.astype(np.float32).tofile(src)
            subprocess.run([exe, "quant", t.name, src, dst], check=True)
            return np.fromfile(dst, dtype=np.uint8)

        def run(self, *args):
            return subprocess.run([exe, *map(str, args)], capture_output=True, text=True)

    return IO()


def assert_same_bits(ours: np.ndarray, ref: np.ndarray, t, per_block: int, what: str):
    assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
    a, b = ours.view(np.uint32), ref.view(np.uint32)
    bad = np.nonzero(a != b)[0]
    if bad.size:
        i = bad[0]
        pytest.fail(f"{t.name} {what}: {bad.size} of {a.size} values differ; first at element {i} (block "
                    f"{i // per_block}): ours {ours[i]!r} (0x{a[i]:08x}), reference {ref[i]!r} (0x{b[i]:08x})")


# ---- dequantization ------------------------------------------------------------------------------------------------

def random_blocks(t, rng) -> np.ndarray:
    """N_RANDOM_BLOCKS random blocks, then for every scale field and edge value a run of blocks with that value."""
    nbytes = block_bytes(t)
    blocks = [rng.integers(0, 256, size=(N_RANDOM_BLOCKS, nbytes), dtype=np.uint8)]
    for off, kind in SCALE_FIELDS[t]:
        edges = {"f16": F16_EDGES, "iq1m": F16_EDGES, "e8m0": E8M0_EDGES, "f32": F32_EDGES}[kind]
        for v in edges:
            b = rng.integers(0, 256, size=(32, nbytes), dtype=np.uint8)
            if kind == "f16":
                b[:, off:off + 2] = np.frombuffer(np.uint16(v).tobytes(), np.uint8)
            elif kind == "f32":
                b[:, off:off + 4] = np.frombuffer(np.uint32(v).tobytes(), np.uint8)
            elif kind == "e8m0":
                b[:, off] = v
            else:  # IQ1_M: fp16 d in the top nibbles of four u16 scale words
                w = b[:, off:off + 8].copy().view(np.uint16)
                for k in range(4):
                    w[:, k] = (w[:, k] & 0x0FFF) | (((v >> (4 * k)) & 0xF) << 12)
                b[:, off:off + 8] = w.view(np.uint8)
            blocks.append(b)
    if len(SCALE_FIELDS[t]) == 2:  # d and dmin (or m, or s): every pair of edge values, NaN with NaN included
        (o1, _), (o2, _) = SCALE_FIELDS[t]
        for v1 in F16_EDGES:
            for v2 in F16_EDGES:
                b = rng.integers(0, 256, size=(4, nbytes), dtype=np.uint8)
                b[:, o1:o1 + 2] = np.frombuffer(np.uint16(v1).tobytes(), np.uint8)
                b[:, o2:o2 + 2] = np.frombuffer(np.uint16(v2).tobytes(), np.uint8)
                blocks.append(b)
    return np.concatenate(blocks)


def ref_dequant(t, blocks: np.ndarray) -> np.ndarray:
    if t == T.Q8_1:  # d fp16, s fp16 (unused for values), qs int8[32]
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        return (blocks[:, 4:].view(np.int8).astype(np.float32) * d).reshape(-1)
    if t == T.Q8_K:  # d f32, qs int8[256], bsums (unused for values)
        d = blocks[:, 0:4].copy().view(np.float32)
        return (blocks[:, 4:260].view(np.int8).astype(np.float32) * d).reshape(-1)
    return quants.dequantize(blocks.reshape(-1), t).reshape(-1)


@pytest.mark.parametrize("t", list(SCALE_FIELDS), ids=lambda t: t.name)
def test_dequant_matches_gguf(io, t):
    rng = np.random.default_rng(int(t))
    blocks = random_blocks(t, rng)
    with np.errstate(all="ignore"):
        ref = ref_dequant(t, blocks)
    ours = io.dequant(t, blocks)
    assert_same_bits(ours, ref, t, block_size(t), "dequantize")
    # the edge runs really produced the special values they are there for
    if t not in (T.Q8_K,):
        assert np.isnan(ref).any() and np.isinf(ref).any() or t == T.MXFP4


@pytest.mark.parametrize("t", [T.F16, T.BF16], ids=lambda t: t.name)
def test_dequant_every_half(io, t):
    halves = np.arange(0x10000, dtype=np.uint16).view(np.uint8)
    with np.errstate(all="ignore"):
        ref = quants.dequantize(halves, t).reshape(-1) if t == T.BF16 else \
            halves.view(np.float16).astype(np.float32)
    assert_same_bits(io.dequant(t, halves), ref, t, 1, "dequantize")


def test_dequant_f32_is_identity(io):
    rng = np.random.default_rng(7)
    bits = np.concatenate([rng.integers(0, 2**32, size=N_RANDOM_BLOCKS, dtype=np.uint32),
                           np.array(F32_EDGES, dtype=np.uint32)])
    assert_same_bits(io.dequant(T.F32, bits.view(np.uint8)), bits.view(np.float32), T.F32, 1, "dequantize")


def test_mxfp4_every_exponent(io):
    """Every E8M0 byte with every nibble: the scale decodes like gguf's e8m0_to_fp32_half across the whole range."""
    e = np.repeat(np.arange(256, dtype=np.uint8), 2)
    qs = np.tile(np.array([0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE] * 2, dtype=np.uint8), (512, 1))
    qs[1::2] = qs[1::2, ::-1]
    blocks = np.concatenate([e[:, None], qs], axis=1)
    with np.errstate(over="ignore"):  # e = 255: 12 * 2^127 overflows to inf, in both
        ref = quants.dequantize(blocks.reshape(-1), T.MXFP4).reshape(-1)
    assert_same_bits(io.dequant(T.MXFP4, blocks), ref, T.MXFP4, 32, "dequantize")


# ---- quantization --------------------------------------------------------------------------------------------------

def make_data(n_blocks_256: int, rng) -> dict[str, np.ndarray]:
    """Rows of 256-multiples for every kind of input the quantizers must handle."""
    n = 256 * n_blocks_256
    g = rng.standard_normal(n).astype(np.float32)
    # block scales spread over six decades, so every fp16 scale regime is visited
    scaled = (g.reshape(-1, 32) * (10.0 ** rng.uniform(-3, 3, size=(n // 32, 1)))).astype(np.float32).reshape(-1)
    outliers = g.copy()
    idx = rng.choice(n, size=n // 100, replace=False)
    outliers[idx] *= 40.0
    one_hot = np.zeros(n, np.float32)
    one_hot[::37] = rng.standard_normal(len(one_hot[::37])).astype(np.float32) * 3
    return {
        "gaussian": g,
        "uniform": rng.uniform(-1, 1, n).astype(np.float32),
        "positive": np.abs(g) + np.float32(0.1),
        "outliers": outliers,
        "scaled": scaled,
        "one_hot": one_hot,
        "zeros": np.zeros(n, np.float32),
        "constant": np.full(n, 0.37, np.float32),
        "negative_constant": np.full(n, -2.5, np.float32),
        "ties": (rng.integers(-16, 17, n) * np.float32(0.25)).astype(np.float32),  # many exact halfway points
    }


@pytest.fixture(scope="module")
def data():
    return make_data(64, np.random.default_rng(2024))


@pytest.mark.parametrize("t", QUANT_TYPES_GGUF, ids=lambda t: t.name)
def test_quant_bytes_match_gguf(io, data, t):
    for kind, x in data.items():
        ours = io.quant(t, x)
        with np.errstate(all="ignore"):
            ref = quants.quantize(x.reshape(-1, 256), t).reshape(-1).view(np.uint8)
        if not np.array_equal(ours, ref):
            bad = np.nonzero(ours != ref)[0]
            pytest.fail(f"{t.name} on {kind}: {bad.size} bytes differ, first at byte {bad[0]}")
        deq = io.dequant(t, ours) if t != T.F16 else ours.view(np.float16).astype(np.float32)
        assert_same_bits(deq, quants.dequantize(ours, t).reshape(-1), t, block_size(t), f"dequantize ({kind})")


@pytest.mark.parametrize("t", QUANT_TYPES_OURS, ids=lambda t: t.name)
def test_quant_decodes_identically(io, data, t):
    for kind, x in data.items():
        q = io.quant(t, x)
        assert q.size == x.size // block_size(t) * block_bytes(t)
        ours = io.dequant(t, q)
        with np.errstate(all="ignore"):
            ref = ref_dequant(t, q.reshape(-1, block_bytes(t)))
        assert_same_bits(ours, ref, t, block_size(t), f"dequantize ({kind})")
        assert np.isfinite(ours).all(), f"{t.name} on {kind}: non-finite values"
        if kind in ("zeros",):
            assert not ours.any(), f"{t.name}: zeros do not survive"


def test_f16_quant_random_bits(io):
    """Every rounding regime of f32 -> f16 (normal, subnormal, overflow, ties): our bytes are numpy's astype.
    NaN is the one documented difference: we quiet it (as F16C hardware and ggml do), numpy keeps payloads."""
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint32)
    ties = (rng.integers(0, 2**19, size=50_000, dtype=np.uint32) << 13) | 0x1000  # exactly halfway, all exponents
    x = np.concatenate([bits, ties]).view(np.float32)
    ours = io.quant(T.F16, x).view(np.uint16)
    with np.errstate(all="ignore"):
        ref = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert nan.any()
    assert np.array_equal(ours[~nan], ref[~nan])
    assert np.isnan(ours[nan].view(np.float16)).all()
    assert ((ours[nan] & 0x0200) != 0).all()  # quiet NaNs


def test_bf16_quant_random_bits(io):
    rng = np.random.default_rng(12)
    x = rng.integers(0, 2**32, size=200_000, dtype=np.uint32).view(np.float32)
    ours = io.quant(T.BF16, x)
    assert np.array_equal(ours, quants.quantize(x, T.BF16).reshape(-1).view(np.uint8))


def test_mxfp4_exponent_rounding(io):
    """amax a few ulps below a power of two: numpy's float32 log2 rounds up to the power and so must we."""
    x = np.zeros((254, 32), np.float32)
    for k in range(-100, 127):
        x[k + 100, 3] = np.nextafter(np.float32(2.0) ** k, np.float32(0), dtype=np.float32)
    x[227:, 5] = np.float32(2.0) ** np.arange(27, dtype=np.float32)
    assert np.array_equal(io.quant(T.MXFP4, x.reshape(-1)), quants.quantize(x, T.MXFP4).reshape(-1))


def test_mxfp4_tiny_blocks_documented_difference(io):
    """max |x| < 2^-125 needs a negative exponent: gguf's uint8 cast wraps (e >= 232, an all-zero block); we clamp
    to e = 0 and keep the values. Everything else in those blocks follows gguf's rule."""
    x = np.zeros((4, 32), np.float32)
    x[0, 0] = np.float32(2.0**-127)
    x[1, 7] = np.float32(-3 * 2.0**-128)
    x[2, :] = np.float32(2.0**-140)
    x[3, :] = np.float32(1e-45)
    ours = io.quant(T.MXFP4, x.reshape(-1)).reshape(4, 17)
    with np.errstate(all="ignore"):
        ref = quants.quantize(x, T.MXFP4).reshape(4, 17)
    assert (ref[:, 0] >= 232).all() and not quants.dequantize(ref.reshape(-1), T.MXFP4).any()
    assert (ours[:, 0] == 0).all()
    deq = quants.dequantize(ours.reshape(-1), T.MXFP4).reshape(4, 32)
    assert deq[0, 0] == x[0, 0] and deq[1, 7] == x[1, 7]


# ---- the test program's error handling -----------------------------------------------------------------------------

def test_quant_io_rejects_bad_input(io, tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\0" * 35)
    r = io.run("dequant", "Q8_0", tmp_path / "odd.bin", tmp_path / "out")
    assert r.returncode == 1 and "not a whole number of 34-byte Q8_0 blocks" in r.stderr
    (tmp_path / "x.f32").write_bytes(np.zeros(48, np.float32).tobytes())
    r = io.run("quant", "Q4_K", tmp_path / "x.f32", tmp_path / "out")
    assert r.returncode == 1 and "not a whole number of 256-element Q4_K blocks" in r.stderr
    r = io.run("quant", "Q9_9", tmp_path / "x.f32", tmp_path / "out")
    assert r.returncode == 1 and "unknown type Q9_9" in r.stderr
    r = io.run("quant", "I32", tmp_path / "x.f32", tmp_path / "out")
    assert r.returncode == 1 and "no quantizer for I32" in r.stderr
    r = io.run("dequant", "Q8_0", tmp_path / "missing.bin", tmp_path / "out")
    assert r.returncode == 1 and "missing.bin" in r.stderr
    assert io.run("dequant").returncode == 2
