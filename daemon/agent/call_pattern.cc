// CallPatternLog. See call_pattern.h for the contract.
#include "daemon/agent/call_pattern.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace falcon::agent {
namespace {

bool IsCollectiveOrP2p(std::uint8_t op) { return op >= kFalconOpAllReduce && op <= kFalconOpRecv; }

analyzer::ChannelKind KindOf(std::uint8_t op) {
  if (op == kFalconOpSend) return analyzer::ChannelKind::kSend;
  if (op == kFalconOpRecv) return analyzer::ChannelKind::kRecv;
  return analyzer::ChannelKind::kCollective;
}

}  // namespace

std::uint64_t& CallPatternLog::Channels::Of(analyzer::ChannelKind kind, std::int32_t peer) {
  if (kind == analyzer::ChannelKind::kSend) return sends[peer];
  if (kind == analyzer::ChannelKind::kRecv) return recvs[peer];
  return collectives;
}

std::uint64_t CallPatternLog::CountChannel(const FalconRecord& r, analyzer::ChannelKind kind) {
  Channels& c = channels_[r.comm_slot];
  if (r.comm_seq == 0) {  // the communicator's first call (in a slot perhaps reused)
    c = Channels{};
    c.known = true;
  }
  const bool in_order = c.known && r.comm_seq == c.next;
  c.next = r.comm_seq + 1;
  if (!in_order || (kind != analyzer::ChannelKind::kCollective && r.peer < 0)) {
    c.known = false;  // a gap (records lost, or the agent came later): no telling any more
    return kUnknown;
  }
  return c.Of(kind, r.peer)++;
}

void CallPatternLog::Push(const FalconRecord& r, std::uint64_t comm_id) {
  if ((r.flags & kFalconFlagBenchmark) != 0) return;
  if (r.op == kFalconOpGroupStart && r.group_depth == 0) {
    ++group_ordinal_[r.lane];
    return;
  }
  if (r.comm_seq == ~std::uint64_t{0} || r.comm_slot == FALCON_NO_COMM || !FalconOpIsOrdered(r.op)) return;
  const analyzer::ChannelKind kind = KindOf(r.op);
  const std::uint64_t channel_seq = CountChannel(r, kind);
  if (!IsCollectiveOrP2p(r.op) || comm_id == 0) return;
  const bool grouped = (r.flags & kFalconFlagInGroup) != 0;
  const std::uint64_t group =
      grouped ? (std::uint64_t{r.lane} + 1) << 32 | std::max<std::uint32_t>(group_ordinal_[r.lane], 1) : 0;
  const std::int32_t peer = kind == analyzer::ChannelKind::kCollective ? -1 : r.peer;
  calls_.push_back({comm_id, r.comm_seq, r.t_start_ns, group, channel_seq, peer, kind});  // full: overwrites the oldest
}

Result<CallPatternReport> CallPatternLog::Build(std::size_t period, std::span<const PatternCommInfo> comms) const {
  const std::size_t n = calls_.size();
  if (period == 0) return Status::Unavailable("no period locked yet");
  if (n < 2 * period + 1) {
    return Status::Unavailable("holds " + std::to_string(n) + " calls, fewer than two periods of " +
                               std::to_string(period));
  }
  auto same_unit = [&](std::size_t i) {  // calls i-1 and i belong to one group
    return i > 0 && calls_[i].group != 0 && calls_[i].group == calls_[i - 1].group;
  };
  // The window [s, s + period) starts and ends at unit boundaries; the last group may still be
  // open (its end not yet issued), so the window ends before it.
  auto unit_start = [&](std::size_t i) {  // the first call of the unit holding call i
    while (i > 0 && same_unit(i)) --i;
    return i;
  };
  std::size_t e = n;
  if (calls_[n - 1].group != 0) e = unit_start(n - 1);  // the last group may be open: drop it
  std::size_t s = e - std::min(e, period);
  for (std::size_t tries = 0; tries < period && s > 0 && same_unit(s); ++tries) {
    e = unit_start(e - 1);
    s = e - std::min(e, period);
  }
  if (e < 2 * period || same_unit(s)) {
    return Status::Unavailable("no period of " + std::to_string(period) + " calls between group boundaries");
  }
  std::optional<std::uint64_t> iteration;
  if (anchor_ns_ != 0) {  // align to the latest iteration anchor still held
    std::size_t a = n;
    for (std::size_t i = n; i-- > 0;) {
      if (calls_[i].t_ns == anchor_ns_) {
        a = i;
        break;
      }
    }
    if (a < n) {  // iteration boundaries lie at a + j * period; take the latest window start
      const auto sa = static_cast<std::int64_t>(a), sp = static_cast<std::int64_t>(period);
      const std::int64_t last = static_cast<std::int64_t>(e) - sp - sa;  // window start <= e - period
      const std::int64_t j = last >= 0 ? last / sp : -((-last + sp - 1) / sp);
      const std::int64_t at = sa + j * sp;
      if (at >= sp) {
        const std::size_t start = unit_start(static_cast<std::size_t>(at));  // stop before a group
        if (start >= period && start + period <= e && (start + period == n || !same_unit(start + period))) {
          s = start;
          e = s + period;
          iteration = static_cast<std::uint64_t>(static_cast<std::int64_t>(anchor_index_) + j);
        }
      }
    }
  }
  // Periodicity over the window and the period before it.
  std::map<std::uint64_t, std::uint64_t> per_period;
  for (std::size_t i = s; i < s + period; ++i) ++per_period[calls_[i].comm];
  for (std::size_t i = s - period; i < s; ++i) {
    const Call& a = calls_[i];
    const Call& b = calls_[i + period];
    if (a.comm != b.comm || a.kind != b.kind || a.peer != b.peer || (a.group == 0) != (b.group == 0) ||
        same_unit(i) != same_unit(i + period) || b.seq - a.seq != per_period[a.comm]) {
      return Status::Unavailable("the last two periods of " + std::to_string(period) + " calls differ");
    }
  }
  CallPatternReport out;
  analyzer::RankCallPattern& p = out.pattern;
  std::map<std::uint64_t, std::uint32_t> index;
  std::vector<const PatternCommInfo*> infos;
  for (const PatternCommInfo& c : comms) {
    if (index.contains(c.id)) continue;
    index[c.id] = static_cast<std::uint32_t>(p.comms.size());
    p.comms.push_back({c.id, c.nranks, c.calls, -1, {}});
    infos.push_back(&c);
  }
  // Per comm index: the channels' order in its list, where its counts are known.
  using ChannelKey = std::pair<analyzer::ChannelKind, std::int32_t>;
  std::vector<std::map<ChannelKey, std::uint32_t>> channel_index(p.comms.size());
  // Since the window's start, per comm index: each channel's count before its first call there,
  // and whether every call there was counted.
  std::vector<std::map<ChannelKey, std::uint64_t>> first(p.comms.size());
  std::vector<bool> whole(p.comms.size(), true);
  for (std::size_t i = s; i < n; ++i) {
    const auto it = index.find(calls_[i].comm);
    if (it == index.end()) continue;
    const Call& c = calls_[i];
    whole[it->second] = whole[it->second] && c.channel_seq != kUnknown;
    first[it->second].try_emplace({c.kind, c.peer}, c.channel_seq);
  }
  for (std::size_t ci = 0; ci < p.comms.size(); ++ci) {
    const PatternCommInfo& info = *infos[ci];
    const auto known = channels_.find(info.slot);
    if (!whole[ci] || info.rank < 0 || info.rank >= info.nranks || known == channels_.end() || !known->second.known) {
      continue;
    }
    const Channels& ch = known->second;
    std::vector<std::pair<ChannelKey, std::uint64_t>> now;  // every channel, with its count now
    if (ch.collectives > 0) now.push_back({{analyzer::ChannelKind::kCollective, -1}, ch.collectives});
    for (const auto& [peer, count] : ch.sends) now.push_back({{analyzer::ChannelKind::kSend, peer}, count});
    for (const auto& [peer, count] : ch.recvs) now.push_back({{analyzer::ChannelKind::kRecv, peer}, count});
    analyzer::PatternComm& pc = p.comms[ci];
    bool sound = true;
    for (const auto& [key, count] : now) {
      const bool p2p = key.first != analyzer::ChannelKind::kCollective;
      sound = sound && (!p2p || (key.second >= 0 && key.second < info.nranks && key.second != info.rank));
      const auto f = first[ci].find(key);
      channel_index[ci][key] = static_cast<std::uint32_t>(pc.channels.size());
      pc.channels.push_back({key.first, key.second, f != first[ci].end() ? f->second : count});
    }
    for (const auto& [key, seq] : first[ci]) sound = sound && channel_index[ci].contains(key);
    if (!sound) {  // a peer outside the communicator (a damaged record), or counts not matching the calls
      pc.channels.clear();
      channel_index[ci].clear();
      continue;
    }
    if (!pc.channels.empty()) pc.rank = info.rank;
  }
  std::map<std::uint64_t, bool> based;
  for (std::size_t i = s; i < s + period; ++i) {
    const Call& c = calls_[i];
    const auto it = index.find(c.comm);
    if (it == index.end()) return Status::Unavailable("a call names a communicator the rank no longer holds");
    if (!based[c.comm]) {
      based[c.comm] = true;
      p.comms[it->second].base_seq = c.seq;
    }
    std::uint32_t channel = 0;
    if (!p.comms[it->second].channels.empty()) channel = channel_index[it->second].find({c.kind, c.peer})->second;
    if (!same_unit(i) || i == s) p.units.push_back({c.group != 0, {}});
    auto& calls = p.units.back().calls;
    const auto cu = std::find_if(calls.begin(), calls.end(), [&](const analyzer::UnitCalls& u) {
      return u.comm == it->second && u.channel == channel;
    });
    if (cu == calls.end()) calls.push_back({it->second, 1, channel});
    else ++cu->count;
  }
  p.iteration_at_start = iteration;
  for (std::size_t i = s; i < n; ++i) {
    if (!same_unit(i) || i == s) ++out.position;
  }
  const double span_s = static_cast<double>(calls_[s + period - 1].t_ns - calls_[s - period].t_ns) / 1e9;
  out.units_per_s = span_s > 0 ? 2.0 * static_cast<double>(p.units.size()) / span_s : 0;
  out.last_call_ns = calls_[n - 1].t_ns;
  return out;
}

}  // namespace falcon::agent
