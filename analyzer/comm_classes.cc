// Communicator classes, suspicion and the compute suspect. See comm_classes.h for the contract.
#include "analyzer/comm_classes.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <unordered_set>

#include "analyzer/robust.h"

namespace falcon::analyzer {
namespace {

bool TermLess(const SignatureTerm& a, const SignatureTerm& b) {
  if (a.op != b.op) return a.op < b.op;
  return a.bytes < b.bytes;
}

// Sort key of a class: size first, then the canonical terms, (op, bytes, count) each.
struct ClassKey {
  std::uint32_t nranks;
  std::vector<SignatureTerm> terms;
  bool operator<(const ClassKey& o) const {
    if (nranks != o.nranks) return nranks < o.nranks;
    const auto tuple = [](const SignatureTerm& t) { return std::tuple(t.op, t.bytes, t.count); };
    return std::lexicographical_compare(
        terms.begin(), terms.end(), o.terms.begin(), o.terms.end(),
        [&](const SignatureTerm& a, const SignatureTerm& b) { return tuple(a) < tuple(b); });
  }
};

bool Valid(double x) { return std::isfinite(x) && x > 0.0; }

}  // namespace

std::vector<SignatureTerm> CanonicalSignature(std::span<const SignatureTerm> terms,
                                              const ClassOptions& options) {
  std::vector<SignatureTerm> out;
  for (SignatureTerm t : terms) {
    if (t.op == OpKind::kOther || t.count == 0) continue;
    if (options.p2p_match == P2pMatch::kMergeSendRecv && t.op == OpKind::kRecv) {
      t.op = OpKind::kSend;
    }
    if (options.size_match == SizeMatch::kSizeClass) t.bytes = SizeClass(t.bytes);
    out.push_back(t);
  }
  std::sort(out.begin(), out.end(), TermLess);
  std::vector<SignatureTerm> merged;
  for (const SignatureTerm& t : out) {
    if (!merged.empty() && merged.back().op == t.op && merged.back().bytes == t.bytes) {
      merged.back().count += t.count;
    } else {
      merged.push_back(t);
    }
  }
  return merged;
}

Result<CommClassification> ClassifyCommunicators(std::span<const CommProfile> comms,
                                                 const ClassOptions& options) {
  std::unordered_set<std::uint64_t> ids;
  for (std::size_t i = 0; i < comms.size(); ++i) {
    const CommProfile& c = comms[i];
    if (c.nranks == 0) {
      return Status::InvalidArgument("communicator " + std::to_string(i) + " has 0 ranks");
    }
    if (!c.members.empty() && c.members.size() != c.nranks) {
      return Status::InvalidArgument("communicator " + std::to_string(i) + " lists " +
                                     std::to_string(c.members.size()) + " members for " +
                                     std::to_string(c.nranks) + " ranks");
    }
    if (!ids.insert(c.id).second) {
      return Status::InvalidArgument("communicator id " + std::to_string(c.id) + " appears twice");
    }
  }
  CommClassification out;
  out.class_of.assign(comms.size(), kNoClass);
  std::map<ClassKey, std::size_t> index;
  for (std::size_t i = 0; i < comms.size(); ++i) {
    ClassKey key{comms[i].nranks, CanonicalSignature(comms[i].signature, options)};
    if (key.terms.empty()) {
      out.idle.push_back(i);
      continue;
    }
    auto [it, inserted] = index.try_emplace(key, out.classes.size());
    if (inserted) out.classes.push_back({key.nranks, key.terms, {}});
    out.classes[it->second].comms.push_back(i);
    out.class_of[i] = it->second;
  }
  return out;
}

Result<std::vector<CommAssessment>> FlagSuspicious(const CommClassification& classes,
                                                   std::span<const double> metric,
                                                   const SuspicionOptions& options) {
  if (metric.size() != classes.class_of.size()) {
    return Status::InvalidArgument("FlagSuspicious: " + std::to_string(metric.size()) +
                                   " metrics for " + std::to_string(classes.class_of.size()) +
                                   " communicators");
  }
  if (!(options.suspicious_ratio >= 1.0)) {
    return Status::InvalidArgument("suspicious_ratio must be >= 1");
  }
  std::vector<CommAssessment> out(metric.size());
  for (std::size_t i = 0; i < metric.size(); ++i) {
    out[i].comm = i;
    out[i].class_index = classes.class_of[i];
    out[i].metric = metric[i];
  }
  std::vector<double> values, scratch;
  for (std::size_t c = 0; c < classes.classes.size(); ++c) {
    const std::vector<std::size_t>& members = classes.classes[c].comms;
    values.clear();
    for (const std::size_t i : members) {
      if (Valid(metric[i])) values.push_back(metric[i]);
    }
    const double class_median = values.empty() ? 0.0 : Median(values, scratch);
    for (const std::size_t i : members) {
      CommAssessment& a = out[i];
      if (!Valid(metric[i])) continue;  // kNoData
      a.peers = values.size() - 1;
      if (a.peers == 0) {
        a.verdict = CommVerdict::kNoPeers;
        continue;
      }
      if (options.baseline == SuspicionBaseline::kPeerMedian) {
        std::vector<double> others;
        for (const std::size_t j : members) {
          if (j != i && Valid(metric[j])) others.push_back(metric[j]);
        }
        a.baseline = Median(others, scratch);
      } else {
        a.baseline = class_median;
      }
      a.ratio = a.metric / a.baseline;
      a.verdict = a.ratio > options.suspicious_ratio ? CommVerdict::kSuspicious
                                                     : CommVerdict::kHealthy;
    }
  }
  return out;
}

Result<ComputeSuspect> FindComputeSuspect(const CollectiveTimings& t,
                                          const ComputeSuspectOptions& options) {
  const std::size_t n = t.nranks;
  if (n < 2) return Status::InvalidArgument("a compute suspect needs >= 2 ranks");
  if (t.wait_s.size() % n != 0) {
    return Status::InvalidArgument("wait_s holds " + std::to_string(t.wait_s.size()) +
                                   " values, not a multiple of " + std::to_string(n) + " ranks");
  }
  const bool arrivals = !t.arrival_ns.empty();
  if (arrivals && t.arrival_ns.size() != t.wait_s.size()) {
    return Status::InvalidArgument("arrival_ns and wait_s differ in size");
  }
  for (const double w : t.wait_s) {
    if (!std::isfinite(w) || w < 0.0) return Status::InvalidArgument("a wait is negative or NaN");
  }
  ComputeSuspect out;
  const std::size_t calls = t.wait_s.size() / n;
  if (calls < options.min_calls || calls == 0) {
    out.verdict = SuspectVerdict::kTooFewCalls;
    return out;
  }
  const auto wait = [&](std::size_t k, std::size_t r) { return t.wait_s[k * n + r]; };
  const auto arrival = [&](std::size_t k, std::size_t r) { return t.arrival_ns[k * n + r]; };

  // Candidate: the least median waiter.
  std::vector<double> column(calls), scratch, medians(n);
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t k = 0; k < calls; ++k) column[k] = wait(k, r);
    medians[r] = Median(column, scratch);
  }
  const std::size_t s = static_cast<std::size_t>(
      std::min_element(medians.begin(), medians.end()) - medians.begin());
  out.rank = static_cast<std::int32_t>(s);
  std::vector<double> others;
  for (std::size_t r = 0; r < n; ++r) {
    if (r != s) others.push_back(medians[r]);
  }
  const double others_wait = Median(others, scratch);

  // Per call: the candidate's advantage in wait and lead in arrival over the runner-up.
  std::vector<double> advantage(calls), lead;
  std::size_t waits_least = 0, enters_last = 0, both = 0;
  for (std::size_t k = 0; k < calls; ++k) {
    double next_wait = std::numeric_limits<double>::infinity();
    std::int64_t next_arrival = std::numeric_limits<std::int64_t>::min();
    for (std::size_t r = 0; r < n; ++r) {
      if (r == s) continue;
      next_wait = std::min(next_wait, wait(k, r));
      if (arrivals) next_arrival = std::max(next_arrival, arrival(k, r));
    }
    advantage[k] = next_wait - wait(k, s);
    const bool least = advantage[k] > 0.0;
    bool last = true;
    if (arrivals) {
      const std::int64_t d = arrival(k, s) - next_arrival;  // ns; fits easily
      lead.push_back(static_cast<double>(d) * 1e-9);
      last = d > 0;
    }
    waits_least += least ? 1 : 0;
    enters_last += last ? 1 : 0;
    both += least && last ? 1 : 0;
  }
  const double total = static_cast<double>(calls);
  out.wait_consistency = static_cast<double>(waits_least) / total;
  out.arrival_consistency = static_cast<double>(enters_last) / total;
  out.confidence = static_cast<double>(both) / total;
  out.wait_advantage_s = Median(advantage, scratch);
  out.lateness_s = arrivals ? Median(lead, scratch) : 0.0;
  out.wait_gap = others_wait > 0.0 ? out.wait_advantage_s / others_wait : 0.0;
  const double spread = RobustSigma(advantage, scratch);
  constexpr double kMaxSnr = 1e6;
  out.snr = out.wait_advantage_s <= 0.0 ? 0.0
            : spread > out.wait_advantage_s / kMaxSnr ? out.wait_advantage_s / spread
                                                     : kMaxSnr;

  if (out.snr < options.min_snr || out.wait_gap < options.min_wait_gap) {
    out.verdict = SuspectVerdict::kNoSuspect;
  } else if (out.wait_consistency < options.min_consistency) {
    out.verdict = SuspectVerdict::kInconsistent;
  } else if (out.arrival_consistency < options.min_consistency) {
    out.verdict = SuspectVerdict::kClockDisagrees;
  } else {
    out.verdict = SuspectVerdict::kFound;
  }
  return out;
}

}  // namespace falcon::analyzer
