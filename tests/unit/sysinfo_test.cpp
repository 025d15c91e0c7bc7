// SPDX-License-Identifier: Apache-2.0
// The locked-memory and CMA figures a failed registration names (sysinfo.h), and their parsers.
#include <gtest/gtest.h>

#include "mesh/platform/sysinfo.h"

namespace mesh {
namespace {

TEST(PinningAdvice, NamesTheLimitTheCmaFiguresAndTheFix) {
  MemlockLimit lim;
  ASSERT_TRUE(parseMemlockLimit("Max locked memory         8388608              8388608              bytes\n", &lim));
  CmaFigures cma;
  ASSERT_TRUE(parseCma("CmaTotal:        0 kB\nCmaFree:    940604 kB\n", &cma));
  std::string advice = pinningAdvice(lim, cma);
  EXPECT_NE(advice.find("RLIMIT_MEMLOCK is 8 MiB (soft) / 8 MiB (hard)"), std::string::npos) << advice;
  EXPECT_NE(advice.find("CmaTotal 0 kB, CmaFree 940604 kB"), std::string::npos) << advice;
  EXPECT_NE(advice.find("kho=off"), std::string::npos) << advice;
  EXPECT_NE(advice.find("ulimit -l unlimited"), std::string::npos) << advice;
  lim.softUnlimited = true;
  cma.freeKb = 0;
  advice = pinningAdvice(lim, cma);
  EXPECT_EQ(advice.find("ulimit -l"), std::string::npos) << advice;
  EXPECT_EQ(advice.find("kho=off"), std::string::npos) << advice;
}

TEST(PinningAdvice, ParsersRefuseMalformedText) {
  MemlockLimit lim;
  EXPECT_FALSE(parseMemlockLimit("Max locked memory  lots  lots  bytes\n", &lim));
  EXPECT_FALSE(parseMemlockLimit("", &lim));
  CmaFigures cma;
  EXPECT_FALSE(parseCma("CmaTotal: x kB\n", &cma));
  bool cap = false;
  ASSERT_TRUE(parseCapIpcLock("CapEff:\t000001ffffffffff\n", &cap));
  EXPECT_TRUE(cap);
  EXPECT_FALSE(parseCapIpcLock("CapEff:\tzz\n", &cap));
  EXPECT_EQ(bytesText(65536), "64 KiB");
  EXPECT_EQ(bytesText(0, true), "unlimited");
}

}  // namespace
}  // namespace mesh
