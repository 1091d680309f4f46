"""The per-kernel profile table (tools/profile/ncu_table.py): kernel names shortened, ncu's CSV read in every time
unit it writes, passes cut at the marker, the pass summed per kernel, and the command line's errors."""
import pathlib
import subprocess
import sys

import pytest

from tools.profile.ncu_table import passes, read_kernels, short_name, table

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def csv_text(kernels, unit="ns"):
    """ncu --csv output for [(name, value)], with the warnings ncu prints first."""
    rows = ["==PROF== Connected to process 7", "==WARNING== Note: Running with unmodified GPU clocks.", HEAD]
    for i, (name, value) in enumerate(kernels):
        rows.append(f'"{i}","7","strata","h","{name}","1","13","(128, 1, 1)","(64, 1, 1)","0","9.0",'
                    f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("name, short", [
    ("void (anonymous namespace)::k_mmvq<(strata::DType)12>(strata::cuda::MatmulArgs, strata::cuda::IqGrids)",
     "k_mmvq<(strata::DType)12>"),
    ("void unnamed>::k_flash<1, 128, 1>(KvCacheView, Rows, Rows, int)", "k_flash<1, 128, 1>"),
    ("void <unnamed>::k_add(Rows, Rows, Rows)", "k_add"),
    ("void mul_mat_vec_q<(ggml_type)12, 1, false>(const void *, const void *, float *)",
     "mul_mat_vec_q<(ggml_type)12, 1, false>"),
    ("strata::cuda::k_rms_norm_wide<2, true>(Rows)", "k_rms_norm_wide<2, true>"),
    ("k_plain", "k_plain"),
])
def test_short_names(name, short):
    assert short_name(name) == short


def test_read_units_and_separators():
    ks = read_kernels(csv_text([("void k_a(int)", "7,616"), ("void k_b(int)", "2.5")], unit="ns"))
    assert ks == [("k_a", pytest.approx(7.616)), ("k_b", pytest.approx(0.0025))]
    assert read_kernels(csv_text([("k_a", "3")], unit="usecond")) == [("k_a", 3.0)]
    assert read_kernels(csv_text([("k_a", "1.5")], unit="msecond")) == [("k_a", 1500.0)]
    with pytest.raises(ValueError, match="no ncu CSV header"):
        read_kernels("==PROF== nothing profiled\n")
    with pytest.raises(ValueError, match="unknown time unit"):
        read_kernels(csv_text([("k_a", "1")], unit="cycle"))


def test_passes_and_the_table():
    seq = [("k_embed", 1.0), ("k_x", 2.0), ("k_y", 3.0), ("k_x", 2.0)] * 3 + [("k_embed", 1.0), ("k_x", 2.0)]
    ps = passes(seq, "embed")
    assert [len(p) for p in ps] == [4, 4, 4, 2]
    assert passes(seq, "no such kernel") == [seq]
    rows, total = table(ps[1], layers=2)
    assert total == pytest.approx(8.0)
    lines = rows.splitlines()
    assert lines[0] == "| kernel | count | us per layer | us each | share |"
    assert lines[2] == "| `k_x` | 2 | 2.0 | 2.00 | 50.0% |"  # largest first: 4 us over 2 layers
    assert lines[3] == "| `k_y` | 1 | 1.5 | 3.00 | 37.5% |"
    assert lines[-1] == "| all | 4 | 4.0 | | 100% |"


def test_command_line(tmp_path):
    f = tmp_path / "p.csv"
    f.write_text(csv_text([("k_embed", "1000"), ("k_x", "3000")] * 3))
    run = lambda *a: subprocess.run([sys.executable, "-m", "tools.profile.ncu_table", str(f), *a], cwd=ROOT,
                                    capture_output=True, text=True, timeout=60)
    out = run("--marker", "embed")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("pass 1 of 3: 2 kernels, 4.0 us")  # the last complete pass
    assert "| `k_x` | 1 | 3.0 | 3.00 | 75.0% |" in out.stdout
    bad = run("--marker", "embed", "--pass", "5")
    assert bad.returncode == 2 and "the input has 3 passes" in bad.stderr
    # --longest: a prompt pass (more GPU time) among decoding ones; the last pass, maybe cut short, is not a candidate
    h = tmp_path / "pp.csv"
    h.write_text(csv_text([("k_embed", "1000"), ("k_x", "9000"), ("k_embed", "1000"), ("k_x", "2000"),
                           ("k_embed", "1000"), ("k_x", "8000"), ("k_embed", "1000"), ("k_x", "50000")]))
    longest = subprocess.run([sys.executable, "-m", "tools.profile.ncu_table", str(h), "--marker", "embed",
                              "--longest"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert longest.returncode == 0, longest.stderr
    assert longest.stdout.startswith("pass 0 of 4: 2 kernels, 10.0 us")
    both = run("--marker", "embed", "--longest", "--pass", "0")
    assert both.returncode == 2 and "one or the other" in both.stderr
    g = tmp_path / "empty.csv"
    g.write_text("==PROF== no kernels\n")
    none = subprocess.run([sys.executable, "-m", "tools.profile.ncu_table", str(g)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert none.returncode == 2 and "no ncu CSV header" in none.stderr
