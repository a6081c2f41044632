// Shim segment creation and removal: see segment.h.
#include "shim/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace falcon::shim {
namespace {

uint64_t AlignUp(uint64_t v) { return (v + 63) & ~uint64_t{63}; }

uint64_t ReadPidStartTicks() {
  // Field 22 of /proc/self/stat; the comm field (2) may hold spaces, so parse after the last ')'.
  int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  int field = 2;
  for (; *p != '\0' && field < 22; ++p) {
    if (*p == ' ') ++field;
  }
  unsigned long long ticks = 0;
  if (std::sscanf(p, "%llu", &ticks) != 1) return 0;
  return ticks;
}

void ReadExeName(char* out, size_t cap) {
  char buf[512];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) {
    std::snprintf(out, cap, "?");
    return;
  }
  buf[n] = '\0';
  const char* base = std::strrchr(buf, '/');
  base = base != nullptr ? base + 1 : buf;
  size_t len = std::strlen(base);
  if (len >= cap) len = cap - 1;
  std::memcpy(out, base, len);
  out[len] = '\0';
}

}  // namespace

SegmentLayout ComputeLayout(const ShimConfig& c) {
  SegmentLayout l{};
  l.control_offset = AlignUp(sizeof(FalconShmHeader));
  l.plan_offset = AlignUp(l.control_offset + sizeof(FalconControl));
  l.comm_offset = AlignUp(l.plan_offset + sizeof(FalconPlanBlock));
  l.thread_offset = AlignUp(l.comm_offset + uint64_t{c.comm_capacity} * sizeof(FalconCommEntry));
  l.lane_offset = AlignUp(l.thread_offset + uint64_t{c.thread_capacity} * sizeof(FalconThreadSlot));
  l.ring_offset = AlignUp(l.lane_offset + uint64_t{c.lanes} * sizeof(FalconLane));
  l.size = AlignUp(l.ring_offset + uint64_t{c.lanes} * c.ring_records * sizeof(FalconRecord));
  return l;
}

bool Segment::Create(const ShimConfig& config, char* error, size_t error_len) {
  const SegmentLayout layout = ComputeLayout(config);
  std::snprintf(path_, sizeof(path_), "%s/%s%u.%d", config.shm_dir, FALCON_SHM_PREFIX,
                static_cast<unsigned>(getuid()), static_cast<int>(getpid()));
  int fd = open(path_, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == EEXIST) {
    // A leftover from an earlier process with this pid (it crashed): never trust its contents.
    unlink(path_);
    fd = open(path_, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  }
  if (fd < 0) {
    std::snprintf(error, error_len, "cannot create %s: %s", path_, std::strerror(errno));
    return false;
  }
  linked_ = true;
  // fchmod: the umask must not widen or narrow what DESIGN.md requires (0600).
  int rc = fchmod(fd, 0600);
  if (rc == 0) rc = posix_fallocate(fd, 0, static_cast<off_t>(layout.size));
  else rc = errno;
  if (rc != 0) {
    std::snprintf(error, error_len, "cannot reserve %llu bytes for %s: %s",
                  static_cast<unsigned long long>(layout.size), path_, std::strerror(rc));
    close(fd);
    Unlink();
    return false;
  }
  // MAP_POPULATE: take the page faults now, not on the first lap of the ring.
  void* base = mmap(nullptr, layout.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    std::snprintf(error, error_len, "cannot map %s: %s", path_, std::strerror(errno));
    Unlink();
    return false;
  }
  auto* bytes = static_cast<unsigned char*>(base);
  header_ = static_cast<FalconShmHeader*>(base);
  control_ = reinterpret_cast<FalconControl*>(bytes + layout.control_offset);
  plan_ = reinterpret_cast<FalconPlanBlock*>(bytes + layout.plan_offset);
  comms_ = reinterpret_cast<FalconCommEntry*>(bytes + layout.comm_offset);
  threads_ = reinterpret_cast<FalconThreadSlot*>(bytes + layout.thread_offset);
  lanes_ = reinterpret_cast<FalconLane*>(bytes + layout.lane_offset);
  ring_ = reinterpret_cast<FalconRecord*>(bytes + layout.ring_offset);
  lane_capacity_ = config.ring_records;
  for (uint32_t i = 0; i < config.lanes; ++i) {
    lanes_[i].owner_thread = 0xFFFFFFFFu;
    lanes_[i].shared = i + 1 == config.lanes ? 1 : 0;
  }

  FalconShmHeader* h = header_;  // fresh file: already zero-filled
  h->abi_version = FALCON_SHM_ABI_VERSION;
  h->header_size = sizeof(FalconShmHeader);
  h->control_size = sizeof(FalconControl);
  h->comm_entry_size = sizeof(FalconCommEntry);
  h->thread_slot_size = sizeof(FalconThreadSlot);
  h->record_size = sizeof(FalconRecord);
  h->comm_capacity = config.comm_capacity;
  h->thread_capacity = config.thread_capacity;
  h->lane_count = config.lanes;
  h->lane_size = sizeof(FalconLane);
  h->lane_capacity = config.ring_records;
  h->control_offset = layout.control_offset;
  h->plan_offset = layout.plan_offset;
  h->plan_size = sizeof(FalconPlanBlock);
  h->comm_offset = layout.comm_offset;
  h->thread_offset = layout.thread_offset;
  h->lane_offset = layout.lane_offset;
  h->ring_offset = layout.ring_offset;
  h->segment_size = layout.size;
  h->pid = static_cast<int32_t>(getpid());
  h->uid = static_cast<uint32_t>(getuid());
  h->pid_start_ticks = ReadPidStartTicks();
  h->created_mono_ns = MonoNowNs();
  h->created_real_ns = RealNowNs();
  h->real_minus_mono_ns = h->created_real_ns - h->created_mono_ns;
  h->rank_hint = config.rank_hint;
  h->local_rank_hint = config.local_rank_hint;
  h->state = kFalconProcRunning;
  if (gethostname(h->host, sizeof(h->host) - 1) != 0) std::snprintf(h->host, sizeof(h->host), "?");
  std::snprintf(h->job, sizeof(h->job), "%s", config.job);
  ReadExeName(h->exe, sizeof(h->exe));
  control_->mode = static_cast<uint32_t>(config.mode);
  control_->sample_every = config.sample_every;
  control_->active_mode = static_cast<uint32_t>(config.mode);
  std::atomic_ref<uint64_t>(h->magic).store(FALCON_SHM_MAGIC, std::memory_order_release);
  return true;
}

void Segment::Unlink() {
  if (!linked_) return;
  linked_ = false;
  unlink(path_);
}

}  // namespace falcon::shim
