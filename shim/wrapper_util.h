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

inline void RegisterInit(ncclResult_t r, ncclComm_t* comm, uint64_t id, FalconCommOrigin origin, int nranks,
                  int rank, const ncclConfig_t* config, CallOutcome& out) {
  if (!Created(r, comm)) return;
  CommIdentity ident;
  ident.comm_id = id;
  ident.origin = origin;
  ident.rank = rank;
  ident.nranks = nranks;
  ident.device = QueryDevice(*comm);
  ident.name = ConfigName(config);
  out.comm_slot = g_tracer.comms().Register(*comm, ident);
}

// Order-independent mix of a rank list (no sort, no allocation).
inline uint64_t HashRankSet(const int* ranks, int n) {
  uint64_t acc = 0;
  for (int i = 0; ranks != nullptr && i < n; ++i) {
    uint64_t x = static_cast<uint64_t>(static_cast<uint32_t>(ranks[i])) + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    acc += x ^ (x >> 31);
  }
  return acc;
}

inline void RegisterChild(ncclResult_t r, ncclComm_t parent, ncclComm_t* child, FalconCommOrigin origin,
                   int32_t color, uint64_t discriminator, const ncclConfig_t* config, CallOutcome& out) {
  CommRegistry& reg = g_tracer.comms();
  uint32_t parent_slot = reg.Lookup(parent);
  if (parent_slot == CommRegistry::kNotMapped) parent_slot = FALCON_NO_COMM;
  const uint32_t index = reg.NextChildIndex(parent_slot);
  out.peer = color;
  out.aux = FALCON_NO_COMM;
  if (!Created(r, child)) return;
  struct {
    uint64_t parent;
    uint32_t index;
    int32_t origin;
    uint64_t discriminator;
  } key{reg.IdOf(parent_slot), index, static_cast<int32_t>(origin), discriminator};
  CommIdentity ident;
  ident.comm_id = Fnv1a(&key, sizeof(key));
  ident.parent_id = key.parent;
  ident.origin = origin;
  ident.color = color;
  ident.split_index = index;
  auto user_rank = Real<decltype(&pncclCommUserRank)>(kFalconOpCommUserRank);
  auto count = Real<decltype(&pncclCommCount)>(kFalconOpCommCount);
  if (user_rank != nullptr && user_rank(*child, &ident.rank) != ncclSuccess) ident.rank = -1;
  if (count != nullptr && count(*child, &ident.nranks) != ncclSuccess) ident.nranks = -1;
  ident.device = QueryDevice(*child);
  ident.name = ConfigName(config);
  out.aux = reg.Register(*child, ident);
}

}  // namespace wrappers
}  // namespace falcon::shim

using falcon::shim::CallDesc;
using falcon::shim::CallOutcome;
using falcon::shim::Intercept;
using falcon::shim::Real;



#define FALCON_REAL_OR_FAIL(NAME, OP)                          \
  auto real = ::falcon::shim::Real<decltype(&p##NAME)>(OP);    \
  if (real == nullptr) return ncclInvalidUsage
