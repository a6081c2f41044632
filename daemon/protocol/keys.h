// Building Redis key and channel names from the patterns in include/falcon/protocol.h.
//
// The only way Falcon code makes a key: FormatKey(kRankKey, {.job = "j", .rank = 3}) is
// "falcon:{j}:rank:3". {job} keeps its braces: they make the job the key's Redis Cluster hash tag,
// so all of a job's keys live in one hash slot; the other variables are replaced bare. Every
// variable the pattern uses must be given and valid (1..128 of [A-Za-z0-9._-]); a pattern
// variable left unset, or a value that could smuggle a ':' or a brace into the key, is an error.
// Thread-safety: pure functions. Must never: accept a value that changes the key's structure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "falcon/protocol.h"
#include "falcon/status.h"

namespace falcon::protocol {

struct KeyVars {
  std::string_view job;
  std::string_view host;
  std::optional<std::int64_t> rank;
};

// True if `value` may stand for a pattern variable.
[[nodiscard]] bool ValidKeyPart(std::string_view value);

// The key of `spec` with its variables filled in.
[[nodiscard]] Result<std::string> FormatKey(const KeySpec& spec, const KeyVars& vars);

// A SCAN MATCH pattern for keys of `spec`: variables given in `vars` are filled in (and must be
// valid), {host} and {rank} left unset become '*'. {job} is required. Key parts cannot hold glob
// characters (ValidKeyPart), so the pattern matches exactly the keys FormatKey can produce.
[[nodiscard]] Result<std::string> KeyMatchPattern(const KeySpec& spec, const KeyVars& vars);

// `name` made usable as a key part: invalid characters become '_', truncated to 128, "_" if empty.
[[nodiscard]] std::string SanitizeKeyPart(std::string_view name);

}  // namespace falcon::protocol
