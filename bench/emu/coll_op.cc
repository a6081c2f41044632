// Collective state machine; see coll_op.h for the round protocol and invariants.
// Thread-safety: owner thread only. Must never block or touch memory outside the caller's
// buffers and the communicator's own slots.
#include "coll_op.h"

#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstring>

#include "emu_config.h"

namespace falcon::emu {
namespace {

const char* KindName(int k) {
  static constexpr const char* kNames[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce",
      "ncclAllGather", "ncclReduceScatter", "ncclAlltoAll", "ncclGather", "ncclScatter"};
  return (k >= 0 && k < 8) ? kNames[k] : "unknown";
}

bool IsRooted(CollKind k) {
  return k == CollKind::kBroadcast || k == CollKind::kReduce || k == CollKind::kGather ||
         k == CollKind::kScatter;
}
bool PerBlock(CollKind k) {
  return k == CollKind::kReduceScatter || k == CollKind::kAlltoAll || k == CollKind::kScatter;
}

class CollOp final : public Op {
 public:
  CollOp(ncclComm* comm, const CollArgs& args) : Op(comm), a_(args) {}

  void Launch() override {
    const int n = comm_->nranks;
    esize_ = DTypeSize(a_.dtype);
    const size_t blocks = PerBlock(a_.kind) ? static_cast<size_t>(n) : 1;
    // A round moves the same bytes per block whatever the datatype (a multiple of the largest
    // element), so members whose datatypes differ but whose byte sizes agree stay in step.
    const size_t block_bytes = comm_->seg->slot_bytes() / blocks / kMaxDTypeSize * kMaxDTypeSize;
    elems_ = block_bytes / esize_;
    if (elems_ == 0) elems_ = 1;
    rounds_ = a_.count == 0 ? 1 : (a_.count + elems_ - 1) / elems_;
    coll_index_ = comm_->colls_launched++;
    step_base_ = comm_->last_step;
    comm_->last_step += rounds_;
    srcs_.resize(static_cast<size_t>(n));
    if (a_.red.premul && a_.red.device_ptr) a_.red.scalar = LoadScalar(a_.dtype, a_.red.device_ptr);
  }

  Progress Step(int64_t now) override;
  bool device_work() const override { return true; }
  std::unique_ptr<Op> Clone() const override {
    auto op = std::make_unique<CollOp>(comm_, a_);
    op->set_stream(stream_);
    return op;
  }

  double ModelSeconds() const override {
    return ModelCollSeconds(Config().fabric, &Config().plan, a_.kind, comm_->nodes, ModelBytes(),
                            JobSeconds(NowNs()));
  }

 private:
  enum class Phase { kTurn, kHang, kPost, kGather, kMismatch, kModel };

  double ModelBytes() const {
    const double b = static_cast<double>(a_.count) * static_cast<double>(DTypeSize(a_.dtype));
    switch (a_.kind) {
      case CollKind::kAllReduce:
      case CollKind::kBroadcast:
      case CollKind::kReduce: return b;
      default: return b * comm_->nranks;
    }
  }
  uint64_t CurStep() const { return step_base_ + round_ + 1; }
  size_t Off() const { return static_cast<size_t>(round_) * elems_; }
  size_t Len() const {
    const size_t off = Off();
    return off >= a_.count ? 0 : std::min(elems_, a_.count - off);
  }
  const char* SendAt(size_t elem) const { return static_cast<const char*>(a_.send) + elem * esize_; }
  char* RecvAt(size_t elem) const { return static_cast<char*>(a_.recv) + elem * esize_; }

  void PostData(char* d);
  void GatherData();
  // Round 0: false (with the message in *why) when the members' calls cannot run together
  // (coll_op.h); a datatype or reduction difference alone at equal byte size passes.
  bool Signature(uint64_t step, std::string* why) const;
  Progress WaitFailed(int64_t now, const std::vector<int>& missing, const char* what);
  Progress Failed(ncclResult_t code, const std::string& text) {
    result_ = Fail(code, comm_, text, Loud::kYes);
    SetAsyncError(comm_, code);
    return Progress::kFailed;
  }

  CollArgs a_;
  Phase phase_ = Phase::kTurn;
  size_t esize_ = 1;
  size_t elems_ = 1;  // elements per block per round
  uint64_t rounds_ = 1;
  uint64_t round_ = 0;
  uint64_t coll_index_ = 0;
  uint64_t step_base_ = 0;
  int64_t arrive_ns_ = 0;
  int64_t max_arrive_ns_ = 0;
  int64_t hang_deadline_ns_ = 0;
  std::string mismatch_;  // Phase::kMismatch: the signatures that disagree
  PeerWait wait_;
  std::vector<const void*> srcs_;
};

void CollOp::PostData(char* d) {
  const size_t len = Len();
  const size_t off = Off();
  const int n = comm_->nranks;
  const bool me_root = comm_->rank == a_.root;
  const Scalar one;
  const Scalar& s = a_.red.premul ? a_.red.scalar : one;
  if (len == 0) return;
  switch (a_.kind) {
    case CollKind::kAllReduce:
    case CollKind::kReduce: ScaleCopy(a_.dtype, d, SendAt(off), len, s); break;
    case CollKind::kBroadcast:
      if (me_root) std::memcpy(d, SendAt(off), len * esize_);
      break;
    case CollKind::kAllGather:
    case CollKind::kGather: std::memcpy(d, SendAt(off), len * esize_); break;
    case CollKind::kReduceScatter:
      for (int b = 0; b < n; ++b) {
        ScaleCopy(a_.dtype, d + static_cast<size_t>(b) * elems_ * esize_,
                  SendAt(static_cast<size_t>(b) * a_.count + off), len, s);
      }
      break;
    case CollKind::kScatter:
      if (!me_root) break;
      [[fallthrough]];
    case CollKind::kAlltoAll:
      for (int b = 0; b < n; ++b) {
        std::memcpy(d + static_cast<size_t>(b) * elems_ * esize_,
                    SendAt(static_cast<size_t>(b) * a_.count + off), len * esize_);
      }
      break;
  }
}

void CollOp::GatherData() {
  const size_t len = Len();
  const size_t off = Off();
  if (len == 0) return;
  const int n = comm_->nranks;
  const int me = comm_->rank;
  const uint64_t s = CurStep();
  const size_t my_piece = static_cast<size_t>(me) * elems_ * esize_;
  const auto slot = [&](int r) { return comm_->seg->slot_data(r, s); };
  switch (a_.kind) {
    case CollKind::kReduce:
      if (me != a_.root) break;
      [[fallthrough]];
    case CollKind::kAllReduce:
    case CollKind::kReduceScatter: {
      const size_t piece = a_.kind == CollKind::kReduceScatter ? my_piece : 0;
      for (int r = 0; r < n; ++r) srcs_[static_cast<size_t>(r)] = slot(r) + piece;
      Reduce(a_.dtype, a_.red.kind, RecvAt(off), srcs_.data(), n, len);
      if (a_.red.int_avg) IntDivide(a_.dtype, RecvAt(off), len, n);
      break;
    }
    case CollKind::kBroadcast: std::memcpy(RecvAt(off), slot(a_.root), len * esize_); break;
    case CollKind::kGather:
      if (me != a_.root) break;
      [[fallthrough]];
    case CollKind::kAllGather:
      for (int r = 0; r < n; ++r) {
        std::memcpy(RecvAt(static_cast<size_t>(r) * a_.count + off), slot(r), len * esize_);
      }
      break;
    case CollKind::kAlltoAll:
      for (int r = 0; r < n; ++r) {
        std::memcpy(RecvAt(static_cast<size_t>(r) * a_.count + off), slot(r) + my_piece,
                    len * esize_);
      }
      break;
    case CollKind::kScatter: std::memcpy(RecvAt(off), slot(a_.root) + my_piece, len * esize_); break;
  }
}

bool CollOp::Signature(uint64_t step, std::string* why) const {
  const SlotHeader* mine = comm_->seg->slot_header(comm_->rank, step);
  for (int r = 0; r < comm_->nranks; ++r) {
    const SlotHeader* h = comm_->seg->slot_header(r, step);
    // As on a GPU, the members' kernels only agree on bytes: a different datatype or reduction
    // at the same byte size computes garbage silently, anything else never completes.
    const bool same = IsValidDType(h->dtype) && h->kind == mine->kind && h->coll_index == mine->coll_index &&
                      h->nranks == mine->nranks && (!IsRooted(a_.kind) || h->root == mine->root) &&
                      h->count * DTypeSize(static_cast<DType>(h->dtype)) == mine->count * esize_;
    if (same) continue;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s: call mismatch on %s: rank %d called %s(count=%" PRIu64 ", %s, root=%d, "
                  "op=%d, seq=%" PRIu64 ") but rank %d called %s(count=%" PRIu64 ", %s, root=%d, "
                  "op=%d, seq=%" PRIu64 ")",
                  a_.name, comm_->label.c_str(), comm_->rank, KindName(mine->kind), mine->count,
                  DTypeName(static_cast<DType>(mine->dtype)), mine->root, mine->redkind,
                  mine->coll_index, r, KindName(h->kind), h->count,
                  IsValidDType(h->dtype) ? DTypeName(static_cast<DType>(h->dtype)) : "?", h->root,
                  h->redkind, h->coll_index);
    *why = buf;
    return false;
  }
  return true;
}

Progress CollOp::WaitFailed(int64_t now, const std::vector<int>& missing, const char* what) {
  std::vector<int> dead;
  const bool check_dead = wait_.LivenessDue(now);
  if (check_dead) {
    for (int r : missing) {
      if (PeerGone(*comm_->seg, r)) dead.push_back(r);
    }
  }
  if (dead.empty() && !wait_.Expired(now)) return Progress::kPending;
  std::vector<int> globals;
  for (int r : missing) globals.push_back(comm_->globals[static_cast<size_t>(r)]);
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "%s %s on %s (seq %" PRIu64 ", step %" PRIu64 ", round %" PRIu64 "/%" PRIu64
                ") after %.3f s: ranks %s (global %s) did not %s%s%s",
                a_.name, dead.empty() ? "timed out" : "failed", comm_->label.c_str(), coll_index_, CurStep(), round_ + 1, rounds_,
                wait_.WaitedSeconds(now), RankList(missing).c_str(), RankList(globals).c_str(),
                what, dead.empty() ? "" : "; process exited or communicator aborted for ranks ",
                dead.empty() ? "" : RankList(dead).c_str());
  return Failed(ncclRemoteError, buf);
}

Progress CollOp::Step(int64_t now) {
  const int n = comm_->nranks;
  Segment* seg = comm_->seg.get();
  bool progressed = false;
  for (;;) {
    switch (phase_) {
      case Phase::kTurn: {
        if (comm_->async_error.load() != ncclSuccess) {
          result_ = Fail(static_cast<ncclResult_t>(comm_->async_error.load()), comm_,
                         std::string(a_.name) + ": " + comm_->label + " failed earlier");
          return Progress::kFailed;
        }
        if (comm_->colls_done != coll_index_) return progressed ? Progress::kAdvanced : Progress::kPending;
        phase_ = Phase::kHang;
        progressed = true;
        break;
      }
      case Phase::kHang: {
        const int global = comm_->globals[static_cast<size_t>(comm_->rank)];
        const auto until = Config().plan.HangUntil(global, JobSeconds(now));
        if (until) {
          if (std::isinf(*until)) {
            // Forever: until the lenient deadline if one is set, else until an abort.
            if (hang_deadline_ns_ == 0) {
              hang_deadline_ns_ = Config().timeout_s > 0 ? now + static_cast<int64_t>(Config().timeout_s * 1e9)
                                                         : INT64_MAX;
            }
            if (now >= hang_deadline_ns_) {
              return Failed(ncclSystemError, std::string(a_.name) + ": " + comm_->label +
                                                 " blocked by a hang fault until the deadline");
            }
            wake_at_ns_ = hang_deadline_ns_;
          } else {
            wake_at_ns_ = EpochNs() + static_cast<int64_t>(*until * 1e9);
          }
          if (now < wake_at_ns_) return Progress::kPending;
        }
        wake_at_ns_ = 0;
        arrive_ns_ = now;
        max_arrive_ns_ = now;
        wait_.Reset(now);
        phase_ = Phase::kPost;
        break;
      }
      case Phase::kPost: {
        const uint64_t s = CurStep();
        std::vector<int> missing;
        if (s > 2) {
          for (int r = 0; r < n; ++r) {
            if (LoadAcquire(seg->rank(r)->consumed) < s - 2) missing.push_back(r);
          }
        }
        if (!missing.empty()) {
          const Progress p = WaitFailed(now, missing, "finish the previous step");
          return p == Progress::kPending && progressed ? Progress::kAdvanced : p;
        }
        SlotHeader* h = seg->slot_header(comm_->rank, s);
        h->kind = static_cast<int32_t>(a_.kind);
        h->dtype = static_cast<int32_t>(a_.dtype);
        h->redkind = a_.red.code;
        h->root = a_.root;
        h->count = a_.count;
        h->coll_index = coll_index_;
        h->arrive_ns = arrive_ns_;
        h->nranks = n;
        PostData(seg->slot_data(comm_->rank, s));
        StoreRelease(seg->rank(comm_->rank)->posted, s);
        phase_ = Phase::kGather;
        progressed = true;
        break;
      }
      case Phase::kGather: {
        const uint64_t s = CurStep();
        std::vector<int> missing;
        for (int r = 0; r < n; ++r) {
          if (LoadAcquire(seg->rank(r)->posted) < s) missing.push_back(r);
        }
        if (!missing.empty()) {
          const Progress p = WaitFailed(now, missing, "arrive");
          return p == Progress::kPending && progressed ? Progress::kAdvanced : p;
        }
        if (round_ == 0) {
          if (!Signature(s, &mismatch_)) {
            // Like NCCL's kernels, which do not compare calls: nothing completes, on any member,
            // until the lenient deadline if one is set, else until an abort (Op::Poll).
            hang_deadline_ns_ = Config().timeout_s > 0 ? now + static_cast<int64_t>(Config().timeout_s * 1e9) : INT64_MAX;
            wake_at_ns_ = hang_deadline_ns_;
            phase_ = Phase::kMismatch;
            return progressed ? Progress::kAdvanced : Progress::kPending;
          }
          for (int r = 0; r < n; ++r) {
            max_arrive_ns_ = std::max(max_arrive_ns_, seg->slot_header(r, s)->arrive_ns);
          }
        }
        GatherData();
        StoreRelease(seg->rank(comm_->rank)->consumed, s);
        progressed = true;
        wait_.Reset(now);
        if (++round_ < rounds_) {
          phase_ = Phase::kPost;
          break;
        }
        const double model = ModelCollSeconds(Config().fabric, &Config().plan, a_.kind,
                                              comm_->nodes, ModelBytes(), JobSeconds(max_arrive_ns_));
        wake_at_ns_ = max_arrive_ns_ + static_cast<int64_t>(model * 1e9);
        phase_ = Phase::kModel;
        break;
      }
      case Phase::kMismatch: {
        if (now < hang_deadline_ns_) return Progress::kPending;
        return Failed(ncclInvalidUsage, mismatch_);
      }
      case Phase::kModel: {
        if (NowNs() < wake_at_ns_) return progressed ? Progress::kAdvanced : Progress::kPending;
        wake_at_ns_ = 0;
        ++comm_->colls_done;
        return Progress::kDone;
      }
    }
  }
}

}  // namespace

std::unique_ptr<Op> MakeCollOp(ncclComm* comm, const CollArgs& args) {
  return std::make_unique<CollOp>(comm, args);
}

}  // namespace falcon::emu
