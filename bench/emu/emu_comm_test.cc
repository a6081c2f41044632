// Emulator communicator management, group semantics, error handling and deadlines, all over real
// processes and real shared memory: ring send/recv, nested and multi-communicator groups,
// InitAll in one thread, Split (incl. NOCOLOR) and Shrink, invalid arguments, mismatched calls
// (same-size datatype mismatches run; others fail only at the lenient deadline), the lenient
// deadline mode (EmuDeadlineTest: FALCON_EMU_TIMEOUT_S named; nothing else sets it, so every
// other test runs on the strict default of waiting forever), a crashed peer, hang faults, a bad
// fault plan, the modelled fabric time and ncclGroupSimulateEnd under a link fault.
//
// Thread-safety: single-threaded test; ranks are forked processes (emu_test_util.h).
// Must never: sleep to synchronise (children block on pipes or exit; the kit has deadlines).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <string>
#include <vector>

#include "emu_test_util.h"

namespace falcon::emu {
namespace {

using testing::AllZero;
using testing::Codes;
using testing::RunOptions;
using testing::RunRanks;

TEST(EmuGroupTest, RingAndNestedGroupsAndMultiComm) {
  const int n = 4;
  const auto codes = RunRanks(n, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t world, dup;
    EMU_CHECK(ncclCommInitRank(&world, n, id, rank) == ncclSuccess, "init");
    EMU_CHECK(ncclCommSplit(world, 0, rank, &dup, nullptr) == ncclSuccess, "split dup");
    std::vector<int> a(1000, rank), b(1000, -1), c(100, rank * 10), d(100, -1);
    std::vector<float> ar(33, 1.0f);
    ncclGroupStart();
    ncclGroupStart();  // nested
    ncclSend(a.data(), a.size(), ncclInt32, (rank + 1) % n, world, nullptr);
    ncclRecv(b.data(), b.size(), ncclInt32, (rank + n - 1) % n, world, nullptr);
    EMU_CHECK(ncclGroupEnd() == ncclSuccess, "inner end");
    ncclSend(c.data(), c.size(), ncclInt32, (rank + n - 1) % n, dup, nullptr);
    ncclRecv(d.data(), d.size(), ncclInt32, (rank + 1) % n, dup, nullptr);
    ncclAllReduce(ar.data(), ar.data(), ar.size(), ncclFloat, ncclSum, dup, nullptr);
    EMU_CHECK(ncclGroupEnd() == ncclSuccess, "outer end");
    EMU_CHECK(b[999] == (rank + n - 1) % n, "ring got %d", b[999]);
    EMU_CHECK(d[0] == ((rank + 1) % n) * 10, "reverse ring got %d", d[0]);
    EMU_CHECK(ar[32] == static_cast<float>(n), "allreduce in group");
    EMU_CHECK(ncclGroupEnd() == ncclInvalidUsage, "unbalanced group end");
    ncclCommDestroy(dup);
    ncclCommDestroy(world);
    return failures;
  });
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(EmuGroupTest, InitAllRanksInOneThread) {
  const auto codes = RunRanks(1, [](int, const ncclUniqueId&) {
    int failures = 0;
    const int n = 3;
    ncclComm_t comms[n];
    EMU_CHECK(ncclCommInitAll(comms, n, nullptr) == ncclSuccess, "initall");
    std::vector<std::vector<double>> bufs(n, std::vector<double>(5000));
    for (int r = 0; r < n; ++r) std::fill(bufs[r].begin(), bufs[r].end(), r + 1.0);
    ncclGroupStart();
    for (int r = 0; r < n; ++r) ncclAllReduce(bufs[r].data(), bufs[r].data(), 5000, ncclDouble, ncclSum, comms[r], nullptr);
    EMU_CHECK(ncclGroupEnd() == ncclSuccess, "group");
    for (int r = 0; r < n; ++r) EMU_CHECK(bufs[r][4999] == 6.0, "rank %d", r);
    // Split of all three ranks from one thread, inside a group.
    ncclComm_t sub[n];
    ncclGroupStart();
    for (int r = 0; r < n; ++r) ncclCommSplit(comms[r], r == 1 ? NCCL_SPLIT_NOCOLOR : 0, -r, &sub[r], nullptr);
    EMU_CHECK(ncclGroupEnd() == ncclSuccess, "split group");
    EMU_CHECK(sub[1] == nullptr, "nocolor");
    int cnt = 0, ur = -1, dev = -1;
    EMU_CHECK(ncclCommCount(sub[0], &cnt) == ncclSuccess && cnt == 2, "count %d", cnt);
    EMU_CHECK(ncclCommUserRank(sub[0], &ur) == ncclSuccess && ur == 1, "key orders ranks (got %d)", ur);
    EMU_CHECK(ncclCommCuDevice(comms[2], &dev) == ncclSuccess && dev == 2, "device %d", dev);
    for (int r : {0, 2}) ncclCommDestroy(sub[r]);
    for (int r = 0; r < n; ++r) EMU_CHECK(ncclCommDestroy(comms[r]) == ncclSuccess, "destroy");
    return failures;
  });
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(EmuCommTest, SplitAndShrink) {
  const int n = 5;
  const auto codes = RunRanks(n, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t world, half = nullptr, shrunk = nullptr;
    EMU_CHECK(ncclCommInitRank(&world, n, id, rank) == ncclSuccess, "init");
    EMU_CHECK(ncclCommSplit(world, rank == 4 ? NCCL_SPLIT_NOCOLOR : rank % 2, rank, &half, nullptr) == ncclSuccess, "split");
    if (rank == 4) {
      EMU_CHECK(half == nullptr, "nocolor gives NULL");
    } else {
      int cnt = 0, ur = -1;
      ncclCommCount(half, &cnt);
      ncclCommUserRank(half, &ur);
      EMU_CHECK(cnt == 2 && ur == rank / 2, "split geometry cnt=%d ur=%d", cnt, ur);
      int v = rank;
      EMU_CHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, half, nullptr) == ncclSuccess, "ar on split");
      EMU_CHECK(v == (rank % 2 == 0 ? 0 + 2 : 1 + 3), "split sum %d", v);
      ncclCommDestroy(half);
    }
    // Shrink away rank 2: only the survivors call it.
    if (rank != 2) {
      int excl[1] = {2};
      EMU_CHECK(ncclCommShrink(world, excl, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT) == ncclSuccess, "shrink");
      int cnt = 0, ur = -1;
      ncclCommCount(shrunk, &cnt);
      ncclCommUserRank(shrunk, &ur);
      EMU_CHECK(cnt == 4 && ur == (rank < 2 ? rank : rank - 1), "shrink geometry cnt=%d ur=%d", cnt, ur);
      int v = 1;
      EMU_CHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, shrunk, nullptr) == ncclSuccess && v == 4, "ar on shrunk");
      ncclCommDestroy(shrunk);
    } else {
      int self[1] = {2};
      EMU_CHECK(ncclCommShrink(world, self, 1, &shrunk, nullptr, 0) == ncclInvalidArgument, "excluded rank calling");
    }
    ncclCommDestroy(world);
    return failures;
  });
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(EmuCommTest, InvalidArgumentsReturnErrorsWithText) {
  const auto codes = RunRanks(1, [](int, const ncclUniqueId& id) {
    int failures = 0;
    int x = 0;
    EMU_CHECK(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, nullptr, nullptr) == ncclInvalidArgument, "null comm");
    EMU_CHECK(std::strstr(ncclGetLastError(nullptr), "invalid communicator") != nullptr, "%s", ncclGetLastError(nullptr));
    ncclComm_t comm;
    EMU_CHECK(ncclCommInitRank(&comm, 1, id, 3) == ncclInvalidArgument, "bad rank");
    EMU_CHECK(ncclCommInitRank(nullptr, 1, id, 0) == ncclInvalidArgument, "null out");
    ncclUniqueId junk{};
    EMU_CHECK(ncclCommInitRank(&comm, 1, junk, 0) == ncclInvalidArgument, "junk id");
    EMU_CHECK(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess, "init");
    EMU_CHECK(ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(12), ncclSum, comm, nullptr) == ncclInvalidArgument, "dtype");
    EMU_CHECK(std::strstr(ncclGetLastError(comm), "invalid datatype") != nullptr, "%s", ncclGetLastError(comm));
    EMU_CHECK(ncclAllReduce(&x, &x, 1, ncclInt32, static_cast<ncclRedOp_t>(77), comm, nullptr) == ncclInvalidArgument, "op");
    EMU_CHECK(ncclBroadcast(&x, &x, 1, ncclInt32, 5, comm, nullptr) == ncclInvalidArgument, "root");
    EMU_CHECK(ncclSend(&x, 1, ncclInt32, 1, comm, nullptr) == ncclInvalidArgument, "peer");
    EMU_CHECK(ncclAllReduce(nullptr, nullptr, 4, ncclInt32, ncclSum, comm, nullptr) == ncclInvalidArgument, "null buf");
    EMU_CHECK(ncclRedOpDestroy(ncclSum, comm) == ncclInvalidArgument, "destroy builtin");
    ncclSimInfo_t bad{};
    EMU_CHECK(ncclGroupSimulateEnd(&bad) == ncclInvalidArgument, "siminfo");
    EMU_CHECK(ncclCommRevoke(comm, 1) == ncclInvalidArgument, "revoke flags");
    int v = 0;
    EMU_CHECK(ncclGetVersion(&v) == ncclSuccess && v == 22809, "version %d", v);
    EMU_CHECK(std::strcmp(ncclGetErrorString(ncclInvalidUsage), "invalid usage (run with NCCL_DEBUG=WARN for details)") == 0, "str");
    void* h = nullptr;
    EMU_CHECK(ncclCommRegister(comm, &x, 4, &h) == ncclSuccess && ncclCommDeregister(comm, h) == ncclSuccess, "reg");
    EMU_CHECK(ncclCommDeregister(comm, h) == ncclInvalidArgument, "double dereg");
    ncclWindow_t w;
    EMU_CHECK(ncclCommWindowRegister(comm, &x, 4, &w, 0) == ncclSuccess && ncclCommWindowDeregister(comm, w) == ncclSuccess, "win");
    void* mem = nullptr;
    EMU_CHECK(ncclMemAlloc(&mem, 100) == ncclSuccess && mem && ncclMemFree(mem) == ncclSuccess, "mem");
    ncclResult_t async = ncclInternalError;
    EMU_CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess, "async");
    EMU_CHECK(ncclCommFinalize(comm) == ncclSuccess, "finalize");
    EMU_CHECK(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, nullptr) == ncclInvalidUsage, "after finalize");
    EMU_CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    EMU_CHECK(ncclCommDestroy(comm) == ncclInvalidArgument, "double destroy");
    return failures;
  });
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// NCCL compares nothing: a datatype or reduction mismatch at equal byte size runs (each rank
// computes with its own arguments, over several rounds, within its own buffers).
TEST(EmuCommTest, SameSizeDatatypeOrReductionMismatchCompletes) {
  RunOptions opt;
  opt.env["FALCON_EMU_CHUNK_BYTES"] = "4096";  // several rounds, a block size no datatype divides evenly
  const auto codes = RunRanks(3, [](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 3, id, rank) != ncclSuccess) return 2;
    // 4000 bytes per block: ncclFloat x 1000 on ranks 0 and 2, ncclFloat16 x 2000 on rank 1.
    const size_t floats = 1000;
    std::vector<float> send(3 * floats + 1, 1.0f), recv(floats + 1, 0.0f);
    const float guard = -7.0f;
    send.back() = guard;
    recv.back() = guard;
    const ncclResult_t rs = rank == 1 ? ncclReduceScatter(send.data(), recv.data(), 2 * floats, ncclFloat16, ncclMax, comm, nullptr)
                                      : ncclReduceScatter(send.data(), recv.data(), floats, ncclFloat, ncclSum, comm, nullptr);
    EMU_CHECK(rs == ncclSuccess, "reduce-scatter rc=%d %s", rs, ncclGetLastError(comm));
    EMU_CHECK(recv.back() == guard, "wrote past the receive buffer");
    std::vector<int32_t> x(64, 1);
    const ncclResult_t ar = ncclAllReduce(x.data(), x.data(), x.size(), rank == 2 ? ncclInt32 : ncclFloat, ncclSum, comm, nullptr);
    EMU_CHECK(ar == ncclSuccess, "all-reduce rc=%d %s", ar, ncclGetLastError(comm));
    ncclResult_t async;
    ncclCommGetAsyncError(comm, &async);
    EMU_CHECK(async == ncclSuccess, "async %d", async);
    ncclCommDestroy(comm);
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// A count mismatch never completes (strict mode: DeviceTest.MismatchedCallsNeverCompleteUntilAbort);
// in the lenient mode every member fails at the deadline with a message naming both signatures.
TEST(EmuDeadlineTest, CountMismatchFailsAtTheDeadlineNamingBothCalls) {
  RunOptions opt;
  opt.env["FALCON_EMU_TIMEOUT_S"] = "0.5";
  const double t0 = testing::MonoNow();
  const auto codes = RunRanks(2, [](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    std::vector<float> b(100, 1.0f);
    const double start = testing::MonoNow();
    const ncclResult_t rc = ncclAllReduce(b.data(), b.data(), rank == 0 ? 10 : 20, ncclFloat, ncclSum, comm, nullptr);
    EMU_CHECK(testing::MonoNow() - start >= 0.45, "failed before the deadline");
    EMU_CHECK(rc == ncclInvalidUsage, "rc=%d", rc);
    const char* msg = ncclGetLastError(comm);
    EMU_CHECK(std::strstr(msg, "call mismatch") && std::strstr(msg, "count=10") && std::strstr(msg, "count=20"), "%s", msg);
    ncclResult_t async;
    ncclCommGetAsyncError(comm, &async);
    EMU_CHECK(async == ncclInvalidUsage, "async %d", async);
    ncclCommDestroy(comm);
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
  EXPECT_LT(testing::MonoNow() - t0, 10.0);
}

TEST(EmuDeadlineTest, P2pSizeMismatchFailsAtTheDeadline) {
  RunOptions opt;
  opt.env["FALCON_EMU_TIMEOUT_S"] = "0.5";
  const auto codes = RunRanks(2, [](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    std::vector<float> b(21, 1.0f);
    b.back() = -7.0f;
    const ncclResult_t rc = rank == 0 ? ncclSend(b.data(), 10, ncclFloat, 1, comm, nullptr)
                                      : ncclRecv(b.data(), 20, ncclFloat, 0, comm, nullptr);
    EMU_CHECK(rc != ncclSuccess, "a mismatched %s completed", rank == 0 ? "send" : "receive");
    if (rank == 1) {
      EMU_CHECK(rc == ncclInvalidUsage, "rc=%d", rc);
      EMU_CHECK(std::strstr(ncclGetLastError(comm), "size mismatch") != nullptr, "%s", ncclGetLastError(comm));
      EMU_CHECK(b.back() == -7.0f, "wrote past the receive buffer");
    }
    ncclCommDestroy(comm);
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// Rank 1 joins but never calls the all-reduce; it waits on a pipe that closes when rank 0 exits.
TEST(EmuDeadlineTest, PeerThatNeverArrivesTimesOut) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  RunOptions opt;
  opt.env["FALCON_EMU_TIMEOUT_S"] = "1";
  opt.after_fork = [&] { close(fds[0]); close(fds[1]); };
  const double t0 = testing::MonoNow();
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    if (rank == 1) {
      close(fds[1]);
      char c;
      while (read(fds[0], &c, 1) > 0) {
      }
      return 0;
    }
    close(fds[0]);
    float v = 1;
    const ncclResult_t rc = ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, comm, nullptr);
    EMU_CHECK(rc == ncclRemoteError, "rc=%d", rc);
    const char* msg = ncclGetLastError(comm);
    EMU_CHECK(std::strstr(msg, "ncclAllReduce timed out") && std::strstr(msg, "ranks 1 ") && std::strstr(msg, "seq 0"), "%s", msg);
    ncclResult_t async;
    ncclCommGetAsyncError(comm, &async);
    EMU_CHECK(async == ncclRemoteError, "async %d", async);
    EMU_CHECK(ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, comm, nullptr) == ncclRemoteError, "sticky");
    ncclCommDestroy(comm);
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
  EXPECT_LT(testing::MonoNow() - t0, 10.0);
}

TEST(EmuDeadlineTest, InitTimesOutWhenARankIsMissingAndLeavesNoSegment) {
  RunOptions opt;
  opt.env["FALCON_EMU_TIMEOUT_S"] = "0.5";
  const auto codes = RunRanks(1, [](int, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    EMU_CHECK(ncclCommInitRank(&comm, 3, id, 0) == ncclRemoteError, "init timeout");
    EMU_CHECK(comm == nullptr, "comm nulled");
    EMU_CHECK(std::strstr(ncclGetLastError(nullptr), "ranks 1,2 did not arrive") != nullptr, "%s", ncclGetLastError(nullptr));
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// No deadline is configured: crash detection does not depend on the lenient mode.
TEST(EmuCommTest, CrashedPeerIsReportedQuickly) {
  RunOptions opt;
  const double t0 = testing::MonoNow();
  const auto codes = RunRanks(2, [](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    if (rank == 1) _exit(0);  // "crash": leaves without destroying
    float v = 1;
    const ncclResult_t rc = ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, comm, nullptr);
    EMU_CHECK(rc == ncclRemoteError, "rc=%d", rc);
    EMU_CHECK(std::strstr(ncclGetLastError(comm), "process exited") != nullptr, "%s", ncclGetLastError(comm));
    ncclCommDestroy(comm);
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
  EXPECT_LT(testing::MonoNow() - t0, 10.0);
}

std::string ShmPath(const ncclUniqueId& id) {
  uint64_t key = 0;
  std::memcpy(&key, id.internal + 8, 8);
  char buf[96];
  std::snprintf(buf, sizeof buf, "/dev/shm/falcon-emu-%u-%016llx", static_cast<unsigned>(getuid()),
                static_cast<unsigned long long>(key));
  return buf;
}

bool WaitForPath(const std::string& path, bool present, double timeout_s) {
  const double deadline = testing::MonoNow() + timeout_s;
  while (testing::MonoNow() < deadline) {
    if ((access(path.c_str(), F_OK) == 0) == present) return true;
    usleep(1000);
  }
  return false;
}

TEST(EmuCommTest, StaleSegmentOfDeadCreatorIsReplacedAndNothingLeaks) {
  ncclUniqueId shared{};
  ASSERT_EQ(ncclGetUniqueId(&shared), ncclSuccess);
  const std::string path = ShmPath(shared);
  // A "dead job": creates the segment, then is SIGKILLed in the middle of its rendezvous.
  const pid_t dead = fork();
  if (dead == 0) {
    ncclComm_t c;
    (void)ncclCommInitRank(&c, 2, shared, 0);
    _exit(0);
  }
  ASSERT_TRUE(WaitForPath(path, true, 10));
  kill(dead, SIGKILL);
  waitpid(dead, nullptr, 0);
  ASSERT_EQ(access(path.c_str(), F_OK), 0) << "the dead job's segment should still be there";
  RunOptions opt;
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId&) {
    int failures = 0;
    ncclComm_t comm;
    EMU_CHECK(ncclCommInitRank(&comm, 2, shared, rank) == ncclSuccess, "init over stale segment");
    int v = 1;
    EMU_CHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, nullptr) == ncclSuccess && v == 2, "ar");
    ncclCommDestroy(comm);
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "segment name leaked: " << path;
}

TEST(EmuFaultTest, BadFaultPlanFailsFirstInit) {
  RunOptions opt;
  opt.env["FALCON_EMU_FAULT_PLAN"] = R"({"faults": [{"kind": "link", "nodes": [1, 1], "factor": 2}]})";
  const auto codes = RunRanks(1, [](int, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    EMU_CHECK(ncclCommInitRank(&comm, 1, id, 0) == ncclInvalidArgument, "bad plan");
    EMU_CHECK(std::strstr(ncclGetLastError(nullptr), "exactly two distinct") != nullptr, "%s", ncclGetLastError(nullptr));
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(EmuFaultTest, FiniteHangDelaysTheRankAndForeverHangHitsTheDeadline) {
  RunOptions opt;
  opt.env["FALCON_EMU_TIMEOUT_S"] = "1";
  opt.env["FALCON_EMU_FAULT_PLAN"] = R"({"faults": [{"kind": "hang", "ranks": [1], "start_s": 0, "duration_s": 0.3},
                                        {"kind": "hang", "ranks": [2], "start_s": 0}]})";
  const auto codes = RunRanks(3, [](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 3, id, rank) != ncclSuccess) return 2;
    ncclComm_t pair;
    // Ranks 0 and 1 form a pair; rank 2 hangs forever in its first call.
    ncclResult_t rc = ncclCommSplit(comm, rank == 2 ? NCCL_SPLIT_NOCOLOR : 0, rank, &pair, nullptr);
    if (rank == 2) {
      EMU_CHECK(rc == ncclSystemError, "forever hang rc=%d", rc);
      return failures;
    }
    EMU_CHECK(rc == ncclRemoteError, "peers of the hung rank time out (rc=%d)", rc);
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(EmuFabricTest, ModelledTimeAndSimulateEndUnderLinkFault) {
  RunOptions opt;
  // 2 ranks on 2 nodes, slow inter-node link: 1 MB all-reduce = 2*(10us + 0.5MB/1GB/s) ~ 1.02 ms.
  opt.env["FALCON_EMU_RANKS_PER_NODE"] = "1";
  opt.env["FALCON_EMU_INTER_GBPS"] = "1";
  opt.env["FALCON_EMU_EPOCH_NS"] = "1";  // job started long ago: the fault below is active
  opt.env["FALCON_EMU_FAULT_PLAN"] = R"({"faults": [{"kind": "link", "nodes": [0, 1], "factor": 3}]})";
  const auto codes = RunRanks(2, [](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    std::vector<float> b(250000, 1.0f);
    const double t0 = testing::MonoNow();
    EMU_CHECK(ncclAllReduce(b.data(), b.data(), b.size(), ncclFloat, ncclSum, comm, nullptr) == ncclSuccess, "ar");
    const double took = testing::MonoNow() - t0;
    EMU_CHECK(took >= 3 * 1.02e-3 * 0.95, "modelled time not waited: %f s", took);
    ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
    ncclGroupStart();
    ncclAllReduce(b.data(), b.data(), b.size(), ncclFloat, ncclSum, comm, nullptr);
    EMU_CHECK(ncclGroupSimulateEnd(&info) == ncclSuccess, "simulate");
    const double expect_us = 3 * 2 * (10 + 0.5e6 / 1e9 * 1e6);
    EMU_CHECK(std::abs(static_cast<double>(info.estimatedTime) - expect_us) < 1.0, "estimated %f us, expected %f", static_cast<double>(info.estimatedTime), expect_us);
    // The simulated group did not execute: the next real collective still matches across ranks.
    EMU_CHECK(ncclAllReduce(b.data(), b.data(), 1, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess, "after sim");
    ncclCommDestroy(comm);
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

}  // namespace
}  // namespace falcon::emu
