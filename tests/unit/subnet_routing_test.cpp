// SPDX-License-Identifier: Apache-2.0
#include "mesh/routing/subnet_routing.h"

#include "lab_topology.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>

namespace mesh {
namespace {

using lab::Link;
using lab::linkAddr;
using lab::nicOnLink;
using lab::nodeHandle;
using lab::nodeNics;

LocalNic nic(int index, const std::string& label, std::vector<const char*> prefixes, int gid = 1) {
  LocalNic n;
  n.index = index;
  n.label = label;
  for (const char* p : prefixes) {
    LocalAddress a;
    EXPECT_TRUE(parsePrefix(p, &a.ip)) << p;
    a.gidIndex = gid;
    n.addrs.push_back(a);
  }
  return n;
}

HandleAddress peerAddr(const char* prefix, uint8_t nicIndex) {
  Ipv4Prefix p;
  EXPECT_TRUE(parsePrefix(prefix, &p)) << prefix;
  return {p.addr, p.prefixLen, nicIndex};
}

const std::vector<Link> kTriangle = {{0, 0, 1}, {1, 0, 2}, {2, 1, 2}};
const std::vector<Link> kRing = {{0, 0, 1}, {1, 1, 2}, {2, 2, 3}, {3, 0, 3}};

TEST(SubnetRouting, TriangleEveryNodeReachesEveryPeerOverItsOwnCable) {
  for (int self = 0; self < 3; ++self) {
    for (int peer = 0; peer < 3; ++peer) {
      if (self == peer) continue;
      const Link& link = *std::find_if(kTriangle.begin(), kTriangle.end(), [&](const Link& l) {
        return (l.a == self && l.b == peer) || (l.a == peer && l.b == self);
      });
      RouteResult r = routeToPeer(nodeNics(kTriangle, self), nodeHandle(kTriangle, peer));
      ASSERT_TRUE(r.ok()) << self << "->" << peer << ": " << r.error;
      ASSERT_EQ(r.routes.size(), 1u) << self << "->" << peer;
      const Route& route = r.routes[0];
      EXPECT_EQ(route.localNic, nicOnLink(kTriangle, self, link.id));
      EXPECT_EQ(route.peerNic, nicOnLink(kTriangle, peer, link.id));
      EXPECT_EQ(route.local, (Ipv4Prefix{linkAddr(link.id, self), 24}));
      EXPECT_EQ(route.peerAddr, linkAddr(link.id, peer));
      EXPECT_EQ(route.prefixLen, 24);
      EXPECT_EQ(route.gidIndex, 10 + link.id);
      EXPECT_TRUE(r.error.empty());
    }
  }
}

TEST(SubnetRouting, TriangleNodeZeroToNodeTwoUsesLinkOne) {
  RouteResult r = routeToPeer(nodeNics(kTriangle, 0), nodeHandle(kTriangle, 2));
  ASSERT_EQ(r.routes.size(), 1u) << r.error;
  EXPECT_EQ(formatPrefix(r.routes[0].local), "198.18.1.1/24");
  EXPECT_EQ(formatIpv4(r.routes[0].peerAddr), "198.18.1.3");
  EXPECT_EQ(r.routes[0].localNic, 1);
  EXPECT_EQ(r.routes[0].peerNic, 0);
}

TEST(SubnetRouting, RingNeighboursRouteButTheUncabledDiagonalFailsWithTheFix) {
  const std::vector<std::pair<int, int>> neighbours = {{0, 1}, {1, 2}, {2, 3}, {3, 0}, {0, 3}};
  for (auto [self, peer] : neighbours) {
    RouteResult r = routeToPeer(nodeNics(kRing, self), nodeHandle(kRing, peer));
    EXPECT_EQ(r.routes.size(), 1u) << self << "->" << peer << ": " << r.error;
  }
  RouteResult r = routeToPeer(nodeNics(kRing, 0), nodeHandle(kRing, 2));
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.routes.empty());
  EXPECT_EQ(r.error,
            "no local RoCEv2 port shares a subnet with the peer (peer: 198.18.1.3/24, "
            "198.18.2.3/24; local: 198.18.0.1/24 on rxe_l0:1, 198.18.3.1/24 on rxe_l3:1); "
            "check the cabling and addresses, or NCCL_MESH_HCA");
  RouteResult back = routeToPeer(nodeNics(kRing, 2), nodeHandle(kRing, 0));
  EXPECT_FALSE(back.ok());
  EXPECT_NE(back.error.find("peer: 198.18.0.1/24, 198.18.3.1/24"), std::string::npos) << back.error;
}

TEST(SubnetRouting, NoMatchErrorNamesEveryLocalSubnetWithItsLabel) {
  std::vector<LocalNic> nics = {nic(0, "rxe_p1:1/p1", {"198.18.0.1/24"}),
                                nic(1, "rxe_p2:1/p2", {"198.18.1.1/24"})};
  RouteResult r = routeToPeer(nics, {peerAddr("198.18.3.2/24", 0), peerAddr("198.18.4.3/24", 1)});
  EXPECT_EQ(r.error,
            "no local RoCEv2 port shares a subnet with the peer (peer: 198.18.3.2/24, "
            "198.18.4.3/24; local: 198.18.0.1/24 on rxe_p1:1/p1, 198.18.1.1/24 on "
            "rxe_p2:1/p2); check the cabling and addresses, or NCCL_MESH_HCA");
}

TEST(SubnetRouting, TwoParallelLinksToOnePeerGiveTwoRoutesOnDistinctNics) {
  const std::vector<Link> links = {{0, 0, 1}, {5, 0, 1}, {1, 0, 2}};
  RouteResult r = routeToPeer(nodeNics(links, 0), nodeHandle(links, 1));
  ASSERT_EQ(r.routes.size(), 2u) << r.error;
  EXPECT_EQ(r.routes[0].localNic, 0);
  EXPECT_EQ(r.routes[1].localNic, 1);
  EXPECT_EQ(r.routes[0].peerNic, 0);
  EXPECT_EQ(r.routes[1].peerNic, 1);
  EXPECT_EQ(formatIpv4(r.routes[0].peerAddr), "198.18.0.2");
  EXPECT_EQ(formatIpv4(r.routes[1].peerAddr), "198.18.5.2");
}

TEST(SubnetRouting, OverlappingPrefixesPickTheLongestLocalMatch) {
  std::vector<LocalNic> nics = {nic(0, "wide", {"10.1.0.1/16"}, 3),
                                nic(1, "narrow", {"10.1.5.1/24"}, 4)};
  // The peer sees the link as a /16 too: both local NICs would accept it, but like the
  // kernel only the longest local prefix (the /24) counts.
  RouteResult both = routeToPeer(nics, {peerAddr("10.1.5.2/16", 0)});
  ASSERT_EQ(both.routes.size(), 1u) << both.error;
  EXPECT_EQ(both.routes[0].localNic, 1);
  EXPECT_EQ(both.routes[0].gidIndex, 4);
  EXPECT_EQ(both.routes[0].prefixLen, 16) << "min of the two sides";

  // A peer in the /16 but outside the /24 is reached over the /16 NIC only.
  RouteResult wide = routeToPeer(nics, {peerAddr("10.1.7.2/16", 0)});
  ASSERT_EQ(wide.routes.size(), 1u) << wide.error;
  EXPECT_EQ(wide.routes[0].localNic, 0);

  // A /24 peer whose subnet does not hold our /16 address is not on-link from its side.
  RouteResult narrow = routeToPeer({nics[0]}, {peerAddr("10.1.5.2/24", 0)});
  EXPECT_FALSE(narrow.ok());
}

TEST(SubnetRouting, SlashThirtyOneAndSlashThirtyLinks) {
  std::vector<LocalNic> nics = {nic(0, "p31", {"198.18.0.0/31"}), nic(1, "p30", {"198.18.1.1/30"})};
  RouteResult r = routeToPeer(nics, {peerAddr("198.18.0.1/31", 0), peerAddr("198.18.1.2/30", 1)});
  ASSERT_EQ(r.routes.size(), 2u) << r.error;
  EXPECT_EQ(r.routes[0].prefixLen, 31);
  EXPECT_EQ(r.routes[0].localNic, 0);
  EXPECT_EQ(r.routes[1].prefixLen, 30);
  EXPECT_EQ(r.routes[1].localNic, 1);

  EXPECT_FALSE(routeToPeer(nics, {peerAddr("198.18.0.2/31", 0)}).ok()) << "next /31";
  EXPECT_FALSE(routeToPeer(nics, {peerAddr("198.18.1.5/30", 0)}).ok()) << "next /30";
}

TEST(SubnetRouting, SeveralAddressesOnOneNetdevAreOneRoute) {
  std::vector<LocalNic> nics = {nic(0, "p0", {"198.18.100.1/24", "198.18.0.1/24"})};
  RouteResult r = routeToPeer(nics, {peerAddr("198.18.100.2/24", 0), peerAddr("198.18.0.2/24", 0)});
  ASSERT_EQ(r.routes.size(), 1u) << r.error;
  EXPECT_EQ(formatPrefix(r.routes[0].local), "198.18.0.1/24") << "lowest addresses win a tie";
  EXPECT_EQ(formatIpv4(r.routes[0].peerAddr), "198.18.0.2");
}

TEST(SubnetRouting, OnOneLinkTheLongestPrefixPairWins) {
  std::vector<LocalNic> nics = {nic(0, "p0", {"198.18.0.1/24", "198.19.0.1/30"})};
  RouteResult r = routeToPeer(nics, {peerAddr("198.18.0.2/24", 3), peerAddr("198.19.0.2/30", 3)});
  ASSERT_EQ(r.routes.size(), 1u) << r.error;
  EXPECT_EQ(r.routes[0].prefixLen, 30);
  EXPECT_EQ(formatIpv4(r.routes[0].peerAddr), "198.19.0.2");
  EXPECT_EQ(r.routes[0].peerNic, 3);
}

TEST(SubnetRouting, PeerWithMoreAddressesThanAHandleHolds) {
  std::vector<HandleAddress> peer;
  for (int i = 0; i < 20; ++i) {
    peer.push_back({0xC6120002u | static_cast<uint32_t>(i) << 8, 24, static_cast<uint8_t>(i)});
  }
  Handle h;
  h.addrs = peer;
  uint8_t buf[kHandleSize];
  std::string error;
  EXPECT_FALSE(encodeHandle(h, buf, &error));
  EXPECT_NE(error.find("has 20 mesh addresses but a handle holds at most 18"), std::string::npos)
      << error;

  peer.resize(kHandleMaxAddresses);
  h.addrs = peer;
  ASSERT_TRUE(encodeHandle(h, buf, &error)) << error;
  Handle decoded;
  ASSERT_TRUE(decodeHandle(buf, sizeof(buf), &decoded, &error)) << error;
  std::vector<LocalNic> nics = {nic(0, "a", {"198.18.17.1/24"}), nic(1, "b", {"198.18.3.1/24"})};
  RouteResult r = routeToPeer(nics, decoded.addrs);
  ASSERT_EQ(r.routes.size(), 2u) << r.error;
  EXPECT_EQ(r.routes[0].peerNic, 17);
  EXPECT_EQ(r.routes[1].peerNic, 3);
}

TEST(SubnetRouting, NoAddressesOnEitherSideIsAnErrorNotACrash) {
  RouteResult none = routeToPeer({}, {});
  EXPECT_FALSE(none.ok());
  EXPECT_NE(none.error.find("peer: no addresses"), std::string::npos) << none.error;
  EXPECT_NE(none.error.find("local: no usable port"), std::string::npos) << none.error;

  RouteResult emptyNics = routeToPeer({nic(0, "bare", {})}, {peerAddr("198.18.0.2/24", 0)});
  EXPECT_FALSE(emptyNics.ok());
  EXPECT_NE(emptyNics.error.find("peer: 198.18.0.2/24; local: no usable port"), std::string::npos)
      << emptyNics.error;

  RouteResult noPeer = routeToPeer({nic(0, "p0", {"198.18.0.1/24"})}, {});
  EXPECT_FALSE(noPeer.ok());
  EXPECT_NE(noPeer.error.find("198.18.0.1/24 on p0"), std::string::npos) << noPeer.error;
}

TEST(SubnetRouting, UnlabelledNicsAreNamedByIndex) {
  RouteResult r = routeToPeer({nic(7, "", {"198.18.0.1/24"})}, {peerAddr("10.0.0.1/8", 0)});
  EXPECT_NE(r.error.find("198.18.0.1/24 on nic 7"), std::string::npos) << r.error;
}

TEST(SubnetRouting, PrefixZeroMatchesAnythingButLosesToLongerPrefixes) {
  std::vector<LocalNic> nics = {nic(0, "any", {"10.0.0.1/0"}), nic(1, "p1", {"198.18.0.1/24"})};
  RouteResult r = routeToPeer(nics, {peerAddr("192.168.9.9/0", 4), peerAddr("198.18.0.2/24", 5)});
  ASSERT_EQ(r.routes.size(), 2u) << r.error;
  EXPECT_EQ(r.routes[0].localNic, 1);
  EXPECT_EQ(r.routes[0].prefixLen, 24);
  EXPECT_EQ(r.routes[1].localNic, 0);
  EXPECT_EQ(r.routes[1].prefixLen, 0);
  EXPECT_EQ(r.routes[1].peerNic, 4);
  // The /0 local address also contains 198.18.0.2, but that peer's /24 does not hold
  // 10.0.0.1, so the /24 link is not duplicated onto the /0 NIC.

  // A /0 local facing a /24 peer that does not contain it: not on-link from the peer.
  EXPECT_FALSE(routeToPeer({nics[0]}, {peerAddr("198.18.0.2/24", 0)}).ok());
}

TEST(SubnetRouting, SlashThirtyTwoOnlyMatchesTheIdenticalAddress) {
  std::vector<LocalNic> nics = {nic(0, "host", {"198.18.0.1/32"})};
  EXPECT_FALSE(routeToPeer(nics, {peerAddr("198.18.0.2/32", 0)}).ok());
  EXPECT_FALSE(routeToPeer(nics, {peerAddr("198.18.0.2/24", 0)}).ok())
      << "our /32 does not contain the peer";
  RouteResult self = routeToPeer(nics, {peerAddr("198.18.0.1/32", 0)});
  ASSERT_EQ(self.routes.size(), 1u) << self.error;
  EXPECT_EQ(self.routes[0].prefixLen, 32);
}

TEST(SubnetRouting, UsesTheNicIndexNotTheVectorPosition) {
  std::vector<LocalNic> nics = {nic(5, "five", {"198.18.0.1/24"}),
                                nic(3, "three", {"198.18.1.1/24"})};
  RouteResult r = routeToPeer(nics, {peerAddr("198.18.0.2/24", 0), peerAddr("198.18.1.2/24", 1)});
  ASSERT_EQ(r.routes.size(), 2u) << r.error;
  EXPECT_EQ(r.routes[0].localNic, 3);
  EXPECT_EQ(r.routes[1].localNic, 5);
}

TEST(SubnetRouting, OrderIsLongestPrefixThenLocalNicThenPeerNic) {
  std::vector<LocalNic> nics = {nic(0, "a", {"198.18.0.1/24"}), nic(1, "b", {"198.18.1.1/24"}),
                                nic(2, "c", {"198.18.2.1/30"})};
  RouteResult r = routeToPeer(nics, {peerAddr("198.18.1.2/24", 0), peerAddr("198.18.0.2/24", 1),
                                     peerAddr("198.18.2.2/30", 2)});
  ASSERT_EQ(r.routes.size(), 3u) << r.error;
  EXPECT_EQ(r.routes[0].localNic, 2);
  EXPECT_EQ(r.routes[1].localNic, 0);
  EXPECT_EQ(r.routes[2].localNic, 1);
}

TEST(SubnetRouting, ResultDoesNotDependOnInputOrder) {
  std::vector<LocalNic> nics = {nic(0, "a", {"198.18.0.1/24", "198.18.9.1/24"}, 1),
                                nic(1, "b", {"198.18.5.1/24"}, 2),
                                nic(2, "c", {"198.18.2.1/30"}, 3)};
  std::vector<HandleAddress> peer = {peerAddr("198.18.9.2/24", 0), peerAddr("198.18.0.2/24", 0),
                                     peerAddr("198.18.5.2/24", 1), peerAddr("198.18.2.2/30", 2)};
  RouteResult reference = routeToPeer(nics, peer);
  ASSERT_EQ(reference.routes.size(), 3u) << reference.error;
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 50; ++trial) {
    std::shuffle(nics.begin(), nics.end(), rng);
    for (LocalNic& n : nics) std::shuffle(n.addrs.begin(), n.addrs.end(), rng);
    std::shuffle(peer.begin(), peer.end(), rng);
    RouteResult r = routeToPeer(nics, peer);
    ASSERT_EQ(r.routes.size(), reference.routes.size());
    for (size_t i = 0; i < r.routes.size(); ++i) {
      EXPECT_EQ(r.routes[i].localNic, reference.routes[i].localNic) << trial << "/" << i;
      EXPECT_EQ(r.routes[i].peerNic, reference.routes[i].peerNic) << trial << "/" << i;
      EXPECT_EQ(r.routes[i].local, reference.routes[i].local) << trial << "/" << i;
      EXPECT_EQ(r.routes[i].peerAddr, reference.routes[i].peerAddr) << trial << "/" << i;
      EXPECT_EQ(r.routes[i].gidIndex, reference.routes[i].gidIndex) << trial << "/" << i;
    }
  }
  EXPECT_EQ(formatPrefix(reference.routes[1].local), "198.18.0.1/24");
}


// --- the functions of one cable end in one subnet (DGX Spark) ------------------------------

TEST(SubnetRouting, TwoFunctionsPerEndInOneSubnetArePairedOneToOne) {
  // Both PCIe functions of a Spark port in 198.18.0.0/24 at both ends: two links, each local
  // function once, each peer function once (not all four pairs).
  std::vector<LocalNic> nics = {nic(0, "rocep1s0f1", {"198.18.0.1/24"}), nic(1, "roceP2p1s0f1", {"198.18.0.3/24"})};
  RouteResult r = routeToPeer(nics, {peerAddr("198.18.0.2/24", 0), peerAddr("198.18.0.4/24", 1)});
  ASSERT_EQ(r.routes.size(), 2u) << r.error;
  EXPECT_EQ(r.routes[0].localNic, 0);
  EXPECT_EQ(r.routes[0].peerNic, 0);
  EXPECT_EQ(r.routes[1].localNic, 1);
  EXPECT_EQ(r.routes[1].peerNic, 1);
  EXPECT_EQ(formatIpv4(r.routes[1].peerAddr), "198.18.0.4");
}

TEST(SubnetRouting, UnevenFunctionCountsStillUseEveryFunctionOnce) {
  std::vector<LocalNic> one = {nic(0, "f0", {"198.18.0.1/24"})};
  std::vector<HandleAddress> two = {peerAddr("198.18.0.2/24", 0), peerAddr("198.18.0.4/24", 1)};
  EXPECT_EQ(routeToPeer(one, two).routes.size(), 2u);  // one local function: both peer functions
  std::vector<LocalNic> three = {nic(0, "f0", {"198.18.0.1/24"}), nic(1, "f1", {"198.18.0.3/24"}),
                                 nic(2, "f2", {"198.18.0.5/24"})};
  RouteResult r = routeToPeer(three, two);
  ASSERT_EQ(r.routes.size(), 3u) << r.error;
  std::vector<int> peerUse(2, 0);
  for (size_t i = 0; i < r.routes.size(); ++i) {
    EXPECT_EQ(r.routes[i].localNic, static_cast<int>(i));
    peerUse[r.routes[i].peerNic]++;
  }
  EXPECT_EQ(peerUse[0], 2);
  EXPECT_EQ(peerUse[1], 1);
}

TEST(SubnetRouting, FunctionsInSubnetsOfTheirOwnAreParallelLinks) {
  // The other Spark configuration: each function pair its own subnet, two routes as before.
  std::vector<LocalNic> nics = {nic(0, "f0", {"198.18.0.1/24"}), nic(1, "f1", {"198.18.128.1/24"})};
  RouteResult r = routeToPeer(nics, {peerAddr("198.18.0.2/24", 0), peerAddr("198.18.128.2/24", 1)});
  ASSERT_EQ(r.routes.size(), 2u) << r.error;
  EXPECT_EQ(r.routes[0].peerNic, 0);
  EXPECT_EQ(r.routes[1].peerNic, 1);
}

// --- the connect side's cap and the accept side's check, both owned here ------------------

TEST(ConnectRoutes, KeepsRouteToPeersOrderAndCapsTheLinkCount) {
  std::vector<LocalNic> nics;
  std::vector<HandleAddress> peer;
  for (int i = 0; i < 6; ++i) {
    std::string local = "198.18." + std::to_string(i) + ".1/24";
    std::string remote = "198.18." + std::to_string(i) + ".2/24";
    nics.push_back(nic(5 - i, "n" + std::to_string(i), {local.c_str()}));
    peer.push_back(peerAddr(remote.c_str(), static_cast<uint8_t>(i)));
  }
  RouteResult all = routeToPeer(nics, peer);
  ASSERT_EQ(all.routes.size(), 6u) << all.error;
  RouteResult capped = connectRoutes(nics, peer, kHsMaxLinks);
  ASSERT_EQ(capped.routes.size(), static_cast<size_t>(kHsMaxLinks));
  for (size_t i = 0; i < capped.routes.size(); ++i) {
    EXPECT_EQ(capped.routes[i].localNic, all.routes[i].localNic) << i;
    EXPECT_EQ(capped.routes[i].peerNic, all.routes[i].peerNic) << i;
  }
  EXPECT_EQ(capped.routes[0].localNic, 0);
  EXPECT_EQ(connectRoutes(nics, peer, 0).routes.size(), 1u);
  EXPECT_EQ(connectRoutes(nics, peer, 100).routes.size(), 6u);
}

TEST(ConnectRoutes, NoSharedSubnetKeepsRouteToPeersError) {
  RouteResult r = connectRoutes(nodeNics(kRing, 0), nodeHandle(kRing, 2), kHsMaxLinks);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error, routeToPeer(nodeNics(kRing, 0), nodeHandle(kRing, 2)).error);
}

// What a connector puts in its HELLO for its routes ("sender" = the connector).
std::vector<HsLink> helloLinks(const std::vector<Route>& routes) {
  std::vector<HsLink> links;
  for (const Route& r : routes) links.push_back(linkForRoute(r));
  return links;
}

TEST(AcceptRoutes, LinkForRouteNamesTheAuthorAsSender) {
  Route r;
  r.localNic = 2;
  r.local = {0xC6120101u, 24};
  r.peerAddr = 0xC6120102u;
  r.peerNic = 5;
  r.prefixLen = 24;
  HsLink l = linkForRoute(r);
  EXPECT_EQ(l.senderAddr, 0xC6120101u);
  EXPECT_EQ(l.receiverAddr, 0xC6120102u);
  EXPECT_EQ(l.senderNic, 2);
  EXPECT_EQ(l.receiverNic, 5);
  EXPECT_EQ(l.prefixLen, 24);
  EXPECT_EQ(l.ctrlAddr, 0u);
  EXPECT_EQ(l.ctrlRkey, 0u);
}

TEST(AcceptRoutes, BothEndsAgreeOnEveryCableOfTheTriangleAndRing) {
  for (const auto* topo : {&kTriangle, &kRing}) {
    int nodes = topo == &kTriangle ? 3 : 4;
    for (int self = 0; self < nodes; ++self) {
      for (int peer = 0; peer < nodes; ++peer) {
        RouteResult out = connectRoutes(nodeNics(*topo, self), nodeHandle(*topo, peer), kHsMaxLinks);
        if (self == peer || !out.ok()) continue;
        RouteResult in = acceptRoutes(nodeNics(*topo, peer), helloLinks(out.routes));
        ASSERT_TRUE(in.ok()) << self << "->" << peer << ": " << in.error;
        ASSERT_EQ(in.routes.size(), out.routes.size());
        for (size_t i = 0; i < in.routes.size(); ++i) {
          EXPECT_EQ(in.routes[i].local.addr, out.routes[i].peerAddr);
          EXPECT_EQ(in.routes[i].peerAddr, out.routes[i].local.addr);
          EXPECT_EQ(in.routes[i].localNic, out.routes[i].peerNic);
          EXPECT_EQ(in.routes[i].peerNic, out.routes[i].localNic);
          EXPECT_EQ(in.routes[i].prefixLen, out.routes[i].prefixLen);
        }
      }
    }
  }
}

TEST(AcceptRoutes, KeepsTheHellosOrderAndTakesTheGidOfTheMatchedAddress) {
  std::vector<LocalNic> nics = {nic(0, "a", {"198.18.0.2/24"}, 3), nic(1, "b", {"198.18.1.2/24"}, 7)};
  std::vector<HsLink> links(2);
  links[0] = {0xC6120101u, 0xC6120102u, 4, 1, 24, 0, 0};  // 198.18.1.1 -> 198.18.1.2
  links[1] = {0xC6120001u, 0xC6120002u, 2, 0, 24, 0, 0};  // 198.18.0.1 -> 198.18.0.2
  RouteResult r = acceptRoutes(nics, links);
  ASSERT_EQ(r.routes.size(), 2u) << r.error;
  EXPECT_EQ(r.routes[0].localNic, 1);
  EXPECT_EQ(r.routes[0].gidIndex, 7);
  EXPECT_EQ(r.routes[0].peerNic, 4);
  EXPECT_EQ(r.routes[1].localNic, 0);
  EXPECT_EQ(r.routes[1].gidIndex, 3);
}

TEST(AcceptRoutes, RefusesALinkWhoseNicAddressOrSubnetDoesNotMatch) {
  std::vector<LocalNic> nics = {nic(0, "a", {"198.18.0.2/24"}), nic(1, "b", {"198.18.1.2/24"})};
  HsLink good{0xC6120001u, 0xC6120002u, 0, 0, 24, 0, 0};
  HsLink wrongNic = good;
  wrongNic.receiverNic = 1;  // our address, but on the other NIC
  HsLink unknownNic = good;
  unknownNic.receiverNic = 9;
  HsLink foreignSender = good;
  foreignSender.senderAddr = 0xC6120501u;  // 198.18.5.1 is not on 198.18.0.0/24
  for (const HsLink& bad : {wrongNic, unknownNic, foreignSender}) {
    RouteResult r = acceptRoutes(nics, {good, bad});
    EXPECT_FALSE(r.ok());
    EXPECT_TRUE(r.routes.empty());
    EXPECT_NE(r.error.find("does not match a local port's subnet"), std::string::npos) << r.error;
  }
  EXPECT_EQ(acceptRoutes(nics, {foreignSender}).error,
            "link 198.18.5.1 -> 198.18.0.2 does not match a local port's subnet");
  EXPECT_EQ(acceptRoutes(nics, {}).error, "the HELLO names no link");
}

}  // namespace
}  // namespace mesh
