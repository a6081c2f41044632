// The validation communicator: see validation_comm.h.
#include "shim/validation_comm.h"

#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "shim/log.h"
#include "shim/real_nccl.h"
#include "shim/tracer.h"

namespace falcon::shim {
namespace {

constexpr uint64_t kMaxBytes = uint64_t{1} << 30;
constexpr int32_t kMaxRanks = 1 << 20;
constexpr uint32_t kMaxRepeats = 1000;

template <typename Fn>
Fn Real(FalconOp op) {
  return RealSymbol<Fn>(op);
}

double Seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

FalconTaskResult Failed(FalconTaskResult r) {
  r.status = kFalconTaskFailed;
  return r;
}

// Polls a nonblocking communicator until its init is done; ncclInProgress at the deadline.
ncclResult_t WaitReady(ncclComm_t comm, int64_t deadline_mono_ns) {
  return static_cast<ncclResult_t>(FinishNonblockingGroup(comm, ncclInProgress, deadline_mono_ns));
}

// Benchmark records: kFalconFlagBenchmark, no communicator slot (the validation communicator is
// not one of the job's) and no comm_seq, so they are never taken for training traffic.
void LogTransfer(Tracer& tracer, ThreadState& ts, FalconOp op, uint64_t bytes, int32_t peer, int64_t t0, int64_t t1,
                 int result) {
  FalconRecord rec;
  std::memset(&rec, 0, sizeof(rec));
  rec.comm_seq = ~uint64_t{0};
  rec.count = bytes;
  rec.t_start_ns = t0;
  rec.t_end_ns = t1;
  rec.comm_slot = FALCON_NO_COMM;
  rec.peer = peer;
  rec.redop = -1;
  rec.op = static_cast<uint8_t>(op);
  rec.dtype = static_cast<uint8_t>(ncclInt8);
  rec.flags = kFalconFlagBenchmark | kFalconFlagHostEnd | kFalconFlagInGroup;
  rec.result = static_cast<uint8_t>(result);
  tracer.Publish(rec, ts.lane_index);
}

struct TransferLog {
  Tracer* tracer;
  ThreadState* ts;
  const FalconTask* task;
};

void LogGpuTransfer(void* ctx, int64_t t0, int64_t t1, uint64_t bytes, int result) {
  const auto* l = static_cast<const TransferLog*>(ctx);
  const FalconTask& t = *l->task;
  if (t.send_peer >= 0) LogTransfer(*l->tracer, *l->ts, kFalconOpSend, bytes, t.send_peer, t0, t1, result);
  if (t.recv_peer >= 0) LogTransfer(*l->tracer, *l->ts, kFalconOpRecv, bytes, t.recv_peer, t0, t1, result);
}

}  // namespace

FalconTaskResult ValidationComm::MakeId(FalconTaskResult r, uint8_t* blob_out) {
  static_assert(sizeof(ncclUniqueId) == FALCON_TASK_BLOB_LEN, "the task blob holds one ncclUniqueId");
  auto get_id = Real<decltype(&pncclGetUniqueId)>(kFalconOpGetUniqueId);
  ncclUniqueId id;
  const ncclResult_t rc = get_id != nullptr ? get_id(&id) : ncclInternalError;
  if (rc != ncclSuccess) {
    Log(LogLevel::kWarn, "validation communicator: ncclGetUniqueId failed (NCCL result %d)", static_cast<int>(rc));
    return Failed(r);
  }
  std::memcpy(blob_out, &id, sizeof(id));
  r.status = kFalconTaskOk;
  return r;
}

FalconTaskResult ValidationComm::Join(const FalconTask& t, const uint8_t* blob, FalconTaskResult r,
                                      int64_t deadline_mono_ns) {
  const auto nranks = static_cast<int32_t>(t.m), rank = static_cast<int32_t>(t.n);
  if (nranks < 2 || nranks > kMaxRanks || rank < 0 || rank >= nranks || t.bytes == 0 || t.bytes > kMaxBytes) {
    r.status = kFalconTaskBadRequest;
    return r;
  }
  Release();  // one validation communicator at a time
  auto init = Real<decltype(&pncclCommInitRankConfig)>(kFalconOpCommInitRankConfig);
  if (init == nullptr) return Failed(r);
  ncclUniqueId id;
  std::memcpy(&id, blob, sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait below has the task's deadline
  config.commName = "falcon-validation";
  ncclComm_t comm = nullptr;
  ncclResult_t rc = init(&comm, nranks, id, rank, &config);
  if (comm != nullptr) comm_ = comm;
  if (rc == ncclSuccess || rc == ncclInProgress) rc = comm != nullptr ? WaitReady(comm, deadline_mono_ns) : ncclInternalError;
  if (rc != ncclSuccess) {
    Abort(rc == ncclInProgress ? "not every member joined before the deadline" : "init failed");
    return Failed(r);
  }
  nranks_ = nranks;
  rank_ = rank;
  bytes_ = t.bytes;
  // The buffers now, before anybody posts: a rank that cannot have them says so here.
  device_ = GpuBenchWanted();
  bool ok = false;
  if (device_) {
    ok = GpuAllocP2pBuffers(t.bytes, &gpu_);
  } else {
    host_send_ = static_cast<char*>(std::malloc(t.bytes));
    host_recv_ = static_cast<char*>(std::malloc(t.bytes));
    ok = host_send_ != nullptr && host_recv_ != nullptr;
    if (ok) std::memset(host_send_, 0x5a, t.bytes);
  }
  if (!ok) {
    Abort("no memory for the transfer buffers");
    return Failed(r);
  }
  r.status = kFalconTaskOk;
  r.timing_source = device_ ? kFalconTimingCudaEvents : kFalconTimingHost;
  return r;
}

FalconTaskResult ValidationComm::P2p(const FalconTask& t, FalconTaskResult r, Tracer& tracer, ThreadState& ts,
                                     int64_t deadline_mono_ns) {
  if (comm_ == nullptr) {
    Log(LogLevel::kWarn, "validation p2p refused: this rank has not joined a validation communicator");
    return Failed(r);
  }
  if (t.bytes == 0 || t.bytes > bytes_ || (t.send_peer < 0 && t.recv_peer < 0) || t.send_peer >= nranks_ ||
      t.recv_peer >= nranks_ || t.send_peer == rank_ || t.recv_peer == rank_) {
    r.status = kFalconTaskBadRequest;
    return r;
  }
  auto* comm = static_cast<ncclComm_t>(comm_);
  if (device_) {
    TransferLog log{&tracer, &ts, &t};
    r = GpuP2p(t, r, comm, gpu_, GpuP2pObserver{&LogGpuTransfer, &log}, deadline_mono_ns);
    if (r.status != kFalconTaskOk) {
      buffers_in_use_ = true;  // the device may still be moving data through them
      Abort("a transfer failed or missed the deadline");
    }
    return r;
  }
  r.timing_source = kFalconTimingHost;
  auto group_start = Real<decltype(&pncclGroupStart)>(kFalconOpGroupStart);
  auto group_end = Real<decltype(&pncclGroupEnd)>(kFalconOpGroupEnd);
  auto send = Real<decltype(&pncclSend)>(kFalconOpSend);
  auto recv = Real<decltype(&pncclRecv)>(kFalconOpRecv);
  if (group_start == nullptr || group_end == nullptr || send == nullptr || recv == nullptr ||
      t.repeats == 0 || t.repeats > kMaxRepeats) {
    return Failed(r);
  }
  double samples[kMaxRepeats];
  for (uint32_t rep = 0; rep <= t.repeats; ++rep) {  // rep 0: warm-up (connection set-up)
    const uint64_t bytes = rep == 0 ? std::min<uint64_t>(t.bytes, FALCON_P2P_WARMUP_BYTES) : t.bytes;
    const int64_t t0 = SystemMonoNs();
    ncclResult_t res = group_start();
    if (res == ncclSuccess && t.send_peer >= 0) res = send(host_send_, bytes, ncclInt8, t.send_peer, comm, nullptr);
    if (res == ncclSuccess && t.recv_peer >= 0) res = recv(host_recv_, bytes, ncclInt8, t.recv_peer, comm, nullptr);
    const auto end = static_cast<ncclResult_t>(FinishNonblockingGroup(comm, group_end(), deadline_mono_ns));
    if (res == ncclSuccess) res = end;
    const int64_t t1 = SystemMonoNs();
    if (t.send_peer >= 0) LogTransfer(tracer, ts, kFalconOpSend, bytes, t.send_peer, t0, t1, res);
    if (t.recv_peer >= 0) LogTransfer(tracer, ts, kFalconOpRecv, bytes, t.recv_peer, t0, t1, res);
    if (res != ncclSuccess) {
      Log(LogLevel::kWarn, "validation p2p failed: NCCL result %d%s", static_cast<int>(res),
          res == ncclInProgress ? " (deadline passed)" : "");
      buffers_in_use_ = res == ncclInProgress;  // the device may still be moving them
      Abort("a transfer failed or missed the deadline");
      return Failed(r);
    }
    if (rep > 0) samples[rep - 1] = Seconds(t1 - t0);
  }
  std::sort(samples, samples + t.repeats);
  r.median_s = samples[t.repeats / 2];
  r.min_s = samples[0];
  r.max_s = samples[t.repeats - 1];
  r.rate = r.median_s > 0 ? static_cast<double>(t.bytes) / r.median_s / 1e9 : 0.0;
  r.status = kFalconTaskOk;
  return r;
}

void ValidationComm::Abort(const char* why) {
  if (comm_ != nullptr) {
    Log(LogLevel::kWarn, "validation communicator aborted: %s", why);
  }
  Release();
}

void ValidationComm::Release() {
  if (comm_ != nullptr) {
    // Abort, not destroy: local and bounded, whatever the peers do (NCCL's destroy may wait for
    // the other ranks of the node).
    if (auto abort = Real<decltype(&pncclCommAbort)>(kFalconOpCommAbort)) abort(static_cast<ncclComm_t>(comm_));
    comm_ = nullptr;
  }
  if (!buffers_in_use_) {
    if (device_) GpuFreeP2pBuffers(gpu_);
    std::free(host_send_);
    std::free(host_recv_);
  } else if (host_send_ != nullptr && n_retired_ < kMaxRetired) {
    retired_[2 * n_retired_] = host_send_;
    retired_[2 * n_retired_ + 1] = host_recv_;
    ++n_retired_;
  }
  gpu_ = GpuP2pBuffers{};
  host_send_ = host_recv_ = nullptr;
  buffers_in_use_ = false;
  device_ = false;
  nranks_ = 0;
  rank_ = -1;
  bytes_ = 0;
}

}  // namespace falcon::shim
