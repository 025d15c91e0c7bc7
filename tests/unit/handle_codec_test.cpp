// SPDX-License-Identifier: Apache-2.0
#include "mesh/wire/handle_codec.h"

#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace mesh {
namespace {

using Bytes = std::array<uint8_t, kHandleSize>;

Handle sampleHandle(size_t count) {
  Handle h;
  h.token = 0x0123456789abcdefull;
  h.port = 40123;
  for (size_t i = 0; i < count; ++i) {
    // 198.18.i.1/24 on nic i/2: two addresses per NIC, as on a port with an alias.
    h.addrs.push_back(
        {0xC6120001u | static_cast<uint32_t>(i) << 8, 24, static_cast<uint8_t>(i / 2)});
  }
  return h;
}

Bytes encodeOk(const Handle& h) {
  Bytes out{};
  std::string error;
  EXPECT_TRUE(encodeHandle(h, out.data(), &error)) << error;
  return out;
}

void expectSameHandle(const Handle& a, const Handle& b) {
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.port, b.port);
  EXPECT_EQ(a.addrs, b.addrs);
}

std::string decodeError(const uint8_t* in, size_t len) {
  Handle h;
  std::string error;
  EXPECT_FALSE(decodeHandle(in, len, &h, &error));
  EXPECT_FALSE(error.empty());
  return error;
}

TEST(HandleCodec, WireLayoutIsPinnedByteForByte) {
  Handle h;
  h.token = 0x1122334455667788ull;
  h.port = 0xABCD;
  h.addrs = {{0xC6120301u, 24, 2}};  // 198.18.3.1/24 nic 2
  Bytes b = encodeOk(h);
  // clang-format off
  const uint8_t expected[] = {'M', 'E', 'S', 'H', 1, 0, 0xCD, 0xAB,
                              0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
                              1, 0, 0, 0,
                              198, 18, 3, 1, 24, 2};
  // clang-format on
  ASSERT_EQ(sizeof(expected), kHandleHeaderSize + kHandleAddressSize);
  for (size_t i = 0; i < sizeof(expected); ++i) EXPECT_EQ(b[i], expected[i]) << "offset " << i;
  for (size_t i = sizeof(expected); i < kHandleSize; ++i) EXPECT_EQ(b[i], 0) << "offset " << i;
}

TEST(HandleCodec, EncodeZeroesTheUnusedTail) {
  Bytes b;
  b.fill(0xEE);
  std::string error;
  ASSERT_TRUE(encodeHandle(sampleHandle(3), b.data(), &error)) << error;
  for (size_t i = kHandleHeaderSize + 3 * kHandleAddressSize; i < kHandleSize; ++i) {
    EXPECT_EQ(b[i], 0) << "offset " << i;
  }
}

TEST(HandleCodec, RoundTripsOneToMaxAddresses) {
  for (size_t n = 1; n <= kHandleMaxAddresses; ++n) {
    Handle in = sampleHandle(n);
    Bytes b = encodeOk(in);
    Handle out;
    std::string error;
    ASSERT_TRUE(decodeHandle(b.data(), b.size(), &out, &error)) << n << ": " << error;
    expectSameHandle(in, out);
  }
}

TEST(HandleCodec, RoundTripsExtremeFieldValues) {
  Handle in;
  in.token = ~0ull;
  in.port = 65535;
  in.addrs = {{0, 0, 0}, {0xffffffffu, 32, 255}};
  Bytes b = encodeOk(in);
  Handle out;
  ASSERT_TRUE(decodeHandle(b.data(), b.size(), &out, nullptr));
  expectSameHandle(in, out);
}

TEST(HandleCodec, EncodeRejectsTooManyAddressesWithTheFix) {
  Bytes b{};
  std::string error;
  EXPECT_FALSE(encodeHandle(sampleHandle(20), b.data(), &error));
  EXPECT_EQ(error,
            "this node has 20 mesh addresses but a handle holds at most 18; restrict the ports "
            "with NCCL_MESH_HCA, or remove the IPv4 addresses no mesh cable uses from their netdevs "
            "(every address of a port counts)");
  EXPECT_FALSE(encodeHandle(sampleHandle(19), b.data(), &error));
  EXPECT_NE(error.find("has 19 mesh addresses"), std::string::npos) << error;
}

TEST(HandleCodec, EncodeRejectsNoAddresses) {
  Bytes b{};
  std::string error;
  EXPECT_FALSE(encodeHandle(Handle{}, b.data(), &error));
  EXPECT_NE(error.find("no mesh addresses"), std::string::npos) << error;
  EXPECT_NE(error.find("NCCL_MESH_HCA"), std::string::npos) << error;
}

TEST(HandleCodec, EncodeRejectsPrefixAbove32) {
  Handle h = sampleHandle(2);
  h.addrs[1].prefixLen = 33;
  Bytes b{};
  std::string error;
  EXPECT_FALSE(encodeHandle(h, b.data(), &error));
  EXPECT_NE(error.find("198.18.1.1 has prefix length 33"), std::string::npos) << error;
}

TEST(HandleCodec, EncodeRejectsNullOutputAndToleratesNullError) {
  EXPECT_FALSE(encodeHandle(sampleHandle(1), nullptr, nullptr));
  Bytes b{};
  EXPECT_FALSE(encodeHandle(Handle{}, b.data(), nullptr));
}

TEST(HandleCodec, DecodeRejectsBadMagicNamingThePlugin) {
  Bytes b = encodeOk(sampleHandle(1));
  b[0] = 'X';
  std::string error = decodeError(b.data(), b.size());
  EXPECT_NE(error.find("magic"), std::string::npos) << error;
  EXPECT_NE(error.find("NCCL_NET_PLUGIN=mesh"), std::string::npos) << error;
}

TEST(HandleCodec, DecodeRejectsUnknownVersion) {
  Bytes b = encodeOk(sampleHandle(1));
  b[4] = 2;
  std::string error = decodeError(b.data(), b.size());
  EXPECT_NE(error.find("version 2 is not supported"), std::string::npos) << error;
  EXPECT_NE(error.find("same nccl-mesh version"), std::string::npos) << error;
}

TEST(HandleCodec, DecodeRejectsZeroAndTooManyAddresses) {
  Bytes b = encodeOk(sampleHandle(1));
  b[16] = 0;
  EXPECT_NE(decodeError(b.data(), b.size()).find("announces 0 addresses"), std::string::npos);
  b[16] = kHandleMaxAddresses + 1;
  EXPECT_NE(decodeError(b.data(), b.size()).find("announces 19 addresses"), std::string::npos);
  b[16] = 255;
  EXPECT_NE(decodeError(b.data(), b.size()).find("1..18"), std::string::npos);
}

TEST(HandleCodec, DecodeRejectsNonZeroFlagsAndReserved) {
  for (size_t off : {17u, 18u, 19u}) {
    Bytes b = encodeOk(sampleHandle(1));
    b[off] = 0x40;
    EXPECT_NE(decodeError(b.data(), b.size()).find("reserved"), std::string::npos) << off;
  }
}

TEST(HandleCodec, DecodeRejectsPrefixAbove32) {
  Bytes b = encodeOk(sampleHandle(2));
  b[kHandleHeaderSize + kHandleAddressSize + 4] = 33;
  std::string error = decodeError(b.data(), b.size());
  EXPECT_NE(error.find("198.18.1.1"), std::string::npos) << error;
  EXPECT_NE(error.find("prefix length 33"), std::string::npos) << error;
}

// Each truncation is copied into a buffer of exactly that size, so a read past len is a
// heap overflow that ASan builds (MESH_SANITIZE=address) report.
TEST(HandleCodec, DecodeRejectsEveryTruncationWithoutReadingPastLen) {
  const size_t n = 4;
  Bytes b = encodeOk(sampleHandle(n));
  const size_t used = kHandleHeaderSize + n * kHandleAddressSize;
  for (size_t len = 0; len < used; ++len) {
    std::vector<uint8_t> cut(b.begin(), b.begin() + len);
    std::string error = decodeError(cut.empty() ? nullptr : cut.data(), len);
    EXPECT_NE(error.find("truncated"), std::string::npos) << len << ": " << error;
  }
  std::vector<uint8_t> exact(b.begin(), b.begin() + used);
  Handle out;
  EXPECT_TRUE(decodeHandle(exact.data(), exact.size(), &out, nullptr));
  EXPECT_EQ(out.addrs.size(), n);
}

TEST(HandleCodec, TruncationMessageSaysWhatWasNeeded) {
  Bytes b = encodeOk(sampleHandle(3));
  EXPECT_NE(decodeError(b.data(), 10).find("10 bytes, the header alone is 20"), std::string::npos);
  EXPECT_NE(decodeError(b.data(), 30).find("30 bytes, but its 3 addresses need 38"),
            std::string::npos);
}

TEST(HandleCodec, DecodeRejectsDamageInTheUnusedTail) {
  // NCCL copies the 128 bytes verbatim and encode zeroes the tail, so a non-zero byte
  // after the last address is damage: every such position is caught.
  Handle in = sampleHandle(2);
  Bytes b = encodeOk(in);
  size_t tail = kHandleHeaderSize + 2 * kHandleAddressSize;
  for (size_t i = tail; i < kHandleSize; ++i) {
    Bytes bad = b;
    bad[i] = 0x5A;
    std::string error;
    EXPECT_FALSE(decodeHandle(bad.data(), bad.size(), nullptr, &error)) << "offset " << i;
    EXPECT_NE(error.find("offset " + std::to_string(i)), std::string::npos) << error;
  }
}

TEST(HandleCodec, DecodeIgnoresBytesBeyondTheHandleSize) {
  Handle in = sampleHandle(2);
  Bytes b = encodeOk(in);
  std::vector<uint8_t> longer(b.begin(), b.end());
  longer.resize(300, 0xFF);  // not the handle's: NCCL's buffer may be larger
  Handle out;
  std::string error;
  ASSERT_TRUE(decodeHandle(longer.data(), longer.size(), &out, &error)) << error;
  expectSameHandle(in, out);
}

TEST(HandleCodec, FailedDecodeLeavesTheOutputUntouched) {
  Handle out = sampleHandle(5);
  Bytes b = encodeOk(sampleHandle(1));
  b[16] = 0;
  EXPECT_FALSE(decodeHandle(b.data(), b.size(), &out, nullptr));
  EXPECT_EQ(out.addrs.size(), 5u);
  EXPECT_FALSE(decodeHandle(nullptr, 128, &out, nullptr));
  EXPECT_EQ(out.addrs.size(), 5u);
}

// The fuzzer's seed corpus, next to this file in the source tree.
// MESH_TESTS_DIR, not __FILE__: the build maps source paths in __FILE__ to relative ones
// (reproducible log lines), which would leave this test looking in the wrong place.
std::filesystem::path seedDir() {
  return std::filesystem::path(MESH_TESTS_DIR) / "fuzz" / "corpus" / "handle";
}

std::vector<Handle> seedHandles() {
  std::vector<Handle> seeds;
  Handle triangle;  // node 0 of the lab triangle: links 0 and 1
  triangle.token = 0x5eed0001u;
  triangle.port = 45001;
  triangle.addrs = {{0xC6120001u, 24, 0}, {0xC6120101u, 24, 1}};
  seeds.push_back(triangle);
  Handle single;
  single.token = 1;
  single.port = 1;
  single.addrs = {{0xC6120002u, 31, 0}};
  seeds.push_back(single);
  seeds.push_back(sampleHandle(kHandleMaxAddresses));
  Handle edges;
  edges.token = ~0ull;
  edges.port = 65535;
  edges.addrs = {{0, 0, 0}, {0xffffffffu, 32, 255}, {0xC6130001u, 16, 7}};
  seeds.push_back(edges);
  return seeds;
}

// Regenerates the seeds: mesh_unit_tests --gtest_also_run_disabled_tests
//   --gtest_filter='*WriteFuzzSeeds'
TEST(HandleCodecSeeds, DISABLED_WriteFuzzSeeds) {
  std::filesystem::create_directories(seedDir());
  std::vector<Handle> seeds = seedHandles();
  for (size_t i = 0; i < seeds.size(); ++i) {
    Bytes b = encodeOk(seeds[i]);
    std::ofstream f(seedDir() / ("valid_" + std::to_string(i) + ".bin"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), b.size());
    ASSERT_TRUE(f.good());
  }
}

TEST(HandleCodecSeeds, CommittedSeedsAreValidHandles) {
  ASSERT_TRUE(std::filesystem::is_directory(seedDir())) << "no corpus at " << seedDir();
  std::vector<Handle> seeds = seedHandles();
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ifstream f(seedDir() / ("valid_" + std::to_string(i) + ".bin"), std::ios::binary);
    ASSERT_TRUE(f.good()) << "seed " << i << " missing; regenerate with DISABLED_WriteFuzzSeeds";
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
    Handle out;
    std::string error;
    ASSERT_TRUE(decodeHandle(bytes.data(), bytes.size(), &out, &error)) << i << ": " << error;
    expectSameHandle(seeds[i], out);
  }
}

}  // namespace
}  // namespace mesh
