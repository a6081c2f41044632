// falcon-emu-bench: nccl-tests-style report of the emulator's collective latency and bandwidth,
// "for context" next to Falcon's own measurements. Runs N ranks itself (fork) or, when RANK is
// set, as one rank under falcon-emu-run. Rank 0 prints a '#' preamble (versions, build, config,
// machine), a header with units, one row per size (8 B .. --max-bytes) for all_reduce, all_gather
// and sendrecv with time (us), algbw and busbw (GB/s) and #wrong, a verdict footer; --json prints
// the same records as JSON (schema_version 1). Exit status 1 on any wrong result.
//
//   falcon-emu-bench [-n N] [--min-bytes B] [--max-bytes B] [--iters I] [--warmup W] [--json]
//
// Thread-safety: single-threaded per rank. Must never: hide wrong results (the #wrong column and
// the exit status report them), or wait without bound (the emulator's deadline applies).
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bootstrap.h"

namespace {

struct Options {
  int n = 2;
  size_t min_bytes = 8, max_bytes = 64u << 20;
  int iters = 20, warmup = 3;
  bool json = false;
};

struct Row {
  const char* op;
  size_t bytes;
  double us, algbw, busbw;
  long wrong;
};

double Now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

#define CK(call)                                                                        \
  do {                                                                                  \
    if ((call) != ncclSuccess) {                                                        \
      std::fprintf(stderr, "falcon-emu-bench: %s failed: %s\n", #call, ncclGetLastError(nullptr)); \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)

std::string Env(const char* k, const char* def) {
  const char* v = std::getenv(k);
  return v && *v ? v : def;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// One timed case; returns the row with the slowest rank's average time.
Row RunCase(const char* op, size_t bytes, ncclComm_t comm, int rank, int n, const Options& o) {
  enum class Kind { kAllReduce, kAllGather, kSendRecv };
  const std::string name = op;
  const Kind kind = name == "all_reduce" ? Kind::kAllReduce : name == "all_gather" ? Kind::kAllGather : Kind::kSendRecv;
  const bool ag = kind == Kind::kAllGather;
  const size_t count = std::max<size_t>(bytes / sizeof(float), 1);
  const auto un = static_cast<size_t>(n);
  const size_t per = ag ? std::max<size_t>(count / un, 1) : count;  // all_gather: per-rank share
  std::vector<float> send(per, static_cast<float>(rank + 1)), recv(ag ? per * un : count);
  auto once = [&] {
    if (kind == Kind::kAllReduce) {
      CK(ncclAllReduce(send.data(), recv.data(), count, ncclFloat, ncclSum, comm, nullptr));
    } else if (ag) {
      CK(ncclAllGather(send.data(), recv.data(), per, ncclFloat, comm, nullptr));
    } else {
      CK(ncclGroupStart());
      CK(ncclSend(send.data(), count, ncclFloat, (rank + 1) % n, comm, nullptr));
      CK(ncclRecv(recv.data(), count, ncclFloat, (rank + n - 1) % n, comm, nullptr));
      CK(ncclGroupEnd());
    }
  };
  const int iters = bytes >= (16u << 20) ? std::max(2, o.iters / 5) : o.iters;
  for (int i = 0; i < o.warmup; ++i) once();
  const double t0 = Now();
  for (int i = 0; i < iters; ++i) once();
  double t = (Now() - t0) / iters;
  long wrong = 0;
  for (size_t i = 0; i < recv.size(); ++i) {
    float expect;
    if (kind == Kind::kAllReduce) expect = static_cast<float>(n * (n + 1) / 2);
    else if (ag) expect = static_cast<float>(i / per + 1);
    else expect = static_cast<float>((rank + n - 1) % n + 1);
    if (recv[i] != expect) ++wrong;
  }
  double wrong_d = static_cast<double>(wrong);
  CK(ncclAllReduce(&t, &t, 1, ncclDouble, ncclMax, comm, nullptr));
  CK(ncclAllReduce(&wrong_d, &wrong_d, 1, ncclDouble, ncclSum, comm, nullptr));
  const double total = static_cast<double>(ag ? per * un * sizeof(float) : count * sizeof(float));
  const double algbw = total / t / 1e9;
  const double factor = kind == Kind::kAllReduce ? 2.0 * (n - 1) / n : (ag ? static_cast<double>(n - 1) / n : 1.0);
  return Row{op, static_cast<size_t>(total), t * 1e6, algbw, algbw * factor, static_cast<long>(wrong_d)};
}

int RankMain(const Options& o, int rank, int n) {
  ncclUniqueId id;
  std::string err;
  if (falcon::emu::BootstrapUniqueId(rank, &id, {}, &err) != ncclSuccess) {
    std::fprintf(stderr, "falcon-emu-bench: %s\n", err.c_str());
    return 2;
  }
  ncclComm_t comm;
  CK(ncclCommInitRank(&comm, n, id, rank));
  std::vector<Row> rows;
  for (const char* op : {"all_reduce", "all_gather", "sendrecv"}) {
    for (size_t b = o.min_bytes; b <= o.max_bytes; b *= 2) rows.push_back(RunCase(op, b, comm, rank, n, o));
  }
  CK(ncclCommDestroy(comm));
  long wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  if (rank != 0) return wrong ? 1 : 0;
  int version = 0;
  ncclGetVersion(&version);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
#ifdef NDEBUG
  const char* build = "optimized";
#else
  const char* build = "DEBUG (unoptimized: figures are not representative)";
#endif
  if (o.json) {
    std::printf("{\"schema_version\": 1, \"tool\": \"falcon-emu-bench\", \"nccl_version\": %d, \"nranks\": %d, "
                "\"fabric\": \"%s\", \"build\": \"%s\", \"rows\": [", version, n,
                Env("FALCON_EMU_FABRIC", "on").c_str(), build);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("%s\n  {\"op\": \"%s\", \"bytes\": %zu, \"time_us\": %.2f, \"algbw_gbps\": %.4f, "
                  "\"busbw_gbps\": %.4f, \"wrong\": %ld}", i ? "," : "", r.op, r.bytes, r.us, r.algbw, r.busbw, r.wrong);
    }
    std::printf("\n], \"wrong\": %ld}\n", wrong);
    return wrong ? 1 : 0;
  }
  std::printf("# falcon-emu-bench (schema 1): NCCL emulator collectives\n");
  std::printf("# nccl.h version %d, runtime ncclGetVersion %d, build %s\n", NCCL_VERSION_CODE, version, build);
  std::printf("# nranks %d  fabric=%s intra=%s GB/s inter=%s GB/s intra_lat=%s us inter_lat=%s us "
              "ranks_per_node=%s time_scale=%s chunk=%s B\n", n, Env("FALCON_EMU_FABRIC", "on").c_str(),
              Env("FALCON_EMU_INTRA_GBPS", "100").c_str(), Env("FALCON_EMU_INTER_GBPS", "25").c_str(),
              Env("FALCON_EMU_INTRA_LAT_US", "2").c_str(), Env("FALCON_EMU_INTER_LAT_US", "10").c_str(),
              Env("FALCON_EMU_RANKS_PER_NODE", "8").c_str(), Env("FALCON_EMU_TIME_SCALE", "1").c_str(),
              Env("FALCON_EMU_CHUNK_BYTES", "1048576").c_str());
  std::printf("# machine: %s, %ld cpus, %s; iters %d (x/5 from 16 MiB), warmup %d; times are the slowest rank's mean\n",
              host, sysconf(_SC_NPROCESSORS_ONLN), CpuModel().c_str(), o.iters, o.warmup);
  std::printf("#\n# %-10s %12s %12s %10s %10s %8s\n", "op", "size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  double bus_sum = 0;
  for (const Row& r : rows) {
    std::printf("  %-10s %12zu %12.2f %10.3f %10.3f %8ld\n", r.op, r.bytes, r.us, r.algbw, r.busbw, r.wrong);
    bus_sum += r.busbw;
  }
  std::printf("# Out of bounds values : %ld %s\n", wrong, wrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %.3f GB/s\n", bus_sum / static_cast<double>(rows.size()));
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto num = [&] { return i + 1 < argc ? std::strtoull(argv[++i], nullptr, 10) : 0ull; };
    if (a == "-n") o.n = static_cast<int>(num());
    else if (a == "--min-bytes") o.min_bytes = num();
    else if (a == "--max-bytes") o.max_bytes = num();
    else if (a == "--iters") o.iters = static_cast<int>(num());
    else if (a == "--warmup") o.warmup = static_cast<int>(num());
    else if (a == "--json") o.json = true;
    else {
      std::printf("usage: falcon-emu-bench [-n N] [--min-bytes B] [--max-bytes B] [--iters I] [--warmup W] [--json]\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  if (o.min_bytes < 4 || o.iters < 1) return 2;
  if (std::getenv("RANK")) {
    const falcon::emu::JobEnv env = falcon::emu::ReadJobEnv();
    return RankMain(o, env.rank, env.world_size);
  }
  char dir[] = "/tmp/falcon-emu-bench-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  const std::string id_file = std::string(dir) + "/id";
  setenv("FALCON_EMU_ID_FILE", id_file.c_str(), 1);
  std::vector<pid_t> pids;
  for (int r = 0; r < o.n; ++r) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("FALCON_EMU_RANK", std::to_string(r).c_str(), 1);
      const int rc = RankMain(o, r, o.n);
      std::fflush(stdout);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  unlink(id_file.c_str());
  rmdir(dir);
  return rc;
}
