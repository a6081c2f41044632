#!/usr/bin/env python3
"""Mitigation end to end: the demo's fault trace (a slow GPU, then a congested DP link, then both)
run three times on the emulator, with Falcon's controller in mode off, advise and act, and the
training throughput of each compared (FALCON Table 7).

For each run: iterations/min of rank 0 in the healthy lead-in and over the fault windows. The
healthy rate is the median of the three runs' lead-ins (the same job before any fault). The
slowdown removed is (act - off) / (healthy - off) over the fault windows.

Usage: bench/mitigation_e2e.py [--build build] [--phase-s 90] [--out DIR] [--json]
Runs about 3 x 7 minutes. Exit status 0 when every run's job passed its data checks.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--phase-s", type=float, default=90)
    p.add_argument("--out", default="mitigation-e2e-out", help="per-run reports (JSON + SVG)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = p.parse_args()
    demo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "demo.py")
    runs = {}
    for mode in ("off", "advise", "act"):
        print(f"# run: mitigation {mode} ...", file=sys.stderr, flush=True)
        r = subprocess.run([sys.executable, demo, "--build", args.build, "--mitigation", mode, "--phase-s",
                            str(args.phase_s), "--out", args.out, "--quiet"], capture_output=True, text=True)
        path = os.path.join(args.out, f"falcon-demo-{mode}.json")
        try:
            with open(path) as f:
                runs[mode] = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            print(f"mitigation_e2e: run {mode} left no report ({e}); its output:\n{r.stdout}{r.stderr}", file=sys.stderr)
            return 1
    healthy = statistics.median(runs[m]["throughput_iters_per_min"]["healthy"] for m in runs)
    off = runs["off"]["fault_windows_iters_per_min"]
    removed = lambda m: (runs[m]["fault_windows_iters_per_min"] - off) / (healthy - off) if healthy > off else 0.0
    decisions = {m: [d.get("strategy") for d in runs[m]["decisions"] if d.get("strategy") not in (None, "S1")]
                 for m in runs}
    doc = {
        "healthy_iters_per_min": healthy,
        "runs": {m: {"ok": runs[m]["ok"], "fault_windows_iters_per_min": runs[m]["fault_windows_iters_per_min"],
                     "phases": runs[m]["throughput_iters_per_min"], "slowdown_removed": removed(m),
                     "switches": decisions[m]} for m in runs},
    }
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print("# mitigation end to end: 16 ranks TP2 x DP4 x PP2, 8 emulated nodes + 1 spare; faults: GPU x2.5, "
              f"DP link x4, GPU x2 + link x4, {args.phase_s:.0f} s each")
        print(f"{'mode':8s} {'fault windows it/min':>21s} {'compute':>8s} {'link':>8s} {'both':>8s} "
              f"{'slowdown removed':>17s}  strategies  job")
        print(f"{'healthy':8s} {healthy:21.1f}")
        for m in ("off", "advise", "act"):
            r = doc["runs"][m]
            ph = r["phases"]
            print(f"{m:8s} {r['fault_windows_iters_per_min']:21.1f} {ph['compute']:8.1f} {ph['link']:8.1f} "
                  f"{ph['both']:8.1f} {100 * r['slowdown_removed']:16.1f}%  {','.join(r['switches']) or '-':10s}  "
                  f"{'ok' if r['ok'] else 'FAILED'}")
    return 0 if all(r["ok"] for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
