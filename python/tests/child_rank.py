"""A process that stands in for one rank of a job, for python/tests: it preloads nothing itself
(the test runs it with LD_PRELOAD=libfalcon_shim.so), makes an NCCL communicator through the
process's global symbols (so the shim records it) over the no-op NCCL, then does what a test asks:

  wait-plan N   wait (up to 60 s) until a plan of version >= N arrives; ack it; report a cost;
                print the plan and what the API returned as one JSON line
  phases        enter and leave phases, printing the phase the shim holds at each point, then
                hold "checkpoint" for FALCON_TEST_HOLD_S
  early-phase   enter "eval" before the first NCCL call, hold it FALCON_TEST_HOLD_S after it
  errors        exercise the error paths of the API; print the outcomes
  hook N        torch.distributed (gloo) rank of WORLD_SIZE: run falcon.torch.PlanHook for N
                iterations (a plan arrives meanwhile), print what was applied when

Environment: FALCON_TEST_NOOP_NCCL (path of the no-op libnccl.so.2), FALCON_TEST_RANK,
FALCON_TEST_NRANKS.
"""
import ctypes
import json
import os
import sys
import time

import falcon


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def make_comm():
    ctypes.CDLL(os.environ["FALCON_TEST_NOOP_NCCL"], mode=ctypes.RTLD_GLOBAL)
    proc = ctypes.CDLL(None)  # the process's symbols: the preloaded shim's ncclCommInitRank
    uid = UniqueId()
    assert proc.ncclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    rank, n = int(os.environ.get("FALCON_TEST_RANK", "0")), int(os.environ.get("FALCON_TEST_NRANKS", "1"))
    rc = proc.ncclCommInitRank(ctypes.byref(comm), n, uid, rank)
    assert rc == 0, rc
    return proc, comm


def wait_plan(version):
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            p = falcon.plan()
        except falcon.PlanBusy:
            p = None
        if p is not None and p.version >= version:
            out = {"plan": {"version": p.version, "strategy": p.strategy, "micro_batches": list(p.micro_batches),
                            "placement": list(p.placement), "excluded_nodes": list(p.excluded_nodes),
                            "restart": p.restart, "issued_ns": p.issued_ns, "warmup": list(p.warmup)}}
            out["ack"] = falcon.ack(p.version)
            out["cost"] = falcon.report_cost("S2", 1.25)
            out["plan_version"] = falcon.plan_version()
            print(json.dumps(out), flush=True)
            return 0
        time.sleep(0.05)
    print(json.dumps({"timeout": True}), flush=True)
    return 1


def phases():
    seen = [falcon.current_phase()]
    with falcon.phase("checkpoint"):
        seen.append(falcon.current_phase())
        with falcon.phase("eval"):
            seen.append(falcon.current_phase())
        seen.append(falcon.current_phase())
    seen.append(falcon.current_phase())
    try:
        with falcon.phase("nap"):
            pass
        seen.append("no error")
    except falcon.InvalidArgument:
        seen.append("InvalidArgument")
    print(json.dumps({"supported": falcon.phase_supported(), "seen": seen}), flush=True)
    # hold a phase long enough for the agent to see it, then finish
    with falcon.phase("checkpoint"):
        time.sleep(float(os.environ.get("FALCON_TEST_HOLD_S", "0")))
    return 0


def errors():
    out = {}
    for name, fn in (("ack0", lambda: falcon.ack(0)), ("cost_nan", lambda: falcon.report_cost("S2", float("nan"))),
                     ("cost_neg", lambda: falcon.report_cost("S3", -1.0)),
                     ("cost_bad_strategy", lambda: falcon.report_cost("S9", 1.0))):
        try:
            out[name] = fn()
        except falcon.InvalidArgument as e:
            out[name] = f"InvalidArgument: {e}"
    out["plan_before_any"] = falcon.plan()
    out["available"] = falcon.available()
    out["api_version"] = falcon.api_version()
    print(json.dumps(out, default=str), flush=True)
    return 0


def hook(iters):
    import torch.distributed as dist
    import falcon.torch as ft
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    h = ft.PlanHook(dp_rank=dist.get_rank(), micro_batches=4, every=1)
    ready = os.environ.get("FALCON_TEST_READY_FILE")
    for it in range(iters):
        if it == 2 and ready and dist.get_rank() == 0:
            open(ready, "w").close()  # the parent may send the plan now
        h.at_boundary(it)
        time.sleep(0.05)  # "train"
        if h.applied and it >= h.applied[-1][0] + 3:
            break
    print(json.dumps({"enabled": h.enabled, "applied": h.applied, "micro_batches": h.micro_batches,
                      "gradient_weight": h.gradient_weight, "rank": dist.get_rank()}), flush=True)
    dist.destroy_process_group()
    return 0


def early_phase():
    """A phase entered before the process's first NCCL call, held across it."""
    cm = falcon.phase("eval")
    cm.__enter__()
    make_comm()
    print(json.dumps({"phase": falcon.current_phase()}), flush=True)
    time.sleep(float(os.environ.get("FALCON_TEST_HOLD_S", "0")))
    cm.__exit__(None, None, None)
    return 0


def main():
    what = sys.argv[1]
    if what == "early-phase":
        return early_phase()
    if what != "errors-no-comm":
        make_comm()
    if what == "wait-plan":
        return wait_plan(int(sys.argv[2]))
    if what == "phases":
        return phases()
    if what in ("errors", "errors-no-comm"):
        return errors()
    if what == "hook":
        return hook(int(sys.argv[2]))
    return 2


if __name__ == "__main__":
    sys.exit(main())
