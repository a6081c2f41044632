// hiredis-backed RedisConnection. See redis_connection.h for the contract.
#include "daemon/redis/redis_connection.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <sys/time.h>

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

RedisConnection::RedisConnection(RedisOptions options) : options_(std::move(options)) {}

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
  std::string msg = std::string("redis ") + options_.host + ":" + std::to_string(options_.port) +
                    ": " + what;
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
  Close();
  ctx_ = redisConnectWithTimeout(options_.host.c_str(), options_.port,
                                 ToTimeval(options_.connect_timeout_ms));
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
