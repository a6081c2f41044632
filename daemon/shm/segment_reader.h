// SegmentReader: read-side view of one shim segment (shm_abi.h).
//
// Opens one segment file (segment_dir.h names them), validates everything a reader relies on (magic, ABI version,
// struct sizes, offsets and capacities inside the file) and refuses a segment that fails any
// check with a Status that says which. Reads records with the seqlock protocol: a record is
// returned only if it was read whole; overwritten records are counted as lost and torn ones
// (a writer died mid-record) as torn.
// Thread-compatible: one SegmentReader per thread; many readers may map one segment.
// Shared memory is untrusted after open: the traced process maps the segment read-write and a
// stray write may change any byte at any time. The reader copies the header once at open,
// validates the copy and takes every size, offset and capacity from it; what it still reads from
// the live mapping (heads, counters, used counts, records) is bounded by the copy before use.
// Never writes to the segment except through the agent's calls (PublishCursor, the control
// block requests, WritePlan), which only the one "active" reader (the agent) may make, on a
// reader opened with Access::kReadWrite.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "daemon/shm/plan_block.h"
#include "falcon/shm_abi.h"
#include "falcon/status.h"

namespace falcon::daemon {

struct CommInfo {
  uint32_t slot = 0;
  FalconCommEntry entry{};  // a consistent copy
};

struct ThreadInfo {
  uint32_t slot = 0;
  FalconThreadSlot entry{};
};

// Where a reader is in each lane: next[l] is the next index of lane l it will read.
struct ReadCursor {
  std::vector<uint64_t> next;
};

struct ReadStats {
  uint64_t read = 0;   // records returned
  uint64_t lost = 0;   // overwritten before this reader got to them
  uint64_t torn = 0;   // half-written records skipped (final reads only)
};

class SegmentReader {
 public:
  enum class Access { kReadOnly, kReadWrite };
  // kLive: stop at a record still being written (retry later). kFinal: the writer is gone or the
  // caller wants a snapshot: a half-written record is skipped and counted as torn.
  enum class ReadMode { kLive, kFinal };

  static Result<SegmentReader> Open(const std::string& path, Access access = Access::kReadOnly);

  SegmentReader(SegmentReader&& other) noexcept;
  SegmentReader& operator=(SegmentReader&& other) noexcept;
  SegmentReader(const SegmentReader&) = delete;
  SegmentReader& operator=(const SegmentReader&) = delete;
  ~SegmentReader();

  const std::string& path() const { return path_; }
  // The header as copied and validated at open: geometry and identity (pid, names: their text
  // fields are NUL-terminated in the copy). Fields the shim keeps updating (state, shim_flags,
  // comm_used, thread_used, counters, real_minus_mono_ns) are stale here: read them from
  // live_header(), atomically, and bound them before use.
  const FalconShmHeader& header() const { return header_copy_; }
  // The live header in shared memory; any field may change under the reader.
  const FalconShmHeader& live_header() const { return *header_; }
  const FalconControl& control() const { return *control_; }
  const FalconPlanBlock& plan() const { return *plan_; }
  uint32_t lane_count() const { return header_copy_.lane_count; }
  // Records written so far, all lanes together.
  uint64_t head() const;
  // Cursors at the oldest record still held in every lane, or at every lane's head.
  ReadCursor OldestCursor() const;
  ReadCursor HeadCursor() const;
  uint64_t records_lost() const;    // writer-side count, all lanes (shm_abi.h contract 4)
  uint64_t records_dropped() const;
  uint64_t queries() const;         // queries counted, not recorded (FalconOpIsQuery), all lanes
  uint64_t lane_queries(uint32_t lane) const;  // one lane's (0 for a lane beyond lane_count)
  bool exited() const;              // the process ran its exit handlers

  std::vector<CommInfo> Comms() const;
  std::vector<ThreadInfo> Threads() const;

  // Appends the records between *cursor and the lanes' heads (at most `max` per lane) to `out`,
  // merged in time order (t_start_mono_ns, lane, seq), and advances *cursor past what it
  // consumed. A cursor older than a lane's oldest index jumps forward; the gap counts as lost.
  // A default-constructed cursor starts at index 0 of every lane.
  ReadStats Read(ReadCursor* cursor, size_t max, ReadMode mode, std::vector<FalconRecord>* out) const;

  // REQUIRES: opened kReadWrite. Tells the writer what this reader has consumed.
  void PublishCursor(const ReadCursor& cursor);

  // REQUIRES: opened kReadWrite. Agent → shim command: `mode` is a FalconMode value (the shim
  // ignores values it does not know); bumps command_seq.
  void RequestMode(uint32_t mode, uint32_t sample_every);

  // Pause protocol (FalconControl in shm_abi.h). REQUIRES: opened kReadWrite.
  // Asks the shim to stop before the first call that reaches one of `targets` (1 to
  // FALCON_PAUSE_MAX_TARGETS; more are not written: the shim rejects the request); returns the
  // pause generation, 0 when read-only.
  uint64_t RequestPause(std::span<const FalconPauseTarget> targets, int64_t deadline_real_ns);
  // The same with one target: call `comm_seq` on `comm_slot`.
  uint64_t RequestPause(uint32_t comm_slot, uint64_t comm_seq, int64_t deadline_real_ns);
  void RequestResume(uint64_t pause_gen);
  // The shim's report: state and the generation it refers to.
  FalconPauseState pause_state(uint64_t* ack_gen) const;
  // While trapped: the comm slot of the call the rank is held before (its comm_seq is counted
  // in CommCalls but the call is not issued), FALCON_NO_COMM when stopped after a group.
  uint32_t trapped_comm_slot() const;
  // Posts a benchmark task (the process must be trapped); returns its sequence number.
  uint64_t PostTask(const FalconTask& task);
  // As PostTask, with the task's input blob (FALCON_TASK_BLOB_LEN bytes, written first).
  uint64_t PostTask(const FalconTask& task, const uint8_t* blob);
  // The shim's answer blob of the last task (kFalconTaskCommId: the unique id). REQUIRES: the
  // task is done (TaskDone returned true for it).
  void TaskResultBlob(uint8_t* out) const;
  // True once the task `seq` has finished; *out is its result.
  bool TaskDone(uint64_t seq, FalconTaskResult* out) const;
  // Plan block (plan_block.h). REQUIRES: opened kReadWrite (else Unavailable), one writer.
  // Writes `plan` whole, or refuses it (CheckPlanFits) and leaves the block as it was.
  [[nodiscard]] Status WritePlan(const ShmPlan& plan);
  uint32_t plan_version() const { return PlanBlockVersion(*plan_); }
  PlanAcks plan_acks() const { return ReadPlanAcks(*plan_); }

  // Calls made so far on communicator `slot` (the next call's comm_seq); 0 if out of range.
  uint64_t CommCalls(uint32_t slot) const;

 private:
  SegmentReader() = default;
  ReadStats ReadLane(uint32_t lane, uint64_t* next, size_t max, ReadMode mode, std::vector<FalconRecord>* out) const;
  std::string path_;
  void* base_ = nullptr;
  size_t size_ = 0;
  FalconShmHeader header_copy_{};  // validated at open; the only source of geometry
  FalconShmHeader* header_ = nullptr;
  FalconControl* control_ = nullptr;
  FalconPlanBlock* plan_ = nullptr;
  FalconCommEntry* comms_ = nullptr;
  FalconThreadSlot* threads_ = nullptr;
  FalconLane* lanes_ = nullptr;
  FalconRecord* ring_ = nullptr;
  bool writable_ = false;
};

// Checks a header copy against the ABI and a file size; the message names the failed check.
Status ValidateHeader(const FalconShmHeader& h, uint64_t file_size);

}  // namespace falcon::daemon
