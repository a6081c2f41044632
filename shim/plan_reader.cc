// Plan block reader and acknowledgements: see plan_reader.h.
#include "shim/plan_reader.h"

#include <atomic>

namespace falcon::shim {
namespace {

// Every shared word is accessed through an atomic (contract 7), so a copy racing the writer is
// a discarded snapshot, never undefined behaviour.
template <typename T>
T Relaxed(const T& word) {
  return std::atomic_ref<T>(const_cast<T&>(word)).load(std::memory_order_relaxed);
}

inline void SpinHint() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

uint32_t Clamp(uint32_t count, uint32_t capacity) { return count < capacity ? count : capacity; }

struct Snapshot {
  FalconPlanInfo info{};
  int part_count = 0;  // entries of the requested part
};

// One consistent copy of the scalars and of min(count, capacity) entries of `part` (if out).
int ReadConsistent(const FalconPlanBlock& b, PlanPart part, int32_t* out, int capacity, Snapshot* s) {
  std::atomic_ref<uint64_t> seq(const_cast<uint64_t&>(b.seq));
  for (int attempt = 0; attempt < kPlanReadAttempts; ++attempt) {
    const uint64_t before = seq.load(std::memory_order_acquire);
    if (before == 0) return FALCON_ERR_NO_PLAN;  // never written
    if ((before & 1) != 0) {                     // the agent is writing
      SpinHint();
      continue;
    }
    FalconPlanInfo& i = s->info;
    i.version = Relaxed(b.version);
    i.strategy = Relaxed(b.strategy);
    i.restart = Relaxed(b.restart);
    // Counts past the capacity can only come from a broken writer: never read past the arrays.
    i.micro_batch_count = Clamp(Relaxed(b.micro_batch_count), FALCON_PLAN_MAX_MICRO_BATCHES);
    i.placement_count = Clamp(Relaxed(b.placement_count), FALCON_PLAN_MAX_PLACEMENT);
    i.exclude_count = Clamp(Relaxed(b.exclude_count), FALCON_PLAN_MAX_EXCLUDE);
    i.issued_real_ns = Relaxed(b.issued_real_ns);
    const int32_t* src = b.micro_batches;
    uint32_t n = i.micro_batch_count;
    if (part == PlanPart::kPlacement) {
      src = b.placement;
      n = i.placement_count;
    } else if (part == PlanPart::kExcludedNodes) {
      src = b.exclude_nodes;
      n = i.exclude_count;
    } else if (part == PlanPart::kWarmup) {
      src = b.warmup;
      n = Clamp(Relaxed(b.warmup_count), FALCON_PLAN_MAX_STAGES);
    }
    s->part_count = static_cast<int>(n);
    if (out != nullptr) {
      const uint32_t copy = Clamp(n, static_cast<uint32_t>(capacity));
      for (uint32_t k = 0; k < copy; ++k) out[k] = Relaxed(src[k]);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq.load(std::memory_order_relaxed) == before) {
      return i.version == 0 ? FALCON_ERR_NO_PLAN : FALCON_OK;
    }
    SpinHint();
  }
  return FALCON_ERR_BUSY;
}

void StoreMax(uint32_t& word, uint32_t value) {
  std::atomic_ref<uint32_t> w(word);
  uint32_t seen = w.load(std::memory_order_relaxed);
  while (seen < value && !w.compare_exchange_weak(seen, value, std::memory_order_release,
                                                  std::memory_order_relaxed)) {
  }
}

}  // namespace

uint32_t PlanVersion(const FalconPlanBlock& block) {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(block.version)).load(std::memory_order_acquire);
}

int ReadPlanInfo(const FalconPlanBlock& block, FalconPlanInfo* info) {
  Snapshot s;
  const int rc = ReadConsistent(block, PlanPart::kMicroBatches, nullptr, 0, &s);
  *info = rc == FALCON_OK ? s.info : FalconPlanInfo{};
  return rc;
}

int ReadPlanPart(const FalconPlanBlock& block, PlanPart part, int32_t* out, int capacity, uint32_t* version) {
  Snapshot s;
  const int rc = ReadConsistent(block, part, out, capacity, &s);
  if (version != nullptr) *version = rc == FALCON_OK ? s.info.version : 0;
  return rc == FALCON_OK ? s.part_count : rc;
}

int AckPlan(FalconPlanBlock& block, uint32_t version, int status) {
  if (version == 0) return FALCON_ERR_INVALID;
  StoreMax(status == 0 ? block.applied_version : block.rejected_version, version);
  const uint64_t last = uint64_t{version} << 32 | static_cast<uint32_t>(status);
  std::atomic_ref<uint64_t>(block.ack_last).store(last, std::memory_order_release);
  std::atomic_ref<uint64_t>(block.ack_count).fetch_add(1, std::memory_order_release);
  return FALCON_OK;
}

bool ValidCostReport(uint32_t strategy, double seconds) {
  return strategy >= kFalconStrategyRebalance && strategy <= kFalconStrategyPipeline && seconds >= 0 &&
         seconds <= kMaxReportedCostS;  // NaN fails the comparisons
}

int ReportCost(FalconPlanBlock& block, uint32_t strategy, double seconds) {
  if (!ValidCostReport(strategy, seconds)) return FALCON_ERR_INVALID;
  const auto us = static_cast<uint64_t>(seconds * 1e6 + 0.5);
  std::atomic_ref<uint64_t>(block.cost_us[strategy - kFalconStrategyRebalance])
      .store(us == 0 ? 1 : us, std::memory_order_release);
  return FALCON_OK;
}

}  // namespace falcon::shim
