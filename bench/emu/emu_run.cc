// falcon-emu-run: launches an N-rank job on this host over the NCCL emulator.
//
//   falcon-emu-run -n N [--ranks-per-node K] [--fault-plan F] [--timeout S] [--job-timeout S]
//                  [--preload LIB] [--lib-dir DIR] [--cuda-lib-dir DIR | --no-cuda]
//                  [--node-shm-dirs DIR] [--no-prefix] [--grace S] -- PROGRAM ARGS...
//
// Forks N ranks with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, FALCON_EMU_RANK,
// FALCON_EMU_EPOCH_NS, FALCON_EMU_ID_FILE (fresh temp path), FALCON_EMU_JOB_STATE (the job's
// shared state, job_state.h: runtime placement), LD_LIBRARY_PATH (the NCCL emulator's dir first,
// then the CUDA driver and cuBLAS emulators', so a rank that dlopens libcuda.so.1 gets a GPU) and
// LD_PRELOAD (--preload); forwards each rank's stdout/stderr line by line with a
// "[rank R] " prefix; exits non-zero if any rank fails; on SIGINT/SIGTERM, or when a rank fails,
// terminates the others after --grace seconds (SIGTERM, then SIGKILL 2 s later). --job-timeout S
// does the same after S seconds (exit status 124): the harness guard for jobs that may be left
// waiting on a missing peer, which the emulator (like NCCL) waits for forever. --timeout S sets
// FALCON_EMU_TIMEOUT_S, the emulator's lenient mode in which such waits fail after S seconds;
// only tests of that mode should pass it. Each rank gets SIGKILL if the launcher itself dies
// (PR_SET_PDEATHSIG), so a killed launcher never leaves ranks waiting forever.
// --node-shm-dirs DIR gives each emulated node its own shim segment directory, DIR/node<K>
// (FALCON_SHM_DIR, created 0700; FALCON_EMU_NODE=K), so one falcon-agent per emulated node sees
// only its node's ranks, as on a real cluster.
//
// At exit it removes its temp directory (the id file and whatever else the ranks left there, e.g.
// restart-round id files) and the job state.
//
// Thread-safety: single-threaded event loop (poll). Must never: leave ranks running after it
// exits (or dies), or block on one rank's pipe while others have output.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef FALCON_EMU_LIB_DIR
#define FALCON_EMU_LIB_DIR ""
#endif

namespace {

volatile sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

struct Options {
  int n = 0;
  int ranks_per_node = 8;
  bool rpn_given = false;
  std::string fault_plan, timeout, preload, lib_dir = FALCON_EMU_LIB_DIR, node_shm_dirs;
  std::string cuda_lib_dir = FALCON_EMU_CUDA_LIB_DIR;  // "" with --no-cuda
  double job_timeout = 0, grace = 5;
  bool prefix = true;
  std::vector<char*> argv;
};

void Usage(FILE* f) {
  std::fprintf(f,
      "usage: falcon-emu-run -n N [options] -- PROGRAM [ARGS...]\n"
      "Runs N ranks of PROGRAM on this host over the Falcon NCCL emulator (libnccl.so.2).\n"
      "  -n, --nranks N          number of ranks (required)\n"
      "  --ranks-per-node K      ranks per emulated node (FALCON_EMU_RANKS_PER_NODE; default 8)\n"
      "  --fault-plan F          fault plan file or inline JSON (FALCON_EMU_FAULT_PLAN)\n"
      "  --timeout S             LENIENT mode: peer waits fail after S s (FALCON_EMU_TIMEOUT_S);\n"
      "                          by default they wait forever, as NCCL's do\n"
      "  --job-timeout S         stop the whole job after S seconds, exit 124 (default: none)\n"
      "  --preload LIB           LD_PRELOAD for every rank (e.g. the Falcon shim)\n"
      "  --lib-dir DIR           emulator directory to put first on LD_LIBRARY_PATH\n"
      "                          (default: %s)\n"
      "  --cuda-lib-dir DIR      CUDA driver and cuBLAS emulators' directory, also put on\n"
      "                          LD_LIBRARY_PATH: every rank is a GPU process (default: %s)\n"
      "  --no-cuda               no CUDA driver on the ranks' library path (host-only ranks)\n"
      "  --node-shm-dirs DIR     FALCON_SHM_DIR=DIR/node<K> for the ranks of emulated node K\n"
      "                          (one falcon-agent per emulated node)\n"
      "  --grace S               seconds to let other ranks finish after one fails (default 5)\n"
      "  --no-prefix             forward output without the \"[rank R] \" prefix\n"
      "  -h, --help              this text\n", FALCON_EMU_LIB_DIR, FALCON_EMU_CUDA_LIB_DIR);
}

double Now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (a == "--") {
      for (int j = i + 1; j < argc; ++j) o->argv.push_back(argv[j]);
      break;
    } else if (a == "-h" || a == "--help") {
      Usage(stdout);
      std::exit(0);
    } else if ((a == "-n" || a == "--nranks") && next(&v)) {
      o->n = std::atoi(v.c_str());
    } else if (a == "--ranks-per-node" && next(&v)) {
      o->ranks_per_node = std::atoi(v.c_str());
      o->rpn_given = true;
    } else if (a == "--fault-plan" && next(&v)) {
      o->fault_plan = v;
    } else if (a == "--timeout" && next(&v)) {
      o->timeout = v;
    } else if (a == "--job-timeout" && next(&v)) {
      o->job_timeout = std::atof(v.c_str());
    } else if (a == "--preload" && next(&v)) {
      o->preload = v;
    } else if (a == "--cuda-lib-dir" && next(&v)) {
      o->cuda_lib_dir = v;
    } else if (a == "--no-cuda") {
      o->cuda_lib_dir.clear();
    } else if (a == "--lib-dir" && next(&v)) {
      o->lib_dir = v;
    } else if (a == "--node-shm-dirs" && next(&v)) {
      o->node_shm_dirs = v;
    } else if (a == "--grace" && next(&v)) {
      o->grace = std::atof(v.c_str());
    } else if (a == "--no-prefix") {
      o->prefix = false;
    } else {
      std::fprintf(stderr, "falcon-emu-run: unknown or incomplete option '%s'\n", a.c_str());
      return false;
    }
  }
  if (o->n < 1 || o->ranks_per_node < 1 || o->argv.empty()) {
    std::fprintf(stderr, "falcon-emu-run: need -n N >= 1 and -- PROGRAM\n");
    return false;
  }
  o->argv.push_back(nullptr);
  return true;
}

struct Rank {
  pid_t pid = 0;
  int out = -1, err = -1;
  std::string out_buf, err_buf;
  int status = -1;  // exit code once reaped
};

void Emit(const Options& o, int rank, std::string* buf, bool flush_all, FILE* f) {
  size_t pos;
  while ((pos = buf->find('\n')) != std::string::npos || (flush_all && !buf->empty())) {
    const std::string line = pos == std::string::npos ? *buf : buf->substr(0, pos);
    if (o.prefix) std::fprintf(f, "[rank %d] %s\n", rank, line.c_str());
    else std::fprintf(f, "%s\n", line.c_str());
    buf->erase(0, pos == std::string::npos ? buf->size() : pos + 1);
  }
  std::fflush(f);
}

std::string NodeShmDir(const Options& o, int node) { return o.node_shm_dirs + "/node" + std::to_string(node); }

// Creates DIR and DIR/node<K> for every emulated node (existing ones are fine).
bool MakeNodeShmDirs(const Options& o) {
  if (o.node_shm_dirs.empty()) return true;
  const int nodes = (o.n + o.ranks_per_node - 1) / o.ranks_per_node;
  for (int k = -1; k < nodes; ++k) {
    const std::string d = k < 0 ? o.node_shm_dirs : NodeShmDir(o, k);
    if (mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
      std::fprintf(stderr, "falcon-emu-run: cannot create %s: %s\n", d.c_str(), std::strerror(errno));
      return false;
    }
  }
  return true;
}

// Removes the files directly inside `dir` (ranks may leave id files of restart rounds), then it.
void RemoveTempDir(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") unlink((dir + "/" + name).c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

void ExecRank(const Options& o, int r, int out_fd, int err_fd, const std::string& id_file, long long epoch,
              const std::string& job_state, pid_t launcher) {
  // Die with the launcher: a rank waiting forever on a missing peer must not outlive it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(137);  // it died before the line above
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  const int rpn = o.ranks_per_node;
  const int node_first = (r / rpn) * rpn;
  const int local_size = std::min(rpn, o.n - node_first);
  setenv("RANK", std::to_string(r).c_str(), 1);
  setenv("FALCON_EMU_RANK", std::to_string(r).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(r - node_first).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(o.n).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(local_size).c_str(), 1);
  setenv("FALCON_EMU_EPOCH_NS", std::to_string(epoch).c_str(), 1);
  setenv("FALCON_EMU_ID_FILE", id_file.c_str(), 1);
  setenv("FALCON_EMU_JOB_STATE", job_state.c_str(), 1);
  if (o.rpn_given) setenv("FALCON_EMU_RANKS_PER_NODE", std::to_string(rpn).c_str(), 1);
  if (!o.fault_plan.empty()) setenv("FALCON_EMU_FAULT_PLAN", o.fault_plan.c_str(), 1);
  if (!o.timeout.empty()) setenv("FALCON_EMU_TIMEOUT_S", o.timeout.c_str(), 1);
  for (const std::string& dir : {o.cuda_lib_dir, o.lib_dir}) {  // the NCCL emulator ends up first
    if (dir.empty()) continue;
    const char* old = std::getenv("LD_LIBRARY_PATH");
    const std::string v = dir + (old && *old ? std::string(":") + old : "");
    setenv("LD_LIBRARY_PATH", v.c_str(), 1);
  }
  if (!o.preload.empty()) setenv("LD_PRELOAD", o.preload.c_str(), 1);
  setenv("FALCON_EMU_NODE", std::to_string(r / rpn).c_str(), 1);
  if (!o.node_shm_dirs.empty()) setenv("FALCON_SHM_DIR", NodeShmDir(o, r / rpn).c_str(), 1);
  execvp(o.argv[0], o.argv.data());
  std::fprintf(stderr, "falcon-emu-run: cannot exec %s: %s\n", o.argv[0], std::strerror(errno));
  _exit(127);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    Usage(stderr);
    return 2;
  }
  if (!MakeNodeShmDirs(o)) return 2;
  char dir_tmpl[] = "/tmp/falcon-emu-run-XXXXXX";
  if (!mkdtemp(dir_tmpl)) {
    std::perror("falcon-emu-run: mkdtemp");
    return 2;
  }
  const std::string dir = dir_tmpl, id_file = dir + "/unique_id";
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const long long epoch = static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
  const std::string job_state = "/falcon-emu-" + std::to_string(getuid()) + "-job-" + std::to_string(getpid()) +
                                "-" + std::to_string(epoch);
  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const pid_t launcher = getpid();
  std::vector<Rank> ranks(static_cast<size_t>(o.n));
  for (int r = 0; r < o.n; ++r) {
    int po[2], pe[2];
    if (pipe(po) != 0 || pipe(pe) != 0) {
      std::perror("falcon-emu-run: pipe");
      return 2;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(po[0]);
      close(pe[0]);
      ExecRank(o, r, po[1], pe[1], id_file, epoch, job_state, launcher);
    }
    close(po[1]);
    close(pe[1]);
    Rank& rk = ranks[static_cast<size_t>(r)];
    rk.pid = pid;
    rk.out = po[0];
    rk.err = pe[0];
  }
  const double start = Now();
  double kill_at = 0;       // when to SIGTERM the survivors (0 = not scheduled)
  bool termed = false;
  double hard_kill_at = 0;
  int first_fail = 0;
  size_t alive = ranks.size();
  while (true) {
    std::vector<pollfd> pfds;
    std::vector<std::pair<int, bool>> who;  // (rank, is_err)
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r].out >= 0) { pfds.push_back({ranks[r].out, POLLIN, 0}); who.push_back({static_cast<int>(r), false}); }
      if (ranks[r].err >= 0) { pfds.push_back({ranks[r].err, POLLIN, 0}); who.push_back({static_cast<int>(r), true}); }
    }
    if (pfds.empty() && alive == 0) break;
    if (!pfds.empty()) poll(pfds.data(), pfds.size(), 50);
    else usleep(20000);
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank& rk = ranks[static_cast<size_t>(who[i].first)];
      int& fd = who[i].second ? rk.err : rk.out;
      std::string& buf = who[i].second ? rk.err_buf : rk.out_buf;
      char chunk[4096];
      const ssize_t n = read(fd, chunk, sizeof chunk);
      if (n > 0) {
        buf.append(chunk, static_cast<size_t>(n));
        Emit(o, who[i].first, &buf, false, who[i].second ? stderr : stdout);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        Emit(o, who[i].first, &buf, true, who[i].second ? stderr : stdout);
        close(fd);
        fd = -1;
      }
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
      Rank& rk = ranks[r];
      int st = 0;
      if (rk.pid > 0 && waitpid(rk.pid, &st, WNOHANG) == rk.pid) {
        rk.pid = 0;
        --alive;
        rk.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (rk.status != 0) {
          if (!termed) {
            std::fprintf(stderr, "falcon-emu-run: rank %zu exited with status %d\n", r, rk.status);
          }
          if (first_fail == 0) first_fail = rk.status;
          if (kill_at == 0) kill_at = Now() + o.grace;
        }
      }
    }
    const double now = Now();
    if (g_signal && kill_at == 0) {
      std::fprintf(stderr, "falcon-emu-run: signal %d: stopping all ranks\n", static_cast<int>(g_signal));
      kill_at = now;
      if (first_fail == 0) first_fail = 128 + g_signal;
    }
    if (o.job_timeout > 0 && now - start > o.job_timeout && kill_at == 0) {
      std::fprintf(stderr, "falcon-emu-run: job timeout (%.1f s): stopping all ranks\n", o.job_timeout);
      kill_at = now;
      if (first_fail == 0) first_fail = 124;
    }
    if (kill_at != 0 && now >= kill_at && !termed && alive > 0) {
      for (auto& rk : ranks) {
        if (rk.pid > 0) kill(rk.pid, SIGTERM);
      }
      termed = true;
      hard_kill_at = now + 2;
    }
    if (termed && hard_kill_at != 0 && now >= hard_kill_at && alive > 0) {
      for (auto& rk : ranks) {
        if (rk.pid > 0) kill(rk.pid, SIGKILL);
      }
      hard_kill_at = 0;
    }
  }
  RemoveTempDir(dir);
  shm_unlink(job_state.c_str());  // the ranks created it on first use, if they used it
  return first_fail;
}
