// Communicator construction; see comms.h.
#include "comms.h"

#include "bootstrap.h"

namespace falcon::train {
namespace {

// Checks that `comm` has `size` members and that this rank is member `index`.
Status CheckGroup(ncclComm_t comm, const char* name, int size, int index) {
  int n = 0, r = 0;
  if (Status s = NcclStatus(ncclCommCount(comm, &n), "ncclCommCount"); !s.ok()) return s;
  if (Status s = NcclStatus(ncclCommUserRank(comm, &r), "ncclCommUserRank"); !s.ok()) return s;
  if (n != size || r != index) {
    return Status::Internal(std::string(name) + " communicator has " + std::to_string(n) + " ranks, this is rank " +
                            std::to_string(r) + "; expected " + std::to_string(size) + " / " + std::to_string(index));
  }
  return Status::Ok();
}

}  // namespace

Status NcclStatus(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return Status::Ok();
  const char* last = ncclGetLastError(nullptr);
  return Status::Unavailable(std::string(what) + ": " + ncclGetErrorString(rc) + " (" + (last ? last : "") + ")");
}

Comms::~Comms() {
  // Destroy errors at teardown are not actionable; the job's result is already decided.
  for (ncclComm_t c : {pp_, dp_, tp_, world_}) {
    if (c) (void)ncclCommDestroy(c);
  }
}

Result<std::unique_ptr<Comms>> Comms::Create(const Shape& shape, int rank, const CommsOptions& options) {
  ncclUniqueId id{};
  std::string err;
  emu::BootstrapOptions bo;
  bo.timeout_s = options.id_timeout_s;
  bo.path = options.id_file;
  if (emu::BootstrapUniqueId(rank, &id, bo, &err) != ncclSuccess) return Status::Unavailable(err);
  std::unique_ptr<Comms> c(new Comms());
  if (Status s = NcclStatus(ncclCommInitRank(&c->world_, shape.world(), id, rank), "ncclCommInitRank(world)");
      !s.ok()) {
    return s;
  }
  const Coords xy = CoordsOf(shape, rank);
  if (Status s = NcclStatus(ncclCommSplit(c->world_, TpGroupOf(shape, xy), rank, &c->tp_, nullptr),
                            "ncclCommSplit(tp)");
      !s.ok()) {
    return s;
  }
  if (Status s = NcclStatus(ncclCommSplit(c->world_, DpGroupOf(shape, xy), rank, &c->dp_, nullptr),
                            "ncclCommSplit(dp)");
      !s.ok()) {
    return s;
  }
  if (Status s = NcclStatus(ncclCommSplit(c->world_, PpGroupOf(shape, xy), rank, &c->pp_, nullptr),
                            "ncclCommSplit(pp)");
      !s.ok()) {
    return s;
  }
  if (Status s = CheckGroup(c->world_, "world", shape.world(), rank); !s.ok()) return s;
  if (Status s = CheckGroup(c->tp_, "tp", shape.tp, xy.tp); !s.ok()) return s;
  if (Status s = CheckGroup(c->dp_, "dp", shape.dp, xy.dp); !s.ok()) return s;
  if (Status s = CheckGroup(c->pp_, "pp", shape.pp, xy.pp); !s.ok()) return s;
  return c;
}

}  // namespace falcon::train
