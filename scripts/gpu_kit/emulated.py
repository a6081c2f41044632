"""The GPU kit's steps over Falcon's emulators (gpu_check.py --emulated): the same checks as on a
GPU, with the NCCL emulator (libnccl.so.2, strict: asynchronous device work, unbounded waits),
the CUDA driver and cuBLAS emulators, and the Megatron-faithful trainer (falcon-train-emu:
every process group split from the world, a watchdog thread, backward collectives from an
autograd thread) in place of PyTorch on a GPU. CI runs the kit this way, so the kit's own logic
(services, falcon-ctl calls, parsing, verdicts) is tested on every change.

What differs from the GPU mode, and why:
  calls   the trainer's --check verifies every value it receives or reduces (exit 1 if one is
          wrong), with and without the shim; the independent call count is the emulator's own
          NCCL_DEBUG=INFO / COLL log, in NCCL's format;
  timing  skipped: the emulator has no timer independent of the CUDA events the shim uses;
  live    the slow GPU is a compute fault of the emulator's fault plan (a factor on that rank's
          modelled kernels, GEMMs included), starting at --slow-after-s.
  hang    falcon-train-emu's own injections (--inject-mismatch RANK:ITER:count:dp, --inject-stall
          RANK:ITER) at iteration --hang-iteration instead of a time: under the strict emulator,
          as under NCCL, the mismatched all-reduce never completes.
"""
import json
import os
import shutil
import time


def emu_argv(kit, world, train_args, shim=False, fault=None, job_timeout=None):
    b = kit.bins
    argv = [b.emu_run, "-n", str(world), "--ranks-per-node", str(world), "--lib-dir", b.nccl_emu_dir,
            "--cuda-lib-dir", b.cuda_emu_dir]
    if shim:
        argv += ["--preload", b.shim]
    if fault:
        argv += ["--fault-plan", json.dumps({"faults": [fault]})]
    if job_timeout:
        argv += ["--job-timeout", str(int(job_timeout))]
    return argv + ["--", b.train_emu] + train_args


def job_env(kit, shm=None, job="kit", extra=None):
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "FALCON_MODE", "FALCON_SHM_DIR", "FALCON_KEEP_SEGMENT"):
        env.pop(k, None)
    env.update(FALCON_JOB=job, FALCON_EMU_GPU_TFLOPS="10")
    if shm:
        env["FALCON_SHM_DIR"] = shm
    if extra:
        env.update(extra)
    return env


def layout_args(kit, layout):
    tp, pp, dp = layout
    return ["--tp", str(tp), "--pp", str(pp), "--dp", str(dp)]


def step_env(kit, rec):
    b = kit.bins
    info = {"mode": "emulated", "nccl_emulator": os.path.join(b.nccl_emu_dir, "libnccl.so.2"),
            "cuda_emulator": os.path.join(b.cuda_emu_dir, "libcuda.so.1"),
            "cublas_emulator": os.path.join(b.cuda_emu_dir, "libcublas.so.13"), "cpus": os.cpu_count()}
    rec["info"] = info
    kit.env = {"gpus": "emulated", "torch": None, "cuda": "emulated", "nccl": "emulator", "libnccl": info["nccl_emulator"],
               "mps": False}
    for k, v in info.items():
        rec["rows"].append([k, v if isinstance(v, str) else json.dumps(v)])
    rec["verdict"] = "PASS" if all(os.path.exists(info[k]) for k in ("nccl_emulator", "cuda_emulator",
                                                                       "cublas_emulator")) else "FAIL"


def step_calls(kit, rec):
    world = kit.a.ranks
    runs = {}
    for label, shim in (("plain", False), ("shim", True)):
        d = os.path.join(kit.out, f"calls-{label}")
        shutil.rmtree(d, ignore_errors=True)  # a rerun into the same --out must not count old logs
        shm = os.path.join(d, "shm")
        os.makedirs(shm, exist_ok=True)
        extra = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL", "NCCL_DEBUG_FILE": os.path.join(d, "nccl.%p.log")}
        if shim:
            extra.update(FALCON_KEEP_SEGMENT="1", FALCON_MODE="profile")
        argv = emu_argv(kit, world, layout_args(kit, kit.a.layout) + [
            "--iters", "12", "--compute-ms", "2", "--check", "--progress-every", "0",
            "--report", os.path.join(d, "report.json")], shim=shim, job_timeout=kit.a.step_timeout_s)
        t = time.time()
        p = kit.spawn(argv, f"calls-{label}.log", job_env(kit, shm if shim else None, "kit-calls", extra))
        try:
            code = p.wait(timeout=kit.a.step_timeout_s + 10)
        except Exception:  # the launcher's own --job-timeout should have ended it
            code = None
        kit.kill(p)
        runs[label] = {"code": code, "dir": d, "shm": shm}
        rec["notes"].append(f"{label}: exit code {code} in {time.time() - t:.1f} s (falcon-train-emu --check)")
    plain, shimmed = runs["plain"], runs["shim"]
    rec["rows"].append(["results verified by the trainer's --check, without / with the shim",
                        f"exit {plain['code']} / {shimmed['code']}"])
    nccl_counts, shim_counts, mism = kit.count_calls_by_pid(shimmed)
    rec["rows"].append(["NCCL-logged calls (all ranks)", sum(sum(c.values()) for c in nccl_counts.values())])
    rec["rows"].append(["shim-recorded data calls (all ranks)", sum(sum(c.values()) for c in shim_counts.values())])
    rec["rows"].append(["per-rank per-op count mismatches", len(mism)])
    for m in mism[:10]:
        rec["notes"].append(m)
    ok = plain["code"] == 0 and shimmed["code"] == 0 and len(nccl_counts) == world and not mism
    rec["verdict"] = "PASS" if ok else "FAIL"


def step_timing(kit, rec):
    rec["notes"].append("emulated mode: no timer independent of the CUDA events the shim uses, nothing to compare")


def step_live(kit, rec):
    world = kit.a.ranks
    job = "kit-live"
    shm = os.path.join(kit.out, "live-shm")
    shutil.rmtree(shm, ignore_errors=True)
    os.makedirs(shm, exist_ok=True)
    port = kit.start_services(shm, job)
    duration, slow_rank, slow_after = kit.a.live_s, world - 1, kit.a.slow_after_s
    fault = {"kind": "compute", "ranks": [slow_rank], "start_s": slow_after, "factor": 2.5}
    argv = emu_argv(kit, world, layout_args(kit, kit.a.layout) + [
        "--duration-s", str(duration), "--compute-ms", "4", "--progress-every", "0",
        "--report", os.path.join(kit.out, "live-report.json")], shim=True, fault=fault, job_timeout=duration + 90)
    # The validation times transfers, so the emulated fabric must be what they measure, as NVLink is
    # on a GPU: at the default 100 GB/s a 4 MiB transfer is modelled in 42 us and the time measured
    # is the host's (copies, wake-ups of 8 ranks on a few cores: 2-7 ms, ±50 %), which no link
    # threshold can judge. At 0.05 GB/s the model's 84 ms dwarfs that.
    fabric = {"FALCON_EMU_INTRA_GBPS": "0.05", "FALCON_EMU_INTER_GBPS": "0.05"}
    t_job = time.time()
    job_proc = kit.spawn(argv, "live.log", job_env(kit, shm, job, fabric))
    rec["notes"].append(f"job: falcon-train-emu {world} ranks TP x PP x DP {kit.a.layout}, {duration:.0f} s, "
                        f"rank {slow_rank} compute x2.5 from {slow_after:.0f} s (the emulator's fault plan), "
                        f"fabric {fabric['FALCON_EMU_INTRA_GBPS']} GB/s")
    st = kit.wait_status(port, job, lambda s: len([r for r in s.get("ranks", []) if r.get("period")]) >= world,
                         min(60, slow_after - 5))
    locked = len([r for r in (st or {}).get("ranks", []) if r.get("period")])
    rec["rows"].append(["ranks with a locked iteration period", f"{locked}/{world}",
                        f"{time.time() - t_job:.1f} s after start"])
    first_named = None
    if time.time() - t_job < slow_after - 10:
        t = time.time()
        rc, out, err = kit.ctl("validate", "--wait", "--json", "--timeout", "60", "--reason", "gpu kit: first round",
                               timeout=90, port=port, job=job)
        with open(os.path.join(kit.out, "live-validate-first.json"), "w") as f:
            f.write(out + err)
        try:
            first_named = json.loads(out)["localisation"].get("cause")
        except (ValueError, KeyError, TypeError):
            first_named = None
        rec["rows"].append(["first validation round, healthy job (falcon-ctl validate --wait)", f"exit {rc}",
                            f"cause {first_named}, {time.time() - t:.1f} s"])
    if time.time() - t_job < slow_after - 8:
        kit.direct_gemms(rec, port, job)
    loc = None
    deadline = t_job + duration - 2
    while time.time() < deadline and loc is None:
        time.sleep(2)
        for inc in kit.incidents(port, job):
            if (inc.get("stage") == "localisation" and inc.get("cause", "unknown") != "unknown"
                    and inc.get("at_ns", 0) / 1e9 > t_job + slow_after):
                loc = inc
                break
    try:
        code = job_proc.wait(timeout=max(5, duration + 90 - (time.time() - t_job)))
    except Exception:
        code = None
    incs = kit.incidents(port, job)
    with open(os.path.join(kit.out, "live-incidents.json"), "w") as f:
        json.dump(incs, f, indent=1)
    for inc in incs:
        rec["rows"].append([f"incident {inc.get('stage')}", inc.get("summary", "")[:150],
                            f"{inc.get('at_ns', 0) / 1e9 - t_job:.1f} s"])
    named = kit.named(loc) if loc else None
    rec["rows"].append(["job exit code", code])
    rec["rows"].append(["localised after the slow-down", json.dumps(named) if named else "nothing"])
    exact = bool(named) and named.get("cause") == "compute" and named.get("ranks") == [slow_rank]
    healthy_first = first_named in (None, "unknown")
    pause_ok = getattr(kit, "direct_pause_ok", True)
    rec["verdict"] = "PASS" if code == 0 and locked == world and exact and healthy_first and pause_ok else "FAIL"
    if not exact:
        rec["notes"].append(f"expected the GPU of rank {slow_rank} named, got {named}")


def step_hang(kit, rec):
    world = kit.a.ranks
    it = kit.a.hang_iteration

    def start_job(kind, rank, after_s, shm, job):
        inject = (["--inject-mismatch", f"{rank}:{it}:count:dp"] if kind == "mismatch"
                  else ["--inject-stall", f"{rank}:{it}"])
        argv = emu_argv(kit, world, layout_args(kit, kit.a.layout) + [
            "--iters", "100000", "--compute-ms", "2", "--progress-every", "0", *inject], shim=True,
            job_timeout=after_s + kit.a.hang_wait_s + 60)
        proc = kit.spawn(argv, f"{kind}.log", job_env(kit, shm, job))
        rec["notes"].append(f"{kind} job: falcon-train-emu {world} ranks TP x PP x DP {kit.a.layout}, {' '.join(inject)}")
        return lambda: [proc.poll()], [f"{kind}.log"]

    kit.hang_cases(rec, start_job)


def step_overhead(kit, rec):
    tp, pp, dp = kit.a.overhead_layout
    world = tp * pp * dp
    modes = ["none", "track", "profile"]
    results = {m: [] for m in modes}
    for run in range(kit.a.overhead_runs):
        if kit.left() < 20 * len(modes):
            rec["notes"].append(f"stopped after {run} runs per mode: the kit's time budget")
            break
        for m in modes:
            shm = os.path.join(kit.out, f"ovh-shm-{m}-{run}")
            os.makedirs(shm, exist_ok=True)
            rep = os.path.join(kit.out, f"ovh-{m}-{run}.json")
            argv = emu_argv(kit, world, layout_args(kit, (tp, pp, dp)) + [
                "--iters", str(kit.a.overhead_iters), "--compute-ms", "2", "--progress-every", "0", "--report", rep],
                shim=m != "none", job_timeout=120)
            p = kit.spawn(argv, f"ovh-{m}-{run}.log", job_env(kit, shm, "kit-ovh",
                                                               {"FALCON_MODE": m} if m != "none" else None))
            code = p.wait(timeout=150)
            its = kit.iterations(rep, 0)[5:]
            if code == 0 and its:
                results[m].append(sorted(i["duration_s"] for i in its)[len(its) // 2])
    kit.overhead_rows(rec, results, modes, f"falcon-train-emu {world} ranks TP {tp} x DP {dp} x PP {pp}")
