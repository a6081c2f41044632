// The shim's per-communicator ordering and identity under what real jobs do: a watchdog thread
// polling every communicator while the training thread issues collectives (PyTorch's
// ProcessGroupNCCL watchdog), communicators made while recording was off, a parent the shim
// never saw created, and a communicator re-created at a freed one's address. Real processes
// over the NCCL emulator (falcon-emu-run), the real shim, the segments read back.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
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

std::vector<std::string> RankArgv(int n, const std::vector<std::string>& prog_args) {
  std::vector<std::string> argv{testing::BinDir("bench/emu") + "/falcon-emu-run", "-n", std::to_string(n),
                                "--ranks-per-node", "2", "--job-timeout", "170", "--lib-dir", testing::EmuLibDir(),
                                "--preload", testing::PreloadValue(), "--",
                                testing::BinDir("tests") + "/falcon-test-ordering"};
  argv.insert(argv.end(), prog_args.begin(), prog_args.end());
  return argv;
}

std::vector<std::string> Env(const TempDir& dir, std::vector<std::string> extra = {}) {
  extra.push_back("FALCON_SHM_DIR=" + dir.path());
  extra.push_back("FALCON_KEEP_SEGMENT=1");
  extra.push_back("FALCON_EMU_FABRIC=off");
  return extra;
}

// One member's view of one communicator: its entry and its ordered calls by comm_seq.
struct Member {
  FalconCommEntry entry{};
  std::vector<std::tuple<uint64_t, int, uint64_t>> ordered;  // (comm_seq, op, count)
  size_t unordered = 0;                                       // records with comm_seq ~0
};

// Queries (FalconOpIsQuery) counted in every segment of `dir`: never recorded, only counted.
uint64_t QueriesIn(const TempDir& dir) {
  uint64_t n = 0;
  auto listed = daemon::ListSegments(dir.path(), static_cast<uint32_t>(getuid()), false);
  EXPECT_TRUE(listed.ok());
  if (!listed.ok()) return 0;
  for (const auto& info : listed.value()) {
    auto seg = SegmentReader::Open(info.path);
    if (seg.ok()) n += seg.value().queries();
  }
  return n;
}

// comm_id → every member's view, from every segment in `dir`.
std::map<uint64_t, std::vector<Member>> ReadMembers(const TempDir& dir) {
  std::map<uint64_t, std::vector<Member>> out;
  auto listed = daemon::ListSegments(dir.path(), static_cast<uint32_t>(getuid()), false);
  EXPECT_TRUE(listed.ok());
  if (!listed.ok()) return out;
  for (const auto& info : listed.value()) {
    auto seg = SegmentReader::Open(info.path);
    EXPECT_TRUE(seg.ok()) << seg.status().ToString();
    if (!seg.ok()) continue;
    std::map<uint32_t, Member> by_slot;
    for (const auto& c : seg.value().Comms()) by_slot[c.slot].entry = c.entry;
    std::vector<FalconRecord> recs;
    daemon::ReadCursor cursor;
    seg.value().Read(&cursor, ~size_t{0}, SegmentReader::ReadMode::kFinal, &recs);
    for (const FalconRecord& r : recs) {
      if (r.comm_slot == FALCON_NO_COMM || r.op >= kFalconOpGpuTiming) continue;
      Member& m = by_slot[r.comm_slot];
      if (FalconOpIsOrdered(r.op)) {
        EXPECT_NE(r.comm_seq, ~uint64_t{0}) << "ordered op " << int(r.op) << " without a comm_seq";
        // Split's count is the rank's own key: only collectives' counts must agree.
        m.ordered.emplace_back(r.comm_seq, r.op, r.op <= kFalconOpRecv ? r.count : 0);
      } else {
        EXPECT_EQ(r.comm_seq, ~uint64_t{0}) << "op " << int(r.op) << " is not ordered but took a comm_seq";
        ++m.unordered;
      }
    }
    for (auto& [slot, m] : by_slot) {
      std::sort(m.ordered.begin(), m.ordered.end());
      out[m.entry.comm_id].push_back(m);
    }
  }
  return out;
}

// Every member of every communicator numbered the same ordered calls alike, densely.
void ExpectAlikeOnEveryMember(const std::map<uint64_t, std::vector<Member>>& comms) {
  for (const auto& [id, members] : comms) {
    SCOPED_TRACE("comm " + daemon::HexId(id));
    ASSERT_FALSE(members.empty());
    EXPECT_EQ(static_cast<int>(members.size()), members[0].entry.nranks) << "every member recorded it";
    const auto& first = members[0].ordered;
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ(std::get<0>(first[i]), std::get<0>(first[0]) + i) << "comm_seq dense";
    }
    for (const Member& m : members) {
      EXPECT_EQ(m.ordered, first) << "rank " << m.entry.rank << " numbered its ordered calls differently";
    }
  }
}

class ShimOrderingTest : public ::testing::TestWithParam<int> {};

TEST_P(ShimOrderingTest, AWatchdogPollingEveryCommunicatorNeverShiftsSequenceNumbers) {
  const int n = GetParam();
  TempDir dir;
  ProcessResult r = testing::Run(RankArgv(n, {"--watchdog", "--iters", "200"}), Env(dir), 180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto comms = ReadMembers(dir);
  ASSERT_EQ(comms.size(), 1u + std::min(n, 2)) << "world and the parity children";
  size_t world_calls = 0;
  for (const auto& [id, members] : comms) {
    for (const Member& m : members) {
      for (const auto& c : m.ordered) EXPECT_FALSE(FalconOpIsQuery(static_cast<unsigned>(std::get<1>(c))));
    }
    if (members[0].entry.nranks == n && members[0].entry.parent_id == 0) world_calls = members[0].ordered.size();
  }
  EXPECT_GT(QueriesIn(dir), static_cast<uint64_t>(n) * 20)
      << "the watchdog threads polled while the ranks ran (counted, not recorded)";
  // InitRank, 200 all-reduces and one split on the world communicator.
  EXPECT_EQ(world_calls, 202u);
  ExpectAlikeOnEveryMember(comms);
}

TEST_P(ShimOrderingTest, SplitsOfAParentTheShimNeverSawAreToldApartAndAgreedOn) {
  const int n = GetParam();
  TempDir dir;
  ProcessResult r = testing::Run(RankArgv(n, {"--hidden-world", "--iters", "20"}), Env(dir), 180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto comms = ReadMembers(dir);
  // The hidden world, and two children per color (two splits with the same colors).
  ASSERT_EQ(comms.size(), 1u + 2u * std::min(n, 2));
  std::map<int, std::set<uint64_t>> children_by_color;
  for (const auto& [id, members] : comms) {
    if (members[0].entry.origin == 0) {
      EXPECT_EQ(static_cast<int>(members.size()), n) << "every rank gave the unseen world one identity";
      continue;
    }
    EXPECT_EQ(members[0].entry.origin, static_cast<uint32_t>(kFalconCommBySplit));
    children_by_color[members[0].entry.color].insert(id);
  }
  for (const auto& [color, ids] : children_by_color) {
    EXPECT_EQ(ids.size(), 2u) << "color " << color << ": the two splits are two communicators";
  }
  ExpectAlikeOnEveryMember(comms);
}

TEST_P(ShimOrderingTest, CommunicatorsMadeWhileRecordingWasOffKeepTheirIdentityAndNumbers) {
  const int n = GetParam();
  TempDir dir, flag_dir;
  const std::string go = flag_dir.path() + "/go";
  pid_t pid = testing::Spawn(RankArgv(n, {"--iters", "40", "--wait-file", go}), Env(dir, {"FALCON_MODE=off"}));
  ASSERT_GT(pid, 0);
  // Every rank has made its communicators with recording off: switch each to track.
  std::vector<SegmentReader> segs;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        auto listed = daemon::ListSegments(dir.path(), static_cast<uint32_t>(getuid()), false);
        if (!listed.ok() || listed.value().size() != static_cast<size_t>(n)) return false;
        segs.clear();
        for (const auto& info : listed.value()) {
          auto s = SegmentReader::Open(info.path, SegmentReader::Access::kReadWrite);
          if (!s.ok() || s.value().Comms().size() < 2) return false;
          segs.push_back(std::move(s.value()));
        }
        return true;
      },
      60))
      << "every rank registered its communicators while off";
  for (SegmentReader& s : segs) s.RequestMode(kFalconModeTrack, 1);
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        for (const SegmentReader& s : segs) {
          if (s.control().command_ack != s.control().command_seq) return false;
        }
        return true;
      },
      30));
  { std::ofstream(go) << "go\n"; }
  ASSERT_EQ(testing::WaitFor(pid, 120), 0);
  const auto comms = ReadMembers(dir);
  ASSERT_EQ(comms.size(), 1u + std::min(n, 2));
  for (const auto& [id, members] : comms) {
    const uint32_t origin = members[0].entry.origin;
    EXPECT_TRUE(origin == kFalconCommByInitRank || origin == kFalconCommBySplit) << "origin " << origin;
    if (origin == kFalconCommBySplit) {
      EXPECT_TRUE(comms.count(members[0].entry.parent_id)) << "parent recorded";
    }
    if (origin == kFalconCommByInitRank) {
      // Recording began after InitRank (seq 0) and the split (seq 1): the all-reduces are 2..41.
      ASSERT_FALSE(members[0].ordered.empty());
      EXPECT_EQ(std::get<0>(members[0].ordered.front()), 2u);
      EXPECT_EQ(members[0].ordered.size(), 40u);
    }
  }
  ExpectAlikeOnEveryMember(comms);
}

// Nonblocking communicators (ncclConfig_t.blocking = 0): init and split return ncclInProgress
// and the communicator is not ready until ncclCommGetAsyncError says so. NCCL refuses rank,
// size and device queries until then, printing a warning into the job's log: the shim must not
// ask them early, and must still end up with every member's identity.
TEST_P(ShimOrderingTest, NonblockingCommunicatorsAreNeverQueriedBeforeTheyAreReady) {
  const int n = GetParam();
  TempDir dir;
  ProcessResult r = testing::Run(RankArgv(n, {"--nonblocking", "--watchdog", "--iters", "40"}), Env(dir), 180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find("Attempt to use communicator before"), std::string::npos) << r.err;
  const auto comms = ReadMembers(dir);
  ASSERT_EQ(comms.size(), 1u + std::min(n, 2));
  for (const auto& [id, members] : comms) {
    for (const Member& m : members) {
      EXPECT_GE(m.entry.rank, 0) << "identity completed once ready";
      EXPECT_GT(m.entry.nranks, 0);
    }
  }
  ExpectAlikeOnEveryMember(comms);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShimOrderingTest, ::testing::Values(2, 4));

TEST(ShimOrderingReuseTest, ACommunicatorMadeAtAFreedOnesAddressIsNotTakenForIt) {
  TempDir dir;
  // AddressSanitizer quarantines freed memory; without its quarantine it may hand the address out
  // again as glibc's allocator does.
  const char* asan = std::getenv("ASAN_OPTIONS");
  ProcessResult r = testing::Run(
      RankArgv(1, {"--reuse", "--iters", "8"}),
      Env(dir, {"ASAN_OPTIONS=" + std::string(asan != nullptr ? asan : "") + ":quarantine_size_mb=0"}), 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  if (r.out.find("reuse same") == std::string::npos) {
    GTEST_SKIP() << "the allocator did not hand the freed communicator's address out again (a sanitizer's "
                    "allocator may not): nothing to test here\n"
                 << r.out;
  }
  const auto comms = ReadMembers(dir);
  // The first communicator: InitRank and one all-reduce. The world at the same address: its
  // InitRank, 8 all-reduces, the split — none of them may land on the first one's entry.
  size_t sizes_seen = 0;
  for (const auto& [id, members] : comms) {
    ASSERT_EQ(members.size(), 1u);
    const size_t calls = members[0].ordered.size();
    if (members[0].entry.parent_id != 0) continue;
    EXPECT_TRUE(calls == 2u || calls == 10u) << daemon::HexId(id) << " has " << calls << " ordered calls";
    ++sizes_seen;
  }
  EXPECT_EQ(sizes_seen, 2u);
  ExpectAlikeOnEveryMember(comms);
}

}  // namespace
}  // namespace falcon
