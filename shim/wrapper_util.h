// Helpers shared by the NCCL wrapper files (nccl_wrappers.cc, nccl_comm_wrappers.cc).
//
// Describing calls, querying a new communicator's rank/device through the REAL library (never
// through the shim's own exports), and registering communicator identities. Off the hot path
// except Coll/OnComm, which only fill a struct. Internal to the shim: include after <nccl.h>.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstring>

#include "shim/real_nccl.h"
#include "shim/tracer.h"

#define FALCON_EXPORT __attribute__((visibility("default")))

namespace falcon::shim {
inline namespace wrappers {

inline constexpr unsigned kConfigMagic = 0xcafebeef;

template <typename Fn>
inline Fn Real(FalconOp op) {
  return RealSymbol<Fn>(op);
}

inline CallDesc Coll(FalconOp op, const void* send, const void* recv, size_t count, ncclDataType_t dt,
              int redop, int peer, ncclComm_t comm, cudaStream_t stream) {
  CallDesc d;
  d.op = op;
  d.comm = comm;
  d.count = count;
  d.dtype = static_cast<int32_t>(dt);
  d.redop = redop;
  d.peer = peer;
  d.stream = stream;
  d.gpu_work = true;
  if (send != nullptr && send == recv) d.flags |= kFalconFlagInPlace;
  return d;
}

inline CallDesc OnComm(FalconOp op, const void* comm, uint64_t count = 0) {
  CallDesc d;
  d.op = op;
  d.comm = comm;
  d.count = count;
  return d;
}

inline int32_t QueryDevice(ncclComm_t comm) {
  auto fn = Real<decltype(&pncclCommCuDevice)>(kFalconOpCommCuDevice);
  int dev = -1;
  if (fn == nullptr || fn(comm, &dev) != ncclSuccess) return -1;
  return dev;
}

inline const char* ConfigName(const ncclConfig_t* config) {
  if (config == nullptr || config->magic != kConfigMagic) return nullptr;
  if (config->size < offsetof(ncclConfig_t, commName) + sizeof(config->commName)) return nullptr;
  return config->commName;
}

inline bool Created(ncclResult_t r, const ncclComm_t* comm) {
  return (r == ncclSuccess || r == ncclInProgress) && comm != nullptr && *comm != nullptr;
}

static_assert(static_cast<int>(ncclInProgress) == kNcclInProgress, "tracer.h mirrors ncclInProgress");

// Whether `comm` has finished its (nonblocking) init or split: ncclCommGetAsyncError does not
// report ncclInProgress. Only then may its rank, size and device be queried: NCCL refuses
// (and prints a warning into the job's log) on a communicator that is not ready.
bool CommReady(ncclComm_t comm);

// Fills in the identity of a communicator registered while it was not ready, once it is.
void CompleteIdentity(ncclComm_t comm);

// A communicator the shim never saw created (made while another thread initialised the shim,
// or through the pncclX entry points directly): registers it with a best-effort identity,
// origin 0. Members agree on it when they meet their unknown communicators of one size in the
// same order (the id hashes the size and that order). Returns its slot.
uint32_t RegisterUnknownComm(const void* comm);

// Registers a communicator an InitRank* call created (if it did) and sets out.comm_slot.
void RegisterInit(ncclResult_t r, ncclComm_t* comm, uint64_t id, FalconCommOrigin origin, int nranks, int rank,
                  const ncclConfig_t* config, CallOutcome& out);

// Order-independent mix of a rank list (no sort, no allocation).
uint64_t HashRankSet(const int* ranks, int n);

// Registers the child of a Split/Shrink on `parent` (if the rank got one): claims the parent's
// next child index, sets out.aux to the child's slot and out.peer to `color`.
void RegisterChild(ncclResult_t r, ncclComm_t parent, ncclComm_t* child, FalconCommOrigin origin, int32_t color,
                   uint64_t discriminator, const ncclConfig_t* config, CallOutcome& out);

}  // namespace wrappers
}  // namespace falcon::shim

using falcon::shim::CallDesc;
using falcon::shim::CallOutcome;
using falcon::shim::Intercept;
using falcon::shim::Real;



#define FALCON_REAL_OR_FAIL(NAME, OP)                          \
  auto real = ::falcon::shim::Real<decltype(&p##NAME)>(OP);    \
  if (real == nullptr) return ncclInvalidUsage
