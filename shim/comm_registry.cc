// Communicator registry: see comm_registry.h.
#include "shim/comm_registry.h"

#include <cstring>

#include "shim/log.h"
#include "shim/segment.h"

namespace falcon::shim {

uint64_t Fnv1a(const void* data, size_t len, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

void CommRegistry::Attach(FalconShmHeader* header, FalconCommEntry* table, uint32_t capacity) {
  header_ = header;
  table_ = table;
  capacity_ = capacity;
}

void CommRegistry::Reset() {
  for (MapEntry& e : map_) {
    e.key.store(0, std::memory_order_relaxed);
    e.slot.store(FALCON_NO_COMM, std::memory_order_relaxed);
    e.pending.store(0, std::memory_order_relaxed);
  }
  epoch_.fetch_add(1, std::memory_order_release);
  for (auto& u : unknown_) u.store(0, std::memory_order_relaxed);
  header_ = nullptr;
  table_ = nullptr;
  capacity_ = 0;
}

uint32_t CommRegistry::HashPointer(uintptr_t p) {
  uint64_t x = static_cast<uint64_t>(p) >> 4;
  x *= 0x9E3779B97F4A7C15ull;
  return static_cast<uint32_t>(x >> 40) & (kMapSize - 1);
}

// HOT PATH: no allocation, no lock, no syscall, no logging.
uint32_t CommRegistry::Lookup(const void* comm) const {
  const auto key = reinterpret_cast<uintptr_t>(comm);
  uint32_t i = HashPointer(key);
  for (uint32_t probes = 0; probes < kMapSize; ++probes, i = (i + 1) & (kMapSize - 1)) {
    uintptr_t k = map_[i].key.load(std::memory_order_acquire);
    if (k == key) return map_[i].slot.load(std::memory_order_relaxed);
    if (k == 0) return kNotMapped;
  }
  return kNotMapped;
}

// END HOT PATH

uint32_t CommRegistry::Register(const void* comm, const CommIdentity& id, bool pending) {
  if (table_ == nullptr || comm == nullptr) return FALCON_NO_COMM;
  uint32_t slot = std::atomic_ref<uint32_t>(header_->comm_used).fetch_add(1, std::memory_order_relaxed);
  if (slot >= capacity_) {
    std::atomic_ref<uint64_t>(header_->comm_overflow).fetch_add(1, std::memory_order_relaxed);
    LogOnce(OnceKey::kCommTableFull, LogLevel::kWarn,
            "communicator table full (%u entries); further communicators are recorded without "
            "identity (raise FALCON_COMM_CAPACITY)", capacity_);
    Map(comm, FALCON_NO_COMM, false);
    epoch_.fetch_add(1, std::memory_order_release);
    return FALCON_NO_COMM;
  }
  FillEntry(table_[slot], comm, id);
  Map(comm, slot, pending);
  epoch_.fetch_add(1, std::memory_order_release);
  return slot;
}

const CommRegistry::MapEntry* CommRegistry::Find(const void* comm) const {
  const auto key = reinterpret_cast<uintptr_t>(comm);
  uint32_t i = HashPointer(key);
  for (uint32_t probes = 0; probes < kMapSize; ++probes, i = (i + 1) & (kMapSize - 1)) {
    uintptr_t k = map_[i].key.load(std::memory_order_acquire);
    if (k == key) return &map_[i];
    if (k == 0) return nullptr;
  }
  return nullptr;
}

bool CommRegistry::Pending(const void* comm) const {
  const MapEntry* m = Find(comm);
  return m != nullptr && m->pending.load(std::memory_order_acquire) != 0;
}

void CommRegistry::Complete(const void* comm, int32_t rank, int32_t nranks, int32_t device) {
  auto* m = const_cast<MapEntry*>(Find(comm));
  if (m == nullptr) return;
  uint32_t was = 1;
  if (!m->pending.compare_exchange_strong(was, 0, std::memory_order_acq_rel)) return;
  const uint32_t slot = m->slot.load(std::memory_order_relaxed);
  if (table_ == nullptr || slot >= capacity_) return;
  FalconCommEntry& e = table_[slot];
  std::atomic_ref<uint32_t> state(e.state);
  state.store(kFalconCommWriting, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  if (rank >= 0) e.rank = rank;
  if (nranks >= 0) e.nranks = nranks;
  if (device >= 0) e.device = device;
  state.store(kFalconCommLive, std::memory_order_release);
}

void CommRegistry::FillEntry(FalconCommEntry& e, const void* comm, const CommIdentity& id) {
  std::atomic_ref<uint32_t> state(e.state);
  state.store(kFalconCommWriting, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e.origin = static_cast<uint32_t>(id.origin);
  e.comm_id = id.comm_id;
  e.parent_id = id.parent_id;
  e.rank = id.rank;
  e.nranks = id.nranks;
  e.device = id.device;
  e.color = id.color;
  e.split_index = id.split_index;
  e.handle = reinterpret_cast<uintptr_t>(comm);
  e.create_mono_ns = MonoNowNs();
  e.create_real_ns = RealNowNs();
  if (id.name != nullptr) {
    size_t n = strnlen(id.name, FALCON_NAME_LEN - 1);
    std::memcpy(e.name, id.name, n);
    e.name[n] = '\0';
  }
  state.store(kFalconCommLive, std::memory_order_release);
}

void CommRegistry::Map(const void* comm, uint32_t slot, bool pending) {
  const auto key = reinterpret_cast<uintptr_t>(comm);
  uint32_t i = HashPointer(key);
  for (uint32_t probes = 0; probes < kMapSize; ++probes, i = (i + 1) & (kMapSize - 1)) {
    uintptr_t k = map_[i].key.load(std::memory_order_acquire);
    if (k == key) {  // handle reused without a destroy we saw: the new communicator wins
      map_[i].pending.store(pending ? 1 : 0, std::memory_order_relaxed);
      map_[i].slot.store(slot, std::memory_order_release);
      return;
    }
    if (k == 0 || k == kTombstone) {
      if (map_[i].key.compare_exchange_strong(k, key, std::memory_order_acq_rel)) {
        // No reader can look this handle up before Register returns it to the caller.
        map_[i].pending.store(pending ? 1 : 0, std::memory_order_relaxed);
        map_[i].slot.store(slot, std::memory_order_release);
        return;
      }
    }
  }
  // Map full: the entry exists but calls on this handle will record no slot.
}

void CommRegistry::Forget(const void* comm) {
  if (table_ == nullptr) return;
  const auto key = reinterpret_cast<uintptr_t>(comm);
  uint32_t i = HashPointer(key);
  for (uint32_t probes = 0; probes < kMapSize; ++probes, i = (i + 1) & (kMapSize - 1)) {
    uintptr_t k = map_[i].key.load(std::memory_order_acquire);
    if (k == 0) return;
    if (k != key) continue;
    uint32_t slot = map_[i].slot.load(std::memory_order_relaxed);
    map_[i].pending.store(0, std::memory_order_relaxed);
    map_[i].key.store(kTombstone, std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_release);
    if (slot < capacity_) {
      FalconCommEntry& e = table_[slot];
      e.destroy_mono_ns = MonoNowNs();
      e.destroy_real_ns = RealNowNs();
      std::atomic_ref<uint32_t>(e.state).store(kFalconCommDestroyed, std::memory_order_release);
    }
    return;
  }
}

uint32_t CommRegistry::NextChildIndex(uint32_t parent_slot) {
  if (table_ == nullptr || parent_slot >= capacity_) return 0;
  return std::atomic_ref<uint32_t>(table_[parent_slot].children).fetch_add(1, std::memory_order_relaxed);
}

uint64_t CommRegistry::IdOf(uint32_t slot) const {
  if (table_ == nullptr || slot >= capacity_) return 0;
  return table_[slot].comm_id;
}

}  // namespace falcon::shim
