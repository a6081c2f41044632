// falcon-train-emu: the emulated hybrid-parallel (TP x DP x PP, 1F1B) trainer. One process per
// rank under falcon-emu-run; compute is modelled time, communication is real NCCL calls through
// the emulator (or whatever libnccl.so.2 is loaded). See docs/trainer.md.
//
// main() only wires: parse flags, read the launcher's environment, validate the shape, run.
// Exit status: 0 ok, 1 a --check verification failed, 2 usage, setup or NCCL error.
// Thread-safety: single-threaded. Must never: run with a shape that does not match the world size.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bootstrap.h"
#include "job.h"
#include "layout.h"
#include "options.h"

int main(int argc, char** argv) {
  using falcon::train::Options;
  falcon::Result<Options> parsed = falcon::train::ParseOptions(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "falcon-train-emu: %s\n", parsed.status().message().c_str());
    return 2;
  }
  const Options& options = parsed.value();
  if (options.help) {
    std::printf("%s", falcon::train::UsageText().c_str());
    return 0;
  }
  const falcon::emu::JobEnv job = falcon::emu::ReadJobEnv();
  if (falcon::Status s = falcon::train::ValidateShape(options.shape, job.world_size); !s.ok()) {
    std::fprintf(stderr, "falcon-train-emu: %s\n", s.message().c_str());
    return 2;
  }
  falcon::train::JobEnvironment env;
  env.rank = job.rank;
  env.world_size = job.world_size;
  if (const char* plan = std::getenv("FALCON_EMU_FAULT_PLAN")) env.fault_plan = plan;
  if (const char* id = std::getenv("FALCON_EMU_ID_FILE")) env.id_file = id;
  if (const char* rpn = std::getenv("FALCON_EMU_RANKS_PER_NODE")) {
    const int n = std::atoi(rpn);
    if (n > 0) env.ranks_per_node = n;
  }
  const falcon::Status s = falcon::train::RunJob(options, env);
  if (s.ok()) return 0;
  std::fprintf(stderr, "falcon-train-emu: rank %d: %s\n", env.rank, s.ToString().c_str());
  return s.code() == falcon::Status::Code::kCorrupt ? 1 : 2;
}
