// Emulator collectives against a reference: every op x datatype x reduction at 1, 2, 3, 4, 5 and
// 8 ranks, out-of-place and in-place, for 0, 1, 7, 1000 and 65537 elements, plus a large
// (256 MiB) all-reduce. The reference folds each rank's input in rank order with the datatype
// kernels of datatypes.h (themselves tested bit-exactly in datatypes_test.cc); results must be
// byte-identical on every rank.
//
// Thread-safety: single-threaded test; ranks are forked processes (emu_test_util.h).
// Must never: sleep to synchronise (the kit waits on child exit with a deadline).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "datatypes.h"
#include "emu_test_util.h"

namespace falcon::emu {
namespace {

using testing::RunRanks;

constexpr ncclDataType_t kTypes[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                                     ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16,
                                     ncclFloat8e4m3, ncclFloat8e5m2};

void StoreValue(DType t, void* buf, size_t i, double v) {
  switch (t) {
    case DType::kInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v); break;
    case DType::kUint8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); break;
    case DType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case DType::kUint32: static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case DType::kUint64: static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(v); break;
    case DType::kFloat16: static_cast<uint16_t*>(buf)[i] = FloatToHalf(static_cast<float>(v)); break;
    case DType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(buf)[i] = v; break;
    case DType::kBfloat16: static_cast<uint16_t*>(buf)[i] = FloatToBf16(static_cast<float>(v)); break;
    case DType::kFp8E4M3: static_cast<uint8_t*>(buf)[i] = FloatToE4M3(static_cast<float>(v)); break;
    case DType::kFp8E5M2: static_cast<uint8_t*>(buf)[i] = FloatToE5M2(static_cast<float>(v)); break;
  }
}

// Deterministic input of `rank` at element i (block-relative index folded in by callers).
double InputValue(DType t, int rank, size_t i) {
  const auto k = static_cast<int>((static_cast<size_t>(rank) * 7 + i * 13) % 11);
  if (!IsFloatDType(t)) {
    return (t == DType::kUint8 || t == DType::kUint32 || t == DType::kUint64) ? k + 1 : k - 4;
  }
  return (k - 5) * 0.5 + (k == 3 ? 0.25 : 0.0);
}

using Bytes = std::vector<unsigned char>;

Bytes MakeInput(DType t, int rank, size_t elems) {
  Bytes b(elems * DTypeSize(t) + 1);
  for (size_t i = 0; i < elems; ++i) StoreValue(t, b.data(), i, InputValue(t, rank, i));
  return b;
}

struct Red {
  ncclRedOp_t op;
  RedKind kind;
  bool premul;
  bool device;
};

Scalar RankScalar(DType t, int rank) {
  Scalar s;
  s.i = rank + 1;
  s.f = 0.5 * (rank + 1);
  (void)t;
  return s;
}

// Reference reduction over all ranks' inputs (each `elems` long) -> `elems` results.
Bytes ReferenceReduce(DType t, const Red& red, int n, size_t elems, size_t block_off) {
  const size_t es = DTypeSize(t);
  std::vector<Bytes> in;
  std::vector<const void*> srcs;
  for (int r = 0; r < n; ++r) {
    Bytes full = MakeInput(t, r, block_off + elems);
    Bytes part(elems * es + 1);
    if (elems) std::memcpy(part.data(), full.data() + block_off * es, elems * es);
    if (red.premul) {
      ScaleCopy(t, part.data(), part.data(), elems, RankScalar(t, r));
    } else if (red.op == ncclAvg && IsFloatDType(t)) {
      Scalar s;
      s.f = 1.0 / n;
      ScaleCopy(t, part.data(), part.data(), elems, s);
    }
    in.push_back(std::move(part));
  }
  for (auto& b : in) srcs.push_back(b.data());
  Bytes out(elems * es + 1);
  if (elems) Reduce(t, red.kind, out.data(), srcs.data(), n, elems);
  if (red.op == ncclAvg && !IsFloatDType(t)) IntDivide(t, out.data(), elems, n);
  return out;
}

// Writes the scalar for PreMulSum in the element type.
Bytes ScalarBytes(DType t, int rank) {
  Bytes b(8);
  StoreValue(t, b.data(), 0, IsFloatDType(t) ? 0.5 * (rank + 1) : rank + 1);
  return b;
}

struct Ctx {
  ncclComm_t comm;
  int rank;
  int n;
  int failures = 0;
};

bool Same(const Bytes& a, const void* b, size_t bytes) { return bytes == 0 || std::memcmp(a.data(), b, bytes) == 0; }

void CheckReductions(Ctx& c, DType t, size_t count, bool inplace) {
  int& failures = c.failures;
  const auto dt = static_cast<ncclDataType_t>(t);
  const size_t es = DTypeSize(t);
  std::vector<Red> reds = {{ncclSum, RedKind::kSum, false, false}, {ncclProd, RedKind::kProd, false, false},
                           {ncclMax, RedKind::kMax, false, false}, {ncclMin, RedKind::kMin, false, false},
                           {ncclAvg, RedKind::kSum, false, false}, {ncclSum, RedKind::kSum, true, false},
                           {ncclSum, RedKind::kSum, true, true}};
  for (Red red : reds) {
    Bytes scalar = ScalarBytes(t, c.rank);
    if (red.premul) {
      EMU_CHECK(ncclRedOpCreatePreMulSum(&red.op, scalar.data(), dt,
                                         red.device ? ncclScalarDevice : ncclScalarHostImmediate,
                                         c.comm) == ncclSuccess, "create premulsum");
    }
    const char* what = red.premul ? "premulsum" : "builtin";
    // AllReduce
    {
      Bytes ref = ReferenceReduce(t, red, c.n, count, 0);
      Bytes send = MakeInput(t, c.rank, count), recv(count * es + 1, 0xEE);
      void* out = inplace ? send.data() : recv.data();
      EMU_CHECK(ncclAllReduce(send.data(), out, count, dt, red.op, c.comm, nullptr) == ncclSuccess, "allreduce");
      EMU_CHECK(Same(ref, out, count * es), "allreduce %s %s op=%d count=%zu inplace=%d", DTypeName(t), what,
                static_cast<int>(red.op), count, inplace);
    }
    // Reduce to the last rank
    {
      const int root = c.n - 1;
      Bytes ref = ReferenceReduce(t, red, c.n, count, 0);
      Bytes send = MakeInput(t, c.rank, count), recv(count * es + 1, 0xEE);
      void* out = inplace ? send.data() : recv.data();
      EMU_CHECK(ncclReduce(send.data(), out, count, dt, red.op, root, c.comm, nullptr) == ncclSuccess, "reduce");
      if (c.rank == root) {
        EMU_CHECK(Same(ref, out, count * es), "reduce %s %s count=%zu inplace=%d", DTypeName(t), what, count, inplace);
      }
    }
    // ReduceScatter: rank r's input is n blocks; block b of the input is MakeInput(...)[b*count..]
    {
      Bytes send = MakeInput(t, c.rank, count * static_cast<size_t>(c.n)), recv(count * es + 1, 0xEE);
      Bytes ref = ReferenceReduce(t, red, c.n, count, static_cast<size_t>(c.rank) * count);
      void* out = inplace ? send.data() + static_cast<size_t>(c.rank) * count * es : recv.data();
      EMU_CHECK(ncclReduceScatter(send.data(), out, count, dt, red.op, c.comm, nullptr) == ncclSuccess, "rs");
      EMU_CHECK(Same(ref, out, count * es), "reducescatter %s %s op=%d count=%zu inplace=%d", DTypeName(t), what,
                static_cast<int>(red.op), count, inplace);
    }
    if (red.premul) EMU_CHECK(ncclRedOpDestroy(red.op, c.comm) == ncclSuccess, "destroy premulsum");
  }
}

void CheckMovement(Ctx& c, DType t, size_t count, bool inplace) {
  int& failures = c.failures;
  const auto dt = static_cast<ncclDataType_t>(t);
  const size_t es = DTypeSize(t);
  const auto un = static_cast<size_t>(c.n);
  const auto me = static_cast<size_t>(c.rank);
  const size_t bytes = count * es;
  // Broadcast and Bcast from the middle rank.
  {
    const int root = c.n / 2;
    Bytes ref = MakeInput(t, root, count);
    Bytes send = MakeInput(t, c.rank, count), recv(bytes + 1, 0xEE);
    void* out = inplace ? send.data() : recv.data();
    EMU_CHECK(ncclBroadcast(send.data(), out, count, dt, root, c.comm, nullptr) == ncclSuccess, "bcast");
    EMU_CHECK(Same(ref, out, bytes), "broadcast %s count=%zu inplace=%d", DTypeName(t), count, inplace);
    Bytes buf = MakeInput(t, c.rank, count);
    EMU_CHECK(ncclBcast(buf.data(), count, dt, root, c.comm, nullptr) == ncclSuccess, "Bcast");
    EMU_CHECK(Same(ref, buf.data(), bytes), "ncclBcast %s count=%zu", DTypeName(t), count);
  }
  // Expected concatenation of every rank's input.
  Bytes all(bytes * un + 1);
  for (int r = 0; r < c.n; ++r) {
    Bytes in = MakeInput(t, r, count);
    if (bytes) std::memcpy(all.data() + static_cast<size_t>(r) * bytes, in.data(), bytes);
  }
  // AllGather
  {
    Bytes in = MakeInput(t, c.rank, count), recv(bytes * un + 1, 0xEE);
    const void* send = in.data();
    if (inplace) {
      if (bytes) std::memcpy(recv.data() + me * bytes, in.data(), bytes);
      send = recv.data() + me * bytes;
    }
    EMU_CHECK(ncclAllGather(send, recv.data(), count, dt, c.comm, nullptr) == ncclSuccess, "allgather");
    EMU_CHECK(Same(all, recv.data(), bytes * un), "allgather %s count=%zu inplace=%d", DTypeName(t), count, inplace);
  }
  // Gather to rank 0
  {
    Bytes in = MakeInput(t, c.rank, count), recv(bytes * un + 1, 0xEE);
    const void* send = in.data();
    if (inplace) {
      if (bytes) std::memcpy(recv.data() + me * bytes, in.data(), bytes);
      send = recv.data() + me * bytes;
    }
    EMU_CHECK(ncclGather(send, recv.data(), count, dt, 0, c.comm, nullptr) == ncclSuccess, "gather");
    if (c.rank == 0) EMU_CHECK(Same(all, recv.data(), bytes * un), "gather %s count=%zu", DTypeName(t), count);
  }
  // Scatter from the last rank: root's input of n*count elements, block r goes to rank r.
  {
    const int root = c.n - 1;
    Bytes rootin = MakeInput(t, root, count * un);
    Bytes send = MakeInput(t, c.rank, count * un), recv(bytes + 1, 0xEE);
    void* out = (inplace && c.rank == root) ? send.data() + me * bytes : recv.data();
    EMU_CHECK(ncclScatter(send.data(), out, count, dt, root, c.comm, nullptr) == ncclSuccess, "scatter");
    EMU_CHECK(bytes == 0 || std::memcmp(rootin.data() + me * bytes, out, bytes) == 0, "scatter %s count=%zu", DTypeName(t), count);
  }
  // AlltoAll: rank r sends block j of its input to rank j; rank j gets block j of each rank.
  {
    Bytes send = MakeInput(t, c.rank, count * un), recv(bytes * un + 1, 0xEE);
    void* out = inplace ? send.data() : recv.data();
    EMU_CHECK(ncclAlltoAll(send.data(), out, count, dt, c.comm, nullptr) == ncclSuccess, "alltoall");
    for (int r = 0; r < c.n; ++r) {
      Bytes theirs = MakeInput(t, r, count * un);
      EMU_CHECK(bytes == 0 || std::memcmp(theirs.data() + me * bytes, static_cast<char*>(out) + static_cast<size_t>(r) * bytes, bytes) == 0,
                "alltoall %s count=%zu from %d", DTypeName(t), count, r);
    }
  }
  // Send/Recv ring in a group.
  {
    const int next = (c.rank + 1) % c.n, prev = (c.rank + c.n - 1) % c.n;
    Bytes send = MakeInput(t, c.rank, count), recv(bytes + 1, 0xEE);
    ncclGroupStart();
    ncclSend(send.data(), count, dt, next, c.comm, nullptr);
    ncclRecv(recv.data(), count, dt, prev, c.comm, nullptr);
    EMU_CHECK(ncclGroupEnd() == ncclSuccess, "ring group");
    Bytes ref = MakeInput(t, prev, count);
    EMU_CHECK(Same(ref, recv.data(), bytes), "sendrecv %s count=%zu", DTypeName(t), count);
  }
}

int MatrixBody(int rank, int n, const ncclUniqueId& id, const std::vector<size_t>& counts) {
  Ctx c{nullptr, rank, n};
  if (ncclCommInitRank(&c.comm, n, id, rank) != ncclSuccess) return 2;
  for (ncclDataType_t dt : kTypes) {
    for (size_t count : counts) {
      // The large count (many staging rounds) runs for a representative subset of types.
      const bool big_ok = dt == ncclInt8 || dt == ncclInt64 || dt == ncclFloat16 || dt == ncclFloat32 ||
                          dt == ncclBfloat16 || dt == ncclFloat8e4m3;
      if (count > 10000 && !big_ok) continue;
      for (bool inplace : {false, true}) {
        CheckReductions(c, static_cast<DType>(dt), count, inplace);
        CheckMovement(c, static_cast<DType>(dt), count, inplace);
        if (c.failures > 20) return 1;
      }
    }
  }
  ncclCommDestroy(c.comm);
  return c.failures ? 1 : 0;
}

class EmuCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(EmuCollectivesTest, EveryOpTypeAndReductionMatchesReference) {
  const int n = GetParam();
  std::vector<size_t> counts = {0, 1, 7, 1000};
  if (n == 2) counts.push_back(65537);
  testing::RunOptions opt;
  opt.deadline_s = 120;
  // Small staging slots force many rounds, exercising chunking on every op.
  opt.env["FALCON_EMU_CHUNK_BYTES"] = "4096";
  opt.env["FALCON_EMU_P2P_CHUNK_BYTES"] = "4096";
  opt.env["FALCON_EMU_FABRIC"] = "off";
  const auto codes = RunRanks(n, [&](int r, const ncclUniqueId& id) { return MatrixBody(r, n, id, counts); }, opt);
  EXPECT_TRUE(testing::AllZero(codes)) << "exit codes: " << testing::Codes(codes);
}

INSTANTIATE_TEST_SUITE_P(Ranks, EmuCollectivesTest, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(EmuCollectivesLargeTest, AllReduce256MiBInPlace) {
  testing::RunOptions opt;
  opt.env["FALCON_EMU_FABRIC"] = "off";
  const auto codes = RunRanks(2, [](int rank, const ncclUniqueId& id) {
    int failures = 0;
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    const size_t count = (size_t{256} << 20) / sizeof(float);
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((i % 1000) + static_cast<size_t>(rank));
    EMU_CHECK(ncclAllReduce(buf.data(), buf.data(), count, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess, "ar");
    for (size_t i = 0; i < count; i += 4093) {
      EMU_CHECK(buf[i] == static_cast<float>(2 * (i % 1000) + 1), "element %zu = %f", i, static_cast<double>(buf[i]));
      if (failures) break;
    }
    ncclCommDestroy(comm);
    return failures ? 1 : 0;
  }, opt);
  EXPECT_TRUE(testing::AllZero(codes)) << testing::Codes(codes);
}

}  // namespace
}  // namespace falcon::emu
