// RefusalLog: the warnings for commands Redis refuses to one part of the agent (the report
// publisher, the command reader). A refusal — NOAUTH, WRONGPASS, NOPERM, WRONGTYPE, any error
// reply or a refused AUTH/PING/SELECT at connect — does not go away by retrying, and the agent
// retries every flush and every read: each distinct refusal (command + Redis's error text) is a
// warning once, naming the command, the key and the error; repeats are only counted. When every
// command of the part goes through again, Accepted() logs that once and forgets what it saw, so
// a refusal that comes back is a warning again.
// Thread-safety: the owner's loop thread only. Must never: log a refusal it has logged since the
// last Accepted(), or hold more than kMaxDistinct refusals (later distinct ones are counted).
#pragma once

#include <spdlog/logger.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>

namespace falcon::agent {

class RefusalLog {
 public:
  static constexpr std::size_t kMaxDistinct = 64;

  RefusalLog(std::string role, std::shared_ptr<spdlog::logger> log);

  // Redis refused `command` ("HSET", "XADD", "AUTH", ...) on `key` ("" when it names none).
  void Refused(std::string_view command, std::string_view key, std::string_view error);
  // Every command of the part went through: logs event=redis_accepted once after refusals.
  void Accepted();

  std::uint64_t refusals() const { return refusals_; }  // since start, logged or not

 private:
  const std::string role_;
  std::shared_ptr<spdlog::logger> log_;
  std::set<std::string> seen_;  // command + '\n' + error, since the last Accepted()
  std::uint64_t refusals_ = 0;
  std::uint64_t since_accepted_ = 0;
};

}  // namespace falcon::agent
