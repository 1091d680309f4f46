"""The routing-trace tool (tools/trace): the reader and writer, the access stream, popularity, reuse distance, the
cache policies (by hand, against plain reference implementations, and their bounds on random traces) and the command
line."""
import json
import math
import pathlib
import struct
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from tools.trace import read_trace, summary, write_trace
from tools.trace.trace import HEADER, RECORD_HEADER

ROOT = pathlib.Path(__file__).resolve().parents[2]
A, B, C = 0, 1, 2  # keys of the hand-computed access sequences


def _records(rng, moe=(1, 3, 4), n_expert=16, k=4, passes=60, prompt=(9, 5)):
    """A trace's records: prompt chunks of the given sizes, then single-token decode passes; Zipf-like routing."""
    zipf = np.arange(1, n_expert + 1, dtype=float) ** -1.1
    logp = {layer: np.log(zipf[rng.permutation(n_expert)]) for layer in moe}  # each layer its own favourites
    out = []
    for i in range(passes):
        t = prompt[i] if i < len(prompt) else 1
        for layer in moe:
            g = logp[layer] - np.log(-np.log(rng.random((t, n_expert))))  # Gumbel top-k: k draws without replacement
            ids = np.argsort(-g, axis=1)[:, :k]
            w = rng.random((t, k)).astype(np.float16)
            out.append((i, layer, ids, w))
    return out


def _write(path, records, n_layer=6, n_expert=16, k=4, with_weights=True):
    write_trace(path, n_layer, n_expert, k, records, with_weights)
    return path


# ---- reader and writer -----------------------------------------------------------------------------------------


def test_round_trip(tmp_path):
    recs = _records(np.random.default_rng(0))
    t = read_trace(_write(tmp_path / "a.trace", recs))
    assert (t.n_layer, t.n_expert, t.k, len(t)) == (6, 16, 4, len(recs))
    assert t.ids.dtype == np.uint16 and t.weights.dtype == np.float16
    for (p, layer, ids, w), r in zip(recs, t):
        assert (r.pass_index, r.layer, r.n_tokens) == (p, layer, ids.shape[0])
        assert r.ids.shape == (ids.shape[0], 4) and np.array_equal(r.ids, ids)
        assert np.array_equal(r.weights, w)
    assert t.record(0).n_tokens == 9 and t.record(len(t) - 1).n_tokens == 1

    bare = read_trace(_write(tmp_path / "b.trace", recs, with_weights=False))
    assert bare.weights is None and all(r.weights is None for r in bare)
    assert np.array_equal(bare.ids, t.ids) and np.array_equal(bare.n_tokens, t.n_tokens)
    # The file is exactly the header and the records the spec lays out.
    size = HEADER.size + sum(RECORD_HEADER.size + ids.size * 2 for _, _, ids, _ in recs)
    assert (tmp_path / "b.trace").stat().st_size == size

    empty = read_trace(_write(tmp_path / "c.trace", []))
    assert len(empty) == 0 and empty.ids.shape == (0, 4)


def test_default_weights(tmp_path):
    t = read_trace(_write(tmp_path / "w.trace", [(0, 1, [[3, 2, 1, 0]], None)]))
    assert t.weights.tolist() == [[0.25] * 4]


def _header(version=1, n_layer=6, n_expert=16, k=4, flags=1, magic=b"STRTRACE"):
    return struct.pack("<8s6I", magic, version, n_layer, n_expert, k, flags, 0)


@pytest.mark.parametrize("header, message", [
    (_header(magic=b"GGUF\x03\x00\x00\x00"), "not a routing trace: magic"),
    (_header(version=2), "unsupported version 2"),
    (_header(flags=3), "unknown flags 0x3"),
    (_header(k=17), "bad header: n_expert 16, k 17"),
    (_header()[:20], "header cut short: 32 bytes expected, the file has 20"),
])
def test_rejects_bad_header(tmp_path, header, message):
    path = tmp_path / "bad.trace"
    path.write_bytes(header)
    with pytest.raises(ValueError, match=message) as e:
        read_trace(path)
    assert str(path) in str(e.value)


def test_rejects_cut_short_records(tmp_path):
    path = _write(tmp_path / "t.trace", [(0, 1, [[0, 1, 2, 3]] * 3, None), (0, 3, [[4, 5, 6, 7]] * 3, None)])
    data = path.read_bytes()
    second = HEADER.size + RECORD_HEADER.size + 3 * 4 * 4  # the first record: 3 tokens x 4 ids and 4 weights
    assert len(data) == second + RECORD_HEADER.size + 3 * 4 * 4

    path.write_bytes(data[:-2])
    with pytest.raises(ValueError, match=rf"{path}: record at byte {second} \(pass 0, layer 3\) cut short: 3 tokens "
                                         r"x 4 ids and weights need 48 bytes, 46 left"):
        read_trace(path)
    path.write_bytes(data + b"\x00" * 5)
    with pytest.raises(ValueError, match=rf"record at byte {len(data)} cut short: 12 bytes of pass, layer, n_tokens "
                                         r"expected, 5 left"):
        read_trace(path)


def test_rejects_bad_ids_and_layers(tmp_path):
    path = _write(tmp_path / "t.trace", [(0, 1, [[0, 1, 2, 3]], None), (0, 3, [[4, 16, 6, 7]], None)])
    second = HEADER.size + RECORD_HEADER.size + 16
    with pytest.raises(ValueError, match=rf"{path}: record at byte {second} \(pass 0, layer 3\): expert id 16 at byte "
                                         rf"{second + RECORD_HEADER.size + 2} >= n_expert 16"):
        read_trace(path)
    path = _write(tmp_path / "l.trace", [(0, 6, [[0, 1, 2, 3]], None)])
    with pytest.raises(ValueError, match=r"record at byte 32 \(pass 0\): layer 6 >= n_layer 6"):
        read_trace(path)


# ---- access stream, popularity, reuse ----------------------------------------------------------------------------


@pytest.fixture
def small_trace(tmp_path):
    """MoE layers 1 and 3 of 4, 4 experts, k 2: a prompt chunk of two tokens, then one decode pass."""
    return read_trace(_write(tmp_path / "s.trace", [
        (0, 1, [[3, 1], [1, 0]], None),  # distinct 0, 1, 3: keys 0, 1, 3
        (0, 3, [[2, 0], [0, 2]], None),  # distinct 0, 2: keys 4 + 0, 4 + 2
        (1, 1, [[2, 1]], None),  # keys 1, 2
        (1, 3, [[3, 0]], None),  # keys 4, 7
    ], n_layer=4, n_expert=4, k=2))


def test_access_stream_and_header(small_trace):
    acc = summary.accesses(small_trace)
    assert acc.key.tolist() == [0, 1, 3, 4, 6, 1, 2, 4, 7]
    assert acc.decode.tolist() == [False] * 5 + [True] * 4
    assert acc.pass_ordinal.tolist() == [0] * 5 + [1] * 4
    h = summary.header_facts(small_trace, acc)
    assert h["moe_layers"] == [1, 3] and (h["n_layer"], h["n_expert"], h["k"]) == (4, 4, 2)
    assert (h["passes"], h["prefill_passes"], h["decode_passes"], h["tokens"], h["accesses"]) == (2, 1, 1, 3, 9)


def test_popularity(small_trace):
    pop = summary.popularity(small_trace)
    # Picks per expert: layer 1 [1, 3, 1, 1], layer 3 [3, 0, 2, 1]; the top 10% of 4 experts is 1 expert (at least 1),
    # of the 8 keys also 1.
    l1, l3 = pop["layers"]
    assert (l1["layer"], l1["picks"], l1["top_share"], l1["never_picked"]) == (1, 6, 0.5, 0)
    assert (l3["layer"], l3["picks"], l3["top_share"], l3["never_picked"]) == (3, 6, 0.5, 1)
    p = np.array([1, 3, 1, 1]) / 6
    assert l1["entropy"] == pytest.approx(-np.sum(p * np.log(p)) / math.log(4))
    assert pop["overall"]["top_share"] == 3 / 12 and pop["overall"]["never_picked"] == 1
    assert pop["overall"]["keys"] == 8 and pop["overall"]["top_keys"] == 1
    uniform = read_trace(_write(small_trace.path.with_name("u.trace"), [(0, 0, [[0, 1], [2, 3]], None)],
                                n_layer=1, n_expert=4, k=2))
    assert summary.popularity(uniform)["layers"][0]["entropy"] == pytest.approx(1.0)


def test_reuse_distance(tmp_path):
    t = read_trace(_write(tmp_path / "r.trace", [
        (0, 2, [[0, 1], [2, 1]], None),  # accesses 0-2: experts 0, 1, 2, all first uses
        (1, 2, [[3, 1]], None),  # 3: expert 1, used in pass 0 -> 1; 4: expert 3, first use
        (2, 2, [[1, 0]], None),  # 5: expert 0 -> 2; 6: expert 1 -> 1
        (3, 2, [[2, 3]], None),  # 7: expert 2 -> 3; 8: expert 3 -> 2
    ], n_layer=3, n_expert=4, k=2))
    acc = summary.accesses(t)
    inf = math.inf
    assert acc.distance.tolist() == [inf, inf, inf, 1, inf, 2, 1, 3, 2]
    assert acc.next_use.tolist() == [5, 3, 7, 6, 8, 9, 9, 9, 9]  # 9: never again
    r = summary.reuse(acc)
    # Decode: sorted [1, 1, 2, 2, 3, inf]; nearest rank: the median is the 3rd, p90 the 6th; accesses 5-8 never recur.
    assert r["decode"] == {"accesses": 6, "median": 2, "p90": inf, "distance_1": 2 / 6, "first_use": 1 / 6,
                           "never_reused": 4 / 6}
    # All: [1, 1, 2, 2, 3, inf x 4]: the median is the 5th.
    assert r["all"] == {"accesses": 9, "median": 3, "p90": inf, "distance_1": 2 / 9, "first_use": 4 / 9,
                        "never_reused": 4 / 9}
    assert r["prefill"]["median"] == inf and r["prefill"]["never_reused"] == 0


def test_reuse_distance_counts_passes_in_trace_order(tmp_path):
    # The pass field skips (a trace started mid-run): distance counts the passes the trace holds.
    t = read_trace(_write(tmp_path / "g.trace", [(5, 0, [[0]], None), (9, 0, [[0]], None)], 1, 2, 1))
    assert summary.accesses(t).distance.tolist() == [math.inf, 1]


# ---- cache policies by hand ------------------------------------------------------------------------------------


def test_lru_by_hand():
    # Capacity 2. A, B miss; A hits (B is now least recent); C evicts B; B evicts A; A evicts C.
    assert summary.lru_hits([A, B, A, C, B, A], 2).tolist() == [0, 0, 1, 0, 0, 0]


def test_lfu_by_hand():
    # Capacity 2, counts over all history:
    # t0 A miss (A1); t1 A hit (A2); t2 B miss (B1); t3 C miss (C1), evicts B (1 < 2);
    # t4 B miss, B2 (its count survived), evicts C (1); cache A2 B2;
    # t5 C miss (C2), A2 and B2 tie: A was used least recently (t1), evicted;
    # t6 A miss (A3), B2 (t4) and C2 (t5) tie: B evicted; t7 B miss (B3), evicts C (2 < 3).
    # Counting only while cached, B would re-enter with 1 at t4 and A would still be cached at t6 (a hit).
    assert summary.lfu_hits([A, A, B, C, B, C, A, B], 2).tolist() == [0, 1, 0, 0, 0, 0, 0, 0]


def test_lfu_decay_by_hand():
    # Capacity 2, counts halved after every 2 accesses (after t1, t3, t5):
    # t0 A miss (A1); t1 A hit (A2), halved: A1; t2 A hit (A2); t3 B miss (B1), halved: A1, B0.5;
    # t4 C miss (C1), evicts B (0.5); t5 B miss (B1.5), A1 (t2) and C1 (t4) tie: A evicted; halved: A0.5, B0.75, C0.5;
    # t6 A miss (A1.5), evicts C (0.5 < 0.75).
    seq = [A, A, A, B, C, B, A]
    assert summary.lfu_hits(seq, 2, decay_every=2).tolist() == [0, 1, 1, 0, 0, 0, 0]
    # Without decay A's three early uses keep it cached: t5 evicts C (C1 < A3) and t6 hits.
    assert summary.lfu_hits(seq, 2).tolist() == [0, 1, 1, 0, 0, 0, 1]


def test_belady_by_hand():
    # Capacity 2, a loop of three keys. t2 C: A is next used at t3, B at t4: B evicted; t3 A hits;
    # t4 B: A is never used again, C at t5: A evicted; t5 C hits. LRU and LFU miss every time on a loop.
    seq = [A, B, C, A, B, C]
    assert summary.belady_hits(seq, 2).tolist() == [0, 0, 0, 1, 0, 1]
    assert summary.lru_hits(seq, 2).tolist() == [0] * 6
    assert summary.lfu_hits(seq, 2).tolist() == [0] * 6
    # Never-again first: at t2, B (never used again) goes before A (used at t3).
    assert summary.belady_hits([A, B, C, A], 2).tolist() == [0, 0, 0, 1]


def test_frozen_by_hand():
    # Capacity 2; t0-t1 fill (A, B); decode t2-t4 only looks: A hits, C misses and is not inserted, A hits (and is
    # not made recent); t5 fills C, evicting A (B was used after A when the cache last changed); t6 A misses.
    seq = [A, B, A, C, A, C, A]
    frozen = [0, 0, 1, 1, 1, 0, 0]
    assert summary.lru_hits(seq, 2, frozen).tolist() == [0, 0, 1, 0, 1, 0, 0]
    assert summary.lru_hits(seq, 2).tolist() == [0, 0, 1, 0, 1, 1, 1]
    # LFU: frozen accesses count nothing, so at t5 A1 (t0) and B1 (t1) tie for C's place: A, the least recently used,
    # is evicted, and t6 A misses.
    assert summary.lfu_hits(seq, 2, None, frozen).tolist() == [0, 0, 1, 0, 1, 0, 0]
    # Without freezing A's counts keep it: t5 C hits (inserted at t3 over B), t6 A hits.
    assert summary.lfu_hits(seq, 2).tolist() == [0, 0, 1, 0, 1, 1, 1]


def test_admit_by_hand():
    # Capacity 1, the engine's factor 2: A fills in a prompt (count 1); decode then asks for B: counts 1 and 2 are not
    # above twice A's, so B is read where it is (misses, the cache unchanged); at 3 it takes A's place; then hits.
    seq = [A, B, B, B, B]
    admit = [0, 1, 1, 1, 1]
    ins = bytearray(len(seq))
    assert summary.lfu_hits(seq, 1, None, admit=admit, inserted=ins).tolist() == [0, 0, 0, 0, 1]
    assert list(ins) == [1, 0, 0, 1, 0]
    # without admission every miss enters: B takes A's place at once
    assert summary.lfu_hits(seq, 1).tolist() == [0, 0, 1, 1, 1]
    # factor 1: B enters once its count (2) is above A's (1); factor 0 admits every miss, as no admission does
    assert summary.lfu_hits(seq, 1, None, admit=admit, admit_factor=1.0).tolist() == [0, 0, 0, 1, 1]
    assert summary.lfu_hits(seq, 1, None, admit=admit, admit_factor=0.0).tolist() == [0, 0, 1, 1, 1]


def _hand_stream(keys, passes, decode):
    keys = np.array(keys, dtype=np.int64)
    nxt, _ = summary.next_uses(keys)
    return summary.Accesses(keys, np.array(passes, dtype=np.int64), np.array(decode, dtype=bool), nxt,
                            np.zeros(len(keys)))


def test_next_use_by_hand():
    # Two MoE layers of two experts (keys 0, 1 in layer 0; 2, 3 in layer 1), capacity 2, no decay; a pass reads
    # layer 0 then layer 1. Keys 0 and 2 fill the cache and hit in pass 1. In pass 2 key 1 misses: 0 and 2 were used
    # in 2 of 3 passes, so each waits L (1 - p) / p = 1 layer step past its layer's turn, which comes in 1 step for
    # key 2 (layer 1, next) and 2 for key 0 (layer 0, just passed): key 0 is expected farthest (3 against 2).
    keys, passes = [0, 2, 0, 2, 1, 2, 0], [0, 0, 1, 1, 2, 2, 3]
    # Decoding, key 1 (1 pass of 3) would wait 2 + 2 * (2/3) / (1/3) = 6 > 3: read where it is; key 0 then hits.
    acc = _hand_stream(keys, passes, [1] * 7)
    assert summary.next_use_hits(acc, 2, 2).tolist() == [0, 0, 1, 1, 0, 1, 1]
    # LFU evicts the least recently used of the two equal counts, key 0, which misses when it comes back
    assert summary.lfu_hits(keys, 2).tolist() == [0, 0, 1, 1, 0, 1, 0]
    # A prompt pass (pass 2) admits every miss: key 1 takes key 0's place, not key 2's (equal rates, key 0's layer
    # comes round later), so key 2 hits and key 0 misses.
    acc = _hand_stream(keys, passes, [1, 1, 1, 1, 0, 0, 1])
    assert summary.next_use_hits(acc, 2, 2).tolist() == [0, 0, 1, 1, 0, 1, 0]
    # The same rates, layer 1's key 3 the newcomer (a prompt pass reading layer 1 only): it takes the place of key 2,
    # whose layer's turn is now (a whole cycle to its next), not of key 0, whose turn comes next; LFU's recency takes
    # key 0.
    keys, passes = [0, 2, 0, 2, 3, 0, 2], [0, 0, 1, 1, 2, 3, 3]
    acc = _hand_stream(keys, passes, [1, 1, 1, 1, 0, 1, 1])
    assert summary.next_use_hits(acc, 2, 2).tolist() == [0, 0, 1, 1, 0, 1, 0]
    assert summary.lfu_hits(keys, 2).tolist() == [0, 0, 1, 1, 0, 0, 1]
    # One layer, capacity 1, a prompt pass asking for keys 0 and 1 together: 1 does not evict 0, which the same
    # record asked for (the engine acquires a layer's experts together); it is read, and 0 hits in the next pass.
    acc = _hand_stream([0, 1, 0], [0, 0, 1], [0, 0, 1])
    assert summary.next_use_hits(acc, 2, 1).tolist() == [0, 0, 1]
    assert summary.lfu_hits([0, 1, 0], 1).tolist() == [0, 0, 0]


def test_decode_transfers_count_admitted_misses_twice():
    # test_next_use_by_hand's first stream, every pass a decode pass of one token, two places. Expected next use:
    # misses at accesses 0, 1 and 4, and 0 and 1 are let in (empty places): 3 + 2 = 5 transfers over 4 tokens. LFU
    # with decay fills every miss, each one transfer: 4 misses over 4 tokens; so does Belady here (1 takes 0's place,
    # which is used again after 2), where a cache that could leave 1 out would move 3.
    acc = _hand_stream([0, 2, 0, 2, 1, 2, 0], [0, 0, 1, 1, 2, 2, 3], [1] * 7)
    r = summary.cache_rates(acc, 4, [50], decay_every=1000, policies=["next_use", "lfu_decay", "belady"],
                            n_expert=2)
    assert r["capacities"] == [2]
    assert r["decode_transfers_per_token"] == {"next_use": [1.25], "lfu_decay": [1.0], "belady": [1.0]}
    assert "favourites" not in summary.cache_rates(acc, 4, [50], policies=["favourites"])[
        "decode_transfers_per_token"]


def test_prompt_filled_by_hand(tmp_path):
    # One MoE layer (layer 2 of 4), 4 experts, top-1. A 5-token prompt picks expert 3 three times and 1 twice: a
    # cache of one key holds 3, of two keys 3 and 1; decode only looks. A second prompt pass of 4 tokens picking 1
    # makes 1 the favourite (6 against 3). Decode: 3, 1, 0, then after the second prompt 1, 3.
    one = lambda *ids: np.array(ids, dtype=np.int64).reshape(-1, 1)
    recs = [(0, 2, one(3, 1, 3, 1, 3), None), (1, 2, one(3), None), (2, 2, one(1), None), (3, 2, one(0), None),
            (4, 2, one(1, 1, 1, 1), None), (5, 2, one(1), None), (6, 2, one(3), None)]
    t = read_trace(_write(tmp_path / "p.trace", recs, n_layer=4, n_expert=4, k=1, with_weights=False))
    acc = summary.accesses(t)
    assert sorted(acc.prefill_key.tolist()) == [1, 1, 1, 1, 1, 1, 3, 3, 3]
    dec = acc.decode
    assert summary.prompt_filled_hits(acc, 1)[dec].tolist() == [True, False, False, True, False]
    assert summary.prompt_filled_hits(acc, 2)[dec].tolist() == [True, True, False, True, True]
    # the same through cache_rates: one key (25% of 4), 2 of the 5 decode accesses hit
    rates = summary.cache_rates(acc, 4, [25], policies=["prompt_filled", "lfu"])
    assert rates["decode_hit_rate"]["prompt_filled"][0] == pytest.approx(2 / 5)


def test_favourites_by_hand(tmp_path, capsys):
    # One MoE layer (layer 2 of 4), 4 experts, top-1. A 4-token prompt picks 0 three times and 2 once: LRU leaves 2
    # in a one-key cache (the record's keys come in ascending order), and the favourites put 0 (3 against 1, above
    # 1.5 times) in its place as decoding begins; decode only looks. At a factor of 3.5, 2 stays, as LRU frozen has it.
    one = lambda *ids: np.array(ids, dtype=np.int64).reshape(-1, 1)
    recs = [(0, 2, one(0, 0, 2, 0), None), (1, 2, one(0), None), (2, 2, one(2), None), (3, 2, one(0), None)]
    path = _write(tmp_path / "f.trace", recs, n_layer=4, n_expert=4, k=1, with_weights=False)
    acc = summary.accesses(read_trace(path))
    dec = acc.decode
    assert summary.favourites_hits(acc, 1, 1)[dec].tolist() == [True, False, True]
    assert summary.favourites_hits(acc, 1, 1, factor=3.5)[dec].tolist() == [False, True, False]
    assert summary.lru_hits(acc.key, 1, acc.decode)[dec].tolist() == [False, True, False]
    # a second key: both held, nothing to move
    assert summary.favourites_hits(acc, 2, 1)[dec].tolist() == [True, True, True]
    # the command line's factor reaches the simulation; a negative one is refused
    assert summary.main([str(path), "--json", "--sizes", "25", "--policies", "favourites"]) == 0
    assert json.loads(capsys.readouterr().out)["cache"]["decode_hit_rate"]["favourites"] == [pytest.approx(2 / 3)]
    assert summary.main([str(path), "--json", "--sizes", "25", "--policies", "favourites,lru_frozen",
                         "--favourite-factor", "3.5"]) == 0
    rates = json.loads(capsys.readouterr().out)["cache"]["decode_hit_rate"]
    assert rates["favourites"] == rates["lru_frozen"] == [pytest.approx(1 / 3)]
    with pytest.raises(SystemExit):
        summary.main([str(path), "--favourite-factor", "-1"])


def test_favourites_when_decode_fills(tmp_path):
    # One MoE layer, 4 experts, top-1, two keys. A 4-token prompt picks 0 three times and 1 once: LRU leaves both
    # (0 the least recently used), both favourites. Decode asks for 2, 3, 1, 2 and fills its misses. Under LRU, 2
    # takes 0's place and 3 takes 1's, so 1 misses; kept, 2 takes the least recently used favourite's place (0) and
    # 3 then takes 2's (the one key outside the favourites), so 1 still hits; frozen, only 1 hits.
    one = lambda *ids: np.array(ids, dtype=np.int64).reshape(-1, 1)
    recs = [(0, 2, one(0, 0, 1, 0), None), (1, 2, one(2), None), (2, 2, one(3), None), (3, 2, one(1), None),
            (4, 2, one(2), None)]
    acc = summary.accesses(read_trace(_write(tmp_path / "d.trace", recs, n_layer=4, n_expert=4, k=1,
                                             with_weights=False)))
    dec = acc.decode
    assert summary.favourites_hits(acc, 2, 1)[dec].tolist() == [False, False, True, False]
    assert summary.favourites_hits(acc, 2, 1, decode="lru")[dec].tolist() == [False, False, False, False]
    assert summary.favourites_hits(acc, 2, 1, decode="kept")[dec].tolist() == [False, False, True, False]
    # plain LRU over the same stream, as the engine's passes split with the host fill
    assert summary.lru_hits(acc.key, 2)[dec].tolist() == [False, False, False, False]
    rates = summary.cache_rates(acc, 4, [50], policies=["favourites_lru", "favourites_kept"], picks_per_token=1)
    assert rates["decode_hit_rate"]["favourites_kept"] == [pytest.approx(1 / 4)]
    assert rates["decode_hit_rate"]["favourites_lru"] == [0.0]


def test_favourites_then_lfu_and_the_decode_mode(tmp_path):
    # One MoE layer, 4 experts, top-1, two keys. The prompt picks 0, 0, 1, 0: both cached, counts 1 each (a prompt
    # pass requests each of its experts once), nothing for the favourites to move. Decode: 2, 2, 2, 3, 1, 2. Under
    # LRU, 3 evicts 1 and 1 then evicts 2, so the last 2 misses; under LFU with decay (none here), 3 evicts 1
    # (count 1 against 2's 3) and 1 then evicts 3 (1 against 3), so the last 2 hits.
    one = lambda *ids: np.array(ids, dtype=np.int64).reshape(-1, 1)
    recs = [(0, 2, one(0, 0, 1, 0), None)] + [(1 + t, 2, one(e), None) for t, e in enumerate([2, 2, 2, 3, 1, 2])]
    acc = summary.accesses(read_trace(_write(tmp_path / "m.trace", recs, n_layer=4, n_expert=4, k=1,
                                             with_weights=False)))
    dec = acc.decode
    assert summary.favourites_hits(acc, 2, 1, decode="lru")[dec].tolist() == [False, True, True, False, False, False]
    assert summary.favourites_hits(acc, 2, 1, decode="lfu")[dec].tolist() == [False, True, True, False, False, True]
    # the decode mode: of six passes only the first four (its first run, split) fill; then 1 is read where it is
    # (a miss that evicts nothing) and 2 is still cached
    assert summary.favourites_hits(acc, 2, 1, decode="lru", chooser=True)[dec].tolist() == [
        False, True, True, False, False, True]
    assert summary.favourites_hits(acc, 2, 1, decode="frozen", chooser=True)[dec].tolist() == [
        False, False, False, False, True, False]


def test_the_decode_modes_split_passes():
    # strata/decode_mode.h's exploration (two runs of four each way, from Split) and probes (after 64 passes alone,
    # the interval doubling): 511 passes give 20 split ones, as the engine counted on the GPU (491 alone / 20 split)
    assert summary.chooser_split_passes(16) == set(range(0, 4)) | set(range(8, 12))
    assert summary.chooser_split_passes(300) == (set(range(0, 4)) | set(range(8, 12)) | set(range(80, 84))
                                                 | set(range(212, 216)))
    assert len(summary.chooser_split_passes(511)) == 20
    assert summary.chooser_split_passes(2) == {0, 1}


def test_admit_factor_option(tmp_path, capsys):
    # the command line's factor reaches the simulation and the header; a negative one is refused
    path = _write(tmp_path / "t.trace", _records(np.random.default_rng(8), passes=40))
    assert summary.main([str(path), "--json", "--policies", "lfu_decay_admit", "--admit-factor", "1.5"]) == 0
    assert json.loads(capsys.readouterr().out)["cache"]["admit_factor"] == 1.5
    assert summary.main([str(path), "--policies", "lfu_decay_admit", "--admit-factor", "3"]) == 0
    assert "above 3 x the victim's count" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        summary.main([str(path), "--admit-factor", "-1"])


# ---- cache policies against plain reference implementations -------------------------------------------------------


def _ref_lru(keys, cap):
    cache, hits = [], []
    for key in keys:
        hits.append(key in cache)
        if key in cache:
            cache.remove(key)
        elif len(cache) == cap:
            cache.pop(0)
        cache.append(key)
    return hits


def _ref_lfu(keys, cap, decay_every=None):
    """Counts as exact fractions, halved every decay_every accesses; evict the smallest (count, last use)."""
    count, last, cache, hits = {}, {}, set(), []
    for i, key in enumerate(keys):
        if decay_every and i and i % decay_every == 0:
            count = {k: c / 2 for k, c in count.items()}
        count[key] = count.get(key, Fraction(0)) + 1
        hits.append(key in cache)
        if key not in cache and len(cache) == cap:
            cache.remove(min(cache, key=lambda k: (count[k], last[k])))
        cache.add(key)
        last[key] = i
    return hits


def _ref_belady(keys, cap):
    cache, hits = set(), []
    for i, key in enumerate(keys):
        hits.append(key in cache)
        if key not in cache and len(cache) == cap:
            def next_use(k):
                return next((j for j in range(i + 1, len(keys)) if keys[j] == k), len(keys))
            cache.remove(max(cache, key=next_use))
        cache.add(key)
    return hits


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_policies_match_references(seed):
    rng = np.random.default_rng(seed)
    keys = (rng.zipf(1.3, 1200) % 24).tolist()  # long enough for the heaps to be rebuilt many times
    for cap in (1, 3, 8):
        assert summary.lru_hits(keys, cap).tolist() == _ref_lru(keys, cap)
        assert summary.lfu_hits(keys, cap).tolist() == _ref_lfu(keys, cap)
        assert summary.lfu_hits(keys, cap, cap).tolist() == _ref_lfu(keys, cap, cap)
        assert summary.belady_hits(keys, cap).tolist() == _ref_belady(keys, cap)
    # Halving after every access: 1,199 decays, so the fixed-point counts are rescaled on the way.
    assert summary.lfu_hits(keys, 4, 1).tolist() == _ref_lfu(keys, 4, 1)


# ---- cache policies on random traces -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [4, 5])
def test_belady_bounds_and_monotone_sizes(tmp_path, seed):
    t = read_trace(_write(tmp_path / "r.trace", _records(np.random.default_rng(seed), passes=150)))
    acc = summary.accesses(t)
    n_keys = 3 * 16
    hits = {p: [] for p in summary.POLICIES}
    for x in summary.DEFAULT_SIZES:
        cap = n_keys * x // 100
        hits["lru"].append(int(summary.lru_hits(acc.key, cap).sum()))
        hits["lfu"].append(int(summary.lfu_hits(acc.key, cap).sum()))
        hits["lfu_decay"].append(int(summary.lfu_hits(acc.key, cap, cap).sum()))
        hits["belady"].append(int(summary.belady_hits(acc.key, cap, acc.next_use).sum()))
        hits["markov"].append(int(summary.markov_hits(acc, 16, cap).sum()))
        hits["next_use"].append(int(summary.next_use_hits(acc, 16, cap, cap).sum()))
    for i in range(len(summary.DEFAULT_SIZES)):
        assert hits["belady"][i] >= max(hits["lru"][i], hits["lfu"][i], hits["lfu_decay"][i], hits["markov"][i],
                                        hits["next_use"][i])
    for p in ("lru", "belady"):
        assert hits[p] == sorted(hits[p]), p
    assert hits["belady"][-1] <= len(acc) - int(np.isinf(acc.distance).sum())  # first uses always miss

    rates = summary.cache_rates(acc, n_keys, summary.DEFAULT_SIZES)
    assert rates["capacities"] == [n_keys * x // 100 for x in summary.DEFAULT_SIZES]
    assert [round(r * len(acc)) for r in rates["hit_rate"]["belady"]] == hits["belady"]
    lru_decode = summary.lru_hits(acc.key, rates["capacities"][0])[acc.decode]
    assert rates["decode_hit_rate"]["lru"][0] == pytest.approx(lru_decode.mean())


def _sticky_records(rng, moe=(0, 2, 5), n_expert=16, k=4, passes=400, stay=0.9):
    """Decode passes whose routing sticks: a layer keeps each of its k experts from one pass to the next with
    probability `stay`, else swaps it for one drawn by a Zipf-like popularity (so frequency alone says less)."""
    zipf = np.arange(1, n_expert + 1, dtype=float) ** -0.6
    pop = {layer: zipf[rng.permutation(n_expert)] / zipf.sum() for layer in moe}
    cur = {layer: list(rng.choice(n_expert, k, replace=False, p=pop[layer])) for layer in moe}
    out = []
    for i in range(passes):
        for layer in moe:
            ids = cur[layer]
            for j in range(k):
                if rng.random() >= stay:
                    free = [e for e in range(n_expert) if e not in ids]
                    w = pop[layer][free] / pop[layer][free].sum()
                    ids[j] = int(rng.choice(free, p=w))
            out.append((i, layer, [list(ids)], None))
    return out


def test_markov_next_use_sees_routing_that_sticks(tmp_path):
    # Where an expert used at its layer's last turn is likely used again, the two-state estimate keeps those and
    # beats counting (LFU, with or without decay) by far: here 89% and 93% of the accesses against 38-69% and 53-87%.
    t = read_trace(_write(tmp_path / "s.trace", _sticky_records(np.random.default_rng(7)), with_weights=False))
    acc = summary.accesses(t)
    for cap in (12, 18):
        markov = summary.markov_hits(acc, 16, cap).mean()
        assert markov > summary.lfu_hits(acc.key, cap).mean() + 0.05
        assert markov > summary.lfu_hits(acc.key, cap, 4 * 3 * 4).mean() + 0.05
        assert markov <= summary.belady_hits(acc.key, cap, acc.next_use).mean()


# ---- command line ------------------------------------------------------------------------------------------------


def test_cli(tmp_path):
    path = _write(tmp_path / "cli.trace", _records(np.random.default_rng(6), passes=40))
    run = subprocess.run([sys.executable, "-m", "tools.trace.summary", str(path), "--sizes", "25,50"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    text = run.stdout
    for heading in ("# Routing trace", "## Expert popularity", "## Reuse distance", "## Expert cache hit rates",
                    "### Decode accesses only"):
        assert heading in text
    assert "| 40: 2 prefill (n_tokens > 1), 38 decode (n_tokens = 1) |" in text
    assert "| size | capacity | LRU | LFU | LFU decay | Belady |" in text
    assert "| 25% | 12 |" in text and "| 50% | 24 |" in text


def test_cli_json(tmp_path, capsys):
    path = _write(tmp_path / "cli.trace", _records(np.random.default_rng(7), passes=40))
    assert summary.main([str(path), "--json", "--policies", "lru,belady"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["header"]["moe_layers"] == [1, 3, 4] and d["header"]["passes"] == 40
    assert d["header"]["tokens"] == 9 + 5 + 38
    assert [x["layer"] for x in d["popularity"]["layers"]] == [1, 3, 4]
    assert d["reuse"]["prefill"]["p90"] is None  # infinite: most prompt accesses are first uses
    assert d["cache"]["sizes"] == summary.DEFAULT_SIZES and set(d["cache"]["hit_rate"]) == {"lru", "belady"}
    assert all(0 <= r <= 1 for rates in d["cache"]["decode_hit_rate"].values() for r in rates)


def test_cli_errors(tmp_path, capsys):
    bad = tmp_path / "bad.trace"
    bad.write_bytes(b"STRTRACE" + b"\x00" * 4)
    assert summary.main([str(bad)]) == 2
    assert "header cut short" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        summary.main([str(bad), "--sizes", "0,50"])


def test_reads_what_the_engine_writes(strata_bin, build_dir, tmp_path):
    """`strata bench --routing-trace` on the tiny model (CPU): the reader takes the file, the passes are the bench's
    (warm-up and timed prompt, then single-token steps), and the summary runs on it."""
    model = build_dir / "models" / "tiny-qwen3moe.gguf"
    if not model.exists():
        model = tmp_path / "tiny.gguf"
        subprocess.run([str(strata_bin), "synth", "--preset", "tiny-qwen3moe", "-o", str(model), "--quiet"],
                       check=True)
    path = tmp_path / "bench.bin"
    subprocess.run([str(strata_bin), "bench", "-m", str(model), "--device", "cpu", "-t", "2", "-p", "24", "-n", "5",
                    "-r", "1", "--routing-trace", str(path)], check=True, capture_output=True)
    t = read_trace(path)
    sizes = sorted({(r.pass_index, r.n_tokens) for r in t})
    assert [n for _, n in sizes][:2] == [24, 24] and all(n == 1 for _, n in sizes[2:])
    out = subprocess.run([sys.executable, "-m", "tools.trace.summary", str(path), "--json"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)


def _routed_stream(seed, n_layers, n_expert, k, passes, prompt_passes, prompt_max):
    """Records (pass, decode, layer, experts) of skewed routing that drifts: per layer a Zipf-like popularity over a
    permutation that changes every 40 passes; prompt passes pick up to prompt_max distinct experts a layer."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_expert + 1) ** 1.1
    weights /= weights.sum()
    recs = []
    for p in range(passes):
        if p % 40 == 0:
            perms = [rng.permutation(n_expert) for _ in range(n_layers)]
        decode = p >= prompt_passes
        size = k if decode else int(rng.integers(k, prompt_max + 1))
        for layer in range(n_layers):
            ids = perms[layer][rng.choice(n_expert, size=size, replace=False, p=weights)]
            recs.append((p, int(decode), layer, [int(e) for e in ids]))
    return recs


def _stream_accesses(recs, n_expert):
    keys = [layer * n_expert + e for _, _, layer, ids in recs for e in ids]
    passes = [p for p, _, _, ids in recs for _ in ids]
    decode = [d for _, d, _, ids in recs for _ in ids]
    return _hand_stream(keys, passes, decode)


@pytest.mark.parametrize("decay", [False, True])
def test_engine_next_use_is_the_simulated_one(tool, decay):
    # The engine's expected-next-use policy (ExpertSlotTable, --expert-cache-policy next) and tools/trace's
    # next_use_hits on the same streams hit on exactly the same accesses. With decay every record has k experts and
    # the period is a whole number of records (the engine counts a decode record's hits before its misses; the
    # simulation counts in record order, which differs only where a halving falls inside a record).
    n_layers, n_expert, k = 6, 16, 3
    recs = _routed_stream(7 if decay else 3, n_layers, n_expert, k, 400, 12, k if decay else 8)
    acc = _stream_accesses(recs, n_expert)
    decay_every = 8 * n_layers * k if decay else 0
    assert acc.decode.any() and not acc.decode.all()
    for capacity in (9, 24, 38):
        text = f"{n_layers} {n_expert} {capacity} {decay_every}\n" + "".join(
            f"{p} {d} {layer} {' '.join(map(str, ids))}\n" for p, d, layer, ids in recs)
        run = subprocess.run([str(tool("slot_replay")), "next"], input=text, capture_output=True, text=True,
                             check=True)
        engine = np.array([c == "1" for c in run.stdout.strip()])
        simulated = summary.next_use_hits(acc, n_expert, capacity, decay_every or None)
        assert len(engine) == len(acc)
        assert engine.tolist() == simulated.tolist(), f"capacity {capacity}: first difference at " \
            f"{int(np.flatnonzero(engine != simulated)[0])}"
        assert 0.1 < engine.mean() < 0.95  # the streams exercise hits, misses and evictions
