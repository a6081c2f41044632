#!/usr/bin/env python3
"""Controller and Redis at scale: what one falcon-controller and one redis-server cost for a job of
N ranks, and whether a fail-slow is still found in time, played by falcon-sim over real Redis
against the real, unmodified falcon-controller.

For each point (one run per point) it starts, each in its own process group, with its log in
--out DIR/N/:
  redis-server   a free loopback port, no persistence
  falcon-controller --job jobJ --redis-host 127.0.0.1 --redis-port P --mitigation advise
                 --metrics-port 0 (its defaults otherwise; --controller-arg adds flags)
  falcon-sim     the job's agents (TP x PP x DP ranks, --gpus-per-node per node) for --duration-s,
                 with one compute fault (x --factor) on one rank drawn with --seed, from
                 --fault-at-s for --fault-s
With --jobs K, K such jobs (job0..jobK-1, each of N ranks, each with its own controller and sim,
each its own faulty rank) share the one redis-server: "many small jobs on one Redis".
With --redis-nodes M > 1, M redis-servers form a Redis Cluster on loopback (the slots in equal
ranges) and job J's controller and sim are pointed at node J mod M, whichever holds the job: they
follow its redirects. Redis figures are then totals over the nodes, with each node's jobs and
commands/s beside them.

Every --sample-s (1 s) it samples each process group's CPU (utime + stime of every member and of
the children they reaped, /proc/PID/stat; cores = CPU seconds / wall seconds) and memory (VmRSS,
VmHWM of /proc/PID/status, summed over the group), and Redis's INFO stats, memory and
commandstats. At the end it reads each job's incidents stream (falcon:{job}:incidents) and
reports per point:
  ctl cores/MB   the controllers' cores and RSS: st = median over the steady window (from the
                 sims' "ready" line + --settle-s to the fault's onset), pk = the highest sample;
                 hwm = VmHWM at the end; with --jobs, totals over the jobs, and per-job medians
  redis          its cores, commands/s (INFO total_commands_processed, less this harness's own
                 INFO calls), used_memory and network
                 in/out (total_net_input_bytes, total_net_output_bytes) in MB/s; per-command
                 rates and usec/call over the steady window in the JSON
  sim cores      falcon-sim's own cost (not Falcon's; shown to tell a saturated host)
  detect/localise the fault's onset (falcon-sim's "fault ... at_ns=" line) -> the first detection
                 / localisation entry after it, s; pause = that localisation's
                 detail.validation.pause_s; decision = a decision entry appeared after the onset;
                 below the table, each point's pause by step, beside the sim's own share of it
                 (how long its commands sat unread and its acks waited: a real agent per node
                 adds neither) and its tick times
  correct        correct: a localisation named exactly the faulty rank (GPU; or the faulty link /
                 NIC, hosts named node<k>), and nothing was named wrongly or before the onset;
                 wrong: something else was named; none: nothing was named
  warn/err       the controller's log lines at level warning / error or critical
Exit status 1 when a point is not "correct" or a process failed; 130 on Ctrl-C. Every process is
ended (its whole group) on exit, errors and Ctrl-C included.

  bench/sim/scale_bench.py --out out/scale                          (1024 .. 32768 ranks, ~17 min)
  bench/sim/scale_bench.py --out out/scale --ranks 1024 --duration-s 90 --fault-at-s 30 --fault-s 45
  bench/sim/scale_bench.py --out out/jobs --ranks 64 --shape 8x8x1 --jobs 100
  bench/sim/scale_bench.py --out out/cluster --shape 8x4x8 --jobs 10 --redis-nodes 3
  bench/sim/scale_bench.py --out out/pinned --ranks 16384 --controller-cpus 1
                 (the controller alone on CPU 1, redis-server and the sim on the rest)
Results, raw samples included, go to DIR/scale.json (schema "v": 1), rewritten after each point.
"""
import argparse
import json
import os
import platform
import random
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from bench_procs import free_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
MB = 1 << 20
READY_RE = re.compile(r"falcon-sim: ready ranks=(\d+) nodes=(\d+)")
FAULT_RE = re.compile(r"falcon-sim: fault kind=(\w+).*\bat_ns=(\d+)")
CONTROLLER_FLAGS = ("--job", "--redis-host", "--redis-port", "--mitigation", "--metrics-port")


def shape_for(ranks):
    """The default (TP, PP, DP) of an N-rank job: TP 8 (one node's GPUs), PP 8 up to 8192 ranks and
    PP 16 from 16384 on (as large jobs deepen their pipelines), DP the rest. REQUIRES: N a
    multiple of TP x PP (64 below 16384, 128 from it)."""
    tp, pp = 8, (16 if ranks >= 16384 else 8)
    if ranks % (tp * pp):
        raise ValueError(f"{ranks} ranks: not a multiple of TP {tp} x PP {pp}; give --shape")
    return tp, pp, ranks // (tp * pp)


def parse_shape(text):
    """"TPxPPxDP" (e.g. 8x8x16: 1024 ranks) -> (tp, pp, dp)."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"shape {text!r}: TPxPPxDP, e.g. 8x8x16")
    return tuple(int(p) for p in parts)


class RedisError(Exception):
    """An error reply (the connection stays usable)."""


class Redis:
    """A minimal RESP2 client: one blocking socket, one command at a time, (re)connected on
    demand. Not thread-safe. A transport error closes the socket and raises OSError."""

    def __init__(self, port, host="127.0.0.1", timeout_s=5.0):
        self.addr, self.timeout_s = (host, port), timeout_s
        self.sock, self.buf = None, b""

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""

    def call(self, *args):
        if self.sock is None:
            self.sock = socket.create_connection(self.addr, timeout=self.timeout_s)
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        try:
            self.sock.sendall(b"".join(out))
            return self._reply()
        except (OSError, ValueError) as e:
            self.close()
            raise OSError(f"redis: {e}") from e

    def info(self, section):
        """INFO <section> as {key: value} (numbers as float, commandstats as {cmd: {calls, usec}})."""
        out = {}
        for line in self.call("INFO", section).splitlines():
            if not line or line.startswith("#") or ":" not in line:
                continue
            key, value = line.split(":", 1)
            if key.startswith("cmdstat_"):
                kv = dict(p.split("=", 1) for p in value.split(",") if "=" in p)
                out.setdefault("cmdstat", {})[key[8:]] = {"calls": int(kv.get("calls", 0)),
                                                          "usec": int(kv.get("usec", 0))}
                continue
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
        return out

    def stream(self, key, batch=1000):
        """Every entry of a stream as {field: value}, oldest first."""
        out, start = [], "-"
        while True:
            page = self.call("XRANGE", key, start, "+", "COUNT", batch) or []
            for entry_id, fields in page:
                out.append(dict(zip(fields[::2], fields[1::2])))
            if len(page) < batch:
                return out
            start = "(" + page[-1][0]

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(max(1 << 16, n + 2 - len(self.buf)))
            if not chunk:
                raise ConnectionError("connection closed")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n).decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise ValueError(f"unexpected reply {line[:40]!r}")


def scan_groups(pgids):
    """Per process group in pgids: CPU seconds of its live members (utime + stime, plus cutime +
    cstime: the members they reaped) and VmRSS / VmHWM in kB, summed over its members."""
    out = {g: {"cpu_s": 0.0, "rss_kb": 0, "hwm_kb": 0, "procs": 0} for g in pgids}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
            group = out.get(int(fields[2]))
            if group is None:
                continue
            group["cpu_s"] += sum(int(x) for x in fields[11:15]) / CLK_TCK
            group["procs"] += 1
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith(("VmRSS:", "VmHWM:")):
                        group["rss_kb" if line[2] == "R" else "hwm_kb"] += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue  # it exited while read
    return out


def fault_for(args, job_index, ranks):
    """The fault plan entry of one job: --fault (defaults filled in) or a compute fault on a rank
    drawn from --seed and the job's index."""
    fault = dict(json.loads(args.fault)) if args.fault else {"kind": "compute"}
    fault.setdefault("start_s", args.fault_at_s)
    fault.setdefault("duration_s", args.fault_s)
    fault.setdefault("factor", args.factor)
    if fault["kind"] == "compute" and "ranks" not in fault:
        fault["ranks"] = [random.Random(args.seed + job_index).randrange(ranks)]
    return fault


def truth_of(fault):
    """What a correct localisation names. Hosts are assumed named node<k> (k = rank // GPUs per node)."""
    kind = fault["kind"]
    if kind == "compute":
        return {"cause": "compute", "gpus": sorted(fault["ranks"]), "links": [], "nics": []}
    if kind == "link":
        return {"cause": "link", "gpus": [], "links": [sorted(f"node{n}" for n in fault["nodes"])], "nics": []}
    if kind == "nic":
        return {"cause": "nic", "gpus": [], "links": [], "nics": [f"node{fault['nodes'][0]}"]}
    raise ValueError(f"fault kind {kind!r}: compute, link or nic")


def named(loc):
    """What a localisation entry names, in truth_of's form."""
    d = loc.get("detail") or {}
    gpus = [g["rank"] for g in d.get("gpus", [])]
    if not gpus and loc.get("cause") == "compute" and "gpus" not in d:
        gpus = list(loc.get("ranks", []))
    return {"cause": loc.get("cause"), "gpus": sorted(gpus),
            "links": sorted(sorted(l["hosts"]) for l in d.get("links", [])),
            "nics": sorted(n["host"] for n in d.get("nics", []))}


def pause_steps(loc):
    """The steps of the localising round while the job was held, [(step, ms)]: its pause."""
    log = ((((loc or {}).get("detail") or {}).get("validation") or {}).get("log")) or []
    out, held = [], False
    for e in log:
        if e.get("step") == "paused":
            held = True
        elif held and isinstance(e.get("ms"), (int, float)):
            out.append((e["step"], e["ms"]))
    return out


def sim_share(summary):
    """The sim's own latency in a round trip, from its summary: per command type, p50 of the time
    the command sat in its stream plus p50 of its ack's wait past its modelled time, ms; and the
    worst worker's tick p99 / max."""
    if not summary or not summary.get("latency"):
        return None
    share, ticks = {}, []
    for w in summary["latency"]:
        for t, lag in w.get("command_read_lag_ms", {}).items():
            ack = (w.get("ack_lag_ms", {}).get(t) or {}).get("p50", 0)
            share[t] = max(share.get(t, 0), max(0, lag.get("p50", 0)) + ack)
        if w.get("tick_ms", {}).get("n"):
            ticks.append((w["tick_ms"]["p99"], w["tick_ms"]["max"]))
    return {"by_type_ms": share, "tick_p99_ms": max((t[0] for t in ticks), default=None),
            "tick_max_ms": max((t[1] for t in ticks), default=None)}


def judge(incidents, onset_ns, truth):
    """Timings (s after onset) and correctness of one job's incidents against its fault."""
    after = [m for m in incidents if m.get("at_ns", 0) >= onset_ns]
    naming = [m for m in incidents if m.get("stage") == "localisation" and m.get("cause", "unknown") != "unknown"]
    early = [m for m in naming if m["at_ns"] < onset_ns]
    det = next((m for m in after if m.get("stage") == "detection"), None)
    loc = next((m for m in naming if m["at_ns"] >= onset_ns), None)
    dec = next((m for m in after if m.get("stage") == "decision"), None)
    wrong = early or any(named(m) != truth for m in naming)
    since = lambda m: None if m is None else round((m["at_ns"] - onset_ns) / 1e9, 3)
    return {"detect_s": since(det), "localise_s": since(loc), "decision_s": since(dec),
            "decision": dec is not None, "strategy": dec.get("strategy") if dec else None,
            "pause_s": ((loc.get("detail") or {}).get("validation") or {}).get("pause_s") if loc else None,
            "pause_steps": pause_steps(loc),
            "named": named(loc) if loc else None, "truth": truth,
            "false_detections": sum(1 for m in incidents if m.get("stage") == "detection" and m["at_ns"] < onset_ns),
            "named_before_onset": len(early),
            "correct": "wrong" if wrong else "correct" if loc else "none",
            "entries": [{k: m.get(k) for k in ("id", "stage", "at_ns", "cause", "strategy")} | {"ranks": m.get("ranks", [])[:16]}
                        for m in incidents]}


class Point:
    """One measured point: a redis-server and, per job, a falcon-controller and a falcon-sim, each
    the leader of its own process group, logs in `dir`. Owns those groups: stop() ends them all and
    is safe to call at any stage of start()."""

    def __init__(self, args, shape, label):
        self.args, self.shape = args, shape
        self.ranks = shape[0] * shape[1] * shape[2]
        self.dir = os.path.join(args.out, label)
        os.makedirs(self.dir, exist_ok=True)
        self.ports = [free_port() for _ in range(args.redis_nodes)]
        self.bus_ports = [free_port() for _ in range(args.redis_nodes)] if args.redis_nodes > 1 else []
        self.port = self.ports[0]
        self.jobs = [f"job{j}" for j in range(args.jobs)]
        self.procs = {}  # name -> Popen; names: redis, controller-jobJ, sim-jobJ
        self.faults = {job: fault_for(args, j, self.ranks) for j, job in enumerate(self.jobs)}
        self.ready = {}  # job -> (wall s the line was first seen, nodes)
        self.onset_ns = {}  # job -> the sim's fault line's at_ns
        self.log_pos = {}
        self.nodes = [Redis(port) for port in self.ports]
        self.redis_names = ["redis"] + [f"redis{i}" for i in range(1, len(self.ports))]
        self.job_slots = {}  # job -> its hash slot (a cluster only)
        self.start_wall = None

    def bin(self, rel):
        return os.path.join(self.args.build, rel)

    def spawn(self, name, argv):
        """Starts `name` with its log; with --controller-cpus, a controller on those CPUs and every
        other process on the rest."""
        cpus = None
        if self.args.controller_cpus:
            cpus = self.args.controller_cpus if name.startswith("controller-") else self.args.other_cpus
        with open(os.path.join(self.dir, name + ".log"), "w") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True,
                                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)

    def start(self):
        a = self.args
        for i, (name, port) in enumerate(zip(self.redis_names, self.ports)):
            node_dir = os.path.abspath(os.path.join(self.dir, name))
            os.makedirs(node_dir, exist_ok=True)
            argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", node_dir, "--maxclients", "65000"]
            if self.bus_ports:
                argv += ["--cluster-enabled", "yes", "--cluster-config-file", os.path.join(node_dir, "nodes.conf"),
                         "--cluster-port", str(self.bus_ports[i]), "--cluster-node-timeout", "5000"]
            self.spawn(name, argv)
        deadline = time.time() + 15
        for name, node in zip(self.redis_names, self.nodes):
            while True:
                try:
                    if node.call("PING") == "PONG":
                        break
                except (OSError, RedisError):
                    pass
                if time.time() > deadline or self.procs[name].poll() is not None:
                    raise RuntimeError(f"redis-server did not come up (see {self.dir}/{name}.log)")
                time.sleep(0.05)
        if self.bus_ports:
            self.form_cluster()
        extra = [x for arg in a.controller_arg for x in shlex.split(arg)]
        for j, job in enumerate(self.jobs):
            self.spawn(f"controller-{job}", [self.bin("daemon/falcon-controller"), "--job", job, "--redis-host",
                                             "127.0.0.1", "--redis-port", str(self.job_port(j)), "--mitigation",
                                             "advise", "--metrics-port", "0"] + extra)
        self.start_wall = time.time()
        tp, pp, dp = self.shape
        for j, job in enumerate(self.jobs):
            plan = os.path.join(self.dir, f"fault-plan-{job}.json")
            with open(plan, "w") as f:
                json.dump({"faults": [self.faults[job]]}, f)
            self.spawn(f"sim-{job}", [self.bin("bench/sim/falcon-sim"), "--redis-host", "127.0.0.1", "--redis-port",
                                      str(self.job_port(j)), "--job", job, "--tp", str(tp), "--pp", str(pp), "--dp", str(dp),
                                      "--gpus-per-node", str(a.gpus_per_node), "--iteration-s", str(a.iteration_s),
                                      "--duration-s", str(a.duration_s), "--fault-plan", plan,
                                      "--processes", str(a.processes), "--seed", str(a.seed + j),
                                      "--summary", os.path.join(self.dir, f"sim-summary-{job}.json")] +
                       [x for arg in a.sim_arg for x in shlex.split(arg)])

    def job_port(self, j):
        """The node job j's processes are given: node j mod M, not necessarily the one holding it."""
        return self.ports[j % len(self.ports)]

    def form_cluster(self, deadline_s=30):
        """The 16384 slots in equal ranges over the nodes, CLUSTER MEET, then every node reports ok."""
        n = len(self.nodes)
        for i, node in enumerate(self.nodes):
            node.call("CLUSTER", "ADDSLOTSRANGE", i * 16384 // n, (i + 1) * 16384 // n - 1)
        for port, bus in zip(self.ports[1:], self.bus_ports[1:]):
            self.nodes[0].call("CLUSTER", "MEET", "127.0.0.1", port, bus)
        deadline = time.time() + deadline_s
        formed = lambda info: "cluster_state:ok" in info and f"cluster_known_nodes:{n}" in info
        while not all(formed(node.call("CLUSTER", "INFO")) for node in self.nodes):
            if time.time() > deadline:
                raise RuntimeError(f"the Redis Cluster of {n} nodes did not form in {deadline_s} s")
            time.sleep(0.1)
        self.job_slots = {job: self.nodes[0].call("CLUSTER", "KEYSLOT", f"falcon:{{{job}}}:incidents") for job in self.jobs}
        progress(f"Redis Cluster of {n} nodes formed (ports {', '.join(map(str, self.ports))}); "
                 f"jobs per node {self.jobs_per_node()}")

    def node_of(self, job):
        """Index of the node that holds the job's keys (its hash slot's range; 0 without a cluster)."""
        return self.job_slots[job] * len(self.nodes) // 16384 if job in self.job_slots else 0

    def jobs_per_node(self):
        return [sum(1 for job in self.job_slots if self.node_of(job) == i) for i in range(len(self.nodes))]

    def read_sim_logs(self):
        """Notes each sim's ready and fault lines (the ready time is when this poll first saw it)."""
        for job in self.jobs:
            path = os.path.join(self.dir, f"sim-{job}.log")
            try:
                with open(path, errors="replace") as f:
                    f.seek(self.log_pos.get(job, 0))
                    text = f.read()
            except OSError:
                continue
            cut = text.rfind("\n") + 1  # a partial last line is read again next time
            self.log_pos[job] = self.log_pos.get(job, 0) + len(text[:cut].encode())
            for line in text[:cut].splitlines():
                if job not in self.ready and (m := READY_RE.search(line)):
                    self.ready[job] = (time.time(), int(m.group(2)))
                    progress(f"{job}: ready after {time.time() - self.start_wall:.1f} s ({m.group(0)})")
                elif job not in self.onset_ns and (m := FAULT_RE.search(line)):
                    self.onset_ns[job] = int(m.group(2))
                    progress(f"{job}: fault at {(int(m.group(2)) / 1e9 - self.start_wall):.1f} s")

    def sample(self):
        s = {"wall": time.time()}
        groups = scan_groups([p.pid for p in self.procs.values()])
        s["procs"] = {name: groups[p.pid] if groups[p.pid]["procs"] else None for name, p in self.procs.items()}
        keep = ("total_commands_processed", "instantaneous_ops_per_sec", "total_net_input_bytes",
                "total_net_output_bytes", "used_memory", "used_memory_rss", "connected_clients", "cmdstat")
        try:
            per_node = []
            for node in self.nodes:
                info = {}
                for section in ("stats", "memory", "clients", "commandstats"):
                    info.update(node.info(section))
                per_node.append({k: info.get(k) for k in keep})
            # The nodes together; with one node that is just its INFO.
            total = {k: sum(n[k] or 0 for n in per_node) for k in keep if k != "cmdstat"}
            total["cmdstat"] = {}
            for n in per_node:
                for cmd, st in (n["cmdstat"] or {}).items():
                    t = total["cmdstat"].setdefault(cmd, {"calls": 0, "usec": 0})
                    t["calls"] += st["calls"]
                    t["usec"] += st["usec"]
            s["redis"] = total
            if len(per_node) > 1:
                s["redis_nodes"] = per_node
        except (OSError, RedisError) as e:
            s["redis"] = None
            s["redis_error"] = str(e)
        return s

    def run(self):
        """Samples until every sim has exited (ended with SIGTERM past --duration-s + --grace-s)."""
        a = self.args
        samples, deadline, termed = [], self.start_wall + a.duration_s + a.grace_s, False
        tick = time.monotonic()
        while True:
            samples.append(self.sample())
            self.read_sim_logs()
            sims = [p for n, p in self.procs.items() if n.startswith("sim-")]
            if all(p.poll() is not None for p in sims):
                break
            if time.time() > deadline and not termed:
                progress(f"a sim is still running {a.grace_s:g} s past --duration-s: SIGTERM")
                for p in sims:
                    signal_group(p, signal.SIGTERM)
                termed, deadline = True, time.time() + 30
            elif time.time() > deadline:
                raise RuntimeError("falcon-sim did not exit 30 s after SIGTERM")
            tick += a.sample_s
            time.sleep(max(0.0, tick - time.monotonic()))
        return samples

    def incidents(self, job):
        """The job's incidents, from the node that holds them (the others answer MOVED)."""
        out = []
        for fields in self.nodes[self.node_of(job)].stream(f"falcon:{{{job}}}:incidents"):
            try:
                out.append(json.loads(fields["msg"]))
            except (KeyError, TypeError, ValueError):
                pass
        return out

    def stop(self):
        """SIGTERM the sims and controllers, then redis once they are gone (a controller's stop writes its
        last state and sets the shims back to track: its Redis must outlive it); SIGKILL what is left
        15 s after each SIGTERM."""
        for node in self.nodes:
            node.close()
        clients = [p for n, p in self.procs.items() if not n.startswith("redis")]
        servers = [p for n, p in self.procs.items() if n.startswith("redis")]
        for group in (clients, servers):
            for p in group:
                if p.poll() is None:
                    signal_group(p, signal.SIGTERM)
            deadline = time.time() + 15
            for p in group:
                try:
                    p.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    pass
        left = scan_groups([p.pid for p in self.procs.values()])
        for p in clients + servers:
            if p.poll() is None or left[p.pid]["procs"]:  # the group's members still exist: ours
                signal_group(p, signal.SIGKILL)
                p.wait()


def signal_group(popen, sig):
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def progress(text):
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def peak(xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def series(samples, fn):
    """fn(prev, cur, dt) for each pair of consecutive samples -> [(wall of cur, value or None)]."""
    out = []
    for prev, cur in zip(samples, samples[1:]):
        dt = cur["wall"] - prev["wall"]
        try:
            out.append((cur["wall"], fn(prev, cur, dt) if dt > 0 else None))
        except (TypeError, KeyError):
            out.append((cur["wall"], None))
    return out


def cores(names):
    """Cores of the groups `names` together, per interval (None when one of them is gone)."""
    return lambda p, c, dt: sum(c["procs"][n]["cpu_s"] - p["procs"][n]["cpu_s"] for n in names) / dt


def mem_mb(names, key):
    return lambda p, c, dt: sum(c["procs"][n][key] for n in names) / 1024


def redis_rate(key, scale=1.0):
    return lambda p, c, dt: (c["redis"][key] - p["redis"][key]) / dt / scale


def falcon_commands(p, c, dt):
    """Commands/s Redis served, less the INFO calls of this harness's own sampling."""
    info = lambda s: s["redis"]["cmdstat"].get("info", {}).get("calls", 0)
    return (c["redis"]["total_commands_processed"] - info(c) - p["redis"]["total_commands_processed"] + info(p)) / dt


def window(points, lo, hi):
    return [v for t, v in points if lo <= t <= hi]


def steady_and_peak(samples, fn, lo, hi):
    pts = series(samples, fn)
    return med(window(pts, lo, hi)), peak(v for _, v in pts)


def command_rates(samples, lo, hi):
    """Per Redis command over [lo, hi]: calls/s and usec/call."""
    inside = [s for s in samples if lo <= s["wall"] <= hi and s.get("redis")]
    if len(inside) < 2:
        return {}
    a, b = inside[0], inside[-1]
    dt, out = b["wall"] - a["wall"], {}
    for cmd, st in (b["redis"]["cmdstat"] or {}).items():
        was = (a["redis"]["cmdstat"] or {}).get(cmd, {"calls": 0, "usec": 0})
        calls = st["calls"] - was["calls"]
        if calls > 0:
            out[cmd] = {"per_s": round(calls / dt, 1), "usec_per_call": round((st["usec"] - was["usec"]) / calls, 2)}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["per_s"]))


def log_levels(path):
    warn = err = 0
    try:
        with open(path, errors="replace") as f:
            for line in f:
                warn += " warning falcon-controller[" in line
                err += " error falcon-controller[" in line or " critical falcon-controller[" in line
    except OSError:
        pass
    return warn, err


def summarise(pt, samples, incidents, exits):
    """The point's record: resources in the steady window and at peak, incident timings, correctness."""
    a, jobs = pt.args, pt.jobs
    ready = [pt.ready[j][0] for j in jobs if j in pt.ready]
    lo = (max(ready) if len(ready) == len(jobs) else pt.start_wall) + a.settle_s
    onsets = [pt.onset_ns[j] / 1e9 for j in jobs if j in pt.onset_ns]
    hi = min(onsets) if onsets else pt.start_wall + a.fault_at_s
    if hi <= lo:
        progress(f"no steady window: ready + {a.settle_s:g} s is past the fault's onset; steady figures are '-'")
    ctl, sims = [f"controller-{j}" for j in jobs], [f"sim-{j}" for j in jobs]
    r = {"ranks": pt.ranks, "shape": dict(zip(("tp", "pp", "dp"), pt.shape)), "jobs": len(jobs),
         "nodes": next((pt.ready[j][1] for j in jobs if j in pt.ready), -(-pt.ranks // a.gpus_per_node)),
         "ready_s": round(max(ready) - pt.start_wall, 2) if len(ready) == len(jobs) else None,
         "steady_window_s": [round(lo - pt.start_wall, 1), round(hi - pt.start_wall, 1)], "logs": pt.dir}
    c_st, c_pk = steady_and_peak(samples, cores(ctl), lo, hi)
    m_st, m_pk = steady_and_peak(samples, mem_mb(ctl, "rss_kb"), lo, hi)
    per_job = [steady_and_peak(samples, cores([n]), lo, hi) for n in ctl]
    per_mem = [steady_and_peak(samples, mem_mb([n], "rss_kb"), lo, hi) for n in ctl]
    last = {n: next((s["procs"][n] for s in reversed(samples) if s["procs"].get(n)), None) for n in ctl + sims}
    hwm = [last[n]["hwm_kb"] / 1024 for n in ctl if last[n]]
    warns = [log_levels(os.path.join(pt.dir, f"{n}.log")) for n in ctl]
    r["controller"] = {"cores_steady": c_st, "cores_peak": c_pk, "rss_mb_steady": m_st, "rss_mb_peak": m_pk,
                       "hwm_mb": sum(hwm) if hwm else None, "warnings": sum(w for w, _ in warns),
                       "errors": sum(e for _, e in warns),
                       "per_job": {"cores_steady_median": med(c for c, _ in per_job),
                                   "cores_peak_median": med(p for _, p in per_job),
                                   "rss_mb_steady_median": med(m for m, _ in per_mem), "hwm_mb_median": med(hwm)}}
    rd = {}
    rd["nodes"] = len(pt.nodes)
    rd["cores_steady"], rd["cores_peak"] = steady_and_peak(samples, cores(pt.redis_names), lo, hi)
    rd["cmds_per_s_steady"], rd["cmds_per_s_peak"] = steady_and_peak(samples, falcon_commands, lo, hi)
    rd["in_mb_s_steady"], rd["in_mb_s_peak"] = steady_and_peak(samples, redis_rate("total_net_input_bytes", MB), lo, hi)
    rd["out_mb_s_steady"], rd["out_mb_s_peak"] = steady_and_peak(samples, redis_rate("total_net_output_bytes", MB), lo, hi)
    rd["used_memory_mb_steady"], rd["used_memory_mb_peak"] = steady_and_peak(
        samples, lambda p, c, dt: c["redis"]["used_memory"] / MB, lo, hi)
    rd["commands_steady"] = command_rates(samples, lo, hi)
    if len(pt.nodes) > 1:
        node_rate = lambda i: lambda p, c, dt: falcon_commands({"redis": p["redis_nodes"][i]}, {"redis": c["redis_nodes"][i]}, dt)
        rd["per_node"] = [dict(zip(("cmds_per_s_steady", "cmds_per_s_peak"), steady_and_peak(samples, node_rate(i), lo, hi)))
                          for i in range(len(pt.nodes))]
        rd["jobs_per_node"] = pt.jobs_per_node()
    r["redis"] = rd
    s_st, s_pk = steady_and_peak(samples, cores(sims), lo, hi)
    summaries = []
    for j in jobs:
        try:
            with open(os.path.join(pt.dir, f"sim-summary-{j}.json")) as f:
                summaries.append(json.load(f))
        except (OSError, ValueError):
            summaries.append(None)
    r["sim"] = {"cores_steady": s_st, "cores_peak": s_pk, "hwm_mb": sum(last[n]["hwm_kb"] / 1024 for n in sims if last[n]),
                "summaries": summaries, "latency": [sim_share(x) for x in summaries]}
    per = []
    for j in jobs:
        onset = pt.onset_ns.get(j)
        res = judge(incidents.get(j, []), onset or int((pt.start_wall + a.fault_at_s) * 1e9), truth_of(pt.faults[j]))
        res.update(job=j, fault=pt.faults[j], onset_source="sim" if onset else "estimated")
        per.append(res)
    verdicts = [p["correct"] for p in per]
    r["incidents"] = {"per_job": per, "correct": verdicts.count("correct"), "wrong": verdicts.count("wrong"),
                      "none": verdicts.count("none"), "decisions": sum(p["decision"] for p in per),
                      "verdict": "wrong" if "wrong" in verdicts else "none" if "none" in verdicts else "correct"}
    for key in ("detect_s", "localise_s", "pause_s"):
        xs = [p[key] for p in per if p[key] is not None]
        r["incidents"][key] = {"median": med(xs), "worst": peak(xs)}
    r["exits"] = exits
    r["processes_ok"] = all(rc == 0 for n, rc in exits.items() if n.startswith("sim-")) and not any(
        rc is not None for n, rc in exits.items() if n.startswith("controller-"))
    r["ok"] = r["incidents"]["verdict"] == "correct" and r["processes_ok"]
    return r


def measure(args, shape, label):
    pt = Point(args, shape, label)
    progress(f"{label}: {pt.ranks} ranks (TP {shape[0]} x PP {shape[1]} x DP {shape[2]}), {args.jobs} job(s), "
             f"redis port{'s' if len(pt.ports) > 1 else ''} {', '.join(map(str, pt.ports))}, logs in {pt.dir}")
    try:
        pt.start()
        samples = pt.run()
        exits = {n: p.poll() for n, p in pt.procs.items()}  # controllers: None while still running
        incidents = {j: pt.incidents(j) for j in pt.jobs}
        for j in pt.jobs:
            with open(os.path.join(pt.dir, f"incidents-{j}.json"), "w") as f:
                json.dump(incidents[j], f, indent=1)
    finally:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        try:
            pt.stop()
        finally:
            signal.signal(signal.SIGINT, old)
    record = summarise(pt, samples, incidents, exits)
    record["samples"] = samples
    return record


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def pair(a, b, spec=".2f"):
    return f"{fmt(a, spec)} / {fmt(b, spec)}"


def table(records, jobs):
    cols = ["ranks", "TPxPPxDP", "nodes", "jobs", "ready s", "ctl cores st/pk", "ctl MB st/hwm"]
    if jobs > 1:
        cols += ["ctl/job cores st/pk", "ctl/job MB st/hwm"]
    cluster = any(r["redis"].get("per_node") for r in records)
    cols += ["redis cores st/pk", "redis cmd/s st/pk"]
    if cluster:
        cols += ["nodes: jobs", "nodes: cmd/s st"]
    cols += ["redis MB st/pk", "redis in/out MB/s st", "sim cores st",
             "detect s", "localise s", "pause s", "decision", "correct", "ctl warn/err"]
    rows = []
    for r in records:
        c, rd, inc, pj = r["controller"], r["redis"], r["incidents"], r["controller"]["per_job"]
        s = r["shape"]
        row = [str(r["ranks"]), f"{s['tp']}x{s['pp']}x{s['dp']}", str(r["nodes"]), str(r["jobs"]), fmt(r["ready_s"], ".1f"),
               pair(c["cores_steady"], c["cores_peak"]), pair(c["rss_mb_steady"], c["hwm_mb"], ".0f")]
        if jobs > 1:
            row += [pair(pj["cores_steady_median"], pj["cores_peak_median"]),
                    pair(pj["rss_mb_steady_median"], pj["hwm_mb_median"], ".0f")]
        timing = lambda key: fmt(inc[key]["median"], ".1f") + ("" if r["jobs"] == 1 else f" ({fmt(inc[key]['worst'], '.1f')})")
        verdict = inc["verdict"] + ("" if r["jobs"] == 1 else f" {inc['correct']}/{r['jobs']}")
        if not r["processes_ok"]:
            verdict += " (process failed)"
        row += [pair(rd["cores_steady"], rd["cores_peak"]), pair(rd["cmds_per_s_steady"], rd["cmds_per_s_peak"], ".0f")]
        if cluster:
            row += ["/".join(map(str, rd.get("jobs_per_node", []))) or "-",
                    "/".join(fmt(n["cmds_per_s_steady"], ".0f") for n in rd.get("per_node", [])) or "-"]
        row += [pair(rd["used_memory_mb_steady"], rd["used_memory_mb_peak"], ".0f"),
                pair(rd["in_mb_s_steady"], rd["out_mb_s_steady"]), fmt(r["sim"]["cores_steady"]),
                timing("detect_s"), timing("localise_s"), timing("pause_s"),
                "yes" if inc["decisions"] == r["jobs"] else "no" if not inc["decisions"] else f"{inc['decisions']}/{r['jobs']}",
                verdict, f"{c['warnings']}/{c['errors']}"]
        rows.append(row)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(cols)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([line(cols), "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"] + [line(r) for r in rows])


def pause_lines(records):
    """Per point, the first job's pause by step and what of it the sim's own latency was."""
    out = []
    for r in records:
        per = r["incidents"]["per_job"]
        i = next((k for k, p in enumerate(per) if p.get("pause_steps")), None)
        if i is None:
            continue
        steps = " + ".join(f"{name} {ms:.0f} ms" for name, ms in per[i]["pause_steps"])
        share = (r["sim"].get("latency") or [None] * len(per))[i]
        line = f"# {r['ranks']} ranks, {per[i]['job']}: pause {fmt(per[i]['pause_s'])} s = {steps}"
        if share:
            mine = ", ".join(f"{t} {ms:.0f}" for t, ms in sorted(share["by_type_ms"].items()) if t in ("validate", "resume"))
            line += (f"; the sim's own part (p50 read + ack lag, ms): {mine or '-'}; sim tick p99/max "
                     f"{fmt(share['tick_p99_ms'], '.0f')}/{fmt(share['tick_max_ms'], '.0f')} ms")
        summary = (r["sim"].get("summaries") or [None] * len(per))[i]
        if summary and summary.get("late_traps"):
            line += (f"; {summary['late_traps']} rank(s) read their pause after their cut (a real agent would "
                     f"answer missed; the sim is behind)")
        out.append(line)
    return out


def preamble(args, points):
    def first_line(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            return "?"
    build_type = "?"
    try:
        with open(os.path.join(args.build, "CMakeCache.txt")) as f:
            build_type = next((l.split("=", 1)[1].strip() for l in f if l.startswith("CMAKE_BUILD_TYPE")), "?")
    except OSError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    return {"commit": first_line(["git", "-C", here, "describe", "--always", "--dirty"]),
            "build": os.path.abspath(args.build), "build_type": build_type,
            "redis": first_line(["redis-server", "--version"]),
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0]},
            "points": [f"{tp}x{pp}x{dp}" for tp, pp, dp in points]}


def parse_cpus(text):
    """A CPU list as taskset and cpuset write it, "0", "1-3,6": a set of CPU numbers."""
    cpus = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{part!r} is not a CPU number or range (e.g. 1 or 2-3,6)")
        lo, hi = int(lo), int(hi) if dash else int(lo)
        if hi < lo:
            raise ValueError(f"{part!r} runs backwards")
        cpus.update(range(lo, hi + 1))
    return cpus


def fmt_cpus(cpus):
    return ",".join(map(str, sorted(cpus)))


def check_binaries(args):
    for rel, target in (("daemon/falcon-controller", "falcon-controller"), ("bench/sim/falcon-sim", "falcon-sim")):
        path = os.path.join(args.build, rel)
        if not os.access(path, os.X_OK):
            sys.exit(f"scale_bench: {path} is missing: build it (cmake --build {args.build} --target {target})")
    if shutil.which("redis-server") is None:
        sys.exit("scale_bench: redis-server is not on PATH (scripts/setup.sh)")
    ctl = os.path.join(args.build, "daemon/falcon-controller")
    help_text = subprocess.run([ctl, "--help"], capture_output=True, text=True, timeout=30).stdout
    missing = [f for f in CONTROLLER_FLAGS if f not in help_text]
    if missing:
        sys.exit(f"scale_bench: {ctl} --help lacks {', '.join(missing)}: the controller's flags changed")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="the build directory (default build)")
    ap.add_argument("--out", required=True, help="directory for scale.json and each point's logs (DIR/N/)")
    ap.add_argument("--ranks", default="1024,4096,16384,32768", help="job sizes, comma-separated (shapes: shape_for)")
    ap.add_argument("--shape", help="TPxPPxDP[,TPxPPxDP...], e.g. 8x8x16: these points instead of --ranks")
    ap.add_argument("--jobs", type=int, default=1, help="jobs of that size sharing the one redis-server (default 1)")
    ap.add_argument("--redis-nodes", type=int, default=1,
                    help="redis-servers; more than 1 form a Redis Cluster, job J pointed at node J mod M (default 1)")
    ap.add_argument("--duration-s", type=float, default=240, help="each sim's run, s (default 240)")
    ap.add_argument("--fault-at-s", type=float, default=60, help="the fault's start after the sim's, s (default 60)")
    ap.add_argument("--fault-s", type=float, default=120, help="the fault's length, s (default 120)")
    ap.add_argument("--factor", type=float, default=2.0, help="the faulty rank's compute slowdown (default 2)")
    ap.add_argument("--fault", help="a fault plan entry as JSON instead (start_s, duration_s, factor default to the above)")
    ap.add_argument("--seed", type=int, default=1, help="draws the faulty rank; job J uses seed + J (default 1)")
    ap.add_argument("--processes", type=int, default=1, help="falcon-sim --processes (default 1)")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="falcon-sim --gpus-per-node (default 8)")
    ap.add_argument("--iteration-s", type=float, default=1.0, help="falcon-sim --iteration-s (default 1)")
    ap.add_argument("--sample-s", type=float, default=1.0, help="sampling period, s (default 1)")
    ap.add_argument("--settle-s", type=float, default=10, help="the steady window opens this long after ready, s (default 10)")
    ap.add_argument("--grace-s", type=float, default=120, help="SIGTERM a sim this long past --duration-s, s (default 120)")
    ap.add_argument("--controller-arg", action="append", default=[], help="extra falcon-controller flags (repeatable)")
    ap.add_argument("--sim-arg", action="append", default=[],
                    help="extra falcon-sim flags (repeatable), e.g. \"--signature-ms 0\"")
    ap.add_argument("--controller-cpus",
                    help="CPU list (e.g. 1 or 2-3,6): the controllers run on these CPUs alone and redis-server and "
                         "the sims on the others, so the controller's times are not those of a shared core "
                         "(default: no pinning)")
    ap.add_argument("--json", action="store_true", help="print the JSON summary (no raw samples) instead of the table")
    args = ap.parse_args()
    args.other_cpus = None
    if args.controller_cpus:
        try:
            args.controller_cpus = parse_cpus(args.controller_cpus)
        except ValueError as e:
            ap.error(f"--controller-cpus: {e}")
        allowed = os.sched_getaffinity(0)
        if not args.controller_cpus <= allowed:
            ap.error(f"--controller-cpus: CPUs {sorted(args.controller_cpus - allowed)} are not available here "
                     f"(this process may use {sorted(allowed)})")
        args.other_cpus = allowed - args.controller_cpus
        if not args.other_cpus:
            ap.error("--controller-cpus leaves no CPU for redis-server and the sims")
    try:
        points = ([parse_shape(s) for s in args.shape.split(",")] if args.shape
                  else [shape_for(int(n)) for n in args.ranks.split(",")])
        if args.fault:
            truth_of(fault_for(args, 0, 1))
    except (ValueError, KeyError, TypeError) as e:
        ap.error(str(e))
    if args.jobs < 1 or args.processes < 1 or args.sample_s <= 0 or args.redis_nodes < 1:
        ap.error("--jobs, --redis-nodes, --processes and --sample-s must be positive")
    if args.fault_at_s + args.fault_s > args.duration_s:
        ap.error("the fault must end within --duration-s")
    return args, points


def on_sigterm(signum, frame):
    raise KeyboardInterrupt  # the same clean-up as Ctrl-C


def main():
    args, points = parse_args()
    check_binaries(args)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # thousands of agents' connections
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where started with SIGINT ignored
    os.makedirs(args.out, exist_ok=True)
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()}  # CPU sets as lists
    doc = {"v": 1, "tool": "scale_bench", "config": config, **preamble(args, points), "records": []}
    if doc["build_type"] not in ("Release", "RelWithDebInfo"):
        print(f"# WARNING: {args.build} is a {doc['build_type']} build: these figures are not the optimised code's",
              file=sys.stderr)
    rc, labels = 0, set()
    try:
        for shape in points:
            n = shape[0] * shape[1] * shape[2]
            label = str(n) if str(n) not in labels else f"{n}-{shape[0]}x{shape[1]}x{shape[2]}"
            labels.add(label)
            doc["records"].append(measure(args, shape, label))
            with open(os.path.join(args.out, "scale.json"), "w") as f:
                json.dump(doc, f, indent=1)
    except KeyboardInterrupt:
        progress("interrupted: every process ended; the points done so far are in scale.json")
        rc = 130
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        progress(f"error: {e}")
        rc = 1
    records = doc["records"]
    if args.json:
        print(json.dumps({k: v for k, v in doc.items() if k != "records"} |
                         {"records": [{k: v for k, v in r.items() if k != "samples"} for r in records]}, indent=1))
    elif records:
        print(f"# falcon scale bench {doc['commit']}, {doc['build_type']} build {doc['build']}; {doc['redis']}")
        print(f"# machine: {os.cpu_count()} cpus, kernel {platform.release()}; {args.jobs} job(s) a point, sim "
              f"{args.duration_s:g} s, compute fault x{args.factor:g} at {args.fault_at_s:g} s for {args.fault_s:g} s, "
              f"seed {args.seed}, sim processes {args.processes}, mitigation advise"
              + (f"; controller on CPUs {fmt_cpus(args.controller_cpus)}, redis-server and sims on "
                 f"{fmt_cpus(args.other_cpus)}" if args.controller_cpus else ""))
        print("# st: median over the steady window (ready + settle to the fault); pk: highest sample; hwm: VmHWM; "
              "MB = MiB; timings: onset -> first entry, s" + ("; with --jobs: totals, per-job medians, (worst)"
                                                            if args.jobs > 1 else ""))
        print()
        print(table(records, args.jobs))
        print()
        for line in pause_lines(records):
            print(line)
    ok = sum(1 for r in records if r["ok"])
    if not args.json:
        print(f"# verdict: {'PASS' if rc == 0 and ok == len(records) else 'FAIL'}: {ok}/{len(points)} points correct; "
              f"results in {os.path.join(args.out, 'scale.json')}")
    return rc or (0 if ok == len(points) else 1)


if __name__ == "__main__":
    sys.exit(main())
