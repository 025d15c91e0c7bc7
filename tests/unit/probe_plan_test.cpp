// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --probe's pure parts: which cables join two nodes, the responder's port
// list on the wire, and the words of the no-cable verdict.
#include <gtest/gtest.h>

#include "mesh/platform/ipv4.h"
#include "mesh/tools/probe_plan.h"

namespace mesh {
namespace {

uint32_t ip(const char* text) {
  uint32_t a = 0;
  EXPECT_TRUE(parseIpv4(text, &a)) << text;
  return a;
}

LocalNic nic(int index, const std::string& label, const char* addr, uint8_t len) {
  LocalNic n;
  n.index = index;
  n.label = label;
  n.addrs.push_back({Ipv4Prefix{ip(addr), len}, 1});
  return n;
}

ProbePeerPort peerPort(const std::string& label, const char* addr, uint8_t len) {
  ProbePeerPort p;
  p.label = label;
  p.addrs.push_back({ip(addr), len, 0});
  return p;
}

// Node B of a triangle A-B (198.18.0.0/24), A-C (198.18.1.0/24), B-C (198.18.2.0/24), as
// the responder, and node A as the prober.
const std::vector<LocalNic> kNodeA = {nic(0, "rxe_p1:1/p1", "198.18.0.1", 24), nic(1, "rxe_p2:1/p2", "198.18.1.1", 24)};
const std::vector<ProbePeerPort> kNodeB = {peerPort("rxe_p0:1/p0", "198.18.0.2", 24),
                                           peerPort("rxe_p2:1/p2", "198.18.2.2", 24)};

TEST(ProbePlan, OneCableBetweenTwoCornersOfATriangle) {
  ProbePlan plan = planProbe(kNodeA, kNodeB);
  ASSERT_EQ(plan.cables.size(), 1u);
  EXPECT_EQ(plan.cables[0].local, 0);
  EXPECT_EQ(plan.cables[0].peer, 0);
  EXPECT_EQ(plan.localAlone, std::vector<int>{1});
  EXPECT_EQ(plan.peerAlone, std::vector<int>{1});
  EXPECT_EQ(describeCable(plan.cables[0], kNodeA, kNodeB, "nodeb"),
            "rxe_p1:1/p1 198.18.0.1/24 <-> nodeb rxe_p0:1/p0 198.18.0.2/24 (subnet 198.18.0.0/24)");
}

TEST(ProbePlan, TwoFunctionsOnOneCableAreTwoCables) {
  // A DGX Spark style link: each PCIe function of the cable its own subnet.
  std::vector<LocalNic> a = {nic(0, "rocep1s0f1:1/enp1s0f1np1", "10.0.0.1", 30),
                             nic(1, "roceP2p1s0f1:1/enP2p1s0f1np1", "10.0.1.1", 30)};
  std::vector<ProbePeerPort> b = {peerPort("rocep1s0f1:1/enp1s0f1np1", "10.0.0.2", 30),
                                  peerPort("roceP2p1s0f1:1/enP2p1s0f1np1", "10.0.1.2", 30)};
  ProbePlan plan = planProbe(a, b);
  ASSERT_EQ(plan.cables.size(), 2u);
  EXPECT_EQ(plan.cables[0].local, 0);
  EXPECT_EQ(plan.cables[0].peer, 0);
  EXPECT_EQ(plan.cables[1].local, 1);
  EXPECT_EQ(plan.cables[1].peer, 1);
  EXPECT_TRUE(plan.localAlone.empty());
  EXPECT_TRUE(plan.peerAlone.empty());
}

TEST(ProbePlan, NoCableNamesBothSidesSubnets) {
  std::vector<ProbePeerPort> nodeC = {peerPort("rxe_p1:1/p1", "198.18.2.3", 24)};
  std::vector<LocalNic> lineEnd = {nic(0, "rxe_p1:1/p1", "198.18.0.1", 24)};
  ProbePlan plan = planProbe(lineEnd, nodeC);
  EXPECT_TRUE(plan.cables.empty());
  EXPECT_EQ(noCableVerdict(lineEnd, nodeC, "nodec"),
            "no cable between this node and nodec: no port here shares a subnet with a port there (this node: "
            "198.18.0.1/24 on rxe_p1:1/p1; nodec: 198.18.2.3/24 on rxe_p1:1/p1). Check the cabling, and that both "
            "ends of each cable have addresses in one subnet of their own");
  EXPECT_EQ(describeLocalPorts({}), "no usable port");
  EXPECT_EQ(describePeerPorts({}), "no usable port");
}

TEST(ProbePorts, EncodeDecodeRoundTripThroughRealHandles) {
  Handle h;
  h.token = 0x1122334455667788ull;
  h.port = 40000;
  h.addrs = {{ip("198.18.0.2"), 24, 0}};
  std::vector<uint8_t> bytes(kHandleSize);
  std::string error;
  ASSERT_TRUE(encodeHandle(h, bytes.data(), &error)) << error;
  std::string text = encodeProbePorts("nodeb", "nccl-mesh 1.2.3 (git abc)", {"rxe_p0:1/p0"}, {bytes});
  ProbePorts ports;
  ASSERT_TRUE(decodeProbePorts(text, &ports, &error)) << error;
  EXPECT_EQ(ports.host, "nodeb");
  EXPECT_EQ(ports.version, "nccl-mesh 1.2.3 (git abc)");
  ASSERT_EQ(ports.ports.size(), 1u);
  EXPECT_EQ(ports.ports[0].label, "rxe_p0:1/p0");
  EXPECT_EQ(ports.ports[0].addrs, h.addrs);
  EXPECT_EQ(std::vector<uint8_t>(ports.ports[0].handle, ports.ports[0].handle + kHandleSize), bytes);
}

TEST(ProbePorts, DecodeRejectsOtherProtocolsAndDamage) {
  ProbePorts ports;
  std::string error;
  EXPECT_FALSE(decodeProbePorts("SSH-2.0-OpenSSH", &ports, &error));
  EXPECT_NE(error.find("probe protocol"), std::string::npos) << error;
  EXPECT_FALSE(decodeProbePorts("probe-ports 1\nport x 00", &ports, &error));
  EXPECT_FALSE(decodeProbePorts("probe-ports 1\nport x " + std::string(2 * kHandleSize, 'z'), &ports, &error));
  EXPECT_FALSE(decodeProbePorts("probe-ports 1\nport x " + std::string(2 * kHandleSize, '0'), &ports, &error));
  EXPECT_NE(error.find("handle"), std::string::npos) << error;  // all zero: bad magic
  EXPECT_FALSE(decodeProbePorts("probe-ports 1\nfrobnicate", &ports, &error));
  EXPECT_TRUE(decodeProbePorts("probe-ports 1\nhost a", &ports, &error)) << error;
  EXPECT_TRUE(ports.ports.empty());
}

}  // namespace
}  // namespace mesh
