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
// --cuda-driver PATH loads that libcuda.so.1 first and passes a stream of its own to every call,
// so the shim also tracks each call's device completion with an event (shm_abi.h contract 8):
// calls then go in bursts of --burst per thread with a 60 ms pause between bursts (not timed),
// as the shim's service thread frees completed events every 50 ms; the `tracked` column says how
// many of the timed shim calls got their completion tracked (it must be 100 % for the added
// cost to be the tracking's), and `driver_ns` what the driver alone takes for the same
// cuStreamIsCapturing + cuEventRecord, measured in the same run.
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
  std::string cuda_driver;  // "" = no driver: host timing, no completion tracking
  int burst = 256;
};

// The driver entry points the bench itself uses (--cuda-driver).
struct Driver {
  using Fn0 = int (*)(unsigned);
  int (*init)(unsigned) = nullptr;
  int (*device_get)(int*, int) = nullptr;
  int (*primary_ctx_retain)(void**, int) = nullptr;
  int (*ctx_set_current)(void*) = nullptr;
  int (*stream_create)(void**, unsigned) = nullptr;
  int (*event_create)(void**, unsigned) = nullptr;
  int (*event_record)(void*, void*) = nullptr;
  int (*stream_is_capturing)(void*, int*) = nullptr;
  void* ctx = nullptr;
};
Driver g_driver;

bool LoadDriver(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", path.c_str(), dlerror());
    return false;
  }
  auto get = [lib](const char* name, auto** fn) {
    *reinterpret_cast<void**>(fn) = dlsym(lib, name);
    return *fn != nullptr;
  };
  Driver& d = g_driver;
  if (!get("cuInit", &d.init) || !get("cuDeviceGet", &d.device_get) ||
      !get("cuDevicePrimaryCtxRetain", &d.primary_ctx_retain) || !get("cuCtxSetCurrent", &d.ctx_set_current) ||
      !get("cuStreamCreate", &d.stream_create) || !get("cuEventCreate", &d.event_create) ||
      !get("cuEventRecord", &d.event_record) || !get("cuStreamIsCapturing", &d.stream_is_capturing)) {
    std::fprintf(stderr, "%s lacks a driver entry point the bench needs\n", path.c_str());
    return false;
  }
  int dev = 0;
  if (d.init(0) != 0 || d.device_get(&dev, 0) != 0 || d.primary_ctx_retain(&d.ctx, dev) != 0) {
    std::fprintf(stderr, "%s: no usable device\n", path.c_str());
    return false;
  }
  return true;
}

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
FalconControl* OwnControl(FalconShmHeader** header) {
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
  *header = h;
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
  double tracked = -1;    // share of timed shim calls whose completion was tracked, -1 = no driver
  double driver_ns = -1;  // cuStreamIsCapturing + cuEventRecord alone, -1 = no driver
};

// The bench's own segment header: its count of calls whose completion was not tracked.
FalconShmHeader* g_header = nullptr;

uint64_t Untracked() { return std::atomic_ref<uint64_t>(g_header->untracked_calls).load(); }

// 1 + the latest comm_seq marked, summed over the bench's communicators: it advances by one per
// shim call when every call is tracked.
uint64_t MarkedSum() {
  auto* comms = reinterpret_cast<FalconCommEntry*>(reinterpret_cast<char*>(g_header) + g_header->comm_offset);
  const uint32_t used = std::min(std::atomic_ref<uint32_t>(g_header->comm_used).load(), g_header->comm_capacity);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < used; ++i) sum += std::atomic_ref<uint64_t>(comms[i].marked).load();
  return sum;
}

void PauseUntimed() {
  timespec ts{0, 60 * 1000 * 1000};
  nanosleep(&ts, nullptr);
}

Row Measure(const Options& o, const char* mode, int nthreads, ncclComm_t* comms, cudaStream_t* streams) {
  std::vector<double> direct, shim, driver;  // per thread and round
  std::atomic<long> wrong{0};
  float buf[4] = {1, 2, 3, 4};
  const bool paced = !o.cuda_driver.empty();
  // Paced: bursts small enough that every thread's burst fits the shim's event pool together.
  const int burst = paced ? std::max(1, std::min(o.burst, 512 / nthreads)) : o.calls;
  const uint64_t untracked_before = Untracked();
  const uint64_t marked_before = MarkedSum();
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<double> d(static_cast<size_t>(nthreads)), s(static_cast<size_t>(nthreads)), e(static_cast<size_t>(nthreads));
    std::vector<std::thread> pool;
    for (int t = 0; t < nthreads; ++t) {
      pool.emplace_back([&, t] {
        ncclComm_t comm = comms[t];
        cudaStream_t stream = streams[t];
        if (paced) g_driver.ctx_set_current(g_driver.ctx);
        // As many events as the shim's pool per context, recorded in turn, as the shim does.
        std::vector<void*> events(paced ? 1024 : 0, nullptr);
        for (void*& ev : events) g_driver.event_create(&ev, 2);
        std::size_t next_event = 0;
        long bad = 0;
        int64_t direct_ns = 0, shim_ns = 0, driver_ns = 0;
        for (int done = 0; done < o.calls; done += burst) {
          const int n = std::min(burst, o.calls - done);
          int64_t t0 = ThreadCpuNs();
          for (int i = 0; i < n; ++i) bad += pncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, comm, stream);
          int64_t t1 = ThreadCpuNs();
          for (int i = 0; i < n; ++i) bad -= ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, comm, stream);
          int64_t t2 = ThreadCpuNs();
          direct_ns += t1 - t0;
          shim_ns += t2 - t1;
          if (paced) {
            int status = 0;
            int64_t t3 = ThreadCpuNs();
            for (int i = 0; i < n; ++i) {
              g_driver.stream_is_capturing(stream, &status);
              g_driver.event_record(events[next_event++ % events.size()], stream);
            }
            driver_ns += ThreadCpuNs() - t3;
            PauseUntimed();
          }
        }
        d[static_cast<size_t>(t)] = static_cast<double>(direct_ns) / o.calls;
        s[static_cast<size_t>(t)] = static_cast<double>(shim_ns) / o.calls;
        e[static_cast<size_t>(t)] = static_cast<double>(driver_ns) / o.calls;
        wrong += bad != 0;
      });
    }
    for (auto& th : pool) th.join();
    for (int t = 0; t < nthreads; ++t) driver.push_back(e[static_cast<size_t>(t)]);
    for (int t = 0; t < nthreads; ++t) {
      direct.push_back(d[static_cast<size_t>(t)]);
      shim.push_back(s[static_cast<size_t>(t)]);
    }
  }
  std::vector<double> added(direct.size());
  for (size_t i = 0; i < added.size(); ++i) added[i] = shim[i] - direct[i];
  Row row{mode, nthreads, Percentile(direct, 50), Percentile(shim, 50), Percentile(added, 50),
          Percentile(added, 95), Percentile(added, 99), wrong.load()};
  if (paced) {
    PauseUntimed();  // the last burst's events are polled
    PauseUntimed();
    const double timed = static_cast<double>(o.rounds) * nthreads * o.calls;
    // Both must hold: no call counted untracked, and every call's mark advanced its communicator.
    const double not_refused = 1.0 - static_cast<double>(Untracked() - untracked_before) / timed;
    const double marked = static_cast<double>(MarkedSum() - marked_before) / timed;
    row.tracked = std::min(not_refused, marked);
    row.driver_ns = Percentile(driver, 50);
  }
  return row;
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--rounds R] [--calls N] [--threads 1,8] [--target-ns 50] [--json]\n"
               "          [--cuda-driver PATH/libcuda.so.1 [--burst N]]\n"
               "Times NCCL calls through libfalcon_shim.so against direct calls into the no-op NCCL.\n"
               "--cuda-driver: with a driver loaded, so the shim tracks device completion too.\n"
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
    else if (a == "--cuda-driver" && i + 1 < argc) o.cuda_driver = argv[++i];
    else if (a == "--burst" && i + 1 < argc) o.burst = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) {
      o.threads.clear();
      for (char* tok = std::strtok(argv[++i], ","); tok != nullptr; tok = std::strtok(nullptr, ",")) {
        o.threads.push_back(std::atoi(tok));
      }
    } else return Usage(argv[0]);
  }
  if (o.rounds < 1 || o.calls < 1 || o.burst < 1 || o.threads.empty()) return Usage(argv[0]);
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
  if (!o.cuda_driver.empty() && !LoadDriver(o.cuda_driver)) return 2;
  const int max_threads = *std::max_element(o.threads.begin(), o.threads.end());
  std::vector<ncclComm_t> comms(static_cast<size_t>(max_threads));
  for (auto& c : comms) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclCommInitRank(&c, 1, id, 0);
  }
  FalconControl* control = OwnControl(&g_header);
  if (control == nullptr) {
    std::fprintf(stderr, "cannot find this process's Falcon segment (is FALCON_DISABLE set?)\n");
    return 2;
  }
  std::vector<cudaStream_t> streams(static_cast<size_t>(max_threads), nullptr);
  if (!o.cuda_driver.empty()) {
    g_driver.ctx_set_current(g_driver.ctx);
    for (auto& st : streams) {
      void* created = nullptr;
      if (g_driver.stream_create(&created, 1) != 0) {
        std::fprintf(stderr, "cuStreamCreate failed\n");
        return 2;
      }
      st = static_cast<cudaStream_t>(created);
    }
    // The shim looks for a loaded driver about once a second; its events come a tick later.
    float warm[4] = {0, 0, 0, 0};
    for (int i = 0; i < 300 && std::atomic_ref<uint32_t>(control->timing_source).load() != kFalconTimingCudaEvents; ++i) {
      ncclAllReduce(warm, warm, 4, ncclFloat, ncclSum, comms[0], streams[0]);
      usleep(10000);
    }
    if (std::atomic_ref<uint32_t>(control->timing_source).load() != kFalconTimingCudaEvents) {
      std::fprintf(stderr, "the shim did not find the CUDA driver %s\n", o.cuda_driver.c_str());
      return 2;
    }
    for (int i = 0; i < 5; ++i) {
      ncclAllReduce(warm, warm, 4, ncclFloat, ncclSum, comms[0], streams[0]);
      PauseUntimed();
    }
  }
  std::vector<Row> rows;
  for (const char* mode : {"track", "profile"}) {
    if (!SetMode(control, std::strcmp(mode, "track") == 0 ? kFalconModeTrack : kFalconModeProfile)) {
      std::fprintf(stderr, "the shim did not acknowledge mode %s\n", mode);
      return 2;
    }
    for (int t : o.threads) rows.push_back(Measure(o, mode, t, comms.data(), streams.data()));
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
                  "\"added_ns_p95\": %.2f, \"added_ns_p99\": %.2f, \"wrong\": %ld",
                  i ? ", " : "", r.mode, r.threads, r.direct_p50, r.shim_p50, r.added_p50, r.added_p95, r.added_p99,
                  r.wrong);
      if (r.tracked >= 0) std::printf(", \"tracked\": %.4f, \"driver_ns\": %.2f", r.tracked, r.driver_ns);
      std::printf("}");
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
  if (!o.cuda_driver.empty()) {
    std::printf("# CUDA driver %s, one stream per thread: completion tracked with an event per call; bursts of "
                "%d calls per thread, 60 ms apart (not timed)\n", o.cuda_driver.c_str(), o.burst);
  }
  std::printf("%-8s %7s %12s %12s %14s %14s %14s %7s %8s %10s\n", "mode", "threads", "direct_ns", "shim_ns",
              "added_ns_p50", "added_ns_p95", "added_ns_p99", "#wrong", "tracked", "driver_ns");
  for (const Row& r : rows) {
    char tracked[16] = "-", driver[16] = "-";
    if (r.tracked >= 0) {
      std::snprintf(tracked, sizeof tracked, "%.1f%%", 100.0 * r.tracked);
      std::snprintf(driver, sizeof driver, "%.1f", r.driver_ns);
    }
    std::printf("%-8s %7d %12.1f %12.1f %14.1f %14.1f %14.1f %7ld %8s %10s\n", r.mode, r.threads, r.direct_p50,
                r.shim_p50, r.added_p50, r.added_p95, r.added_p99, r.wrong, tracked, driver);
  }
  std::printf("# verdict: %.1f ns added per call in track mode, 1 thread (p50); target <= %.0f ns: %s; %ld wrong\n",
              headline.added_p50, o.target_ns, pass ? "PASS" : "FAIL", wrong);
  return wrong != 0 ? 1 : 0;
}
