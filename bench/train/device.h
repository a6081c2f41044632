// The trainer's view of its GPU: one context, streams, events and modelled kernels, through the
// CUDA driver API loaded at run time (dlopen libcuda.so.1: the emulator's under falcon-emu-run,
// the real driver elsewhere), as PyTorch drives a device: compute on one stream, each process
// group's NCCL work on its own stream, ordered by events (record on the producer,
// cuStreamWaitEvent on the consumer), the host running ahead until it must read a result.
//
// Modelled compute is a kernel of nominal length: falconEmuLaunchCompute(stream, seconds) when
// the emulator exports it (resolved once with dlsym(RTLD_DEFAULT, ...); the emulated device then
// applies compute faults and noise itself), else host-side modelled compute (ComputeModel: a
// sleep of nominal x falconEmuComputeFactor) on the calling thread.
// Without a driver (no libcuda.so.1, or one that cannot open device `ordinal`) streams and events are null and every wait is a no-op: the
// NCCL calls then complete before they return, which the program relies on nowhere else.
// Where the driver lacks cuStreamWaitEvent, a stream wait becomes a host wait on the event
// (stricter, still correct).
//
// Thread-safety: a Device, its streams and events are used by the thread that opened it.
// Must never: let the host read a buffer a stream writes before synchronising on an event
// recorded after that write (HostWait), or reuse an event it has not created.
#ifndef FALCON_BENCH_TRAIN_DEVICE_H_
#define FALCON_BENCH_TRAIN_DEVICE_H_

#include <memory>
#include <string>
#include <vector>

#include "falcon/status.h"
#include "model.h"

namespace falcon::train {

using StreamHandle = void*;  // CUstream; nullptr without a driver
using EventHandle = void*;   // CUevent; nullptr without a driver

class Device {
 public:
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device();

  // Loads the driver (if any), makes device `ordinal`'s primary context current.
  // REQUIRES: `compute` outlives the Device.
  [[nodiscard]] static Result<std::unique_ptr<Device>> Open(int ordinal, ComputeModel* compute);

  // Makes the device's primary context current on the calling thread (as cudaSetDevice does on
  // a thread of the process's own, e.g. PyTorch's autograd thread). Any thread.
  [[nodiscard]] Status MakeCurrent();
  // A new non-blocking stream / event owned by the Device (destroyed with it); nullptr without
  // a driver.
  [[nodiscard]] Result<StreamHandle> NewStream();
  [[nodiscard]] Result<EventHandle> NewEvent();

  // Records `e` on `s` (the work enqueued on s so far).
  [[nodiscard]] Status Record(EventHandle e, StreamHandle s);
  // Makes `s` wait for `e`'s last record (no host wait when the driver can).
  [[nodiscard]] Status StreamWait(StreamHandle s, EventHandle e);
  // Blocks the host until `e`'s last record completed (cuEventSynchronize).
  [[nodiscard]] Status HostWait(EventHandle e);
  // Blocks the host until every stream of this Device has run all the work enqueued on it so
  // far (an event recorded on each, then cuEventSynchronize). Unbounded, as the driver's waits
  // are: call it once the work cannot wait on anything else (e.g. after ncclCommAbort).
  [[nodiscard]] Status SynchronizeStreams();
  // Enqueues a modelled kernel of nominal `ms` on `s` (see the file comment).
  [[nodiscard]] Status Compute(StreamHandle s, double ms);

  [[nodiscard]] bool has_driver() const { return driver_ != nullptr; }
  [[nodiscard]] bool device_compute() const { return launch_ != nullptr; }

 private:
  struct Driver;
  Device() = default;
  [[nodiscard]] Status Check(int rc, const char* what) const;

  // Fixed after Open.
  std::unique_ptr<Driver> driver_;
  int (*launch_)(void*, double) = nullptr;  // falconEmuLaunchCompute, when exported
  ComputeModel* compute_ = nullptr;
  // Owned driver objects.
  std::vector<StreamHandle> streams_;
  std::vector<EventHandle> events_;
};

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_DEVICE_H_
