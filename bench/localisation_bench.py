#!/usr/bin/env python3
"""Localisation benchmark: randomized fail-slows on a 16-rank emulated job, end to end.

Each run starts a redis-server on a free loopback port, one falcon-agent per emulated node (8),
falcon-controller, and falcon-train-emu (TP 2 x DP 4 x PP 2, 2 ranks per node) under the shim
with one random fault: a slow GPU (compute, one rank, x2-x4), a slow link (two nodes carrying DP
traffic, x3-x6) or a slow NIC (one node, x3-x6), starting at a random time. It records, from the
controller's incident stream (read with falcon-ctl incidents --json):
  detect_s    fault onset -> the incident's detection stage
  localise_s  fault onset -> the first localisation naming a culprit
  correct     that localisation named exactly the injected culprit (and nothing else)
  pause_s     how long the job was paused for that validation
  agent_cpu   mean agent CPU over the run, % of one core (agent heartbeats' cpu_seconds)
and prints one row per run, then medians and worst cases. Exit status 1 if any run was wrong.

  bench/localisation_bench.py --build build --runs 20 [--seed 1] [--json out.json]

The onset is the launcher's job epoch + the fault's start_s; the epoch is taken as the wall clock
just before falcon-emu-run starts (off by the launcher's start-up, a few milliseconds).
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

NODES, RANKS = 8, 16
DP_LINKS = [(0, 1), (1, 2), (2, 3), (0, 3), (4, 5), (5, 6), (6, 7), (4, 7)]  # carry DP traffic


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_fault(rng):
    kind = rng.choice(["compute", "link", "nic"])
    start = round(rng.uniform(18, 28), 1)
    if kind == "compute":
        rank = rng.randrange(RANKS)
        f = {"kind": "compute", "ranks": [rank], "start_s": start, "factor": round(rng.uniform(2, 4), 2)}
        return f, {"gpus": [rank], "links": [], "nics": []}
    if kind == "link":
        a, b = rng.choice(DP_LINKS)
        f = {"kind": "link", "nodes": [a, b], "start_s": start, "factor": round(rng.uniform(3, 6), 2)}
        return f, {"gpus": [], "links": [sorted([f"node{a}", f"node{b}"])], "nics": []}
    node = rng.randrange(NODES)
    f = {"kind": "nic", "nodes": [node], "start_s": start, "factor": round(rng.uniform(3, 6), 2)}
    return f, {"gpus": [], "links": [], "nics": [f"node{node}"]}


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
                    "--view-ms", "500", "--heartbeat-ms", "1000", "--p2p-bytes", "1048576", "--retry-after-s", "10"],
                   "controller.log")
        env = dict(os.environ, FALCON_JOB=self.job, FALCON_EMU_INTRA_GBPS="0.05", FALCON_EMU_INTER_GBPS="0.05",
                   FALCON_EMU_GPU_TFLOPS="10")
        plan = json.dumps({"faults": [self.fault]})
        epoch = time.time()
        job = self.spawn([self.bin("bench/emu/falcon-emu-run"), "-n", str(RANKS), "--ranks-per-node", "2",
                          "--timeout", "120", "--node-shm-dirs", shm, "--preload", self.bin("shim/libfalcon_shim.so"),
                          "--fault-plan", plan, "--", self.bin("bench/train/falcon-train-emu"), "--tp", "2", "--dp",
                          "4", "--pp", "2", "--compute-ms", "10", "--grad-bytes", "2097152", "--check",
                          "--progress-every", "0", "--duration-s",
                          str(self.args.duration)], "job.log", env)
        onset = epoch + self.fault["start_s"]
        rc = job.wait(timeout=self.args.duration + 120)
        time.sleep(1.5)  # the last heartbeats and incident stages
        incs = self.incidents()
        cpu = self.agent_cpu(time.time() - epoch)
        det = next((i for i in incs if i["stage"] == "detection" and i["at_ns"] / 1e9 >= onset), None)
        loc = next((i for i in incs if i["stage"] == "localisation" and i.get("cause", "unknown") != "unknown"
                    and i["at_ns"] / 1e9 >= onset), None)
        row = {"run": self.index, "fault": self.fault, "truth": self.truth, "job_rc": rc, "agent_cpu_pct": cpu,
               "detect_s": det["at_ns"] / 1e9 - onset if det else None,
               "localise_s": loc["at_ns"] / 1e9 - onset if loc else None,
               "named": named(loc) if loc else None,
               "pause_s": loc["detail"]["validation"].get("pause_s") if loc else None,
               "false_accusations": sum(1 for i in incs if i["stage"] == "localisation"
                                        and i.get("cause", "unknown") != "unknown" and i["at_ns"] / 1e9 < onset)}
        row["correct"] = bool(loc) and row["named"] == truth_norm(self.truth) and rc == 0 and \
            row["false_accusations"] == 0
        return row

    def agent_cpu(self, elapsed):
        total = []
        for key in self.redis("--scan", "--pattern", f"falcon:{self.job}:agent:*").split():
            try:
                total.append(json.loads(self.redis("HGET", key, "msg"))["cpu_seconds"])
            except (json.JSONDecodeError, KeyError):
                pass
        return 100.0 * statistics.mean(total) / elapsed if total and elapsed > 0 else None

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
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
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(f"# falcon localisation benchmark: {args.runs} runs, seed {args.seed}, 16 ranks TP2xDP4xPP2 on 8 "
          f"emulated nodes, {args.duration:.0f} s jobs, build {args.build}")
    print(f"# machine: {os.cpu_count()} cpus, {os.uname().release}")
    print(f"# {'run':>3} {'fault':<34} {'detect(s)':>9} {'localise(s)':>11} {'pause(s)':>8} {'agentCPU%':>9} "
          f"{'job':>4} {'correct':>7}")
    rows = []
    for i in range(args.runs):
        fault, truth = random_fault(rng)
        run = Run(args, i, fault, truth)
        try:
            row = run.go()
        finally:
            run.close()
        rows.append(row)
        where = fault.get("ranks") or fault.get("nodes")
        desc = f"{fault['kind']} {where} x{fault['factor']} @{fault['start_s']}s"
        print(f"  {i:>3} {desc:<34} {fmt(row['detect_s']):>9} {fmt(row['localise_s']):>11} "
              f"{fmt(row['pause_s']):>8} {fmt(row['agent_cpu_pct']):>9} {row['job_rc']:>4} "
              f"{'yes' if row['correct'] else 'NO':>7}", flush=True)
    ok = [r for r in rows if r["correct"]]
    loc = sorted(r["localise_s"] for r in ok)
    det = sorted(r["detect_s"] for r in rows if r["detect_s"] is not None)
    pause = sorted(r["pause_s"] for r in ok if r["pause_s"] is not None)
    cpu = [r["agent_cpu_pct"] for r in rows if r["agent_cpu_pct"] is not None]
    summary = {"runs": len(rows), "correct": len(ok),
               "detect_s": {"p50": statistics.median(det) if det else None, "max": max(det) if det else None},
               "localise_s": {"p50": statistics.median(loc) if loc else None, "max": max(loc) if loc else None},
               "pause_s": {"p50": statistics.median(pause) if pause else None, "max": max(pause) if pause else None},
               "agent_cpu_pct": {"mean": statistics.mean(cpu) if cpu else None, "max": max(cpu) if cpu else None}}
    print(f"# correct {len(ok)}/{len(rows)}; onset->detection p50 {fmt(summary['detect_s']['p50'])} s worst "
          f"{fmt(summary['detect_s']['max'])} s; onset->localised p50 {fmt(summary['localise_s']['p50'])} s worst "
          f"{fmt(summary['localise_s']['max'])} s; pause p50 {fmt(summary['pause_s']['p50'])} s worst "
          f"{fmt(summary['pause_s']['max'])} s; agent CPU mean {fmt(summary['agent_cpu_pct']['mean'])} % of a core")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"v": 1, "summary": summary, "runs": rows}, f, indent=1)
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
