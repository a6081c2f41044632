// The trainer's device: driver API at run time, streams, events, modelled kernels; see device.h.
#include "device.h"

#include <dlfcn.h>

namespace falcon::train {

// Entry points of the driver API (cuda.h ABI: opaque handles, int results). Null when absent.
struct Device::Driver {
  void* lib = nullptr;
  int (*init)(unsigned) = nullptr;
  int (*primary_ctx_retain)(void**, int) = nullptr;
  int (*ctx_set_current)(void*) = nullptr;
  int (*stream_create)(void**, unsigned) = nullptr;
  int (*stream_destroy)(void*) = nullptr;
  int (*event_create)(void**, unsigned) = nullptr;
  int (*event_destroy)(void*) = nullptr;
  int (*event_record)(void*, void*) = nullptr;
  int (*event_synchronize)(void*) = nullptr;
  int (*stream_wait_event)(void*, void*, unsigned) = nullptr;  // optional
  void* ctx = nullptr;  // the device's primary context
};

namespace {

constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 2;  // CU_EVENT_DISABLE_TIMING

template <typename Fn>
void Resolve(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
}

}  // namespace

Device::~Device() {
  if (!driver_) return;
  // Teardown errors are not actionable; the job's result is decided by now.
  for (EventHandle e : events_) (void)driver_->event_destroy(e);
  for (StreamHandle s : streams_) (void)driver_->stream_destroy(s);
  // The library stays loaded (other users, e.g. the shim, may hold its symbols).
}

Status Device::SynchronizeStreams() {
  if (!driver_) return Status::Ok();
  for (StreamHandle s : streams_) {
    void* e = nullptr;
    if (Status st = Check(driver_->event_create(&e, kEventDisableTiming), "cuEventCreate"); !st.ok()) return st;
    Status st = Check(driver_->event_record(e, s), "cuEventRecord");
    if (st.ok()) st = Check(driver_->event_synchronize(e), "cuEventSynchronize");
    (void)driver_->event_destroy(e);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status Device::Check(int rc, const char* what) const {
  if (rc == 0) return Status::Ok();
  return Status::Unavailable(std::string(what) + " failed: CUDA error " + std::to_string(rc));
}

Result<std::unique_ptr<Device>> Device::Open(int ordinal, ComputeModel* compute) {
  std::unique_ptr<Device> d(new Device());
  d->compute_ = compute;
  d->launch_ = reinterpret_cast<int (*)(void*, double)>(dlsym(RTLD_DEFAULT, "falconEmuLaunchCompute"));
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    d->launch_ = nullptr;  // no stream to launch on: host-side compute
    return d;
  }
  auto drv = std::make_unique<Driver>();
  drv->lib = lib;
  Resolve(lib, "cuInit", &drv->init);
  Resolve(lib, "cuDevicePrimaryCtxRetain", &drv->primary_ctx_retain);
  Resolve(lib, "cuCtxSetCurrent", &drv->ctx_set_current);
  Resolve(lib, "cuStreamCreate", &drv->stream_create);
  Resolve(lib, "cuStreamDestroy_v2", &drv->stream_destroy);
  Resolve(lib, "cuEventCreate", &drv->event_create);
  Resolve(lib, "cuEventDestroy_v2", &drv->event_destroy);
  Resolve(lib, "cuEventRecord", &drv->event_record);
  Resolve(lib, "cuEventSynchronize", &drv->event_synchronize);
  Resolve(lib, "cuStreamWaitEvent", &drv->stream_wait_event);
  if (!drv->init || !drv->primary_ctx_retain || !drv->ctx_set_current || !drv->stream_create ||
      !drv->stream_destroy || !drv->event_create || !drv->event_destroy || !drv->event_record ||
      !drv->event_synchronize) {
    return Status::Unavailable("libcuda.so.1 lacks a driver entry point the trainer needs");
  }
  void* ctx = nullptr;
  if (drv->init(0) != 0 || drv->primary_ctx_retain(&ctx, ordinal) != 0 || drv->ctx_set_current(ctx) != 0) {
    d->launch_ = nullptr;  // a driver without this device (no GPU, fewer GPUs): host-side work, as without one
    return d;
  }
  drv->ctx = ctx;
  d->driver_ = std::move(drv);
  return d;
}

Status Device::MakeCurrent() {
  if (!driver_) return Status::Ok();
  return Check(driver_->ctx_set_current(driver_->ctx), "cuCtxSetCurrent");
}

Result<StreamHandle> Device::NewStream() {
  if (!driver_) return StreamHandle{nullptr};
  void* s = nullptr;
  if (Status st = Check(driver_->stream_create(&s, kStreamNonBlocking), "cuStreamCreate"); !st.ok()) return st;
  streams_.push_back(s);
  return s;
}

Result<EventHandle> Device::NewEvent() {
  if (!driver_) return EventHandle{nullptr};
  void* e = nullptr;
  if (Status st = Check(driver_->event_create(&e, kEventDisableTiming), "cuEventCreate"); !st.ok()) return st;
  events_.push_back(e);
  return e;
}

Status Device::Record(EventHandle e, StreamHandle s) {
  if (!driver_) return Status::Ok();
  return Check(driver_->event_record(e, s), "cuEventRecord");
}

Status Device::StreamWait(StreamHandle s, EventHandle e) {
  if (!driver_) return Status::Ok();
  if (driver_->stream_wait_event) return Check(driver_->stream_wait_event(s, e, 0), "cuStreamWaitEvent");
  return HostWait(e);
}

Status Device::HostWait(EventHandle e) {
  if (!driver_) return Status::Ok();
  return Check(driver_->event_synchronize(e), "cuEventSynchronize");
}

Status Device::Compute(StreamHandle s, double ms) {
  if (launch_ != nullptr) {
    compute_->Observe();  // the factor in force, for the report; the device applies it
    const int rc = launch_(s, ms / 1e3);
    if (rc != 0) return Status::Unavailable("falconEmuLaunchCompute returned " + std::to_string(rc));
    return Status::Ok();
  }
  compute_->Run(ms);
  return Status::Ok();
}

}  // namespace falcon::train
