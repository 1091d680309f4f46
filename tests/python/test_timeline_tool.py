"""The pass timeline summary (tools/profile/timeline.py) on a hand-made trace: busy time as the union of kernel
intervals (overlaps counted once), idle gaps, passes cut at the marker, copy-engine busy time and rate."""
import io

from tools.profile.timeline import read_trace, summarise, union_ns


def test_union_counts_overlaps_once():
    assert union_ns([]) == 0
    assert union_ns([(0, 10), (5, 15), (20, 30)]) == 25
    assert union_ns([(0, 10), (2, 3), (10, 12)]) == 12


def test_two_passes_of_two_kernels_and_a_copy(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(
        "kind,name,start_ns,end_ns,stream,graph\n"
        "kernel,k_embed(int),0,1000,7,1\n"
        "kernel,k_mmvq<Q4_K>(x),2000,6000,7,1\n"
        "kernel,k_embed(int),10000,11000,7,1\n"
        "kernel,k_mmvq<Q4_K>(x),12000,16000,7,1\n"
        "kernel,k_embed(int),20000,21000,7,1\n"
        "copy,HtoD 2000,1000,2000,9,0\n"
        "copy,HtoD 4000,11000,13000,9,0\n")
    kernels, copies = read_trace(f)
    assert len(kernels) == 5 and len(copies) == 2
    out = io.StringIO()
    summarise(kernels, copies, "embed", 2, out)
    text = out.getvalue()
    assert "2 passes: 10.0 us per pass; GPU busy 5.0 us (50.0%), idle 5.0 us" in text
    assert "kernels per pass 2; mean gap between consecutive kernels 2.00 us" in text
    # 6000 bytes over two passes, the engine busy 1 + 2 us: 3000 bytes and 1.5 us a pass, 2 GB/s while busy
    assert "copy engine busy 1.5 us (15.0% of the pass) at 2.00 GB/s while busy" in text
    # run 4 us; to its end 5 us a pass (the gap after the embedding's end and the kernel's own 4 us): half the wall
    assert "| `k_mmvq<Q4_K>` | 1.0 | 4.0 | 5.0 | 50.0% |" in text
    # the second pass's embedding takes the gap after the first pass's last kernel: (1 + 5) / 2 a pass
    assert "| `k_embed` | 1.0 | 1.0 | 3.0 | 30.0% |" in text
    # the first pass's copy runs between its kernels, the second's half beside its second kernel
    assert ("overlap per pass: kernels and host-to-device copies at once 0.5 us, copies alone 1.0 us, kernels alone "
            "4.5 us, neither 4.0 us") in text


def test_each_pass_has_its_row(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(
        "kind,name,start_ns,end_ns,stream,graph\n"
        "kernel,k_embed(int),0,1000000,7,1\n"
        "kernel,k_mm(x),1000000,3000000,7,1\n"
        "kernel,k_embed(int),4000000,4500000,7,1\n"
        "copy,HtoD 1048576,2000000,4000000,9,0\n")
    kernels, copies = read_trace(f)
    out = io.StringIO()
    summarise(kernels, copies, "embed", 1, out, each=True)
    assert "| 0 | 4.00 | 3.00 | 2.00 | 1.00 | 0.00 | 1.0 |" in out.getvalue()
