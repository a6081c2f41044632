// Connection settings for Falcon's Redis client (filled from a daemon's config table).
// Plain value type. Must never: be logged with the password (use Describe()).
#pragma once

#include <string>

namespace falcon::redis {

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string user;      // ACL user; empty: AUTH <password> (the default user)
  std::string password;  // empty: no AUTH
  int db = 0;            // SELECT db when != 0
  int connect_timeout_ms = 1000;
  int command_timeout_ms = 2000;  // per call, unless the call gives its own
  int backoff_min_ms = 100;       // first reconnect delay after a failed attempt
  int backoff_max_ms = 5000;      // delays double up to this

  // "host:port db N user U" without the password, for logs.
  std::string Describe() const {
    std::string s = host + ":" + std::to_string(port);
    if (db != 0) s += " db " + std::to_string(db);
    if (!user.empty()) s += " user " + user;
    if (!password.empty()) s += " (password set)";
    return s;
  }
};

}  // namespace falcon::redis
