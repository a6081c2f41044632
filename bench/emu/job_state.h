// Job-wide runtime state of the NCCL emulator, shared by every process of one emulated job: the
// placement override (the emulated node of every global rank) that falconEmuSetPlacement installs
// when a framework re-places ranks (Falcon S3/S4). The fabric model charges every operation
// launched after a change by the ranks' new nodes; the fault plan's link and nic faults stay on
// physical node indices, and its compute faults on physical GPUs (below), so moving ranks off a
// slow link or GPU really changes the job's speed.
//
// Where: a POSIX shm object named by FALCON_EMU_JOB_STATE (falcon-emu-run exports
// "/falcon-emu-<uid>-job-<launcher pid>-<epoch>" and unlinks it when the job ends). Each process
// maps it lazily on first use (O_CREAT, mode 0600, sized to a fixed capacity; all zero = no
// override), so no process has to create it first. Without the variable, or when it cannot be
// mapped (one stderr line), there is no job state: SetPlacement fails with kNoJobState and every
// rank sits on its launch node.
//
// Layout: JobStateHeader, then int32 node_of_rank[kJobStateMaxRanks].
// Concurrency contract (between processes; every shared word is accessed through
// std::atomic_ref):
//  1. `magic` goes from 0 to kJobStateMagic once (CAS by whoever maps it first).
//  2. `generation` is even while no write is in progress. A writer CASes it from even g to g + 1
//     (writers exclude each other that way), stores `count` and the entries, then stores g + 2
//     (release). It only grows.
//  3. A reader loads `generation` (acquire), retries while it is odd, copies `count` and the
//     entries, fences (acquire) and reloads it: unchanged means the copy is consistent.
//  4. Waits for a writer are bounded (1 s); past it the reader keeps the placement it had and
//     the writer gives up with kBusy (only a process killed inside a write can cause that).
//
// Physical GPUs: the k-th lowest rank on a node runs on the node's k-th GPU (the analyzer's rule,
// docs/mitigation.md). A compute fault names the ranks of the *launch* placement, i.e. the GPUs
// they were launched on; PhysicalRankOf maps a rank's current seat (node, k) back to the launch
// rank that owned that GPU, so a rank moved to a spare node leaves its slow GPU behind and the
// rank moved onto it inherits the slowdown. Hang faults stay with the rank (a process behaviour).
//
// Thread-safety: every function may be called from any thread; the process-local cache of the
// override is guarded by a mutex. Must never: throw, wait without a deadline, or map the state
// with a mode other than 0600.
#ifndef FALCON_BENCH_EMU_JOB_STATE_H_
#define FALCON_BENCH_EMU_JOB_STATE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "comm.h"

namespace falcon::emu {

inline constexpr uint64_t kJobStateMagic = 0x46414C434F4E4A42ull;  // "FALCONJB"
inline constexpr int kJobStateMaxRanks = 65536;                    // the protocol's placement bound
inline constexpr int kJobStateMaxNode = 65535;

struct alignas(64) JobStateHeader {
  uint64_t magic;       // atomic
  uint64_t generation;  // atomic: seqlock word (contract 2, 3)
  int32_t count;        // atomic: entries of the override; 0 = none
  int32_t capacity;     // kJobStateMaxRanks (written with magic)
  uint8_t reserved[40];
};

enum class SetPlacementResult { kOk = 0, kInvalid = -1, kNoJobState = -2, kBusy = -3 };

// Installs `node_of_rank` (entry r = node of global rank r) as the job's placement; an empty span
// clears the override (back to the launch placement). Identical content is not rewritten.
// kInvalid: more than kJobStateMaxRanks entries or a node outside [0, kJobStateMaxNode].
[[nodiscard]] SetPlacementResult SetJobPlacement(std::span<const int> node_of_rank);

// Generation of the override this process would read now; 0 while there is no job state or it
// was never written. Cheap (one atomic load): callers compare it with what they cached.
[[nodiscard]] uint64_t JobPlacementGeneration();

// The node of `global_rank` now: the override when it covers the rank, else the launch node
// (Config().NodeOf).
[[nodiscard]] int CurrentNodeOf(int global_rank);

// The launch rank whose GPU `global_rank` runs on now (see "Physical GPUs"); -1 when its seat
// was no launch rank's (a spare node, or a seat past a node's launch ranks). Identity while no
// override is in force.
[[nodiscard]] int PhysicalRankOf(int global_rank);

// Brings comm->nodes up to date with the placement: kIfChanged is a no-op (one atomic load) while
// the generation is the one comm->nodes reflects. Owner thread only; does nothing before
// comm->globals is filled (a communicator still initialising).
enum class Refresh { kIfChanged, kAlways };
void RefreshCommNodes(ncclComm* comm, Refresh when);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_JOB_STATE_H_
