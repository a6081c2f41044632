// RankKeyCache: the controller's copy of the rank keys' contents, so that a view re-read fetches
// only the rank keys whose content changed.
//
// An agent writes a rank key when its content changes and renews it unchanged; each heartbeat
// carries the rank's counters as a beat naming the content they go with (written_ns, rank_beat.h).
// A re-read reads every agent key, then fetches a rank key only when a beat of its rank names a
// content not held here for that (rank, host) — or when no agent beats for it (an agent that
// rewrites the key with every heartbeat instead). The registrations handed to the view are the
// held contents with their beats' counters: what re-reading every key would have given.
// Two claimants of one rank (two hosts) each keep their own content here, so the view sees both
// while both beat, whichever of them wrote the key last. A content is held as the view's entry
// (RankEntry, a few hundred bytes), not as the parsed message (kilobytes): one per rank.
// Thread-safety: a value type; one thread. Must never: do I/O, or pair counters with a content
// other than the one they were counted against.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/controller/job_view.h"
#include "daemon/protocol/rank_beat.h"

namespace falcon::controller {

class RankKeyCache {
 public:
  // Starts a re-read with its agent heartbeats (validated agent_heartbeat messages).
  // REQUIRES: `agents` outlives this re-read's Registrations call (the beats are read in place).
  void SetAgents(const std::vector<nlohmann::json>& agents);
  // Whether the rank key of `rank` (nullopt: a key whose name holds no rank) must be fetched.
  [[nodiscard]] bool NeedsFetch(std::optional<std::int64_t> rank) const;
  // A fetched key's registration (validated rank_register).
  void Fetched(const nlohmann::json& registration);
  // The registrations of the ranks whose keys exist now (`ranks`, with the ranks read from
  // fetched keys' contents added): per rank, each beating host's held content with its beat's
  // counters, or the content fetched now as it is where no beat goes with it. Forgets what no
  // key and no beat refers to any more, and ends the re-read.
  [[nodiscard]] std::vector<RankEntry> Registrations(const std::vector<std::int64_t>& ranks);

  // Ends a re-read that failed before Registrations: what it fetched stays held, its beats go.
  void Abandon();

  [[nodiscard]] std::size_t size() const { return held_.size(); }

 private:
  struct Held {
    RankEntry entry;                   // as its key held it
    std::vector<std::uint32_t> slots;  // each of entry.info.comms' index in the key's comms
    std::size_t comms = 0;             // the key's number of comms (a beat has one count each)
    std::int64_t written_ns = 0;       // the key's at_ns
    bool fetched_now = false;          // fetched in this re-read
  };
  protocol::BeatIndex beats_;                                  // this re-read's
  std::map<std::pair<std::int64_t, std::string>, Held> held_;  // (rank, host) -> content
  // The content held for the beat's host that the beat names, if any.
  [[nodiscard]] const Held* Matching(std::int64_t rank, const protocol::BeatIndex::Beat& b) const;
};

}  // namespace falcon::controller
