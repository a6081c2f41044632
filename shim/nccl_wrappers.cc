// The exported NCCL API: one wrapper per function declared in nccl.h 2.28.
//
// Each wrapper resolves the real function once (real_nccl.h), describes the call (CallDesc) and
// runs it through Intercept (tracer.h), which forwards and records. The real result is always
// returned unchanged. A function the real library lacks returns ncclInvalidUsage (string
// queries return a fixed message) after one warning. Communicator-creating calls register the
// new communicator with an identity every member computes alike (comm_registry.h).
// Thread-safety: as NCCL's own; the shim adds no locks. Never throws (built -fno-exceptions).
#include "shim/wrapper_util.h"

using falcon::shim::CallDesc;
using falcon::shim::Intercept;

extern "C" {

// ---- Collectives and point-to-point ---------------------------------------------------------

FALCON_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclAllReduce, kFalconOpAllReduce);
  auto d = falcon::shim::Coll(kFalconOpAllReduce, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
  return Intercept(d, [&] { return real(sendbuff, recvbuff, count, datatype, op, comm, stream); });
}

FALCON_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         int root, ncclComm_t comm, cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclBroadcast, kFalconOpBroadcast);
  auto d = falcon::shim::Coll(kFalconOpBroadcast, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
  return Intercept(d, [&] { return real(sendbuff, recvbuff, count, datatype, root, comm, stream); });
}

FALCON_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclBcast, kFalconOpBcast);
  auto d = falcon::shim::Coll(kFalconOpBcast, buff, buff, count, datatype, -1, root, comm, stream);
  return Intercept(d, [&] { return real(buff, count, datatype, root, comm, stream); });
}

FALCON_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclReduce, kFalconOpReduce);
  auto d = falcon::shim::Coll(kFalconOpReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  return Intercept(d, [&] { return real(sendbuff, recvbuff, count, datatype, op, root, comm, stream); });
}

FALCON_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclAllGather, kFalconOpAllGather);
  auto d = falcon::shim::Coll(kFalconOpAllGather, sendbuff, recvbuff, sendcount, datatype, -1, -1, comm, stream);
  return Intercept(d, [&] { return real(sendbuff, recvbuff, sendcount, datatype, comm, stream); });
}

FALCON_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclReduceScatter, kFalconOpReduceScatter);
  auto d = falcon::shim::Coll(kFalconOpReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream);
  return Intercept(d, [&] { return real(sendbuff, recvbuff, recvcount, datatype, op, comm, stream); });
}

FALCON_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        ncclComm_t comm, cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclAlltoAll, kFalconOpAlltoAll);
  auto d = falcon::shim::Coll(kFalconOpAlltoAll, sendbuff, recvbuff, count, datatype, -1, -1, comm, stream);
  return Intercept(d, [&] { return real(sendbuff, recvbuff, count, datatype, comm, stream); });
}

FALCON_EXPORT ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclGather, kFalconOpGather);
  auto d = falcon::shim::Coll(kFalconOpGather, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
  return Intercept(d, [&] { return real(sendbuff, recvbuff, count, datatype, root, comm, stream); });
}

FALCON_EXPORT ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm_t comm, cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclScatter, kFalconOpScatter);
  auto d = falcon::shim::Coll(kFalconOpScatter, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
  return Intercept(d, [&] { return real(sendbuff, recvbuff, count, datatype, root, comm, stream); });
}

FALCON_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                    ncclComm_t comm, cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclSend, kFalconOpSend);
  auto d = falcon::shim::Coll(kFalconOpSend, sendbuff, nullptr, count, datatype, -1, peer, comm, stream);
  return Intercept(d, [&] { return real(sendbuff, count, datatype, peer, comm, stream); });
}

FALCON_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                    cudaStream_t stream) {
  FALCON_REAL_OR_FAIL(ncclRecv, kFalconOpRecv);
  auto d = falcon::shim::Coll(kFalconOpRecv, nullptr, recvbuff, count, datatype, -1, peer, comm, stream);
  return Intercept(d, [&] { return real(recvbuff, count, datatype, peer, comm, stream); });
}

// ---- Groups ---------------------------------------------------------------------------------

FALCON_EXPORT ncclResult_t ncclGroupStart() {
  FALCON_REAL_OR_FAIL(ncclGroupStart, kFalconOpGroupStart);
  return Intercept(CallDesc{kFalconOpGroupStart}, [&] { return real(); });
}

FALCON_EXPORT ncclResult_t ncclGroupEnd() {
  FALCON_REAL_OR_FAIL(ncclGroupEnd, kFalconOpGroupEnd);
  return Intercept(CallDesc{kFalconOpGroupEnd}, [&] { return real(); });
}

FALCON_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  FALCON_REAL_OR_FAIL(ncclGroupSimulateEnd, kFalconOpGroupSimulateEnd);
  return Intercept(CallDesc{kFalconOpGroupSimulateEnd}, [&] { return real(simInfo); });
}

}  // extern "C"
