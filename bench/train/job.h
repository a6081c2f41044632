// The run loop of one falcon-train-emu rank: builds the communicators and the trainer, runs
// iterations until rank 0 decides to stop, agrees on stop and mitigation plans through the
// control word (control_word.h: carried by the DP loss and MP grad-norm all-reduces, or with
// --world-sync a world all-reduce of its own), applies S1..S4 plans (job_run.h), records the
// ground truth and writes the report.
//
// Thread-safety: one training thread per process (and a watchdog thread, comms.h). Must never: let ranks disagree on the iteration at
// which they stop or switch plans (only the control word decides), or skip the report on an
// error that happens after the options were accepted.
#ifndef FALCON_BENCH_TRAIN_JOB_H_
#define FALCON_BENCH_TRAIN_JOB_H_

#include <string>

#include "falcon/status.h"
#include "options.h"

namespace falcon::train {

// What main() read from the environment (falcon-emu-run sets it).
struct JobEnvironment {
  int rank = 0;
  int world_size = 1;
  std::string fault_plan;   // FALCON_EMU_FAULT_PLAN (file or inline JSON); empty = none
  std::string id_file;      // FALCON_EMU_ID_FILE: unique-id exchange (restart rounds add a suffix)
  int ranks_per_node = 8;   // FALCON_EMU_RANKS_PER_NODE: GPUs per emulated node
  double id_timeout_s = 60; // wait for rank 0's unique id
};

// Runs the job. Returns Ok; Corrupt when --check found wrong data; another error (NCCL failure,
// bad fault plan, report I/O) otherwise. Messages are not printed here; main() prints them.
// REQUIRES: ValidateShape(options.shape, env.world_size) is Ok.
[[nodiscard]] Status RunJob(const Options& options, const JobEnvironment& env);

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_JOB_H_
