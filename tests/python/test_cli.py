"""The command line as a new user meets it, on the embedded tiny model (CPU): usage errors exit 2 and name the flag or
command (with the nearest one where a name is misspelt), token ids in give token ids out, the VRAM budget is said not
to apply on the CPU, and `strata quantize` never destroys its input."""
import os
import re
import subprocess

import pytest


@pytest.fixture(scope="module")
def tiny_model(build_dir, strata_bin, tmp_path_factory):
    """The embedded default model the build writes; written here when the build has not made it yet."""
    path = build_dir / "models" / "tiny-qwen3moe.gguf"
    if path.exists():
        return path
    path = tmp_path_factory.mktemp("cli") / "tiny-qwen3moe.gguf"
    subprocess.run([strata_bin, "synth", "--preset", "tiny-qwen3moe", "-o", str(path), "--quiet"], check=True)
    return path


def strata(strata_bin, *args, **kw):
    return subprocess.run([str(strata_bin), *map(str, args)], capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("args, named", [
    (["inspct"], "unknown command 'inspct'; did you mean 'inspect'?"),
    (["rn", "-m", "x"], "did you mean 'run'?"),
    (["frobnicate"], "unknown command 'frobnicate' (commands: "),
    ([], "give a command"),
    (["run", "-m", "{model}", "--tokenz", "1"], "did you mean '--tokens'?"),
    (["run", "-m", "{model}", "--tokens", "1", "-t", "-3"], "--threads"),
    (["run", "-m", "{model}", "--tokens", "1", "-t", "100000"], "100000 threads"),
    (["run", "-m", "{model}", "--tokens", "1", "-c", "0"], "--ctx-size"),
    (["run", "-m", "{model}", "--tokens", "1", "-b", "0"], "--batch"),
    (["run", "-m", "{model}", "--tokens", "1", "-n", "-1"], "--n-predict"),
    (["run", "-m", "{model}", "--tokens", "1,x"], "--tokens: 'x' is not a token id"),
    (["run", "-m", "{model}", "--tokens", "1", "--output-format", "bytes"], "--output-format"),
    (["run", "-m", "{model}", "--prompt", "a", "--tokens", "1"], "give only one of"),
    (["run", "-m", "{model}", "--tokens", "1", "--device", "tpu"], "--device: expected auto, cpu or cuda"),
    (["run", "-m", "{model}", "--tokens", "1", "--vram-budget", "12Q"], "--vram-budget"),
    (["run", "-m", "{model}", "--tokens", "1", "--gpu", "-1"], "--gpu"),
    (["bench", "-m", "{model}", "-t", "-1"], "--threads"),
    (["serve", "-m", "{model}", "-c", "0"], "--ctx-size"),
    (["serve", "-m", "{model}", "--port", "70000"], "--port"),
    (["quantize", "{model}", "out.gguf", "--default-type", "Q9"], "--default-type"),
    (["run"], "--model is required"),
])
def test_usage_errors_exit_2_and_name_the_flag(strata_bin, tiny_model, tmp_path, args, named):
    args = [a.replace("{model}", str(tiny_model)) for a in args]
    p = strata(strata_bin, *args, cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.startswith("strata: error: "), p.stderr
    assert named in p.stderr, p.stderr
    assert p.stdout == ""


def test_help_and_version_exit_0(strata_bin):
    assert strata(strata_bin, "--help").returncode == 0
    assert strata(strata_bin, "run", "--help").returncode == 0
    v = strata(strata_bin, "--version")
    assert v.returncode == 0 and v.stdout.startswith("strata ")


def test_runtime_errors_exit_1(strata_bin, tmp_path):
    p = strata(strata_bin, "run", "-m", tmp_path / "missing.gguf", "--tokens", "1", "--device", "cpu")
    assert p.returncode == 1 and "missing.gguf" in p.stderr


def test_token_ids_in_token_ids_out(strata_bin, tiny_model):
    ids = strata(strata_bin, "run", "-m", tiny_model, "--tokens", "1,2,3", "-n", "6", "--temp", "0", "--device", "cpu")
    assert ids.returncode == 0, ids.stderr
    assert re.fullmatch(r"\d+( \d+){5}\n", ids.stdout), ids.stdout
    text = strata(strata_bin, "run", "-m", tiny_model, "--tokens", "1,2,3", "-n", "6", "--temp", "0", "--device",
                  "cpu", "--output-format", "text")
    assert text.returncode == 0, text.stderr
    assert not re.fullmatch(r"\d+( \d+){5}\n", text.stdout)  # the prompt and continuation as text, not ids
    # A text prompt can print the ids of its continuation too: the same tokens as from the same ids.
    prompt = strata(strata_bin, "tokenize", "-m", tiny_model, stdin=None, input="Hello")
    assert prompt.returncode == 0, prompt.stderr


@pytest.mark.parametrize("n", ["1", "2", "9"])
def test_greedy_picks_on_the_device_are_the_samplers(strata_bin, tiny_model, n):
    # --temp 0 picks the arg-max where the logits are (Engine::decode_greedy); --temp 1 --top-k 1 draws from the
    # one best token on the host, step by step: the same ids
    args = ["run", "-m", tiny_model, "--tokens", "4,5,6", "-n", n, "--device", "cpu", "--ignore-eos"]
    greedy = strata(strata_bin, *args, "--temp", "0")
    drawn = strata(strata_bin, *args, "--temp", "1", "--top-k", "1")
    assert greedy.returncode == 0 and drawn.returncode == 0, greedy.stderr + drawn.stderr
    assert len(greedy.stdout.split()) == int(n), greedy.stdout
    assert greedy.stdout == drawn.stdout


def test_weights_size_is_readable_for_small_files(strata_bin, tiny_model):
    p = strata(strata_bin, "run", "-m", tiny_model, "--tokens", "1", "-n", "1", "--device", "cpu")
    assert re.search(r"\(\d+(\.\d+)? (KiB|MiB) of weights\)", p.stderr), p.stderr
    assert "(0.00 GiB" not in p.stderr


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_vram_budget_on_the_cpu_is_said_once(strata_bin, tiny_model, device):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # "auto" then runs on the CPU even on a GPU machine
    p = strata(strata_bin, "bench", "-m", tiny_model, "-p", "8", "-n", "2", "-r", "1", "--device", device,
               "--vram-budget", "1K", env=env)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("--vram-budget 1K is ignored") == 1, p.stderr
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert rows and all(r.split("|")[3].strip() == "-" for r in rows), p.stdout  # no budget shown for the CPU


def test_expert_profile_on_the_cpu_keeps_nothing(strata_bin, tiny_model, tmp_path):
    # the CPU reads every expert in place: no cache to start, so the profile is neither read nor written
    prof = tmp_path / "p.gguf"
    p = strata(strata_bin, "run", "-m", tiny_model, "--tokens", "1,2,3", "-n", "2", "--device", "cpu",
               "--expert-profile", prof)
    assert p.returncode == 0, p.stderr
    assert f"--expert-profile {prof}: no partial expert cache here" in p.stderr, p.stderr
    assert not prof.exists()


def test_one_repetition_has_no_spread(strata_bin, tiny_model):
    p = strata(strata_bin, "bench", "-m", tiny_model, "-p", "8", "-n", "2", "-r", "1", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert "±" not in p.stdout and "±" not in p.stderr
    assert "1 repetition\n" in p.stderr or "1 repetition" in p.stderr and "1 repetitions" not in p.stderr


def test_quantize_refuses_to_write_over_its_input(strata_bin, tiny_model, tmp_path):
    src = tmp_path / "m.gguf"
    src.write_bytes(tiny_model.read_bytes())
    before = src.read_bytes()
    (tmp_path / "link.gguf").symlink_to(src)
    os.link(src, tmp_path / "hard.gguf")
    for out in (src, tmp_path / "link.gguf", tmp_path / "hard.gguf", tmp_path / "." / "m.gguf"):
        p = strata(strata_bin, "quantize", src, out, "--default-type", "F16")
        assert p.returncode == 1 and "the output is the input file" in p.stderr, p.stderr
    assert src.read_bytes() == before
    assert sorted(f.name for f in tmp_path.iterdir()) == ["hard.gguf", "link.gguf", "m.gguf"]  # no .partial left


def test_quantize_asks_before_requantizing(strata_bin, tiny_model, tmp_path):
    # The tiny model's experts are Q4_K (quantized); its other matrices Q8_0.
    p = strata(strata_bin, "quantize", tiny_model, tmp_path / "q8.gguf", "--default-type", "Q8_0")
    assert p.returncode == 1 and "--allow-requantize" in p.stderr and "is already Q4_K" in p.stderr, p.stderr
    assert not (tmp_path / "q8.gguf").exists() and not (tmp_path / "q8.gguf.partial").exists()
    p = strata(strata_bin, "quantize", tiny_model, tmp_path / "q8.gguf", "--default-type", "Q8_0",
               "--allow-requantize")
    assert p.returncode == 0, p.stderr
    info = strata(strata_bin, "inspect", tmp_path / "q8.gguf", "--json")
    assert "Q4_K" not in info.stdout
    # Converting to a float type is not requantizing.
    assert strata(strata_bin, "quantize", tiny_model, tmp_path / "f32.gguf", "--default-type", "F32").returncode == 0
