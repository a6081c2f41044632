// The exported NCCL API, part 2: communicator life cycle, registration, reduction operators,
// queries and memory. See nccl_wrappers.cc for the contract every wrapper follows.
//
// Communicator identity (shm_abi.h, FalconCommEntry): InitRank* hash the unique id(s); Split and
// Shrink hash (parent id, n-th child of the parent, color / excluded set); InitAll hashes
// (host, pid, n-th InitAll, ndev) since all its members live in this process.
#include <unistd.h>

#include <atomic>

#include "shim/wrapper_util.h"

using falcon::shim::CallDesc;
using falcon::shim::CallOutcome;
using falcon::shim::Fnv1a;
using falcon::shim::Intercept;
using falcon::shim::OnComm;

namespace {
std::atomic<uint32_t> g_init_all_calls{0};
const char kMissingString[] = "falcon: this NCCL library lacks the function";
}  // namespace

extern "C" {

// ---- Communicator creation ------------------------------------------------------------------

FALCON_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  FALCON_REAL_OR_FAIL(ncclGetUniqueId, kFalconOpGetUniqueId);
  return Intercept(CallDesc{kFalconOpGetUniqueId}, [&] { return real(uniqueId); });
}

FALCON_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  FALCON_REAL_OR_FAIL(ncclCommInitRank, kFalconOpCommInitRank);
  CallDesc d = OnComm(kFalconOpCommInitRank, nullptr, static_cast<uint64_t>(nranks));
  d.peer = rank;
  return Intercept(d, [&] { return real(comm, nranks, commId, rank); },
                   [&](ncclResult_t r, CallOutcome& out) {
                     falcon::shim::RegisterInit(r, comm, Fnv1a(&commId, sizeof(commId)), kFalconCommByInitRank,
                                                nranks, rank, nullptr, out);
                   });
}

FALCON_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                  ncclConfig_t* config) {
  FALCON_REAL_OR_FAIL(ncclCommInitRankConfig, kFalconOpCommInitRankConfig);
  CallDesc d = OnComm(kFalconOpCommInitRankConfig, nullptr, static_cast<uint64_t>(nranks));
  d.peer = rank;
  return Intercept(d, [&] { return real(comm, nranks, commId, rank, config); },
                   [&](ncclResult_t r, CallOutcome& out) {
                     falcon::shim::RegisterInit(r, comm, Fnv1a(&commId, sizeof(commId)),
                                                kFalconCommByInitRankConfig, nranks, rank, config, out);
                   });
}

FALCON_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                    ncclUniqueId* commIds, ncclConfig_t* config) {
  FALCON_REAL_OR_FAIL(ncclCommInitRankScalable, kFalconOpCommInitRankScalable);
  CallDesc d = OnComm(kFalconOpCommInitRankScalable, nullptr, static_cast<uint64_t>(nranks));
  d.peer = myrank;
  return Intercept(d, [&] { return real(newcomm, nranks, myrank, nId, commIds, config); },
                   [&](ncclResult_t r, CallOutcome& out) {
                     uint64_t id = falcon::shim::kFnvOffset;
                     for (int i = 0; commIds != nullptr && i < nId; ++i) id = Fnv1a(&commIds[i], sizeof(ncclUniqueId), id);
                     falcon::shim::RegisterInit(r, newcomm, id, kFalconCommByInitRankScalable, nranks, myrank, config,
                                                out);
                   });
}

FALCON_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  FALCON_REAL_OR_FAIL(ncclCommInitAll, kFalconOpCommInitAll);
  CallDesc d = OnComm(kFalconOpCommInitAll, nullptr, static_cast<uint64_t>(ndev));
  return Intercept(d, [&] { return real(comm, ndev, devlist); }, [&](ncclResult_t r, CallOutcome& out) {
    if (r != ncclSuccess || comm == nullptr || ndev <= 0) return;
    struct {
      char host[64];
      int32_t pid;
      uint32_t call;
      int32_t ndev;
    } key{};
    gethostname(key.host, sizeof(key.host) - 1);
    key.pid = static_cast<int32_t>(getpid());
    key.call = g_init_all_calls.fetch_add(1, std::memory_order_relaxed);
    key.ndev = ndev;
    const uint64_t id = Fnv1a(&key, sizeof(key));
    for (int i = 0; i < ndev; ++i) {
      if (comm[i] == nullptr) continue;
      falcon::shim::CommIdentity ident;
      ident.comm_id = id;
      ident.origin = kFalconCommByInitAll;
      ident.rank = i;
      ident.nranks = ndev;
      ident.device = devlist != nullptr ? devlist[i] : i;
      uint32_t slot = falcon::shim::g_tracer.comms().Register(comm[i], ident);
      if (i == 0) out.comm_slot = slot;
    }
  });
}

FALCON_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                         ncclConfig_t* config) {
  FALCON_REAL_OR_FAIL(ncclCommSplit, kFalconOpCommSplit);
  CallDesc d = OnComm(kFalconOpCommSplit, comm, static_cast<uint64_t>(static_cast<uint32_t>(key)));
  d.peer = color;
  return Intercept(d, [&] { return real(comm, color, key, newcomm, config); },
                   [&](ncclResult_t r, CallOutcome& out) {
                     falcon::shim::RegisterChild(r, comm, newcomm, kFalconCommBySplit, color,
                                                 static_cast<uint64_t>(static_cast<uint32_t>(color)), config, out);
                   });
}

FALCON_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                          ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  FALCON_REAL_OR_FAIL(ncclCommShrink, kFalconOpCommShrink);
  CallDesc d = OnComm(kFalconOpCommShrink, comm, static_cast<uint64_t>(excludeRanksCount < 0 ? 0 : excludeRanksCount));
  return Intercept(d, [&] { return real(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags); },
                   [&](ncclResult_t r, CallOutcome& out) {
                     falcon::shim::RegisterChild(r, comm, newcomm, kFalconCommByShrink, excludeRanksCount,
                                                 falcon::shim::HashRankSet(excludeRanksList, excludeRanksCount),
                                                 config, out);
                   });
}

// ---- Communicator teardown ------------------------------------------------------------------

FALCON_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  FALCON_REAL_OR_FAIL(ncclCommFinalize, kFalconOpCommFinalize);
  return Intercept(OnComm(kFalconOpCommFinalize, comm), [&] { return real(comm); });
}

FALCON_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  FALCON_REAL_OR_FAIL(ncclCommDestroy, kFalconOpCommDestroy);
  return Intercept(OnComm(kFalconOpCommDestroy, comm), [&] { return real(comm); },
                   [&](ncclResult_t r, CallOutcome&) {
                     if (r == ncclSuccess && comm != nullptr) falcon::shim::g_tracer.comms().Forget(comm);
                   });
}

FALCON_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  FALCON_REAL_OR_FAIL(ncclCommAbort, kFalconOpCommAbort);
  return Intercept(OnComm(kFalconOpCommAbort, comm), [&] { return real(comm); },
                   [&](ncclResult_t r, CallOutcome&) {
                     if (r == ncclSuccess && comm != nullptr) falcon::shim::g_tracer.comms().Forget(comm);
                   });
}

FALCON_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  FALCON_REAL_OR_FAIL(ncclCommRevoke, kFalconOpCommRevoke);
  CallDesc d = OnComm(kFalconOpCommRevoke, comm, static_cast<uint64_t>(static_cast<uint32_t>(revokeFlags)));
  return Intercept(d, [&] { return real(comm, revokeFlags); });
}

// ---- Registration and reduction operators ---------------------------------------------------

FALCON_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  FALCON_REAL_OR_FAIL(ncclCommRegister, kFalconOpCommRegister);
  return Intercept(OnComm(kFalconOpCommRegister, comm, size), [&] { return real(comm, buff, size, handle); });
}

FALCON_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  FALCON_REAL_OR_FAIL(ncclCommDeregister, kFalconOpCommDeregister);
  return Intercept(OnComm(kFalconOpCommDeregister, comm), [&] { return real(comm, handle); });
}

FALCON_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                                  int winFlags) {
  FALCON_REAL_OR_FAIL(ncclCommWindowRegister, kFalconOpCommWindowRegister);
  CallDesc d = OnComm(kFalconOpCommWindowRegister, comm, size);
  d.peer = winFlags;
  return Intercept(d, [&] { return real(comm, buff, size, win, winFlags); });
}

FALCON_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  FALCON_REAL_OR_FAIL(ncclCommWindowDeregister, kFalconOpCommWindowDeregister);
  return Intercept(OnComm(kFalconOpCommWindowDeregister, comm), [&] { return real(comm, win); });
}

FALCON_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                    ncclScalarResidence_t residence, ncclComm_t comm) {
  FALCON_REAL_OR_FAIL(ncclRedOpCreatePreMulSum, kFalconOpRedOpCreatePreMulSum);
  CallDesc d = OnComm(kFalconOpRedOpCreatePreMulSum, comm);
  d.dtype = static_cast<int32_t>(datatype);
  d.peer = static_cast<int32_t>(residence);
  return Intercept(d, [&] { return real(op, scalar, datatype, residence, comm); },
                   [&](ncclResult_t r, CallOutcome& out) {
                     if (r == ncclSuccess && op != nullptr) out.aux = static_cast<uint64_t>(static_cast<uint32_t>(*op));
                   });
}

FALCON_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  FALCON_REAL_OR_FAIL(ncclRedOpDestroy, kFalconOpRedOpDestroy);
  CallDesc d = OnComm(kFalconOpRedOpDestroy, comm);
  d.redop = op;
  return Intercept(d, [&] { return real(op, comm); });
}

// ---- Queries --------------------------------------------------------------------------------

FALCON_EXPORT ncclResult_t ncclGetVersion(int* version) {
  FALCON_REAL_OR_FAIL(ncclGetVersion, kFalconOpGetVersion);
  return Intercept(CallDesc{kFalconOpGetVersion}, [&] { return real(version); });
}

FALCON_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  auto real = falcon::shim::Real<decltype(&pncclGetErrorString)>(kFalconOpGetErrorString);
  if (real == nullptr) return kMissingString;
  CallDesc d{kFalconOpGetErrorString};
  d.count = static_cast<uint64_t>(result);
  return Intercept(d, [&] { return real(result); });
}

FALCON_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  auto real = falcon::shim::Real<decltype(&pncclGetLastError)>(kFalconOpGetLastError);
  if (real == nullptr) return kMissingString;
  return Intercept(OnComm(kFalconOpGetLastError, comm), [&] { return real(comm); });
}

FALCON_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  FALCON_REAL_OR_FAIL(ncclCommGetAsyncError, kFalconOpCommGetAsyncError);
  return Intercept(OnComm(kFalconOpCommGetAsyncError, comm), [&] { return real(comm, asyncError); },
                   [&](ncclResult_t r, CallOutcome&) {
                     // The caller saw a nonblocking communicator become ready: now its rank,
                     // size and device may be asked for.
                     if (r == ncclSuccess && asyncError != nullptr && *asyncError != ncclInProgress &&
                         comm != nullptr && falcon::shim::g_tracer.comms().Pending(comm)) {
                       falcon::shim::CompleteIdentity(comm);
                     }
                   });
}

FALCON_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  FALCON_REAL_OR_FAIL(ncclCommCount, kFalconOpCommCount);
  return Intercept(OnComm(kFalconOpCommCount, comm), [&] { return real(comm, count); });
}

FALCON_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  FALCON_REAL_OR_FAIL(ncclCommCuDevice, kFalconOpCommCuDevice);
  return Intercept(OnComm(kFalconOpCommCuDevice, comm), [&] { return real(comm, device); });
}

FALCON_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  FALCON_REAL_OR_FAIL(ncclCommUserRank, kFalconOpCommUserRank);
  return Intercept(OnComm(kFalconOpCommUserRank, comm), [&] { return real(comm, rank); });
}

// ---- Memory ---------------------------------------------------------------------------------

FALCON_EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  FALCON_REAL_OR_FAIL(ncclMemAlloc, kFalconOpMemAlloc);
  CallDesc d{kFalconOpMemAlloc};
  d.count = size;
  return Intercept(d, [&] { return real(ptr, size); });
}

FALCON_EXPORT ncclResult_t ncclMemFree(void* ptr) {
  FALCON_REAL_OR_FAIL(ncclMemFree, kFalconOpMemFree);
  return Intercept(CallDesc{kFalconOpMemFree}, [&] { return real(ptr); });
}

}  // extern "C"
