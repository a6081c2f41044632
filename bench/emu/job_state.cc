// The job-wide placement override; see job_state.h for the layout and the concurrency contract.
// Thread-safety: the mapping is made once (std::call_once); the process-local copy of the
// override is guarded by g_cache.mu. Must never: throw, or wait for a writer past 1 s.
#include "job_state.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "emu_config.h"

namespace falcon::emu {
namespace {

constexpr int64_t kWriterWaitNs = 1'000'000'000;
constexpr size_t kStateBytes = sizeof(JobStateHeader) + sizeof(int32_t) * kJobStateMaxRanks;

struct Mapping {
  JobStateHeader* hdr = nullptr;
  int32_t* nodes = nullptr;
};

// Maps the state named by FALCON_EMU_JOB_STATE; *err says why not (empty: no name configured).
Mapping MapState(std::string* err) {
  const std::string& name = Config().job_state_name;
  if (name.empty() || !Config().error.empty()) return {};
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) {
    *err = std::string("shm_open: ") + std::strerror(errno);
    return {};
  }
  struct stat st{};
  if (fstat(fd, &st) != 0 || st.st_uid != getuid()) {
    *err = "it belongs to another user";
    close(fd);
    return {};
  }
  // Growing to the fixed size is idempotent, so processes racing here all end up with it.
  if (static_cast<size_t>(st.st_size) < kStateBytes && ftruncate(fd, static_cast<off_t>(kStateBytes)) != 0) {
    *err = std::string("ftruncate: ") + std::strerror(errno);
    close(fd);
    return {};
  }
  void* p = mmap(nullptr, kStateBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    *err = std::string("mmap: ") + std::strerror(errno);
    return {};
  }
  auto* h = static_cast<JobStateHeader*>(p);
  std::atomic_ref<int32_t>(h->capacity).store(kJobStateMaxRanks, std::memory_order_relaxed);
  uint64_t expected = 0;
  std::atomic_ref<uint64_t>(h->magic).compare_exchange_strong(expected, kJobStateMagic);
  if (expected != 0 && expected != kJobStateMagic) {
    munmap(p, kStateBytes);
    *err = "it is not an emulator job state";
    return {};
  }
  return {h, reinterpret_cast<int32_t*>(static_cast<char*>(p) + sizeof(JobStateHeader))};
}

const Mapping& State() {
  static std::once_flag once;
  static Mapping m;
  std::call_once(once, [] {
    std::string err;
    m = MapState(&err);
    if (!err.empty()) {
      std::fprintf(stderr, "falcon-emu[pid %d]: job state %s: %s; placement changes are unavailable\n",
                   static_cast<int>(getpid()), Config().job_state_name.c_str(), err.c_str());
    }
  });
  return m;
}

std::atomic_ref<uint64_t> Gen(const Mapping& m) { return std::atomic_ref<uint64_t>(m.hdr->generation); }

// A consistent copy of the override (contract 3); nullopt when a writer held it past the deadline.
std::optional<uint64_t> Snapshot(const Mapping& m, std::vector<int>* out) {
  const int64_t deadline = NowNs() + kWriterWaitNs;
  while (true) {
    const uint64_t g1 = Gen(m).load(std::memory_order_acquire);
    if ((g1 & 1) == 0) {
      const int32_t n = std::clamp(std::atomic_ref<int32_t>(m.hdr->count).load(std::memory_order_relaxed), 0,
                                   kJobStateMaxRanks);
      out->resize(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) {
        (*out)[static_cast<size_t>(i)] = std::atomic_ref<int32_t>(m.nodes[i]).load(std::memory_order_relaxed);
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      if (Gen(m).load(std::memory_order_relaxed) == g1) return g1;
    }
    if (NowNs() > deadline) return std::nullopt;
    sched_yield();
  }
}

// This process's copy of the override, refreshed when the generation moves.
struct Cache {
  std::mutex mu;
  uint64_t generation = 0;         // guarded by mu
  std::vector<int> nodes;          // guarded by mu: the override as of `generation`
};

Cache& TheCache() {
  static auto* c = new Cache;  // leaked on purpose: used from exit-time cleanup paths
  return *c;
}

// REQUIRES: c.mu held.
void RefreshLocked(Cache& c) {
  const Mapping& m = State();
  if (!m.hdr) return;
  if (Gen(m).load(std::memory_order_acquire) == c.generation) return;
  std::vector<int> copy;
  if (const std::optional<uint64_t> g = Snapshot(m, &copy)) {
    c.generation = *g;
    c.nodes = std::move(copy);
  } else {
    // A writer died inside its write (contract 4): keep the old copy, and do not wait again
    // until the generation moves.
    c.generation = Gen(m).load(std::memory_order_acquire);
  }
}

// REQUIRES: c.mu held.
int NodeLocked(const Cache& c, int rank) {
  if (rank >= 0 && static_cast<size_t>(rank) < c.nodes.size()) return c.nodes[static_cast<size_t>(rank)];
  return Config().NodeOf(rank);
}

}  // namespace

SetPlacementResult SetJobPlacement(std::span<const int> node_of_rank) {
  if (node_of_rank.size() > static_cast<size_t>(kJobStateMaxRanks)) return SetPlacementResult::kInvalid;
  for (int n : node_of_rank) {
    if (n < 0 || n > kJobStateMaxNode) return SetPlacementResult::kInvalid;
  }
  const Mapping& m = State();
  if (!m.hdr) return SetPlacementResult::kNoJobState;
  std::vector<int> now;
  if (Snapshot(m, &now) && std::equal(now.begin(), now.end(), node_of_rank.begin(), node_of_rank.end())) {
    return SetPlacementResult::kOk;  // every rank of a job may install the same placement
  }
  const int64_t deadline = NowNs() + kWriterWaitNs;
  uint64_t g = Gen(m).load(std::memory_order_relaxed);
  while ((g & 1) != 0 || !Gen(m).compare_exchange_weak(g, g + 1, std::memory_order_relaxed)) {
    if (NowNs() > deadline) return SetPlacementResult::kBusy;
    sched_yield();
    g = Gen(m).load(std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_release);
  std::atomic_ref<int32_t>(m.hdr->count).store(static_cast<int32_t>(node_of_rank.size()), std::memory_order_relaxed);
  for (size_t i = 0; i < node_of_rank.size(); ++i) {
    std::atomic_ref<int32_t>(m.nodes[i]).store(node_of_rank[i], std::memory_order_relaxed);
  }
  Gen(m).store(g + 2, std::memory_order_release);
  return SetPlacementResult::kOk;
}

uint64_t JobPlacementGeneration() {
  const Mapping& m = State();
  return m.hdr ? Gen(m).load(std::memory_order_acquire) : 0;
}

int CurrentNodeOf(int global_rank) {
  Cache& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  RefreshLocked(c);
  return NodeLocked(c, global_rank);
}

int PhysicalRankOf(int global_rank) {
  if (global_rank < 0) return global_rank;
  Cache& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  RefreshLocked(c);
  if (c.nodes.empty()) return global_rank;
  const int node = NodeLocked(c, global_rank);
  int seat = 0;  // k: this rank is the k-th lowest rank on its node now
  for (int q = 0; q < global_rank; ++q) seat += NodeLocked(c, q) == node ? 1 : 0;
  // The launch rank that was the seat-th lowest on `node`. Launch nodes grow with the rank past
  // the explicit placement (rank / ranks_per_node), so the search ends there.
  const EmuConfig& cfg = Config();
  const long long bound = static_cast<long long>(cfg.placement.size()) +
                          (static_cast<long long>(node) + 1) * cfg.ranks_per_node;
  for (long long q = 0, k = 0; q < bound && q <= kJobStateMaxRanks; ++q) {
    if (cfg.NodeOf(static_cast<int>(q)) != node) continue;
    if (k++ == seat) return static_cast<int>(q);
  }
  return -1;
}

void RefreshCommNodes(ncclComm* comm, Refresh when) {
  if (comm->globals.empty()) return;
  const uint64_t g = JobPlacementGeneration();
  if (when == Refresh::kIfChanged && g == comm->nodes_generation) return;
  Cache& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  RefreshLocked(c);
  comm->nodes.resize(comm->globals.size());
  for (size_t i = 0; i < comm->globals.size(); ++i) comm->nodes[i] = NodeLocked(c, comm->globals[i]);
  comm->nodes_generation = c.generation;
}

}  // namespace falcon::emu
