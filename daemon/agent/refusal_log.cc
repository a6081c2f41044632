// RefusalLog. See refusal_log.h for the contract.
#include "daemon/agent/refusal_log.h"

#include "daemon/common/log_escape.h"

namespace falcon::agent {

RefusalLog::RefusalLog(std::string role, std::shared_ptr<spdlog::logger> log)
    : role_(std::move(role)), log_(std::move(log)) {}

void RefusalLog::Refused(std::string_view command, std::string_view key, std::string_view error) {
  ++refusals_;
  ++since_accepted_;
  if (seen_.size() >= kMaxDistinct) return;
  if (!seen_.insert(std::string(command) + "\n" + std::string(error)).second) return;
  log_->warn("event=redis_refused role={} command={} key={} error={} action=retrying", role_,
             daemon::LogValue(command), key.empty() ? std::string("-") : daemon::LogValue(key),
             daemon::LogQuoted(error));
}

void RefusalLog::Accepted() {
  if (since_accepted_ == 0) return;
  log_->info("event=redis_accepted role={} refusals={}", role_, since_accepted_);
  since_accepted_ = 0;
  seen_.clear();
}

}  // namespace falcon::agent
