#!/usr/bin/env python3
"""Pipeline adaptation end to end: an 8-rank DP 2 x PP 4 emulated job whose link between stages 1
and 2 of one replica turns slow for one phase and then recovers (scripts/demo.py --scenario
pp-link), run with Falcon's controller off and in act, side by side.

Figures, from rank 0's iterations (iteration time, ms):
  - healthy: median over the lead-in before the fault (both runs);
  - slow:    median over the fault window in the off run (from 5 s after the onset);
  - adapted: median in the act run over the iterations under the pipeline plan (new warm-up
             counts), to the fault's end;
  - slowdown removed = (slow - adapted) / (slow - healthy): the correctness column, it fails
    below --min-removed;
  - whole window: throughput over the fault window, act against off, as a share of the slowdown
    the off run suffered (detection, localisation and the ski-rental wait count against it);
  - undo: iterations of the act run between the fault's end and the first one back on the
    standard schedule (S1), and how many ran on the adapted counts after the fault.

Usage: bench/pipeline_e2e.py [--build build] [--phase-s 60] [--out DIR] [--runs 1] [--json]
                             [--reuse] [--keep] [--min-removed 0.6] [--split-backward]
--split-backward runs the trainer's F/B/W schedule (each backward split ZeroBubble-style).
Runs about 2 x 2.5 minutes per --runs. Exit status 0 when every job passed its data checks and
every act run removed at least --min-removed of the slowdown under the plan.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def median_ms(iters, lo, hi, version=None):
    """Median duration (ms) of rank 0's iterations starting in [lo, hi), optionally under `version`s."""
    d = [dur for start, dur, v in iters if lo <= start < hi and (version is None or v in version)]
    return 1e3 * statistics.median(d) if d else None


def rate(iters, lo, hi):
    n = sum(1 for start, dur, _ in iters if lo <= start and start + dur <= hi)
    return 60.0 * n / (hi - lo) if hi > lo else 0.0


def analyse(off, act):
    ph = {p["name"]: (p["start_s"], p["end_s"]) for p in off["phases"]}
    (h_lo, h_hi), (f_lo, f_hi) = ph["healthy"], ph["pp-link"]
    settle = 10.0  # the lead-in's first seconds: communicators, first checkpoints
    healthy = statistics.median([median_ms(r["rank0_iterations"], settle, h_hi) for r in (off, act)])
    slow = median_ms(off["rank0_iterations"], f_lo + 5, f_hi)
    plans = [p for p in act["rank0_plans"] if p["status"] == "applied"]
    pipeline = {p["version"] for p in plans if p["strategy"] == "pipeline" and f_lo <= p["at_s"] < f_hi}
    adapted = median_ms(act["rank0_iterations"], f_lo, f_hi, pipeline)
    first = min((s for s, d, v in act["rank0_iterations"] if v in pipeline), default=None)
    removed = (slow - adapted) / (slow - healthy) if adapted is not None and slow > healthy else None
    off_rate, act_rate = rate(off["rank0_iterations"], f_lo, f_hi), rate(act["rank0_iterations"], f_lo, f_hi)
    healthy_rate = 60e3 / healthy
    whole = (act_rate - off_rate) / (healthy_rate - off_rate) if healthy_rate > off_rate else None
    # After the fault: the first iteration under a later plan (the undo), counted from the fault's end.
    undo = min((p for p in plans if p["at_s"] >= f_lo and p["version"] not in pipeline and p["strategy"] == "S1"),
               key=lambda p: p["version"], default=None)
    after = [(s, d, v) for s, d, v in act["rank0_iterations"] if s >= f_hi]
    adapted_after = sum(1 for s, d, v in after if v in pipeline)
    undo_iters = None
    if undo is not None:
        undo_iters = sum(1 for s, d, v in after if v < undo["version"])
    strategies = [p["strategy"] for p in plans if p["at_s"] >= f_lo]
    return {"healthy_ms": healthy, "slow_ms": slow, "adapted_ms": adapted, "slowdown_removed": removed,
            "plan_in_effect_after_s": None if first is None else first - f_lo,
            "whole_window": {"off_iters_per_min": off_rate, "act_iters_per_min": act_rate,
                             "healthy_iters_per_min": healthy_rate, "slowdown_removed": whole},
            "undo_after_fault_iterations": undo_iters, "adapted_iterations_after_fault": adapted_after,
            "strategies": strategies, "ok": off["ok"] and act["ok"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--phase-s", type=float, default=60)
    p.add_argument("--out", default="pipeline-e2e-out", help="per-run reports (JSON + SVG)")
    p.add_argument("--runs", type=int, default=1, help="off/act pairs to run (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    p.add_argument("--reuse", action="store_true", help="analyse the reports already in --out; run nothing")
    p.add_argument("--keep", action="store_true", help="keep each run's logs")
    p.add_argument("--split-backward", action="store_true",
                   help="the trainer splits each backward into B and W (F/B/W) instead of 1F1B's fused backward")
    p.add_argument("--min-removed", type=float, default=0.6,
                   help="the least share of the slowdown the plan must remove (default 0.6)")
    args = p.parse_args()
    if args.runs < 1:
        p.error("--runs must be at least 1")
    demo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "demo.py")
    results = []
    for i in range(args.runs):
        out = os.path.join(args.out, f"run{i}")
        runs = {}
        for mode in ("off", "act"):
            r = subprocess.CompletedProcess([], 0, "", "")
            if not args.reuse:
                print(f"# run {i + 1}/{args.runs}: mitigation {mode} ...", file=sys.stderr, flush=True)
                r = subprocess.run([sys.executable, demo, "--build", args.build, "--scenario", "pp-link",
                                    "--mitigation", mode, "--phase-s", str(args.phase_s), "--out", out, "--quiet"] +
                                   (["--keep"] if args.keep else []) +
                                   (["--split-backward"] if args.split_backward else []),
                                   capture_output=True, text=True)
            path = os.path.join(out, f"falcon-demo-pp-link-{mode}.json")
            try:
                with open(path) as f:
                    runs[mode] = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                print(f"pipeline_e2e: run {mode} left no report ({e}); its output:\n{r.stdout}{r.stderr}",
                      file=sys.stderr)
                return 1
        results.append(analyse(runs["off"], runs["act"]))
    passed = all(r["ok"] and r["slowdown_removed"] is not None and r["slowdown_removed"] >= args.min_removed
                 for r in results)
    if args.json:
        print(json.dumps({"runs": results, "min_removed": args.min_removed, "split_backward": args.split_backward,
                          "passed": passed}, indent=1))
    else:
        print("# pipeline adaptation end to end: 8 ranks DP2 x PP4, one rank per emulated node; the link between "
              f"stages 1 and 2 of replica 0 x12 for {args.phase_s:.0f} s, then healthy; "
              f"{'F/B/W (split backward)' if args.split_backward else '1F1B (fused backward)'}")
        print(f"{'run':4s} {'healthy':>8s} {'slow':>8s} {'adapted':>8s} {'removed':>8s} {'in effect':>10s} "
              f"{'window':>8s} {'undo':>6s}  strategies  job")
        for i, r in enumerate(results):
            fmt = lambda v, f="{:8.1f}": ("{:>8s}".format("-") if v is None else f.format(v))
            w = r["whole_window"]["slowdown_removed"]
            print(f"{i + 1:<4d} {fmt(r['healthy_ms'])} {fmt(r['slow_ms'])} {fmt(r['adapted_ms'])} "
                  f"{fmt(None if r['slowdown_removed'] is None else 100 * r['slowdown_removed'], '{:7.1f}%')} "
                  f"{fmt(r['plan_in_effect_after_s'], '{:9.1f}s')} {fmt(None if w is None else 100 * w, '{:7.1f}%')} "
                  f"{'-' if r['undo_after_fault_iterations'] is None else r['undo_after_fault_iterations']:>6}  "
                  f"{','.join(r['strategies']) or '-':10s}  {'ok' if r['ok'] else 'FAILED'}")
        print("# ms: rank 0's median iteration; removed: (slow - adapted) / (slow - healthy); in effect: after the "
              "fault's onset; window: throughput over the fault window, act vs off; undo: iterations after the "
              "fault's end before the S1 undo took effect")
        print(f"# {'PASS' if passed else 'FAIL'}: at least {100 * args.min_removed:.0f}% of the slowdown removed "
              "under the plan, every job's data checks passed")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
