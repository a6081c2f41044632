// How both daemons read their config file, so that they refuse the same things: the path must
// name a regular file (after symlinks: never a directory, a device such as /dev/zero, or a FIFO,
// which is opened without blocking and refused), of at most max_bytes (1 MiB by default; the
// read stops there, so a file that grows is refused too), holding text: no NUL and no control
// character other than tab, CR and newline (a binary file is refused naming the line and byte).
// ParseConfigLines is the one syntax both read: `name = value` lines, blank lines and `#`
// comments skipped; a value is the text up to a `#` (trimmed), or "double-quoted" (a backslash
// escapes a quote or a backslash inside; it may then hold a `#`) followed by nothing but a
// comment. What the names mean, and whether one may repeat, is each daemon's table's business.
// ReadConfigFile also returns the file's permission bits, for ExposedSecretWarning: a file that
// sets a password and that group or others may read gets a warning (the daemon logs it), never a
// refusal (a deployment that manages access otherwise keeps working).
// Thread-safety: stateless functions. Must never: block on the file's type (FIFOs), read past
// max_bytes + 1, or print anything (errors and warnings are returned).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "falcon/status.h"

namespace falcon::daemon {

inline constexpr std::size_t kMaxConfigFileBytes = 1 << 20;

struct ConfigFileText {
  std::string text;
  std::uint32_t mode = 0;  // permission bits (st_mode & 07777)
};

// NotFound when the file cannot be opened; InvalidArgument when it is not a regular file, too
// large, or not text. Every message names the path.
[[nodiscard]] Result<ConfigFileText> ReadConfigFile(const std::string& path,
                                                    std::size_t max_bytes = kMaxConfigFileBytes);

struct ConfigLine {
  std::size_t line = 0;  // 1-based
  std::string name;      // trimmed, never empty
  std::string value;     // unquoted
};

// The settings of config `text` in file order. InvalidArgument "<file_name>:<line>: ..." for a
// line that is not `name = value` (a `[section]` included) or a quoted value left open or followed
// by more than a comment.
[[nodiscard]] Result<std::vector<ConfigLine>> ParseConfigLines(std::string_view text,
                                                               std::string_view file_name);

// The warning for a config file at `path` with permission bits `mode` that sets the secret
// option `option`, when group or others may read it (mode & 077); nullopt otherwise.
std::optional<std::string> ExposedSecretWarning(const std::string& path, std::uint32_t mode,
                                                std::string_view option);

}  // namespace falcon::daemon
