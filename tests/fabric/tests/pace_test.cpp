// SPDX-License-Identifier: Apache-2.0
// The fabric's link rates (lib/pace.h): the rates file, the wire overhead and the shared
// token buckets, without a fabric. Timing is given, never measured: every figure here is
// exact arithmetic on the buckets' virtual time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "../lib/pace.h"

namespace meshfab {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/meshfab-pace-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { (void)!std::system(("rm -rf " + path_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(PaceRates, ParsesEveryField) {
  std::string errors;
  auto t = parseRates("# comment\n525400000001 fn=224000000 wire=L0-n0 wire_rate=400000000 delay_ns=20000\n\n",
                      &errors);
  EXPECT_EQ(errors, "");
  ASSERT_EQ(t.size(), 1u);
  const PaceConfig& c = t.at("525400000001");
  EXPECT_DOUBLE_EQ(c.fnRate, 224e6);
  EXPECT_DOUBLE_EQ(c.wireRate, 400e6);
  EXPECT_EQ(c.wire, "L0-n0");
  EXPECT_EQ(c.delayNs, 20000);
  EXPECT_TRUE(c.capped());
}

TEST(PaceRates, MalformedLinesAreSkippedAndNamed) {
  std::string errors;
  auto t = parseRates(
      "zz5400000001 fn=1\n"                      // bad key
      "525400000002 fn=-5\n"                     // negative rate
      "525400000003 wire_rate=100\n"             // a wire rate needs a wire id
      "525400000004 speed=3\n"                   // unknown field
      "525400000005 wire=a/b wire_rate=100\n"    // an id that would be a path
      "525400000006 fn=1e6 delay_ns=5\n",        // the one good line
      &errors);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t.count("525400000006"), 1u);
  for (const char* line : {"line 1:", "line 2:", "line 3:", "line 4:", "line 5:"}) {
    EXPECT_NE(errors.find(line), std::string::npos) << line << " in:\n" << errors;
  }
  EXPECT_EQ(errors.find("line 6:"), std::string::npos);
}

TEST(PaceRates, NoRateIsUncapped) {
  auto t = parseRates("525400000001 fn=0 wire=w wire_rate=0 delay_ns=0\n", nullptr);
  EXPECT_FALSE(t.at("525400000001").capped());
  EXPECT_FALSE(t.at("525400000001").any());
}

TEST(PaceRates, InboundCapsAreKeyedByTheDestinationsAddress) {
  std::string errors;
  auto t = parseRates(
      "525410fe0000 fn=0 wire=S-n0 wire_rate=400000000 delay_ns=0\n"
      "in 198.18.0.1 fn=224000000 wire=S-n0-in wire_rate=400000000\n"
      "in 198.18.300.1 fn=1\n"            // not an address
      "in\n"                              // none at all
      "in 198.18.0.2 fn=1 delay_ns=5\n",  // the sender's cable has the delay, not the switch port
      &errors);
  ASSERT_EQ(t.size(), 2u) << errors;
  EXPECT_EQ(inboundKey(0xc6120001u), "in-198.18.0.1");
  const PaceConfig& c = t.at(inboundKey(0xc6120001u));
  EXPECT_DOUBLE_EQ(c.fnRate, 224e6);
  EXPECT_DOUBLE_EQ(c.wireRate, 400e6);
  EXPECT_EQ(c.wire, "S-n0-in");
  for (const char* line : {"line 3:", "line 4:", "line 5:"}) {
    EXPECT_NE(errors.find(line), std::string::npos) << line << " in:\n" << errors;
  }
}

// Two nodes send into one switch port whose cap is their shared bucket. Sender B's thread
// always wakes up late (here 40 % of a packet's time after it was told to retry), A's on
// time. A switch port's queue serves them in turn all the same: each packet reserves its slot
// when its sender first asks, so B gets its half. (Checking the bucket and charging it only
// when free gave A nearly everything: B found the slot taken every time it woke.)
TEST(PaceBucket, SendersIntoOneSwitchPortTakeTurnsHoweverLateTheyWake) {
  TempDir dir;
  PaceConfig port, in;
  port.fnRate = 1e9;  // each sender's own port: 1 byte/ns, as fast as the destination
  in.wireRate = 1e9;  // the switch port towards the destination: 1 byte/ns for both together
  in.wire = "S-n0-in";
  Pacer a, b, inbound;
  std::string why;
  ASSERT_TRUE(a.configure(dir.path(), "525410fe0001", port, 0, &why)) << why;
  ASSERT_TRUE(b.configure(dir.path(), "525410fe0002", port, 0, &why)) << why;
  ASSERT_TRUE(inbound.configure(dir.path(), inboundKey(0xc6120001u), in, 0, &why)) << why;
  const uint64_t packet = 1000;  // 1000 ns at the cap
  const int64_t lateB = 400;
  int64_t t = 1000000;
  const int64_t end = t + 1000000;
  int64_t nextA = t, nextB = t, slotA = 0, slotB = 0;
  uint64_t sentA = 0, sentB = 0;
  while (std::min(nextA, nextB) < end) {
    bool turnA = nextA <= nextB;
    int64_t& next = turnA ? nextA : nextB;
    int64_t retry = 0;
    if ((turnA ? a : b).tryTransmit(packet, next, &retry, &inbound, turnA ? &slotA : &slotB)) {
      (turnA ? sentA : sentB) += packet;
    } else {
      next = retry + (turnA ? 0 : lateB);
    }
  }
  // Together at most the switch port's 1 byte/ns (+ a packet each), and B about half of it.
  EXPECT_LE(sentA + sentB, 1000000u + 2 * packet);
  EXPECT_GE(sentA + sentB, 1000000u * 9 / 10);
  EXPECT_NEAR(static_cast<double>(sentA), static_cast<double>(sentB), 0.1 * 1000000) << "A " << sentA << " B " << sentB;
}

// One sender (its port: 1 byte/ns) and the switch's port towards its destination (1 byte/ns).
class PaceSwitchPort : public ::testing::Test {
 protected:
  void SetUp() override {
    PaceConfig port, in;
    port.fnRate = 1e9;
    in.wireRate = 1e9;
    in.wire = "S-n0-in";
    std::string why;
    ASSERT_TRUE(sender.configure(dir.path(), "525410fe0001", port, 0, &why)) << why;
    ASSERT_TRUE(inbound.configure(dir.path(), inboundKey(0xc6120001u), in, 0, &why)) << why;
  }
  bool send(uint64_t bytes, int64_t at) { return sender.tryTransmit(bytes, at, &retry, &inbound, &slot); }

  TempDir dir;
  Pacer sender, inbound;
  const int64_t now = 1000000;
  int64_t retry = 0, slot = 0;
};

// A sender waits for its own port first: the switch port's slot is taken only once the packet
// can leave it, so a sender at its own cap holds no slot from others.
TEST_F(PaceSwitchPort, ASenderAtItsOwnCapTakesNoSwitchSlot) {
  ASSERT_TRUE(send(1000, now));  // both free: goes, no slot left
  EXPECT_EQ(slot, 0);
  EXPECT_FALSE(send(1000, now));  // its own port is busy
  EXPECT_EQ(retry, now + 1000);
  EXPECT_EQ(slot, 0) << "a slot was taken while the sender's own port was busy";
  EXPECT_EQ(inbound.readyAt(now), now + 1000);  // only the first packet's bytes there
}

// A packet that took its slot at the switch port left its own port then (its caps were
// charged): at the slot it goes, whatever its port sent since. (When it waited for its own
// port again, the slot passed unused and the destination's cable lost that time: on a switch
// of 4 Spark cables the all-to-all reached 0.85 of the bound, 0.94-0.96 since.)
TEST_F(PaceSwitchPort, APacketWithASlotGoesAtItWhateverItsPortSentSince) {
  inbound.chargeAnyway(5000, now);  // other senders' packets: the switch port is busy for 5 us
  EXPECT_FALSE(send(1000, now));
  EXPECT_EQ(slot, now + 5000);
  EXPECT_EQ(retry, now + 5000);
  EXPECT_EQ(sender.readyAt(now), now + 1000) << "the packet's bytes were charged to its own port when it took the slot";
  sender.chargeAnyway(6000, now + 1000);  // meanwhile the port sends elsewhere, busy until now + 7000
  EXPECT_TRUE(send(1000, now + 5000));
  EXPECT_EQ(slot, 0);
}

TEST(PaceWire, OverheadIsRoceV2OnEthernet) {
  // One full 4096-byte packet: the ceiling is 4096 / 4178 of the line rate.
  EXPECT_EQ(wireBytes(4096, 1, 0), 4178u);
  // A 64 KiB WRITE in 16 packets, RETH on the first, immediate on the last.
  EXPECT_EQ(wireBytes(65536, 16, kRethBytes + kImmBytes), 65536u + 16 * 82 + 20);
  EXPECT_EQ(wireBytes(0, 1, kAethBytes), 86u);  // an ACK
}

TEST(PaceBucket, ChargesAtTheRateAndLetsALateSenderCatchUpOnlyByTheBurst) {
  TempDir dir;
  Pacer p;
  PaceConfig cfg;
  cfg.fnRate = 1e9;  // 1 byte per ns
  std::string why;
  ASSERT_TRUE(p.configure(dir.path(), "525400000001", cfg, /*burstNs=*/1000, &why)) << why;
  ASSERT_TRUE(p.capped());
  int64_t now = 1000000, retry = 0;
  // Idle bucket: a burst's worth goes at once (1000 ns of credit), then the cap holds.
  EXPECT_TRUE(p.tryTransmit(600, now, &retry));  // next = now - 1000 + 600 = now - 400
  EXPECT_TRUE(p.tryTransmit(400, now, &retry));  // next = now
  EXPECT_TRUE(p.tryTransmit(100, now, &retry));  // next <= now: goes, next = now + 100
  EXPECT_FALSE(p.tryTransmit(1, now, &retry));
  EXPECT_EQ(retry, now + 100);
  EXPECT_TRUE(p.tryTransmit(1, now + 100, &retry));
  // Long idle: credit never exceeds the burst.
  now += 1000000;
  EXPECT_TRUE(p.tryTransmit(1000, now, &retry));
  EXPECT_TRUE(p.tryTransmit(1, now, &retry));
  EXPECT_FALSE(p.tryTransmit(1, now, &retry));
  EXPECT_EQ(retry, now + 1);
}

TEST(PaceBucket, TwoPortsShareTheWireAndKeepTheirOwnCaps) {
  TempDir dir;
  PaceConfig cfg;
  cfg.fnRate = 1e9;    // each function: 1 byte/ns
  cfg.wireRate = 1.5e9;  // the wire: 1.5 bytes/ns
  cfg.wire = "L0-n0";
  Pacer a, b;
  std::string why;
  ASSERT_TRUE(a.configure(dir.path(), "525400000001", cfg, 0, &why)) << why;
  ASSERT_TRUE(b.configure(dir.path(), "525402000001", cfg, 0, &why)) << why;
  // Both send 1500-byte packets back to back from t = 0 for 30 us of virtual time: each
  // packet goes at the first ns both its port's bucket and the wire's are free.
  int64_t t = 1000000;
  const int64_t end = t + 30000;
  uint64_t sentA = 0, sentB = 0;
  int64_t nextA = t, nextB = t;
  while (std::min(nextA, nextB) < end) {
    bool turnA = nextA <= nextB;
    Pacer& p = turnA ? a : b;
    int64_t& next = turnA ? nextA : nextB;
    int64_t retry = 0;
    if (p.tryTransmit(1500, next, &retry)) {
      (turnA ? sentA : sentB) += 1500;
    } else {
      next = retry;
    }
  }
  // Together at most the wire's 1.5 B/ns (+ one packet each of rounding), each at most 1 B/ns.
  EXPECT_LE(sentA + sentB, 45000u + 3000u);
  EXPECT_GE(sentA + sentB, 45000u - 3000u);
  EXPECT_LE(sentA, 30000u + 1500u);
  EXPECT_LE(sentB, 30000u + 1500u);
  // And the wire is shared fairly between two equal senders.
  EXPECT_NEAR(static_cast<double>(sentA), static_cast<double>(sentB), 3000.0);
}

TEST(PaceBucket, SeparateNetworksDoNotShare) {
  TempDir one, two;
  PaceConfig cfg;
  cfg.fnRate = 1e9;
  Pacer a, b;
  std::string why;
  ASSERT_TRUE(a.configure(one.path(), "525400000001", cfg, 0, &why));
  ASSERT_TRUE(b.configure(two.path(), "525400000001", cfg, 0, &why));
  int64_t retry = 0;
  EXPECT_TRUE(a.tryTransmit(1000, 5000, &retry));
  EXPECT_TRUE(b.tryTransmit(1000, 5000, &retry));  // another fabric directory: its own bucket
}

}  // namespace
}  // namespace meshfab
