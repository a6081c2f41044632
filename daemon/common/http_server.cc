// HttpServer. See http_server.h for the contract.
#include "daemon/common/http_server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>

namespace falcon::daemon {
namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

// One connection: read a request, write the response, close. Owns itself through the handlers.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<HttpServer::Handler> metrics,
          std::shared_ptr<HttpServer::Handler> health)
      : stream_(std::move(socket)), metrics_(std::move(metrics)), health_(std::move(health)) {}

  void Run() {
    parser_.body_limit(8192);
    parser_.header_limit(8192);
    stream_.expires_after(std::chrono::seconds(5));
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       self->OnRead(ec);
                     });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec) return;  // closed, timed out or malformed: drop the connection
    const auto& req = parser_.get();
    res_.version(req.version());
    res_.keep_alive(false);
    res_.set(http::field::server, "falcon-agent");
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res_.result(http::status::method_not_allowed);
      res_.body() = "GET only\n";
    } else if (path == "/metrics") {
      res_.result(http::status::ok);
      res_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res_.body() = (*metrics_)();
    } else if (path == "/healthz") {
      res_.result(http::status::ok);
      res_.set(http::field::content_type, "text/plain; charset=utf-8");
      res_.body() = (*health_)();
    } else {
      res_.result(http::status::not_found);
      res_.body() = "not found: /metrics, /healthz\n";
    }
    res_.prepare_payload();
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code wec, std::size_t) {
      beast::error_code ignored;  // closing a finished connection: nothing to report
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      (void)wec;
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> res_;
  std::shared_ptr<HttpServer::Handler> metrics_;
  std::shared_ptr<HttpServer::Handler> health_;
};

}  // namespace

HttpServer::HttpServer(boost::asio::io_context& io, Handler metrics, Handler health)
    : io_(io),
      metrics_(std::make_shared<Handler>(std::move(metrics))),
      health_(std::make_shared<Handler>(std::move(health))),
      acceptor_(io) {}

Status HttpServer::Start(const std::string& address, int port) {
  beast::error_code ec;
  const auto addr = boost::asio::ip::make_address(address, ec);
  if (ec) return Status::InvalidArgument("metrics address '" + address + "': " + ec.message());
  const tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  if (acceptor_.open(ep.protocol(), ec); ec) return Status::IoError("metrics socket: " + ec.message());
  if (acceptor_.set_option(boost::asio::socket_base::reuse_address(true), ec); ec) {
    return Status::IoError("metrics socket option: " + ec.message());
  }
  if (acceptor_.bind(ep, ec); ec) {
    return Status::IoError("metrics bind " + address + ":" + std::to_string(port) + ": " + ec.message());
  }
  if (acceptor_.listen(boost::asio::socket_base::max_listen_connections, ec); ec) {
    return Status::IoError("metrics listen: " + ec.message());
  }
  port_ = acceptor_.local_endpoint(ec).port();
  Accept();
  return Status::Ok();
}

void HttpServer::Stop() {
  beast::error_code ignored;  // closing: errors mean it was not open
  acceptor_.close(ignored);
}

void HttpServer::Accept() {
  acceptor_.async_accept(io_, [this](beast::error_code ec, tcp::socket socket) {
    if (ec == boost::asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) std::make_shared<Session>(std::move(socket), metrics_, health_)->Run();
    Accept();
  });
}

}  // namespace falcon::daemon
