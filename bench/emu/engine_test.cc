// The emulator is as strict as NCCL where a framework could lean on a difference (engine.h,
// docs/emulator.md "Nonblocking communicators and abort"), over real processes and shared
// memory: a missing peer blocks until ncclCommAbort from another thread ends the wait (a
// collective, a grouped send/recv, a blocking init); the peers of an aborted rank fail instead of
// hanging; nonblocking init, split, group end and finalize return ncclInProgress and refuse use
// (NCCL's WARN line, ncclInvalidArgument) until ncclCommGetAsyncError reports ncclSuccess; the
// first send between two ranks completes only once the peer posted its receive. No timeout is
// configured anywhere: the strict default is what runs.
//
// Thread-safety: the gtest process only forks; inside a rank, one thread blocks in a call while
// the rank's main thread watches it through atomics and aborts.
// Must never: sleep to synchronise. A wait that must NOT end ("still blocked") waits for the
// call's completion flag with a deadline and expects the deadline.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "emu_test_util.h"

namespace falcon::emu {
namespace {

using testing::AllZero;
using testing::Codes;
using testing::MonoNow;
using testing::RunOptions;
using testing::RunRanks;

constexpr const char* kWarn = "NCCL WARN Attempt to use communicator before the previous operation returned ncclSuccess";

// A call made on its own thread, watched from the rank's main thread.
class BlockedCall {
 public:
  template <class F>
  explicit BlockedCall(F&& call)
      : thread_([this, call = std::forward<F>(call)] {
          const ncclResult_t rc = call();
          done_at_.store(MonoNow());
          rc_.store(rc);
          done_.store(true, std::memory_order_release);
        }) {}
  ~BlockedCall() { thread_.join(); }
  BlockedCall(const BlockedCall&) = delete;
  BlockedCall& operator=(const BlockedCall&) = delete;

  // True if the call returned within `seconds`.
  bool ReturnsWithin(double seconds) const {
    const double deadline = MonoNow() + seconds;
    while (MonoNow() < deadline) {
      if (done_.load(std::memory_order_acquire)) return true;
      usleep(1000);
    }
    return done_.load(std::memory_order_acquire);
  }
  ncclResult_t rc() const { return rc_.load(); }
  double done_at() const { return done_at_.load(); }

 private:
  std::atomic<bool> done_{false};
  std::atomic<ncclResult_t> rc_{ncclSuccess};
  std::atomic<double> done_at_{0};
  std::thread thread_;
};

// Polls ncclCommGetAsyncError until it is no longer ncclInProgress (or `seconds` pass).
ncclResult_t PollReady(ncclComm_t comm, double seconds = 20) {
  const double deadline = MonoNow() + seconds;
  ncclResult_t state = ncclInProgress;
  while (MonoNow() < deadline) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state != ncclInProgress) return state;
    sched_yield();
  }
  return state;
}

// A one-way go signal between ranks (a pipe created before the fork).
struct Signal {
  int fds[2] = {-1, -1};
  Signal() { (void)!pipe(fds); }
  void Give() const { (void)!write(fds[1], "x", 1); }
  void Await() const {
    char c;
    (void)!read(fds[0], &c, 1);
  }
};

// Rank 1 joins and then never calls anything until rank 0 is gone (its pipe end closes).
int IdleUntilPeerExits(const Signal& exit_signal) {
  close(exit_signal.fds[1]);
  exit_signal.Await();
  return 0;
}

TEST(EngineAbortTest, MissingPeerBlocksUntilAbortFromAnotherThread) {
  Signal rank0_gone;
  RunOptions opt;
  opt.deadline_s = 30;
  opt.after_fork = [&] { close(rank0_gone.fds[0]); close(rank0_gone.fds[1]); };
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    if (rank == 1) return IdleUntilPeerExits(rank0_gone);
    float v = 1;
    BlockedCall call([&] { return ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, comm, nullptr); });
    EMU_CHECK(!call.ReturnsWithin(0.5), "the all-reduce returned (rc=%d) although rank 1 never called it", call.rc());
    const double t0 = MonoNow();
    EMU_CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
    EMU_CHECK(MonoNow() - t0 < 0.5, "ncclCommAbort took %.3f s", MonoNow() - t0);
    EMU_CHECK(call.ReturnsWithin(1.0), "the all-reduce still blocks 1 s after the abort");
    EMU_CHECK(call.rc() == ncclInternalError, "rc=%d", call.rc());
    EMU_CHECK(std::strstr(ncclGetLastError(nullptr), "aborted") != nullptr, "%s", ncclGetLastError(nullptr));
    ncclResult_t async;
    EMU_CHECK(ncclCommGetAsyncError(comm, &async) == ncclInvalidArgument, "the handle is gone after abort");
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(EngineAbortTest, AbortWakesABlockedGroupEnd) {
  Signal rank0_gone;
  RunOptions opt;
  opt.deadline_s = 30;
  opt.after_fork = [&] { close(rank0_gone.fds[0]); close(rank0_gone.fds[1]); };
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    if (rank == 1) return IdleUntilPeerExits(rank0_gone);
    std::vector<int> out(64, 7), in(64, 0);
    BlockedCall call([&] {
      ncclGroupStart();
      ncclSend(out.data(), out.size(), ncclInt32, 1, comm, nullptr);
      ncclRecv(in.data(), in.size(), ncclInt32, 1, comm, nullptr);
      return ncclGroupEnd();
    });
    EMU_CHECK(!call.ReturnsWithin(0.5), "ncclGroupEnd returned (rc=%d) without its peer", call.rc());
    EMU_CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
    EMU_CHECK(call.ReturnsWithin(1.0), "ncclGroupEnd still blocks 1 s after the abort");
    EMU_CHECK(call.rc() == ncclInternalError, "rc=%d", call.rc());
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(EngineAbortTest, AbortWakesABlockedInitAndRemovesItsSegment) {
  RunOptions opt;
  opt.deadline_s = 30;
  const auto codes = RunRanks(1, [&](int, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm = nullptr;
    BlockedCall call([&] { return ncclCommInitRank(&comm, 2, id, 0); });  // rank 1 never comes
    ncclComm_t seen = nullptr;
    const double deadline = MonoNow() + 10;
    while (seen == nullptr && MonoNow() < deadline) {
      seen = __atomic_load_n(&comm, __ATOMIC_ACQUIRE);  // published before the init waits
      sched_yield();
    }
    EMU_CHECK(seen != nullptr, "the handle was never published");
    if (seen == nullptr) return failures;
    EMU_CHECK(!call.ReturnsWithin(0.5), "the init returned (rc=%d) with a member missing", call.rc());
    EMU_CHECK(ncclCommAbort(seen) == ncclSuccess, "abort");
    EMU_CHECK(call.ReturnsWithin(1.0), "the init still blocks 1 s after the abort");
    EMU_CHECK(call.rc() == ncclInternalError, "rc=%d", call.rc());
    EMU_CHECK(__atomic_load_n(&comm, __ATOMIC_ACQUIRE) == nullptr, "a failed init leaves *comm NULL");
    uint64_t key = 0;
    std::memcpy(&key, id.internal + 8, 8);
    char path[96];
    std::snprintf(path, sizeof path, "/dev/shm/falcon-emu-%u-%016llx", static_cast<unsigned>(getuid()),
                  static_cast<unsigned long long>(key));
    EMU_CHECK(access(path, F_OK) != 0, "segment %s left behind", path);
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// Rank 0 aborts while its own process lives on; rank 1, blocked on it in a collective on one
// communicator and a receive on another, gets ncclRemoteError (as from NCCL's proxy when the
// aborted peer closes its connections), not a hang.
TEST(EngineAbortTest, PeersOfAnAbortedRankFailInsteadOfHanging) {
  Signal rank1_done;
  RunOptions opt;
  opt.deadline_s = 30;
  opt.after_fork = [&] { close(rank1_done.fds[0]); close(rank1_done.fds[1]); };
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t world, dup;
    if (ncclCommInitRank(&world, 2, id, rank) != ncclSuccess) return 2;
    if (ncclCommSplit(world, 0, rank, &dup, nullptr) != ncclSuccess) return 3;
    if (rank == 0) {
      close(rank1_done.fds[1]);
      EMU_CHECK(ncclCommAbort(world) == ncclSuccess && ncclCommAbort(dup) == ncclSuccess, "abort");
      rank1_done.Await();  // alive until rank 1 is finished: its errors come from the aborts
      return failures;
    }
    close(rank1_done.fds[0]);
    const double t0 = MonoNow();
    float v = 1;
    const ncclResult_t rc = ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, world, nullptr);
    EMU_CHECK(rc == ncclRemoteError, "all-reduce rc=%d", rc);
    EMU_CHECK(std::strstr(ncclGetLastError(world), "aborted") != nullptr, "%s", ncclGetLastError(world));
    ncclResult_t async;
    EMU_CHECK(ncclCommGetAsyncError(world, &async) == ncclSuccess && async == ncclRemoteError, "async %d", async);
    int x = 0;
    const ncclResult_t rc2 = ncclRecv(&x, 1, ncclInt32, 0, dup, nullptr);
    EMU_CHECK(rc2 == ncclRemoteError, "recv rc=%d", rc2);
    EMU_CHECK(MonoNow() - t0 < 5, "took %.3f s", MonoNow() - t0);
    ncclCommDestroy(dup);
    ncclCommDestroy(world);
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// Sends stderr to a temporary file; Text() returns what was written since.
class StderrCapture {
 public:
  StderrCapture() {
    char tmpl[] = "/tmp/falcon-emu-stderr-XXXXXX";
    fd_ = mkstemp(tmpl);
    unlink(tmpl);
    saved_ = dup(STDERR_FILENO);
    dup2(fd_, STDERR_FILENO);
  }
  ~StderrCapture() {
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    close(fd_);
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  std::string Text() const {
    std::string s;
    char buf[4096];
    ssize_t n;
    off_t off = 0;
    while ((n = pread(fd_, buf, sizeof buf, off)) > 0) {
      s.append(buf, static_cast<size_t>(n));
      off += n;
    }
    return s;
  }

 private:
  int fd_ = -1, saved_ = -1;
};

// Every use of a communicator that is not ready fails with ncclInvalidArgument, after NCCL's
// WARN line on stderr.
int RefusesUse(ncclComm_t comm) {
  int failures = 0;
  int i = 0;
  float f = 0;
  ncclRedOp_t op;
  ncclResult_t state = ncclSuccess;
  std::vector<ncclResult_t> rc;
  std::string text;
  {
    StderrCapture capture;
    rc.push_back(ncclCommCount(comm, &i));
    rc.push_back(ncclCommUserRank(comm, &i));
    rc.push_back(ncclCommCuDevice(comm, &i));
    rc.push_back(ncclAllReduce(&f, &f, 1, ncclFloat, ncclSum, comm, nullptr));
    rc.push_back(ncclBroadcast(&f, &f, 1, ncclFloat, 0, comm, nullptr));
    rc.push_back(ncclSend(&f, 1, ncclFloat, 0, comm, nullptr));
    rc.push_back(ncclRedOpCreatePreMulSum(&op, &f, ncclFloat, ncclScalarHostImmediate, comm));
    text = capture.Text();
  }
  for (size_t k = 0; k < rc.size(); ++k) EMU_CHECK(rc[k] == ncclInvalidArgument, "call %zu rc=%d", k, rc[k]);
  size_t warns = 0;
  for (size_t at = text.find(kWarn); at != std::string::npos; at = text.find(kWarn, at + 1)) ++warns;
  EMU_CHECK(warns == rc.size(), "%zu WARN lines for %zu calls:\n%s", warns, rc.size(), text.c_str());
  EMU_CHECK(ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress, "state %d", state);
  return failures;
}

// Rank 0 goes first at every step and checks the not-ready state before letting rank 1 take
// the same step, so "not ready" is observed deterministically.
TEST(EngineNonblockingTest, InitSplitGroupAndFinalizeRunInTheBackground) {
  Signal go[4];
  RunOptions opt;
  opt.deadline_s = 40;
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto step = [&](int k) {  // rank 1 waited for go[k] before its call
      if (rank == 0) go[k].Give();
    };
    ncclComm_t world = nullptr;
    if (rank == 1) go[0].Await();
    EMU_CHECK(ncclCommInitRankConfig(&world, 2, id, rank, &config) == ncclInProgress, "init returns ncclInProgress");
    EMU_CHECK(world != nullptr, "init hands out a handle at once");
    if (rank == 0) failures += RefusesUse(world);
    step(0);
    EMU_CHECK(PollReady(world) == ncclSuccess, "init completes");
    int n = 0, r = -1;
    EMU_CHECK(ncclCommCount(world, &n) == ncclSuccess && n == 2, "count %d", n);
    EMU_CHECK(ncclCommUserRank(world, &r) == ncclSuccess && r == rank, "rank %d", r);

    // Split (collective over the parent): the child exists at once and is ready later.
    ncclComm_t child = nullptr;
    if (rank == 1) go[1].Await();
    EMU_CHECK(ncclCommSplit(world, 0, -rank, &child, &config) == ncclInProgress, "split returns ncclInProgress");
    EMU_CHECK(child != nullptr, "split hands out a handle at once");
    if (rank == 0) failures += RefusesUse(child);
    step(1);
    EMU_CHECK(PollReady(child) == ncclSuccess, "split completes");
    EMU_CHECK(PollReady(world) == ncclSuccess, "the parent is ready again");
    EMU_CHECK(ncclCommUserRank(child, &r) == ncclSuccess && r == 1 - rank, "key orders the child (rank %d)", r);

    // A group on a nonblocking communicator: the first send between the pair waits for the
    // peer's receive in the background, and the communicator is not ready meanwhile.
    std::vector<int> out(1000, 10 + rank), in(1000, -1);
    if (rank == 1) go[2].Await();
    ncclGroupStart();
    // Child ranks are reversed (key -rank): the peer's child rank equals our world rank.
    if (rank == 0) ncclSend(out.data(), out.size(), ncclInt32, rank, child, nullptr);
    else ncclRecv(in.data(), in.size(), ncclInt32, rank, child, nullptr);
    EMU_CHECK(ncclGroupEnd() == ncclInProgress, "group end returns ncclInProgress");
    if (rank == 0) failures += RefusesUse(child);
    step(2);
    EMU_CHECK(PollReady(child) == ncclSuccess, "the group completes");
    if (rank == 1) EMU_CHECK(in[999] == 10, "received %d", in[999]);

    // An ungrouped collective on a nonblocking communicator is a group of one.
    float v = 1.0f + static_cast<float>(rank);
    EMU_CHECK(ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, child, nullptr) == ncclInProgress, "all-reduce");
    EMU_CHECK(PollReady(child) == ncclSuccess && v == 3.0f, "all-reduce result %f", static_cast<double>(v));

    if (rank == 1) go[3].Await();
    EMU_CHECK(ncclCommFinalize(child) == ncclInProgress, "finalize returns ncclInProgress");
    step(3);
    EMU_CHECK(PollReady(child) == ncclSuccess, "finalize completes");
    EMU_CHECK(ncclCommDestroy(child) == ncclSuccess, "destroy child");
    EMU_CHECK(ncclCommDestroy(world) == ncclSuccess, "destroy world");
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(EngineNonblockingTest, AbortEndsABackgroundJobAndMixedGroupsAreRefused) {
  Signal rank0_gone;
  RunOptions opt;
  opt.deadline_s = 30;
  opt.after_fork = [&] { close(rank0_gone.fds[0]); close(rank0_gone.fds[1]); };
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclConfig_t blocking_config = NCCL_CONFIG_INITIALIZER;
    blocking_config.blocking = 1;
    ncclComm_t nb = nullptr, blk = nullptr;
    EMU_CHECK(ncclCommInitRankConfig(&nb, 2, id, rank, &config) == ncclInProgress, "init");
    EMU_CHECK(PollReady(nb) == ncclSuccess, "ready");
    // The split runs on the nonblocking parent; its config makes the child blocking.
    EMU_CHECK(ncclCommSplit(nb, 0, rank, &blk, &blocking_config) == ncclInProgress, "split");
    EMU_CHECK(PollReady(blk) == ncclSuccess && PollReady(nb) == ncclSuccess, "split ready");
    float f = 1;
    EMU_CHECK(ncclAllReduce(&f, &f, 1, ncclFloat, ncclSum, blk, nullptr) == ncclSuccess && f == 2.0f, "blocking child");
    if (rank == 1) return IdleUntilPeerExits(rank0_gone);
    ncclGroupStart();
    ncclAllReduce(&f, &f, 1, ncclFloat, ncclSum, nb, nullptr);
    ncclAllReduce(&f, &f, 1, ncclFloat, ncclSum, blk, nullptr);
    EMU_CHECK(ncclGroupEnd() == ncclInvalidArgument, "a group mixing blocking and nonblocking is refused");
    EMU_CHECK(ncclAllReduce(&f, &f, 1, ncclFloat, ncclSum, nb, nullptr) == ncclInProgress, "waits for rank 1");
    EMU_CHECK(PollReady(nb, 0.3) == ncclInProgress, "still in progress without rank 1");
    EMU_CHECK(ncclCommAbort(nb) == ncclSuccess, "abort of a communicator a job drives");
    EMU_CHECK(ncclCommAbort(blk) == ncclSuccess, "abort of an idle one");
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// NCCL connects a pair lazily at its first send/recv and blocks there until the peer arrives;
// the emulator's sends are synchronous, so the first send returns only after the receive was
// posted. Rank 1 posts late and stamps the moment in shared memory first.
TEST(EngineFirstConnectionTest, FirstSendReturnsOnlyAfterThePeerPostedItsReceive) {
  auto* posted_at = static_cast<std::atomic<double>*>(
      mmap(nullptr, sizeof(std::atomic<double>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(posted_at, MAP_FAILED);
  new (posted_at) std::atomic<double>(0);
  RunOptions opt;
  opt.deadline_s = 30;
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    int x = 42;
    if (rank == 0) {
      EMU_CHECK(ncclSend(&x, 1, ncclInt32, 1, comm, nullptr) == ncclSuccess, "send");
      const double returned = MonoNow();
      EMU_CHECK(posted_at->load() > 0 && returned >= posted_at->load(), "the send returned before the receive was posted");
    } else {
      const double late = MonoNow() + 0.3;  // arrive late: rank 0 must be waiting meanwhile
      while (MonoNow() < late) usleep(1000);
      posted_at->store(MonoNow());
      int y = 0;
      EMU_CHECK(ncclRecv(&y, 1, ncclInt32, 0, comm, nullptr) == ncclSuccess && y == 42, "recv %d", y);
    }
    ncclCommDestroy(comm);
    return failures;
  }, opt);
  munmap(posted_at, sizeof(std::atomic<double>));
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

}  // namespace
}  // namespace falcon::emu
