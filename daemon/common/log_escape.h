// Log values that carry outside input (command ids, reasons, Redis key names, message excerpts,
// hosts, paths): one escaper for both daemons' `key=value` log lines, so that no value can end a
// line, forge another `event=` line or a `key=value` pair, or break a quoted field.
//
// EscapeLogText escapes `\` and `"` with a backslash, writes \n \r \t as those two characters
// and every other control byte (0x00-0x1f, 0x7f) as \xHH; other bytes (UTF-8 included) pass
// unchanged. Text longer than max_bytes is cut there and ends with "..." (a cut never splits an
// escape). LogValue is for a bare field (`id={}`): the text itself when it is non-empty and made
// only of [A-Za-z0-9._:/@+,{}-] (a Redis key, "falcon:{job}:rank:3", stays bare), else the escaped
// text in double quotes. LogQuoted always quotes
// (`reason={}`, replacing `reason=\"{}\"`).
// Thread-safety: pure functions. Must never: throw (beyond std::bad_alloc), or log.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace falcon::daemon {

inline constexpr std::size_t kMaxLogValueBytes = 1024;

std::string EscapeLogText(std::string_view text, std::size_t max_bytes = kMaxLogValueBytes);
std::string LogValue(std::string_view text);
std::string LogQuoted(std::string_view text);

}  // namespace falcon::daemon
