// StallWatch: whether one rank stopped making progress (issue #19 item 2), from its progress as
// the shim publishes it (daemon/shm/progress_reader.h), checked every stall_check_ms.
//
// A rank is stalled when all of these hold:
//  - its latest ordered call is older than the bound max(floor_s, factor x iteration time), the
//    iteration time being the rank's own (its detector's healthy baseline, else its latest
//    sample); until it has one, max(floor_s, startup_s): communicator setup and the first
//    iterations of a large job take minutes, and a slow start is not a hang;
//  - it has work outstanding in NCCL: a host thread inside an NCCL call (a blocking group end,
//    an init or split waiting for peers), or tracked device work of some communicator that has
//    not completed;
//  - it is not held by a Falcon pause and its framework's phase is training (falconSetPhase).
// A rank idle outside NCCL with nothing outstanding (a long checkpoint, the end of training, a
// stuck data loader) is never stalled itself: where it holds the job up, its peers stall waiting
// for it, and the hang diagnosis names it. Where device completion is not tracked (no CUDA
// driver, FALCON_DEVICE_PROGRESS=0) only host calls that do not return count as outstanding.
// The verdict changes at most once per Update; the caller reports the transitions.
// Thread-safety: value type, one owner (the agent loop). Must never: read clocks or do I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "daemon/shm/progress_reader.h"

namespace falcon::agent {

struct StallOptions {
  double floor_s = 5.0;  // the bound's floor, seconds
  double factor = 4.0;   // the bound's multiple of the rank's iteration time
  double startup_s = 120.0;  // the bound while the rank's iteration time is unknown
};

// What the rank waits in when stalled: its oldest outstanding call.
struct StallCall {
  std::uint64_t comm = 0;  // 0: a host call on no known communicator (a group end, an init)
  std::optional<std::uint64_t> seq;  // comm_seq, when the call is known
  std::uint8_t op = 0;               // FalconOp code, when seq is known
  bool in_host_call = false;         // a host thread is inside it
};

struct StallEvent {
  bool stalled = false;  // the new verdict: stalled, or progressing again
  double age_s = 0;      // since the latest ordered call
  double bound_s = 0;    // the bound it was judged against
  std::int64_t last_call_mono_ns = 0;
  StallCall waiting_in;  // stalled only
};

class StallWatch {
 public:
  explicit StallWatch(const StallOptions& options = {}) : options_(options) {}

  // `p` read at `now_mono_ns` (the writer's clock); `iteration_s`: the rank's iteration time, 0
  // when unknown. Returns the new verdict when it changed.
  std::optional<StallEvent> Update(const daemon::SegmentProgress& p, std::int64_t now_mono_ns,
                                   double iteration_s);

  bool stalled() const { return stalled_; }
  // Seconds since the latest ordered call at the last Update (0 before any call).
  double age_s() const { return age_s_; }
  double bound_s(double iteration_s) const;
  std::uint64_t stalls() const { return stalls_; }  // transitions to stalled so far

 private:
  StallOptions options_;
  bool stalled_ = false;
  double age_s_ = 0;
  std::uint64_t stalls_ = 0;
};

// The oldest outstanding call of `p`: the first pending tracked call by issue time, else the
// communicator of a host call in flight; nullopt when nothing is outstanding.
std::optional<StallCall> OutstandingCall(const daemon::SegmentProgress& p);

}  // namespace falcon::agent
