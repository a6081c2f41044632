// What the two segment targets share: a segment file in tmpfs rewritten for each input, a
// well-formed image with records laid out from the input, byte patches read from the input, and
// one pass of everything a reader (the agent, falcon-ctl trace) does with an open segment, each
// result checked against the geometry validated at open.
#pragma once
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "daemon/shm/plan_block.h"
#include "daemon/shm/record_json.h"
#include "daemon/shm/segment_image.h"
#include "daemon/shm/segment_reader.h"
#include "fuzz/fuzz_input.h"

namespace falcon::fuzz {

// A file in /dev/shm (or /tmp) for this process, removed at exit.
class SegmentFile {
 public:
  SegmentFile() {
    char tmpl[] = "/dev/shm/falcon-fuzz-XXXXXX";
    char fallback[] = "/tmp/falcon-fuzz-XXXXXX";
    int fd = mkstemp(tmpl);
    path_ = tmpl;
    if (fd < 0) {
      fd = mkstemp(fallback);
      path_ = fallback;
    }
    if (fd < 0) PropertyFailed("cannot create a segment file");
    close(fd);
  }
  ~SegmentFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }
  void Write(const std::string& bytes) const {
    const int fd = open(path_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) PropertyFailed("cannot rewrite the segment file");
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
      if (n <= 0) PropertyFailed("short write to the segment file");
      done += static_cast<size_t>(n);
    }
    close(fd);
  }

 private:
  std::string path_;
};

inline const SegmentFile& TheSegmentFile() {
  static const SegmentFile file;
  return file;
}

// A writable mapping of the file: the traced process's view of the segment.
class WriterView {
 public:
  WriterView(const std::string& path, size_t size) : size_(size) {
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) base_ = static_cast<uint8_t*>(p);
  }
  ~WriterView() {
    if (base_ != nullptr) munmap(base_, size_);
  }
  WriterView(const WriterView&) = delete;
  WriterView& operator=(const WriterView&) = delete;
  uint8_t* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

// One write the input asks for: `len` bytes at `offset`, half of them aimed at the header.
struct Patch {
  uint64_t offset = 0;
  std::string value;
};

inline std::vector<Patch> TakePatches(FuzzInput& in, size_t image_size, size_t max_patches) {
  std::vector<Patch> patches;
  while (!in.empty() && patches.size() < max_patches) {
    const uint8_t kind = in.Take<uint8_t>();
    const uint32_t where = in.Take<uint32_t>();
    const size_t len = 1 + ((kind >> 1) & 7);
    const uint64_t region = (kind & 1) != 0 ? sizeof(FalconShmHeader) : image_size;
    Patch p;
    p.offset = where % region;
    p.value = std::string(in.Bytes(len));
    if (p.offset + p.value.size() > image_size) p.value.resize(image_size - p.offset);
    patches.push_back(std::move(p));
  }
  return patches;
}

// Byte stores as the other process makes them: atomic bytes, so a concurrent reader's atomic
// loads of the same words are not a data race in this process's model.
inline void ApplyPatch(uint8_t* base, const Patch& p) {
  for (size_t i = 0; i < p.value.size(); ++i) {
    __atomic_store_n(base + p.offset + i, static_cast<uint8_t>(p.value[i]), __ATOMIC_RELAXED);
  }
}

// A well-formed image whose geometry, records and communicators come from the input.
inline daemon::SegmentImage TakeImage(FuzzInput& in) {
  daemon::SegmentGeometry g;
  g.lanes = static_cast<uint32_t>(in.Range(2, 6));
  g.capacity = uint64_t{1} << in.Range(0, 5);
  g.comms = static_cast<uint32_t>(in.Range(0, 4));
  g.threads = static_cast<uint32_t>(in.Range(0, 3));
  daemon::SegmentImage img = daemon::MakeSegmentImage(g);
  img.header.thread_used = static_cast<uint32_t>(in.Range(0, 5));
  img.StoreHeader();
  int64_t t = 1000;
  for (uint32_t l = 0; l < g.lanes; ++l) {
    const uint64_t head = in.Range(0, 3 * g.capacity);
    img.Lane(l)->head = head;
    for (uint64_t i = head > g.capacity ? head - g.capacity : 0; i < head; ++i) {
      FalconRecord* r = img.Record(l, i);
      r->version = in.Bool() ? 2 * i + 2 : 2 * i + 1;  // complete, or a writer mid-record
      t += static_cast<int64_t>(in.Range(0, 5000));
      r->t_start_ns = t;
      r->t_end_ns = t + static_cast<int64_t>(in.Range(0, 100));
      r->comm_slot = static_cast<uint32_t>(in.Range(0, g.comms + 1));
      r->comm_seq = i;
      r->op = static_cast<uint8_t>(in.Take<uint8_t>());
      r->dtype = static_cast<uint8_t>(in.Take<uint8_t>());
      r->redop = static_cast<int16_t>(in.Take<int16_t>());
      r->peer = in.Take<int8_t>();
      r->lane = static_cast<uint8_t>(l);
    }
  }
  return img;
}

// Everything a reader does with an open segment, with the results bounded by the geometry the
// reader validated at open. `max` bounds the records asked for per lane.
inline void ExerciseReader(const daemon::SegmentReader& seg, size_t max) {
  const FalconShmHeader& h = seg.header();
  if (seg.lane_count() != h.lane_count) PropertyFailed("lane_count differs from the header copy");
  (void)seg.head();
  (void)seg.records_lost();
  (void)seg.records_dropped();
  (void)seg.exited();
  if (seg.Comms().size() > h.comm_capacity) PropertyFailed("more communicators than the table holds");
  if (seg.Threads().size() > h.thread_capacity) PropertyFailed("more threads than the table holds");
  const daemon::CommTable comms = daemon::MakeCommTable(seg);
  for (uint32_t slot = 0; slot <= h.comm_capacity + 1; ++slot) (void)seg.CommCalls(slot);
  (void)seg.CommCalls(0xFFFFFFFFu);
  uint64_t ack = 0;
  (void)seg.pause_state(&ack);
  (void)seg.trapped_comm_slot();
  FalconTaskResult result{};
  (void)seg.TaskDone(1, &result);
  (void)seg.plan_version();
  (void)seg.plan_acks();
  daemon::ShmPlan plan;
  (void)daemon::ReadPlanBlock(seg.plan(), &plan);

  daemon::ReadCursor cursors[3] = {daemon::ReadCursor{}, seg.OldestCursor(), seg.HeadCursor()};
  for (daemon::ReadCursor& cursor : cursors) {
    if (!cursor.next.empty() && cursor.next.size() != h.lane_count) PropertyFailed("cursor of another geometry");
    for (auto mode : {daemon::SegmentReader::ReadMode::kLive, daemon::SegmentReader::ReadMode::kFinal}) {
      std::vector<FalconRecord> out;
      const daemon::ReadStats stats = seg.Read(&cursor, max, mode, &out);
      if (stats.read != out.size()) PropertyFailed("read count differs from the records returned");
      if (out.size() > max * h.lane_count) PropertyFailed("more records than asked for");
      for (const FalconRecord& r : out) (void)daemon::RecordToJson(r, h, comms).dump();
    }
  }
}

}  // namespace falcon::fuzz
