// SPDX-License-Identifier: Apache-2.0
#include "mesh/wire/handshake_proto.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

namespace mesh {
namespace {

using Bytes = std::vector<uint8_t>;

HsMessage qpMessage(HsType type, int links, int qpsPerLink) {
  HsMessage m;
  m.type = type;
  m.token = 0x0123456789abcdefull;
  m.qpsPerLink = qpsPerLink;
  for (int l = 0; l < links; ++l) {
    HsLink link;
    link.senderAddr = 0xC6120001u | static_cast<uint32_t>(l) << 8;  // 198.18.l.1
    link.receiverAddr = 0xC6120002u | static_cast<uint32_t>(l) << 8;
    link.senderNic = static_cast<uint8_t>(l);
    link.receiverNic = static_cast<uint8_t>(3 - l);
    link.prefixLen = 24;
    link.ctrlAddr = 0x7f0000001000ull + static_cast<uint64_t>(l) * 0x10000;
    link.ctrlRkey = 0xabc00000u + static_cast<uint32_t>(l);
    m.links.push_back(link);
    for (int q = 0; q < qpsPerLink; ++q) {
      HsQp qp;
      qp.qpn = 0x100u + static_cast<uint32_t>(l * 16 + q);
      qp.psn = 0xfffff0u + static_cast<uint32_t>(q % 16);
      for (int i = 0; i < 16; ++i) qp.gid[i] = static_cast<uint8_t>(l * 16 + q + i);
      qp.gidIndex = static_cast<uint8_t>(1 + l);
      qp.mtu = static_cast<uint8_t>(1 + (q % 5));
      m.qps.push_back(qp);
    }
  }
  return m;
}

Bytes encodeOk(const HsMessage& m) {
  Bytes out;
  std::string error;
  EXPECT_TRUE(encodeHandshake(m, &out, &error)) << error;
  return out;
}

HsMessage parseOk(const Bytes& b) {
  HsMessage m;
  std::string error;
  EXPECT_TRUE(parseHandshake(b.data(), b.size(), &m, &error)) << error;
  return m;
}

std::string parseError(const Bytes& b) {
  HsMessage m;
  std::string error;
  EXPECT_FALSE(parseHandshake(b.data(), b.size(), &m, &error));
  EXPECT_FALSE(error.empty());
  return error;
}

std::string encodeError(const HsMessage& m) {
  Bytes out;
  std::string error;
  EXPECT_FALSE(encodeHandshake(m, &out, &error));
  EXPECT_FALSE(error.empty());
  return error;
}

void put32(Bytes* b, size_t off, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*b)[off + i] = static_cast<uint8_t>(v >> (8 * i));
}

void expectSame(const HsMessage& a, const HsMessage& b) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.reason, b.reason);
  ASSERT_EQ(a.links.size(), b.links.size());
  for (size_t i = 0; i < a.links.size(); ++i) {
    EXPECT_EQ(a.links[i].senderAddr, b.links[i].senderAddr);
    EXPECT_EQ(a.links[i].receiverAddr, b.links[i].receiverAddr);
    EXPECT_EQ(a.links[i].senderNic, b.links[i].senderNic);
    EXPECT_EQ(a.links[i].receiverNic, b.links[i].receiverNic);
    EXPECT_EQ(a.links[i].prefixLen, b.links[i].prefixLen);
    EXPECT_EQ(a.links[i].ctrlAddr, b.links[i].ctrlAddr);
    EXPECT_EQ(a.links[i].ctrlRkey, b.links[i].ctrlRkey);
    EXPECT_EQ(a.links[i].hasEce, b.links[i].hasEce);
    EXPECT_EQ(a.links[i].eceVendor, b.links[i].eceVendor);
    EXPECT_EQ(a.links[i].eceOptions, b.links[i].eceOptions);
  }
  if (!a.links.empty()) {
    EXPECT_EQ(a.qpsPerLink, b.qpsPerLink);
  }
  ASSERT_EQ(a.qps.size(), b.qps.size());
  for (size_t i = 0; i < a.qps.size(); ++i) {
    EXPECT_EQ(a.qps[i].qpn, b.qps[i].qpn);
    EXPECT_EQ(a.qps[i].psn, b.qps[i].psn);
    EXPECT_EQ(0, std::memcmp(a.qps[i].gid, b.qps[i].gid, 16));
    EXPECT_EQ(a.qps[i].gidIndex, b.qps[i].gidIndex);
    EXPECT_EQ(a.qps[i].mtu, b.qps[i].mtu);
  }
}

// Offsets into a 1-link message, for corrupting single fields.
constexpr size_t kBody = kHsHeaderSize;
constexpr size_t kLink0 = kBody + kHsBodyPrefixSize;
constexpr size_t kQp0 = kLink0 + kHsLinkSize;  // with one link

TEST(HandshakeProto, HeaderLayoutIsPinnedByteForByte) {
  HsMessage m;
  m.type = HsType::Ready;
  m.token = 0x1122334455667788ull;
  Bytes b = encodeOk(m);
  const uint8_t expected[] = {'M', 'H', 'S', '1', 1, 0, 3, 0, 24, 0, 0, 0, 0, 0, 0, 0,
                              0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
  ASSERT_EQ(b.size(), sizeof(expected));
  for (size_t i = 0; i < sizeof(expected); ++i) EXPECT_EQ(b[i], expected[i]) << "offset " << i;
}

TEST(HandshakeProto, LinkAndQpLayoutIsPinnedByteForByte) {
  HsMessage m = qpMessage(HsType::Hello, 1, 1);
  Bytes b = encodeOk(m);
  ASSERT_EQ(b.size(), kQp0 + kHsQpSize);
  EXPECT_EQ(b[kBody], 1);
  EXPECT_EQ(b[kBody + 1], 1);
  const uint8_t link[] = {0x01, 0x00, 0x12, 0xC6, 0x02, 0x00, 0x12, 0xC6, 0, 3, 24, 0,
                          0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00,
                          0x00, 0x00, 0xc0, 0xab};
  for (size_t i = 0; i < sizeof(link); ++i) EXPECT_EQ(b[kLink0 + i], link[i]) << "link " << i;
  for (size_t i = sizeof(link); i < kHsLinkSize; ++i) EXPECT_EQ(b[kLink0 + i], 0) << "link " << i;
  const uint8_t qp[] = {0x00, 0x01, 0x00, 0x00, 0xf0, 0xff, 0xff, 0x00};
  for (size_t i = 0; i < sizeof(qp); ++i) EXPECT_EQ(b[kQp0 + i], qp[i]) << "qp " << i;
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(b[kQp0 + 8 + i], i) << "gid " << i;
  EXPECT_EQ(b[kQp0 + 24], 1);  // gidIndex
  EXPECT_EQ(b[kQp0 + 25], 1);  // mtu
  for (size_t i = 26; i < kHsQpSize; ++i) EXPECT_EQ(b[kQp0 + i], 0) << "qp " << i;
}

TEST(HandshakeProto, HelloAndAcceptRoundTrip) {
  for (HsType type : {HsType::Hello, HsType::Accept}) {
    for (int links : {1, 4}) {
      for (int qps : {1, 16}) {
        SCOPED_TRACE(std::to_string(links) + " links x " + std::to_string(qps) + " QPs");
        HsMessage m = qpMessage(type, links, qps);
        Bytes b = encodeOk(m);
        EXPECT_EQ(b.size(), kHsHeaderSize + kHsBodyPrefixSize + links * kHsLinkSize +
                                links * qps * kHsQpSize);
        std::string error;
        EXPECT_EQ(handshakeLength(b.data(), b.size(), &error), static_cast<long>(b.size()));
        expectSame(m, parseOk(b));
      }
    }
  }
}

TEST(HandshakeProto, LargestMessageIsTheMaximum) {
  Bytes b = encodeOk(qpMessage(HsType::Accept, kHsMaxLinks, kHsMaxQpsPerLink));
  EXPECT_EQ(b.size(), kHsMaxMessage);
}

TEST(HandshakeProto, ReadyAndRejectRoundTrip) {
  HsMessage ready;
  ready.type = HsType::Ready;
  ready.token = 42;
  Bytes b = encodeOk(ready);
  EXPECT_EQ(b.size(), kHsHeaderSize);
  expectSame(ready, parseOk(b));

  HsMessage reject;
  reject.type = HsType::Reject;
  reject.token = 7;
  reject.reason = "token mismatch: this listener belongs to another communicator";
  b = encodeOk(reject);
  EXPECT_EQ(b.size(), kHsHeaderSize + reject.reason.size());
  expectSame(reject, parseOk(b));

  reject.reason.clear();
  expectSame(reject, parseOk(encodeOk(reject)));
  reject.reason.assign(kHsMaxReason, 'x');
  expectSame(reject, parseOk(encodeOk(reject)));
}

TEST(HandshakeProto, RejectsBadMagic) {
  Bytes b = encodeOk(qpMessage(HsType::Hello, 1, 1));
  put32(&b, 0, 0x20544547);  // "GET ": someone speaking HTTP to the port
  std::string e = parseError(b);
  EXPECT_NE(e.find("bad magic 0x20544547"), std::string::npos) << e;
  EXPECT_NE(e.find("not an nccl-mesh peer"), std::string::npos) << e;
}

TEST(HandshakeProto, RejectsOtherVersion) {
  Bytes b = encodeOk(qpMessage(HsType::Hello, 1, 1));
  b[4] = 2;
  std::string e = parseError(b);
  EXPECT_NE(e.find("version 2"), std::string::npos) << e;
}

TEST(HandshakeProto, RejectsUnknownType) {
  Bytes b = encodeOk(qpMessage(HsType::Hello, 1, 1));
  for (uint8_t t : {0, 5, 0xff}) {
    b[6] = t;
    EXPECT_NE(parseError(b).find("unknown message type " + std::to_string(t)), std::string::npos);
  }
}

TEST(HandshakeProto, RejectsLengthBelowHeader) {
  Bytes b = encodeOk(qpMessage(HsType::Hello, 1, 1));
  put32(&b, 8, 10);
  std::string e = parseError(b);
  EXPECT_NE(e.find("length 10 is shorter than the 24-byte header"), std::string::npos) << e;
}

TEST(HandshakeProto, RejectsLengthAboveMaximum) {
  Bytes b = encodeOk(qpMessage(HsType::Hello, 1, 1));
  put32(&b, 8, 99999);
  std::string e = parseError(b);
  EXPECT_NE(e.find("length 99999 exceeds 2204"), std::string::npos) << e;
}

// Header bytes 12..15 are reserved (0) in every message but a HELLO (below).
TEST(HandshakeProto, RejectsNonZeroHeaderReserved) {
  Bytes accept = encodeOk(qpMessage(HsType::Accept, 1, 1));
  accept[12] = 1;
  EXPECT_NE(parseError(accept).find("origin header field is 0x1; in ACCEPT it must be 0"), std::string::npos)
      << parseError(accept);
}

// Header bytes 12..15: the origin a relay's HELLO names (the relayed connection's sender);
// 0 in every other message, and refused there, both ways.
TEST(HandshakeProto, OnlyAHelloNamesAnOrigin) {
  HsMessage m = qpMessage(HsType::Hello, 1, 1);
  EXPECT_EQ(parseOk(encodeOk(m)).originAddr, 0u) << "a direct HELLO names none";
  m.originAddr = 0xc6120001u;  // 198.18.0.1
  Bytes b = encodeOk(m);
  EXPECT_EQ(b[12], 0x01);
  EXPECT_EQ(b[15], 0xc6);
  EXPECT_EQ(parseOk(b).originAddr, 0xc6120001u);
  HsMessage ready;
  ready.type = HsType::Ready;
  ready.originAddr = 1;
  Bytes out;
  std::string error;
  EXPECT_FALSE(encodeHandshake(ready, &out, &error));
  EXPECT_NE(error.find("cannot name an origin"), std::string::npos) << error;
}

TEST(HandshakeProto, RejectsLengthMismatch) {
  Bytes b = encodeOk(qpMessage(HsType::Hello, 1, 1));
  b.push_back(0);  // one byte more than the header says
  EXPECT_NE(parseError(b).find("header says 92 bytes, the message has 93"), std::string::npos);
  b.resize(b.size() - 2);
  EXPECT_NE(parseError(b).find("the message has 91"), std::string::npos);
  Bytes tiny(b.begin(), b.begin() + 10);
  EXPECT_NE(parseError(tiny).find("truncated header: 10 bytes of 24"), std::string::npos);
}

TEST(HandshakeProto, RejectsTruncatedBody) {
  // Header length agrees with the buffer, but the counts need more bytes.
  Bytes b = encodeOk(qpMessage(HsType::Hello, 2, 4));
  b.resize(b.size() - kHsQpSize);
  put32(&b, 8, static_cast<uint32_t>(b.size()));
  std::string e = parseError(b);
  EXPECT_NE(e.find("HELLO with 2 links x 4 QPs must be 348 bytes, got 316"), std::string::npos)
      << e;
  Bytes prefixOnly(b.begin(), b.begin() + kHsHeaderSize + 2);
  put32(&prefixOnly, 8, static_cast<uint32_t>(prefixOnly.size()));
  EXPECT_NE(parseError(prefixOnly).find("body truncated: 2 bytes"), std::string::npos);
}

TEST(HandshakeProto, RejectsLinkAndQpCountsOutOfRange) {
  Bytes b = encodeOk(qpMessage(HsType::Accept, 1, 1));
  b[kBody] = 0;
  EXPECT_NE(parseError(b).find("ACCEPT has 0 links (min 1)"), std::string::npos);
  b[kBody] = 5;
  EXPECT_NE(parseError(b).find("ACCEPT has 5 links (max 4)"), std::string::npos);
  b[kBody] = 1;
  b[kBody + 1] = 0;
  EXPECT_NE(parseError(b).find("0 QPs per link (min 1)"), std::string::npos);
  b[kBody + 1] = 17;
  EXPECT_NE(parseError(b).find("17 QPs per link (max 16)"), std::string::npos);

  HsMessage m = qpMessage(HsType::Hello, 1, 1);
  m.links.clear();
  m.qps.clear();
  EXPECT_NE(encodeError(m).find("0 links"), std::string::npos);
  m = qpMessage(HsType::Hello, 5, 1);
  EXPECT_NE(encodeError(m).find("5 links (max 4)"), std::string::npos);
  m = qpMessage(HsType::Hello, 1, 17);
  EXPECT_NE(encodeError(m).find("17 QPs per link"), std::string::npos);
  m = qpMessage(HsType::Hello, 2, 2);
  m.qps.pop_back();
  EXPECT_NE(encodeError(m).find("lists 3 QPs for 2 links x 2 QPs"), std::string::npos);
}

TEST(HandshakeProto, RejectsQpnAndPsnAbove24Bits) {
  Bytes b = encodeOk(qpMessage(HsType::Hello, 1, 1));
  Bytes bad = b;
  put32(&bad, kQp0, 0x1000000);
  EXPECT_NE(parseError(bad).find("qpn 0x1000000, above 24 bits"), std::string::npos);
  bad = b;
  put32(&bad, kQp0 + 4, 0xffffffff);
  EXPECT_NE(parseError(bad).find("psn 0xffffffff, above 24 bits"), std::string::npos);

  HsMessage m = qpMessage(HsType::Hello, 1, 1);
  m.qps[0].qpn = 0x1000000;
  EXPECT_NE(encodeError(m).find("qpn"), std::string::npos);
  m = qpMessage(HsType::Hello, 1, 1);
  m.qps[0].psn = 0x1000000;
  EXPECT_NE(encodeError(m).find("psn"), std::string::npos);
}

TEST(HandshakeProto, RejectsMtuOutsideIbvMtu) {
  Bytes b = encodeOk(qpMessage(HsType::Hello, 1, 1));
  for (uint8_t mtu : {0, 6}) {
    b[kQp0 + 25] = mtu;
    EXPECT_NE(parseError(b).find("mtu " + std::to_string(mtu) + ", outside 1..5"),
              std::string::npos);
    HsMessage m = qpMessage(HsType::Hello, 1, 1);
    m.qps[0].mtu = mtu;
    EXPECT_NE(encodeError(m).find("mtu"), std::string::npos);
  }
}

TEST(HandshakeProto, RejectsPrefixLengthAbove32) {
  Bytes b = encodeOk(qpMessage(HsType::Hello, 1, 1));
  b[kLink0 + 10] = 33;
  EXPECT_NE(parseError(b).find("prefix length 33"), std::string::npos);
}

TEST(HandshakeProto, RejectsEveryNonZeroReservedByte) {
  const Bytes good = encodeOk(qpMessage(HsType::Hello, 1, 1));
  // Body byte 2 is the traffic class, reserved (0) unless byte 3 says it is carried.
  std::vector<size_t> reserved = {kBody + 2, kLink0 + 11};  // header 12..15: the origin (above)
  for (size_t i = 24; i < kHsLinkSize; ++i) reserved.push_back(kLink0 + i);
  for (size_t i = 26; i < kHsQpSize; ++i) reserved.push_back(kQp0 + i);
  for (size_t off : reserved) {
    Bytes b = good;
    b[off] = 0x80;
    EXPECT_NE(parseError(b).find("reserved"), std::string::npos) << "offset " << off;
  }
}

// The connector's traffic class and service level travel in body bytes 2..3, so the
// receiver's QPs use the same ones (NCCL IB's connect metadata carries tc and sl).
TEST(HandshakeProto, TrafficClassRoundTripsAndItsReservedBitsAreRefused) {
  HsMessage m = qpMessage(HsType::Hello, 1, 1);
  EXPECT_EQ(parseOk(encodeOk(m)).trafficClass, -1) << "not carried unless set";
  m.trafficClass = 96;
  m.serviceLevel = 3;
  const Bytes good = encodeOk(m);
  EXPECT_EQ(good[kBody + 2], 96);
  EXPECT_EQ(good[kBody + 3], 0x83);
  HsMessage back = parseOk(good);
  EXPECT_EQ(back.trafficClass, 96);
  EXPECT_EQ(back.serviceLevel, 3);
  {
    Bytes b = good;
    b[kBody + 3] |= 0x40;
    EXPECT_NE(parseError(b).find("reserved"), std::string::npos) << "bit 6";
  }
  Bytes b = good;
  b[kBody + 3] = 0x03;  // a service level without the "carried" bit
  EXPECT_NE(parseError(b).find("reserved"), std::string::npos);
  m.serviceLevel = 16;
  Bytes out;
  std::string error;
  EXPECT_FALSE(encodeHandshake(m, &out, &error));
}

// ECE (NCCL IB's per-QP ece / ece_supported, per link here): flags bit 0 and the last 8
// bytes of a LinkInfo, in a HELLO (what the connector offers) and an ACCEPT (what the
// acceptor settled on); zero fields without the bit, other flag bits refused.
TEST(HandshakeProto, EceRoundTripsPerLinkAndItsFieldsAreZeroWithoutTheFlag) {
  for (HsType type : {HsType::Hello, HsType::Accept}) {
    HsMessage m = qpMessage(type, 2, 2);
    m.links[1].hasEce = true;
    m.links[1].eceVendor = 0x15b3;
    m.links[1].eceOptions = 0x30000001;
    const Bytes good = encodeOk(m);
    EXPECT_EQ(good[kLink0 + 11], 0) << "link 0 carries none";
    for (size_t i = 24; i < kHsLinkSize; ++i) EXPECT_EQ(good[kLink0 + i], 0) << i;
    const size_t link1 = kLink0 + kHsLinkSize;
    EXPECT_EQ(good[link1 + 11], 1);
    const uint8_t ece[] = {0xb3, 0x15, 0, 0, 0x01, 0, 0, 0x30};
    for (size_t i = 0; i < sizeof(ece); ++i) EXPECT_EQ(good[link1 + 24 + i], ece[i]) << i;
    expectSame(m, parseOk(good));
    Bytes b = good;
    b[link1 + 11] = 0x03;
    EXPECT_NE(parseError(b).find("reserved"), std::string::npos) << "flag bit 1";
    b = good;
    b[link1 + 11] = 0;
    EXPECT_NE(parseError(b).find("reserved"), std::string::npos) << "ECE bytes without the flag";
    m.links[1].eceOptions = 0;  // carried zeros are still carried
    EXPECT_TRUE(parseOk(encodeOk(m)).links[1].hasEce);
  }
}

// The fuzzer's seed corpus (tests/fuzz/corpus/handshake) holds whole valid messages, so the
// fuzzer starts from every message kind; one HELLO carries ECE on both links. MESH_TESTS_DIR:
// see handle_codec_test.cpp.
TEST(HandshakeProto, CommittedFuzzSeedsAreValidMessages) {
  const std::filesystem::path dir = std::filesystem::path(MESH_TESTS_DIR) / "fuzz" / "corpus" / "handshake";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << "no corpus at " << dir;
  int seeds = 0, withEce = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(entry.path(), std::ios::binary);
    Bytes bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(entry.path().filename().string());
    HsMessage m = parseOk(bytes);
    ++seeds;
    for (const HsLink& l : m.links) withEce += l.hasEce ? 1 : 0;
  }
  EXPECT_GE(seeds, 7);
  EXPECT_EQ(withEce, 2) << "hello_2x4_ece.bin";
}

// Bits 4..5 of the classes byte: a HELLO that is leg 1 or 2 of a two-relay connection
// (mesh/relay/relay_twin.h), with or without a traffic class; 3, or any leg in another
// message, is refused.
TEST(HandshakeProto, OnlyAHelloNamesATwoRelayLeg) {
  for (int tc : {-1, 96}) {
    for (int leg : {1, 2}) {
      HsMessage m = qpMessage(HsType::Hello, 1, 1);
      m.trafficClass = tc;
      m.serviceLevel = tc < 0 ? -1 : 3;
      m.twinLeg = leg;
      Bytes b = encodeOk(m);
      EXPECT_EQ(b[kBody + 3] & 0x30, leg << 4);
      HsMessage back = parseOk(b);
      EXPECT_EQ(back.twinLeg, leg);
      EXPECT_EQ(back.trafficClass, tc);
      b[kBody + 3] |= 0x30;
      EXPECT_NE(parseError(b).find("two-relay leg 3"), std::string::npos);
    }
  }
  EXPECT_EQ(parseOk(encodeOk(qpMessage(HsType::Hello, 1, 1))).twinLeg, 0);
  HsMessage accept = qpMessage(HsType::Accept, 1, 1);
  accept.twinLeg = 1;
  Bytes out;
  std::string error;
  EXPECT_FALSE(encodeHandshake(accept, &out, &error));
  EXPECT_NE(error.find("only a HELLO"), std::string::npos) << error;
  accept.twinLeg = 0;
  Bytes b = encodeOk(accept);
  b[kBody + 3] |= 0x10;
  EXPECT_NE(parseError(b).find("only a HELLO"), std::string::npos);
}

TEST(HandshakeProto, RejectsReadyWithBody) {
  HsMessage ready;
  ready.type = HsType::Ready;
  Bytes b = encodeOk(ready);
  b.resize(b.size() + 4);
  put32(&b, 8, static_cast<uint32_t>(b.size()));
  EXPECT_NE(parseError(b).find("READY carries 4 body bytes, must be empty"), std::string::npos);
}

TEST(HandshakeProto, RejectsOverLongReason) {
  HsMessage reject;
  reject.type = HsType::Reject;
  reject.reason.assign(kHsMaxReason + 1, 'x');
  EXPECT_NE(encodeError(reject).find("513 bytes exceeds 512"), std::string::npos);

  reject.reason.assign(kHsMaxReason, 'x');
  Bytes b = encodeOk(reject);
  b.push_back('x');
  put32(&b, 8, static_cast<uint32_t>(b.size()));
  EXPECT_NE(parseError(b).find("REJECT reason of 513 bytes exceeds 512"), std::string::npos);
}

TEST(HandshakeProto, RejectsUnknownTypeOnEncode) {
  HsMessage m;
  m.type = static_cast<HsType>(9);
  EXPECT_NE(encodeError(m).find("unknown message type 9"), std::string::npos);
  std::string error;
  EXPECT_FALSE(encodeHandshake(qpMessage(HsType::Hello, 1, 1), nullptr, &error));
}

TEST(HandshakeLength, IsZeroUntilTheHeaderIsComplete) {
  Bytes b = encodeOk(qpMessage(HsType::Hello, 4, 16));
  std::string error;
  for (size_t n = 0; n < kHsHeaderSize; ++n) {
    EXPECT_EQ(handshakeLength(b.data(), n, &error), 0) << n << " bytes";
  }
  for (size_t n : {kHsHeaderSize, kHsHeaderSize + 1, b.size()}) {
    EXPECT_EQ(handshakeLength(b.data(), n, &error), static_cast<long>(b.size())) << n << " bytes";
  }
  EXPECT_TRUE(error.empty()) << error;
}

TEST(HandshakeLength, IsMinusOneForABadHeader) {
  const Bytes good = encodeOk(qpMessage(HsType::Hello, 1, 1));
  auto expectBad = [](Bytes b, const std::string& what) {
    std::string error;
    EXPECT_EQ(handshakeLength(b.data(), kHsHeaderSize, &error), -1) << what;
    EXPECT_NE(error.find(what), std::string::npos) << error;
  };
  Bytes b = good;
  b[0] ^= 1;
  expectBad(b, "bad magic");
  b = good;
  b[4] = 9;
  expectBad(b, "version 9");
  b = good;
  b[6] = 0;
  expectBad(b, "unknown message type 0");
  b = good;
  put32(&b, 8, 23);
  expectBad(b, "length 23 is shorter");
  b = good;
  put32(&b, 8, 2205);
  expectBad(b, "length 2205 exceeds 2204");
}

TEST(HandshakeProto, NeverReadsBeyondLen) {
  // Each prefix is copied into a heap buffer of exactly its size, so ASan catches any read
  // past the end; parse must reject every proper prefix and accept the whole message.
  Bytes full = encodeOk(qpMessage(HsType::Accept, 2, 3));
  for (size_t n = 0; n <= full.size(); ++n) {
    std::unique_ptr<uint8_t[]> exact(new uint8_t[n == 0 ? 1 : n]);
    std::memcpy(exact.get(), full.data(), n);
    HsMessage m;
    std::string error;
    bool ok = parseHandshake(exact.get(), n, &m, &error);
    EXPECT_EQ(ok, n == full.size()) << n << " bytes: " << error;
    handshakeLength(exact.get(), n, &error);
  }
  std::string error;
  EXPECT_FALSE(parseHandshake(nullptr, 100, nullptr, &error));
  EXPECT_EQ(handshakeLength(nullptr, 100, &error), 0);
}

}  // namespace
}  // namespace mesh
