// The profiling phase's verdict (FALCON §4.3) from the agents' comm_profile reports: which
// communicators do the same work (classes, analyzer/comm_classes.h), which are slower than their
// class (> suspicious_ratio x class median), and which ranks are compute suspects (in a
// communicator, the rank that waits least in its calls arrives last: its compute is slow).
//  - A communicator's signature is the set of (op, bytes) it carries, from its members' profile
//    windows. Windows are not aligned to iterations, so counts are not compared: two TP groups
//    whose windows held 301 and 300 iterations are still one class.
//  - Its metric is its transfer time per call (profile or sample mode timings: device time where
//    the shim had CUDA events): per collective signature the least median over its members (the
//    last to arrive waits for nobody), per point-to-point transfer the lesser of its two ends,
//    weighted by calls. Waiting for a slow member does not make a group look slow.
//  - Compute suspect: per communicator, rows = its signatures, columns = members, cell = that
//    member's median duration of that signature; analyzer::FindComputeSuspect decides.
// Thread-safety: stateless functions. Must never: do I/O, or use a profile it was not given
// validated.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <vector>

#include "analyzer/comm_classes.h"
#include "daemon/controller/job_view.h"
#include "falcon/status.h"

namespace falcon::controller {

struct ComputeSuspectFinding {
  std::int64_t rank = -1;  // global
  std::uint64_t comm = 0;
  double wait_gap = 0;
  double confidence = 0;
};

struct ProfileVerdict {
  std::vector<std::uint64_t> suspicious;  // communicators slower than their class
  std::vector<std::uint64_t> peers;       // healthy communicators of the suspicious ones' classes
  std::vector<std::vector<std::uint64_t>> classes;  // every class with data, by comm id
  std::vector<ComputeSuspectFinding> compute_suspects;
  std::size_t ranks_with_timings = 0;
  nlohmann::json evidence = nlohmann::json::array();  // per communicator: class, metric, ratio
};

// `profiles`: the newest validated comm_profile message per global rank.
[[nodiscard]] Result<ProfileVerdict> AnalyzeProfiles(
    const JobView& view, const std::map<std::int64_t, nlohmann::json>& profiles,
    const analyzer::SuspicionOptions& suspicion);

// A comm_profile's numeric member `key` of `o`, NaN when absent or not a number (the profiles
// are validated as a whole, their signature entries field by field where they are read).
[[nodiscard]] double ProfileNumber(const nlohmann::json& o, const char* key);

}  // namespace falcon::controller
