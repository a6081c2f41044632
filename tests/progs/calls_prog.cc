// falcon-test-calls: a deterministic NCCL workload for the shim tests (runs over any NCCL; the
// tests use the no-op library so only the shim is exercised).
//
// Usage: falcon-test-calls [--threads T] [--iters N] [--fork] [--wait-file PATH]
// Each thread creates its own single-rank communicator and, per iteration, issues one
// AllReduce, one Bcast (which NCCL implements through ncclBroadcast), one group of Send+Recv,
// one AllGather and one call with a null communicator (an error), then splits its communicator
// once and destroys both. Prints "calls <n> checksum <hex>": n = NCCL calls the program made
// itself, checksum = a hash of every result code and output value, so runs with and without
// the shim can be compared. --wait-file: after the first iteration, wait (up to 30 s) until
// PATH exists before continuing (lets a test act on a live process). --fork: the main thread
// forks a child that makes calls of its own before the parent continues.
#include <nccl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<unsigned long long> g_calls{0};

unsigned long long Mix(unsigned long long h, unsigned long long v) { return (h ^ v) * 0x100000001b3ull; }

struct Options {
  int threads = 1;
  int iters = 100;
  bool fork_child = false;
  std::string wait_file;
};

bool WaitForFile(const std::string& path) {
  for (int i = 0; i < 3000; ++i) {  // 30 s deadline
    struct stat st;
    if (stat(path.c_str(), &st) == 0) return true;
    timespec ts{0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
  return false;
}

unsigned long long Worker(int index, const Options& o) {
  unsigned long long h = 0xcbf29ce484222325ull;
  unsigned long long calls = 0;
  ncclUniqueId id;
  h = Mix(h, ncclGetUniqueId(&id));
  ncclComm_t comm = nullptr;
  h = Mix(h, ncclCommInitRank(&comm, 1, id, 0));
  calls += 2;
  float buf[16];
  for (int i = 0; i < 16; ++i) buf[i] = static_cast<float>(index * 16 + i);
  for (int it = 0; it < o.iters; ++it) {
    h = Mix(h, ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, nullptr));
    h = Mix(h, ncclBcast(buf, 16, ncclFloat, 0, comm, nullptr));
    h = Mix(h, ncclGroupStart());
    h = Mix(h, ncclSend(buf, 4, ncclFloat, 0, comm, nullptr));
    h = Mix(h, ncclRecv(buf + 4, 4, ncclFloat, 0, comm, nullptr));
    h = Mix(h, ncclGroupEnd());
    h = Mix(h, ncclAllGather(buf, buf, 16, ncclFloat, comm, nullptr));
    h = Mix(h, ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, nullptr, nullptr));  // error: null comm
    calls += 8;
    if (it == 0 && index == 0 && !o.wait_file.empty() && !WaitForFile(o.wait_file)) {
      std::fprintf(stderr, "timed out waiting for %s\n", o.wait_file.c_str());
      std::exit(3);
    }
  }
  ncclComm_t child = nullptr;
  h = Mix(h, ncclCommSplit(comm, 0, 0, &child, nullptr));
  h = Mix(h, ncclCommDestroy(child));
  h = Mix(h, ncclCommDestroy(comm));
  calls += 3;
  for (float v : buf) h = Mix(h, static_cast<unsigned long long>(v));
  g_calls += calls;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) o.threads = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) o.iters = std::atoi(argv[++i]);
    else if (a == "--fork") o.fork_child = true;
    else if (a == "--wait-file" && i + 1 < argc) o.wait_file = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--threads T] [--iters N] [--fork] [--wait-file PATH]\n", argv[0]);
      return 2;
    }
  }
  if (o.threads < 1 || o.iters < 1) return 2;
  int version = 0;
  unsigned long long h = ncclGetVersion(&version);
  g_calls += 1;
  if (o.fork_child) {
    pid_t pid = fork();
    if (pid == 0) {
      Options child = o;
      child.wait_file.clear();
      Worker(99, child);
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 4;
  }
  // The main thread is worker 0, so a single-threaded run makes every call from one thread.
  std::vector<unsigned long long> results(static_cast<size_t>(o.threads));
  std::vector<std::thread> threads;
  for (int t = 1; t < o.threads; ++t) {
    threads.emplace_back([&, t] { results[static_cast<size_t>(t)] = Worker(t, o); });
  }
  results[0] = Worker(0, o);
  for (auto& t : threads) t.join();
  for (unsigned long long r : results) h = Mix(h, r);
  std::printf("calls %llu checksum %016llx version %d\n", g_calls.load(), h, version);
  return 0;
}
