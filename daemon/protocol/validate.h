// Validation of received protocol messages against their MessageSpec (include/falcon/protocol.h).
//
// Every reader of Redis calls ParseMessage (text -> validated JSON) before it looks at a field:
// the message must be a JSON object of at most kMaxMessageBytes, with "v" == kSchemaVersion,
// "type" == the expected type (or, for ParseAnyOf, one of a set), every required field present,
// and every listed field of the declared type, inside its choices/bounds; array elements inside
// their element bounds, and object elements that have an ObjectSpec checked like a message.
// Unknown fields are allowed (forward compatibility). The Status says which check failed and
// where ("rank_register.comms[3].nranks: value out of bounds"), for the log line.
// Thread-safety: pure functions. Must never: throw (JSON exceptions are caught here), or accept
// a message a check rejected.
#pragma once

#include <nlohmann/json.hpp>

#include <span>
#include <string_view>

#include "falcon/protocol.h"
#include "falcon/status.h"

namespace falcon::protocol {

inline constexpr std::size_t kMaxMessageBytes = 1 << 20;

// Checks an already parsed value.
[[nodiscard]] Status ValidateMessage(const nlohmann::json& message, const MessageSpec& spec);

// Parses `text` and validates it as `spec`.
[[nodiscard]] Result<nlohmann::json> ParseMessage(std::string_view text, const MessageSpec& spec);

// Parses `text` and validates it as whichever of `specs` its "type" names. *which (if given)
// points at that spec on success.
[[nodiscard]] Result<nlohmann::json> ParseAnyOf(std::string_view text,
                                                std::span<const MessageSpec> specs,
                                                const MessageSpec** which = nullptr);

const char* JsonTypeName(JsonType t);

}  // namespace falcon::protocol
