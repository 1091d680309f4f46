"""The golden manifest (tools/golden/manifest.json): configs, seed, token sequences, quantization rules, file hashes,
oracle hashes and the software the oracle ran on. Helpers to read it, write it canonically, and hash files/oracles.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from pathlib import Path

import numpy as np

GOLDEN_DIR = Path(__file__).resolve().parent
MANIFEST_PATH = GOLDEN_DIR / "manifest.json"
ORACLE_DIR = GOLDEN_DIR / "oracles"


def load(path: Path = MANIFEST_PATH) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save(data: dict, path: Path = MANIFEST_PATH) -> None:
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    # lists of numbers on one line
    text = re.sub(r"\[\s*([-+0-9.eE]+(?:,\s*[-+0-9.eE]+)*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    Path(path).write_text(text, encoding="utf-8")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """An .npz that numpy.load reads, written byte-for-byte reproducibly (stored entries, fixed timestamps, sorted)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[key]), version=(1, 0), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            z.writestr(info, buf.getvalue())


def arrays_digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over (name, dtype, shape, raw bytes) of every array, names sorted: equal iff the contents are equal."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
