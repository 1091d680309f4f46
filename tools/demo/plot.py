"""The loss plot as a PNG: with matplotlib when it is installed, else drawn here (numpy, zlib and struct only).

The fallback draws the axes, grid lines at round values labelled with a 3x5-pixel digit font, and each series as a
polyline in its colour; series names appear only in the matplotlib version (the model card says which colour is which).
"""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# 3x5 glyphs, rows top to bottom
_FONT = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
}
_SCALE = 2  # font pixels per glyph pixel


@dataclass
class Series:
    name: str
    x: list[float]
    y: list[float]
    color: tuple[int, int, int]


def write_png(path: Path, rgb: np.ndarray) -> None:
    """An 8-bit RGB image (height x width x 3, uint8) as a PNG file."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w, _ = rgb.shape
    rows = np.concatenate([np.zeros((h, 1), np.uint8), rgb.reshape(h, w * 3)], axis=1)  # filter 0 on every row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + chunk(b"IEND", b""))


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _label(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:.3g}"


def _text(img: np.ndarray, s: str, x: int, y: int) -> None:
    for i, ch in enumerate(s):
        bits = np.array([int(b) for b in _FONT[ch]], bool).reshape(5, 3)
        glyph = np.kron(bits, np.ones((_SCALE, _SCALE), bool))
        x0 = x + i * 4 * _SCALE
        region = img[y: y + glyph.shape[0], x0: x0 + glyph.shape[1]]
        region[glyph[: region.shape[0], : region.shape[1]]] = 0


def _line(img: np.ndarray, x0: float, y0: float, x1: float, y1: float, color: tuple[int, int, int]) -> None:
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 2
    xs = np.rint(np.linspace(x0, x1, n)).astype(int)
    ys = np.rint(np.linspace(y0, y1, n)).astype(int)
    h, w, _ = img.shape
    for dy, dx in ((0, 0), (1, 0), (0, 1)):  # two pixels thick
        ok = (ys + dy >= 0) & (ys + dy < h) & (xs + dx >= 0) & (xs + dx < w)
        img[ys[ok] + dy, xs[ok] + dx] = color


def draw(series: list[Series], width: int = 800, height: int = 480) -> np.ndarray:
    img = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 64, 16, 16, 40
    xs = [v for s in series for v in s.x]
    ys = [v for s in series for v in s.y]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)
    pad = (y_hi - y_lo) * 0.05 or 0.5
    y_lo, y_hi = y_lo - pad, y_hi + pad
    x_hi = x_hi if x_hi > x_lo else x_lo + 1

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * (width - left - right - 1)

    def py(y: float) -> float:
        return top + (y_hi - y) / (y_hi - y_lo) * (height - top - bottom - 1)

    for t in nice_ticks(y_lo, y_hi):
        r = int(round(py(t)))
        img[r, left: width - right] = 225
        s = _label(t)
        _text(img, s, left - 6 - len(s) * 4 * _SCALE, r - 5)
    for t in nice_ticks(x_lo, x_hi):
        c = int(round(px(t)))
        img[top: height - bottom, c] = 225
        s = _label(t)
        _text(img, s, c - len(s) * 2 * _SCALE, height - bottom + 8)
    img[top: height - bottom, left] = 0
    img[height - bottom - 1, left: width - right] = 0
    for s in series:
        for (xa, ya), (xb, yb) in zip(zip(s.x, s.y), list(zip(s.x, s.y))[1:]):
            _line(img, px(xa), py(ya), px(xb), py(yb), s.color)
        if len(s.x) == 1:
            _line(img, px(s.x[0]) - 2, py(s.y[0]), px(s.x[0]) + 2, py(s.y[0]), s.color)
    return img


def plot(path: Path, series: list[Series], xlabel: str, ylabel: str) -> str:
    """Write the plot; return which renderer drew it ("matplotlib" or "builtin")."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        write_png(path, draw(series))
        return "builtin"
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=100)
    for s in series:
        ax.plot(s.x, s.y, label=s.name, color=tuple(c / 255 for c in s.color),
                marker="o" if len(s.x) < 50 else None, markersize=3)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return "matplotlib"
