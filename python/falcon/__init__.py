"""Falcon for training frameworks: the mitigation plan, acknowledgements, measured costs and
phase annotations, through the C API of the LD_PRELOADed shim (include/falcon/falcon.h).

    import falcon
    if falcon.available():                 # the shim is preloaded into this process
        p = falcon.plan()                  # None, or a Plan snapshot
        if p and p.strategy == "S2":
            ...                            # apply p.micro_batches at an iteration boundary
            falcon.ack(p.version)
    with falcon.phase("checkpoint"):       # planned pauses are never taken for fail-slows or hangs
        save_checkpoint()

Everything here is pure Python over ctypes and has no third-party dependency; `falcon.torch`
(and its Lightning, Hugging Face and Megatron-LM adapters) needs PyTorch. Without the shim every
call is a cheap no-op: available() is False, plan() is None, ack() and report_cost() return
False, phase() does nothing. Errors the C API reports become exceptions (InvalidArgument for a
bad argument) or None (no plan yet); a plan that keeps changing while it is read is PlanBusy,
which a caller at an iteration boundary simply retries at the next one.

Thread-safety: every function may be called from any thread; phase() nests per process (the
innermost phase is in force), which is what a training loop that checkpoints from one thread
needs.
"""
import contextlib
import ctypes
import threading
from dataclasses import dataclass, field
from typing import Optional, Tuple

from . import _capi

__all__ = ["available", "api_version", "plan", "plan_version", "ack", "report_cost", "phase",
           "current_phase", "phase_supported", "Plan", "FalconError", "InvalidArgument", "PlanBusy",
           "PHASES", "STRATEGIES"]

STRATEGIES = {0: None, 1: "S1", 2: "S2", 3: "S3", 4: "S4", 5: "pipeline"}
_STRATEGY_CODES = {"S1": 1, "S2": 2, "S3": 3, "S4": 4, "pipeline": 5}
# Phase codes of falconSetPhase (falcon.h): training is the default, the others are planned
# pauses the detector must not take for a fail-slow or a hang.
PHASES = {"train": 0, "checkpoint": 1, "eval": 2, "dataload": 3, "other": 4}
_PHASE_NAMES = {v: k for k, v in PHASES.items()}
_MAX_ENTRIES = 16384  # the largest plan part (placement); falcon.h capacities


class FalconError(RuntimeError):
    """The shim's C API refused a request."""


class InvalidArgument(FalconError, ValueError):
    """A bad argument (version 0, a negative or non-finite cost, an unknown strategy or phase)."""


class PlanBusy(FalconError):
    """The plan kept changing while it was read: try again at the next iteration boundary."""


@dataclass(frozen=True)
class Plan:
    """One consistent snapshot of the mitigation plan in force."""
    version: int
    strategy: Optional[str]           # S1 (undo S2) | S2 | S3 | S4 | pipeline | None
    micro_batches: Tuple[int, ...] = ()   # S2: per DP replica (indexed by DP rank)
    placement: Tuple[int, ...] = ()       # S3/S4: node index of every global rank
    excluded_nodes: Tuple[int, ...] = ()  # S4
    restart: bool = False                 # S4: restart from the last checkpoint
    warmup: Tuple[int, ...] = ()          # pipeline: warm-up forwards per stage
    issued_ns: int = 0                    # when the agent delivered it, CLOCK_REALTIME ns
    extra: dict = field(default_factory=dict, compare=False)


_api = None
_api_lock = threading.Lock()


def _lib():
    global _api
    if _api is None:
        with _api_lock:
            if _api is None:
                _api = _capi.CApi()
    return _api


def _reset_for_tests(handle=None):
    """Re-resolve the C API (tests load the shim with ctypes.CDLL and pass its handle)."""
    global _api
    with _api_lock:
        _api = _capi.CApi(handle)


def available() -> bool:
    """True when the Falcon shim is preloaded into this process."""
    return _lib().lib is not None


def api_version() -> Optional[int]:
    """The shim's C API version (falcon.h FALCON_API_VERSION: 3 has phases, 4 pipeline plans), None without the shim."""
    api = _lib()
    return int(api.falconApiVersion()) if api.lib is not None else None


def plan_version() -> int:
    """The version of the plan in force; 0 when there is none (or no shim). One load: cheap
    enough to call at every iteration boundary."""
    api = _lib()
    return int(api.falconPlanVersion()) if api.lib is not None else 0


def _check(rc, what):
    if rc == _capi.ERR_INVALID:
        raise InvalidArgument(f"{what}: invalid argument")
    if rc == _capi.ERR_BUSY:
        raise PlanBusy(f"{what}: the plan changed while it was read")
    return rc


def _entries(fn, count, version):
    """A plan part of `count` entries, checked to belong to plan `version`."""
    if count <= 0:
        return ()
    n = min(count, _MAX_ENTRIES)
    buf = (ctypes.c_int32 * n)()
    got_version = ctypes.c_uint32()
    rc = _check(fn(buf, n, ctypes.byref(got_version)), fn.__name__)
    if rc == _capi.ERR_NO_PLAN:
        return None
    if got_version.value != version:  # a newer plan arrived between the two reads
        raise PlanBusy("the plan changed while it was read")
    return tuple(buf[:min(rc, n)])


def plan() -> Optional[Plan]:
    """The plan in force as a Plan, or None when no plan has arrived (or there is no shim).
    Raises PlanBusy when the agent kept rewriting it while it was read."""
    api = _lib()
    if api.lib is None:
        return None
    info = _capi.PlanInfo()
    rc = _check(api.falconGetPlan(ctypes.byref(info)), "falconGetPlan")
    if rc == _capi.ERR_NO_PLAN or info.version == 0:
        return None
    v = info.version
    parts = {}
    for key, fn, count in (("micro_batches", api.falconGetMicroBatchPlan, info.micro_batch_count),
                           ("placement", api.falconGetPlacementPlan, info.placement_count),
                           ("excluded_nodes", api.falconGetExcludedNodes, info.exclude_count)):
        got = _entries(fn, count, v)
        if got is None:
            return None
        parts[key] = got
    if api.has("falconGetPipelinePlan"):
        size = api.falconGetPipelinePlan(None, 0, None)
        if size > 0:
            got = _entries(api.falconGetPipelinePlan, size, v)
            parts["warmup"] = got or ()
    return Plan(version=v, strategy=STRATEGIES.get(info.strategy, f"unknown({info.strategy})"),
                restart=bool(info.restart), issued_ns=int(info.issued_real_ns), **parts)


def ack(version: int, ok: bool = True, status: Optional[int] = None) -> bool:
    """Tell the controller that this rank applied (ok=True) or rejected plan `version`; `status`
    overrides with a framework's own non-zero code. False without the shim (or before the
    process's first NCCL call, when there is no shared memory yet)."""
    if version <= 0 or version > 0xFFFFFFFF:
        raise InvalidArgument(f"plan version {version} out of range")
    api = _lib()
    if api.lib is None:
        return False
    code = (0 if ok else 1) if status is None else int(status)
    rc = _check(api.falconAckPlan(version, code), "falconAckPlan")
    return rc == _capi.OK


def report_cost(strategy: str, seconds: float) -> bool:
    """What applying `strategy` ("S2", "S3", "S4") costs this rank, in seconds of lost training;
    the controller's ski-rental rule uses the slowest rank's figure. False without the shim or
    with a shim too old for it (C API < 2)."""
    api = _lib()
    if strategy not in ("S2", "S3", "S4", "pipeline"):
        raise InvalidArgument(f"strategy {strategy!r}: one of S2, S3, S4, pipeline")
    if not (seconds >= 0 and seconds < 49 * 86400):  # NaN fails both
        raise InvalidArgument(f"cost {seconds!r} s: finite, >= 0 and below 49 days")
    if api.lib is None or not api.has("falconReportCost"):
        return False
    rc = _check(api.falconReportCost(_STRATEGY_CODES[strategy], float(seconds)), "falconReportCost")
    return rc == _capi.OK


def phase_supported() -> bool:
    """True when the preloaded shim takes phase annotations (C API >= 3)."""
    api = _lib()
    return api.lib is not None and api.has("falconSetPhase")


def current_phase() -> str:
    """The phase the shim holds for this process ('train' without the shim)."""
    api = _lib()
    if not phase_supported():
        return "train"
    return _PHASE_NAMES.get(int(api.falconGetPhase()), "other")


_phase_lock = threading.Lock()
_phase_stack = []


@contextlib.contextmanager
def phase(name: str):
    """Annotate a planned pause: `with falcon.phase("checkpoint"): save()`. The agent neither
    takes the slower iterations inside for a fail-slow nor the silence for a hang. Phases nest;
    leaving restores the enclosing one (training by default). A no-op without the shim."""
    if name not in PHASES:
        raise InvalidArgument(f"phase {name!r}: one of {', '.join(PHASES)}")
    api = _lib()
    if not phase_supported():
        yield
        return
    with _phase_lock:
        _phase_stack.append(name)
        _check(api.falconSetPhase(PHASES[name]), "falconSetPhase")
    try:
        yield
    finally:
        with _phase_lock:
            _phase_stack.pop()
            api.falconSetPhase(PHASES[_phase_stack[-1]] if _phase_stack else 0)
