#!/usr/bin/env python3
"""Chaos suite: a job under load while its agents, controller and Redis are killed, stopped and
restarted at random points, bad keys and oversized messages are injected and segment
directories are filled with junk.

Each run starts a redis-server on a free loopback port (append-only file, fsync on every write:
a Redis that is killed comes back with what it acknowledged, as a production one should), one
falcon-agent per emulated node, falcon-controller, and falcon-train-emu (TP 2 x DP 2 x PP 2,
8 ranks on 4 nodes) under the shim with --check, so every collective's data is verified, and one
slow GPU (rank 5, x2) from 40 % of the run on. Then, at --actions random times (seeded), one of:

  kill-agent        SIGKILL one agent, start it again D s later
  stop-agent        SIGSTOP one agent for D s, then SIGCONT
  kill-controller   SIGKILL the controller, start it again D s later
  stop-controller   SIGSTOP the controller for D s
  kill-redis        SIGKILL redis-server, start it again (same port, same files) D s later
  stop-redis        SIGSTOP redis-server for D s
  bad-keys          wrong-type keys where rank and agent keys live, garbage on every report
                    stream and on requests, 1.5 MiB messages on iterations and a rank key
  fill-shm          300 junk files and a directory named like segments in one node's segment
                    directory, some unreadable, some truncated segment headers

with D drawn from 0.5-6 s. After every action that took something away, it measures the
recovery: the time from the restore (restart, SIGCONT) until every agent and the controller have
written a fresh heartbeat and every rank is registered again. A run passes when
  - the job exits 0 (--check: every result correct),
  - no daemon that was not killed on purpose exited, and no log shows a crash,
  - no incident is lost: every incident stage a controller logged as published is in the
    incidents stream at the end, and the slow GPU was detected,
  - every recovery took at most --recover-bound-s (default 20 s).
It prints one row per action and a summary per run; exit status 1 if any run failed.

  bench/chaos.py --build build --runs 1 --seed 1            (what CI runs, ~70 s)
  bench/chaos.py --build build --runs 5 --duration 300 --actions 40 --json soak.json
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

from bench_procs import free_port

NODES, RANKS = 4, 8
ACTIONS = ["kill-agent", "stop-agent", "kill-controller", "stop-controller", "kill-redis", "stop-redis",
           "bad-keys", "fill-shm"]
CRASH_MARKS = ("AddressSanitizer", "runtime error:", "terminate called", "Segmentation fault", "std::bad_alloc")


class Daemon:
    """One daemon process that the suite may kill, stop and start again with the same argv."""

    def __init__(self, name, argv, log):
        self.name, self.argv, self.log = name, argv, log
        self.proc = None
        self.killed = 0  # times the suite killed it on purpose
        self.unexpected = []  # exit codes of exits the suite did not cause

    def start(self):
        f = open(self.log, "a")
        self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT)
        f.close()

    def check_alive(self):
        if self.proc and self.proc.poll() is not None:
            self.unexpected.append(self.proc.returncode)
            self.proc = None

    def kill(self):
        self.check_alive()
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.killed += 1

    def signal(self, sig):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Run:
    def __init__(self, args, index, seed):
        self.args, self.index = args, index
        self.rng = random.Random(seed)
        self.dir = tempfile.mkdtemp(prefix="falcon-chaos-")
        self.port = free_port()
        self.job = f"chaos{index}"
        self.shm = os.path.join(self.dir, "shm")
        self.daemons = {}
        self.rows = []

    def bin(self, rel):
        return os.path.join(self.args.build, rel)

    def key(self, suffix):
        return f"falcon:{{{self.job}}}:{suffix}"

    def redis(self, *cmd, stdin=None, timeout=5):
        try:
            return subprocess.run(["redis-cli", "-p", str(self.port), *cmd], input=stdin, capture_output=True,
                                  text=True, timeout=timeout).stdout
        except subprocess.TimeoutExpired:
            return ""

    def wait_redis(self, timeout=15):
        deadline = time.time() + timeout
        while self.redis("PING", timeout=1).strip() != "PONG":
            if time.time() > deadline:
                raise RuntimeError("redis-server did not come up")
            time.sleep(0.05)

    def make_daemons(self):
        log = lambda name: os.path.join(self.dir, name + ".log")
        self.daemons["redis"] = Daemon("redis", [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
            "--appendfsync", "always", "--dir", self.dir], log("redis"))
        for k in range(NODES):
            self.daemons[f"agent{k}"] = Daemon(f"agent{k}", [
                self.bin("daemon/falcon-agent"), "--job", self.job, "--host", f"node{k}", "--shm-dir",
                f"{self.shm}/node{k}", "--redis-port", str(self.port), "--metrics-port", "0", "--poll-ms", "100",
                "--flush-ms", "250", "--heartbeat-ms", "500", "--key-ttl-s", "3", "--profile-ms", "2000",
                "--command-block-ms", "200"], log(f"agent{k}"))
        self.daemons["controller"] = Daemon("controller", [
            self.bin("daemon/falcon-controller"), "--job", self.job, "--redis-port", str(self.port), "--view-ms",
            "500", "--heartbeat-ms", "1000", "--p2p-bytes", "524288", "--retry-after-s", "10"], log("controller"))

    # ---- health -----------------------------------------------------------------------------

    def heartbeat_ns(self, key):
        try:
            return json.loads(self.redis("HGET", key, "msg", timeout=1))["at_ns"]
        except (json.JSONDecodeError, KeyError, TypeError):
            return None

    def healthy_since(self, t0):
        """Every agent and the controller wrote a heartbeat after t0; every rank is registered."""
        for k in range(NODES):
            at = self.heartbeat_ns(self.key(f"agent:node{k}"))
            if at is None or at / 1e9 < t0:
                return False
        at = self.heartbeat_ns(self.key("controller"))
        if at is None or at / 1e9 < t0:
            return False
        ranks = [k for k in self.redis("--scan", "--pattern", self.key("rank:*"), timeout=2).split()
                 if k.rsplit(":", 1)[1].isdigit() and int(k.rsplit(":", 1)[1]) < RANKS]
        return len(set(ranks)) == RANKS

    def recovery(self, t0):
        deadline = t0 + self.args.recover_bound_s + 10
        while time.time() < deadline:
            if self.healthy_since(t0):
                return time.time() - t0
            time.sleep(0.2)
        return None

    # ---- actions ----------------------------------------------------------------------------

    def act(self, kind, hold):
        """Does one action; returns the restore time (None when nothing was taken away)."""
        d = self.daemons
        if kind in ("kill-agent", "stop-agent"):
            target = d[f"agent{self.rng.randrange(NODES)}"]
        elif kind in ("kill-controller", "stop-controller"):
            target = d["controller"]
        elif kind in ("kill-redis", "stop-redis"):
            target = d["redis"]
        if kind.startswith("kill-"):
            target.kill()
            time.sleep(hold)
            target.start()
            if target.name == "redis":
                self.wait_redis()
            return time.time(), target.name
        if kind.startswith("stop-"):
            target.signal(signal.SIGSTOP)
            time.sleep(hold)
            target.signal(signal.SIGCONT)
            return time.time(), target.name
        if kind == "bad-keys":
            self.bad_keys()
            return None, "redis keys"
        if kind == "fill-shm":
            node = self.rng.randrange(NODES)
            self.fill_shm(os.path.join(self.shm, f"node{node}"))
            return None, f"node{node} shm"
        raise ValueError(kind)

    def bad_keys(self):
        big = "x" * (3 << 19)  # 1.5 MiB
        self.redis("SET", self.key("rank:9999"), "not a hash")
        self.redis("SADD", self.key("agent:chaos"), "not a hash")
        self.redis("LPUSH", self.key("rank:9998"), "a list")
        self.redis("HSET", self.key("rank:9997"), "msg", "{\"v\": 1, \"type\": \"rank_register\"")
        self.redis("-x", "HSET", self.key("rank:9996"), "msg", stdin=big)
        self.redis("-x", "XADD", self.key("iterations"), "*", "msg", stdin=big)
        for stream in ("iterations", "alarms", "profiles", "acks", "requests"):
            self.redis("XADD", self.key(stream), "*", "msg", "{\"v\": 1, \"type\": 7}")
            self.redis("XADD", self.key(stream), "*", "nomsg", "1")
        self.redis("XADD", self.key("alarms"), "*", "msg", json.dumps({
            "v": 2, "type": "alarm", "job": self.job, "host": "node0", "at_ns": 1, "rank": 1e300, "pid": -5,
            "kind": "slow", "onset": 1, "at": 1, "ratio": 1e308, "probability": 2, "level_s": -1, "baseline_s": 0}))

    def fill_shm(self, directory):
        os.makedirs(directory, exist_ok=True)
        uid = os.getuid()
        for i in range(300):
            name = f"falcon.{uid}.{'%032x' % self.rng.getrandbits(128)}.{self.rng.randrange(1 << 32)}.{900000 + i}"
            path = os.path.join(directory, name)
            with open(path, "wb") as f:
                if i % 3 == 0:
                    f.write(b"")  # empty
                elif i % 3 == 1:
                    f.write(bytes(self.rng.getrandbits(8) for _ in range(512)))  # garbage header
                else:
                    f.write(struct.pack("<QI", 0x4641434C4E534D31, 1) + bytes(52))  # cut short after its magic
            if i % 10 == 0:
                os.chmod(path, 0)
        os.makedirs(os.path.join(directory, f"falcon.{uid}.{'0' * 32}.1.1"), exist_ok=True)

    # ---- the run ----------------------------------------------------------------------------

    def go(self):
        a = self.args
        self.make_daemons()
        self.daemons["redis"].start()
        self.wait_redis()
        for name, dmn in self.daemons.items():
            if name != "redis":
                dmn.start()
        env = dict(os.environ, FALCON_JOB=self.job, FALCON_EMU_INTRA_GBPS="0.05", FALCON_EMU_INTER_GBPS="0.05",
                   FALCON_EMU_GPU_TFLOPS="10")
        onset_s = 0.4 * a.duration
        fault = {"kind": "compute", "ranks": [5], "start_s": onset_s, "factor": 2.0}
        job_log = open(os.path.join(self.dir, "job.log"), "w")
        epoch = time.time()
        job = subprocess.Popen([
            self.bin("bench/emu/falcon-emu-run"), "-n", str(RANKS), "--ranks-per-node", "2", "--job-timeout",
            str(int(a.duration) + 120), "--node-shm-dirs", self.shm, "--preload", self.bin("shim/libfalcon_shim.so"),
            "--fault-plan", json.dumps({"faults": [fault]}), "--", self.bin("bench/train/falcon-train-emu"),
            "--tp", "2", "--dp", "2", "--pp", "2", "--compute-ms", "20", "--grad-bytes", str(1 << 20), "--check",
            "--progress-every", "0", "--duration-s", str(a.duration)], stdout=job_log, stderr=subprocess.STDOUT,
            env=env)
        times = sorted(self.rng.uniform(5, max(6, a.duration - 12)) for _ in range(a.actions))
        for at in times:
            now = time.time() - epoch
            if now < at:
                time.sleep(at - now)
            if job.poll() is not None:
                break
            for dmn in self.daemons.values():
                dmn.check_alive()
            kind = self.rng.choice(ACTIONS)
            hold = round(self.rng.uniform(0.5, 6), 2)
            started = time.time() - epoch
            restored, what = self.act(kind, hold)
            rec = self.recovery(restored) if restored is not None else None
            row = {"at_s": round(started, 1), "action": kind, "target": what,
                   "hold_s": hold if kind.startswith(("kill", "stop")) else None,
                   "recovery_s": None if rec is None else round(rec, 2),
                   "recovered": restored is None or rec is not None}
            self.rows.append(row)
            print(f"    {row['at_s']:7.1f} {kind:16s} {what:12s} {fmt(row['hold_s'])!s:>7} "
                  f"{fmt(row['recovery_s'])!s:>9}", flush=True)
        try:
            rc = job.wait(timeout=a.duration + 150)
        except subprocess.TimeoutExpired:
            job.kill()
            rc = "timeout"
        job_log.close()
        time.sleep(2)  # the last stages of an open incident
        for dmn in self.daemons.values():
            dmn.check_alive()
        return self.verdict(rc, epoch + onset_s)

    def logged_incidents(self):
        logged = set()
        with open(os.path.join(self.dir, "controller.log"), errors="replace") as f:
            for line in f:
                if "event=incident " in line:
                    fields = {}
                    for part in line.split(" summary=", 1)[0].split():
                        if "=" in part:
                            k, v = part.split("=", 1)
                            fields.setdefault(k, v)
                    logged.add((fields.get("id"), fields.get("stage")))
        return logged

    def stored_incidents(self):
        out = subprocess.run([self.bin("daemon/falcon-ctl"), "incidents", "--json", "-n", "0", "--job", self.job,
                              "--port", str(self.port)], capture_output=True, text=True)
        try:
            return [i["msg"] for i in json.loads(out.stdout).get("incidents", [])]
        except (json.JSONDecodeError, KeyError):
            return []

    def crashes(self):
        found = []
        for name in os.listdir(self.dir):
            if name.endswith(".log") and name != "job.log":
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    text = f.read()
                found += [f"{name}: {m}" for m in CRASH_MARKS if m in text]
                if len(text) > 50 << 20:
                    found.append(f"{name}: {len(text) >> 20} MiB of log (a hot loop?)")
        return found

    def verdict(self, rc, onset):
        stored = self.stored_incidents()
        stored_keys = {(i.get("id"), i.get("stage")) for i in stored}
        lost = sorted(self.logged_incidents() - stored_keys)
        detected = any(i.get("stage") == "detection" and i.get("at_ns", 0) / 1e9 >= onset for i in stored)
        died = {n: d.unexpected for n, d in self.daemons.items() if d.unexpected}
        recoveries = [r["recovery_s"] for r in self.rows if r["recovery_s"] is not None]
        slow = [r for r in self.rows if not r["recovered"] or (r["recovery_s"] or 0) > self.args.recover_bound_s]
        result = {"run": self.index, "job_rc": rc, "actions": len(self.rows), "incidents": len(stored),
                  "incidents_lost": lost, "detected": detected, "daemons_died": died, "crashes": self.crashes(),
                  "worst_recovery_s": max(recoveries) if recoveries else None,
                  "median_recovery_s": statistics.median(recoveries) if recoveries else None,
                  "slow_recoveries": slow, "rows": self.rows}
        result["passed"] = (rc == 0 and not lost and detected and not died and not result["crashes"] and not slow)
        return result

    def close(self):
        for dmn in self.daemons.values():
            dmn.stop()
        if self.args.keep:
            print(f"#   run {self.index} files: {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def fmt(v):
    return "-" if v is None else f"{v:.2f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--build", default="build", help="build directory (default: build)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=float, default=60, help="job seconds per run (default 60)")
    p.add_argument("--actions", type=int, default=8, help="chaos actions per run (default 8)")
    p.add_argument("--recover-bound-s", type=float, default=20,
                   help="longest acceptable time from a restore to a healthy system (default 20)")
    p.add_argument("--json", help="write the results here as JSON")
    p.add_argument("--keep", action="store_true", help="keep each run's logs")
    a = p.parse_args()
    if a.runs < 1 or a.actions < 0 or a.duration < 20 or a.recover_bound_s <= 0:
        p.error("--runs >= 1, --actions >= 0, --duration >= 20 and --recover-bound-s > 0 are required")
    for rel in ("daemon/falcon-agent", "daemon/falcon-controller", "daemon/falcon-ctl", "bench/emu/falcon-emu-run",
                "bench/train/falcon-train-emu", "shim/libfalcon_shim.so"):
        if not os.path.exists(os.path.join(a.build, rel)):
            p.error(f"{os.path.join(a.build, rel)} not found: build first (cmake --build {a.build})")
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        p.error("redis-server and redis-cli are needed (scripts/setup.sh)")
    print(f"# falcon chaos suite: {a.runs} runs, seed {a.seed}, {a.actions} actions per run, {a.duration:.0f} s jobs, "
          f"{RANKS} ranks on {NODES} nodes, recovery bound {a.recover_bound_s:.0f} s, build {a.build}")
    results = []
    for i in range(a.runs):
        print(f"# run {i}:   at(s) action           target          hold(s) recover(s)", flush=True)
        run = Run(a, i, a.seed * 1000 + i)
        try:
            r = run.go()
        finally:
            run.close()
        results.append(r)
        print(f"# run {i}: job rc {r['job_rc']}, {r['incidents']} incident stages, lost {len(r['incidents_lost'])}, "
              f"slow GPU detected {'yes' if r['detected'] else 'NO'}, daemons died {r['daemons_died'] or 0}, "
              f"crashes {r['crashes'] or 0}, recovery median {fmt(r['median_recovery_s'])} s worst "
              f"{fmt(r['worst_recovery_s'])} s: {'PASS' if r['passed'] else 'FAIL'}", flush=True)
    actions = sum(r["actions"] for r in results)
    worst = [r["worst_recovery_s"] for r in results if r["worst_recovery_s"] is not None]
    print(f"# total: {actions} actions, {sum(r['job_rc'] == 0 for r in results)}/{len(results)} jobs completed with "
          f"correct data, {sum(len(r['incidents_lost']) for r in results)} incidents lost, worst recovery "
          f"{fmt(max(worst) if worst else None)} s, {sum(r['passed'] for r in results)}/{len(results)} runs passed")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
