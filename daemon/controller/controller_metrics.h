// The controller's metrics: a snapshot struct, its Prometheus text, and the endpoint that
// serves it (GET /metrics, GET /healthz) from a thread of its own. The controller loop is not an
// event loop (it blocks in Redis reads with a bound), so the endpoint never touches the loop's
// state: the loop publishes a rendered snapshot once per turn and the endpoint serves the latest.
// Thread-safety: ControllerMetrics and RenderControllerMetrics are plain; MetricsEndpoint's
// Publish is called by the loop thread, its HTTP handlers run on its own thread, the text is
// handed over under a mutex. Must never: block the controller loop (Publish only swaps a string).
#pragma once

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/common/http_server.h"
#include "falcon/status.h"

namespace falcon::controller {

struct ControllerMetrics {
  std::string job;
  std::string host;
  std::string phase;                              // tracking | profiling | validating
  bool incident_open = false;
  std::map<std::string, std::uint64_t> entries;   // incident entries written, by stage
  std::map<std::string, std::uint64_t> culprits;  // GPUs, links, NICs named, by cause
  std::uint64_t rounds = 0;                       // validation rounds finished
  double last_pause_seconds = 0;                  // stopped -> resumed of the last round (0: none)
  std::uint64_t ranks = 0;
  std::uint64_t agents = 0;
  std::uint64_t slow_ranks = 0;
  std::uint64_t stalled_ranks = 0;                // live ranks the agents report stalled
  bool hang_open = false;                         // a hang episode is open
  std::uint64_t signature_calls = 0;              // collectives the agents reported for mismatch checks
  std::uint64_t signatures_pending = 0;           // (communicator, seq) waiting for members' reports
  double current_iteration_seconds = 0;           // 0: unknown
  double healthy_iteration_seconds = 0;           // 0: unknown
  std::int64_t plan_version = 0;
  bool redis_connected = false;
  std::uint64_t step_failures = 0;
  std::uint64_t dropped_messages = 0;
  double cpu_seconds = 0;
  double view_refresh_seconds = 0;                // how long the last re-read of the rank and agent keys took
  double state_save_seconds = 0;                  // how long the last write of the state document took
  std::uint64_t stream_trimmed = 0;               // report stream entries trimmed behind the cursors
  std::map<std::string, double> stream_lag_seconds;  // per stream read: how far behind its end (0: caught up)
};

std::string RenderControllerMetrics(const ControllerMetrics& m);

class MetricsEndpoint {
 public:
  MetricsEndpoint();
  ~MetricsEndpoint();  // stops the thread
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Binds address:port (0: ephemeral) and starts serving on the endpoint's thread.
  [[nodiscard]] Status Start(const std::string& address, int port);
  // The text /metrics serves from now on, and the /healthz body.
  void Publish(std::string metrics, std::string health);
  int port() const { return server_ ? server_->port() : 0; }

 private:
  boost::asio::io_context io_;
  std::unique_ptr<daemon::HttpServer> server_;
  std::thread thread_;
  std::mutex mu_;
  std::string metrics_;  // guarded by mu_
  std::string health_;   // guarded by mu_
};

}  // namespace falcon::controller
