// ValidationRun: one validation round as a state machine the controller drives from its loop:
// pause every rank at a consistent cut, run the planned benchmark steps (validation_steps.h)
// one at a time, resume, and hand over the measurements as a localisation input.
//  - Pause: first `cut_info` to every agent: each rank's last period of ordered calls. From them
//    PlanCut (analyzer/cut_plan.h) picks the earliest consistent cut at least `pause_lead_s`
//    ahead of every rank (extrapolated with each rank's pace and the age of its pattern), with
//    no collective spanning the job needed; the pause carries per-rank, per-communicator targets.
//    When no rank pattern is to be had (no period locked yet) and a communicator spans every
//    live rank, the cut falls back to call `seq` of that communicator, placed the same way from
//    its reported call rate. A cut some rank had already passed ("missed") or stopped off plan
//    ("misaligned") is retried further ahead, up to `pause_attempts` times. With neither (a
//    fresh controller has not measured call rates: that takes two reports), it waits up to
//    `ack_timeout_s` before giving up.
//  - Each step sends its commands, then waits for every ack up to `ack_timeout_s`. A task that
//    failed or was never acked leaves its measurement out; the round goes on.
//  - Re-measuring (`remeasure`): when the steps are done and the findings are ambiguous (more than
//    one culprit, a NIC only some of whose links were slow, or a slow link that rests on a single
//    slow transfer across its node pair, or a finding less than `remeasure_below` x its
//    baseline), the steps that produced a finding
//    run once more before the resume and each measurement keeps the lower of its two values.
//    Interference (a starved host, a co-scheduled process) only ever adds time and rarely hits
//    the same transfers twice, whereas a fail-slow slows both runs: what noise made of a slow link
//    (a second slow link, a NIC, one preempted transfer) is taken back, a real culprit stays. A
//    clean finding (one GPU, one link slow in two or more transfers, a NIC slow to every peer)
//    keeps the pause short. A measurement taken back lowers its baseline's median, so a result
//    just short of a threshold may pass it afterwards, never measured twice: one more pass
//    re-measures such new findings, and only them, ambiguous or not.
//    Exchanges are re-measured alone (`remeasure_alone`): each suspect exchange in a step of its
//    own, after a reference exchange of the same kind (intra-node, inter-node) also alone — the
//    one at the median of its kind's first measurements, i.e. what the baseline stands for. The
//    suspect's new value is its alone time scaled by the reference's (reference's first time x
//    suspect alone / reference alone), so it is judged against the same baseline. Exchanges run
//    side by side in a step share what sits between them (a PCIe switch or NIC two GPUs share,
//    the hosts' CPUs, the fabric's spine), and an exchange slowed by its step-mates measures
//    slow again when its step runs again; alone it does not, while a slow link stays slow alone.
//    More suspect exchanges than `remeasure_alone_max`, or a kind with no other exchange to
//    serve as reference: their steps run again instead.
//  - Any pause failure, and the end of the steps, lead to resume. Resume is sent even when the
//    pause never fully took (agents release only what they trapped), and the shims' own deadline
//    (`max_pause_s`) releases the job if nobody resumes it.
// Thread-safety: one thread (the controller's). Must never: do I/O (commands go out through
// Next()'s return value), or wait: every state has a deadline checked in Next().
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "analyzer/localize.h"
#include "daemon/controller/job_view.h"
#include "daemon/controller/validation_steps.h"
#include "daemon/protocol/messages.h"

namespace falcon::controller {

enum class Statistic { kMin, kMedian };

struct ValidationSettings {
  Statistic statistic = Statistic::kMin;  // which repetition time stands for a benchmark
  double pause_lead_s = 1.0;
  double max_pause_s = 60;
  int pause_attempts = 3;
  // analyzer::CutOptions::iteration_start_tries: cut where the device has little queued work.
  int cut_iteration_tries = 2;
  double ack_timeout_s = 20;
  // As analyzer/validation_plan.h: large enough that throughput, not launch latency, is timed.
  std::int64_t gemm_size = 4096;
  std::string gemm_dtype = "fp32";  // fp32 | bf16 | fp16 (protocol's validate.dtype)
  std::int64_t gemm_repeats = 5;
  std::int64_t p2p_bytes = std::int64_t{64} << 20;
  std::int64_t p2p_repeats = 5;
  bool remeasure = true;                   // re-measure ambiguous findings (see above)
  bool gemm_first = true;                  // a sweep round skips its transfers once GEMM names a GPU
  bool remeasure_alone = true;             // re-measure suspect exchanges alone (see above)
  std::size_t remeasure_alone_max = 8;     // ... up to this many; more: their steps run again
  // A finding below this x its baseline is ambiguous too: close enough to the threshold
  // (gemm_ratio, link_ratio) for one interfered-with measurement to have made it.
  double remeasure_below = 1.5;
  analyzer::LocalizationOptions localization;  // what counts as a finding, as the controller's
};

struct OutgoingCommand {
  std::string host;  // "" = every agent, through the broadcast stream (JobView::Broadcast)
  protocol::Command command;
};

// One command for every agent host: a single broadcast entry (host "") when every agent reads
// the broadcast stream, else one per host, each made by `make` (so each has an id of its own).
// `await(id, host)` is called for every agent host with the id that host will ack.
[[nodiscard]] std::vector<OutgoingCommand> ToEveryAgent(
    const JobView& view, const std::function<protocol::Command()>& make,
    const std::function<void(const std::string& id, const std::string& host)>& await);

// Why findings call for a second measurement ("" when they are clean): more than one culprit, or
// a NIC that only some of its peers found slow (a slow NIC slows every link it carries, so the
// rest of its slow links may be noise, or a slow link's neighbour). Slow exchanges between the
// same two nodes are one link: a congested node pair slows every rank pair across it. A finding
// less than `marginal_ratio` x its baseline is ambiguous whatever else was found (0: none is).
[[nodiscard]] std::string RemeasureReason(const analyzer::Localization& findings, double marginal_ratio = 0);

// The round's GEMM times as the incident shows them: {"gemm_s": {rank: s}} with every rank up to
// `listed` ranks; past that the slowest `listed`, and "gemm_spread" {ranks, max_s, median_s,
// min_s} over them all. The summary is the incident's, in every state write while it lasts: at
// 16,384 ranks the whole table was 0.46 MB.
inline constexpr std::size_t kListedGemms = 256;
[[nodiscard]] nlohmann::json GemmTimesJson(const std::vector<analyzer::GemmMeasurement>& gemms,
                                           std::size_t listed = kListedGemms);

class ValidationRun {
 public:
  // `id` prefixes every command id ("<id>-1", ...). Steps come from PlanValidationSteps.
  // `release_first`: begin with a resume to every agent (a pause an earlier controller or round
  // may have left), then pause.
  ValidationRun(std::string id, std::vector<ValidationStep> steps, ValidationSettings settings,
                bool release_first);

  // A sweep (the profile singled out no communicator, so every one is planned): once the GEMM
  // steps name a slow GPU cleanly (no RemeasureReason), the transfers are skipped — the profile
  // found every communicator alike, which is what a compute fault looks like, and a sweep's
  // dozen-odd steps would only lengthen the pause. GEMM naming nobody (or an ambiguous finding)
  // runs the sweep as planned. Call before the first Next().
  void SkipSweepAfterCleanGemm() { gemm_first_ = true; }

  // Advances on deadlines and on acks received; returns the commands to send now.
  std::vector<OutgoingCommand> Next(const JobView& view, std::int64_t now_ns);
  // A validated ack from the acks stream; ones for other commands are ignored. Kept as given:
  // pass an rvalue (a GEMM step's 2,048 acks at 16,384 ranks were each deep-copied here).
  void OnAck(nlohmann::json ack);
  // Frees the acks of the steps that are over. Next() only sets them aside, so that the next
  // step's commands go out first: freeing 2,048 acks took 10-20 ms of the pause at 16,384 ranks.
  void FreeAnswered() { answered_.clear(); }

  [[nodiscard]] bool done() const { return phase_ == Phase::kDone; }
  [[nodiscard]] bool paused() const { return paused_; }  // the pause took on every rank
  // A pause or release is out and not yet answered in full: from the pause command (ranks stop
  // at their cut one by one and wait there) until the resume's or release's acks.
  [[nodiscard]] bool stopping() const {
    return phase_ == Phase::kAwaitPause || phase_ == Phase::kStep || phase_ == Phase::kAwaitStep ||
           phase_ == Phase::kResume || phase_ == Phase::kAwaitResume;
  }
  [[nodiscard]] bool completed() const { return done() && paused_ && cursor_ == order_.size(); }
  [[nodiscard]] const std::string& failure() const { return failure_; }  // "" unless it failed

  // The measurements, as Localize() wants them (views into this object: keep it alive).
  [[nodiscard]] analyzer::LocalizationInput Input() const;
  // Pause length, steps, failures, per-rank results (GemmTimesJson): for the incident's evidence.
  [[nodiscard]] nlohmann::json Summary() const;

 private:
  enum class Phase { kPause, kAwaitCutInfo, kAwaitPause, kStep, kAwaitStep, kResume, kAwaitResume, kDone };
  std::vector<OutgoingCommand> SendCutInfo(const JobView& view, std::int64_t now_ns);
  std::string NoCutReason(const JobView& view) const;  // why a round found no cut
  // From the cut_info acks: the planned cut's pause, else the one-communicator cut (SendPause).
  std::vector<OutgoingCommand> SendPlannedPause(const JobView& view, std::int64_t now_ns);
  std::vector<OutgoingCommand> SendPause(const JobView& view, std::int64_t now_ns);
  std::vector<OutgoingCommand> SendStep(const JobView& view, std::int64_t now_ns);
  // The step's commands, one per host and task (SendStep, when it cannot broadcast).
  std::vector<OutgoingCommand> StepPerHost(const ValidationStep& step, const JobView& view, std::int64_t now_ns);
  std::vector<OutgoingCommand> SendResume(const JobView& view, std::int64_t now_ns);
  void FinishPause(const JobView& view, std::int64_t now_ns);
  void FinishStep(const JobView& view, std::int64_t now_ns);
  bool FinishVcommStep(const ValidationStep& step, std::int64_t now_ns);  // true if `step` was a vcomm step
  void PlanRemeasure();  // after the last step: append the steps to run again, if any
  bool PlanProbe(const JobView& view);  // after the last step: one step telling NICs from links
  bool RunBefore() const;  // the step at cursor_ ran earlier in this round (a re-measurement)
  // An exchange measured alone in a step of its own (PlanAlone), and where its first
  // measurement sits.
  struct Alone {
    std::int32_t sender = -1, receiver = -1;  // as in its first measurement
    std::uint32_t pass = 0;
    bool judged = true;
    int kind = 0;            // of link: see PlanAlone
    bool reference = false;  // the reference exchange of its kind, not a suspect
  };
  // Appends, for the suspect exchanges `pairs`, the steps measuring them alone after a
  // reference of each kind; names them in `names`. False (nothing appended) when it cannot.
  bool PlanAlone(const std::set<std::pair<std::int64_t, std::int64_t>>& pairs, nlohmann::json& names);
  // An alone step's exchange took `seconds`: keep the reference, or scale and merge a suspect.
  void FinishAlone(const Alone& a, double seconds, nlohmann::json& log_entry);
  void SkipSweepIfGemmNamed();  // after a GEMM step: see SkipSweepAfterCleanGemm
  bool AllAcked() const;
  void NewStep();  // a step's commands go out: the last step's acks set aside (answered_)
  void SetGemm(protocol::Command& cmd) const;
  // A command of `type` for every agent host (controller::ToEveryAgent), awaited from each.
  std::vector<OutgoingCommand> AwaitFromEveryAgent(const JobView& view, const std::string& type, std::int64_t now_ns);
  // The step is a GEMM on every live rank that has an agent, and on no other.
  static bool EveryLiveRank(const ValidationStep& step, const JobView& view);
  protocol::Command NewCommand(const std::string& type, std::int64_t now_ns, double timeout_s);

  const std::string id_;
  std::vector<ValidationStep> steps_;  // the planned steps, then the probe step if any
  const ValidationSettings settings_;

  Phase phase_ = Phase::kPause;
  std::int64_t deadline_ns_ = 0;
  std::int64_t sent_ns_ = 0;  // when the pause or the current step went out (the log's "ms")
  // (command id, host) -> its ack, once in: a broadcast command is one id acked by every host.
  std::map<std::pair<std::string, std::string>, std::optional<nlohmann::json>> pending_;
  std::vector<decltype(pending_)> answered_;  // finished steps' acks, until FreeAnswered()
  int commands_ = 0;
  int pause_attempt_ = 0;
  double lead_s_ = 0;
  bool paused_ = false;
  bool retry_pause_ = false;
  std::int64_t cut_wait_deadline_ns_ = 0;  // give up waiting for a cut communicator then
  std::int64_t cut_info_ns_ = 0;           // when cut_info went out
  std::int64_t cut_retry_ns_ = 0;          // no cut_info before then (patterns not ready)
  std::string cut_failure_;                // why the last planned cut was not possible
  std::vector<std::size_t> order_;  // indices into steps_: each once, then those re-measured
  std::size_t cursor_ = 0;          // into order_: the step under way or next
  int remeasure_passes_ = 0;  // PlanRemeasure: at most two, the second for what the first made
  std::set<std::int64_t> remeasured_gpus_;  // ranks and exchanges already planned again
  std::set<std::pair<std::int64_t, std::int64_t>> remeasured_pairs_;
  bool probe_planned_ = false;
  bool gemm_first_ = false;  // SkipSweepAfterCleanGemm
  std::string p2p_skipped_;  // why the planned transfers did not run, if GEMM made them moot
  std::size_t steps_done_ = 0, steps_again_ = 0;
  std::int64_t paused_ns_ = 0, resumed_ns_ = 0;
  std::string failure_;
  std::string vcomm_blob_;   // the validation communicator's unique id (hex), from "vcomm id"
  std::string p2p_failure_;  // why no transfer ran, if the validation communicator failed
  nlohmann::json log_ = nlohmann::json::array();
  std::vector<analyzer::TransferMeasurement> transfers_, peer_transfers_;
  std::vector<analyzer::GemmMeasurement> gemms_;
  // Where each measured exchange (pass, sender, receiver) and GEMM (rank) sits in its list.
  std::map<std::tuple<std::uint32_t, std::int32_t, std::int32_t>, std::size_t> transfer_at_, peer_transfer_at_;
  std::map<std::int32_t, std::size_t> gemm_at_;
  std::map<std::size_t, Alone> alone_;  // index into steps_ -> the exchange that step measures alone
  std::map<int, std::pair<double, double>> reference_;  // link kind -> reference's (alone, first) seconds
};

}  // namespace falcon::controller
