// ControllerState: everything the controller must not lose when it restarts (it lives in Redis,
// hash falcon:{job}:controller, message controller_state, field state_doc): the phase, the
// stream cursors (so no alarm, profile or ack is read twice or skipped), the ranks whose last
// alarm said slow (written apart, in the hash's field "slow": SlowJson), the open incident and
// the profiling verdict that validation works from.
// FromJson never trusts its input: a field of the wrong shape is reported and the state falls
// back to a fresh one (cursors kept where they are valid), so a corrupt hash costs at most a
// re-detection, never a crash.
// Thread-safety: a value type. Must never: do I/O.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace falcon::controller {

enum class Phase { kTracking, kProfiling, kValidating };
const char* PhaseName(Phase p);

struct SlowRank {
  double ratio = 1;
  double level_s = 0;
  double baseline_s = 0;
  std::int64_t onset_ns = 0;
};

struct Incident {
  std::string id;
  std::int64_t opened_ns = 0;
  std::vector<std::int64_t> ranks;  // slow at detection
  double healthy_s = 0;             // iteration time before it
  bool localised = false;           // a validation named the culprit(s)
  int attempts = 0;                 // validation rounds tried
  std::int64_t next_attempt_ns = 0;
  std::int64_t last_round_ns = 0;   // when the last validation round ended
  std::string cause = "unknown";
  nlohmann::json findings = nlohmann::json::object();
  std::string request;  // the controller_request id that opened or re-validated it, if any
  // The decision stage (mitigation.h): Mitigator::ToJson, null until a localisation started it.
  nlohmann::json mitigation;
  std::int64_t last_feed_ns = 0;  // when the planner was last fed the iteration time
  // A validation round under way only re-checks the culprits of a running mitigation; the
  // interval to the next one (doubles while they are still slow; 0 = the configured one).
  bool recheck = false;
  double recheck_interval_s = 0;
  bool revalidate = false;  // a new slowdown began while mitigating: re-check (at next_attempt_ns)
  int deferred_rounds = 0;  // rounds in a row whose outcome Redis did not take (each is redone)
  // The job's fastest iteration time (worst rank's recent median) seen while mitigating since
  // the last round ended; 0 = none yet. A new slowdown re-validates only above it.
  double best_since_round_s = 0;
  // The iteration time the job settled at under the plan in force (act mode), measured once the
  // plan, and the last round, have had time to show in the job's recent median (planner samples
  // and iterations: Controller::SettlePlanLevel); 0 = not yet. A plan hides its fault's end from
  // the detector, but one that leaves the job slower than its fault-free pace (healthy, or the
  // re-balanced split's: Mitigator::FaultFreeRatio) by half the suspicious-ratio margin shows it:
  // iterations below the midpoint of this level and that pace (Controller::FasterUnderPlan)
  // re-check the culprits at once instead of at the next recheck-s, or, where the pace is known
  // and the margin full, undo the plan at once.
  double plan_level_s = 0;
  std::int64_t plan_level_after_ns = 0;  // when to (re)measure plan_level_s; 0 = nothing to measure
  std::int64_t faster_since_ns = 0;      // since when the job runs faster than plan_level_s allows
  // When the recovery watch last saw every culprit's group still waiting for it (its window's
  // time; 0 = never): what a re-check round would have found, so the re-check timer runs from
  // the later of this and last_round_ns. Written with the next state write, not on its own: a
  // restart that loses the newest value only re-checks sooner.
  std::int64_t watch_seen_ns = 0;
};

struct ControllerState {
  Phase phase = Phase::kTracking;
  std::int64_t since_ns = 0;
  std::uint64_t incidents = 0;
  std::map<std::string, std::string> cursors;  // stream short name -> last entry id read
  std::map<std::int64_t, SlowRank> slow;
  std::optional<Incident> incident;
  std::int64_t profile_from_ns = 0;  // profiles must start after this to count
  nlohmann::json suspicion = nlohmann::json::object();  // ProfileVerdict as JSON
  std::optional<double> healthy_s;
  // When the last incident was resolved (0: none yet). Slow alarms from before it are about that
  // incident: the agents' detectors can take tens of seconds to call a rank recovered after a
  // plan is undone, so they open no new incident unless the job is slow again (Controller::Track).
  std::int64_t resolved_ns = 0;
  std::int32_t plan_version = 0;  // of the last plan published (falcon:{job}:plan)
  // Node numbering of the plans (JobView::SetNodes): fixed when the first mitigation starts, the
  // job's hosts sorted then the configured spares ("spare0", ...); empty until then.
  std::vector<std::string> node_hosts;
  // Placement in force after an S3/S4 plan every rank's framework applied in place; nodes left
  // out by S4 plans (never used as spares again).
  std::vector<std::int32_t> placement;
  std::vector<std::int32_t> excluded_nodes;
  // An act-mode S3/S4 plan waiting for every rank to apply it.
  std::int32_t pending_version = 0;
  std::vector<std::int32_t> pending_placement;
  std::vector<std::int32_t> pending_excluded;
};

// `with_slow` false leaves out "slow" (SlowJson's). The controller writes the slow ranks beside
// the document, in the hash's own field and only when an alarm changed them: at 16,384 ranks
// slow they are 1.5 MB, most of what the document would be, and the document is written every
// heartbeat.
nlohmann::json ToJson(const ControllerState& s, bool with_slow = true);
nlohmann::json SlowJson(const std::map<std::int64_t, SlowRank>& slow);
// SlowJson's inverse; throws std::invalid_argument saying what is wrong ("slow: ...").
std::map<std::int64_t, SlowRank> SlowFromJson(const nlohmann::json& j);
// `why` gets what was wrong (empty when all was fine).
ControllerState StateFromJson(const nlohmann::json& j, std::string* why);

// Stream entry ids "ms-seq": true when a < b.
bool StreamIdLess(const std::string& a, const std::string& b);
bool ValidStreamId(const std::string& id);
// The milliseconds part of a valid id (Redis's clock when the entry was added).
std::optional<std::uint64_t> StreamIdMs(const std::string& id);

}  // namespace falcon::controller
