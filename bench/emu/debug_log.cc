// NCCL's debug log of calls: see debug_log.h.
#include "debug_log.h"

#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "comm.h"

namespace falcon::emu {
namespace {

struct Sink {
  bool on = false;
  FILE* out = nullptr;
  char host[64] = {};
};

// NCCL_DEBUG_FILE with %h and %p replaced (NCCL's substitution).
std::string ExpandPath(const char* pattern, const char* host) {
  std::string out;
  for (const char* p = pattern; *p != '\0'; ++p) {
    if (p[0] == '%' && p[1] == 'h') {
      out += host;
      ++p;
    } else if (p[0] == '%' && p[1] == 'p') {
      out += std::to_string(getpid());
      ++p;
    } else {
      out += *p;
    }
  }
  return out;
}

bool SubsysHasColl(const char* subsys) {
  if (subsys == nullptr) return false;  // NCCL's default: INIT,BOOTSTRAP,ENV
  std::string s(subsys);
  if (!s.empty() && s[0] == '^') return s.find("COLL") == std::string::npos;  // all but the listed
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (strcasecmp(item.c_str(), "COLL") == 0 || strcasecmp(item.c_str(), "ALL") == 0) return true;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return false;
}

const Sink& TheSink() {
  static const Sink sink = [] {
    Sink s;
    const char* level = std::getenv("NCCL_DEBUG");
    if (level == nullptr || (strcasecmp(level, "INFO") != 0 && strcasecmp(level, "TRACE") != 0)) return s;
    if (!SubsysHasColl(std::getenv("NCCL_DEBUG_SUBSYS"))) return s;
    gethostname(s.host, sizeof(s.host) - 1);
    if (char* dot = std::strchr(s.host, '.')) *dot = '\0';
    const char* file = std::getenv("NCCL_DEBUG_FILE");
    s.out = stdout;
    if (file != nullptr && file[0] != '\0') {
      FILE* f = std::fopen(ExpandPath(file, s.host).c_str(), "a");
      if (f != nullptr) s.out = f;  // as NCCL: an unopenable file falls back to stdout
    }
    s.on = true;
    return s;
  }();
  return sink;
}

std::atomic<unsigned long> g_op_count{0};

}  // namespace

void LogCall(const char* op, const void* send, const void* recv, size_t count, int datatype, int red, int root,
             const ncclComm* comm, const void* stream) {
  const Sink& s = TheSink();
  if (!s.on) return;
  std::fprintf(s.out,
               "%s:%d:%ld [%d] NCCL INFO %s: opCount %lx sendbuff %p recvbuff %p count %zu datatype %d op %d root %d "
               "comm %p [nranks=%d] stream %p\n",
               s.host, static_cast<int>(getpid()), static_cast<long>(syscall(SYS_gettid)), comm->device, op,
               g_op_count.fetch_add(1, std::memory_order_relaxed), send, recv, count, datatype, red, root,
               static_cast<const void*>(comm), comm->nranks, stream);
  std::fflush(s.out);
}

}  // namespace falcon::emu
