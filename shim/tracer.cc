// Tracer: lazy initialisation, the out-of-line recording paths, thread binding, fork and exit
// handling. The inline hot path is in tracer.h.
#include "shim/tracer.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "shim/log.h"
#include "shim/real_nccl.h"
#include "shim/service_thread.h"
#include "shim/wrapper_util.h"

namespace falcon::shim {

std::atomic<int> g_init_state{Tracer::kUninit};
std::atomic<uint32_t> g_phase{0};
Tracer g_tracer;

namespace {
// initial-exec: the shim is preloaded, so its TLS sits in the static block (no __tls_get_addr).
__attribute__((tls_model("initial-exec"))) thread_local ThreadState t_thread;

// Returns this thread's thread slot and lane to the pool when the thread exits, so that
// threads that come and go do not exhaust the tables.
struct ThreadExitRelease {
  ~ThreadExitRelease() { g_tracer.ReleaseThreadSlot(t_thread); }
};
__attribute__((tls_model("initial-exec"))) thread_local ThreadExitRelease t_release;

void ForkChildHandler() { g_tracer.OnForkChild(); }

__attribute__((destructor)) void ShimDestructor() {
  if (g_init_state.load(std::memory_order_acquire) == Tracer::kReady) g_tracer.OnExit();
}

bool ClockAllowsTsc() {
  const char* v = std::getenv("FALCON_CLOCK");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0 || std::strcmp(v, "tsc") == 0) return true;
  if (std::strcmp(v, "system") != 0) {
    Log(LogLevel::kWarn, "ignoring FALCON_CLOCK=\"%.32s\": expected auto, tsc or system; using auto", v);
    return true;
  }
  return false;
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
  t.clock_.Init(ClockAllowsTsc());
  t.mode_.store(static_cast<uint32_t>(t.config_.mode), std::memory_order_relaxed);
  t.sample_every_.store(t.config_.sample_every, std::memory_order_relaxed);
  if (t.gpu_.Init()) t.segment_.control()->timing_source = kFalconTimingCudaEvents;
  t.trap_.Attach(t.segment_.control(), t.config_.comm_capacity);
  t.stop_.store(false, std::memory_order_relaxed);
  if (StartServiceThread(t)) {
    t.segment_.MarkHeartbeatKept();
  } else {  // readers then never judge this segment by its (stopped) heartbeat
    LogOnce(OnceKey::kServiceThread, LogLevel::kWarn,
            "cannot start the service thread: no heartbeat, mode changes or GPU timing");
  }
  Log(LogLevel::kInfo, "recording NCCL calls to %s (clock: %s)", t.segment_.path(),
      t.clock_.source() == FastClock::Source::kTsc ? "tsc" : "system");
  g_init_state.store(kReady, std::memory_order_release);
  // A phase the framework set before the first NCCL call (falconSetPhase): written now. One set
  // concurrently may write it as well; the later record wins, as it should.
  if (const uint32_t phase = g_phase.load(std::memory_order_seq_cst); phase != 0) t.NotePhase(phase);
  return &t;
}

void Tracer::OnExit() {
  stop_.store(true, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(segment_.header()->state).store(kFalconProcExited, std::memory_order_release);
  // Never unmap: other threads may still be inside an NCCL call while the process exits.
  if (!config_.keep_segment) segment_.Unlink();
}

void Tracer::OnForkChild() {
  // The child is a new process: it must not write into the parent's segment. Leave the mapping
  // (it is the parent's) and initialise afresh on the child's first call.
  g_init_state.store(kUninit, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_relaxed);
  comms_.Reset();
  trap_.Reset();
  validation_ = ValidationComm();  // the parent's communicator is not the child's to abort
  segment_.ForgetInForkChild();
  segment_ = Segment();
  t_thread = ThreadState();
  ResetLogOnce();
}

void Tracer::BindThread(ThreadState& ts) {
  ts.generation = generation();
  ts.slot = nullptr;
  ts.slot_index = 0xFFFF;
  ts.cached_comm = nullptr;
  ts.cached_slot = FALCON_NO_COMM;
  (void)&t_release;  // odr-use: registers the exit hook for this thread
  const uint64_t tid = static_cast<uint64_t>(syscall(SYS_gettid));  // once per thread
  FalconThreadSlot* slots = segment_.threads();
  for (uint32_t i = 0; i < config_.thread_capacity; ++i) {
    uint64_t free_tid = 0;
    if (std::atomic_ref<uint64_t>(slots[i].tid).compare_exchange_strong(free_tid, tid, std::memory_order_acq_rel)) {
      ts.slot = &slots[i];
      ts.slot_index = static_cast<uint16_t>(i);
      std::atomic_ref<uint32_t> used(segment_.header()->thread_used);
      uint32_t seen = used.load(std::memory_order_relaxed);
      while (seen < i + 1 && !used.compare_exchange_weak(seen, i + 1, std::memory_order_relaxed)) {
      }
      break;
    }
  }
  if (ts.slot == nullptr) {
    LogOnce(OnceKey::kThreadTableFull, LogLevel::kInfo,
            "more than %u threads call NCCL at once; later threads are recorded without in-flight state",
            config_.thread_capacity);
  }
  // The first lanes-1 concurrent threads each own a lane; the rest share the last one.
  uint32_t lane = SharedLane();
  const uint32_t owner = ts.slot != nullptr ? ts.slot_index : 0xFFFEu;
  for (uint32_t l = 0; l < SharedLane(); ++l) {
    uint32_t free_owner = 0xFFFFFFFFu;
    if (std::atomic_ref<uint32_t>(segment_.lanes()[l].owner_thread)
            .compare_exchange_strong(free_owner, owner, std::memory_order_acq_rel)) {
      lane = l;
      break;
    }
  }
  ts.lane_index = static_cast<uint8_t>(lane);
  ts.lane = &segment_.lanes()[lane];
  ts.ring = segment_.lane_ring(lane);
  ts.lane_shared = lane == SharedLane();
}

void Tracer::ReleaseThreadSlot(ThreadState& ts) {
  if (g_init_state.load(std::memory_order_acquire) != kReady || ts.generation != generation()) return;
  if (!ts.lane_shared) {
    std::atomic_ref<uint32_t>(ts.lane->owner_thread).store(0xFFFFFFFFu, std::memory_order_release);
  }
  if (ts.slot != nullptr) {
    std::atomic_ref<uint64_t>(ts.slot->inflight_seq).store(0, std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(ts.slot->tid).store(0, std::memory_order_release);
  }
  ts.generation = 0;
  ts.slot = nullptr;
}

uint32_t Tracer::SlotOf(const void* comm, ThreadState& ts) {
  const uint64_t epoch = comms_.epoch();  // before the lookup: a later change invalidates the cache
  uint32_t slot = comms_.Lookup(comm);
  if (slot == CommRegistry::kNotMapped) slot = RegisterUnknownComm(comm);
  ts.cached_comm = comm;
  ts.cached_slot = slot;
  ts.cached_epoch = epoch;
  return slot;
}

void Tracer::NoteStream(void* stream) {
  if (stream == nullptr) {
    legacy_stream_used_.store(true, std::memory_order_relaxed);
    return;
  }
  for (std::atomic<void*>& slot : job_streams_) {
    void* seen = slot.load(std::memory_order_relaxed);
    if (seen == stream) return;
    if (seen == nullptr) {
      if (slot.compare_exchange_strong(seen, stream, std::memory_order_relaxed) || seen == stream) return;
    }
  }
}

size_t Tracer::JobStreams(void** out, size_t max) const {
  size_t n = 0;
  for (const std::atomic<void*>& slot : job_streams_) {
    void* s = slot.load(std::memory_order_relaxed);
    if (s == nullptr || n == max) break;
    out[n++] = s;
  }
  if (n < max && legacy_stream_used_.load(std::memory_order_relaxed)) out[n++] = nullptr;
  return n;
}

GpuTicket Tracer::GpuBegin(const CallDesc& d, ThreadState& ts) {
  GpuTicket g;
  if (!d.gpu_work || !gpu_.available()) return g;
  if (ts.group_depth == 0) {  // events bracket the call's own work
    g.ticket = gpu_.Start(d.stream, &g.capturing);
    return g;
  }
  // Inside a group NCCL launches everything at the outermost ncclGroupEnd: one start event
  // before the group's first GPU call, on its stream; a group spanning streams is not timed.
  if (ts.group_streams == 0) {
    ts.group_ticket = gpu_.Start(d.stream, &g.capturing);
    ts.group_stream = d.stream;
    ts.group_streams = 1;
  } else if (d.stream != ts.group_stream) {
    ts.group_streams = 2;
  }
  return g;
}

void Tracer::Record(const CallDesc& d, const CallOutcome& out, ThreadState& ts, int64_t t0, int64_t t1,
                    uint64_t comm_seq, uint32_t comm_slot, int result, bool timed, GpuTicket gpu) {
  FalconRecord r;
  std::memset(&r, 0, sizeof(r));
  r.comm_slot = out.comm_slot != FALCON_NO_COMM ? out.comm_slot : comm_slot;
  if (comm_slot == FALCON_NO_COMM && r.comm_slot != FALCON_NO_COMM) comm_seq = comms_.NextCallSeq(r.comm_slot);
  r.comm_seq = comm_seq;
  r.count = d.count;
  r.aux = out.aux != ~uint64_t{0} ? out.aux : reinterpret_cast<uintptr_t>(d.stream);
  r.t_start_ns = t0;
  r.peer = out.peer >= -1 ? out.peer : d.peer;
  r.redop = static_cast<int16_t>(d.redop > 32767 ? 32767 : d.redop);
  r.op = static_cast<uint8_t>(d.op);
  r.dtype = static_cast<uint8_t>(d.dtype);
  r.group_depth = static_cast<uint8_t>(ts.group_depth > 255 ? 255 : ts.group_depth);
  r.flags = d.flags;
  if (ts.group_depth > 0) r.flags |= kFalconFlagInGroup;
  r.result = static_cast<uint8_t>(result);
  if (timed) {
    r.t_end_ns = t1;
    r.flags |= kFalconFlagHostEnd;
  }
  if (gpu.capturing) r.flags |= kFalconFlagGraphCapture;
  int32_t ticket = gpu.ticket;
  void* stream = d.stream;
  if (d.op == kFalconOpGroupEnd && ts.group_depth == 1 && ts.group_streams > 0) {
    // The outermost group end: its timing is the whole group's (every call in it).
    ticket = ts.group_streams == 1 ? ts.group_ticket : -1;
    stream = ts.group_stream;
    if (ts.group_streams > 1 && ts.group_ticket >= 0) gpu_.Cancel(ts.group_ticket);
    ts.group_ticket = -1;
    ts.group_stream = nullptr;
    ts.group_streams = 0;
  }
  // A failed call, or a group end of nonblocking communicators still launching (ncclInProgress:
  // its work may not be on the stream yet), gets no device time.
  if (ticket >= 0 && result != 0) {
    gpu_.Cancel(ticket);
    ticket = -1;
  }
  if (ticket >= 0) r.flags |= kFalconFlagGpuPending;
  Publish(r, ts.lane_index);
  if (ticket >= 0) {
    if (r.version == 0) gpu_.Cancel(ticket);  // the record was dropped: nothing to attach to
    else gpu_.Stop(ticket, stream, r.version / 2 - 1, ts.lane_index);
  }
  if (ts.slot != nullptr) std::atomic_ref<uint64_t>(ts.slot->inflight_seq).store(0, std::memory_order_release);
}

void Tracer::CountUntracked(uint64_t n) {
  std::atomic_ref<uint64_t>(segment_.header()->untracked_calls).fetch_add(n, std::memory_order_relaxed);
}

void Tracer::TrackDevice(const CallDesc& d, ThreadState& ts, uint32_t comm_slot, uint64_t comm_seq, int result) {
  if (d.op == kFalconOpGroupEnd) {
    if (ts.group_depth != 1) return;  // an inner end launches nothing
    // ncclInProgress: nonblocking communicators still launching; the work may not be queued.
    uint64_t untracked = 0;
    for (uint32_t i = 0; i < ts.group_mark_count; ++i) {
      const ThreadState::GroupMark& m = ts.group_marks[i];
      if (result == 0 && gpu_.Mark(m.stream, m.comm_slot, m.seq)) comms_.NoteMarked(m.comm_slot, m.seq);
      else ++untracked;
    }
    if (untracked != 0) CountUntracked(untracked);
    ts.group_mark_count = 0;
    return;
  }
  if (!d.gpu_work || comm_seq == ~uint64_t{0} || comm_slot == FALCON_NO_COMM) return;
  if (result != 0) {  // failed (no work), or in progress (work not queued yet)
    if (result == kNcclInProgress) CountUntracked(1);
    return;
  }
  if (ts.group_depth == 0) {
    if (gpu_.Mark(d.stream, comm_slot, comm_seq)) comms_.NoteMarked(comm_slot, comm_seq);
    else CountUntracked(1);
    return;
  }
  for (uint32_t i = 0; i < ts.group_mark_count; ++i) {
    ThreadState::GroupMark& m = ts.group_marks[i];
    if (m.comm_slot == comm_slot && m.stream == d.stream) {
      m.seq = comm_seq;
      return;
    }
  }
  // A group on more communicators and streams than kGroupMarks: the rest stay unmarked (of
  // unknown state to readers, never reported complete).
  if (ts.group_mark_count < ThreadState::kGroupMarks) ts.group_marks[ts.group_mark_count++] = {comm_slot, comm_seq, d.stream};
  else CountUntracked(1);
}

void Tracer::Publish(FalconRecord& r, uint32_t lane_index) {
  FalconLane* lane = &segment_.lanes()[lane_index];
  const uint64_t cap = config_.ring_records;
  std::atomic_ref<uint64_t> head(lane->head);
  FalconRecord* ring = segment_.lane_ring(lane_index);
  const bool shared = lane_index == SharedLane();
  uint64_t idx;
  FalconRecord* slot;
  if (!shared) {
    idx = head.load(std::memory_order_relaxed);
    head.store(idx + 1, std::memory_order_relaxed);
    slot = &ring[idx & (cap - 1)];
    std::atomic_ref<uint64_t>(slot->version).store(2 * idx + 1, std::memory_order_relaxed);
  } else {
    idx = head.fetch_add(1, std::memory_order_relaxed);
    slot = &ring[idx & (cap - 1)];
    std::atomic_ref<uint64_t> version(slot->version);
    uint64_t cur = version.load(std::memory_order_relaxed);
    // Claim the slot: it must hold an older, complete record (or nothing). A slower writer
    // still inside it means we would tear its record: drop ours instead (contract 3).
    if ((cur & 1) != 0 || cur >= 2 * idx + 1 ||
        !version.compare_exchange_strong(cur, 2 * idx + 1, std::memory_order_relaxed)) {
      std::atomic_ref<uint64_t>(lane->records_dropped).fetch_add(1, std::memory_order_relaxed);
      r.version = 0;
      return;
    }
  }
  std::atomic_thread_fence(std::memory_order_release);
  if (idx >= cap && idx - cap >= std::atomic_ref<uint64_t>(lane->reader_cursor).load(std::memory_order_relaxed)) {
    std::atomic_ref<uint64_t> lost(lane->records_lost);
    if (shared) lost.fetch_add(1, std::memory_order_relaxed);
    else lost.store(lost.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  r.version = 2 * idx + 2;
  r.lane = static_cast<uint8_t>(lane_index);
  // Word-wise relaxed atomic stores: a concurrent reader may copy the slot (seqlock).
  const auto* src = reinterpret_cast<const uint64_t*>(&r);
  auto* dst = reinterpret_cast<uint64_t*>(slot);
  for (size_t w = 1; w < sizeof(FalconRecord) / sizeof(uint64_t); ++w) {
    std::atomic_ref<uint64_t>(dst[w]).store(src[w], std::memory_order_relaxed);
  }
  std::atomic_ref<uint64_t>(slot->version).store(2 * idx + 2, std::memory_order_release);
}

void Tracer::ServiceTick(TickKind kind) {
  FalconShmHeader* h = segment_.header();
  FalconControl* c = segment_.control();
  clock_.Calibrate();
  const int64_t mono = SystemMonoNs();
  std::atomic_ref<int64_t>(h->real_minus_mono_ns).store(RealNowNs() - mono, std::memory_order_relaxed);
  std::atomic_ref<int64_t>(c->heartbeat_mono_ns).store(mono, std::memory_order_relaxed);
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
  trap_.ServiceTick(RealNowNs());
  if (kind == TickKind::kFirst) return;
  // A process may load CUDA after its first NCCL call: look for the driver about once a second.
  if (!gpu_.available() && !gpu_.disabled() && ++ticks_without_gpu_ % kGpuRetryTicks == 0 && gpu_.Init()) {
    std::atomic_ref<uint32_t>(c->timing_source).store(kFalconTimingCudaEvents, std::memory_order_relaxed);
    Log(LogLevel::kInfo, "CUDA driver found: GPU timing with CUDA events from now on");
  }
  if (gpu_.available()) {
    gpu_.Poll(*this);
    gpu_.PollMarks(comms_, SystemMonoNs());
  }
}

void Tracer::NotePhase(uint32_t phase) {
  FalconControl* c = segment_.control();
  const int64_t now = clock_.Now();
  const int64_t real_minus_mono =
      std::atomic_ref<int64_t>(segment_.header()->real_minus_mono_ns).load(std::memory_order_relaxed);
  std::atomic_ref<int64_t>(c->phase_since_real_ns).store(now + real_minus_mono, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(c->phase).store(phase, std::memory_order_release);
  FalconRecord r;
  std::memset(&r, 0, sizeof(r));
  r.comm_seq = ~uint64_t{0};
  r.count = kFalconAnnotatePhase;
  r.peer = static_cast<int32_t>(phase);
  r.t_start_ns = now;
  r.comm_slot = FALCON_NO_COMM;
  r.redop = -1;
  r.op = static_cast<uint8_t>(kFalconOpAnnotation);
  r.dtype = 0xFF;
  Publish(r, SharedLane());
}

void Tracer::Annotate(uint64_t what, ThreadState& ts) {
  FalconRecord r;
  std::memset(&r, 0, sizeof(r));
  r.comm_seq = ~uint64_t{0};
  r.count = what;
  r.t_start_ns = clock_.Now();
  r.comm_slot = FALCON_NO_COMM;
  r.peer = -1;
  r.redop = -1;
  r.op = static_cast<uint8_t>(kFalconOpAnnotation);
  r.dtype = 0xFF;
  Publish(r, ts.lane_index);
}

}  // namespace falcon::shim
