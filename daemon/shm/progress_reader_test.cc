// ReadProgress on crafted segments: which calls count as complete (tracked, pending, unknown
// tail, no tracking), the thread in a call, destroyed communicators, and the latest calls per
// communicator taken from the lanes' tails.
#include "daemon/shm/progress_reader.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/shm/segment_image.h"
#include "falcon/shm_abi.h"

namespace falcon::daemon {
namespace {

class ProgressReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/falcon-progress-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    img_ = MakeSegmentImage({.lanes = 2, .capacity = 16, .comms = 4, .threads = 2});
    img_.header.rank_hint = 7;
    std::strcpy(img_.header.host, "node-a");
    img_.StoreHeader();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Comm `slot`: `calls` issued, device_done and marked as given.
  void SetComm(uint32_t slot, uint64_t calls, uint64_t done, uint64_t marked, int32_t rank = 0) {
    FalconCommEntry* e = img_.Comm(slot);
    e->calls = calls;
    e->device_done = done;
    e->marked = marked;
    e->rank = rank;
    e->last_call_mono_ns = calls != 0 ? 1000 + static_cast<int64_t>(slot) : 0;
  }

  // One ordered call record in lane `lane`.
  void AddCall(uint32_t lane, uint32_t slot, uint64_t seq, int64_t t, uint8_t op = kFalconOpAllReduce) {
    FalconLane* l = img_.Lane(lane);
    const uint64_t i = l->head++;
    FalconRecord* r = img_.Record(lane, i);
    std::memset(r, 0, sizeof *r);
    r->version = 2 * i + 2;
    r->comm_slot = slot;
    r->comm_seq = seq;
    r->op = op;
    r->dtype = 7;
    r->redop = 0;
    r->peer = -1;
    r->count = 1024;
    r->aux = 0xABC;
    r->t_start_ns = t;
    r->lane = static_cast<uint8_t>(lane);
  }

  SegmentProgress Read(int64_t now = 10'000, ProgressReadOptions options = {}) {
    const std::string path = dir_ + "/segment";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << img_.bytes;
    auto seg = SegmentReader::Open(path);
    EXPECT_TRUE(seg.ok()) << seg.status().message();
    return ReadProgress(seg.value(), now, options);
  }

  std::string dir_;
  SegmentImage img_;
};

TEST_F(ProgressReaderTest, CompletionFollowsTheTrackedCalls) {
  SetComm(0, 10, 10, 10);  // every call tracked and done
  SetComm(1, 10, 6, 9);    // calls 6..8 tracked and pending, 9 unknown
  SetComm(2, 10, 8, 8);    // everything tracked is done; 8 and 9 were never marked: unknown
  SetComm(3, 10, 0, 0);    // no tracking at all
  const SegmentProgress p = Read();
  ASSERT_EQ(p.progress.comms.size(), 4u);
  EXPECT_EQ(p.progress.rank, 7);
  EXPECT_EQ(p.progress.host, "node-a");
  EXPECT_TRUE(p.device_tracked);
  EXPECT_EQ(p.progress.comms[0].completed, 10u);
  EXPECT_TRUE(p.progress.comms[0].completion_known);
  EXPECT_EQ(p.progress.comms[1].completed, 6u);
  EXPECT_TRUE(p.progress.comms[1].completion_known) << "a tracked call is pending: the count is exact";
  EXPECT_EQ(p.progress.comms[2].completed, 8u);
  EXPECT_FALSE(p.progress.comms[2].completion_known) << "calls 8 and 9 were never tracked";
  EXPECT_EQ(p.progress.comms[3].completed, 0u);
  EXPECT_FALSE(p.progress.comms[3].completion_known) << "nothing tracked";
  EXPECT_EQ(p.last_call_mono_ns, 1003);
}

TEST_F(ProgressReaderTest, DeviceDoneAheadOfMarkedIsNotPending) {
  SetComm(0, 5, 5, 4);  // the service thread saw call 4 complete before the caller stored marked
  const SegmentProgress p = Read();
  EXPECT_EQ(p.progress.comms[0].completed, 5u);
  EXPECT_TRUE(p.progress.comms[0].completion_known);
}

TEST_F(ProgressReaderTest, WithoutTrackingCompletionIsUnknown) {
  for (uint32_t s = 0; s < 4; ++s) SetComm(s, 3, 0, 0);
  const SegmentProgress p = Read();
  EXPECT_FALSE(p.device_tracked);
  for (const auto& c : p.progress.comms) {
    EXPECT_EQ(c.completed, 0u);
    EXPECT_FALSE(c.completion_known);
  }
}

TEST_F(ProgressReaderTest, DestroyedCommunicatorsAreLeftOut) {
  for (uint32_t s = 0; s < 4; ++s) SetComm(s, 1, 1, 1);
  img_.Comm(2)->state = kFalconCommDestroyed;
  const SegmentProgress p = Read();
  ASSERT_EQ(p.progress.comms.size(), 3u);
  for (const auto& c : p.progress.comms) EXPECT_NE(c.comm, img_.Comm(2)->comm_id);
}

// A job at its end destroys its communicators one by one; the last left is often the world
// group, last used by a checkpoint's barrier long before. The rank's latest call is still the
// one on a communicator destroyed a moment ago: without it, a rank inside the world group's
// destroy read as quiet since that barrier, and its agent reported a stall.
TEST_F(ProgressReaderTest, ACommunicatorDestroyedAMomentAgoStillDatesTheLatestCall) {
  SetComm(0, 3, 0, 0);  // the world group: its last call (a barrier) long ago
  img_.Comm(0)->last_call_mono_ns = 1'000;
  SetComm(1, 500, 0, 0);  // a TP group: its last call just now, destroyed since
  img_.Comm(1)->last_call_mono_ns = 9'500;
  img_.Comm(1)->state = kFalconCommDestroyed;
  img_.header.thread_used = 1;
  img_.StoreHeader();
  auto* threads = img_.At<FalconThreadSlot>(img_.header.thread_offset);
  threads[0].tid = 11;
  threads[0].inflight_seq = FALCON_INFLIGHT_UNORDERED;  // inside the world group's destroy
  threads[0].inflight_comm_slot = 0;
  threads[0].inflight_since_mono_ns = 9'600;
  // A slot being written, or free, dates nothing.
  img_.Comm(2)->last_call_mono_ns = 99'000;
  img_.Comm(2)->state = kFalconCommWriting;
  img_.Comm(3)->last_call_mono_ns = 88'000;
  img_.Comm(3)->state = kFalconCommFree;
  const SegmentProgress p = Read();
  ASSERT_EQ(p.progress.comms.size(), 1u) << "the destroyed group is no communicator of the rank's now";
  EXPECT_EQ(p.last_call_mono_ns, 9'500);
  ASSERT_TRUE(p.progress.in_call.has_value());
  EXPECT_EQ(*p.progress.in_call, img_.Comm(0)->comm_id);
}

TEST_F(ProgressReaderTest, TheOldestCallInFlightIsReported) {
  SetComm(1, 4, 4, 4);
  img_.header.thread_used = 2;
  img_.StoreHeader();
  auto* threads = img_.At<FalconThreadSlot>(img_.header.thread_offset);
  threads[0].tid = 11;
  threads[0].inflight_seq = 4;  // call 3 on comm slot 1
  threads[0].inflight_comm_slot = 1;
  threads[0].inflight_since_mono_ns = 9'000;
  threads[1].tid = 12;
  threads[1].inflight_seq = FALCON_INFLIGHT_UNORDERED;  // an ncclGroupEnd, older
  threads[1].inflight_comm_slot = FALCON_NO_COMM;
  threads[1].inflight_since_mono_ns = 5'000;
  SegmentProgress p = Read();
  ASSERT_TRUE(p.progress.in_call.has_value());
  EXPECT_EQ(*p.progress.in_call, 0u) << "the group end is older and on no known communicator";
  EXPECT_EQ(p.in_call_since_mono_ns, 5'000);
  // A call younger than in_call_min_ns does not count.
  ProgressReadOptions o;
  o.in_call_min_ns = 2'000;
  threads[1].tid = 0;
  p = Read(10'000, o);
  EXPECT_FALSE(p.progress.in_call.has_value());
  o.in_call_min_ns = 500;
  p = Read(10'000, o);
  ASSERT_TRUE(p.progress.in_call.has_value());
  EXPECT_EQ(*p.progress.in_call, img_.Comm(1)->comm_id);
}

TEST_F(ProgressReaderTest, RecentCallsAreTheLatestPerCommunicatorInTimeOrder) {
  SetComm(0, 30, 28, 30);
  SetComm(1, 2, 2, 2);
  for (uint64_t s = 0; s < 30; ++s) AddCall(0, 0, s, 100 + static_cast<int64_t>(s) * 10);  // wraps the ring
  AddCall(1, 1, 0, 105);
  AddCall(1, 1, 1, 395);
  AddCall(1, FALCON_NO_COMM, ~uint64_t{0}, 396, kFalconOpGroupEnd);  // not ordered: left out
  ProgressReadOptions o;
  o.per_comm = 4;
  const SegmentProgress p = Read(10'000, o);
  ASSERT_EQ(p.progress.recent.size(), 6u);
  // comm 0: seq 26..29 (issue times 360..390); comm 1: seq 0 (105) and 1 (395).
  EXPECT_EQ(p.progress.recent.front().comm, img_.Comm(1)->comm_id);
  EXPECT_EQ(p.progress.recent.front().seq, 0u);
  EXPECT_EQ(p.progress.recent.back().seq, 1u);
  std::vector<uint64_t> seqs;
  for (const auto& c : p.progress.recent) {
    if (c.comm == img_.Comm(0)->comm_id) seqs.push_back(c.seq);
  }
  EXPECT_EQ(seqs, (std::vector<uint64_t>{26, 27, 28, 29}));
  for (const auto& c : p.progress.recent) {
    if (c.comm == img_.Comm(0)->comm_id) {
      EXPECT_EQ(c.completed, c.seq < 28) << c.seq;
    }
    EXPECT_EQ(c.stream, 0xABCu);
    EXPECT_EQ(c.sig.count, 1024u);
  }
}

}  // namespace
}  // namespace falcon::daemon
