// Plan block writer and readers: see plan_block.h.
#include "daemon/shm/plan_block.h"

#include <algorithm>
#include <atomic>
#include <string>

namespace falcon::daemon {
namespace {

constexpr int kReadAttempts = 1000;

template <typename T>
void Store(T& word, T value) {
  std::atomic_ref<T>(word).store(value, std::memory_order_relaxed);
}

template <typename T>
T Load(const T& word) {
  return std::atomic_ref<T>(const_cast<T&>(word)).load(std::memory_order_relaxed);
}

void StoreArray(int32_t* dst, const std::vector<int32_t>& src) {
  for (size_t i = 0; i < src.size(); ++i) Store(dst[i], src[i]);
}

void LoadArray(const int32_t* src, uint32_t n, std::vector<int32_t>* dst) {
  dst->resize(n);
  for (uint32_t i = 0; i < n; ++i) (*dst)[i] = Load(src[i]);
}

Status TooLong(const char* what, size_t n, size_t capacity, const char* macro) {
  return Status::InvalidArgument(std::string(what) + " has " + std::to_string(n) +
                                 " entries; the shared-memory plan block holds at most " +
                                 std::to_string(capacity) + " (" + macro + ")");
}

}  // namespace

Status CheckPlanFits(const ShmPlan& p) {
  if (p.version == 0) return Status::InvalidArgument("plan version 0 means no plan");
  if (p.micro_batches.size() > FALCON_PLAN_MAX_MICRO_BATCHES) {
    return TooLong("micro_batches", p.micro_batches.size(), FALCON_PLAN_MAX_MICRO_BATCHES,
                   "FALCON_PLAN_MAX_MICRO_BATCHES");
  }
  if (p.placement.size() > FALCON_PLAN_MAX_PLACEMENT) {
    return TooLong("placement", p.placement.size(), FALCON_PLAN_MAX_PLACEMENT, "FALCON_PLAN_MAX_PLACEMENT");
  }
  if (p.exclude_nodes.size() > FALCON_PLAN_MAX_EXCLUDE) {
    return TooLong("exclude_nodes", p.exclude_nodes.size(), FALCON_PLAN_MAX_EXCLUDE, "FALCON_PLAN_MAX_EXCLUDE");
  }
  if (p.warmup.size() > FALCON_PLAN_MAX_STAGES) {
    return TooLong("warmup", p.warmup.size(), FALCON_PLAN_MAX_STAGES, "FALCON_PLAN_MAX_STAGES");
  }
  return Status::Ok();
}

Status WritePlanBlock(FalconPlanBlock* b, const ShmPlan& p) {
  if (Status s = CheckPlanFits(p); !s.ok()) return s;
  std::atomic_ref<uint64_t> seq(b->seq);
  uint64_t even = seq.load(std::memory_order_relaxed);
  if ((even & 1) != 0) ++even;  // a writer died mid-write: its half plan is overwritten now
  seq.store(even + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // odd seq before any field
  Store(b->strategy, p.strategy);
  Store(b->restart, p.restart ? 1u : 0u);
  Store(b->micro_batch_count, static_cast<uint32_t>(p.micro_batches.size()));
  Store(b->placement_count, static_cast<uint32_t>(p.placement.size()));
  Store(b->exclude_count, static_cast<uint32_t>(p.exclude_nodes.size()));
  Store(b->warmup_count, static_cast<uint32_t>(p.warmup.size()));
  Store(b->issued_real_ns, p.issued_real_ns);
  StoreArray(b->micro_batches, p.micro_batches);
  StoreArray(b->placement, p.placement);
  StoreArray(b->exclude_nodes, p.exclude_nodes);
  StoreArray(b->warmup, p.warmup);
  std::atomic_ref<uint32_t>(b->version).store(p.version, std::memory_order_release);
  seq.store(even + 2, std::memory_order_release);
  return Status::Ok();
}

uint32_t PlanBlockVersion(const FalconPlanBlock& b) {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(b.version)).load(std::memory_order_acquire);
}

Status ReadPlanBlock(const FalconPlanBlock& b, ShmPlan* out) {
  std::atomic_ref<uint64_t> seq(const_cast<uint64_t&>(b.seq));
  for (int attempt = 0; attempt < kReadAttempts; ++attempt) {
    const uint64_t before = seq.load(std::memory_order_acquire);
    if (before == 0) return Status::NotFound("no plan was written");
    if ((before & 1) != 0) continue;
    ShmPlan p;
    p.version = Load(b.version);
    p.strategy = Load(b.strategy);
    p.restart = Load(b.restart) != 0;
    p.issued_real_ns = Load(b.issued_real_ns);
    LoadArray(b.micro_batches, std::min<uint32_t>(Load(b.micro_batch_count), FALCON_PLAN_MAX_MICRO_BATCHES),
              &p.micro_batches);
    LoadArray(b.placement, std::min<uint32_t>(Load(b.placement_count), FALCON_PLAN_MAX_PLACEMENT), &p.placement);
    LoadArray(b.exclude_nodes, std::min<uint32_t>(Load(b.exclude_count), FALCON_PLAN_MAX_EXCLUDE),
              &p.exclude_nodes);
    LoadArray(b.warmup, std::min<uint32_t>(Load(b.warmup_count), FALCON_PLAN_MAX_STAGES), &p.warmup);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq.load(std::memory_order_relaxed) == before) {
      if (p.version == 0) return Status::NotFound("no plan was written");
      *out = std::move(p);
      return Status::Ok();
    }
  }
  return Status::Unavailable("the plan kept changing while being read");
}

PlanAcks ReadPlanAcks(const FalconPlanBlock& b) {
  PlanAcks a;
  const uint64_t last = std::atomic_ref<uint64_t>(const_cast<uint64_t&>(b.ack_last)).load(std::memory_order_acquire);
  a.last_version = static_cast<uint32_t>(last >> 32);
  a.last_status = static_cast<int32_t>(static_cast<uint32_t>(last));
  a.applied = Load(b.applied_version);
  a.rejected = Load(b.rejected_version);
  a.count = Load(b.ack_count);
  for (int i = 0; i < 4; ++i) {
    const uint64_t us = Load(b.cost_us[i]);
    if (us > 0) a.cost_s[i] = static_cast<double>(us) / 1e6;
  }
  return a;
}

}  // namespace falcon::daemon
