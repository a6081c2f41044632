// Process-wide configuration of the NCCL emulator, read once from the environment (the table
// in docs/emulator.md lists every variable), plus the two process-wide facts the emulator learns
// at run time: the job epoch and this process's global rank.
//
// Thread-safety: Config() parses on first use under std::call_once and is immutable afterwards.
// The epoch and process rank are atomics set at most once (first writer wins).
// Must never: throw, abort on a bad value (a bad value becomes Config().error, which makes every
// communicator init fail with ncclInvalidArgument).
#ifndef FALCON_BENCH_EMU_EMU_CONFIG_H_
#define FALCON_BENCH_EMU_EMU_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fabric_model.h"
#include "fault_plan.h"

namespace falcon::emu {

struct EmuConfig {
  FabricParams fabric;
  double timeout_s = 0;               // FALCON_EMU_TIMEOUT_S: lenient peer deadline; 0 = wait forever (NCCL)
  double gpu_tflops = 10;             // FALCON_EMU_GPU_TFLOPS: modelled GEMM rate (0 = no model)
  double compute_noise = 0.03;        // FALCON_EMU_COMPUTE_NOISE: sigma of a kernel's lognormal noise (0 = none)
  uint64_t noise_seed = 0;            // FALCON_EMU_NOISE_SEED: mixed with the rank into each rank's seed
  int ranks_per_node = 8;             // FALCON_EMU_RANKS_PER_NODE
  std::vector<int> placement;         // FALCON_EMU_PLACEMENT: node of each global rank
  std::optional<int> global_rank;     // FALCON_EMU_RANK, else RANK
  std::optional<int> device;          // FALCON_EMU_DEVICE
  std::optional<int> local_rank;      // LOCAL_RANK
  std::optional<int64_t> epoch_ns;    // FALCON_EMU_EPOCH_NS
  size_t slot_bytes = 1 << 20;        // FALCON_EMU_CHUNK_BYTES (collective staging per rank)
  size_t p2p_chunk_bytes = 256 << 10; // FALCON_EMU_P2P_CHUNK_BYTES
  bool debug = false;                 // FALCON_EMU_DEBUG
  FaultPlan plan;                     // FALCON_EMU_FAULT_PLAN
  std::string job_state_name;         // FALCON_EMU_JOB_STATE: shm name of the job state (job_state.h)
  std::string error;                  // non-empty: the configuration is unusable

  // Launch node of a global rank: explicit placement if it covers the rank, else
  // rank / ranks_per_node. (The node now, after falconEmuSetPlacement: job_state.h CurrentNodeOf.)
  [[nodiscard]] int NodeOf(int rank) const;
};

[[nodiscard]] const EmuConfig& Config();

// CLOCK_MONOTONIC in nanoseconds.
[[nodiscard]] int64_t NowNs();

// The job epoch (CLOCK_MONOTONIC ns): FALCON_EMU_EPOCH_NS, else the first value offered here
// (the creation time of the first communicator, agreed through its segment).
void OfferEpochNs(int64_t ns);
[[nodiscard]] int64_t EpochNs();  // 0 while unknown
// Seconds since the epoch at `now_ns` (0 while the epoch is unknown).
[[nodiscard]] double JobSeconds(int64_t now_ns);

// This process's global rank: FALCON_EMU_RANK / RANK, else the first value offered (the rank in
// the first InitRank communicator).
void OfferProcessRank(int rank);
[[nodiscard]] int ProcessGlobalRank(int fallback);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_EMU_CONFIG_H_
