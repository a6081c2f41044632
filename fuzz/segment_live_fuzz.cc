// Fuzz target: the segment reader over a live segment that the traced process corrupts after
// open. The input lays out a well-formed segment, which the reader opens read-write as the agent
// does; then the input's patches land through the traced process's own mapping, first one at a
// time between reader passes (reproducible), then from a second thread while the reader reads
// and makes the agent's writes (pause, resume, cursor, mode, plan). No patch may crash the
// reader or make it read outside the geometry it validated at open.
#include <thread>

#include "fuzz/segment_fuzz.h"

namespace {

void AgentWrites(falcon::daemon::SegmentReader& seg, falcon::fuzz::FuzzInput& in) {
  using namespace falcon;
  seg.PublishCursor(seg.HeadCursor());
  seg.RequestMode(in.Take<uint8_t>(), in.Take<uint8_t>());
  FalconPauseTarget targets[2] = {};
  targets[0].comm_slot = static_cast<uint32_t>(in.Range(0, 4));
  targets[0].seq = in.Take<uint16_t>();
  const uint64_t gen = seg.RequestPause(targets, in.Take<int64_t>());
  seg.RequestResume(gen);
  daemon::ShmPlan plan;
  plan.version = seg.plan_version() + 1;
  plan.strategy = 2;
  plan.micro_batches = {1, 2, 3};
  (void)seg.WritePlan(plan);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace falcon;
  fuzz::FuzzInput in(data, size);
  const daemon::SegmentImage img = fuzz::TakeImage(in);
  const size_t max = in.Range(1, 64);
  const fuzz::SegmentFile& file = fuzz::TheSegmentFile();
  file.Write(img.bytes);
  Result<daemon::SegmentReader> opened = daemon::SegmentReader::Open(file.path(), daemon::SegmentReader::Access::kReadWrite);
  if (!opened.ok()) fuzz::PropertyFailed("a well-formed segment was refused");
  daemon::SegmentReader& seg = opened.value();
  fuzz::WriterView traced(file.path(), img.bytes.size());
  if (traced.base() == nullptr) fuzz::PropertyFailed("cannot map the segment as the traced process");
  fuzz::ExerciseReader(seg, max);

  const std::vector<fuzz::Patch> patches = fuzz::TakePatches(in, img.bytes.size(), 48);
  for (const fuzz::Patch& p : patches) {  // one at a time: reproducible
    fuzz::ApplyPatch(traced.base(), p);
    fuzz::ExerciseReader(seg, max);
  }
  fuzz::FuzzInput writes(data, size);  // the agent's own writes reuse the input's bytes
  AgentWrites(seg, writes);

  std::atomic<bool> stop{false};
  std::thread corrupter([&] {  // and concurrently, as a stray writer in the job would
    for (int round = 0; round < 8 && !stop.load(std::memory_order_relaxed); ++round) {
      for (const fuzz::Patch& p : patches) fuzz::ApplyPatch(traced.base(), p);
    }
  });
  for (int pass = 0; pass < 3; ++pass) {
    fuzz::ExerciseReader(seg, max);
    AgentWrites(seg, writes);
  }
  stop.store(true, std::memory_order_relaxed);
  corrupter.join();
  fuzz::ExerciseReader(seg, max);
  return 0;
}
