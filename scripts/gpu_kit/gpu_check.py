#!/usr/bin/env python3
"""Falcon's GPU acceptance kit: proves the shim, the agent and the controller on a real GPU (or,
with --emulated, on the emulators) and prints one report. Run through scripts/gpu_check.sh.

Steps (each bounded in time; a failed step does not stop the others):
  env       the machine: GPU, driver, PyTorch, NCCL (version and library), MPS
  calls     N ranks of PyTorch on one GPU (distinct NCCL_HOSTID each), every class of call
            (collectives in five dtypes, grouped P2P, send/recv, sub-groups, a nonblocking
            communicator, a CUDA-graph-captured all-reduce), run without and with the shim:
            results and outcomes identical, every call NCCL logged recorded exactly once
  timing    the shim's CUDA-event durations of timed all-reduces against torch.cuda.Event
            timings of the same calls (PyTorch's watchdog polling throughout)
  live      redis-server, falcon-agent and falcon-controller on the example job (TP x DP x PP):
            detection, a pause at a consistent cut, GEMM (fp32 and bf16) and P2P validation,
            resume, a slow rank made real (MPS SM share where MPS runs, else extra work on that
            rank), the incident the controller wrote
  hang      two more jobs of the example, with their own services: one rank all-reduces its loss
            with another count (a collective mismatch), then one rank stops issuing NCCL calls
            (a stuck host, every other rank waiting in NCCL); the controller's mismatch and hang
            incidents must name that rank (within --mismatch-bound-s and --hang-bound-s of the
            onset), and falcon-ctl hang --agents and falcon-ctl dump are run on the hung job
  overhead  iteration time of the example job without the shim, with track and with profile
            (medians of --overhead-runs runs each, interleaved)

Output: a '#' preamble, one block per step, a verdict line; --json FILE writes the same as JSON;
--out DIR keeps every log. Exit status: 0 when no step failed, 1 otherwise, 2 on bad usage.
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = 1
STEPS = ("env", "calls", "timing", "live", "hang", "overhead")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, nd=3):
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


class Bins:
    """Where Falcon's programs are: a bundle (bin/, lib/) or a build tree."""

    def __init__(self, bundle, build):
        self.env_path = os.environ.get("PATH", "")
        if bundle:
            b = os.path.abspath(bundle)
            self.shim = os.path.join(b, "lib", "libfalcon_shim.so")
            self.agent, self.controller, self.ctl = (os.path.join(b, "bin", n) for n in
                                                     ("falcon-agent", "falcon-controller", "falcon-ctl"))
            self.redis_server = os.path.join(b, "bin", "redis-server")
            self.redis_cli = os.path.join(b, "bin", "redis-cli")
            self.root = b
            emu = os.path.join(b, "emu")
        else:
            b = os.path.abspath(build)
            self.shim = os.path.join(b, "shim", "libfalcon_shim.so")
            self.agent, self.controller, self.ctl = (os.path.join(b, "daemon", n) for n in
                                                     ("falcon-agent", "falcon-controller", "falcon-ctl"))
            self.redis_server = shutil.which("redis-server") or "redis-server"
            self.redis_cli = shutil.which("redis-cli") or "redis-cli"
            self.root = b
            emu = b
        if bundle:
            self.emu_run = os.path.join(emu, "falcon-emu-run")
            self.train_emu = os.path.join(emu, "falcon-train-emu")
            self.nccl_emu_dir = os.path.join(emu, "nccl")
            self.cuda_emu_dir = os.path.join(emu, "cuda")
        else:
            self.emu_run = os.path.join(emu, "bench", "emu", "falcon-emu-run")
            self.train_emu = os.path.join(emu, "bench", "train", "falcon-train-emu")
            self.nccl_emu_dir = os.path.join(emu, "emu-lib")
            self.cuda_emu_dir = os.path.join(emu, "cuda-emu-lib")

    def missing(self, emulated):
        need = [self.shim, self.agent, self.controller, self.ctl, self.redis_server, self.redis_cli]
        if emulated:
            need += [self.emu_run, self.train_emu, os.path.join(self.nccl_emu_dir, "libnccl.so.2"),
                     os.path.join(self.cuda_emu_dir, "libcuda.so.1")]
        return [p for p in need if not (os.path.exists(p) or shutil.which(p))]


class Kit:
    def __init__(self, args):
        self.a = args
        self.bins = Bins(args.bundle, args.build)
        self.out = os.path.abspath(args.out) if args.out else tempfile.mkdtemp(prefix="falcon-gpu-check-")
        os.makedirs(self.out, exist_ok=True)
        self.t0 = time.time()
        self.steps = []
        self.procs = []
        self.python = sys.executable
        self.pkg = os.path.join(self.repo_root(), "python")
        self.example = os.path.join(self.repo_root(), "examples", "megatron_style.py")
        self.worker = os.path.join(HERE, "calls_worker.py")

    def repo_root(self):
        for cand in (os.path.join(HERE, "..", ".."), self.bins.root):
            if os.path.isdir(os.path.join(cand, "examples")):
                return os.path.abspath(cand)
        return os.path.abspath(os.path.join(HERE, "..", ".."))

    def left(self):
        return self.a.budget_s - (time.time() - self.t0)

    def log(self, msg):
        if not self.a.quiet:
            print(f"# [{time.time() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    # ---- processes ----
    def spawn(self, argv, logname, env=None, cwd=None):
        f = open(os.path.join(self.out, logname), "w")
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        p.logname = logname
        self.procs.append(p)
        return p

    @staticmethod
    def kill(p, sig=signal.SIGTERM, wait_s=5):
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()

    def stop_all(self):
        for p in reversed(self.procs):
            self.kill(p)
        self.procs = []

    def rank_env(self, rank, world, port, extra=None, shim=False, shm_dir=None, job="kit"):
        env = dict(os.environ)
        for k in ("LD_PRELOAD", "FALCON_MODE", "FALCON_SHM_DIR", "FALCON_KEEP_SEGMENT"):
            env.pop(k, None)
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_DEVICE="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   NCCL_HOSTID=f"falcon-kit-{rank}",   # one GPU, several "hosts": NCCL's net transport
                   NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1",
                   PYTHONPATH=self.pkg + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
                   PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        if shim:
            env["LD_PRELOAD"] = self.bins.shim
            env["FALCON_SHM_DIR"] = shm_dir
            env["FALCON_JOB"] = job
            env["FALCON_LOG"] = "info"
        if extra:
            env.update(extra)
        return env

    def run_ranks(self, argv_of, world, tag, timeout_s, shim=False, shm_dir=None, extra_env=None, job="kit",
                  per_rank_env=None):
        """Starts `world` ranks (argv_of(rank)), waits up to timeout_s; returns their exit codes
        (None: killed at the deadline)."""
        port = free_port()
        procs = []
        for r in range(world):
            env = self.rank_env(r, world, port, extra_env, shim, shm_dir, job)
            if per_rank_env:
                env.update(per_rank_env(r))
            procs.append(self.spawn(argv_of(r), f"{tag}.rank{r}.log", env))
        deadline = time.time() + timeout_s
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.time())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        for p in procs:
            self.kill(p)
            if p in self.procs:
                self.procs.remove(p)
        return codes

    # ---- reading the shim's segments ----
    def records(self, seg):
        out = subprocess.run([self.bins.ctl, "trace", "--file", seg, "--json"], capture_output=True, text=True,
                             timeout=120)
        recs = []
        for line in out.stdout.splitlines():
            try:
                recs.append(json.loads(line))
            except ValueError:
                pass
        return recs

    def segments(self, shm_dir):
        """pid -> segment path (segment names end in .<pid>)."""
        segs = {}
        for path in glob.glob(os.path.join(shm_dir, "falcon.*")):
            tail = path.rsplit(".", 1)[-1]
            if tail.isdigit():
                segs[int(tail)] = path
        return segs

    def ctl(self, *args, timeout=30, port=None, job="kit"):
        argv = [self.bins.ctl, *args]
        if port is not None:
            argv += ["--port", str(port), "--job", job]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr

    # ---- steps ----
    def step(self, name, fn, min_left_s=20):
        if self.a.steps and name not in self.a.steps:
            return
        rec = {"step": name, "verdict": "SKIP", "rows": [], "notes": [], "seconds": 0.0}
        if self.left() < min_left_s:
            rec["notes"].append(f"skipped: {self.left():.0f} s of the {self.a.budget_s:.0f} s budget left")
            self.steps.append(rec)
            return
        self.log(f"step {name}")
        t = time.time()
        try:
            fn(rec)
        except Exception as e:  # a broken step is reported, the others still run
            import traceback
            rec["verdict"] = "FAIL"
            rec["notes"].append(f"step crashed: {type(e).__name__}: {e}")
            with open(os.path.join(self.out, f"{name}.traceback.txt"), "w") as f:
                f.write(traceback.format_exc())
        finally:
            self.stop_all()
            self.stop_mps()
        rec["seconds"] = round(time.time() - t, 1)
        self.log(f"step {name}: {rec['verdict']} ({rec['seconds']} s)")
        self.steps.append(rec)
        self.write_report()

    def step_env(self, rec):
        info = {}
        smi = shutil.which("nvidia-smi")
        if smi:
            q = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
            info["gpus"] = [l.strip() for l in q.stdout.splitlines() if l.strip()]
        probe = ("import json, os, torch\n"
                 "d = {'torch': torch.__version__, 'cuda': torch.version.cuda,"
                 " 'gpu_ok': torch.cuda.is_available()}\n"
                 "try:\n d['nccl'] = '.'.join(map(str, torch.cuda.nccl.version()))\n"
                 "except Exception as e:\n d['nccl'] = None\n"
                 "d['libnccl'] = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libnccl' in l})\n"
                 "d['libcublas'] = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcublas.so' in l})\n"
                 "print(json.dumps(d))\n")
        r = subprocess.run([self.python, "-c", probe], capture_output=True, text=True, timeout=120)
        try:
            info.update(json.loads(r.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            rec["notes"].append(f"torch probe failed: {r.stderr[-400:]}")
        info["mps"] = self.probe_mps(rec) if shutil.which("nvidia-cuda-mps-control") and info.get("gpu_ok") else False
        info["cpus"] = os.cpu_count()
        rec["info"] = info
        self.env = info
        rec["verdict"] = "PASS" if info.get("gpu_ok") and info.get("nccl") else "FAIL"
        for k, v in info.items():
            rec["rows"].append([k, json.dumps(v) if not isinstance(v, str) else v])

    MPS_PROBE = ("import torch, time\n"
                 "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
                 "for _ in range(3): a @ a\n"
                 "torch.cuda.synchronize()\n"
                 "e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)\n"
                 "e0.record()\n"
                 "for _ in range(20): a @ a\n"
                 "e1.record(); e1.synchronize()\n"
                 "print(20 * 2 * 8192 ** 3 / (e0.elapsed_time(e1) / 1e3) / 1e12)\n")

    def mps_usable(self, rec):
        """--mps on/off, or auto: the env step's probe (run now if it did not run)."""
        if self.a.mps == "off" or self.a.backend != "nccl":
            return False
        if not hasattr(self, "_mps_ok"):
            env = getattr(self, "env", None)
            self._mps_ok = env["mps"] if env and "mps" in env else (
                shutil.which("nvidia-cuda-mps-control") is not None and self.probe_mps(rec))
        return self._mps_ok or self.a.mps == "on"

    def start_mps(self):
        d = os.path.join(self.out, "mps-live")
        os.makedirs(d, exist_ok=True)
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=d, CUDA_MPS_LOG_DIRECTORY=d)
        r = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise RuntimeError(f"MPS daemon did not start: {r.stderr.strip()[:200]}")
        self._mps_env = env
        return d

    def stop_mps(self):
        env = getattr(self, "_mps_env", None)
        if env:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True, capture_output=True,
                           timeout=20)
            self._mps_env = None

    def probe_mps(self, rec):
        """Whether an MPS client limited to a share of the SMs really runs slower here: the kit's
        way of making a slow GPU real. Starts a private MPS daemon and stops it again."""
        d = os.path.join(self.out, "mps")
        os.makedirs(d, exist_ok=True)
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=d, CUDA_MPS_LOG_DIRECTORY=d)
        try:
            r = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, capture_output=True, text=True, timeout=20)
            if r.returncode != 0:
                rec["notes"].append(f"MPS daemon did not start: {r.stderr.strip()[:200]}")
                return False
            rates = {}
            for share in (100, 25):
                e = dict(env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(share))
                p = subprocess.run([self.python, "-c", self.MPS_PROBE], env=e, capture_output=True, text=True,
                                   timeout=60)
                try:
                    rates[share] = float(p.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    rec["notes"].append(f"MPS client ({share} %) failed: {p.stderr.strip()[-300:]}")
                    return False
            rec["notes"].append(f"MPS: bf16 GEMM {rates[100]:.0f} TFLOP/s at 100 % of the SMs, {rates[25]:.0f} at 25 %")
            return rates[25] < 0.6 * rates[100]
        except (OSError, subprocess.TimeoutExpired) as e:
            rec["notes"].append(f"MPS probe failed: {e}")
            return False
        finally:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True, capture_output=True,
                           timeout=20)

    def step_calls(self, rec):
        world = self.a.ranks
        runs = {}
        for label, shim in (("plain", False), ("shim", True)):
            d = os.path.join(self.out, f"calls-{label}")
            shutil.rmtree(d, ignore_errors=True)  # a rerun into the same --out must not count old logs
            os.makedirs(d, exist_ok=True)
            shm = os.path.join(d, "shm")
            os.makedirs(shm, exist_ok=True)
            extra = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL",
                     "NCCL_DEBUG_FILE": os.path.join(d, "nccl.%p.log")}
            if shim:
                extra.update(FALCON_KEEP_SEGMENT="1", FALCON_MODE="profile")
            t = time.time()
            codes = self.run_ranks(lambda r: [self.python, self.worker, "--out", os.path.join(d, f"rank{r}.json"),
                                              "--timing-reps", str(self.a.timing_reps), "--backend", self.a.backend],
                                   world, f"calls-{label}", self.a.step_timeout_s, shim=shim, shm_dir=shm,
                                   extra_env=extra, job="kit-calls")
            reports = []
            for r in range(world):
                try:
                    with open(os.path.join(d, f"rank{r}.json")) as f:
                        reports.append(json.load(f))
                except (OSError, ValueError):
                    reports.append(None)
            runs[label] = {"codes": codes, "reports": reports, "dir": d, "shm": shm, "s": time.time() - t}
            rec["notes"].append(f"{label}: exit codes {codes} in {time.time() - t:.1f} s")
        self.calls_runs = runs
        plain, shim = runs["plain"], runs["shim"]
        ok = all(c == 0 for c in plain["codes"] + shim["codes"])
        # 1. identical outcomes and results
        diffs, cases = [], 0
        for r in range(world):
            a, b = plain["reports"][r], shim["reports"][r]
            if not a or not b:
                diffs.append(f"rank {r}: no report")
                continue
            for name, ra in sorted(a["cases"].items()):
                cases += 1
                rb = b["cases"].get(name)
                if rb != ra:
                    diffs.append(f"rank {r} {name}: {ra} vs {rb}")
        failed_cases = sorted({n for rep in plain["reports"] if rep for n, c in rep["cases"].items() if not c["ok"]})
        rec["rows"].append(["cases x ranks compared", cases])
        rec["rows"].append(["differences (result digest or outcome)", len(diffs)])
        rec["rows"].append(["cases that failed in both runs", ", ".join(failed_cases) or "none"])
        for dline in diffs[:10]:
            rec["notes"].append(dline)
        # 2. every call NCCL logged is recorded exactly once
        nccl_counts, shim_counts, mism = self.count_calls(shim, world)
        rec["rows"].append(["NCCL-logged calls (all ranks)", sum(sum(c.values()) for c in nccl_counts.values())])
        rec["rows"].append(["shim-recorded data calls (all ranks)", sum(sum(c.values()) for c in shim_counts.values())])
        rec["rows"].append(["per-rank per-op count mismatches", len(mism)])
        for m in mism[:10]:
            rec["notes"].append(m)
        self.shim_records = getattr(self, "shim_records", {})
        rec["verdict"] = "PASS" if ok and not diffs and not mism and nccl_counts else "FAIL"
        if not nccl_counts:
            rec["notes"].append("no NCCL INFO COLL lines found: the independent count is missing")

    OP_ALIASES = {"Bcast": "Broadcast"}
    DATA_OPS = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AlltoAll", "Gather", "Scatter",
                "Send", "Recv"}

    def count_calls(self, run, world):
        """Per rank: op -> calls, from NCCL's own INFO COLL log and from the shim's records."""
        pids = {rep["pid"]: r for r, rep in enumerate(run["reports"]) if rep}
        nccl, shim, mism = self.count_calls_by_pid(run, pids)
        for r, rep in enumerate(run["reports"]):
            if rep and rep["pid"] in getattr(self, "_records_by_pid", {}):
                self.shim_records[r] = self._records_by_pid[rep["pid"]]
        return nccl, shim, mism

    def count_calls_by_pid(self, run, names=None):
        """Per process (named by `names[pid]`, default the pid): op -> calls, from NCCL's own INFO
        COLL log (nccl.<pid>.log) and from the shim's records of the segment of that pid."""
        line_re = re.compile(r"NCCL INFO (\w+): opCount [0-9a-fA-F]+ ")
        nccl, shim, mism = {}, {}, []
        segs = self.segments(run["shm"])
        logs = {}
        for path in glob.glob(os.path.join(run["dir"], "nccl.*.log")):
            tail = os.path.basename(path)[len("nccl."):-len(".log")]
            if tail.isdigit():
                logs[int(tail)] = path
        pids = sorted(set(names) if names else set(logs) | set(segs))
        self.shim_records = getattr(self, "shim_records", {})
        self._records_by_pid = {}
        for pid in pids:
            who = names[pid] if names else pid
            counts = {}
            if pid in logs:
                with open(logs[pid], errors="replace") as f:
                    for line in f:
                        m = line_re.search(line)
                        if m:
                            op = self.OP_ALIASES.get(m.group(1), m.group(1))
                            counts[op] = counts.get(op, 0) + 1
            if counts:
                nccl[who] = counts
            seg = segs.get(pid)
            recs = self.records(seg) if seg else []
            self._records_by_pid[pid] = recs
            with open(os.path.join(run["dir"], f"records.{who}.jsonl"), "w") as f:
                f.writelines(json.dumps(x) + "\n" for x in recs)
            sc = {}
            for x in recs:
                if "benchmark" in x.get("flags", []):
                    continue
                op = self.OP_ALIASES.get(x["op"], x["op"])
                if op in self.DATA_OPS:
                    sc[op] = sc.get(op, 0) + 1
            shim[who] = sc
            if not seg:
                mism.append(f"rank {who}: no segment for pid {pid}")
            for op in sorted(set(counts) | set(sc)):
                if counts.get(op, 0) != sc.get(op, 0):
                    mism.append(f"rank {who} {op}: NCCL logged {counts.get(op, 0)}, shim recorded {sc.get(op, 0)}")
        return nccl, shim, mism

    def step_timing(self, rec):
        runs = getattr(self, "calls_runs", None)
        if not runs:
            rec["notes"].append("needs the calls step")
            return
        run = runs["shim"]
        rows = {}
        pairs = 0
        for r, rep in enumerate(run["reports"]):
            if not rep or not rep.get("timed"):
                continue
            recs = self.shim_records.get(r, [])
            gpu = {(x["ref_lane"], x["ref_seq"]): x for x in recs if x["op"] == "GpuTiming"}
            by_count = {}
            for x in recs:
                if x["op"] == "AllReduce" and x["nranks"] == len(run["reports"]):
                    by_count.setdefault(x["count"], []).append(x)
            per_count_idx = {}
            for t in rep["timed"]:
                c = t["count"]
                lst = by_count.get(c, [])
                i = per_count_idx.get(c, 0)
                per_count_idx[c] = i + 1
                if i >= len(lst):
                    continue
                g = gpu.get((lst[i]["lane"], lst[i]["seq"]))
                if not g:
                    continue
                shim_ms = (g["gpu_end_ns"] - g["gpu_start_ns"]) / 1e6
                rows.setdefault(c, []).append((t["torch_ms"], shim_ms))
                pairs += 1
        worst = 0.0
        for c in sorted(rows):
            tt = [a for a, _ in rows[c]]
            ss = [b for _, b in rows[c]]
            diffs = [b - a for a, b in rows[c]]
            rel = abs(median(ss) - median(tt)) / median(tt) if median(tt) else 0.0
            worst = max(worst, rel if median(tt) > 0.1 else 0.0)
            rec["rows"].append([c * 4, len(rows[c]), median(tt), median(ss), median(diffs),
                                max(abs(d) for d in diffs), 100 * rel])
        rec["header"] = ["bytes", "calls", "torch_ms_p50", "shim_ms_p50", "diff_ms_p50", "diff_ms_max", "rel_%"]
        rec["notes"].append(f"{pairs} calls paired (shim GpuTiming record <-> torch.cuda.Event pair of the same call)")
        rec["notes"].append("rel_% = |p50 shim - p50 torch| / p50 torch; the verdict counts calls above 0.1 ms")
        rec["verdict"] = "PASS" if pairs and worst <= self.a.timing_tolerance else "FAIL"

    # ---- the live system ----
    def start_services(self, shm, job, controller_args=()):
        port = free_port()
        self.spawn([self.bins.redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", self.out], f"redis-{job}.log")
        deadline = time.time() + 15
        while True:
            r = subprocess.run([self.bins.redis_cli, "-p", str(port), "PING"], capture_output=True, text=True)
            if r.stdout.strip() == "PONG":
                break
            if time.time() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.1)
        self.spawn([self.bins.agent, "--job", job, "--host", "gpu-node0", "--shm-dir", shm, "--redis-port", str(port),
                    "--metrics-port", "0", "--poll-ms", "100", "--flush-ms", "250", "--heartbeat-ms", "500",
                    "--key-ttl-s", "3", "--profile-ms", "2000", "--command-block-ms", "200"], f"agent-{job}.log")
        self.spawn([self.bins.controller, "--job", job, "--redis-port", str(port), "--view-ms", "500",
                    "--heartbeat-ms", "1000", "--p2p-bytes", str(4 << 20), "--retry-after-s", "10",
                    "--gemm-dtype", "bf16", "--gemm-size", "4096", "--gemm-batch", "1", *controller_args],
                   f"controller-{job}.log")
        return port

    def wait_status(self, port, job, pred, timeout_s):
        deadline = time.time() + timeout_s
        last = None
        while time.time() < deadline:
            rc, out, _ = self.ctl("status", "--json", port=port, job=job)
            if rc == 0:
                try:
                    last = json.loads(out)
                    if pred(last):
                        return last
                except ValueError:
                    pass
            time.sleep(1)
        return last

    def step_live(self, rec):
        world = self.a.ranks
        tp, pp, dp = self.a.layout
        job = "kit-live"
        shm = os.path.join(self.out, "live-shm")
        shutil.rmtree(shm, ignore_errors=True)
        os.makedirs(shm, exist_ok=True)
        port = self.start_services(shm, job)
        duration = self.a.live_s
        slow_rank, slow_after = world - 1, self.a.slow_after_s
        argv = lambda r: [self.python, self.example, "--backend", self.a.backend, "--tp", str(tp), "--pp", str(pp),
                          "--dp", str(dp),
                          "--duration-s", str(duration), "--iters", "0", "--hidden", str(self.a.hidden),
                          "--report", os.path.join(self.out, "live-report.json"),
                          "--slow-rank", str(slow_rank), "--slow-after-s", str(slow_after),
                          "--slow-ms", str(self.a.slow_ms), "--checkpoint-every", "0"]
        jport = free_port()
        jobs = []
        mps = self.mps_usable(rec)
        if mps:
            pipe = self.start_mps()
            rec["notes"].append(f"a slow GPU made real: every rank an MPS client, rank {slow_rank} limited to "
                                f"{self.a.mps_share} % of the SMs from the start")
        t_job = time.time()
        for r in range(world):
            env = self.rank_env(r, world, jport, shim=True, shm_dir=shm, job=job)
            if mps:
                env.update(CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=pipe, NCCL_CUMEM_ENABLE="0")
                if r == slow_rank:
                    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(self.a.mps_share)
            jobs.append(self.spawn(argv(r), f"live.rank{r}.log", env))
        rec["notes"].append(f"job: {world} ranks TP {tp} x DP {dp} x PP {pp}, {duration:.0f} s, rank {slow_rank} "
                            f"+{self.a.slow_ms:g} ms device time per micro-batch from {slow_after:.0f} s")
        st = self.wait_status(port, job, lambda s: len([r for r in s.get("ranks", []) if r.get("period")]) >= world,
                              min(60, duration / 2))
        locked = len([r for r in (st or {}).get("ranks", []) if r.get("period")])
        rec["rows"].append(["ranks with a locked iteration period", f"{locked}/{world}",
                            f"{time.time() - t_job:.1f} s after start"])
        # A validation round on the healthy job, asked for by hand: pause, GEMM, P2P, resume.
        if time.time() - t_job < slow_after - 15:
            t = time.time()
            rc, out, err = self.ctl("validate", "--wait", "--json", "--timeout", "60", "--reason",
                                    "gpu kit: first round", timeout=90, port=port, job=job)
            rec["rows"].append(["first validation round (falcon-ctl validate --wait)", f"exit {rc}",
                                f"{time.time() - t:.1f} s"])
            with open(os.path.join(self.out, "live-validate-first.json"), "w") as f:
                f.write(out + err)
            self.summarise_round(rec, out, "first round")
            if mps:
                try:
                    named = self.named(json.loads(out)["localisation"])
                except (ValueError, KeyError, TypeError):
                    named = None
                gpus = []
                try:
                    gpus = [g.get("rank") for g in json.loads(out)["localisation"]["detail"].get("gpus", [])]
                except (ValueError, KeyError, TypeError, AttributeError):
                    pass
                self.mps_named = gpus
                rec["rows"].append([f"MPS-limited rank {slow_rank} named by the first round",
                                    "yes" if gpus == [slow_rank] else f"no: {json.dumps(named)[:160]}",
                                    f"GPUs named {gpus}"])
        # Direct trap commands: GEMM in fp32 and bf16 on every rank while paused.
        if time.time() - t_job < slow_after - 10:
            self.direct_gemms(rec, port, job)
        # The slow rank: wait for the controller's localisation.
        deadline = t_job + duration - 2
        loc = None
        while time.time() < deadline and loc is None:
            time.sleep(2)
            for inc in self.incidents(port, job):
                if inc.get("stage") == "localisation" and inc.get("at_ns", 0) / 1e9 > t_job + slow_after:
                    loc = inc
                    break
        codes = []
        for p in jobs:
            try:
                codes.append(p.wait(timeout=max(5, duration + 60 - (time.time() - t_job))))
            except subprocess.TimeoutExpired:
                codes.append(None)
        incs = self.incidents(port, job)
        with open(os.path.join(self.out, "live-incidents.json"), "w") as f:
            json.dump(incs, f, indent=1)
        for inc in incs:
            rec["rows"].append([f"incident {inc.get('stage')}", inc.get("summary", "")[:150],
                                f"{inc.get('at_ns', 0) / 1e9 - t_job:.1f} s"])
        its = self.iterations(os.path.join(self.out, "live-report.json"), 0)
        before = [i["duration_s"] for i in its if i["start_s"] + i["duration_s"] < slow_after and i["iter"] >= 5]
        after = [i["duration_s"] for i in its if i["start_s"] > slow_after + 2]
        rec["rows"].append(["rank 0 iteration p50 before / after the slow-down, ms",
                            f"{fmt(1e3 * median(before) if before else None, 1)} / "
                            f"{fmt(1e3 * median(after) if after else None, 1)}", f"{len(its)} iterations"])
        rec["rows"].append(["job exit codes", json.dumps(codes)])
        named = self.named(loc) if loc else None
        rec["rows"].append(["localised after the slow-down", json.dumps(named) if named else "nothing"])
        alive = all(c == 0 for c in codes)
        self.stop_mps()
        mps_ok = not mps or getattr(self, "mps_named", None) == [slow_rank]
        pause_ok = getattr(self, "direct_pause_ok", True)
        rec["verdict"] = "PASS" if alive and locked == world and mps_ok and pause_ok else "FAIL"
        if not pause_ok:
            rec["notes"].append("falcon-ctl pause --iteration did not trap every rank")
        if loc and named and named.get("ranks") and slow_rank not in named["ranks"]:
            rec["notes"].append(f"the controller named {named}, not rank {slow_rank}: see incidents "
                                "(one GPU shared by every rank: a rank's extra work slows its neighbours' kernels)")

    def step_hang(self, rec):
        tp, pp, dp = self.a.layout

        def start_job(kind, rank, after_s, shm, job):
            inject = (["--inject-mismatch", f"{rank}:{after_s:g}:count"] if kind == "mismatch"
                      else ["--inject-stall", f"{rank}:{after_s:g}"])
            argv = lambda r: [self.python, self.example, "--backend", self.a.backend, "--tp", str(tp), "--pp", str(pp),
                              "--dp", str(dp), "--iters", "0", "--duration-s", "600", "--hidden", str(self.a.hidden),
                              "--checkpoint-every", "0", *inject]
            jport = free_port()
            logs = [f"{kind}.rank{r}.log" for r in range(self.a.ranks)]
            procs = [self.spawn(argv(r), logs[r], self.rank_env(r, self.a.ranks, jport, shim=True, shm_dir=shm,
                                                                job=job))
                     for r in range(self.a.ranks)]
            rec["notes"].append(f"{kind} job: the example, {self.a.ranks} ranks TP {tp} x DP {dp} x PP {pp}, "
                                f"{' '.join(inject)}")
            return lambda: [p.poll() for p in procs], logs

        self.hang_cases(rec, start_job)

    # The hang step of both modes: start_job(kind, rank, after_s, shm, job) starts the job with the
    # injection and returns (a function giving its processes' exit codes, None while running;
    # the logs, relative to --out, where the onset is announced).
    def hang_cases(self, rec, start_job):
        rank = self.a.ranks - 1
        results = []
        for kind in ("mismatch", "stall"):
            job = f"kit-{kind}"
            shm = os.path.join(self.out, f"{kind}-shm")
            shutil.rmtree(shm, ignore_errors=True)
            os.makedirs(shm, exist_ok=True)
            # The fail-slow path held back (every rank slow first, no mitigation): the hang path is checked.
            port = self.start_services(shm, job, ("--min-slow-fraction", "1", "--mitigation", "off"))
            codes, logs = start_job(kind, rank, self.a.hang_after_s, shm, job)
            stage = "mismatch" if kind == "mismatch" else "hang"
            option = f"--inject-{kind}"
            deadline = time.time() + self.a.hang_after_s + self.a.hang_wait_s
            onset, found, exited = None, [], None
            while time.time() < deadline:
                time.sleep(0.5)
                if onset is None:
                    onset = self.onset(logs, rank, option)
                found = [i for i in self.incidents(port, job) if i.get("stage") == stage]
                if found:
                    time.sleep(2)  # entries of the same diagnosis
                    found = [i for i in self.incidents(port, job) if i.get("stage") == stage]
                    break
                done = [c for c in codes() if c is not None]
                if done:
                    exited = done
                    break
            if onset is None:
                onset = self.onset(logs, rank, option)
            # The live picture of the job as it is now, through the agent and from the shm segments.
            rc_h, out_h, err_h = self.ctl("hang", "--agents", "--redis", f"redis://127.0.0.1:{port}", "--job", job,
                                          "--json", timeout=60)
            rc_d, out_d, err_d = self.ctl("dump", "--dir", shm, "--job", job, "--json", timeout=60)
            for name, text in ((f"{kind}-hang.json", out_h + err_h), (f"{kind}-dump.json", out_d + err_d),
                               (f"{kind}-incidents.json", json.dumps(self.incidents(port, job), indent=1))):
                with open(os.path.join(self.out, name), "w") as f:
                    f.write(text)
            named = sorted({tuple(i.get("ranks") or []) for i in found})
            kinds = sorted({str((i.get("detail") or {}).get("kind")) for i in found})
            diagnosed = (min(i["at_ns"] for i in found) / 1e9 - onset) if found and onset else None
            bound = self.a.mismatch_bound_s if kind == "mismatch" else self.a.hang_bound_s
            exact = bool(found) and named == [(rank,)] and (kind == "mismatch" or kinds == ["not_issued"])
            ok = exact and diagnosed is not None and diagnosed <= bound
            try:
                dumped = len(json.loads(out_d).get("ranks", []))
            except (ValueError, AttributeError):
                dumped = None
            try:
                picture = json.loads(out_h)
                culprits = sorted({r for f in picture.get("findings", []) for r in f.get("culprits", [])})
                counts = picture.get("counts")
            except (ValueError, AttributeError, TypeError):
                culprits, counts = None, None
            detail = (f"{len(found)} {stage} entr{'y' if len(found) == 1 else 'ies'} {kinds}; falcon-ctl hang "
                      f"--agents exit {rc_h}, findings {json.dumps(counts)}, culprits {json.dumps(culprits)}; "
                      f"falcon-ctl dump exit {rc_d}, {dumped} ranks")
            if onset is None:
                detail += "; the onset was never announced"
            if exited:
                detail += f"; the job exited ({exited}) before a {stage} incident"
            rec["rows"].append([f"{kind} injected on rank {rank}", f"named {json.dumps([list(n) for n in named])}",
                                f"{fmt(diagnosed, 2)} s after the onset (bound {bound:g} s)",
                                "correct" if ok else "WRONG", detail])
            results.append(ok)
            self.stop_all()
        rec["verdict"] = "PASS" if results and all(results) else "FAIL"

    def onset(self, logs, rank, option):
        """The wall time a rank announced its injection: "rank R: OPTION: ... (from NS ns)"."""
        mark = f"rank {rank}: {option}:"
        for name in logs:
            try:
                with open(os.path.join(self.out, name), errors="replace") as f:
                    for line in f:
                        if mark in line and "(from " in line:
                            return int(line.rsplit("(from ", 1)[1].split()[0]) / 1e9
            except (OSError, ValueError):
                pass
        return None

    def direct_gemms(self, rec, port, job):
        """Pause every rank at an iteration start a few seconds ahead, run a 4096^3 GEMM in fp32
        and in bf16 on every rank, resume: what the controller's rounds do, by hand."""
        # Status counts the iteration samples each agent has analysed, which trail the ranks'
        # own iteration numbers, and the job runs on while falcon-ctl plans: aim a few seconds
        # past that count; when it falls short, falcon-ctl names an iteration that has a cut as
        # the ranks stood, and the next try aims that many seconds past it.
        later = None
        for attempt in range(4):
            st = self.wait_status(port, job, lambda s: bool(s.get("ranks")), 10) or {}
            ranks = st.get("ranks", [])
            iters = [r.get("iterations") or 0 for r in ranks]
            ages = [r.get("heartbeat_age_s") or 0.0 for r in ranks]
            its = [r.get("current_s") for r in ranks if r.get("current_s")]
            it_s = max(min(its) if its else 0.1, 1e-3)
            ahead_s = (max(ages) if ages else 0.0) + 3.0 * (attempt + 1)
            base = later if later is not None else (min(iters) if iters else 0)
            at = base + max(20, math.ceil(ahead_s / it_s))
            rc, out, err = self.ctl("pause", "--iteration", str(at), "--max-pause", "30", "--json", "--timeout",
                                    "30", timeout=60, port=port, job=job)
            named = re.search(r"\(iteration (\d+) has a cut", err)
            if rc == 0 or not named:
                break
            later = int(named.group(1))
            rec["notes"].append(f"pause --iteration {at}: {err.strip()[:240]}; aiming past {later}")
        states = self.ack_results(out)
        trapped = sum(1 for r in states if r.get("state") == "trapped")
        rec["rows"].append([f"falcon-ctl pause --iteration {at}", f"exit {rc}",
                            f"{trapped} ranks trapped" + ("" if trapped else ": " + err.strip()[:200])])
        self.direct_pause_ok = trapped == len(states) and trapped > 0
        if trapped:
            for dtype in ("fp32", "bf16"):
                rc, out, err = self.ctl("validate", "--task", "gemm", "--dtype", dtype, "--size", "4096",
                                        "--repeats", "5", "--json", "--timeout", "30", timeout=60, port=port, job=job)
                with open(os.path.join(self.out, f"live-gemm-{dtype}.json"), "w") as f:
                    f.write(out + err)
                res = sorted(self.ack_results(out), key=lambda r: r.get("rank", -1))
                tf = [f"r{r.get('rank')}:{r['rate'] / 1e3:.0f}" for r in res if r.get("rate")]
                kinds = sorted({f"{r.get('task_status')}/{r.get('dtype')}" for r in res})
                rec["rows"].append([f"GEMM 4096^3 {dtype}, every rank at once (exit {rc})",
                                    "TFLOP/s " + " ".join(tf) if tf else (out + err)[:160], ", ".join(kinds)])
        rc, out, err = self.ctl("resume", "--json", "--timeout", "30", timeout=60, port=port, job=job)
        rec["rows"].append(["falcon-ctl resume", f"exit {rc}",
                            ", ".join(sorted({str(r.get("state")) for r in self.ack_results(out)}))])

    @staticmethod
    def ack_results(out):
        try:
            j = json.loads(out)
        except ValueError:
            return []
        res = []
        for t in j.get("targets", []):
            ack = t.get("ack") or {}
            res.extend(ack.get("results", []))
        return res

    def summarise_round(self, rec, out, label):
        try:
            j = json.loads(out)
        except ValueError:
            return
        rec["notes"].append(f"{label}: {json.dumps(j)[:600]}")

    def incidents(self, port, job):
        rc, out, _ = self.ctl("incidents", "--json", "-n", "0", port=port, job=job)
        try:
            return [i["msg"] for i in json.loads(out).get("incidents", [])]
        except (ValueError, KeyError, TypeError):
            return []

    @staticmethod
    def named(inc):
        return {k: inc.get(k) for k in ("cause", "ranks", "hosts", "summary") if inc.get(k) is not None}

    @staticmethod
    def iterations(report, rank):
        try:
            with open(f"{report}.rank{rank}") as f:
                return json.load(f)["iterations"]
        except (OSError, ValueError, KeyError):
            return []

    def step_overhead(self, rec):
        tp, pp, dp = self.a.overhead_layout
        world = tp * pp * dp
        modes = ["none", "track", "profile"]
        results = {m: [] for m in modes}
        for run in range(self.a.overhead_runs):
            if self.left() < 25 * len(modes):
                rec["notes"].append(f"stopped after {run} runs per mode: the kit's time budget")
                break
            for m in modes:
                shm = os.path.join(self.out, f"ovh-shm-{m}-{run}")
                os.makedirs(shm, exist_ok=True)
                rep = os.path.join(self.out, f"ovh-{m}-{run}.json")
                codes = self.run_ranks(
                    lambda r: [self.python, self.example, "--backend", self.a.backend, "--tp", str(tp), "--pp", str(pp),
                               "--dp", str(dp),
                               "--iters", str(self.a.overhead_iters), "--hidden", str(self.a.hidden),
                               "--report", rep, "--no-falcon"],
                    world, f"ovh-{m}-{run}", 120, shim=(m != "none"), shm_dir=shm,
                    extra_env={"FALCON_MODE": m} if m != "none" else None, job="kit-ovh")
                its = self.iterations(rep, 0)[5:]
                if all(c == 0 for c in codes) and its:
                    results[m].append(median([i["duration_s"] for i in its]))
                shutil.rmtree(shm, ignore_errors=True)
        self.overhead_rows(rec, results, modes, f"example job {world} ranks TP {tp} x DP {dp} x PP {pp}, hidden "
                           f"{self.a.hidden}")

    def overhead_rows(self, rec, results, modes, what):
        base = median(results["none"])
        rec["header"] = ["mode", "runs", "iteration_ms_p50", "min_ms", "max_ms", "vs_none"]
        for m in modes:
            xs = results[m]
            rec["rows"].append([m, len(xs), 1e3 * median(xs) if xs else None, 1e3 * min(xs) if xs else None,
                                1e3 * max(xs) if xs else None,
                                (median(xs) / base) if xs and base else None])
        rec["notes"].append(f"{what}, {self.a.overhead_iters} iterations per run (first 5 dropped), modes "
                            "interleaved run by run")
        ok = all(len(results[m]) >= 1 for m in modes)
        rec["verdict"] = "PASS" if ok else "FAIL"
        if ok and min(len(results[m]) for m in modes) < self.a.overhead_runs:
            rec["notes"].append(f"fewer than the {self.a.overhead_runs} runs asked for: medians of few runs")

    # ---- report ----
    def write_report(self):
        doc = {"schema": SCHEMA, "tool": "falcon-gpu-check", "emulated": self.a.emulated,
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t0)),
               "config": {k: v for k, v in vars(self.a).items() if k not in ("json",)},
               "steps": self.steps}
        with open(os.path.join(self.out, "report.json"), "w") as f:
            json.dump(doc, f, indent=1, default=str)
        if self.a.json:
            with open(self.a.json, "w") as f:
                json.dump(doc, f, indent=1, default=str)

    def print_report(self):
        lines = [f"# falcon-gpu-check (schema {SCHEMA}) {'emulated' if self.a.emulated else 'GPU'}",
                 f"# ranks {self.a.ranks}, layout TP x PP x DP = {'x'.join(map(str, self.a.layout))}, "
                 f"budget {self.a.budget_s:.0f} s, logs {self.out}"]
        env = getattr(self, "env", {})
        if env:
            lines.append(f"# gpu {env.get('gpus')}, torch {env.get('torch')}, cuda {env.get('cuda')}, "
                         f"nccl {env.get('nccl')} {env.get('libnccl')}")
        for s in self.steps:
            lines.append(f"\n## {s['step']}: {s['verdict']} ({s['seconds']} s)")
            if s.get("header"):
                lines.append("  " + "  ".join(f"{h:>14}" for h in s["header"]))
            for row in s["rows"]:
                if s.get("header"):
                    lines.append("  " + "  ".join(f"{fmt(v):>14}" for v in row))
                else:
                    lines.append("  " + " | ".join(fmt(v) for v in row))
            for n in s["notes"]:
                lines.append(f"  # {n}")
        failed = [s["step"] for s in self.steps if s["verdict"] == "FAIL"]
        lines.append(f"\n# verdict: {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'} "
                     f"in {time.time() - self.t0:.0f} s")
        text = "\n".join(lines)
        print(text)
        with open(os.path.join(self.out, "report.txt"), "w") as f:
            f.write(text + "\n")
        return 1 if failed else 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Falcon's GPU acceptance kit", epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", default="", help="a bundle made by scripts/bundle.sh (bin/, lib/)")
    ap.add_argument("--build", default="build", help="a build tree (when no --bundle)")
    ap.add_argument("--emulated", action="store_true", help="run the steps over the NCCL and CUDA emulators")
    ap.add_argument("--ranks", type=int, default=8, help="ranks sharing the GPU")
    ap.add_argument("--layout", default="2,2,2", help="TP,PP,DP of the example job (product = --ranks)")
    ap.add_argument("--steps", default="", help="comma-separated subset of env,calls,timing,live,hang,overhead")
    ap.add_argument("--budget-s", type=float, default=540, help="stop starting steps after this long")
    ap.add_argument("--step-timeout-s", type=float, default=100, help="longest a job of one step may run")
    ap.add_argument("--timing-reps", type=int, default=8)
    ap.add_argument("--timing-tolerance", type=float, default=0.10, help="largest relative p50 difference")
    ap.add_argument("--live-s", type=float, default=100, help="length of the live job")
    ap.add_argument("--slow-after-s", type=float, default=50)
    ap.add_argument("--slow-ms", type=float, default=15.0,
                    help="extra device time of the slow rank per micro-batch forward, ms")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--mps", default="auto", choices=["auto", "on", "off"],
                    help="make the slow rank's GPU really slow with MPS (an SM share) where MPS works")
    ap.add_argument("--mps-share", type=int, default=25, help="the slow rank's share of the SMs under MPS, %%")
    ap.add_argument("--hang-after-s", type=float, default=30,
                    help="hang step: seconds into each job before the injection (the agent needs the period)")
    ap.add_argument("--hang-wait-s", type=float, default=40, help="hang step: longest wait for the incident")
    ap.add_argument("--hang-iteration", type=int, default=80,
                    help="hang step, --emulated: the iteration the injection strikes at (instead of a time)")
    ap.add_argument("--hang-bound-s", type=float, default=10, help="hang step: a stuck rank named within this")
    ap.add_argument("--mismatch-bound-s", type=float, default=1, help="hang step: a mismatch raised within this")
    ap.add_argument("--overhead-layout", default="2,1,2", help="TP,PP,DP of the overhead runs")
    ap.add_argument("--overhead-runs", type=int, default=5)
    ap.add_argument("--overhead-iters", type=int, default=40)
    ap.add_argument("--out", default="", help="keep logs and report.json here (default: a temporary dir)")
    ap.add_argument("--json", default="", help="also write the report as JSON to this file")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"],
                    help="gloo: a dry run of the kit's own logic on CPUs (nothing for the shim to record)")
    a = ap.parse_args(argv)
    a.steps = [s for s in a.steps.split(",") if s]
    bad = [s for s in a.steps if s not in STEPS]
    if bad:
        ap.error(f"unknown steps: {bad}")
    try:
        a.layout = tuple(int(x) for x in a.layout.split(","))
        assert len(a.layout) == 3 and a.layout[0] * a.layout[1] * a.layout[2] == a.ranks
        a.overhead_layout = tuple(int(x) for x in a.overhead_layout.split(","))
        assert len(a.overhead_layout) == 3 and min(a.overhead_layout) >= 1
    except (ValueError, AssertionError):
        ap.error("--layout TP,PP,DP with TP*PP*DP = --ranks; --overhead-layout TP,PP,DP")
    return a


def main(argv=None):
    a = parse_args(argv)
    kit = Kit(a)
    missing = kit.bins.missing(a.emulated)
    if missing:
        print(f"gpu_check: missing programs: {', '.join(missing)} (make a bundle: scripts/bundle.sh)", file=sys.stderr)
        return 2
    if a.emulated:
        import emulated
        steps = {n: (lambda rec, f=getattr(emulated, f"step_{n}"): f(kit, rec))
                 for n in STEPS}
    else:
        steps = {n: getattr(kit, f"step_{n}") for n in STEPS}
    try:
        kit.step("env", steps["env"], 0)
        kit.step("calls", steps["calls"], 60)
        kit.step("timing", steps["timing"], 0)
        kit.step("live", steps["live"], a.live_s + 30)
        kit.step("hang", steps["hang"], 2 * (a.hang_after_s + 20))
        kit.step("overhead", steps["overhead"], 40)
    except KeyboardInterrupt:
        kit.stop_all()
    kit.write_report()
    return kit.print_report()


if __name__ == "__main__":
    sys.exit(main())
