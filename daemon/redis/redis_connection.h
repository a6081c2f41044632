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
// Thread-safety: thread-compatible — one thread at a time calls everything except Interrupt(),
// which any thread may call to make a blocked call on the owner thread return (it shuts the
// socket down). Must never: throw, block past a call's timeout (except a command sent with
// timeout_ms < 0, which waits until data or Interrupt()), or log the password.
#pragma once

#include <mutex>
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

  const RedisOptions& options() const { return options_; }
  bool connected() const { return ctx_ != nullptr; }

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

  const RedisOptions options_;
  redisContext* ctx_ = nullptr;  // owner thread only
  std::mutex fd_mu_;             // guards fd_ against Interrupt() racing Close()
  int fd_ = -1;                  // guarded by fd_mu_
};

// The command Connect() failed on when the server refused it ("AUTH", "PING", "SELECT"); "" for
// any other status (unreachable, timed out, ok).
std::string RefusedCommand(const Status& connect_status);

// The Status for an error reply ("LOADING ..." etc. are Unavailable).
Status ErrorReplyStatus(const std::string& message);

}  // namespace falcon::redis
