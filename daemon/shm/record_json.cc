// Record names and JSON: see record_json.h.
#include "daemon/shm/record_json.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>

namespace falcon::daemon {

const char* OpName(uint16_t op) {
  switch (op) {
    case kFalconOpAllReduce: return "AllReduce";
    case kFalconOpBroadcast: return "Broadcast";
    case kFalconOpBcast: return "Bcast";
    case kFalconOpReduce: return "Reduce";
    case kFalconOpAllGather: return "AllGather";
    case kFalconOpReduceScatter: return "ReduceScatter";
    case kFalconOpAlltoAll: return "AlltoAll";
    case kFalconOpGather: return "Gather";
    case kFalconOpScatter: return "Scatter";
    case kFalconOpSend: return "Send";
    case kFalconOpRecv: return "Recv";
    case kFalconOpGroupStart: return "GroupStart";
    case kFalconOpGroupEnd: return "GroupEnd";
    case kFalconOpGroupSimulateEnd: return "GroupSimulateEnd";
    case kFalconOpCommInitRank: return "CommInitRank";
    case kFalconOpCommInitRankConfig: return "CommInitRankConfig";
    case kFalconOpCommInitRankScalable: return "CommInitRankScalable";
    case kFalconOpCommInitAll: return "CommInitAll";
    case kFalconOpCommSplit: return "CommSplit";
    case kFalconOpCommShrink: return "CommShrink";
    case kFalconOpCommFinalize: return "CommFinalize";
    case kFalconOpCommDestroy: return "CommDestroy";
    case kFalconOpCommAbort: return "CommAbort";
    case kFalconOpCommRevoke: return "CommRevoke";
    case kFalconOpCommRegister: return "CommRegister";
    case kFalconOpCommDeregister: return "CommDeregister";
    case kFalconOpCommWindowRegister: return "CommWindowRegister";
    case kFalconOpCommWindowDeregister: return "CommWindowDeregister";
    case kFalconOpRedOpCreatePreMulSum: return "RedOpCreatePreMulSum";
    case kFalconOpRedOpDestroy: return "RedOpDestroy";
    case kFalconOpGetUniqueId: return "GetUniqueId";
    case kFalconOpGetVersion: return "GetVersion";
    case kFalconOpGetErrorString: return "GetErrorString";
    case kFalconOpGetLastError: return "GetLastError";
    case kFalconOpCommGetAsyncError: return "CommGetAsyncError";
    case kFalconOpCommCount: return "CommCount";
    case kFalconOpCommCuDevice: return "CommCuDevice";
    case kFalconOpCommUserRank: return "CommUserRank";
    case kFalconOpMemAlloc: return "MemAlloc";
    case kFalconOpMemFree: return "MemFree";
    case kFalconOpGpuTiming: return "GpuTiming";
    case kFalconOpAnnotation: return "Annotation";
    default: return "Unknown";
  }
}

namespace {
struct DtypeInfo {
  const char* name;
  uint64_t size;
};
// Indexed by ncclDataType_t.
constexpr DtypeInfo kDtypes[] = {{"int8", 1},    {"uint8", 1},    {"int32", 4},      {"uint32", 4},
                                 {"int64", 8},   {"uint64", 8},   {"float16", 2},    {"float32", 4},
                                 {"float64", 8}, {"bfloat16", 2}, {"float8e4m3", 1}, {"float8e5m2", 1}};
constexpr size_t kNumDtypes = sizeof(kDtypes) / sizeof(kDtypes[0]);
}  // namespace

const char* DtypeName(uint8_t dtype) { return dtype < kNumDtypes ? kDtypes[dtype].name : nullptr; }
uint64_t DtypeSize(uint8_t dtype) { return dtype < kNumDtypes ? kDtypes[dtype].size : 0; }

const char* RedOpName(int32_t redop) {
  switch (redop) {
    case -1: return nullptr;
    case 0: return "sum";
    case 1: return "prod";
    case 2: return "max";
    case 3: return "min";
    case 4: return "avg";
    default: return redop >= 5 ? "premulsum" : nullptr;
  }
}

const char* ResultName(int32_t result) {
  static const char* const kNames[] = {"ncclSuccess",        "ncclUnhandledCudaError", "ncclSystemError",
                                       "ncclInternalError",  "ncclInvalidArgument",    "ncclInvalidUsage",
                                       "ncclRemoteError",    "ncclInProgress"};
  return (result >= 0 && result < 8) ? kNames[result] : "ncclUnknownResult";
}

std::string HexId(uint64_t id) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

CommTable MakeCommTable(const SegmentReader& seg) {
  CommTable t;
  for (const CommInfo& c : seg.Comms()) t.emplace(c.slot, c.entry);
  return t;
}

nlohmann::json RecordToJson(const FalconRecord& r, const FalconShmHeader& h, const CommTable& comms) {
  using nlohmann::json;
  json j;
  j["v"] = kRecordSchemaVersion;
  j["lane"] = r.lane;
  j["seq"] = RecordIndex(r);
  j["pid"] = h.pid;
  j["op"] = OpName(r.op);
  auto it = comms.find(r.comm_slot);
  const FalconCommEntry* c = it != comms.end() ? &it->second : nullptr;
  j["comm"] = c != nullptr ? json(HexId(c->comm_id)) : json(nullptr);
  j["comm_slot"] = r.comm_slot != FALCON_NO_COMM ? json(r.comm_slot) : json(nullptr);
  j["comm_seq"] = r.comm_seq != ~uint64_t{0} ? json(r.comm_seq) : json(nullptr);
  j["rank"] = c != nullptr ? c->rank : h.rank_hint;
  j["nranks"] = c != nullptr ? json(c->nranks) : json(nullptr);
  j["count"] = r.count;
  const char* dt = DtypeName(r.dtype);
  j["dtype"] = dt != nullptr ? json(dt) : json(nullptr);
  j["bytes"] = r.count * DtypeSize(r.dtype);
  const char* red = RedOpName(r.redop);
  j["redop"] = red != nullptr ? json(red) : json(nullptr);
  j["peer"] = r.peer;
  j["t_start_ns"] = r.t_start_ns;
  // Times from a torn or damaged record may be anything: a sum or difference that does not fit
  // is shown as unknown (null), never computed with overflow.
  int64_t real = 0, duration = 0;
  const int64_t offset = std::atomic_ref<int64_t>(const_cast<int64_t&>(h.real_minus_mono_ns)).load(std::memory_order_relaxed);
  j["t_real_ns"] = __builtin_add_overflow(r.t_start_ns, offset, &real) ? json(nullptr) : json(real);
  const bool host_end = (r.flags & kFalconFlagHostEnd) != 0;
  j["t_end_ns"] = host_end ? json(r.t_end_ns) : json(nullptr);
  j["duration_ns"] =
      host_end && !__builtin_sub_overflow(r.t_end_ns, r.t_start_ns, &duration) ? json(duration) : json(nullptr);
  if (r.op == kFalconOpGpuTiming) {
    j["ref_lane"] = r.peer;
    j["ref_seq"] = r.comm_seq;
    j["gpu_start_ns"] = r.t_start_ns;
    j["gpu_end_ns"] = r.t_end_ns;
  } else if (r.op == kFalconOpCommSplit || r.op == kFalconOpCommShrink) {
    auto child = comms.find(static_cast<uint32_t>(r.aux));
    j["child"] = child != comms.end() ? json(HexId(child->second.comm_id)) : json(nullptr);
  } else {
    j["stream"] = r.aux;
  }
  j["group_depth"] = r.group_depth;
  json flags = json::array();
  if (r.flags & kFalconFlagInGroup) flags.push_back("in_group");
  if (r.flags & kFalconFlagGraphCapture) flags.push_back("graph_capture");
  if (r.flags & kFalconFlagBenchmark) flags.push_back("benchmark");
  if (r.flags & kFalconFlagGpuPending) flags.push_back("gpu_pending");
  if (r.flags & kFalconFlagInPlace) flags.push_back("in_place");
  j["flags"] = flags;
  j["result"] = ResultName(r.result);
  return j;
}

}  // namespace falcon::daemon
