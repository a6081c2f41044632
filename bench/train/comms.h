// The trainer's NCCL communicators, built the way PyTorch + Megatron-LM build them, and the
// helpers that turn NCCL results into Status values.
//
// Megatron mode (the default): the world communicator from ncclCommInitRank (unique id exchanged
// through bench/emu/bootstrap.h), then every process group of process_groups.h in Megatron's
// order, each with one ncclCommSplit of the world on every rank (members: color = the group's
// index, key = global rank; the others NCCL_SPLIT_NOCOLOR), as torch.distributed.new_group does
// with an eagerly initialised default group. With `lazy`, nothing is created up front: a group's
// communicator is made at its first use by its members alone (ncclCommInitRank with a unique id
// its lowest rank publishes in `<id file>.pg.<group>.<index>`), as PyTorch does without a bound
// device. With `nonblocking`, every communicator is made with ncclConfig_t.blocking = 0 and the
// creator polls ncclCommGetAsyncError until it is ready. With `watchdog`, a Watchdog thread polls
// every ready communicator (watchdog.h).
// Legacy mode (`--world-sync`): the world and three splits (tp, dp, pp), blocking, no watchdog.
//
// Thread-safety: a Comms is owned and used by one thread (its Watchdog thread only polls).
// Must never: destroy a communicator while its Watchdog runs (the destructor stops it first),
// leave one undestroyed, or hide an NCCL error (every failure becomes a Status naming the call
// and ncclGetLastError's text).
#ifndef FALCON_BENCH_TRAIN_COMMS_H_
#define FALCON_BENCH_TRAIN_COMMS_H_

#include <nccl.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "falcon/status.h"
#include "layout.h"
#include "process_groups.h"
#include "watchdog.h"

namespace falcon::train {

// Ok for ncclSuccess, else Unavailable("<what>: <error string> (<last error>)").
[[nodiscard]] Status NcclStatus(ncclResult_t rc, const char* what);

// Like NcclStatus, but an ncclInProgress from a nonblocking communicator is polled
// (ncclCommGetAsyncError) until the operation's enqueue completes.
[[nodiscard]] Status NcclDone(ncclResult_t rc, ncclComm_t comm, const char* what);

struct CommsOptions {
  double id_timeout_s = 60;  // how long ranks other than a group's first wait for its unique id
  std::string id_file;       // where the world's id is exchanged; empty: $FALCON_EMU_ID_FILE
  bool megatron = true;      // false: the legacy world + tp/dp/pp set
  bool lazy = false;         // create each group at its first use (Megatron mode)
  bool nonblocking = false;  // ncclConfig_t.blocking = 0 (Megatron mode)
  bool watchdog = false;     // poll every communicator from a Watchdog thread (Megatron mode)
  bool pp_per_direction = false;  // the per-direction pipeline pair groups too (process_groups.h)
};

class Comms {
 public:
  Comms(const Comms&) = delete;
  Comms& operator=(const Comms&) = delete;
  ~Comms();

  // Creates the communicators (none in lazy mode) and checks every group's size and this rank's
  // index. Once it returns on any rank in eager mode, every rank has read the world's id, so
  // rank 0 may remove a restart round's id file.
  [[nodiscard]] static Result<std::unique_ptr<Comms>> Create(const Shape& shape, int rank, const CommsOptions& options);

  // After a failure: stops the watchdog and aborts every communicator (ncclCommAbort: work in
  // flight is dropped, as PyTorch's abort does; a destroy could wait for peers that are gone).
  // The Comms holds none afterwards.
  void AbortAll();

  // This rank's communicator of group kind `g`, created now in lazy mode. REQUIRES: this rank is
  // a member of such a group (every rank is, except for embd / pos-embd).
  [[nodiscard]] Result<ncclComm_t> Get(Group g);

  // Legacy accessors (eager modes only).
  [[nodiscard]] ncclComm_t world() const { return Find(Group::kWorld); }
  [[nodiscard]] ncclComm_t tp() const { return Find(Group::kTp); }
  [[nodiscard]] ncclComm_t dp() const { return Find(Group::kDp); }
  [[nodiscard]] ncclComm_t pp() const { return Find(Group::kPp); }

  // "name.index" of every communicator this rank created, in creation order.
  [[nodiscard]] const std::vector<std::string>& created() const { return created_; }
  // Split calls this rank made on the world (members and non-members).
  [[nodiscard]] int splits() const { return splits_; }
  [[nodiscard]] std::uint64_t watchdog_polls() const { return watchdog_ ? watchdog_->polls() : 0; }

 private:
  Comms(const Shape& shape, int rank, const CommsOptions& o) : shape_(shape), rank_(rank), options_(o) {}
  [[nodiscard]] ncclComm_t Find(Group g) const;
  [[nodiscard]] Status CreateLegacy();
  [[nodiscard]] Status CreateWorld(const std::string& id_file);
  [[nodiscard]] Status Split(const GroupSpec& g);
  [[nodiscard]] Status InitGroup(const GroupSpec& g);
  [[nodiscard]] Status Adopt(Group g, int index, ncclComm_t comm);

  // Fixed after construction.
  const Shape shape_;
  const int rank_;
  const CommsOptions options_;

  std::map<Group, ncclComm_t> mine_;       // this rank's communicator of each kind
  std::vector<ncclComm_t> owned_;          // every communicator created, in creation order
  std::vector<std::string> created_;
  int splits_ = 0;
  std::unique_ptr<Watchdog> watchdog_;     // destroyed before owned_ (see ~Comms)
};

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_COMMS_H_
