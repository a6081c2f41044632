// Exported NCCL entry points for communicator management and queries (init, split, shrink,
// finalize/destroy/abort/revoke, errors, registration, memory, version), plus the falconEmu*
// extras of falcon_emu.h (placement: job_state.h).
//
// ncclUniqueId layout (128 bytes): [0,8) magic "FALCEMU1", [8,16) random 64-bit key from
// getrandom(2), [16,20) creator uid, [20,24) creator pid, rest zero. The key names the
// rendezvous segment (shm_segment.h).
//
// Blocking and nonblocking communicators: ncclConfig_t.blocking = 0 makes a communicator
// nonblocking (split/shrink children inherit the parent's setting unless their config names
// one). Its init, and every later group on it, runs in the background (engine.h) and returns
// ncclInProgress; until ncclCommGetAsyncError reports ncclSuccess, queries and operations fail
// with ncclInvalidArgument after NCCL's WARN line (comm.h EnsureReady).
//
// Thread-safety: as NCCL (one thread per communicator), except that ncclCommAbort and
// ncclCommGetAsyncError may be called from any thread at any time: Abort drops the handle and
// flags the communicator; a call blocked on it in another thread returns ncclInternalError and
// frees it (comm.h invariant 1). The handle of a blocking init is published (a release store)
// before the call waits for the other members, so another thread may abort it, as in NCCL.
// Must never: throw across the C ABI, crash on a null or destroyed communicator (IsLiveComm
// guards every handle).
#include <sys/random.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <span>
#include <unordered_set>

#include "api_util.h"
#include "bench/nccl_error_string.h"
#include "device.h"
#include "emu_config.h"
#include "engine.h"
#include "falcon_emu.h"
#include "group.h"
#include "init_op.h"
#include "job_state.h"

struct ncclWindow_vidmem {
  uint64_t magic;
  void* buff;
  size_t size;
  ncclComm* comm;
};

namespace falcon::emu {
namespace {

constexpr uint64_t kIdMagic = 0x31554D45434C4146ull;  // "FALCEMU1" little-endian
constexpr uint64_t kWindowMagic = 0x57494E444F57454Dull;

struct Handles {
  std::mutex mu;
  std::unordered_set<void*> live;  // registration and window handles
};
Handles& Hs() {
  static auto* h = new Handles;
  return *h;
}

ncclResult_t ConfigError(const char* name) {
  if (Config().error.empty()) return ncclSuccess;
  return Fail(ncclInvalidArgument, nullptr, std::string(name) + ": bad emulator configuration: " + Config().error,
              Loud::kYes);
}

ncclResult_t CheckConfigStruct(const char* name, const ncclConfig_t* config) {
  if (config && (config->magic != 0xcafebeefu || config->size < offsetof(ncclConfig_t, blocking))) {
    return Fail(ncclInvalidArgument, nullptr, std::string(name) + ": config not initialised with NCCL_CONFIG_INITIALIZER");
  }
  return ncclSuccess;
}

// ncclConfig_t.blocking if the config sets it, else `inherited` (NCCL's default is blocking).
bool ConfigBlocking(const ncclConfig_t* config, bool inherited) {
  if (config == nullptr || config->size < offsetof(ncclConfig_t, blocking) + sizeof(config->blocking) ||
      config->blocking == NCCL_CONFIG_UNDEF_INT) {
    return inherited;
  }
  return config->blocking != 0;
}

// Marks a nonblocking communicator finalized once the jobs before it are done.
class FinalizeOp final : public Op {
 public:
  explicit FinalizeOp(ncclComm* c) : Op(c) {}

 protected:
  Progress Step(int64_t) override {
    comm_->finalized = true;
    return Progress::kDone;
  }
};

int DefaultDevice(int global) {
  if (Config().device) return *Config().device;
  if (Config().local_rank) return *Config().local_rank;
  return global % Config().ranks_per_node;
}

ncclResult_t InitRank(const char* name, ncclComm_t* out, int nranks, const ncclUniqueId* id, int rank,
                      const ncclConfig_t* config) {
  if (!out) return Fail(ncclInvalidArgument, nullptr, std::string(name) + ": comm pointer is null");
  // Every write of *out is a release store: another thread may poll it to abort (file comment).
  __atomic_store_n(out, static_cast<ncclComm*>(nullptr), __ATOMIC_RELEASE);
  ncclResult_t rc = ConfigError(name);
  if (rc == ncclSuccess) rc = CheckConfigStruct(name, config);
  if (rc != ncclSuccess) return rc;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return Fail(ncclInvalidArgument, nullptr, std::string(name) + ": invalid rank " + std::to_string(rank) +
                                                  " for nranks " + std::to_string(nranks));
  }
  uint64_t magic = 0, key = 0;
  std::memcpy(&magic, id->internal, 8);
  std::memcpy(&key, id->internal + 8, 8);
  if (magic != kIdMagic) {
    return Fail(ncclInvalidArgument, nullptr, std::string(name) + ": unique id was not made by ncclGetUniqueId");
  }
  int global = rank;
  if (Config().global_rank) {
    global = *Config().global_rank;
  } else {
    OfferProcessRank(rank);
    global = ProcessGlobalRank(rank);
  }
  ncclComm* c = NewComm(rank, nranks, key, DefaultDevice(global));
  c->blocking = ConfigBlocking(config, true);
  CommRef hold(c);  // an abort from another thread must not free it under us
  __atomic_store_n(out, c, __ATOMIC_RELEASE);
  const bool grouped = InGroup();
  rc = Submit(MakeInitOp(c, global));
  if (rc != ncclSuccess && rc != ncclInProgress && !grouped) {
    DeleteComm(c);  // no-op if another thread aborted it meanwhile
    __atomic_store_n(out, static_cast<ncclComm*>(nullptr), __ATOMIC_RELEASE);
  }
  return rc;
}

}  // namespace
}  // namespace falcon::emu

using namespace falcon::emu;  // NOLINT: entry points below are the C ABI of this module

FALCON_EMU_EXPORT ncclResult_t pncclGetVersion(int* version) {
  if (!version) return Fail(ncclInvalidArgument, nullptr, "ncclGetVersion: null pointer");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

FALCON_EMU_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  return Guarded("ncclGetUniqueId", [&] {
    if (!uniqueId) return Fail(ncclInvalidArgument, nullptr, "ncclGetUniqueId: null pointer");
    uint64_t key = 0;
    if (getrandom(&key, sizeof key, 0) != static_cast<ssize_t>(sizeof key)) {
      return Fail(ncclSystemError, nullptr, "ncclGetUniqueId: getrandom failed");
    }
    std::memset(uniqueId->internal, 0, sizeof uniqueId->internal);
    const uint32_t uid = getuid();
    const int32_t pid = getpid();
    std::memcpy(uniqueId->internal, &kIdMagic, 8);
    std::memcpy(uniqueId->internal + 8, &key, 8);
    std::memcpy(uniqueId->internal + 16, &uid, 4);
    std::memcpy(uniqueId->internal + 20, &pid, 4);
    return ncclSuccess;
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                                       int rank, ncclConfig_t* config) {
  return Guarded("ncclCommInitRankConfig",
                 [&] { return InitRank("ncclCommInitRankConfig", comm, nranks, &commId, rank, config); });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return Guarded("ncclCommInitRank", [&] { return InitRank("ncclCommInitRank", comm, nranks, &commId, rank, nullptr); });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                         ncclUniqueId* commIds, ncclConfig_t* config) {
  return Guarded("ncclCommInitRankScalable", [&] {
    if (nId < 1 || !commIds) return Fail(ncclInvalidArgument, nullptr, "ncclCommInitRankScalable: need nId >= 1 ids");
    return InitRank("ncclCommInitRankScalable", newcomm, nranks, &commIds[0], myrank, config);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return Guarded("ncclCommInitAll", [&] {
    if (!comms || ndev < 1) return Fail(ncclInvalidArgument, nullptr, "ncclCommInitAll: need comms and ndev >= 1");
    ncclResult_t rc = ConfigError("ncclCommInitAll");
    if (rc != ncclSuccess) return rc;
    ncclUniqueId id;
    rc = pncclGetUniqueId(&id);
    if (rc != ncclSuccess) return rc;
    uint64_t key = 0;
    std::memcpy(&key, id.internal + 8, 8);
    std::vector<std::unique_ptr<Op>> ops;
    for (int i = 0; i < ndev; ++i) {
      comms[i] = NewComm(i, ndev, key, devlist ? devlist[i] : i);
      ops.push_back(MakeInitOp(comms[i], i));
    }
    rc = RunOps(ops);
    if (rc != ncclSuccess) {
      for (int i = 0; i < ndev; ++i) {
        DeleteComm(comms[i]);
        comms[i] = nullptr;
      }
    }
    return rc;
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  return Guarded("ncclCommFinalize", [&] {
    if (!IsLiveComm(comm)) return Fail(ncclInvalidArgument, nullptr, "ncclCommFinalize: invalid communicator");
    const ncclResult_t rc = EnsureReady(comm, "ncclCommFinalize");
    if (rc != ncclSuccess) return rc;
    if (comm->revoked) return Fail(ncclInvalidUsage, comm, "ncclCommFinalize: communicator was revoked");
    if (!comm->blocking) {
      std::vector<std::unique_ptr<Op>> ops;
      ops.push_back(std::make_unique<FinalizeOp>(comm));
      return RunInBackground(std::move(ops));  // ncclInProgress, as NCCL's nonblocking finalize
    }
    SyncCommDevice(comm);  // a blocking finalize flushes the communicator's queued work
    comm->finalized = true;
    return ncclSuccess;
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  return Guarded("ncclCommDestroy", [&] {
    if (!IsLiveComm(comm)) return Fail(ncclInvalidArgument, nullptr, "ncclCommDestroy: invalid communicator");
    if (GroupHasOpsOn(comm)) {
      return Fail(ncclInvalidUsage, comm, "ncclCommDestroy: operations on this communicator are queued in an open group");
    }
    if (comm->inflight.load(std::memory_order_acquire) > 0) {
      return Fail(ncclInvalidUsage, comm, "ncclCommDestroy: a nonblocking operation is in progress; poll "
                                          "ncclCommGetAsyncError until it ends, or ncclCommAbort");
    }
    SyncCommDevice(comm);  // destroy finalizes first: the queued work completes
    DeleteComm(comm);
    return ncclSuccess;
  });
}

// Callable from any thread, also while another thread is blocked in a call on `comm` or a
// background job drives it: those fail with ncclInternalError within one engine sweep, and the
// last of them frees the communicator and marks this rank gone for its peers (comm.h).
FALCON_EMU_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
  return Guarded("ncclCommAbort", [&] {
    if (comm == nullptr || !Unregister(comm)) {
      return Fail(ncclInvalidArgument, nullptr, "ncclCommAbort: invalid communicator");
    }
    comm->aborted.store(true, std::memory_order_release);
    Release(comm);  // the handle's reference
    return ncclSuccess;
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return Guarded("ncclCommRevoke", [&] {
    if (!IsLiveComm(comm)) return Fail(ncclInvalidArgument, nullptr, "ncclCommRevoke: invalid communicator");
    if (revokeFlags != NCCL_REVOKE_DEFAULT) return Fail(ncclInvalidArgument, comm, "ncclCommRevoke: revokeFlags must be 0");
    comm->revoked = true;  // nothing is in flight outside GroupEnd, so it is quiescent at once
    return ncclSuccess;
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                              ncclConfig_t* config) {
  return Guarded("ncclCommSplit", [&] {
    ncclResult_t rc = CheckUsable(comm, "ncclCommSplit");
    if (rc == ncclSuccess) rc = CheckConfigStruct("ncclCommSplit", config);
    if (rc == ncclSuccess && !newcomm) rc = Fail(ncclInvalidArgument, comm, "ncclCommSplit: newcomm is null");
    if (rc == ncclSuccess && color < 0 && color != NCCL_SPLIT_NOCOLOR) {
      rc = Fail(ncclInvalidArgument, comm, "ncclCommSplit: color must be >= 0 or NCCL_SPLIT_NOCOLOR");
    }
    if (rc != ncclSuccess) {
      NoteGroupError(rc);
      return rc;
    }
    *newcomm = nullptr;
    const bool grouped = InGroup();
    rc = Submit(MakeSplitOp(comm, color, key, ConfigBlocking(config, comm->blocking), newcomm));
    if (rc != ncclSuccess && rc != ncclInProgress && !grouped && *newcomm) {
      DeleteComm(*newcomm);
      *newcomm = nullptr;
    }
    return rc;
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                               ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  return Guarded("ncclCommShrink", [&] {
    ncclResult_t rc = CheckUsable(comm, "ncclCommShrink");
    if (rc == ncclSuccess) rc = CheckConfigStruct("ncclCommShrink", config);
    if (rc != ncclSuccess) return rc;
    if (!newcomm) return Fail(ncclInvalidArgument, comm, "ncclCommShrink: newcomm is null");
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT) {
      return Fail(ncclInvalidArgument, comm, "ncclCommShrink: invalid shrinkFlags");
    }
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList) || excludeRanksCount >= comm->nranks) {
      return Fail(ncclInvalidArgument, comm, "ncclCommShrink: invalid excludeRanksList/excludeRanksCount");
    }
    std::vector<int> exclude(excludeRanksList, excludeRanksList + excludeRanksCount);
    std::unordered_set<int> seen;
    for (int r : exclude) {
      if (r < 0 || r >= comm->nranks || !seen.insert(r).second) {
        return Fail(ncclInvalidArgument, comm, "ncclCommShrink: excluded rank " + std::to_string(r) +
                                                   " is out of range or repeated");
      }
      if (r == comm->rank) {
        return Fail(ncclInvalidArgument, comm, "ncclCommShrink: rank " + std::to_string(r) +
                                                   " is excluded; excluded ranks must not call ncclCommShrink");
      }
    }
    *newcomm = nullptr;
    const bool grouped = InGroup();
    rc = Submit(MakeShrinkOp(comm, std::move(exclude), ConfigBlocking(config, comm->blocking), newcomm));
    if (rc != ncclSuccess && rc != ncclInProgress && !grouped && *newcomm) {
      DeleteComm(*newcomm);
      *newcomm = nullptr;
    }
    return rc;
  });
}

FALCON_EMU_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  return falcon::bench::NcclErrorString(result);
}

FALCON_EMU_EXPORT const char* pncclGetLastError(ncclComm_t comm) {
  try {
    return LastErrorText(comm);
  } catch (...) {
    return "";  // Not swallowed: only allocation can fail here and the text is advisory.
  }
}

FALCON_EMU_EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!IsLiveComm(comm) || !asyncError) return Fail(ncclInvalidArgument, nullptr, "ncclCommGetAsyncError: invalid argument");
  *asyncError = AsyncState(comm);
  return ncclSuccess;
}

FALCON_EMU_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  if (!IsLiveComm(comm) || !count) return Fail(ncclInvalidArgument, nullptr, "ncclCommCount: invalid argument");
  const ncclResult_t rc = EnsureReady(comm, "ncclCommCount");
  if (rc != ncclSuccess) return rc;
  *count = comm->nranks;
  return ncclSuccess;
}

FALCON_EMU_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!IsLiveComm(comm) || !device) return Fail(ncclInvalidArgument, nullptr, "ncclCommCuDevice: invalid argument");
  const ncclResult_t rc = EnsureReady(comm, "ncclCommCuDevice");
  if (rc != ncclSuccess) return rc;
  *device = comm->device;
  return ncclSuccess;
}

FALCON_EMU_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!IsLiveComm(comm) || !rank) return Fail(ncclInvalidArgument, nullptr, "ncclCommUserRank: invalid argument");
  const ncclResult_t rc = EnsureReady(comm, "ncclCommUserRank");
  if (rc != ncclSuccess) return rc;
  *rank = comm->rank;
  return ncclSuccess;
}

FALCON_EMU_EXPORT ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return Guarded("ncclCommRegister", [&] {
    if (!IsLiveComm(comm) || !handle) return Fail(ncclInvalidArgument, nullptr, "ncclCommRegister: invalid argument");
    auto* w = new ncclWindow_vidmem{kWindowMagic, buff, size, comm};
    std::lock_guard<std::mutex> lock(Hs().mu);
    Hs().live.insert(w);
    *handle = w;
    return ncclSuccess;
  });
}

static ncclResult_t DropHandle(const char* name, ncclComm_t comm, void* handle) {
  if (!IsLiveComm(comm)) return Fail(ncclInvalidArgument, nullptr, std::string(name) + ": invalid communicator");
  {
    std::lock_guard<std::mutex> lock(Hs().mu);
    if (!handle || Hs().live.erase(handle) == 0) {
      return Fail(ncclInvalidArgument, comm, std::string(name) + ": unknown handle");
    }
  }
  delete static_cast<ncclWindow_vidmem*>(handle);
  return ncclSuccess;
}

FALCON_EMU_EXPORT ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  return Guarded("ncclCommDeregister", [&] { return DropHandle("ncclCommDeregister", comm, handle); });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                                       int) {
  return Guarded("ncclCommWindowRegister", [&] {
    if (!IsLiveComm(comm) || !win) return Fail(ncclInvalidArgument, nullptr, "ncclCommWindowRegister: invalid argument");
    auto* w = new ncclWindow_vidmem{kWindowMagic, buff, size, comm};
    std::lock_guard<std::mutex> lock(Hs().mu);
    Hs().live.insert(w);
    *win = w;
    return ncclSuccess;
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return Guarded("ncclCommWindowDeregister", [&] { return DropHandle("ncclCommWindowDeregister", comm, win); });
}

FALCON_EMU_EXPORT ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  return Guarded("ncclMemAlloc", [&] {
    if (!ptr) return Fail(ncclInvalidArgument, nullptr, "ncclMemAlloc: null pointer");
    const size_t rounded = ((size == 0 ? 1 : size) + 4095) & ~size_t{4095};
    *ptr = std::aligned_alloc(4096, rounded);
    if (!*ptr) return Fail(ncclSystemError, nullptr, "ncclMemAlloc: out of memory");
    return ncclSuccess;
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclMemFree(void* ptr) {
  std::free(ptr);
  return ncclSuccess;
}

// The falconEmu* extras never fail: on an internal error (only allocation can fail, in the
// job-state cache) they answer as if no placement override were in force.
FALCON_EMU_EXPORT double falconEmuComputeFactor(int globalRank, double t_s) {
  if (!Config().error.empty()) return 1.0;
  try {
    const int physical = PhysicalRankOf(globalRank);
    return physical < 0 ? 1.0 : Config().plan.ComputeFactor(physical, t_s);
  } catch (const std::exception&) {
    return Config().plan.ComputeFactor(globalRank, t_s);
  }
}

FALCON_EMU_EXPORT double falconEmuGemmSeconds(int globalRank, double flops) {
  const EmuConfig& c = Config();
  if (!c.error.empty() || c.gpu_tflops <= 0 || !(flops >= 0)) return -1.0;
  const double t = EpochNs() == 0 ? 0.0 : JobSeconds(NowNs());
  return flops / (c.gpu_tflops * 1e12) * falconEmuComputeFactor(globalRank, t) * c.fabric.time_scale;
}

FALCON_EMU_EXPORT double falconEmuJobSeconds(void) {
  return EpochNs() == 0 ? -1.0 : JobSeconds(NowNs());
}

FALCON_EMU_EXPORT int falconEmuNodeOf(int globalRank) {
  try {
    return CurrentNodeOf(globalRank);
  } catch (const std::exception&) {
    return Config().NodeOf(globalRank);
  }
}

FALCON_EMU_EXPORT int falconEmuLaunchNodeOf(int globalRank) { return Config().NodeOf(globalRank); }

FALCON_EMU_EXPORT int falconEmuSetPlacement(const int* node_of_rank, int n) {
  if (n < 0 || (n > 0 && node_of_rank == nullptr)) return static_cast<int>(SetPlacementResult::kInvalid);
  try {
    const SetPlacementResult r = SetJobPlacement(std::span<const int>(node_of_rank, static_cast<size_t>(n)));
    return static_cast<int>(r);
  } catch (const std::exception&) {
    return static_cast<int>(SetPlacementResult::kBusy);  // allocation failed: nothing was written
  }
}

FALCON_EMU_EXPORT double falconEmuTransferSeconds(int srcNode, int dstNode, double bytes) {
  const EmuConfig& c = Config();
  if (!c.error.empty() || srcNode < 0 || dstNode < 0 || !(bytes >= 0)) return -1.0;
  const double t = EpochNs() == 0 ? 0.0 : JobSeconds(NowNs());
  return ModelP2pSeconds(c.fabric, &c.plan, srcNode, dstNode, bytes, t);
}

FALCON_EMU_ALIAS(ncclResult_t, ncclGetVersion, (int*));
FALCON_EMU_ALIAS(ncclResult_t, ncclGetUniqueId, (ncclUniqueId*));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommInitRankConfig, (ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommInitRank, (ncclComm_t*, int, ncclUniqueId, int));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommInitRankScalable, (ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommInitAll, (ncclComm_t*, int, const int*));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommFinalize, (ncclComm_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommDestroy, (ncclComm_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommAbort, (ncclComm_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommRevoke, (ncclComm_t, int));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommSplit, (ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommShrink, (ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int));
FALCON_EMU_ALIAS(const char*, ncclGetErrorString, (ncclResult_t));
FALCON_EMU_ALIAS(const char*, ncclGetLastError, (ncclComm_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t, ncclResult_t*));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommCount, (const ncclComm_t, int*));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommCuDevice, (const ncclComm_t, int*));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommUserRank, (const ncclComm_t, int*));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommRegister, (const ncclComm_t, void*, size_t, void**));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommDeregister, (const ncclComm_t, void*));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommWindowRegister, (ncclComm_t, void*, size_t, ncclWindow_t*, int));
FALCON_EMU_ALIAS(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t, ncclWindow_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclMemAlloc, (void**, size_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclMemFree, (void*));
