// What every falcon-ctl command that talks to Redis shares: the connection options (--redis URL
// or --host/--port, --user, --password / FALCON_REDIS_PASSWORD, --job / FALCON_JOB, --json,
// --timeout), connecting with a friendly error, reading stream
// entries newest-first, and validating every payload read (bad ones are reported on stderr and
// skipped, never used).
// Single-threaded, like falcon-ctl. Must never: print the password, or use a payload that failed
// validation.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/protocol/keys.h"
#include "daemon/protocol/messages.h"
#include "daemon/redis/redis_connection.h"
#include "falcon/protocol.h"
#include "falcon/status.h"

namespace CLI {
class App;
}

namespace falcon::ctl {

struct RedisCliOptions {
  std::string url;  // redis://[user[:password]@]host[:port][/db]; overrides host/port
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string user;
  std::string password;  // else FALCON_REDIS_PASSWORD
  std::string job;       // else FALCON_JOB, else "default"
  bool json = false;
  double timeout_s = 5;  // connect, each command, and waiting for acks
};

// Adds the common options to `cmd`. `opts` must outlive parsing.
void AddRedisOptions(CLI::App& cmd, RedisCliOptions& opts);

// Applies the environment and the URL: fills job and password. InvalidArgument on a bad URL or
// job name (the message says which).
[[nodiscard]] Status ResolveRedisOptions(RedisCliOptions& opts);

// A connected, authenticated connection, or Unavailable / InvalidArgument with a message that
// names the server (never the password).
[[nodiscard]] Result<std::unique_ptr<redis::RedisConnection>> ConnectRedis(
    const RedisCliOptions& opts);

// The exit code and the "falcon-ctl: ..." line on stderr for a failed Redis step.
int ReportRedisError(const Status& status);


// One validated payload from a stream or hash.
struct ValidMessage {
  std::string id;  // stream entry id, or the key for a hash
  nlohmann::json msg;
};

// Entries of `stream` from newest backwards, at most `count` (0: all), returned oldest first;
// entries after (exclusive) `after_id` only when it is non-empty. Entries whose payload is
// missing or fails `spec` are reported on stderr and skipped; a key that is not a stream is
// reported and read as empty.
[[nodiscard]] Result<std::vector<ValidMessage>> ReadStreamTail(redis::RedisConnection& c,
                                                               const std::string& stream,
                                                               const protocol::MessageSpec& spec,
                                                               std::uint64_t count,
                                                               const std::string& after_id);

// The kPayloadField of hash `key` validated as `spec`; nullopt (reported on stderr) when the key
// vanished, is not a hash, or the payload is bad.
[[nodiscard]] Result<std::optional<ValidMessage>> ReadHashMessage(
    redis::RedisConnection& c, const std::string& key, const protocol::MessageSpec& spec);

// One agent's answer to a command sent by AskAgents.
struct AgentAnswer {
  std::string host;
  std::string command_id;
  std::optional<nlohmann::json> ack;  // validated (protocol::kAck); nullopt: no answer in time
};

// Sends `command` (its type and type-specific fields; ids, times and the deadline are filled in)
// to every agent with a heartbeat key for opts.job, and waits up to opts.timeout_s for their
// acks. NotFound when no agent is registered; a Redis failure as its Status. Defined in
// agent_command.cc.
[[nodiscard]] Result<std::vector<AgentAnswer>> AskAgents(redis::RedisConnection& c, const RedisCliOptions& opts,
                                                         const protocol::Command& command);

// Validates one payload read from `where`; warns on stderr and returns nullopt when it is bad.
std::optional<nlohmann::json> ValidateOrWarn(const std::string& where, const std::string* text,
                                             const protocol::MessageSpec& spec);

// Key variables naming one job (host and rank unset).
inline protocol::KeyVars JobVars(const std::string& job) { return {job, {}, std::nullopt}; }

// Wall clock, ns since the epoch.
std::int64_t NowNs();
// "2026-11-21 13:08:42" (UTC) for a wall-clock ns value.
std::string FormatUtc(std::int64_t ns);
// Seconds since `ns`, one decimal, e.g. "3.2s"; "-" for ns <= 0.
std::string AgeString(std::int64_t ns, std::int64_t now_ns);

}  // namespace falcon::ctl
