// Communicator registration for the wrappers: see wrapper_util.h. Runs after the real call
// returned (never on the per-call hot path of collectives); queries go to the REAL library.
#include "shim/wrapper_util.h"

namespace falcon::shim {
inline namespace wrappers {

bool CommReady(ncclComm_t comm) {
  auto poll = Real<decltype(&pncclCommGetAsyncError)>(kFalconOpCommGetAsyncError);
  if (poll == nullptr) return true;  // an NCCL without it has no nonblocking communicators
  ncclResult_t async = ncclSuccess;
  return poll(comm, &async) != ncclInProgress && async != ncclInProgress;
}

namespace {
struct Queried {
  int32_t rank = -1;
  int32_t nranks = -1;
  int32_t device = -1;
};
// REQUIRES: CommReady(comm).
Queried Query(ncclComm_t comm) {
  Queried q;
  auto user_rank = Real<decltype(&pncclCommUserRank)>(kFalconOpCommUserRank);
  auto count = Real<decltype(&pncclCommCount)>(kFalconOpCommCount);
  if (user_rank != nullptr && user_rank(comm, &q.rank) != ncclSuccess) q.rank = -1;
  if (count != nullptr && count(comm, &q.nranks) != ncclSuccess) q.nranks = -1;
  q.device = QueryDevice(comm);
  return q;
}
}  // namespace

void CompleteIdentity(ncclComm_t comm) {
  const Queried q = Query(comm);
  g_tracer.comms().Complete(comm, q.rank, q.nranks, q.device);
}

uint32_t RegisterUnknownComm(const void* comm) {
  auto handle = static_cast<ncclComm_t>(const_cast<void*>(comm));
  const bool ready = CommReady(handle);
  CommIdentity ident;
  if (ready) {
    const Queried q = Query(handle);
    ident.rank = q.rank;
    ident.nranks = q.nranks;
    ident.device = q.device;
  }
  CommRegistry& reg = g_tracer.comms();
  struct {
    uint64_t tag;
    int32_t nranks;
    uint32_t ordinal;
  } key{0x756e6b6e6f776e00ull /* "unknown" */, ident.nranks, reg.NextUnknownOrdinal(ident.nranks)};
  ident.comm_id = Fnv1a(&key, sizeof(key));
  ident.origin = static_cast<FalconCommOrigin>(0);
  return reg.Register(comm, ident, /*pending=*/!ready);
}

void RegisterInit(ncclResult_t r, ncclComm_t* comm, uint64_t id, FalconCommOrigin origin, int nranks,
                  int rank, const ncclConfig_t* config, CallOutcome& out) {
  if (!Created(r, comm)) return;
  CommIdentity ident;
  ident.comm_id = id;
  ident.origin = origin;
  ident.rank = rank;
  ident.nranks = nranks;
  // A nonblocking init that is still running: the device is filled in once it is ready.
  const bool pending = r == ncclInProgress || !CommReady(*comm);
  if (!pending) ident.device = QueryDevice(*comm);
  ident.name = ConfigName(config);
  out.comm_slot = g_tracer.comms().Register(*comm, ident, pending);
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
  // A parent the shim never saw created gets its identity now, so that its children are
  // numbered (and named) apart rather than all taking child index 0 of "no parent".
  if (parent_slot == CommRegistry::kNotMapped && parent != nullptr) parent_slot = RegisterUnknownComm(parent);
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
  // A nonblocking split that is still running: rank, size and device follow once it is ready.
  const bool pending = r == ncclInProgress || !CommReady(*child);
  if (!pending) {
    const Queried q = Query(*child);
    ident.rank = q.rank;
    ident.nranks = q.nranks;
    ident.device = q.device;
  }
  ident.name = ConfigName(config);
  out.aux = reg.Register(*child, ident, pending);
}

}  // namespace wrappers
}  // namespace falcon::shim
