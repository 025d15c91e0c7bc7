// SPDX-License-Identifier: Apache-2.0
#include "mesh/relay/relay_proto.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "mesh/wire/wire.h"

namespace mesh {
namespace {

using Bytes = std::vector<uint8_t>;

Handle sampleHandle(uint64_t token) {
  Handle h;
  h.token = token;
  h.port = 40123;
  h.addrs = {{0xC6120103u, 24, 0}, {0xC6120203u, 24, 1}};
  return h;
}

RelayMessage sampleHello(size_t addrs, size_t routes) {
  RelayMessage m;
  m.type = RelayType::Hello;
  m.hello.node = 0x0123456789abcdefull;
  for (size_t i = 0; i < addrs; ++i) m.hello.addrs.push_back({0xC6120001u + static_cast<uint32_t>(i << 8), 24});
  for (size_t i = 0; i < routes; ++i) {
    m.hello.routes.push_back({{0xC6120000u + static_cast<uint32_t>((i % 256) << 8), 24},
                              static_cast<uint8_t>(i % (kRouteHopsUnreachable + 1))});
  }
  return m;
}

// A HELLO of one node of an n-node cluster whose every node has `addrs` addresses and
// `neighbours` neighbours (the records of all n, the sender's first).
RelayMessage sampleHelloWithRecords(size_t n, size_t addrs, size_t neighbours, size_t routes) {
  RelayMessage m = sampleHello(std::max<size_t>(addrs, 1), routes);
  for (size_t i = 0; i < n; ++i) {
    TopologyRecord r;
    r.origin = i == 0 ? m.hello.node : 0x7000 + i;
    r.seq = 1700000000000ull + i;
    r.topologyDigest = 0x1111222233334444ull;
    r.tableDigest = 0x5555666677778888ull;
    for (size_t a = 0; a < addrs; ++a) r.addrs.push_back({0xC6120001u + static_cast<uint32_t>((a + 8 * i) << 8), 24});
    for (size_t k = 0; k < neighbours; ++k) r.neighbours.push_back(0x7000 + (i + k + 1) % n);
    m.topology.records.push_back(r);
  }
  return m;
}

RelayMessage sampleOpen(size_t visited) {
  RelayMessage m;
  m.type = RelayType::Open;
  m.open.origin = 0x1001;
  m.open.request = 0xfeedfacecafebeefull;
  m.open.hopBudget = 3;
  for (size_t i = 0; i < visited; ++i) m.open.visited.push_back(0x2000 + i);
  m.open.target = sampleHandle(0x1122334455667788ull);
  return m;
}

RelayMessage sampleReply(RelayStatus status, std::string reason) {
  RelayMessage m;
  m.type = RelayType::OpenReply;
  m.reply.request = 42;
  m.reply.status = status;
  m.reply.hops = 1;
  if (status == RelayStatus::Ok) m.reply.leg = sampleHandle(7);
  m.reply.reason = std::move(reason);
  return m;
}

Bytes encodeOk(const RelayMessage& m) {
  Bytes b;
  std::string error;
  EXPECT_TRUE(encodeRelay(m, &b, &error)) << error;
  return b;
}

RelayMessage parseOk(const Bytes& b) {
  RelayMessage m;
  std::string error;
  EXPECT_TRUE(parseRelay(b.data(), b.size(), &m, &error)) << error;
  return m;
}

std::string parseError(const Bytes& b) {
  RelayMessage m;
  std::string error;
  EXPECT_FALSE(parseRelay(b.data(), b.size(), &m, &error));
  return error;
}

void expectSameHandle(const Handle& a, const Handle& b) {
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.port, b.port);
  EXPECT_EQ(a.addrs, b.addrs);
}

TEST(RelayProto, HelloRoundTripsAtEverySizeUpToTheLimits) {
  for (auto [addrs, routes] : {std::pair<size_t, size_t>{1, 0}, {2, 3}, {kHelloMaxAddresses, kHelloMaxRoutes}}) {
    RelayMessage in = sampleHello(addrs, routes);
    Bytes b = encodeOk(in);
    EXPECT_EQ(b.size(), kRelayHeaderSize + kRelayHelloPrefix + addrs * 6 + routes * 6);
    std::string error;
    EXPECT_EQ(relayMessageLength(b.data(), b.size(), &error), static_cast<long>(b.size()));
    RelayMessage out = parseOk(b);
    EXPECT_EQ(out.type, RelayType::Hello);
    EXPECT_EQ(out.hello.node, in.hello.node);
    EXPECT_EQ(out.hello.addrs, in.hello.addrs);
    EXPECT_EQ(out.hello.routes, in.hello.routes);
  }
  EXPECT_LE(encodeOk(sampleHello(kHelloMaxAddresses, kHelloMaxRoutes)).size(), kRelayMaxHello);
}

TEST(RelayProto, HelloCarriesTheRoutePlansRecordsAndTheOverflowFlag) {
  RelayMessage in = sampleHelloWithRecords(4, 2, 2, 4);
  Bytes b = encodeOk(in);
  EXPECT_EQ(b.size(), kRelayHeaderSize + kRelayHelloPrefix + 2 * 6 + 4 * 6 + 4 * (36 + 2 * 6 + 2 * 8));
  EXPECT_EQ(b.size(), relayHelloSize(in.hello, in.topology));
  RelayMessage out = parseOk(b);
  EXPECT_EQ(out.hello.routes, in.hello.routes);
  EXPECT_FALSE(out.topology.overflow);
  EXPECT_EQ(out.topology.records, in.topology.records);

  RelayMessage over = sampleHello(2, 4);
  over.topology.overflow = true;
  Bytes ob = encodeOk(over);
  EXPECT_EQ(ob[16 + 9], kHelloFlagOverflow);
  EXPECT_TRUE(parseOk(ob).topology.overflow);
  EXPECT_TRUE(parseOk(ob).topology.records.empty());
}

TEST(RelayProto, EightNodesWithFourAddressesFitOneHelloWhateverTheCabling) {
  // Every node cabled to the 7 others, 4 addresses each, and 32 subnets in the vector.
  RelayMessage full = sampleHelloWithRecords(8, 4, 7, 32);
  EXPECT_EQ(relayHelloSize(full.hello, full.topology), kHelloPlanGuaranteeBytes);
  EXPECT_LE(encodeOk(full).size(), kRelayMaxHello);
  // A ring of 8 with 8 addresses per node (both functions of both cables, a subnet each).
  EXPECT_LE(encodeOk(sampleHelloWithRecords(8, 8, 2, 32)).size(), kRelayMaxHello);
  // Beyond: the sender is told to send its view as overflow.
  RelayMessage big = sampleHelloWithRecords(12, 8, 4, 32);
  Bytes out;
  std::string error;
  EXPECT_FALSE(encodeRelay(big, &out, &error));
  EXPECT_EQ(error, "relay: HELLO of " + std::to_string(relayHelloSize(big.hello, big.topology)) +
                       " bytes exceeds 1472 (one datagram): send the view as overflow");
}

TEST(RelayProto, HelloRecordLayoutIsPinned) {
  RelayMessage m = sampleHelloWithRecords(1, 1, 1, 0);
  m.topology.records[0].neighbours = {0x0102030405060708ull};
  Bytes b = encodeOk(m);
  ASSERT_EQ(b.size(), 16u + 16u + 6u + 36u + 6u + 8u);
  EXPECT_EQ(b[16 + 12], 1);  // nRecords
  const uint8_t* r = &b[16 + 16 + 6];
  EXPECT_EQ(getLe(r, 8), 0x0123456789abcdefull);
  EXPECT_EQ(getLe(r + 8, 8), 1700000000000ull);
  EXPECT_EQ(getLe(r + 16, 8), 0x1111222233334444ull);
  EXPECT_EQ(getLe(r + 24, 8), 0x5555666677778888ull);
  EXPECT_EQ(r[32], 1);
  EXPECT_EQ(r[33], 1);
  EXPECT_EQ(getLe(r + 36, 4), 0xC6120001u);
  EXPECT_EQ(r[40], 24);
  EXPECT_EQ(getLe(r + 42, 8), 0x0102030405060708ull);
}

TEST(RelayProto, HelloRecordRefusals) {
  std::string error;
  Bytes out;
  RelayMessage m = sampleHelloWithRecords(kTopologyMaxRecords + 1, 0, 0, 0);
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  EXPECT_EQ(error, "relay: HELLO carries 17 records (at most 16)");
  m = sampleHelloWithRecords(2, 1, 1, 0);
  m.topology.overflow = true;
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  EXPECT_EQ(error, "relay: HELLO says its view overflows but carries records");
  m = sampleHelloWithRecords(2, 1, 1, 0);
  m.topology.records[1].origin = m.topology.records[0].origin;
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  EXPECT_EQ(error, "relay: HELLO record 2: a second record of the same origin");
  m = sampleHelloWithRecords(2, 1, 1, 0);
  m.topology.records[1].neighbours[0] = 0;
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  EXPECT_EQ(error, "relay: HELLO record 2: neighbour node 0 (reserved)");
  m = sampleHelloWithRecords(1, 1, kTopologyMaxNeighbours + 1, 0);
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  EXPECT_EQ(error, "relay: HELLO record 1: 16 neighbours (at most 15)");

  // On the wire: a record cut short, bytes after the last record, unknown flags.
  Bytes b = encodeOk(sampleHelloWithRecords(2, 1, 1, 0));
  Bytes bad = b;
  bad[16 + 12] = 3;
  EXPECT_EQ(parseError(bad), "relay: HELLO record 3 is truncated");
  bad = b;
  bad[16 + 12] = 1;
  EXPECT_EQ(parseError(bad), "relay: HELLO has 50 bytes after its last record");
  bad = b;
  bad[16 + 16 + 6 + 33] = 9;
  EXPECT_EQ(parseError(bad), "relay: HELLO record 1 with 1 addresses and 9 neighbours needs 114 bytes, 100 left");
  bad = b;
  bad[16 + 16 + 6 + 34] = 1;
  EXPECT_EQ(parseError(bad), "relay: HELLO record reserved bytes must be 0");
  bad = b;
  bad[16 + 9] = 2;
  EXPECT_EQ(parseError(bad), "relay: HELLO flags 2: unknown bits set");
}

TEST(RelayProto, AVersionOneHelloIsRefusedNamingBothVersions) {
  Bytes b = encodeOk(sampleHello(1, 1));
  putLe(&b[4], 1, 2);
  EXPECT_EQ(parseError(b), "relay: peer speaks relay protocol version 1, this build speaks " +
                               std::to_string(kRelayVersion) + "; run the same nccl-mesh version on every node");
}

TEST(RelayProto, HelloLayoutIsLittleEndianAndPinned) {
  RelayMessage m = sampleHello(1, 1);
  m.hello.routes[0] = {{0xC6120300u, 24}, 2};
  Bytes b = encodeOk(m);
  ASSERT_EQ(b.size(), 44u);
  EXPECT_EQ(Bytes(b.begin(), b.begin() + 4), (Bytes{'M', 'R', 'L', '1'}));
  EXPECT_EQ(getLe(&b[4], 2), kRelayVersion);
  EXPECT_EQ(getLe(&b[6], 2), 1u);
  EXPECT_EQ(getLe(&b[8], 4), 44u);
  EXPECT_EQ(getLe(&b[16], 8), 0x0123456789abcdefull);
  EXPECT_EQ(b[24], 1);
  EXPECT_EQ(getLe(&b[26], 2), 1u);
  EXPECT_EQ(b[28], 0);  // no records
  EXPECT_EQ(getLe(&b[32], 4), 0xC6120001u);
  EXPECT_EQ(b[36], 24);
  EXPECT_EQ(getLe(&b[38], 4), 0xC6120300u);
  EXPECT_EQ(b[42], 24);
  EXPECT_EQ(b[43], 2);
}

TEST(RelayProto, HelloRefusals) {
  std::string error;
  Bytes out;
  RelayMessage m = sampleHello(0, 0);
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  EXPECT_EQ(error, "relay: HELLO lists 0 addresses (1..32)");
  m = sampleHello(1, kHelloMaxRoutes + 1);
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  m = sampleHello(1, 1);
  m.hello.node = 0;
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  m = sampleHello(1, 1);
  m.hello.routes[0].subnet = {0xC6120305u, 24};
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  EXPECT_EQ(error, "relay: HELLO route 198.18.3.5/24 is not a network address with a prefix length 0..32");
  m = sampleHello(1, 1);
  m.hello.routes[0].hops = kRouteHopsUnreachable + 1;
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  // On the wire: a count that disagrees with the length, a non-zero reserved byte.
  Bytes b = encodeOk(sampleHello(2, 2));
  Bytes bad = b;
  bad[24] = 3;
  EXPECT_EQ(parseError(bad), "relay: HELLO with 3 addresses, 2 routes and 0 records is 46 body bytes, got 40");
  bad = b;
  bad[29] = 1;
  EXPECT_EQ(parseError(bad), "relay: HELLO reserved bytes must be 0");
  bad = b;
  bad[32 + 5] = 1;
  EXPECT_EQ(parseError(bad), "relay: HELLO address reserved byte must be 0");
  bad = b;
  bad[32 + 4] = 33;
  EXPECT_EQ(parseError(bad), "relay: HELLO address with prefix length 33");
}

TEST(RelayProto, OpenRoundTripsWithTheTargetHandleAndVisitedRelays) {
  for (size_t visited : {size_t{0}, size_t{1}, static_cast<size_t>(kRelayMaxHopBudget)}) {
    RelayMessage in = sampleOpen(visited);
    Bytes b = encodeOk(in);
    EXPECT_EQ(b.size(), kRelayHeaderSize + kRelayOpenPrefix + kHandleSize + visited * 8);
    RelayMessage out = parseOk(b);
    ASSERT_EQ(out.type, RelayType::Open);
    EXPECT_EQ(out.open.origin, in.open.origin);
    EXPECT_EQ(out.open.request, in.open.request);
    EXPECT_EQ(out.open.hopBudget, 3);
    EXPECT_EQ(out.open.visited, in.open.visited);
    EXPECT_EQ(out.open.originAddr, 0u) << "not said";
    expectSameHandle(out.open.target, in.open.target);
  }
  // The sender's address, for the last relay's HELLO to the target (bytes 20..23).
  RelayMessage in = sampleOpen(1);
  in.open.originAddr = 0xc6120001u;  // 198.18.0.1
  Bytes b = encodeOk(in);
  EXPECT_EQ(b[kRelayHeaderSize + 20], 0x01);
  EXPECT_EQ(b[kRelayHeaderSize + 23], 0xc6);
  EXPECT_EQ(parseOk(b).open.originAddr, 0xc6120001u);
  EXPECT_EQ(encodeOk(sampleOpen(kRelayMaxHopBudget)).size(), kRelayMaxOpen);
}

TEST(RelayProto, OpenRefusals) {
  std::string error;
  Bytes out;
  RelayMessage m = sampleOpen(0);
  m.open.hopBudget = 0;
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  EXPECT_EQ(error, "relay: OPEN hop budget 0 (1..15)");
  m.open.hopBudget = 16;
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  m = sampleOpen(16);
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  m = sampleOpen(0);
  m.open.target.addrs.clear();
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  EXPECT_EQ(error.rfind("relay: OPEN target: ", 0), 0u) << error;
  m = sampleOpen(0);
  m.open.origin = 0;
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  // A corrupted handle inside is refused with the handle codec's reason.
  Bytes b = encodeOk(sampleOpen(1));
  Bytes bad = b;
  bad[kRelayHeaderSize + kRelayOpenPrefix] ^= 0xff;  // handle magic
  EXPECT_NE(parseError(bad).find("relay: OPEN target: listen handle has magic"), std::string::npos);
  bad = b;
  bad[kRelayHeaderSize + 17] = 2;  // two visited, one present
  EXPECT_EQ(parseError(bad), "relay: OPEN with 2 visited relays is 168 body bytes, got 160");
  bad = b;
  bad[kRelayHeaderSize + 19] = 1;
  EXPECT_EQ(parseError(bad), "relay: OPEN reserved fields must be 0");
  bad = b;
  bad[kRelayHeaderSize + 18] = 3;
  EXPECT_EQ(parseError(bad), "relay: OPEN names two-relay leg 3 (0..2)");
  m = sampleOpen(1);
  m.open.twinLeg = 3;
  EXPECT_FALSE(encodeRelay(m, &out, &error));
}

// Byte 18 of the OPEN: the leg of a two-relay connection the relay passes on to C's HELLO.
TEST(RelayProto, OpenCarriesATwoRelayLeg) {
  for (int leg : {0, 1, 2}) {
    RelayMessage m = sampleOpen(1);
    m.open.twinLeg = leg;
    Bytes b = encodeOk(m);
    EXPECT_EQ(b[kRelayHeaderSize + 18], leg);
    EXPECT_EQ(parseOk(b).open.twinLeg, leg);
  }
}

TEST(RelayProto, ReplyCarriesALegOnSuccessAndAReasonOtherwise) {
  RelayMessage ok = parseOk(encodeOk(sampleReply(RelayStatus::Ok, "")));
  ASSERT_EQ(ok.type, RelayType::OpenReply);
  EXPECT_EQ(ok.reply.status, RelayStatus::Ok);
  EXPECT_EQ(ok.reply.request, 42u);
  EXPECT_EQ(ok.reply.hops, 1);
  expectSameHandle(ok.reply.leg, sampleHandle(7));
  std::string reason = "no route to 198.18.2.3/24 within 1 relay hop(s)";
  RelayMessage no = parseOk(encodeOk(sampleReply(RelayStatus::NoRoute, reason)));
  EXPECT_EQ(no.reply.status, RelayStatus::NoRoute);
  EXPECT_EQ(no.reply.reason, reason);
  EXPECT_EQ(parseOk(encodeOk(sampleReply(RelayStatus::Loop, ""))).reply.reason, "");
  EXPECT_EQ(encodeOk(sampleReply(RelayStatus::PeerRefused, std::string(kRelayMaxReason, 'x'))).size(), kRelayMaxReply);
  EXPECT_STREQ(relayStatusName(RelayStatus::NoMemory), "relay memory cap reached");
}

TEST(RelayProto, ReplyRefusals) {
  std::string error;
  Bytes out;
  EXPECT_FALSE(encodeRelay(sampleReply(RelayStatus::Ok, "why"), &out, &error));
  EXPECT_EQ(error, "relay: OPEN-REPLY Ok with a reason");
  EXPECT_FALSE(encodeRelay(sampleReply(RelayStatus::NoRoute, std::string(kRelayMaxReason + 1, 'x')), &out, &error));
  RelayMessage m = sampleReply(RelayStatus::NoRoute, "x");
  m.reply.status = static_cast<RelayStatus>(kRelayStatusMax + 1);
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  m = sampleReply(RelayStatus::NoRoute, "x");
  m.reply.hops = 16;
  EXPECT_FALSE(encodeRelay(m, &out, &error));
  Bytes b = encodeOk(sampleReply(RelayStatus::NoRoute, "abc"));
  Bytes bad = b;
  bad[kRelayHeaderSize + 8] = 99;  // unknown status
  EXPECT_EQ(parseError(bad), "relay: OPEN-REPLY status 99 is unknown");
  bad = b;
  bad[kRelayHeaderSize + 12] = 4;  // reason longer than the message
  EXPECT_EQ(parseError(bad), "relay: OPEN-REPLY with status 1 and a 4-byte reason is 20 body bytes, got 19");
}

TEST(RelayProto, HeaderChecksAndFraming) {
  Bytes b = encodeOk(sampleOpen(0));
  std::string error;
  EXPECT_EQ(relayMessageLength(b.data(), kRelayHeaderSize - 1, &error), 0);
  Bytes bad = b;
  bad[0] ^= 1;
  EXPECT_EQ(relayMessageLength(bad.data(), bad.size(), &error), -1);
  EXPECT_EQ(error, "relay: bad magic 0x314c524c, not an nccl-mesh relay message");
  bad = b;
  bad[4] = static_cast<uint8_t>(kRelayVersion + 1);
  EXPECT_NE(parseError(bad).find("relay protocol version " + std::to_string(kRelayVersion + 1) + ", this build speaks " +
                                 std::to_string(kRelayVersion)),
            std::string::npos);
  bad = b;
  bad[6] = 4;
  EXPECT_EQ(parseError(bad), "relay: unknown message type 4");
  bad = b;
  putLe(&bad[8], kRelayMaxOpen + 1, 4);
  EXPECT_EQ(relayMessageLength(bad.data(), bad.size(), &error), -1);
  EXPECT_EQ(error, "relay: OPEN length 289 exceeds 288");
  bad = b;
  bad[12] = 1;
  EXPECT_EQ(parseError(bad), "relay: reserved header field must be 0");
  Bytes shorter(b.begin(), b.end() - 1);
  EXPECT_EQ(parseError(shorter), "relay: header says 168 bytes, got 167");
  // A failed parse leaves the output untouched.
  RelayMessage out = sampleHello(1, 0);
  EXPECT_FALSE(parseRelay(shorter.data(), shorter.size(), &out, &error));
  EXPECT_EQ(out.type, RelayType::Hello);
  EXPECT_EQ(out.hello.addrs.size(), 1u);
}

// --- fuzz seeds -----------------------------------------------------------------------------

std::filesystem::path seedDir() { return std::filesystem::path(MESH_TESTS_DIR) / "fuzz" / "corpus" / "relay"; }

std::vector<RelayMessage> seedMessages() {
  return {sampleHello(1, 0), sampleHello(3, 5), sampleOpen(0), sampleOpen(2),
          sampleReply(RelayStatus::Ok, ""), sampleReply(RelayStatus::PeerRefused, "C refused: wrong token"),
          sampleHelloWithRecords(4, 2, 2, 4)};
}

// Regenerates the seeds: mesh_unit_tests --gtest_also_run_disabled_tests
//   --gtest_filter='*RelaySeeds.DISABLED_WriteFuzzSeeds'
TEST(RelaySeeds, DISABLED_WriteFuzzSeeds) {
  std::filesystem::create_directories(seedDir());
  std::vector<RelayMessage> seeds = seedMessages();
  for (size_t i = 0; i < seeds.size(); ++i) {
    Bytes b = encodeOk(seeds[i]);
    std::ofstream f(seedDir() / ("valid_" + std::to_string(i) + ".bin"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    ASSERT_TRUE(f.good());
  }
}

TEST(RelaySeeds, CommittedSeedsAreTheMessagesTheyClaim) {
  ASSERT_TRUE(std::filesystem::is_directory(seedDir())) << "no corpus at " << seedDir();
  std::vector<RelayMessage> seeds = seedMessages();
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ifstream f(seedDir() / ("valid_" + std::to_string(i) + ".bin"), std::ios::binary);
    ASSERT_TRUE(f.good()) << "seed " << i << " missing; regenerate with DISABLED_WriteFuzzSeeds";
    Bytes bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes, encodeOk(seeds[i])) << "seed " << i;
  }
}

}  // namespace
}  // namespace mesh
