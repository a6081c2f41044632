"""ctypes binding of the shim's C API (include/falcon/falcon.h). Internal: use `falcon`.

The functions are resolved from the running process (the LD_PRELOADed libfalcon_shim.so), never
loaded from disk: a process without the shim has no Falcon, and loading a second copy of the shim
would record nothing. Every function of falcon.h is non-blocking and lock-free, so calling them
from Python at an iteration boundary costs a few microseconds of ctypes overhead.
"""
import ctypes
import os

OK = 0
ERR_NO_PLAN = -1
ERR_INVALID = -2
ERR_BUSY = -3


class PlanInfo(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("strategy", ctypes.c_uint32),
        ("micro_batch_count", ctypes.c_uint32),
        ("placement_count", ctypes.c_uint32),
        ("exclude_count", ctypes.c_uint32),
        ("restart", ctypes.c_uint32),
        ("issued_real_ns", ctypes.c_int64),
    ]


_SIGNATURES = {
    # name: (restype, argtypes, required)
    "falconApiVersion": (ctypes.c_int, [], True),
    "falconPlanVersion": (ctypes.c_uint32, [], True),
    "falconGetPlan": (ctypes.c_int, [ctypes.POINTER(PlanInfo)], True),
    "falconGetMicroBatchPlan": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int32), ctypes.c_int,
                                               ctypes.POINTER(ctypes.c_uint32)], True),
    "falconGetPlacementPlan": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int32), ctypes.c_int,
                                              ctypes.POINTER(ctypes.c_uint32)], True),
    "falconGetExcludedNodes": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int32), ctypes.c_int,
                                              ctypes.POINTER(ctypes.c_uint32)], True),
    "falconAckPlan": (ctypes.c_int, [ctypes.c_uint32, ctypes.c_int], True),
    "falconReportCost": (ctypes.c_int, [ctypes.c_uint32, ctypes.c_double], False),  # API 2
    "falconGetPipelinePlan": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int32), ctypes.c_int,
                                             ctypes.POINTER(ctypes.c_uint32)], False),  # API 3
    "falconSetPhase": (ctypes.c_int, [ctypes.c_uint32], False),  # API 3
    "falconGetPhase": (ctypes.c_int, [], False),  # API 3
}


class CApi:
    """The shim's exports found in this process, or `lib is None` when there are none."""

    def __init__(self, handle=None):
        self.lib = None
        self.fn = {}
        if os.environ.get("FALCON_PY_DISABLE", "") == "1":
            return
        try:
            proc = handle if handle is not None else ctypes.CDLL(None)
        except OSError:
            return
        for name, (restype, argtypes, required) in _SIGNATURES.items():
            f = getattr(proc, name, None)
            if f is None:
                if required:  # not the shim (or a broken one): no Falcon at all
                    self.fn = {}
                    return
                continue
            f.restype, f.argtypes = restype, argtypes
            self.fn[name] = f
        self.lib = proc

    def has(self, name):
        return name in self.fn

    def __getattr__(self, name):
        try:
            return self.__dict__["fn"][name]
        except KeyError:
            raise AttributeError(name) from None
