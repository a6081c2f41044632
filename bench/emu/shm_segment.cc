// POSIX shm segment create/join/stale-detection; see shm_segment.h for layout and contract.
// Thread-safety: one owner thread per Segment. Must never block or wait: every call is one
// attempt; the init state machine retries with backoff and a deadline.
#include "shm_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "emu_config.h"

namespace falcon::emu {
namespace {

constexpr int64_t kUnsizedStaleNs = 2'000'000'000;

bool PidDead(int32_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

// Unlinks `name` only if it still names the object (dev, ino). Checking and then unlinking is
// not atomic, so the check and the unlink run under an exclusive flock on that object: the name
// leaves an object only under its lock (stale removal here, a member's Unlink, a creator before
// it publishes), so two ranks that both found the same stale segment cannot unlink the fresh one
// the faster of them created between the other's check and its unlink. Never waits: when the
// object is locked (its creator is still creating it, or another rank is removing it) nothing is
// unlinked and the caller tries again later. Returns whether the name was removed.
bool UnlinkIfNames(const std::string& name, uint64_t dev, uint64_t ino) {
  const auto names = [&](int fd) {
    struct stat st{};
    return fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_ino) == ino &&
           static_cast<uint64_t>(st.st_dev) == dev;
  };
  const int fd = shm_open(name.c_str(), O_RDONLY, 0600);
  if (fd < 0) return false;
  bool removed = false;
  if (names(fd) && flock(fd, LOCK_EX | LOCK_NB) == 0) {
    // Locked: the name cannot move off this object now, but it may have done so before the
    // lock was taken (another rank removed it and a new one was created), so look again.
    const int again = shm_open(name.c_str(), O_RDONLY, 0600);
    if (again >= 0) {
      removed = names(again) && shm_unlink(name.c_str()) == 0;
      close(again);
    }
  }
  close(fd);  // releases the lock
  return removed;
}

void UnlinkIfSame(const std::string& name, const struct stat& st) {
  (void)UnlinkIfNames(name, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
}

size_t SlotStride(size_t slot_bytes) { return sizeof(SlotHeader) + slot_bytes; }

}  // namespace

size_t Segment::SizeFor(int n, size_t slot_bytes, size_t p2p) {
  const auto un = static_cast<size_t>(n);
  return sizeof(SegHeader) + un * sizeof(RankCtl) + un * 2 * SlotStride(slot_bytes) +
         un * un * sizeof(Chan) + un * un * 2 * p2p;
}

void Segment::ComputeOffsets() {
  const auto un = static_cast<size_t>(nranks_);
  off_ranks_ = sizeof(SegHeader);
  off_slots_ = off_ranks_ + un * sizeof(RankCtl);
  off_chans_ = off_slots_ + un * 2 * SlotStride(slot_bytes_);
  off_chan_data_ = off_chans_ + un * un * sizeof(Chan);
}

Segment::~Segment() {
  if (base_) munmap(base_, size_);
}

void Segment::Unlink() {
  if (!unlinked_ && !name_.empty()) (void)UnlinkIfNames(name_, dev_, ino_);
  unlinked_ = true;
}

Segment::Status Segment::Create(int fd, uint64_t key, int nranks, size_t slot_bytes,
                                size_t p2p_bytes, std::string* err) {
  const size_t size = SizeFor(nranks, slot_bytes, p2p_bytes);
  // Held until the header is published (the unlock below): a rank that finds the object
  // unfinished cannot remove it while this creator lives, however long it takes.
  (void)flock(fd, LOCK_EX | LOCK_NB);
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    *err = "fstat(" + name_ + "): " + std::strerror(errno);
    close(fd);
    shm_unlink(name_.c_str());
    return Status::kError;
  }
  dev_ = static_cast<uint64_t>(st.st_dev);
  ino_ = static_cast<uint64_t>(st.st_ino);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    *err = "ftruncate(" + name_ + ", " + std::to_string(size) + "): " + std::strerror(errno);
    close(fd);
    shm_unlink(name_.c_str());
    return Status::kError;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *err = "mmap(" + name_ + "): " + std::strerror(errno);
    close(fd);
    shm_unlink(name_.c_str());
    return Status::kError;
  }
  base_ = p;
  size_ = size;
  nranks_ = nranks;
  slot_bytes_ = slot_bytes;
  p2p_bytes_ = p2p_bytes;
  ComputeOffsets();
  SegHeader* h = header();
  h->version = kSegVersion;
  h->nranks = nranks;
  h->key = key;
  h->epoch_ns = NowNs();
  h->slot_bytes = slot_bytes;
  h->p2p_chunk_bytes = p2p_bytes;
  h->total_bytes = size;
  StoreRelease(h->creator_pid, static_cast<int32_t>(getpid()));
  StoreRelease(h->magic, kSegMagic);
  // Explicitly: the mapping holds the open file, so closing the fd alone would keep the lock.
  (void)flock(fd, LOCK_UN);
  close(fd);
  unlinked_ = false;
  return Status::kOk;
}

bool Segment::UnfinishedTooLong(const struct stat& st) {
  // The timer belongs to one object: when the name now holds another (a peer unlinked the
  // stale one and is creating its replacement), the wait starts again. Otherwise a rank whose
  // timer ran on the dead job's segment would unlink its peer's fresh one, and the two would
  // rendezvous in different segments until the deadline.
  const int64_t now = NowNs();
  const auto ino = static_cast<uint64_t>(st.st_ino), dev = static_cast<uint64_t>(st.st_dev);
  if (unsized_since_ns_ == 0 || ino != unsized_ino_ || dev != unsized_dev_) {
    unsized_since_ns_ = now;
    unsized_ino_ = ino;
    unsized_dev_ = dev;
    return false;
  }
  if (now - unsized_since_ns_ <= kUnsizedStaleNs) return false;
  unsized_since_ns_ = 0;
  return true;
}

Segment::Status Segment::TryOpen(const std::string& name, uint64_t key, int nranks,
                                 size_t slot_bytes, size_t p2p_bytes, std::string* err) {
  name_ = name;
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) return Create(fd, key, nranks, slot_bytes, p2p_bytes, err);
  if (errno != EEXIST) {
    *err = "shm_open(" + name + "): " + std::strerror(errno);
    return Status::kError;
  }
  fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    if (errno == ENOENT) return Status::kPending;  // unlinked between the two calls
    *err = "shm_open(" + name + "): " + std::strerror(errno);
    return Status::kError;
  }
  struct stat st{};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(SegHeader)) {
    if (UnfinishedTooLong(st)) UnlinkIfSame(name, st);  // creator died between O_EXCL and ftruncate
    close(fd);
    return Status::kPending;
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    *err = "mmap(" + name + "): " + std::strerror(errno);
    return Status::kError;
  }
  auto* h = static_cast<SegHeader*>(p);
  const int32_t creator = LoadAcquire(h->creator_pid);
  const bool published = LoadAcquire(h->magic) == kSegMagic;
  if (PidDead(creator)) {
    // A segment left by a dead job (or a creator that crashed during init): start fresh.
    munmap(p, size);
    UnlinkIfSame(name, st);
    close(fd);
    return Status::kPending;
  }
  if (!published && creator == 0) {
    // Sized but no creator recorded yet: the creator is between ftruncate and publishing, or
    // died there. Same rule as an unsized segment: stale after kUnsizedStaleNs.
    munmap(p, size);
    if (UnfinishedTooLong(st)) UnlinkIfSame(name, st);
    close(fd);
    return Status::kPending;
  }
  close(fd);
  dev_ = static_cast<uint64_t>(st.st_dev);
  ino_ = static_cast<uint64_t>(st.st_ino);
  if (!published) {
    munmap(p, size);
    return Status::kPending;
  }
  if (h->version != kSegVersion || h->key != key || h->total_bytes != size) {
    munmap(p, size);
    *err = "segment " + name + " has an incompatible layout";
    return Status::kError;
  }
  if (h->nranks != nranks) {
    *err = "nranks mismatch: this rank passed " + std::to_string(nranks) +
           " but the communicator was created with " + std::to_string(h->nranks);
    munmap(p, size);
    return Status::kError;
  }
  base_ = p;
  size_ = size;
  nranks_ = nranks;
  slot_bytes_ = h->slot_bytes;
  p2p_bytes_ = h->p2p_chunk_bytes;
  ComputeOffsets();
  unlinked_ = false;
  return Status::kOk;
}

RankCtl* Segment::rank(int r) const {
  return reinterpret_cast<RankCtl*>(static_cast<char*>(base_) + off_ranks_) + r;
}

SlotHeader* Segment::slot_header(int r, uint64_t step) const {
  const size_t idx = static_cast<size_t>(r) * 2 + (step & 1);
  return reinterpret_cast<SlotHeader*>(static_cast<char*>(base_) + off_slots_ +
                                       idx * SlotStride(slot_bytes_));
}

char* Segment::slot_data(int r, uint64_t step) const {
  return reinterpret_cast<char*>(slot_header(r, step)) + sizeof(SlotHeader);
}

Chan* Segment::chan(int src, int dst) const {
  const size_t idx = static_cast<size_t>(src) * static_cast<size_t>(nranks_) + static_cast<size_t>(dst);
  return reinterpret_cast<Chan*>(static_cast<char*>(base_) + off_chans_) + idx;
}

char* Segment::chan_data(int src, int dst, uint64_t chunk) const {
  const size_t idx = (static_cast<size_t>(src) * static_cast<size_t>(nranks_) +
                      static_cast<size_t>(dst)) * 2 + (chunk & 1);
  return static_cast<char*>(base_) + off_chan_data_ + idx * p2p_bytes_;
}

}  // namespace falcon::emu
