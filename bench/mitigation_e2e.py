#!/usr/bin/env python3
"""Mitigation end to end: the demo's fault trace (a slow GPU, then a congested DP link, then both)
run three times on the emulator, with Falcon's controller in mode off, advise and act, and the
training throughput of each compared (FALCON Table 7).

For each run: iterations/min of rank 0 in the healthy lead-in and over the fault windows. The
healthy rate is the median of the three runs' lead-ins (the same job before any fault). Two
figures of slowdown removed, (mode - off) / (healthy - off):
  - over the whole fault windows: everything counts, detection, localisation (its pauses), the
    ski-rental wait, re-checks;
  - under the plan (act only; FALCON Table 7's measure): from the first iteration a mitigation
    plan (S2..S4) shaped in each fault window to the window's end, against the off run over the
    same intervals. The reaction time (onset to that iteration) is reported per phase.
Undo (act only), per fault window: rank 0's iterations that started after the window's fault
ended and still ran under a plan decided in that window, before the S1 that undid it; "early"
when the S1 came while the fault lasted; "kept" when no S1 followed (a placement stays in force:
there is nothing to undo).

Against each run's own lead-in: the same figures with every run's rates taken as fractions of
its own healthy lead-in, (mode/mode's lead-in - off/off's lead-in) / (1 - off/off's lead-in).
The runs are whole jobs one after another; on a loaded machine one run's pace can differ from
another's by 10 % or more before any fault, and that drift would otherwise count as slowdown
removed or added.

The chosen plans' ceiling (act only): each window's plan bounds the iteration time from below by
its fault-free ratio (re-balanced micro-batches: the fullest replica's share), so no reaction
time and no pause could take the whole-window figure past what those ratios allow; printed as
"at most N%". With 4 micro-batches per replica some healthy replica must take a fifth:
(5 + 1) / (4 + 1) = 1.2x under PP 2.

Usage: bench/mitigation_e2e.py [--build build] [--phase-s 90] [--out DIR] [--json] [--reuse] [--keep]
                               [--micro-batches N]
Runs about 3 x 7 minutes (--reuse: only re-reads the reports in --out). Exit status 0 when every
run's job passed its data checks.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def rate(iters, lo, hi):
    """Iterations per minute that start and end in [lo, hi) job seconds."""
    n = sum(1 for start, dur, _ in iters if lo <= start and start + dur <= hi)
    return 60.0 * n / (hi - lo) if hi > lo else 0.0


def own_removed(mode_rate, mode_lead, off_rate, off_lead):
    """Slowdown removed with each run's rate as a fraction of its own healthy lead-in."""
    if mode_lead <= 0 or off_lead <= 0:
        return 0.0
    m, o = mode_rate / mode_lead, off_rate / off_lead
    return (m - o) / (1 - o) if o < 1 else 0.0


def under_plan(act, off, healthy):
    """Throughput from the first iteration under an S2..S4 plan to the end of each fault window."""
    if "rank0_iterations" not in act or "rank0_iterations" not in off:
        return None
    phases, a_sum, o_sum, span_sum = {}, 0.0, 0.0, 0.0
    for ph in act["phases"]:
        if ph["name"] == "healthy":
            continue
        lo, hi = ph["start_s"], ph["end_s"]
        # Plans decided for this window's fail-slow (a placement from an earlier one stays in force).
        mine = {p["version"] for p in act["rank0_plans"]
                if p["status"] == "applied" and p["strategy"] in ("S2", "S3", "S4") and lo <= p["at_s"] < hi}
        first = next((s for s, d, v in act["rank0_iterations"] if lo <= s < hi and v in mine), None)
        if first is None:
            phases[ph["name"]] = {"reaction_s": None}
            continue
        a, o = rate(act["rank0_iterations"], first, hi), rate(off["rank0_iterations"], first, hi)
        phases[ph["name"]] = {"reaction_s": first - lo, "span_s": hi - first, "act": a, "off": o}
        a_sum += a * (hi - first)
        o_sum += o * (hi - first)
        span_sum += hi - first
    a_rate = a_sum / span_sum if span_sum else 0.0
    o_rate = o_sum / span_sum if span_sum else 0.0
    removed = (a_rate - o_rate) / (healthy - o_rate) if span_sum and healthy > o_rate else 0.0
    own = own_removed(a_rate, act["throughput_iters_per_min"]["healthy"], o_rate,
                      off["throughput_iters_per_min"]["healthy"]) if span_sum else 0.0
    return {"phases": phases, "act": a_rate, "off": o_rate, "slowdown_removed": removed,
            "slowdown_removed_own_lead_in": own}


def plan_ceiling(act, off, healthy):
    """What the plans act chose could give at best, per fault window: a plan's fault-free ratio
    (the controller's candidate field: for re-balanced micro-batches the fullest replica's share,
    (its micro-batches + PP - 1) / (the job's own + PP - 1); 1 for a placement) bounds the
    iteration time under it from below while the fault lasts, so healthy / ratio bounds its rate.
    The whole-window figure those plans could reach reacting at once and never pausing the job:
    sum over windows of (ceiling - off) over sum of (healthy - off)."""
    applied = {p["version"]: p for p in act["rank0_plans"] if p["status"] == "applied"}
    ratio_of = {}  # plan version -> the fault-free ratio of its candidate
    candidates = {}  # incident -> its newest candidates
    for d in act["decisions"]:
        det = d.get("detail") or {}
        if "candidates" in det:
            candidates[d.get("id")] = det["candidates"]
        plan = det.get("plan") or {}
        v, strategy = plan.get("plan_version"), plan.get("strategy")
        if v is not None and strategy in ("S2", "S3", "S4"):
            c = candidates.get(d.get("id"), {}).get(strategy, {})
            ratio_of[v] = c.get("fault_free_ratio", 1.0)
    windows, bounds = {}, []  # bounds: per window, (the plans' largest fault-free ratio, off's rate)
    for ph in act["phases"]:
        if ph["name"] in ("healthy", "after"):
            continue
        lo, hi = ph["start_s"], ph["end_s"]
        ratios = [ratio_of[v] for v, p in applied.items() if v in ratio_of and lo <= p["at_s"] < hi]
        if not ratios:
            continue
        windows[ph["name"]] = healthy / max(ratios)
        bounds.append((max(ratios), off["throughput_iters_per_min"][ph["name"]]))

    def removed(reference, off_unit):
        """The ceiling's share of the slowdown with `reference` as healthy and off's rates / off_unit."""
        gain = sum(max(0.0, min(reference / r, reference) - o / off_unit) for r, o in bounds)
        loss = sum(max(0.0, reference - o / off_unit) for _, o in bounds)
        return gain / loss if loss > 0 else 0.0

    off_lead = off["throughput_iters_per_min"]["healthy"]
    return {"windows": windows, "slowdown_removed": removed(healthy, 1.0),
            "slowdown_removed_own_lead_in": removed(1.0, off_lead) if off_lead > 0 else 0.0}


def undo_per_window(act):
    """Per fault window: iterations after the fault's end still under the window's plan."""
    if "rank0_iterations" not in act:
        return None
    plans = [p for p in act["rank0_plans"] if p["status"] == "applied"]
    faults = [ph for ph in act["phases"] if ph["name"] not in ("healthy", "after")]
    out = {}
    for i, ph in enumerate(faults):
        lo, hi = ph["start_s"], ph["end_s"]
        nxt = faults[i + 1]["start_s"] if i + 1 < len(faults) else float("inf")
        mine = [p for p in plans if p["strategy"] in ("S2", "S3", "S4") and lo <= p["at_s"] < hi]
        if not mine:
            out[ph["name"]] = {"status": "no plan"}
            continue
        first = min(p["at_s"] for p in mine)
        undo = min((p for p in plans if p["strategy"] == "S1" and p["at_s"] > first),
                   key=lambda p: p["version"], default=None)
        if undo is None or undo["at_s"] >= nxt:
            out[ph["name"]] = {"status": "kept"}
        elif undo["at_s"] < hi:
            out[ph["name"]] = {"status": "early", "undo_at_s": undo["at_s"]}
        else:
            n = sum(1 for s, d, v in act["rank0_iterations"] if hi <= s < nxt and v < undo["version"])
            out[ph["name"]] = {"status": "undone", "iterations": n, "undo_at_s": undo["at_s"],
                               "after_fault_s": undo["at_s"] - hi}
    return out


def DemoWorkDir(output):
    """The log directory a --keep demo run printed ("# logs: DIR"), or None."""
    for line in output.splitlines():
        if line.startswith("# logs: "):
            return line[len("# logs: "):].strip()
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--phase-s", type=float, default=90)
    p.add_argument("--out", default="mitigation-e2e-out", help="per-run reports (JSON + SVG)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    p.add_argument("--reuse", action="store_true", help="analyse the reports already in --out; run nothing")
    p.add_argument("--keep", action="store_true", help="keep each run's logs (their directories are printed)")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="micro-batches per DP replica (default: the demo's; the same global batch: demo.py --micro-batches)")
    args = p.parse_args()
    if args.micro_batches is not None and not 1 <= args.micro_batches <= 64:
        p.error("--micro-batches must be 1 to 64 (demo.py's bound)")
    demo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "demo.py")
    runs = {}
    for mode in ("off", "advise", "act"):
        r = subprocess.CompletedProcess([], 0, "", "")
        if not args.reuse:
            print(f"# run: mitigation {mode} ...", file=sys.stderr, flush=True)
            r = subprocess.run([sys.executable, demo, "--build", args.build, "--mitigation", mode, "--phase-s",
                                str(args.phase_s), "--out", args.out, "--quiet"] + (["--keep"] if args.keep else []) +
                               ([] if args.micro_batches is None else ["--micro-batches", str(args.micro_batches)]),
                               capture_output=True, text=True)
            if args.keep:
                print(f"# logs of {mode}: {DemoWorkDir(r.stdout + r.stderr) or 'not printed'}", file=sys.stderr)
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
    lead = lambda m: runs[m]["throughput_iters_per_min"]["healthy"]
    own = lambda m: own_removed(runs[m]["fault_windows_iters_per_min"], lead(m), off, lead("off"))
    decisions = {m: [d.get("strategy") for d in runs[m]["decisions"] if d.get("strategy") not in (None, "S1")]
                 for m in runs}
    doc = {
        "healthy_iters_per_min": healthy,
        "runs": {m: {"ok": runs[m]["ok"], "fault_windows_iters_per_min": runs[m]["fault_windows_iters_per_min"],
                     "phases": runs[m]["throughput_iters_per_min"], "slowdown_removed": removed(m),
                     "slowdown_removed_own_lead_in": own(m),
                     "switches": decisions[m]} for m in runs},
        "under_plan": under_plan(runs["act"], runs["off"], healthy),
        "undo": undo_per_window(runs["act"]),
        "ceiling": plan_ceiling(runs["act"], runs["off"], healthy),
    }
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        mb = "" if args.micro_batches is None else f"{args.micro_batches} micro-batches per replica, "
        print(f"# mitigation end to end: 16 ranks TP2 x DP4 x PP2, {mb}8 emulated nodes + 1 spare; faults: GPU x2.5, "
              f"DP link x4, GPU x2 + link x4, {args.phase_s:.0f} s each")
        print(f"{'mode':8s} {'lead-in':>8s} {'fault windows it/min':>21s} {'compute':>8s} {'link':>8s} {'both':>8s} "
              f"{'slowdown removed':>17s} {'own lead-in':>12s}  strategies  job")
        print(f"{'healthy':8s} {'':8s} {healthy:21.1f}")
        for m in ("off", "advise", "act"):
            r = doc["runs"][m]
            ph = r["phases"]
            print(f"{m:8s} {ph['healthy']:8.1f} {r['fault_windows_iters_per_min']:21.1f} {ph['compute']:8.1f} "
                  f"{ph['link']:8.1f} {ph['both']:8.1f} {100 * r['slowdown_removed']:16.1f}% "
                  f"{100 * r['slowdown_removed_own_lead_in']:11.1f}%  {','.join(r['switches']) or '-':10s}  "
                  f"{'ok' if r['ok'] else 'FAILED'}")
        u = doc["under_plan"]
        if u is None:
            print("# under the plan: no report of rank 0's iterations (rerun without --reuse)")
        else:
            print("# act, from the first iteration under a mitigation plan to the end of each fault window "
                  "(off over the same intervals):")
            for name, ph in u["phases"].items():
                if ph["reaction_s"] is None:
                    print(f"#   {name:8s} no plan took effect")
                else:
                    print(f"#   {name:8s} plan in effect {ph['reaction_s']:5.1f} s after the onset, for {ph['span_s']:5.1f} s: "
                          f"act {ph['act']:6.1f} it/min, off {ph['off']:6.1f} it/min")
            print(f"#   under the plan: act {u['act']:.1f} it/min vs off {u['off']:.1f} it/min (healthy {healthy:.1f}): "
                  f"{100 * u['slowdown_removed']:.1f}% of the slowdown removed "
                  f"({100 * u['slowdown_removed_own_lead_in']:.1f}% against each run's own lead-in)")
        c = doc["ceiling"]
        if c["windows"]:
            print("# the chosen plans' ceiling (healthy / each plan's fault-free ratio; reacting at once, no pauses): " +
                  ", ".join(f"{n} {v:.1f}" for n, v in c["windows"].items()) +
                  f" it/min: at most {100 * c['slowdown_removed']:.1f}% over whole windows "
                  f"({100 * c['slowdown_removed_own_lead_in']:.1f}% against off's own lead-in)")
        for name, w in (doc["undo"] or {}).items():
            if w["status"] == "undone":
                print(f"#   undo {name:8s} {w['iterations']} iterations ({w['after_fault_s']:.1f} s) after the fault ended")
            elif w["status"] == "early":
                print(f"#   undo {name:8s} EARLY: at {w['undo_at_s']:.1f} s, while the fault lasted")
            else:
                print(f"#   undo {name:8s} {w['status']}")
    return 0 if all(r["ok"] for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
