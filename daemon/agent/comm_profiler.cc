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
  auto it = sigs_.find(key);
  if (it == sigs_.end()) {
    if (sigs_.size() >= max_signatures_) {
      ++overflow_;
      return;
    }
    it = sigs_.emplace(key, Acc{}).first;
    comms_[comm.comm_id] = {comm.rank, comm.nranks};
  }
  Acc& a = it->second;
  ++a.count;
  if ((r.flags & kFalconFlagHostEnd) != 0 && r.t_end_ns >= r.t_start_ns) {
    const double us = static_cast<double>(r.t_end_ns - r.t_start_ns) * 1e-3;
    ++a.timed;
    a.sum_us += us;
    if (a.reservoir.size() < kReservoir) {
      a.reservoir.push_back(us);
    } else {
      a.reservoir[a.next] = us;
      a.next = (a.next + 1) % kReservoir;
    }
  }
}

std::vector<CommStats> CommProfiler::TakeWindow() {
  std::vector<CommStats> out;
  for (auto& [key, acc] : sigs_) {
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
  comms_.clear();
  return out;
}

}  // namespace falcon::agent
