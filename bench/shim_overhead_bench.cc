// falcon-shim-bench: what one NCCL call costs through libfalcon_shim.so, against a direct call,
// measured side by side in one run over the no-op NCCL (so only the shim is measured).
//
// The program re-executes itself with LD_PRELOAD=<shim> if the shim is not loaded yet. Each
// round, every thread times N direct calls (pncclAllReduce: straight into the no-op library)
// and N calls through the shim (ncclAllReduce: interposed), interleaved, using the thread's CPU
// clock (so preemption on an oversubscribed machine does not count as shim cost). The mode
// (track, profile) is switched through the segment's control block, as the agent does.
// Reports p50/p95/p99 over rounds of the per-call cost; --json prints the same records.
// Exit status 1 if any interposed call returned a different result than the direct call.
#include <dlfcn.h>
#include <fcntl.h>
#include <nccl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "falcon/shm_abi.h"

namespace {

struct Options {
  int rounds = 30;
  int calls = 20000;
  std::vector<int> threads = {1, 8};
  bool json = false;
  double target_ns = 50;
};

int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// This process's segment name, falcon.<uid>.<boot>.<pidns>.<pid> (shm_abi.h); the bench links
// only include/, so it spells the name out itself.
std::string OwnSegmentName() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string line;
  std::getline(f, line);
  for (char c : line) {
    if (c != '-') boot += c;
  }
  if (boot.size() != 32) boot.assign(32, '0');  // the shim's "unknown"
  struct stat ns {};
  const unsigned long long pid_ns = stat("/proc/self/ns/pid", &ns) == 0 ? ns.st_ino : 0;
  return std::string(FALCON_SHM_PREFIX) + std::to_string(getuid()) + "." + boot + "." + std::to_string(pid_ns) + "." +
         std::to_string(getpid());
}

// The traced process's own control block (the agent's view), found by its segment name.
FalconControl* OwnControl() {
  const char* dir = std::getenv("FALCON_SHM_DIR");
  std::string path = std::string(dir != nullptr && *dir ? dir : FALCON_SHM_DEFAULT_DIR) + "/" + OwnSegmentName();
  int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) return nullptr;
  struct stat st;
  fstat(fd, &st);
  void* base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  auto* h = static_cast<FalconShmHeader*>(base);
  return reinterpret_cast<FalconControl*>(static_cast<char*>(base) + h->control_offset);
}

bool SetMode(FalconControl* c, FalconMode mode) {
  std::atomic_ref<uint32_t>(c->mode).store(mode);
  uint64_t seq = std::atomic_ref<uint64_t>(c->command_seq).fetch_add(1) + 1;
  for (int i = 0; i < 500; ++i) {  // the shim's service thread ticks every 50 ms
    if (std::atomic_ref<uint64_t>(c->command_ack).load() == seq) return c->active_mode == static_cast<uint32_t>(mode);
    usleep(10000);
  }
  return false;
}

struct Row {
  const char* mode;
  int threads;
  double direct_p50, shim_p50, added_p50, added_p95, added_p99;
  long wrong;
};

Row Measure(const Options& o, const char* mode, int nthreads, ncclComm_t* comms) {
  std::vector<double> direct, shim;
  std::atomic<long> wrong{0};
  float buf[4] = {1, 2, 3, 4};
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<double> d(static_cast<size_t>(nthreads)), s(static_cast<size_t>(nthreads));
    std::vector<std::thread> pool;
    for (int t = 0; t < nthreads; ++t) {
      pool.emplace_back([&, t] {
        ncclComm_t comm = comms[t];
        long bad = 0;
        int64_t t0 = ThreadCpuNs();
        for (int i = 0; i < o.calls; ++i) bad += pncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, comm, nullptr);
        int64_t t1 = ThreadCpuNs();
        for (int i = 0; i < o.calls; ++i) bad -= ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, comm, nullptr);
        int64_t t2 = ThreadCpuNs();
        d[static_cast<size_t>(t)] = static_cast<double>(t1 - t0) / o.calls;
        s[static_cast<size_t>(t)] = static_cast<double>(t2 - t1) / o.calls;
        wrong += bad != 0;
      });
    }
    for (auto& th : pool) th.join();
    for (int t = 0; t < nthreads; ++t) {
      direct.push_back(d[static_cast<size_t>(t)]);
      shim.push_back(s[static_cast<size_t>(t)]);
    }
  }
  std::vector<double> added(direct.size());
  for (size_t i = 0; i < added.size(); ++i) added[i] = shim[i] - direct[i];
  return Row{mode, nthreads, Percentile(direct, 50), Percentile(shim, 50), Percentile(added, 50),
             Percentile(added, 95), Percentile(added, 99), wrong.load()};
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--rounds R] [--calls N] [--threads 1,8] [--target-ns 50] [--json]\n"
               "Times NCCL calls through libfalcon_shim.so against direct calls into the no-op NCCL.\n"
               "Env: FALCON_SHIM_PATH overrides the shim to preload (default: the build's).\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) o.rounds = std::atoi(argv[++i]);
    else if (a == "--calls" && i + 1 < argc) o.calls = std::atoi(argv[++i]);
    else if (a == "--target-ns" && i + 1 < argc) o.target_ns = std::atof(argv[++i]);
    else if (a == "--json") o.json = true;
    else if (a == "--threads" && i + 1 < argc) {
      o.threads.clear();
      for (char* tok = std::strtok(argv[++i], ","); tok != nullptr; tok = std::strtok(nullptr, ",")) {
        o.threads.push_back(std::atoi(tok));
      }
    } else return Usage(argv[0]);
  }
  if (o.rounds < 1 || o.calls < 1 || o.threads.empty()) return Usage(argv[0]);
  for (int t : o.threads) {
    if (t < 1 || t > 256) return Usage(argv[0]);
  }
  // Interposed? ncclAllReduce resolves to the shim only when it is preloaded.
  if (dlsym(RTLD_DEFAULT, "ncclAllReduce") == dlsym(RTLD_DEFAULT, "pncclAllReduce")) {
    if (std::getenv("FALCON_BENCH_REEXEC") != nullptr) {
      std::fprintf(stderr, "the shim did not load; set FALCON_SHIM_PATH\n");
      return 2;
    }
    const char* shim = std::getenv("FALCON_SHIM_PATH");
    setenv("LD_PRELOAD", shim != nullptr ? shim : FALCON_BENCH_SHIM_PATH, 1);
    setenv("FALCON_BENCH_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);
    std::perror("execv");
    return 2;
  }
  const int max_threads = *std::max_element(o.threads.begin(), o.threads.end());
  std::vector<ncclComm_t> comms(static_cast<size_t>(max_threads));
  for (auto& c : comms) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclCommInitRank(&c, 1, id, 0);
  }
  FalconControl* control = OwnControl();
  if (control == nullptr) {
    std::fprintf(stderr, "cannot find this process's Falcon segment (is FALCON_DISABLE set?)\n");
    return 2;
  }
  std::vector<Row> rows;
  for (const char* mode : {"track", "profile"}) {
    if (!SetMode(control, std::strcmp(mode, "track") == 0 ? kFalconModeTrack : kFalconModeProfile)) {
      std::fprintf(stderr, "the shim did not acknowledge mode %s\n", mode);
      return 2;
    }
    for (int t : o.threads) rows.push_back(Measure(o, mode, t, comms.data()));
  }
  long wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  const Row& headline = rows.front();
  const bool pass = headline.added_p50 <= o.target_ns;
#ifdef __OPTIMIZE__
  const char* build = "optimized";
#else
  const char* build = "UNOPTIMIZED (numbers are meaningless)";
#endif
  if (o.json) {
    std::printf("{\"schema\": 1, \"bench\": \"shim_overhead\", \"build\": \"%s\", \"cpu\": \"%s\", \"rounds\": %d, "
                "\"calls_per_round\": %d, \"rows\": [",
                build, CpuModel().c_str(), o.rounds, o.calls);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("%s{\"mode\": \"%s\", \"threads\": %d, \"direct_ns\": %.2f, \"shim_ns\": %.2f, \"added_ns_p50\": %.2f, "
                  "\"added_ns_p95\": %.2f, \"added_ns_p99\": %.2f, \"wrong\": %ld}",
                  i ? ", " : "", r.mode, r.threads, r.direct_p50, r.shim_p50, r.added_p50, r.added_p95, r.added_p99,
                  r.wrong);
    }
    std::printf("], \"target_ns\": %.1f, \"pass\": %s}\n", o.target_ns, pass ? "true" : "false");
    return wrong != 0 ? 1 : 0;
  }
  utsname u;
  uname(&u);
  std::printf("# falcon-shim-bench 0.1.0  (%s build)\n", build);
  std::printf("# nccl.h %d.%d.%d, NCCL underneath: no-op library (only the shim is measured)\n", NCCL_MAJOR,
              NCCL_MINOR, NCCL_PATCH);
  std::printf("# machine: %s, %u cores, %s %s\n", CpuModel().c_str(), std::thread::hardware_concurrency(), u.sysname,
              u.release);
  std::printf("# config: %d rounds x %d calls per thread; ncclAllReduce(4 floats); per-thread CPU time\n", o.rounds,
              o.calls);
  std::printf("# direct = pncclAllReduce into the no-op library; shim = ncclAllReduce through libfalcon_shim.so\n");
  std::printf("%-8s %7s %12s %12s %14s %14s %14s %7s\n", "mode", "threads", "direct_ns", "shim_ns", "added_ns_p50",
              "added_ns_p95", "added_ns_p99", "#wrong");
  for (const Row& r : rows) {
    std::printf("%-8s %7d %12.1f %12.1f %14.1f %14.1f %14.1f %7ld\n", r.mode, r.threads, r.direct_p50, r.shim_p50,
                r.added_p50, r.added_p95, r.added_p99, r.wrong);
  }
  std::printf("# verdict: %.1f ns added per call in track mode, 1 thread (p50); target <= %.0f ns: %s; %ld wrong\n",
              headline.added_p50, o.target_ns, pass ? "PASS" : "FAIL", wrong);
  return wrong != 0 ? 1 : 0;
}
