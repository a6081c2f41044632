// Test support: plans whose every field and entry is a function of the version, so that a
// reader can tell a consistent copy from a mix of two plans without knowing which plans were
// written. Shared by the plan-block tests and falcon-test-plan (tests/progs/plan_prog.cc).
// Header-only, standard library and falcon.h/shm_abi.h only. Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "falcon/shm_abi.h"

namespace falcon::testing {

enum PlanPatternPart : std::uint32_t { kPatternMicroBatches = 0, kPatternPlacement = 1, kPatternExclude = 2 };

inline constexpr std::uint32_t PatternCapacity(std::uint32_t part) {
  return part == kPatternMicroBatches ? FALCON_PLAN_MAX_MICRO_BATCHES
         : part == kPatternPlacement  ? FALCON_PLAN_MAX_PLACEMENT
                                      : FALCON_PLAN_MAX_EXCLUDE;
}

// Entries of `part` in plan `version`: mostly small plans, every 8th one filling (almost) the
// whole array, so that writes and copies race at every size.
inline constexpr std::uint32_t PatternCount(std::uint32_t version, std::uint32_t part) {
  const std::uint32_t cap = PatternCapacity(part);
  if (version % 8 == 0) return cap - version % 7;
  return (version * (part + 3)) % 17;
}

inline constexpr std::int32_t PatternValue(std::uint32_t version, std::uint32_t part, std::uint32_t i) {
  return static_cast<std::int32_t>(((version * 2654435761u) ^ (part << 28) ^ (i * 40503u)) & 0x7fffffffu);
}

inline constexpr std::uint32_t PatternStrategy(std::uint32_t version) { return version % 5; }
inline constexpr std::uint32_t PatternRestart(std::uint32_t version) { return version % 2; }
inline constexpr std::int64_t PatternIssuedNs(std::uint32_t version) { return std::int64_t{version} * 1000 + 7; }

}  // namespace falcon::testing
