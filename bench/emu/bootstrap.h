// Test-program bootstrap over a file: rank 0 makes an ncclUniqueId and publishes it atomically
// (write a temp file, then rename) at FALCON_EMU_ID_FILE (set by falcon-emu-run) or a given path;
// the other ranks poll for it with a deadline. It calls NCCL through the ordinary ncclGetUniqueId
// symbol, so an LD_PRELOAD shim sees the call.
//
// Thread-safety: reentrant; no shared state. Must never: wait without a deadline, or let a reader
// see a partially written id (rename is atomic).
#ifndef FALCON_BENCH_EMU_BOOTSTRAP_H_
#define FALCON_BENCH_EMU_BOOTSTRAP_H_

#include <nccl.h>

#include <string>

namespace falcon::emu {

struct BootstrapOptions {
  std::string path;        // empty: $FALCON_EMU_ID_FILE
  double timeout_s = 60;   // how long non-zero ranks wait for the file
};

// Job identity as falcon-emu-run exports it (RANK, WORLD_SIZE); rank 0 / size 1 when unset.
struct JobEnv {
  int rank = 0;
  int world_size = 1;
};
[[nodiscard]] JobEnv ReadJobEnv();

// Fills *id: rank 0 creates and publishes it, other ranks read it. On failure returns
// ncclSystemError (or what ncclGetUniqueId returned) and *error says why.
[[nodiscard]] ncclResult_t BootstrapUniqueId(int rank, ncclUniqueId* id, const BootstrapOptions& options,
                                             std::string* error);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_BOOTSTRAP_H_
