// falcon-load-caller: one rank of a synthetic job that issues NCCL calls at a fixed rate, for the
// agent-at-full-load benchmark (bench/agent_load_bench.py). Run it over the no-op NCCL under the
// shim: only the shim's recording and the agent's reading are exercised, at a rate no real
// framework reaches.
//
// Each iteration is `--calls-per-iteration` calls on one communicator of `--nranks`, the same
// sequence every iteration as a training step issues it: each position's operation (AllReduce,
// AllGather, ReduceScatter) and size (16 KiB to 1 MiB) drawn once from a fixed hash of the
// position, then one 8-byte Broadcast closing the iteration — no shorter repeat inside it, so
// the agent's period is the iteration. Calls go out in bursts every millisecond so
// that `--rate` calls leave per second; from `--slow-at-s` on, every burst interval is stretched
// by `--slow-factor` (the rank's iterations take that much longer: a straggler the agent must
// name). At exit it prints one JSON line: {rank, calls, seconds, rate, slow_at_calls, errors}.
// Exit status 1 when a call failed, 2 on bad arguments.
#include <nccl.h>
#include <time.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  int rank = 0;
  int nranks = 8;
  double rate = 10000;  // calls per second
  int calls_per_iteration = 1000;
  double duration_s = 30;
  double slow_at_s = -1;  // < 0: never
  double slow_factor = 1.0;
};

const char kUsage[] =
    "usage: falcon-load-caller --rank R [--nranks N] [--rate CALLS_PER_S] [--calls-per-iteration K]\n"
    "                          [--duration-s S] [--slow-at-s T --slow-factor F]\n"
    "One rank of a synthetic job issuing NCCL calls at a fixed rate (see the file's header).\n";

bool ParseDouble(const char* text, double lo, double hi, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// 0 on success, else the exit status (usage printed).
int Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "falcon-load-caller: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    double v = 0;
    const char* value = argv[++i];
    struct Numeric {
      const char* flag;
      double lo, hi;
    };
    static const Numeric kFlags[] = {{"--rank", 0, 1 << 24},          {"--nranks", 1, 1 << 24},
                                     {"--rate", 1, 1e7},              {"--calls-per-iteration", 3, 1e7},
                                     {"--duration-s", 0.1, 86400},    {"--slow-at-s", 0, 86400},
                                     {"--slow-factor", 1, 100}};
    const Numeric* spec = nullptr;
    for (const Numeric& n : kFlags) {
      if (a == n.flag) spec = &n;
    }
    if (spec == nullptr) {
      std::fprintf(stderr, "falcon-load-caller: unknown option %s\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (!ParseDouble(value, spec->lo, spec->hi, &v)) {
      std::fprintf(stderr, "falcon-load-caller: %s: '%s' is not a number in [%g, %g]\n", a.c_str(), value, spec->lo,
                   spec->hi);
      return 2;
    }
    if (a == "--rank") o->rank = static_cast<int>(v);
    if (a == "--nranks") o->nranks = static_cast<int>(v);
    if (a == "--rate") o->rate = v;
    if (a == "--calls-per-iteration") o->calls_per_iteration = static_cast<int>(v);
    if (a == "--duration-s") o->duration_s = v;
    if (a == "--slow-at-s") o->slow_at_s = v;
    if (a == "--slow-factor") o->slow_factor = v;
  }
  if (o->rank >= o->nranks) {
    std::fprintf(stderr, "falcon-load-caller: --rank %d is not below --nranks %d\n", o->rank, o->nranks);
    return 2;
  }
  return 0;
}

double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void SleepUntil(double t) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(t);
  ts.tv_nsec = static_cast<long>((t - static_cast<double>(ts.tv_sec)) * 1e9);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int rc = Parse(argc, argv, &o); rc != 0) return rc;
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  ncclComm_t comm = nullptr;
  if (ncclCommInitRank(&comm, o.nranks, id, o.rank) != ncclSuccess) {
    std::fprintf(stderr, "falcon-load-caller: ncclCommInitRank failed\n");
    return 1;
  }
  // Buffers are never touched by the no-op library; sized as the calls say, to be honest.
  std::vector<float> big(std::size_t{1} << 20), tiny(2);
  struct Call {
    int op;  // 0 AllReduce, 1 AllGather, 2 ReduceScatter
    std::size_t count;
  };
  std::vector<Call> pattern;
  for (int i = 0; i + 1 < o.calls_per_iteration; ++i) {
    std::uint64_t h = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(i + 1);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    const std::size_t count = std::size_t{4096} << (2 * ((h >> 8) % 4));  // 16 KiB .. 1 MiB of floats
    pattern.push_back({static_cast<int>(h % 3), count});
  }
  const double tick_s = 1e-3;
  const double per_tick = o.rate * tick_s;  // calls per millisecond burst
  const double start = Now();
  const double stop = start + o.duration_s;
  double next = start, owed = 0;
  unsigned long long calls = 0, slow_at_calls = 0, errors = 0;
  bool slow = false;
  for (;;) {
    const double now = Now();
    if (now >= stop) break;
    if (!slow && o.slow_at_s >= 0 && now - start >= o.slow_at_s) {
      slow = true;
      slow_at_calls = calls;
    }
    owed += per_tick;
    for (; owed >= 1.0; owed -= 1.0) {
      const std::size_t pos = static_cast<std::size_t>(calls % static_cast<unsigned long long>(o.calls_per_iteration));
      ncclResult_t r;
      if (pos == pattern.size()) {
        r = ncclBroadcast(tiny.data(), tiny.data(), tiny.size(), ncclFloat, 0, comm, nullptr);
      } else {
        const Call& c = pattern[pos];
        const std::size_t part = c.count / static_cast<std::size_t>(o.nranks);
        r = c.op == 0   ? ncclAllReduce(big.data(), big.data(), c.count, ncclFloat, ncclSum, comm, nullptr)
            : c.op == 1 ? ncclAllGather(big.data(), big.data(), part, ncclFloat, comm, nullptr)
                        : ncclReduceScatter(big.data(), big.data(), part, ncclFloat, ncclSum, comm, nullptr);
      }
      if (r != ncclSuccess) ++errors;
      ++calls;
    }
    next += tick_s * (slow ? o.slow_factor : 1.0);
    if (next < Now() - 0.05) next = Now();  // fell far behind (preempted): do not burst to catch up
    SleepUntil(next);
  }
  const double seconds = Now() - start;
  ncclCommDestroy(comm);
  std::printf("{\"rank\": %d, \"calls\": %llu, \"seconds\": %.3f, \"rate\": %.1f, \"slow_at_calls\": %llu, "
              "\"errors\": %llu}\n",
              o.rank, calls, seconds, static_cast<double>(calls) / seconds, slow_at_calls, errors);
  return errors == 0 ? 0 : 1;
}
