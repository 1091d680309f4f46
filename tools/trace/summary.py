"""Summarise a routing trace: expert popularity, reuse distance and the hit rates of expert caches.

    python -m tools.trace.summary run.trace                  # markdown tables
    python -m tools.trace.summary run.trace --json           # the same figures as one JSON object
    python -m tools.trace.summary run.trace --sizes 5,10,25  # cache sizes, % of (MoE layers x n_expert)
    python -m tools.trace.summary run.trace --policies lru,belady   # a subset of the cache policies
    python -m tools.trace.summary run.trace --policies lru,lru_frozen,lfu_decay_frozen   # and the frozen forms
    python -m tools.trace.summary run.trace --policies lfu_decay_admit --admit-factor 1.5  # admission's threshold

What an expert cache sees: a pass of T tokens loads each expert it uses once, so the access stream is, pass by pass
and within a pass layer by layer, the distinct experts of that (pass, layer) in ascending id order, one access each, to
the key (layer, expert). Passes of one token are decode passes; passes of more (prompt chunks, and batched decoding of
several sequences) count as prefill.

- Popularity (per MoE layer, and over all (layer, expert) keys): the share of token-expert picks taken by the most
  popular 10% of experts, the entropy of the pick distribution over log(number of experts) (1.0 = uniform), the
  experts never picked.
- Reuse distance of an access: the passes since its key was last accessed (infinite on first use); nearest-rank
  median and p90, the shares at distance 1 and of first uses, and the share of accesses whose key is never accessed
  again. JSON writes an infinite distance as null.
- Caches: one cache over all keys, capacity X% of the keys (rounded down, at least 1). A hit is an access whose key is
  cached; a miss inserts the key, evicting one when full. LRU; LFU (smallest count, ties to the least recently used,
  counts kept for keys out of the cache too); LFU with decay (every count halved every N accesses, N = the engine's
  period, 32 x MoE layers x k, unless --decay-every); Belady (the key used again farthest in the future, never-again first). Hit rates over all
  accesses and over the decode passes' accesses only (prefill passes still update the cache). On request
  (--policies), LRU and LFU decay frozen in decode: decode passes only look, as the engine's mapped misses leave the
  cache as the prompts filled it. Markov next use (--policies markov, markov_hits): each key a two-state chain over
  its layer's turns, the key expected to be needed farthest ahead evicted. Prompt-filled (--policies prompt_filled):
  after each prefill pass the cache holds the keys the prompts picked most often, token by token; decode only looks.
  Favourites (--policies favourites, the engine's STRATA_PROMPT_FAVOURITES): LRU in prefill passes, each adding its
  picks to a score per key that halves every 2048 prompt tokens; the first decode pass after them lets the weakest
  cached key (an empty place, then the lowest score) give way to the best-scored key outside while that one scores
  above --favourite-factor (1.5) times it; decode only looks. favourites_lru: the same, but decode passes fill their
  misses under LRU (passes split with the host copy their misses in); favourites_kept: as favourites_lru, but a miss
  takes the least recently used key outside the favourites first (simulated only); favourites_lfu: decode fills
  under LFU with decay. auto_lru / auto_lfu: the engine's default decode (`--cpu-share auto`) where passes by the
  device alone measure faster: the favourites, then only the decode mode's exploration and probe passes (split with
  the host) fill, under LRU or LFU with decay; the rest only look (chooser_split_passes). Expected next use
  (--policies next_use, next_use_hits): each key's rate of use a pass from LFU decay's counts (passes using it over
  passes, both halved with the counts), its expected wait the layers until its layer comes round plus a whole cycle
  of layers per pass it is expected to miss; the cached key expected farthest is evicted, and a decode miss enters
  only where its own wait, a cycle away, is shorter than that key's. Besides hit rates, decode's expert transfers
  per token where they follow from the hits (a miss moves an expert once, an admitted one twice: read in place, then
  copied in): an admitting policy can buy hits with fills that move more than they save.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from pathlib import Path
from typing import Sequence

import numpy as np

from .trace import Trace, read_trace

DEFAULT_SIZES = list(range(10, 100, 10))
POLICIES = {"lru": "LRU", "lfu": "LFU", "lfu_decay": "LFU decay", "belady": "Belady",
            "lru_frozen": "LRU, frozen in decode", "lfu_decay_frozen": "LFU decay, frozen in decode",
            "lfu_decay_admit": "LFU decay, admitting in decode", "markov": "Markov next use",
            "prompt_filled": "prompt-filled, frozen in decode",
            "favourites": "LRU, then the prompts' favourites as decoding begins, frozen in decode",
            "favourites_lru": "the prompts' favourites, then LRU filling decode's misses",
            "favourites_kept": "the prompts' favourites, kept while decode's misses fill the rest",
            "favourites_lfu": "the prompts' favourites, then LFU decay filling decode's misses",
            "auto_lru": "the engine's default decode under LRU: favourites, the decode mode's split passes fill",
            "auto_lfu": "the engine's default decode under LFU decay: favourites, the decode mode's split passes fill",
            "next_use": "expected next use (LFU decay rates, layer cycle, admitting)"}
MARKOV_PRIOR = 2.0  # Markov next use: the weight, in observations, of the layer-wide rates each key's estimate starts from
# The frozen forms are what the engine's mapped misses do (STRATA_DECODE_MAPPED): the policy fills the cache in
# prompt passes, and decode passes read their misses in place, so decoding hits only what the prompts left. The
# admitting form is a decode that reads a miss in place unless its count beats the victim's (then it is filled).
DEFAULT_POLICIES = ("lru", "lfu", "lfu_decay", "belady")
TOP_FRACTION = 0.1
FAVOURITE_HALF_TOKENS = 2048  # the engine's favourite scores halve every this many prompt tokens (expert_slots.h)
FAVOURITE_FACTOR = 1.5  # ... and a slot gives way to an expert outside scoring this many times more (moe_schedule.h)
ENGINE_DECAY_TOKENS = 32  # the engine's LFU (--expert-cache-policy lfu) halves its counts every 32 tokens' requests
DECAY_HEADROOM = 64  # LFU decay: the fraction bits the fixed-point counts keep (lfu_hits)
RESCALE_DECAYS = 64  # ... and how many they drop at a time
ADMIT_FACTOR = 2.0  # LFU admitting: a miss enters only with a count above this times the victim's (the engine's)
# Decode transfers per token (misses, plus admitted misses' fills) for the policies whose decode fills are known: those
# that fill every miss or none, and the admitting ones (their fills counted).
ADMITTING_POLICIES = ("lfu_decay_admit", "next_use")
TRANSFER_POLICIES = ("lru", "lfu", "lfu_decay", "belady", "lru_frozen", "lfu_decay_frozen", "markov",
                     "prompt_filled") + ADMITTING_POLICIES


# ---- the access stream ------------------------------------------------------------------------------------------


@dataclass
class Accesses:
    """The expert cache's access stream: one entry per distinct expert of each (pass, layer) record, in stream order."""

    key: np.ndarray  # int64: slot * n_expert + expert, slot = the layer's place among the MoE layers
    pass_ordinal: np.ndarray  # int64: the access's pass, counted in trace order from 0
    decode: np.ndarray  # bool: the pass has one token
    next_use: np.ndarray  # int64: index of the next access to the same key, len(key) if none
    distance: np.ndarray  # float64: passes since the key's previous access, inf on first use
    # Every token-expert pick of the prefill passes (a key once per token that chose it), with its pass: the prompt
    # popularity the prompt-filled policy ranks by. Empty where the stream was built by hand.
    prefill_key: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    prefill_pass: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.key.shape[0])


def moe_layers(trace: Trace) -> np.ndarray:
    """The layers with records, ascending."""
    return np.unique(trace.layers)


def _pass_ordinals(trace: Trace) -> np.ndarray:
    """Per record, its pass counted in trace order (a new pass starts where the pass field changes)."""
    starts = np.ones(len(trace), dtype=np.int64)
    starts[1:] = trace.passes[1:] != trace.passes[:-1]
    return np.cumsum(starts) - 1


def next_uses(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each access, the index of the next and of the previous access to the same key (len(key) / -1 if none)."""
    n = key.shape[0]
    order = np.argsort(key, kind="stable")
    same = key[order[1:]] == key[order[:-1]]
    earlier, later = order[:-1][same], order[1:][same]
    nxt = np.full(n, n, dtype=np.int64)
    nxt[earlier] = later
    prev = np.full(n, -1, dtype=np.int64)
    prev[later] = earlier
    return nxt, prev


def accesses(trace: Trace) -> Accesses:
    """The trace's access stream, with each access's next use and reuse distance."""
    layers = moe_layers(trace)
    e = trace.n_expert
    record_of_row = np.repeat(np.arange(len(trace), dtype=np.int64), trace.n_tokens)
    # Sorted, record * n_expert + id is record-major with ascending ids within a record: the stream order.
    picks = np.sort((record_of_row[:, None] * e + trace.ids).reshape(-1))
    picks = picks[np.diff(picks, prepend=-1) != 0]
    record, expert = picks // e, picks % e
    key = np.searchsorted(layers, trace.layers[record]) * e + expert
    ordinal_of_record = _pass_ordinals(trace)
    pass_ordinal = ordinal_of_record[record]
    nxt, prev = next_uses(key)
    distance = np.full(key.shape[0], np.inf)
    seen = prev >= 0
    distance[seen] = pass_ordinal[seen] - pass_ordinal[prev[seen]]
    pre = trace.n_tokens[record_of_row] > 1  # rows of prefill records
    pre_rec = record_of_row[pre]
    prefill_key = (np.searchsorted(layers, trace.layers[pre_rec])[:, None] * e + trace.ids[pre]).reshape(-1)
    prefill_pass = np.repeat(ordinal_of_record[pre_rec], trace.k)
    return Accesses(key, pass_ordinal, trace.n_tokens[record] == 1, nxt, distance, prefill_key, prefill_pass)


# ---- header facts, popularity, reuse ----------------------------------------------------------------------------


def header_facts(trace: Trace, acc: Accesses) -> dict:
    layers = moe_layers(trace)
    pass_tokens = trace.n_tokens[np.flatnonzero(np.diff(_pass_ordinals(trace), prepend=-1))]  # a pass's first record
    return {
        "file": str(trace.path),
        "n_layer": trace.n_layer,
        "n_expert": trace.n_expert,
        "k": trace.k,
        "weights": trace.weights is not None,
        "moe_layers": [int(x) for x in layers],
        "records": len(trace),
        "passes": int(pass_tokens.shape[0]),
        "prefill_passes": int(np.sum(pass_tokens > 1)),
        "decode_passes": int(np.sum(pass_tokens == 1)),
        "tokens": int(trace.n_tokens[trace.layers == layers[0]].sum()) if layers.size else 0,
        "accesses": len(acc),
    }


def _spread(picks: np.ndarray) -> dict:
    """Top-10% share, normalized entropy and never-picked count of one pick-count vector."""
    n = picks.shape[0]
    top = max(1, round(TOP_FRACTION * n))
    total = int(picks.sum())
    if total == 0:
        return {"picks": 0, "top_share": None, "entropy": None, "never_picked": n}
    p = picks[picks > 0] / total
    entropy = float(-np.sum(p * np.log(p)) / math.log(n)) if n > 1 else 1.0
    return {"picks": total, "top_share": float(np.sort(picks)[::-1][:top].sum() / total), "entropy": entropy,
            "never_picked": int(np.sum(picks == 0))}


def popularity(trace: Trace) -> dict:
    layers = moe_layers(trace)
    e = trace.n_expert
    slot_of_row = np.repeat(np.searchsorted(layers, trace.layers), trace.n_tokens)
    picks = np.bincount((slot_of_row[:, None] * e + trace.ids).reshape(-1),
                        minlength=layers.shape[0] * e).reshape(-1, e)
    return {
        "top_experts": max(1, round(TOP_FRACTION * e)),
        "layers": [{"layer": int(layer), **_spread(picks[i])} for i, layer in enumerate(layers)],
        "overall": {"keys": int(picks.size), "top_keys": max(1, round(TOP_FRACTION * picks.size)),
                    **_spread(picks.reshape(-1))},
    }


def _nearest_rank(sorted_values: np.ndarray, q: float) -> float:
    return float(sorted_values[max(0, math.ceil(q * sorted_values.shape[0]) - 1)])


def reuse(acc: Accesses) -> dict:
    out = {}
    for name, mask in (("all", np.ones(len(acc), dtype=bool)), ("prefill", ~acc.decode), ("decode", acc.decode)):
        d = np.sort(acc.distance[mask])
        n = int(d.shape[0])
        if n == 0:
            out[name] = {"accesses": 0}
            continue
        out[name] = {
            "accesses": n,
            "median": _nearest_rank(d, 0.5),
            "p90": _nearest_rank(d, 0.9),
            "distance_1": float(np.mean(d == 1)),
            "first_use": float(np.mean(np.isinf(d))),
            "never_reused": float(np.mean(acc.next_use[mask] == len(acc))),
        }
    return out


# ---- cache policies: each returns the hit flag of every access --------------------------------------------------


def _as_list(keys) -> list:
    return keys if isinstance(keys, list) else np.asarray(keys).tolist()


def lru_hits(keys, capacity: int, frozen=None) -> np.ndarray:
    """LRU; frozen (a flag per access, or None): those accesses only look (a hit or not), changing nothing."""
    cache: OrderedDict = OrderedDict()
    hits = bytearray(len(keys))
    frozen = _as_list(frozen) if frozen is not None else None
    for i, key in enumerate(_as_list(keys)):
        if frozen is not None and frozen[i]:
            hits[i] = key in cache
            continue
        if key in cache:
            cache.move_to_end(key)
            hits[i] = 1
            continue
        if len(cache) >= capacity:
            cache.popitem(last=False)
        cache[key] = None
    return np.frombuffer(hits, dtype=bool)


def lfu_hits(keys, capacity: int, decay_every: int | None = None, frozen=None, admit=None,
             inserted: bytearray | None = None, admit_factor: float = ADMIT_FACTOR) -> np.ndarray:
    """LFU over all history (counts survive eviction), ties to the least recently used; with decay_every, every
    count is halved after each decay_every accesses (frozen accesses count as time passing, as in lru_hits they
    only look). admit (a flag per access, or None): at those accesses a miss enters a full cache only if its count,
    this access included, is above admit_factor times the victim's (else it is read where it is and the cache stays
    as it was), the counts updated as always. inserted (optional, one byte per access): set where the access put its
    key in.

    A min-heap with lazy deletion of one int per access, count * n + the access's index (so ties go to the least
    recently used); an entry is current while the cache maps its key to that value. Decay is free: the counts are
    fixed-point with DECAY_HEADROOM fraction bits to start with and each decay adds one (the next increments are twice
    as large), so every stored count is its decayed count times one common factor. Every RESCALE_DECAYS decays the
    counts drop that many low bits, which loses only what is below 2^-DECAY_HEADROOM of an access.
    """
    keys = _as_list(keys)
    n = len(keys)
    count: dict = {}
    cache: dict = {}  # key -> its current heap entry
    heap: list = []
    step = 1 << DECAY_HEADROOM if decay_every else 1
    hits = bytearray(n)
    frozen = _as_list(frozen) if frozen is not None else None
    admit = _as_list(admit) if admit is not None else None
    for i, key in enumerate(keys):
        if decay_every and i and i % decay_every == 0:
            step <<= 1
            if step.bit_length() > DECAY_HEADROOM + RESCALE_DECAYS:
                step >>= RESCALE_DECAYS
                count = {k: c >> RESCALE_DECAYS for k, c in count.items()}
                cache = {k: count[k] * n + v % n for k, v in cache.items()}
                heap = list(cache.values())
                heapify(heap)
        if frozen is not None and frozen[i]:
            hits[i] = key in cache
            continue
        c = count.get(key, 0) + step
        count[key] = c
        if key in cache:
            hits[i] = 1
        elif len(cache) >= capacity:
            while True:
                v = heap[0]
                victim = keys[v % n]
                if cache.get(victim) == v:
                    break
                heappop(heap)
            if admit is not None and admit[i] and c <= admit_factor * (v // n):
                continue
            heappop(heap)
            del cache[victim]
        if inserted is not None and not hits[i]:
            inserted[i] = 1
        v = c * n + i
        cache[key] = v
        heappush(heap, v)
        if len(heap) > 2 * capacity + 64:  # drop the stale entries
            heap = list(cache.values())
            heapify(heap)
    return np.frombuffer(hits, dtype=bool)


def belady_hits(keys, capacity: int, next_use=None) -> np.ndarray:
    """Belady's OPT: evict the cached key whose next use is farthest (never-again first, ties to the larger key).

    next_use (from next_uses) can be passed in when the stream is simulated at several sizes. A max-heap with lazy
    deletion of -(next use * n_keys + key), as in lfu_hits; a hit leaves a stale entry that never reaches the top, so
    the heap is rebuilt from the cache when it grows past twice the capacity.
    """
    keys = _as_list(keys)
    if next_use is None:
        next_use, _ = next_uses(np.asarray(keys, dtype=np.int64))
    n_keys = max(keys, default=0) + 1
    cache: dict = {}  # key -> its current heap entry
    heap: list = []
    hits = bytearray(len(keys))
    for i, (key, nxt) in enumerate(zip(keys, _as_list(next_use))):
        if key in cache:
            hits[i] = 1
        elif len(cache) >= capacity:
            while True:
                v = -heappop(heap)
                victim = v % n_keys
                if cache.get(victim) == v:
                    break
            del cache[victim]
        v = nxt * n_keys + key
        cache[key] = v
        heappush(heap, -v)
        if len(heap) > 2 * capacity + 64:
            heap = [-v for v in cache.values()]
            heapify(heap)
    return np.frombuffer(hits, dtype=bool)


def markov_hits(acc: Accesses, n_expert: int, capacity: int, prior: float = MARKOV_PRIOR) -> np.ndarray:
    """Evict the cached key whose next use is expected farthest, each key a two-state chain over its layer's turns.

    A key's layer has a turn once per pass (its record). At each turn every key of the layer was used at its last turn
    or not (state 1 or 0) and is used now or not; per key, counts of the two transitions from each state give
    a = P(used | used last turn) and b = P(used | not), each started from the rate over all keys with `prior`
    observations' weight. The expected wait to a key's next use, in turns, is the part of a pass until its layer comes
    round (this pass if its layer is later in the pass, else the next; a whole pass for the current layer), plus, from
    state 1, (1 - a) / b, from state 0, 1 / b - 1 (geometric waits). The current record's own experts are never
    evicted for one another. The layer's turn is the place of the key's layer among the MoE layers (key // n_expert).
    """
    key, passes = acc.key, acc.pass_ordinal
    n = int(key.shape[0])
    n_keys = int(key.max()) + 1 if n else 1
    n_layers = (n_keys + n_expert - 1) // n_expert
    n_keys = n_layers * n_expert
    last = np.full(n_keys, -(1 << 40), dtype=np.int64)  # the pass of each key's last use
    t1, t11, t0, t01 = (np.zeros(n_keys) for _ in range(4))  # turns from state 1 / 0, and uses among them
    rate1, rate0 = [1.0, 2.0], [1.0, 8.0]  # uses and turns over all keys, from each state
    cache: set = set()
    hits = np.zeros(n, dtype=bool)
    i = 0
    while i < n:
        p, layer = int(passes[i]), int(key[i]) // n_expert
        j = i
        while j < n and passes[j] == p and int(key[j]) // n_expert == layer:
            j += 1
        used = set(key[i:j].tolist())
        for k in range(layer * n_expert, (layer + 1) * n_expert):
            u = k in used
            if last[k] == p - 1:
                t1[k] += 1
                t11[k] += u
                rate1[0] += u
                rate1[1] += 1
            else:
                t0[k] += 1
                t01[k] += u
                rate0[0] += u
                rate0[1] += 1
        r1, r0 = rate1[0] / rate1[1], rate0[0] / rate0[1]
        for idx in range(i, j):
            k = int(key[idx])
            if k in cache:
                hits[idx] = True
                continue
            if len(cache) >= capacity:
                victim, far = None, -1.0
                for c in cache:
                    if c in used:
                        continue
                    cl = c // n_expert
                    a = (t11[c] + prior * r1) / (t1[c] + prior)
                    b = max((t01[c] + prior * r0) / (t0[c] + prior), 1e-6)
                    ahead = ((cl - layer) % n_layers) / n_layers or 1.0
                    # used at its layer's last turn: this pass's if that came already; the current layer's turn
                    # is now, and c is not among its experts
                    state1 = cl != layer and last[c] == (p if cl < layer else p - 1)
                    wait = ahead + ((1.0 - a) / b if state1 else 1.0 / b - 1.0)
                    if wait > far or (wait == far and c < victim):
                        victim, far = c, wait
                if victim is None:  # every cached key is one of this record's: the new one is read, not kept
                    continue
                cache.discard(victim)
            cache.add(k)
        for k in used:
            last[k] = p
        i = j
    return hits


def next_use_hits(acc: Accesses, n_expert: int, capacity: int, decay_every: int | None = None,
                  inserted: bytearray | None = None) -> np.ndarray:
    """Evict the cached key whose next use is expected farthest, by its rate and the place of its layer in the cycle.

    Rates: per key the passes that used it and the passes so far, both halved after each decay_every accesses (LFU
    decay's period); p = the first over the second. In layer steps from the current access, key c of layer lc waits
    for its layer to come round (lc after the current layer: lc - layer; before it: L minus the distance back; the
    current layer: a whole cycle of L), then L (1 - p) / p more (the expected passes it misses, geometric). The
    largest wait goes (ties to the lowest key); the current record's own experts are never evicted for one another
    (the engine acquires a layer's experts together). A decode access (acc.decode) that misses a full cache enters
    only where its own wait, L + L (1 - p) / p (its layer's turn just taken), is below that key's; otherwise it is
    read where it is. inserted (optional, one byte per access): set where the access put its key in the cache.
    """
    key, passes = acc.key, acc.pass_ordinal
    n = int(key.shape[0])
    n_layers = max(1, (int(key.max()) + n_expert) // n_expert) if n else 1
    count = np.zeros(n_layers * n_expert)
    n_passes = 0.0
    in_cache = np.zeros(n_layers * n_expert, dtype=bool)
    cached: list = []
    hits = np.zeros(n, dtype=bool)
    last_pass = -1
    L = float(n_layers)
    record_end = 0  # the current record's accesses: [i, record_end)
    for i in range(n):
        k = int(key[i])
        if decay_every and i and i % decay_every == 0:
            count *= 0.5
            n_passes *= 0.5
        if passes[i] != last_pass:
            n_passes += 1.0
            last_pass = int(passes[i])
        if i >= record_end:
            record_end = i + 1
            while record_end < n and passes[record_end] == passes[i] and key[record_end] // n_expert == k // n_expert:
                record_end += 1
            record = set(key[i:record_end].tolist())
        count[k] += 1.0
        if in_cache[k]:
            hits[i] = True
            continue
        if len(cached) < capacity:
            cached.append(k)
            in_cache[k] = True
            if inserted is not None:
                inserted[i] = 1
            continue
        ca = np.array(cached)
        layer = k // n_expert
        back = (ca // n_expert - layer) % n_layers
        ahead = np.where(back == 0, L, back).astype(float)
        p = np.minimum(np.maximum(count[ca], 1e-9) / max(n_passes, 1.0), 1.0)
        wait = ahead + L * (1.0 - p) / p
        wait[[c in record for c in cached]] = -1.0  # the record's own experts stay
        if wait.max() < 0.0:  # every cached key is one of this record's: the new one is read, not kept
            continue
        far = np.flatnonzero(wait == wait.max())
        j = int(far[np.argmin(ca[far])])
        if acc.decode[i]:
            pk = min(count[k] / max(n_passes, 1.0), 1.0)
            if L + L * (1.0 - pk) / pk >= wait[j]:
                continue
        in_cache[cached[j]] = False
        cached[j] = k
        in_cache[k] = True
        if inserted is not None:
            inserted[i] = 1
    return hits


def _passes_with_picks(acc: Accesses):
    """The stream pass by pass: (first access, end, pass ordinal, the pass's prefill picks as keys; empty for a
    decode pass)."""
    order = np.argsort(acc.prefill_pass, kind="stable")
    pre_key, pre_pass = acc.prefill_key[order], acc.prefill_pass[order]
    n, i = len(acc), 0
    while i < n:
        p = int(acc.pass_ordinal[i])
        j = i
        while j < n and acc.pass_ordinal[j] == p:
            j += 1
        a, b = np.searchsorted(pre_pass, [p, p + 1])
        yield i, j, p, pre_key[a:b]
        i = j


def prompt_filled_hits(acc: Accesses, capacity: int) -> np.ndarray:
    """The cache as the prompts fill it, frozen in decode: after each prefill pass it holds the `capacity` keys the
    prefill passes so far picked most often (token by token; ties to the smaller key), and every access only looks.
    What a decode that reads its misses in place keeps after a prompt whose lent slots were refilled with the prompt's
    favourites (STRATA_LOAN_REFILL=last), where the loan took most of the cache."""
    n = len(acc)
    hits = np.zeros(n, dtype=bool)
    if n == 0:
        return hits
    n_keys = int(max(acc.key.max(), acc.prefill_key.max(initial=0))) + 1
    counts = np.zeros(n_keys, dtype=np.int64)
    cached = np.zeros(n_keys, dtype=bool)
    for i, j, _, picks in _passes_with_picks(acc):
        hits[i:j] = cached[acc.key[i:j]]
        if not acc.decode[i]:  # a prefill pass: its picks counted, the cache refilled
            counts += np.bincount(picks, minlength=n_keys)
            cached[:] = False
            cached[np.argsort(-counts, kind="stable")[:capacity]] = True
    return hits


def chooser_split_passes(n: int) -> set:
    """The decode passes (0-based, of n) that the engine's decode mode (strata/decode_mode.h, DecodeModeChooser) runs
    split where passes alone measure faster: exploring from Split in runs of k_run = 4 until each mode has six
    samples (a run's first pass after a switch gives none: two runs each, 16 passes), then alone, with a probe run
    of four split passes after 64 passes, the interval doubling after each probe that keeps alone (to 1024)."""
    split = set(range(0, 4)) | set(range(8, 12))
    at, every = 16, 64
    while at + every < n:
        at += every
        split |= set(range(at, at + 4))
        at += 4
        every = min(2 * every, 1024)
    return {p for p in split if p < n}


def favourites_hits(acc: Accesses, capacity: int, picks_per_token: int, factor: float = FAVOURITE_FACTOR,
                    half_tokens: float = FAVOURITE_HALF_TOKENS, decode: str = "frozen", chooser: bool = False,
                    decay_every: int | None = None) -> np.ndarray:
    """The engine's prompt favourites (STRATA_PROMPT_FAVOURITES): prefill passes fill their misses as LRU does (the
    engine's prompt passes sweep most experts, where either policy evicts by recency) and add their picks per key to
    a score that halves every half_tokens prompt tokens (a pass's tokens: its picks over picks_per_token, the MoE
    layers times k); the first decode pass after them turns the cache toward the scores
    (ExpertSlotTable::keep_favourites: the weakest slot, empty ones first, then the lowest score with the least
    recently used first, gives way to the best-scored key outside while that one scores above factor times it).
    Decode passes, by `decode`: "frozen", they only look (a decode by the device alone, misses read in place);
    "lru", they fill their misses as LRU does (passes split with the host copy their misses in); "lfu", likewise
    under LFU with decay (counts of every request of the prompt and filling passes, halved every decay_every of them;
    the victim the least requested key, ties to the least recently used: the engine's default policy); "kept", as
    "lru" but the keys the favourites' turn left in the cache with a score are kept: a miss takes the least recently
    used key outside them first, and only where there is none the least recently used of them (which is then kept no
    more; simulated only, not in the engine). chooser: only the passes chooser_split_passes names fill, the others
    only look: the engine's default decode (`--cpu-share auto`) where passes alone measure faster."""
    assert decode in ("frozen", "lru", "kept", "lfu")
    n = len(acc)
    hits = np.zeros(n, dtype=bool)
    if n == 0:
        return hits
    n_keys = int(max(acc.key.max(), acc.prefill_key.max(initial=0))) + 1
    score = np.zeros(n_keys)
    cache: OrderedDict = OrderedDict()  # least recently used first
    kept: OrderedDict = OrderedDict()  # "kept": the favourites' keys, out of `cache`, least recently used first
    count = np.zeros(n_keys)  # "lfu": requests, in units that double at each decay
    last = np.zeros(n_keys, dtype=np.int64)  # "lfu": the clock of each key's last use
    step, requests, clock = 1.0, 0, 0
    keys = acc.key.tolist()
    split = chooser_split_passes(len(np.unique(acc.pass_ordinal[acc.decode]))) if chooser else None
    pending = False
    decode_pass = -1

    def request(key: int) -> None:
        nonlocal step, requests, clock
        if decay_every and requests and requests % decay_every == 0:
            step *= 2.0
        requests += 1
        count[key] += step
        clock += 1
        last[key] = clock

    for i, j, _, picks in _passes_with_picks(acc):
        if acc.decode[i]:
            decode_pass += 1
            if pending:
                cache.update(kept)  # the turn below judges every cached key
                kept.clear()
                pending = False
                outside = [k for k in np.argsort(-score, kind="stable").tolist() if score[k] > 0 and k not in cache]
                weakest = [(-1.0, -1)] * (capacity - len(cache)) + sorted(
                    ((float(score[k]), r) for r, k in enumerate(cache)), key=lambda x: x[0])
                held = list(cache)
                for k, (victim_score, rank) in zip(outside, weakest):
                    if victim_score >= 0 and not score[k] > factor * victim_score:
                        break
                    if rank >= 0:
                        del cache[held[rank]]
                    cache[k] = None
                    clock += 1
                    last[k] = clock
                if decode == "kept":
                    for k in [k for k in cache if score[k] > 0]:
                        kept[k] = cache.pop(k)
            fills = decode != "frozen" and (split is None or decode_pass in split)
            for a in range(i, j):
                key = keys[a]
                if not fills:
                    hits[a] = key in cache or key in kept
                    continue
                if decode == "lfu":
                    request(key)
                for part in (kept, cache):
                    if key in part:
                        part.move_to_end(key)
                        hits[a] = True
                        break
                else:
                    if len(cache) + len(kept) >= capacity:
                        if decode == "lfu":
                            del cache[min(cache, key=lambda k: (count[k], last[k]))]  # O(capacity): small traces
                        else:
                            (cache if cache else kept).popitem(last=False)
                    cache[key] = None
        else:
            if kept:  # a prompt pass: every key judged by recency again, the kept ones the least recent
                kept.update(cache)
                cache, kept = kept, OrderedDict()
            for a in range(i, j):
                key = keys[a]
                request(key)
                if key in cache:
                    cache.move_to_end(key)
                    hits[a] = True
                    continue
                if len(cache) >= capacity:
                    cache.popitem(last=False)
                cache[key] = None
            score *= 2.0 ** (-(len(picks) / max(1, picks_per_token)) / half_tokens)
            score += np.bincount(picks, minlength=n_keys)
            pending = True
    return hits


def cache_rates(acc: Accesses, n_keys: int, sizes: list[int], decay_every: int | None = None,
                policies: Sequence[str] = DEFAULT_POLICIES, n_expert: int = 1,
                admit_factor: float = ADMIT_FACTOR, picks_per_token: int = 1,
                favourite_factor: float = FAVOURITE_FACTOR) -> dict:
    """Hit rates of the policies at each size (percent of n_keys), over all accesses and over decode accesses, and
    decode's expert transfers per token where they follow from the hits: a miss moves an expert once (copied in, or
    read in place where the cache stays as it is), and an admitting policy's admitted miss moves it twice (read in
    place by its pass, then copied into the cache)."""
    keys, nxt = acc.key.tolist(), acc.next_use.tolist()
    capacities = [max(1, n_keys * x // 100) for x in sizes]
    fills = bytearray(len(acc))  # the admitting policies' decode fills (one byte per access), per simulation
    simulate = {
        "lru": lambda cap: lru_hits(keys, cap),
        "lfu": lambda cap: lfu_hits(keys, cap),
        "lfu_decay": lambda cap: lfu_hits(keys, cap, decay_every or cap),
        "belady": lambda cap: belady_hits(keys, cap, nxt),
        "lru_frozen": lambda cap: lru_hits(keys, cap, acc.decode),
        "lfu_decay_frozen": lambda cap: lfu_hits(keys, cap, decay_every or cap, acc.decode),
        "lfu_decay_admit": lambda cap: lfu_hits(keys, cap, decay_every or cap, admit=acc.decode,
                                                admit_factor=admit_factor, inserted=fills),
        "markov": lambda cap: markov_hits(acc, n_expert, cap),
        "next_use": lambda cap: next_use_hits(acc, n_expert, cap, decay_every or cap, inserted=fills),
        "prompt_filled": lambda cap: prompt_filled_hits(acc, cap),
        "favourites": lambda cap: favourites_hits(acc, cap, picks_per_token, favourite_factor),
        "favourites_lru": lambda cap: favourites_hits(acc, cap, picks_per_token, favourite_factor, decode="lru"),
        "favourites_kept": lambda cap: favourites_hits(acc, cap, picks_per_token, favourite_factor, decode="kept"),
        "favourites_lfu": lambda cap: favourites_hits(acc, cap, picks_per_token, favourite_factor, decode="lfu",
                                                      decay_every=decay_every or cap),
        "auto_lru": lambda cap: favourites_hits(acc, cap, picks_per_token, favourite_factor, decode="lru",
                                                chooser=True),
        "auto_lfu": lambda cap: favourites_hits(acc, cap, picks_per_token, favourite_factor, decode="lfu",
                                                chooser=True, decay_every=decay_every or cap),
    }
    rates: dict = {p: [] for p in policies}
    decode_rates: dict = {p: [] for p in policies}
    transfers: dict = {p: [] for p in policies if p in TRANSFER_POLICIES}
    any_decode = bool(acc.decode.any())
    n_tokens = len(np.unique(acc.pass_ordinal[acc.decode]))
    for cap in capacities:
        for policy in policies:
            fills[:] = bytes(len(acc))
            hits = simulate[policy](cap)
            rates[policy].append(float(hits.mean()) if len(acc) else None)
            decode_rates[policy].append(float(hits[acc.decode].mean()) if any_decode else None)
            if policy in transfers:
                moved = int(np.count_nonzero(~hits[acc.decode]))
                if policy in ADMITTING_POLICIES:  # a miss read in place, and the admitted ones copied in as well
                    moved += int(np.count_nonzero(np.frombuffer(fills, dtype=np.uint8)[acc.decode]))
                transfers[policy].append(moved / n_tokens if any_decode else None)
    return {"sizes": list(sizes), "capacities": capacities, "keys": n_keys, "decay_every": decay_every,
            "admit_factor": admit_factor, "hit_rate": rates, "decode_hit_rate": decode_rates,
            "decode_transfers_per_token": transfers}


def engine_decay_every(trace: Trace) -> int:
    """The engine's LFU decay period (strata/memory_strata.cpp): 32 decode steps' worth of requests."""
    return ENGINE_DECAY_TOKENS * max(1, moe_layers(trace).shape[0] * trace.k)


def summarize(trace: Trace, sizes: list[int] = DEFAULT_SIZES, decay_every: int | None = None,
              policies: Sequence[str] = DEFAULT_POLICIES, admit_factor: float = ADMIT_FACTOR,
              favourite_factor: float = FAVOURITE_FACTOR) -> dict:
    """Every figure of the summary, as the JSON output holds them."""
    acc = accesses(trace)
    decay_every = decay_every or engine_decay_every(trace)
    return {
        "header": header_facts(trace, acc),
        "popularity": popularity(trace),
        "reuse": reuse(acc),
        "cache": cache_rates(acc, moe_layers(trace).shape[0] * trace.n_expert, sizes, decay_every, policies,
                             trace.n_expert, admit_factor, moe_layers(trace).shape[0] * trace.k,
                             favourite_factor),
    }


# ---- output -----------------------------------------------------------------------------------------------------


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    parts, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(parts)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _dist(x: float | None) -> str:
    return "-" if x is None else ("inf" if math.isinf(x) else str(int(x)))


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def to_markdown(s: dict) -> str:
    h, pop, cache = s["header"], s["popularity"], s["cache"]
    out = [f"# Routing trace {h['file']}", ""]
    out += _table(["fact", "value"], [
        ["MoE layers", f"{len(h['moe_layers'])} of {h['n_layer']} ({_ranges(h['moe_layers'])})"],
        ["n_expert, k", f"{h['n_expert']}, {h['k']}"],
        ["passes", f"{h['passes']}: {h['prefill_passes']} prefill (n_tokens > 1), {h['decode_passes']} decode "
                   f"(n_tokens = 1)"],
        ["tokens", str(h["tokens"])],
        ["records", f"{h['records']} (weights {'present' if h['weights'] else 'absent'})"],
        ["expert accesses", f"{h['accesses']} (distinct experts per pass and layer)"],
    ])

    def spread_row(name: str, d: dict) -> list[str]:
        entropy = "-" if d["entropy"] is None else f"{d['entropy']:.3f}"
        return [name, _pct(d["top_share"]), entropy, str(d["never_picked"])]

    out += ["", "## Expert popularity", "",
            f"Share of the token-expert picks taken by the top 10% ({pop['top_experts']} experts of a layer; "
            f"{pop['overall']['top_keys']} of the {pop['overall']['keys']} (layer, expert) keys for all), entropy "
            f"over its maximum, experts never picked.", ""]
    out += _table(["layer", "top 10% share", "entropy", "never picked"],
                  [spread_row(str(d["layer"]), d) for d in pop["layers"]] + [spread_row("all", pop["overall"])])

    out += ["", "## Reuse distance", "",
            "Passes since the access's (layer, expert) was last accessed; first use is infinite. Never reused: the "
            "key is not accessed again.", ""]
    rows = []
    for name, d in s["reuse"].items():
        if d["accesses"]:
            rows.append([name, str(d["accesses"]), _dist(d["median"]), _dist(d["p90"]), _pct(d["distance_1"]),
                         _pct(d["first_use"]), _pct(d["never_reused"])])
        else:
            rows.append([name, "0"] + ["-"] * 5)
    out += _table(["passes", "accesses", "median", "p90", "distance 1", "first use", "never reused"], rows)

    decay = f"every {cache['decay_every']} accesses" if cache["decay_every"] else "every <capacity> accesses"
    out += ["", "## Expert cache hit rates", "",
            f"One cache over all {cache['keys']} (layer, expert) keys; size in % of them. LFU decay halves the counts "
            f"{decay}" + (f"; admitting in decode, a miss enters above {cache['admit_factor']:g} x the victim's count"
                          if "lfu_decay_admit" in cache["hit_rate"] else "") + ".", ""]
    for title, rates in (("All accesses", cache["hit_rate"]),
                         ("Decode accesses only (prefill passes still update the cache)", cache["decode_hit_rate"])):
        out += [f"### {title}", ""]
        out += _table(["size", "capacity"] + [POLICIES[p] for p in rates],
                      [[f"{x}%", str(c)] + [_pct(r[i]) for r in rates.values()]
                       for i, (x, c) in enumerate(zip(cache["sizes"], cache["capacities"]))])
        out.append("")
    moved = cache.get("decode_transfers_per_token") or {}
    if moved and any(v is not None for r in moved.values() for v in r):
        out += ["### Decode expert transfers per token", "",
                "Misses (copied in, or read in place where the cache stays), plus the copies of the misses an "
                "admitting policy lets in: the bytes a decode moves over the bus, in experts.", ""]
        out += _table(["size", "capacity"] + [POLICIES[p] for p in moved],
                      [[f"{x}%", str(c)] + ["-" if r[i] is None else f"{r[i]:.2f}" for r in moved.values()]
                       for i, (x, c) in enumerate(zip(cache["sizes"], cache["capacities"]))])
        out.append("")
    return "\n".join(out)


def _json_safe(x):
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and math.isinf(x):
        return None
    return x


def _sizes(text: str) -> list[int]:
    sizes = [int(x) for x in text.split(",") if x.strip()]
    if not sizes or any(not 0 < x <= 100 for x in sizes):
        raise argparse.ArgumentTypeError(f"sizes are percentages in 1..100, comma-separated: {text!r}")
    return sizes


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a positive number of accesses expected: {text!r}")
    return int(text)


def _factor(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not (v >= 0.0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"a factor of 0 or more expected: {text!r}")
    return v


def _policies(text: str) -> list[str]:
    policies = [x.strip() for x in text.split(",") if x.strip()]
    if not policies or any(p not in POLICIES for p in policies):
        raise argparse.ArgumentTypeError(f"policies are {', '.join(POLICIES)}, comma-separated: {text!r}")
    return policies


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path, help="a routing trace (strata run/bench --routing-trace FILE)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of markdown tables")
    ap.add_argument("--sizes", type=_sizes, default=DEFAULT_SIZES,
                    help="cache sizes in %% of (MoE layers x n_expert), comma-separated (default 10,20,...,90)")
    ap.add_argument("--decay-every", type=_positive, help="LFU decay: halve the counts every N accesses (default: the engine's, 32 x MoE layers x k)")
    ap.add_argument("--admit-factor", type=_factor, default=ADMIT_FACTOR,
                    help="LFU admitting in decode: a miss enters above this times the victim's count "
                         f"(default {ADMIT_FACTOR:g}, the engine's)")
    ap.add_argument("--favourite-factor", type=_factor, default=FAVOURITE_FACTOR,
                    help="favourites: a slot gives way to a key outside scoring above this times its score "
                         f"(default {FAVOURITE_FACTOR:g}, the engine's)")
    ap.add_argument("--policies", type=_policies, default=list(DEFAULT_POLICIES),
                    help=f"cache policies to simulate, comma-separated (default {','.join(DEFAULT_POLICIES)}; "
                         f"all: {','.join(POLICIES)})")
    args = ap.parse_args(argv)
    try:
        s = summarize(read_trace(args.trace), args.sizes, args.decay_every, args.policies, args.admit_factor,
                      args.favourite_factor)
    except (ValueError, OSError) as e:
        print(f"summary: {e}", file=sys.stderr)
        return 2
    print(json.dumps(_json_safe(s), indent=1) if args.json else to_markdown(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
