// RedisServer test fixture. See redis_server.h for the contract.
#include "tests/support/redis_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "daemon/redis/redis_commands.h"

namespace falcon::testing {

long long InfoCounter(redis::RedisConnection& conn, const std::string& section, const std::string& line,
                      const std::string& field) {
  Result<redis::RedisReply> info = conn.Command({"INFO", section});
  if (!info.ok()) return -1;
  const std::string& text = info.value().str;
  std::size_t at = text.find("\n" + line + ":");
  if (at == std::string::npos) return 0;
  at += line.size() + 2;
  if (!field.empty()) {
    at = text.find(field + "=", at);
    if (at == std::string::npos) return 0;
    at += field.size() + 1;
  }
  return std::atoll(text.c_str() + at);
}

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

RedisServer::RedisServer(RedisServerOptions options) : options_(std::move(options)) {}

RedisServer::~RedisServer() { Kill(); }

redis::RedisOptions RedisServer::ClientOptions() const {
  redis::RedisOptions o;
  o.host = "127.0.0.1";
  o.port = port_;
  o.password = options_.password;
  o.connect_timeout_ms = 1000;
  o.command_timeout_ms = 2000;
  o.backoff_min_ms = 20;
  o.backoff_max_ms = 200;
  return o;
}

std::string RedisServer::Log() const {
  std::ifstream f(dir_.path() + "/redis.log");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

Status RedisServer::Start(double deadline_s) {
  if (running()) return Status::Ok();
  if (port_ == 0) port_ = FreeLoopbackPort();
  if (port_ == 0) return Status::Unavailable("no free loopback port");
  std::vector<std::string> args{"redis-server", "--port", std::to_string(port_), "--bind",
                                "127.0.0.1", "--dir", dir_.path(), "--save", "",
                                "--appendonly", "no", "--daemonize", "no"};
  if (!options_.password.empty()) args.insert(args.end(), {"--requirepass", options_.password});
  if (options_.cluster) {
    // The bus port is named: by default it is the port + 10000, which may be taken, or past 65535.
    if (cluster_port_ == 0) cluster_port_ = FreeLoopbackPort();
    if (cluster_port_ == 0) return Status::Unavailable("no free loopback port for the cluster bus");
    args.insert(args.end(), {"--cluster-enabled", "yes", "--cluster-config-file", dir_.path() + "/nodes.conf",
                             "--cluster-node-timeout", "5000", "--cluster-port", std::to_string(cluster_port_)});
  }
  if (!options_.acl_user.empty()) {
    // Command-line config: the words after --user up to the next --option form one line.
    args.insert(args.end(), {"--user", options_.acl_user, "on", ">" + options_.acl_password});
    std::istringstream rules(options_.acl_rules);
    for (std::string rule; rules >> rule;) args.push_back(rule);
  }
  const std::string log = dir_.path() + "/redis.log";
  pid_ = ::fork();
  if (pid_ < 0) return Status::IoError("fork failed");
  if (pid_ == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  redis::RedisOptions o = ClientOptions();
  if (o.password.empty() && !options_.acl_user.empty()) {
    o.user = options_.acl_user;
    o.password = options_.acl_password;
  }
  o.connect_timeout_ms = 200;
  bool exited = false;
  const bool up = WaitUntil(
      [&] {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          exited = true;
          return true;
        }
        redis::RedisConnection c(o);
        return c.Connect().ok() && redis::Ping(c).ok();
      },
      deadline_s);
  if (exited) {
    pid_ = -1;
    return Status::Unavailable("redis-server exited at start: " + Log());
  }
  if (!up) {
    Kill();
    return Status::Unavailable("redis-server did not answer PING in time: " + Log());
  }
  return Status::Ok();
}

void RedisServer::Signal(int sig) {
  if (pid_ <= 0) return;
  ::kill(pid_, sig);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

Status FormCluster(const std::vector<RedisServer*>& nodes, double deadline_s) {
  constexpr int kSlots = 16384;
  if (nodes.empty()) return Status::InvalidArgument("no cluster nodes");
  std::vector<std::unique_ptr<redis::RedisConnection>> conns;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    conns.push_back(std::make_unique<redis::RedisConnection>(nodes[i]->ClientOptions()));
    if (Status s = conns.back()->Connect(); !s.ok()) return s;
    const int lo = static_cast<int>(i * kSlots / nodes.size());
    const int hi = static_cast<int>((i + 1) * kSlots / nodes.size()) - 1;
    Result<redis::RedisReply> r =
        conns.back()->Command({"CLUSTER", "ADDSLOTSRANGE", std::to_string(lo), std::to_string(hi)});
    if (!r.ok()) return r.status();
  }
  for (std::size_t i = 1; i < nodes.size(); ++i) {
    Result<redis::RedisReply> r =
        conns[0]->Command({"CLUSTER", "MEET", "127.0.0.1", std::to_string(nodes[i]->port()),
                           std::to_string(nodes[i]->cluster_port())});
    if (!r.ok()) return r.status();
  }
  const std::string known = "cluster_known_nodes:" + std::to_string(nodes.size());
  const bool ok = WaitUntil(
      [&] {
        for (auto& c : conns) {
          Result<redis::RedisReply> info = c->Command({"CLUSTER", "INFO"});
          if (!info.ok() || info.value().str.find("cluster_state:ok") == std::string::npos ||
              info.value().str.find(known) == std::string::npos) {
            return false;
          }
        }
        return true;
      },
      deadline_s);
  return ok ? Status::Ok() : Status::Unavailable("the cluster did not form in time");
}

void RedisServer::Kill() { Signal(SIGKILL); }
void RedisServer::Stop() { Signal(SIGTERM); }

}  // namespace falcon::testing
