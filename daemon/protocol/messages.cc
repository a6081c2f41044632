// Protocol messages to and from JSON. See messages.h for the contract.
#include "daemon/protocol/messages.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "daemon/protocol/validate.h"
#include "falcon/shm_abi.h"

namespace falcon::protocol {
namespace {

using nlohmann::json;

json Base(const MessageSpec& spec) { return json{{"v", kSchemaVersion}, {"type", spec.type}}; }

json Report(const MessageSpec& spec, const ReportHeader& h) {
  json j = Base(spec);
  j["job"] = h.job;
  j["host"] = h.host;
  j["at_ns"] = h.at_ns;
  return j;
}

template <typename T>
void SetIf(json& j, const char* name, const std::optional<T>& v) {
  if (v) j[name] = *v;
}

}  // namespace

std::string CommIdHex(std::uint64_t id) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

std::optional<std::uint64_t> ParseCommIdHex(std::string_view hex) {
  if (hex.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : hex) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<std::uint64_t>(d);
  }
  return v;
}

json ToJson(const RankRegistration& m) {
  json j = Report(kRankRegister, m.header);
  j["rank"] = m.rank;
  j["pid"] = m.pid;
  j["local_rank"] = m.local_rank;
  j["exe"] = m.exe;
  j["state"] = m.state;
  j["started_ns"] = m.started_ns;
  j["mode"] = m.mode;
  json comms = json::array();
  for (const CommSummary& c : m.comms) {
    comms.push_back({{"id", CommIdHex(c.id)}, {"rank", c.rank}, {"nranks", c.nranks},
                     {"name", c.name}, {"calls", c.calls}});
  }
  j["comms"] = std::move(comms);
  j["records"] = m.records;
  j["lost"] = m.lost;
  SetIf(j, "period", m.period);
  j["iterations"] = m.iterations;
  j["slow"] = m.slow;
  SetIf(j, "plan_delivered", m.plan_delivered);
  SetIf(j, "plan_applied", m.plan_applied);
  SetIf(j, "plan_rejected", m.plan_rejected);
  SetIf(j, "cost_s2", m.cost_s2);
  SetIf(j, "cost_s3", m.cost_s3);
  SetIf(j, "cost_s4", m.cost_s4);
  SetIf(j, "cost_s5", m.cost_s5);
  SetIf(j, "phase", m.phase);
  if (m.excluded > 0) j["excluded"] = m.excluded;
  return j;
}

json ToJson(const AgentHeartbeat& m) {
  json j = Report(kAgentHeartbeat, m.header);
  j["pid"] = m.pid;
  j["version"] = m.version;
  j["started_ns"] = m.started_ns;
  j["ranks"] = m.ranks;
  j["cpu_seconds"] = m.cpu_seconds;
  j["outbox"] = m.outbox;
  j["dropped"] = m.dropped;
  if (m.broadcast) j["broadcast"] = true;
  if (m.beats) {
    json beats = json::array();
    for (const RankBeat& b : *m.beats) {
      json o = {{"rank", b.rank},   {"written_ns", b.written_ns}, {"calls", b.calls},
                {"records", b.records}, {"lost", b.lost},   {"iterations", b.iterations}};
      if (b.excluded > 0) o["excluded"] = b.excluded;
      beats.push_back(std::move(o));
    }
    j["beats"] = std::move(beats);
  }
  return j;
}

json ToJson(const IterationBatch& m) {
  json j = Report(kIterations, m.header);
  j["rank"] = m.rank;
  j["pid"] = m.pid;
  j["period"] = m.period;
  j["first"] = m.first;
  j["start_ns"] = m.start_ns;
  j["seconds"] = m.seconds;
  return j;
}

json ToJson(const AlarmReport& m) {
  json j = Report(kAlarm, m.header);
  j["rank"] = m.rank;
  j["pid"] = m.pid;
  j["kind"] = m.kind;
  j["onset"] = m.onset;
  j["at"] = m.at;
  SetIf(j, "onset_ns", m.onset_ns);
  j["ratio"] = m.ratio;
  j["probability"] = m.probability;
  j["level_s"] = m.level_s;
  j["baseline_s"] = m.baseline_s;
  return j;
}

json ToJson(const StallReport& m) {
  json j = Report(kStall, m.header);
  j["rank"] = m.rank;
  j["pid"] = m.pid;
  j["kind"] = m.kind;
  j["age_s"] = m.age_s;
  j["bound_s"] = m.bound_s;
  SetIf(j, "last_call_ns", m.last_call_ns);
  SetIf(j, "comm", m.comm);
  SetIf(j, "seq", m.seq);
  SetIf(j, "op", m.op);
  SetIf(j, "in_call", m.in_call);
  return j;
}

json ToJson(const CallSignatures& m) {
  json j = Report(kCallSignatures, m.header);
  j["rank"] = m.rank;
  j["pid"] = m.pid;
  json comms = json::array();
  for (const CommSignatures& c : m.comms) {
    json runs = json::array();
    for (const SignatureRun& r : c.runs) {
      runs.push_back({{"seq", r.seq}, {"n", r.n}, {"op", r.op}, {"dtype", r.dtype},
                      {"count", r.count}, {"redop", r.redop}, {"root", r.root}});
    }
    comms.push_back({{"id", CommIdHex(c.id)}, {"nranks", c.nranks}, {"runs", std::move(runs)}});
  }
  j["comms"] = std::move(comms);
  SetIf(j, "dropped", m.dropped);
  if (!m.digests.empty()) {
    json digests = json::array();
    for (const CommDigests& c : m.digests) {
      json blocks = json::array();
      for (const SignatureBlock& b : c.blocks) {
        blocks.push_back({{"seq", b.seq}, {"n", b.n}, {"digest", CommIdHex(b.digest)}});
      }
      digests.push_back({{"id", CommIdHex(c.id)}, {"nranks", c.nranks}, {"blocks", std::move(blocks)}});
    }
    j["digests"] = std::move(digests);
  }
  return j;
}

std::uint64_t SignatureDigestTerm(std::uint64_t seq, std::uint8_t op, std::int32_t dtype, std::uint64_t count,
                                  std::int32_t redop, std::int32_t root) {
  // splitmix64's finaliser, applied twice over the call's fields: a change in any one of them
  // changes the term, and so the block's sum, but for a 2^-64 chance.
  const auto mix = [](std::uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
  };
  const std::uint64_t shape = std::uint64_t{op} | (std::uint64_t{static_cast<std::uint8_t>(dtype)} << 8) |
                              (std::uint64_t{static_cast<std::uint16_t>(redop)} << 16) |
                              (std::uint64_t{static_cast<std::uint32_t>(root)} << 32);
  return mix(mix(seq * 0x9E3779B97F4A7C15ULL ^ shape) + count);
}

namespace {

template <typename T>
void AppendInt(std::string* out, T v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out->append(buf, r.ptr);
}

// A string as dump() writes it: plain printable ASCII as is, anything else through nlohmann.
void AppendString(std::string* out, const std::string& s) {
  const bool plain = std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
  if (!plain) {
    out->append(json(s).dump());
    return;
  }
  out->push_back('"');
  out->append(s);
  out->push_back('"');
}

// `,"name":value` (the comma left out for the first field of an object: `first`).
template <typename T>
void AppendField(std::string* out, const char* name, const T& v, bool first = false) {
  if (!first) out->push_back(',');
  out->push_back('"');
  out->append(name);
  out->append("\":");
  if constexpr (std::is_integral_v<T>) {
    AppendInt(out, v);
  } else {
    AppendString(out, v);
  }
}

}  // namespace

std::string Dump(const CallSignatures& m) {
  // Keys in the order dump() writes them: sorted, as nlohmann::json's objects are std::maps.
  std::string out;
  std::size_t runs = 0;
  for (const CommSignatures& c : m.comms) runs += c.runs.size();
  out.reserve(160 + 48 * m.comms.size() + 96 * runs);
  out.push_back('{');
  AppendField(&out, "at_ns", m.header.at_ns, true);
  out.append(",\"comms\":[");
  for (std::size_t i = 0; i < m.comms.size(); ++i) {
    const CommSignatures& c = m.comms[i];
    out.append(i > 0 ? ",{" : "{");
    AppendField(&out, "id", CommIdHex(c.id), true);
    AppendField(&out, "nranks", c.nranks);
    out.append(",\"runs\":[");
    for (std::size_t k = 0; k < c.runs.size(); ++k) {
      const SignatureRun& r = c.runs[k];
      out.append(k > 0 ? ",{" : "{");
      AppendField(&out, "count", r.count, true);
      AppendField(&out, "dtype", r.dtype);
      AppendField(&out, "n", r.n);
      AppendField(&out, "op", r.op);
      AppendField(&out, "redop", r.redop);
      AppendField(&out, "root", r.root);
      AppendField(&out, "seq", r.seq);
      out.push_back('}');
    }
    out.append("]}");
  }
  out.push_back(']');
  if (!m.digests.empty()) {
    out.append(",\"digests\":[");
    for (std::size_t i = 0; i < m.digests.size(); ++i) {
      const CommDigests& c = m.digests[i];
      out.append(i > 0 ? ",{" : "{");
      out.append("\"blocks\":[");
      for (std::size_t k = 0; k < c.blocks.size(); ++k) {
        const SignatureBlock& b = c.blocks[k];
        out.append(k > 0 ? ",{" : "{");
        AppendField(&out, "digest", CommIdHex(b.digest), true);
        AppendField(&out, "n", b.n);
        AppendField(&out, "seq", b.seq);
        out.push_back('}');
      }
      out.push_back(']');
      AppendField(&out, "id", CommIdHex(c.id));
      AppendField(&out, "nranks", c.nranks);
      out.push_back('}');
    }
    out.push_back(']');
  }
  if (m.dropped) AppendField(&out, "dropped", *m.dropped);
  AppendField(&out, "host", m.header.host);
  AppendField(&out, "job", m.header.job);
  AppendField(&out, "pid", m.pid);
  AppendField(&out, "rank", m.rank);
  AppendField(&out, "type", std::string(kCallSignatures.type));
  AppendField(&out, "v", kSchemaVersion);
  out.push_back('}');
  return out;
}

json ToJson(const CommProfileReport& m) {
  json j = Report(kCommProfile, m.header);
  j["rank"] = m.rank;
  j["pid"] = m.pid;
  j["since_ns"] = m.since_ns;
  j["mode"] = m.mode;
  json comms = json::array();
  for (const CommProfile& c : m.comms) {
    json sigs = json::array();
    for (const SignatureProfile& s : c.sigs) {
      json sj = {{"op", s.op}, {"bytes", s.bytes}, {"peer", s.peer}, {"count", s.count}};
      SetIf(sj, "mean_us", s.mean_us);
      SetIf(sj, "median_us", s.median_us);
      SetIf(sj, "clock", s.clock);
      sigs.push_back(std::move(sj));
    }
    comms.push_back({{"id", CommIdHex(c.id)}, {"rank", c.rank}, {"nranks", c.nranks},
                     {"sigs", std::move(sigs)}});
  }
  j["comms"] = std::move(comms);
  return j;
}

// A JSON integer >= 0, however it was made (parsed text is unsigned, values built in code signed).
bool NonNegative(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
}

void CopyPlanFields(const json& plan, Command* c) {
  for (const auto& [key, into] : {std::pair{"micro_batches", &c->micro_batches}, std::pair{"placement", &c->placement},
                                  std::pair{"exclude_nodes", &c->exclude_nodes}, std::pair{"warmup", &c->warmup}}) {
    if (plan.contains(key)) *into = plan[key].get<std::vector<std::int32_t>>();
  }
  c->restart = plan.value("restart", false);
}

json ToJson(const Command& m) {
  const MessageSpec* spec = FindCommand(m.type);
  json j = spec != nullptr ? Base(*spec) : json{{"v", kSchemaVersion}, {"type", m.type}};
  j["id"] = m.id;
  j["issued_ns"] = m.issued_ns;
  SetIf(j, "deadline_ns", m.deadline_ns);
  SetIf(j, "ranks", m.ranks);
  if (m.type == kSetMode.type) {
    j["mode"] = m.mode;
    j["sample_every"] = m.sample_every;
  } else if (m.type == kPause.type) {
    j["at_iteration"] = m.at_iteration;
    j["max_pause_s"] = m.max_pause_s;
    SetIf(j, "comm", m.comm);
    SetIf(j, "comm_seq", m.comm_seq);
    if (!m.targets.empty()) {
      json t = json::array();
      for (const Command::RankTargets& r : m.targets) t.push_back(CutTargetsToJson(r));
      j["targets"] = std::move(t);
    }
  } else if (m.type == kValidate.type) {
    j["task"] = m.task;
    SetIf(j, "comm", m.comm);
    SetIf(j, "peer", m.peer);
    SetIf(j, "shift", m.shift);
    SetIf(j, "bytes", m.bytes);
    SetIf(j, "size", m.size);
    SetIf(j, "dtype", m.dtype);
    SetIf(j, "repeats", m.repeats);
    SetIf(j, "blob", m.blob);
    SetIf(j, "vranks", m.vranks);
    SetIf(j, "vrank", m.vrank);
    if (!m.peers.empty()) j["peers"] = m.peers;
    if (!m.vrank_each.empty()) j["vrank_each"] = m.vrank_each;
  } else if (m.type == kPlanCommand.type) {
    j["plan_version"] = m.plan_version;
    j["strategy"] = m.strategy;
    if (!m.micro_batches.empty()) j["micro_batches"] = m.micro_batches;
    if (!m.placement.empty()) j["placement"] = m.placement;
    if (!m.exclude_nodes.empty()) j["exclude_nodes"] = m.exclude_nodes;
    if (!m.warmup.empty()) j["warmup"] = m.warmup;
    if (m.restart) j["restart"] = true;
  } else if (m.type == kProgressCommand.type) {
    SetIf(j, "calls", m.calls);
  }
  return j;
}

json ToJson(const Ack& m) {
  json j = Report(kAck, m.header);
  j["command"] = m.command;
  j["command_type"] = m.command_type;
  j["status"] = m.status;
  if (!m.detail.empty()) j["detail"] = m.detail;
  j["ranks"] = m.ranks;
  if (!m.results.empty()) {
    json results = json::array();
    for (const AckRankResult& r : m.results) {
      json rj = {{"rank", r.rank}, {"state", r.state}};
      SetIf(rj, "task_status", r.task_status);
      SetIf(rj, "median_s", r.median_s);
      SetIf(rj, "min_s", r.min_s);
      SetIf(rj, "max_s", r.max_s);
      SetIf(rj, "rate", r.rate);
      SetIf(rj, "dtype", r.dtype);
      SetIf(rj, "blob", r.blob);
      if (r.pattern) rj["pattern"] = *r.pattern;
      if (r.progress) rj["progress"] = *r.progress;
      results.push_back(std::move(rj));
    }
    j["results"] = std::move(results);
  }
  return j;
}

json ToJson(const Alert& m) {
  json j = Base(kAlert);
  j["job"] = m.job;
  j["at_ns"] = m.at_ns;
  j["severity"] = m.severity;
  j["source"] = m.source;
  j["summary"] = m.summary;
  SetIf(j, "host", m.host);
  SetIf(j, "rank", m.rank);
  SetIf(j, "incident", m.incident);
  return j;
}

namespace {

std::optional<std::int64_t> OwnEntry(const Command& c, const std::vector<std::int64_t>& each,
                                     std::optional<std::int64_t> single, std::int64_t rank) {
  if (each.empty()) return single;
  if (!c.ranks) return std::nullopt;
  const auto at = std::find(c.ranks->begin(), c.ranks->end(), rank);
  if (at == c.ranks->end()) return std::nullopt;
  return each[static_cast<std::size_t>(at - c.ranks->begin())];
}

}  // namespace

std::optional<std::int64_t> PeerOf(const Command& c, std::int64_t rank) { return OwnEntry(c, c.peers, c.peer, rank); }
std::optional<std::int64_t> VrankOf(const Command& c, std::int64_t rank) {
  return OwnEntry(c, c.vrank_each, c.vrank, rank);
}

Result<Command> ParseCommand(std::string_view text) {
  const MessageSpec* spec = nullptr;
  Result<json> parsed = ParseAnyOf(text, kCommands, &spec);
  if (!parsed.ok()) return parsed.status();
  const json& j = parsed.value();
  try {  // validated above; the catch only guards the edge (STYLE rule 5)
    Command c;
    c.type = std::string(spec->type);
    c.id = j.at("id").get<std::string>();
    c.issued_ns = j.at("issued_ns").get<std::int64_t>();
    if (j.contains("deadline_ns")) c.deadline_ns = j["deadline_ns"].get<std::int64_t>();
    if (j.contains("ranks")) c.ranks = j["ranks"].get<std::vector<std::int64_t>>();
    if ((c.type == kPause.type || c.type == kValidate.type) && j.contains("comm")) {
      c.comm = j["comm"].get<std::string>();
      if (!ParseCommIdHex(*c.comm)) {
        return Status::InvalidArgument(c.type + ".comm: not 16 hex digits");
      }
    }
    if (c.type == kSetMode.type) {
      c.mode = j.at("mode").get<std::string>();
      c.sample_every = j.value("sample_every", std::uint32_t{100});
    } else if (c.type == kPause.type) {
      c.at_iteration = j.at("at_iteration").get<std::uint64_t>();
      c.max_pause_s = j.at("max_pause_s").get<double>();
      if (j.contains("comm_seq")) c.comm_seq = j["comm_seq"].get<std::uint64_t>();
      if (j.contains("targets")) {
        for (const json& r : j["targets"]) {
          Command::RankTargets rt;
          if (!r.contains("rank") || !r["rank"].is_number_integer() || r["rank"].get<std::int64_t>() < 0 ||
              !r.contains("t") || !r["t"].is_array() || r["t"].empty() || r["t"].size() > FALCON_PAUSE_MAX_TARGETS) {
            return Status::InvalidArgument("pause.targets: each entry needs rank >= 0 and t with 1..16 targets");
          }
          rt.rank = r["rank"].get<std::int64_t>();
          for (const json& t : r["t"]) {
            const bool shaped = t.is_array() && t.size() == 3 && t[0].is_string() && NonNegative(t[1]) &&
                                NonNegative(t[2]);
            const auto id = shaped ? ParseCommIdHex(t[0].get<std::string>()) : std::nullopt;
            if (!id) return Status::InvalidArgument("pause.targets: a target is [comm (16 hex), trigger_seq, expect_seq]");
            rt.targets.push_back({*id, t[1].get<std::uint64_t>(), t[2].get<std::uint64_t>()});
          }
          c.targets.push_back(std::move(rt));
        }
      }
    } else if (c.type == kValidate.type) {
      c.task = j.at("task").get<std::string>();
      if (j.contains("peer")) c.peer = j["peer"].get<std::int64_t>();
      if (j.contains("shift")) c.shift = j["shift"].get<std::int64_t>();
      if (j.contains("bytes")) c.bytes = j["bytes"].get<std::int64_t>();
      if (j.contains("size")) c.size = j["size"].get<std::int64_t>();
      if (j.contains("dtype")) c.dtype = j["dtype"].get<std::string>();
      if (j.contains("repeats")) c.repeats = j["repeats"].get<std::int64_t>();
      if (j.contains("blob")) {
        c.blob = j["blob"].get<std::string>();
        if (c.blob->find_first_not_of("0123456789abcdef") != std::string::npos) {
          return Status::InvalidArgument("validate.blob: not lower-case hex digits");
        }
      }
      if (j.contains("vranks")) c.vranks = j["vranks"].get<std::int64_t>();
      if (j.contains("vrank")) c.vrank = j["vrank"].get<std::int64_t>();
      if (j.contains("peers")) c.peers = j["peers"].get<std::vector<std::int64_t>>();
      if (j.contains("vrank_each")) c.vrank_each = j["vrank_each"].get<std::vector<std::int64_t>>();
      // Per-rank lists pair up with `ranks` by position, and replace their single-rank fields.
      for (const auto& [name, list, single] : {std::tuple{"peers", &c.peers, c.peer.has_value() || c.shift.has_value()},
                                               std::tuple{"vrank_each", &c.vrank_each, c.vrank.has_value()}}) {
        if (list->empty()) continue;
        if (!c.ranks || c.ranks->size() != list->size()) {
          return Status::InvalidArgument(std::string("validate.") + name + ": one entry per rank of `ranks`");
        }
        if (single) {
          return Status::InvalidArgument(std::string("validate.") + name + " replaces " +
                                         (list == &c.peers ? "peer and shift" : "vrank") + ": give one of them");
        }
        std::vector<std::int64_t> sorted = *c.ranks;
        std::sort(sorted.begin(), sorted.end());
        if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
          return Status::InvalidArgument(std::string("validate.") + name + ": `ranks` names a rank twice");
        }
      }
      if (c.task == "vcomm_join") {
        const bool placed = c.vrank_each.empty()
                                ? c.vrank && c.vranks && *c.vrank < *c.vranks
                                : c.vranks && std::all_of(c.vrank_each.begin(), c.vrank_each.end(),
                                                          [&](std::int64_t v) { return v < *c.vranks; });
        if (!c.blob || !c.vranks || !c.bytes || !placed) {
          return Status::InvalidArgument("validate vcomm_join needs blob, vranks, vrank (or vrank_each) < vranks and bytes");
        }
      }
    } else if (c.type == kPlanCommand.type) {
      c.plan_version = j.at("plan_version").get<std::int32_t>();
      c.strategy = j.at("strategy").get<std::string>();
      c.restart = j.value("restart", false);
      // The schema checks element types; the element ranges are checked here.
      auto ints = [&j](const char* key, std::int64_t lo, std::int64_t hi,
                       std::vector<std::int32_t>* out) -> Status {
        if (!j.contains(key)) return Status::Ok();
        for (const json& e : j[key]) {
          const std::int64_t v = e.get<std::int64_t>();
          if (v < lo || v > hi) {
            return Status::InvalidArgument(std::string("plan.") + key + ": element " +
                                           std::to_string(v) + " outside [" + std::to_string(lo) +
                                           ", " + std::to_string(hi) + "]");
          }
          out->push_back(static_cast<std::int32_t>(v));
        }
        return Status::Ok();
      };
      if (Status s = ints("micro_batches", 1, 4096, &c.micro_batches); !s.ok()) return s;
      if (Status s = ints("placement", 0, 65535, &c.placement); !s.ok()) return s;
      if (Status s = ints("exclude_nodes", 0, 65535, &c.exclude_nodes); !s.ok()) return s;
      if (Status s = ints("warmup", 0, 65535, &c.warmup); !s.ok()) return s;
      for (std::size_t i = 1; i < c.warmup.size(); ++i) {
        // A stage that wants more forwards before its first backward than its upstream can send
        // without one waits forever: refuse the plan, never deliver it.
        if (c.warmup[i] > c.warmup[i - 1]) {
          return Status::InvalidArgument("plan.warmup: stage " + std::to_string(i) + "'s count " +
                                         std::to_string(c.warmup[i]) + " exceeds stage " + std::to_string(i - 1) +
                                         "'s " + std::to_string(c.warmup[i - 1]) +
                                         " (counts must not increase along the pipeline)");
        }
      }
      if (c.strategy == "pipeline" && c.warmup.empty()) {
        return Status::InvalidArgument("plan: strategy pipeline needs warmup counts");
      }
    } else if (c.type == kProgressCommand.type) {
      if (j.contains("calls")) c.calls = j["calls"].get<std::int64_t>();
    }
    return c;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("command: ") + e.what());
  }
}

std::optional<CommandIdentity> SalvageCommandIdentity(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  const auto id = j.find("id");
  const auto type = j.find("type");
  if (id == j.end() || type == j.end() || !id->is_string() || !type->is_string()) return std::nullopt;
  const std::string& id_text = id->get_ref<const std::string&>();
  const std::string& type_text = type->get_ref<const std::string&>();
  if (id_text.empty() || id_text.size() > 64 || FindCommand(type_text) == nullptr) return std::nullopt;
  return CommandIdentity{id_text, type_text};
}

json CutTargetsToJson(const Command::RankTargets& t) {
  json list = json::array();
  for (const analyzer::CutTarget& c : t.targets) list.push_back({CommIdHex(c.comm), c.trigger_seq, c.expect_seq});
  return {{"rank", t.rank}, {"t", std::move(list)}};
}

namespace {

// Units, run-length encoded: [repeat, group (0/1), then per call entry its fields], where an
// entry is (comm index, count) in "units", or (comm index, channel index, count) in
// "channel_units".
json UnitRuns(const std::vector<analyzer::CallUnit>& units, bool channels) {
  auto same = [&](const analyzer::CallUnit& a, const analyzer::CallUnit& b) {
    if (a.group != b.group || a.calls.size() != b.calls.size()) return false;
    for (std::size_t x = 0; x < a.calls.size(); ++x) {
      if (a.calls[x].comm != b.calls[x].comm || a.calls[x].count != b.calls[x].count ||
          (channels && a.calls[x].channel != b.calls[x].channel)) {
        return false;
      }
    }
    return true;
  };
  json runs = json::array();
  for (std::size_t i = 0; i < units.size();) {
    std::size_t k = i + 1;
    while (k < units.size() && same(units[k], units[i])) ++k;
    json u = {k - i, units[i].group ? 1 : 0};
    for (const analyzer::UnitCalls& c : units[i].calls) {
      u.push_back(c.comm);
      if (channels) u.push_back(c.channel);
      u.push_back(c.count);
    }
    runs.push_back(std::move(u));
    i = k;
  }
  return runs;
}

// A unit's calls per communicator, channels merged: what "units" carries for older readers.
std::vector<analyzer::CallUnit> ByComm(const std::vector<analyzer::CallUnit>& units) {
  std::vector<analyzer::CallUnit> out;
  out.reserve(units.size());
  for (const analyzer::CallUnit& u : units) {
    analyzer::CallUnit merged{u.group, {}};
    for (const analyzer::UnitCalls& c : u.calls) {
      auto it = std::find_if(merged.calls.begin(), merged.calls.end(),
                             [&](const analyzer::UnitCalls& x) { return x.comm == c.comm; });
      if (it == merged.calls.end()) merged.calls.push_back({c.comm, c.count, 0});
      else it->count += c.count;
    }
    out.push_back(std::move(merged));
  }
  return out;
}

}  // namespace

// "comms" and "units" count calls per communicator, as every controller reads them; where the
// rank's agent counts calls per channel, "channels" (per comm: [own comm rank, [[kind, peer,
// base], ...]]) and "channel_units" carry them too.
json CutPatternToJson(const CutPatternMessage& m) {
  const analyzer::RankCallPattern& p = m.pattern;
  json comms = json::array();
  bool channels = false;
  for (const analyzer::PatternComm& c : p.comms) {
    comms.push_back({CommIdHex(c.id), c.nranks, c.base_seq});
    channels = channels || !c.channels.empty();
  }
  json j = {{"rank", p.rank}, {"comms", std::move(comms)}, {"units", UnitRuns(ByComm(p.units), false)},
            {"position", m.position}, {"units_per_s", m.units_per_s}, {"age_s", m.age_s}};
  if (channels) {
    json per_comm = json::array();
    for (const analyzer::PatternComm& c : p.comms) {
      json list = json::array();
      for (const analyzer::PatternChannel& ch : c.channels) list.push_back({static_cast<int>(ch.kind), ch.peer, ch.base});
      per_comm.push_back({c.rank, std::move(list)});
    }
    j["channels"] = std::move(per_comm);
    j["channel_units"] = UnitRuns(p.units, true);
  }
  if (p.iteration_at_start) j["iteration"] = *p.iteration_at_start;
  return j;
}

Result<CutPatternMessage> ParseCutPattern(const json& j) {
  constexpr std::size_t kMaxComms = 4096, kMaxUnits = std::size_t{1} << 20;
  auto bad = [](const std::string& why) { return Status::InvalidArgument("cut pattern: " + why); };
  if (!j.is_object()) return bad("not an object");
  for (const char* key : {"rank", "position"}) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 0) return bad(std::string(key) + " missing or negative");
  }
  for (const char* key : {"units_per_s", "age_s"}) {
    if (!j.contains(key) || !j[key].is_number()) return bad(std::string(key) + " missing");
    const double v = j[key].get<double>();
    if (!(v >= 0 && v <= 1e12)) return bad(std::string(key) + " outside [0, 1e12]");
  }
  if (!j.contains("comms") || !j["comms"].is_array() || j["comms"].size() > kMaxComms) return bad("comms missing or too many");
  if (!j.contains("units") || !j["units"].is_array()) return bad("units missing");
  CutPatternMessage m;
  m.pattern.rank = j["rank"].get<std::int64_t>();
  m.position = j["position"].get<std::uint64_t>();
  m.units_per_s = j["units_per_s"].get<double>();
  m.age_s = j["age_s"].get<double>();
  if (j.contains("iteration")) {
    if (!NonNegative(j["iteration"])) return bad("iteration not a non-negative integer");
    m.pattern.iteration_at_start = j["iteration"].get<std::uint64_t>();
  }
  for (const json& c : j["comms"]) {
    const bool shaped = c.is_array() && c.size() == 3 && c[0].is_string() && c[1].is_number_integer() &&
                        NonNegative(c[2]);
    const auto id = shaped ? ParseCommIdHex(c[0].get<std::string>()) : std::nullopt;
    if (!id || c[1].get<std::int64_t>() < 1 || static_cast<double>(c[1].get<std::int64_t>()) > kMaxRank) {
      return bad("a comm is [id (16 hex), nranks 1..max, base_seq]");
    }
    m.pattern.comms.push_back({*id, c[1].get<std::int64_t>(), c[2].get<std::uint64_t>(), -1, {}});
  }
  if (j.contains("channels") != j.contains("channel_units")) return bad("channels and channel_units come together");
  const bool channels = j.contains("channels");
  if (channels) {
    const json& per_comm = j["channels"];
    if (!per_comm.is_array() || per_comm.size() != m.pattern.comms.size()) return bad("channels: one entry per comm");
    for (std::size_t c = 0; c < per_comm.size(); ++c) {
      analyzer::PatternComm& comm = m.pattern.comms[c];
      const json& e = per_comm[c];
      if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer() || !e[1].is_array() ||
          e[0].get<std::int64_t>() < -1 || e[0].get<std::int64_t>() >= comm.nranks || e[1].size() > kMaxComms) {
        return bad("a comm's channels are [own comm rank (-1..nranks-1), [channel, ...]] (at most 4096)");
      }
      comm.rank = static_cast<std::int32_t>(e[0].get<std::int64_t>());
      for (const json& ch : e[1]) {
        if (!ch.is_array() || ch.size() != 3 || !NonNegative(ch[0]) || ch[0].get<std::uint64_t>() > 2 ||
            !ch[1].is_number_integer() || !NonNegative(ch[2])) {
          return bad("a channel is [kind 0..2, peer, base]");
        }
        const auto kind = static_cast<analyzer::ChannelKind>(ch[0].get<std::uint64_t>());
        const std::int64_t peer = ch[1].get<std::int64_t>();
        const bool p2p = kind != analyzer::ChannelKind::kCollective;
        if (p2p ? (peer < 0 || peer >= comm.nranks || peer == comm.rank) : peer != -1) {
          return bad("a send's or receive's peer is another member's comm rank; a collective's is -1");
        }
        for (const analyzer::PatternChannel& seen : comm.channels) {
          if (seen.kind == kind && seen.peer == peer) return bad("a channel is listed twice");
        }
        comm.channels.push_back({kind, static_cast<std::int32_t>(peer), ch[2].get<std::uint64_t>()});
      }
      if (comm.channels.empty() != (comm.rank < 0)) return bad("a comm with channels has its own comm rank, and only then");
    }
  }
  const json& runs = channels ? j["channel_units"] : j["units"];
  const std::size_t entry = channels ? 3 : 2;
  if (!runs.is_array()) return bad("units missing");
  for (const json& u : runs) {
    if (!u.is_array() || u.size() < 2 + entry || (u.size() - 2) % entry != 0 || !NonNegative(u[0]) || !NonNegative(u[1])) {
      return bad(channels ? "a unit run is [repeat, group, comm, channel, count, ...]" : "a unit run is [repeat, group, comm, count, ...]");
    }
    const std::uint64_t repeat = u[0].get<std::uint64_t>();
    if (repeat < 1 || repeat > kMaxUnits || m.pattern.units.size() + repeat > kMaxUnits) return bad("too many units");
    analyzer::CallUnit unit{u[1].get<std::uint64_t>() != 0, {}};
    for (std::size_t x = 2; x < u.size(); x += entry) {
      for (std::size_t f = 0; f < entry; ++f) {
        if (!NonNegative(u[x + f])) return bad("a unit's fields are non-negative integers");
      }
      const std::uint64_t comm = u[x].get<std::uint64_t>(), count = u[x + entry - 1].get<std::uint64_t>();
      if (comm >= m.pattern.comms.size() || count < 1 || count > kMaxUnits) {
        return bad("a unit names an unknown comm index or a count outside [1, 2^20]");
      }
      std::uint64_t channel = 0;
      if (channels) {
        channel = u[x + 1].get<std::uint64_t>();
        const auto& list = m.pattern.comms[comm].channels;
        if (!list.empty() && channel >= list.size()) return bad("a unit names an unknown channel index");
        if (list.empty() && channel != 0) return bad("a unit names a channel of a comm without channels");
      }
      unit.calls.push_back({static_cast<std::uint32_t>(comm), static_cast<std::uint32_t>(count),
                            static_cast<std::uint32_t>(channel)});
    }
    m.pattern.units.insert(m.pattern.units.end(), repeat, unit);
  }
  return m;
}

std::string FitText(std::string text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  const std::string tail = " ... (" + std::to_string(text.size()) + " bytes, cut)";
  std::size_t keep = max_bytes - tail.size();
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;  // continuation
  text.resize(keep);
  return text + tail;
}

}  // namespace falcon::protocol
