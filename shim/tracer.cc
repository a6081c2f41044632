// Tracer: lazy initialisation, per-call recording, fork and exit handling. See tracer.h.
#include "shim/tracer.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "shim/log.h"
#include "shim/real_nccl.h"
#include "shim/service_thread.h"

namespace falcon::shim {

std::atomic<int> g_init_state{Tracer::kUninit};
Tracer g_tracer;

namespace {
// initial-exec: the shim is preloaded, so its TLS sits in the static block (no __tls_get_addr).
__attribute__((tls_model("initial-exec"))) thread_local ThreadState t_thread;

void ForkChildHandler() { g_tracer.OnForkChild(); }

__attribute__((destructor)) void ShimDestructor() {
  if (g_init_state.load(std::memory_order_acquire) == Tracer::kReady) g_tracer.OnExit();
}
}  // namespace

ThreadState& CurrentThread() { return t_thread; }

Tracer* Tracer::InitSlow() {
  int expected = kUninit;
  if (!g_init_state.compare_exchange_strong(expected, kIniting, std::memory_order_acq_rel)) {
    return expected == kReady ? &g_tracer : nullptr;
  }
  Tracer& t = g_tracer;
  t.config_ = LoadShimConfig();
  if (t.config_.nccl_library[0] != '\0') SetFallbackLibrary(t.config_.nccl_library);
  static std::atomic<bool> atfork_registered{false};
  if (!atfork_registered.exchange(true)) pthread_atfork(nullptr, nullptr, ForkChildHandler);
  if (t.config_.disabled) {
    Log(LogLevel::kInfo, "FALCON_DISABLE set: calls pass through unrecorded");
    g_init_state.store(kPassThrough, std::memory_order_release);
    return nullptr;
  }
  char error[512];
  if (!t.segment_.Create(t.config_, error, sizeof(error))) {
    LogOnce(OnceKey::kSegmentCreate, LogLevel::kWarn, "%s; NCCL calls pass through unrecorded", error);
    g_init_state.store(kPassThrough, std::memory_order_release);
    return nullptr;
  }
  t.comms_.Attach(t.segment_.header(), t.segment_.comms(), t.config_.comm_capacity);
  t.mode_.store(static_cast<uint32_t>(t.config_.mode), std::memory_order_relaxed);
  t.sample_every_.store(t.config_.sample_every, std::memory_order_relaxed);
  if (t.gpu_.Init()) t.segment_.control()->timing_source = kFalconTimingCudaEvents;
  t.stop_.store(false, std::memory_order_relaxed);
  if (!StartServiceThread(t)) {
    LogOnce(OnceKey::kServiceThread, LogLevel::kWarn,
            "cannot start the service thread: no heartbeat, mode changes or GPU timing");
  }
  Log(LogLevel::kInfo, "recording NCCL calls to %s", t.segment_.path());
  g_init_state.store(kReady, std::memory_order_release);
  return &t;
}

void Tracer::OnExit() {
  stop_.store(true, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(segment_.header()->state).store(kFalconProcExited, std::memory_order_release);
  // Never unmap: other threads may still be inside an NCCL call while the process exits.
  if (!config_.keep_segment) segment_.Unlink();
}

void Tracer::OnForkChild() {
  // The child is a new process: it must not write into the parent's segment. Drop the mapping's
  // use (leave it mapped; it is the parent's) and initialise afresh on the child's first call.
  g_init_state.store(kUninit, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_relaxed);
  comms_.Reset();
  segment_ = Segment();
  t_thread = ThreadState();
  ResetLogOnce();
}

void Tracer::CountInternalError() {
  std::atomic_ref<uint64_t>(segment_.header()->internal_errors).fetch_add(1, std::memory_order_relaxed);
}

void Tracer::AcquireThreadSlot(ThreadState& ts) {
  ts.generation = generation();
  ts.slot = nullptr;
  ts.slot_index = 0xFFFF;
  FalconShmHeader* h = segment_.header();
  uint32_t i = std::atomic_ref<uint32_t>(h->thread_used).fetch_add(1, std::memory_order_relaxed);
  if (i >= config_.thread_capacity) {
    LogOnce(OnceKey::kThreadTableFull, LogLevel::kInfo,
            "more than %u threads call NCCL; later threads are recorded without in-flight state",
            config_.thread_capacity);
    return;
  }
  ts.slot = &segment_.threads()[i];
  ts.slot_index = static_cast<uint16_t>(i);
  ts.slot->tid = static_cast<uint64_t>(syscall(SYS_gettid));  // once per thread, off the hot path
}

uint32_t Tracer::RegisterUnknownComm(const void* comm) {
  // A communicator created before the shim was recording (or by a path it cannot see): give it
  // a process-local identity so its calls are still attributed. Members will not agree on it.
  CommIdentity id;
  id.comm_id = Fnv1a(&comm, sizeof(comm), Fnv1a(&segment_.header()->pid, sizeof(int32_t)));
  id.origin = static_cast<FalconCommOrigin>(0);
  return comms_.Register(comm, id);
}

// HOT PATH BEGIN (Begin, End, Publish): no lock, no allocation, no syscall, no getenv, no log.
CallToken Tracer::Begin(const CallDesc& d, ThreadState& ts) {
  CallToken t;
  t.t0 = MonoNowNs();
  if (ts.generation != generation()) AcquireThreadSlot(ts);  // first call of this thread
  if (d.comm != nullptr) {
    t.comm_slot = comms_.Lookup(d.comm);
    if (t.comm_slot == CommRegistry::kNotMapped) t.comm_slot = RegisterUnknownComm(d.comm);  // once
    if (t.comm_slot != FALCON_NO_COMM) t.comm_seq = comms_.NextCallSeq(t.comm_slot);
  }
  t.group_depth = static_cast<uint8_t>(ts.group_depth > 255 ? 255 : ts.group_depth);
  t.flags = d.flags;
  if (ts.group_depth > 0) t.flags |= kFalconFlagInGroup;
  const uint32_t mode = mode_.load(std::memory_order_relaxed);
  if (mode == kFalconModeProfile) {
    t.host_end = true;
  } else if (mode == kFalconModeSample) {
    uint32_t every = sample_every_.load(std::memory_order_relaxed);
    t.host_end = (ts.sample_counter++ % (every == 0 ? 1 : every)) == 0;
  }
  if (t.host_end && d.gpu_work && gpu_.available()) {
    bool capturing = false;
    t.gpu_ticket = gpu_.Start(d.stream, &capturing);
    if (capturing) t.flags |= kFalconFlagGraphCapture;
  }
  if (ts.slot != nullptr) {
    FalconThreadSlot* s = ts.slot;
    std::atomic_ref<int64_t>(s->inflight_since_mono_ns).store(t.t0, std::memory_order_relaxed);
    std::atomic_ref<uint32_t>(s->inflight_comm_slot).store(t.comm_slot, std::memory_order_relaxed);
    std::atomic_ref<uint16_t>(s->inflight_op).store(static_cast<uint16_t>(d.op), std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(s->inflight_seq).store(t.comm_seq + 1, std::memory_order_release);
  }
  return t;
}

void Tracer::End(const CallToken& t, const CallDesc& d, const CallOutcome& out, int result, ThreadState& ts) {
  FalconRecord r;
  std::memset(&r, 0, sizeof(r));
  r.comm_slot = out.comm_slot != FALCON_NO_COMM ? out.comm_slot : t.comm_slot;
  r.comm_seq = t.comm_seq;
  if (t.comm_slot == FALCON_NO_COMM && r.comm_slot != FALCON_NO_COMM) r.comm_seq = comms_.NextCallSeq(r.comm_slot);
  r.count = out.count != ~uint64_t{0} ? out.count : d.count;
  r.stream = reinterpret_cast<uintptr_t>(d.stream);
  r.t_start_mono_ns = t.t0;
  r.t_start_real_ns = t.t0 + std::atomic_ref<int64_t>(segment_.header()->real_minus_mono_ns).load(std::memory_order_relaxed);
  r.ref_seq = out.ref;
  r.peer = out.peer >= -1 ? out.peer : d.peer;
  r.redop = d.redop;
  r.op = static_cast<uint16_t>(d.op);
  r.dtype = static_cast<uint8_t>(d.dtype < 0 ? 0xFF : d.dtype);
  r.group_depth = t.group_depth;
  r.flags = t.flags;
  r.thread_slot = ts.slot_index;
  r.result = result;
  if (t.host_end) {
    r.t_end_mono_ns = MonoNowNs();
    r.flags |= kFalconFlagHostEnd;
  }
  if (t.gpu_ticket >= 0) {
    if (result == 0) r.flags |= kFalconFlagGpuPending;
    else gpu_.Cancel(t.gpu_ticket);
  }
  Publish(r);
  if (t.gpu_ticket >= 0 && result == 0) gpu_.Stop(t.gpu_ticket, d.stream, r.seq);
  if (ts.slot != nullptr) {
    std::atomic_ref<uint64_t>(ts.slot->inflight_seq).store(0, std::memory_order_release);
    std::atomic_ref<uint64_t>(ts.slot->calls).fetch_add(1, std::memory_order_relaxed);
  }
}

void Tracer::Publish(FalconRecord& r) {
  FalconShmHeader* h = segment_.header();
  const uint64_t cap = h->ring_capacity;
  const uint64_t idx = std::atomic_ref<uint64_t>(h->ring_head).fetch_add(1, std::memory_order_relaxed);
  r.seq = idx;
  FalconRecord* slot = &segment_.ring()[idx & (cap - 1)];
  std::atomic_ref<uint64_t> version(slot->version);
  const uint64_t writing = 2 * idx + 1;
  uint64_t cur = version.load(std::memory_order_relaxed);
  // Claim the slot: it must hold an older, complete record (or nothing). A slower writer still
  // inside it means we would tear its record: drop ours instead (contract 3 of shm_abi.h).
  if ((cur & 1) != 0 || cur >= writing ||
      !version.compare_exchange_strong(cur, writing, std::memory_order_relaxed)) {
    std::atomic_ref<uint64_t>(h->records_dropped).fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::atomic_thread_fence(std::memory_order_release);
  if (idx >= cap && idx - cap >= std::atomic_ref<uint64_t>(h->reader_cursor).load(std::memory_order_relaxed)) {
    std::atomic_ref<uint64_t>(h->records_lost).fetch_add(1, std::memory_order_relaxed);
  }
  // Word-wise relaxed atomic stores: a concurrent reader may copy the slot (seqlock).
  const auto* src = reinterpret_cast<const uint64_t*>(&r);
  auto* dst = reinterpret_cast<uint64_t*>(slot);
  for (size_t w = 1; w < sizeof(FalconRecord) / sizeof(uint64_t); ++w) {
    std::atomic_ref<uint64_t>(dst[w]).store(src[w], std::memory_order_relaxed);
  }
  version.store(writing + 1, std::memory_order_release);
}
// HOT PATH END

void Tracer::ServiceTick() {
  FalconShmHeader* h = segment_.header();
  FalconControl* c = segment_.control();
  std::atomic_ref<int64_t>(h->real_minus_mono_ns).store(RealNowNs() - MonoNowNs(), std::memory_order_relaxed);
  std::atomic_ref<int64_t>(c->heartbeat_mono_ns).store(MonoNowNs(), std::memory_order_relaxed);
  std::atomic_ref<int64_t>(c->heartbeat_real_ns).store(RealNowNs(), std::memory_order_relaxed);
  const uint64_t cmd = std::atomic_ref<uint64_t>(c->command_seq).load(std::memory_order_acquire);
  if (cmd != applied_command_) {
    applied_command_ = cmd;
    const uint32_t want = std::atomic_ref<uint32_t>(c->mode).load(std::memory_order_relaxed);
    if (want <= kFalconModeOff) {
      mode_.store(want, std::memory_order_relaxed);
    } else {
      LogOnce(OnceKey::kUnknownMode, LogLevel::kWarn, "agent requested unknown mode %u; keeping mode %u",
              want, mode_.load(std::memory_order_relaxed));
    }
    uint32_t every = std::atomic_ref<uint32_t>(c->sample_every).load(std::memory_order_relaxed);
    sample_every_.store(every == 0 ? 1 : (every > 1000000 ? 1000000 : every), std::memory_order_relaxed);
    std::atomic_ref<uint32_t>(c->active_mode).store(mode_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(c->command_ack).store(cmd, std::memory_order_release);
  }
  if (gpu_.available()) gpu_.Poll(*this);
}

}  // namespace falcon::shim
