// CommandReader: receives controller commands from falcon:{job}:commands:{host} and, with
// options.broadcast_stream, from falcon:{job}:broadcast (the commands for every agent), both in
// one XREADGROUP through the host's own group (protocol::CommandGroup), on a worker of its own
// ("redis-cmd"), because XREADGROUP ... BLOCK waits. Entry ids handed to on_command are the own
// stream's ids, and "b" + the id for broadcast entries (stream ids are digits: no clash); Done
// takes them back as handed out. Each read job (re)creates the
// consumer groups if Redis lost them (a restarted server), reads this consumer's pending entries
// first (delivered before a crash, never acknowledged), then new ones, and XACKs the entries the
// loop has finished with. Entries come back to the loop as posted events, already validated:
// on_command receives either a Command or the reason the entry was rejected, and then, when
// the entry still names a valid id and a known command type, that identity (so that the loop
// can ack it "rejected").
// The loop must call Done(entry_id) once it has handled an entry (after queuing the ack).
// With options.plan_key, the first successful read also returns the plan in force (one HGETALL;
// its failure only costs the recovery, never the commands).
// A read that failed (a timed-out reply, a dropped connection) may have been delivered to us by
// the server all the same: the next read takes our pending entries again, skipping those the
// loop already has (handed out, not yet Done), so no command is lost and none runs twice.
// A command Redis refuses (XGROUP, XACK, XREADGROUP: NOPERM, NOAUTH, WRONGTYPE...; AUTH or PING
// at connect) is a warning through a RefusalLog, once per distinct command and error; the read
// is retried every retry_ms as after any failure.
// Thread-safety: public methods on the loop thread only; the worker runs job closures only.
// Invariants: at most one read job in flight; after a failed read the next waits retry_ms.
// Must never: block the loop; execute anything itself.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/logger.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/agent/refusal_log.h"
#include "daemon/protocol/messages.h"
#include "daemon/redis/redis_worker.h"

namespace falcon::agent {

struct CommandReaderOptions {
  std::string stream;    // falcon:{job}:commands:{host}
  std::string broadcast_stream;  // falcon:{job}:broadcast ("" = not read)
  std::string consumer;  // the host; the group is protocol::CommandGroup(consumer)
  int block_ms = 1000;
  int retry_ms = 250;
  std::size_t count = 32;  // entries per read
  // falcon:{job}:plan, read once with the first read (""= not read): the plan in force when the
  // agent starts, for processes that start after it (an agent restart forgets the plans it held).
  std::string plan_key;
};

class CommandReader {
 public:
  using OnCommand =
      std::function<void(const std::string& entry_id, const Result<protocol::Command>& command,
                         const std::optional<protocol::CommandIdentity>& identity)>;

  CommandReader(boost::asio::io_context& io, const redis::RedisOptions& redis,
                CommandReaderOptions options, OnCommand on_command,
                std::shared_ptr<spdlog::logger> log);
  ~CommandReader();

  // Receives the plan hash's message text (unvalidated) when the first read found one.
  void OnPlanInForce(std::function<void(const std::string& text)> fn) { on_plan_ = std::move(fn); }

  void Start();
  void Stop();
  void Done(const std::string& entry_id);
  bool connected() const { return connected_; }

 private:
  struct Entry {
    std::string id;
    Result<protocol::Command> command;
    std::optional<protocol::CommandIdentity> identity;  // only when command failed
  };
  struct ReadResult {
    Status status;
    std::string command;  // the command that failed when !status.ok(): "XGROUP", "XACK", "XREADGROUP"
    std::string key;      // the stream(s) it named
    std::vector<Entry> entries;
    bool pending_phase = false;
    std::optional<std::string> plan_text;  // the plan hash's "msg", read with the pending phase
  };
  void Read();
  void OnRead(ReadResult r);

  boost::asio::io_context& io_;
  CommandReaderOptions options_;
  OnCommand on_command_;
  std::function<void(const std::string&)> on_plan_;
  std::shared_ptr<spdlog::logger> log_;
  RefusalLog refusals_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // before worker_ (captured)
  redis::RedisWorker worker_;
  boost::asio::steady_timer retry_;
  std::vector<std::string> to_ack_;
  bool pending_phase_ = true;  // the first read takes our pending entries ("0"), then new ones
  std::set<std::string> handed_;  // entries passed to on_command, not yet Done
  bool in_flight_ = false;
  bool connected_ = false;
  bool stopped_ = false;
};

}  // namespace falcon::agent
