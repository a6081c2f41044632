// RedisConnection: one synchronous connection to Redis over hiredis, and RedisReply, the plain
// value its commands return (no hiredis type leaves daemon/redis/).
//
// Connect() connects with a timeout, authenticates (AUTH [user] password) and selects the db.
// Without a password it sends a PING: a server that requires one (NOAUTH) refuses the connect
// there, instead of accepting it and then every command.
// Command() / Pipeline() send commands and wait for their replies up to a per-call timeout. A
// transport error or a timeout closes the connection (hiredis cannot resync a half-read reply):
// the call returns Unavailable and connected() turns false; reconnecting is the owner's choice
// (RedisWorker does it with backoff). An error reply from the server is returned as a Status
// (Unavailable for LOADING/BUSY/MASTERDOWN/TRYAGAIN, InvalidArgument otherwise) by Command() and
// as a kError element by Pipeline().
// Redis Cluster: a reply "MOVED <slot> <host>:<port>" moves the connection to that node (the same
// handshake as Connect()) and sends the redirected commands again there; later commands go there
// too (all of one job's keys share one hash slot, include/falcon/protocol.h). "ASK <slot>
// <host>:<port>" (a slot in migration) sends ASKING and the command to that node over a
// connection of its own, once, and stays put. At most kMaxRedirects redirects per call; each
// redirected round trip gets what is left of the call's timeout (plus the connect to the node).
// Connect() always starts at the configured server, so a reconnect after a failover follows the
// cluster's new redirects. A standalone server never redirects. Only the redirected commands of
// a pipeline are sent again (a PUBLISH or an XADD that ran is never repeated), and the replies
// keep the commands' order.
// Thread-safety: thread-compatible — one thread at a time calls everything except Interrupt(),
// which any thread may call to make a blocked call on the owner thread return (it shuts the
// socket down). Must never: throw, block past a call's timeout (except a command sent with
// timeout_ms < 0, which waits until data or Interrupt()), or log the password.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/redis/redis_options.h"
#include "falcon/status.h"

struct redisContext;

namespace falcon::redis {

struct RedisReply {
  enum class Type { kNil, kStatus, kError, kInteger, kString, kArray };
  Type type = Type::kNil;
  std::string str;  // kStatus, kError, kString
  long long integer = 0;
  std::vector<RedisReply> elements;  // kArray
};

class RedisConnection {
 public:
  explicit RedisConnection(RedisOptions options);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  static constexpr int kMaxRedirects = 8;

  const RedisOptions& options() const { return options_; }
  bool connected() const { return ctx_ != nullptr; }
  // The server this connection talks to now: the configured one, or a cluster node it was
  // redirected to ("host:port").
  std::string endpoint() const { return host_ + ":" + std::to_string(port_); }
  // Cluster redirects (MOVED and ASK) followed since construction.
  std::uint64_t redirects() const { return redirects_; }

  // (Re)connects: closes any current connection first. Unavailable when the server cannot be
  // reached in time, InvalidArgument when AUTH, SELECT or (without a password) PING is refused:
  // the message then starts "redis <COMMAND> " (see RefusedCommand).
  [[nodiscard]] Status Connect();
  void Close();

  // timeout_ms: 0 = options().command_timeout_ms; < 0 = no timeout (pub/sub reads).
  [[nodiscard]] Result<RedisReply> Command(const std::vector<std::string>& argv, int timeout_ms = 0);
  [[nodiscard]] Result<std::vector<RedisReply>> Pipeline(
      const std::vector<std::vector<std::string>>& commands, int timeout_ms = 0);
  // Reads the next pushed reply (pub/sub). Same timeout convention.
  [[nodiscard]] Result<RedisReply> ReadReply(int timeout_ms);

  // Any thread: wakes a call blocked on the socket (it then fails with Unavailable).
  void Interrupt();

 private:
  Status SetTimeout(int timeout_ms);
  Status TransportError(const char* what);
  // Connects to host_:port_ and runs the handshake (AUTH, PING, SELECT).
  Status Handshake();
  // One round of the pipeline on the current connection, redirects not followed.
  Result<std::vector<RedisReply>> Send(const std::vector<std::vector<std::string>>& commands,
                                       int timeout_ms);

  const RedisOptions options_;
  std::string host_;  // where the connection is (or goes next): options_ or a redirect's node
  int port_ = 0;
  std::uint64_t redirects_ = 0;
  redisContext* ctx_ = nullptr;  // owner thread only
  std::mutex fd_mu_;             // guards fd_ against Interrupt() racing Close()
  int fd_ = -1;                  // guarded by fd_mu_
};

// The command Connect() failed on when the server refused it ("AUTH", "PING", "SELECT"); "" for
// any other status (unreachable, timed out, ok).
std::string RefusedCommand(const Status& connect_status);

// The Status for an error reply ("LOADING ..." etc. are Unavailable).
Status ErrorReplyStatus(const std::string& message);

// A cluster redirect read from an error reply: "MOVED 3999 10.0.0.7:6381" or "ASK ...". An empty
// host (a node that does not know its address) means the node that sent the reply.
struct Redirect {
  bool ask = false;
  std::string host;
  int port = 0;
};
std::optional<Redirect> ParseRedirect(const std::string& error_message);

}  // namespace falcon::redis
