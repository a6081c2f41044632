// A well-formed segment of this ABI as bytes, for tests and fuzz targets that need a segment
// without a shim: the header with every size and offset the reader checks, an empty control and
// plan block, `comms` live communicator entries, and every lane's descriptor. Callers fill
// records, counters or identity fields in the bytes (the offsets are in the returned header)
// and write the bytes to a file. Header-only so that each test and fuzz target builds it alone.
// Thread-safety: pure functions.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "falcon/shm_abi.h"

namespace falcon::daemon {

struct SegmentGeometry {
  uint32_t lanes = 2;       // >= 2; the last one is shared
  uint64_t capacity = 64;   // records per lane, a power of two
  uint32_t comms = 0;       // communicator entries, all live
  uint32_t threads = 0;     // thread slots
};

struct SegmentImage {
  FalconShmHeader header{};
  std::string bytes;  // header.segment_size bytes

  template <class T>
  T* At(uint64_t offset) {
    return reinterpret_cast<T*>(bytes.data() + offset);
  }
  FalconLane* Lane(uint32_t l) { return At<FalconLane>(header.lane_offset + l * sizeof(FalconLane)); }
  FalconRecord* Record(uint32_t lane, uint64_t index) {
    return At<FalconRecord>(header.ring_offset +
                            (lane * header.lane_capacity + index % header.lane_capacity) * sizeof(FalconRecord));
  }
  FalconCommEntry* Comm(uint32_t slot) {
    return At<FalconCommEntry>(header.comm_offset + slot * sizeof(FalconCommEntry));
  }
  // Copies the header (after the caller changed it) back into the bytes.
  void StoreHeader() { std::memcpy(bytes.data(), &header, sizeof(header)); }
};

inline uint64_t AlignSegment(uint64_t v) { return (v + 63) & ~uint64_t{63}; }

inline SegmentImage MakeSegmentImage(const SegmentGeometry& g) {
  SegmentImage img;
  FalconShmHeader& h = img.header;
  h.magic = FALCON_SHM_MAGIC;
  h.abi_version = FALCON_SHM_ABI_VERSION;
  h.header_size = sizeof(FalconShmHeader);
  h.control_size = sizeof(FalconControl);
  h.comm_entry_size = sizeof(FalconCommEntry);
  h.thread_slot_size = sizeof(FalconThreadSlot);
  h.record_size = sizeof(FalconRecord);
  h.lane_size = sizeof(FalconLane);
  h.plan_size = sizeof(FalconPlanBlock);
  h.lane_count = g.lanes;
  h.lane_capacity = g.capacity;
  h.comm_capacity = g.comms;
  h.thread_capacity = g.threads;
  h.control_offset = AlignSegment(sizeof(FalconShmHeader));
  h.plan_offset = AlignSegment(h.control_offset + sizeof(FalconControl));
  h.comm_offset = AlignSegment(h.plan_offset + sizeof(FalconPlanBlock));
  h.thread_offset = AlignSegment(h.comm_offset + g.comms * sizeof(FalconCommEntry));
  h.lane_offset = AlignSegment(h.thread_offset + g.threads * sizeof(FalconThreadSlot));
  h.ring_offset = AlignSegment(h.lane_offset + g.lanes * sizeof(FalconLane));
  h.segment_size = AlignSegment(h.ring_offset + g.lanes * g.capacity * sizeof(FalconRecord));
  h.pid = 1;
  h.state = kFalconProcRunning;
  h.comm_used = g.comms;
  h.rank_hint = -1;
  h.local_rank_hint = -1;
  img.bytes.assign(h.segment_size, '\0');
  img.StoreHeader();
  for (uint32_t c = 0; c < g.comms; ++c) {
    FalconCommEntry* e = img.Comm(c);
    e->state = kFalconCommLive;
    e->comm_id = 0x1000 + c;
    e->nranks = 4;
    e->device = -1;
    e->color = -1;
  }
  for (uint32_t l = 0; l < g.lanes; ++l) {
    img.Lane(l)->shared = l + 1 == g.lanes ? 1 : 0;
    img.Lane(l)->owner_thread = 0xFFFFFFFFu;
  }
  return img;
}

}  // namespace falcon::daemon
