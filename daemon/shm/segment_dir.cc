// Segment discovery: see segment_dir.h.
#include "daemon/shm/segment_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "daemon/shm/segment_reader.h"
#include "falcon/shm_abi.h"

namespace falcon::daemon {
namespace {

std::optional<uint64_t> StartTicks(int32_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return std::nullopt;
  std::string line;
  std::getline(f, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i < 22 && rest >> field; ++i) {
  }
  uint64_t ticks = 0;
  if (!(rest >> ticks)) return std::nullopt;
  return ticks;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// 32 hex digits (dashes skipped when allow_dashes) into 16 bytes.
bool ParseBootId(std::string_view text, bool allow_dashes, std::array<uint8_t, 16>* out) {
  int nibbles = 0;
  for (char c : text) {
    if (allow_dashes && c == '-') continue;
    const int v = HexDigit(c);
    if (v < 0 || nibbles == 32) return false;
    (*out)[nibbles / 2] = static_cast<uint8_t>(nibbles % 2 == 0 ? v << 4 : (*out)[nibbles / 2] | v);
    ++nibbles;
  }
  return nibbles == 32;
}

std::array<uint8_t, 16> ReadBootId() {
  std::array<uint8_t, 16> id{};
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string line;
  if (!f || !std::getline(f, line) || !ParseBootId(line, /*allow_dashes=*/true, &id)) id.fill(0);
  return id;
}

uint64_t PidNsInode(const std::string& proc_dir) {
  struct stat st;
  return stat((proc_dir + "/ns/pid").c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Strict decimal: digits only, no sign, no overflow past `max`.
bool ParseDecimal(std::string_view text, uint64_t max, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (max - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

template <typename T>
T LoadShared(const T& field, std::memory_order order) {
  return std::atomic_ref<T>(const_cast<T&>(field)).load(order);
}

int64_t NowNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// True if anyone holds the liveness lock (shm_abi.h) on the file behind `fd`. Takes no lock.
bool LockHeld(int fd) {
  struct flock l;
  std::memset(&l, 0, sizeof(l));
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  if (fcntl(fd, F_OFD_GETLK, &l) != 0) return true;  // cannot tell: count it as held
  return l.l_type != F_UNLCK;
}

PidNamespace HeaderNamespace(const FalconShmHeader& h) {
  PidNamespace ns;
  std::memcpy(ns.boot_id.data(), h.boot_id, ns.boot_id.size());
  ns.pid_ns = h.pid_ns;
  return ns;
}

WriterEvidence Gather(const SegmentReader& seg, const PidNamespace& own, bool lock_held) {
  const FalconShmHeader& h = seg.header();
  const FalconControl& c = seg.control();
  const PidNamespace writer = HeaderNamespace(h);
  WriterEvidence e;
  e.exited = seg.exited();
  e.same_namespace = writer.known() && writer == own;
  e.pid_matches = e.same_namespace && ProcessMatches(h.pid, h.pid_start_ticks);
  e.lock_held = lock_held;
  const uint32_t flags = LoadShared(seg.live_header().shim_flags, std::memory_order_acquire);
  e.heartbeat_kept = (flags & kFalconShimHeartbeat) != 0;
  const std::array<uint8_t, 16> zero{};
  e.same_boot = writer.boot_id != zero && writer.boot_id == own.boot_id;
  e.heartbeat_mono_age_ns =
      NowNs(CLOCK_MONOTONIC) - LoadShared(c.heartbeat_mono_ns, std::memory_order_relaxed);
  e.heartbeat_real_age_ns =
      NowNs(CLOCK_REALTIME) - LoadShared(c.heartbeat_real_ns, std::memory_order_relaxed);
  return e;
}

// One directory entry, looked at now. nullopt if the file is gone.
std::optional<SegmentInfo> Inspect(const std::string& path, const SegmentName& name, const PidNamespace& own,
                                   const LivenessOptions& options) {
  SegmentInfo info;
  info.path = path;
  info.uid = name.uid;
  info.pid = name.pid;
  info.pid_ns = name.ns.pid_ns;
  info.own_namespace = name.ns.known() && name.ns == own;
  int64_t mtime_ns = 0;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    struct stat st;
    if (fstat(fd, &st) == 0) {
      info.inode = static_cast<uint64_t>(st.st_ino);
      mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
    }
    info.lock_held = LockHeld(fd);
    close(fd);
  } else if (errno == ENOENT) {
    return std::nullopt;
  } else {
    info.lock_held = true;  // cannot tell (no permission?): never judged dead by its lock
  }
  Result<SegmentReader> r = SegmentReader::Open(path);
  if (!r.ok()) {
    if (r.status().code() == Status::Code::kNotFound) return std::nullopt;
    info.error = r.status().message();
    // No header to trust: in our namespace the name's pid decides; elsewhere only a free lock on
    // a file untouched for longer than the heartbeat bound (a writer that died while creating it).
    bool dead;
    if (info.own_namespace) dead = !ProcessMatches(info.pid, 0);
    else dead = !info.lock_held && mtime_ns != 0 && NowNs(CLOCK_REALTIME) - mtime_ns > options.heartbeat_stale_ns;
    info.state = dead ? SegmentInfo::State::kOrphaned : SegmentInfo::State::kUnreadable;
    return info;
  }
  const SegmentReader& seg = r.value();
  const FalconShmHeader& h = seg.header();
  info.pid = h.pid;
  info.pid_ns = h.pid_ns;
  info.own_namespace = HeaderNamespace(h).known() && HeaderNamespace(h) == own;
  info.exe = h.exe;
  info.job = h.job;
  info.host = h.host;
  info.rank_hint = h.rank_hint;
  info.records = seg.head();
  info.lost = seg.records_lost();
  info.comms = LoadShared(seg.live_header().comm_used, std::memory_order_relaxed);
  info.created_real_ns = h.created_real_ns;
  info.heartbeat_real_ns = seg.control().heartbeat_real_ns;
  info.state = ClassifyWriter(Gather(seg, own, info.lock_held), options);
  return info;
}

}  // namespace

bool PidNamespace::known() const {
  const std::array<uint8_t, 16> zero{};
  return pid_ns != 0 && boot_id != zero;
}

PidNamespace OwnPidNamespace() {
  PidNamespace ns;
  ns.boot_id = ReadBootId();
  ns.pid_ns = PidNsInode("/proc/self");
  return ns;
}

std::optional<SegmentName> ParseSegmentName(std::string_view file_name) {
  const std::string_view prefix = FALCON_SHM_PREFIX;
  if (file_name.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::string_view rest = file_name.substr(prefix.size());
  std::string_view parts[4];
  for (int i = 0; i < 4; ++i) {
    const size_t dot = rest.find('.');
    if ((dot == std::string_view::npos) != (i == 3)) return std::nullopt;  // exactly four parts
    parts[i] = rest.substr(0, dot);
    if (dot != std::string_view::npos) rest = rest.substr(dot + 1);
  }
  SegmentName n;
  uint64_t uid = 0, pid_ns = 0, pid = 0;
  if (!ParseDecimal(parts[0], UINT32_MAX, &uid) || !ParseBootId(parts[1], /*allow_dashes=*/false, &n.ns.boot_id) ||
      !ParseDecimal(parts[2], UINT64_MAX, &pid_ns) || !ParseDecimal(parts[3], INT32_MAX, &pid) || pid == 0) {
    return std::nullopt;
  }
  n.uid = static_cast<uint32_t>(uid);
  n.ns.pid_ns = pid_ns;
  n.pid = static_cast<int32_t>(pid);
  return n;
}

std::string SegmentFileName(const SegmentName& n) {
  char boot[33];
  for (size_t i = 0; i < n.ns.boot_id.size(); ++i) std::snprintf(boot + 2 * i, 3, "%02x", n.ns.boot_id[i]);
  return std::string(FALCON_SHM_PREFIX) + std::to_string(n.uid) + "." + boot + "." + std::to_string(n.ns.pid_ns) +
         "." + std::to_string(n.pid);
}

std::string SegmentPath(const std::string& dir, const SegmentName& name) {
  return dir + "/" + SegmentFileName(name);
}

const char* SegmentStateName(SegmentInfo::State s) {
  switch (s) {
    case SegmentInfo::State::kLive: return "live";
    case SegmentInfo::State::kExited: return "exited";
    case SegmentInfo::State::kOrphaned: return "orphaned";
    case SegmentInfo::State::kUnreadable: return "unreadable";
  }
  return "?";
}

SegmentInfo::State ClassifyWriter(const WriterEvidence& e, const LivenessOptions& options) {
  using State = SegmentInfo::State;
  if (e.exited) return State::kExited;
  if (e.same_namespace) return e.pid_matches ? State::kLive : State::kOrphaned;
  if (e.lock_held || !e.heartbeat_kept) return State::kLive;
  // Either clock may say the heartbeat is fresh: a clock step or a time namespace must not
  // make a live writer look dead. Monotonic times compare only within one boot.
  const bool fresh = (e.same_boot && e.heartbeat_mono_age_ns < options.heartbeat_stale_ns) ||
                     e.heartbeat_real_age_ns < options.heartbeat_stale_ns;
  return fresh ? State::kLive : State::kOrphaned;
}

SegmentInfo::State WriterState(const SegmentReader& seg, const LivenessOptions& options) {
  bool lock_held = false;  // an unlinked file (exited, or reaped as dead) has no lock to find
  int fd = open(seg.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    lock_held = LockHeld(fd);
    close(fd);
  }
  return ClassifyWriter(Gather(seg, OwnPidNamespace(), lock_held), options);
}

std::string DefaultSegmentDir() {
  const char* v = std::getenv("FALCON_SHM_DIR");
  return (v != nullptr && *v != '\0') ? v : FALCON_SHM_DEFAULT_DIR;
}

std::string SegmentPathOfPid(const std::string& dir, uint32_t uid, int32_t pid) {
  SegmentName name{uid, OwnPidNamespace(), pid};
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream status(proc + "/status");
  std::string line;
  while (status && std::getline(status, line)) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    int32_t innermost = 0;
    while (fields >> innermost) {
    }
    const uint64_t ns = PidNsInode(proc);
    if (innermost > 0 && ns != 0) {
      name.pid = innermost;
      name.ns.pid_ns = ns;
    }
    break;
  }
  return SegmentPath(dir, name);
}

bool ProcessMatches(int32_t pid, uint64_t start_ticks) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  if (start_ticks == 0) return true;
  std::optional<uint64_t> now = StartTicks(pid);
  return now.has_value() && *now == start_ticks;
}

Result<std::vector<SegmentInfo>> ListSegments(const std::string& dir, uint32_t uid, bool all_users,
                                              const LivenessOptions& options) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return Status::IoError("cannot list " + dir + ": " + std::strerror(errno));
  const PidNamespace own = OwnPidNamespace();
  std::vector<SegmentInfo> out;
  while (dirent* e = readdir(d)) {
    std::optional<SegmentName> name = ParseSegmentName(e->d_name);
    if (!name.has_value() || (!all_users && name->uid != uid)) continue;
    std::optional<SegmentInfo> info = Inspect(dir + "/" + e->d_name, *name, own, options);
    if (info.has_value()) out.push_back(std::move(*info));
  }
  closedir(d);
  return out;
}

Status ReapSegment(const SegmentInfo& info, const LivenessOptions& options) {
  if (info.state == SegmentInfo::State::kLive) return Status::InvalidArgument(info.path + " belongs to a live process");
  if (info.state == SegmentInfo::State::kUnreadable) {
    return Status::InvalidArgument(info.path + " is unreadable and its writer may be alive; not removing it");
  }
  // Look again: the writer may have come back to life in the reader's eyes (a frozen container
  // thawed), or the name may now be a new process's segment.
  const size_t slash = info.path.rfind('/');
  std::optional<SegmentName> name = ParseSegmentName(std::string_view(info.path).substr(slash + 1));
  if (!name.has_value()) return Status::InvalidArgument(info.path + " is not a segment name of this ABI");
  std::optional<SegmentInfo> now = Inspect(info.path, *name, OwnPidNamespace(), options);
  if (!now.has_value()) return Status::Ok();  // already gone
  if (now->inode != info.inode) return Status::InvalidArgument(info.path + " was replaced since it was listed");
  if (now->state == SegmentInfo::State::kLive || now->state == SegmentInfo::State::kUnreadable) {
    return Status::InvalidArgument(info.path + " is " + SegmentStateName(now->state) + " now; not removing it");
  }
  if (unlink(info.path.c_str()) != 0 && errno != ENOENT) {
    return Status::IoError("cannot remove " + info.path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace falcon::daemon
