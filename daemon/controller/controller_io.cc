// Controller, its Redis side: connecting, the persisted state, the job view, the report
// streams, commands out, incidents and alerts out. See controller.h. Every payload read is
// validated against its spec first; a bad one is logged, counted and dropped.
#include <time.h>
#include <unistd.h>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <functional>
#include <optional>

#include "daemon/common/log_escape.h"
#include "daemon/controller/controller.h"
#include "daemon/protocol/keys.h"
#include "daemon/protocol/validate.h"
#include "daemon/redis/redis_commands.h"

namespace falcon::controller {
namespace {

using nlohmann::json;

constexpr std::uint64_t kCommandsMaxLen = 1000;
constexpr std::uint64_t kReadCount = 1000;  // stream entries per XREAD at most
// A rare stream that filled its COUNT is read on at once, without the busy ones, this many more
// times at most (so one turn carries up to 64,000 of its entries).
constexpr int kDrainReads = 63;
// While a round holds the job, a read waits on the rare streams alone and then takes at most this
// many entries of each busy stream. A held job writes little to them, but at 16,384 ranks a full
// page of each (parsed, dispatched and freed before the turn) put 0.1-0.2 s between a step's acks
// and the next step, twice a pause.
constexpr std::uint64_t kHeldBusyCount = 64;

struct StreamSpec {
  const char* name;  // cursor name
  const protocol::KeySpec* key;
  const protocol::MessageSpec* message;
  bool busy = false;  // written by every rank all the time: trimmed behind the reading (TrimStreams);
                      // the others come in bursts and are drained in one turn (StartRead)
};

const StreamSpec kStreams[] = {
    {"alarms", &protocol::kAlarmsStream, &protocol::kAlarm},
    {"profiles", &protocol::kProfilesStream, &protocol::kCommProfile, true},
    {"acks", &protocol::kAcksStream, &protocol::kAck},
    {"iterations", &protocol::kIterationsStream, &protocol::kIterations, true},
    {"requests", &protocol::kRequestsStream, &protocol::kControllerRequest},
    {"stalls", &protocol::kStallsStream, &protocol::kStall},
    {"signatures", &protocol::kSignaturesStream, &protocol::kCallSignatures, true},
};

// Newest entry id of `stream`, "" when it is empty or absent.
Result<std::string> LastEntryId(redis::RedisConnection& c, const std::string& stream) {
  Result<redis::RedisReply> r = c.Command({"XREVRANGE", stream, "+", "-", "COUNT", "1"});
  if (!r.ok()) return r.status();
  const redis::RedisReply& rep = r.value();
  if (rep.type != redis::RedisReply::Type::kArray) return Status::Corrupt("unexpected XREVRANGE reply");
  if (rep.elements.empty()) return std::string();
  if (rep.elements[0].type != redis::RedisReply::Type::kArray || rep.elements[0].elements.empty()) {
    return Status::Corrupt("unexpected XREVRANGE entry");
  }
  return rep.elements[0].elements[0].str;
}

}  // namespace

std::string Controller::Key(const protocol::KeySpec& spec, const std::string& host) const {
  Result<std::string> k = protocol::FormatKey(spec, {config_.job, host, std::nullopt});
  return k.ok() ? k.value() : std::string();  // job and host names are checked at start
}

bool Controller::EnsureConnected(std::int64_t now_ns) {
  if (conn_ && conn_->connected()) return true;
  if (now_ns < next_connect_ns_) return false;
  if (!conn_) conn_ = std::make_unique<redis::RedisConnection>(config_.redis);
  Status s = conn_->Connect();
  if (s.ok() && !state_loaded_) s = LoadState(now_ns);
  if (s.ok()) s = CheckCursors();
  if (!s.ok()) {
    backoff_ms_ = std::clamp(backoff_ms_ * 2, config_.redis.backoff_min_ms, config_.redis.backoff_max_ms);
    next_connect_ns_ = now_ns + std::int64_t{backoff_ms_} * 1'000'000;
    log_->warn("event=redis_unavailable server={} retry_ms={} error={}", daemon::LogQuoted(config_.redis.Describe()),
               backoff_ms_, daemon::LogQuoted(s.message()));
    conn_->Close();
    return false;
  }
  backoff_ms_ = 0;
  log_->info("event=redis_connected server={}", daemon::LogQuoted(config_.redis.Describe()));
  validation_.Abandon();  // a validation interrupted by the outage is released and redone by Advance()
  next_view_ns_ = 0;
  ++read_generation_;  // CheckCursors may have moved the cursors a read in flight started from
  dirty_ = true;
  slow_written_version_ = 0;  // a Redis restarted without persistence lost them: written again
  return true;
}

Status Controller::LoadState(std::int64_t now_ns) {
  Result<std::map<std::string, std::string>> h = redis::HGetAll(*conn_, Key(protocol::kControllerKey));
  if (!h.ok()) return h.status();
  auto msg = h.value().find(std::string(protocol::kPayloadField));
  bool fresh = msg == h.value().end();
  if (!fresh) {
    Result<json> m = protocol::ParseMessage(msg->second, protocol::kControllerState);
    std::string why = m.ok() ? "" : m.status().message();
    if (m.ok()) {
      const json& doc = m.value()["state_doc"];
      state_ = StateFromJson(doc, &why);
      // The slow ranks are the hash's own field, unless an older controller wrote the document
      // (it holds them itself then). An unreadable field costs no slow rank: the alarms are read
      // again from the stream's start, a rank's last report winning, as a fresh start does. Read
      // even when the document is not: its cursors are kept then, and so are these.
      auto slow = h.value().find(std::string(protocol::kControllerSlowField));
      if (!(doc.is_object() && doc.contains("slow")) && slow != h.value().end()) {
        try {
          state_.slow = SlowFromJson(json::parse(slow->second));
        } catch (const std::exception& e) {
          log_->error("event=state_unreadable part=slow action=replay_alarms error={}", daemon::LogQuoted(e.what()));
          state_.slow.clear();
          state_.cursors["alarms"] = "0-0";
        }
      }
      tracking_.Reload();  // its slow-rank map is state_'s
    }
    if (!why.empty()) log_->error("event=state_unreadable action=start_fresh error={}", daemon::LogQuoted(why));
    fresh = !m.ok();
    if (m.ok()) {
      log_->info("event=state_loaded phase={} incident={} incidents={}", PhaseName(state_.phase),
                 state_.incident ? daemon::LogValue(state_.incident->id) : "-", state_.incidents);
    }
  }
  if (fresh) {
    state_.since_ns = now_ns;
    // Start at each stream's end, except alarms and stalls: replaying them rebuilds which ranks
    // are slow or stalled now (a rank's last report wins; ranks whose registration says healthy,
    // or whose process is gone, are dropped later).
    for (const StreamSpec& s : kStreams) {
      if (state_.cursors.count(s.name)) continue;
      Result<std::string> last = LastEntryId(*conn_, Key(*s.key));
      if (!last.ok() && last.status().code() == Status::Code::kInvalidArgument) continue;  // ProbeStreams sets it aside
      if (!last.ok()) return last.status();
      // Requests made before this controller ever ran are stale: they start at the end too.
      const std::string name = s.name;
      state_.cursors[s.name] = name == "alarms" || name == "stalls" || last.value().empty() ? "0-0" : last.value();
    }
  }
  // A validation our predecessor left is redone by Advance() (release first, then a new cut)
  // once the view is read.
  if (state_.phase == Phase::kProfiling) profiling_.AssumeMode("profile");
  state_loaded_ = true;
  return Status::Ok();
}

// A cursor past a stream's newest entry means Redis lost data (restarted without persistence):
// read that stream from its beginning again.
Status Controller::CheckCursors() {
  for (const StreamSpec& s : kStreams) {
    std::string& cursor = state_.cursors[s.name];
    if (cursor.empty()) cursor = "0-0";
    Result<std::string> last = LastEntryId(*conn_, Key(*s.key));
    if (!last.ok() && last.status().code() == Status::Code::kInvalidArgument) continue;  // ProbeStreams sets it aside
    if (!last.ok()) return last.status();
    if (cursor != "0-0" && (last.value().empty() || StreamIdLess(last.value(), cursor))) {
      log_->warn("event=cursor_reset stream={} cursor={} newest={}", s.name, daemon::LogValue(cursor),
                 last.value().empty() ? "-" : daemon::LogValue(last.value()));
      cursor = "0-0";
    }
  }
  return Status::Ok();
}

Status Controller::SaveState(std::int64_t now_ns) {
  json m = {{"v", protocol::kSchemaVersion}, {"type", protocol::kControllerState.type},
            {"job", config_.job},            {"at_ns", now_ns},
            {"pid", static_cast<std::int64_t>(getpid())},
            {"host", config_.host},          {"version", kControllerVersion},
            {"started_ns", started_ns_},      {"state", PhaseName(state_.phase)},
            {"since_ns", state_.since_ns},   {"ranks", view_.ranks().size()},
            {"agents", view_.agents().size()}, {"mode", profiling_.mode()},
            {"slow_ranks", LiveSlow()},      {"incidents", state_.incidents},
            {"state_doc", ToJson(state_, /*with_slow=*/false)}};
  if (const std::optional<double> cur = CurrentIterationS()) m["current_s"] = *cur;
  const std::optional<double> healthy = state_.incident ? std::optional(state_.incident->healthy_s) : state_.healthy_s;
  if (healthy && *healthy > 0) m["healthy_s"] = *healthy;
  if (const auto p = view_.Period()) m["period"] = *p;
  if (state_.incident) m["incident"] = state_.incident->id;
  if (state_.incident && state_.incident->mitigation.is_object()) {
    m["strategy"] = state_.incident->mitigation.value("applied", json::array()).empty()
                        ? json("S1")
                        : state_.incident->mitigation["applied"].back();
  }
  if (state_.plan_version > 0) m["plan_version"] = state_.plan_version;
  m["mitigation"] = config_.mitigation.mode;
  if (Status s = protocol::ValidateMessage(m, protocol::kControllerState); !s.ok()) {
    return Status::Internal("controller_state would be invalid: " + s.message());
  }
  dirty_ = false;
  next_save_ns_ = now_ns + std::int64_t{config_.heartbeat_ms} * 1'000'000;
  redis::FieldList fields = {{std::string(protocol::kPayloadField), m.dump()},
                             {"state", PhaseName(state_.phase)},
                             {"incident", state_.incident ? state_.incident->id : ""},
                             {"pid", std::to_string(getpid())}};
  // The slow ranks go in their own field, only when an alarm changed them: during an outbreak at
  // 16,384 ranks they are 1.5 MB, and the document is written every heartbeat. The same HSET
  // writes both, so a reader never sees a document and slow ranks from different writes.
  const std::uint64_t slow_version = tracking_.slow_version();
  if (slow_written_version_ != slow_version) {
    fields.emplace_back(std::string(protocol::kControllerSlowField), SlowJson(state_.slow).dump());
  }
  Status s = redis::HSet(*conn_, Key(protocol::kControllerKey), std::move(fields));
  if (s.ok()) slow_written_version_ = slow_version;
  if (s.ok()) saved_cursors_ = state_.cursors;
  return s;
}

// The agents cap each report stream at stream_maxlen messages whatever the job's size: a small
// job's signatures stream then holds minutes of reports nobody reads again, and a hundred small
// jobs on one Redis hold gigabytes (docs/scale.md). Once read, an entry is only history, so the
// busy streams are trimmed behind this controller's reading: what stays is every entry after
// the cursors of the last state written (a restarted controller reads on from there) and
// stream-retention-s before them, for people and tools reading the recent past. The cut is an
// entry id on Redis's own clock (the cursor's), so no host's clock skews it. Housekeeping: a
// failure is logged and tried again later, never a failed turn.
void Controller::TrimStreams(std::int64_t now_ns) {
  const auto retention_ms = static_cast<std::int64_t>(config_.stream_retention_s * 1000);
  next_trim_ns_ = now_ns + std::clamp<std::int64_t>(retention_ms / 4, 1000, 10'000) * 1'000'000;
  std::vector<std::vector<std::string>> commands;
  std::vector<const char*> names;
  for (const StreamSpec& s : kStreams) {
    if (!s.busy || unreadable_.count(s.name)) continue;
    auto c = saved_cursors_.find(s.name);
    if (c == saved_cursors_.end()) continue;
    const std::optional<std::uint64_t> ms = StreamIdMs(c->second);
    if (!ms || *ms > static_cast<std::uint64_t>(INT64_MAX)) continue;
    const std::int64_t cut_ms = static_cast<std::int64_t>(*ms) - retention_ms;
    if (cut_ms <= 0) continue;  // "0-0", or nothing older than the retention yet
    commands.push_back({"XTRIM", Key(*s.key), "MINID", "~", std::to_string(cut_ms) + "-0"});
    names.push_back(s.name);
  }
  if (commands.empty()) return;
  Result<std::vector<redis::RedisReply>> r = conn_->Pipeline(commands);
  if (!r.ok()) {
    log_->debug("event=stream_trim_failed error={}", daemon::LogQuoted(r.status().message()));
    return;
  }
  for (std::size_t i = 0; i < r.value().size() && i < names.size(); ++i) {
    const redis::RedisReply& reply = r.value()[i];
    if (reply.type == redis::RedisReply::Type::kInteger) {
      trimmed_total_ += static_cast<std::uint64_t>(std::max<std::int64_t>(0, reply.integer));
    } else if (reply.type == redis::RedisReply::Type::kError && reply.str.find("WRONGTYPE") == std::string::npos) {
      // A server without MINID (Redis before 6.2) or an ACL without XTRIM: the agents' cap alone.
      trim_refused_ = true;
      log_->warn("event=stream_trim_refused stream={} error={} action=stream_maxlen_only", names[i],
                 daemon::LogQuoted(reply.str));
      return;
    }
  }
}

// Reads the keys of `spec` (SCAN, then HGETALL in pipelined pages) whose SCANned name `wanted`
// accepts, and hands each valid payload to `take`; keys Redis refused go to `seen_bad`.
Status Controller::ReadViewKeys(const protocol::KeySpec& spec, const protocol::MessageSpec& msg,
                                const std::function<bool(const std::string&)>& wanted,
                                const std::function<void(json)>& take, std::set<std::string>& seen_bad,
                                std::vector<std::string>* scanned) {
  Result<std::string> pattern = protocol::KeyMatchPattern(spec, {config_.job, {}, std::nullopt});
  if (!pattern.ok()) return pattern.status();
  Result<std::vector<std::string>> all = redis::ScanKeys(*conn_, pattern.value());
  if (!all.ok()) return all.status();
  std::vector<std::string> keys;
  for (const std::string& key : all.value()) {
    if (wanted(key)) keys.push_back(key);
  }
  if (scanned != nullptr) *scanned = std::move(all).value();
  // One round trip per kPipelineKeys keys: at 16,384 ranks a key at a time took the turn.
  Result<std::vector<Result<std::map<std::string, std::string>>>> hashes = redis::HGetAllMany(*conn_, keys);
  if (!hashes.ok()) return hashes.status();
  view_keys_ += keys.size();
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const std::string& key = keys[k];
    Result<std::map<std::string, std::string>>& h = hashes.value()[k];
    if (!h.ok() && h.status().code() != Status::Code::kInvalidArgument) return h.status();
    if (!h.ok()) {  // Redis refused this key (not a hash): skip it, the others still count
      seen_bad.insert(key);
      if (bad_keys_.insert(key).second) {
        log_->warn("event=bad_key key={} action=skipped error={}", daemon::LogValue(key),
                   daemon::LogQuoted(h.status().message()));
      }
      continue;
    }
    auto text = h.value().find(std::string(protocol::kPayloadField));
    if (text == h.value().end()) continue;  // expired between SCAN and HGETALL
    Result<json> m = protocol::ParseMessage(text->second, msg);
    if (!m.ok()) {
      ++dropped_messages_;
      log_->warn("event=bad_message key={} error={}", daemon::LogValue(key), daemon::LogQuoted(m.status().message()));
      continue;
    }
    take(std::move(m.value()));
  }
  return Status::Ok();
}

namespace {

// The rank a rank key's name gives (its last part), nullopt if it gives none.
std::optional<std::int64_t> RankOfKey(const std::string& key) {
  const std::size_t colon = key.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  std::int64_t rank = -1;
  const char* end = key.data() + key.size();
  auto [p, ec] = std::from_chars(key.data() + colon + 1, end, rank);
  if (ec != std::errc() || p != end || rank < 0) return std::nullopt;
  return rank;
}

}  // namespace

// The agent keys every time; a rank key only when no beat in them goes with the content held
// for it (rank_key_cache.h): at 32,768 ranks that is a few hundred keys a re-read, not 32,768.
Status Controller::RefreshView() {
  std::vector<json> agents;
  std::set<std::string> seen_bad;  // keys Redis refused in this scan
  view_keys_ = 0;
  Status s = ReadViewKeys(
      protocol::kAgentKey, protocol::kAgentHeartbeat, [](const std::string&) { return true; },
      [&](json m) { agents.push_back(std::move(m)); }, seen_bad, nullptr);
  if (!s.ok()) return s;
  rank_keys_.SetAgents(agents);
  std::vector<std::string> rank_keys;
  s = ReadViewKeys(
      protocol::kRankKey, protocol::kRankRegister,
      [&](const std::string& key) { return rank_keys_.NeedsFetch(RankOfKey(key)); },
      [&](json m) { rank_keys_.Fetched(m); }, seen_bad, &rank_keys);
  if (!s.ok()) {
    rank_keys_.Abandon();
    return s;
  }
  std::vector<std::int64_t> ranks_with_keys;
  for (const std::string& key : rank_keys) {
    if (const std::optional<std::int64_t> r = RankOfKey(key)) ranks_with_keys.push_back(*r);
  }
  std::vector<RankEntry> ranks = rank_keys_.Registrations(ranks_with_keys);
  view_keys_ = std::max(view_keys_, agents.size() + ranks.size());  // fetched or held, each rank counts
  for (auto it = bad_keys_.begin(); it != bad_keys_.end();) {
    if (seen_bad.count(*it)) {
      ++it;
      continue;
    }
    log_->info("event=bad_key_cleared key={}", daemon::LogValue(*it));  // readable again, or gone
    it = bad_keys_.erase(it);
  }
  view_.UpdateEntries(std::move(ranks), agents);
  for (const RankClaimEvent& e : view_.TakeClaimEvents()) {
    if (e.kind == RankClaimEvent::Kind::kConflict) {
      log_->warn("event=rank_claim_conflict rank={} holder_host={} holder_pid={} claimant_host={} claimant_pid={} "
                 "action=kept_holder",
                 e.rank, daemon::LogValue(e.holder_host), e.holder_pid, daemon::LogValue(e.claimant_host),
                 e.claimant_pid);
    } else {
      log_->warn("event=rank_claim_handover rank={} from_host={} from_pid={} to_host={} to_pid={} reason={}", e.rank,
                 daemon::LogValue(e.holder_host), e.holder_pid, daemon::LogValue(e.claimant_host), e.claimant_pid,
                 "holder_silent");
    }
  }
  if (!state_.node_hosts.empty()) view_.SetNodes(state_.node_hosts, state_.placement);
  return Status::Ok();
}

Status Controller::ProbeStreams(std::int64_t now_ns, bool all) {
  for (const StreamSpec& s : kStreams) {
    auto bad = unreadable_.find(s.name);
    if (!all && (bad == unreadable_.end() || !bad->second.Due(now_ns))) continue;
    Result<redis::RedisReply> type = conn_->Command({"TYPE", Key(*s.key)});
    if (!type.ok()) return type.status();
    const std::string& t = type.value().str;
    if (t == "stream" || t == "none") {
      if (bad != unreadable_.end()) {
        log_->info("event=stream_readable stream={}", s.name);
        unreadable_.erase(bad);
      }
      continue;
    }
    if (bad == unreadable_.end()) {
      bad = unreadable_.emplace(s.name, RefusedRetry{}).first;
      log_->warn("event=stream_unreadable stream={} key={} type={} action=skipped retry_max_ms={}", s.name,
                 daemon::LogValue(Key(*s.key)), daemon::LogValue(t), RefusedRetry::kMaxMs);
    }
    bad->second.Refused(now_ns);
  }
  return Status::Ok();
}

void Controller::StartRead() {
  if (read_in_flight_ || !reader_) return;
  std::vector<std::pair<std::string, std::string>> streams;  // key, cursor
  std::vector<const StreamSpec*> specs;
  for (const StreamSpec& s : kStreams) {
    if (unreadable_.count(s.name)) continue;
    streams.emplace_back(Key(*s.key), state_.cursors[s.name]);
    specs.push_back(&s);
  }
  if (streams.empty()) return;  // nothing readable: the turns keep the pace without Redis
  const std::uint64_t generation = read_generation_;
  const bool held = validation_.holding();
  auto job = [this, streams = std::move(streams), specs = std::move(specs), generation, held,
              block_ms = config_.tick_ms](redis::RedisConnection& c) {
    ReadOutcome out;
    std::vector<bool> drain;
    for (const StreamSpec* spec : specs) drain.push_back(!spec->busy);
    // A wave of acks (one per agent host: 2,048 at 16,384 ranks) or of alarms outgrows one
    // COUNT: the rare streams are read on at once, so a validation step waits one turn for its
    // acks, not one per thousand hosts, each beside a thousand entries of every busy stream (a
    // step's acks took a second to come in at 16,384 ranks). While a round holds the job, the
    // read waits for the rare streams and then takes a short page of the busy ones.
    Result<std::vector<redis::StreamRead>> r =
        held ? redis::XReadMarkedFirst(c, streams, drain, kReadCount, block_ms, kDrainReads, kHeldBusyCount)
             : redis::XReadDrained(c, streams, drain, kReadCount, block_ms, kDrainReads);
    out.status = r.status();
    if (r.ok()) {
      for (const StreamSpec* spec : specs) out.streams.push_back(spec->name);
      for (const redis::StreamRead& read : r.value()) {
        const StreamSpec* spec = nullptr;
        for (std::size_t i = 0; i < streams.size(); ++i) {
          if (streams[i].first == read.stream) spec = specs[i];
        }
        if (spec == nullptr) continue;
        const std::uint64_t page =
            spec->busy ? (held ? kHeldBusyCount : kReadCount) : kReadCount * (kDrainReads + 1);
        if (!read.entries.empty() && read.entries.size() >= page) out.behind[spec->name] = read.entries.back().id;
        for (const redis::StreamEntry& e : read.entries) {
          // An agent packs the messages of one flush into one entry: one msg field each.
          const std::vector<const std::string*> texts = e.Values(std::string(protocol::kPayloadField));
          if (texts.empty()) out.entries.push_back({spec->name, e.id, Status::InvalidArgument("no msg field")});
          for (const std::string* text : texts) {
            out.entries.push_back({spec->name, e.id, protocol::ParseMessage(*text, *spec->message)});
          }
        }
      }
    }
    boost::asio::post(io_, [this, out = std::move(out), generation]() mutable { OnRead(std::move(out), generation); });
  };
  read_in_flight_ = reader_->Submit(std::move(job));
}

void Controller::OnRead(ReadOutcome r, std::uint64_t generation) {
  read_in_flight_ = false;
  if (generation != read_generation_) {  // read before a reconnect: its cursors may be stale
    ScheduleTurn(0);
    return;
  }
  if (!r.status.ok()) {
    if (r.status.code() == Status::Code::kInvalidArgument && conn_ && conn_->connected()) {
      // Redis refused the read (a key of the wrong type): find the culprits and set them aside.
      const std::size_t before = unreadable_.size();
      Status probed = ProbeStreams(WallNs(), true);
      if (probed.ok() && unreadable_.size() > before) {
        ScheduleTurn(0);
        return;
      }
      if (!probed.ok()) r.status = probed;
    }
    Failed(r.status);
    return;
  }
  const std::int64_t now = WallNs();
  for (StreamMessage& e : r.entries) {
    state_.cursors[e.stream] = e.id;
    dirty_ = true;
    Dispatch(e, now);
  }
  NoteLag(r, now);
  if (step_failures_ == 0) Turn();  // at once; after failures the backoff's turn comes first
}

void Controller::NoteLag(const ReadOutcome& r, std::int64_t now_ns) {
  for (const char* name : r.streams) {
    double lag = 0;
    if (auto b = r.behind.find(name); b != r.behind.end()) {
      if (const std::optional<std::uint64_t> ms = StreamIdMs(b->second)) {
        lag = std::max(0.0, static_cast<double>(now_ns / 1'000'000 - static_cast<std::int64_t>(*ms)) / 1e3);
      }
    }
    stream_lag_s_[name] = lag;
    if (lag > kLagWarnS && lagging_.insert(name).second) {
      log_->warn("event=stream_lagging stream={} lag_s={:.1f} read_count={}", name, lag, kReadCount);
    } else if (lag < kLagClearS && lagging_.erase(name) > 0) {
      log_->info("event=stream_caught_up stream={}", name);
    }
  }
}

void Controller::Dispatch(StreamMessage& e, std::int64_t now_ns) {
  if (!e.message.ok()) {
    ++dropped_messages_;
    log_->warn("event=bad_message stream={} id={} error={}", e.stream, daemon::LogValue(e.id),
               daemon::LogQuoted(e.message.status().message()));
    return;
  }
  json& m = e.message.value();
  const std::string name = e.stream;
  if (name == "alarms") OnAlarm(m);
  else if (name == "profiles") OnProfile(m);
  else if (name == "acks") OnAck(std::move(m));
  else if (name == "requests") OnRequest(m);
  else if (name == "stalls") hang_.OnStall(m);
  else if (name == "signatures") mismatch_.OnSignatures(m, now_ns);
  else OnIterations(m);
}

Status Controller::Send(const std::vector<OutgoingCommand>& commands) {
  // Every command is checked before any is sent; then they go in pipelined rounds (a validation
  // step at 16,384 ranks is 16,384 commands: one round trip each took seconds).
  std::vector<std::vector<std::string>> xadds;
  for (const OutgoingCommand& c : commands) {
    const json j = protocol::ToJson(c.command);
    const protocol::MessageSpec* spec = protocol::FindCommand(c.command.type);
    if (spec == nullptr) return Status::Internal("unknown command type " + c.command.type);
    if (Status s = protocol::ValidateMessage(j, *spec); !s.ok()) {
      return Status::Internal("the " + c.command.type + " command would be invalid: " + s.message());
    }
    // Host "": every agent at once, through the broadcast stream (one entry for thousands).
    const std::string key = c.host.empty() ? Key(protocol::kBroadcastStream) : Key(protocol::kCommandsStream, c.host);
    xadds.push_back(redis::XAddArgs(key, kCommandsMaxLen,
                                    {{std::string(protocol::kPayloadField), j.dump()}}));
  }
  Result<std::vector<redis::RedisReply>> replies = redis::PipelineInRounds(*conn_, xadds);
  if (!replies.ok()) return replies.status();
  for (std::size_t i = 0; i < commands.size(); ++i) {
    const redis::RedisReply& r = replies.value()[i];
    if (r.type == redis::RedisReply::Type::kError) return redis::ErrorReplyStatus(r.str);
    log_->debug("event=command id={} type={} host={}", daemon::LogValue(commands[i].command.id),
                daemon::LogValue(commands[i].command.type),
                daemon::LogValue(commands[i].host.empty() ? std::string("*") : commands[i].host));
  }
  return Status::Ok();
}

Status Controller::WritePlan(const json& m, const std::string& strategy) {
  if (Status s = protocol::ValidateMessage(m, protocol::kMitigationPlan); !s.ok()) {
    return Status::Internal("plan would be invalid: " + s.message());
  }
  return redis::HSet(*conn_, Key(protocol::kPlanKey),
                     {{std::string(protocol::kPayloadField), m.dump()},
                      {"plan_version", std::to_string(m["plan_version"].get<std::int64_t>())},
                      {"strategy", strategy},
                      {"mode", m["mode"].get<std::string>()}});
}

Result<json> Controller::IncidentEntry(const std::string& stage, const std::string& summary, json fields) const {
  json m = std::move(fields);
  m["v"] = protocol::kSchemaVersion;
  m["type"] = protocol::kIncident.type;
  if (!m.contains("id")) m["id"] = state_.incident ? state_.incident->id : "none";  // else a hang episode's
  m["job"] = config_.job;
  m["stage"] = stage;
  // The summary is one line for people; one too long for the protocol (a list of thousands of
  // hosts) must not cost the entry itself: it is cut.
  m["summary"] = protocol::FitText(summary, static_cast<std::size_t>(protocol::kMaxText));
  if (Status s = protocol::ValidateMessage(m, protocol::kIncident); !s.ok()) {
    return Status::Internal("incident would be invalid: " + s.message());
  }
  return m;
}

Status Controller::Record(const std::string& stage, const std::string& summary, json fields,
                          const char* severity) {
  const std::int64_t now = fields.value("at_ns", std::int64_t{0});
  Result<json> entry = IncidentEntry(stage, summary, std::move(fields));
  if (!entry.ok()) return entry.status();
  const json& m = entry.value();
  Result<std::string> id = redis::XAdd(*conn_, Key(protocol::kIncidentsStream),
                                       static_cast<std::uint64_t>(config_.incidents_maxlen),
                                       {{std::string(protocol::kPayloadField), m.dump()}});
  if (!id.ok()) return id.status();
  protocol::Alert a;
  a.job = config_.job;
  a.at_ns = now;
  a.severity = severity;
  a.source = "controller";
  a.summary = m["summary"].get<std::string>();  // as cut for the entry
  a.incident = m["id"].get<std::string>();
  Result<std::int64_t> p = redis::Publish(*conn_, Key(protocol::kAlertsChannel), protocol::ToJson(a).dump());
  if (!p.ok()) return p.status();
  ++counted_.entries[stage];  // written (the alert too): what /metrics counts
  if (stage == "localisation" && m.contains("detail") && m["detail"].is_object()) {
    const json& d = m["detail"];
    for (const auto& [field, cause] : {std::pair{"gpus", "compute"}, {"links", "link"}, {"nics", "nic"}}) {
      if (d.contains(field) && d[field].is_array()) counted_.culprits[cause] += d[field].size();
    }
    if (d.contains("validation")) {
      const json& v = d["validation"];
      ++counted_.rounds;
      if (v.is_object() && v.contains("pause_s") && v["pause_s"].is_number()) {
        counted_.last_pause_seconds = v["pause_s"].get<double>();
      }
    }
  }
  log_->warn("event=incident id={} stage={} summary={}", daemon::LogValue(m["id"].get<std::string>()),
             daemon::LogValue(stage), daemon::LogQuoted(summary));
  return Status::Ok();
}

void Controller::OnAlarm(const json& m) {
  if (const std::optional<SlowRank> slow = tracking_.OnAlarm(m)) {
    const std::int64_t rank = m["rank"].get<std::int64_t>();
    const std::int64_t onset = slow->onset_ns;
    // A slowdown that began after the incident's last round is news (the incident may have been
    // a false alarm, and a real fail-slow started since): it earns the incident fresh rounds.
    if (state_.incident && !state_.incident->localised && onset > state_.incident->last_round_ns &&
        state_.incident->last_round_ns > 0 && state_.incident->attempts > 0) {
      log_->info("event=new_slowdown rank={} incident={} action=allow_new_rounds", rank,
                 daemon::LogValue(state_.incident->id));
      state_.incident->attempts = 0;
      state_.incident->next_attempt_ns = 0;
    } else if (state_.incident && state_.incident->localised && state_.incident->mitigation.is_object() &&
               onset > state_.incident->last_round_ns && state_.incident->last_round_ns > 0 &&
               !state_.incident->revalidate && !CoveredByTheRound(onset)) {
      // Slower again while a mitigation runs: another fault may have begun (or the mitigation
      // stopped helping). Look again before paying for the next strategy -- but only when the
      // job is slower than it has been since the last round: a round's pause and a plan's
      // change shift the ranks' series too, and an alarm about that is no news; nor is one about
      // a slowdown that the round under way measures (CoveredByTheRound).
      Incident& inc = *state_.incident;
      const double level = slow->level_s;
      const double best = inc.best_since_round_s;
      const bool slower = best <= 0 || level > config_.suspicious_ratio * best;
      log_->info("event=new_slowdown rank={} incident={} level_s={:.4f} best_since_round_s={:.4f} action={}", rank,
                 daemon::LogValue(inc.id), level, best, slower ? "revalidate" : "none");
      inc.revalidate = slower;
    }
  }
}

// A round under way measures the job from its validation on: a slowdown that began before the
// validation started (while profiling, or earlier) is in its measurements, so the other ranks'
// alarms about the slowdown that started the round do not ask for a second one.
bool Controller::CoveredByTheRound(std::int64_t onset_ns) const {
  switch (state_.phase) {
    case Phase::kTracking: return false;
    case Phase::kProfiling: return true;
    case Phase::kValidating: return onset_ns <= state_.since_ns;
  }
  return false;
}

void Controller::OnProfile(const json& m) { profiling_.OnProfile(m); }

void Controller::OnAck(json m) {
  if (hang_.OnAck(m)) return;
  if (profiling_.OnAck(m, &state_.profile_from_ns)) return;
  validation_.OnAck(std::move(m));
}

void Controller::OnRequest(const json& m) {
  log_->info("event=request id={} action={} by={}", daemon::LogValue(m["id"].get<std::string>()),
             daemon::LogValue(m["action"].get<std::string>()), daemon::LogValue(m.value("by", "-")));
  requests_.push_back(m);
}

void Controller::OnIterations(const json& m) { tracking_.OnIterations(m); }

}  // namespace falcon::controller
