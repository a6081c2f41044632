// The per-iteration agreement of falcon-train-emu: a small int32 control word all-reduced (sum)
// on the world communicator at the end of every iteration, in which only rank 0 writes the stop
// flag and any plan announcement, and every rank adds 1 to a member count. Every rank therefore
// learns the same decision in the same iteration and applies it from the next one; the count
// proves that every rank took part.
//
//   [stop, member_count, plan_version, strategy, verdict, restart, placement_count,
//    exclude_count, warmup_count, m_0 .. m_{dp-1}]
//
// verdict: 0 no plan, 1 apply, 2 reject (the plan is invalid for this job; every rank acks it
// with a non-zero status). strategy: 1..5 (S1..S4, pipeline); 0 only on a rejected plan whose
// strategy is unknown. An applied plan carries its effect: the micro-batch counts in force
// from the next iteration (dp entries) and, when placement_count (0 or world), exclude_count or
// warmup_count (0: standard 1F1B, or pp) is non-zero, a payload that rank 0 broadcasts on the
// world right after the word: [placement (placement_count entries), exclude_nodes (exclude_count
// entries), warm-up counts in force from the next iteration (warmup_count entries)].
//
// Thread-safety: values and pure functions. Must never: trust a decoded word without the checks
// (member count, field ranges, payload sizes).
#ifndef FALCON_BENCH_TRAIN_CONTROL_WORD_H_
#define FALCON_BENCH_TRAIN_CONTROL_WORD_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "falcon/status.h"
#include "mitigation_plan.h"

namespace falcon::train {

enum class Verdict : std::int32_t { kApply = 1, kReject = 2 };

// A plan as rank 0 announces it.
struct Announcement {
  std::int32_t version = 0;
  std::optional<Strategy> strategy;  // absent only for a rejected plan of an unknown strategy
  Verdict verdict = Verdict::kApply;
  PlanEffect effect;                // kApply only; effect.placement empty = unchanged
  std::vector<int> exclude_nodes;   // kApply only, for the record
};

struct ControlDecision {
  bool stop = false;
  std::optional<Announcement> plan;
};

// This rank's contribution: rank 0 passes its proposal, the others an empty ControlDecision.
// REQUIRES: an applied plan's micro_batches has dp entries.
[[nodiscard]] std::vector<std::int32_t> PackControl(const ControlDecision& proposal, int dp);

// Decodes the summed word. Corrupt if the member count is not `world` or a field is out of
// range. An applied plan with a payload comes back with the payload's vectors sized (placement
// to world, exclude_nodes to its count) but not filled: PayloadSize / UnpackPayload do that.
[[nodiscard]] Result<ControlDecision> UnpackControl(const std::vector<std::int32_t>& summed, int world, int dp);

// Payload entries of an announcement (0: nothing to broadcast).
[[nodiscard]] std::size_t PayloadSize(const Announcement& a);
// Rank 0: the payload to broadcast.
[[nodiscard]] std::vector<std::int32_t> PackPayload(const Announcement& a);
// Every rank: fills the announcement's placement and exclude_nodes from the broadcast payload.
// Corrupt on a size mismatch or a negative node.
[[nodiscard]] Status UnpackPayload(std::span<const std::int32_t> payload, Announcement* a);

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_CONTROL_WORD_H_
