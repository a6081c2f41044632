// Environment parsing for the emulator; see emu_config.h.
// Thread-safety: see header. Must never throw out of Config().
#include "emu_config.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <sstream>

namespace falcon::emu {
namespace {

std::atomic<int64_t> g_epoch_ns{0};
std::atomic<int> g_process_rank{-1};

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

// Parses a double env var into *out; records an error on a malformed or out-of-range value.
void ReadDouble(const char* name, double min, double* out, std::string* err) {
  const char* v = Env(name);
  if (!v) return;
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v, &end);
  if (errno || end == v || *end != '\0' || !(d >= min)) {
    if (err->empty()) *err = std::string(name) + "=\"" + v + "\" is not a number >= " +
                             std::to_string(min);
    return;
  }
  *out = d;
}

std::optional<long long> ParseInt(const char* v) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (errno || end == v || *end != '\0') return std::nullopt;
  return x;
}

void ReadInt(const char* name, long long min, long long max, std::optional<long long>* out,
             std::string* err) {
  const char* v = Env(name);
  if (!v) return;
  const auto x = ParseInt(v);
  if (!x || *x < min || *x > max) {
    if (err->empty()) *err = std::string(name) + "=\"" + v + "\" is not an integer in [" +
                             std::to_string(min) + ", " + std::to_string(max) + "]";
    return;
  }
  *out = x;
}

EmuConfig Parse() {
  EmuConfig c;
  std::string& err = c.error;
  const char* fabric = Env("FALCON_EMU_FABRIC");
  if (fabric) {
    const std::string f = fabric;
    if (f == "off" || f == "0" || f == "false") c.fabric.enabled = false;
    else if (f != "on" && f != "1" && f != "true") err = "FALCON_EMU_FABRIC must be on or off";
  }
  ReadDouble("FALCON_EMU_INTRA_GBPS", 1e-9, &c.fabric.intra_gbps, &err);
  ReadDouble("FALCON_EMU_INTER_GBPS", 1e-9, &c.fabric.inter_gbps, &err);
  ReadDouble("FALCON_EMU_INTRA_LAT_US", 0, &c.fabric.intra_lat_us, &err);
  ReadDouble("FALCON_EMU_INTER_LAT_US", 0, &c.fabric.inter_lat_us, &err);
  ReadDouble("FALCON_EMU_TIME_SCALE", 0, &c.fabric.time_scale, &err);
  ReadDouble("FALCON_EMU_TIMEOUT_S", 1e-3, &c.timeout_s, &err);
  ReadDouble("FALCON_EMU_GPU_TFLOPS", 0, &c.gpu_tflops, &err);
  ReadDouble("FALCON_EMU_COMPUTE_NOISE", 0, &c.compute_noise, &err);
  if (c.compute_noise > 1) err = "FALCON_EMU_COMPUTE_NOISE must be in [0, 1]";
  std::optional<long long> x;
  ReadInt("FALCON_EMU_NOISE_SEED", 0, (1LL << 62), &x, &err);
  if (x) c.noise_seed = static_cast<uint64_t>(*x);
  x.reset();
  ReadInt("FALCON_EMU_RANKS_PER_NODE", 1, 1 << 20, &x, &err);
  if (x) c.ranks_per_node = static_cast<int>(*x);
  x.reset();
  ReadInt("FALCON_EMU_RANK", 0, 1 << 30, &x, &err);
  if (!x) ReadInt("RANK", 0, 1 << 30, &x, &err);
  if (x) c.global_rank = static_cast<int>(*x);
  x.reset();
  ReadInt("FALCON_EMU_DEVICE", 0, 1 << 20, &x, &err);
  if (x) c.device = static_cast<int>(*x);
  x.reset();
  ReadInt("LOCAL_RANK", 0, 1 << 30, &x, &err);
  if (x) c.local_rank = static_cast<int>(*x);
  x.reset();
  ReadInt("FALCON_EMU_EPOCH_NS", 1, INT64_MAX, &x, &err);
  if (x) c.epoch_ns = *x;
  x.reset();
  ReadInt("FALCON_EMU_CHUNK_BYTES", 4096, 1ll << 30, &x, &err);
  if (x) c.slot_bytes = static_cast<size_t>(*x);
  x.reset();
  ReadInt("FALCON_EMU_P2P_CHUNK_BYTES", 4096, 1ll << 30, &x, &err);
  if (x) c.p2p_chunk_bytes = static_cast<size_t>(*x);
  c.slot_bytes &= ~size_t{63};
  c.p2p_chunk_bytes &= ~size_t{63};
  const char* dbg = Env("FALCON_EMU_DEBUG");
  c.debug = dbg && std::string(dbg) != "0";
  if (const char* pl = Env("FALCON_EMU_PLACEMENT")) {
    std::stringstream ss(pl);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const auto n = ParseInt(item.c_str());
      if (!n || *n < 0 || *n > (1 << 20)) {
        if (err.empty()) err = std::string("FALCON_EMU_PLACEMENT=\"") + pl +
                               "\" must be a comma-separated list of node numbers";
        break;
      }
      c.placement.push_back(static_cast<int>(*n));
    }
  }
  if (const char* js = Env("FALCON_EMU_JOB_STATE")) {
    const std::string name = js;
    if (name.size() < 2 || name.size() > 200 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
      if (err.empty()) err = "FALCON_EMU_JOB_STATE=\"" + name + "\" must be a shm name: '/' then up to 199 characters, no other '/'";
    } else {
      c.job_state_name = name;
    }
  }
  if (const char* fp = Env("FALCON_EMU_FAULT_PLAN")) {
    auto res = LoadFaultPlan(fp);
    if (res.ok()) c.plan = std::move(*res.plan);
    else if (err.empty()) err = "FALCON_EMU_FAULT_PLAN: " + res.error;
  }
  if (c.epoch_ns) g_epoch_ns.store(*c.epoch_ns, std::memory_order_relaxed);
  return c;
}

}  // namespace

int EmuConfig::NodeOf(int rank) const {
  if (rank >= 0 && static_cast<size_t>(rank) < placement.size()) {
    return placement[static_cast<size_t>(rank)];
  }
  return rank < 0 ? 0 : rank / ranks_per_node;
}

const EmuConfig& Config() {
  static std::once_flag once;
  static EmuConfig* config = nullptr;  // leaked on purpose: used from exit-time cleanup
  std::call_once(once, [] { config = new EmuConfig(Parse()); });
  return *config;
}

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void OfferEpochNs(int64_t ns) {
  (void)Config();  // an env epoch, if any, is installed first
  int64_t expected = 0;
  g_epoch_ns.compare_exchange_strong(expected, ns, std::memory_order_relaxed);
}

int64_t EpochNs() {
  (void)Config();
  return g_epoch_ns.load(std::memory_order_relaxed);
}

double JobSeconds(int64_t now_ns) {
  const int64_t e = EpochNs();
  return e == 0 ? 0.0 : static_cast<double>(now_ns - e) * 1e-9;
}

void OfferProcessRank(int rank) {
  int expected = -1;
  g_process_rank.compare_exchange_strong(expected, rank, std::memory_order_relaxed);
}

int ProcessGlobalRank(int fallback) {
  if (Config().global_rank) return *Config().global_rank;
  const int r = g_process_rank.load(std::memory_order_relaxed);
  return r >= 0 ? r : fallback;
}

}  // namespace falcon::emu
