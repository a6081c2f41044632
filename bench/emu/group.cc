// Progress engine and group state; see group.h for the invariants.
// Thread-safety: thread_local state only. Must never throw out of the engine: Step() is noexcept
// by contract, and allocation failures are caught by the API layer.
#include "group.h"

#include <sched.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <climits>

#include "emu_config.h"
#include "job_state.h"

namespace falcon::emu {
namespace {

struct GroupState {
  int depth = 0;
  std::vector<std::unique_ptr<Op>> ops;
  ncclResult_t error = ncclSuccess;
};
thread_local GroupState t_group;

constexpr int kSpinSweeps = 64;
constexpr int kYieldSweeps = 128;
constexpr int64_t kMaxSleepNs = 200'000;

void SleepNs(int64_t ns) {
  if (ns <= 0) return;
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  sched_yield();
#endif
}

// Waits a little after a sweep without progress. `wake_ns` is the earliest time-only wake-up
// (INT64_MAX if none); `peers` says whether any op waits for other ranks.
void Backoff(int idle, int64_t now, int64_t wake_ns, bool peers) {
  if (!peers) {
    const int64_t left = wake_ns - now;
    if (left > 60'000) SleepNs(left - 50'000);
    else if (left > 0) sched_yield();
    return;
  }
  if (idle < kSpinSweeps) {
    for (int i = 0; i < 16; ++i) CpuRelax();
  } else if (idle < kYieldSweeps) {
    sched_yield();
  } else {
    const int shift = std::min(idle - kYieldSweeps, 8);
    int64_t ns = std::min<int64_t>(int64_t{1000} << shift, kMaxSleepNs);
    if (wake_ns != INT64_MAX) ns = std::min(ns, wake_ns - now);
    if (ns > 0) SleepNs(ns); else sched_yield();
  }
}

}  // namespace

bool PeerWait::Expired(int64_t now_ns) const {
  return static_cast<double>(now_ns - last_progress_ns_) * 1e-9 > Config().timeout_s;
}

bool PeerWait::LivenessDue(int64_t now_ns) {
  if (now_ns < next_liveness_ns_) return false;
  next_liveness_ns_ = now_ns + 100'000'000;
  return true;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(ranks[i]);
  }
  return s;
}

bool ProcessGone(int pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

ncclResult_t RunOps(std::vector<std::unique_ptr<Op>>& ops) {
  for (auto& op : ops) {
    RefreshCommNodes(op->comm(), Refresh::kIfChanged);  // a placement change applies from here on
    op->Launch();
  }
  std::vector<bool> finished(ops.size(), false);
  size_t remaining = ops.size();
  ncclResult_t first_error = ncclSuccess;
  int idle = 0;
  while (remaining > 0) {
    const int64_t now = NowNs();
    bool advanced = false;
    bool peers = false;
    int64_t wake = INT64_MAX;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (finished[i]) continue;
      const Progress p = ops[i]->Step(now);
      if (p == Progress::kDone || p == Progress::kFailed) {
        finished[i] = true;
        --remaining;
        advanced = true;
        if (p == Progress::kFailed && first_error == ncclSuccess) first_error = ops[i]->result();
      } else if (p == Progress::kAdvanced) {
        advanced = true;
      } else if (ops[i]->wake_at_ns() != 0) {
        wake = std::min(wake, ops[i]->wake_at_ns());
      } else {
        peers = true;
      }
    }
    if (advanced) {
      idle = 0;
      continue;
    }
    if (remaining > 0) Backoff(idle++, now, wake, peers);
  }
  return first_error;
}

ncclResult_t Submit(std::unique_ptr<Op> op) {
  if (t_group.depth > 0) {
    t_group.ops.push_back(std::move(op));
    return ncclSuccess;
  }
  std::vector<std::unique_ptr<Op>> one;
  one.push_back(std::move(op));
  return RunOps(one);
}

void NoteGroupError(ncclResult_t code) {
  if (t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = code;
}

bool InGroup() { return t_group.depth > 0; }

bool GroupHasOpsOn(const ncclComm* comm) {
  return std::any_of(t_group.ops.begin(), t_group.ops.end(),
                     [comm](const std::unique_ptr<Op>& op) { return op->comm() == comm; });
}

ncclResult_t GroupStart() {
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t GroupEnd() {
  if (t_group.depth == 0) {
    return Fail(ncclInvalidUsage, nullptr, "ncclGroupEnd: not inside a group (missing ncclGroupStart)");
  }
  if (--t_group.depth > 0) return ncclSuccess;
  std::vector<std::unique_ptr<Op>> ops = std::move(t_group.ops);
  t_group.ops.clear();
  const ncclResult_t call_error = t_group.error;
  t_group.error = ncclSuccess;
  const ncclResult_t run_error = RunOps(ops);
  return call_error != ncclSuccess ? call_error : run_error;
}

ncclResult_t GroupSimulateEnd(ncclSimInfo_t* info) {
  if (info == nullptr || info->magic != 0x74685283u || info->size != sizeof(ncclSimInfo_t)) {
    return Fail(ncclInvalidArgument, nullptr,
                "ncclGroupSimulateEnd: simInfo must be initialised with NCCL_SIM_INFO_INITIALIZER");
  }
  if (t_group.depth == 0) {
    return Fail(ncclInvalidUsage, nullptr, "ncclGroupSimulateEnd: not inside a group");
  }
  if (--t_group.depth > 0) return ncclSuccess;
  double seconds = 0;
  for (const auto& op : t_group.ops) {
    RefreshCommNodes(op->comm(), Refresh::kIfChanged);
    seconds += op->ModelSeconds();
  }
  t_group.ops.clear();
  const ncclResult_t call_error = t_group.error;
  t_group.error = ncclSuccess;
  info->estimatedTime = static_cast<float>(seconds * 1e6);  // microseconds
  return call_error;
}

}  // namespace falcon::emu
