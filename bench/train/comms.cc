// Communicator construction; see comms.h.
#include "comms.h"

#include <sched.h>

#include <cstdio>

#include "bootstrap.h"

namespace falcon::train {
namespace {

// Checks that `comm` has `size` members and that this rank is member `index`.
Status CheckGroup(ncclComm_t comm, const std::string& name, int size, int index) {
  int n = 0, r = 0;
  if (Status s = NcclStatus(ncclCommCount(comm, &n), "ncclCommCount"); !s.ok()) return s;
  if (Status s = NcclStatus(ncclCommUserRank(comm, &r), "ncclCommUserRank"); !s.ok()) return s;
  if (n != size || r != index) {
    return Status::Internal(name + " communicator has " + std::to_string(n) + " ranks, this is rank " +
                            std::to_string(r) + "; expected " + std::to_string(size) + " / " + std::to_string(index));
  }
  return Status::Ok();
}

// Polls a nonblocking communicator until its pending operation (init, split, enqueue) is done.
Status WaitReady(ncclComm_t comm, const char* what) {
  for (;;) {
    ncclResult_t async = ncclSuccess;
    if (Status s = NcclStatus(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError"); !s.ok()) return s;
    if (async != ncclInProgress) return NcclStatus(async, what);
    sched_yield();
  }
}

ncclConfig_t Config(bool nonblocking) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = nonblocking ? 0 : 1;
  return c;
}

}  // namespace

Status NcclStatus(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return Status::Ok();
  const char* last = ncclGetLastError(nullptr);
  return Status::Unavailable(std::string(what) + ": " + ncclGetErrorString(rc) + " (" + (last ? last : "") + ")");
}

Status NcclDone(ncclResult_t rc, ncclComm_t comm, const char* what) {
  if (rc == ncclInProgress && comm != nullptr) return WaitReady(comm, what);
  return NcclStatus(rc, what);
}

Comms::~Comms() {
  watchdog_.reset();  // stops polling before any communicator goes (watchdog.h invariant 1)
  // Destroy errors at teardown are not actionable; the job's result is already decided.
  for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) {
    if (*it == nullptr) continue;
    if (options_.nonblocking) {
      (void)ncclCommFinalize(*it);
      (void)WaitReady(*it, "ncclCommFinalize");
    }
    (void)ncclCommDestroy(*it);
  }
}

void Comms::AbortAll() {
  watchdog_.reset();
  // Abort errors are not actionable: the job has failed already.
  for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) (void)ncclCommAbort(*it);
  owned_.clear();
  mine_.clear();
}

ncclComm_t Comms::Find(Group g) const {
  const auto it = mine_.find(g);
  return it == mine_.end() ? nullptr : it->second;
}

Status Comms::Adopt(Group g, int index, ncclComm_t comm) {
  owned_.push_back(comm);
  mine_[g] = comm;
  std::string name = std::string(GroupName(g)) + (g == Group::kWorld ? "" : "." + std::to_string(index));
  if (watchdog_) watchdog_->Watch(comm, name);
  created_.push_back(std::move(name));
  return Status::Ok();
}

Result<std::unique_ptr<Comms>> Comms::Create(const Shape& shape, int rank, const CommsOptions& options) {
  std::unique_ptr<Comms> c(new Comms(shape, rank, options));
  if (!options.megatron) {
    if (Status s = c->CreateLegacy(); !s.ok()) return s;
    return c;
  }
  if (options.watchdog) c->watchdog_ = std::make_unique<Watchdog>(rank);
  if (options.lazy) return c;
  if (Status s = c->CreateWorld(options.id_file); !s.ok()) return s;
  for (const GroupSpec& g : MegatronGroups(shape, options.pp_per_direction)) {
    if (Status s = c->Split(g); !s.ok()) return s;
  }
  return c;
}

Status Comms::CreateWorld(const std::string& id_file) {
  ncclUniqueId id{};
  std::string err;
  emu::BootstrapOptions bo;
  bo.timeout_s = options_.id_timeout_s;
  bo.path = id_file;
  if (emu::BootstrapUniqueId(rank_, &id, bo, &err) != ncclSuccess) return Status::Unavailable(err);
  ncclComm_t world = nullptr;
  ncclConfig_t cfg = Config(options_.nonblocking);
  const ncclResult_t rc = options_.megatron ? ncclCommInitRankConfig(&world, shape_.world(), id, rank_, &cfg)
                                            : ncclCommInitRank(&world, shape_.world(), id, rank_);
  if (Status s = NcclDone(rc, world, "ncclCommInitRankConfig(world)"); !s.ok()) {
    if (world) (void)ncclCommAbort(world);
    return s;
  }
  if (Status s = Adopt(Group::kWorld, 0, world); !s.ok()) return s;
  return CheckGroup(world, "world", shape_.world(), rank_);
}

// One group, as torch.distributed.new_group makes it from an eagerly initialised world: a split
// of the world on every rank, NCCL_SPLIT_NOCOLOR for the ranks outside the group.
Status Comms::Split(const GroupSpec& g) {
  const int me = MemberIndex(g, rank_);
  ncclComm_t child = nullptr;
  ncclConfig_t cfg = Config(options_.nonblocking);
  const ncclResult_t rc = ncclCommSplit(Find(Group::kWorld), me >= 0 ? g.index : NCCL_SPLIT_NOCOLOR, rank_, &child, &cfg);
  ++splits_;
  const std::string what = std::string("ncclCommSplit(") + GroupName(g.kind) + ")";
  if (Status s = NcclDone(rc, child != nullptr ? child : Find(Group::kWorld), what.c_str()); !s.ok()) return s;
  if (me < 0) return Status::Ok();
  if (child == nullptr) return Status::Internal(what + " gave a member no communicator");
  if (Status s = Adopt(g.kind, g.index, child); !s.ok()) return s;
  return CheckGroup(child, GroupName(g.kind), static_cast<int>(g.ranks.size()), me);
}

// One group made at its first use by its members only (PyTorch without a bound device).
Status Comms::InitGroup(const GroupSpec& g) {
  const int me = MemberIndex(g, rank_);
  const std::string path =
      options_.id_file.empty() ? "" : options_.id_file + ".pg." + GroupName(g.kind) + "." + std::to_string(g.index);
  if (path.empty() && g.ranks.size() > 1) return Status::Unavailable("--lazy-init: no id file to exchange unique ids");
  ncclUniqueId id{};
  if (g.ranks.size() == 1) {
    if (Status s = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
  } else {
    std::string err;
    emu::BootstrapOptions bo;
    bo.timeout_s = options_.id_timeout_s;
    bo.path = path;
    if (emu::BootstrapUniqueId(me, &id, bo, &err) != ncclSuccess) return Status::Unavailable(err);
  }
  ncclComm_t comm = nullptr;
  ncclConfig_t cfg = Config(options_.nonblocking);
  const std::string what = std::string("ncclCommInitRankConfig(") + GroupName(g.kind) + ")";
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, static_cast<int>(g.ranks.size()), id, me, &cfg);
  if (Status s = NcclDone(rc, comm, what.c_str()); !s.ok()) {
    if (comm) (void)ncclCommAbort(comm);
    return s;
  }
  // Every member has read the id once the communicator exists.
  if (me == 0 && g.ranks.size() > 1) std::remove(path.c_str());
  if (Status s = Adopt(g.kind, g.index, comm); !s.ok()) return s;
  return CheckGroup(comm, GroupName(g.kind), static_cast<int>(g.ranks.size()), me);
}

Result<ncclComm_t> Comms::Get(Group g) {
  if (ncclComm_t c = Find(g)) return c;
  if (!options_.megatron || !options_.lazy) {
    return Status::Internal(std::string("no ") + GroupName(g) + " communicator on this rank");
  }
  if (g == Group::kWorld) {
    GroupSpec world{Group::kWorld, 0, {}};
    for (int r = 0; r < shape_.world(); ++r) world.ranks.push_back(r);
    if (Status s = InitGroup(world); !s.ok()) return s;
    return Find(g);
  }
  for (const GroupSpec& spec : MegatronGroups(shape_, options_.pp_per_direction)) {
    if (spec.kind == g && MemberIndex(spec, rank_) >= 0) {
      if (Status s = InitGroup(spec); !s.ok()) return s;
      return Find(g);
    }
  }
  return Status::Internal(std::string("this rank is in no ") + GroupName(g) + " group");
}

Status Comms::CreateLegacy() {
  if (Status s = CreateWorld(options_.id_file); !s.ok()) return s;
  const Coords xy = CoordsOf(shape_, rank_);
  const struct {
    Group kind;
    int color;
    int size;
    int index;
  } splits[] = {{Group::kTp, TpGroupOf(shape_, xy), shape_.tp, xy.tp},
                {Group::kDp, DpGroupOf(shape_, xy), shape_.dp, xy.dp},
                {Group::kPp, PpGroupOf(shape_, xy), shape_.pp, xy.pp}};
  for (const auto& sp : splits) {
    ncclComm_t child = nullptr;
    const std::string what = std::string("ncclCommSplit(") + GroupName(sp.kind) + ")";
    if (Status s = NcclStatus(ncclCommSplit(Find(Group::kWorld), sp.color, rank_, &child, nullptr), what.c_str());
        !s.ok()) {
      return s;
    }
    ++splits_;
    if (Status s = Adopt(sp.kind, sp.color, child); !s.ok()) return s;
    if (Status s = CheckGroup(child, GroupName(sp.kind), sp.size, sp.index); !s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace falcon::train
