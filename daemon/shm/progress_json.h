// The progress document: every rank's progress on its communicators (analyzer::RankProgress) as
// one JSON document. `falcon-ctl dump` writes it; `falcon-ctl hang --progress` reads it; the
// Flight Recorder converter (scripts/falcon-flight-recorder) writes it from PyTorch's dumps.
//
//   {"format": "falcon-progress", "version": 1, "source": "shm" | "flight-recorder" | ...,
//    "ranks": [{"rank": 3, "host": "node-1",
//               "in_call": null | "<comm>",      // host thread inside an NCCL call on it
//               "comms": [{"comm": "<comm>", "name": "", "nranks": 8, "comm_rank": 3,
//                          "issued": 120, "completed": 119, "completion_known": true}],
//               "recent": [{"comm": "<comm>", "seq": 119, "op": "AllReduce",
//                           "dtype": "bfloat16" | null, "redop": "sum" | null, "peer": -1,
//                           "count": 4096, "stream": "<hex>" | null, "group": 0,
//                           "completed": false, "issue_ns": 0}]}]}
// <comm> is a communicator id, 16 lower-case hex digits, alike on every member. `recent` is
// oldest first. Names follow the call-record dump (record_json.h): op "AllReduce", dtype
// "float32", redop "sum" | "prod" | "max" | "min" | "avg" | "premulsum". Optional on input:
// host, name, completion_known (true; false: completed is a lower bound, the device work is not
// tracked), in_call, dtype, redop, peer (-1), stream, group (0: none; calls of a rank with the
// same group were launched together by one ncclGroupEnd), completed (false), issue_ns (0).
// Unknown keys are ignored (later versions may add some); a newer major version is refused.
// Pure functions; thread-safe.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "analyzer/hang_diagnosis.h"

namespace falcon::daemon {

inline constexpr int kProgressFormatVersion = 1;

struct ProgressDocument {
  std::string source;
  std::vector<analyzer::RankProgress> ranks;
};

nlohmann::json ProgressToJson(std::span<const analyzer::RankProgress> ranks, std::string_view source);
// nullopt and *error = "ranks[2].comms[0].issued: expected a non-negative integer" (the path of
// the first bad value) when the document does not follow the format above.
std::optional<ProgressDocument> ParseProgress(const nlohmann::json& doc, std::string* error);
// One element of a document's "ranks" alone (what a `progress` command's ack result carries),
// checked as ParseProgress checks it; *error's path starts at "rank".
std::optional<analyzer::RankProgress> ParseProgressRank(const nlohmann::json& rank, std::string* error);

}  // namespace falcon::daemon
