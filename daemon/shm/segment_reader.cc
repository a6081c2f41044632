// SegmentReader: see segment_reader.h.
#include "daemon/shm/segment_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

namespace falcon::daemon {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

bool InBounds(uint64_t offset, uint64_t count, uint64_t elem, uint64_t limit) {
  if (offset > limit || elem == 0) return false;
  if (count > (limit - offset) / elem) return false;
  return offset % 8 == 0;
}

template <typename T>
T LoadRelaxed(const T& field) {
  return std::atomic_ref<T>(const_cast<T&>(field)).load(std::memory_order_relaxed);
}

}  // namespace

Status ValidateHeader(const FalconShmHeader& h, uint64_t file_size) {
  if (h.magic != FALCON_SHM_MAGIC) return Status::Corrupt("bad magic (not a Falcon segment, or not initialised yet)");
  if (h.abi_version != FALCON_SHM_ABI_VERSION) {
    return Status::Corrupt("unsupported ABI version " + std::to_string(h.abi_version) + " (this reader knows " +
                           std::to_string(FALCON_SHM_ABI_VERSION) + "); use a matching falcon-ctl/agent");
  }
  if (h.header_size != sizeof(FalconShmHeader) || h.control_size != sizeof(FalconControl) ||
      h.comm_entry_size != sizeof(FalconCommEntry) || h.thread_slot_size != sizeof(FalconThreadSlot) ||
      h.record_size != sizeof(FalconRecord)) {
    return Status::Corrupt("struct sizes differ from this reader's ABI");
  }
  if (h.segment_size > file_size) {
    return Status::Corrupt("segment_size " + std::to_string(h.segment_size) + " exceeds the file (" +
                           std::to_string(file_size) + " bytes)");
  }
  if (h.lane_size != sizeof(FalconLane)) return Status::Corrupt("lane size differs from this reader's ABI");
  if (h.plan_size != sizeof(FalconPlanBlock)) {
    return Status::Corrupt("plan block size " + std::to_string(h.plan_size) + " differs from this reader's ABI (" +
                           std::to_string(sizeof(FalconPlanBlock)) + ")");
  }
  if (h.lane_capacity == 0 || (h.lane_capacity & (h.lane_capacity - 1)) != 0) {
    return Status::Corrupt("lane capacity is not a power of two");
  }
  if (h.lane_count < 2 || h.lane_count > 1024) return Status::Corrupt("implausible lane count");
  const uint64_t lim = h.segment_size;
  const uint64_t records = h.lane_capacity > (uint64_t{1} << 40) ? ~uint64_t{0} : h.lane_capacity * h.lane_count;
  if (!InBounds(h.control_offset, 1, sizeof(FalconControl), lim) ||
      !InBounds(h.plan_offset, 1, sizeof(FalconPlanBlock), lim) ||
      !InBounds(h.comm_offset, h.comm_capacity, sizeof(FalconCommEntry), lim) ||
      !InBounds(h.thread_offset, h.thread_capacity, sizeof(FalconThreadSlot), lim) ||
      !InBounds(h.lane_offset, h.lane_count, sizeof(FalconLane), lim) ||
      !InBounds(h.ring_offset, records, sizeof(FalconRecord), lim)) {
    return Status::Corrupt("a table lies outside the segment");
  }
  return Status::Ok();
}

Result<SegmentReader> SegmentReader::Open(const std::string& path, Access access) {
  const bool rw = access == Access::kReadWrite;
  int fd = open(path.c_str(), (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return errno == ENOENT ? Status::NotFound(Errno("cannot open " + path)) : Status::IoError(Errno("cannot open " + path));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = Status::IoError(Errno("cannot stat " + path));
    close(fd);
    return s;
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < sizeof(FalconShmHeader)) {
    close(fd);
    return Status::Corrupt(path + ": too small for a Falcon segment (" + std::to_string(file_size) + " bytes)");
  }
  void* base = mmap(nullptr, file_size, rw ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return Status::IoError(Errno("cannot map " + path));
  auto* h = static_cast<FalconShmHeader*>(base);
  FalconShmHeader copy;
  std::memcpy(&copy, h, sizeof(copy));
  copy.magic = std::atomic_ref<uint64_t>(h->magic).load(std::memory_order_acquire);
  Status s = ValidateHeader(copy, file_size);
  if (!s.ok()) {
    munmap(base, file_size);
    return Status::Corrupt(path + ": " + s.message());
  }
  SegmentReader r;
  r.path_ = path;
  r.base_ = base;
  r.size_ = file_size;
  auto* bytes = static_cast<unsigned char*>(base);
  r.header_ = h;
  // Text fields are read as C strings by callers: terminate the copy's, whatever the file holds.
  copy.host[sizeof(copy.host) - 1] = '\0';
  copy.job[sizeof(copy.job) - 1] = '\0';
  copy.exe[sizeof(copy.exe) - 1] = '\0';
  r.header_copy_ = copy;
  r.control_ = reinterpret_cast<FalconControl*>(bytes + copy.control_offset);
  r.plan_ = reinterpret_cast<FalconPlanBlock*>(bytes + copy.plan_offset);
  r.comms_ = reinterpret_cast<FalconCommEntry*>(bytes + copy.comm_offset);
  r.threads_ = reinterpret_cast<FalconThreadSlot*>(bytes + copy.thread_offset);
  r.lanes_ = reinterpret_cast<FalconLane*>(bytes + copy.lane_offset);
  r.ring_ = reinterpret_cast<FalconRecord*>(bytes + copy.ring_offset);
  r.writable_ = rw;
  return r;
}

SegmentReader::SegmentReader(SegmentReader&& o) noexcept { *this = std::move(o); }

SegmentReader& SegmentReader::operator=(SegmentReader&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) munmap(base_, size_);
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    header_copy_ = o.header_copy_;
    header_ = std::exchange(o.header_, nullptr);
    control_ = std::exchange(o.control_, nullptr);
    plan_ = std::exchange(o.plan_, nullptr);
    comms_ = std::exchange(o.comms_, nullptr);
    threads_ = std::exchange(o.threads_, nullptr);
    lanes_ = std::exchange(o.lanes_, nullptr);
    ring_ = std::exchange(o.ring_, nullptr);
    writable_ = std::exchange(o.writable_, false);
  }
  return *this;
}

SegmentReader::~SegmentReader() {
  if (base_ != nullptr) munmap(base_, size_);
}

uint64_t SegmentReader::head() const {
  uint64_t total = 0;
  for (uint32_t l = 0; l < header_copy_.lane_count; ++l) {
    total += std::atomic_ref<uint64_t>(lanes_[l].head).load(std::memory_order_acquire);
  }
  return total;
}

ReadCursor SegmentReader::OldestCursor() const {
  ReadCursor c;
  const uint64_t cap = header_copy_.lane_capacity;
  for (uint32_t l = 0; l < header_copy_.lane_count; ++l) {
    const uint64_t h = std::atomic_ref<uint64_t>(lanes_[l].head).load(std::memory_order_acquire);
    c.next.push_back(h > cap ? h - cap : 0);
  }
  return c;
}

ReadCursor SegmentReader::HeadCursor() const {
  ReadCursor c;
  for (uint32_t l = 0; l < header_copy_.lane_count; ++l) {
    c.next.push_back(std::atomic_ref<uint64_t>(lanes_[l].head).load(std::memory_order_acquire));
  }
  return c;
}

uint64_t SegmentReader::records_lost() const {
  uint64_t total = 0;
  for (uint32_t l = 0; l < header_copy_.lane_count; ++l) total += LoadRelaxed(lanes_[l].records_lost);
  return total;
}

uint64_t SegmentReader::records_dropped() const {
  uint64_t total = 0;
  for (uint32_t l = 0; l < header_copy_.lane_count; ++l) total += LoadRelaxed(lanes_[l].records_dropped);
  return total;
}

uint64_t SegmentReader::queries() const {
  uint64_t total = 0;
  for (uint32_t l = 0; l < header_copy_.lane_count; ++l) total += LoadRelaxed(lanes_[l].queries);
  return total;
}

uint64_t SegmentReader::lane_queries(uint32_t lane) const {
  return lane < header_copy_.lane_count ? LoadRelaxed(lanes_[lane].queries) : 0;
}

bool SegmentReader::exited() const {
  return std::atomic_ref<uint32_t>(header_->state).load(std::memory_order_acquire) == kFalconProcExited;
}

std::vector<CommInfo> SegmentReader::Comms() const {
  std::vector<CommInfo> out;
  uint32_t used = LoadRelaxed(header_->comm_used);
  if (used > header_copy_.comm_capacity) used = header_copy_.comm_capacity;
  for (uint32_t i = 0; i < used; ++i) {
    std::atomic_ref<uint32_t> state(comms_[i].state);
    for (int attempt = 0; attempt < 3; ++attempt) {
      const uint32_t before = state.load(std::memory_order_acquire);
      if (before != kFalconCommLive && before != kFalconCommDestroyed) break;
      CommInfo info;
      info.slot = i;
      std::memcpy(&info.entry, &comms_[i], sizeof(FalconCommEntry));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (state.load(std::memory_order_relaxed) == before) {
        info.entry.state = before;
        info.entry.name[sizeof(info.entry.name) - 1] = '\0';  // a C string for callers
        out.push_back(info);
        break;
      }
    }
  }
  return out;
}

std::vector<ThreadInfo> SegmentReader::Threads() const {
  std::vector<ThreadInfo> out;
  uint32_t used = LoadRelaxed(header_->thread_used);
  if (used > header_copy_.thread_capacity) used = header_copy_.thread_capacity;
  for (uint32_t i = 0; i < used; ++i) {
    ThreadInfo t;
    t.slot = i;
    // Fields are independent words; a slightly stale mix is acceptable for a status view.
    t.entry.tid = LoadRelaxed(threads_[i].tid);
    t.entry.inflight_seq = std::atomic_ref<uint64_t>(threads_[i].inflight_seq).load(std::memory_order_acquire);
    t.entry.inflight_since_mono_ns = LoadRelaxed(threads_[i].inflight_since_mono_ns);
    t.entry.inflight_comm_slot = LoadRelaxed(threads_[i].inflight_comm_slot);
    t.entry.inflight_op = LoadRelaxed(threads_[i].inflight_op);
    out.push_back(t);
  }
  return out;
}

ReadStats SegmentReader::ReadLane(uint32_t lane, uint64_t* next, size_t max, ReadMode mode,
                                  std::vector<FalconRecord>* out) const {
  ReadStats stats;
  const uint64_t cap = header_copy_.lane_capacity;
  FalconRecord* ring = ring_ + uint64_t{lane} * cap;
  const uint64_t end = std::atomic_ref<uint64_t>(lanes_[lane].head).load(std::memory_order_acquire);
  if (end > cap && *next < end - cap) {
    stats.lost += (end - cap) - *next;
    *next = end - cap;
  }
  while (*next < end && stats.read < max) {
    const uint64_t idx = *next;
    FalconRecord* slot = &ring[idx & (cap - 1)];
    std::atomic_ref<uint64_t> version(slot->version);
    const uint64_t want = 2 * idx + 2;
    const uint64_t v1 = version.load(std::memory_order_acquire);
    if (v1 > want) {  // already overwritten by a newer lap
      ++stats.lost;
      ++*next;
      continue;
    }
    if (v1 != want) {  // claimed but not complete (or not even claimed yet)
      if (mode == ReadMode::kLive) break;
      ++stats.torn;
      ++*next;
      continue;
    }
    FalconRecord rec;
    auto* dst = reinterpret_cast<uint64_t*>(&rec);
    auto* src = reinterpret_cast<uint64_t*>(slot);
    for (size_t w = 0; w < sizeof(FalconRecord) / sizeof(uint64_t); ++w) {
      dst[w] = std::atomic_ref<uint64_t>(src[w]).load(std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (version.load(std::memory_order_relaxed) != v1) {  // a writer lapped us while we copied
      ++stats.lost;
      ++*next;
      continue;
    }
    out->push_back(rec);
    ++stats.read;
    ++*next;
  }
  return stats;
}

ReadStats SegmentReader::Read(ReadCursor* cursor, size_t max, ReadMode mode, std::vector<FalconRecord>* out) const {
  ReadStats total;
  cursor->next.resize(header_copy_.lane_count, 0);
  const size_t first = out->size();
  for (uint32_t l = 0; l < header_copy_.lane_count; ++l) {
    ReadStats s = ReadLane(l, &cursor->next[l], max, mode, out);
    total.read += s.read;
    total.lost += s.lost;
    total.torn += s.torn;
  }
  const auto before = [](const FalconRecord& a, const FalconRecord& b) {
    if (a.t_start_ns != b.t_start_ns) return a.t_start_ns < b.t_start_ns;
    if (a.lane != b.lane) return a.lane < b.lane;
    return a.version < b.version;
  };
  const auto begin = out->begin() + static_cast<std::ptrdiff_t>(first);
  // One busy lane (a single-threaded caller) reads in order already: no sort, no buffer.
  if (!std::is_sorted(begin, out->end(), before)) std::stable_sort(begin, out->end(), before);
  return total;
}

void SegmentReader::PublishCursor(const ReadCursor& cursor) {
  if (!writable_) return;
  for (uint32_t l = 0; l < header_copy_.lane_count && l < cursor.next.size(); ++l) {
    std::atomic_ref<uint64_t>(lanes_[l].reader_cursor).store(cursor.next[l], std::memory_order_relaxed);
  }
}

void SegmentReader::RequestMode(uint32_t mode, uint32_t sample_every) {
  if (!writable_) return;
  std::atomic_ref<uint32_t>(control_->mode).store(static_cast<uint32_t>(mode), std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(control_->sample_every).store(sample_every, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(control_->command_seq).fetch_add(1, std::memory_order_release);
}

}  // namespace falcon::daemon

namespace falcon::daemon {

uint64_t SegmentReader::RequestPause(uint32_t comm_slot, uint64_t comm_seq, int64_t deadline_real_ns) {
  const FalconPauseTarget target{comm_slot, 0, comm_seq};
  return RequestPause(std::span<const FalconPauseTarget>(&target, 1), deadline_real_ns);
}

uint64_t SegmentReader::RequestPause(std::span<const FalconPauseTarget> targets, int64_t deadline_real_ns) {
  if (!writable_) return 0;
  const std::size_t n = std::min<std::size_t>(targets.size(), FALCON_PAUSE_MAX_TARGETS);
  for (std::size_t i = 0; i < n; ++i) {
    std::atomic_ref<uint32_t>(control_->pause_targets[i].comm_slot).store(targets[i].comm_slot, std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(control_->pause_targets[i].seq).store(targets[i].seq, std::memory_order_relaxed);
  }
  // More targets than fit: a count the shim rejects, never a silently shorter cut.
  const auto count = static_cast<uint32_t>(targets.size() > FALCON_PAUSE_MAX_TARGETS ? FALCON_PAUSE_MAX_TARGETS + 1 : n);
  std::atomic_ref<uint32_t>(control_->pause_target_count).store(count, std::memory_order_relaxed);
  std::atomic_ref<int64_t>(control_->pause_deadline_real_ns).store(deadline_real_ns, std::memory_order_relaxed);
  return std::atomic_ref<uint64_t>(control_->pause_gen).fetch_add(1, std::memory_order_release) + 1;
}

void SegmentReader::RequestResume(uint64_t pause_gen) {
  if (!writable_) return;
  std::atomic_ref<uint64_t>(control_->resume_gen).store(pause_gen, std::memory_order_release);
}

uint32_t SegmentReader::trapped_comm_slot() const { return LoadRelaxed(control_->trapped_comm_slot); }

FalconPauseState SegmentReader::pause_state(uint64_t* ack_gen) const {
  *ack_gen = std::atomic_ref<uint64_t>(control_->pause_ack_gen).load(std::memory_order_acquire);
  return static_cast<FalconPauseState>(LoadRelaxed(control_->pause_state));
}

uint64_t SegmentReader::PostTask(const FalconTask& task) {
  if (!writable_) return 0;
  std::memcpy(&control_->task, &task, sizeof(task));
  return std::atomic_ref<uint64_t>(control_->task_seq).fetch_add(1, std::memory_order_release) + 1;
}

uint64_t SegmentReader::PostTask(const FalconTask& task, const uint8_t* blob) {
  if (!writable_) return 0;
  std::memcpy(control_->task_blob, blob, FALCON_TASK_BLOB_LEN);
  return PostTask(task);
}

void SegmentReader::TaskResultBlob(uint8_t* out) const {
  std::memcpy(out, control_->task_result_blob, FALCON_TASK_BLOB_LEN);
}

bool SegmentReader::TaskDone(uint64_t seq, FalconTaskResult* out) const {
  if (std::atomic_ref<uint64_t>(control_->task_ack).load(std::memory_order_acquire) < seq) return false;
  std::memcpy(out, &control_->task_result, sizeof(*out));
  return out->task_seq == seq;
}

Status SegmentReader::WritePlan(const ShmPlan& plan) {
  if (!writable_) return Status::Unavailable(path_ + ": opened read-only; cannot write the plan");
  return WritePlanBlock(plan_, plan);
}

uint64_t SegmentReader::CommCalls(uint32_t slot) const {
  if (slot >= header_copy_.comm_capacity) return 0;
  return LoadRelaxed(comms_[slot].calls);
}

}  // namespace falcon::daemon
