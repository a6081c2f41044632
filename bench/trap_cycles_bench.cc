// falcon-trap-cycles-bench: pause -> validate -> resume cycles on a live emulated job whose ranks
// each run a watchdog thread polling ncclCommGetAsyncError (as PyTorch's does), with validation
// failures injected, played the way the agent plays them (through each rank's control block).
// It answers: does any cycle hang (a pause, a task or a resume past its deadline), does any
// result come back wrong, and does the job's own data check pass at the end?
//
// Each cycle pauses every rank before the same call of the world communicator, runs a GEMM on
// every rank, then one validation scenario, then resumes:
//   ok          the validation communicator's id, every rank joins it, a ring pass on it
//   no-join     one rank never joins: the others' joins must fail by their 1 s deadline
//   no-post     every rank joins, one never posts its transfer: its peers' must fail by 1 s
//   on-job      a transfer naming the job's own communicator: refused (bad_request)
// A cycle "hangs" if any of its waits outlives its deadline plus kGraceS; a result is "wrong"
// if a task's status is not the one its scenario expects.
//
// Usage: falcon-trap-cycles-bench [--cycles N] [--ranks R] [--json]   (run from the build tree)
// Exit 1 on any hang, wrong result or failed job. Talks to segments through include/falcon/
// only (the shm ABI), like falcon-shim-bench.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "falcon/shm_abi.h"

namespace {

constexpr double kGraceS = 3.0;
constexpr int64_t kTaskDeadlineNs = 1'000'000'000;
constexpr const char* kScenarios[] = {"ok", "no-join", "no-post", "on-job"};

struct Options {
  int cycles = 200;
  int ranks = 4;
  bool json = false;
};

int64_t RealNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

template <typename T>
T Load(const T& v) {
  return std::atomic_ref<T>(const_cast<T&>(v)).load(std::memory_order_acquire);
}
template <typename T>
void Store(T& v, T x) {
  std::atomic_ref<T>(v).store(x, std::memory_order_release);
}

// One rank's segment, mapped read-write as the agent maps it.
struct Rank {
  FalconShmHeader* h = nullptr;
  FalconControl* c = nullptr;
  FalconCommEntry* comms = nullptr;
  uint64_t WorldCalls() const { return Load(comms[0].calls); }
  uint64_t Pause(uint64_t seq, int64_t deadline) {
    Store(c->pause_comm_slot, 0u);
    Store(c->pause_comm_seq, seq);
    Store(c->pause_deadline_real_ns, deadline);
    return std::atomic_ref<uint64_t>(c->pause_gen).fetch_add(1, std::memory_order_acq_rel) + 1;
  }
  uint64_t Post(const FalconTask& t, const uint8_t* blob = nullptr) {
    std::memcpy(&c->task, &t, sizeof(t));
    if (blob != nullptr) std::memcpy(c->task_blob, blob, FALCON_TASK_BLOB_LEN);
    return std::atomic_ref<uint64_t>(c->task_seq).fetch_add(1, std::memory_order_acq_rel) + 1;
  }
  bool Done(uint64_t seq, FalconTaskResult* r) const {
    if (Load(c->task_ack) < seq) return false;
    std::memcpy(r, &c->task_result, sizeof(*r));
    return r->task_seq == seq;
  }
};

std::vector<Rank> MapRanks(const std::string& dir, int n) {
  std::vector<Rank> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, FALCON_SHM_PREFIX, std::strlen(FALCON_SHM_PREFIX)) != 0) continue;
    const std::string path = dir + "/" + e->d_name;
    const int fd = open(path.c_str(), O_RDWR);
    if (fd < 0) continue;
    struct stat st;
    void* base = fstat(fd, &st) == 0 ? mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE,
                                            MAP_SHARED, fd, 0)
                                     : MAP_FAILED;
    close(fd);
    if (base == MAP_FAILED) continue;
    Rank r;
    r.h = static_cast<FalconShmHeader*>(base);
    if (Load(r.h->magic) != FALCON_SHM_MAGIC || r.h->abi_version != FALCON_SHM_ABI_VERSION) continue;
    r.c = reinterpret_cast<FalconControl*>(static_cast<char*>(base) + r.h->control_offset);
    r.comms = reinterpret_cast<FalconCommEntry*>(static_cast<char*>(base) + r.h->comm_offset);
    if (Load(r.h->comm_used) == 0 || Load(r.comms[0].state) != kFalconCommLive) continue;  // no world yet
    out.push_back(r);
  }
  closedir(d);
  std::sort(out.begin(), out.end(), [](const Rank& a, const Rank& b) { return a.h->rank_hint < b.h->rank_hint; });
  if (static_cast<int>(out.size()) != n) out.clear();
  return out;
}

// Polls `cond` until true or `timeout_s`; false on timeout.
template <typename F>
bool WaitFor(F cond, double timeout_s) {
  const int64_t until = RealNs() + static_cast<int64_t>(timeout_s * 1e9);
  while (!cond()) {
    if (RealNs() > until) return false;
    usleep(500);
  }
  return true;
}

struct Outcome {
  bool hang = false;
  int wrong = 0;
  double pause_ms = 0;
};

FalconTask Task(uint32_t kind) {
  FalconTask t{};
  t.kind = kind;
  t.repeats = 1;
  t.send_peer = t.recv_peer = -1;
  return t;
}

// Runs `tasks[r]` on the ranks in `on` (others idle); each must end by its deadline + grace with
// status `want[r]` (< 0: either outcome is right). Returns false on a hang; counts wrong ones.
bool RunTasks(std::vector<Rank>& ranks, const std::vector<FalconTask>& tasks, const std::vector<int>& on,
              const std::vector<int32_t>& want, const uint8_t* blob, Outcome* o) {
  std::map<int, uint64_t> seqs;
  for (int r : on) seqs[r] = ranks[static_cast<size_t>(r)].Post(tasks[static_cast<size_t>(r)], blob);
  for (int r : on) {
    FalconTaskResult res{};
    const int64_t dl = tasks[static_cast<size_t>(r)].deadline_real_ns;
    const double wait_s = (dl > 0 ? static_cast<double>(dl - RealNs()) / 1e9 : 20.0) + kGraceS;
    if (!WaitFor([&] { return ranks[static_cast<size_t>(r)].Done(seqs[r], &res); }, wait_s)) return false;
    if (want[static_cast<size_t>(r)] >= 0 && res.status != want[static_cast<size_t>(r)]) ++o->wrong;
  }
  return true;
}

Outcome Cycle(std::vector<Rank>& ranks, int cycle, int scenario) {
  Outcome o;
  const int n = static_cast<int>(ranks.size());
  uint64_t target = 0;
  for (const Rank& r : ranks) target = std::max(target, r.WorldCalls());
  target += 60;  // a few iterations ahead of the furthest rank
  const int64_t deadline = RealNs() + 30'000'000'000LL;
  std::vector<uint64_t> gens;
  for (Rank& r : ranks) gens.push_back(r.Pause(target, deadline));
  auto all_in = [&](uint32_t state) {
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (Load(ranks[i].c->pause_ack_gen) != gens[i] || Load(ranks[i].c->pause_state) != state) return false;
    }
    return true;
  };
  if (!WaitFor([&] { return all_in(kFalconPauseTrapped); }, 30 + kGraceS)) {
    o.hang = true;
    return o;
  }
  std::vector<int> all;
  for (int r = 0; r < n; ++r) all.push_back(r);
  std::vector<FalconTask> tasks(static_cast<size_t>(n), Task(kFalconTaskGemm));
  for (FalconTask& t : tasks) t.m = t.n = t.k = 64;
  bool ok = RunTasks(ranks, tasks, all, std::vector<int32_t>(static_cast<size_t>(n), kFalconTaskOk), nullptr, &o);
  const int odd = cycle % n;  // the rank that misbehaves
  uint8_t blob[FALCON_TASK_BLOB_LEN] = {};
  if (ok && scenario != 3) {  // the validation communicator's id
    std::vector<FalconTask> id(static_cast<size_t>(n), Task(kFalconTaskCommId));
    std::vector<int32_t> want(static_cast<size_t>(n), kFalconTaskOk);
    ok = RunTasks(ranks, id, {0}, want, nullptr, &o);
    std::memcpy(blob, ranks[0].c->task_result_blob, sizeof(blob));
  }
  if (ok && (scenario == 0 || scenario == 1 || scenario == 2)) {
    std::vector<FalconTask> join(static_cast<size_t>(n), Task(kFalconTaskCommJoin));
    std::vector<int> joiners;
    for (int r = 0; r < n; ++r) {
      join[static_cast<size_t>(r)].m = static_cast<uint32_t>(n);
      join[static_cast<size_t>(r)].n = static_cast<uint32_t>(r);
      join[static_cast<size_t>(r)].bytes = 65536;
      join[static_cast<size_t>(r)].deadline_real_ns = RealNs() + kTaskDeadlineNs;
      if (scenario != 1 || r != odd) joiners.push_back(r);
    }
    const int32_t want_join = scenario == 1 ? kFalconTaskFailed : kFalconTaskOk;
    ok = RunTasks(ranks, join, joiners, std::vector<int32_t>(static_cast<size_t>(n), want_join), blob, &o);
  }
  if (ok && (scenario == 0 || scenario == 2 || scenario == 3)) {
    std::vector<FalconTask> ring(static_cast<size_t>(n), Task(kFalconTaskP2p));
    std::vector<int> posters;
    std::vector<int32_t> want(static_cast<size_t>(n), kFalconTaskOk);
    for (int r = 0; r < n; ++r) {
      FalconTask& t = ring[static_cast<size_t>(r)];
      t.repeats = 3;
      t.comm_slot = scenario == 3 ? 0u : FALCON_VALIDATION_COMM;
      t.send_peer = (r + 1) % n;
      t.recv_peer = (r + n - 1) % n;
      t.bytes = 65536;
      t.deadline_real_ns = RealNs() + kTaskDeadlineNs;
      if (scenario == 3) want[static_cast<size_t>(r)] = kFalconTaskBadRequest;
      if (scenario == 2 && r == odd) continue;
      // With one rank silent, its ring neighbours fail; the others may finish first or fail once
      // the communicator is aborted: only the neighbours' outcome is certain.
      if (scenario == 2 && (r == (odd + 1) % n || r == (odd + n - 1) % n)) want[static_cast<size_t>(r)] = kFalconTaskFailed;
      else if (scenario == 2) want[static_cast<size_t>(r)] = -1;
      posters.push_back(r);
    }
    ok = RunTasks(ranks, ring, posters, want, nullptr, &o);
  }
  for (size_t i = 0; i < ranks.size(); ++i) Store(ranks[i].c->resume_gen, gens[i]);
  if (!ok || !WaitFor([&] { return all_in(kFalconPauseResumed); }, 10 + kGraceS)) {
    o.hang = true;
    return o;
  }
  int64_t first = INT64_MAX, last = 0;
  for (const Rank& r : ranks) {
    first = std::min(first, Load(r.c->trapped_real_ns));
    last = std::max(last, Load(r.c->resumed_real_ns));
  }
  o.pause_ms = static_cast<double>(last - first) / 1e6;
  return o;
}

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5))];
}

std::string Dir(const char* argv0) {
  std::string self = argv0;
  const size_t slash = self.rfind('/');
  return slash == std::string::npos ? "." : self.substr(0, slash);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cycles" && i + 1 < argc) o.cycles = std::atoi(argv[++i]);
    else if (a == "--ranks" && i + 1 < argc) o.ranks = std::atoi(argv[++i]);
    else if (a == "--json") o.json = true;
    else {
      std::fprintf(stderr, "usage: %s [--cycles N] [--ranks R] [--json]\n", argv[0]);
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  if (o.cycles < 1 || o.ranks < 2 || o.ranks > 16) {
    std::fprintf(stderr, "falcon-trap-cycles-bench: --cycles >= 1, --ranks 2..16\n");
    return 2;
  }
  char tmpl[] = "/tmp/falcon-trap-cycles-XXXXXX";
  const char* tmp = mkdtemp(tmpl);
  if (tmp == nullptr) return 2;
  const std::string dir = tmp, bin = Dir(argv[0]);
  const std::string stop = dir + "/stop";
  const pid_t job = fork();
  if (job == 0) {
    setenv("FALCON_SHM_DIR", dir.c_str(), 1);
    setenv("FALCON_KEEP_SEGMENT", "1", 1);
    const std::string ranks = std::to_string(o.ranks);
    const std::string run = bin + "/emu/falcon-emu-run", job_bin = bin + "/emu/falcon-emu-job";
    const std::string shim = std::string(FALCON_BENCH_SHIM_PATH);
    execl(run.c_str(), run.c_str(), "-n", ranks.c_str(), "--ranks-per-node", "2", "--preload", shim.c_str(),
          "--job-timeout", "3600", "--", job_bin.c_str(), "--iters", "100000000",
          "--compute-ms", "2", "--bytes", "65536", "--check", "--watchdog", "--stop-file", stop.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  std::vector<Rank> ranks;
  if (!WaitFor([&] { return !(ranks = MapRanks(dir, o.ranks)).empty(); }, 60)) {
    std::fprintf(stderr, "falcon-trap-cycles-bench: the job's segments did not appear in %s\n", dir.c_str());
    kill(job, SIGKILL);
    return 2;
  }
  std::printf("# falcon-trap-cycles-bench: %d cycles, %d ranks (emulated job, watchdog thread per rank, --check)\n",
              o.cycles, o.ranks);
  std::printf("# scenarios in turn: ok, no-join (one rank never joins), no-post (one rank never posts), "
              "on-job (a transfer on the job's communicator); task deadlines 1 s, grace %.0f s\n", kGraceS);
  std::map<int, std::vector<double>> pauses;
  std::map<int, int> hangs, wrong, runs;
  for (int cycle = 0; cycle < o.cycles; ++cycle) {
    const int scenario = cycle % 4;
    const Outcome out = Cycle(ranks, cycle, scenario);
    ++runs[scenario];
    hangs[scenario] += out.hang ? 1 : 0;
    wrong[scenario] += out.wrong;
    if (!out.hang) pauses[scenario].push_back(out.pause_ms);
    if (out.hang) {
      std::fprintf(stderr, "falcon-trap-cycles-bench: cycle %d (%s) hung; stopping\n", cycle, kScenarios[scenario]);
      break;
    }
  }
  FILE* f = std::fopen(stop.c_str(), "w");
  if (f != nullptr) std::fclose(f);
  int status = 0;
  const bool exited = WaitFor([&] { return waitpid(job, &status, WNOHANG) == job; }, 120);
  if (!exited) kill(job, SIGKILL);
  const bool job_ok = exited && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (DIR* d = opendir(dir.c_str())) {  // the kept segments and the stop file
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') unlink((dir + "/" + e->d_name).c_str());
    }
    closedir(d);
    rmdir(dir.c_str());
  }
  int total_hangs = 0, total_wrong = 0;
  std::printf("%-10s %7s %12s %12s %12s %7s %7s\n", "scenario", "cycles", "pause_p50_ms", "pause_p95_ms",
              "pause_max_ms", "#hangs", "#wrong");
  for (int s = 0; s < 4; ++s) {
    std::printf("%-10s %7d %12.1f %12.1f %12.1f %7d %7d\n", kScenarios[s], runs[s], Pct(pauses[s], 50),
                Pct(pauses[s], 95), Pct(pauses[s], 100), hangs[s], wrong[s]);
    total_hangs += hangs[s];
    total_wrong += wrong[s];
  }
  std::printf("# verdict: %d hangs, %d wrong results, job data check %s: %s\n", total_hangs, total_wrong,
              job_ok ? "ok" : "FAILED", total_hangs == 0 && total_wrong == 0 && job_ok ? "PASS" : "FAIL");
  if (o.json) {
    std::printf("{\"v\": 1, \"bench\": \"trap_cycles\", \"cycles\": %d, \"ranks\": %d, \"hangs\": %d, \"wrong\": %d, "
                "\"job_ok\": %s}\n",
                o.cycles, o.ranks, total_hangs, total_wrong, job_ok ? "true" : "false");
  }
  return total_hangs == 0 && total_wrong == 0 && job_ok ? 0 : 1;
}
