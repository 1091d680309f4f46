"""Per-kernel GPU time of one forward pass, from Nsight Compute's CSV.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv -c 2500 strata bench -m F -p 1 -n 2 -r 1 > s.csv
    python -m tools.profile.ncu_table s.csv --marker embed_rows --layers 48

The kernels are cut into passes where the marker (a regular expression on the kernel name: the pass's first
kernel, e.g. Strata's token embedding) occurs; the pass chosen (--pass, default the last complete one: the
warm-up's first passes load code and fill caches) is summed per kernel name, largest first, with the count, the
time in microseconds (per layer with --layers) and the share of the pass; --longest picks the complete pass with
the most GPU time instead (a prompt pass among decoding ones: `strata bench -p 512 -n 1`). Without a marker match every kernel is
one pass. ncu runs kernels one at a time with its own overhead around each, so the figures are each kernel's own
duration, not the spacing a stream or graph gives them.
"""
import argparse
import csv
import io
import re
import sys
from collections import OrderedDict


def read_kernels(text):
    """[(kernel name, duration in microseconds)] in launch order, from ncu's --csv output (warnings before the
    header are skipped; units nsecond, usecond or msecond)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the input")
    rows = csv.reader(io.StringIO("\n".join(lines[start:])))
    head = next(rows)
    try:
        i_id, i_name = head.index("ID"), head.index("Kernel Name")
        i_metric, i_unit, i_value = head.index("Metric Name"), head.index("Metric Unit"), head.index("Metric Value")
    except ValueError as e:
        raise ValueError(f"ncu CSV without the expected columns: {e}") from None
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
    out = OrderedDict()
    for r in rows:
        if len(r) <= max(i_id, i_name, i_metric, i_unit, i_value) or r[i_metric] != "gpu__time_duration.sum":
            continue
        if r[i_unit] not in scale:
            raise ValueError(f"kernel {r[i_id]}: unknown time unit {r[i_unit]!r}")
        out[int(r[i_id])] = (short_name(r[i_name]), float(r[i_value].replace(",", "")) * scale[r[i_unit]])
    return list(out.values())


def short_name(name):
    """A kernel's name without its argument list and namespaces:
    'void (anonymous namespace)::k_mmvq<(strata::DType)12>(strata::cuda::MatmulArgs, ...)' -> 'k_mmvq<(strata::DType)12>'."""
    s = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "").replace("unnamed>::", "")
    if s.startswith("void "):
        s = s[5:]
    depth = 0
    for i, ch in enumerate(s):  # the argument list: the first '(' outside template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            s = s[:i]
            break
    depth, last = 0, 0
    for i, ch in enumerate(s):  # namespaces and classes: up to the last '::' outside template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0 and s.startswith("::", i):
            last = i + 2
    return s[last:].strip()


def passes(kernels, marker):
    """The kernels cut at each occurrence of the marker; one pass of everything when it never occurs."""
    if marker:
        rx = re.compile(marker)
        cuts = [i for i, (name, _) in enumerate(kernels) if rx.search(name)]
        if cuts:
            return [kernels[a:b] for a, b in zip(cuts, cuts[1:] + [len(kernels)])]
    return [kernels]


def table(kernels, layers=1):
    """Markdown rows of one pass: kernel, count, total us (per layer), us each, share."""
    agg = OrderedDict()
    for name, us in kernels:
        c, t = agg.get(name, (0, 0.0))
        agg[name] = (c + 1, t + us)
    total = sum(t for _, t in agg.values())
    unit = "us per layer" if layers > 1 else "us"
    lines = [f"| kernel | count | {unit} | us each | share |", "|---|---:|---:|---:|---:|"]
    for name, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| `{name}` | {c} | {t / layers:.1f} | {t / c:.2f} | {100 * t / total:.1f}% |")
    lines.append(f"| all | {len(kernels)} | {total / layers:.1f} | | 100% |")
    return "\n".join(lines), total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --csv output with gpu__time_duration.sum ('-' for standard input)")
    ap.add_argument("--marker", default="", help="regular expression on kernel names that opens a pass")
    ap.add_argument("--pass", dest="which", type=int, default=None,
                    help="which pass (0-based; default: the last complete one, or the only one)")
    ap.add_argument("--longest", action="store_true",
                    help="the complete pass with the most GPU time (a prompt's among decoding ones); not with --pass")
    ap.add_argument("--layers", type=int, default=1, help="divide totals by this many layers")
    a = ap.parse_args(argv)
    if a.layers < 1:
        ap.error("--layers: expected a whole number >= 1")
    text = sys.stdin.read() if a.csv == "-" else open(a.csv, encoding="utf-8").read()
    try:
        ks = read_kernels(text)
    except ValueError as e:
        print(f"ncu_table: {a.csv}: {e}", file=sys.stderr)
        return 2
    if a.longest and a.which is not None:
        ap.error("--longest and --pass: one or the other")
    ps = passes(ks, a.marker)
    complete = len(ps) - 1 if len(ps) > 2 else len(ps)  # the last may be cut short by ncu's -c
    if a.longest:
        which = max(range(complete), key=lambda i: sum(us for _, us in ps[i]))
    else:
        which = a.which if a.which is not None else complete - 1
    if not 0 <= which < len(ps):
        print(f"ncu_table: --pass {which}: the input has {len(ps)} passes (0..{len(ps) - 1})", file=sys.stderr)
        return 2
    rows, total = table(ps[which], a.layers)
    print(f"pass {which} of {len(ps)}: {len(ps[which])} kernels, {total:.1f} us\n")
    print(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
