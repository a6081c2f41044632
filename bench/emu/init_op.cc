// Init / split / shrink state machines; see init_op.h.
// Thread-safety: owner thread only. Must never block; waits are retried by the engine.
#include "init_op.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>

#include "coll_op.h"
#include "emu_config.h"
#include "job_state.h"

namespace falcon::emu {
namespace {

class InitOp final : public Op {
 public:
  InitOp(ncclComm* comm, int global) : Op(comm), global_(global) {}

 protected:
  Progress Step(int64_t now) override {
    if (start_ns_ == 0) start_ns_ = now;
    if (!comm_->seg) comm_->seg = std::make_unique<Segment>();
    Segment* seg = comm_->seg.get();
    if (!joined_) {
      if (!seg->mapped()) {
        std::string err;
        const auto st = seg->TryOpen(SegmentName(comm_->key), comm_->key, comm_->nranks,
                                     Config().slot_bytes, Config().p2p_chunk_bytes, &err);
        if (st == Segment::Status::kError) return Failed(ncclInvalidUsage, "ncclCommInitRank: " + err);
        if (st == Segment::Status::kPending) return Timeout(now, {});
      }
      RankCtl* me = seg->rank(comm_->rank);
      if (LoadAcquire(me->pid) != 0) {
        return Failed(ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(comm_->rank) +
                                            " joined " + comm_->label + " twice");
      }
      me->global_rank = global_;
      me->device = comm_->device;
      StoreRelease(me->pid, static_cast<int32_t>(getpid()));
      const int before = std::atomic_ref<int32_t>(seg->header()->joined).fetch_add(1);
      if (before + 1 == comm_->nranks) seg->Unlink();  // everyone has it mapped now
      joined_ = true;
      return Progress::kAdvanced;
    }
    if (LoadAcquire(seg->header()->joined) < comm_->nranks) {
      std::vector<int> missing, gone;
      const bool check_gone = wait_.LivenessDue(now);
      for (int r = 0; r < comm_->nranks; ++r) {
        if (LoadAcquire(seg->rank(r)->pid) == 0) missing.push_back(r);
        else if (check_gone && PeerGone(*seg, r)) gone.push_back(r);
      }
      if (!gone.empty()) {
        return Failed(ncclRemoteError, "ncclCommInitRank failed on " + comm_->label + ": ranks " + RankList(gone) +
                                           " joined, then their process exited or they aborted the communicator");
      }
      return Timeout(now, missing);
    }
    comm_->globals.resize(static_cast<size_t>(comm_->nranks));
    for (int r = 0; r < comm_->nranks; ++r) comm_->globals[static_cast<size_t>(r)] = seg->rank(r)->global_rank;
    RefreshCommNodes(comm_, Refresh::kAlways);
    OfferEpochNs(seg->header()->epoch_ns);
    comm_->state = CommState::kReady;
    return Progress::kDone;
  }

 private:
  Progress Failed(ncclResult_t code, const std::string& text) {
    comm_->state = CommState::kFailed;
    if (comm_->seg) comm_->seg->Unlink();
    result_ = Fail(code, comm_, text, Loud::kYes);
    return Progress::kFailed;
  }
  // Waits forever (as NCCL) unless FALCON_EMU_TIMEOUT_S set a lenient deadline.
  Progress Timeout(int64_t now, const std::vector<int>& missing) {
    const double limit = Config().timeout_s;
    if (limit <= 0 || static_cast<double>(now - start_ns_) * 1e-9 <= limit) return Progress::kPending;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "ncclCommInitRank timed out on %s after %.3f s: %s%s%s", comm_->label.c_str(),
                  static_cast<double>(now - start_ns_) * 1e-9,
                  missing.empty() ? "the communicator segment never became ready" : "ranks ",
                  missing.empty() ? "" : RankList(missing).c_str(),
                  missing.empty() ? "" : " did not arrive");
    return Failed(ncclRemoteError, buf);
  }

  int global_;
  bool joined_ = false;
  int64_t start_ns_ = 0;
  PeerWait wait_;  // liveness checks of joined ranks only
};

class SplitOp final : public Op {
 public:
  SplitOp(ncclComm* parent, int color, int key, bool child_blocking, ncclComm** out)
      : Op(parent), color_(color), key_(key), child_blocking_(child_blocking), out_(out) {}
  ~SplitOp() override {
    if (child_) Release(child_);
  }

  // The child handle exists from here on (NCCL hands out a valid handle at once); its rank
  // and size are filled in once the all-gather on the parent has run.
  void Launch() override {
    index_ = comm_->splits++;
    mine_[0] = color_;
    mine_[1] = key_;
    all_.assign(static_cast<size_t>(comm_->nranks) * 2, 0);
    CollArgs a;
    a.kind = CollKind::kAllGather;
    a.name = "ncclCommSplit";
    a.send = mine_;
    a.recv = all_.data();
    a.count = 2;
    a.dtype = DType::kInt32;
    gather_ = MakeCollOp(comm_, a);
    gather_->Launch();
    if (color_ == NCCL_SPLIT_NOCOLOR) {
      *out_ = nullptr;
      return;
    }
    const uint64_t key = DeriveKey(comm_->key, 1, index_, static_cast<uint64_t>(static_cast<uint32_t>(color_)));
    child_ = NewComm(0, 1, key, comm_->device);
    child_->blocking = child_blocking_;
    Retain(child_);  // ours, while we drive it
    __atomic_store_n(out_, child_, __ATOMIC_RELEASE);  // another thread may read it to abort
  }

  ncclComm* child() const override { return child_; }

 protected:
  Progress Step(int64_t now) override {
    if (!child_op_) {
      const Progress p = gather_->Poll(now);
      if (p == Progress::kFailed) {
        result_ = gather_->result();
        return p;
      }
      if (p != Progress::kDone) return p;
      if (!child_) return Progress::kDone;  // NCCL_SPLIT_NOCOLOR
      std::vector<std::pair<std::pair<int, int>, int>> members;  // ((key, parent rank), parent rank)
      for (int r = 0; r < comm_->nranks; ++r) {
        if (all_[static_cast<size_t>(r) * 2] == color_) {
          members.push_back({{all_[static_cast<size_t>(r) * 2 + 1], r}, r});
        }
      }
      std::sort(members.begin(), members.end());
      int my_rank = 0;
      for (size_t i = 0; i < members.size(); ++i) {
        if (members[i].second == comm_->rank) my_rank = static_cast<int>(i);
      }
      SetGeometry(child_, my_rank, static_cast<int>(members.size()));
      child_op_ = MakeInitOp(child_, comm_->globals[static_cast<size_t>(comm_->rank)]);
      return Progress::kAdvanced;
    }
    const Progress p = child_op_->Poll(now);
    if (p == Progress::kFailed) result_ = child_op_->result();
    return p;
  }

 private:
  int color_, key_;
  bool child_blocking_;
  ncclComm** out_;
  ncclComm* child_ = nullptr;  // one reference held
  uint64_t index_ = 0;
  int32_t mine_[2] = {0, 0};
  std::vector<int32_t> all_;
  std::unique_ptr<Op> gather_;
  std::unique_ptr<Op> child_op_;
};

class ShrinkOp final : public Op {
 public:
  ShrinkOp(ncclComm* parent, std::vector<int> exclude, bool child_blocking, ncclComm** out)
      : Op(parent), exclude_(std::move(exclude)), child_blocking_(child_blocking), out_(out) {}

  void Launch() override {
    const uint64_t index = comm_->shrinks++;
    std::sort(exclude_.begin(), exclude_.end());
    uint64_t salt = 0;
    for (int r : exclude_) salt = DeriveKey(salt, static_cast<uint64_t>(r), 0, 0);
    int my_rank = 0, n = 0;
    for (int r = 0; r < comm_->nranks; ++r) {
      if (std::binary_search(exclude_.begin(), exclude_.end(), r)) continue;
      if (r == comm_->rank) my_rank = n;
      ++n;
    }
    ncclComm* child = NewComm(my_rank, n, DeriveKey(comm_->key, 2, index, salt), comm_->device);
    child->blocking = child_blocking_;
    __atomic_store_n(out_, child, __ATOMIC_RELEASE);  // another thread may read it to abort
    child_op_ = MakeInitOp(child, comm_->globals[static_cast<size_t>(comm_->rank)]);
  }

  ncclComm* child() const override { return child_op_ ? child_op_->comm() : nullptr; }

 protected:
  Progress Step(int64_t now) override {
    const Progress p = child_op_->Poll(now);
    if (p == Progress::kFailed) result_ = child_op_->result();
    return p;
  }

 private:
  std::vector<int> exclude_;
  bool child_blocking_;
  ncclComm** out_;
  std::unique_ptr<Op> child_op_;
};

}  // namespace

std::unique_ptr<Op> MakeInitOp(ncclComm* comm, int global_rank) {
  return std::make_unique<InitOp>(comm, global_rank);
}
std::unique_ptr<Op> MakeSplitOp(ncclComm* parent, int color, int key, bool child_blocking, ncclComm** newcomm) {
  return std::make_unique<SplitOp>(parent, color, key, child_blocking, newcomm);
}
std::unique_ptr<Op> MakeShrinkOp(ncclComm* parent, std::vector<int> exclude, bool child_blocking,
                                 ncclComm** newcomm) {
  return std::make_unique<ShrinkOp>(parent, std::move(exclude), child_blocking, newcomm);
}

}  // namespace falcon::emu
