// ReportPublisher. See report_publisher.h for the contract.
#include "daemon/agent/report_publisher.h"

#include <boost/asio/post.hpp>

#include <future>
#include <utility>

#include "daemon/common/log_escape.h"
#include "falcon/protocol.h"

namespace falcon::agent {

ReportPublisher::ReportPublisher(boost::asio::io_context& io, const redis::RedisOptions& redis,
                                 const PublisherOptions& options,
                                 std::shared_ptr<spdlog::logger> log)
    : io_(io),
      options_(options),
      log_(std::move(log)),
      refusals_("publisher", log_),
      worker_("redis-pub", redis,
              [this, alive = alive_](bool up, const Status& why) {
                // Worker thread: hand the transition to the loop.
                boost::asio::post(io_, [this, alive, up, why] {
                  if (*alive) OnState(up, why);
                });
              }),
      outbox_(options.outbox_max) {}

ReportPublisher::~ReportPublisher() { Stop(); }

void ReportPublisher::Start() { worker_.Start(); }

void ReportPublisher::Stop() {
  *alive_ = false;
  worker_.Stop();
}

void ReportPublisher::OnState(bool up, const Status& why) {
  if (up && !connected_) log_->info("event=redis_up role=publisher");
  if (!up && connected_) log_->warn("event=redis_down role=publisher reason={}", daemon::LogQuoted(why.message()));
  if (!up && !connected_) {
    const std::string refused = redis::RefusedCommand(why);
    if (!refused.empty()) {
      refusals_.Refused(refused, "", why.message());  // AUTH or PING refused: a warning, once
    } else {
      log_->debug("event=redis_retry role=publisher reason={}", daemon::LogQuoted(why.message()));
    }
  }
  connected_ = up;
}

void ReportPublisher::Queue(const std::string& stream, const nlohmann::json& message, bool packable) {
  outbox_.Push(stream, message.dump(), packable);
}

void ReportPublisher::Queue(const std::string& stream, std::string message_text, bool packable) {
  outbox_.Push(stream, std::move(message_text), packable);
}

void ReportPublisher::SetHash(const std::string& key, redis::FieldList fields, std::int64_t ttl_s) {
  hashes_[key] = {std::move(fields), ttl_s, ++hash_version_};
}

void ReportPublisher::Publish(const std::string& channel, const nlohmann::json& message) {
  if (pubs_.size() < 1024) pubs_.emplace_back(channel, message.dump());
}

ReportPublisher::FlushResult ReportPublisher::Write(redis::RedisConnection& c, const Batch& b) {
  std::vector<std::vector<std::string>> cmds;
  for (const auto& [key, h] : b.hashes) {
    cmds.push_back(redis::HSetArgs(key, h.fields));
    cmds.push_back(redis::ExpireArgs(key, h.ttl_s));
  }
  for (const auto& [channel, payload] : b.pubs) cmds.push_back(redis::PublishArgs(channel, payload));
  // Entries [first, end): consecutive packable messages of one stream share an entry.
  std::vector<std::pair<std::size_t, std::size_t>> groups;
  for (std::size_t i = 0; i < b.entries.size();) {
    std::size_t j = i + 1, bytes = b.entries[i].payload.size();
    while (b.entries[i].packable && j < b.entries.size() && j - i < protocol::kPackMessages && b.entries[j].packable &&
           b.entries[j].stream == b.entries[i].stream && bytes + b.entries[j].payload.size() <= protocol::kPackBytes) {
      bytes += b.entries[j++].payload.size();
    }
    groups.emplace_back(i, j);
    i = j;
  }
  for (const auto& [first, end] : groups) {
    redis::FieldList fields;
    for (std::size_t k = first; k < end; ++k) fields.emplace_back(std::string(protocol::kPayloadField), b.entries[k].payload);
    cmds.push_back(redis::XAddArgs(b.entries[first].stream, protocol::EntryCap(b.maxlen, end - first), fields));
  }
  FlushResult r;
  Result<std::vector<redis::RedisReply>> replies = c.Pipeline(cmds);
  if (!replies.ok()) {
    r.status = replies.status();
    return r;
  }
  r.ok = true;
  const auto& rep = replies.value();
  auto refused = [&](std::size_t i, const char* command, const std::string& key) {
    if (rep[i].type != redis::RedisReply::Type::kError) return false;
    r.refused.push_back({command, key, rep[i].str});
    return true;
  };
  std::size_t i = 0;
  for (const auto& [key, h] : b.hashes) {
    if (!refused(i, "HSET", key)) r.hashes_written[key] = h.version;
    (void)refused(i + 1, "EXPIRE", key);  // logged; the next heartbeat sets the TTL again
    i += 2;
  }
  for (const auto& [channel, payload] : b.pubs) (void)refused(i++, "PUBLISH", channel);  // live only
  for (const auto& [first, end] : groups) {
    if (refused(i++, "XADD", b.entries[first].stream)) {
      r.status = redis::ErrorReplyStatus(rep[i - 1].str);
      break;  // keep order: later entries wait for the next flush
    }
    r.confirmed_seq = b.entries[end - 1].seq;
  }
  r.remaining_hint = b.backlog > b.entries.size() ? b.backlog - b.entries.size() : 0;
  return r;
}

ReportPublisher::Batch ReportPublisher::TakeBatch(std::size_t max_entries) {
  // The job owns copies: the loop may change its queues while the worker runs.
  Batch b;
  b.entries = outbox_.Peek(max_entries);
  while (!b.entries.empty() && b.entries.front().seq <= in_flight_seq_) {
    b.entries.erase(b.entries.begin());  // only at shutdown: sent by the flush still in flight
  }
  b.hashes.assign(hashes_.begin(), hashes_.end());
  b.pubs.swap(pubs_);
  b.maxlen = options_.stream_maxlen;
  b.backlog = outbox_.size();
  return b;
}

void ReportPublisher::Flush() {
  if (in_flight_ || (outbox_.empty() && hashes_.empty() && pubs_.empty())) return;
  Batch batch = TakeBatch(options_.flush_batch);
  in_flight_ = true;
  in_flight_seq_ = batch.entries.empty() ? 0 : batch.entries.back().seq;
  auto job = [this, alive = alive_, batch = std::move(batch)](redis::RedisConnection& c) {
    FlushResult r = Write(c, batch);
    boost::asio::post(io_, [this, alive, r = std::move(r)]() mutable {
      if (*alive) OnFlushed(std::move(r));
    });
  };
  if (!worker_.Submit(std::move(job))) in_flight_ = false;
}

void ReportPublisher::FlushSoon() {
  if (in_flight_) {
    flush_soon_ = true;
    return;
  }
  Flush();
}

std::size_t ReportPublisher::FinalFlush(std::chrono::milliseconds budget) {
  if (outbox_.empty() && hashes_.empty() && pubs_.empty()) return 0;
  Batch batch = TakeBatch(outbox_.size());
  const std::size_t n = batch.entries.size();
  auto done = std::make_shared<std::promise<std::size_t>>();
  std::future<std::size_t> written = done->get_future();
  auto job = [done, batch = std::move(batch)](redis::RedisConnection& c) {
    const FlushResult r = Write(c, batch);
    std::size_t count = 0;
    for (const OutEntry& e : batch.entries) count += e.seq <= r.confirmed_seq ? 1 : 0;
    done->set_value(count);
  };
  if (!worker_.Submit(std::move(job))) return n;
  if (written.wait_for(budget) != std::future_status::ready) return n;
  return n - written.get();
}

void ReportPublisher::OnFlushed(FlushResult r) {
  in_flight_ = false;
  in_flight_seq_ = 0;
  if (r.confirmed_seq != 0) outbox_.ConfirmThrough(r.confirmed_seq);
  for (const auto& [key, version] : r.hashes_written) {
    const auto it = hashes_.find(key);
    if (it != hashes_.end() && it->second.version == version) hashes_.erase(it);
  }
  for (const Refusal& f : r.refused) refusals_.Refused(f.command, f.key, f.error);
  if (r.ok && r.refused.empty()) refusals_.Accepted();
  // Catch up: more queued and Redis answered (or an ack is waiting): flush again now rather than
  // next period. A failed flush leaves the retry to the period (Redis is away).
  const bool soon = std::exchange(flush_soon_, false);
  if (r.ok && r.status.ok() && !outbox_.empty() && (r.remaining_hint > 0 || soon)) Flush();
}

}  // namespace falcon::agent
