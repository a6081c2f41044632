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

// /proc/sys/kernel/random/boot_id ("0968b90f-898b-42f2-...") as 16 bytes; zeros if unreadable.
void ReadBootId(uint8_t out[16]) {
  std::memset(out, 0, 16);
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[64];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return;
  uint8_t bytes[16];
  int nibbles = 0;
  for (ssize_t i = 0; i < n && nibbles < 32; ++i) {
    const char c = buf[i];
    int v = -1;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    if (v < 0) continue;  // the dashes
    if (nibbles % 2 == 0) bytes[nibbles / 2] = static_cast<uint8_t>(v << 4);
    else bytes[nibbles / 2] |= static_cast<uint8_t>(v);
    ++nibbles;
  }
  if (nibbles == 32) std::memcpy(out, bytes, 16);
}

// The inode of this process's PID namespace (what readlink shows as pid:[N]); 0 if unknown.
uint64_t ReadPidNs() {
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

// Takes the liveness lock (shm_abi.h) on the whole file without waiting; 0 or an errno.
int LockSegment(int fd) {
  struct flock l;
  std::memset(&l, 0, sizeof(l));
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  return fcntl(fd, F_OFD_SETLK, &l) == 0 ? 0 : errno;
}

// A file already holds our name. It is replaced only if nobody holds its lock: we take the lock
// ourselves (so no reader judges it dead while we look) and unlink it. Returns false, with the
// reason in `error`, if it belongs to a live process or cannot be inspected; the file is left
// alone then.
bool RemoveDeadSegment(const char* path, char* error, size_t error_len) {
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return true;  // gone meanwhile
    std::snprintf(error, error_len, "cannot inspect the existing %s: %s", path, std::strerror(errno));
    return false;
  }
  const int rc = LockSegment(fd);
  if (rc != 0) {
    close(fd);
    if (rc == EAGAIN || rc == EACCES) {
      std::snprintf(error, error_len, "%s belongs to a live process (its lock is held); not replacing it", path);
    } else {
      std::snprintf(error, error_len, "cannot lock the existing %s: %s", path, std::strerror(rc));
    }
    return false;
  }
  unlink(path);  // a leftover of a process that had our pid in our PID namespace: it crashed
  close(fd);
  return true;
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
  uint8_t boot_id[16];
  ReadBootId(boot_id);
  const uint64_t pid_ns = ReadPidNs();
  char boot_hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(boot_hex + 2 * i, 3, "%02x", boot_id[i]);
  std::snprintf(path_, sizeof(path_), "%s/%s%u.%s.%llu.%d", config.shm_dir, FALCON_SHM_PREFIX,
                static_cast<unsigned>(getuid()), boot_hex, static_cast<unsigned long long>(pid_ns),
                static_cast<int>(getpid()));
  int fd = open(path_, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == EEXIST) {
    if (!RemoveDeadSegment(path_, error, error_len)) return false;
    fd = open(path_, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  }
  if (fd < 0) {
    std::snprintf(error, error_len, "cannot create %s: %s", path_, std::strerror(errno));
    return false;
  }
  linked_ = true;
  // The lock first: from here on no reader can take the half-built file for a dead one.
  int rc = LockSegment(fd);
  if (rc != 0) {
    std::snprintf(error, error_len, "cannot lock %s: %s", path_, std::strerror(rc));
    close(fd);
    Unlink();
    return false;
  }
  // fchmod: the umask must not widen or narrow what DESIGN.md requires (0600).
  rc = fchmod(fd, 0600);
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
  if (base == MAP_FAILED) {
    std::snprintf(error, error_len, "cannot map %s: %s", path_, std::strerror(errno));
    close(fd);
    Unlink();
    return false;
  }
  lock_fd_ = fd;  // never closed: the kernel drops the lock when the process dies
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
  h->pid_ns = pid_ns;
  std::memcpy(h->boot_id, boot_id, sizeof(h->boot_id));
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

void Segment::MarkHeartbeatKept() {
  std::atomic_ref<uint32_t>(header_->shim_flags).fetch_or(kFalconShimHeartbeat, std::memory_order_release);
}

void Segment::ForgetInForkChild() {
  if (lock_fd_ >= 0) close(lock_fd_);
  lock_fd_ = -1;
}

void Segment::Unlink() {
  if (!linked_) return;
  linked_ = false;
  unlink(path_);
}

}  // namespace falcon::shim
