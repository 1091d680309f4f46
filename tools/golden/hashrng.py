"""Counter-based pseudo-random numbers whose values depend on nothing but (seed, name, index).

Every golden weight is a pure function of the model seed, the tensor's Hugging Face name and the element's flat index,
computed with exact integer arithmetic (64-bit wrap-around) followed by a handful of correctly rounded IEEE-754
operations (add, multiply, divide). No transcendental function and no library random stream is involved, so any
machine with any numpy version regenerates bit-identical weights.

Not for cryptography, and not a general-purpose RNG: it exists so that the golden models are reproducible.
"""
from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # odd increment of the splitmix64 sequence
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def fnv1a64(text: str) -> int:
    """64-bit FNV-1a of the UTF-8 bytes of `text` (Python ints, exact)."""
    h = 0xCBF29CE484222325
    for b in text.encode("utf-8"):
        h ^= b
        h = (h * 0x100000001B3) & MASK64
    return h


def _mix_int(z: int) -> int:
    """splitmix64's output function on a Python int."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function, element-wise on a uint64 array (products wrap modulo 2**64)."""
    z = z ^ (z >> np.uint64(30))
    z = z * _MIX1
    z = z ^ (z >> np.uint64(27))
    z = z * _MIX2
    return z ^ (z >> np.uint64(31))


def stream_key(seed: int, name: str) -> int:
    """The key of one tensor's stream: independent streams for every (seed, name)."""
    return _mix_int(_mix_int(seed * GOLDEN_GAMMA) ^ fnv1a64(name))


def hash64(seed: int, name: str, n: int) -> np.ndarray:
    """n uint64 values: element i is mix(key + (i + 1) * gamma), the i-th splitmix64 output of the tensor's stream."""
    key = np.uint64(stream_key(seed, name))
    idx = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix(key + idx * np.uint64(GOLDEN_GAMMA))


def uniform(seed: int, name: str, n: int) -> np.ndarray:
    """n float64 values in [0, 1) from the top 53 bits (exact: an integer times a power of two)."""
    return (hash64(seed, name, n) >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


# Irwin-Hall with four 16-bit uniforms per value: the sum of four independent integers uniform on [0, 65535] has mean
# 2 * 65535 and variance 4 * (65536**2 - 1) / 12; centred and scaled it is a bounded (|z| < 3.47), slightly flat-topped
# stand-in for a standard normal. Integer sums are exact; one subtraction and one multiplication are rounded.
_IH_MEAN = 2.0 * 65535.0
_IH_INV_STD = 1.0 / float(np.sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0))


def normal(seed: int, name: str, n: int) -> np.ndarray:
    """n float64 values, roughly N(0, 1) (Irwin-Hall of four 16-bit parts of each hash)."""
    h = hash64(seed, name, n)
    m = np.uint64(0xFFFF)
    s = (h & m) + ((h >> np.uint64(16)) & m) + ((h >> np.uint64(32)) & m) + (h >> np.uint64(48))
    return (s.astype(np.float64) - _IH_MEAN) * _IH_INV_STD


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), returned as float32.

    Magnitudes below 2**-14 become zero, so every value is exactly representable in float16 as well: the F32, F16 and
    BF16 files of a model then hold exactly the same numbers.
    """
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    bits = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) & np.uint64(0xFFFF0000)
    out = bits.astype(np.uint32).view(np.float32)
    out = np.where(np.abs(out) < np.float32(2.0**-14), np.float32(0.0), out).astype(np.float32)
    if not np.all(np.abs(out) <= np.float32(65504.0)):
        raise ValueError("value outside the float16 range")
    return out
