// SegmentReader against a segment file whose header changes after open, as a stray write in the
// traced process (which maps the segment read-write) would change it: every case corrupts one
// header field through a second mapping and checks that reads go on with the geometry validated
// at open — no crash, no allocation sized by shared memory, no record lost.
#include "daemon/shm/segment_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "daemon/shm/segment_image.h"
#include "falcon/shm_abi.h"

namespace falcon::daemon {
namespace {

constexpr uint32_t kLanes = 2;
constexpr uint64_t kCapacity = 64;
constexpr uint32_t kComms = 2;
constexpr uint32_t kThreads = 2;
constexpr uint64_t kRecords = 10;  // all in lane 0

// A segment of this ABI with kRecords complete records in lane 0 and one live communicator.
void WriteSegment(const std::string& path) {
  SegmentImage img = MakeSegmentImage({.lanes = kLanes, .capacity = kCapacity, .comms = kComms, .threads = kThreads});
  img.header.comm_used = 1;
  img.header.thread_used = 1;
  std::memset(img.header.exe, 'x', sizeof(img.header.exe));  // no terminator: the reader's copy must add one
  img.StoreHeader();
  std::memset(img.Comm(1), 0, sizeof(FalconCommEntry));
  std::memset(img.Comm(0)->name, 'c', sizeof(img.Comm(0)->name));
  img.Lane(0)->head = kRecords;
  for (uint64_t i = 0; i < kRecords; ++i) {
    FalconRecord* r = img.Record(0, i);
    r->version = 2 * i + 2;  // complete (shm_abi.h seqlock)
    r->t_start_ns = static_cast<int64_t>(1000 + i);
    r->count = i;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << img.bytes;
}

class SegmentReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/falcon-segreader-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/segment";
    WriteSegment(path_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Applies `corrupt` to the header through a mapping of its own (the traced process's view).
  void Corrupt(const std::function<void(FalconShmHeader*)>& corrupt) {
    int fd = open(path_.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    void* base = mmap(nullptr, sizeof(FalconShmHeader), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(base, MAP_FAILED);
    corrupt(static_cast<FalconShmHeader*>(base));
    munmap(base, sizeof(FalconShmHeader));
  }

  std::string dir_, path_;
};

TEST_F(SegmentReaderTest, HeaderChangedAfterOpenIsNotTrusted) {
  struct Case {
    const char* what;
    std::function<void(FalconShmHeader*)> corrupt;
  };
  const std::vector<Case> cases = {
      {"lane_count 1000000", [](FalconShmHeader* h) { h->lane_count = 1000000; }},
      {"lane_count 0xffffffff", [](FalconShmHeader* h) { h->lane_count = 0xffffffffu; }},
      {"lane_count 0", [](FalconShmHeader* h) { h->lane_count = 0; }},
      {"lane_capacity huge", [](FalconShmHeader* h) { h->lane_capacity = uint64_t{1} << 62; }},
      {"lane_capacity 3", [](FalconShmHeader* h) { h->lane_capacity = 3; }},
      {"lane_capacity 0", [](FalconShmHeader* h) { h->lane_capacity = 0; }},
      {"comm table", [](FalconShmHeader* h) { h->comm_capacity = h->comm_used = 0xffffffffu; }},
      {"thread table", [](FalconShmHeader* h) { h->thread_capacity = h->thread_used = 0xffffffffu; }},
      {"offsets", [](FalconShmHeader* h) {
         h->ring_offset = h->lane_offset = h->comm_offset = h->thread_offset = ~uint64_t{0} - 7;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    WriteSegment(path_);
    Result<SegmentReader> opened = SegmentReader::Open(path_);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    const SegmentReader& seg = opened.value();
    ReadCursor cursor;
    std::vector<FalconRecord> out;
    ReadStats first = seg.Read(&cursor, kRecords / 2, SegmentReader::ReadMode::kLive, &out);
    ASSERT_EQ(first.read, kRecords / 2);

    Corrupt(c.corrupt);

    EXPECT_EQ(seg.lane_count(), kLanes);
    EXPECT_EQ(seg.header().lane_capacity, kCapacity);
    ReadStats rest = seg.Read(&cursor, kRecords, SegmentReader::ReadMode::kLive, &out);
    EXPECT_EQ(rest.read, kRecords - kRecords / 2);
    EXPECT_EQ(rest.lost + rest.torn, 0u);
    ASSERT_EQ(out.size(), kRecords);
    for (uint64_t i = 0; i < kRecords; ++i) EXPECT_EQ(out[i].count, i);
    EXPECT_EQ(cursor.next.size(), kLanes);
    EXPECT_EQ(seg.head(), kRecords);
    EXPECT_EQ(seg.OldestCursor().next.size(), kLanes);
    EXPECT_EQ(seg.HeadCursor().next.size(), kLanes);
    EXPECT_EQ(seg.records_lost(), 0u);
    EXPECT_LE(seg.Comms().size(), kComms);
    EXPECT_LE(seg.Threads().size(), kThreads);
    EXPECT_EQ(seg.CommCalls(kComms + 5), 0u);
  }
}

TEST_F(SegmentReaderTest, TextFieldsAreTerminated) {
  Result<SegmentReader> opened = SegmentReader::Open(path_);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const SegmentReader& seg = opened.value();
  EXPECT_EQ(std::strlen(seg.header().exe), sizeof(seg.header().exe) - 1);
  const std::vector<CommInfo> comms = seg.Comms();
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_EQ(std::strlen(comms[0].entry.name), sizeof(comms[0].entry.name) - 1);
}

}  // namespace
}  // namespace falcon::daemon
