#!/usr/bin/env python3
"""Falcon end-to-end demo: detect, localise and mitigate fail-slows in an emulated 16-rank job.

Starts a private redis-server, one falcon-agent per emulated node, falcon-controller, and a
16-rank TP 2 x DP 4 x PP 2 falcon-train-emu job (8 emulated nodes of 2 ranks, 1 spare node) over
the CPU NCCL emulator with libfalcon_shim.so preloaded. A fault plan slows one GPU, then a link
that carries data-parallel traffic, then a GPU and another link at once. While the job runs it
shows a live status line and prints every incident stage (detection, localisation, decision,
resolution) as the controller records it. At the end it writes a report: JSON (the job's ground
truth, every incident entry, the plans, throughput per phase) and an SVG plot of iteration time
per rank with the faults, localisations and decisions marked. Everything it started is stopped
and its files removed (unless --keep), also on Ctrl-C.

With --scenario pp-link the job is an 8-rank DP 2 x PP 4 pipeline (one rank per node) whose link
between stages 1 and 2 of replica 0 turns slow for one phase and recovers: the case for adapting
the pipeline's warm-up counts (--pp-comm per-direction, an activation limit of 8). With
--split-backward its trainer splits each backward ZeroBubble-style into B and W (F/B/W).

Usage: scripts/demo.py [--build build] [--scenario mixed|pp-link] [--mitigation act|advise|off]
       [--split-backward] [--out falcon-demo-out] [--keep] [--phase-s 90] [--quiet] [--json]
(scripts/demo.sh does the set-up and build, then runs this.)
Exit status: 0 the job finished with its data checks passing, 1 it did not, 2 usage or set-up.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

JOB = "demo"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mixed_faults(phase_s):
    """Healthy lead-in, then three fault phases separated by healthy gaps (seconds of job time)."""
    lead, gap = 35.0, 25.0
    t1 = lead
    t2 = t1 + phase_s + gap
    t3 = t2 + phase_s + gap
    faults = [
        # 1: one slow GPU (rank 5: node 2, DP replica 2, pipeline stage 0).
        {"kind": "compute", "ranks": [5], "start_s": t1, "duration_s": phase_s, "factor": 2.5},
        # 2: a congested link between nodes 1 and 2, which carries the stage-0 DP ring.
        {"kind": "link", "nodes": [1, 2], "start_s": t2, "duration_s": phase_s, "factor": 4.0},
        # 3: both at once: rank 11 (node 5, replica 1, stage 1) and the link nodes 6 - 7.
        {"kind": "compute", "ranks": [11], "start_s": t3, "duration_s": phase_s, "factor": 2.0},
        {"kind": "link", "nodes": [6, 7], "start_s": t3, "duration_s": phase_s, "factor": 4.0},
    ]
    phases = [("healthy", 0.0, t1), ("compute", t1, t1 + phase_s), ("link", t2, t2 + phase_s),
              ("both", t3, t3 + phase_s)]
    return {"faults": faults}, phases, t3 + phase_s + 20.0


def pp_link_faults(phase_s):
    """Healthy lead-in, one slow pipeline link, then a healthy tail in which the fault has ended."""
    lead, tail = 35.0, 40.0
    t1 = lead
    faults = [
        # The link between node 2 (rank 2: replica 0, stage 1) and node 4 (rank 4: replica 0,
        # stage 2): replica 0's activations and gradients between stages 1 and 2.
        {"kind": "link", "nodes": [2, 4], "start_s": t1, "duration_s": phase_s, "factor": 12.0},
    ]
    phases = [("healthy", 0.0, t1), ("pp-link", t1, t1 + phase_s), ("after", t1 + phase_s, t1 + phase_s + tail)]
    return {"faults": faults}, phases, t1 + phase_s + tail


# The jobs the demo runs: shape, placement, the trainer's and the controller's settings, faults.
SCENARIOS = {
    "mixed": {
        "ranks": 16, "tp": 2, "dp": 4, "pp": 2, "ranks_per_node": 2, "nodes": 8, "micro_batches": 4,
        "train": ["--compute-ms", "10", "--grad-bytes", "2097152"],
        # The ski-rental overheads are what this trainer's plans cost: S2 takes effect at the next
        # iteration (0 s measured; 1 s), S3 moves 4 ranks' state over the modelled fabric (0.7 s
        # measured; 2 s), S4 is a 50 s modelled relaunch plus up to 10 iterations rolled back (60 s).
        "controller": ["--s2-overhead-s", "1", "--s3-overhead-s", "2", "--s4-overhead-s", "60"],
        "faults": mixed_faults,
    },
    "pp-link": {
        "ranks": 8, "tp": 1, "dp": 2, "pp": 4, "ranks_per_node": 1, "nodes": 8, "micro_batches": 8,
        # Activations of 2 x 64 x 512 x 2 bytes (2.6 ms a hop on the modelled fabric, 31 ms on the
        # slowed link) against a 10 ms forward per stage: the slow link costs the 1F1B pipeline
        # far more than its own delay. Receives posted ahead on per-direction communicators, and
        # room for 8 micro-batches' activations per stage, let adapted warm-up counts hide it.
        "train": ["--compute-ms", "5", "--hidden", "512", "--grad-bytes", "262144", "--pp-comm", "per-direction",
                  "--activation-limit", "8"],
        # The shape is inferred: the stage-pair communicators give the stage stride.
        # The overheads are the controller's defaults for a large job (S3 120 s: moving ranks'
        # state and rebuilding communicators; S4 900 s; the pipeline switch 2 s, no pause).
        "controller": ["--pipeline-activation-limit", "8"],
        "faults": pp_link_faults,
    },
}


class Demo:
    def __init__(self, args):
        self.args = args
        self.sc = dict(SCENARIOS[args.scenario])
        if args.micro_batches is not None and args.micro_batches != self.sc["micro_batches"]:
            # The same global batch split finer (or coarser): each micro-batch's compute scales by
            # the old count over the new, so a replica's compute per iteration stays the same.
            train = list(self.sc["train"])
            if "--compute-ms" in train:
                i = train.index("--compute-ms") + 1
                train[i] = f"{float(train[i]) * self.sc['micro_batches'] / args.micro_batches:g}"
            self.sc["train"] = train
            self.sc["micro_batches"] = args.micro_batches
        self.build = os.path.abspath(args.build)
        self.bin = {
            "agent": f"{self.build}/daemon/falcon-agent",
            "controller": f"{self.build}/daemon/falcon-controller",
            "ctl": f"{self.build}/daemon/falcon-ctl",
            "run": f"{self.build}/bench/emu/falcon-emu-run",
            "train": f"{self.build}/bench/train/falcon-train-emu",
            "shim": f"{self.build}/shim/libfalcon_shim.so",
        }
        missing = [p for p in self.bin.values() if not os.path.exists(p)]
        if missing:
            raise SystemExit(f"demo: not built: {', '.join(missing)} (run scripts/demo.sh, or build first)")
        self.redis_server = shutil.which("redis-server")
        if not self.redis_server:
            raise SystemExit("demo: redis-server not found (scripts/setup.sh installs it)")
        self.work = tempfile.mkdtemp(prefix="falcon-demo-")
        self.out = os.path.abspath(args.out)
        self.epoch_ns = 0
        os.makedirs(self.out, exist_ok=True)
        self.port = free_port()
        self.procs = []  # (name, Popen), each in its own process group
        self.entries = []  # incident entries seen, in order
        self.last_entry = ""

    # ---- processes -------------------------------------------------------------------------------
    def spawn(self, name, argv, env=None, log=None):
        e = dict(os.environ)
        e.update(env or {})
        out = open(log or os.path.join(self.work, f"{name}.log"), "ab")
        p = subprocess.Popen(argv, env=e, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        self.procs.append((name, p))
        return p

    def stop_all(self):
        for name, p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 10
        for name, p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs.clear()

    def ctl(self, *args, timeout=10):
        r = subprocess.run([self.bin["ctl"], *args, "--port", str(self.port), "--job", JOB, "--json"],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode not in (0, 1):
            return None
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError:
            return None

    def start_services(self):
        self.spawn("redis", [self.redis_server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", self.work])
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("demo: redis-server did not start (see its log with --keep)")
        shm = os.path.join(self.work, "shm")
        for n in range(self.sc["nodes"]):
            os.makedirs(os.path.join(shm, f"node{n}"), exist_ok=True)
            self.spawn(f"agent{n}", [self.bin["agent"], "--job", JOB, "--host", f"node{n}", "--shm-dir",
                                     os.path.join(shm, f"node{n}"), "--redis-port", str(self.port),
                                     "--metrics-port", "0", "--poll-ms", "100", "--flush-ms", "250",
                                     "--heartbeat-ms", "500", "--key-ttl-s", "3", "--profile-ms", "2000",
                                     "--command-block-ms", "200"])
        ctl_args = [self.bin["controller"], "--job", JOB, "--redis-port", str(self.port), "--view-ms", "500",
                    "--heartbeat-ms", "1000", "--p2p-bytes", "1048576", "--retry-after-s", "10",
                    "--mitigation", self.args.mitigation, "--micro-batches", str(self.sc["micro_batches"]),
                    "--spare-nodes", "1", "--plan-sample-s", "1", "--recheck-s", "20"] + self.sc["controller"]
        self.spawn("controller", ctl_args)

    def start_job(self, plan, duration_s):
        plan_file = os.path.join(self.work, "faults.json")
        with open(plan_file, "w") as f:
            json.dump(plan, f)
        shm = os.path.join(self.work, "shm")
        sc = self.sc
        argv = [self.bin["run"], "-n", str(sc["ranks"]), "--ranks-per-node", str(sc["ranks_per_node"]),
                "--job-timeout", str(int(duration_s) + 300),
                "--node-shm-dirs", shm, "--preload", self.bin["shim"], "--fault-plan", plan_file, "--",
                self.bin["train"], "--tp", str(sc["tp"]), "--dp", str(sc["dp"]), "--pp", str(sc["pp"]),
                "--micro-batches", str(sc["micro_batches"]), *sc["train"],
                *(["--split-backward"] if self.args.split_backward else []), "--check",
                "--progress-every", "0", "--duration-s", str(duration_s),
                "--report", os.path.join(self.work, "train-report.json"),
                "--falcon-plans", "--spare-nodes", "1", "--restart-s", "50"]
        # falcon-emu-run takes its start as the job epoch (fault times count from it): this is
        # within milliseconds of it, close enough to place incident stages on the job's time axis.
        self.epoch_ns = time.time_ns()
        env = {"FALCON_JOB": JOB, "FALCON_EMU_INTRA_GBPS": "0.05", "FALCON_EMU_INTER_GBPS": "0.05",
               "FALCON_EMU_GPU_TFLOPS": "10"}
        return self.spawn("job", argv, env=env)

    # ---- live view -------------------------------------------------------------------------------
    def poll_incidents(self):
        args = ["incidents", "-n", "0"] + (["--since", self.last_entry] if self.last_entry else [])
        doc = self.ctl(*args)
        new = []
        for e in (doc or {}).get("incidents", []):
            self.last_entry = e["entry"]
            m = e["msg"]
            self.entries.append(m)
            new.append(m)
        return new

    def status_line(self, t0):
        s = self.ctl("status") or {}
        c = s.get("controller") or {}
        cur, healthy = c.get("current_s"), c.get("healthy_s")
        ms = lambda v: "-" if v is None else f"{v * 1e3:.0f} ms"
        return (f"t={time.time() - t0:5.0f}s  ranks {len(s.get('ranks', [])):2d}  controller {c.get('state', '-'):10s} "
                f"iteration {ms(cur)} (healthy {ms(healthy)})  strategy {c.get('strategy') or '-'}  "
                f"plan {('v' + str(c['plan_version'])) if c.get('plan_version') else '-'}")

    def run(self):
        sc = self.sc
        plan, phases, duration = sc["faults"](self.args.phase_s)
        say = (lambda *a: None) if self.args.quiet else (lambda *a: print(*a, flush=True))
        say(f"# Falcon demo ({self.args.scenario}): {sc['ranks']} ranks (TP {sc['tp']} x DP {sc['dp']} x PP {sc['pp']}) "
            f"{sc['micro_batches']} micro-batches per replica, on {sc['nodes']} emulated nodes + 1 spare, "
            f"mitigation {self.args.mitigation}, {duration:.0f} s of training; files in {self.work}")
        for f in plan["faults"]:
            where = f"rank {f['ranks'][0]}" if "ranks" in f else f"link node{f['nodes'][0]}-node{f['nodes'][1]}"
            say(f"#   fault: {f['kind']:7s} {where:22s} x{f['factor']} from {f['start_s']:.0f} s for {f['duration_s']:.0f} s")
        self.start_services()
        job = self.start_job(plan, duration)
        t0 = time.time()
        next_status = 0.0
        tty = sys.stdout.isatty() and not self.args.quiet
        while job.poll() is None:
            time.sleep(0.5)
            for m in self.poll_incidents():
                if tty:
                    print("\r\033[K", end="")
                say(f"[{time.time() - t0:5.0f}s] {m['stage']:12s} {m.get('strategy', ''):3s} {m['summary']}")
            if time.time() >= next_status:
                next_status = time.time() + 2
                line = self.status_line(t0)
                if tty:
                    print("\r\033[K" + line, end="", flush=True)
                elif not self.args.quiet and int(time.time() - t0) % 20 < 2:
                    say(line)
            if time.time() - t0 > duration + 180:
                say("demo: the job overran its time by 3 minutes; stopping it")
                break
        if tty:
            print()
        time.sleep(2)
        self.poll_incidents()
        rc = job.poll()
        return self.report(plan, phases, rc)

    # ---- report ----------------------------------------------------------------------------------
    def rank_reports(self):
        out = []
        for r in range(self.sc["ranks"]):
            path = os.path.join(self.work, f"train-report.json.rank{r}")
            try:
                with open(path) as f:
                    out.append(json.load(f))
            except (OSError, json.JSONDecodeError):
                pass
        return out

    def report(self, plan, phases, rc):
        reports = self.rank_reports()
        plan_doc = self.ctl("plan", "--history") or {}
        iters = reports[0]["iterations"] if reports else []

        def rate(lo, hi):  # iterations per minute of rank 0 in [lo, hi) job seconds
            n = sum(1 for it in iters if lo <= it["start_s"] and it["start_s"] + it["duration_s"] <= hi)
            return 60.0 * n / (hi - lo) if hi > lo else 0.0

        throughput = {name: rate(lo, hi) for name, lo, hi in phases}
        fault_windows = [(lo, hi) for name, lo, hi in phases if name != "healthy"]
        span = sum(hi - lo for lo, hi in fault_windows)
        faulted = sum(rate(lo, hi) * (hi - lo) for lo, hi in fault_windows) / span if span else 0.0
        ok = rc == 0 and len(reports) == self.sc["ranks"] and all(r.get("status") == "ok" for r in reports)
        doc = {
            "schema": "falcon.demo.report", "schema_version": 1,
            "scenario": self.args.scenario, "mitigation": self.args.mitigation, "ok": ok, "job_exit_code": rc,
            "fault_plan": plan, "phases": [{"name": n, "start_s": lo, "end_s": hi} for n, lo, hi in phases],
            "throughput_iters_per_min": throughput, "fault_windows_iters_per_min": faulted,
            "incidents": self.entries, "plan": plan_doc.get("plan"), "decisions": plan_doc.get("decisions", []),
            # Rank 0's iterations [start_s, duration_s, plan_version] and the plans it applied, for
            # throughput under a plan (bench/mitigation_e2e.py).
            "rank0_iterations": [[it["start_s"], it["duration_s"], it["plan_version"]] for it in iters],
            "rank0_plans": [{"version": p["version"], "strategy": p["strategy"], "status": p["status"],
                             "at_s": p["at_s"]} for p in (reports[0].get("plans", []) if reports else [])],
            "ranks": [{"rank": r.get("rank"), "status": r.get("status"), "summary": r.get("summary"),
                       "plans_applied": r.get("plans_applied", r.get("plan_changes", []))} for r in reports],
        }
        name = self.args.mitigation if self.args.scenario == "mixed" else f"{self.args.scenario}-{self.args.mitigation}"
        json_path = os.path.join(self.out, f"falcon-demo-{name}.json")
        svg_path = os.path.join(self.out, f"falcon-demo-{name}.svg")
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1)
        with open(svg_path, "w") as f:
            f.write(plot_svg(reports, plan, self.entries, self.args.mitigation, self.epoch_ns))
        if self.args.json:
            print(json.dumps({k: doc[k] for k in ("mitigation", "ok", "throughput_iters_per_min",
                                                   "fault_windows_iters_per_min")}))
        elif not self.args.quiet:
            print("# throughput, iterations/min (rank 0): " +
                  ", ".join(f"{k} {v:.1f}" for k, v in throughput.items()) + f"; all fault windows {faulted:.1f}")
            print(f"# job: {'finished, every data check passed' if ok else 'FAILED (exit %s)' % rc}")
            print(f"# report: {json_path}\n# plot:   {svg_path}")
        return 0 if ok else 1


def plot_svg(reports, plan, entries, mode, t_epoch):
    """Iteration time per rank against job time, faults shaded, incident stages marked.
    Written by hand (a few dozen SVG elements) to keep the demo free of plotting packages."""
    W, H, L, R, T, B = 1000, 420, 60, 20, 40, 50
    series = [[(it["start_s"] + it["duration_s"], it["duration_s"]) for it in r.get("iterations", [])] for r in reports]
    pts = [p for s in series for p in s]
    if not pts:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="80"><text x="10" y="40">no iterations recorded</text></svg>\n'
    x_max = max(p[0] for p in pts) * 1.02
    y_max = sorted(p[1] for p in pts)[int(0.995 * (len(pts) - 1))] * 1.15
    x = lambda t: L + (W - L - R) * t / x_max
    y = lambda v: T + (H - T - B) * (1 - min(v, y_max) / y_max)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="20" font-size="14">Falcon demo ({mode}): iteration time per rank; faults shaded, '
           f'incident stages marked</text>']
    for f in plan["faults"]:
        color = "#fde0dd" if f["kind"] == "compute" else "#deebf7"
        out.append(f'<rect x="{x(f["start_s"]):.1f}" y="{T}" width="{x(f["start_s"] + f["duration_s"]) - x(f["start_s"]):.1f}" '
                   f'height="{H - T - B}" fill="{color}" opacity="0.7"/>')
    for s in series:
        if s:
            out.append('<polyline fill="none" stroke="#444" stroke-opacity="0.35" stroke-width="1" points="' +
                       " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in s) + '"/>')
    colors = {"detection": "#e6550d", "localisation": "#d62728", "decision": "#2ca02c", "resolution": "#1f77b4"}
    if t_epoch:
        for m in entries:
            t = (m["at_ns"] - t_epoch) / 1e9
            if 0 <= t <= x_max:
                c = colors.get(m["stage"], "#000")
                out.append(f'<line x1="{x(t):.1f}" y1="{T}" x2="{x(t):.1f}" y2="{H - B}" stroke="{c}" stroke-width="1.5">'
                           f'<title>{m["stage"]}: {escape(m["summary"])}</title></line>')
    for i, (name, c) in enumerate(colors.items()):
        out.append(f'<rect x="{L + 10 + i * 110}" y="{T + 6}" width="10" height="10" fill="{c}"/>'
                   f'<text x="{L + 24 + i * 110}" y="{T + 15}">{name}</text>')
    for k in range(6):
        v = y_max * k / 5
        out.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v * 1e3:.0f}</text>'
                   f'<line x1="{L}" y1="{y(v):.1f}" x2="{W - R}" y2="{y(v):.1f}" stroke="#ddd"/>')
    for k in range(0, int(x_max) + 1, 30):
        out.append(f'<text x="{x(k):.1f}" y="{H - B + 16}" text-anchor="middle">{k}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">job time, s</text>')
    out.append(f'<text x="14" y="{(T + H - B) / 2}" transform="rotate(-90 14 {(T + H - B) / 2})" '
               f'text-anchor="middle">iteration time, ms</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build", help="build directory (default: build)")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="mixed",
                   help="mixed: a slow GPU, a slow DP link, both (default); pp-link: a slow pipeline link")
    p.add_argument("--mitigation", choices=["act", "advise", "off"], default="act",
                   help="the controller's decision mode (default: act: plans are applied by the job)")
    p.add_argument("--split-backward", action="store_true",
                   help="pp-link: the trainer runs F/B/W (each backward split into B and W, ZeroBubble-style)")
    p.add_argument("--phase-s", type=float, default=90, help="length of each fault phase, s (default 90)")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="micro-batches per DP replica (default: the scenario's, 4 for mixed, 8 for pp-link); the "
                        "global batch stays the same: each micro-batch's compute scales to match")
    p.add_argument("--out", default="falcon-demo-out", help="directory for the report (default: falcon-demo-out)")
    p.add_argument("--keep", action="store_true", help="keep logs and segments")
    p.add_argument("--quiet", action="store_true", help="no live output; the summary only")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = p.parse_args()
    if args.split_backward and args.scenario != "pp-link":
        p.error("--split-backward needs --scenario pp-link (per-direction pipeline traffic)")
    if args.micro_batches is not None and not 1 <= args.micro_batches <= 64:
        p.error("--micro-batches must be 1 to 64")
    if args.phase_s < 30:
        p.error("--phase-s must be at least 30 (detection and localisation take 10-20 s)")
    demo = Demo(args)

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        rc = demo.run()
    except KeyboardInterrupt:
        print("\ndemo: interrupted; stopping everything it started", file=sys.stderr)
        rc = 130
    finally:
        demo.stop_all()
        if not args.keep:
            shutil.rmtree(demo.work, ignore_errors=True)
        else:
            print(f"# logs: {demo.work}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
