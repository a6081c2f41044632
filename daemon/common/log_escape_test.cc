// LogValue / LogQuoted / EscapeLogText: no value can end a log line, open a quoted field or
// forge a key=value pair; safe values stay bare and readable.
#include "daemon/common/log_escape.h"

#include <gtest/gtest.h>

#include <string>

namespace falcon::daemon {
namespace {

TEST(LogEscapeTest, ValuesCannotForgeLinesFieldsOrQuotes) {
  struct Case {
    std::string in;
    std::string value;   // LogValue
    std::string quoted;  // LogQuoted
  } cases[] = {
      {"falcon:{job}:rank:1", "falcon:{job}:rank:1", "\"falcon:{job}:rank:1\""},
      {"v7-3", "v7-3", "\"v7-3\""},
      {"", "\"\"", "\"\""},
      {"a b", "\"a b\"", "\"a b\""},
      {"x=1", "\"x=1\"", "\"x=1\""},
      {"id\nevent=forged", "\"id\\nevent=forged\"", "\"id\\nevent=forged\""},
      {"say \"hi\"", "\"say \\\"hi\\\"\"", "\"say \\\"hi\\\"\""},
      {"back\\slash", "\"back\\\\slash\"", "\"back\\\\slash\""},
      {"cr\rtab\t", "\"cr\\rtab\\t\"", "\"cr\\rtab\\t\""},
      {std::string("nul\0bel\x07" "del\x7f", 12), "\"nul\\x00bel\\x07del\\x7f\"", "\"nul\\x00bel\\x07del\\x7f\""},
      {"h\xc3\xa9llo", "\"h\xc3\xa9llo\"", "\"h\xc3\xa9llo\""},  // UTF-8 passes, quoted
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.in);
    EXPECT_EQ(LogValue(c.in), c.value);
    EXPECT_EQ(LogQuoted(c.in), c.quoted);
    for (const std::string& out : {LogValue(c.in), LogQuoted(c.in)}) {
      EXPECT_EQ(out.find('\n'), std::string::npos);
      EXPECT_EQ(out.find('\r'), std::string::npos);
    }
  }
}

TEST(LogEscapeTest, LongValuesAreCutWithoutSplittingAnEscape) {
  EXPECT_EQ(EscapeLogText(std::string(10, 'a'), 4), "aaaa...");
  EXPECT_EQ(EscapeLogText("ab\ncd", 3), "ab\\n...");
  EXPECT_EQ(EscapeLogText("abc", 3), "abc");
  const std::string big(5000, 'x');
  EXPECT_EQ(LogValue(big).size(), kMaxLogValueBytes + 5) << "quoted, cut, with '...'";
}

}  // namespace
}  // namespace falcon::daemon
