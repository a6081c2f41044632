#!/usr/bin/env python3
"""Hang detection and diagnosis, end to end: how soon a hang is detected and its culprit named,
and how often the name is right, over randomised injections; and whether a healthy job with long
checkpoints raises anything.

Every run starts a redis-server on a free loopback port, one falcon-agent per emulated node
(default agent settings: stall floor 5 s, 4 iterations), falcon-controller, and falcon-train-emu
(TP 2 x DP 4 x PP 2 = 16 ranks, 4 nodes of 4, under the shim, every result checked) over the
strict NCCL emulator. One fault per injection run, drawn with the seed:

  stall   a random rank's host stops issuing NCCL calls before a random iteration
          (falcon-train-emu --inject-stall; the trainer logs the wall time it stopped)
  device  a random rank's device stops completing its collectives at a random time
          (the emulator's fault plan, kind "hang"; onset = the job's epoch + start_s)
  mismatch  a random rank issues its first TP or DP collective of a random iteration with
          another count or datatype (falcon-train-emu --inject-mismatch; as under NCCL the
          call then never completes)
  deadlock  a random rank queues the grad-norm all-reduce (mp group) before the embedding
          all-reduce (embd group) on one stream, every other rank the other way round
          (falcon-train-emu --inject-swap): a real two-communicator deadlock

Per run it reads the stalls and incidents streams and reports:
  detect_s    first stall report - onset (a rank of the job reported stalled); mismatch: the
              first mismatch entry - onset
  diagnose_s  first incident entry naming the fault (hang, deadlock or mismatch) - onset
  correct     stall: every hang entry names exactly the injected rank (not_issued);
              device: exactly one entry, not_completing, on a communicator the injected rank is
              held in; and no mismatch, deadlock or disorder entry;
              mismatch: every mismatch entry names exactly the injected rank, within
              --mismatch-bound-s (1 s) of the call;
              deadlock: a deadlock entry whose cycle holds the injected rank, no mismatch entry
A healthy run (--healthy-s, default 600) checkpoints every 50 iterations with a save longer than
the stall floor (every rank idle outside NCCL) and must end with no stall report and no hang,
mismatch, deadlock or disorder incident.

  bench/hang_bench.py --build build --runs 30 --seed 1 --healthy-s 600 --json hang.json
  bench/hang_bench.py --build build --runs 4 --healthy-s 60          (a quick look)
Exit status 1 when a run was wrong, late (> --bound-s) or the healthy run raised anything.
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

TP, DP, PP = 2, 4, 2
RANKS = TP * DP * PP
NODES = 4
KINDS = ["stall", "device", "mismatch", "deadlock"]


class Job:
    """redis-server, NODES agents, the controller and the trainer, in one temporary directory."""

    def __init__(self, args, name):
        self.args, self.name = args, name
        self.dir = tempfile.mkdtemp(prefix="falcon-hang-")
        self.port = free_port()
        self.shm = os.path.join(self.dir, "shm")
        self.procs = []
        self.job = None
        self.epoch = 0.0

    def bin(self, rel):
        return os.path.join(self.args.build, rel)

    def redis(self, *cmd, timeout=5):
        try:
            return subprocess.run(["redis-cli", "-p", str(self.port), *cmd], capture_output=True, text=True,
                                  timeout=timeout).stdout
        except subprocess.TimeoutExpired:
            return ""

    def spawn(self, name, argv, env=None):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        self.procs.append(p)
        return p

    def start_services(self):
        self.spawn("redis", ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", self.dir])
        deadline = time.time() + 15
        while self.redis("PING", timeout=1).strip() != "PONG":
            if time.time() > deadline:
                raise RuntimeError("redis-server did not come up")
            time.sleep(0.05)
        for k in range(NODES):
            os.makedirs(f"{self.shm}/node{k}", exist_ok=True)
            self.spawn(f"agent{k}", [self.bin("daemon/falcon-agent"), "--job", self.name, "--host", f"node{k}",
                                     "--shm-dir", f"{self.shm}/node{k}", "--redis-port", str(self.port),
                                     "--metrics-port", "0", "--profile-ms", "0"]
                       + ([] if self.args.signature_full_seqs is None
                          else ["--signature-full-seqs", str(self.args.signature_full_seqs)]))
        # The fail-slow path held back (every rank must be slow, no mitigation): the hang path is measured.
        self.spawn("controller", [self.bin("daemon/falcon-controller"), "--job", self.name, "--redis-port",
                                  str(self.port), "--view-ms", "500", "--min-slow-fraction", "1", "--mitigation", "off"])

    def start_job(self, train_args, fault=None, timeout_s=300):
        env = dict(os.environ, FALCON_JOB=self.name, FALCON_EMU_GPU_TFLOPS="10")
        argv = [self.bin("bench/emu/falcon-emu-run"), "-n", str(RANKS), "--ranks-per-node", str(RANKS // NODES),
                "--job-timeout", str(int(timeout_s)), "--node-shm-dirs", self.shm, "--preload",
                self.bin("shim/libfalcon_shim.so")]
        if fault:
            argv += ["--fault-plan", json.dumps({"faults": [fault]})]
        argv += ["--", self.bin("bench/train/falcon-train-emu"), "--tp", str(TP), "--dp", str(DP), "--pp", str(PP),
                 "--compute-ms", "2", "--check", "--progress-every", "0"] + train_args
        self.epoch = time.time()
        self.job = self.spawn("job", argv, env)

    def stream(self, name, after="-"):
        out = []
        raw = self.redis("--json", "XRANGE", f"falcon:{{{self.name}}}:{name}", after, "+", timeout=5)
        try:
            entries = json.loads(raw) if raw.strip() else []
        except json.JSONDecodeError:
            return out
        for e in entries:
            try:
                fields = e[1]
                if isinstance(fields, dict):
                    msg = fields.get("msg")
                else:
                    msg = dict(zip(fields[::2], fields[1::2])).get("msg")
                out.append(json.loads(msg))
            except (IndexError, TypeError, ValueError, AttributeError):
                pass
        return out

    def stop(self):
        stop_all(self.procs, timeout_s=30)

    def log(self, name):
        try:
            with open(os.path.join(self.dir, name + ".log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def cleanup(self, keep):
        if keep:
            print(f"    (kept {self.dir})")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def stall_onset(job_log, rank, option="--inject-stall"):
    mark = f"rank {rank}: {option}:"
    for line in job_log.splitlines():
        if mark in line and "(from " in line:
            return int(line.rsplit("(from ", 1)[1].split()[0]) / 1e9
    return None


HANG_STAGES = {"hang", "mismatch", "deadlock", "disorder"}


def injection_run(args, index, rng):
    kind = args.kinds[index % len(args.kinds)]
    rank = rng.randrange(RANKS)
    option = {"stall": "--inject-stall", "mismatch": "--inject-mismatch", "deadlock": "--inject-swap"}.get(kind)
    job = Job(args, f"hang{index}")
    row = {"run": index, "kind": kind, "rank": rank}
    try:
        job.start_services()
        if kind == "stall":
            it = rng.randrange(40, 120)
            row["iteration"] = it
            job.start_job(["--iters", "100000", "--inject-stall", f"{rank}:{it}"])
        elif kind == "mismatch":
            it = rng.randrange(40, 120)
            what, group = rng.choice(["count", "dtype"]), rng.choice(["tp", "dp"])
            row.update(iteration=it, what=what, group=group)
            job.start_job(["--iters", "100000", "--inject-mismatch", f"{rank}:{it}:{what}:{group}"])
        elif kind == "deadlock":
            it = rng.randrange(40, 120)
            row["iteration"] = it
            job.start_job(["--iters", "100000", "--inject-swap", f"{rank}:{it}"])
        else:
            start_s = round(rng.uniform(10, 20), 2)
            row["start_s"] = start_s
            job.start_job(["--iters", "100000"], {"kind": "hang", "ranks": [rank], "start_s": start_s})
        deadline = time.time() + args.wait_s
        onset = None
        incidents, stalls = [], []
        while time.time() < deadline:
            time.sleep(0.5)
            if job.job.poll() is not None:
                row["error"] = f"the job exited ({job.job.returncode}) before a hang was diagnosed"
                break
            if option and onset is None:
                onset = stall_onset(job.log("job"), rank, option)
            stalls = [m for m in job.stream("stalls") if m.get("kind") == "stalled"]
            incidents = [m for m in job.stream("incidents") if m.get("stage") in HANG_STAGES]
            if incidents and (kind != "deadlock" or any(m["stage"] == "deadlock" for m in incidents)):
                time.sleep(args.settle_s)  # entries of the same diagnosis, and a second look
                stalls = [m for m in job.stream("stalls") if m.get("kind") == "stalled"]
                incidents = [m for m in job.stream("incidents") if m.get("stage") in HANG_STAGES]
                break
        if option and onset is None:
            onset = stall_onset(job.log("job"), rank, option)
        if kind == "device":
            onset = job.epoch + row["start_s"]
        row["onset_known"] = onset is not None
        named = incidents
        if kind == "mismatch":
            named = [m for m in incidents if m["stage"] == "mismatch"]
        elif kind == "deadlock":
            named = [m for m in incidents if m["stage"] == "deadlock"]
        if kind == "mismatch" and named and onset is not None:
            row["detect_s"] = round(min(m["at_ns"] for m in named) / 1e9 - onset, 2)
        elif stalls and onset is not None:
            row["detect_s"] = round(min(m["at_ns"] for m in stalls) / 1e9 - onset, 2)
        if named and onset is not None:
            row["diagnose_s"] = round(min(m["at_ns"] for m in named) / 1e9 - onset, 2)
        row["entries"] = [{"stage": m["stage"], "kind": m.get("detail", {}).get("kind"), "ranks": m.get("ranks", []),
                           "waiting": m.get("detail", {}).get("waiting", []),
                           "cycle": sorted({c.get("rank") for c in m.get("detail", {}).get("chain", [])})}
                          for m in incidents]
        row["stalled_ranks"] = sorted({m["rank"] for m in stalls})
        if kind == "stall":
            ok = bool(incidents) and all(e["stage"] == "hang" and e["kind"] == "not_issued" and e["ranks"] == [rank]
                                         for e in row["entries"])
        elif kind == "mismatch":
            mm = [e for e in row["entries"] if e["stage"] == "mismatch"]
            ok = bool(mm) and all(e["ranks"] == [rank] for e in mm)
        elif kind == "deadlock":
            ok = (any(e["stage"] == "deadlock" and rank in e["cycle"] for e in row["entries"])
                  and not any(e["stage"] == "mismatch" for e in row["entries"]))
        else:
            ok = (len(incidents) == 1 and row["entries"][0]["kind"] == "not_completing"
                  and rank in row["entries"][0]["waiting"] + row["entries"][0]["ranks"])
        row["correct"] = ok
        bound = args.mismatch_bound_s if kind == "mismatch" else args.bound_s
        row["in_bound"] = ok and row.get("diagnose_s") is not None and row["diagnose_s"] <= bound
    finally:
        keep = args.keep or not row.get("in_bound", False)
        if keep:  # what the streams held, for the post-mortem
            for name in ("incidents", "stalls"):
                with open(os.path.join(job.dir, name + ".json"), "w") as f:
                    json.dump(job.stream(name), f, indent=1)
        job.stop()
        job.cleanup(keep)
    return row


def healthy_run(args):
    job = Job(args, "healthy")
    row = {"run": "healthy", "duration_s": args.healthy_s}
    try:
        job.start_services()
        report = os.path.join(job.dir, "report-{rank}.json")
        job.start_job(["--duration-s", str(args.healthy_s), "--checkpoint-every", "50", "--checkpoint-save-ms",
                       str(int(args.checkpoint_s * 1000)), "--report", report], timeout_s=args.healthy_s + 300)
        rc = job.job.wait(timeout=args.healthy_s + 300)
        time.sleep(3)
        row["job_exit"] = rc
        row["stall_reports"] = len(job.stream("stalls"))
        hangs = [m for m in job.stream("incidents") if m.get("stage") in HANG_STAGES]
        row["hang_incidents"] = len(hangs)
        try:  # the trainer's ground truth: how many checkpoints every rank sat through
            with open(report.replace("{rank}", "0")) as f:
                r0 = json.load(f)
            row["checkpoints"] = r0["checkpoints"]["taken"]
            row["iterations"] = len(r0["iterations"])
        except (OSError, ValueError, KeyError, TypeError):
            row["checkpoints"] = None
        row["correct"] = rc == 0 and row["stall_reports"] == 0 and not hangs and bool(row["checkpoints"])
    finally:
        job.stop()
        job.cleanup(args.keep or not row.get("correct", False))
    return row


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--build", default="build", help="the build directory (default build)")
    ap.add_argument("--runs", type=int, default=30, help="injection runs (default 30)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kinds", default="all",
                    help="which faults to inject, in turn: a comma-separated list of stall, device, mismatch, deadlock; "
                         "all (default): every kind; both: stall,device")
    ap.add_argument("--healthy-s", type=float, default=600, help="length of the healthy run, s (0: none)")
    ap.add_argument("--checkpoint-s", type=float, default=8, help="each checkpoint's save in the healthy run, s")
    ap.add_argument("--bound-s", type=float, default=10, help="a diagnosis later than this after onset fails")
    ap.add_argument("--mismatch-bound-s", type=float, default=1, help="a mismatch raised later than this after the call fails")
    ap.add_argument("--signature-full-seqs", type=int, default=None,
                    help="the agents' signature_full_seqs (default: theirs, 4096); 0 sends every communicator's "
                         "calls as block digests from the start, so a mismatch is found through them")
    ap.add_argument("--wait-s", type=float, default=90, help="longest wait for a diagnosis per run, s")
    ap.add_argument("--settle-s", type=float, default=3, help="after the first entry, wait this long for the rest")
    ap.add_argument("--json", help="write the rows and the summary here")
    ap.add_argument("--keep", action="store_true", help="keep every run's directory (logs), not only failed ones")
    args = ap.parse_args()
    args.kinds = {"all": KINDS, "both": ["stall", "device"]}.get(args.kinds, args.kinds.split(","))
    if not args.kinds or any(k not in KINDS for k in args.kinds):
        ap.error(f"--kinds: a comma-separated list of {', '.join(KINDS)}, or all or both")
    for rel in ("daemon/falcon-agent", "daemon/falcon-controller", "bench/emu/falcon-emu-run",
                "bench/train/falcon-train-emu", "shim/libfalcon_shim.so"):
        if not os.path.exists(os.path.join(args.build, rel)):
            sys.exit(f"hang_bench: {rel} not built in {args.build}")
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        sys.exit("hang_bench: redis-server and redis-cli are needed (scripts/setup.sh)")
    rng = random.Random(args.seed)
    rows = []
    print(f"# hang_bench: {args.runs} injection run(s), seed {args.seed}, {RANKS} ranks (TP {TP} x DP {DP} x PP {PP}), "
          f"{NODES} nodes; bound {args.bound_s:g} s, mismatches {args.mismatch_bound_s:g} s")
    print(f"{'run':>4} {'kind':8} {'rank':>4} {'at':>8} {'detect_s':>9} {'diag_s':>7} {'correct':>7}  entries")
    for i in range(args.runs):
        r = injection_run(args, i, rng)
        rows.append(r)
        at = f"it {r['iteration']}" if "iteration" in r else f"{r.get('start_s', '?')} s"
        ents = "; ".join(f"{e['stage']}/{e['kind']} {e['ranks']}" for e in r.get("entries", [])) or r.get("error", "-")
        print(f"{i:>4} {r['kind']:8} {r['rank']:>4} {at:>8} {r.get('detect_s', '-')!s:>9} {r.get('diagnose_s', '-')!s:>7} "
              f"{'yes' if r.get('correct') else 'NO':>7}  {ents}", flush=True)
    healthy = healthy_run(args) if args.healthy_s > 0 else None
    if healthy:
        print(f"healthy {healthy['duration_s']:g} s, {healthy.get('iterations')} iterations, {healthy.get('checkpoints')} "
              f"checkpoints of {args.checkpoint_s:g} s: job exit {healthy.get('job_exit')}, stall reports "
              f"{healthy.get('stall_reports')}, hang incidents {healthy.get('hang_incidents')}", flush=True)
    summary = {}
    for kind in KINDS + ["all"]:
        sel = [r for r in rows if kind == "all" or r["kind"] == kind]
        if not sel:
            continue
        det = [r["detect_s"] for r in sel if "detect_s" in r]
        dia = [r["diagnose_s"] for r in sel if "diagnose_s" in r]
        summary[kind] = {"runs": len(sel), "correct": sum(1 for r in sel if r.get("correct")),
                         "in_bound": sum(1 for r in sel if r.get("in_bound")),
                         "detect_p50_s": statistics.median(det) if det else None, "detect_worst_s": max(det) if det else None,
                         "diagnose_p50_s": statistics.median(dia) if dia else None,
                         "diagnose_worst_s": max(dia) if dia else None}
    for kind, s in summary.items():
        bound = "bound" if kind == "all" else f"{args.mismatch_bound_s if kind == 'mismatch' else args.bound_s:g} s"
        print(f"# {kind:8}: correct {s['correct']}/{s['runs']}, within {bound} {s['in_bound']}/{s['runs']}; "
              f"detection p50 {s['detect_p50_s']} s worst {s['detect_worst_s']} s; diagnosis p50 {s['diagnose_p50_s']} s "
              f"worst {s['diagnose_worst_s']} s")
    ok = all(r.get("in_bound") for r in rows) and (healthy is None or healthy.get("correct"))
    print(f"# verdict: {'PASS' if ok else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "healthy": healthy, "summary": summary, "seed": args.seed, "bound_s": args.bound_s},
                      f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
