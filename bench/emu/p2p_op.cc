// Send/recv state machines; see p2p_op.h.
// Thread-safety: owner thread only. Must never block or overrun the receive buffer.
#include "p2p_op.h"

#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstring>

#include "emu_config.h"
#include "fabric_model.h"

namespace falcon::emu {
namespace {

class P2pOp final : public Op {
 public:
  P2pOp(ncclComm* comm, const P2pArgs& args) : Op(comm), a_(args) {
    bytes_ = a_.count * DTypeSize(a_.dtype);
  }

  void Launch() override {
    const auto p = static_cast<size_t>(a_.peer);
    msg_ = a_.is_send ? comm_->sends_launched[p]++ : comm_->recvs_launched[p]++;
  }

  Progress Step(int64_t now) override;
  bool device_work() const override { return true; }
  std::unique_ptr<Op> Clone() const override {
    auto op = std::make_unique<P2pOp>(comm_, a_);
    op->set_stream(stream_);
    return op;
  }
  Progress Connect(int64_t now) override;

  double ModelSeconds() const override {
    const int me = comm_->nodes[static_cast<size_t>(comm_->rank)];
    const int peer = comm_->nodes[static_cast<size_t>(a_.peer)];
    return ModelP2pSeconds(Config().fabric, &Config().plan, a_.is_send ? me : peer,
                           a_.is_send ? peer : me, static_cast<double>(bytes_), JobSeconds(NowNs()));
  }

 private:
  enum class Phase { kTurn, kHang, kData, kMismatch, kFinalAck, kModel };

  const char* Name() const { return a_.is_send ? "ncclSend" : "ncclRecv"; }
  Chan* Channel() const {
    return a_.is_send ? comm_->seg->chan(comm_->rank, a_.peer) : comm_->seg->chan(a_.peer, comm_->rank);
  }
  Progress Failed(ncclResult_t code, const std::string& text) {
    result_ = Fail(code, comm_, text, Loud::kYes);
    SetAsyncError(comm_, code);
    return Progress::kFailed;
  }
  Progress Waiting(int64_t now, bool progressed);
  bool SendChunk(Chan* ch);
  // kFailed: the chunk does not belong to this receive (mismatch_ says why; nothing consumed).
  Progress RecvChunk(Chan* ch, bool* advanced);
  void FinishData(int64_t send_arrive, int64_t recv_arrive);

  P2pArgs a_;
  size_t bytes_ = 0;
  uint64_t msg_ = 0;
  Phase phase_ = Phase::kTurn;
  uint64_t base_chunk_ = 0;  // channel chunk number before this message
  uint64_t chunks_ = 0;      // chunks done (sender: written; receiver: consumed)
  uint64_t total_chunks_ = 1;
  size_t moved_ = 0;
  int64_t arrive_ns_ = 0;
  int64_t peer_arrive_ns_ = 0;
  int64_t hang_deadline_ns_ = 0;
  std::string mismatch_;  // Phase::kMismatch: what the receiver found instead of its message
  PeerWait wait_;
  bool connecting_ = false;
};

// NCCL connects a pair at its first send/recv, inside the group launch, blocking until the peer
// takes part (shm_segment.h invariant 5).
Progress P2pOp::Connect(int64_t now) {
  const auto p = static_cast<size_t>(a_.peer);
  std::vector<bool>& connected = a_.is_send ? comm_->send_connected : comm_->recv_connected;
  if (connected[p]) return Progress::kDone;
  Chan* ch = Channel();
  if (!connecting_) {
    connecting_ = true;
    wait_.Reset(now);
    StoreRelease(a_.is_send ? ch->send_ready : ch->recv_ready, uint32_t{1});
  }
  if (LoadAcquire(a_.is_send ? ch->recv_ready : ch->send_ready) != 0) {
    connected[p] = true;
    return Progress::kDone;
  }
  return Waiting(now, false);
}

Progress P2pOp::Waiting(int64_t now, bool progressed) {
  const bool dead = wait_.LivenessDue(now) && PeerGone(*comm_->seg, a_.peer);
  if (!dead && !wait_.Expired(now)) return progressed ? Progress::kAdvanced : Progress::kPending;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s %s on %s (message %" PRIu64 " %s peer %d, global %d, %zu bytes) after "
                "%.3f s: peer rank %d did not %s%s",
                Name(), dead ? "failed" : "timed out", comm_->label.c_str(), msg_, a_.is_send ? "to" : "from", a_.peer,
                comm_->globals[static_cast<size_t>(a_.peer)], bytes_, wait_.WaitedSeconds(now),
                a_.peer, a_.is_send ? "post the matching ncclRecv" : "post the matching ncclSend",
                dead ? " (its process exited or it aborted the communicator)" : "");
  return Failed(ncclRemoteError, buf);
}

bool P2pOp::SendChunk(Chan* ch) {
  const uint64_t c = base_chunk_ + chunks_ + 1;
  if (c > 2 && LoadAcquire(ch->acked) < c - 2) return false;
  const size_t cap = comm_->seg->p2p_chunk_bytes();
  const size_t len = std::min(cap, bytes_ - moved_);
  ChunkHeader& h = ch->hdr[c & 1];
  h.msg_index = msg_;
  h.total_bytes = bytes_;
  h.chunk_bytes = len;
  h.send_arrive_ns = arrive_ns_;
  h.dtype = static_cast<int32_t>(a_.dtype);
  if (len) std::memcpy(comm_->seg->chan_data(comm_->rank, a_.peer, c), static_cast<const char*>(a_.send) + moved_, len);
  StoreRelease(ch->sent, c);
  moved_ += len;
  ++chunks_;
  return true;
}

Progress P2pOp::RecvChunk(Chan* ch, bool* advanced) {
  const uint64_t c = base_chunk_ + chunks_ + 1;
  if (LoadAcquire(ch->sent) < c) return Progress::kPending;
  const ChunkHeader& h = ch->hdr[c & 1];
  if (h.msg_index != msg_ || h.total_bytes != bytes_ || h.chunk_bytes > bytes_ - moved_) {
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "ncclRecv: size mismatch on %s: expected message %" PRIu64 " of %zu bytes from "
                  "rank %d, but it sent message %" PRIu64 " of %" PRIu64 " bytes",
                  comm_->label.c_str(), msg_, bytes_, a_.peer, h.msg_index, h.total_bytes);
    mismatch_ = buf;
    return Progress::kFailed;  // Step parks the receive (Phase::kMismatch); nothing was copied
  }
  if (chunks_ == 0) peer_arrive_ns_ = h.send_arrive_ns;
  if (h.chunk_bytes) {
    std::memcpy(static_cast<char*>(a_.recv) + moved_, comm_->seg->chan_data(a_.peer, comm_->rank, c),
                h.chunk_bytes);
  }
  moved_ += h.chunk_bytes;
  ++chunks_;
  StoreRelease(ch->acked, c);
  *advanced = true;
  return Progress::kAdvanced;
}

void P2pOp::FinishData(int64_t send_arrive, int64_t recv_arrive) {
  const int me = comm_->nodes[static_cast<size_t>(comm_->rank)];
  const int peer = comm_->nodes[static_cast<size_t>(a_.peer)];
  const int64_t start = std::max(send_arrive, recv_arrive);
  const double s = ModelP2pSeconds(Config().fabric, &Config().plan, a_.is_send ? me : peer,
                                   a_.is_send ? peer : me, static_cast<double>(bytes_), JobSeconds(start));
  wake_at_ns_ = start + static_cast<int64_t>(s * 1e9);
  phase_ = Phase::kModel;
}

Progress P2pOp::Step(int64_t now) {
  const auto p = static_cast<size_t>(a_.peer);
  Chan* ch = Channel();
  bool progressed = false;
  for (;;) {
    switch (phase_) {
      case Phase::kTurn: {
        if (comm_->async_error.load() != ncclSuccess) {
          result_ = Fail(static_cast<ncclResult_t>(comm_->async_error.load()), comm_,
                         std::string(Name()) + ": " + comm_->label + " failed earlier");
          return Progress::kFailed;
        }
        const uint64_t done = a_.is_send ? comm_->sends_done[p] : comm_->recvs_done[p];
        if (done != msg_) return progressed ? Progress::kAdvanced : Progress::kPending;
        phase_ = Phase::kHang;
        break;
      }
      case Phase::kHang: {
        const auto until = Config().plan.HangUntil(comm_->globals[static_cast<size_t>(comm_->rank)], JobSeconds(now));
        if (until) {
          if (std::isinf(*until)) {
            // Forever: until the lenient deadline if one is set, else until an abort.
            if (hang_deadline_ns_ == 0) {
              hang_deadline_ns_ = Config().timeout_s > 0 ? now + static_cast<int64_t>(Config().timeout_s * 1e9)
                                                         : INT64_MAX;
            }
            if (now >= hang_deadline_ns_) {
              return Failed(ncclSystemError, std::string(Name()) + ": " + comm_->label +
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
        wait_.Reset(now);
        base_chunk_ = a_.is_send ? comm_->send_cursor[p] : comm_->recv_cursor[p];
        total_chunks_ = bytes_ == 0 ? 1 : (bytes_ + comm_->seg->p2p_chunk_bytes() - 1) / comm_->seg->p2p_chunk_bytes();
        if (!a_.is_send) ch->recv_arrive_ns[msg_ & 1] = arrive_ns_;  // published by the first ack
        phase_ = Phase::kData;
        progressed = true;
        break;
      }
      case Phase::kData: {
        if (a_.is_send) {
          while (chunks_ < total_chunks_ && SendChunk(ch)) progressed = true;
          if (chunks_ < total_chunks_) return Waiting(now, progressed);
          phase_ = Phase::kFinalAck;
          wait_.Reset(now);
          break;
        }
        // Receiver: the sender's chunk count decides the end; we stop when all bytes arrived.
        bool adv = false;
        while (true) {
          const Progress r = RecvChunk(ch, &adv);
          if (r == Progress::kFailed) {
            // NCCL does not compare sizes: the receive never completes (nor, without acks, does
            // the send), until the lenient deadline if one is set, else until an abort.
            hang_deadline_ns_ = Config().timeout_s > 0 ? now + static_cast<int64_t>(Config().timeout_s * 1e9) : INT64_MAX;
            wake_at_ns_ = hang_deadline_ns_;
            phase_ = Phase::kMismatch;
            return adv || progressed ? Progress::kAdvanced : Progress::kPending;
          }
          if (r == Progress::kPending) break;
          if (moved_ == bytes_ && chunks_ >= total_chunks_) break;
        }
        if (adv) {
          progressed = true;
          wait_.Reset(now);
        }
        if (moved_ < bytes_ || chunks_ < total_chunks_) return Waiting(now, progressed);
        comm_->recv_cursor[p] = base_chunk_ + chunks_;
        FinishData(peer_arrive_ns_, arrive_ns_);
        break;
      }
      case Phase::kMismatch: {
        if (now < hang_deadline_ns_) return Progress::kPending;
        return Failed(ncclInvalidUsage, mismatch_);
      }
      case Phase::kFinalAck: {
        const uint64_t last = base_chunk_ + total_chunks_;
        if (LoadAcquire(ch->acked) < last) return Waiting(now, progressed);
        comm_->send_cursor[p] = last;
        FinishData(arrive_ns_, ch->recv_arrive_ns[msg_ & 1]);
        progressed = true;
        break;
      }
      case Phase::kModel: {
        if (NowNs() < wake_at_ns_) return progressed ? Progress::kAdvanced : Progress::kPending;
        wake_at_ns_ = 0;
        if (a_.is_send) ++comm_->sends_done[p];
        else ++comm_->recvs_done[p];
        return Progress::kDone;
      }
    }
  }
}

}  // namespace

std::unique_ptr<Op> MakeP2pOp(ncclComm* comm, const P2pArgs& args) {
  return std::make_unique<P2pOp>(comm, args);
}

}  // namespace falcon::emu
