// falcon-test-ordering: a multi-rank NCCL program for the shim's ordering and identity tests.
// Run one process per rank under falcon-emu-run. It makes the calls whose comm_seq must come
// out alike on every member of a communicator, while other threads and unusual creation paths
// try to make them differ:
//   --iters N          all-reduces on the world communicator (default 200), then a split by
//                      rank parity and N / 4 all-reduces and one grouped send/recv on the child
//   --watchdog         a second thread polls ncclCommGetAsyncError, ncclCommCount,
//                      ncclCommUserRank and ncclCommCuDevice on every communicator the whole
//                      time, every 0.3 ms on even ranks and 1.7 ms on odd ones, as PyTorch's
//                      watchdog polls async errors; the main thread lets at least one poll
//                      through every 10 all-reduces
//   --hidden-world     the world communicator is made through pncclCommInitRank, which the
//                      shim does not see; it is then split twice with the same color
//   --wait-file PATH   after creating its communicators, wait (up to 60 s) until PATH exists
//                      before the first collective (lets a test change the shim's mode)
//   --nonblocking      every communicator is nonblocking (ncclConfig_t.blocking = 0): the
//                      program polls ncclCommGetAsyncError until ready after init, split and
//                      every call that returns ncclInProgress, as NCCL requires
//   --reuse            first makes, uses and destroys a communicator of its own, then makes
//                      the world communicator (malloc usually hands out the same address) and
//                      prints "reuse same" or "reuse different"
// Prints "rank R ok polls P" and exits 0, or says what failed and exits non-zero.
#include <nccl.h>
#include <sys/stat.h>
#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/emu/bootstrap.h"

namespace {

struct Options {
  int iters = 200;
  bool watchdog = false;
  bool hidden_world = false;
  bool reuse = false;
  bool nonblocking = false;
  std::string wait_file;
};

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) o->iters = std::atoi(argv[++i]);
    else if (a == "--watchdog") o->watchdog = true;
    else if (a == "--hidden-world") o->hidden_world = true;
    else if (a == "--reuse") o->reuse = true;
    else if (a == "--nonblocking") o->nonblocking = true;
    else if (a == "--wait-file" && i + 1 < argc) o->wait_file = argv[++i];
    else return false;
  }
  return o->iters > 0;
}

void SleepNs(long ns) {
  timespec ts{ns / 1000000000L, ns % 1000000000L};
  nanosleep(&ts, nullptr);
}

bool WaitForFile(const std::string& path) {
  for (int i = 0; i < 6000; ++i) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) return true;
    SleepNs(10 * 1000 * 1000);
  }
  return false;
}

// A call's result once the communicator is done with it: ncclInProgress (nonblocking) is polled
// through ncclCommGetAsyncError until it is not, with a 60 s bound.
ncclResult_t Settle(ncclResult_t r, ncclComm_t comm) {
  for (int i = 0; r == ncclInProgress && comm != nullptr && i < 600000; ++i) {
    ncclResult_t async = ncclInProgress;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &async);
    if (q != ncclSuccess) return q;
    r = async;
    if (r == ncclInProgress) SleepNs(100 * 1000);
  }
  return r;
}

#define CHECK_ON(call, comm)                                                      \
  do {                                                                            \
    ncclResult_t r_ = (call);  /* first: it may set `comm` */                     \
    r_ = Settle(r_, (comm));                                                      \
    if (r_ != ncclSuccess) {                                                      \
      std::fprintf(stderr, "rank %d: %s failed: %d\n", env.rank, #call, static_cast<int>(r_)); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)
#define CHECK_NCCL(call) CHECK_ON(call, nullptr)

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    std::fprintf(stderr, "usage: falcon-test-ordering [--iters N] [--watchdog] [--hidden-world] [--reuse] [--nonblocking] [--wait-file PATH]\n");
    return 2;
  }
  falcon::emu::JobEnv env = falcon::emu::ReadJobEnv();
  ncclUniqueId id;
  std::string error;
  if (falcon::emu::BootstrapUniqueId(env.rank, &id, {}, &error) != ncclSuccess) {
    std::fprintf(stderr, "bootstrap: %s\n", error.c_str());
    return 2;
  }
  const void* first_address = nullptr;
  if (o.reuse) {  // a one-rank communicator of our own, used and destroyed on this thread
    ncclUniqueId own;
    ncclComm_t first = nullptr;
    float x = 1;
    CHECK_NCCL(ncclGetUniqueId(&own));
    CHECK_NCCL(ncclCommInitRank(&first, 1, own, 0));
    CHECK_NCCL(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, first, nullptr));
    CHECK_NCCL(ncclCommDestroy(first));
    first_address = first;
  }
  ncclComm_t world = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclConfig_t* cfg = o.nonblocking ? &config : nullptr;
  if (o.hidden_world) CHECK_NCCL(pncclCommInitRank(&world, env.world_size, id, env.rank));
  else if (o.nonblocking) CHECK_ON(ncclCommInitRankConfig(&world, env.world_size, id, env.rank, cfg), world);
  else CHECK_NCCL(ncclCommInitRank(&world, env.world_size, id, env.rank));

  ncclComm_t child = nullptr, twin = nullptr;
  CHECK_ON(ncclCommSplit(world, env.rank % 2, env.rank, &child, cfg), child);
  if (o.hidden_world) CHECK_ON(ncclCommSplit(world, env.rank % 2, env.rank, &twin, cfg), twin);
  if (o.reuse) std::printf("rank %d reuse %s\n", env.rank, first_address == world ? "same" : "different");

  std::atomic<bool> stop{false};
  std::atomic<long> polls{0};
  std::thread watchdog;
  if (o.watchdog) {
    const long period_ns = env.rank % 2 == 0 ? 300 * 1000 : 1700 * 1000;
    std::vector<ncclComm_t> comms{world, child};
    if (twin != nullptr) comms.push_back(twin);
    // Queries on a nonblocking communicator with work in flight are refused (NCCL warns): there
    // the watchdog polls async errors only, as PyTorch's does.
    const bool queries = !o.nonblocking;
    watchdog = std::thread([&stop, &polls, comms, period_ns, queries] {
      while (!stop.load(std::memory_order_relaxed)) {
        for (ncclComm_t c : comms) {
          ncclResult_t async = ncclSuccess;
          int n = 0, r = 0, dev = 0;
          (void)ncclCommGetAsyncError(c, &async);
          if (queries) {
            (void)ncclCommCount(c, &n);
            (void)ncclCommUserRank(c, &r);
            (void)ncclCommCuDevice(c, &dev);
          }
          polls.fetch_add(1, std::memory_order_relaxed);
        }
        SleepNs(period_ns);
      }
    });
  }
  if (!o.wait_file.empty() && !WaitForFile(o.wait_file)) {
    std::fprintf(stderr, "rank %d: %s never appeared\n", env.rank, o.wait_file.c_str());
    return 3;
  }

  std::vector<float> buf(256, static_cast<float>(env.rank + 1));
  for (int i = 0; i < o.iters; ++i) {
    CHECK_ON(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, world, nullptr), world);
    if (o.watchdog && i % 10 == 9) {  // make sure polls land between the collectives
      const long seen = polls.load();
      for (int w = 0; w < 1000 && polls.load() == seen; ++w) SleepNs(1000 * 1000);
    }
  }
  int child_size = 0, child_rank = 0;
  CHECK_NCCL(ncclCommCount(child, &child_size));
  CHECK_NCCL(ncclCommUserRank(child, &child_rank));
  std::vector<float> out(64);
  for (ncclComm_t c : {child, twin}) {
    if (c == nullptr) continue;
    for (int i = 0; i < o.iters / 4; ++i) {
      CHECK_ON(ncclAllReduce(buf.data(), buf.data(), 64, ncclFloat, ncclSum, c, nullptr), c);
    }
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclSend(buf.data(), 64, ncclFloat, (child_rank + 1) % child_size, c, nullptr));
    CHECK_NCCL(ncclRecv(out.data(), 64, ncclFloat, (child_rank + child_size - 1) % child_size, c, nullptr));
    CHECK_ON(ncclGroupEnd(), c);
  }
  stop.store(true);
  if (watchdog.joinable()) watchdog.join();
  for (ncclComm_t c : {twin, child, world}) {
    if (c != nullptr) CHECK_NCCL(ncclCommDestroy(c));
  }
  std::printf("rank %d ok polls %ld\n", env.rank, polls.load());
  return 0;
}
