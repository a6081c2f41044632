// Fuzz target: the segment reader opening a segment that was damaged before it looked. The
// input lays out a well-formed segment (geometry, records, communicators), then patches bytes
// anywhere in it, half of them in the header; the reader must refuse it with a Status or read
// it within the geometry it validated, never crash or allocate by what the file claims.
#include "fuzz/segment_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace falcon;
  fuzz::FuzzInput in(data, size);
  daemon::SegmentImage img = fuzz::TakeImage(in);
  const size_t max = in.Range(1, 64);
  const bool truncate = in.Bool();
  const size_t keep = in.Range(0, img.bytes.size());
  for (const fuzz::Patch& p : fuzz::TakePatches(in, img.bytes.size(), 64)) {
    fuzz::ApplyPatch(reinterpret_cast<uint8_t*>(img.bytes.data()), p);
  }
  if (truncate) img.bytes.resize(keep);  // a file cut short (a full disk, a writer killed)
  const fuzz::SegmentFile& file = fuzz::TheSegmentFile();
  file.Write(img.bytes);
  for (auto access : {daemon::SegmentReader::Access::kReadOnly, daemon::SegmentReader::Access::kReadWrite}) {
    Result<daemon::SegmentReader> seg = daemon::SegmentReader::Open(file.path(), access);
    if (!seg.ok()) {
      if (seg.status().message().empty()) fuzz::PropertyFailed("a refusal without a reason");
      continue;
    }
    fuzz::ExerciseReader(seg.value(), max);
  }
  return 0;
}
