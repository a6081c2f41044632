// Typed Redis commands. See redis_commands.h for the contract.
#include "daemon/redis/redis_commands.h"

#include <algorithm>
#include <iterator>

namespace falcon::redis {
namespace {

using Type = RedisReply::Type;

Status Shape(const char* what) { return Status::Corrupt(std::string("redis: unexpected reply to ") + what); }

Result<StreamEntry> ParseEntry(const RedisReply& r) {
  if (r.type != Type::kArray || r.elements.size() != 2 || r.elements[0].type != Type::kString) {
    return Shape("stream entry");
  }
  StreamEntry e;
  e.id = r.elements[0].str;
  const RedisReply& f = r.elements[1];
  if (f.type == Type::kNil) return e;  // entry deleted while pending
  if (f.type != Type::kArray || f.elements.size() % 2 != 0) return Shape("stream entry fields");
  for (size_t i = 0; i + 1 < f.elements.size(); i += 2) {
    e.fields.emplace_back(f.elements[i].str, f.elements[i + 1].str);
  }
  return e;
}

Result<std::vector<StreamEntry>> ParseEntries(const RedisReply& r) {
  if (r.type != Type::kArray) return Shape("stream entries");
  std::vector<StreamEntry> out;
  for (const RedisReply& e : r.elements) {
    Result<StreamEntry> entry = ParseEntry(e);
    if (!entry.ok()) return entry.status();
    out.push_back(std::move(entry).value());
  }
  return out;
}

int BlockTimeout(const RedisConnection& c, int block_ms) {
  return block_ms > 0 ? block_ms + c.options().command_timeout_ms : 0;
}

}  // namespace

const std::string* StreamEntry::Field(const std::string& name) const {
  for (const auto& [k, v] : fields) {
    if (k == name) return &v;
  }
  return nullptr;
}

std::vector<const std::string*> StreamEntry::Values(const std::string& name) const {
  std::vector<const std::string*> out;
  for (const auto& [k, v] : fields) {
    if (k == name) out.push_back(&v);
  }
  return out;
}

std::vector<std::string> XAddArgs(const std::string& stream, std::uint64_t maxlen,
                                  const FieldList& fields) {
  std::vector<std::string> a{"XADD", stream};
  if (maxlen > 0) {
    a.insert(a.end(), {"MAXLEN", "~", std::to_string(maxlen)});
  }
  a.push_back("*");
  for (const auto& [k, v] : fields) {
    a.push_back(k);
    a.push_back(v);
  }
  return a;
}

Result<std::string> XAdd(RedisConnection& c, const std::string& stream, std::uint64_t maxlen,
                         const FieldList& fields) {
  Result<RedisReply> r = c.Command(XAddArgs(stream, maxlen, fields));
  if (!r.ok()) return r.status();
  if (r.value().type != Type::kString) return Shape("XADD");
  return r.value().str;
}

Result<std::vector<StreamRead>> ParseStreamReads(const RedisReply& reply) {
  std::vector<StreamRead> out;
  if (reply.type == Type::kNil) return out;  // BLOCK timed out
  if (reply.type != Type::kArray) return Shape("XREAD");
  for (const RedisReply& s : reply.elements) {
    if (s.type != Type::kArray || s.elements.size() != 2 || s.elements[0].type != Type::kString) {
      return Shape("XREAD stream");
    }
    Result<std::vector<StreamEntry>> entries = ParseEntries(s.elements[1]);
    if (!entries.ok()) return entries.status();
    out.push_back({s.elements[0].str, std::move(entries).value()});
  }
  return out;
}

Result<std::vector<StreamRead>> XRead(
    RedisConnection& c, const std::vector<std::pair<std::string, std::string>>& streams_and_ids,
    std::uint64_t count, int block_ms) {
  std::vector<std::string> a{"XREAD"};
  if (count > 0) a.insert(a.end(), {"COUNT", std::to_string(count)});
  if (block_ms >= 0) a.insert(a.end(), {"BLOCK", std::to_string(block_ms)});
  a.push_back("STREAMS");
  for (const auto& s : streams_and_ids) a.push_back(s.first);
  for (const auto& s : streams_and_ids) a.push_back(s.second);
  Result<RedisReply> r = c.Command(a, BlockTimeout(c, block_ms));
  if (!r.ok()) return r.status();
  return ParseStreamReads(r.value());
}

Result<std::vector<StreamRead>> XReadDrained(
    RedisConnection& c, const std::vector<std::pair<std::string, std::string>>& streams_and_ids,
    const std::vector<bool>& drain, std::uint64_t count, int block_ms, int max_more) {
  Result<std::vector<StreamRead>> first = XRead(c, streams_and_ids, count, block_ms);
  if (!first.ok() || count == 0) return first;
  std::vector<StreamRead> reads = std::move(first).value();
  std::vector<std::pair<std::string, std::string>> more;  // stream to read on, from its last id
  for (const StreamRead& r : reads) {
    for (std::size_t i = 0; i < streams_and_ids.size() && i < drain.size(); ++i) {
      if (drain[i] && streams_and_ids[i].first == r.stream && r.entries.size() >= count) {
        more.emplace_back(r.stream, r.entries.back().id);
      }
    }
  }
  for (int i = 0; i < max_more && !more.empty(); ++i) {
    Result<std::vector<StreamRead>> again = XRead(c, more, count, -1);
    if (!again.ok()) break;
    more.clear();
    for (StreamRead& r : again.value()) {
      if (r.entries.empty()) continue;
      if (r.entries.size() >= count) more.emplace_back(r.stream, r.entries.back().id);
      for (StreamRead& into : reads) {
        if (into.stream == r.stream) std::move(r.entries.begin(), r.entries.end(), std::back_inserter(into.entries));
      }
    }
  }
  return reads;
}

Result<std::vector<StreamRead>> XReadMarkedFirst(
    RedisConnection& c, const std::vector<std::pair<std::string, std::string>>& streams_and_ids,
    const std::vector<bool>& drain, std::uint64_t count, int block_ms, int max_more, std::uint64_t other_count) {
  std::vector<std::pair<std::string, std::string>> marked, others;
  for (std::size_t i = 0; i < streams_and_ids.size(); ++i) {
    (i < drain.size() && drain[i] ? marked : others).push_back(streams_and_ids[i]);
  }
  if (marked.empty()) return XRead(c, others, other_count, block_ms);
  Result<std::vector<StreamRead>> first =
      XReadDrained(c, marked, std::vector<bool>(marked.size(), true), count, block_ms, max_more);
  if (!first.ok() || others.empty()) return first;
  std::vector<StreamRead> reads = std::move(first).value();
  Result<std::vector<StreamRead>> rest = XRead(c, others, other_count, -1);
  if (!rest.ok()) return rest.status();
  std::move(rest.value().begin(), rest.value().end(), std::back_inserter(reads));
  return reads;
}

Result<std::vector<StreamRead>> XReadGroup(RedisConnection& c, const std::string& group,
                                           const std::string& consumer, const std::string& stream,
                                           const std::string& id, std::uint64_t count,
                                           int block_ms) {
  return XReadGroup(c, group, consumer, {{stream, id}}, count, block_ms);
}

Result<std::vector<StreamRead>> XReadGroup(RedisConnection& c, const std::string& group, const std::string& consumer,
                                           const std::vector<std::pair<std::string, std::string>>& streams_and_ids,
                                           std::uint64_t count, int block_ms) {
  std::vector<std::string> a{"XREADGROUP", "GROUP", group, consumer};
  if (count > 0) a.insert(a.end(), {"COUNT", std::to_string(count)});
  if (block_ms >= 0) a.insert(a.end(), {"BLOCK", std::to_string(block_ms)});
  a.emplace_back("STREAMS");
  for (const auto& [stream, id] : streams_and_ids) a.push_back(stream);
  for (const auto& [stream, id] : streams_and_ids) a.push_back(id);
  Result<RedisReply> r = c.Command(a, BlockTimeout(c, block_ms));
  if (!r.ok()) return r.status();
  return ParseStreamReads(r.value());
}

Status XGroupCreate(RedisConnection& c, const std::string& stream, const std::string& group,
                    const std::string& id) {
  Result<RedisReply> r = c.Command({"XGROUP", "CREATE", stream, group, id, "MKSTREAM"});
  if (!r.ok() && r.status().message().find("BUSYGROUP") != std::string::npos) return Status::Ok();
  return r.status();
}

Status XAck(RedisConnection& c, const std::string& stream, const std::string& group,
            const std::vector<std::string>& ids) {
  if (ids.empty()) return Status::Ok();
  std::vector<std::string> a{"XACK", stream, group};
  a.insert(a.end(), ids.begin(), ids.end());
  return c.Command(a).status();
}

Result<std::vector<StreamEntry>> XRange(RedisConnection& c, const std::string& stream,
                                        const std::string& start, const std::string& end,
                                        std::uint64_t count) {
  std::vector<std::string> a{"XRANGE", stream, start, end};
  if (count > 0) a.insert(a.end(), {"COUNT", std::to_string(count)});
  Result<RedisReply> r = c.Command(a);
  if (!r.ok()) return r.status();
  return ParseEntries(r.value());
}

Result<std::uint64_t> XLen(RedisConnection& c, const std::string& stream) {
  Result<RedisReply> r = c.Command({"XLEN", stream});
  if (!r.ok()) return r.status();
  if (r.value().type != Type::kInteger || r.value().integer < 0) return Shape("XLEN");
  return static_cast<std::uint64_t>(r.value().integer);
}

std::vector<std::string> HSetArgs(const std::string& key, const FieldList& fields) {
  std::vector<std::string> a{"HSET", key};
  for (const auto& [k, v] : fields) {
    a.push_back(k);
    a.push_back(v);
  }
  return a;
}

Status HSet(RedisConnection& c, const std::string& key, const FieldList& fields) {
  return c.Command(HSetArgs(key, fields)).status();
}

Result<std::map<std::string, std::string>> HGetAll(RedisConnection& c, const std::string& key) {
  Result<RedisReply> r = c.Command({"HGETALL", key});
  if (!r.ok()) return r.status();
  if (r.value().type != Type::kArray || r.value().elements.size() % 2 != 0) return Shape("HGETALL");
  std::map<std::string, std::string> out;
  const auto& e = r.value().elements;
  for (size_t i = 0; i + 1 < e.size(); i += 2) out[e[i].str] = e[i + 1].str;
  return out;
}

Result<std::vector<RedisReply>> PipelineInRounds(RedisConnection& c,
                                                 const std::vector<std::vector<std::string>>& commands) {
  std::vector<RedisReply> out;
  out.reserve(commands.size());
  for (std::size_t first = 0; first < commands.size(); first += kPipelineKeys) {
    const auto begin = commands.begin() + static_cast<std::ptrdiff_t>(first);
    const auto end = commands.begin() + static_cast<std::ptrdiff_t>(std::min(commands.size(), first + kPipelineKeys));
    Result<std::vector<RedisReply>> r = c.Pipeline(std::vector<std::vector<std::string>>(begin, end));
    if (!r.ok()) return r.status();
    for (RedisReply& rep : r.value()) out.push_back(std::move(rep));
  }
  return out;
}

Result<std::vector<Result<std::map<std::string, std::string>>>> HGetAllMany(RedisConnection& c,
                                                                           const std::vector<std::string>& keys) {
  std::vector<std::vector<std::string>> cmds;
  cmds.reserve(keys.size());
  for (const std::string& key : keys) cmds.push_back({"HGETALL", key});
  Result<std::vector<RedisReply>> replies = PipelineInRounds(c, cmds);
  if (!replies.ok()) return replies.status();
  std::vector<Result<std::map<std::string, std::string>>> out;
  out.reserve(keys.size());
  for (const RedisReply& rep : replies.value()) {
    if (rep.type == Type::kError) {
      out.emplace_back(ErrorReplyStatus(rep.str));
      continue;
    }
    if (rep.type != Type::kArray || rep.elements.size() % 2 != 0) return Shape("HGETALL");
    std::map<std::string, std::string> h;
    for (std::size_t i = 0; i + 1 < rep.elements.size(); i += 2) h[rep.elements[i].str] = rep.elements[i + 1].str;
    out.emplace_back(std::move(h));
  }
  return out;
}

std::vector<std::string> ExpireArgs(const std::string& key, std::int64_t seconds) {
  return {"EXPIRE", key, std::to_string(seconds)};
}

Status Expire(RedisConnection& c, const std::string& key, std::int64_t seconds) {
  return c.Command(ExpireArgs(key, seconds)).status();
}

Result<std::int64_t> Ttl(RedisConnection& c, const std::string& key) {
  Result<RedisReply> r = c.Command({"TTL", key});
  if (!r.ok()) return r.status();
  if (r.value().type != Type::kInteger) return Shape("TTL");
  return static_cast<std::int64_t>(r.value().integer);
}

Status Del(RedisConnection& c, const std::string& key) { return c.Command({"DEL", key}).status(); }

std::vector<std::string> PublishArgs(const std::string& channel, const std::string& message) {
  return {"PUBLISH", channel, message};
}

Result<std::int64_t> Publish(RedisConnection& c, const std::string& channel,
                             const std::string& message) {
  Result<RedisReply> r = c.Command(PublishArgs(channel, message));
  if (!r.ok()) return r.status();
  if (r.value().type != Type::kInteger) return Shape("PUBLISH");
  return static_cast<std::int64_t>(r.value().integer);
}

Status Ping(RedisConnection& c) {
  Result<RedisReply> r = c.Command({"PING"});
  if (!r.ok()) return r.status();
  return r.value().str == "PONG" ? Status::Ok() : Shape("PING");
}

namespace {
constexpr int kMaxScanRounds = 10000;  // bounds a SCAN over a huge keyspace
constexpr int kScanCount = 1000;
}  // namespace

Result<std::vector<std::string>> ScanKeys(redis::RedisConnection& c, const std::string& pattern) {
  std::vector<std::string> keys;
  // SCAN lists one server's keys. In a Redis Cluster a pattern with a hash tag ("falcon:{job}:")
  // matches keys of one slot only: a keyed read of the pattern itself (never a key, it holds a
  // '*') moves the connection to the node that holds that slot first. On a standalone server it
  // is one more O(1) round trip. A refusal (an ACL without EXISTS) leaves the connection where it
  // is, as before; only a lost connection fails the scan.
  if (Result<RedisReply> routed = c.Command({"EXISTS", pattern});
      !routed.ok() && routed.status().code() == Status::Code::kUnavailable) {
    return routed.status();
  }
  std::string cursor = "0";
  for (int round = 0; round < kMaxScanRounds; ++round) {
    Result<RedisReply> r =
        c.Command({"SCAN", cursor, "MATCH", pattern, "COUNT", std::to_string(kScanCount)});
    if (!r.ok()) return r.status();
    const RedisReply& rep = r.value();
    if (rep.type != RedisReply::Type::kArray || rep.elements.size() != 2 ||
        rep.elements[1].type != RedisReply::Type::kArray) {
      return Status::Corrupt("unexpected SCAN reply");
    }
    for (const RedisReply& k : rep.elements[1].elements) keys.push_back(k.str);
    cursor = rep.elements[0].str;
    if (cursor == "0") break;
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

}  // namespace falcon::redis
