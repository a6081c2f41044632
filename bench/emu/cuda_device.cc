// Device executor: see cuda_device.h for the model and invariants.
// Thread-safety: everything below is guarded by Exec::mu. Must never: hold the mutex while work
// runs (invariant 2), throw out of a worker (work is noexcept by contract; std::function's call
// of an empty target cannot happen: Enqueue refuses none).
#include "cuda_device.h"

#include <time.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace falcon::cuemu {

struct Item {
  std::function<void()> run;
  std::vector<Dep> deps;
};

struct StreamCore {
  int ctx = 0;
  bool legacy = false;
  bool non_blocking = false;
  // Guarded by Exec::mu.
  uint64_t enqueued = 0;
  uint64_t done = 0;
  std::deque<Item> queue;
  bool worker = false;   // a worker thread serves this stream now
  bool closing = false;  // the handle was destroyed: the worker exits once the queue drained
};

namespace {

constexpr uintptr_t kLegacyHandle = 0x1;     // CU_STREAM_LEGACY
constexpr uintptr_t kPerThreadHandle = 0x2;  // CU_STREAM_PER_THREAD

struct Exec {
  std::mutex mu;
  std::condition_variable cv;
  StreamPtr legacy[kDevices];
  std::vector<std::weak_ptr<StreamCore>> streams[kDevices];  // every non-legacy stream, per context
  std::unordered_map<void*, StreamPtr> handles;               // live handles
};

// Leaked: workers may outlive static destruction (a collective that never completes).
Exec& X() {
  static auto* x = new Exec;
  return *x;
}

bool DepsMet(const Item& it) {
  return std::all_of(it.deps.begin(), it.deps.end(), [](const Dep& d) { return d.stream->done >= d.seq; });
}

void Work(StreamPtr s) {
  Exec& x = X();
  std::unique_lock<std::mutex> lock(x.mu);
  for (;;) {
    x.cv.wait(lock, [&] { return (!s->queue.empty() && DepsMet(s->queue.front())) || (s->closing && s->queue.empty()); });
    if (s->queue.empty()) break;
    Item it = std::move(s->queue.front());
    s->queue.pop_front();
    lock.unlock();
    it.run();
    it = Item{};  // drops what the work held (and its dependencies) outside the lock
    lock.lock();
    ++s->done;
    x.cv.notify_all();
  }
  s->worker = false;
}

// REQUIRES: x.mu held.
StreamPtr LegacyLocked(int ctx) {
  Exec& x = X();
  if (!x.legacy[ctx]) {
    x.legacy[ctx] = std::make_shared<StreamCore>();
    x.legacy[ctx]->ctx = ctx;
    x.legacy[ctx]->legacy = true;
  }
  return x.legacy[ctx];
}

// The legacy-stream rules (cuda_device.h): what an item enqueued on `s` must wait for.
// REQUIRES: x.mu held.
void AddImplicitDeps(const StreamPtr& s, std::vector<Dep>* deps) {
  Exec& x = X();
  if (s->non_blocking) return;
  if (s->legacy) {
    auto& list = x.streams[s->ctx];
    list.erase(std::remove_if(list.begin(), list.end(), [](const std::weak_ptr<StreamCore>& w) { return w.expired(); }),
               list.end());
    for (const auto& w : list) {
      StreamPtr b = w.lock();
      if (b && !b->non_blocking && b->enqueued > b->done) deps->push_back(Dep{b, b->enqueued});
    }
    return;
  }
  const StreamPtr legacy = LegacyLocked(s->ctx);
  if (legacy->enqueued > legacy->done) deps->push_back(Dep{legacy, legacy->enqueued});
}

}  // namespace

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void* CreateStream(int ctx, bool non_blocking) {
  auto s = std::make_shared<StreamCore>();
  s->ctx = ctx;
  s->non_blocking = non_blocking;
  Exec& x = X();
  std::lock_guard<std::mutex> lock(x.mu);
  x.streams[ctx].push_back(s);
  void* handle = s.get();
  x.handles.emplace(handle, std::move(s));
  return handle;
}

bool DestroyStream(void* handle) {
  Exec& x = X();
  StreamPtr s;
  std::lock_guard<std::mutex> lock(x.mu);
  auto it = x.handles.find(handle);
  if (it == x.handles.end()) return false;
  s = std::move(it->second);
  x.handles.erase(it);
  s->closing = true;
  x.cv.notify_all();
  return true;
}

StreamPtr Resolve(void* handle, int current_ctx) {
  const auto h = reinterpret_cast<uintptr_t>(handle);
  Exec& x = X();
  std::lock_guard<std::mutex> lock(x.mu);
  if (h == 0 || h == kLegacyHandle || h == kPerThreadHandle) {
    if (current_ctx < 0 || current_ctx >= kDevices) return nullptr;
    return LegacyLocked(current_ctx);
  }
  auto it = x.handles.find(handle);
  return it == x.handles.end() ? nullptr : it->second;
}

int ContextOf(const StreamCore& s) { return s.ctx; }

uint64_t Enqueue(const StreamPtr& s, std::function<void()> run, std::vector<Dep> deps) {
  Exec& x = X();
  std::lock_guard<std::mutex> lock(x.mu);
  AddImplicitDeps(s, &deps);
  s->queue.push_back(Item{std::move(run), std::move(deps)});
  const uint64_t seq = ++s->enqueued;
  if (!s->worker) {
    s->worker = true;
    std::thread(Work, s).detach();  // exits when its stream is destroyed and drained
  }
  x.cv.notify_all();
  return seq;
}

uint64_t Tail(const StreamPtr& s) {
  std::lock_guard<std::mutex> lock(X().mu);
  return s->enqueued;
}

bool Completed(const Dep& d) {
  std::lock_guard<std::mutex> lock(X().mu);
  return d.stream->done >= d.seq;
}

void Wait(const std::vector<Dep>& deps) {
  Exec& x = X();
  std::unique_lock<std::mutex> lock(x.mu);
  x.cv.wait(lock, [&] {
    return std::all_of(deps.begin(), deps.end(), [](const Dep& d) { return d.stream->done >= d.seq; });
  });
}

std::vector<Dep> ContextTails(int ctx, Which which) {
  Exec& x = X();
  std::lock_guard<std::mutex> lock(x.mu);
  std::vector<Dep> deps;
  const StreamPtr legacy = LegacyLocked(ctx);
  deps.push_back(Dep{legacy, legacy->enqueued});
  for (const auto& w : x.streams[ctx]) {
    StreamPtr s = w.lock();
    if (!s || (which == Which::kLegacyScope && s->non_blocking)) continue;
    deps.push_back(Dep{s, s->enqueued});
  }
  return deps;
}

}  // namespace falcon::cuemu
