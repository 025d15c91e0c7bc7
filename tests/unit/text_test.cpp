// SPDX-License-Identifier: Apache-2.0
// mesh/platform/text.h: JSON strings every reader can parse.
#include "mesh/platform/text.h"

#include <gtest/gtest.h>

#include <string>

namespace mesh {
namespace {

TEST(JsonString, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(jsonString("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
}

TEST(JsonString, KeepsWellFormedUtf8) {
  std::string s = "train-\xe8\xae\xad-\xf0\x9f\x9a\x80";  // a CJK character and an emoji
  EXPECT_EQ(jsonString(s), "\"" + s + "\"");
}

// The kernel keeps 15 bytes of a process name (/proc/PID/comm), which can cut a multi-byte
// character: such bytes went into `nccl-mesh-info --watch --json` as they were, and strict
// parsers (Python's json) refused the whole document. They become U+FFFD.
TEST(JsonString, ReplacesBytesThatAreNotUtf8) {
  EXPECT_EQ(jsonString("a\xe8\xae"), "\"a\\ufffd\\ufffd\"");  // a character cut short
  EXPECT_EQ(jsonString("\x80x"), "\"\\ufffdx\"");               // a stray continuation byte
  EXPECT_EQ(jsonString("\xc0\xaf"), "\"\\ufffd\\ufffd\"");   // an overlong '/'
  EXPECT_EQ(jsonString("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // a surrogate
  EXPECT_EQ(jsonString("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");  // past U+10FFFF
}

}  // namespace
}  // namespace mesh
