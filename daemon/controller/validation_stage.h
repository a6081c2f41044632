// ValidationStage: the controller's validation stage (docs/controller.md "What it does",
// Validation). One round at a time: it plans the round's steps from the profiling verdict
// (GEMM on every live rank, P2P over the suspicious communicators and their peers:
// validation_steps.h), runs it (ValidationRun: pause at a cut, steps, resume) and, once it is
// done, localises (analyzer::Localize) and words the verdict: the slow GPUs, links and NICs,
// their ranks and hosts, the cause and the evidence for the `localisation` entry.
// Controller owns the incident: it starts rounds, feeds acks, sends what Next returns and
// writes the verdict.
// Thread-safety: a value type for one thread (the controller loop). Must never: do I/O, read a
// clock (times are the caller's), or trust a message it was not given validated.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/controller/job_view.h"
#include "daemon/controller/validation_run.h"
#include "daemon/controller/validation_steps.h"
#include "falcon/status.h"

namespace falcon::controller {

// What a finished round found.
struct RoundVerdict {
  bool localised = false;            // it named a slow GPU, link or NIC
  std::string cause = "unknown";     // compute | nic | link | unknown
  std::vector<std::int64_t> ranks;   // the culprit GPUs' ranks and the slow links' ends, ascending
  std::string summary;               // "slow GPU: rank 5 on node2 (GEMM 2.00x median); ..."; "" none
  nlohmann::json detail;             // validation (the round's summary), gpus, links, nics,
                                     // unassessed; or error (Localize refused the measurements)
  std::string failure;               // why the round did not complete; "" it did
};

class ValidationStage {
 public:
  // settings.localization: what counts as a slow GPU or link, for re-measuring and the verdict.
  ValidationStage(ValidationSettings settings, StepOptions steps) : settings_(std::move(settings)), steps_(steps) {}

  // Plans round `id` over the communicators named in `suspicion` ("suspicious" are judged,
  // "peers" give baselines; hex ids). `release_first`: resume every agent before the pause (a
  // pause an earlier round or controller may have left). InvalidArgument when no plan is made.
  Status Start(const JobView& view, const nlohmann::json& suspicion, const std::string& id, bool release_first);
  [[nodiscard]] bool running() const { return run_ != nullptr; }
  [[nodiscard]] bool done() const { return run_ != nullptr && run_->done(); }
  // The round holds the job: every rank paused, and the round not done (its resume not yet acked).
  [[nodiscard]] bool holding() const { return run_ != nullptr && run_->paused() && !run_->done(); }
  // Ranks may be waiting on the round: its pause is out (the first ranks wait at their cut for
  // the last), it holds the job, or its release is out (ValidationRun::stopping).
  [[nodiscard]] bool stopping() const { return run_ != nullptr && run_->stopping(); }
  // A validated ack: fed to the round under way (moved in: see ValidationRun::OnAck).
  void OnAck(nlohmann::json m);
  // Frees the acks of the round's finished steps: call once Next()'s commands are sent.
  void FreeAnswered() {
    if (run_) run_->FreeAnswered();
  }
  // The commands to send now for the round under way (none when there is none).
  std::vector<OutgoingCommand> Next(const JobView& view, std::int64_t now_ns);
  // The finished round's verdict; the round is over after it.
  RoundVerdict Finish(const JobView& view);
  // Drops the round under way (an outage: the next one releases first).
  void Abandon() { run_.reset(); }
  // The commands that resume every agent of `view` (leaving: never a job paused behind us).
  std::vector<OutgoingCommand> Release(const std::string& id, const JobView& view, std::int64_t now_ns) const;

 private:
  ValidationSettings settings_;
  StepOptions steps_;
  std::unique_ptr<ValidationRun> run_;
};

// The verdict on `loc` (Localize's outcome over `run`'s measurements) in `view`'s host names.
RoundVerdict VerdictOf(const Result<analyzer::Localization>& loc, const ValidationRun& run, const JobView& view);

}  // namespace falcon::controller
