// The emulated GPU as the NCCL emulator sees it: the CUDA driver emulator (libcuda.so.1 built
// from cuda_emu.cc) when the process has loaded it, and the modelled kernels that run on it
// (falconEmuLaunchCompute, the cuBLAS emulator's GEMMs).
//
// A collective or send/recv on a blocking communicator is device work when the driver emulator
// is loaded, the calling thread has a current context and the stream is not being captured:
// ncclGroupEnd (or the ungrouped call) then enqueues it on its stream with cuLaunchHostFunc and
// returns, and the stream's worker drives it (engine.h RunOnDevice). Without the driver emulator
// the call completes before it returns, as before: a program that is not a CUDA program has no
// other way to wait for it.
//
// Thread-safety: CudaEmu and DeviceUsable from any thread. SyncCommDevice and ReleaseCommDevice
// touch the [owner] `device_event` of a communicator (comm.h). LaunchModelledKernel from any
// thread. Must never: load the driver into a process that has not (dlopen RTLD_NOLOAD), throw.
#ifndef FALCON_BENCH_EMU_DEVICE_H_
#define FALCON_BENCH_EMU_DEVICE_H_

struct ncclComm;

namespace falcon::emu {

// The driver emulator's entry points (cuda.h signatures with opaque handles).
struct CudaEmuApi {
  int (*ctx_get_current)(void**) = nullptr;
  int (*launch_host_func)(void*, void (*)(void*), void*) = nullptr;
  int (*event_create)(void**, unsigned) = nullptr;
  int (*event_destroy)(void*) = nullptr;
  int (*event_record)(void*, void*) = nullptr;
  int (*stream_wait_event)(void*, void*, unsigned) = nullptr;
  int (*event_synchronize)(void*) = nullptr;
  int (*event_query)(void*) = nullptr;
  int (*stream_is_capturing)(void*, int*) = nullptr;
  int (*exchange_capture_mode)(int*) = nullptr;
  int (*capture_host_func)(void*, void (*)(void*), void (*)(void*), void*) = nullptr;  // falconEmuCudaCaptureHostFunc
};

// The entry points once the process has loaded the driver emulator (a real driver is never
// used: its device memory is not host memory); null before. Looked up again until found.
[[nodiscard]] const CudaEmuApi* CudaEmu();

// True if work on `stream` can be queued on the emulated device now (see the file comment).
[[nodiscard]] bool DeviceUsable(void* stream);
// True if `stream` is being captured into a CUDA graph on the emulated device (the calling thread
// has a current context): device work is then recorded, not run (engine.h CaptureOnDevice).
[[nodiscard]] bool DeviceCapturing(void* stream);

// An event recorded on `stream` now (its queued work), for a nonblocking communicator's op that
// runs in the background but must start after that work (Op gate); null if there is no device.
[[nodiscard]] void* MarkStream(void* stream);
// True once the work before `mark` completed. Any thread (runs in the relaxed capture mode).
[[nodiscard]] bool MarkReached(void* mark);
void DropMark(void* mark);

// Blocks until the device work queued so far on `c` completed (unbounded, as the device).
// REQUIRES: the caller drives `c` ([owner]).
void SyncCommDevice(ncclComm* c);
// Destroys `c`'s device event; called when the communicator is freed.
void ReleaseCommDevice(ncclComm* c);

// A modelled kernel: enqueued on `stream` (0: the legacy stream of the current context), it runs
// `body(arg)` (if any) when it starts, then occupies the stream until
//   nominal_s x (the fault plan's compute factor of this rank's GPU at the start) x noise
// has passed since it started; `release(arg)` (if any) runs when the kernel is done (or at once
// when it cannot be enqueued). Noise is lognormal with sigma FALCON_EMU_COMPUTE_NOISE, from a
// generator seeded by the rank (and FALCON_EMU_NOISE_SEED). Without the driver emulator (or with
// no current context) the kernel runs in the calling thread before this returns.
// Returns 0, or -1 (bad arguments), -2 (broken configuration), -3 (the driver refused the work).
int LaunchModelledKernel(void* stream, double nominal_s, void (*body)(void*), void* arg, void (*release)(void*));

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_DEVICE_H_
