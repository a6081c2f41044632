// Config file reading. See config_file.h for the contract.
#include "daemon/common/config_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace falcon::daemon {
namespace {

const char* TypeName(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string Trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

// A value as a config file writes it: up to a '#' comment, or "double-quoted" (a backslash
// escapes a quote or a backslash inside), which may hold '#', followed by nothing but a comment.
Result<std::string> FileValue(std::string_view text) {
  const auto start = text.find_first_not_of(" \t\r");
  if (start == std::string_view::npos || text[start] != '"') return Trim(text.substr(0, text.find('#')));
  std::string out;
  for (std::size_t i = start + 1; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == '"' || text[i + 1] == '\\')) {
      out += text[++i];
    } else if (text[i] == '"') {
      if (!Trim(text.substr(i + 1, text.find('#', i + 1) - (i + 1))).empty()) {
        return Status::InvalidArgument("text after the closing quote");
      }
      return out;
    } else {
      out += text[i];
    }
  }
  return Status::InvalidArgument("no closing quote");
}

std::string Octal(std::uint32_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

}  // namespace

Result<ConfigFileText> ReadConfigFile(const std::string& path, std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below by its type.
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (fd.get() < 0) {
    return Status::NotFound("cannot read config file " + path + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return Status::NotFound("cannot stat config file " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("config file " + path + " is " + TypeName(st.st_mode) +
                                   ", not a regular file");
  }
  const std::string too_large = "config file " + path + " is larger than " + std::to_string(max_bytes) + " bytes";
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) return Status::InvalidArgument(too_large);
  ConfigFileText out;
  out.mode = static_cast<std::uint32_t>(st.st_mode & 07777);
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::NotFound("cannot read config file " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    out.text.append(buf, static_cast<std::size_t>(n));
    if (out.text.size() > max_bytes) return Status::InvalidArgument(too_large);  // it grew
  }
  std::size_t line = 1;
  for (std::size_t i = 0; i < out.text.size(); ++i) {
    const auto c = static_cast<unsigned char>(out.text[i]);
    if (c == '\n') ++line;
    if ((c < 0x20 && c != '\t' && c != '\r' && c != '\n') || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned>(c));
      return Status::InvalidArgument("config file " + path + " line " + std::to_string(line) +
                                     ": control character " + hex + " (byte " + std::to_string(i) +
                                     "): not a text file");
    }
  }
  return out;
}

Result<std::vector<ConfigLine>> ParseConfigLines(std::string_view text, std::string_view file_name) {
  std::vector<ConfigLine> out;
  std::size_t n = 0;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    ++n;
    const std::string origin = std::string(file_name) + ":" + std::to_string(n);
    const auto hash = line.find('#');
    const auto eq = line.find('=');
    if (eq == std::string_view::npos || (hash != std::string_view::npos && hash < eq)) {
      if (Trim(line.substr(0, hash)).empty()) continue;  // blank or a comment
      return Status::InvalidArgument(origin + ": expected 'name = value'");
    }
    std::string name = Trim(line.substr(0, eq));
    if (name.empty()) return Status::InvalidArgument(origin + ": expected 'name = value'");
    Result<std::string> value = FileValue(line.substr(eq + 1));
    if (!value.ok()) return Status::InvalidArgument(origin + ": " + name + ": " + value.status().message());
    out.push_back({n, std::move(name), std::move(value).value()});
  }
  return out;
}

std::optional<std::string> ExposedSecretWarning(const std::string& path, std::uint32_t mode,
                                                std::string_view option) {
  if ((mode & 077) == 0) return std::nullopt;
  return "config file " + path + " sets " + std::string(option) + " and group or others may read it (mode " +
         Octal(mode) + "): chmod 600 " + path + ", or pass the password through the environment";
}

}  // namespace falcon::daemon
