// Shim configuration loader: see config.h. Runs once per process, off the hot path.
#include "shim/config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "shim/log.h"

namespace falcon::shim {
namespace {

void CopyString(char* dst, size_t cap, const char* src) {
  size_t n = std::strlen(src);
  if (n >= cap) n = cap - 1;
  std::memcpy(dst, src, n);
  dst[n] = '\0';
}

void Warn(const char* name, const char* value, const char* why) {
  Log(LogLevel::kWarn, "ignoring %s=\"%.64s\": %s; using the default", name, value, why);
}

// Reads an unsigned integer in [lo, hi]; keeps *out on absence or error.
void ReadUnsigned(const char* name, uint64_t lo, uint64_t hi, uint64_t* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return;
  char* end = nullptr;
  errno = 0;
  unsigned long long parsed = std::strtoull(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || v[0] == '-') {
    Warn(name, v, "not a non-negative integer");
    return;
  }
  if (parsed < lo || parsed > hi) {
    Warn(name, v, "out of range");
    return;
  }
  *out = parsed;
}

bool ReadFlag(const char* name, bool fallback = false) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  if (std::strcmp(v, "1") == 0 || std::strcmp(v, "true") == 0 || std::strcmp(v, "yes") == 0) return true;
  if (std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "no") == 0) return false;
  Warn(name, v, "expected 1/0, true/false or yes/no");
  return fallback;
}

int32_t ReadRankHint(const char* const* names) {
  for (const char* const* n = names; *n != nullptr; ++n) {
    const char* v = std::getenv(*n);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    long parsed = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && parsed >= 0 && parsed < (1L << 30)) return static_cast<int32_t>(parsed);
  }
  return -1;
}

void ReadLogLevel() {
  const char* v = std::getenv("FALCON_LOG");
  if (v == nullptr || *v == '\0') return;
  if (std::strcmp(v, "quiet") == 0) SetLogLevel(LogLevel::kQuiet);
  else if (std::strcmp(v, "warn") == 0) SetLogLevel(LogLevel::kWarn);
  else if (std::strcmp(v, "info") == 0) SetLogLevel(LogLevel::kInfo);
  else if (std::strcmp(v, "debug") == 0) SetLogLevel(LogLevel::kDebug);
  else Warn("FALCON_LOG", v, "expected quiet, warn, info or debug");
}

}  // namespace

bool ParseMode(const char* text, FalconMode* mode) {
  if (std::strcmp(text, "track") == 0) *mode = kFalconModeTrack;
  else if (std::strcmp(text, "profile") == 0) *mode = kFalconModeProfile;
  else if (std::strcmp(text, "sample") == 0) *mode = kFalconModeSample;
  else if (std::strcmp(text, "off") == 0) *mode = kFalconModeOff;
  else return false;
  return true;
}

ShimConfig LoadShimConfig() {
  ShimConfig c;
  ReadLogLevel();
  c.disabled = ReadFlag("FALCON_DISABLE");
  if (const char* v = std::getenv("FALCON_MODE"); v != nullptr && *v != '\0') {
    if (!ParseMode(v, &c.mode)) Warn("FALCON_MODE", v, "expected track, profile, sample or off");
  }
  uint64_t u = c.sample_every;
  ReadUnsigned("FALCON_SAMPLE_EVERY", 1, 1000000, &u);
  c.sample_every = static_cast<uint32_t>(u);
  if (const char* v = std::getenv("FALCON_SHM_DIR"); v != nullptr && *v != '\0') {
    if (v[0] != '/' || std::strlen(v) >= sizeof(c.shm_dir) - 64) Warn("FALCON_SHM_DIR", v, "not an absolute path of sane length");
    else CopyString(c.shm_dir, sizeof(c.shm_dir), v);
  }
  u = c.ring_records;
  ReadUnsigned("FALCON_RING_RECORDS", 64, 1ull << 24, &u);
  if ((u & (u - 1)) != 0) {
    Warn("FALCON_RING_RECORDS", std::getenv("FALCON_RING_RECORDS"), "not a power of two");
  } else {
    c.ring_records = u;
  }
  u = c.lanes;
  ReadUnsigned("FALCON_LANES", 2, 64, &u);
  c.lanes = static_cast<uint32_t>(u);
  u = c.comm_capacity;
  ReadUnsigned("FALCON_COMM_CAPACITY", 16, 65536, &u);
  c.comm_capacity = static_cast<uint32_t>(u);
  u = c.thread_capacity;
  ReadUnsigned("FALCON_THREAD_CAPACITY", 4, 4096, &u);
  c.thread_capacity = static_cast<uint32_t>(u);
  c.keep_segment = ReadFlag("FALCON_KEEP_SEGMENT");
  c.device_progress = ReadFlag("FALCON_DEVICE_PROGRESS", true);
  if (const char* v = std::getenv("FALCON_JOB"); v != nullptr) CopyString(c.job, sizeof(c.job), v);
  if (const char* v = std::getenv("FALCON_NCCL_LIBRARY"); v != nullptr) {
    CopyString(c.nccl_library, sizeof(c.nccl_library), v);
  }
  static const char* const kRank[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", nullptr};
  static const char* const kLocal[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "SLURM_LOCALID", nullptr};
  c.rank_hint = ReadRankHint(kRank);
  c.local_rank_hint = ReadRankHint(kLocal);
  return c;
}

}  // namespace falcon::shim
