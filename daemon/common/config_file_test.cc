// ReadConfigFile on real files: what both daemons refuse (directories, devices, FIFOs, files too
// large, binary files) and what they read; ExposedSecretWarning by permission bits.
#include "daemon/common/config_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

namespace falcon::daemon {
namespace {

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/falcon-config-file-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)std::system(("rm -rf '" + dir_ + "'").c_str()); }  // best effort
  std::string Write(const std::string& name, const std::string& text, mode_t mode = 0600) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST_F(ConfigFileTest, RegularTextFilesAreReadWithTheirMode) {
  const std::string path = Write("ok.conf", "# comment\njob = \"a\"\r\n\tx=1\n", 0640);
  Result<ConfigFileText> r = ReadConfigFile(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r.value().text, "# comment\njob = \"a\"\r\n\tx=1\n");
  EXPECT_EQ(r.value().mode, 0640u);
  ASSERT_EQ(::symlink(path.c_str(), (dir_ + "/link.conf").c_str()), 0);
  EXPECT_TRUE(ReadConfigFile(dir_ + "/link.conf").ok()) << "a symlink to a regular file is fine";
  EXPECT_TRUE(ReadConfigFile(Write("empty.conf", "")).ok());
}

TEST_F(ConfigFileTest, WhatIsNotASmallTextFileIsRefusedNamingWhy) {
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0600), 0);
  struct Case {
    std::string path;
    Status::Code code;
    std::string why;
  } cases[] = {
      {dir_, Status::Code::kInvalidArgument, "is a directory"},
      {"/dev/zero", Status::Code::kInvalidArgument, "is a character device"},
      {dir_ + "/fifo", Status::Code::kInvalidArgument, "is a FIFO"},
      {dir_ + "/absent", Status::Code::kNotFound, "cannot read config file"},
      {Write("big", std::string(kMaxConfigFileBytes + 1, '#')), Status::Code::kInvalidArgument, "larger than"},
      {Write("nul", std::string("job = a\n\0\n", 10)), Status::Code::kInvalidArgument, "line 2: control character 0x00"},
      {Write("esc", "a=1\nb=2\nc=\x1b[31m\n"), Status::Code::kInvalidArgument, "line 3: control character 0x1b"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    const auto t0 = std::chrono::steady_clock::now();
    Result<ConfigFileText> r = ReadConfigFile(c.path);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0)
        << "never blocks or reads without end";
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.path), std::string::npos) << "names the file";
  }
  EXPECT_TRUE(ReadConfigFile(Write("exact", std::string(kMaxConfigFileBytes, '#'))).ok()) << "the cap is inclusive";
}

TEST(ConfigFileWarningTest, APasswordFileOpenToGroupOrOthersIsWarnedAbout) {
  for (const std::uint32_t mode : {0600u, 0400u, 0700u}) {
    EXPECT_FALSE(ExposedSecretWarning("/etc/f.conf", mode, "redis_password")) << mode;
  }
  for (const std::uint32_t mode : {0640u, 0604u, 0644u, 0666u, 0610u}) {
    const std::optional<std::string> w = ExposedSecretWarning("/etc/f.conf", mode, "redis_password");
    ASSERT_TRUE(w) << mode;
    EXPECT_NE(w->find("/etc/f.conf"), std::string::npos);
    EXPECT_NE(w->find("redis_password"), std::string::npos);
    EXPECT_NE(w->find("chmod 600"), std::string::npos);
  }
  EXPECT_NE(ExposedSecretWarning("f", 0644, "x")->find("mode 0644"), std::string::npos);
}

}  // namespace
}  // namespace falcon::daemon
