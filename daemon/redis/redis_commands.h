// Typed Redis commands over a RedisConnection: streams, hashes, expiry, pub/sub publishing.
//
// Each function sends one command (or returns its argv for pipelining) and turns the reply into
// plain values; an unexpected reply shape is a Corrupt status, never a crash. Stream fields are
// (name, value) pairs. Blocking reads (block_ms > 0) wait on the calling thread: call them only
// from a worker thread (STYLE rule 9), never from an event loop.
// Thread-safety: as RedisConnection (one thread per connection). Must never: throw.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "daemon/redis/redis_connection.h"
#include "falcon/status.h"

namespace falcon::redis {

using FieldList = std::vector<std::pair<std::string, std::string>>;

struct StreamEntry {
  std::string id;
  FieldList fields;
  // Value of field `name`, or nullptr (the first, when the entry repeats the name).
  const std::string* Field(const std::string& name) const;
  // Every value of field `name`, in order (an agent's entry holds several messages).
  std::vector<const std::string*> Values(const std::string& name) const;
};

struct StreamRead {
  std::string stream;
  std::vector<StreamEntry> entries;
};

// XADD stream MAXLEN ~ maxlen * field value ... (maxlen 0: no trimming).
std::vector<std::string> XAddArgs(const std::string& stream, std::uint64_t maxlen,
                                  const FieldList& fields);
[[nodiscard]] Result<std::string> XAdd(RedisConnection& c, const std::string& stream,
                                       std::uint64_t maxlen, const FieldList& fields);

// XREAD [COUNT n] [BLOCK ms] STREAMS s... id... ; block_ms < 0: no BLOCK. Empty on timeout.
[[nodiscard]] Result<std::vector<StreamRead>> XRead(
    RedisConnection& c, const std::vector<std::pair<std::string, std::string>>& streams_and_ids,
    std::uint64_t count, int block_ms);

// XRead, then each stream marked in `drain` (same order as streams_and_ids) that returned `count`
// entries is read on at once, without BLOCK and without the others, at most `max_more` more
// times; its entries are appended to its first read's. So a burst on a rare stream comes in one
// call while busy streams stay bounded by `count`. A failed read-on ends the draining and what
// was read stands (the caller's cursors go on from it); only the first read's failure is returned.
[[nodiscard]] Result<std::vector<StreamRead>> XReadDrained(
    RedisConnection& c, const std::vector<std::pair<std::string, std::string>>& streams_and_ids,
    const std::vector<bool>& drain, std::uint64_t count, int block_ms, int max_more);

// The streams marked in `drain` first, as XReadDrained reads them (BLOCK up to block_ms for any
// of them, a full COUNT read on up to `max_more` times), then the unmarked ones in one XREAD
// without BLOCK, at most `other_count` entries each. For a reader that waits on a few streams
// while the others run heavy: what it waits for is not read behind a full page of each of them.
// With nothing marked, the unmarked ones are the blocking read. Either read's failure is the
// result (what the other read brought is dropped: a caller's cursors stay, and read it again).
[[nodiscard]] Result<std::vector<StreamRead>> XReadMarkedFirst(
    RedisConnection& c, const std::vector<std::pair<std::string, std::string>>& streams_and_ids,
    const std::vector<bool>& drain, std::uint64_t count, int block_ms, int max_more, std::uint64_t other_count);

// XREADGROUP GROUP g consumer [COUNT n] [BLOCK ms] STREAMS stream id ('>' = new entries).
[[nodiscard]] Result<std::vector<StreamRead>> XReadGroup(RedisConnection& c,
                                                         const std::string& group,
                                                         const std::string& consumer,
                                                         const std::string& stream,
                                                         const std::string& id,
                                                         std::uint64_t count, int block_ms);
// The same over several streams at once (the group must exist on each), COUNT per stream.
[[nodiscard]] Result<std::vector<StreamRead>> XReadGroup(
    RedisConnection& c, const std::string& group, const std::string& consumer,
    const std::vector<std::pair<std::string, std::string>>& streams_and_ids, std::uint64_t count, int block_ms);

// XGROUP CREATE stream group id MKSTREAM; a group that already exists is OK.
[[nodiscard]] Status XGroupCreate(RedisConnection& c, const std::string& stream,
                                  const std::string& group, const std::string& id);
[[nodiscard]] Status XAck(RedisConnection& c, const std::string& stream, const std::string& group,
                          const std::vector<std::string>& ids);
// XRANGE stream start end [COUNT n] (count 0: all).
[[nodiscard]] Result<std::vector<StreamEntry>> XRange(RedisConnection& c, const std::string& stream,
                                                      const std::string& start,
                                                      const std::string& end, std::uint64_t count);
[[nodiscard]] Result<std::uint64_t> XLen(RedisConnection& c, const std::string& stream);

std::vector<std::string> HSetArgs(const std::string& key, const FieldList& fields);
[[nodiscard]] Status HSet(RedisConnection& c, const std::string& key, const FieldList& fields);
[[nodiscard]] Result<std::map<std::string, std::string>> HGetAll(RedisConnection& c,
                                                                 const std::string& key);
// Sends `commands` in pipelined rounds of kPipelineKeys (one round trip each): the replies, one
// per command, in order, error replies as kError elements. Fails (with the rounds before sent)
// only when the connection does.
inline constexpr std::size_t kPipelineKeys = 1000;
[[nodiscard]] Result<std::vector<RedisReply>> PipelineInRounds(RedisConnection& c,
                                                               const std::vector<std::vector<std::string>>& commands);

// HGETALL of every key, pipelined in rounds: one result per key, in order — the hash (empty: no
// such key), or the key's error reply as a Status (InvalidArgument: e.g. not a hash). The outer
// status fails only when the connection does.
[[nodiscard]] Result<std::vector<Result<std::map<std::string, std::string>>>> HGetAllMany(
    RedisConnection& c, const std::vector<std::string>& keys);
std::vector<std::string> ExpireArgs(const std::string& key, std::int64_t seconds);
[[nodiscard]] Status Expire(RedisConnection& c, const std::string& key, std::int64_t seconds);
// Remaining TTL in seconds (-1 none, -2 no key).
[[nodiscard]] Result<std::int64_t> Ttl(RedisConnection& c, const std::string& key);
[[nodiscard]] Status Del(RedisConnection& c, const std::string& key);

std::vector<std::string> PublishArgs(const std::string& channel, const std::string& message);
// Returns the number of subscribers that received it.
[[nodiscard]] Result<std::int64_t> Publish(RedisConnection& c, const std::string& channel,
                                           const std::string& message);
[[nodiscard]] Status Ping(RedisConnection& c);
// Keys matching `pattern` (SCAN MATCH ... COUNT 1000 until the cursor returns to 0), sorted and
// without duplicates.
[[nodiscard]] Result<std::vector<std::string>> ScanKeys(RedisConnection& c, const std::string& pattern);

// Parses an XREAD/XREADGROUP reply.
[[nodiscard]] Result<std::vector<StreamRead>> ParseStreamReads(const RedisReply& reply);

}  // namespace falcon::redis
