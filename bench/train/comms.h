// The trainer's NCCL communicators, built the way Megatron-LM builds them: a world communicator
// from ncclCommInitRank (unique id exchanged through bench/emu/bootstrap.h), then the TP, DP and
// PP groups with ncclCommSplit of the world (color = group index from layout.h, key = global
// rank). Also the small helpers that turn NCCL results into Status values.
//
// Thread-safety: a Comms is owned and used by one thread. Must never: leave a communicator
// undestroyed on the success path (the destructor destroys what was created), or hide an NCCL
// error (every failure becomes a Status naming the call and ncclGetLastError's text).
#ifndef FALCON_BENCH_TRAIN_COMMS_H_
#define FALCON_BENCH_TRAIN_COMMS_H_

#include <nccl.h>

#include <memory>
#include <string>

#include "falcon/status.h"
#include "layout.h"

namespace falcon::train {

// Ok for ncclSuccess, else Unavailable("<what>: <error string> (<last error>)").
[[nodiscard]] Status NcclStatus(ncclResult_t rc, const char* what);

struct CommsOptions {
  double id_timeout_s = 60;  // how long ranks other than 0 wait for rank 0's unique id
  std::string id_file;       // where the id is exchanged; empty: $FALCON_EMU_ID_FILE
};

class Comms {
 public:
  Comms(const Comms&) = delete;
  Comms& operator=(const Comms&) = delete;
  ~Comms();

  // Bootstraps the world communicator of `shape.world()` ranks and splits it. Verifies every
  // group's size and this rank's index. Once it returns on any rank, every rank has read the id
  // (the world's rendezvous is complete), so rank 0 may remove a restart round's id file.
  [[nodiscard]] static Result<std::unique_ptr<Comms>> Create(const Shape& shape, int rank, const CommsOptions& options);

  [[nodiscard]] ncclComm_t world() const { return world_; }
  [[nodiscard]] ncclComm_t tp() const { return tp_; }
  [[nodiscard]] ncclComm_t dp() const { return dp_; }
  [[nodiscard]] ncclComm_t pp() const { return pp_; }

 private:
  Comms() = default;
  ncclComm_t world_ = nullptr;
  ncclComm_t tp_ = nullptr;
  ncclComm_t dp_ = nullptr;
  ncclComm_t pp_ = nullptr;
};

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_COMMS_H_
