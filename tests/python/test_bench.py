"""`strata bench` on the embedded tiny model (CPU): the markdown table's shape, the JSON report's tests and fields,
the context sized from the largest test and its depth, and bad flag values refused with a message naming the flag."""
import json
import re
import subprocess

import pytest

from tools.trace import read_trace


@pytest.fixture(scope="module")
def tiny_model(build_dir, strata_bin, tmp_path_factory):
    """The embedded default model the build writes; written here when the build has not made it yet."""
    path = build_dir / "models" / "tiny-qwen3moe.gguf"
    if path.exists():
        return path
    path = tmp_path_factory.mktemp("bench") / "tiny-qwen3moe.gguf"
    subprocess.run([strata_bin, "synth", "--preset", "tiny-qwen3moe", "-o", str(path), "--quiet"], check=True)
    return path


def bench(strata_bin, model, *args, check=True):
    return subprocess.run([strata_bin, "bench", "-m", str(model), "--device", "cpu", "-t", "2", *args],
                          capture_output=True, text=True, check=check, timeout=60)


def first_table(text):
    """The lines of the first block of output (the results table) and their cells."""
    lines = text.split("\n\n")[0].splitlines()
    assert all(ln.startswith("|") and ln.endswith("|") for ln in lines), lines
    return lines, [[c.strip() for c in ln[1:-1].split("|")] for ln in lines]


def test_table(strata_bin, tiny_model):
    out = bench(strata_bin, tiny_model, "-p", "32,64", "-n", "8", "-r", "2").stdout
    lines, rows = first_table(out)
    assert rows[0] == ["model", "size", "budget", "routing", "test", "t/s"]
    assert all(re.fullmatch(r"-+:?", c) for c in rows[1])
    body = rows[2:]
    assert [r[4] for r in body] == ["pp32", "pp64", "tg8"]
    for model, size, budget, routing, _, tps in body:
        assert model == "synthetic tiny-qwen3moe"  # general.name of the synthetic file
        assert re.fullmatch(r"\d+\.\d+ (MiB|GiB)", size)
        assert budget == "-" and routing == "model"
        m = re.fullmatch(r"(\d+\.\d\d) ± (\d+\.\d\d)", tps)
        assert m and float(m.group(1)) > 0
    assert len({len(ln) for ln in lines}) == 1  # padded columns: every line equally long
    assert "expert cache: no lookups" in out  # the CPU backend reads every expert in place


def test_json(strata_bin, tiny_model):
    proc = bench(strata_bin, tiny_model, "--json", "-p", "16,48", "-n", "4,8", "-r", "3", "--chunk", "16")
    d = json.loads(proc.stdout)
    assert d["model"]["name"] == "synthetic tiny-qwen3moe"
    assert d["model"]["architecture"] == "qwen3moe"
    assert d["model"]["size_bytes"] == tiny_model.stat().st_size
    assert d["backend"].startswith("CPU")
    assert d["vram_budget_bytes"] is None
    assert d["chunk"] == 16 and d["repetitions"] == 3 and d["routing"] == "model"
    assert d["n_ctx"] == 48  # the longest prompt; the longest generation needs 1 + 8
    assert [t["test"] for t in d["tests"]] == ["pp16", "pp48", "tg4", "tg8"]
    for t in d["tests"]:
        assert t["timed_tokens"] == (t["n_gen"] or t["n_prompt"])
        assert len(t["seconds"]) == 3 and all(s > 0 for s in t["seconds"])
        assert len(t["tokens_per_second"]) == 3 and all(r > 0 for r in t["tokens_per_second"])
        assert t["tps_mean"] > 0 and t["tps_sd"] >= 0
        assert t["wall_seconds"] == pytest.approx(sum(t["seconds"]))
        c = t["expert_cache"]
        assert set(c) == {"hits", "misses", "misses_on_host", "misses_mapped", "mapped_admitted", "passes_alone",
                          "passes_split", "hit_rate", "cpu_share", "bytes_streamed", "effective_h2d_gb_per_s",
                          "host_expert_gb_per_s", "favourite_fills"}
        assert c["passes_alone"] == c["passes_split"] == 0
        assert c["hits"] == c["misses"] == c["misses_on_host"] == c["bytes_streamed"] == 0
        assert c["misses_mapped"] == c["mapped_admitted"] == c["favourite_fills"] == 0
        assert c["hit_rate"] is None and c["cpu_share"] is None and c["host_expert_gb_per_s"] == 0
    assert d["tests"][2]["n_prompt"] == 1 and d["tests"][2]["n_gen"] == 4
    # decode's weight traffic: less than the file (k of the experts), the rate = bytes per token x t/s
    per_token = d["decode_weight_bytes_per_token"]
    assert 0 < per_token < d["model"]["size_bytes"]
    for t in d["tests"][2:]:
        assert t["weight_read_gb_per_s"] == pytest.approx(per_token * t["tps_mean"] / 1e9)
    assert "weight_read_gb_per_s" not in d["tests"][0]
    assert d["device_copy_gb_per_s"] is None  # no device memory on the CPU
    assert d["upload_gb_per_s"] is None  # nothing streamed, and no bus
    assert "weight_read_share_of_copy" not in d["tests"][2]
    assert set(d["expert_cache"]) == set(d["tests"][0]["expert_cache"])


def test_routing_override(strata_bin, tiny_model, tmp_path):
    """--routing uniform and zipf:S replace the router's choice: the table and the JSON name it, and a routing trace
    of the run holds draws that differ from the router's."""
    _, rows = first_table(bench(strata_bin, tiny_model, "-p", "16", "-n", "4", "-r", "1", "--routing", "zipf:1.5")
                          .stdout)
    assert [r[3] for r in rows[2:]] == ["zipf:1.5", "zipf:1.5"]
    traces = {}
    for routing in ("model", "uniform"):
        path = tmp_path / f"{routing}.bin"
        d = json.loads(bench(strata_bin, tiny_model, "--json", "-p", "16", "-n", "4", "-r", "1", "--routing",
                             routing, "--routing-trace", str(path)).stdout)
        assert d["routing"] == routing
        traces[routing] = path.read_bytes()
    assert len(traces["model"]) == len(traces["uniform"]) and traces["model"] != traces["uniform"]


def test_context_fits_the_longest_generation(strata_bin, tiny_model):
    d = json.loads(bench(strata_bin, tiny_model, "--json", "-p", "8", "-n", "40", "-r", "1").stdout)
    assert d["n_ctx"] == 41
    assert d["tests"][1]["tps_sd"] == 0  # one repetition: no spread


def test_parallel_sequences(strata_bin, tiny_model):
    """--parallel N: each tgN decodes N sequences together, and its rate counts the tokens of all of them."""
    d = json.loads(bench(strata_bin, tiny_model, "--json", "-p", "8", "-n", "5", "-r", "2", "--parallel", "3").stdout)
    assert [t["test"] for t in d["tests"]] == ["pp8", "tg5 x3"]
    pp, tg = d["tests"]
    assert pp["n_seq"] == 1 and pp["timed_tokens"] == 8
    assert tg["n_seq"] == 3 and tg["n_gen"] == 5 and tg["timed_tokens"] == 15
    for s, r in zip(tg["seconds"], tg["tokens_per_second"]):
        assert r == pytest.approx(15 / s)
    assert "weight_read_gb_per_s" not in tg  # a pass of three tokens shares the weights it reads
    _, rows = first_table(bench(strata_bin, tiny_model, "-p", "8", "-n", "4", "-r", "1", "--parallel", "2").stdout)
    assert [r[4] for r in rows[2:]] == ["pp8", "tg4 x2"]


def test_depth(strata_bin, tiny_model, tmp_path):
    """-d D: every test after D context tokens per sequence, prefilled untimed; the trace shows they were run."""
    trace = tmp_path / "d.trace"
    d = json.loads(bench(strata_bin, tiny_model, "--json", "-p", "8", "-n", "4", "-r", "1", "-d", "0,16",
                         "--routing-trace", str(trace)).stdout)
    assert [(t["test"], t["depth"]) for t in d["tests"]] == [("pp8", 0), ("tg4", 0), ("pp8 @ d16", 16),
                                                             ("tg4 @ d16", 16)]
    assert d["n_ctx"] == 16 + 8
    assert [t["timed_tokens"] for t in d["tests"]] == [8, 4, 8, 4]  # the context is not timed
    t = read_trace(trace)
    first = t.layers == t.layers.min()
    # each test once untimed and once timed: pp 8, tg 1 + 4, and the same again after 16 context tokens each
    assert int(t.n_tokens[first].sum()) == 2 * (8 + 5) + 2 * ((16 + 8) + (16 + 5))
    _, rows = first_table(bench(strata_bin, tiny_model, "-p", "8", "-n", "4", "-r", "1", "-d", "16").stdout)
    assert [r[4] for r in rows[2:]] == ["pp8 @ d16", "tg4 @ d16"]


@pytest.mark.parametrize("args, flag", [
    (["-d", "-1"], "-d/--depth"),
    (["-d", "x"], "-d/--depth"),
    (["-p", "0"], "-p/--n-prompt"),
    (["-p", "abc"], "-p/--n-prompt"),
    (["-p", "64,,8"], "-p/--n-prompt"),
    (["-n", "0"], "-n/--n-gen"),
    (["-n", "-3"], "-n/--n-gen"),
    (["-r", "0"], "--repetitions"),
    (["--chunk", "0"], "--chunk"),
    (["--kv-type", "q4"], "--kv-type"),
    (["--routing", "zipf"], "--routing"),
    (["--routing", "zipf:0"], "--routing"),
    (["--routing", "random"], "--routing"),
    (["--host-mem", "ram"], "--host-mem"),
    (["--expert-cache-policy", "arc"], "--expert-cache-policy"),
    (["--parallel", "0"], "--parallel"),
    (["--parallel", "x"], "--parallel"),
])
def test_bad_flags(strata_bin, tiny_model, args, flag):
    proc = bench(strata_bin, tiny_model, *args, check=False)
    assert proc.returncode == 2  # a usage error
    assert proc.stdout == ""
    assert proc.stderr.startswith("strata: error: " + flag), proc.stderr
