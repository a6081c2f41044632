// Segment names and the liveness rule: the pure parts table-driven, then ListSegments and
// ReapSegment on crafted segment files whose writer claims another PID namespace (a container),
// with and without the liveness lock, with stale, fresh and absent heartbeats.
#include "daemon/shm/segment_dir.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/shm/segment_image.h"
#include "falcon/shm_abi.h"

namespace falcon::daemon {
namespace {

using State = SegmentInfo::State;

constexpr const char* kBoot = "0968b90f898b42f29ff92371067155a1";

int64_t Now(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

TEST(SegmentDirTest, ParsesNamesOfThisAbiOnly) {
  struct Case {
    std::string name;
    bool ok;
  };
  const std::string b = kBoot;
  const std::vector<Case> cases = {
      {"falcon.1000." + b + ".4026531836.12345", true},
      {"falcon.0." + b + ".1.1", true},
      {"falcon.0.1", false},                            // ABI 4 and older: ignored
      {"falcon.1000.12345", false},
      {"falcon.0." + b.substr(1) + ".1.1", false},     // 31 hex digits
      {"falcon.0." + b + "0.1.1", false},              // 33
      {"falcon.0.0968b90f-898b-42f2-9ff9-2371067155a1.1.1", false},
      {"falcon.0." + b + ".1.0", false},               // pid 0
      {"falcon.0." + b + ".1.-5", false},
      {"falcon.0." + b + ".1.2147483648", false},      // pid beyond int32
      {"falcon.4294967296." + b + ".1.1", false},      // uid beyond uint32
      {"falcon.0." + b + ".1.1.", false},
      {"falcon.0." + b + ".1.1.7", false},
      {"falcon.0." + b + "..1", false},
      {"falcon.0." + b + ".x1.1", false},
      {"falcon." + b, false},
      {"falcon.", false},
      {"other.0." + b + ".1.1", false},
      {"falcon.0." + b + ".1.1 ", false},
  };
  for (const Case& c : cases) {
    std::optional<SegmentName> n = ParseSegmentName(c.name);
    EXPECT_EQ(n.has_value(), c.ok) << c.name;
    if (n.has_value()) {
      EXPECT_EQ(SegmentFileName(*n), c.name) << "round trip";
    }
  }
  std::optional<SegmentName> n = ParseSegmentName("falcon.1000." + b + ".4026531836.12345");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->uid, 1000u);
  EXPECT_EQ(n->ns.pid_ns, 4026531836u);
  EXPECT_EQ(n->pid, 12345);
  EXPECT_EQ(n->ns.boot_id[0], 0x09);
  EXPECT_EQ(n->ns.boot_id[15], 0xa1);
}

TEST(SegmentDirTest, OwnNamespaceIsKnownHere) {
  const PidNamespace own = OwnPidNamespace();
  EXPECT_TRUE(own.known()) << "needs /proc: boot_id and /proc/self/ns/pid";
}

TEST(SegmentDirTest, LivenessRule) {
  const int64_t s = 1'000'000'000;  // the bound in these cases
  const LivenessOptions o{s};
  struct Case {
    const char* what;
    WriterEvidence e;
    State want;
  };
  auto ev = [](bool exited, bool same_ns, bool pid, bool lock, bool kept, int64_t mono_age, int64_t real_age) {
    WriterEvidence e;
    e.exited = exited;
    e.same_namespace = same_ns;
    e.pid_matches = pid;
    e.lock_held = lock;
    e.heartbeat_kept = kept;
    e.same_boot = true;
    e.heartbeat_mono_age_ns = mono_age;
    e.heartbeat_real_age_ns = real_age;
    return e;
  };
  const std::vector<Case> cases = {
      {"exited wins over everything", ev(true, false, false, true, true, 0, 0), State::kExited},
      {"exited, same namespace", ev(true, true, true, false, true, 0, 0), State::kExited},
      {"same ns, pid runs", ev(false, true, true, false, true, 99 * s, 99 * s), State::kLive},
      {"same ns, pid gone: exact, no wait", ev(false, true, false, false, true, 0, 0), State::kOrphaned},
      {"other ns, lock held, heartbeat stale (stopped, frozen)", ev(false, false, false, true, true, 99 * s, 99 * s),
       State::kLive},
      {"other ns, no lock, heartbeat fresh", ev(false, false, false, false, true, s / 2, s / 2), State::kLive},
      {"other ns, no lock, heartbeat stale", ev(false, false, false, false, true, 2 * s, 2 * s), State::kOrphaned},
      {"other ns, no lock, heartbeat just at the bound", ev(false, false, false, false, true, s, s), State::kOrphaned},
      {"other ns, no heartbeat kept (no service thread): unknown is live",
       ev(false, false, false, false, false, 99 * s, 99 * s), State::kLive},
      {"wall clock stepped back: fresh by one clock is enough", ev(false, false, false, false, true, 2 * s, -5 * s),
       State::kLive},
      {"time namespace: monotonic looks fresh", ev(false, false, false, false, true, s / 2, 2 * s), State::kLive},
  };
  for (const Case& c : cases) EXPECT_EQ(ClassifyWriter(c.e, o), c.want) << c.what;
  WriterEvidence other_boot = ev(false, false, false, false, true, -99 * s, 2 * s);
  other_boot.same_boot = false;
  EXPECT_EQ(ClassifyWriter(other_boot, o), State::kOrphaned) << "another boot's monotonic clock means nothing";
}

// A minimal valid segment of this ABI, written as a file.
struct Crafted {
  PidNamespace ns;
  int32_t pid = 1;
  uint64_t start_ticks = 0;
  bool heartbeat_kept = true;
  int64_t heartbeat_age_ns = 3600'000'000'000;  // an hour
  uint32_t state = kFalconProcRunning;
};

void WriteSegment(const std::string& path, const Crafted& c) {
  SegmentImage img = MakeSegmentImage({});
  FalconShmHeader& h = img.header;
  h.pid = c.pid;
  h.uid = static_cast<uint32_t>(getuid());
  h.pid_start_ticks = c.start_ticks;
  h.state = c.state;
  h.shim_flags = c.heartbeat_kept ? kFalconShimHeartbeat : 0;
  h.pid_ns = c.ns.pid_ns;
  std::memcpy(h.boot_id, c.ns.boot_id.data(), sizeof(h.boot_id));
  std::snprintf(h.exe, sizeof(h.exe), "crafted");
  img.StoreHeader();
  FalconControl* ctl = img.At<FalconControl>(h.control_offset);
  ctl->heartbeat_mono_ns = Now(CLOCK_MONOTONIC) - c.heartbeat_age_ns;
  ctl->heartbeat_real_ns = Now(CLOCK_REALTIME) - c.heartbeat_age_ns;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << img.bytes;
}

class SegmentDirFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/falcon-segdir-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    own_ = OwnPidNamespace();
    other_ = own_;
    other_.pid_ns = own_.pid_ns + 977;  // a container's PID namespace on this boot
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes a crafted segment under its proper name and returns the path.
  std::string Write(const Crafted& c) {
    const std::string path = SegmentPath(dir_, SegmentName{static_cast<uint32_t>(getuid()), c.ns, c.pid});
    WriteSegment(path, c);
    return path;
  }
  std::vector<SegmentInfo> List(int64_t stale_ns = kHeartbeatStaleNs) {
    auto listed = ListSegments(dir_, static_cast<uint32_t>(getuid()), false, LivenessOptions{stale_ns});
    EXPECT_TRUE(listed.ok()) << listed.status().ToString();
    return listed.ok() ? listed.value() : std::vector<SegmentInfo>{};
  }
  static bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

  std::string dir_;
  PidNamespace own_, other_;
};

TEST_F(SegmentDirFileTest, StaleHeartbeatInAnotherNamespaceIsOrphanedAndReaped) {
  Crafted c;
  c.ns = other_;
  const std::string path = Write(c);
  auto segs = List();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].state, State::kOrphaned);
  EXPECT_FALSE(segs[0].own_namespace);
  EXPECT_EQ(segs[0].pid, 1);
  EXPECT_EQ(segs[0].pid_ns, other_.pid_ns);
  EXPECT_TRUE(ReapSegment(segs[0]).ok());
  EXPECT_FALSE(Exists(path));
}

TEST_F(SegmentDirFileTest, HeldLockKeepsAStaleWriterLive) {
  Crafted c;
  c.ns = other_;
  const std::string path = Write(c);
  auto segs = List();
  ASSERT_EQ(segs.size(), 1u);
  ASSERT_EQ(segs[0].state, State::kOrphaned);
  // The writer turns out to hold its lock (a stopped process): listing and reaping both see it.
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  ASSERT_EQ(fcntl(fd, F_OFD_SETLK, &l), 0);
  EXPECT_FALSE(ReapSegment(segs[0]).ok()) << "checked again before unlinking";
  EXPECT_TRUE(Exists(path));
  segs = List();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].state, State::kLive);
  EXPECT_TRUE(segs[0].lock_held);
  EXPECT_FALSE(ReapSegment(segs[0]).ok());
  close(fd);  // the writer dies
  segs = List();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].state, State::kOrphaned);
}

TEST_F(SegmentDirFileTest, FreshOrAbsentHeartbeatInAnotherNamespaceIsLive) {
  Crafted fresh;
  fresh.ns = other_;
  fresh.pid = 7;
  fresh.heartbeat_age_ns = 0;
  Crafted none;  // its service thread never started: an hour-old heartbeat says nothing
  none.ns = other_;
  none.pid = 8;
  none.heartbeat_kept = false;
  Write(fresh);
  Write(none);
  auto segs = List();
  ASSERT_EQ(segs.size(), 2u);
  for (const SegmentInfo& s : segs) {
    EXPECT_EQ(s.state, State::kLive) << s.path;
    EXPECT_FALSE(ReapSegment(s).ok());
  }
  // The same fresh heartbeat is stale under a bound shorter than its age.
  for (const SegmentInfo& s : List(/*stale_ns=*/-1)) {
    EXPECT_EQ(s.state, s.pid == 7 ? State::kOrphaned : State::kLive) << s.path;
  }
}

TEST_F(SegmentDirFileTest, OwnNamespaceUsesThePidExactly) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  Crafted dead;  // fresh heartbeat, but its pid is gone: no waiting for the bound here
  dead.ns = own_;
  dead.pid = child;
  dead.heartbeat_age_ns = 0;
  Crafted me;  // stale heartbeat, but the pid runs
  me.ns = own_;
  me.pid = getpid();
  Write(dead);
  Write(me);
  auto segs = List();
  ASSERT_EQ(segs.size(), 2u);
  for (const SegmentInfo& s : segs) {
    EXPECT_TRUE(s.own_namespace);
    EXPECT_EQ(s.state, s.pid == getpid() ? State::kLive : State::kOrphaned) << s.path;
  }
}

TEST_F(SegmentDirFileTest, ExitedIsReapable) {
  Crafted c;
  c.ns = other_;
  c.heartbeat_age_ns = 0;
  c.state = kFalconProcExited;
  const std::string path = Write(c);
  auto segs = List();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].state, State::kExited);
  EXPECT_TRUE(ReapSegment(segs[0]).ok());
  EXPECT_FALSE(Exists(path));
}

TEST_F(SegmentDirFileTest, OldNamesAreIgnored) {
  Crafted c;
  c.ns = own_;
  const std::string old = dir_ + "/" + FALCON_SHM_PREFIX + std::to_string(getuid()) + ".1";
  WriteSegment(old, c);
  EXPECT_TRUE(List().empty());
  EXPECT_TRUE(Exists(old));
}

TEST_F(SegmentDirFileTest, AReplacedFileIsNotReaped) {
  Crafted c;
  c.ns = other_;
  const std::string path = Write(c);
  auto segs = List();
  ASSERT_EQ(segs.size(), 1u);
  ASSERT_EQ(segs[0].state, State::kOrphaned);
  // A new writer took the name in between (new file, new inode).
  const std::string fresh = path + ".new";
  WriteSegment(fresh, c);
  ASSERT_EQ(rename(fresh.c_str(), path.c_str()), 0);
  EXPECT_FALSE(ReapSegment(segs[0]).ok());
  EXPECT_TRUE(Exists(path));
}

TEST_F(SegmentDirFileTest, UnreadableFileOfAnotherNamespaceWaitsForTheBound) {
  const std::string path = SegmentPath(dir_, SegmentName{static_cast<uint32_t>(getuid()), other_, 3});
  std::ofstream(path) << "half-built";
  auto segs = List();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].state, State::kUnreadable) << "a writer may still be creating it";
  EXPECT_FALSE(ReapSegment(segs[0]).ok());
  const timespec hour_ago[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), hour_ago, 0), 0);
  segs = List();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].state, State::kOrphaned);
  EXPECT_TRUE(ReapSegment(segs[0]).ok());
  EXPECT_FALSE(Exists(path));
}

}  // namespace
}  // namespace falcon::daemon
