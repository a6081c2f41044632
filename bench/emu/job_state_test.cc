// The job-wide placement override (job_state.h, falconEmuSetPlacement) over real processes and a
// real job-state segment: every process sees a change, the fabric model charges collectives and
// send/recv by the ranks' current nodes (modelled time via ncclGroupSimulateEnd, plus a real
// collective that must wait for the slow link it was moved onto), compute faults follow the
// physical GPU, bad arguments change nothing, and without a job state nothing can be changed.
//
// Thread-safety: single-threaded test; ranks are forked processes (emu_test_util.h).
// Must never: sleep to synchronise (ranks meet in collectives; the kit has deadlines).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "emu_test_util.h"
#include "falcon_emu.h"

namespace falcon::emu {
namespace {

using testing::AllZero;
using testing::Codes;
using testing::RunOptions;
using testing::RunRanks;

// A fresh job-state name per test, removed when the test ends.
class JobStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int n = 0;
    name_ = "/falcon-emu-test-" + std::to_string(getuid()) + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    opt_.env["FALCON_EMU_JOB_STATE"] = name_;
  }
  void TearDown() override { shm_unlink(name_.c_str()); }

  std::string name_;
  RunOptions opt_;
};

// Every member of `comm` has passed this point before anyone returns.
bool Barrier(ncclComm_t comm) {
  int x = 1;
  return ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, nullptr) == ncclSuccess;
}

// Modelled microseconds of a 1 MB all-reduce on `comm` (not executed).
double SimulatedAllReduceUs(ncclComm_t comm, std::vector<float>& b) {
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  ncclGroupStart();
  ncclAllReduce(b.data(), b.data(), b.size(), ncclFloat, ncclSum, comm, nullptr);
  if (ncclGroupSimulateEnd(&info) != ncclSuccess) return -1;
  return static_cast<double>(info.estimatedTime);
}

TEST_F(JobStateTest, SetPlacementIsSeenByEveryProcessAndBadArgumentsChangeNothing) {
  opt_.env["FALCON_EMU_RANKS_PER_NODE"] = "1";
  const auto codes = RunRanks(3, [](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 3, id, rank) != ncclSuccess) return 2;
    for (int r = 0; r < 3; ++r) EMU_CHECK(falconEmuNodeOf(r) == r, "launch node of %d: %d", r, falconEmuNodeOf(r));
    EMU_CHECK(Barrier(comm), "barrier");
    if (rank == 0) {
      const int p[3] = {4, 0, 1};
      EMU_CHECK(falconEmuSetPlacement(p, 3) == 0, "set");
      const int bad[2] = {0, -1};
      EMU_CHECK(falconEmuSetPlacement(bad, 2) == -1, "negative node");
      const int huge[1] = {70000};
      EMU_CHECK(falconEmuSetPlacement(huge, 1) == -1, "node past 65535");
      EMU_CHECK(falconEmuSetPlacement(nullptr, 2) == -1, "null");
      EMU_CHECK(falconEmuSetPlacement(p, -1) == -1, "negative count");
    }
    EMU_CHECK(Barrier(comm), "barrier");
    const int want[4] = {4, 0, 1, 3};  // rank 3 is not covered: its launch node
    for (int r = 0; r < 4; ++r) {
      EMU_CHECK(falconEmuNodeOf(r) == want[r], "rank %d sees node %d for rank %d", rank, falconEmuNodeOf(r), r);
      EMU_CHECK(falconEmuLaunchNodeOf(r) == r, "launch node of %d", r);
    }
    EMU_CHECK(Barrier(comm), "barrier");
    if (rank == 2) EMU_CHECK(falconEmuSetPlacement(nullptr, 0) == 0, "clear");
    EMU_CHECK(Barrier(comm), "barrier");
    for (int r = 0; r < 3; ++r) EMU_CHECK(falconEmuNodeOf(r) == r, "after clear: rank %d at %d", r, falconEmuNodeOf(r));
    ncclCommDestroy(comm);
    return failures;
  }, opt_);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST_F(JobStateTest, TransfersAreChargedByTheCurrentNodes) {
  // Both ranks start on node 0; a 3x link fault between nodes 0 and 1; 1 GB/s between nodes.
  opt_.env["FALCON_EMU_RANKS_PER_NODE"] = "2";
  opt_.env["FALCON_EMU_INTER_GBPS"] = "1";
  opt_.env["FALCON_EMU_EPOCH_NS"] = "1";  // the job started long ago: the fault is active
  opt_.env["FALCON_EMU_FAULT_PLAN"] = R"({"faults": [{"kind": "link", "nodes": [0, 1], "factor": 3}]})";
  const auto codes = RunRanks(2, [](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    std::vector<float> b(250000, 1.0f);  // 1 MB
    const double intra_us = 2 * (2 + 0.5e6 / 100e9 * 1e6);
    const double inter_us = 2 * (10 + 0.5e6 / 1e9 * 1e6);
    double us = SimulatedAllReduceUs(comm, b);
    EMU_CHECK(std::abs(us - intra_us) < 0.5, "same node: %f us, expected %f", us, intra_us);
    // Both ranks are done with the old placement before either changes it; every rank installs
    // the same placement (idempotent), then they meet again: rank 1 -> node 1.
    EMU_CHECK(Barrier(comm), "barrier");
    const int onto_fault[2] = {0, 1};
    EMU_CHECK(falconEmuSetPlacement(onto_fault, 2) == 0, "set");
    EMU_CHECK(Barrier(comm), "barrier");
    us = SimulatedAllReduceUs(comm, b);
    EMU_CHECK(std::abs(us - 3 * inter_us) < 1.0, "across the slow link: %f us, expected %f", us, 3 * inter_us);
    // The real collective waits for the modelled time of the slow link too.
    const double t0 = testing::MonoNow();
    EMU_CHECK(ncclAllReduce(b.data(), b.data(), b.size(), ncclFloat, ncclSum, comm, nullptr) == ncclSuccess, "ar");
    const double took = testing::MonoNow() - t0;
    EMU_CHECK(took >= 3 * inter_us * 1e-6 * 0.95, "modelled time not waited: %f s", took);
    // Send/recv between the ranks is charged on the same link.
    ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
    ncclGroupStart();
    if (rank == 0) ncclSend(b.data(), b.size(), ncclFloat, 1, comm, nullptr);
    else ncclRecv(b.data(), b.size(), ncclFloat, 0, comm, nullptr);
    EMU_CHECK(ncclGroupSimulateEnd(&info) == ncclSuccess, "simulate p2p");
    const double p2p_us = 3 * (10 + 1e6 / 1e9 * 1e6);
    EMU_CHECK(std::abs(static_cast<double>(info.estimatedTime) - p2p_us) < 1.0, "p2p %f us, expected %f",
              static_cast<double>(info.estimatedTime), p2p_us);
    // Onto two spare nodes: the fault stays on the physical link 0-1, so the job is fast again.
    EMU_CHECK(Barrier(comm), "barrier");
    const int spares[2] = {2, 3};
    EMU_CHECK(falconEmuSetPlacement(spares, 2) == 0, "set spares");
    EMU_CHECK(Barrier(comm), "barrier");
    us = SimulatedAllReduceUs(comm, b);
    EMU_CHECK(std::abs(us - inter_us) < 1.0, "spares: %f us, expected %f", us, inter_us);
    EMU_CHECK(std::abs(falconEmuTransferSeconds(0, 1, 1e6) - p2p_us * 1e-6) < 1e-6, "transfer 0->1 %f",
              falconEmuTransferSeconds(0, 1, 1e6));
    EMU_CHECK(falconEmuTransferSeconds(-1, 1, 1) == -1.0, "bad node");
    ncclCommDestroy(comm);
    return failures;
  }, opt_);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST_F(JobStateTest, ComputeFaultsFollowThePhysicalGpu) {
  // 4 ranks, 2 per node: launch nodes 0 0 1 1; the GPU rank 1 was launched on is 4x slow.
  opt_.env["FALCON_EMU_RANKS_PER_NODE"] = "2";
  opt_.env["FALCON_EMU_FAULT_PLAN"] = R"({"faults": [{"kind": "compute", "ranks": [1], "factor": 4}]})";
  const auto codes = RunRanks(1, [](int, const ncclUniqueId&) {
    int failures = 0;
    EMU_CHECK(falconEmuComputeFactor(1, 10) == 4.0, "launch: rank 1 is slow");
    EMU_CHECK(falconEmuComputeFactor(0, 10) == 1.0, "launch: rank 0 is not");
    // Node 0 now holds ranks 2 and 3: rank 3 is its 2nd lowest rank, so it runs on GPU (0, 1),
    // rank 1's old GPU. Rank 1 went to spare node 2 and is healthy there.
    const int p[4] = {1, 2, 0, 0};
    EMU_CHECK(falconEmuSetPlacement(p, 4) == 0, "set");
    const double want[4] = {1, 1, 1, 4};
    for (int r = 0; r < 4; ++r) {
      EMU_CHECK(falconEmuComputeFactor(r, 10) == want[r], "rank %d: factor %f", r, falconEmuComputeFactor(r, 10));
    }
    return failures;
  }, opt_);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(JobStateNoStateTest, WithoutAJobStateNothingCanBeChanged) {
  RunOptions opt;
  opt.env["FALCON_EMU_RANKS_PER_NODE"] = "2";
  const auto codes = RunRanks(1, [](int, const ncclUniqueId&) {
    int failures = 0;
    unsetenv("FALCON_EMU_JOB_STATE");
    const int p[2] = {5, 5};
    EMU_CHECK(falconEmuSetPlacement(p, 2) == -2, "no job state");
    EMU_CHECK(falconEmuNodeOf(1) == 0 && falconEmuNodeOf(2) == 1, "launch placement");
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

}  // namespace
}  // namespace falcon::emu
