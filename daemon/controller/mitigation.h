// Mitigation: the controller's decision stage (FALCON §5; DESIGN.md "The controller").
//
// Once a validation has named the culprits of an incident, a Mitigator decides what to do about
// them. It prepares every candidate plan up front from the localisation and the job's layout:
//   S2  re-balance micro-batches across DP replicas (compute culprits only; needs the job's
//       micro-batches per replica, config micro_batches): replica i's time per micro-batch is
//       the slowest GEMM ratio among its culprit GPUs (1 for healthy replicas), bounded by the
//       pace at which 1F1B takes the slow iteration time measured (no replica is slower than
//       the job that waits for it);
//   S3  re-place nodes: link relief for a slow link, straggler consolidation for slow GPUs (no
//       S3 for a slow NIC: every placement keeps the node's inter-node traffic); when a slow
//       GPU and a slow link were named together and S3 is link relief, its plan carries S2's
//       micro-batch counts as well (the planner would never come back to S2 after S3), and
//       its stop undoes them like S2's;
//   S4  checkpoint-restart without the culprit nodes, onto spare nodes (config spare_nodes);
//   pipeline  (communication culprits only) new warm-up counts per pipeline stage when a slow
//       link joins two pipeline stages' nodes (Adaptra; analyzer/pipeline_plan.h): needs the
//       job's micro-batches per replica and its healthy and slow iteration times, from which
//       the link's delay is sized; the counts stay within config pipeline_activation_limit.
// A candidate that cannot be planned (no layout, S2 without micro-batch counts, a plan that
// gains nothing) is made unavailable (infinite overhead) with the reason kept. Then a ski-rental
// planner (analyzer/ski_rental.h) is fed the job's iteration time: it switches to the next
// strategy when the fail-slow has cost as much as that strategy's overhead. Every decision
// carries its plan in the protocol's plan fields (include/falcon/protocol.h), the expected gain
// and the reason. When the fail-slow ends, End() says whether S2's re-balancing must be undone
// (an S1 plan restoring the job's own counts).
//
// The layout (TP x DP x PP and the rank -> node placement) comes from the communicators: ranks
// are numbered Megatron-style (TP innermost, then DP, then PP; analyzer/topology_plan.h), the
// DP family is the family of job-partitioning communicators with the fewest calls (gradient
// synchronisation happens once per iteration, TP and PP traffic per layer or micro-batch), TP the
// stride-1 family otherwise. config job_shape overrides the inference.
//
// Thread-safety: values; one thread. Must never: do I/O, read clocks (time comes in), or emit a
// plan the analyzer's planners did not produce.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "analyzer/ski_rental.h"
#include "analyzer/topology_plan.h"
#include "daemon/controller/job_view.h"
#include "falcon/status.h"

namespace falcon::controller {

struct MitigationSettings {
  std::string mode = "advise";  // off: no decisions; advise: publish; act: also send to the agents
  analyzer::StrategyOverheads overheads;  // seconds of lost training per strategy
  std::int32_t micro_batches = 0;  // per DP replica in the job's own schedule; 0: S2 unavailable
  std::string job_shape;           // "TPxDPxPP"; empty: inferred from the communicators
  std::int32_t spare_nodes = 0;    // idle nodes an S4 restart may use (the controller names them spare0, ...)
  double sample_s = 1.0;           // how often the planner is fed the iteration time
  double recheck_s = 60;           // while S2 holds, re-validate the culprits this often (doubling)
  bool recovery_watch = true;      // while S2 holds for slow GPUs, watch their groups (recovery_watch.h)
  std::int32_t pipeline_activation_limit = 0;  // micro-batches' activations a stage may hold; 0: PP
};

// The job's iteration times when the mitigation starts: what sizes a slow pipeline link's delay,
// and what bounds a slow replica's pace in S2.
struct JobTiming {
  double healthy_s = 0;
  double slow_s = 0;
  // The slow pipeline links' delay per transfer as the round's profile timed it (0: not timed):
  // ProfiledLinkDelay.
  double profiled_link_delay_s = 0;
  // slow_s was measured under the job's own, even micro-batch split (false: under re-balanced
  // counts, as when the culprits change while an S2 is in force): only then does it bound a
  // replica's pace in S2, or size a slow pipeline link's delay the profile did not time.
  bool even_split = true;
};

// The delay per transfer that the slow links of `findings` (a localisation's detail, with its
// round's `suspicion`, whose `comms` are the profile's per-communicator evidence) add to the
// two-rank communicators joining their two hosts, as the profile timed them: the largest
// (metric_s - baseline_s) over those communicators the profile found suspicious — their transfer
// time per call against their class's median (the pipeline's stage pairs, whose sends and
// receives the profile times). 0 when none was timed.
[[nodiscard]] double ProfiledLinkDelay(const nlohmann::json& findings, const JobView& view);

// Overheads the job measured itself: what applying each strategy cost, as the frameworks reported
// it (falcon.h falconReportCost; the slowest rank's figure, since every rank waits for it), plus,
// for S2, the controller's own planning time. Unset: the configured overhead holds.
struct MeasuredOverheads {
  std::optional<double> rebalance_s, topology_s, restart_s, pipeline_s;
  [[nodiscard]] bool empty() const { return !rebalance_s && !topology_s && !restart_s && !pipeline_s; }
};

// The slowest live rank's reported cost per strategy (RankInfo::cost_s).
[[nodiscard]] MeasuredOverheads MeasuredFrom(const JobView& view);

struct JobLayout {
  analyzer::JobPlacement placement;  // shape, gpus_per_node, num_nodes, node_of_rank
  std::vector<std::string> hosts;    // node index -> host name
  std::vector<std::int32_t> spares;  // idle nodes an S4 restart may use (not excluded before)
};

// The job's layout from the view (and the job_shape override when non-empty): nodes are the
// view's hosts (its SetNodes numbering, spares included); idle nodes not in `excluded` are the
// spares. InvalidArgument naming the obstacle: ranks missing, uneven ranks per host, a shape
// that does not match the world size, communicators that do not reveal a shape.
[[nodiscard]] Result<JobLayout> InferLayout(const JobView& view, const std::string& job_shape,
                                            const std::vector<std::int32_t>& excluded = {});

// "2x4x2" -> {tp 2, dp 4, pp 2}. InvalidArgument otherwise.
[[nodiscard]] Result<analyzer::JobShape> ParseJobShape(const std::string& text);

struct Decision {
  analyzer::MitigationDecision planner;
  std::string strategy;        // S1..S4 (S1 for a stop)
  std::string from;            // the strategy in force before
  nlohmann::json plan;         // protocol plan fields but plan_version (strategy, micro_batches, ...)
  double expected_gain = 0;    // fraction of the slow iteration time the plan saves (model)
  std::string summary;         // one line for people
  bool publish_plan = false;   // a plan for frameworks (switches, and a stop that undoes S2)
};

class Mitigator {
 public:
  // Prepares the candidates for a localised incident. `findings` is the localisation's detail
  // (gpus, links, nics as the controller records them), `cause` compute | link | nic.
  // InvalidArgument for a cause without culprits or bad settings; a layout error only makes
  // S2/S3/S4 unavailable.
  // Each available candidate's overhead is the measured one where `measured` has it, else the
  // configured one; its "overhead_source" says which ("measured" | "configured").
  [[nodiscard]] static Result<Mitigator> Start(const MitigationSettings& settings,
                                               const std::string& cause,
                                               const nlohmann::json& findings,
                                               const Result<JobLayout>& layout,
                                               const MeasuredOverheads& measured = {},
                                               const JobTiming& timing = {});
  // From ToJson(); InvalidArgument when the document is not one this class wrote.
  [[nodiscard]] static Result<Mitigator> FromJson(const MitigationSettings& settings,
                                                  const nlohmann::json& doc);
  [[nodiscard]] nlohmann::json ToJson() const;

  // The job took iteration_s per iteration (healthy: healthy_s) for `iterations` iterations
  // ending at now_s. A decision when the planner switches.
  [[nodiscard]] Result<std::optional<Decision>> Observe(double now_s, double iteration_s,
                                                        double healthy_s, std::int64_t iterations);
  // Newly measured overheads for a running mitigation: every available candidate whose measured
  // overhead differs from the one it has (by more than 1 % and 10 ms) takes it, and the planner
  // re-sorts the strategies not yet applied. Returns one line per change ("S3 120 s -> 2.1 s
  // (measured)"), empty when nothing changed. InvalidArgument for a negative or NaN figure
  // (nothing is changed then).
  [[nodiscard]] Result<std::vector<std::string>> UseMeasured(const MeasuredOverheads& measured);

  // The fail-slow is over (or the incident closed): the stop decision.
  [[nodiscard]] Result<Decision> End(double now_s);

  [[nodiscard]] std::string current() const;  // S1..S4
  [[nodiscard]] bool rebalance_in_effect() const;
  // Adapted warm-up counts are in force (a pipeline decision not yet undone).
  [[nodiscard]] bool pipeline_in_effect() const;
  // The iteration time the plan in force should give once its fault has ended, as a multiple of
  // the healthy one: 1 for adapted warm-up counts alone (they only add slack), the fullest DP
  // replica's share for re-balanced micro-batches (S2, or an S3 carrying its counts; the
  // candidate's "fault_free_ratio"). None when no such plan is in force or its pace is unknown
  // (a placement, a restart, a document from before the figure existed).
  [[nodiscard]] std::optional<double> FaultFreeRatio() const;
  [[nodiscard]] bool stopped() const;
  // Candidates with their overheads, plans, gains, or why they are unavailable.
  [[nodiscard]] const nlohmann::json& candidates() const { return candidates_; }
  [[nodiscard]] double accumulated_slowdown_s() const;

 private:
  Mitigator(analyzer::RootCause cause, nlohmann::json candidates, analyzer::SkiRentalPlanner planner)
      : cause_(cause), candidates_(std::move(candidates)), planner_(std::move(planner)) {}
  Decision MakeDecision(const analyzer::MitigationDecision& d) const;
  // The strategy's plan re-balances micro-batches too (an S3 for a slow GPU and a slow link).
  [[nodiscard]] bool CarriesRebalance(const std::string& strategy) const;

  analyzer::RootCause cause_;
  nlohmann::json candidates_;  // {"S2": {overhead_s, plan?, expected_gain?, unavailable?}, ...}
  analyzer::SkiRentalPlanner planner_;
};

// What a localisation's findings blame: "gpu 5", "link [\"node1\",\"node2\"]" (hosts in order),
// "nic \"node4\"" (evidence left out).
[[nodiscard]] std::set<std::string> Culprits(const nlohmann::json& findings);

// Whether a re-check's findings name other culprits than the ones a mitigation (`strategy` in
// force) answers. Culprits that are gone count, except slow links while a re-placement (S3, S4)
// is in force: the placement routes the job's heavy traffic around them, so the round's profile
// no longer flags them, but they are still slow and the placement is still what helps.
[[nodiscard]] bool CulpritsChanged(const nlohmann::json& before, const nlohmann::json& after,
                                   const std::string& strategy);

}  // namespace falcon::controller
