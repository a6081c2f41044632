// Communicator registry, error text and lifetime helpers; see comm.h.
// Thread-safety: registry and global error text under their own mutexes (leaked singletons so
// they outlive static destruction, as exit-time cleanup may still run); reference counts and
// flags are atomics (comm.h invariants).
// Must never: throw out of these functions except std::bad_alloc, which API entry points catch.
#include "comm.h"

#include "device.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <unordered_set>

#include "emu_config.h"

namespace falcon::emu {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_set<const ncclComm*> live;
  std::string last_error;
};

Registry& Reg() {
  static auto* r = new Registry;
  return *r;
}

// At exit, remove the names of rendezvous that never completed so nothing leaks in /dev/shm.
struct ExitCleanup {
  ~ExitCleanup() {
    Registry& r = Reg();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const ncclComm* c : r.live) {
      if (c->seg) c->seg->Unlink();
    }
  }
} g_exit_cleanup;

}  // namespace

bool Unregister(ncclComm* c) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  return Reg().live.erase(c) != 0;
}

void Retain(ncclComm* c) { c->refs.fetch_add(1, std::memory_order_relaxed); }

void Release(ncclComm* c) {
  if (c->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // Last reference: nothing else can reach `c` now.
  if (c->seg && c->seg->mapped()) {
    if (c->aborted.load(std::memory_order_relaxed)) StoreRelease(c->seg->rank(c->rank)->gone, int32_t{1});
    c->seg->Unlink();
  }
  ReleaseCommDevice(c);
  c->magic = 0;
  delete c;
}

bool IsLiveComm(const ncclComm* c) {
  if (c == nullptr) return false;
  std::lock_guard<std::mutex> lock(Reg().mu);
  return Reg().live.count(c) != 0;
}

ncclResult_t Fail(ncclResult_t code, ncclComm* comm, const std::string& text, Loud loud) {
  {
    std::lock_guard<std::mutex> lock(Reg().mu);
    Reg().last_error = text;
  }
  if (comm) {
    std::lock_guard<std::mutex> lock(comm->mu);
    comm->last_error = text;
  }
  if (loud == Loud::kYes || Config().debug) {
    std::fprintf(stderr, "falcon-emu[pid %d]: %s\n", static_cast<int>(getpid()), text.c_str());
  }
  return code;
}

void SetAsyncError(ncclComm* comm, ncclResult_t code) {
  int expected = ncclSuccess;
  comm->async_error.compare_exchange_strong(expected, code);
}

const char* LastErrorText(ncclComm* comm) {
  thread_local std::string copy;
  if (comm && IsLiveComm(comm)) {
    std::lock_guard<std::mutex> lock(comm->mu);
    if (!comm->last_error.empty()) {
      copy = comm->last_error;
      return copy.c_str();
    }
  }
  std::lock_guard<std::mutex> lock(Reg().mu);
  copy = Reg().last_error;
  return copy.c_str();
}

std::string SegmentName(uint64_t key) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "/falcon-emu-%u-%016" PRIx64, static_cast<unsigned>(getuid()), key);
  return buf;
}

uint64_t DeriveKey(uint64_t parent, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = parent;
  for (uint64_t v : {a, b, c}) {
    x ^= v + 0x9E3779B97F4A7C15ull + (x << 6) + (x >> 2);
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
  }
  return x;
}

ncclComm* NewComm(int rank, int nranks, uint64_t key, int device) {
  auto* c = new ncclComm;
  c->key = key;
  c->device = device;
  SetGeometry(c, rank, nranks);
  std::lock_guard<std::mutex> lock(Reg().mu);
  Reg().live.insert(c);
  return c;
}

void SetGeometry(ncclComm* c, int rank, int nranks) {
  c->rank = rank;
  c->nranks = nranks;
  char buf[96];
  std::snprintf(buf, sizeof buf, "comm %016" PRIx64 " rank %d/%d", c->key, rank, nranks);
  c->label = buf;
  const auto n = static_cast<size_t>(nranks);
  c->sends_launched.assign(n, 0);
  c->sends_done.assign(n, 0);
  c->recvs_launched.assign(n, 0);
  c->recvs_done.assign(n, 0);
  c->send_cursor.assign(n, 0);
  c->recv_cursor.assign(n, 0);
  c->send_connected.assign(n, false);
  c->recv_connected.assign(n, false);
}

void DeleteComm(ncclComm* c) {
  if (Unregister(c)) Release(c);
}

ncclResult_t AsyncState(const ncclComm* c) {
  if (c->inflight.load(std::memory_order_acquire) > 0) return ncclInProgress;
  return static_cast<ncclResult_t>(c->async_error.load());
}

ncclResult_t EnsureReady(ncclComm* c, const char* op) {
  if (c->inflight.load(std::memory_order_acquire) == 0) return ncclSuccess;
  // NCCL's own words (init.cc, ncclCommEnsureReady), in its log-line shape.
  char host[64] = "localhost";
  gethostname(host, sizeof host - 1);
  std::fprintf(stderr, "%s:%d:%ld [%d] NCCL WARN Attempt to use communicator before the previous operation returned ncclSuccess\n",
               host, static_cast<int>(getpid()), static_cast<long>(syscall(SYS_gettid)), c->device);
  return Fail(ncclInvalidArgument, c, std::string(op) + ": communicator is not ready (a nonblocking "
                                      "operation is in progress; poll ncclCommGetAsyncError until ncclSuccess)");
}

ncclResult_t CheckUsable(ncclComm* c, const char* op) {
  if (!IsLiveComm(c)) {
    return Fail(ncclInvalidArgument, nullptr, std::string(op) + ": invalid communicator (null or destroyed)");
  }
  const ncclResult_t ready = EnsureReady(c, op);
  if (ready != ncclSuccess) return ready;
  if (c->state == CommState::kFailed) {
    return Fail(ncclInvalidUsage, c, std::string(op) + ": " + c->label + " failed to initialize");
  }
  if (c->state == CommState::kInitializing) {
    return Fail(ncclInvalidUsage, c, std::string(op) + ": " + c->label +
                                         " is still initializing (its init is queued in an open group)");
  }
  const int async = c->async_error.load();
  if (async != ncclSuccess) {
    return Fail(static_cast<ncclResult_t>(async), c,
                std::string(op) + ": " + c->label + " has an asynchronous error; destroy it");
  }
  if (c->revoked) return Fail(ncclInvalidUsage, c, std::string(op) + ": " + c->label + " was revoked");
  if (c->finalized) return Fail(ncclInvalidUsage, c, std::string(op) + ": " + c->label + " was finalized");
  return ncclSuccess;
}

}  // namespace falcon::emu
