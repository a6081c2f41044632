// Containers: traced processes in their own PID namespaces (unshare --pid --fork), all pid 1,
// sharing one FALCON_SHM_DIR with a reader in another namespace (this test, like the agent in
// its own container). Each keeps its own segment; the reader sees them live while they run
// (stopped ones included), exited after a normal exit, orphaned after a crash, and never reaps
// a live one. Real processes, real segments; needs root and util-linux unshare, else skipped.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"
#include "tests/support/calls_prog.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using daemon::SegmentInfo;
using State = SegmentInfo::State;
using testing::TempDir;

constexpr int64_t kShortBoundNs = 500'000'000;  // heartbeat bound for the crash cases below

// util-linux unshare from $PATH (Spawn and Run exec a path), or "".
std::string UnsharePath() {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/unshare";
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// Why namespaces cannot be made here, or "" if they can.
std::string NamespacesUnavailable() {
  if (geteuid() != 0) return "needs root for unshare --pid";
  if (UnsharePath().empty()) return "no unshare (util-linux) on PATH";
  testing::ProcessResult r = testing::Run({UnsharePath(), "--pid", "--fork", "--mount-proc", "true"}, {}, 30);
  if (r.exit_code != 0) return "unshare --pid --fork --mount-proc failed: " + r.err;
  return "";
}

class ShimNamespaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = NamespacesUnavailable();
    if (!why.empty()) GTEST_SKIP() << why;
    gate_ = dir_.path() + "/go";
  }
  void TearDown() override {
    for (pid_t p : spawned_) {
      kill(p, SIGKILL);
      testing::WaitFor(p, 10);
    }
  }

  // Starts falcon-test-calls as pid 1 of a new PID namespace; it records a few calls, then waits
  // for the gate file. --kill-child: killing unshare kills the namespace's init, and so the rank.
  // Under AddressSanitizer its leak checker cannot run as pid 1 of a PID namespace (it exits
  // with "LeakSanitizer has encountered a fatal error"): it is off for these ranks only.
  pid_t SpawnContainerRank() {
    const char* asan = std::getenv("ASAN_OPTIONS");
    pid_t pid = testing::Spawn(
        {UnsharePath(), "--pid", "--fork", "--mount-proc", "--kill-child", testing::CallsProg(), "--iters", "5",
         "--wait-file", gate_},
        {"LD_LIBRARY_PATH=" + testing::NoopLibDir(), "FALCON_SHM_DIR=" + dir_.path(), "FALCON_KEEP_SEGMENT=1",
         "LD_PRELOAD=" + testing::PreloadValue(),
         "ASAN_OPTIONS=" + std::string(asan != nullptr ? asan : "") + ":detect_leaks=0"});
    if (pid > 0) spawned_.push_back(pid);
    return pid;
  }
  std::vector<SegmentInfo> List(int64_t stale_ns = daemon::kHeartbeatStaleNs) {
    auto listed = daemon::ListSegments(dir_.path(), static_cast<uint32_t>(getuid()), false, {stale_ns});
    EXPECT_TRUE(listed.ok()) << listed.status().ToString();
    return listed.ok() ? listed.value() : std::vector<SegmentInfo>{};
  }
  // Both ranks have a segment with their first calls in it.
  bool BothRecording() {
    auto segs = List();
    return segs.size() == 2 && segs[0].records > 2 && segs[1].records > 2;
  }
  static const SegmentInfo* Find(const std::vector<SegmentInfo>& segs, uint64_t pid_ns) {
    for (const SegmentInfo& s : segs) {
      if (s.pid_ns == pid_ns) return &s;
    }
    return nullptr;
  }
  void Finish(pid_t pid) {
    EXPECT_EQ(testing::WaitFor(pid, 60), 0);
    std::erase(spawned_, pid);
  }

  TempDir dir_;
  std::string gate_;
  std::vector<pid_t> spawned_;
};

TEST_F(ShimNamespaceTest, SamePidInTwoNamespacesKeepsTwoLiveSegments) {
  pid_t a = SpawnContainerRank();
  pid_t b = SpawnContainerRank();
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  ASSERT_TRUE(testing::WaitUntil([&] { return BothRecording(); }, 30)) << List().size() << " segment(s)";
  auto segs = List();
  std::set<uint64_t> namespaces;
  for (const SegmentInfo& s : segs) {
    EXPECT_EQ(s.pid, 1) << s.path << ": pid 1 in its own namespace";
    EXPECT_FALSE(s.own_namespace) << s.path;
    EXPECT_EQ(s.state, State::kLive) << s.path;
    EXPECT_TRUE(s.lock_held) << s.path;
    EXPECT_FALSE(daemon::ReapSegment(s).ok()) << "a live segment in another namespace is never reaped";
    namespaces.insert(s.pid_ns);
  }
  EXPECT_EQ(namespaces.size(), 2u) << "the segment names differ by PID namespace";
  { std::ofstream(gate_) << "go"; }
  Finish(a);
  Finish(b);
  segs = List();
  ASSERT_EQ(segs.size(), 2u);
  for (const SegmentInfo& s : segs) {
    EXPECT_EQ(s.state, State::kExited) << s.path;
    EXPECT_GT(s.records, 20u) << s.path << ": both kept recording into their own segment";
  }
}

TEST_F(ShimNamespaceTest, CrashedRankIsOrphanedOnceItsHeartbeatStops) {
  pid_t crashed = SpawnContainerRank();
  pid_t running = SpawnContainerRank();
  ASSERT_GT(crashed, 0);
  ASSERT_GT(running, 0);
  ASSERT_TRUE(testing::WaitUntil([&] { return BothRecording(); }, 30));
  // Tell the two apart by the namespace of the rank we are about to kill. unshare itself is in
  // our namespace; its child, the rank, is found through /proc and named by its pid here.
  uint64_t crashed_ns = 0;
  std::ifstream children("/proc/" + std::to_string(crashed) + "/task/" + std::to_string(crashed) + "/children");
  pid_t rank = 0;
  ASSERT_TRUE(children >> rank) << "cannot find the rank under unshare " << crashed;
  const std::string rank_path = daemon::SegmentPathOfPid(dir_.path(), static_cast<uint32_t>(getuid()), rank);
  for (const SegmentInfo& s : List()) {
    if (s.path == rank_path) crashed_ns = s.pid_ns;
  }
  ASSERT_NE(crashed_ns, 0u) << "trace-by-pid finds a container's rank by its pid here: " << rank_path;
  kill(crashed, SIGKILL);
  EXPECT_NE(testing::WaitFor(crashed, 10), 0);
  std::erase(spawned_, crashed);
  // Its lock went with it; the heartbeat ages past the bound; the other rank stays live.
  ASSERT_TRUE(testing::WaitUntil([&] {
    const std::vector<SegmentInfo> listed = List(kShortBoundNs);
    const SegmentInfo* s = Find(listed, crashed_ns);
    return s != nullptr && s->state == State::kOrphaned;
  }, 30));
  auto segs = List(kShortBoundNs);
  ASSERT_EQ(segs.size(), 2u);
  for (const SegmentInfo& s : segs) {
    if (s.pid_ns == crashed_ns) {
      EXPECT_FALSE(s.lock_held);
      EXPECT_TRUE(daemon::ReapSegment(s, {kShortBoundNs}).ok()) << s.path;
    } else {
      EXPECT_EQ(s.state, State::kLive) << s.path;
      EXPECT_FALSE(daemon::ReapSegment(s, {kShortBoundNs}).ok());
    }
  }
  ASSERT_EQ(List().size(), 1u) << "only the crashed rank's segment was reaped";
  { std::ofstream(gate_) << "go"; }
  Finish(running);
  segs = List();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].state, State::kExited);
}

TEST_F(ShimNamespaceTest, StoppedRankInAnotherNamespaceStaysLive) {
  pid_t a = SpawnContainerRank();
  ASSERT_GT(a, 0);
  ASSERT_TRUE(testing::WaitUntil([&] {
    auto segs = List();
    return segs.size() == 1 && segs[0].records > 2;
  }, 30));
  std::ifstream children("/proc/" + std::to_string(a) + "/task/" + std::to_string(a) + "/children");
  pid_t rank = 0;
  ASSERT_TRUE(children >> rank);
  // A rank stopped in a debugger or a paused container: no heartbeat, but it is alive.
  ASSERT_EQ(kill(rank, SIGSTOP), 0);
  ASSERT_TRUE(testing::WaitUntil([&] {
    auto segs = List();
    return segs.size() == 1 && testing::WallClockNs() - segs[0].heartbeat_real_ns > 2 * kShortBoundNs;
  }, 30)) << "the heartbeat stops while the rank is stopped";
  auto segs = List(kShortBoundNs);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].state, State::kLive) << "its lock says it lives";
  EXPECT_FALSE(daemon::ReapSegment(segs[0], {kShortBoundNs}).ok());
  ASSERT_EQ(kill(rank, SIGCONT), 0);
  { std::ofstream(gate_) << "go"; }
  Finish(a);
  segs = List();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].state, State::kExited);
}

}  // namespace
}  // namespace falcon
