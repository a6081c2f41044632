#!/usr/bin/env python3
"""Localisation benchmark: randomized fail-slows on a 16-rank emulated job, end to end.

Each run starts a redis-server on a free loopback port, one falcon-agent per emulated node (8),
falcon-controller, and falcon-train-emu (TP 2 x DP 4 x PP 2, 2 ranks per node) under the shim
with one random fault, factor --min-factor..--max-factor (default 1.3-3): a slow GPU (compute,
one rank), a slow link (two nodes carrying DP traffic) or a slow NIC (one node), starting at a
random time. It records, from the controller's incident stream (read with falcon-ctl incidents
--json) and rank 0's ground-truth report:
  slowdown    the job's median iteration time over the 10 iterations after the onset / the 10
              before it (what the detectors see)
  detect_s    fault onset -> the incident's detection stage
  localise_s  fault onset -> the first localisation naming a culprit
  localise_it the same in iterations (rank 0's iterations that ended in between)
  verdict     exact: that localisation named exactly the injected culprit (and nothing else, and
              nobody before the onset); wrong: it named something else, or someone was accused
              before the onset, or the job failed; missed: nothing was named
  pause_s     how long the job was paused for that validation
  agent_cpu   mean agent CPU over the run, % of one core (agent heartbeats' cpu_seconds)
and prints one row per run, then medians and worst cases. A fault that slows the job by less than
--threshold (default 1.10: the detectors' 10 % verification rule) is no fail-slow to them: such a
run counts as passed unless it is wrong. Exit status 1 if any run failed.

The job is shaped so that every kind of fault matters: modelled compute is about half of an
iteration and DP gradient traffic about a third (fabric 0.02 GB/s), so a x1.3 fault slows it by
roughly 10-20 %. It runs without --check: verifying 4 MiB buffers on every rank is host CPU work
that no model accounts for (the pause/resume tests run with it).

  bench/localisation_bench.py --build build --runs 20 [--seed 1] [--json out.json]
  bench/localisation_bench.py --fault '{"kind":"compute","ranks":[6],"start_s":27,"factor":2}' --keep

The onset is the launcher's job epoch + the fault's start_s; the epoch is taken as the wall clock
just before falcon-emu-run starts (off by the launcher's start-up, a few milliseconds).
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_procs import free_port, stop_all

NODES, RANKS = 8, 16
WINDOW = 10  # iterations either side of the onset for the slowdown
DP_LINKS = [(0, 1), (1, 2), (2, 3), (0, 3), (4, 5), (5, 6), (6, 7), (4, 7)]  # carry DP traffic


def random_fault(rng, lo, hi):
    kind = rng.choice(["compute", "link", "nic"])
    start = round(rng.uniform(18, 28), 1)
    factor = round(rng.uniform(lo, hi), 2)
    if kind == "compute":
        f = {"kind": "compute", "ranks": [rng.randrange(RANKS)], "start_s": start, "factor": factor}
    elif kind == "link":
        f = {"kind": "link", "nodes": list(rng.choice(DP_LINKS)), "start_s": start, "factor": factor}
    else:
        f = {"kind": "nic", "nodes": [rng.randrange(NODES)], "start_s": start, "factor": factor}
    return f, truth_of(f)


def truth_of(f):
    if f["kind"] == "compute":
        return {"gpus": list(f["ranks"]), "links": [], "nics": []}
    if f["kind"] == "link":
        return {"gpus": [], "links": [sorted(f"node{n}" for n in f["nodes"])], "nics": []}
    if f["kind"] == "nic":
        return {"gpus": [], "links": [], "nics": [f"node{f['nodes'][0]}"]}
    raise ValueError(f"fault kind {f['kind']!r}: compute, link or nic")


def named(loc):
    d = loc.get("detail", {})
    links = sorted({tuple(sorted(l["hosts"])) for l in d.get("links", [])})
    return {"gpus": sorted(g["rank"] for g in d.get("gpus", [])),
            "links": [list(l) for l in links],
            "nics": sorted(n["host"] for n in d.get("nics", []))}


class Run:
    def __init__(self, args, index, fault, truth):
        self.args, self.index, self.fault, self.truth = args, index, fault, truth
        self.dir = tempfile.mkdtemp(prefix="falcon-locbench-")
        self.port = free_port()
        self.job = f"bench{index}"
        self.procs = []

    def bin(self, rel):
        return os.path.join(self.args.build, rel)

    def spawn(self, argv, log, env=None):
        f = open(os.path.join(self.dir, log), "w")
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        self.procs.append(p)
        return p

    def redis(self, *cmd):
        return subprocess.run(["redis-cli", "-p", str(self.port), *cmd], capture_output=True, text=True).stdout

    def incidents(self):
        out = subprocess.run([self.bin("daemon/falcon-ctl"), "incidents", "--json", "-n", "0", "--job", self.job,
                              "--port", str(self.port)], capture_output=True, text=True)
        try:
            return [i["msg"] for i in json.loads(out.stdout).get("incidents", [])]
        except json.JSONDecodeError:
            return []

    def go(self):
        self.spawn(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", self.dir], "redis.log")
        deadline = time.time() + 10
        while self.redis("PING").strip() != "PONG":
            if time.time() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        shm = os.path.join(self.dir, "shm")
        for k in range(NODES):
            self.spawn([self.bin("daemon/falcon-agent"), "--job", self.job, "--host", f"node{k}", "--shm-dir",
                        f"{shm}/node{k}", "--redis-port", str(self.port), "--metrics-port", "0", "--poll-ms", "100",
                        "--flush-ms", "250", "--heartbeat-ms", "500", "--key-ttl-s", "3", "--profile-ms", "2000",
                        "--command-block-ms", "200"], f"agent{k}.log")
        self.spawn([self.bin("daemon/falcon-controller"), "--job", self.job, "--redis-port", str(self.port),
                    "--view-ms", "500", "--heartbeat-ms", "1000", "--p2p-bytes", "524288", "--retry-after-s", "10"],
                   "controller.log")
        env = dict(os.environ, FALCON_JOB=self.job, FALCON_EMU_INTRA_GBPS="0.02", FALCON_EMU_INTER_GBPS="0.02",
                   FALCON_EMU_GPU_TFLOPS="10")
        plan = json.dumps({"faults": [self.fault]})
        epoch = time.time()
        job = self.spawn([self.bin("bench/emu/falcon-emu-run"), "-n", str(RANKS), "--ranks-per-node", "2",
                          "--job-timeout", str(int(self.args.duration) + 110), "--node-shm-dirs", shm, "--preload", self.bin("shim/libfalcon_shim.so"),
                          "--fault-plan", plan, "--", self.bin("bench/train/falcon-train-emu"),
                          "--tp", "2", "--dp",
                          "4", "--pp", "2", "--compute-ms", str(self.args.compute_ms), "--grad-bytes",
                          str(self.args.grad_bytes),
                          "--progress-every", "0", "--report", os.path.join(self.dir, "report.json"),
                          "--duration-s", str(self.args.duration)], "job.log", env)
        onset = epoch + self.fault["start_s"]
        rc = job.wait(timeout=self.args.duration + 120)
        time.sleep(1.5)  # the last heartbeats and incident stages
        incs = self.incidents()
        if self.args.keep:  # the incidents (validation steps and timings included) for a later look
            with open(os.path.join(self.dir, "incidents.json"), "w") as f:
                json.dump(incs, f, indent=1)
        cpu = self.agent_cpu(time.time() - epoch)
        det = next((i for i in incs if i["stage"] == "detection" and i["at_ns"] / 1e9 >= onset), None)
        loc = next((i for i in incs if i["stage"] == "localisation" and i.get("cause", "unknown") != "unknown"
                    and i["at_ns"] / 1e9 >= onset), None)
        row = {"run": self.index, "fault": self.fault, "truth": self.truth, "job_rc": rc, "agent_cpu_pct": cpu,
               "detect_s": det["at_ns"] / 1e9 - onset if det else None,
               "localise_s": loc["at_ns"] / 1e9 - onset if loc else None,
               "localise_it": self.iterations_between(self.fault["start_s"], loc["at_ns"] / 1e9 - epoch)
               if loc else None,
               "slowdown": self.slowdown(),
               "named": named(loc) if loc else None,
               "pause_s": loc["detail"]["validation"].get("pause_s") if loc else None,
               "false_accusations": sum(1 for i in incs if i["stage"] == "localisation"
                                        and i.get("cause", "unknown") != "unknown" and i["at_ns"] / 1e9 < onset)}
        named_all = [named(i) for i in incs if i["stage"] == "localisation" and
                     i.get("cause", "unknown") != "unknown" and i["at_ns"] / 1e9 >= onset]
        truth = truth_norm(self.truth)
        if rc != 0 or row["false_accusations"] or any(n != truth for n in named_all):
            row["verdict"] = "wrong"
        else:
            row["verdict"] = "exact" if loc else "missed"
        row["eligible"] = row["slowdown"] is None or row["slowdown"] >= self.args.threshold
        row["passed"] = row["verdict"] == "exact" or (row["verdict"] == "missed" and not row["eligible"])
        return row

    def rank0_iterations(self):
        try:
            with open(os.path.join(self.dir, "report.json.rank0")) as f:
                return json.load(f)["iterations"]
        except (OSError, ValueError, KeyError):
            return []

    def iterations_between(self, t0, t1):
        """Rank 0's iterations that ended in (t0, t1], job seconds."""
        return sum(1 for it in self.rank0_iterations() if t0 < it["start_s"] + it["duration_s"] <= t1)

    def slowdown(self):
        """Median iteration time of the WINDOW iterations that began after the onset, over the median
        of the WINDOW that ended before it: the change the detectors see, local to the onset so that
        host load elsewhere in the run does not count (a validation pause is one long iteration;
        the median ignores it)."""
        its = self.rank0_iterations()
        start = self.fault["start_s"]
        before = [it["duration_s"] for it in its if it["start_s"] + it["duration_s"] <= start and it["iter"] >= 5]
        after = [it["duration_s"] for it in its if it["start_s"] >= start]
        before, after = before[-WINDOW:], after[:WINDOW]
        if not before or not after:
            return None
        return statistics.median(after) / statistics.median(before)

    def agent_cpu(self, elapsed):
        total = []
        for key in self.redis("--scan", "--pattern", f"falcon:{{{self.job}}}:agent:*").split():
            try:
                total.append(json.loads(self.redis("HGET", key, "msg"))["cpu_seconds"])
            except (json.JSONDecodeError, KeyError):
                pass
        return 100.0 * statistics.mean(total) / elapsed if total and elapsed > 0 else None

    def close(self):
        stop_all(self.procs, timeout_s=10)
        if self.args.keep:
            print(f"#   run {self.index} files: {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def truth_norm(t):
    return {"gpus": sorted(t["gpus"]), "links": sorted(t["links"]), "nics": sorted(t["nics"])}


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="build directory (default: build)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=55, help="job seconds per run (default 55)")
    ap.add_argument("--json", help="write the records here as JSON")
    ap.add_argument("--keep", action="store_true", help="keep each run's logs")
    ap.add_argument("--min-factor", type=float, default=1.3, help="slowest fault factor drawn (default 1.3)")
    ap.add_argument("--max-factor", type=float, default=3.0, help="largest fault factor drawn (default 3)")
    ap.add_argument("--compute-ms", type=float, default=20,
                    help="the job's modelled forward time of a layer per micro-batch (default 20)")
    ap.add_argument("--threshold", type=float, default=1.10,
                    help="job slowdown below which a fault need not be found (default 1.10)")
    ap.add_argument("--grad-bytes", type=int, default=4 << 20, help="DP gradient bytes per rank (default 4 MiB)")
    ap.add_argument("--fault", help="run this fault (a fault-plan entry as JSON) instead of random ones")
    args = ap.parse_args()
    if not 1.0 < args.min_factor <= args.max_factor:
        ap.error("need 1 < --min-factor <= --max-factor")
    fixed = None
    if args.fault:
        try:
            fixed = json.loads(args.fault)
            truth_of(fixed)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            ap.error(f"--fault: {e}")
    rng = random.Random(args.seed)
    print(f"# falcon localisation benchmark: {args.runs} runs, seed {args.seed}, factors "
          f"{args.min_factor}-{args.max_factor}, 16 ranks TP2xDP4xPP2 on 8 emulated nodes, {args.duration:.0f} s "
          f"jobs, build {args.build}")
    print(f"# machine: {os.cpu_count()} cpus, {os.uname().release}")
    print(f"# {'run':>3} {'fault':<34} {'slowdown':>8} {'detect(s)':>9} {'localise(s)':>11} {'(iters)':>7} "
          f"{'pause(s)':>8} {'agentCPU%':>9} {'job':>4} {'verdict':>7}")
    rows = []
    for i in range(args.runs):
        fault, truth = (dict(fixed), truth_of(fixed)) if fixed else random_fault(rng, args.min_factor,
                                                                                 args.max_factor)
        run = Run(args, i, fault, truth)
        try:
            row = run.go()
        finally:
            run.close()
        rows.append(row)
        where = fault.get("ranks") or fault.get("nodes")
        desc = f"{fault['kind']} {where} x{fault['factor']} @{fault['start_s']}s"
        print(f"  {i:>3} {desc:<34} {fmt(row['slowdown']):>8} {fmt(row['detect_s']):>9} "
              f"{fmt(row['localise_s']):>11} {fmt(row['localise_it'], 'd'):>7} {fmt(row['pause_s']):>8} "
              f"{fmt(row['agent_cpu_pct']):>9} {row['job_rc']:>4} "
              f"{row['verdict'] + ('' if row['eligible'] else '*'):>8}", flush=True)
    ok = [r for r in rows if r["verdict"] == "exact"]
    eligible = [r for r in rows if r["eligible"]]
    below = [r for r in rows if not r["eligible"]]
    failed = [r for r in rows if not r["passed"]]
    loc = sorted(r["localise_s"] for r in ok)
    loc_it = sorted(r["localise_it"] for r in ok)
    det = sorted(r["detect_s"] for r in rows if r["detect_s"] is not None)
    pause = sorted(r["pause_s"] for r in ok if r["pause_s"] is not None)
    cpu = [r["agent_cpu_pct"] for r in rows if r["agent_cpu_pct"] is not None]
    summary = {"runs": len(rows), "exact": len(ok), "eligible": len(eligible),
               "eligible_exact": sum(1 for r in eligible if r["verdict"] == "exact"),
               "below_threshold": len(below), "below_threshold_exact": sum(1 for r in below if r["verdict"] == "exact"),
               "wrong": sum(1 for r in rows if r["verdict"] == "wrong"), "failed": len(failed),
               "detect_s": {"p50": statistics.median(det) if det else None, "max": max(det) if det else None},
               "localise_s": {"p50": statistics.median(loc) if loc else None, "max": max(loc) if loc else None},
               "localise_iterations": {"p50": statistics.median(loc_it) if loc_it else None,
                                       "max": max(loc_it) if loc_it else None},
               "pause_s": {"p50": statistics.median(pause) if pause else None, "max": max(pause) if pause else None},
               "agent_cpu_pct": {"mean": statistics.mean(cpu) if cpu else None, "max": max(cpu) if cpu else None}}
    print(f"# localised exactly {summary['eligible_exact']}/{len(eligible)} runs whose fault slowed the job >= "
          f"{args.threshold:g}x; below that (*): {len(below)} runs, {summary['below_threshold_exact']} localised "
          f"exactly; wrong {summary['wrong']}")
    print(f"# onset->detection p50 {fmt(summary['detect_s']['p50'])} s worst "
          f"{fmt(summary['detect_s']['max'])} s; onset->localised p50 {fmt(summary['localise_s']['p50'])} s worst "
          f"{fmt(summary['localise_s']['max'])} s (iterations p50 {fmt(summary['localise_iterations']['p50'], 'g')} "
          f"worst {fmt(summary['localise_iterations']['max'], 'g')}); pause p50 {fmt(summary['pause_s']['p50'])} s worst "
          f"{fmt(summary['pause_s']['max'])} s; agent CPU mean {fmt(summary['agent_cpu_pct']['mean'])} % of a core")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"v": 1, "summary": summary, "runs": rows}, f, indent=1)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
