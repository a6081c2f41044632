// CommProfiler. See comm_profiler.h for the contract.
#include "daemon/agent/comm_profiler.h"

#include <algorithm>

#include "daemon/shm/record_json.h"

namespace falcon::agent {
namespace {

bool Profiled(std::uint8_t op) { return op >= kFalconOpAllReduce && op <= kFalconOpRecv; }

}  // namespace

void CommProfiler::Add(const FalconRecord& r, const FalconCommEntry& comm) {
  if (!Profiled(r.op)) return;
  const Key key{comm.comm_id, r.op, r.count * daemon::DtypeSize(r.dtype), r.peer};
  bool added = false;
  Acc* acc = Lookup(key, &added);
  if (acc == nullptr) return;
  if (added) comms_[comm.comm_id] = {comm.rank, comm.nranks};
  ++acc->count;
  if ((r.flags & kFalconFlagInGroup) != 0) {
    open_group_[r.lane].push_back(key);  // timed (if at all) by the group's end
    return;
  }
  if ((r.flags & kFalconFlagGpuPending) != 0) {
    if (pending_.size() >= kMaxPending) pending_.erase(pending_.begin());
    pending_[{r.lane, daemon::RecordIndex(r)}] = {key};
    return;
  }
  if ((r.flags & kFalconFlagHostEnd) != 0 && r.t_end_ns >= r.t_start_ns) {
    AddDuration(key, static_cast<double>(r.t_end_ns - r.t_start_ns) * 1e-3, false);
  }
}

void CommProfiler::Observe(const FalconRecord& r) {
  if (r.op == kFalconOpGroupEnd) {
    std::vector<Key>& group = open_group_[r.lane];
    if (r.group_depth > 1) return;  // an inner group end: the group goes on
    if ((r.flags & kFalconFlagGpuPending) != 0 && !group.empty()) {
      if (pending_.size() >= kMaxPending) pending_.erase(pending_.begin());
      pending_[{r.lane, daemon::RecordIndex(r)}] = std::move(group);
    }
    group.clear();
    return;
  }
  if (r.op != kFalconOpGpuTiming || r.peer < 0 || r.peer > 255) return;
  auto it = pending_.find({static_cast<std::uint8_t>(r.peer), r.comm_seq});
  if (it == pending_.end()) return;
  if (r.result == 0 && r.t_end_ns >= r.t_start_ns) {
    const double us = static_cast<double>(r.t_end_ns - r.t_start_ns) * 1e-3;
    for (const Key& key : it->second) AddDuration(key, us, true);
  }
  pending_.erase(it);
}

CommProfiler::Acc* CommProfiler::Lookup(const Key& key, bool* added) {
  Cached& slot = cache_[KeyHash{}(key) % cache_.size()];
  if (slot.acc != nullptr && slot.key == key) return slot.acc;
  auto it = sigs_.find(key);
  if (it == sigs_.end()) {
    if (sigs_.size() >= max_signatures_) {
      ++overflow_;
      return nullptr;
    }
    it = sigs_.emplace(key, Acc{}).first;
    *added = true;
  }
  slot = {key, &it->second};
  return &it->second;
}

void CommProfiler::AddDuration(const Key& key, double us, bool device) {
  // The call's window may have been taken before its device time came: it counts in this one.
  bool added = false;
  Acc* acc = Lookup(key, &added);
  if (acc == nullptr) return;
  Acc& a = *acc;
  ++a.timed;
  if (device) ++a.device;
  a.sum_us += us;
  if (a.reservoir.size() < kReservoir) {
    a.reservoir.push_back(us);
  } else {
    a.reservoir[a.next] = us;
    a.next = (a.next + 1) % kReservoir;
  }
}

std::vector<CommStats> CommProfiler::TakeWindow() {
  std::vector<CommStats> out;
  std::vector<std::pair<const Key, Acc>*> ordered;  // by communicator, then signature
  ordered.reserve(sigs_.size());
  for (auto& entry : sigs_) ordered.push_back(&entry);
  std::sort(ordered.begin(), ordered.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
  for (auto* entry : ordered) {
    const Key& key = entry->first;
    Acc& acc = entry->second;
    if (out.empty() || out.back().id != key.comm) {
      const CommId& c = comms_[key.comm];
      out.push_back({key.comm, c.rank, c.nranks, {}});
    }
    SignatureStats s;
    s.op = daemon::OpName(key.op);
    s.bytes = key.bytes;
    s.peer = key.peer;
    s.count = acc.count;
    s.timed = acc.timed;
    s.device = acc.device;
    if (acc.timed > 0) {
      s.mean_us = acc.sum_us / static_cast<double>(acc.timed);
      std::vector<double>& v = acc.reservoir;
      auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
      std::nth_element(v.begin(), mid, v.end());
      s.median_us = *mid;
    }
    out.back().sigs.push_back(std::move(s));
  }
  sigs_.clear();
  cache_.fill({});  // comms_ stays: device times of this window's calls may still come
  return out;
}

}  // namespace falcon::agent
