// Service thread: see service_thread.h.
#include "shim/service_thread.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include "shim/tracer.h"

namespace falcon::shim {
namespace {

constexpr long kTickNs = 50 * 1000 * 1000;

void* ServiceMain(void* arg) {
  auto* tracer = static_cast<Tracer*>(arg);
  const uint32_t generation = tracer->generation();
  while (!tracer->stopping() && tracer->generation() == generation) {
    tracer->ServiceTick();
    timespec ts{0, kTickNs};
    nanosleep(&ts, nullptr);
  }
  return nullptr;
}

}  // namespace

bool StartServiceThread(Tracer& tracer) {
  // First heartbeat before the first record, before the thread exists (on the caller's thread).
  tracer.ServiceTick(Tracer::TickKind::kFirst);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t thread;
  int rc = pthread_create(&thread, &attr, ServiceMain, &tracer);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) return false;
  pthread_setname_np(thread, "falcon-shim");
  return true;
}

}  // namespace falcon::shim
