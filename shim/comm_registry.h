// The shim's communicator registry: ncclComm_t → comm-table slot, and communicator identity.
//
// Identity is what every member computes alike (see FalconCommEntry in shm_abi.h). The shared
// comm table lives in the segment; the pointer map lives in process memory.
// Thread-safety:
//  1. Lookup() is lock-free and may run concurrently with Register()/Forget() of OTHER
//     communicators; NCCL forbids using a communicator while it is being destroyed, so a lookup
//     never races with Forget() of the same handle.
//  2. Register()/Forget() may run concurrently from several threads (one communicator each).
//  3. Slots in the shared table are never reused; a table overflow yields FALCON_NO_COMM and is
//     counted in the header.
//  4. Every Register()/Forget() advances epoch() (release) before returning, so a per-thread
//     cache of one lookup stays valid exactly while the epoch it was taken at is current: a
//     handle destroyed and re-created at the same address is never served from a stale cache.
//  5. NextCallSeq() is an atomic fetch-add: callers on several threads (legal for different
//     communicators, and harmless misuse on one) never share or skip a number.
//  6. An identity may be pending (a nonblocking communicator whose init/split has not finished:
//     NCCL refuses rank/size/device queries until it is ready). Complete() fills it in once;
//     only the caller that observed the communicator ready calls it.
// Never allocates, never blocks, never logs on the Lookup path.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "falcon/shm_abi.h"

namespace falcon::shim {

// FNV-1a 64-bit over `len` bytes, continuing from `h` (start with kFnvOffset).
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t Fnv1a(const void* data, size_t len, uint64_t h = kFnvOffset);

struct CommIdentity {
  uint64_t comm_id = 0;
  uint64_t parent_id = 0;
  FalconCommOrigin origin = kFalconCommByInitRank;
  int32_t rank = -1;
  int32_t nranks = -1;
  int32_t device = -1;
  int32_t color = -1;
  uint32_t split_index = 0;
  const char* name = nullptr;  // may be null
};

class CommRegistry {
 public:
  // Binds the registry to a segment's comm table. Not thread-safe; called at shim init.
  void Attach(FalconShmHeader* header, FalconCommEntry* table, uint32_t capacity);
  // Drops every mapping (after fork: the child owns no communicator).
  void Reset();

  // Lookup() result for a handle the registry has never seen.
  static constexpr uint32_t kNotMapped = 0xFFFFFFFEu;

  // HOT PATH helper: slot of `comm`; FALCON_NO_COMM if it is known but has no table entry
  // (table full); kNotMapped if it was never registered.
  uint32_t Lookup(const void* comm) const;

  // Fills a new table entry and maps `comm` to it; returns the slot, or FALCON_NO_COMM when the
  // table is full (the handle is then mapped to FALCON_NO_COMM so it is not retried).
  // `pending`: rank/nranks/device are not known yet (see invariant 6).
  uint32_t Register(const void* comm, const CommIdentity& id, bool pending = false);
  // True while `comm`'s identity waits for Complete().
  bool Pending(const void* comm) const;
  // Fills in rank, nranks and device of a pending communicator (values < 0 keep the entry's)
  // and clears the pending mark. No-op for a communicator that is not pending.
  void Complete(const void* comm, int32_t rank, int32_t nranks, int32_t device);
  // Advances on every Register()/Forget() (invariant 4).
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  // Marks the communicator destroyed and unmaps its handle.
  void Forget(const void* comm);

  // The n-th (0-based) communicator of `nranks` ranks registered without a known origin.
  uint32_t NextUnknownOrdinal(int32_t nranks) {
    return unknown_[static_cast<uint32_t>(nranks) % kUnknownBuckets].fetch_add(1, std::memory_order_relaxed);
  }
  // Claims the next split/shrink index of `parent_slot` (0-based).
  uint32_t NextChildIndex(uint32_t parent_slot);
  uint64_t IdOf(uint32_t slot) const;
  // HOT PATH helper: the comm_seq of the next ordered call on `slot` (invariant 5). Only
  // ordered calls (FalconOpIsOrdered) take one, so the numbers are alike on every member
  // whatever other threads (a watchdog polling errors) do with the communicator meanwhile.
  uint64_t NextCallSeq(uint32_t slot) {
    return std::atomic_ref<uint64_t>(table_[slot].calls).fetch_add(1, std::memory_order_relaxed);
  }
  // HOT PATH helpers for a communicator's progress (shm_abi.h contract 8): plain atomic stores.
  void NoteCall(uint32_t slot, int64_t mono_ns) {
    std::atomic_ref<int64_t>(table_[slot].last_call_mono_ns).store(mono_ns, std::memory_order_relaxed);
  }
  // Call `seq`'s completion is tracked from now on (a later call's mark may already be there).
  void NoteMarked(uint32_t slot, uint64_t seq) {
    std::atomic_ref<uint64_t> marked(table_[slot].marked);
    if (marked.load(std::memory_order_relaxed) < seq + 1) marked.store(seq + 1, std::memory_order_relaxed);
  }
  // Service thread (the only writer of device_done): call `seq` completed on the device at `now_ns`.
  void NoteDone(uint32_t slot, uint64_t seq, int64_t now_ns) {
    if (slot >= capacity_) return;
    std::atomic_ref<uint64_t> done(table_[slot].device_done);
    if (done.load(std::memory_order_relaxed) >= seq + 1) return;
    std::atomic_ref<int64_t>(table_[slot].done_mono_ns).store(now_ns, std::memory_order_relaxed);
    done.store(seq + 1, std::memory_order_release);
  }

 private:
  static constexpr uint32_t kMapSize = 8192;  // power of two, > any sane live-communicator count
  static constexpr uintptr_t kTombstone = 1;
  struct MapEntry {
    std::atomic<uintptr_t> key{0};
    std::atomic<uint32_t> slot{FALCON_NO_COMM};
    std::atomic<uint32_t> pending{0};  // 1 while the identity waits for Complete()
  };
  static uint32_t HashPointer(uintptr_t p);
  void FillEntry(FalconCommEntry& e, const void* comm, const CommIdentity& id);
  void Map(const void* comm, uint32_t slot, bool pending);
  const MapEntry* Find(const void* comm) const;

  FalconShmHeader* header_ = nullptr;  // fixed after Attach
  FalconCommEntry* table_ = nullptr;   // fixed after Attach
  uint32_t capacity_ = 0;              // fixed after Attach
  std::atomic<uint64_t> epoch_{1};
  static constexpr uint32_t kUnknownBuckets = 64;
  std::atomic<uint32_t> unknown_[kUnknownBuckets] = {};
  MapEntry map_[kMapSize];
};

}  // namespace falcon::shim
