// Outbox: the agent's bounded queue of stream entries waiting to be written to Redis. Reports
// that must not be lost (iteration batches, alarms, profiles, acks) wait here while Redis is
// unreachable; when the queue is full the oldest entry is dropped and counted. Entries carry
// increasing sequence numbers so a flush in flight can be confirmed even if older entries were
// dropped meanwhile.
// Thread-safety: one owner (the agent loop). Must never: grow beyond its capacity, or block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace falcon::agent {

struct OutEntry {
  std::uint64_t seq = 0;
  std::string stream;   // key
  std::string payload;  // JSON text
  // May share a stream entry with the messages queued next to it for the same stream (see
  // ReportPublisher::Queue).
  bool packable = false;
};

class Outbox {
 public:
  explicit Outbox(std::size_t capacity) : capacity_(capacity) {}

  void Push(std::string stream, std::string payload, bool packable = false);
  // Copies of up to `max` oldest entries (for a flush).
  std::vector<OutEntry> Peek(std::size_t max) const;
  // Removes entries with seq <= `seq` (written to Redis).
  void ConfirmThrough(std::uint64_t seq);

  std::size_t size() const { return q_.size(); }
  bool empty() const { return q_.empty(); }
  std::uint64_t dropped() const { return dropped_; }
  std::uint64_t confirmed() const { return confirmed_; }

 private:
  std::size_t capacity_;
  std::deque<OutEntry> q_;
  std::uint64_t next_seq_ = 1;
  std::uint64_t dropped_ = 0;
  std::uint64_t confirmed_ = 0;
};

}  // namespace falcon::agent
