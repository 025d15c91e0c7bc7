// SPDX-License-Identifier: Apache-2.0
#include "mesh/platform/ipv4.h"

#include <gtest/gtest.h>

namespace mesh {
namespace {

TEST(Ipv4, PrefixMaskCoversZeroToThirtyTwoAndClampsAbove) {
  EXPECT_EQ(prefixMask(0), 0u);
  EXPECT_EQ(prefixMask(1), 0x80000000u);
  EXPECT_EQ(prefixMask(24), 0xffffff00u);
  EXPECT_EQ(prefixMask(31), 0xfffffffeu);
  EXPECT_EQ(prefixMask(32), 0xffffffffu);
  EXPECT_EQ(prefixMask(33), 0xffffffffu);
  EXPECT_EQ(prefixMask(255), 0xffffffffu);
}

TEST(Ipv4, SameSubnetComparesOnlyTheLeadingBits) {
  const uint32_t a = 0xC6120001u;  // 198.18.0.1
  const uint32_t b = 0xC6120002u;  // 198.18.0.2
  const uint32_t c = 0xC6120101u;  // 198.18.1.1
  EXPECT_TRUE(sameSubnet(a, b, 24));
  EXPECT_FALSE(sameSubnet(a, c, 24));
  EXPECT_TRUE(sameSubnet(a, c, 16));
  EXPECT_TRUE(sameSubnet(a, 0x01020304u, 0));  // /0 contains everything
  EXPECT_FALSE(sameSubnet(a, b, 32));
  EXPECT_TRUE(sameSubnet(a, a, 32));
  EXPECT_FALSE(sameSubnet(a, b, 31));  // .1 and .2 straddle a /31 boundary
  EXPECT_TRUE(sameSubnet(0xC6120000u, a, 31));
}

TEST(Ipv4, FormatsDottedQuadAndPrefix) {
  EXPECT_EQ(formatIpv4(0xC6120001u), "198.18.0.1");
  EXPECT_EQ(formatIpv4(0), "0.0.0.0");
  EXPECT_EQ(formatIpv4(0xffffffffu), "255.255.255.255");
  EXPECT_EQ(formatPrefix(Ipv4Prefix{0xC6120301u, 24}), "198.18.3.1/24");
  EXPECT_EQ(formatPrefix(Ipv4Prefix{0, 0}), "0.0.0.0/0");
}

TEST(Ipv4, ParsesValidAddresses) {
  uint32_t addr = 0;
  ASSERT_TRUE(parseIpv4("198.18.0.1", &addr));
  EXPECT_EQ(addr, 0xC6120001u);
  ASSERT_TRUE(parseIpv4("0.0.0.0", &addr));
  EXPECT_EQ(addr, 0u);
  ASSERT_TRUE(parseIpv4("255.255.255.255", &addr));
  EXPECT_EQ(addr, 0xffffffffu);
}

TEST(Ipv4, RejectsAnythingButAStrictDottedQuad) {
  uint32_t addr = 0x12345678u;
  for (const char* bad : {"", "1.2.3", "1.2.3.4.5", "256.1.1.1", "1.2.3.04", "01.2.3.4", " 1.2.3.4",
                          "1.2.3.4 ", "1..3.4", "1.2.3.", ".1.2.3", "a.b.c.d", "1.2.3.4/24",
                          "1.2.3.1000", "-1.2.3.4", "+1.2.3.4", "0x1.2.3.4", "1.2.3.4\n"}) {
    EXPECT_FALSE(parseIpv4(bad, &addr)) << "'" << bad << "'";
  }
  EXPECT_EQ(addr, 0x12345678u) << "a rejected parse must not touch the output";
}

TEST(Ipv4, ParsesPrefixWithAndWithoutLength) {
  Ipv4Prefix p;
  ASSERT_TRUE(parsePrefix("198.18.2.3/24", &p));
  EXPECT_EQ(p, (Ipv4Prefix{0xC6120203u, 24}));
  ASSERT_TRUE(parsePrefix("198.18.2.3", &p));
  EXPECT_EQ(p.prefixLen, 32);
  ASSERT_TRUE(parsePrefix("10.0.0.0/0", &p));
  EXPECT_EQ(p.prefixLen, 0);
  ASSERT_TRUE(parsePrefix("10.0.0.1/32", &p));
  EXPECT_EQ(p.prefixLen, 32);
}

TEST(Ipv4, RejectsBadPrefixes) {
  Ipv4Prefix p{1, 7};
  for (const char* bad :
       {"1.2.3.4/", "1.2.3.4/33", "1.2.3.4/100", "1.2.3.4/-1", "1.2.3.4/2a", "1.2.3.4/024",
        "1.2.3.4//24", "1.2.3/24", "/24", "1.2.3.4/24/1", "1.2.3.4 /24", "1.2.3.4/ 24"}) {
    EXPECT_FALSE(parsePrefix(bad, &p)) << "'" << bad << "'";
  }
  EXPECT_EQ(p, (Ipv4Prefix{1, 7}));
}

TEST(Ipv4, FormatAndParseRoundTrip) {
  for (uint32_t addr : {0u, 1u, 0x7f000001u, 0xC6130A0Bu, 0xfffffffeu}) {
    for (uint8_t len : {0, 1, 16, 24, 30, 31, 32}) {
      Ipv4Prefix in{addr, len};
      Ipv4Prefix out;
      ASSERT_TRUE(parsePrefix(formatPrefix(in), &out)) << formatPrefix(in);
      EXPECT_EQ(out, in);
    }
  }
}

}  // namespace
}  // namespace mesh
