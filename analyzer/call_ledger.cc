// CallLedger. See call_ledger.h for the contract.
#include "analyzer/call_ledger.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace falcon::analyzer {
namespace {

constexpr std::size_t kAgreedMax = 65536;  // tie-breakers kept

}  // namespace

void CallLedger::Add(std::int64_t rank, std::uint64_t comm, std::int32_t nranks, std::uint64_t seq, std::uint64_t n,
                     const CallSignature& sig, std::int64_t now_ns) {
  if (n == 0 || nranks < 2) return;
  if (n > options_.window) {  // only the newest `window` of a long run can still be compared
    seq += n - options_.window;
    n = options_.window;
  }
  Comm& c = comms_[comm];
  if (c.nranks != nranks) {
    // A communicator id names one set of members; a different size means reports that cannot be
    // compared with what is held (a bad report, or an id reused): start over.
    for (auto& [s, e] : c.seqs) differing_.erase({comm, s});
    c.seqs.clear();
    c.nranks = nranks;
    c.newest = 0;
  }
  const std::uint64_t last = seq + (n - 1);
  c.last_ns = now_ns;
  c.newest = std::max(c.newest, last);
  for (std::uint64_t s = seq;; ++s) {
    if (s + options_.window >= c.newest) {
      auto [it, fresh] = c.seqs.try_emplace(s);
      Entry& e = it->second;
      if (fresh) e.first_ns = now_ns;
      const bool seen = std::any_of(e.reports.begin(), e.reports.end(), [rank](const auto& r) { return r.first == rank; });
      if (!seen) {
        e.reports.emplace_back(rank, sig);
        if (e.differ_ns < 0 && !(sig == e.reports.front().second)) {
          e.differ_ns = now_ns;
          differing_.insert({comm, s});
        }
        if (e.reports.size() >= static_cast<std::size_t>(nranks) && (e.differ_ns < 0 || !Tied(e))) Decide(comm, c, it);
      }
    }
    if (s == last) break;
  }
  Evict(comm, c, c.newest);
}

void CallLedger::Evict(std::uint64_t comm_id, Comm& c, std::uint64_t newest) {
  while (!c.seqs.empty() && c.seqs.begin()->first + options_.window < newest) {
    auto it = c.seqs.begin();
    if (it->second.differ_ns < 0) ++expired_;
    Decide(comm_id, c, it);
  }
}

bool CallLedger::Tied(const Entry& e) {
  std::vector<std::pair<CallSignature, std::size_t>> tally;
  for (const auto& [rank, sig] : e.reports) {
    auto t = std::find_if(tally.begin(), tally.end(), [&want = sig](const auto& x) { return x.first == want; });
    if (t == tally.end()) tally.emplace_back(sig, 1);
    else ++t->second;
  }
  std::sort(tally.begin(), tally.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return tally.size() > 1 && tally[0].second == tally[1].second;
}

void CallLedger::Decide(std::uint64_t comm_id, Comm& c, std::map<std::uint64_t, Entry>::iterator it) {
  Entry& e = it->second;
  if (e.differ_ns >= 0) {
    differing_.erase({comm_id, it->first});
    const auto like = agreed_.find({c.nranks, it->first});
    std::optional<Finding> f =
        MismatchOf(comm_id, it->first, std::move(e.reports), like == agreed_.end() ? nullptr : &like->second);
    if (f && c.raised < options_.max_per_comm) {
      ++c.raised;
      ++raised_;
      decided_.push_back(std::move(*f));
    } else if (f) {
      ++suppressed_;
    }
  } else if (e.reports.size() >= static_cast<std::size_t>(c.nranks)) {
    ++compared_;
    const std::pair<std::int32_t, std::uint64_t> key{c.nranks, it->first};
    if (agreed_.insert_or_assign(key, e.reports.front().second).second) {
      agreed_order_.push_back(key);
      if (agreed_order_.size() > kAgreedMax) {
        agreed_.erase(agreed_order_.front());
        agreed_order_.pop_front();
      }
    }
  }
  c.seqs.erase(it);
}

std::vector<Finding> CallLedger::Take(std::int64_t now_ns) {
  for (auto d = differing_.begin(); d != differing_.end();) {
    const auto [comm_id, seq] = *d++;  // Decide erases the current element
    Comm& c = comms_[comm_id];
    auto it = c.seqs.find(seq);
    if (it != c.seqs.end() && now_ns - it->second.differ_ns >= options_.grace_ns) Decide(comm_id, c, it);
  }
  for (auto ci = comms_.begin(); ci != comms_.end();) {
    Comm& c = ci->second;
    // Oldest first: entries are made in about seq order, so the first young one ends the scan.
    while (!c.seqs.empty() && now_ns - c.seqs.begin()->second.first_ns > options_.max_age_ns) {
      if (c.seqs.begin()->second.differ_ns < 0) ++expired_;
      Decide(ci->first, c, c.seqs.begin());
    }
    ci = c.seqs.empty() && now_ns - c.last_ns > options_.max_age_ns ? comms_.erase(ci) : std::next(ci);
  }
  std::vector<Finding> out;
  out.swap(decided_);
  return out;
}

void CallLedger::ForgetRank(std::int64_t rank) {
  for (auto& [comm_id, c] : comms_) {
    for (auto it = c.seqs.begin(); it != c.seqs.end();) {
      const auto& reports = it->second.reports;
      if (std::any_of(reports.begin(), reports.end(), [rank](const auto& r) { return r.first == rank; })) {
        differing_.erase({comm_id, it->first});
        it = c.seqs.erase(it);
      } else {
        ++it;
      }
    }
  }
}

std::size_t CallLedger::pending() const {
  std::size_t n = 0;
  for (const auto& [id, c] : comms_) n += c.seqs.size();
  return n;
}

}  // namespace falcon::analyzer
