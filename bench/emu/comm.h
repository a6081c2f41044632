// Communicator state of the NCCL emulator (struct ncclComm, the type behind ncclComm_t), the
// registry of live communicators, per-communicator reduction operators, and error reporting.
//
// Thread-safety: NCCL's rule applies: a communicator is used by one thread at a time (its
// "owner"). Fields marked [owner] are touched only by the thread that currently drives it: the
// caller's thread, or the background progress thread (engine.h) while a job of a nonblocking
// communicator is in flight (`inflight` > 0; the caller takes them back after it reads
// `inflight` == 0, an acquire). `async_error`, `aborted`, `inflight` and `refs` are atomic and
// may be touched by any thread (ncclCommAbort and ncclCommGetAsyncError run on other threads);
// `last_error` is guarded by `mu`. The registry (IsLiveComm, Unregister) and the process-wide
// last-error text are guarded by internal mutexes. Invariants:
//  1. Lifetime is reference counted: the user's handle holds one reference (dropped by
//     Destroy/Abort, exactly once: whoever Unregister()s it), every Op holds one, every
//     background job holds one per communicator it drives. The object is freed by whichever
//     thread drops the last reference, so a thread blocked inside a call never sees freed memory.
//  2. `aborted` only goes false -> true (ncclCommAbort); every wait polls it (Op::Poll).
//  3. When an aborted communicator is freed, its rank is marked `gone` in the shared segment, so
//     peers waiting on it fail with ncclRemoteError like peers of a crashed process.
// Must never: throw across the C ABI, block, or touch a communicator that IsLiveComm rejects
// without holding a reference.
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
  bool blocking = true;  // ncclConfig_t.blocking (split/shrink children inherit the parent's)
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
  std::vector<bool> send_connected, recv_connected;  // first-use connection with each peer made
  // [owner] The CUDA driver emulator's event recorded after this communicator's last device work
  // (device.h), or null; destroyed with the communicator.
  void* device_event = nullptr;
  uint64_t device_launched = 0;  // [owner] units of device work queued on this communicator
  uint64_t splits = 0;
  uint64_t shrinks = 0;
  std::vector<falcon::emu::RedOpEntry> redops;
  bool finalized = false;
  bool revoked = false;

  std::atomic<int> async_error{ncclSuccess};
  std::atomic<bool> aborted{false};  // ncclCommAbort was called (invariant 2)
  std::atomic<int> inflight{0};      // background jobs driving this communicator (engine.h)
  std::atomic<int> refs{1};          // invariant 1
  std::atomic<uint64_t> device_done{0};  // units of device work finished (release; notified)
  std::mutex mu;
  std::string last_error;  // guarded by mu
};

namespace falcon::emu {

// Registry of communicators whose user handle is valid (created, not yet destroyed or aborted).
[[nodiscard]] bool IsLiveComm(const ncclComm* c);
// Removes `c` from the registry; true if this call did (the caller now owns the handle's
// reference and must Release it), false if it was not live.
[[nodiscard]] bool Unregister(ncclComm* c);

// Reference counting (invariant 1). REQUIRES for Retain: the caller holds a reference already
// or owns the live handle.
void Retain(ncclComm* c);
void Release(ncclComm* c);
// Holds a reference for a scope.
class CommRef {
 public:
  explicit CommRef(ncclComm* c) : c_(c) { if (c_) Retain(c_); }
  ~CommRef() { if (c_) Release(c_); }
  CommRef(const CommRef&) = delete;
  CommRef& operator=(const CommRef&) = delete;

 private:
  ncclComm* c_;
};

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

// Creates a communicator object in the kInitializing state and registers it (one reference:
// the handle's).
[[nodiscard]] ncclComm* NewComm(int rank, int nranks, uint64_t key, int device);
// Sets rank, size and the per-peer state of a communicator created before its membership was
// known (a split child). REQUIRES: the caller drives `c` ([owner]).
void SetGeometry(ncclComm* c, int rank, int nranks);
// Drops the user's handle: unregisters and releases its reference (the object is freed once
// nothing else holds it, unlinking an unfinished rendezvous). No-op if already dropped.
void DeleteComm(ncclComm* c);

// NCCL's ncclCommEnsureReady for nonblocking communicators: while a background job drives `c`,
// prints "NCCL WARN Attempt to use communicator before the previous operation returned
// ncclSuccess" to stderr and returns ncclInvalidArgument. REQUIRES: IsLiveComm(c).
[[nodiscard]] ncclResult_t EnsureReady(ncclComm* c, const char* op);
// What ncclCommGetAsyncError reports: ncclInProgress while a background job drives `c`, then
// the communicator's asynchronous error (or ncclSuccess).
[[nodiscard]] ncclResult_t AsyncState(const ncclComm* c);

// Returns ncclSuccess if `c` may run operations, else records and returns the error
// (EnsureReady first).
[[nodiscard]] ncclResult_t CheckUsable(ncclComm* c, const char* op);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_COMM_H_
