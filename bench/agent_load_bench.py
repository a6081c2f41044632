#!/usr/bin/env python3
"""The agent at full load: one real falcon-agent (default options) following --ranks real
processes under the real shim, each issuing NCCL calls at a fixed rate over the no-op NCCL
(falcon-load-caller), one of them slowed part-way. Per point (calls/s per rank, --rates) it
starts redis-server on a free loopback port, the agent and the callers, and reports:

  - the agent's CPU (% of one core, from /proc, over the window after warm-up) and memory (RSS,
    VmHWM), and the bytes Redis read from it over the same window (INFO total_net_input_bytes);
  - call records: read by the agent against calls issued, lost (overwritten before read) and
    torn, from the agent's /metrics;
  - detection: the ranks the agent raised a `slow` alarm for, and how long after the slow-down;
    correct when that is the slowed rank alone.

Points run one after another in one invocation, so their ratios compare like with like. Exit
status 1 unless every point read every record, lost none and detected correctly.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench_procs import free_port, stop_all


def cpu_seconds(pid):
    """utime + stime of `pid`, seconds (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def memory_mb(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) / 1024.0
    except OSError:
        pass
    return out


def metrics(port):
    """The agent's counters from /metrics: name -> value (labels dropped, values summed)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(falcon_agent_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


class Point:
    def __init__(self, args, rate, full_seqs):
        self.args = args
        self.rate = rate
        self.full_seqs = full_seqs
        self.dir = tempfile.mkdtemp(prefix="falcon-agentload-")
        self.port = free_port()
        self.metrics_port = free_port()
        self.job = "load"
        self.procs = []

    def bin(self, rel):
        return os.path.join(self.args.build, rel)

    def spawn(self, argv, log, env=None, stdout=None):
        f = open(os.path.join(self.dir, log), "w")
        p = subprocess.Popen(argv, stdout=stdout or f, stderr=f if stdout else subprocess.STDOUT, env=env, text=True)
        self.procs.append(p)
        return p

    def redis(self, *cmd):
        return subprocess.run(["redis-cli", "-p", str(self.port), "--raw", *cmd], capture_output=True,
                              text=True).stdout

    def redis_in_bytes(self):
        """Bytes Redis has read from its clients so far (INFO stats)."""
        for line in self.redis("INFO", "stats").splitlines():
            if line.startswith("total_net_input_bytes:"):
                return int(line.split(":", 1)[1])
        return None

    def alarms(self):
        """Every message of the alarms stream (entries may pack several `msg` fields)."""
        out = []
        for line in self.redis("XRANGE", f"falcon:{{{self.job}}}:alarms", "-", "+").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return out

    def run(self):
        a = self.args
        self.spawn(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                    "no", "--dir", self.dir], "redis.log")
        deadline = time.time() + 10
        while self.redis("PING").strip() != "PONG":
            if time.time() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        shm = os.path.join(self.dir, "shm")
        os.makedirs(shm)
        agent = self.spawn([self.bin("daemon/falcon-agent"), "--job", self.job, "--host", "node0", "--shm-dir", shm,
                            "--redis-port", str(self.port), "--metrics-port", str(self.metrics_port)]
                           + ([] if self.full_seqs is None else ["--signature-full-seqs", str(self.full_seqs)]),
                           "agent.log")
        env = dict(os.environ, LD_PRELOAD=os.path.abspath(self.bin("shim/libfalcon_shim.so")), FALCON_SHM_DIR=shm,
                   FALCON_JOB=self.job)
        callers = []
        start = time.time()
        for r in range(a.ranks):
            argv = [self.bin("bench/falcon-load-caller"), "--rank", str(r), "--nranks", str(a.ranks), "--rate",
                    str(self.rate), "--calls-per-iteration", str(a.calls_per_iteration), "--duration-s",
                    str(a.duration_s)]
            if r == a.slow_rank:
                argv += ["--slow-at-s", str(a.slow_at_s), "--slow-factor", str(a.slow_factor)]
            callers.append(self.spawn(argv, f"rank{r}.log", env, stdout=subprocess.PIPE))
        onset = start + a.slow_at_s
        time.sleep(a.warmup_s)
        cpu0, in0, t0 = cpu_seconds(agent.pid), self.redis_in_bytes(), time.time()
        time.sleep(max(0.0, a.duration_s - a.warmup_s - 1.0))
        cpu1, in1, t1 = cpu_seconds(agent.pid), self.redis_in_bytes(), time.time()
        mem = memory_mb(agent.pid)
        summaries = []
        for p in callers:
            out, _ = p.communicate(timeout=a.duration_s + 30)
            try:
                summaries.append(json.loads(out.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                summaries.append({"calls": 0, "rate": 0.0, "errors": 1, "rc": p.returncode})
        time.sleep(2.0)  # the agent's last polls of the exited ranks' segments
        counters = metrics(self.metrics_port)
        alarms = self.alarms()
        issued = sum(s["calls"] for s in summaries)
        slow_ranks = sorted({m["rank"] for m in alarms if m.get("kind") == "slow"})
        first = min((m["at_ns"] / 1e9 for m in alarms if m.get("kind") == "slow" and m["rank"] == a.slow_rank),
                    default=None)
        row = {
            "rate_target": self.rate,
            "rate_achieved": sum(s["rate"] for s in summaries) / len(summaries),
            "ranks": a.ranks,
            "signature_full_seqs": self.full_seqs,
            "agent_cpu_pct": 100.0 * (cpu1 - cpu0) / (t1 - t0) if cpu0 is not None and cpu1 is not None else None,
            "redis_in_kb_s": (in1 - in0) / 1e3 / (t1 - t0) if in0 is not None and in1 is not None else None,
            "agent_rss_mb": mem.get("VmRSS"),
            "agent_hwm_mb": mem.get("VmHWM"),
            "calls_issued": issued,
            "records_read": counters.get("falcon_agent_records_read_total"),
            "records_lost": counters.get("falcon_agent_records_lost_total"),
            "records_torn": counters.get("falcon_agent_records_torn_total"),
            "caller_errors": sum(s.get("errors", 0) for s in summaries),
            "slow_alarm_ranks": slow_ranks,
            "detect_s": first - onset if first is not None else None,
        }
        # Every call is a record (the init and destroy add a few per rank); none lost or torn; the
        # slowed rank alone alarmed, after its slow-down.
        read_all = row["records_read"] is not None and row["records_read"] >= issued
        row["correct"] = (read_all and row["records_lost"] == 0 and row["records_torn"] == 0 and
                          row["caller_errors"] == 0 and slow_ranks == [a.slow_rank] and row["detect_s"] is not None
                          and row["detect_s"] > 0)
        return row

    def close(self):
        stop_all(self.procs, timeout_s=10)
        if self.args.keep:
            print(f"# files: {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build", help="build directory (default: build)")
    p.add_argument("--rates", default="1000,10000", help="calls per second per rank, one point each (default 1000,10000)")
    p.add_argument("--ranks", type=int, default=8, help="shimmed processes on the node (default 8)")
    p.add_argument("--calls-per-iteration", type=int, default=1000, help="calls per iteration (default 1000)")
    p.add_argument("--duration-s", type=float, default=60, help="seconds each point's callers run (default 60)")
    p.add_argument("--warmup-s", type=float, default=10, help="seconds before the CPU window opens (default 10)")
    p.add_argument("--slow-rank", type=int, default=3, help="the rank slowed part-way (default 3)")
    p.add_argument("--slow-at-s", type=float, default=35, help="when it slows, s after start (default 35)")
    p.add_argument("--slow-factor", type=float, default=1.5, help="how much longer its iterations take (default 1.5)")
    p.add_argument("--signature-full-seqs", default="",
                   help="the agent's signature_full_seqs, one point per value per rate (comma-separated; default: "
                        "the agent's own, 4096). A very large value (1e18) sends every call as runs, as agents "
                        "before block digests did")
    p.add_argument("--json", help="write the rows here as JSON")
    p.add_argument("--keep", action="store_true", help="keep each point's logs")
    a = p.parse_args()
    try:
        rates = [float(r) for r in a.rates.split(",")]
    except ValueError:
        p.error(f"--rates: not a comma-separated list of numbers: {a.rates}")
    try:
        fulls = [int(float(v)) for v in a.signature_full_seqs.split(",")] if a.signature_full_seqs else [None]
    except ValueError:
        p.error(f"--signature-full-seqs: not a comma-separated list of numbers: {a.signature_full_seqs}")
    if any(v is not None and not 0 <= v <= 9.2e18 for v in fulls):
        p.error("--signature-full-seqs: each value must lie in 0..9.2e18")
    if not 0 <= a.slow_rank < a.ranks:
        p.error(f"--slow-rank {a.slow_rank} is not one of the {a.ranks} ranks")
    if not a.warmup_s + 1 < a.slow_at_s < a.duration_s:
        p.error("--slow-at-s must fall after the warm-up and before the end of --duration-s")
    for rel in ("daemon/falcon-agent", "bench/falcon-load-caller", "shim/libfalcon_shim.so"):
        if not os.path.exists(os.path.join(a.build, rel)):
            p.error(f"{os.path.join(a.build, rel)} is missing: build first (cmake --build --preset default)")
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        p.error("redis-server and redis-cli are needed (scripts/setup.sh installs them)")
    print(f"# falcon agent at full load: {a.ranks} ranks on one agent, {a.calls_per_iteration} calls an iteration, "
          f"{a.duration_s:g} s a point; rank {a.slow_rank} x{a.slow_factor:g} from {a.slow_at_s:g} s; build {a.build}")
    print(f"# machine: {os.cpu_count()} cpus, {os.uname().release}")
    print("calls/s/rank  full seqs  achieved  agentCPU%  Redis in kB/s  RSS MB  HWM MB  issued     read       lost  torn  "
          "slow alarms  detect s  verdict")
    rows = []
    for rate, full in [(r, f) for r in rates for f in fulls]:
        pt = Point(a, rate, full)
        try:
            row = pt.run()
        finally:
            pt.close()
        rows.append(row)
        print(f"{rate:>12.0f}  {'default' if full is None else format(full, 'g'):>9}  {row['rate_achieved']:>8.0f}  "
              f"{fmt(row['agent_cpu_pct'], '>9.2f')}  {fmt(row['redis_in_kb_s'], '>13.1f')}  "
              f"{fmt(row['agent_rss_mb'], '>6.1f')}  {fmt(row['agent_hwm_mb'], '>6.1f')}  {row['calls_issued']:<9d}  "
              f"{fmt(row['records_read'], '<9.0f')}  {fmt(row['records_lost'], '>4.0f')}  {fmt(row['records_torn'], '>4.0f')}  "
              f"{str(row['slow_alarm_ranks']):<11}  {fmt(row['detect_s'], '>8.1f')}  "
              f"{'correct' if row['correct'] else 'WRONG'}", flush=True)
    def label(row):
        full = row["signature_full_seqs"]
        return f"{row['rate_target']:g} calls/s per rank" + ("" if full is None else f", full seqs {full:g}")
    def ratio(a_row, b_row):
        if a_row["agent_cpu_pct"] and b_row["agent_cpu_pct"] is not None:
            print(f"# agent CPU x{b_row['agent_cpu_pct'] / a_row['agent_cpu_pct']:.2f} from {label(a_row)} "
                  f"to {label(b_row)}")
    if len(fulls) == 1 and len(rows) > 1:
        ratio(rows[0], rows[-1])
    for k in range(0, len(rows), len(fulls)):  # per rate: each setting against the first
        for row in rows[k + 1:k + len(fulls)]:
            ratio(rows[k], row)
    ok = all(r["correct"] for r in rows)
    print(f"# verdict: {'PASS' if ok else 'FAIL'}: {sum(r['correct'] for r in rows)}/{len(rows)} points correct")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
