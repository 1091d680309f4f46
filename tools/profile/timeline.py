"""Where a GPU pass's time goes, from the kernel trace of tools/profile/kernel_trace.cpp.

    python -m tools.profile.timeline s.csv --marker embed --passes 16

Passes are cut where a kernel matching --marker (a regular expression on the kernel name: a pass's first kernel,
e.g. Strata's embedding, llama.cpp's get_rows) starts; the last --passes complete passes are summarised: the pass's
wall time (first kernel start to the next pass's first start), the GPU's busy time (the union of its kernels'
intervals), the idle time between kernels, the kernel count and the mean gap from one kernel's end to the next
one's start, the host-to-device copies (bytes, the time the copy engine was busy, its rate while busy) and the share
of the pass it was busy, how much of that overlapped kernels (a prefill that streams experts should copy while it
computes); with --each a row per pass; then the kernels by total time over those passes. A kernel's time is its run
(start to end: with programmatic dependent launch that includes the wait for the kernel before it) and its share of
the wall time (from the end of the kernel that ended before it to its own end: what the pass would lose without it,
the launch gap and the wait included; these add up to the pass but for the idle time after its last kernel). Names are demangled where c++filt is found.
"""
import argparse
import csv
import re
import shutil
import subprocess
import sys
from collections import defaultdict


def read_trace(path):
    """(kernels, copies): kernels [(start, end, name)], copies [(start, end, kind, bytes)], in ns, sorted by start."""
    kernels, copies = [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            s, e = int(row["start_ns"]), int(row["end_ns"])
            if row["kind"] == "kernel":
                kernels.append((s, e, row["name"]))
            else:
                kind, _, n = row["name"].partition(" ")
                copies.append((s, e, kind, int(n or 0)))
    kernels.sort()
    copies.sort()
    return kernels, copies


def union_ns(intervals):
    """Total length of the union of [s, e) intervals sorted by s."""
    total, cur_s, cur_e = 0, None, None
    for s, e in intervals:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def clip(intervals, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def merged(intervals):
    """The union of [s, e) intervals as disjoint sorted intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def both_ns(a, b):
    """Length of the intersection of two disjoint sorted interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, e - s)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(kernels, copies, lo, hi):
    """(kernel busy, host-to-device busy, both at once) in [lo, hi), ns."""
    k = merged(clip([(s, e) for s, e, _ in kernels], lo, hi))
    c = merged(clip([(s, e) for s, e, kind, _ in copies if kind == "HtoD"], lo, hi))
    return sum(e - s for s, e in k), sum(e - s for s, e in c), both_ns(k, c)


def demangled(names):
    """name -> the demangled name without its parameter list (the name itself where c++filt is missing)."""
    names = sorted(set(names))
    out = dict(zip(names, names))
    if shutil.which("c++filt") and names:
        got = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
        if len(got) == len(names):
            out = dict(zip(names, got))
    return {n: re.sub(r"\(.*", "", re.sub(r"strata::cuda::\(anonymous namespace\)::", "", d)) for n, d in out.items()}


def summarise(kernels, copies, marker, n_passes, out=sys.stdout, each=False):
    rx = re.compile(marker)
    starts = [k[0] for k in kernels if rx.search(k[2])]
    if len(starts) < 2:
        raise ValueError(f"fewer than two kernels match the marker {marker!r}: no complete pass")
    bounds = list(zip(starts[:-1], starts[1:]))[-n_passes:]
    lo, hi = bounds[0][0], bounds[-1][1]
    ks = [k for k in kernels if lo <= k[0] < hi]
    n = len(bounds)
    wall = (hi - lo) / n
    busy = union_ns([(s, e) for s, e, _ in ks]) / n
    gaps = [b[0] - a[1] for a, b in zip(ks, ks[1:]) if b[0] >= a[1]]
    h2d = [(s, e, b) for s, e, kind, b in copies if kind == "HtoD" and e > lo and s < hi]
    h2d_all = [c for c in copies if c[2] == "HtoD" and c[1] > lo and c[0] < hi]
    h2d_busy = union_ns(clip([(s, e) for s, e, _ in h2d], lo, hi)) / n
    h2d_bytes = sum(b for _, _, b in h2d) / n
    p = lambda *a: print(*a, file=out)
    p(f"{n} passes: {wall / 1e3:.1f} us per pass; GPU busy {busy / 1e3:.1f} us ({100 * busy / wall:.1f}%), "
      f"idle {(wall - busy) / 1e3:.1f} us")
    p(f"kernels per pass {len(ks) / n:.0f}; mean gap between consecutive kernels "
      f"{(sum(gaps) / len(gaps) / 1e3) if gaps else 0:.2f} us")
    if h2d:
        rate = h2d_bytes / h2d_busy if h2d_busy else 0
        p(f"host-to-device per pass: {h2d_bytes / 2**20:.1f} MiB in {len(h2d) / n:.0f} copies, copy engine busy "
          f"{h2d_busy / 1e3:.1f} us ({100 * h2d_busy / wall:.1f}% of the pass) at {rate:.2f} GB/s while busy")
    kb, cb, both = (sum(x) / n for x in zip(*(overlap(ks, h2d_all, a, b) for a, b in bounds)))
    if cb:
        p(f"overlap per pass: kernels and host-to-device copies at once {both / 1e3:.1f} us, copies alone "
          f"{(cb - both) / 1e3:.1f} us, kernels alone {(kb - both) / 1e3:.1f} us, neither "
          f"{(wall - kb - cb + both) / 1e3:.1f} us")
    if each:
        p("\n| pass | wall ms | kernels ms | copies ms | both ms | neither ms | HtoD MiB |")
        p("|---:|---:|---:|---:|---:|---:|---:|")
        for i, (a, b) in enumerate(bounds):
            k1, c1, b1 = overlap(ks, h2d_all, a, b)
            mib = sum(x for s, _, kind, x in copies if kind == "HtoD" and a <= s < b) / 2**20
            p(f"| {i} | {(b - a) / 1e6:.2f} | {k1 / 1e6:.2f} | {c1 / 1e6:.2f} | {b1 / 1e6:.2f} | "
              f"{(b - a - k1 - c1 + b1) / 1e6:.2f} | {mib:.1f} |")
    short = demangled([k[2] for k in ks])
    by = defaultdict(lambda: [0, 0, 0])
    prev_end = lo
    for s, e, name in sorted(ks, key=lambda k: k[1]):
        key = short[name][:90]
        by[key][0] += 1
        by[key][1] += e - s
        by[key][2] += max(0, min(e, hi) - max(prev_end, lo))
        prev_end = max(prev_end, e)
    p("\n| kernel | per pass | us per pass (run) | us per pass (to its end) | share of wall |")
    p("|---|---:|---:|---:|---:|")
    for name, (c, t, w) in sorted(by.items(), key=lambda kv: -kv[1][2])[:25]:
        p(f"| `{name}` | {c / n:.1f} | {t / n / 1e3:.1f} | {w / n / 1e3:.1f} | {100 * w / n / wall:.1f}% |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--marker", required=True, help="regular expression on a pass's first kernel")
    ap.add_argument("--passes", type=int, default=16, help="the last N complete passes (default 16)")
    ap.add_argument("--each", action="store_true", help="also a row per pass (wall, kernels, copies, overlap)")
    a = ap.parse_args(argv)
    kernels, copies = read_trace(a.trace)
    summarise(kernels, copies, a.marker, a.passes, each=a.each)


if __name__ == "__main__":
    main()
