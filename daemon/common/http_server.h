// HttpServer: a minimal HTTP/1.1 endpoint (Boost.Beast) on an io_context (the agent's event
// loop, the controller's metrics thread), serving GET /metrics (Prometheus text) and
// GET /healthz. Every socket operation is asynchronous on the
// loop's io_context, so handlers may read the loop's state directly; each connection serves one
// request and closes, with a 5 s deadline and a request size limit.
// Thread-safety: everything runs on the io_context's (single) thread; Start/Stop from it too.
// Must never: block the loop, or let an exception escape (all Beast/Asio calls use error codes).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <functional>
#include <memory>
#include <string>

#include "falcon/status.h"

namespace falcon::daemon {

class HttpServer {
 public:
  using Handler = std::function<std::string()>;  // body; runs on the loop thread

  HttpServer(boost::asio::io_context& io, Handler metrics, Handler health);
  // Binds address:port (port 0: an ephemeral port, see port()) and starts accepting.
  [[nodiscard]] Status Start(const std::string& address, int port);
  void Stop();
  int port() const { return port_; }

 private:
  void Accept();

  boost::asio::io_context& io_;
  std::shared_ptr<Handler> metrics_;
  std::shared_ptr<Handler> health_;
  boost::asio::ip::tcp::acceptor acceptor_;
  int port_ = 0;
};

}  // namespace falcon::daemon
