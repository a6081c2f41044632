// The run of one falcon-train-emu rank (private to job.cc and job_mitigation.cc): communicators,
// trainer, the per-iteration agreement, mitigation plans (S1..S4) and their costs, in-memory
// checkpoints and restarts, and the ground-truth report.
//
// Iteration boundary (every rank, in this order):
//  1. the control word (control_word.h): rank 0 proposes stop and at most one plan announcement
//     (polled from its PlanSource and resolved against the job: apply with its effect, or
//     reject); every rank learns the same decision in the same iteration: in the default
//     (Megatron) mode from the word carried by the iteration's DP loss and MP grad-norm
//     all-reduces (megatron_trainer.h), with --world-sync from a world all-reduce of the word;
//     a placement or excluded-node list follows as a broadcast from rank 0 on the world (a rare
//     world collective, only when a plan carries one);
//  2. a checkpoint when the next iteration is a multiple of --checkpoint-every;
//  3. an applied plan takes effect before the next iteration: S1/S2 set the micro-batch counts;
//     S3 installs the new placement in the emulator (falconEmuSetPlacement, every rank the
//     same), sleeps the modelled state move of the ranks that changed node, then all ranks meet
//     in a world barrier; S4 destroys the communicators, sleeps --restart-s, installs the
//     placement, re-creates the world (a fresh unique id per restart round) and the splits, and
//     rolls back to the last checkpoint; every rank then acks the plan (falconAckPlan, when the
//     shim is there), a rejected one with status 1.
// All ranks are quiescent before a plan is applied or the job stops (in the default mode every
// rank drains its streams first: the parameter all-gathers run ahead into the next iteration
// otherwise), so placement changes and communicator teardown never race with traffic.
//
// Thread-safety: one training thread per process (plus the communicators' watchdog thread,
// comms.h). Must never: let ranks disagree on the iteration at
// which they stop, switch plans or roll back (only the control word decides), or skip the
// report on an error that happens after the options were accepted.
#ifndef FALCON_BENCH_TRAIN_JOB_RUN_H_
#define FALCON_BENCH_TRAIN_JOB_RUN_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comms.h"
#include "control_word.h"
#include "device.h"
#include "fault_plan.h"
#include "job.h"
#include "megatron_trainer.h"
#include "mitigation_plan.h"
#include "model.h"
#include "plan_source.h"
#include "report.h"
#include "trainer.h"

namespace falcon::train {

class JobRun {
 public:
  JobRun(const Options& o, const JobEnvironment& env);
  [[nodiscard]] Status Run();

 private:
  // What an S4 restart rolls back to: the training state after iteration next_iter - 1. The
  // modelled model state is the iteration number itself (payloads are keyed by it), so a
  // rolled-back iteration recomputes exactly what it computed the first time.
  struct Checkpoint {
    int next_iter = 0;
  };

  // job.cc
  [[nodiscard]] Status LoadFaults();
  [[nodiscard]] Status Setup();
  [[nodiscard]] Status StartComms(int round);  // (re)creates comms_ and trainer_
  [[nodiscard]] Status Loop();
  [[nodiscard]] ControlDecision MakeProposal(int iter);  // rank 0's stop and plan; others: empty
  [[nodiscard]] Result<ControlDecision> Step(int iter);  // one iteration and its decision
  [[nodiscard]] Result<ControlDecision> Agree(const ControlDecision& proposal);  // --world-sync
  // The plan's placement / excluded-node payload from rank 0, on the world.
  [[nodiscard]] Status ReceivePayload(const ControlDecision& proposal, ControlDecision* d);
  [[nodiscard]] Status Barrier();
  [[nodiscard]] Status Drain();  // default mode: every stream idle
  void Progress(int iter) const;
  [[nodiscard]] double Now() const;  // seconds since the job epoch

  // job_mitigation.cc
  [[nodiscard]] std::optional<Announcement> Propose();  // rank 0
  // Applies an agreed plan; *next_iter may move back (restart).
  [[nodiscard]] Status Apply(const Announcement& a, double decided_at, int* next_iter);
  [[nodiscard]] Status MoveRanks(const std::vector<int>& to, double* modelled_s, std::uint64_t* moved_bytes);
  [[nodiscard]] Status Restart(const Announcement& a, double decided_at, const std::vector<int>& to, int* next_iter);
  [[nodiscard]] Status InstallPlacement(const std::vector<int>& to) const;
  // Returns whether a checkpoint was taken; with --checkpoint-save-ms its modelled save.
  [[nodiscard]] Result<bool> MaybeCheckpoint(int next_iter);

  // Fixed after construction / Setup.
  const Options o_;
  const JobEnvironment env_;
  const double local_start_;
  JobFacts facts_;
  std::optional<emu::FaultPlan> faults_;
  std::unique_ptr<PlanSource> source_;  // rank 0 only
  FalconAck ack_;

  // Training state (identical on every rank, except pending_rejection_).
  std::unique_ptr<Comms> comms_;
  std::unique_ptr<ComputeModel> compute_;
  std::unique_ptr<Device> device_;             // default mode
  std::unique_ptr<Trainer> trainer_;           // --world-sync
  std::unique_ptr<MegatronTrainer> mtrainer_;  // default mode
  ControlDecision proposal_;                   // this rank's contribution to the last word
  PlanState state_;
  std::int32_t version_in_force_ = 0;
  std::int32_t last_considered_ = 0;  // highest plan version applied or rejected
  std::string pending_rejection_;      // rank 0: why the plan it announces is rejected
  std::string pending_source_;
  Checkpoint checkpoint_;
  int restarts_ = 0;
  int highest_iter_run_ = -1;

  ReportData report_;
};

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_JOB_RUN_H_
