// Common Redis plumbing of falcon-ctl. See redis_cli.h for the contract.
#include "daemon/ctl/redis_cli.h"

#include <time.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "daemon/common/cli_checks.h"
#include "daemon/ctl/command.h"
#include "daemon/protocol/keys.h"
#include "daemon/protocol/validate.h"
#include "daemon/redis/redis_commands.h"

namespace falcon::ctl {
namespace {


// Parses redis://[user[:password]@]host[:port][/db] into `opts` (db is accepted, must be 0).
Status ParseUrl(RedisCliOptions& opts) {
  std::string rest = opts.url;
  const std::string scheme = "redis://";
  if (rest.rfind(scheme, 0) != 0) return Status::InvalidArgument("--redis: URL must start with redis://");
  rest = rest.substr(scheme.size());
  const std::size_t at = rest.rfind('@');
  if (at != std::string::npos) {
    const std::string cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const std::size_t colon = cred.find(':');
    if (colon == std::string::npos) {
      opts.password = cred;  // redis://secret@host, as redis-cli reads it
    } else {
      opts.user = cred.substr(0, colon);
      opts.password = cred.substr(colon + 1);
    }
  }
  const std::size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    if (!db.empty() && db != "0") return Status::InvalidArgument("--redis: only db 0 is used by Falcon");
    rest = rest.substr(0, slash);
  }
  const std::size_t colon = rest.rfind(':');
  if (colon != std::string::npos) {
    char* end = nullptr;
    const long port = std::strtol(rest.c_str() + colon + 1, &end, 10);
    if (end == nullptr || *end != '\0' || port < 1 || port > 65535) {
      return Status::InvalidArgument("--redis: bad port in " + opts.url);
    }
    opts.port = static_cast<int>(port);
    rest = rest.substr(0, colon);
  }
  if (!rest.empty()) opts.host = rest;
  return Status::Ok();
}

}  // namespace

void AddRedisOptions(CLI::App& cmd, RedisCliOptions& opts) {
  cmd.add_option("--redis", opts.url, "Redis URL redis://[user[:password]@]host[:port]")
      ->group("Redis");
  cmd.add_option("--host", opts.host, "Redis host")->capture_default_str()->group("Redis");
  cmd.add_option("--port", opts.port, "Redis port")->check(daemon::FiniteRange(1, 65535))->capture_default_str()->group("Redis");
  cmd.add_option("--user", opts.user, "Redis ACL user")->group("Redis");
  cmd.add_option("--password", opts.password, "Redis password (default: $FALCON_REDIS_PASSWORD)")->group("Redis");
  cmd.add_option("--job", opts.job, "job name (default: $FALCON_JOB, else 'default')");
  cmd.add_flag("--json", opts.json, "machine-readable JSON instead of a table");
  cmd.add_option("--timeout", opts.timeout_s, "seconds for connecting, each command and acks")
      ->check(daemon::FiniteRange(0.1, 3600.0))
      ->capture_default_str();
}

Status ResolveRedisOptions(RedisCliOptions& opts) {
  if (opts.password.empty()) {
    if (const char* p = std::getenv("FALCON_REDIS_PASSWORD"); p != nullptr) opts.password = p;
  }
  if (!opts.url.empty()) {
    if (Status s = ParseUrl(opts); !s.ok()) return s;
  }
  if (opts.job.empty()) {
    const char* j = std::getenv("FALCON_JOB");
    opts.job = (j != nullptr && *j != '\0') ? j : "default";
  }
  if (!protocol::ValidKeyPart(opts.job)) {
    return Status::InvalidArgument("job name '" + opts.job +
                                   "' is not 1..128 characters of [A-Za-z0-9._-]");
  }
  return Status::Ok();
}

Result<std::unique_ptr<redis::RedisConnection>> ConnectRedis(const RedisCliOptions& opts) {
  redis::RedisOptions r;
  r.host = opts.host;
  r.port = opts.port;
  r.user = opts.user;
  r.password = opts.password;
  r.connect_timeout_ms = static_cast<int>(opts.timeout_s * 1000);
  r.command_timeout_ms = r.connect_timeout_ms;
  auto conn = std::make_unique<redis::RedisConnection>(r);
  if (Status s = conn->Connect(); !s.ok()) {
    const std::string hint = s.code() == Status::Code::kUnavailable
                                 ? " (is redis-server running there? set --redis or --host/--port)"
                                 : " (check --user / --password / FALCON_REDIS_PASSWORD)";
    return Status(s.code() == Status::Code::kUnavailable
                      ? Status::Unavailable("cannot reach Redis at " + r.Describe() + ": " +
                                            s.message() + hint)
                      : Status::InvalidArgument("Redis at " + r.Describe() + " refused us: " +
                                                s.message() + hint));
  }
  return conn;
}

int ReportRedisError(const Status& status) {
  std::fprintf(stderr, "falcon-ctl: %s\n", status.message().c_str());
  switch (status.code()) {
    case Status::Code::kUnavailable:
    case Status::Code::kIoError: return kExitUnreachable;
    case Status::Code::kInvalidArgument: return kExitUsage;
    case Status::Code::kNotFound:
    case Status::Code::kCorrupt: return kExitInput;
    default: return kExitInternal;
  }
}

namespace {

// Redis refused a read because the key holds another type: one key's problem, not the command's.
bool WrongType(const Status& s) {
  return s.code() == Status::Code::kInvalidArgument && s.message().find("WRONGTYPE") != std::string::npos;
}

}  // namespace

std::optional<nlohmann::json> ValidateOrWarn(const std::string& where, const std::string* text,
                                             const protocol::MessageSpec& spec) {
  if (text == nullptr) {
    std::fprintf(stderr, "falcon-ctl: warning: %s: no '%s' field, skipped\n", where.c_str(),
                 std::string(protocol::kPayloadField).c_str());
    return std::nullopt;
  }
  Result<nlohmann::json> parsed = protocol::ParseMessage(*text, spec);
  if (!parsed.ok()) {
    std::fprintf(stderr, "falcon-ctl: warning: %s: bad %s message skipped: %s\n", where.c_str(),
                 std::string(spec.type).c_str(), parsed.status().message().c_str());
    return std::nullopt;
  }
  return std::move(parsed).value();
}

Result<std::vector<ValidMessage>> ReadStreamTail(redis::RedisConnection& c,
                                                 const std::string& stream,
                                                 const protocol::MessageSpec& spec,
                                                 std::uint64_t count, const std::string& after_id) {
  std::vector<std::string> argv{"XREVRANGE", stream, "+", after_id.empty() ? "-" : "(" + after_id};
  if (count > 0) argv.insert(argv.end(), {"COUNT", std::to_string(count)});
  Result<redis::RedisReply> r = c.Command(argv);
  if (!r.ok() && WrongType(r.status())) {
    std::fprintf(stderr, "falcon-ctl: warning: %s: %s, skipped\n", stream.c_str(), r.status().message().c_str());
    return std::vector<ValidMessage>{};
  }
  if (!r.ok()) return r.status();
  // XREVRANGE replies like one stream of an XREAD reply: wrap it to reuse the parser.
  redis::RedisReply wrapped{redis::RedisReply::Type::kArray, {}, 0, {}};
  redis::RedisReply one{redis::RedisReply::Type::kArray, {}, 0, {}};
  one.elements.push_back({redis::RedisReply::Type::kString, stream, 0, {}});
  one.elements.push_back(std::move(r).value());
  wrapped.elements.push_back(std::move(one));
  Result<std::vector<redis::StreamRead>> reads = redis::ParseStreamReads(wrapped);
  if (!reads.ok()) return reads.status();
  std::vector<ValidMessage> out;
  for (const redis::StreamRead& read : reads.value()) {
    for (auto it = read.entries.rbegin(); it != read.entries.rend(); ++it) {
      std::vector<const std::string*> texts = it->Values(std::string(protocol::kPayloadField));
      if (texts.empty()) texts.push_back(nullptr);  // warned about as an entry without a message
      for (const std::string* text : texts) {       // an agent's entry may hold several
        std::optional<nlohmann::json> msg = ValidateOrWarn(stream + " " + it->id, text, spec);
        if (msg) out.push_back({it->id, std::move(*msg)});
      }
    }
  }
  return out;
}

Result<std::optional<ValidMessage>> ReadHashMessage(redis::RedisConnection& c,
                                                    const std::string& key,
                                                    const protocol::MessageSpec& spec) {
  Result<std::map<std::string, std::string>> h = redis::HGetAll(c, key);
  if (!h.ok() && WrongType(h.status())) {
    std::fprintf(stderr, "falcon-ctl: warning: %s: %s, skipped\n", key.c_str(), h.status().message().c_str());
    return std::optional<ValidMessage>{};
  }
  if (!h.ok()) return h.status();
  if (h.value().empty()) return std::optional<ValidMessage>{};  // expired since SCAN
  auto it = h.value().find(std::string(protocol::kPayloadField));
  std::optional<nlohmann::json> msg =
      ValidateOrWarn(key, it == h.value().end() ? nullptr : &it->second, spec);
  if (!msg) return std::optional<ValidMessage>{};
  return std::optional<ValidMessage>{ValidMessage{key, std::move(*msg)}};
}

std::int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string FormatUtc(std::int64_t ns) {
  const time_t secs = static_cast<time_t>(ns / 1000000000);
  tm t{};
  gmtime_r(&secs, &t);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &t);
  return buf;
}

std::string AgeString(std::int64_t ns, std::int64_t now_ns) {
  if (ns <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1fs", static_cast<double>(now_ns - ns) / 1e9);
  return buf;
}

}  // namespace falcon::ctl
