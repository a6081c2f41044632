// falcon-test-plan: a "framework" that reads Falcon's mitigation plan through the C API
// (include/falcon/falcon.h) the way a training hook would: the functions are resolved with
// dlsym(RTLD_DEFAULT, ...) and a missing symbol means "no Falcon". Runs over any libnccl.so.2
// (the tests use the no-op library or the emulator) with libfalcon_shim.so preloaded.
//
//   falcon-test-plan api   [--want V] [--ack-status S] [--ready-file R] [--stop-file F] [--late 1]
//                          [--timeout T]
//     Checks the contract before the first NCCL call (version 0, FALCON_ERR_NO_PLAN, NULL
//     arguments → FALCON_ERR_INVALID) and right after it (segment, still no plan; not with
//     --late 1, where the agent may hand over a held plan at once), creates R,
//     waits until a plan of version >= V arrives (V = 0: stops here), prints it through every getter
//     ("plan ...", "mb ...", "placement ...", "exclude ...", "warmup ..."), checks capacity truncation
//     ("truncate ..."), acks it with status S and prints "acked V S". Exit 0 if every check
//     passed, 1 on a failed check ("FAIL <what>" lines), 3 on timeout. With F: then runs on
//     (an all-reduce every 10 ms) until F exists.
//   falcon-test-plan hammer [--threads T] [--ready-file R] [--stop-file F] [--timeout T]
//     After its first NCCL call creates R; then T threads read the plan through every getter until F exists, checking each copy against
//     tests/support/plan_pattern.h; prints "hammer reads R busy B no_plan N mixed M regressed G
//     max_version V" (mixed and regressed must be 0).
//   falcon-test-plan train [--reject-status S] [--stop-file F] [--timeout T]
//     One rank of a job (RANK/WORLD_SIZE/FALCON_EMU_ID_FILE as falcon-emu-run sets them): an
//     all-reduce per iteration; at every iteration boundary polls falconPlanVersion(), and on a
//     new plan reads it, prints "rank R plan V strategy S mb [..]" and acks it (status 0, or S
//     on rank 1 when --reject-status is given). Runs until F exists.
#include <dlfcn.h>
#include <fcntl.h>
#include <nccl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "falcon/falcon.h"
#include "tests/support/plan_pattern.h"

namespace {

using falcon::testing::PatternCount;
using falcon::testing::PatternValue;

struct Api {
  int (*api_version)() = nullptr;
  uint32_t (*plan_version)() = nullptr;
  int (*get_plan)(FalconPlanInfo*) = nullptr;
  int (*get_part[4])(int32_t*, int, uint32_t*) = {nullptr, nullptr, nullptr, nullptr};  // mb, placement, exclude, warmup
  int (*ack)(uint32_t, int) = nullptr;
  int (*report_cost)(uint32_t, double) = nullptr;
};

template <typename Fn>
bool Resolve(const char* name, Fn* out) {
  void* p = dlsym(RTLD_DEFAULT, name);
  *out = reinterpret_cast<Fn>(p);
  return p != nullptr;
}

bool ResolveApi(Api* a) {
  return Resolve("falconApiVersion", &a->api_version) && Resolve("falconPlanVersion", &a->plan_version) &&
         Resolve("falconGetPlan", &a->get_plan) && Resolve("falconGetMicroBatchPlan", &a->get_part[0]) &&
         Resolve("falconGetPlacementPlan", &a->get_part[1]) && Resolve("falconGetExcludedNodes", &a->get_part[2]) &&
         Resolve("falconGetPipelinePlan", &a->get_part[3]) &&
         Resolve("falconAckPlan", &a->ack) && Resolve("falconReportCost", &a->report_cost);
}

struct Options {
  std::string mode;
  uint32_t want = 1;
  int ack_status = 0;
  int reject_status = -1;
  int threads = 4;
  std::string stop_file;
  std::string ready_file;
  bool late = false;  // api: the agent may deliver a held plan at once, so skip the no-plan check
  double timeout_s = 60;
};

double MonoSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void SleepMs(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000};
  nanosleep(&ts, nullptr);
}

bool Exists(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0;
}

int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : def;
}

// Creates `path` (if any): tells a waiting test that this process reached a point.
void Touch(const std::string& path) {
  if (path.empty()) return;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) close(fd);
}

int g_failures = 0;
void Check(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAIL %s\n", what);
    ++g_failures;
  }
}

std::string List(const int32_t* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// A communicator over this job's ranks: rank 0 publishes the unique id through the file that
// falcon-emu-run names (FALCON_EMU_ID_FILE), the others read it. A lone rank needs no file.
ncclComm_t InitComm(int rank, int world, double timeout_s) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  const char* file = std::getenv("FALCON_EMU_ID_FILE");
  if (world == 1 || rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) return nullptr;
    if (world > 1 && file != nullptr) {
      const std::string tmp = std::string(file) + ".tmp";
      const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd < 0 || write(fd, id.internal, sizeof id.internal) != static_cast<ssize_t>(sizeof id.internal)) return nullptr;
      close(fd);
      if (rename(tmp.c_str(), file) != 0) return nullptr;
    }
  } else {
    const double deadline = MonoSeconds() + timeout_s;
    for (;;) {
      const int fd = file != nullptr ? open(file, O_RDONLY) : -1;
      if (fd >= 0) {
        const ssize_t n = read(fd, id.internal, sizeof id.internal);
        close(fd);
        if (n == static_cast<ssize_t>(sizeof id.internal)) break;
      }
      if (MonoSeconds() > deadline) return nullptr;
      SleepMs(5);
    }
  }
  ncclComm_t comm = nullptr;
  return ncclCommInitRank(&comm, world, id, rank) == ncclSuccess ? comm : nullptr;
}

void CheckNoPlan(const Api& a, const char* when) {
  std::string w(when);
  Check(a.plan_version() == 0, (w + ": falconPlanVersion() == 0").c_str());
  FalconPlanInfo info;
  std::memset(&info, 0xff, sizeof info);
  Check(a.get_plan(&info) == FALCON_ERR_NO_PLAN && info.version == 0, (w + ": falconGetPlan NO_PLAN, version 0").c_str());
  int32_t buf[4] = {-7, -7, -7, -7};
  for (auto* get : a.get_part) {
    uint32_t version = 99;
    Check(get(buf, 4, &version) == FALCON_ERR_NO_PLAN && version == 0, (w + ": part getter NO_PLAN, version 0").c_str());
  }
  Check(buf[0] == -7, (w + ": nothing copied without a plan").c_str());
}

void CheckInvalid(const Api& a) {
  int32_t buf[2];
  Check(a.get_plan(nullptr) == FALCON_ERR_INVALID, "falconGetPlan(NULL) is INVALID");
  for (auto* get : a.get_part) {
    uint32_t version = 99;
    Check(get(nullptr, 4, &version) == FALCON_ERR_INVALID && version == 0, "getter(NULL, 4) is INVALID, version 0");
    Check(get(buf, -1, nullptr) == FALCON_ERR_INVALID, "getter(capacity -1) is INVALID");
  }
  Check(a.ack(0, 0) == FALCON_ERR_INVALID, "falconAckPlan(0, ...) is INVALID");
  Check(a.report_cost(kFalconStrategyIgnore, 1) == FALCON_ERR_INVALID, "falconReportCost(S1) is INVALID");
  Check(a.report_cost(kFalconStrategyRestart, -1) == FALCON_ERR_INVALID, "falconReportCost(-1 s) is INVALID");
}

int RunApi(const Api& a, const Options& o) {
  Check(a.api_version() == FALCON_API_VERSION, "falconApiVersion() == FALCON_API_VERSION");
  CheckNoPlan(a, "before the first NCCL call");
  CheckInvalid(a);
  Check(a.ack(1, 0) == FALCON_ERR_NO_PLAN, "before the first NCCL call: falconAckPlan NO_PLAN");
  Check(a.report_cost(kFalconStrategyRestart, 1) == FALCON_ERR_NO_PLAN, "before the first NCCL call: falconReportCost NO_PLAN");
  ncclComm_t comm = InitComm(0, 1, o.timeout_s);
  if (comm == nullptr) {
    std::printf("FAIL communicator\n");
    return 1;
  }
  float x[4] = {1, 2, 3, 4};
  (void)ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, nullptr);
  if (!o.late) CheckNoPlan(a, "attached, no plan yet");
  CheckInvalid(a);
  std::printf("ready\n");
  std::fflush(stdout);
  Touch(o.ready_file);
  if (o.want == 0) {
    (void)ncclCommDestroy(comm);
    return g_failures == 0 ? 0 : 1;
  }
  const double deadline = MonoSeconds() + o.timeout_s;
  while (a.plan_version() < o.want) {
    if (MonoSeconds() > deadline) {
      std::printf("timeout waiting for plan %u\n", o.want);
      (void)ncclCommDestroy(comm);
      return 3;
    }
    (void)ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, nullptr);
    SleepMs(5);
  }
  FalconPlanInfo info;
  Check(a.get_plan(&info) == FALCON_OK, "falconGetPlan OK");
  std::printf("plan version %u strategy %u restart %u issued %lld counts %u %u %u\n", info.version, info.strategy,
              info.restart, static_cast<long long>(info.issued_real_ns), info.micro_batch_count, info.placement_count,
              info.exclude_count);
  static int32_t buf[FALCON_PLAN_MAX_PLACEMENT];
  const char* names[4] = {"mb", "placement", "exclude", "warmup"};
  for (int part = 0; part < 4; ++part) {
    uint32_t version = 0;
    const int n = a.get_part[part](buf, FALCON_PLAN_MAX_PLACEMENT, &version);
    Check(n >= 0 && version == info.version, "full-capacity getter returns the plan's version");
    std::printf("%s version %u count %d %s\n", names[part], version, n, List(buf, n < 0 ? 0 : n).c_str());
    uint32_t size_version = 0;
    Check(a.get_part[part](nullptr, 0, &size_version) == n && size_version == version, "getter(NULL, 0) gives the size");
  }
  // Truncation: capacity 2 copies two entries, returns the full count, leaves the rest alone.
  for (int part = 0; part < 4; ++part) {
    int32_t small[3] = {-5, -5, -5};
    uint32_t version = 0;
    const int n = a.get_part[part](small, 2, &version);
    std::printf("truncate %s count %d copied %s sentinel %s\n", names[part], n, List(small, n < 2 ? (n < 0 ? 0 : n) : 2).c_str(),
                small[2] == -5 ? "intact" : "overwritten");
  }
  const int rc = a.ack(info.version, o.ack_status);
  std::printf("acked %u %d rc %d\n", info.version, o.ack_status, rc);
  Check(rc == FALCON_OK, "falconAckPlan OK");
  const int cost_rc = a.report_cost(kFalconStrategyRestart, 42.5);
  std::printf("cost S4 rc %d\n", cost_rc);
  Check(cost_rc == FALCON_OK, "falconReportCost OK");
  std::fflush(stdout);
  while (!o.stop_file.empty() && !Exists(o.stop_file) && MonoSeconds() < deadline) {
    (void)ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, nullptr);
    SleepMs(10);
  }
  (void)ncclCommDestroy(comm);
  return g_failures == 0 ? 0 : 1;
}

struct HammerStats {
  unsigned long long reads = 0, busy = 0, no_plan = 0, mixed = 0, regressed = 0;
  uint32_t max_version = 0;
};

// One reader thread: every copy must be exactly plan `version` of the pattern.
void HammerThread(const Api& a, const Options& o, const std::atomic<bool>& stop, HammerStats* s) {
  std::vector<int32_t> buf(FALCON_PLAN_MAX_PLACEMENT);
  uint32_t last = 0;
  for (unsigned long long i = 0; !stop.load(std::memory_order_relaxed); ++i) {
    uint32_t version = 0;
    bool consistent = true;
    int rc;
    const int part = static_cast<int>(i % 4) - 1;  // -1: falconGetPlan
    if (part < 0) {
      FalconPlanInfo info;
      rc = a.get_plan(&info);
      version = info.version;
      if (rc == FALCON_OK) {
        consistent = info.strategy == falcon::testing::PatternStrategy(version) &&
                     info.restart == falcon::testing::PatternRestart(version) &&
                     info.issued_real_ns == falcon::testing::PatternIssuedNs(version);
        for (uint32_t p = 0; p < 3; ++p) {
          const uint32_t n = p == 0 ? info.micro_batch_count : p == 1 ? info.placement_count : info.exclude_count;
          consistent = consistent && n == PatternCount(version, p);
        }
      }
    } else {
      rc = a.get_part[part](buf.data(), static_cast<int>(buf.size()), &version);
      if (rc >= 0) {
        const auto p = static_cast<uint32_t>(part);
        consistent = static_cast<uint32_t>(rc) == PatternCount(version, p);
        for (int k = 0; consistent && k < rc; ++k) {
          consistent = buf[static_cast<size_t>(k)] == PatternValue(version, p, static_cast<uint32_t>(k));
        }
      }
    }
    if (rc == FALCON_ERR_BUSY) {
      ++s->busy;
    } else if (rc == FALCON_ERR_NO_PLAN) {
      ++s->no_plan;
    } else {
      ++s->reads;
      if (!consistent && s->mixed++ == 0) std::printf("mixed copy: part %d version %u rc %d\n", part, version, rc);
      if (version < last) ++s->regressed;
      last = version;
      if (version > s->max_version) s->max_version = version;
    }
    (void)o;
  }
}

int RunHammer(const Api& a, const Options& o) {
  ncclComm_t comm = InitComm(0, 1, o.timeout_s);
  if (comm == nullptr) {
    std::printf("FAIL communicator\n");
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  Touch(o.ready_file);
  std::atomic<bool> stop{false};
  std::vector<HammerStats> stats(static_cast<size_t>(o.threads));
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    threads.emplace_back(HammerThread, std::cref(a), std::cref(o), std::cref(stop), &stats[static_cast<size_t>(t)]);
  }
  const double deadline = MonoSeconds() + o.timeout_s;
  while (!Exists(o.stop_file) && MonoSeconds() < deadline) SleepMs(10);
  stop.store(true);
  HammerStats total;
  for (size_t t = 0; t < threads.size(); ++t) {
    threads[t].join();
    total.reads += stats[t].reads;
    total.busy += stats[t].busy;
    total.no_plan += stats[t].no_plan;
    total.mixed += stats[t].mixed;
    total.regressed += stats[t].regressed;
    if (stats[t].max_version > total.max_version) total.max_version = stats[t].max_version;
  }
  std::printf("hammer reads %llu busy %llu no_plan %llu mixed %llu regressed %llu max_version %u\n", total.reads,
              total.busy, total.no_plan, total.mixed, total.regressed, total.max_version);
  (void)ncclCommDestroy(comm);
  return total.mixed == 0 && total.regressed == 0 ? 0 : 1;
}

int RunTrain(const Api& a, const Options& o) {
  const int rank = EnvInt("RANK", 0), world = EnvInt("WORLD_SIZE", 1);
  ncclComm_t comm = InitComm(rank, world, o.timeout_s);
  if (comm == nullptr) {
    std::printf("rank %d FAIL communicator\n", rank);
    return 1;
  }
  std::vector<float> x(1024, 1.0f);
  std::vector<int32_t> mb(FALCON_PLAN_MAX_MICRO_BATCHES);
  uint32_t in_force = 0;
  const double deadline = MonoSeconds() + o.timeout_s;
  int rc = 0;
  // Every rank must agree to stop at the same iteration: rank 0 decides, the all-reduce carries it.
  for (long iter = 0;; ++iter) {
    std::fill(x.begin(), x.end(), 1.0f);
    x[0] = rank == 0 && (Exists(o.stop_file) || MonoSeconds() > deadline) ? 1.0f : 0.0f;
    if (ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat, ncclSum, comm, nullptr) != ncclSuccess) {
      std::printf("rank %d FAIL all-reduce\n", rank);
      rc = 1;
      break;
    }
    if (x[0] > 0.5f) break;
    const uint32_t v = a.plan_version();  // iteration boundary: one load
    if (v > in_force) {
      FalconPlanInfo info;
      uint32_t mb_version = 0;
      const int n = a.get_part[0](mb.data(), static_cast<int>(mb.size()), &mb_version);
      if (a.get_plan(&info) == FALCON_OK && n >= 0 && mb_version == info.version) {
        const int status = rank == 1 && o.reject_status >= 0 ? o.reject_status : 0;
        // An applied plan's cost: (rank + 1) x version tenths of a second, so the figures differ per rank.
        if (status == 0 && info.strategy >= kFalconStrategyRebalance) {
          (void)a.report_cost(info.strategy, 0.1 * (rank + 1) * info.version);
        }
        std::printf("rank %d plan %u strategy %u mb %s at iteration %ld ack %d rc %d\n", rank, info.version,
                    info.strategy, List(mb.data(), n).c_str(), iter, status, a.ack(info.version, status));
        std::fflush(stdout);
        in_force = info.version;
      }  // else busy: try again next iteration
    }
    SleepMs(5);
  }
  (void)ncclCommDestroy(comm);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s api|hammer|train [options]\n", argv[0]);
    return 2;
  }
  o.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--want") o.want = static_cast<uint32_t>(std::strtoul(v.c_str(), nullptr, 10));
    else if (k == "--ack-status") o.ack_status = std::atoi(v.c_str());
    else if (k == "--reject-status") o.reject_status = std::atoi(v.c_str());
    else if (k == "--threads") o.threads = std::atoi(v.c_str());
    else if (k == "--stop-file") o.stop_file = v;
    else if (k == "--ready-file") o.ready_file = v;
    else if (k == "--late") o.late = v == "1";
    else if (k == "--timeout") o.timeout_s = std::atof(v.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  Api a;
  if (!ResolveApi(&a)) {
    std::printf("no falcon\n");  // the shim is not preloaded: a framework hook does nothing
    return 4;
  }
  if (o.mode == "api") return RunApi(a, o);
  if (o.mode == "hammer") return RunHammer(a, o);
  if (o.mode == "train") return RunTrain(a, o);
  std::fprintf(stderr, "unknown mode %s\n", o.mode.c_str());
  return 2;
}
