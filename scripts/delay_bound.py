#!/usr/bin/env python3
"""Lower bound on detection delay for any detector that obeys a minimum-change rule.

usage: delay_bound.py TRACE_DIR [--results DIR] [--min-change 0.10] [--recall 0.98] [--json] [-v]

A fail-slow detector that confirms a change only when the level after it differs from the
healthy level by more than `--min-change` (FALCON's verification, 10 %) cannot alarm on a
labelled fail-slow before the slow level itself is more than 10 % above the level before it. A
ladder whose first stages are 3-9 % above the baseline is therefore confirmed, at the earliest,
when a later stage passes 10 %, however good the detector.

For every labelled interval [s, e) of TRACE_DIR (the format of score.py: NNNN-kind.csv with
`iter,seconds,label` and index.json with the merged intervals, or the CSV labels alone) this
script finds that earliest point with hindsight:
  - the reference level is the median log time of up to 150 samples before s that lie in no
    labelled interval; the noise sigma comes from their median absolute successive difference;
  - the interval's log times are split into constant levels by binary segmentation (a split is
    kept when it reduces the squared error by more than --penalty x sigma^2 x ln(length), the
    BIC rule for one more mean; segments of at least --min-segment samples);
  - the bound is the offset from s of the first segment whose median is more than min-change
    above the reference (no such segment: the interval never passes the rule).
The bound uses the whole interval (the future included) and no confidence margin, so no online
detector that obeys the rule can beat it: it is a floor, not a target.

Reported: p50/p95 of the bound over all intervals; the smallest p95 any rule-abiding detector
can reach while detecting at least --recall of the intervals (it may skip the slowest); with
--results DIR (one detector output per trace, DIR/NNNN-kind.json, as score.py --results reads)
also the detector's delays as score.py counts them (from s) and counted from the bound.

Without the rule (--target-p95 N, default 10): to reach p95 <= N a detector must alarm within N
iterations on enough of the intervals whose bound is > N, i.e. on first levels down to some
ratio; the script prints that ratio and how many healthy traces (no labelled interval) hold a
benign level at least that high for at least N iterations (same segmentation, reference = the
trace's median). Each of those is a false-positive trace for such a detector.
Standard library only.
"""
import argparse, csv, json, math, os, statistics, sys


def percentile(xs, p):
    """The same rank rule as score.py."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def split_levels(y, lo, hi, penalty, min_len):
    """Change points of y[lo:hi] by binary segmentation (squared-error reduction > penalty)."""
    n = hi - lo
    if n < 2 * min_len:
        return []
    prefix = [0.0]
    for v in y[lo:hi]:
        prefix.append(prefix[-1] + v)
    total, best, best_k = prefix[-1], penalty, None
    for k in range(min_len, n - min_len + 1):
        gap = prefix[k] / k - (total - prefix[k]) / (n - k)
        gain = k * (n - k) / n * gap * gap
        if gain > best:
            best, best_k = gain, k
    if best_k is None:
        return []
    cut = lo + best_k
    return (split_levels(y, lo, cut, penalty, min_len) + [cut] +
            split_levels(y, cut, hi, penalty, min_len))


def read_trace(path):
    seconds, labels = [], []
    try:
        with open(path, newline="") as f:
            for line, row in enumerate(csv.DictReader(f), start=2):
                try:
                    seconds.append(float(row["seconds"]))
                    labels.append(int(row.get("label") or 0))
                except (KeyError, TypeError, ValueError):
                    sys.exit(f"delay_bound.py: {path}:{line}: expected `iter,seconds[,label]`")
    except OSError as err:
        sys.exit(f"delay_bound.py: {err}")
    return seconds, labels


def label_intervals(labels):
    out, start = [], None
    for i, v in enumerate(labels + [0]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            out.append([start, i])
            start = None
    return out


def load_index(tdir):
    path = os.path.join(tdir, "index.json")
    if os.path.exists(path):
        with open(path) as f:
            return [(m["file"], m.get("failslow")) for m in json.load(f)]
    return [(name, None) for name in sorted(os.listdir(tdir)) if name.endswith(".csv")]


def constant_levels(y, lo, hi, ref, args):
    """y[lo:hi] split into constant levels: [(start, end, ratio to the median of ref)], the
    split penalty scaled by the noise sigma of ref (median absolute successive difference)."""
    level = statistics.median(ref)
    diffs = [abs(ref[i] - ref[i - 1]) for i in range(1, len(ref))]
    sigma = max(statistics.median(diffs) / (0.6745 * math.sqrt(2.0)), 1e-4)
    penalty = args.penalty * sigma * sigma * math.log(max(hi - lo, 2))
    cuts = [lo] + split_levels(y, lo, hi, penalty, args.min_segment) + [hi]
    return [(a, b, math.exp(statistics.median(y[a:b]) - level)) for a, b in zip(cuts, cuts[1:])]


def bound_for(y, intervals, s, e, args):
    """(offset of the first level past the rule or None, [[offset, ratio], ...])."""
    inside = [False] * len(y)
    for a, b in intervals:
        for i in range(a, min(b, len(y))):
            inside[i] = True
    ref = [y[i] for i in range(s - 1, -1, -1) if not inside[i]][:150][::-1]
    if len(ref) < 8:
        return None, []
    levels, bound = [], None
    for a, _, ratio in constant_levels(y, s, e, ref, args):
        levels.append([a - s, round(ratio, 4)])
        if bound is None and ratio > 1.0 + args.min_change:
            bound = a - s
    return bound, levels


def highest_level(y, args):
    """Highest constant level (ratio to the trace's median) lasting >= target_p95 samples."""
    if len(y) < 8:
        return 1.0
    return max([ratio for a, b, ratio in constant_levels(y, 0, len(y), y, args)
                if b - a >= max(args.target_p95, 1)] or [1.0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_dir")
    ap.add_argument("--results", help="detector outputs, DIR/<trace>.json (as score.py --results)")
    ap.add_argument("--min-change", type=float, default=0.10,
                    help="the rule: relative level change a detector needs (default 0.10)")
    ap.add_argument("--recall", type=float, default=0.98,
                    help="report the best p95 of a detector that finds this share (default 0.98)")
    ap.add_argument("--penalty", type=float, default=2.0,
                    help="segmentation penalty in sigma^2 x ln(n) (default 2, BIC)")
    ap.add_argument("--min-segment", type=int, default=5, help="shortest level (default 5)")
    ap.add_argument("--target-p95", type=int, default=10,
                    help="delay target whose cost on healthy traces is reported (default 10)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per interval")
    args = ap.parse_args()
    if not os.path.isdir(args.trace_dir):
        sys.exit(f"delay_bound.py: {args.trace_dir}: not a directory")
    if not 0.0 < args.recall <= 1.0 or args.min_change <= 0.0 or args.min_segment < 1:
        sys.exit("delay_bound.py: --recall must be in (0, 1], --min-change > 0, --min-segment >= 1")

    events, healthy_levels = [], []
    for name, intervals in load_index(args.trace_dir):
        seconds, labels = read_trace(os.path.join(args.trace_dir, name))
        if any(not (v > 0.0 and math.isfinite(v)) for v in seconds):
            sys.exit(f"delay_bound.py: {name}: a non-positive or non-finite iteration time")
        y = [math.log(v) for v in seconds]
        if intervals is None:
            intervals = label_intervals(labels)
        if not intervals:
            healthy_levels.append((highest_level(y, args), name))
        alarms = None
        if args.results:
            path = os.path.join(args.results, name[:-4] + ".json")
            try:
                with open(path) as f:
                    alarms = [a["at"] for a in json.load(f).get("alarms", [])
                              if a.get("type") == "slow"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                sys.exit(f"delay_bound.py: {path}: {err}")
        for s, e in intervals:
            bound, levels = bound_for(y, intervals, s, e, args)
            ev = {"file": name, "start": s, "end": e, "bound": bound, "levels": levels}
            if alarms is not None:
                hits = [a for a in alarms if s <= a <= e]  # score.py's rule
                ev["delay"] = min(hits) - s if hits else None
            events.append(ev)

    bounds = [ev["bound"] for ev in events if ev["bound"] is not None]
    never = sum(1 for ev in events if ev["bound"] is None)
    # A detector may skip up to (1 - recall) of the intervals: the ones with the largest bounds
    # (or none at all) lower its p95 most. The p95 of the rest is the best it can do.
    keep = math.ceil(args.recall * len(events))
    ranked = sorted(bounds)[:keep] if keep <= len(bounds) else None
    summary = {
        "intervals": len(events), "min_change": args.min_change,
        "bound_p50": percentile(bounds, 50), "bound_p95": percentile(bounds, 95),
        "target_p95": args.target_p95, "never_passes_rule": never,
        "bound_over_target": sum(1 for b in bounds if b > args.target_p95),
        "recall": args.recall, "best_p95_at_recall": percentile(ranked, 95) if ranked else None,
    }
    # Without the rule: a detector with recall >= --recall may miss `miss` intervals, and the p95
    # rank over the rest lets `late` of them be detected after target_p95. Every other interval
    # whose bound is past the target must be caught on its first level within target_p95
    # iterations, so the detector must alarm on first levels down to the `need`-th highest.
    target = args.target_p95
    miss = len(events) - math.ceil(args.recall * len(events))
    found = len(events) - miss
    late = found - 1 - int(round(0.95 * (found - 1)))
    early = sorted((ev["levels"][0][1] for ev in events
                    if (ev["bound"] is None or ev["bound"] > target) and ev["levels"]),
                   reverse=True)
    need = len(early) - miss - late
    if need > 0 and healthy_levels:
        ratio = early[need - 1]
        hits = sorted(v for v in healthy_levels if v[0] >= ratio)
        summary.update({"alarm_level_needed": ratio,
                        "healthy_traces": len(healthy_levels),
                        "healthy_with_level_needed": len(hits),
                        "healthy_files": [name for _, name in hits]})
    if args.results:
        delays = [ev["delay"] for ev in events if ev["delay"] is not None]
        after = [ev["delay"] - ev["bound"] for ev in events
                 if ev["delay"] is not None and ev["bound"] is not None]
        summary.update({
            "detected": len(delays), "delay_p50": percentile(delays, 50),
            "delay_p95": percentile(delays, 95),
            "delay_after_bound_p50": percentile(after, 50),
            "delay_after_bound_p95": percentile(after, 95),
        })
    if args.json:
        print(json.dumps({"summary": summary, "events": events if args.verbose else []}))
        return
    if args.verbose:
        print(f"{'trace':<22}{'start':>7}{'end':>7}{'bound':>7}{'delay':>7}  levels (offset, x)")
        for ev in events:
            fmt = lambda v: "-" if v is None else str(v)
            print(f"{ev['file']:<22}{ev['start']:>7}{ev['end']:>7}{fmt(ev['bound']):>7}"
                  f"{fmt(ev.get('delay')):>7}  {ev['levels'][:6]}")
    print(f"# {summary['intervals']} intervals; earliest point a >{100 * args.min_change:.0f} % rule "
          f"allows: p50 {summary['bound_p50']} p95 {summary['bound_p95']} iterations "
          f"({summary['bound_over_target']} after {args.target_p95}, {never} never)")
    print(f"# best p95 delay of any detector under the rule that finds {100 * args.recall:.0f} % "
          f"of the intervals: {summary['best_p95_at_recall']}")
    if "alarm_level_needed" in summary:
        print(f"# without the rule, p95 <= {target} at {100 * args.recall:.0f} % recall needs "
              f"alarms on first levels down to {summary['alarm_level_needed']:.3f}x within "
              f"{target} iterations; "
              f"{summary['healthy_with_level_needed']} of {summary['healthy_traces']} healthy "
              f"traces hold a benign level that high for >= {target} iterations")
    if args.results:
        print(f"# detector: {summary['detected']} detected, delay p50 {summary['delay_p50']} "
              f"p95 {summary['delay_p95']}; counted from the bound p50 "
              f"{summary['delay_after_bound_p50']} p95 {summary['delay_after_bound_p95']}")


if __name__ == "__main__":
    main()
