// falcon-test-emu-comms: a small multi-rank NCCL program for the shim-over-emulator tests.
// Run one process per rank under falcon-emu-run. Builds a world communicator, splits it by
// rank parity and again by rank / 2, shrinks the world by its last rank, runs a fixed set of
// collectives with deterministic data on each, makes two invalid calls, and prints one line:
//   "rank R results <hex checksum of every output value and return code>"
// so that runs with and without the shim can be compared byte for byte.
#include <nccl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/emu/bootstrap.h"

namespace {

unsigned long long Mix(unsigned long long h, unsigned long long v) { return (h ^ v) * 0x100000001b3ull; }

unsigned long long Exercise(ncclComm_t comm, int rank, unsigned long long h) {
  if (comm == nullptr) return Mix(h, 0xdead);
  int n = 0, r = 0;
  h = Mix(h, ncclCommCount(comm, &n));
  h = Mix(h, ncclCommUserRank(comm, &r));
  std::vector<float> buf(64), out(64 * static_cast<size_t>(n));
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(rank * 100 + static_cast<int>(i));
  h = Mix(h, ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr));
  h = Mix(h, ncclBcast(buf.data(), buf.size(), ncclFloat, 0, comm, nullptr));
  h = Mix(h, ncclAllGather(buf.data(), out.data(), buf.size(), ncclFloat, comm, nullptr));
  h = Mix(h, ncclGroupStart());
  h = Mix(h, ncclSend(buf.data(), 8, ncclFloat, (r + 1) % n, comm, nullptr));
  h = Mix(h, ncclRecv(out.data(), 8, ncclFloat, (r + n - 1) % n, comm, nullptr));
  h = Mix(h, ncclGroupEnd());
  for (float v : buf) h = Mix(h, static_cast<unsigned long long>(v));
  for (float v : out) h = Mix(h, static_cast<unsigned long long>(v));
  return h;
}

}  // namespace

int main() {
  falcon::emu::JobEnv env = falcon::emu::ReadJobEnv();
  ncclUniqueId id;
  std::string error;
  if (falcon::emu::BootstrapUniqueId(env.rank, &id, {}, &error) != ncclSuccess) {
    std::fprintf(stderr, "bootstrap: %s\n", error.c_str());
    return 2;
  }
  unsigned long long h = 0xcbf29ce484222325ull;
  ncclComm_t world = nullptr;
  h = Mix(h, ncclCommInitRank(&world, env.world_size, id, env.rank));
  if (world == nullptr) return 3;
  h = Exercise(world, env.rank, h);
  ncclComm_t parity = nullptr, pairs = nullptr, shrunk = nullptr;
  h = Mix(h, ncclCommSplit(world, env.rank % 2, env.rank, &parity, nullptr));
  h = Exercise(parity, env.rank, h);
  h = Mix(h, ncclCommSplit(world, env.rank / 2, env.rank, &pairs, nullptr));
  h = Exercise(pairs, env.rank, h);
  int last = env.world_size - 1;
  if (env.rank != last) {
    h = Mix(h, ncclCommShrink(world, &last, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT));
    h = Exercise(shrunk, env.rank, h);
  }
  float x = 1;
  h = Mix(h, ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, nullptr, nullptr));                     // null comm
  h = Mix(h, ncclAllReduce(&x, &x, 1, ncclFloat, static_cast<ncclRedOp_t>(4), world, nullptr));  // Avg: valid
  h = Mix(h, ncclBroadcast(&x, &x, 1, ncclFloat, env.world_size + 3, world, nullptr));            // bad root
  for (ncclComm_t c : {shrunk, pairs, parity, world}) {
    if (c != nullptr) h = Mix(h, ncclCommDestroy(c));
  }
  std::printf("rank %d results %016llx\n", env.rank, h);
  return 0;
}
