// Key formatting. See keys.h for the contract.
#include "daemon/protocol/keys.h"

namespace falcon::protocol {
namespace {

constexpr std::size_t kMaxPart = 128;

bool PartChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

bool ValidKeyPart(std::string_view value) {
  if (value.empty() || value.size() > kMaxPart) return false;
  for (char c : value) {
    if (!PartChar(c)) return false;
  }
  return true;
}

std::string SanitizeKeyPart(std::string_view name) {
  std::string out;
  for (char c : name.substr(0, kMaxPart)) out.push_back(PartChar(c) ? c : '_');
  return out.empty() ? std::string("_") : out;
}

namespace {

enum class Unset { kError, kWildcard };

Result<std::string> Expand(const KeySpec& spec, const KeyVars& vars, Unset unset) {
  std::string out;
  std::string_view p = spec.pattern;
  while (!p.empty()) {
    const std::size_t open = p.find('{');
    if (open == std::string_view::npos) {
      out.append(p);
      break;
    }
    out.append(p.substr(0, open));
    const std::size_t close = p.find('}', open);
    if (close == std::string_view::npos) {
      return Status::Internal("malformed key pattern " + std::string(spec.pattern));
    }
    const std::string_view var = p.substr(open + 1, close - open - 1);
    std::string value;
    bool wildcard = false;
    if (var == "job") {
      value = std::string(vars.job);
    } else if (var == "host") {
      value = std::string(vars.host);
      wildcard = value.empty() && unset == Unset::kWildcard;
    } else if (var == "rank") {
      if (!vars.rank && unset == Unset::kWildcard) {
        wildcard = true;
      } else if (!vars.rank) {
        return Status::InvalidArgument(std::string(spec.name) + " key needs a rank");
      } else if (*vars.rank < 0) {
        return Status::InvalidArgument("rank must be >= 0 in a key");
      } else {
        value = std::to_string(*vars.rank);
      }
    } else {
      return Status::Internal("unknown variable {" + std::string(var) + "} in key pattern");
    }
    if (wildcard) {
      value.assign(1, '*');  // not = "*": GCC 12 -O3 reports a false -Wrestrict on that
    } else if (!ValidKeyPart(value)) {
      return Status::InvalidArgument(std::string(spec.name) + " key: {" + std::string(var) +
                                     "} = '" + value.substr(0, 40) +
                                     "' is not 1..128 characters of [A-Za-z0-9._-]");
    }
    if (var == "job") {
      // The job is the key's Redis Cluster hash tag: every key of one job hashes to one slot,
      // so one cluster node holds the whole job and its multi-key reads never cross nodes.
      out.push_back('{');
      out.append(value);
      out.push_back('}');
    } else {
      out.append(value);
    }
    p = p.substr(close + 1);
  }
  return out;
}

}  // namespace

Result<std::string> FormatKey(const KeySpec& spec, const KeyVars& vars) {
  return Expand(spec, vars, Unset::kError);
}

Result<std::string> KeyMatchPattern(const KeySpec& spec, const KeyVars& vars) {
  return Expand(spec, vars, Unset::kWildcard);
}

}  // namespace falcon::protocol
