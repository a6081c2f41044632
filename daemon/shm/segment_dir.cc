// Segment discovery: see segment_dir.h.
#include "daemon/shm/segment_dir.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

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

bool ParseName(const char* name, uint32_t* uid, int32_t* pid) {
  const size_t plen = std::strlen(FALCON_SHM_PREFIX);
  if (std::strncmp(name, FALCON_SHM_PREFIX, plen) != 0) return false;
  unsigned u = 0;
  int p = 0;
  char tail = 0;
  if (std::sscanf(name + plen, "%u.%d%c", &u, &p, &tail) != 2 || p <= 0) return false;
  *uid = u;
  *pid = p;
  return true;
}

}  // namespace

const char* SegmentStateName(SegmentInfo::State s) {
  switch (s) {
    case SegmentInfo::State::kLive: return "live";
    case SegmentInfo::State::kExited: return "exited";
    case SegmentInfo::State::kOrphaned: return "orphaned";
    case SegmentInfo::State::kUnreadable: return "unreadable";
  }
  return "?";
}

std::string DefaultSegmentDir() {
  const char* v = std::getenv("FALCON_SHM_DIR");
  return (v != nullptr && *v != '\0') ? v : FALCON_SHM_DEFAULT_DIR;
}

std::string SegmentPath(const std::string& dir, uint32_t uid, int32_t pid) {
  return dir + "/" + FALCON_SHM_PREFIX + std::to_string(uid) + "." + std::to_string(pid);
}

bool ProcessMatches(int32_t pid, uint64_t start_ticks) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  if (start_ticks == 0) return true;
  std::optional<uint64_t> now = StartTicks(pid);
  return now.has_value() && *now == start_ticks;
}

Result<std::vector<SegmentInfo>> ListSegments(const std::string& dir, uint32_t uid, bool all_users) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return Status::IoError("cannot list " + dir + ": " + std::strerror(errno));
  std::vector<SegmentInfo> out;
  while (dirent* e = readdir(d)) {
    SegmentInfo info;
    if (!ParseName(e->d_name, &info.uid, &info.pid)) continue;
    if (!all_users && info.uid != uid) continue;
    info.path = dir + "/" + e->d_name;
    Result<SegmentReader> r = SegmentReader::Open(info.path);
    if (!r.ok()) {
      info.error = r.status().message();
      info.state = ProcessMatches(info.pid, 0) ? SegmentInfo::State::kUnreadable : SegmentInfo::State::kOrphaned;
      out.push_back(std::move(info));
      continue;
    }
    const SegmentReader& seg = r.value();
    const FalconShmHeader& h = seg.header();
    info.exe = h.exe;
    info.job = h.job;
    info.host = h.host;
    info.rank_hint = h.rank_hint;
    info.records = seg.head();
    info.lost = seg.records_lost();
    info.comms = h.comm_used;
    info.created_real_ns = h.created_real_ns;
    info.heartbeat_real_ns = seg.control().heartbeat_real_ns;
    if (seg.exited()) info.state = SegmentInfo::State::kExited;
    else if (ProcessMatches(h.pid, h.pid_start_ticks)) info.state = SegmentInfo::State::kLive;
    else info.state = SegmentInfo::State::kOrphaned;
    out.push_back(std::move(info));
  }
  closedir(d);
  return out;
}

Status ReapSegment(const SegmentInfo& info) {
  if (info.state == SegmentInfo::State::kLive) return Status::InvalidArgument(info.path + " belongs to a live process");
  if (info.state == SegmentInfo::State::kUnreadable) {
    return Status::InvalidArgument(info.path + " is unreadable and its pid runs; not removing it");
  }
  if (unlink(info.path.c_str()) != 0 && errno != ENOENT) {
    return Status::IoError("cannot remove " + info.path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace falcon::daemon
