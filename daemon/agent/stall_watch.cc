#include "daemon/agent/stall_watch.h"

#include <algorithm>
#include <limits>

namespace falcon::agent {

std::optional<StallCall> OutstandingCall(const daemon::SegmentProgress& p) {
  const analyzer::RankProgress& r = p.progress;
  // Pending tracked work: the first call not completed on each communicator whose completion is
  // known (a communicator's work completes in order); the oldest of those by issue time. One
  // whose call left the read window counts as issued before every call still in it.
  std::optional<StallCall> best;
  std::int64_t best_issue = std::numeric_limits<std::int64_t>::max();
  for (const analyzer::CommProgress& c : r.comms) {
    if (!c.completion_known || c.completed >= c.issued) continue;
    StallCall s;
    s.comm = c.comm;
    s.seq = c.completed;
    s.in_host_call = r.in_call.has_value() && *r.in_call == c.comm;
    std::int64_t issue = std::numeric_limits<std::int64_t>::min();
    for (const analyzer::IssuedCall& i : r.recent) {
      if (i.comm == c.comm && i.seq == c.completed) {
        s.op = i.sig.op;
        issue = i.issue_ns;
      }
    }
    if (!best || issue < best_issue) {
      best = s;
      best_issue = issue;
    }
  }
  if (best) return best;
  if (!r.in_call) return std::nullopt;
  StallCall s;
  s.comm = *r.in_call;
  s.in_host_call = true;
  for (const analyzer::CommProgress& c : r.comms) {
    if (c.comm != s.comm || c.issued == 0) continue;
    for (const analyzer::IssuedCall& i : r.recent) {
      if (i.comm == c.comm && i.seq + 1 == c.issued) {
        s.seq = i.seq;
        s.op = i.sig.op;
      }
    }
  }
  return s;
}

double StallWatch::bound_s(double iteration_s) const {
  return std::max(options_.floor_s, iteration_s > 0 ? options_.factor * iteration_s : options_.startup_s);
}

std::optional<StallEvent> StallWatch::Update(const daemon::SegmentProgress& p, std::int64_t now_mono_ns,
                                             double iteration_s) {
  age_s_ = p.last_call_mono_ns > 0 && now_mono_ns > p.last_call_mono_ns
               ? static_cast<double>(now_mono_ns - p.last_call_mono_ns) / 1e9
               : 0;
  const double bound = bound_s(iteration_s);
  std::optional<StallCall> outstanding;
  bool now_stalled = false;
  if (!p.paused && p.phase == 0 && p.last_call_mono_ns > 0 && age_s_ > bound) {
    outstanding = OutstandingCall(p);
    now_stalled = outstanding.has_value();
  }
  if (now_stalled == stalled_) return std::nullopt;
  stalled_ = now_stalled;
  if (stalled_) ++stalls_;
  StallEvent e;
  e.stalled = stalled_;
  e.age_s = age_s_;
  e.bound_s = bound;
  e.last_call_mono_ns = p.last_call_mono_ns;
  if (outstanding) e.waiting_in = *outstanding;
  return e;
}

}  // namespace falcon::agent
