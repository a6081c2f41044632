// Segment naming rules under races the rendezvous tests hit only by chance: an unlink never
// removes an object other than the unlinker's, and a stale segment is not removed while
// another rank holds its lock (that rank is checking it, or it is still being created).
#include "shm_segment.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace falcon::emu {
namespace {

constexpr size_t kSlot = 4096, kP2p = 4096;

std::string TestName(const char* what) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "/falcon-emu-segtest-%d-%s", static_cast<int>(getpid()), what);
  return buf;
}

// Identity of the object the name refers to now; 0 when there is none.
ino_t NamedInode(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0600);
  if (fd < 0) return 0;
  struct stat st{};
  const bool ok = fstat(fd, &st) == 0;
  close(fd);
  return ok ? st.st_ino : 0;
}

TEST(ShmSegmentTest, UnlinkLeavesAReplacementAloneThatAnotherRankCreated) {
  const std::string name = TestName("replaced");
  std::string err;
  Segment first;
  ASSERT_EQ(first.TryOpen(name, 1, 2, kSlot, kP2p, &err), Segment::Status::kOk) << err;
  // Another rank found `first` stale, removed it and created the replacement.
  ASSERT_EQ(shm_unlink(name.c_str()), 0);
  Segment second;
  ASSERT_EQ(second.TryOpen(name, 1, 2, kSlot, kP2p, &err), Segment::Status::kOk) << err;
  const ino_t replacement = NamedInode(name);
  ASSERT_NE(replacement, 0u);
  first.Unlink();
  EXPECT_EQ(NamedInode(name), replacement) << "the first segment's unlink removed its replacement";
  second.Unlink();
  EXPECT_EQ(NamedInode(name), 0u);
}

TEST(ShmSegmentTest, AStaleSegmentIsNotRemovedWhileAnotherRankHoldsItsLock) {
  const std::string name = TestName("locked");
  // A creator that publishes the segment and dies without removing it.
  const pid_t dead = fork();
  if (dead == 0) {
    std::string e;
    Segment s;
    _exit(s.TryOpen(name, 7, 2, kSlot, kP2p, &e) == Segment::Status::kOk ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(dead, &status, 0), dead);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const ino_t stale = NamedInode(name);
  ASSERT_NE(stale, 0u);

  // Another rank is removing it: it holds the lock.
  const int held = shm_open(name.c_str(), O_RDONLY, 0600);
  ASSERT_GE(held, 0);
  ASSERT_EQ(flock(held, LOCK_EX | LOCK_NB), 0);
  std::string err;
  Segment joiner;
  EXPECT_EQ(joiner.TryOpen(name, 7, 2, kSlot, kP2p, &err), Segment::Status::kPending) << err;
  EXPECT_EQ(NamedInode(name), stale) << "removed while another rank held the lock";
  close(held);

  // Lock released: the stale name goes, and the next attempt creates a fresh segment.
  EXPECT_EQ(joiner.TryOpen(name, 7, 2, kSlot, kP2p, &err), Segment::Status::kPending) << err;
  EXPECT_EQ(NamedInode(name), 0u);
  EXPECT_EQ(joiner.TryOpen(name, 7, 2, kSlot, kP2p, &err), Segment::Status::kOk) << err;
  EXPECT_EQ(joiner.header()->creator_pid, getpid());
  joiner.Unlink();
  EXPECT_EQ(NamedInode(name), 0u);
}

TEST(ShmSegmentTest, APublishedSegmentCarriesNoLockAndItsMembersRemoveIt) {
  // The creator's lock lasts until it publishes; the mapping must not keep it (a flock belongs to
  // the open file, which a mapping holds), or no member could ever remove the name.
  const std::string name = TestName("published");
  std::string err;
  Segment creator, joiner;
  ASSERT_EQ(creator.TryOpen(name, 3, 2, kSlot, kP2p, &err), Segment::Status::kOk) << err;
  ASSERT_EQ(joiner.TryOpen(name, 3, 2, kSlot, kP2p, &err), Segment::Status::kOk) << err;
  const int fd = shm_open(name.c_str(), O_RDONLY, 0600);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0) << "the published segment is still locked";
  close(fd);
  joiner.Unlink();
  EXPECT_EQ(NamedInode(name), 0u);
  creator.Unlink();  // already gone: nothing to do, nothing else touched
}

}  // namespace
}  // namespace falcon::emu
