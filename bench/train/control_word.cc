// Control word and plan payload encoding; see control_word.h. Pure.
#include "control_word.h"

namespace falcon::train {
namespace {

enum Field : std::size_t {
  kStop, kMembers, kVersion, kStrategy, kVerdict, kRestart, kPlacementCount, kExcludeCount, kWarmupCount, kCounts
};

}  // namespace

std::vector<std::int32_t> PackControl(const ControlDecision& proposal, int dp) {
  std::vector<std::int32_t> w(kCounts + static_cast<std::size_t>(dp), 0);
  w[kStop] = proposal.stop ? 1 : 0;
  w[kMembers] = 1;
  if (const std::optional<Announcement>& a = proposal.plan) {
    w[kVersion] = a->version;
    w[kStrategy] = a->strategy ? static_cast<std::int32_t>(*a->strategy) : 0;
    w[kVerdict] = static_cast<std::int32_t>(a->verdict);
    if (a->verdict == Verdict::kApply) {
      w[kRestart] = a->effect.restart ? 1 : 0;
      w[kPlacementCount] = static_cast<std::int32_t>(a->effect.placement.size());
      w[kExcludeCount] = static_cast<std::int32_t>(a->exclude_nodes.size());
      w[kWarmupCount] = static_cast<std::int32_t>(a->effect.warmup.size());
      for (int d = 0; d < dp; ++d) {
        w[kCounts + static_cast<std::size_t>(d)] = a->effect.micro_batches[static_cast<std::size_t>(d)];
      }
    }
  }
  return w;
}

Result<ControlDecision> UnpackControl(const std::vector<std::int32_t>& w, int world, int dp) {
  if (w.size() != kCounts + static_cast<std::size_t>(dp)) return Status::Corrupt("control word: wrong length");
  if (w[kMembers] != world) {
    return Status::Corrupt("control word: member count " + std::to_string(w[kMembers]) + ", expected " +
                           std::to_string(world));
  }
  if (w[kStop] != 0 && w[kStop] != 1) return Status::Corrupt("control word: stop flag " + std::to_string(w[kStop]));
  ControlDecision d;
  d.stop = w[kStop] == 1;
  if (w[kVersion] == 0) return d;
  if (w[kVersion] < 0) return Status::Corrupt("control word: plan version " + std::to_string(w[kVersion]));
  Announcement a;
  a.version = w[kVersion];
  if (w[kVerdict] != static_cast<std::int32_t>(Verdict::kApply) && w[kVerdict] != static_cast<std::int32_t>(Verdict::kReject)) {
    return Status::Corrupt("control word: verdict " + std::to_string(w[kVerdict]));
  }
  a.verdict = static_cast<Verdict>(w[kVerdict]);
  a.strategy = StrategyFromCode(w[kStrategy]);
  if (!a.strategy && (w[kStrategy] != 0 || a.verdict == Verdict::kApply)) {
    return Status::Corrupt("control word: strategy " + std::to_string(w[kStrategy]));
  }
  if (a.verdict == Verdict::kApply) {
    if (w[kRestart] != 0 && w[kRestart] != 1) return Status::Corrupt("control word: restart " + std::to_string(w[kRestart]));
    a.effect.restart = w[kRestart] == 1;
    if (w[kPlacementCount] != 0 && w[kPlacementCount] != world) {
      return Status::Corrupt("control word: placement count " + std::to_string(w[kPlacementCount]));
    }
    if (w[kExcludeCount] < 0 || w[kExcludeCount] > kMaxPlanNodes) {
      return Status::Corrupt("control word: exclude count " + std::to_string(w[kExcludeCount]));
    }
    if (w[kWarmupCount] < 0 || w[kWarmupCount] > kMaxPlanStages) {
      return Status::Corrupt("control word: warm-up count " + std::to_string(w[kWarmupCount]));
    }
    a.effect.placement.assign(static_cast<std::size_t>(w[kPlacementCount]), -1);
    a.exclude_nodes.assign(static_cast<std::size_t>(w[kExcludeCount]), -1);
    a.effect.warmup.assign(static_cast<std::size_t>(w[kWarmupCount]), -1);
    for (int i = 0; i < dp; ++i) {
      const std::int32_t m = w[kCounts + static_cast<std::size_t>(i)];
      if (m < 1 || m > kMaxPlanMicroBatches) return Status::Corrupt("control word: micro-batches " + std::to_string(m));
      a.effect.micro_batches.push_back(m);
    }
  }
  d.plan = std::move(a);
  return d;
}

std::size_t PayloadSize(const Announcement& a) {
  return a.verdict == Verdict::kApply ? a.effect.placement.size() + a.exclude_nodes.size() + a.effect.warmup.size() : 0;
}

std::vector<std::int32_t> PackPayload(const Announcement& a) {
  std::vector<std::int32_t> p;
  if (a.verdict != Verdict::kApply) return p;
  p.insert(p.end(), a.effect.placement.begin(), a.effect.placement.end());
  p.insert(p.end(), a.exclude_nodes.begin(), a.exclude_nodes.end());
  p.insert(p.end(), a.effect.warmup.begin(), a.effect.warmup.end());
  return p;
}

Status UnpackPayload(std::span<const std::int32_t> payload, Announcement* a) {
  if (payload.size() != PayloadSize(*a)) return Status::Corrupt("plan payload: wrong length");
  const std::size_t np = a->effect.placement.size();
  const std::size_t nodes = np + a->exclude_nodes.size();
  for (std::size_t i = 0; i < payload.size(); ++i) {
    if (i >= nodes) {
      if (payload[i] < 0 || payload[i] > kMaxPlanWarmup) {
        return Status::Corrupt("plan payload: warm-up count " + std::to_string(payload[i]));
      }
      a->effect.warmup[i - nodes] = payload[i];
      continue;
    }
    if (payload[i] < 0 || payload[i] >= kMaxPlanNodes) {
      return Status::Corrupt("plan payload: node " + std::to_string(payload[i]));
    }
    if (i < np) a->effect.placement[i] = payload[i];
    else a->exclude_nodes[i - np] = payload[i];
  }
  return Status::Ok();
}

}  // namespace falcon::train
