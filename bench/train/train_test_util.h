// Test kit for falcon-train-emu's end-to-end tests: run a job under falcon-emu-run, watch its
// output line by line, read the per-rank reports.
//
// Thread-safety: call from the test's main thread only (fork). Must never: wait without a bound
// (falcon-emu-run's --job-timeout ends every job).
#ifndef FALCON_BENCH_TRAIN_TRAIN_TEST_UTIL_H_
#define FALCON_BENCH_TRAIN_TRAIN_TEST_UTIL_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace falcon::train::testing {

struct JobResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr of every rank, "[rank R] " prefixed
};

// Runs falcon-emu-run with `launcher_args` -- falcon-train-emu `trainer_args`; calls on_line for
// every output line as it arrives; `env` is set for the job.
inline JobResult RunJob(const std::vector<std::string>& launcher_args, const std::vector<std::string>& trainer_args,
                        const std::function<void(const std::string&)>& on_line = nullptr,
                        const std::vector<std::pair<std::string, std::string>>& env = {}) {
  std::vector<std::string> args = {FALCON_EMU_RUN_BIN, "--job-timeout", "90"};
  args.insert(args.end(), launcher_args.begin(), launcher_args.end());
  args.push_back("--");
  args.push_back(FALCON_TRAIN_EMU_BIN);
  args.insert(args.end(), trainer_args.begin(), trainer_args.end());
  int fds[2];
  JobResult r;
  if (pipe2(fds, O_CLOEXEC) != 0) return r;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  FILE* in = fdopen(fds[0], "r");
  char line[4096];
  while (in && std::fgets(line, sizeof line, in)) {
    r.output += line;
    if (on_line) on_line(line);
  }
  if (in) std::fclose(in);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

class TrainJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/falcon-train-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string ReportSpec() const { return dir_ + "/report-{rank}.json"; }
  nlohmann::json Report(int rank) const {
    std::ifstream in(dir_ + "/report-" + std::to_string(rank) + ".json");
    return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  // Median iteration time of every rank.
  std::vector<double> Medians(int world) const {
    std::vector<double> m;
    for (int r = 0; r < world; ++r) m.push_back(Report(r)["summary"]["median_s"].get<double>());
    return m;
  }

  std::string dir_;
};

}  // namespace falcon::train::testing

#endif  // FALCON_BENCH_TRAIN_TRAIN_TEST_UTIL_H_
