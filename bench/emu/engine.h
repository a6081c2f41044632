// The emulator's progress engine: drives a batch of launched Ops to completion, either in the
// calling thread (blocking communicators without a device: RunOps), on the emulated device's
// stream worker (blocking communicators over the CUDA driver emulator: RunOnDevice, recorded
// into a CUDA graph while the stream is captured: CaptureOnDevice; device.h), or in the
// background (nonblocking communicators: RunInBackground), where NCCL's ncclGroupEndInternal
// launches on a helper pthread (groupLaunchNonBlocking).
//
// Background design: one process-wide progress thread, started on first use and never joined
// (a job may wait forever on a peer that never comes; the process may exit under it). It owns
// a list of jobs and sweeps every op of every job round-robin, so jobs of several
// communicators (several ranks of one process, a split's parent and child) progress together
// and never deadlock on each other. Ordering guarantee: jobs start in submission order; ops of
// one job were launched (took their sequence numbers) in submission order by the submitting
// thread; ops of different jobs on one communicator cannot overlap, because a nonblocking
// communicator refuses new calls until its job is done (EnsureReady, comm.h).
//
// Thread-safety: RunOps drives only its arguments in the calling thread. RunInBackground may
// be called from any thread; it hands the ops and the [owner] state of their communicators to
// the progress thread until the job ends. Invariants:
//  1. For every communicator a job drives (each op's comm and child), `inflight` is incremented
//     and a reference taken before the job is queued, and both are dropped (inflight with a
//     release store) only after the job's last op finished and its error was recorded in
//     `async_error`: an `inflight` of 0 read with acquire hands the communicator back.
//  2. The engine never sleeps while an op made progress in the last sweep; idle sweeps back off
//     from spinning to sched_yield to nanosleep (<= 200 us while peers are awaited, <= 10 ms for
//     a time-only wait), so an abort or a new job is seen within that.
// Must never: spin without backing off, throw out of the progress thread.
#ifndef FALCON_BENCH_EMU_ENGINE_H_
#define FALCON_BENCH_EMU_ENGINE_H_

#include <nccl.h>

#include <memory>
#include <vector>

#include "op.h"

namespace falcon::emu {

// Launches `ops` in order and drives them to completion in the calling thread; returns the
// first failure (or ncclSuccess).
[[nodiscard]] ncclResult_t RunOps(std::vector<std::unique_ptr<Op>>& ops);

// Launches `ops` in order in the calling thread, makes their first-use connections there
// (blocking until the peers arrive, as NCCL's group launch), then queues them as one unit of
// device work on their streams (device.h) and returns ncclSuccess: the stream's worker drives
// them, records failures as the communicators' async errors, and later work on the streams and
// communicators waits for it. REQUIRES: every op is device_work() on a blocking communicator and
// DeviceUsable(its stream).
[[nodiscard]] ncclResult_t RunOnDevice(std::vector<std::unique_ptr<Op>> ops);

// Records unlaunched device-work `ops` into the CUDA graph being captured on the first op's
// stream (device.h DeviceCapturing) instead of running them: each cuGraphLaunch of the graph
// launches fresh copies in its calling thread (sequence numbers, connections) and its replay
// drives them on the device, without passing through the NCCL API. True if recorded (`ops` is
// then consumed); false, with `ops` untouched, if the driver refused.
[[nodiscard]] bool CaptureOnDevice(std::vector<std::unique_ptr<Op>>& ops);

// Launches `ops` in order in the calling thread, then queues them as one job for the progress
// thread (invariant 1). Returns ncclInProgress. Throws std::system_error (turned into an error
// at the API edge, api_util.h) only if the progress thread cannot be started, before launching.
[[nodiscard]] ncclResult_t RunInBackground(std::vector<std::unique_ptr<Op>> ops);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_ENGINE_H_
