// hiredis-backed RedisConnection. See redis_connection.h for the contract.
#include "daemon/redis/redis_connection.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <charconv>
#include <memory>

namespace falcon::redis {
namespace {

timeval ToTimeval(int ms) {
  if (ms < 0) return timeval{0, 0};  // zero: no timeout
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1000;
  return tv;
}

RedisReply Convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING: out.type = RedisReply::Type::kString; break;
    case REDIS_REPLY_STATUS: out.type = RedisReply::Type::kStatus; break;
    case REDIS_REPLY_ERROR: out.type = RedisReply::Type::kError; break;
    case REDIS_REPLY_INTEGER: out.type = RedisReply::Type::kInteger; break;
    case REDIS_REPLY_ARRAY: out.type = RedisReply::Type::kArray; break;
    default: out.type = RedisReply::Type::kNil; break;
  }
  if (r->str != nullptr && r->len > 0) out.str.assign(r->str, r->len);
  out.integer = r->integer;
  out.elements.reserve(r->elements);
  for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(Convert(r->element[i]));
  return out;
}

struct ReplyDeleter {
  void operator()(void* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<void, ReplyDeleter>;

}  // namespace

std::string RefusedCommand(const Status& connect_status) {
  if (connect_status.code() != Status::Code::kInvalidArgument) return {};
  for (const char* command : {"AUTH", "PING", "SELECT"}) {
    if (connect_status.message().rfind(std::string("redis ") + command + " ", 0) == 0) return command;
  }
  return {};
}

Status ErrorReplyStatus(const std::string& message) {
  for (const char* transient : {"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"}) {
    if (message.rfind(transient, 0) == 0) return Status::Unavailable("redis: " + message);
  }
  return Status::InvalidArgument("redis: " + message);
}

std::optional<Redirect> ParseRedirect(const std::string& message) {
  Redirect r;
  std::string_view rest(message);
  if (rest.rfind("MOVED ", 0) == 0) {
    rest.remove_prefix(6);
  } else if (rest.rfind("ASK ", 0) == 0) {
    r.ask = true;
    rest.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const std::size_t space = rest.find(' ');  // after the slot
  if (space == std::string_view::npos) return std::nullopt;
  rest.remove_prefix(space + 1);
  const std::size_t colon = rest.rfind(':');  // the last one: an IPv6 address has its own
  if (colon == std::string_view::npos) return std::nullopt;
  const std::string_view port = rest.substr(colon + 1);
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), r.port);
  if (ec != std::errc() || end != port.data() + port.size() || r.port < 1 || r.port > 65535) {
    return std::nullopt;
  }
  r.host.assign(rest.substr(0, colon));
  return r;
}

RedisConnection::RedisConnection(RedisOptions options)
    : options_(std::move(options)), host_(options_.host), port_(options_.port) {}

RedisConnection::~RedisConnection() { Close(); }

void RedisConnection::Close() {
  if (ctx_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(fd_mu_);
    fd_ = -1;
  }
  redisFree(ctx_);
  ctx_ = nullptr;
}

void RedisConnection::Interrupt() {
  std::lock_guard<std::mutex> lock(fd_mu_);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Status RedisConnection::TransportError(const char* what) {
  std::string msg = "redis " + endpoint() + ": " + what;
  if (ctx_ != nullptr && ctx_->err != 0) msg += ": " + std::string(ctx_->errstr);
  Close();
  return Status::Unavailable(msg);
}

Status RedisConnection::SetTimeout(int timeout_ms) {
  if (ctx_ == nullptr) return Status::Unavailable("redis: not connected");
  const int ms = timeout_ms == 0 ? options_.command_timeout_ms : timeout_ms;
  if (redisSetTimeout(ctx_, ToTimeval(ms)) != REDIS_OK) return TransportError("set timeout");
  return Status::Ok();
}

Status RedisConnection::Connect() {
  host_ = options_.host;
  port_ = options_.port;
  return Handshake();
}

Status RedisConnection::Handshake() {
  Close();
  ctx_ = redisConnectWithTimeout(host_.c_str(), port_, ToTimeval(options_.connect_timeout_ms));
  if (ctx_ == nullptr) return Status::Unavailable("redis: cannot allocate a context");
  if (ctx_->err != 0) return TransportError("connect");
  {
    std::lock_guard<std::mutex> lock(fd_mu_);
    fd_ = ctx_->fd;
  }
  (void)redisEnableKeepAlive(ctx_);  // best effort: only speeds up dead-peer detection
  if (!options_.password.empty()) {
    std::vector<std::string> auth{"AUTH"};
    if (!options_.user.empty()) auth.push_back(options_.user);
    auth.push_back(options_.password);
    Result<RedisReply> r = Command(auth, options_.connect_timeout_ms);
    if (!r.ok()) {
      Close();
      return Status::InvalidArgument("redis AUTH" +
                                     (options_.user.empty() ? "" : " as " + options_.user) +
                                     " refused: " + r.status().message());
    }
  }
  if (options_.password.empty()) {
    // Without AUTH the connection opens even where the server requires a password, and every
    // command is then refused: find out now, so the owner reports a refusal rather than a
    // connection. Only NOAUTH counts: a default user that may not PING may still do its work.
    Result<RedisReply> r = Command({"PING"}, options_.connect_timeout_ms);
    if (!r.ok() && r.status().code() != Status::Code::kInvalidArgument) {
      const Status s = r.status();
      Close();
      return s;
    }
    if (!r.ok() && r.status().message().find("NOAUTH") != std::string::npos) {
      Close();
      return Status::InvalidArgument("redis PING refused: " + r.status().message() +
                                     " (the server requires a password)");
    }
  }
  if (options_.db != 0) {
    Result<RedisReply> r = Command({"SELECT", std::to_string(options_.db)}, options_.connect_timeout_ms);
    if (!r.ok()) {
      Close();
      return Status::InvalidArgument("redis SELECT " + std::to_string(options_.db) + " refused: " +
                                     r.status().message());
    }
  }
  return Status::Ok();
}

Result<RedisReply> RedisConnection::Command(const std::vector<std::string>& argv, int timeout_ms) {
  Result<std::vector<RedisReply>> r = Pipeline({argv}, timeout_ms);
  if (!r.ok()) return r.status();
  RedisReply& reply = r.value().front();
  if (reply.type == RedisReply::Type::kError) return ErrorReplyStatus(reply.str);
  return std::move(reply);
}

Result<std::vector<RedisReply>> RedisConnection::Pipeline(
    const std::vector<std::vector<std::string>>& commands, int timeout_ms) {
  using Clock = std::chrono::steady_clock;
  const int budget_ms = timeout_ms == 0 ? options_.command_timeout_ms : timeout_ms;
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(std::max(budget_ms, 0));
  // What is left of the call's timeout for the next round trip (< 0: none, as given).
  auto left_ms = [&]() -> int {
    if (budget_ms < 0) return -1;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return static_cast<int>(std::max<std::int64_t>(left.count(), 1));
  };
  Result<std::vector<RedisReply>> first = Send(commands, timeout_ms);
  if (!first.ok()) return first;
  std::vector<RedisReply>& replies = first.value();
  for (int hop = 0; hop < kMaxRedirects; ++hop) {
    // The commands redirected to the node named by the first MOVED (a pipeline over several
    // jobs' keys reaches each node in a hop of its own), and every ASK.
    std::optional<Redirect> moved;
    std::vector<std::size_t> to_move, to_ask;
    std::vector<Redirect> asks;
    for (std::size_t i = 0; i < replies.size(); ++i) {
      if (replies[i].type != RedisReply::Type::kError) continue;
      std::optional<Redirect> r = ParseRedirect(replies[i].str);
      if (!r) continue;
      if (r->host.empty()) r->host = host_;
      if (r->ask) {
        to_ask.push_back(i);
        asks.push_back(std::move(*r));
      } else if (!moved || (r->host == moved->host && r->port == moved->port)) {
        if (!moved) moved = std::move(r);
        to_move.push_back(i);
      }
    }
    if (to_move.empty() && to_ask.empty()) return first;
    if (budget_ms >= 0 && Clock::now() >= deadline) {
      return Status::Unavailable("redis " + endpoint() + ": timed out following cluster redirects");
    }
    for (std::size_t k = 0; k < to_ask.size(); ++k) {
      // A slot being migrated: this key is already on the importing node; ask it there, once.
      RedisConnection there(options_);
      there.host_ = asks[k].host;
      there.port_ = asks[k].port;
      if (Status s = there.Handshake(); !s.ok()) return s;
      // Interrupt() cannot reach this connection: it waits a command timeout at most, even for a
      // call made without one.
      Result<std::vector<RedisReply>> r =
          there.Send({{"ASKING"}, commands[to_ask[k]]}, budget_ms < 0 ? options_.command_timeout_ms : left_ms());
      if (!r.ok()) return r.status();
      replies[to_ask[k]] = std::move(r.value()[1]);
      ++redirects_;
    }
    if (to_move.empty()) continue;
    host_ = moved->host;
    port_ = moved->port;
    ++redirects_;
    if (Status s = Handshake(); !s.ok()) return s;
    std::vector<std::vector<std::string>> again;
    again.reserve(to_move.size());
    for (std::size_t i : to_move) again.push_back(commands[i]);
    Result<std::vector<RedisReply>> r = Send(again, left_ms());
    if (!r.ok()) return r.status();
    for (std::size_t k = 0; k < to_move.size(); ++k) replies[to_move[k]] = std::move(r.value()[k]);
  }
  for (const RedisReply& r : replies) {
    if (r.type == RedisReply::Type::kError && ParseRedirect(r.str)) {
      return Status::Unavailable("redis " + endpoint() + ": more than " + std::to_string(kMaxRedirects) +
                                 " cluster redirects (" + r.str + ")");
    }
  }
  return first;
}

Result<std::vector<RedisReply>> RedisConnection::Send(
    const std::vector<std::vector<std::string>>& commands, int timeout_ms) {
  Status s = SetTimeout(timeout_ms);
  if (!s.ok()) return s;
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const auto& argv : commands) {
    args.clear();
    lens.clear();
    for (const std::string& a : argv) {
      args.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx_, static_cast<int>(args.size()), args.data(), lens.data()) !=
        REDIS_OK) {
      return TransportError("append command");
    }
  }
  std::vector<RedisReply> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      return TransportError(commands.size() == 1 ? commands[0][0].c_str() : "pipeline");
    }
    ReplyPtr reply(raw);
    replies.push_back(Convert(static_cast<const redisReply*>(reply.get())));
  }
  return replies;
}

Result<RedisReply> RedisConnection::ReadReply(int timeout_ms) {
  Status s = SetTimeout(timeout_ms);
  if (!s.ok()) return s;
  void* raw = nullptr;
  if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) return TransportError("read");
  ReplyPtr reply(raw);
  return Convert(static_cast<const redisReply*>(reply.get()));
}

}  // namespace falcon::redis
