// ReportPublisher: how the agent loop writes to Redis without ever blocking on it.
//
// Stream entries (Queue) go to the bounded Outbox and stay there until Redis confirms them, so
// nothing queued is lost while Redis is down unless the outbox overflows (oldest dropped,
// counted). Hash state (SetHash: rank/agent keys with a TTL) keeps only the latest value per key
// and is re-sent by the next heartbeat anyway. Pub/sub messages (Publish) are live only: sent
// with the next flush or dropped if that flush fails. Flush() hands one batch at a time to the
// "redis-pub" RedisWorker as a pipeline; the result comes back to the loop as a posted event.
// While a backlog remains after a successful flush, the next flush is posted at once (catch up).
// FlushSoon() is for entries someone waits on (command acks): flushed now, or right after the
// flush in flight returns, instead of at the next period.
// Commands Redis refuses (an error reply to HSET, EXPIRE, PUBLISH or XADD; AUTH or, without a
// password, PING refused at connect) are warnings through a RefusalLog: once per distinct
// command and error, naming them, however often the flush retries.
// Thread-safety: every method runs on the loop thread; the worker only runs the job closure,
// which owns copies of its data and posts its result back.
// Invariants:
//  1. At most one flush is in flight (in_flight_).
//  2. Outbox entries are removed only when Redis acknowledged them (ConfirmThrough).
// Must never: block the loop, or touch loop state from the worker thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/agent/outbox.h"
#include "daemon/agent/refusal_log.h"
#include "daemon/redis/redis_commands.h"
#include "daemon/redis/redis_worker.h"

namespace falcon::agent {

struct PublisherOptions {
  std::uint64_t stream_maxlen = 100000;
  std::size_t outbox_max = 100000;
  std::size_t flush_batch = 512;
};

class ReportPublisher {
 public:
  ReportPublisher(boost::asio::io_context& io, const redis::RedisOptions& redis,
                  const PublisherOptions& options, std::shared_ptr<spdlog::logger> log);
  ~ReportPublisher();

  void Start();
  void Stop();  // joins the worker; queued data is dropped

  // `packable`: the message may share one stream entry (one `msg` field each) with the packable
  // messages queued next to it for the same stream — a node's ranks' reports of one flush in one
  // XADD, up to protocol::kPackMessages messages and kPackBytes bytes an entry (docs/protocol.md).
  void Queue(const std::string& stream, const nlohmann::json& message, bool packable = false);
  // The same, for a message already written as JSON text (protocol::Dump).
  void Queue(const std::string& stream, std::string message_text, bool packable = false);
  void SetHash(const std::string& key, redis::FieldList fields, std::int64_t ttl_s);
  void Publish(const std::string& channel, const nlohmann::json& message);
  void Flush();
  void FlushSoon();
  // Shutdown only, after the loop has stopped: writes everything queued through the worker,
  // waiting up to `budget` (this blocks the calling thread). Returns the entries left unwritten.
  std::size_t FinalFlush(std::chrono::milliseconds budget);

  bool connected() const { return connected_; }
  std::size_t outbox_size() const { return outbox_.size(); }
  std::uint64_t dropped() const { return outbox_.dropped(); }
  std::uint64_t published() const { return outbox_.confirmed(); }

 private:
  struct HashWrite {
    redis::FieldList fields;
    std::int64_t ttl_s = 0;
    std::uint64_t version = 0;
  };
  struct Refusal {
    std::string command;  // "HSET", "EXPIRE", "PUBLISH", "XADD"
    std::string key;
    std::string error;  // Redis's error reply
  };
  struct FlushResult {
    std::uint64_t confirmed_seq = 0;  // last outbox seq written, 0 if none
    std::vector<Refusal> refused;     // error replies, in pipeline order
    std::map<std::string, std::uint64_t> hashes_written;  // key -> version
    bool ok = false;
    std::size_t remaining_hint = 0;
    Status status;
  };
  struct Batch {
    std::vector<OutEntry> entries;
    std::vector<std::pair<std::string, HashWrite>> hashes;
    std::vector<std::pair<std::string, std::string>> pubs;
    std::uint64_t maxlen = 0;
    std::size_t backlog = 0;
  };
  Batch TakeBatch(std::size_t max_entries);
  // Worker thread: one pipeline with the batch's writes.
  static FlushResult Write(redis::RedisConnection& c, const Batch& b);
  void OnFlushed(FlushResult r);
  void OnState(bool connected, const Status& why);

  boost::asio::io_context& io_;
  PublisherOptions options_;
  std::shared_ptr<spdlog::logger> log_;
  RefusalLog refusals_;
  // Cleared by Stop(): posted callbacks that arrive later do nothing. Declared before worker_,
  // whose callback captures it.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  redis::RedisWorker worker_;
  Outbox outbox_;
  std::map<std::string, HashWrite> hashes_;
  std::vector<std::pair<std::string, std::string>> pubs_;
  std::uint64_t hash_version_ = 0;
  bool flush_soon_ = false;  // FlushSoon() met a flush in flight: flush again when it returns
  bool in_flight_ = false;
  std::uint64_t in_flight_seq_ = 0;  // last outbox seq of the flush in flight
  bool connected_ = false;
};

}  // namespace falcon::agent
