#!/usr/bin/env python3
"""Cost against N: plots and growth exponents from scale_bench.py's scale.json files.

Reads the one-job points (records with "jobs": 1) of each FILE, a scale.json written by
bench/sim/scale_bench.py, and draws, against the job's ranks N on a log axis:
  controller cores   steady (median of the steady window) and peak (highest 1 s sample)
  controller MB      steady RSS and VmHWM
  Redis commands/s   steady and peak
  times, s           onset -> detected, detected -> named (the localisation), the pause
Cores, MB and commands/s are on log-log axes with a dashed line proportional to N through the
smallest point: a cost that grows linearly runs parallel to it.

It also prints, per cost and per pair of successive points, the growth exponent
log(cost_b / cost_a) / log(N_b / N_a): 1 is linear, above 1 super-linear. A point whose
localisation was not "correct" is drawn hollow and its times are left out.

Several FILEs make one curve (a run per point, e.g. the small points in one run and the large ones
in another); when two FILEs hold the same N the later FILE's point is used, with a warning.

  bench/sim/plot_scale.py out/scale/scale.json --out docs/img
  bench/sim/plot_scale.py out/small/scale.json out/large/scale.json --out docs/img --json

Writes DIR/scale-cost.svg (or --format png). Needs matplotlib (Debian: python3-matplotlib,
installed by scripts/setup.sh). Exit status 2 on a bad or empty input.
"""
import argparse
import json
import math
import os
import sys

# (key in the output, panel title, [(label, getter)], log y axis)
SERIES = [
    ("controller_cores", "falcon-controller, cores",
     [("steady", lambda r: r["controller"]["cores_steady"]), ("peak", lambda r: r["controller"]["cores_peak"])], True),
    ("controller_mb", "falcon-controller, MB",
     [("steady RSS", lambda r: r["controller"]["rss_mb_steady"]), ("VmHWM", lambda r: r["controller"]["hwm_mb"])],
     True),
    ("redis_cmds", "redis-server, commands/s",
     [("steady", lambda r: r["redis"]["cmds_per_s_steady"]), ("peak", lambda r: r["redis"]["cmds_per_s_peak"])], True),
    ("times", "a slow GPU, seconds",
     [("onset -> detected", lambda r: r["incidents"]["detect_s"]["median"]),
      ("detected -> named", lambda r: r["incidents"]["localise_s"]["median"] - r["incidents"]["detect_s"]["median"]),
      ("pause", lambda r: r["incidents"]["pause_s"]["median"])], False),
]


def load(paths):
    """N -> (record, source) over the files' one-job records; later files win."""
    points = {}
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"plot_scale: {path}: {e}") from None
        if not isinstance(doc, dict) or doc.get("tool") != "scale_bench" or not isinstance(doc.get("records"), list):
            raise SystemExit(f"plot_scale: {path}: not a scale_bench.py scale.json")
        source = f"{os.path.basename(os.path.dirname(os.path.abspath(path))) or path} ({doc.get('commit', '?')})"
        for r in doc["records"]:
            if not isinstance(r, dict) or r.get("jobs") != 1 or not isinstance(r.get("ranks"), int):
                continue
            if r["ranks"] in points:
                print(f"plot_scale: warning: {r['ranks']} ranks in {points[r['ranks']][1]} and {source}: "
                      f"using {source}", file=sys.stderr)
            points[r["ranks"]] = (r, source)
    if not points:
        raise SystemExit("plot_scale: no one-job points in " + ", ".join(paths))
    return dict(sorted(points.items()))


def named(record):
    """The point's localisation named the faulty rank and nothing else."""
    return record.get("incidents", {}).get("verdict") == "correct"


def value(getter, record, key):
    """The figure, or None where the run did not produce it (times of a point not named)."""
    if key == "times" and not named(record):
        return None
    try:
        v = getter(record)
    except (KeyError, TypeError):
        return None
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def table(points):
    """{key: {label: [[N, value], ...]}} and the exponents between successive points."""
    data, growth = {}, {}
    for key, _, lines, _ in SERIES:
        data[key], growth[key] = {}, {}
        for label, getter in lines:
            xs = [[n, value(getter, r, key)] for n, (r, _) in points.items()]
            data[key][label] = xs
            have = [(n, v) for n, v in xs if v is not None and v > 0]
            growth[key][label] = [{"from": a[0], "to": b[0], "exponent": round(math.log(b[1] / a[1]) / math.log(b[0] / a[0]), 2)}
                                  for a, b in zip(have, have[1:])]
    return data, growth


def plot(points, data, out, fmt, heading=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot_scale: matplotlib is missing (Debian: apt-get install python3-matplotlib, "
                         "or scripts/setup.sh); --json prints the figures without it") from None
    plt.rcParams["svg.hashsalt"] = "falcon-scale"  # the same input draws the same file
    plt.rcParams["svg.fonttype"] = "none"  # text as text: smaller, searchable
    ns = list(points)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (key, title, lines, logy) in zip(axes.flat, SERIES):
        for label, _ in lines:
            xs = [(n, v) for n, v in data[key][label] if v is not None]
            if not xs:
                continue
            line, = ax.plot([n for n, _ in xs], [v for _, v in xs], marker="o", label=label)
            bad = [(n, v) for n, v in xs if not named(points[n][0])]
            if bad:
                ax.plot([n for n, _ in bad], [v for _, v in bad], "o", markerfacecolor="white",
                        markeredgecolor=line.get_color())
        if logy:
            ref = next(((n, v) for n, v in data[key][lines[0][0]] if v), None)
            if ref:
                ax.plot(ns, [ref[1] * n / ref[0] for n in ns], "--", color="grey", linewidth=0.8, label="∝ N")
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns)
        ax.set_xticklabels([f"{n:,}" for n in ns])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_title(title)
        ax.set_xlabel("ranks")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small")
    sources = sorted({s for _, s in points.values()})
    fig.suptitle(heading or "Falcon at scale, one run per point: " + "; ".join(sources), fontsize="medium")
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"scale-cost.{fmt}")
    fig.savefig(path, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", metavar="FILE", help="scale.json files of bench/sim/scale_bench.py")
    ap.add_argument("--out", help="directory for scale-cost.svg (default: no plot, the table only)")
    ap.add_argument("--format", choices=("svg", "png"), default="svg", help="the plot's format (default svg)")
    ap.add_argument("--title", help="the plot's title (default: the files' directories and commits)")
    ap.add_argument("--json", action="store_true", help="print the figures and exponents as JSON instead of the table")
    args = ap.parse_args()
    try:
        points = load(args.files)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    data, growth = table(points)
    path = plot(points, data, args.out, args.format, args.title) if args.out else None
    if args.json:
        json.dump({"points": {n: s for n, (_, s) in points.items()}, "figures": data, "growth": growth,
                   "plot": path}, sys.stdout, indent=1)
        print()
        return 0
    ns = list(points)
    print("| cost | " + " | ".join(f"{n:,}" for n in ns) + " | exponents |")
    print("|---|" + "---:|" * len(ns) + "---|")
    for key, title, lines, _ in SERIES:
        for label, _ in lines:
            cells = ["—" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.2f}") for _, v in data[key][label]]
            exps = ", ".join(f"{g['exponent']:.2f}" for g in growth[key][label]) or "—"
            print(f"| {title.split(',')[0]} {label} | " + " | ".join(cells) + f" | {exps} |")
    if path:
        print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
