// Controller metrics and their endpoint. See controller_metrics.h for the contract.
#include "daemon/controller/controller_metrics.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include "daemon/common/prometheus_text.h"

namespace falcon::controller {

std::string RenderControllerMetrics(const ControllerMetrics& m) {
  daemon::PromWriter w("falcon_controller_",
                       "job=\"" + daemon::PromEscape(m.job) + "\",host=\"" + daemon::PromEscape(m.host) + "\"");
  w.Head("phase", "gauge", "1 for the phase the controller is in.");
  for (const char* p : {"tracking", "profiling", "validating"}) {
    w.Line("phase", std::string("phase=\"") + p + "\"", m.phase == p ? 1 : 0);
  }
  w.One("incident_open", "gauge", "1 while an incident is open.", m.incident_open ? 1 : 0);
  w.Head("incident_entries_total", "counter", "Incident entries written, by stage.");
  for (const char* s : {"detection", "localisation", "decision", "resolution", "hang", "mismatch", "deadlock", "disorder"}) {
    const auto it = m.entries.find(s);
    w.Line("incident_entries_total", std::string("stage=\"") + s + "\"",
           static_cast<double>(it == m.entries.end() ? 0 : it->second));
  }
  w.Head("culprits_total", "counter", "Slow GPUs (compute), links and NICs named by localisations.");
  for (const char* c : {"compute", "link", "nic"}) {
    const auto it = m.culprits.find(c);
    w.Line("culprits_total", std::string("cause=\"") + c + "\"",
           static_cast<double>(it == m.culprits.end() ? 0 : it->second));
  }
  w.One("validation_rounds_total", "counter", "Validation rounds finished.", static_cast<double>(m.rounds));
  w.One("last_pause_seconds", "gauge", "How long the last validation round held the job, seconds (0: none yet).",
        m.last_pause_seconds);
  w.One("ranks", "gauge", "Ranks the agents report.", static_cast<double>(m.ranks));
  w.One("agents", "gauge", "Agents with a live heartbeat.", static_cast<double>(m.agents));
  w.One("slow_ranks", "gauge", "Ranks whose detector says slow.", static_cast<double>(m.slow_ranks));
  w.One("stalled_ranks", "gauge", "Live ranks the agents report stalled in NCCL.", static_cast<double>(m.stalled_ranks));
  w.One("hang_open", "gauge", "1 while a hang episode is open.", m.hang_open ? 1 : 0);
  w.One("signature_calls_total", "counter", "Collectives the agents reported (one by one or in digested blocks), compared across members for mismatches.",
        static_cast<double>(m.signature_calls));
  w.One("signatures_pending", "gauge", "Collectives and blocks (communicator, seq) held until every member reported them.",
        static_cast<double>(m.signatures_pending));
  w.Head("iteration_seconds", "gauge", "The job's iteration time now and when healthy, seconds (0: unknown).");
  w.Line("iteration_seconds", "kind=\"current\"", m.current_iteration_seconds);
  w.Line("iteration_seconds", "kind=\"healthy\"", m.healthy_iteration_seconds);
  w.One("plan_version", "gauge", "Version of the last mitigation plan published (0: none).",
        static_cast<double>(m.plan_version));
  w.One("redis_connected", "gauge", "1 while the controller's Redis connection is up.", m.redis_connected ? 1 : 0);
  w.One("step_failures_total", "counter", "Loop turns that failed (then retried with backoff).",
        static_cast<double>(m.step_failures));
  w.One("dropped_messages_total", "counter", "Messages from Redis that failed validation.",
        static_cast<double>(m.dropped_messages));
  w.One("cpu_seconds_total", "counter", "Controller CPU, user + system, seconds.", m.cpu_seconds);
  w.One("view_refresh_seconds", "gauge",
        "How long the last re-read of the rank and agent keys took, seconds (the next waits at least 4x that).",
        m.view_refresh_seconds);
  w.One("state_save_seconds", "gauge",
        "How long the last write of the state document took, seconds (a changed state waits 4x that, at most).",
        m.state_save_seconds);
  w.Head("stream_lag_seconds", "gauge",
         "How far the reading is behind a report stream, seconds: the age of the last entry read when the read "
         "stopped at its page, 0 when it reached the stream's end.");
  for (const auto& [stream, lag] : m.stream_lag_seconds) {
    w.Line("stream_lag_seconds", "stream=\"" + daemon::PromEscape(stream) + "\"", lag);
  }
  w.One("stream_trimmed_total", "counter",
        "Entries of the iterations, signatures and profiles streams trimmed behind what was read (stream-retention-s).",
        static_cast<double>(m.stream_trimmed));
  return w.str();
}

MetricsEndpoint::MetricsEndpoint() : health_("starting\n") {}

MetricsEndpoint::~MetricsEndpoint() {
  if (thread_.joinable()) {
    boost::asio::post(io_, [this] {
      if (server_) server_->Stop();
      io_.stop();
    });
    thread_.join();
  }
}

Status MetricsEndpoint::Start(const std::string& address, int port) {
  server_ = std::make_unique<daemon::HttpServer>(
      io_,
      [this] {
        std::lock_guard<std::mutex> lock(mu_);
        return metrics_;
      },
      [this] {
        std::lock_guard<std::mutex> lock(mu_);
        return health_;
      });
  if (Status s = server_->Start(address, port); !s.ok()) return s;
  thread_ = std::thread([this] {
    auto guard = boost::asio::make_work_guard(io_);
    io_.run();
  });
  return Status::Ok();
}

void MetricsEndpoint::Publish(std::string metrics, std::string health) {
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.swap(metrics);
  health_.swap(health);
}

}  // namespace falcon::controller
