// The device executor of the CUDA driver emulator (cuda_emu.cc): streams as in-order work queues,
// each executed by a worker thread of its own, so the host returns from an enqueue at once and
// the "device" runs the work later, as a GPU does.
//
// Model (what the driver guarantees and the emulator honours):
//  * Work on one stream runs in enqueue order; work on different streams may run concurrently.
//  * The legacy default stream of a context (handle 0, CU_STREAM_LEGACY, and the per-thread
//    default stream, which is not modelled separately) waits for all earlier work on the
//    context's blocking streams, and every blocking stream waits for earlier legacy work;
//    CU_STREAM_NON_BLOCKING streams do neither.
//  * A work item may carry dependencies (stream, n): it starts only once that stream completed its
//    n-th item (cuStreamWaitEvent, the legacy rules).
//  * A work item may block (a collective waiting for its peers): its stream waits, unbounded.
//
// Thread-safety: every function may be called from any thread. All executor state is guarded by
// one process-wide mutex; host waits and idle workers sleep on one condition variable, woken at
// every enqueue and completion (a process has a handful of streams). Invariants:
//  1. A stream's `done` counts completed items; item n (1-based) of a stream completes only after
//     items 1..n-1 did. `enqueued` >= `done`.
//  2. A worker runs work without holding the mutex, so work may block and may enqueue more work.
//  3. Streams are reference counted: the handle (until cuStreamDestroy), the worker (until its
//     queue drains after destroy), events and dependencies each hold one, so a stream destroyed
//     with work pending finishes that work, then its worker exits.
// Must never: spin (every wait is a condition-variable wait), throw out of a worker.
#ifndef FALCON_BENCH_EMU_CUDA_DEVICE_H_
#define FALCON_BENCH_EMU_CUDA_DEVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace falcon::cuemu {

inline constexpr int kDevices = 8;

struct StreamCore;
using StreamPtr = std::shared_ptr<StreamCore>;

// "Stream `stream` completed its `seq`-th item".
struct Dep {
  StreamPtr stream;
  uint64_t seq = 0;
};

// CLOCK_MONOTONIC nanoseconds.
[[nodiscard]] int64_t NowNs();

// A new stream of context `ctx` (0 <= ctx < kDevices). `non_blocking`: CU_STREAM_NON_BLOCKING.
// Returns the handle the driver hands out (registered until DestroyStream).
[[nodiscard]] void* CreateStream(int ctx, bool non_blocking);
// Drops the handle: pending work still runs, then the worker exits. False for unknown handles.
bool DestroyStream(void* handle);
// The stream a handle names: 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD mean the legacy
// stream of `current_ctx`; null for an unknown handle (or no current context for those).
[[nodiscard]] StreamPtr Resolve(void* handle, int current_ctx);
// The context of a resolved stream.
[[nodiscard]] int ContextOf(const StreamCore& s);

// Enqueues `run` on `s` after `deps` (and the legacy-stream rules); returns its sequence number.
uint64_t Enqueue(const StreamPtr& s, std::function<void()> run, std::vector<Dep> deps = {});
// The sequence number of the last item enqueued on `s` so far (0: none).
[[nodiscard]] uint64_t Tail(const StreamPtr& s);
[[nodiscard]] bool Completed(const Dep& d);
// Blocks until every dependency completed (unbounded, as the driver).
void Wait(const std::vector<Dep>& deps);
// The tails of every stream of `ctx` (cuCtxSynchronize), or of the blocking streams and the
// legacy stream only (synchronising the legacy stream).
enum class Which { kAll, kLegacyScope };
[[nodiscard]] std::vector<Dep> ContextTails(int ctx, Which which);

}  // namespace falcon::cuemu

#endif  // FALCON_BENCH_EMU_CUDA_DEVICE_H_
