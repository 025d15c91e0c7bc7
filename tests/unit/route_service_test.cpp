// SPDX-License-Identifier: Apache-2.0
// The route-discovery service on real UDP sockets over loopback: two services in this
// process (distinct ports, HELLOs sent to each other's port instead of a broadcast, which
// loopback cannot carry) learn each other's subnets, shrug off garbage, and stop cleanly.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mesh/platform/ipv4.h"
#include "mesh/relay/relay_proto.h"
#include "mesh/relay/route_service.h"
#include "warn_capture.h"

namespace mesh {
namespace {

using std::chrono::milliseconds;

uint32_t ip(const char* text) {
  uint32_t a = 0;
  EXPECT_TRUE(parseIpv4(text, &a)) << text;
  return a;
}

LocalNic nic(int index, const char* label, const char* addr, uint8_t len) {
  LocalNic n;
  n.index = index;
  n.label = label;
  n.addrs.push_back({Ipv4Prefix{ip(addr), len}, 1});
  return n;
}

sockaddr_in udpTo(uint32_t addr, int port) { return ipv4SockAddr(addr, static_cast<uint16_t>(port)); }

// Polls cond every 10 ms until it holds or the deadline passes.
bool waitFor(const std::function<bool()>& cond, milliseconds deadline = milliseconds(10000)) {
  auto end = std::chrono::steady_clock::now() + deadline;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

bool hasLine(const RouteService& s, const std::string& prefix) {
  std::vector<std::string> lines = s.describe();
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.rfind(prefix, 0) == 0; });
}

// A and B share the link 127.0.1.0/24; A alone is on 127.0.2.0/24, B alone on 127.0.3.0/24.
// Each sends the link's HELLOs to the other's UDP port (known once the other started).
struct Pair {
  Reactor reactor;
  std::atomic<int> portA{0};
  std::atomic<int> portB{0};
  std::unique_ptr<RouteService> a;
  std::unique_ptr<RouteService> b;

  static RouteServiceSettings settings(const char* linkAddr, std::atomic<int>* peerPort,
                                       uint64_t holdMs) {
    RouteServiceSettings s;
    s.udpPort = 0;  // any free port: tests may run in parallel
    s.helloMs = 100;
    s.routes.holdMs = holdMs;
    uint32_t peer = ip(linkAddr);
    uint32_t link = ip("127.0.1.0");
    s.destinations = [peer, link, peerPort](const LocalNic&, const LocalAddress& addr, int) {
      std::vector<sockaddr_in> out;
      int port = peerPort->load();
      if ((addr.ip.addr & prefixMask(24)) == link && port != 0) out.push_back(udpTo(peer, port));
      return out;
    };
    return s;
  }

  // holdMs: long by default, so that a loaded 2-core CI machine never expires a live
  // neighbour; short where expiry is the point.
  // aDrops: A's addresses that send no HELLO (the test-only switch).
  explicit Pair(uint64_t holdMs = 5000, std::vector<uint32_t> aDrops = {}) {
    EXPECT_EQ(reactor.start(), ncclSuccess);
    RouteServiceSettings sa = settings("127.0.1.2", &portB, holdMs);
    sa.dropHellosFrom = std::move(aDrops);
    a = std::make_unique<RouteService>(
        &reactor, std::vector<LocalNic>{nic(0, "a0", "127.0.1.1", 24), nic(1, "a1", "127.0.2.1", 24)}, sa);
    b = std::make_unique<RouteService>(
        &reactor, std::vector<LocalNic>{nic(0, "b0", "127.0.1.2", 24), nic(1, "b1", "127.0.3.1", 24)},
        settings("127.0.1.1", &portA, holdMs));
  }
  void start() {
    ASSERT_EQ(a->start(), ncclSuccess);
    ASSERT_EQ(b->start(), ncclSuccess);
    portA = a->udpPort();
    portB = b->udpPort();
    ASSERT_NE(portA.load(), 0);
    ASSERT_NE(portB.load(), 0);
  }
  bool converged() const {
    return hasLine(*a, "127.0.3.0/24 learned hops 1 on a0 via 127.0.1.2") &&
           hasLine(*b, "127.0.2.0/24 learned hops 1 on b0 via 127.0.1.1");
  }
};

TEST(RouteService, NodeIdIgnoresOrderAndTellsAddressSetsApart) {
  std::vector<LocalNic> ab{nic(0, "p0", "198.18.0.1", 24), nic(1, "p1", "198.18.1.1", 24)};
  std::vector<LocalNic> ba{nic(0, "x", "198.18.1.1", 24), nic(1, "y", "198.18.0.1", 24)};
  EXPECT_EQ(nodeIdFromPorts(ab), nodeIdFromPorts(ba));  // labels and port order do not count
  EXPECT_NE(nodeIdFromPorts(ab), 0u);
  EXPECT_NE(nodeIdFromPorts({}), 0u);

  std::vector<LocalNic> other{nic(0, "p0", "198.18.0.2", 24), nic(1, "p1", "198.18.1.1", 24)};
  std::vector<LocalNic> prefix{nic(0, "p0", "198.18.0.1", 25), nic(1, "p1", "198.18.1.1", 24)};
  std::vector<LocalNic> fewer{nic(0, "p0", "198.18.0.1", 24)};
  EXPECT_NE(nodeIdFromPorts(ab), nodeIdFromPorts(other));
  EXPECT_NE(nodeIdFromPorts(ab), nodeIdFromPorts(prefix));
  EXPECT_NE(nodeIdFromPorts(ab), nodeIdFromPorts(fewer));
}

TEST(RouteService, BroadcastRulePerPrefix) {
  LocalNic p = nic(0, "p0", "198.18.4.1", 24);
  auto to = [&](const char* addr, uint8_t len) {
    std::vector<sockaddr_in> d = helloDestinations(p, LocalAddress{Ipv4Prefix{ip(addr), len}, 1}, 41517);
    std::vector<std::string> out;
    for (const sockaddr_in& sa : d) {
      out.push_back(formatIpv4(ntohl(sa.sin_addr.s_addr)) + ":" + std::to_string(ntohs(sa.sin_port)));
    }
    return out;
  };
  EXPECT_EQ(to("198.18.4.1", 24), std::vector<std::string>{"198.18.4.255:41517"});
  EXPECT_EQ(to("198.18.4.1", 30), std::vector<std::string>{"198.18.4.3:41517"});
  // /31 has no broadcast address; a unicast would reach only one process of the peer node.
  EXPECT_EQ(to("198.18.4.0", 31), std::vector<std::string>{"255.255.255.255:41517"});
  EXPECT_TRUE(to("198.18.4.1", 32).empty());
}

TEST(RouteService, SettingsFromConfig) {
  Config c;
  c.relayPort = 40000;
  c.relayMaxHops = 3;
  RouteServiceSettings s = routeServiceSettings(c);
  EXPECT_EQ(s.udpPort, 40000);
  EXPECT_EQ(s.routes.maxHops, 3);
  EXPECT_EQ(s.routes.holdMs, 4u * static_cast<uint64_t>(s.helloMs));
  EXPECT_TRUE(s.dropHellosFrom.empty());
}

TEST(RouteService, TwoNodesLearnEachOthersSubnets) {
  Pair pair;
  pair.start();
  ASSERT_TRUE(waitFor([&] { return pair.converged(); }))
      << "A: " << ::testing::PrintToString(pair.a->describe())
      << "\nB: " << ::testing::PrintToString(pair.b->describe());
  EXPECT_EQ(pair.a->neighbourCount(), 1u);
  EXPECT_EQ(pair.b->neighbourCount(), 1u);
  std::vector<NeighbourLink> seen = pair.a->neighbours();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].localPort, 0);
  EXPECT_EQ(seen[0].node, pair.b->self());
  EXPECT_EQ(seen[0].linkAddr, ip("127.0.1.2"));
  EXPECT_NE(pair.a->self(), pair.b->self());

  // A peer on B's far subnet is reached through B's address on the shared link.
  NextHopResult via = pair.a->nextHops({HandleAddress{ip("127.0.3.1"), 24, 0}});
  ASSERT_TRUE(via.ok()) << via.error;
  EXPECT_EQ(via.hops.front().route.nextHopAddr, ip("127.0.1.2"));
  EXPECT_EQ(via.hops.front().route.nextHop, pair.b->self());
  RouteServiceCounters c = pair.a->counters();
  EXPECT_GT(c.hellosSent, 0u);
  EXPECT_GT(c.hellosAccepted, 0u);
  EXPECT_EQ(c.malformed, 0u);
  pair.a->stop();
  pair.b->stop();
  pair.reactor.stop();
}

TEST(RouteService, GarbageIsCountedAndWarnedOncePerSender) {
  testing_support::WarnCapture warnings;
  Pair pair;
  pair.start();
  ASSERT_TRUE(waitFor([&] { return pair.converged(); }));

  // From A's link address (a sender on B's link) and from an address on none of B's links.
  auto sendFrom = [&](const char* from, const std::vector<uint8_t>& bytes) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in local = udpTo(ip(from), 0);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0) << strerror(errno);
    sockaddr_in to = udpTo(ip("127.0.1.2"), pair.portB.load());
    EXPECT_EQ(sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to)),
              static_cast<ssize_t>(bytes.size()));
    close(fd);
  };
  std::vector<uint8_t> junk(40, 0xab);
  std::vector<uint8_t> huge(2000, 0);
  for (int i = 0; i < 10; ++i) sendFrom("127.0.1.9", junk);
  sendFrom("127.0.1.9", huge);
  sendFrom("127.0.1.9", {});
  sendFrom("127.0.9.9", junk);
  ASSERT_TRUE(waitFor([&] { return pair.b->counters().malformed >= 12 && pair.b->counters().foreign >= 1; }))
      << "malformed " << pair.b->counters().malformed << ", foreign " << pair.b->counters().foreign;

  // Still working: A's periodic HELLOs keep being accepted after the garbage.
  uint64_t before = pair.b->counters().hellosAccepted;
  ASSERT_TRUE(waitFor([&] { return pair.b->counters().hellosAccepted >= before + 3; }));
  EXPECT_TRUE(pair.converged());
  EXPECT_EQ(pair.b->counters().malformed, 12u);
  pair.a->stop();
  pair.b->stop();
  pair.reactor.stop();  // the reactor thread logged: read the capture after it is joined

  size_t fromNine = 0;
  for (const std::string& w : warnings.lines()) {
    if (w.find("127.0.1.9") != std::string::npos) ++fromNine;
  }
  EXPECT_EQ(fromNine, 1u) << ::testing::PrintToString(warnings.lines());
}

// A view of more nodes than one HELLO carries (a cluster of 17 or more, or a sender naming
// made-up origins) goes out as overflow and the HELLOs keep going. Before, the codec refused
// the 17 records (their bytes fit one datagram) and B fell silent on every link: A lost B.
TEST(RouteService, AViewOfMoreNodesThanAHelloCarriesIsSentAsOverflow) {
  testing_support::WarnCapture warnings;
  Pair pair;
  pair.start();
  ASSERT_TRUE(waitFor([&] { return pair.converged(); }));
  RelayMessage m;
  m.type = RelayType::Hello;
  m.hello.node = 0x7777;
  m.hello.addrs = {Ipv4Prefix{ip("127.0.1.9"), 24}};
  for (int i = 0; i < 16; ++i) {
    TopologyRecord r;
    r.origin = 0x7000 + static_cast<NodeId>(i);
    r.seq = 1;
    r.addrs = {Ipv4Prefix{ip("127.0.9.1") + static_cast<uint32_t>(4 * i), 30}};
    m.topology.records.push_back(r);
  }
  std::vector<uint8_t> bytes;
  std::string why;
  ASSERT_TRUE(encodeRelay(m, &bytes, &why)) << why;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in local = udpTo(ip("127.0.1.9"), 0);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0) << strerror(errno);
  sockaddr_in to = udpTo(ip("127.0.1.2"), pair.portB.load());
  ASSERT_EQ(sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to)),
            static_cast<ssize_t>(bytes.size()));
  close(fd);
  ASSERT_TRUE(waitFor([&] { return pair.b->records().size() >= 18; })) << pair.b->records().size();
  // B's view (itself, A and the 16) is more than one HELLO carries: A keeps hearing B, told so.
  uint64_t before = pair.a->counters().hellosAccepted;
  EXPECT_TRUE(waitFor([&] { return pair.a->counters().hellosAccepted >= before + 3; }))
      << "A heard no more HELLOs from B";
  EXPECT_TRUE(waitFor([&] { return pair.a->agreement().why.find("does not fit one HELLO") != std::string::npos; }))
      << pair.a->agreement().why;
  EXPECT_FALSE(pair.b->agreement().agree);
  pair.a->stop();
  pair.b->stop();
  pair.reactor.stop();
  for (const std::string& w : warnings.lines()) EXPECT_EQ(w.find("cannot encode"), std::string::npos) << w;
}

size_t openFds() {
  size_t n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += fcntl(fd, F_GETFD) != -1 ? 1 : 0;
  return n;
}

TEST(RouteService, StopTwiceAndAfterTheReactorStopped) {
  size_t fdsBefore = openFds();
  {
    Pair pair;
    pair.start();
    pair.a->stop();
    pair.a->stop();
    EXPECT_EQ(pair.a->start(), ncclInternalError);  // a stopped service stays stopped
    pair.reactor.stop();
    pair.b->stop();  // the reactor is gone: closes inline
    pair.b->stop();
  }
  EXPECT_EQ(openFds(), fdsBefore);  // every socket closed, on either path
}

TEST(RouteService, StartNeedsARunningReactor) {
  Reactor idle;
  RouteService s(&idle, {nic(0, "p0", "127.0.5.1", 24)}, RouteServiceSettings{});
  EXPECT_EQ(s.start(), ncclInternalError);
  s.stop();
}

// The route plan (issue 31): both nodes hold both records and the same digests, so they
// agree; a node's plan answers nothing for a peer it is cabled to.
TEST(RouteService, TwoNodesBuildTheSamePictureAndAgree) {
  Pair pair;
  pair.start();
  auto agreed = [&] {
    return pair.a->agreement().agree && pair.b->agreement().agree && pair.a->plan().nodes.size() == 2 &&
           pair.b->plan().nodes.size() == 2 && pair.a->plan().tableDigest == pair.b->plan().tableDigest;
  };
  ASSERT_TRUE(waitFor(agreed)) << pair.a->agreement().why << " / " << pair.b->agreement().why;
  RoutePlan plan = pair.a->plan();
  EXPECT_EQ(plan.topologyDigest, pair.b->plan().topologyDigest);
  EXPECT_TRUE(plan.paths.empty());  // two cabled nodes: nothing to relay
  ASSERT_EQ(plan.loads.size(), 2u);
  EXPECT_EQ(plan.nodeOf(ip("127.0.3.1")), pair.b->self());
  std::vector<TopologyRecord> records = pair.b->records();
  ASSERT_EQ(records.size(), 2u);
  for (const TopologyRecord& r : records) {
    EXPECT_EQ(r.neighbours.size(), 1u);
    EXPECT_EQ(r.tableDigest, plan.tableDigest);
  }
  EXPECT_EQ(pair.a->planNextHop(0, {HandleAddress{ip("127.0.3.1"), 24, 0}}), 0u);
  pair.a->stop();
  pair.b->stop();
  pair.reactor.stop();
}

// MESH_TEST_DROP_HELLOS_FROM on A's link address: B never hears A, A hears B, and A sees
// the half-heard cable as a disagreement (B, alone in its picture, has nobody to disagree with).
TEST(RouteService, HellosDroppedOneWayAreADisagreement) {
  EXPECT_EQ(parseDropHellosFrom(" 127.0.1.1, bad ,10.0.0.1"), (std::vector<uint32_t>{ip("127.0.1.1"), ip("10.0.0.1")}));
  EXPECT_TRUE(parseDropHellosFrom(nullptr).empty());
  Pair pair(5000, {ip("127.0.1.1")});
  pair.start();
  std::string why;
  ASSERT_TRUE(waitFor([&] {
    PlanAgreement a = pair.a->agreement();
    why = a.why;
    return !a.agree && pair.a->plan().nodes.size() == 2;
  })) << why;
  EXPECT_EQ(why, "node " + hex64(pair.a->self()) + " hears node " + hex64(pair.b->self()) + " but node " +
                     hex64(pair.b->self()) + " does not hear node " + hex64(pair.a->self()) +
                     " (HELLOs lost one way, or a cable just cut)");
  EXPECT_EQ(pair.b->neighbourCount(), 0u);
  EXPECT_EQ(pair.b->plan().nodes.size(), 1u);
  pair.a->stop();
  pair.b->stop();
  pair.reactor.stop();
}

// The start-up rule (RouteService::settled): a node alone with a cable to a node not yet
// heard has an open picture, and relayed connects wait while it is open and still new. With
// HELLOs a minute apart, "two quiet periods" cannot pass during the test.
TEST(RouteService, AnOpenPictureIsNotSettledWhileItIsNew) {
  Reactor reactor;
  ASSERT_EQ(reactor.start(), ncclSuccess);
  RouteServiceSettings s;
  s.udpPort = 0;
  s.helloMs = 60000;
  s.routes.holdMs = 240000;
  s.destinations = [](const LocalNic&, const LocalAddress&, int) { return std::vector<sockaddr_in>{}; };
  RouteService alone(&reactor, {nic(0, "a0", "127.0.1.1", 24)}, s);
  EXPECT_FALSE(alone.closure().agree);  // before start: not even its own addresses
  EXPECT_EQ(alone.closure().why, "this node's own addresses are not known yet");
  ASSERT_EQ(alone.start(), ncclSuccess);
  // The first HELLO burst (on the reactor, soon after start) records its own addresses.
  ASSERT_TRUE(waitFor([&] { return alone.closure().why.find("127.0.1.1/24") != std::string::npos; }))
      << alone.closure().why;
  EXPECT_TRUE(alone.agreement().agree) << alone.agreement().why;  // nobody to disagree with...
  PlanAgreement closed = alone.closure();
  EXPECT_FALSE(closed.agree);  // ...and a cable to nobody heard
  EXPECT_EQ(closed.node, alone.self());
  EXPECT_NE(closed.why.find("127.0.1.1/24 leads to no node heard"), std::string::npos) << closed.why;
  EXPECT_FALSE(alone.settled());
  alone.stop();
  // Only a /32 (no neighbour can share it): closed, so settled at once.
  RouteService host(&reactor, {nic(0, "h0", "127.0.4.1", 32)}, s);
  ASSERT_EQ(host.start(), ncclSuccess);
  EXPECT_TRUE(waitFor([&] { return host.settled(); })) << host.closure().why;
  EXPECT_TRUE(host.closure().agree) << host.closure().why;
  host.stop();
  reactor.stop();
}

// A and B each have a port nobody answers on (a1, b1): their picture agrees but stays open for
// good, and is settled once it has stopped changing for two HELLO periods.
TEST(RouteService, AnOpenPictureThatStopsChangingSettles) {
  Pair pair;
  pair.start();
  ASSERT_TRUE(waitFor([&] { return pair.a->agreement().agree && pair.a->plan().nodes.size() == 2; }))
      << pair.a->agreement().why;
  PlanAgreement closed = pair.a->closure();
  EXPECT_FALSE(closed.agree);
  EXPECT_TRUE(closed.why.find("127.0.2.1/24") != std::string::npos ||
              closed.why.find("127.0.3.1/24") != std::string::npos) << closed.why;
  EXPECT_TRUE(waitFor([&] { return pair.a->settled() && pair.b->settled(); }));
  pair.a->stop();
  pair.b->stop();
  pair.reactor.stop();
}

TEST(RouteService, NeighbourGoesWhenSilent) {
  Pair pair(1000);
  pair.start();
  ASSERT_TRUE(waitFor([&] { return pair.converged(); }));
  pair.b->stop();
  // Expiry runs on A's 100 ms timer.
  ASSERT_TRUE(waitFor([&] { return pair.a->neighbourCount() == 0; }, milliseconds(15000)));
  EXPECT_FALSE(hasLine(*pair.a, "127.0.3.0/24"));
  pair.a->stop();
  pair.reactor.stop();
}

// A view within the counts (16 nodes) whose records do not fit one datagram: the node sends
// its HELLOs as overflow, every burst. It measured the fit on what it had advertised last,
// so an overflow HELLO (no records) read as "fits", the next burst's full records failed to
// encode, and so on: every other burst sent nothing, with a WARN each time, and the picture
// never settled. A neighbour floods 14 made-up origins with 12 neighbours each (~1850 bytes).
TEST(RouteService, ARecordSetTooLongForOneDatagramIsSentAsOverflowEveryBurst) {
  testing_support::WarnCapture warnings;
  Pair pair;
  pair.start();
  ASSERT_TRUE(waitFor([&] { return pair.converged(); }));
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in local = udpTo(ip("127.0.1.9"), 0);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0) << strerror(errno);
  sockaddr_in to = udpTo(ip("127.0.1.2"), pair.portB.load());
  for (int half = 0; half < 2; ++half) {  // two datagrams of 7 records
    RelayMessage m;
    m.type = RelayType::Hello;
    m.hello.node = 0x7000;
    m.hello.addrs = {Ipv4Prefix{ip("127.0.1.9"), 24}};
    for (int i = half * 7; i < half * 7 + 7; ++i) {
      TopologyRecord r;
      r.origin = 0x7000 + static_cast<NodeId>(i);
      r.seq = 1;
      r.addrs = {Ipv4Prefix{ip("127.0.9.1") + static_cast<uint32_t>(4 * i), 30}};
      for (int j = 0; j < 13; ++j) {
        if (j != i) r.neighbours.push_back(0x7000 + static_cast<NodeId>(j));
      }
      m.topology.records.push_back(r);
    }
    std::vector<uint8_t> bytes;
    std::string why;
    ASSERT_TRUE(encodeRelay(m, &bytes, &why)) << why;
    ASSERT_EQ(sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to)),
              static_cast<ssize_t>(bytes.size()));
  }
  close(fd);
  ASSERT_TRUE(waitFor([&] { return pair.b->records().size() == 16; })) << pair.b->records().size();
  // Five bursts that sent (the broken node needed about ten, half of them failing).
  uint64_t sent0 = pair.b->counters().hellosSent;
  EXPECT_TRUE(waitFor([&] { return pair.b->counters().hellosSent >= sent0 + 5; }));
  EXPECT_EQ(pair.b->records().size(), 16u) << "the view changed under the test";
  pair.a->stop();
  pair.b->stop();
  pair.reactor.stop();
  size_t encodeWarns = 0;
  for (const std::string& w : warnings.lines()) encodeWarns += w.find("cannot encode") != std::string::npos;
  EXPECT_EQ(encodeWarns, 0u) << "a burst whose HELLO could not be encoded (sent as full records, too long)";
}

}  // namespace
}  // namespace mesh
