// A rank's key and its beat: what changes every heartbeat kept out of the rank key.
//
// A rank key (kRankKey) holds a rank's identity, communicators and state; the counters that move
// every heartbeat (calls per communicator, records, lost, iterations, excluded) travel as the
// rank's beat in its agent's key (agent_heartbeat `beats`). So a writer rewrites a rank key only
// when its content changes, or unchanged to renew its TTL, and a reader holding a key's content
// re-reads it only when the beat names another content (`written_ns`): at 32,768 ranks the keys'
// rewrites and re-reads were most of Redis's load (docs/scale.md).
// Writers: one RankKeyWriter per rank. Readers: a BeatIndex of a job's heartbeats, then ApplyBeat,
// or ApplyBeats for a whole job.
// Thread-safety: a value type and pure functions. Must never: merge counters into a content
// they were not counted against (another written_ns, host or number of communicators).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "daemon/protocol/messages.h"

namespace falcon::protocol {

class RankKeyWriter {
 public:
  // Given one heartbeat's full registration `m` (m.header.at_ns set): whether the rank key is
  // written now, and `beat` filled with m's counters against the content the key holds. Written
  // when the content (m without header.at_ns and the counters) differs from the last write's —
  // then `payload()` is m's text and `m.header.at_ns` its written_ns — or rewritten unchanged,
  // the same text, once the key's TTL would otherwise come within two heartbeats of running out.
  // now_ns: a monotonic clock. REQUIRES: ttl_ns, heartbeat_ns > 0.
  [[nodiscard]] bool Next(const RankRegistration& m, std::int64_t now_ns, std::int64_t ttl_ns,
                          std::int64_t heartbeat_ns, RankBeat& beat);
  // The text to write (valid after Next returned true once).
  [[nodiscard]] const std::string& payload() const { return payload_; }

 private:
  // Whether m differs from the last write's content in at_ns and the counters alone. Copies them
  // into content_ and compares the whole struct, so a field added to RankRegistration counts.
  [[nodiscard]] bool SameContent(const RankRegistration& m);

  RankRegistration content_;        // the last write's content (its at_ns and counters: m's)
  std::string payload_;             // the last write's text; empty before the first
  std::int64_t written_ns_ = 0;     // its at_ns
  std::int64_t last_write_ns_ = 0;  // monotonic, when it was last (re)written
};

// The beats in a job's agent heartbeats (validated agent_heartbeat messages), by rank; an agent
// without `beats` gives none. REQUIRES: the heartbeats outlive the index (beats are read in place).
class BeatIndex {
 public:
  struct Beat {
    const nlohmann::json* beat = nullptr;  // an element of its heartbeat's `beats`
    const std::string* host = nullptr;     // the heartbeat's host
    std::int64_t at_ns = 0;                // the heartbeat's at_ns
  };
  BeatIndex() = default;
  explicit BeatIndex(const std::vector<nlohmann::json>& agents);
  // The beats naming `rank`, in the heartbeats' order.
  [[nodiscard]] std::span<const Beat> Of(std::int64_t rank) const;

 private:
  std::vector<std::int64_t> ranks_;  // sorted
  std::vector<Beat> beats_;          // beats_[i] names ranks_[i]; a rank's in the heartbeats' order
};

// The beat of `m` against the content written at written_ns.
[[nodiscard]] RankBeat BeatOf(const RankRegistration& m, std::int64_t written_ns);

// Puts the counters of `beat` (a validated element of the `beats` of a validated agent_heartbeat
// from host `host`, written at at_ns) into `registration` (a validated rank_register) and sets its
// at_ns to at_ns, when the beat goes with it: same rank and host, written_ns equal to the
// registration's at_ns, one count per communicator. Returns whether it did; false leaves it as is.
bool ApplyBeat(nlohmann::json& registration, const nlohmann::json& beat, const std::string& host,
               std::int64_t at_ns);

// Every registration of `ranks` given the beat that goes with it among `agents` (validated
// agent_heartbeats), where there is one: what the rank keys would say had they been rewritten
// with each heartbeat. For readers of a whole job at once (falcon-ctl).
void ApplyBeats(std::vector<nlohmann::json>& ranks, const std::vector<nlohmann::json>& agents);

}  // namespace falcon::protocol
