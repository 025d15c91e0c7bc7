// SPDX-License-Identifier: Apache-2.0
// TwinSteer (mesh/relay/relay_twin.h): which leg of a two-relay connection carries the next
// send, on a simulated clock. Each leg delivers its sends in order at its own rate; the
// sender keeps NCCL's 8 steps in flight, as the proxy does.
#include <gtest/gtest.h>

#include <cmath>
#include <deque>

#include "mesh/relay/relay_twin.h"

namespace mesh {
namespace {

using Clock = TwinSteer::Clock;
using std::chrono::duration_cast;
using std::chrono::nanoseconds;

Clock::time_point at(double seconds) {
  return Clock::time_point() + std::chrono::hours(1) + duration_cast<nanoseconds>(std::chrono::duration<double>(seconds));
}

struct Sim {
  TwinSteer steer;
  double rate[2];       // bytes/s each leg delivers (0: stalled)
  double busyUntil[2] = {0, 0};
  struct Sent {
    uint64_t id;
    double doneAt;
  };
  std::deque<Sent> queue[2];
  uint64_t picks[2] = {0, 0};
  uint64_t nextId = 1;

  // Sends `count` messages of `bytes`, at most `window` in flight; returns the end time.
  double run(int count, uint64_t bytes, int window, double now = 0) {
    int inflight = 0;
    for (int sent = 0; sent < count;) {
      if (inflight < window) {
        int leg = steer.pick(bytes, at(now));
        ++picks[leg];
        double start = std::max(now, busyUntil[leg]);
        double done = rate[leg] > 0 ? start + static_cast<double>(bytes) / rate[leg] : 1e9;
        busyUntil[leg] = done;
        steer.posted(leg, nextId, bytes, at(now));
        queue[leg].push_back(Sent{nextId++, done});
        ++inflight;
        ++sent;
        continue;
      }
      // The next completion of either leg.
      int leg = -1;
      for (int l = 0; l < 2; ++l) {
        if (!queue[l].empty() && (leg < 0 || queue[l].front().doneAt < queue[leg].front().doneAt)) leg = l;
      }
      if (leg < 0 || queue[leg].front().doneAt >= 1e9) break;  // everything stalled
      now = queue[leg].front().doneAt;
      steer.completed(leg, queue[leg].front().id, at(now));
      queue[leg].pop_front();
      --inflight;
    }
    return now;
  }
};

TEST(TwinSteer, UntriedLegsAreTriedFirstTiesGoToLegZero) {
  TwinSteer s;
  s.useRates();  // the rates decide (MESH_TEST_TWIN_RATES)
  EXPECT_EQ(s.pick(1000, at(0)), 0);
  s.posted(0, 1, 1000, at(0));
  EXPECT_EQ(s.pick(1000, at(0)), 1) << "leg 1 has no rate yet: it is tried";
  s.posted(1, 2, 1000, at(0));
  s.completed(0, 1, at(0.001));
  s.completed(1, 2, at(0.001));
  EXPECT_EQ(s.pick(1000, at(0.001)), 0) << "equal rates, nothing held: leg 0";
  EXPECT_EQ(s.sends(0), 1u);
  EXPECT_EQ(s.bytes(1), 1000u);
}

TEST(TwinSteer, EqualLegsShareEvenly) {
  Sim sim;
  sim.steer.useRates();
  sim.rate[0] = sim.rate[1] = 10e6;
  sim.run(400, 512 << 10, 8);
  double share = static_cast<double>(sim.picks[0]) / 400;
  EXPECT_GT(share, 0.4);
  EXPECT_LT(share, 0.6);
}

// A leg through a relay whose onward cable is busy delivers slower: it gets fewer sends,
// about in proportion to its rate, and the pair moves nearly what both legs can.
TEST(TwinSteer, ASlowerLegGetsFewerSends) {
  Sim sim;
  sim.steer.useRates();
  sim.rate[0] = 2.5e6;
  sim.rate[1] = 10e6;
  double end = sim.run(400, 512 << 10, 8);
  double share = static_cast<double>(sim.picks[0]) / 400;
  EXPECT_LT(share, 0.3) << "picks " << sim.picks[0] << " / " << sim.picks[1];
  double rate = 400.0 * (512 << 10) / end;
  EXPECT_GT(rate, 0.85 * 12.5e6) << "both legs together";
}

// A leg whose relay slows down twentyfold (its onward cable taken by other traffic) gets
// about its share of what both legs deliver from then on (200 x 0.5 / 10.5 = 9.5 sends).
TEST(TwinSteer, ALegThatSlowsDownIsLeftAlone) {
  Sim sim;
  sim.steer.useRates();
  sim.rate[0] = sim.rate[1] = 10e6;
  double now = sim.run(100, 512 << 10, 8);
  sim.rate[0] = 0.5e6;
  uint64_t before = sim.picks[0];
  sim.run(200, 512 << 10, 8, now);
  EXPECT_LE(sim.picks[0] - before, 12u) << "the slowed leg got " << sim.picks[0] - before << " of 200 sends";
}

// A leg left idle for kRetryIdle is tried again: what slowed it may be gone.
TEST(TwinSteer, AnIdleLegIsTriedAgain) {
  TwinSteer s;
  s.useRates();
  s.posted(0, 1, 1 << 20, at(0));
  s.posted(1, 2, 1 << 20, at(0));
  s.completed(0, 1, at(0.01));   // fast
  s.completed(1, 2, at(1.0));    // slow
  s.posted(0, 3, 1 << 20, at(1.0));
  EXPECT_EQ(s.pick(1 << 20, at(1.0)), 0);
  s.completed(0, 3, at(1.01));
  s.posted(0, 4, 1 << 20, at(1.2));
  EXPECT_EQ(s.pick(1 << 20, at(1.25)), 0) << "leg 1 was slow and idle for less than kRetryIdle";
  EXPECT_EQ(s.pick(1 << 20, at(1.0 + TwinSteer::kRetryIdle + 0.1)), 1) << "leg 1 idle for longer: tried again";
}

// NCCL's tree on a 4-ring: one relay's onward path shares a cable NCCL's own tree edge fills.
// Both legs deliver alike (the fabric shares the busy cable fairly), so the rates alone would
// split the bytes; the other traffic on the first cables decides instead.
TEST(TwinSteer, ALegWhoseCableCarriesClearlyMoreOtherTrafficIsAvoided) {
  Sim sim;
  sim.rate[0] = sim.rate[1] = 10e6;
  sim.steer.setLoad(0, 12e6);  // NCCL's tree edge on leg 0's cable
  sim.steer.setLoad(1, 1e6);
  sim.steer.setOwnRate(10e6);
  EXPECT_EQ(sim.steer.quieterLeg(), 1);
  sim.run(64, 512 << 10, 8);
  EXPECT_EQ(sim.picks[0], 0u) << "every send on the quieter cable, however much leg 1 holds";
  EXPECT_EQ(sim.picks[1], 64u);
}

TEST(TwinSteer, SimilarLoadsLeaveTheChoiceToTheRates) {
  Sim sim;
  sim.rate[0] = sim.rate[1] = 10e6;
  sim.steer.useRates();
  sim.steer.setLoad(0, 10e6);  // an all-to-all: both cables about as busy
  sim.steer.setLoad(1, 7e6);
  sim.steer.setOwnRate(10e6);
  EXPECT_EQ(sim.steer.quieterLeg(), -1) << "within kLoadMargin";
  sim.run(64, 512 << 10, 8);
  EXPECT_NEAR(static_cast<double>(sim.picks[0]), 32.0, 4.0);
}

TEST(TwinSteer, LoadsSmallNextToWhatTheConnectionSendsDoNotDecide) {
  TwinSteer s;
  s.setOwnRate(100e6);  // a relayed stream at 100 MB/s
  s.setLoad(0, 2e6);    // a receiver's FIFO writes beside it: noise
  s.setLoad(1, 0);
  EXPECT_EQ(s.quieterLeg(), -1);
  s.setLoad(0, 20e6);
  EXPECT_EQ(s.quieterLeg(), 1);
}

TEST(TwinSteer, UnknownLoadsDoNotDecide) {
  TwinSteer s;
  s.setLoad(0, 50e6);
  s.setOwnRate(10e6);
  EXPECT_EQ(s.quieterLeg(), -1) << "leg 1's load not known yet (unpublished counters: never)";
  TwinSteer t;
  t.setLoad(0, 50e6);
  t.setLoad(1, 0);
  EXPECT_EQ(t.quieterLeg(), -1) << "the connection's own rate not known yet";
}

// Where the loads do not decide, the plan's way (leg 0) takes every send, however the rates
// compare; where they do, they win.
TEST(TwinSteer, ThePlansWayTakesEverySendUnlessTheLoadsDecide) {
  Sim sim;
  sim.rate[0] = 5e6;
  sim.rate[1] = 20e6;
  sim.run(32, 512 << 10, 8);
  EXPECT_EQ(sim.picks[0], 32u);
  sim.steer.setLoad(0, 12e6);
  sim.steer.setLoad(1, 0);
  sim.steer.setOwnRate(10e6);
  EXPECT_EQ(sim.steer.pick(512 << 10, at(100)), 1);
}

TEST(LoadMeter, RateOfTheDirectTraffic) {
  LoadMeter m;
  EXPECT_FALSE(m.sample(1000, 400, at(0)));
  EXPECT_FALSE(m.known());
  // 10 MB/s of direct traffic beside 20 MB/s of relayed: no rate before kWarm.
  EXPECT_FALSE(m.sample(1000 + 3000000, 400 + 2000000, at(0.1)));
  EXPECT_FALSE(m.known());
  double w = LoadMeter::kWarm;
  ASSERT_TRUE(m.sample(1000 + static_cast<uint64_t>(30e6 * w), 400 + static_cast<uint64_t>(20e6 * w), at(w)));
  EXPECT_NEAR(m.rate(), 10e6, 1) << "the average since the first reading";
  // Then a moving average: 1 s with no direct traffic at all.
  uint64_t total = 1000 + static_cast<uint64_t>(30e6 * w) + 5000000, relay = 400 + static_cast<uint64_t>(20e6 * w) + 5000000;
  ASSERT_TRUE(m.sample(total, relay, at(w + 1)));
  EXPECT_NEAR(m.rate(), 10e6 * std::exp(-1 / LoadMeter::kSmooth), 1);
  EXPECT_FALSE(m.sample(total, relay, at(w + 1 + LoadMeter::kMinGap / 2))) << "too soon for another";
}

TEST(LoadMeter, RelayBytesAheadOfTheTotalCountAsNoDirectTraffic) {
  LoadMeter m;
  m.sample(100, 100, at(0));
  ASSERT_TRUE(m.sample(100, 200, at(LoadMeter::kWarm)));  // a torn read: the relay-path counter read after a post
  EXPECT_EQ(m.rate(), 0);
}

}  // namespace
}  // namespace mesh
