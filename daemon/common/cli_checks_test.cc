// FiniteRange / NonNegative on a real CLI11 app: nan, inf, negative numbers for unsigned options
// and out-of-range values are refused with a message naming the option; good values pass.
#include "daemon/common/cli_checks.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace falcon::daemon {
namespace {

// Parses `--x VALUE` into a double option checked by FiniteRange(1, 10) and `--n VALUE` into an
// unsigned one checked by NonNegative; "" when accepted, else CLI11's message.
std::string Parse(const std::string& flag, const std::string& value) {
  CLI::App app;
  double x = 0;
  std::uint64_t n = 0;
  app.add_option("--x", x)->check(FiniteRange(1, 10));
  app.add_option("--n", n)->check(NonNegative());
  try {
    app.parse(std::vector<std::string>{value, flag});  // CLI11 takes them reversed
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(CliChecksTest, NonFiniteNegativeAndOutOfRangeNumbersAreRefused) {
  for (const char* bad : {"nan", "NaN", "inf", "-inf", "infinity", "1e999", "0.5", "11", "abc", "5x", ""}) {
    const std::string why = Parse("--x", bad);
    EXPECT_FALSE(why.empty()) << bad;
    EXPECT_NE(why.find("--x"), std::string::npos) << why;
  }
  for (const char* good : {"1", "10", "5.5", "1e0"}) EXPECT_EQ(Parse("--x", good), "") << good;
  for (const char* bad : {"-1", "-0", "nan", "-18446744073709551615"}) {
    const std::string why = Parse("--n", bad);
    EXPECT_FALSE(why.empty()) << bad;
    EXPECT_NE(why.find("--n"), std::string::npos) << why;
  }
  for (const char* good : {"0", "1", "18446744073709551615"}) EXPECT_EQ(Parse("--n", good), "") << good;
}

TEST(CliChecksTest, BooleansAreTheAgentsWordsAndTextHasNoControlCharacters) {
  auto parse = [](const CLI::Validator& check, const std::string& value) {
    CLI::App app;
    std::string v;
    app.add_option("--v", v)->check(check);
    try {
      app.parse(std::vector<std::string>{value, "--v"});
    } catch (const CLI::ParseError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const char* good : {"true", "false", "1", "0", "yes", "no", "on", "off"}) {
    EXPECT_EQ(parse(Boolean(), good), "") << good;
  }
  for (const std::string& bad : {std::string("12z0"), std::string("2"), std::string("TRUE "), std::string(),
                                 std::string("1\0", 2)}) {
    EXPECT_NE(parse(Boolean(), bad).find("--v"), std::string::npos) << bad;
  }
  EXPECT_EQ(parse(PlainText(), "a b \"c\" #d"), "");
  for (const std::string& bad : {std::string("a\nb"), std::string("a\0", 2), std::string("\x1b[0m"), std::string("\x7f")}) {
    EXPECT_NE(parse(PlainText(), bad).find("--v"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace falcon::daemon
