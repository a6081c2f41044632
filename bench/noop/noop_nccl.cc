// A no-op NCCL: libnccl.so.2 whose every function returns at once. Test and benchmark fabric.
//
// Used where only the shim must be measured or exercised (per-call overhead, recording under
// many threads, pass-through checks), never where data must move (that is the emulator's job).
// Communicators are small heap objects carrying rank/nranks/device so identity queries work;
// arguments are validated the way NCCL does for null communicators and bad enums, so error
// codes can be compared with and without the shim. Like the real library, pncclBcast calls
// the public ncclBroadcast through the dynamic symbol table, so an interposer sees that
// internal call (the shim must not record it twice).
// Thread-safe: no shared mutable state except the atomic unique-id counter.
#include <dlfcn.h>
#include <nccl.h>

#include "bench/nccl_error_string.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#define NOOP_API extern "C" __attribute__((visibility("default")))
// Each pnccl function is the implementation; ncclX is a weak alias, as in NCCL itself.
#define NOOP_ALIAS(name) __attribute__((weak, alias("p" #name)))

struct ncclComm {
  int rank;
  int nranks;
  int device;
};

namespace {

std::atomic<unsigned long long> g_ids{1};

ncclResult_t CheckComm(const ncclComm* c) { return c == nullptr ? ncclInvalidArgument : ncclSuccess; }

ncclResult_t CheckColl(const ncclComm* c, ncclDataType_t dt) {
  if (c == nullptr) return ncclInvalidArgument;
  if (static_cast<int>(dt) < 0 || static_cast<int>(dt) >= ncclNumTypes) return ncclInvalidArgument;
  return ncclSuccess;
}

ncclResult_t CheckOp(ncclRedOp_t op) {
  return (static_cast<int>(op) < 0 || static_cast<int>(op) >= ncclNumOps) ? ncclInvalidArgument : ncclSuccess;
}

ncclResult_t NewComm(ncclComm_t* out, int nranks, int rank, int device) {
  if (out == nullptr || nranks <= 0 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  *out = new (std::nothrow) ncclComm{rank, nranks, device};
  return *out != nullptr ? ncclSuccess : ncclSystemError;
}

}  // namespace

NOOP_API ncclResult_t pncclGetVersion(int* v) {
  if (v == nullptr) return ncclInvalidArgument;
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id, 0, sizeof(*id));
  unsigned long long n = g_ids.fetch_add(1);
  std::memcpy(id->internal, &n, sizeof(n));
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclCommInitRank(ncclComm_t* c, int nranks, ncclUniqueId, int rank) {
  return NewComm(c, nranks, rank, 0);
}
NOOP_API ncclResult_t pncclCommInitRankConfig(ncclComm_t* c, int nranks, ncclUniqueId, int rank, ncclConfig_t*) {
  return NewComm(c, nranks, rank, 0);
}
NOOP_API ncclResult_t pncclCommInitRankScalable(ncclComm_t* c, int nranks, int rank, int, ncclUniqueId*,
                                                ncclConfig_t*) {
  return NewComm(c, nranks, rank, 0);
}
NOOP_API ncclResult_t pncclCommInitAll(ncclComm_t* c, int ndev, const int* devlist) {
  if (c == nullptr || ndev <= 0) return ncclInvalidArgument;
  for (int i = 0; i < ndev; ++i) {
    if (NewComm(&c[i], ndev, i, devlist != nullptr ? devlist[i] : i) != ncclSuccess) return ncclSystemError;
  }
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int, ncclComm_t* out, ncclConfig_t*) {
  if (comm == nullptr || out == nullptr) return ncclInvalidArgument;
  if (color == NCCL_SPLIT_NOCOLOR) {
    *out = nullptr;
    return ncclSuccess;
  }
  return NewComm(out, 1, 0, comm->device);
}
NOOP_API ncclResult_t pncclCommShrink(ncclComm_t comm, int*, int n, ncclComm_t* out, ncclConfig_t*, int) {
  if (comm == nullptr || out == nullptr || n < 0 || n >= comm->nranks) return ncclInvalidArgument;
  return NewComm(out, comm->nranks - n, 0, comm->device);
}
NOOP_API ncclResult_t pncclCommFinalize(ncclComm_t c) { return CheckComm(c); }
NOOP_API ncclResult_t pncclCommDestroy(ncclComm_t c) {
  if (c == nullptr) return ncclInvalidArgument;
  delete c;
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclCommAbort(ncclComm_t c) { return pncclCommDestroy(c); }
NOOP_API ncclResult_t pncclCommRevoke(ncclComm_t c, int flags) {
  return c == nullptr || flags != 0 ? ncclInvalidArgument : ncclSuccess;
}
NOOP_API const char* pncclGetErrorString(ncclResult_t r) {
  return falcon::bench::NcclErrorString(r);
}
NOOP_API const char* pncclGetLastError(ncclComm_t) { return ""; }
NOOP_API ncclResult_t pncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) {
  if (c == nullptr || e == nullptr) return ncclInvalidArgument;
  *e = ncclSuccess;
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclCommCount(const ncclComm_t c, int* n) {
  if (c == nullptr || n == nullptr) return ncclInvalidArgument;
  *n = c->nranks;
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclCommCuDevice(const ncclComm_t c, int* d) {
  if (c == nullptr || d == nullptr) return ncclInvalidArgument;
  *d = c->device;
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclCommUserRank(const ncclComm_t c, int* r) {
  if (c == nullptr || r == nullptr) return ncclInvalidArgument;
  *r = c->rank;
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclCommRegister(const ncclComm_t c, void*, size_t, void** h) {
  if (c == nullptr || h == nullptr) return ncclInvalidArgument;
  *h = c;
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclCommDeregister(const ncclComm_t c, void*) { return CheckComm(c); }
NOOP_API ncclResult_t pncclCommWindowRegister(ncclComm_t c, void*, size_t, ncclWindow_t* w, int) {
  if (c == nullptr || w == nullptr) return ncclInvalidArgument;
  *w = nullptr;
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclCommWindowDeregister(ncclComm_t c, ncclWindow_t) { return CheckComm(c); }
NOOP_API ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void*, ncclDataType_t, ncclScalarResidence_t,
                                                ncclComm_t c) {
  if (c == nullptr || op == nullptr) return ncclInvalidArgument;
  *op = static_cast<ncclRedOp_t>(ncclNumOps);
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclRedOpDestroy(ncclRedOp_t, ncclComm_t c) { return CheckComm(c); }
NOOP_API ncclResult_t pncclReduce(const void*, void*, size_t, ncclDataType_t dt, ncclRedOp_t op, int root,
                                  ncclComm_t c, cudaStream_t) {
  ncclResult_t r = CheckColl(c, dt);
  if (r == ncclSuccess && (root < 0 || root >= c->nranks)) r = ncclInvalidArgument;
  return r != ncclSuccess ? r : CheckOp(op);
}
NOOP_API ncclResult_t pncclBroadcast(const void*, void*, size_t, ncclDataType_t dt, int root, ncclComm_t c,
                                     cudaStream_t) {
  ncclResult_t r = CheckColl(c, dt);
  return (r == ncclSuccess && (root < 0 || root >= c->nranks)) ? ncclInvalidArgument : r;
}
NOOP_API ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t dt, int root, ncclComm_t c,
                                 cudaStream_t s) {
  // Through the dynamic symbol, so an interposer sees this internal call.
  using Fn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  static Fn pub = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "ncclBroadcast"));
  return pub != nullptr ? pub(buff, buff, count, dt, root, c, s) : pncclBroadcast(buff, buff, count, dt, root, c, s);
}
NOOP_API ncclResult_t pncclAllReduce(const void*, void*, size_t, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c,
                                     cudaStream_t) {
  ncclResult_t r = CheckColl(c, dt);
  return r != ncclSuccess ? r : CheckOp(op);
}
NOOP_API ncclResult_t pncclReduceScatter(const void*, void*, size_t, ncclDataType_t dt, ncclRedOp_t op,
                                         ncclComm_t c, cudaStream_t) {
  ncclResult_t r = CheckColl(c, dt);
  return r != ncclSuccess ? r : CheckOp(op);
}
NOOP_API ncclResult_t pncclAllGather(const void*, void*, size_t, ncclDataType_t dt, ncclComm_t c, cudaStream_t) {
  return CheckColl(c, dt);
}
NOOP_API ncclResult_t pncclAlltoAll(const void*, void*, size_t, ncclDataType_t dt, ncclComm_t c, cudaStream_t) {
  return CheckColl(c, dt);
}
NOOP_API ncclResult_t pncclGather(const void*, void*, size_t, ncclDataType_t dt, int root, ncclComm_t c,
                                  cudaStream_t) {
  ncclResult_t r = CheckColl(c, dt);
  return (r == ncclSuccess && (root < 0 || root >= c->nranks)) ? ncclInvalidArgument : r;
}
NOOP_API ncclResult_t pncclScatter(const void*, void*, size_t, ncclDataType_t dt, int root, ncclComm_t c,
                                   cudaStream_t) {
  ncclResult_t r = CheckColl(c, dt);
  return (r == ncclSuccess && (root < 0 || root >= c->nranks)) ? ncclInvalidArgument : r;
}
NOOP_API ncclResult_t pncclSend(const void*, size_t, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t) {
  ncclResult_t r = CheckColl(c, dt);
  return (r == ncclSuccess && (peer < 0 || peer >= c->nranks)) ? ncclInvalidArgument : r;
}
NOOP_API ncclResult_t pncclRecv(void*, size_t, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t) {
  ncclResult_t r = CheckColl(c, dt);
  return (r == ncclSuccess && (peer < 0 || peer >= c->nranks)) ? ncclInvalidArgument : r;
}
NOOP_API ncclResult_t pncclGroupStart() { return ncclSuccess; }
NOOP_API ncclResult_t pncclGroupEnd() { return ncclSuccess; }
NOOP_API ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* info) {
  if (info == nullptr) return ncclInvalidArgument;
  info->estimatedTime = 0.0f;
  return ncclSuccess;
}
NOOP_API ncclResult_t pncclMemAlloc(void** p, size_t n) {
  if (p == nullptr) return ncclInvalidArgument;
  *p = std::malloc(n == 0 ? 1 : n);
  return *p != nullptr ? ncclSuccess : ncclSystemError;
}
NOOP_API ncclResult_t pncclMemFree(void* p) {
  std::free(p);
  return ncclSuccess;
}

// Weak public aliases, one per function of nccl.h.
NOOP_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) NOOP_ALIAS(ncclMemAlloc);
NOOP_API ncclResult_t ncclMemFree(void *ptr) NOOP_ALIAS(ncclMemFree);
NOOP_API ncclResult_t ncclGetVersion(int *version) NOOP_ALIAS(ncclGetVersion);
NOOP_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) NOOP_ALIAS(ncclGetUniqueId);
NOOP_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) NOOP_ALIAS(ncclCommInitRankConfig);
NOOP_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) NOOP_ALIAS(ncclCommInitRank);
NOOP_API ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) NOOP_ALIAS(ncclCommInitAll);
NOOP_API ncclResult_t ncclCommFinalize(ncclComm_t comm) NOOP_ALIAS(ncclCommFinalize);
NOOP_API ncclResult_t ncclCommDestroy(ncclComm_t comm) NOOP_ALIAS(ncclCommDestroy);
NOOP_API ncclResult_t ncclCommAbort(ncclComm_t comm) NOOP_ALIAS(ncclCommAbort);
NOOP_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) NOOP_ALIAS(ncclCommRevoke);
NOOP_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t* config) NOOP_ALIAS(ncclCommSplit);
NOOP_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) NOOP_ALIAS(ncclCommShrink);
NOOP_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds, ncclConfig_t* config) NOOP_ALIAS(ncclCommInitRankScalable);
NOOP_API const char* ncclGetErrorString(ncclResult_t result) NOOP_ALIAS(ncclGetErrorString);
NOOP_API const char* ncclGetLastError(ncclComm_t comm) NOOP_ALIAS(ncclGetLastError);
NOOP_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) NOOP_ALIAS(ncclCommGetAsyncError);
NOOP_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) NOOP_ALIAS(ncclCommCount);
NOOP_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) NOOP_ALIAS(ncclCommCuDevice);
NOOP_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) NOOP_ALIAS(ncclCommUserRank);
NOOP_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) NOOP_ALIAS(ncclCommRegister);
NOOP_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) NOOP_ALIAS(ncclCommDeregister);
NOOP_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags) NOOP_ALIAS(ncclCommWindowRegister);
NOOP_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) NOOP_ALIAS(ncclCommWindowDeregister);
NOOP_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm) NOOP_ALIAS(ncclRedOpCreatePreMulSum);
NOOP_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) NOOP_ALIAS(ncclRedOpDestroy);
NOOP_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclReduce);
NOOP_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclBcast);
NOOP_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclBroadcast);
NOOP_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclAllReduce);
NOOP_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclReduceScatter);
NOOP_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclAllGather);
NOOP_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclAlltoAll);
NOOP_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclGather);
NOOP_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclScatter);
NOOP_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclSend);
NOOP_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) NOOP_ALIAS(ncclRecv);
NOOP_API ncclResult_t ncclGroupStart() NOOP_ALIAS(ncclGroupStart);
NOOP_API ncclResult_t ncclGroupEnd() NOOP_ALIAS(ncclGroupEnd);
NOOP_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) NOOP_ALIAS(ncclGroupSimulateEnd);
