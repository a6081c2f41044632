// Communicator registration for the wrappers: see wrapper_util.h. Runs after the real call
// returned (never on the per-call hot path of collectives); queries go to the REAL library.
#include "shim/wrapper_util.h"

namespace falcon::shim {
inline namespace wrappers {

void RegisterInit(ncclResult_t r, ncclComm_t* comm, uint64_t id, FalconCommOrigin origin, int nranks,
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

uint64_t HashRankSet(const int* ranks, int n) {
  uint64_t acc = 0;
  for (int i = 0; ranks != nullptr && i < n; ++i) {
    uint64_t x = static_cast<uint64_t>(static_cast<uint32_t>(ranks[i])) + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    acc += x ^ (x >> 31);
  }
  return acc;
}

void RegisterChild(ncclResult_t r, ncclComm_t parent, ncclComm_t* child, FalconCommOrigin origin,
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
