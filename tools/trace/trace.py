"""Read and write routing traces (docs/routing-trace.md, version 1).

A trace is a 32-byte header and one record per (forward pass, MoE layer): u32 pass, u32 layer, u32 n_tokens, then
n_tokens x k u16 expert ids and, when flags bit 0 is set, n_tokens x k f16 weights. Every field is a multiple of two
bytes long, so the reader views the file as u16 words and gathers all ids (and weights) with one index array; only
the record headers are walked in Python. `Trace` keeps the records as flat arrays; `Trace.record(i)` and iteration
give one record at a time.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

import numpy as np

MAGIC = b"STRTRACE"
VERSION = 1
HEADER = struct.Struct("<8s6I")  # magic, version, n_layer, n_expert, k, flags, reserved
RECORD_HEADER = struct.Struct("<3I")  # pass, layer, n_tokens
FLAG_WEIGHTS = 1


class Record(NamedTuple):
    """One (forward pass, MoE layer): ids [n_tokens, k] uint16, weights [n_tokens, k] float16 or None."""

    pass_index: int
    layer: int
    ids: np.ndarray
    weights: np.ndarray | None

    @property
    def n_tokens(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class Trace:
    """A routing trace: the header fields and the records as flat arrays.

    Record r is passes[r], layers[r], n_tokens[r]; its tokens are rows offsets[r]:offsets[r + 1] of ids (and weights).
    """

    path: Path
    n_layer: int
    n_expert: int
    k: int
    passes: np.ndarray  # [records] int64
    layers: np.ndarray  # [records] int64
    n_tokens: np.ndarray  # [records] int64
    offsets: np.ndarray  # [records + 1] int64, token rows
    ids: np.ndarray  # [tokens, k] uint16
    weights: np.ndarray | None  # [tokens, k] float16

    def __len__(self) -> int:
        return int(self.passes.shape[0])

    def record(self, r: int) -> Record:
        a, b = self.offsets[r], self.offsets[r + 1]
        return Record(int(self.passes[r]), int(self.layers[r]), self.ids[a:b],
                      None if self.weights is None else self.weights[a:b])

    def __iter__(self) -> Iterator[Record]:
        return (self.record(r) for r in range(len(self)))


def read_trace(path: str | Path) -> Trace:
    """Read a trace file; a ValueError naming the file says what is wrong with a bad one."""
    path = Path(path)
    buf = path.read_bytes()

    def fail(problem: str) -> ValueError:
        return ValueError(f"{path}: {problem}")

    if len(buf) < HEADER.size:
        raise fail(f"header cut short: {HEADER.size} bytes expected, the file has {len(buf)}")
    magic, version, n_layer, n_expert, k, flags, _reserved = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise fail(f"not a routing trace: magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise fail(f"unsupported version {version} (this reader knows version {VERSION})")
    if flags & ~FLAG_WEIGHTS:
        raise fail(f"unknown flags 0x{flags:x} (only bit 0, weights, is defined)")
    if n_expert == 0 or k == 0 or k > n_expert:
        raise fail(f"bad header: n_expert {n_expert}, k {k} (need 1 <= k <= n_expert)")
    has_weights = bool(flags & FLAG_WEIGHTS)
    row_bytes = 2 * k * (2 if has_weights else 1)

    starts, heads = [], []  # byte offset of each record's ids; (pass, layer, n_tokens)
    off, end = HEADER.size, len(buf)
    while off < end:
        if end - off < RECORD_HEADER.size:
            raise fail(f"record at byte {off} cut short: {RECORD_HEADER.size} bytes of pass, layer, n_tokens "
                       f"expected, {end - off} left")
        p, layer, t = RECORD_HEADER.unpack_from(buf, off)
        body = t * row_bytes
        if end - off - RECORD_HEADER.size < body:
            raise fail(f"record at byte {off} (pass {p}, layer {layer}) cut short: {t} tokens x {k} ids"
                       f"{' and weights' if has_weights else ''} need {body} bytes, {end - off - RECORD_HEADER.size} "
                       f"left")
        if layer >= n_layer:
            raise fail(f"record at byte {off} (pass {p}): layer {layer} >= n_layer {n_layer}")
        starts.append(off + RECORD_HEADER.size)
        heads.append((p, layer, t))
        off += RECORD_HEADER.size + body

    head = np.array(heads, dtype=np.int64).reshape(-1, 3)
    n_tokens = head[:, 2]
    offsets = np.concatenate([[0], np.cumsum(n_tokens)])
    # u16 word index of every id: the record's first id word plus the element's place within the record.
    per_record = n_tokens * k
    first_word = np.repeat(np.array(starts, dtype=np.int64) // 2 - offsets[:-1] * k, per_record)
    words = np.frombuffer(buf, dtype="<u2", count=len(buf) // 2)
    idx = first_word + np.arange(int(offsets[-1]) * k)
    ids = words[idx].astype(np.uint16).reshape(-1, k)
    weights = None
    if has_weights:
        weights = words[idx + np.repeat(per_record, per_record)].view("<f2").astype(np.float16).reshape(-1, k)
    if ids.size and int(ids.max()) >= n_expert:
        bad = int(np.argmax(ids.reshape(-1) >= n_expert))
        r = int(np.searchsorted(offsets, bad // k, side="right")) - 1
        raise fail(f"record at byte {starts[r] - RECORD_HEADER.size} (pass {head[r, 0]}, layer {head[r, 1]}): "
                   f"expert id {int(ids.reshape(-1)[bad])} at byte {2 * int(idx[bad])} >= n_expert {n_expert}")
    return Trace(path, n_layer, n_expert, k, head[:, 0].copy(), head[:, 1].copy(), n_tokens.copy(), offsets, ids,
                 weights)


def write_trace(path: str | Path, n_layer: int, n_expert: int, k: int,
                records: Iterable[tuple[int, int, np.ndarray, np.ndarray | None]], with_weights: bool = True) -> None:
    """Write records (pass, layer, ids [n_tokens, k], weights [n_tokens, k] or None) as a version 1 trace.

    With with_weights, a record without weights gets 1/k for each of its picks.
    """
    out = [HEADER.pack(MAGIC, VERSION, n_layer, n_expert, k, FLAG_WEIGHTS if with_weights else 0, 0)]
    for p, layer, ids, weights in records:
        ids = np.asarray(ids, dtype="<u2").reshape(-1, k)
        out.append(RECORD_HEADER.pack(p, layer, ids.shape[0]))
        out.append(ids.tobytes())
        if with_weights:
            w = np.full(ids.shape, 1.0 / k) if weights is None else weights
            out.append(np.asarray(w, dtype="<f2").reshape(ids.shape).tobytes())
    Path(path).write_bytes(b"".join(out))
