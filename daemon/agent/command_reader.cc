// CommandReader. See command_reader.h for the contract.
#include "daemon/agent/command_reader.h"

#include <boost/asio/post.hpp>

#include <map>

#include "daemon/common/log_escape.h"
#include "daemon/redis/redis_commands.h"
#include "falcon/protocol.h"

namespace falcon::agent {
namespace {
constexpr std::size_t kPendingCount = 10000;
bool IsBroadcastEntry(const std::string& id) { return !id.empty() && id.front() == 'b'; }
// Redis lost the group (NOGROUP), or the stream a read blocked on was deleted (UNBLOCKED).
bool GroupGone(const Status& s) {
  return s.message().find("NOGROUP") != std::string::npos || s.message().find("UNBLOCKED") != std::string::npos;
}
}  // namespace

CommandReader::CommandReader(boost::asio::io_context& io, const redis::RedisOptions& redis,
                             CommandReaderOptions options, OnCommand on_command,
                             std::shared_ptr<spdlog::logger> log)
    : io_(io),
      options_(std::move(options)),
      on_command_(std::move(on_command)),
      log_(std::move(log)),
      refusals_("commands", log_),
      worker_("redis-cmd", redis,
              [this, alive = alive_](bool up, const Status& why) {
                boost::asio::post(io_, [this, alive, up, why] {
                  if (!*alive) return;
                  if (up && !connected_) log_->info("event=redis_up role=commands");
                  if (!up && connected_) {
                    log_->warn("event=redis_down role=commands reason={}", daemon::LogQuoted(why.message()));
                  }
                  if (const std::string refused = redis::RefusedCommand(why); !up && !refused.empty()) {
                    refusals_.Refused(refused, "", why.message());
                  }
                  connected_ = up;
                });
              }),
      retry_(io) {}

CommandReader::~CommandReader() { Stop(); }

void CommandReader::Start() {
  worker_.Start();
  Read();
}

void CommandReader::Stop() {
  stopped_ = true;
  *alive_ = false;
  retry_.cancel();
  worker_.Stop();
}

void CommandReader::Done(const std::string& entry_id) {
  handed_.erase(entry_id);
  to_ack_.push_back(entry_id);
}

void CommandReader::Read() {
  if (stopped_ || in_flight_) return;
  in_flight_ = true;
  std::vector<std::string> acks;
  acks.swap(to_ack_);
  const bool pending = pending_phase_;
  auto job = [this, alive = alive_, acks = std::move(acks), pending,
              o = options_](redis::RedisConnection& c) {
    const std::string group = protocol::CommandGroup(o.consumer);
    ReadResult r;
    r.pending_phase = pending;
    std::vector<std::pair<std::string, std::string>> streams = {{o.stream, pending ? "0" : ">"}};
    if (!o.broadcast_stream.empty()) streams.emplace_back(o.broadcast_stream, pending ? "0" : ">");
    // The groups are made on the first read and after a failed one (a new connection, or a
    // group Redis lost: NOGROUP), not on every read.
    r.command = "XGROUP";
    for (const auto& [stream, id] : streams) {
      if (!pending || !r.status.ok()) break;
      r.status = redis::XGroupCreate(c, stream, group, "$");
      r.key = stream;
    }
    std::vector<std::string> own_acks, broadcast_acks;
    for (const std::string& id : acks) {
      if (IsBroadcastEntry(id)) broadcast_acks.push_back(id.substr(1));
      else own_acks.push_back(id);
    }
    if (r.status.ok()) {
      r.status = redis::XAck(c, o.stream, group, own_acks);
      r.command = "XACK";
      r.key = o.stream;
    }
    if (r.status.ok() && !o.broadcast_stream.empty()) {
      r.status = redis::XAck(c, o.broadcast_stream, group, broadcast_acks);
      r.key = o.broadcast_stream;
    }
    // Pending phase: one non-blocking read of everything delivered to us but never acked.
    Result<std::vector<redis::StreamRead>> read = Status::Unavailable("not read");
    if (r.status.ok()) {
      read = redis::XReadGroup(c, group, o.consumer, streams, pending ? kPendingCount : o.count,
                               pending ? -1 : o.block_ms);
      r.status = read.status();
      r.command = "XREADGROUP";
      r.key = o.broadcast_stream.empty() ? o.stream : o.stream + " " + o.broadcast_stream;
    }
    if (r.status.ok() && pending && !o.plan_key.empty()) {
      Result<std::map<std::string, std::string>> plan = redis::HGetAll(c, o.plan_key);
      if (plan.ok()) {
        auto it = plan.value().find(std::string(protocol::kPayloadField));
        if (it != plan.value().end()) r.plan_text = it->second;
      }
    }
    if (r.status.ok()) {
      for (const redis::StreamRead& s : read.value()) {
        const bool broadcast = s.stream != o.stream;
        for (const redis::StreamEntry& e : s.entries) {
          const std::string id = broadcast ? "b" + e.id : e.id;
          const std::string* msg = e.Field(std::string(protocol::kPayloadField));
          if (msg == nullptr) {
            r.entries.push_back({id, Status::InvalidArgument("entry has no \"msg\" field"), {}});
          } else {
            Entry entry{id, protocol::ParseCommand(*msg), {}};
            if (!entry.command.ok()) entry.identity = protocol::SalvageCommandIdentity(*msg);
            r.entries.push_back(std::move(entry));
          }
        }
      }
    }
    if (!r.status.ok()) {
      // Not acknowledged: give the ids back so the next read retries them.
      for (const std::string& id : acks) r.entries.push_back({id, Status::Unavailable("re-ack"), {}});
    }
    boost::asio::post(io_, [this, alive, r = std::move(r)]() mutable {
      if (*alive) OnRead(std::move(r));
    });
  };
  if (!worker_.Submit(std::move(job))) in_flight_ = false;
}

void CommandReader::OnRead(ReadResult r) {
  in_flight_ = false;
  if (!r.status.ok()) {
    for (const Entry& e : r.entries) to_ack_.push_back(e.id);  // the unacked ids
    if (GroupGone(r.status)) {  // the stream or its group went away (FLUSHALL, DEL): make them again
      log_->info("event=command_group_lost command={} key={} reason={}", r.command, daemon::LogQuoted(r.key),
                 daemon::LogQuoted(r.status.message()));
    } else if (r.status.code() == Status::Code::kInvalidArgument) {  // Redis refused it: retrying will not help
      refusals_.Refused(r.command, r.key, r.status.message());
    } else {
      log_->debug("event=command_read_failed command={} reason={}", r.command, daemon::LogQuoted(r.status.message()));
    }
    pending_phase_ = true;  // the failed read may have been delivered: take our pending ones again
    retry_.expires_after(std::chrono::milliseconds(options_.retry_ms));
    retry_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
      if (!ec && *alive) Read();
    });
    return;
  }
  refusals_.Accepted();
  if (r.pending_phase) pending_phase_ = false;
  if (r.plan_text && on_plan_) on_plan_(*r.plan_text);
  for (const Entry& e : r.entries) {
    if (!handed_.insert(e.id).second) continue;  // re-read from our pending entries: handled already
    on_command_(e.id, e.command, e.identity);
  }
  Read();
}

}  // namespace falcon::agent
