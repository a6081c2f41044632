// Shared-memory transport of the NCCL emulator: one POSIX shm segment per communicator, named
// from the communicator's 64-bit key, holding the rendezvous header, one control block per rank,
// double-buffered collective staging slots and double-buffered point-to-point channels.
//
// Layout (offsets from the mapping start; sizes fixed by the creator and recorded in the header):
//   [SegHeader][RankCtl x n][slot x n x 2][Chan x n x n][chan data x n x n x 2]
//   slot = SlotHeader + slot_bytes data; chan data = p2p_chunk_bytes each.
// Memory is sparse (tmpfs): only the pages a job touches are backed, so the size is bounded by
// n * 2 * slot_bytes + (touched pairs) * 2 * p2p_chunk_bytes regardless of message sizes.
//
// Lifecycle: the first rank creates the name with O_EXCL and mode 0600, takes an exclusive flock
// on it, sizes it, fills the header and publishes `magic` last (release), then drops the lock.
// Joiners map it once the magic is visible. A name whose creator pid is dead, or that stays
// unfinished (unsized, or no creator recorded) for 2 s while nobody holds its lock, is stale: it
// is unlinked and the rendezvous starts over. The rank whose join completes the membership
// unlinks the name (all members hold mappings by then), so a finished or crashed job leaves no
// name behind; a rank that gives up during init unlinks it too. Every unlink removes the name
// only while it still refers to the unlinker's object, checked under that object's flock, so a
// rank never removes a replacement another rank created meanwhile.
//
// Concurrency contract (between processes; every shared word is accessed through
// std::atomic_ref; plain fields are written before the release store that publishes them):
//  1. SegHeader fields are immutable once `magic` is published.
//  2. RankCtl[r].{global_rank, device} are written by rank r before its `pid` (release);
//     `joined` is incremented after `pid` is published. `gone` goes 0 -> 1 once, when rank r
//     aborted the communicator; peers waiting on r then fail as if its process had exited.
//  3. Collective step s uses slot parity s % 2. Rank r writes its slot for step s only after
//     every rank's `consumed` >= s - 2, then publishes `posted` = s (release). Readers read a
//     slot of step s only after seeing `posted` >= s (acquire), then publish `consumed` = s.
//  4. Channel src->dst carries chunks numbered from 1: the sender writes chunk c into parity
//     c % 2 only when `acked` >= c - 2, then publishes `sent` = c; the receiver copies it out after
//     seeing `sent` >= c and publishes `acked` = c. recv_arrive_ns[m % 2] for message m is written
//     by the receiver before it acks any chunk of m.
//  5. Connection (first use of a channel, inside ncclGroupEnd): the sender sets `send_ready`, the
//     receiver `recv_ready` (release, 0 -> 1 once); each side's connect is complete once it sees
//     the other's flag (acquire).
//
// Thread-safety: a Segment object is owned by one communicator and used by one thread at a time.
// Must never: block (TryOpen is a non-blocking attempt the caller repeats), or unlink a segment
// whose creator is alive while its rendezvous is still in progress.
#ifndef FALCON_BENCH_EMU_SHM_SEGMENT_H_
#define FALCON_BENCH_EMU_SHM_SEGMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

struct stat;

namespace falcon::emu {

inline constexpr uint64_t kSegMagic = 0x46414C434F4E454Dull;  // "FALCONEM"
inline constexpr uint32_t kSegVersion = 1;

struct alignas(64) SegHeader {
  uint64_t magic;  // atomic
  uint32_t version;
  int32_t nranks;
  uint64_t key;
  int32_t creator_pid;  // atomic (written before magic)
  int32_t joined;       // atomic
  int64_t epoch_ns;
  uint64_t slot_bytes;
  uint64_t p2p_chunk_bytes;
  uint64_t total_bytes;
  uint8_t reserved[192];
};

struct alignas(64) RankCtl {
  int32_t pid;  // atomic: 0 until the rank joined
  int32_t global_rank;
  int32_t device;
  int32_t gone;       // atomic: 1 once the rank aborted this communicator (comm.h invariant 3)
  uint64_t posted;    // atomic: last collective step whose slot this rank published
  uint64_t consumed;  // atomic: last collective step this rank finished reading
  uint8_t reserved[32];
};

// Describes the data of one collective step; every rank posts one per step.
struct alignas(64) SlotHeader {
  int32_t kind;
  int32_t dtype;
  int32_t redkind;
  int32_t root;
  uint64_t count;
  uint64_t coll_index;
  int64_t arrive_ns;
  int32_t nranks;
  int32_t reserved0;
  uint8_t reserved[16];
};

struct alignas(64) ChunkHeader {
  uint64_t msg_index;
  uint64_t total_bytes;
  uint64_t chunk_bytes;
  int64_t send_arrive_ns;
  int32_t dtype;
  int32_t reserved0;
  uint8_t reserved[24];
};

struct alignas(64) Chan {
  uint64_t sent;        // atomic, sender-written
  uint32_t send_ready;  // atomic, sender-written: 1 once the sender reached its first connect
  uint8_t pad0[52];
  uint64_t acked;  // atomic, receiver-written
  int64_t recv_arrive_ns[2];
  uint32_t recv_ready;  // atomic, receiver-written: 1 once the receiver reached its first connect
  uint8_t pad1[36];
  ChunkHeader hdr[2];
};

template <class T>
T LoadAcquire(T& x) {
  return std::atomic_ref<T>(x).load(std::memory_order_acquire);
}
template <class T>
void StoreRelease(T& x, T v) {
  std::atomic_ref<T>(x).store(v, std::memory_order_release);
}

class Segment {
 public:
  enum class Status { kOk, kPending, kError };

  Segment() = default;
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // One non-blocking attempt to create or map the segment `name` for `nranks` ranks.
  // kPending: try again later. kError: *err says why (e.g. nranks mismatch).
  [[nodiscard]] Status TryOpen(const std::string& name, uint64_t key, int nranks,
                               size_t slot_bytes, size_t p2p_chunk_bytes, std::string* err);
  // Removes the name if this object has not already done so. Mappings stay valid.
  void Unlink();
  [[nodiscard]] bool mapped() const { return base_ != nullptr; }

  [[nodiscard]] SegHeader* header() const { return static_cast<SegHeader*>(base_); }
  [[nodiscard]] RankCtl* rank(int r) const;
  [[nodiscard]] SlotHeader* slot_header(int r, uint64_t step) const;
  [[nodiscard]] char* slot_data(int r, uint64_t step) const;
  [[nodiscard]] size_t slot_bytes() const { return slot_bytes_; }
  [[nodiscard]] Chan* chan(int src, int dst) const;
  [[nodiscard]] char* chan_data(int src, int dst, uint64_t chunk) const;
  [[nodiscard]] size_t p2p_chunk_bytes() const { return p2p_bytes_; }

  // Total mapping size for the given geometry.
  [[nodiscard]] static size_t SizeFor(int nranks, size_t slot_bytes, size_t p2p_chunk_bytes);

 private:
  void ComputeOffsets();
  Status Create(int fd, uint64_t key, int nranks, size_t slot_bytes, size_t p2p_bytes,
                std::string* err);
  // True once the object `st` describes has looked unfinished (unsized, or no creator recorded)
  // for longer than the stale limit across this rank's attempts; then the timer is reset.
  bool UnfinishedTooLong(const struct stat& st);

  std::string name_;
  bool unlinked_ = true;
  void* base_ = nullptr;
  size_t size_ = 0;
  int nranks_ = 0;
  size_t slot_bytes_ = 0;
  size_t p2p_bytes_ = 0;
  size_t off_ranks_ = 0, off_slots_ = 0, off_chans_ = 0, off_chan_data_ = 0;
  uint64_t dev_ = 0, ino_ = 0;     // the object this segment maps: Unlink removes only it
  int64_t unsized_since_ns_ = 0;   // when the object below first looked unfinished; 0: not timing
  uint64_t unsized_ino_ = 0, unsized_dev_ = 0;
};

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_SHM_SEGMENT_H_
