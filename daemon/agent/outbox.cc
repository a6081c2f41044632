// Outbox. See outbox.h for the contract.
#include "daemon/agent/outbox.h"

namespace falcon::agent {

void Outbox::Push(std::string stream, std::string payload, bool packable) {
  if (capacity_ == 0) {
    ++dropped_;
    return;
  }
  while (q_.size() >= capacity_) {
    q_.pop_front();
    ++dropped_;
  }
  q_.push_back({next_seq_++, std::move(stream), std::move(payload), packable});
}

std::vector<OutEntry> Outbox::Peek(std::size_t max) const {
  std::vector<OutEntry> out;
  for (std::size_t i = 0; i < q_.size() && i < max; ++i) out.push_back(q_[i]);
  return out;
}

void Outbox::ConfirmThrough(std::uint64_t seq) {
  while (!q_.empty() && q_.front().seq <= seq) {
    q_.pop_front();
    ++confirmed_;
  }
}

}  // namespace falcon::agent
