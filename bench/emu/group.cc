// Group state; see group.h for the invariants.
// Thread-safety: thread_local state only. Must never throw except std::bad_alloc and
// std::system_error (engine.h), which the API layer catches.
#include "group.h"

#include <algorithm>

#include "device.h"
#include "engine.h"
#include "job_state.h"

namespace falcon::emu {
namespace {

struct GroupState {
  int depth = 0;
  std::vector<std::unique_ptr<Op>> ops;
  ncclResult_t error = ncclSuccess;
};
thread_local GroupState t_group;

// The group's ops all run on blocking communicators, all on nonblocking ones, or (an error)
// on both kinds.
enum class Blocking { kYes, kNo, kMixed };
Blocking KindOf(const std::vector<std::unique_ptr<Op>>& ops) {
  bool blocking = false, nonblocking = false;
  for (const auto& op : ops) (op->comm()->blocking ? blocking : nonblocking) = true;
  if (blocking && nonblocking) return Blocking::kMixed;
  return nonblocking ? Blocking::kNo : Blocking::kYes;
}

// True if every op is device work whose stream can take it now (device.h).
bool OnDevice(const std::vector<std::unique_ptr<Op>>& ops) {
  return std::all_of(ops.begin(), ops.end(),
                     [](const std::unique_ptr<Op>& op) { return op->device_work() && DeviceUsable(op->stream()); });
}

// True if every op is device work and the first op's stream is being captured into a graph.
bool Captured(const std::vector<std::unique_ptr<Op>>& ops) {
  return std::all_of(ops.begin(), ops.end(), [](const std::unique_ptr<Op>& op) { return op->device_work(); }) &&
         DeviceCapturing(ops.front()->stream());
}

// Runs a finished group (or one ungrouped call): in this thread for blocking communicators,
// in the background for nonblocking ones (ncclInProgress).
ncclResult_t Execute(std::vector<std::unique_ptr<Op>> ops) {
  switch (KindOf(ops)) {
    case Blocking::kYes:
      if (Captured(ops) && CaptureOnDevice(ops)) return ncclSuccess;
      if (OnDevice(ops)) return RunOnDevice(std::move(ops));
      // Host work (init, split, shrink) follows the communicators' device work (their
      // collective state is shared with it).
      for (const auto& op : ops) SyncCommDevice(op->comm());
      return RunOps(ops);
    case Blocking::kNo:
      // Not on streams (device.h), but after the streams' earlier work, as a kernel would be.
      for (auto& op : ops) {
        if (op->device_work()) op->set_gate(MarkStream(op->stream()));
      }
      return RunInBackground(std::move(ops));
    case Blocking::kMixed: break;
  }
  // NCCL refuses this too (group.cc): a group is either blocking or not.
  return Fail(ncclInvalidArgument, nullptr,
              "ncclGroupEnd: blocking and nonblocking communicators are not allowed in the same group");
}

}  // namespace

ncclResult_t Submit(std::unique_ptr<Op> op) {
  if (t_group.depth > 0) {
    t_group.ops.push_back(std::move(op));
    return ncclSuccess;
  }
  std::vector<std::unique_ptr<Op>> one;
  one.push_back(std::move(op));
  return Execute(std::move(one));
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
  if (ops.empty()) return call_error;
  const ncclResult_t run_error = Execute(std::move(ops));
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
