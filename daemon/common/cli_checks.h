// CLI11 validators that both daemons and falcon-ctl use for numbers from flags, environment
// variables and config files. CLI::Range lets `nan` through (every comparison with it is false)
// and an unsigned option takes "-1" as 2^64-1; these refuse both, with a message that CLI11
// prefixes with the option's name.
//   FiniteRange(min, max): a finite number in [min, max] (integer options still need an integer:
//     CLI11's conversion refuses "5.5" after this check passes).
//   NonNegative: a number >= 0 (for unsigned options).
//   Boolean: exactly true|false|1|0|yes|no|on|off, as the agent's config reads booleans (CLI11
//     alone takes "12z0..." as true: it reads a number's leading digits and ignores the rest).
//   PlainText: no control character (as the agent's config refuses: one would break the file
//     --print-config writes and the log lines that quote the value).
// Header-only (CLI11 is header-only too). Thread-safety: the validators hold only their bounds.
// Must never: accept text that strtod does not consume entirely.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

namespace falcon::daemon {

namespace cli_checks_detail {

// Parses all of `text` as a number; "" when it is one (stored in *value), else why not.
inline std::string ParseNumber(const std::string& text, double* value) {
  char* end = nullptr;
  errno = 0;
  *value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) return "'" + text.substr(0, 40) + "' is not a number";
  if (!std::isfinite(*value) || errno == ERANGE) return "'" + text.substr(0, 40) + "' is not a finite number";
  return "";
}

inline std::string Format(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace cli_checks_detail

inline CLI::Validator FiniteRange(double min, double max) {
  const std::string bounds = cli_checks_detail::Format(min) + " - " + cli_checks_detail::Format(max);
  return CLI::Validator(
      [min, max, bounds](std::string& text) -> std::string {
        double v = 0;
        if (std::string why = cli_checks_detail::ParseNumber(text, &v); !why.empty()) return why;
        if (v < min || v > max) return "value " + text + " not in range " + bounds;
        return "";
      },
      "NUMBER in [" + bounds + "]", "FINITE_RANGE");
}

inline CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (std::string why = cli_checks_detail::ParseNumber(text, &v); !why.empty()) return why;
        const auto first = text.find_first_not_of(" \t");
        if (v < 0 || (first != std::string::npos && text[first] == '-')) return "value " + text + " is negative";
        return "";
      },
      "NUMBER >= 0", "NON_NEGATIVE");
}

inline CLI::Validator Boolean() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        for (const char* word : {"true", "false", "1", "0", "yes", "no", "on", "off"}) {
          if (text == word) return "";
        }
        return "'" + text.substr(0, 40) + "' is not a boolean (true/false)";
      },
      "", "BOOLEAN");
}

inline CLI::Validator PlainText() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        for (std::size_t i = 0; i < text.size(); ++i) {
          const auto c = static_cast<unsigned char>(text[i]);
          if (c < 0x20 || c == 0x7f) return "control character at offset " + std::to_string(i) + " is not allowed";
        }
        return "";
      },
      "", "PLAIN_TEXT");
}

}  // namespace falcon::daemon
