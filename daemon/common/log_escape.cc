// Log value escaping. See log_escape.h for the contract.
#include "daemon/common/log_escape.h"

namespace falcon::daemon {
namespace {

bool Bare(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == ':' || c == '/' || c == '@' || c == '+' || c == ',' || c == '-' || c == '{' || c == '}';
}

}  // namespace

std::string EscapeLogText(std::string_view text, std::size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size() < max_bytes ? text.size() + 2 : max_bytes + 3);
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (i >= max_bytes) {
      out += "...";
      break;
    }
    const char c = text[i];
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += "\\x";
          out += kHex[u >> 4];
          out += kHex[u & 15];
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string LogValue(std::string_view text) {
  bool bare = !text.empty() && text.size() <= kMaxLogValueBytes;
  for (std::size_t i = 0; bare && i < text.size(); ++i) bare = Bare(text[i]);
  return bare ? std::string(text) : LogQuoted(text);
}

std::string LogQuoted(std::string_view text) { return "\"" + EscapeLogText(text) + "\""; }

}  // namespace falcon::daemon
