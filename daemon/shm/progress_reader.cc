// ReadProgress (progress_reader.h): the comm table, the thread slots and the tail of every lane
// turned into one RankProgress.
#include "daemon/shm/progress_reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace falcon::daemon {
namespace {

template <typename T>
T Load(const T& field) {
  return std::atomic_ref<T>(const_cast<T&>(field)).load(std::memory_order_acquire);
}

// Calls known complete on `e`, and whether that is all there is to know: true where a tracked
// call is still pending (the count is exact) or every call completed; false where calls were
// never tracked (the count is a lower bound).
std::pair<std::uint64_t, bool> CompletedCalls(const FalconCommEntry& e) {
  const std::uint64_t issued = e.calls;
  const std::uint64_t done = std::min(e.device_done, issued);
  const std::uint64_t marked = std::min(std::max(e.marked, done), issued);
  return {done, done < marked || done == issued};
}

}  // namespace

SegmentProgress ReadProgress(const SegmentReader& seg, std::int64_t now_mono_ns, const ProgressReadOptions& options) {
  SegmentProgress out;
  const FalconShmHeader& h = seg.header();
  analyzer::RankProgress& p = out.progress;
  p.host = h.host;
  const std::int64_t real_minus_mono = Load(seg.live_header().real_minus_mono_ns);

  std::map<std::uint32_t, std::size_t> by_slot;  // comm slot -> index in p.comms
  std::int32_t widest = 0;
  std::int64_t rank_from_comms = -1;
  for (const CommInfo& c : seg.Comms()) {
    // A communicator destroyed a moment ago still dates the rank's latest call: a job tearing
    // its groups down one by one is not quiet while it destroys the last (often the world group,
    // used only for a checkpoint's barrier long before).
    const FalconCommEntry& e = c.entry;
    if (e.state != kFalconCommLive && e.state != kFalconCommDestroyed) continue;
    out.last_call_mono_ns = std::max(out.last_call_mono_ns, e.last_call_mono_ns);
    if (e.state != kFalconCommLive) continue;
    analyzer::CommProgress cp;
    cp.comm = e.comm_id;
    cp.nranks = e.nranks;
    cp.comm_rank = e.rank;
    cp.issued = e.calls;
    std::tie(cp.completed, cp.completion_known) = CompletedCalls(e);
    cp.name.assign(e.name, ::strnlen(e.name, sizeof e.name));
    if (e.marked != 0 || e.device_done != 0) out.device_tracked = true;
    if (e.nranks > widest) {
      widest = e.nranks;
      rank_from_comms = e.rank;
    }
    by_slot.emplace(c.slot, p.comms.size());
    p.comms.push_back(std::move(cp));
  }
  p.rank = h.rank_hint >= 0 ? h.rank_hint : rank_from_comms;

  for (const ThreadInfo& t : seg.Threads()) {
    const FalconThreadSlot& s = t.entry;
    if (s.tid == 0 || s.inflight_seq == 0) continue;
    if (now_mono_ns - s.inflight_since_mono_ns < options.in_call_min_ns) continue;
    if (out.in_call_since_mono_ns != 0 && s.inflight_since_mono_ns >= out.in_call_since_mono_ns) continue;
    out.in_call_since_mono_ns = s.inflight_since_mono_ns;
    auto it = by_slot.find(s.inflight_comm_slot);
    p.in_call = it != by_slot.end() ? p.comms[it->second].comm : 0;
  }

  // The tail of every lane, merged in time order; the latest calls of each communicator.
  ReadCursor cursor = seg.HeadCursor();
  const ReadCursor oldest = seg.OldestCursor();
  for (std::size_t l = 0; l < cursor.next.size(); ++l) {
    const std::uint64_t back = std::min<std::uint64_t>(cursor.next[l], options.lane_window);
    cursor.next[l] = std::max(oldest.next[l], cursor.next[l] - back);
  }
  std::vector<FalconRecord> records;
  seg.Read(&cursor, options.lane_window, SegmentReader::ReadMode::kLive, &records);
  std::map<std::size_t, std::deque<analyzer::IssuedCall>> latest;
  std::map<std::size_t, analyzer::IssuedCall> first_pending;
  // Group ids: a lane's calls between its outermost ncclGroupStart and ncclGroupEnd share one
  // (a lane is one thread's; a group whose start was overwritten still gets an id of its own).
  std::map<std::uint8_t, std::uint64_t> lane_group;
  std::uint64_t groups = 0;
  for (const FalconRecord& r : records) {
    if (r.op == kFalconOpGroupStart && r.group_depth == 0) lane_group[r.lane] = ++groups;
    if (r.op == kFalconOpGroupEnd && r.group_depth == 1) {
      lane_group.erase(r.lane);
      continue;
    }
    // Calls with device work only: an init, split or finalize has no device queue and its
    // arguments (colour, key) differ between members by design.
    if (r.op < kFalconOpAllReduce || r.op > kFalconOpRecv || r.comm_seq == ~std::uint64_t{0}) continue;
    auto it = by_slot.find(r.comm_slot);
    if (it == by_slot.end()) continue;
    const analyzer::CommProgress& cp = p.comms[it->second];
    analyzer::IssuedCall call;
    call.comm = cp.comm;
    call.seq = r.comm_seq;
    call.sig.op = r.op;
    call.sig.dtype = r.dtype;
    call.sig.redop = r.redop;
    call.sig.peer = r.peer;
    call.sig.count = r.count;
    call.stream = r.aux;
    if ((r.flags & kFalconFlagInGroup) != 0) {
      std::uint64_t& g = lane_group[r.lane];
      if (g == 0) g = ++groups;
      call.group = g;
    }
    call.completed = r.comm_seq < cp.completed;
    call.issue_ns = r.t_start_ns + real_minus_mono;
    // The communicator's first pending call is kept whatever follows it: all later work may wait
    // for it (analyzer/hang_diagnosis.h).
    if (r.comm_seq == cp.completed && cp.completed < cp.issued) first_pending[it->second] = call;
    auto& q = latest[it->second];
    q.push_back(call);
    if (q.size() > options.per_comm) q.pop_front();
  }
  std::vector<analyzer::IssuedCall> recent;
  for (auto& [index, q] : latest) {
    auto first = first_pending.find(index);
    if (first != first_pending.end() && (q.empty() || q.front().seq > first->second.seq)) recent.push_back(first->second);
    recent.insert(recent.end(), q.begin(), q.end());
  }
  std::stable_sort(recent.begin(), recent.end(),
                   [](const analyzer::IssuedCall& a, const analyzer::IssuedCall& b) { return a.issue_ns < b.issue_ns; });
  p.recent = std::move(recent);

  const FalconControl& c = seg.control();
  out.paused = Load(c.pause_state) == kFalconPauseTrapped;
  out.phase = Load(c.phase);
  return out;
}

}  // namespace falcon::daemon
