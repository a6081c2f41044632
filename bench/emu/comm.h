// Communicator state of the NCCL emulator (struct ncclComm, the type behind ncclComm_t), the
// registry of live communicators, per-communicator reduction operators, and error reporting.
//
// Thread-safety: NCCL's rule applies: a communicator is used by one thread at a time (its
// "owner"). Fields marked [owner] are touched only by that thread; `async_error` is atomic and
// `last_error` is guarded by `mu`. The registry (IsLiveComm, Register/Unregister) and the
// process-wide last-error text are guarded by internal mutexes.
// Must never: throw across the C ABI, block, or touch a communicator that IsLiveComm rejects.
#ifndef FALCON_BENCH_EMU_COMM_H_
#define FALCON_BENCH_EMU_COMM_H_

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "datatypes.h"
#include "shm_segment.h"

namespace falcon::emu {

inline constexpr uint64_t kCommMagic = 0x434F4D4D454D5531ull;

// A PreMulSum operator created by ncclRedOpCreatePreMulSum.
struct RedOpEntry {
  bool live = false;
  DType dtype = DType::kFloat32;
  bool device_residence = false;  // read *ptr when the collective runs
  const void* ptr = nullptr;
  Scalar scalar;                  // host-immediate value
};

enum class CommState { kInitializing, kReady, kFailed };

}  // namespace falcon::emu

struct ncclComm {
  // Fixed after construction.
  uint64_t magic = falcon::emu::kCommMagic;
  int rank = 0;
  int nranks = 0;
  int device = 0;
  uint64_t key = 0;
  std::string label;  // "comm <key>:<rank>/<n>" for messages

  // [owner] Set by the init state machine.
  falcon::emu::CommState state = falcon::emu::CommState::kInitializing;
  std::unique_ptr<falcon::emu::Segment> seg;
  std::vector<int> globals;  // global rank of each member
  std::vector<int> nodes;    // emulated node of each member now (job_state.h RefreshCommNodes)
  uint64_t nodes_generation = 0;  // the job placement generation `nodes` reflects

  // [owner] Sequencing: indices are assigned at launch, in submission order.
  uint64_t colls_launched = 0;
  uint64_t colls_done = 0;
  uint64_t last_step = 0;  // last collective step allocated
  std::vector<uint64_t> sends_launched, sends_done, recvs_launched, recvs_done;  // per peer
  std::vector<uint64_t> send_cursor, recv_cursor;  // last channel chunk used, per peer
  uint64_t splits = 0;
  uint64_t shrinks = 0;
  std::vector<falcon::emu::RedOpEntry> redops;
  bool finalized = false;
  bool revoked = false;

  std::atomic<int> async_error{ncclSuccess};
  std::mutex mu;
  std::string last_error;  // guarded by mu
};

namespace falcon::emu {

// Registry of communicators that exist (created and not yet destroyed).
void RegisterComm(ncclComm* c);
void UnregisterComm(ncclComm* c);
[[nodiscard]] bool IsLiveComm(const ncclComm* c);

// Records `text` as the last error (process-wide and on `comm` if given), prints it to stderr
// when `loud` or FALCON_EMU_DEBUG is set, and returns `code`.
enum class Loud { kNo, kYes };
ncclResult_t Fail(ncclResult_t code, ncclComm* comm, const std::string& text, Loud loud = Loud::kNo);
// Marks the communicator failed asynchronously (CommGetAsyncError reports `code`).
void SetAsyncError(ncclComm* comm, ncclResult_t code);
[[nodiscard]] const char* LastErrorText(ncclComm* comm);

// Shared-memory name for a communicator key.
[[nodiscard]] std::string SegmentName(uint64_t key);
// Deterministic child key (split / shrink) from the parent key and a salt.
[[nodiscard]] uint64_t DeriveKey(uint64_t parent, uint64_t a, uint64_t b, uint64_t c);

// Creates a communicator object in the kInitializing state and registers it.
[[nodiscard]] ncclComm* NewComm(int rank, int nranks, uint64_t key, int device);
// Unregisters and frees it (unlinking an unfinished rendezvous).
void DeleteComm(ncclComm* c);

// Returns ncclSuccess if `c` may run operations, else records and returns the error.
[[nodiscard]] ncclResult_t CheckUsable(ncclComm* c, const char* op);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_COMM_H_
