// Exported NCCL entry points for data movement: collectives, send/recv, groups and PreMulSum
// reduction operators. Each validates its arguments (errors are values: ncclInvalidArgument /
// ncclInvalidUsage plus ncclGetLastError text, never a crash), builds an Op and submits it to the
// calling thread's group (group.h).
//
// ncclBcast is implemented by calling ncclBroadcast through the dynamic symbol table
// (dlsym(RTLD_DEFAULT, "ncclBroadcast"), resolved once): when an LD_PRELOAD shim interposes
// ncclBroadcast, this internal call goes through the shim, exactly like the real NCCL's Bcast,
// which lets the shim's re-entrancy guard be tested.
//
// Thread-safety: as NCCL: concurrent calls on different communicators are safe; one
// communicator is used by one thread at a time. Must never: throw across the C ABI (Guarded).
#include <dlfcn.h>

#include <atomic>
#include <string>

#include "api_util.h"
#include "coll_op.h"
#include "debug_log.h"
#include "group.h"
#include "p2p_op.h"

namespace falcon::emu {
namespace {

ncclResult_t CallError(ncclResult_t code) {
  if (code != ncclSuccess) NoteGroupError(code);
  return code;
}

ncclResult_t ResolveRed(const char* name, ncclComm* comm, ncclRedOp_t op, DType dt, RedSpec* out) {
  const int v = static_cast<int>(op);
  if (v >= 0 && v < 4) {
    out->code = v;
    out->kind = static_cast<RedKind>(v);
    return ncclSuccess;
  }
  if (v == ncclAvg) {
    out->code = v;
    out->kind = RedKind::kSum;
    if (IsFloatDType(dt)) {
      out->premul = true;
      out->scalar.f = 1.0 / comm->nranks;
    } else {
      out->int_avg = true;
    }
    return ncclSuccess;
  }
  const int idx = v - static_cast<int>(ncclNumOps);
  if (idx >= 0 && static_cast<size_t>(idx) < comm->redops.size() && comm->redops[static_cast<size_t>(idx)].live) {
    const RedOpEntry& e = comm->redops[static_cast<size_t>(idx)];
    if (e.dtype != dt) {
      return Fail(ncclInvalidArgument, comm, std::string(name) + ": reduction op " + std::to_string(v) +
                                                 " was created for datatype " + DTypeName(e.dtype) +
                                                 ", not " + DTypeName(dt));
    }
    out->code = ncclNumOps;
    out->kind = RedKind::kSum;
    out->premul = true;
    out->scalar = e.scalar;
    out->device_ptr = e.device_residence ? e.ptr : nullptr;
    return ncclSuccess;
  }
  return Fail(ncclInvalidArgument, comm, std::string(name) + ": invalid reduction op " + std::to_string(v));
}

// True if `comm` is a usable handle whose rank is `root` (a communicator that is not ready yet
// is answered false without reading its rank; SubmitColl then refuses it).
bool IsRankOf(ncclComm* comm, int root) {
  return IsLiveComm(comm) && comm->inflight.load(std::memory_order_acquire) == 0 && comm->rank == root;
}

struct CollCall {
  CollArgs args;
  bool reduction = false;
  bool rooted = false;
  bool need_send = true;  // on this rank
  bool need_recv = true;
  ncclRedOp_t op = ncclSum;
};

ncclResult_t SubmitColl(ncclComm* comm, int datatype, CollCall call, cudaStream_t stream) {
  const char* name = call.args.name;
  ncclResult_t rc = CheckUsable(comm, name);
  if (rc != ncclSuccess) return CallError(rc);
  if (!IsValidDType(datatype)) {
    return CallError(Fail(ncclInvalidArgument, comm, std::string(name) + ": invalid datatype " + std::to_string(datatype)));
  }
  call.args.dtype = static_cast<DType>(datatype);
  if (call.rooted && (call.args.root < 0 || call.args.root >= comm->nranks)) {
    return CallError(Fail(ncclInvalidArgument, comm, std::string(name) + ": invalid root " +
                                                         std::to_string(call.args.root) + " (nranks " +
                                                         std::to_string(comm->nranks) + ")"));
  }
  if (call.args.count > 0 && ((call.need_send && !call.args.send) || (call.need_recv && !call.args.recv))) {
    return CallError(Fail(ncclInvalidArgument, comm, std::string(name) + ": null buffer with count " +
                                                         std::to_string(call.args.count)));
  }
  if (call.reduction) {
    rc = ResolveRed(name, comm, call.op, call.args.dtype, &call.args.red);
    if (rc != ncclSuccess) return CallError(rc);
  }
  LogCall(name + 4, call.args.send, call.args.recv, call.args.count, datatype, call.reduction ? static_cast<int>(call.op) : 0,
          call.args.root, comm, stream);  // name + 4: "ncclAllReduce" -> "AllReduce"
  std::unique_ptr<Op> op = MakeCollOp(comm, call.args);
  op->set_stream(stream);
  return Submit(std::move(op));
}

CollCall Make(CollKind kind, const char* name, const void* s, void* r, size_t count, int root) {
  CollCall c;
  c.args.kind = kind;
  c.args.name = name;
  c.args.send = s;
  c.args.recv = r;
  c.args.count = count;
  c.args.root = root;
  return c;
}

ncclResult_t SubmitP2p(ncclComm* comm, int datatype, P2pArgs a, cudaStream_t stream) {
  const char* name = a.is_send ? "ncclSend" : "ncclRecv";
  ncclResult_t rc = CheckUsable(comm, name);
  if (rc != ncclSuccess) return CallError(rc);
  if (!IsValidDType(datatype)) {
    return CallError(Fail(ncclInvalidArgument, comm, std::string(name) + ": invalid datatype " + std::to_string(datatype)));
  }
  a.dtype = static_cast<DType>(datatype);
  if (a.peer < 0 || a.peer >= comm->nranks) {
    return CallError(Fail(ncclInvalidArgument, comm, std::string(name) + ": invalid peer " + std::to_string(a.peer) +
                                                         " (nranks " + std::to_string(comm->nranks) + ")"));
  }
  if (a.count > 0 && (a.is_send ? a.send == nullptr : a.recv == nullptr)) {
    return CallError(Fail(ncclInvalidArgument, comm, std::string(name) + ": null buffer"));
  }
  LogCall(a.is_send ? "Send" : "Recv", a.send, a.recv, a.count, datatype, 0, a.peer, comm, stream);
  std::unique_ptr<Op> op = MakeP2pOp(comm, a);
  op->set_stream(stream);
  return Submit(std::move(op));
}

using BroadcastFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);

BroadcastFn DynamicBroadcast() {
  static std::atomic<BroadcastFn> fn{nullptr};
  BroadcastFn f = fn.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = reinterpret_cast<BroadcastFn>(dlsym(RTLD_DEFAULT, "ncclBroadcast"));
    if (f == nullptr) f = &pncclBroadcast;
    fn.store(f, std::memory_order_release);
  }
  return f;
}

}  // namespace
}  // namespace falcon::emu

using namespace falcon::emu;  // NOLINT: entry points below are the C ABI of this module

FALCON_EMU_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return Guarded("ncclAllReduce", [&] {
    CollCall c = Make(CollKind::kAllReduce, "ncclAllReduce", sendbuff, recvbuff, count, 0);
    c.reduction = true;
    c.op = op;
    return SubmitColl(comm, datatype, c, stream);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return Guarded("ncclBroadcast", [&] {
    CollCall c = Make(CollKind::kBroadcast, "ncclBroadcast", sendbuff, recvbuff, count, root);
    c.rooted = true;
    c.need_send = IsRankOf(comm, root);
    return SubmitColl(comm, datatype, c, stream);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
    ncclComm_t comm, cudaStream_t stream) {
  // Through the dynamic symbol on purpose: see the file comment.
  return DynamicBroadcast()(buff, buff, count, datatype, root, comm, stream);
}

FALCON_EMU_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return Guarded("ncclReduce", [&] {
    CollCall c = Make(CollKind::kReduce, "ncclReduce", sendbuff, recvbuff, count, root);
    c.reduction = true;
    c.rooted = true;
    c.op = op;
    c.need_recv = IsRankOf(comm, root);
    return SubmitColl(comm, datatype, c, stream);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return Guarded("ncclAllGather", [&] {
    return SubmitColl(comm, datatype, Make(CollKind::kAllGather, "ncclAllGather", sendbuff, recvbuff, sendcount, 0), stream);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return Guarded("ncclReduceScatter", [&] {
    CollCall c = Make(CollKind::kReduceScatter, "ncclReduceScatter", sendbuff, recvbuff, recvcount, 0);
    c.reduction = true;
    c.op = op;
    return SubmitColl(comm, datatype, c, stream);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return Guarded("ncclAlltoAll", [&] {
    return SubmitColl(comm, datatype, Make(CollKind::kAlltoAll, "ncclAlltoAll", sendbuff, recvbuff, count, 0), stream);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return Guarded("ncclGather", [&] {
    CollCall c = Make(CollKind::kGather, "ncclGather", sendbuff, recvbuff, count, root);
    c.rooted = true;
    c.need_recv = IsRankOf(comm, root);
    return SubmitColl(comm, datatype, c, stream);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return Guarded("ncclScatter", [&] {
    CollCall c = Make(CollKind::kScatter, "ncclScatter", sendbuff, recvbuff, count, root);
    c.rooted = true;
    c.need_send = IsRankOf(comm, root);
    return SubmitColl(comm, datatype, c, stream);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
    int peer, ncclComm_t comm, cudaStream_t stream) {
  return Guarded("ncclSend", [&] {
    P2pArgs a;
    a.is_send = true;
    a.send = sendbuff;
    a.count = count;
    a.peer = peer;
    return SubmitP2p(comm, datatype, a, stream);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype,
    int peer, ncclComm_t comm, cudaStream_t stream) {
  return Guarded("ncclRecv", [&] {
    P2pArgs a;
    a.is_send = false;
    a.recv = recvbuff;
    a.count = count;
    a.peer = peer;
    return SubmitP2p(comm, datatype, a, stream);
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclGroupStart() {
  return Guarded("ncclGroupStart", [] { return GroupStart(); });
}
FALCON_EMU_EXPORT ncclResult_t pncclGroupEnd() {
  return Guarded("ncclGroupEnd", [] { return GroupEnd(); });
}
FALCON_EMU_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return Guarded("ncclGroupSimulateEnd", [&] { return GroupSimulateEnd(simInfo); });
}

FALCON_EMU_EXPORT ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
    ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm) {
  return Guarded("ncclRedOpCreatePreMulSum", [&] {
    if (!IsLiveComm(comm)) return Fail(ncclInvalidArgument, nullptr, "ncclRedOpCreatePreMulSum: invalid communicator");
    if (const ncclResult_t rc = EnsureReady(comm, "ncclRedOpCreatePreMulSum"); rc != ncclSuccess) return rc;
    if (!op || !scalar) return Fail(ncclInvalidArgument, comm, "ncclRedOpCreatePreMulSum: null op or scalar");
    if (!IsValidDType(datatype)) return Fail(ncclInvalidArgument, comm, "ncclRedOpCreatePreMulSum: invalid datatype");
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate) {
      return Fail(ncclInvalidArgument, comm, "ncclRedOpCreatePreMulSum: invalid scalar residence");
    }
    RedOpEntry e;
    e.live = true;
    e.dtype = static_cast<DType>(datatype);
    e.device_residence = residence == ncclScalarDevice;
    e.ptr = scalar;
    if (!e.device_residence) e.scalar = LoadScalar(e.dtype, scalar);
    size_t idx = 0;
    while (idx < comm->redops.size() && comm->redops[idx].live) ++idx;
    if (idx == comm->redops.size()) comm->redops.push_back(e);
    else comm->redops[idx] = e;
    *op = static_cast<ncclRedOp_t>(static_cast<int>(ncclNumOps) + static_cast<int>(idx));
    return ncclSuccess;
  });
}

FALCON_EMU_EXPORT ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return Guarded("ncclRedOpDestroy", [&] {
    if (!IsLiveComm(comm)) return Fail(ncclInvalidArgument, nullptr, "ncclRedOpDestroy: invalid communicator");
    if (const ncclResult_t rc = EnsureReady(comm, "ncclRedOpDestroy"); rc != ncclSuccess) return rc;
    const int idx = static_cast<int>(op) - static_cast<int>(ncclNumOps);
    if (idx < 0 || static_cast<size_t>(idx) >= comm->redops.size() || !comm->redops[static_cast<size_t>(idx)].live) {
      return Fail(ncclInvalidArgument, comm, "ncclRedOpDestroy: op " + std::to_string(static_cast<int>(op)) +
                                                 " was not created by ncclRedOpCreatePreMulSum on this communicator");
    }
    comm->redops[static_cast<size_t>(idx)].live = false;
    return ncclSuccess;
  });
}

FALCON_EMU_ALIAS(ncclResult_t, ncclAllReduce, (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclBroadcast, (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclBcast, (void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclReduce, (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclAllGather, (const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclReduceScatter, (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclAlltoAll, (const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclGather, (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclScatter, (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclSend, (const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclRecv, (void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclGroupStart, ());
FALCON_EMU_ALIAS(ncclResult_t, ncclGroupEnd, ());
FALCON_EMU_ALIAS(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t*));
FALCON_EMU_ALIAS(ncclResult_t, ncclRedOpCreatePreMulSum, (ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t));
FALCON_EMU_ALIAS(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t, ncclComm_t));
