// The unit of work of the emulator's progress engine: every NCCL call that communicates (init,
// collectives, send/recv, split, shrink) becomes an Op, a non-blocking state machine. GroupEnd (or
// an ungrouped call) launches its ops in submission order and polls them until all finish, so
// ops of several communicators and of several ranks in one thread progress together.
//
// Thread-safety: an Op is launched (and connected) by the thread that submitted it and then
// driven by that thread (blocking communicators without a device), by the worker of its device
// stream (blocking communicators over the CUDA driver emulator, device.h), or by the background
// progress thread (nonblocking ones, engine.h). Launch touches only the communicator's
// `*_launched` counters and Step only its `*_done` counters and cursors, so the host may launch
// while the device steps earlier ops of the same communicator. It holds a reference to its communicator for its whole life (comm.h invariant 1).
// Must never: block or sleep inside Launch/Step (waiting is the engine's job), throw.
#ifndef FALCON_BENCH_EMU_OP_H_
#define FALCON_BENCH_EMU_OP_H_

#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm.h"

namespace falcon::emu {

enum class Progress { kPending, kAdvanced, kDone, kFailed };

class Op {
 public:
  explicit Op(ncclComm* comm) : comm_(comm) { Retain(comm_); }
  virtual ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  // Called once, in submission order, by the submitting thread: takes sequence numbers.
  virtual void Launch() {}
  // One attempt to advance: fails the op with ncclInternalError once its communicator was
  // aborted (what NCCL's waits return when they see the abort flag), else Step().
  [[nodiscard]] Progress Poll(int64_t now_ns);
  // The communicator this op creates (split/shrink child), known after Launch; else null.
  [[nodiscard]] virtual ncclComm* child() const { return nullptr; }
  // Modelled seconds of this op if it started now (ncclGroupSimulateEnd).
  [[nodiscard]] virtual double ModelSeconds() const { return 0; }
  // True for collectives and send/recv: work that runs on the device's stream (device.h);
  // init, split, shrink and finalize run in the host thread.
  [[nodiscard]] virtual bool device_work() const { return false; }
  // One non-blocking attempt at the host-side connection ncclGroupEnd makes before the device
  // work is queued (first send/recv between a pair: both must have arrived). After Launch.
  [[nodiscard]] virtual Progress Connect(int64_t /*now_ns*/) { return Progress::kDone; }

  // Makes the op wait, in Poll, until the device reached `mark` (device.h MarkStream; owned by
  // the op from now on): a nonblocking communicator's op starts after its stream's earlier work.
  void set_gate(void* mark) { gate_ = mark; }

  // A fresh, unlaunched op with the same arguments and stream (a CUDA graph replays a captured
  // call as a new op each time); null for ops that cannot be captured.
  [[nodiscard]] virtual std::unique_ptr<Op> Clone() const { return nullptr; }

  // The CUstream the call named (0: the legacy stream).
  void set_stream(void* stream) { stream_ = stream; }
  [[nodiscard]] void* stream() const { return stream_; }

  [[nodiscard]] ncclResult_t result() const { return result_; }
  [[nodiscard]] ncclComm* comm() const { return comm_; }
  // Non-zero while the op only waits for a point in time (model or hang), not for peers.
  [[nodiscard]] int64_t wake_at_ns() const { return wake_at_ns_; }

 protected:
  // One non-blocking attempt to advance. kFailed: result() holds the error (already recorded).
  virtual Progress Step(int64_t now_ns) = 0;

  ncclComm* comm_;
  void* stream_ = nullptr;
  void* gate_ = nullptr;
  ncclResult_t result_ = ncclSuccess;
  int64_t wake_at_ns_ = 0;
};

// Peer-wait bookkeeping shared by the collective and p2p state machines.
class PeerWait {
 public:
  void Reset(int64_t now_ns) { last_progress_ns_ = now_ns; next_liveness_ns_ = now_ns; }
  // True once no progress was made for FALCON_EMU_TIMEOUT_S (lenient mode); never by default.
  [[nodiscard]] bool Expired(int64_t now_ns) const;
  // True at most every 100 ms: time to check whether missing peers' processes are alive.
  [[nodiscard]] bool LivenessDue(int64_t now_ns);
  [[nodiscard]] double WaitedSeconds(int64_t now_ns) const {
    return static_cast<double>(now_ns - last_progress_ns_) * 1e-9;
  }

 private:
  int64_t last_progress_ns_ = 0;
  int64_t next_liveness_ns_ = 0;
};

// "1,3,5" for error messages.
[[nodiscard]] std::string RankList(const std::vector<int>& ranks);
// True if the process `pid` no longer exists.
[[nodiscard]] bool ProcessGone(int pid);
// True if rank `r` of `seg` will never arrive: its process exited or it aborted the
// communicator (RankCtl.gone).
[[nodiscard]] bool PeerGone(const Segment& seg, int r);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_OP_H_
