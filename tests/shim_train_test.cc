// falcon-train-emu as the shim sees it: real ranks over the NCCL emulator under the real shim,
// the records read back from the segments. The default (PyTorch + Megatron-LM) mode must issue
// no collective on the world communicator once the groups are made, split the world once per
// Megatron process group on every rank (NCCL_SPLIT_NOCOLOR where it is not a member), poll
// every communicator from a thread of its own, and still switch micro-batch plans on every rank
// at the same iteration; --world-sync (the legacy mode) shows the world all-reduce per
// iteration these checks look for.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "bench/train/process_groups.h"
#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using daemon::SegmentReader;
using testing::ProcessResult;
using testing::TempDir;

constexpr int kRanks = 8;

// What one rank's segment says.
struct RankCalls {
  int rank = -1;
  uint32_t world_slot = 0;
  std::map<int, int> world_ops;        // op -> records on the world communicator
  std::vector<FalconCommEntry> splits;  // children of the world, by split_index
  std::set<int> collective_lanes;       // lanes of the training thread's collectives
  uint64_t queries = 0;                 // ncclCommGetAsyncError and other queries: counted, not recorded
  uint64_t collective_lane_queries = 0; // of those, counted on the training thread's lanes
  int poll_records = 0;                 // query records (there must be none)
};

ProcessResult RunTrainer(const TempDir& dir, const std::vector<std::string>& args) {
  std::vector<std::string> argv{testing::BinDir("bench/emu") + "/falcon-emu-run", "-n", std::to_string(kRanks),
                                "--ranks-per-node", "4", "--job-timeout", "110", "--lib-dir", testing::EmuLibDir(),
                                "--preload", testing::PreloadValue(), "--", testing::BinDir("bench/train") +
                                "/falcon-train-emu", "--tp", "2", "--dp", "2", "--pp", "2", "--compute-ms", "2",
                                "--progress-every", "0", "--check", "--report", dir.path() + "/report-{rank}.json"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::Run(argv, {"FALCON_SHM_DIR=" + dir.path(), "FALCON_KEEP_SEGMENT=1"}, 120);
}

std::vector<RankCalls> ReadRanks(const TempDir& dir) {
  std::vector<RankCalls> out;
  auto listed = daemon::ListSegments(dir.path(), static_cast<uint32_t>(getuid()), false);
  EXPECT_TRUE(listed.ok());
  if (!listed.ok()) return out;
  for (const auto& info : listed.value()) {
    auto seg = SegmentReader::Open(info.path);
    EXPECT_TRUE(seg.ok()) << seg.status().ToString();
    if (!seg.ok()) continue;
    RankCalls rc;
    uint64_t world_id = 0;
    const std::vector<daemon::CommInfo> comms = seg.value().Comms();
    for (const auto& c : comms) {
      if (c.entry.nranks == kRanks && c.entry.parent_id == 0) {
        rc.rank = c.entry.rank;
        rc.world_slot = c.slot;
        world_id = c.entry.comm_id;
      }
    }
    for (const auto& c : comms) {
      if (world_id != 0 && c.entry.parent_id == world_id) rc.splits.push_back(c.entry);
    }
    std::sort(rc.splits.begin(), rc.splits.end(),
              [](const FalconCommEntry& a, const FalconCommEntry& b) { return a.split_index < b.split_index; });
    std::vector<FalconRecord> recs;
    daemon::ReadCursor cursor;
    seg.value().Read(&cursor, ~size_t{0}, SegmentReader::ReadMode::kFinal, &recs);
    for (const FalconRecord& r : recs) {
      if (r.comm_slot == rc.world_slot) ++rc.world_ops[r.op];
      if (r.op == kFalconOpAllReduce || r.op == kFalconOpSend) rc.collective_lanes.insert(r.lane);
      if (FalconOpIsQuery(r.op)) ++rc.poll_records;
    }
    rc.queries = seg.value().queries();
    for (int lane : rc.collective_lanes) rc.collective_lane_queries += seg.value().lane_queries(static_cast<uint32_t>(lane));
    out.push_back(std::move(rc));
  }
  return out;
}

// Records of operations that move data, on the world communicator.
int WorldTraffic(const RankCalls& rc) {
  int n = 0;
  for (const auto& [op, count] : rc.world_ops) {
    if ((op >= kFalconOpAllReduce && op <= kFalconOpRecv)) n += count;
  }
  return n;
}

nlohmann::json Report(const TempDir& dir, int rank) {
  std::ifstream in(dir.path() + "/report-" + std::to_string(rank) + ".json");
  return nlohmann::json::parse(in, nullptr, false);
}

TEST(ShimTrainTest, MegatronModeHasNoWorldCollectiveAndAgreesOnPlans) {
  TempDir dir;
  // An S2 plan present at start: every rank must switch at iteration 1, agreed without a
  // world collective (a plan without placement has no world payload).
  std::ofstream(dir.path() + "/plan.json") << R"({"version": 1, "micro_batches": [2, 6]})";
  const ProcessResult r = RunTrainer(dir, {"--iters", "6", "--plan-file", dir.path() + "/plan.json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<RankCalls> ranks = ReadRanks(dir);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  for (const RankCalls& rc : ranks) {
    ASSERT_GE(rc.rank, 0);
    EXPECT_EQ(WorldTraffic(rc), 0) << "rank " << rc.rank << " issued a collective on the world";
    EXPECT_EQ(rc.world_ops.count(kFalconOpCommInitRankConfig), 1u) << rc.rank;
  }
  for (int rank = 0; rank < kRanks; ++rank) {
    const nlohmann::json j = Report(dir, rank);
    ASSERT_FALSE(j.is_discarded()) << rank;
    ASSERT_EQ(j["plan_changes"].size(), 1u) << rank;
    EXPECT_EQ(j["plan_changes"][0]["iter"], 1) << rank;
    EXPECT_EQ(j["iterations"][1]["micro_batches"], j["coords"]["dp"] == 0 ? 2 : 6) << rank;
  }
}

TEST(ShimTrainTest, LegacyModeIssuesAWorldAllReducePerIteration) {
  TempDir dir;
  const ProcessResult r = RunTrainer(dir, {"--iters", "4", "--world-sync"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<RankCalls> ranks = ReadRanks(dir);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  for (const RankCalls& rc : ranks) {
    EXPECT_EQ(rc.world_ops.count(kFalconOpAllReduce) ? rc.world_ops.at(kFalconOpAllReduce) : 0, 4) << rc.rank;
    EXPECT_EQ(rc.queries - rc.collective_lane_queries, 0u) << "no watchdog in the legacy mode: no other thread asks";
  }
}

TEST(ShimTrainTest, EveryRankSplitsTheWorldForEveryGroupInOrder) {
  TempDir dir;
  const ProcessResult r = RunTrainer(dir, {"--iters", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const train::Shape shape{2, 2, 2};
  const std::vector<train::GroupSpec> groups = train::MegatronGroups(shape);
  for (const RankCalls& rc : ReadRanks(dir)) {
    ASSERT_GE(rc.rank, 0);
    // One split call per group on every rank, member or not.
    EXPECT_EQ(rc.world_ops.count(kFalconOpCommSplit) ? rc.world_ops.at(kFalconOpCommSplit) : 0,
              static_cast<int>(groups.size()))
        << rc.rank;
    // The communicators it got: the groups it is in, in order, with their color and size.
    std::vector<std::vector<int>> want, got;
    for (const train::GroupSpec& g : groups) {
      const int me = train::MemberIndex(g, rc.rank);
      if (me >= 0) want.push_back({g.index, static_cast<int>(g.ranks.size()), me});
    }
    for (const FalconCommEntry& e : rc.splits) got.push_back({e.color, e.nranks, e.rank});
    EXPECT_EQ(got, want) << "rank " << rc.rank;
  }
}

TEST(ShimTrainTest, WatchdogPollsEveryCommunicatorFromItsOwnThread) {
  TempDir dir;
  const ProcessResult r = RunTrainer(dir, {"--iters", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const RankCalls& rc : ReadRanks(dir)) {
    // Each round polls every communicator of the rank (world + its 11 groups, 10 off the ends);
    // polls are counted, never recorded, and the watchdog takes no lane of the training thread.
    ASSERT_FALSE(rc.collective_lanes.empty());
    EXPECT_GE(rc.queries - rc.collective_lane_queries, 2u * 10u)
        << "rank " << rc.rank << ": the polls come from a thread other than the training thread's";
    EXPECT_EQ(rc.poll_records, 0) << rc.rank;
  }
}

}  // namespace
}  // namespace falcon
