// Test support: a real redis-server for one test, on a free loopback port with a temporary
// directory (no persistence), optionally password-protected or with an ACL user. Start() waits
// for PING (with AUTH) up to a deadline; Kill() + Start() restarts it on the same port (an empty
// server, as after a crash without persistence). The destructor stops it and removes the dir.
// Thread-compatible. Must never: leave a redis-server running after the test (it is killed in
// the destructor), or sleep to synchronise (it polls PING with a deadline).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "daemon/redis/redis_connection.h"
#include "daemon/redis/redis_options.h"
#include "falcon/status.h"
#include "tests/support/subprocess.h"

namespace falcon::testing {

struct RedisServerOptions {
  std::string password;      // requirepass for the default user ("" = none)
  std::string acl_user;      // an extra ACL user ("" = none)
  std::string acl_password;  // its password
  // Its permissions, as ACL SETUSER rules (space-separated): every command by default.
  std::string acl_rules = "~* &* +@all";
  // A Redis Cluster node (cluster-enabled, its nodes.conf in the server's directory); FormCluster
  // joins such nodes into one cluster.
  bool cluster = false;
};

class RedisServer {
 public:
  explicit RedisServer(RedisServerOptions options = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts the server (a free port the first time, the same port after Kill/Stop) and waits
  // until it answers PING, at most deadline_s.
  [[nodiscard]] Status Start(double deadline_s = 15);
  void Kill();  // SIGKILL, reaped
  void Stop();  // SIGTERM, reaped
  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  int cluster_port() const { return cluster_port_; }  // the cluster bus; 0 unless options.cluster
  const std::string& dir() const { return dir_.path(); }
  // Client options for this server: the default user's password if any (not the ACL user).
  redis::RedisOptions ClientOptions() const;
  std::string Log() const;  // the server's log

 private:
  void Signal(int sig);

  RedisServerOptions options_;
  TempDir dir_;
  int port_ = 0;
  int cluster_port_ = 0;  // the cluster bus (options_.cluster)
  pid_t pid_ = -1;
};

// A counter of Redis's INFO on `conn`: in `section`, the line named `line`, and in it the field
// `field` ("" for the line's own value), e.g. ("commandstats", "cmdstat_hgetall", "calls").
// 0 while the line or field is absent (nothing counted yet); -1 if INFO failed.
long long InfoCounter(redis::RedisConnection& conn, const std::string& section, const std::string& line,
                      const std::string& field);

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreeLoopbackPort();

// Joins started cluster nodes (RedisServerOptions::cluster) into one Redis Cluster: the 16384
// hash slots in equal ranges, node i the i-th range, then CLUSTER MEET and a wait, at most
// deadline_s, until every node reports cluster_state:ok and knows every other.
[[nodiscard]] Status FormCluster(const std::vector<RedisServer*>& nodes, double deadline_s = 30);

}  // namespace falcon::testing
