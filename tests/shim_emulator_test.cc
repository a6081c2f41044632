// The real shim over the NCCL emulator, several real processes per test (falcon-emu-run):
// results and error codes are identical with and without the shim, and every member of a
// communicator — world, split children, shrunk communicator — records the same identity.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/shm/record_json.h"
#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using daemon::SegmentReader;
using testing::ProcessResult;
using testing::TempDir;

ProcessResult RunRanks(int n, const TempDir& dir, bool with_shim) {
  std::vector<std::string> argv{testing::BinDir("bench/emu") + "/falcon-emu-run", "-n", std::to_string(n),
                                "--ranks-per-node", "2", "--job-timeout", "110", "--lib-dir", testing::EmuLibDir()};
  if (with_shim) {
    argv.push_back("--preload");
    argv.push_back(testing::PreloadValue());
  }
  argv.push_back("--");
  argv.push_back(testing::BinDir("tests") + "/falcon-test-emu-comms");
  return testing::Run(argv, {"FALCON_SHM_DIR=" + dir.path(), "FALCON_KEEP_SEGMENT=1", "FALCON_EMU_FABRIC=off"}, 120);
}

// "rank R results X" lines, sorted by rank (the launcher interleaves ranks' output).
std::vector<std::string> ResultLines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const size_t res = line.find(" results ");
    if (res == std::string::npos) continue;
    const size_t rank = line.rfind("rank ", res);
    if (rank != std::string::npos) lines.push_back(line.substr(rank));
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

class ShimEmulatorTest : public ::testing::TestWithParam<int> {};

TEST_P(ShimEmulatorTest, SameResultsWithAndWithoutShim) {
  const int n = GetParam();
  TempDir plain_dir, traced_dir;
  ProcessResult plain = RunRanks(n, plain_dir, /*with_shim=*/false);
  ProcessResult traced = RunRanks(n, traced_dir, /*with_shim=*/true);
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  ASSERT_EQ(traced.exit_code, 0) << traced.out << traced.err;
  std::vector<std::string> a = ResultLines(plain.out), b = ResultLines(traced.out);
  ASSERT_EQ(a.size(), static_cast<size_t>(n)) << plain.out;
  EXPECT_EQ(a, b);
  auto listed = daemon::ListSegments(plain_dir.path(), static_cast<uint32_t>(getuid()), false);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed.value().empty()) << "no segments without the shim";
}

TEST_P(ShimEmulatorTest, EveryMemberRecordsTheSameCommunicatorIdentity) {
  const int n = GetParam();
  TempDir dir;
  ProcessResult traced = RunRanks(n, dir, true);
  ASSERT_EQ(traced.exit_code, 0) << traced.out << traced.err;
  auto listed = daemon::ListSegments(dir.path(), static_cast<uint32_t>(getuid()), false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed.value().size(), static_cast<size_t>(n));
  // comm_id → the (rank, nranks) pairs of the members that recorded it.
  std::map<uint64_t, std::set<std::pair<int, int>>> members;
  std::map<uint64_t, uint64_t> parent_of;
  std::map<uint64_t, int> origin_of;
  for (const auto& info : listed.value()) {
    auto seg = SegmentReader::Open(info.path);
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    for (const auto& c : seg.value().Comms()) {
      members[c.entry.comm_id].insert({c.entry.rank, c.entry.nranks});
      parent_of[c.entry.comm_id] = c.entry.parent_id;
      origin_of[c.entry.comm_id] = static_cast<int>(c.entry.origin);
      EXPECT_EQ(c.entry.state, static_cast<uint32_t>(kFalconCommDestroyed));
    }
    // Records of this process on the world communicator carry dense per-comm sequence numbers.
    std::vector<FalconRecord> recs;
    daemon::ReadCursor cursor;
    seg.value().Read(&cursor, ~size_t{0}, SegmentReader::ReadMode::kFinal, &recs);
    EXPECT_GT(recs.size(), 20u);
  }
  // Expected: world (n members); parity split: 2 comms; pair split: ceil(n/2) comms; shrink: 1.
  const size_t expected = 1 + std::min(n, 2) + static_cast<size_t>((n + 1) / 2) + (n > 1 ? 1 : 0);
  EXPECT_EQ(members.size(), expected);
  for (const auto& [id, ranks] : members) {
    const int nranks = ranks.begin()->second;
    EXPECT_EQ(static_cast<int>(ranks.size()), nranks) << "comm " << daemon::HexId(id)
                                                     << ": every member recorded it with a distinct rank";
    int expect_rank = 0;
    for (const auto& [rank, size] : ranks) {
      EXPECT_EQ(size, nranks);
      EXPECT_EQ(rank, expect_rank++);
    }
    if (origin_of[id] == kFalconCommBySplit || origin_of[id] == kFalconCommByShrink) {
      EXPECT_TRUE(members.count(parent_of[id])) << "a child's parent is a recorded communicator";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShimEmulatorTest, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace falcon
