// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --doctor: the checks of ports and addresses, each with a tree that passes
// (the fixture's triangle member) and one that does not, and malformed sysfs/procfs entries.
#include <algorithm>

#include "doctor_fixture.h"

namespace mesh {
namespace {

// --- ports ----------------------------------------------------------------------------------------

TEST_F(DoctorTest, PortsAreReadFromSysfs) {
  expectCheck("ports", Verdict::Ok, "2 ACTIVE RoCE port(s) (sysfs): rxe_p1:1 (p1), rxe_p2:1 (p2)");
}

TEST_F(DoctorTest, APortThatIsDownWarnsAndNoActivePortFails) {
  put("sys/class/infiniband/rxe_p2/ports/1/state", "1: DOWN");
  expectCheck("ports", Verdict::Warn, "rxe_p2:1 (p2) DOWN");
  put("sys/class/infiniband/rxe_p1/ports/1/state", "1: DOWN");
  EXPECT_VERDICT(check("ports"), Verdict::Fail);
}

TEST_F(DoctorTest, NoRdmaDeviceFailsWithWhatVerbsSaid) {
  remove("sys/class/infiniband");
  expectCheck("ports", Verdict::Fail, "rdma-core lists no RDMA device");
}

TEST_F(DoctorTest, PortsFromVerbsWhereSysfsHasNone) {
  remove("sys/class/infiniband");
  src_.verbsPorts = [](const Config&, std::string*) {
    PortFact p;
    p.device = "fab_p1";
    p.state = "ACTIVE";
    p.linkLayer = "Ethernet";
    p.netdev = "p1";
    p.activeMtu = 4096;
    GidEntry g;
    g.index = 1;
    g.rocev2 = true;
    g.netdev = "p1";
    uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1};
    memcpy(g.gid, gid, 16);
    p.gids.push_back(g);
    return std::vector<PortFact>{p};
  };
  expectCheck("ports", Verdict::Ok, "(verbs): fab_p1:1 (p1)");
  EXPECT_VERDICT(check("roce-gids"), Verdict::Ok);
}

TEST_F(DoctorTest, AMalformedGidFileIsAWarnNamingIt) {
  put("sys/class/infiniband/rxe_p2/ports/1/gids/2", "not-a-gid");
  expectCheck("ports", Verdict::Warn, "/sys/class/infiniband/rxe_p2/ports/1/gids/2 is not a GID");
}

// The table was read as 0..largest name: one stray entry in a damaged tree took 45 s, 726 MB
// and 155 MB of output. Only the entries there are read; one beyond any table is named.
TEST_F(DoctorTest, AStrayGidEntryFarBeyondTheTableIsSkippedAndNamed) {
  put("sys/class/infiniband/rxe_p2/ports/1/gids/99999999", "0000:0000:0000:0000:0000:ffff:c612:0101");
  CheckResult r = expectCheck("ports", Verdict::Warn, "gids/99999999: beyond any GID table");
  EXPECT_LT(r.found.size(), 2000u) << r.found.substr(0, 300);
  EXPECT_VERDICT(check("roce-gids"), Verdict::Ok);
}

TEST_F(DoctorTest, AnUnreadablePortStateIsAWarnNamingIt) {
  remove("sys/class/infiniband/rxe_p2/ports/1/state");
  mkdir("sys/class/infiniband/rxe_p2/ports/1/state");
  expectCheck("ports", Verdict::Warn, "rxe_p2/ports/1/state");
}

// --- MTU and GIDs ---------------------------------------------------------------------------------

TEST_F(DoctorTest, Mtu1500OnOnePortWarns) {
  netif("p2").mtu = 1500;
  CheckResult r = expectCheck("mtu", Verdict::Warn, "p2 1500 (RoCE 1024)");
  EXPECT_MENTIONS(r.fix, "mtu 9000");
}

// 9000 and 9216 (or 4200) both give a RoCE MTU of 4096: nothing to change. (It warned "the
// ports differ" comparing the netdevs' MTUs.)
TEST_F(DoctorTest, NetdevMtusThatDifferButGiveTheSameRoceMtuAreOk) {
  netif("p2").mtu = 9216;
  expectCheck("mtu", Verdict::Ok, "p2 9216 (RoCE 4096)");
  netif("p2").mtu = 4200;
  EXPECT_VERDICT(check("mtu"), Verdict::Ok);
}

TEST_F(DoctorTest, APortsNetdevOutsideThisNamespaceIsAWarnSayingSo) {
  netifs_.erase(std::remove_if(netifs_.begin(), netifs_.end(), [](const NetIf& i) { return i.name == "p2"; }),
                netifs_.end());
  CheckResult r = expectCheck("mtu", Verdict::Warn, "netdev not in this namespace: p2");
  EXPECT_MENTIONS(r.found, "cannot be read here");
  EXPECT_MENTIONS(r.fix, "--network host");
}

TEST_F(DoctorTest, AnAddressWithoutItsRoceV2GidFails) {
  netif("p2").ipv4.push_back({0xc6120201, 24});  // 198.18.2.1, added after the port came up
  expectCheck("roce-gids", Verdict::Fail, "p2 198.18.2.1 on rxe_p2:1");
}

TEST_F(DoctorTest, ARoceV1GidDoesNotCount) {
  put("sys/class/infiniband/rxe_p1/ports/1/gid_attrs/types/1", "IB/RoCE v1");
  EXPECT_VERDICT(check("roce-gids"), Verdict::Fail);
}

TEST_F(DoctorTest, APortWithoutAnAddressWarns) {
  netif("p2").ipv4.clear();
  EXPECT_VERDICT(check("roce-gids"), Verdict::Warn);
}

TEST_F(DoctorTest, APinnedGidIndexWithIpv6GidsWarns) {
  src_.env["NCCL_MESH_GID_INDEX"] = "1";
  EXPECT_VERDICT(check("gid-index"), Verdict::Ok);
  put("sys/class/infiniband/rxe_p1/ports/1/gids/2", "2001:0db8:0000:0000:0000:0000:0000:0001");
  put("sys/class/infiniband/rxe_p1/ports/1/gid_attrs/types/2", "RoCE v2");
  CheckResult r = expectCheck("gid-index", Verdict::Warn);
  EXPECT_MENTIONS(r.fix, "unset NCCL_MESH_GID_INDEX");
}

TEST_F(DoctorTest, APinnedGidIndexThatIsNotAnIpv4GidFails) {
  src_.env["NCCL_MESH_GID_INDEX"] = "0";  // the link-local GID
  expectCheck("gid-index", Verdict::Fail, "rxe_p1:1 (p1)");
}

// --- two ports in one subnet: ARP and reverse-path filtering -------------------------------------

class DoctorSharedSubnetTest : public DoctorTest {
 protected:
  void SetUp() override {
    DoctorTest::SetUp();
    // Both functions of one DGX Spark port in one subnet (NVIDIA's instructions).
    addPort("roceP2p1s0f1", "enP2p1s0f1np1", "198.18.0.11");
    for (const char* k : {"arp_ignore", "arp_announce", "rp_filter"}) {
      put(std::string("proc/sys/net/ipv4/conf/enP2p1s0f1np1/") + k, "0");
    }
    netif("enP2p1s0f1np1").mtu = 9000;
    netif("enP2p1s0f1np1").ipv4 = {{0xc612000b, 24}};
  }
};

TEST_F(DoctorSharedSubnetTest, WithoutArpSettingsFails) {
  CheckResult r = expectCheck("arp", Verdict::Fail, "enP2p1s0f1np1+p1 in 198.18.0.0/24");
  EXPECT_MENTIONS(r.fix, "arp_ignore=1");
}

TEST_F(DoctorSharedSubnetTest, ArpSettingsOnAllPass) {
  put("proc/sys/net/ipv4/conf/all/arp_ignore", "1");
  put("proc/sys/net/ipv4/conf/all/arp_announce", "2");
  EXPECT_VERDICT(check("arp"), Verdict::Ok);
}

TEST_F(DoctorSharedSubnetTest, AMalformedSysctlIsAWarnNamingIt) {
  put("proc/sys/net/ipv4/conf/all/arp_ignore", "1");
  put("proc/sys/net/ipv4/conf/all/arp_announce", "2");
  put("proc/sys/net/ipv4/conf/p1/arp_announce", "two");
  expectCheck("arp", Verdict::Warn, "conf/p1/arp_announce is not a number");
}

TEST_F(DoctorSharedSubnetTest, StrictRpFilterFailsAndLoosePasses) {
  put("proc/sys/net/ipv4/conf/enP2p1s0f1np1/rp_filter", "1");
  EXPECT_VERDICT(check("rp-filter"), Verdict::Fail);
  put("proc/sys/net/ipv4/conf/all/rp_filter", "2");  // the larger of all and the port's
  EXPECT_VERDICT(check("rp-filter"), Verdict::Ok);
}

TEST_F(DoctorTest, StrictRpFilterWithOneSubnetPerPortIsOk) {
  put("proc/sys/net/ipv4/conf/all/rp_filter", "1");
  EXPECT_VERDICT(check("rp-filter"), Verdict::Ok);
  remove("proc/sys/net/ipv4/conf/p2/rp_filter");
  expectCheck("rp-filter", Verdict::Warn, "conf/p2/rp_filter");
}

// --- the bootstrap interface and the relay ---------------------------------------------------------

TEST_F(DoctorTest, SocketIfnameOnAMeshPortFailsInATriangle) {
  src_.env["NCCL_SOCKET_IFNAME"] = "p1";
  EXPECT_VERDICT(check("socket-ifname"), Verdict::Fail);
  src_.env["NCCL_SOCKET_IFNAME"] = "=nothing";
  EXPECT_VERDICT(check("socket-ifname"), Verdict::Fail);
  src_.env.erase("NCCL_SOCKET_IFNAME");
  EXPECT_VERDICT(check("socket-ifname"), Verdict::Warn);
  src_.env["NCCL_SOCKET_IFNAME"] = "^p,lo";  // NCCL's exclude syntax
  EXPECT_VERDICT(check("socket-ifname"), Verdict::Ok);
}

TEST_F(DoctorTest, ARingWithoutTheRelayFails) {
  src_.nodes = 4;  // two cables, four nodes: a ring or a line
  expectCheck("relay", Verdict::Fail, "1 node(s) have no cable to this one");
  src_.env["NCCL_MESH_RELAY"] = "auto";
  EXPECT_VERDICT(check("relay"), Verdict::Ok);
}

TEST_F(DoctorTest, ALongRingNeedsMoreRelayHops) {
  src_.nodes = 8;
  src_.env["NCCL_MESH_RELAY"] = "auto";
  expectCheck("relay", Verdict::Warn, "a ring of 8 nodes needs 3");
  src_.env["NCCL_MESH_RELAY_MAX_HOPS"] = "6";
  EXPECT_VERDICT(check("relay"), Verdict::Ok);
}

// NCCL_MESH_RELAY_MAX_HOPS takes 1..15: for 18 nodes and more the fix named a value the
// plugin refuses (a WARN, and the default 2).
TEST_F(DoctorTest, TheRelayHopsSuggestionStaysInTheSettingsRange) {
  src_.nodes = 20;
  src_.env["NCCL_MESH_RELAY"] = "auto";
  CheckResult r = expectCheck("relay", Verdict::Warn, "a ring of 20 nodes needs 9 (a line 18)");
  EXPECT_MENTIONS(r.fix, "NCCL_MESH_RELAY_MAX_HOPS=15 on every node (its largest value");
  EXPECT_EQ(r.fix.find("=18"), std::string::npos) << r.fix;
}

TEST_F(DoctorTest, WithoutANodeCountTwoPeersWarn) {
  src_.nodes = 0;
  EXPECT_VERDICT(check("relay"), Verdict::Warn);
  src_.env["NCCL_MESH_ROUTES"] = "198.18.2.0/24=198.18.0.2";
  src_.nodes = 3;
  EXPECT_VERDICT(check("relay"), Verdict::Warn);  // static routes ignored with the relay off
}

TEST_F(DoctorSharedSubnetTest, BothFunctionsOfOneCableCountAsOnePeer) {
  remove("sys/class/infiniband/rxe_p2");
  src_.nodes = 2;
  expectCheck("relay", Verdict::Ok, "cabled to 1 peer(s) over 1 subnet(s)");
}

// The kernel's ARP table, as /proc/net/arp prints it.
std::string arpTable(const std::vector<std::string>& rows) {
  std::string t = "IP address       HW type     Flags       HW address            Mask     Device\n";
  for (const std::string& r : rows) t += r + "\n";
  return t;
}

// NVIDIA's layout for more than three DGX Sparks: every node's port on a switch, in subnets
// all nodes share. The node's two ports, each with one peer node in the ARP table, still look
// like a ring of four; several neighbours on one port are a switch: no relay needed, and the
// bootstrap may run on that port.
TEST_F(DoctorTest, PortsOnASwitchNeedNoRelay) {
  src_.nodes = 4;
  put("proc/net/arp", arpTable({"198.18.0.2       0x1         0x2         52:54:00:00:00:01     *        p1",
                                "198.18.1.3       0x1         0x2         52:54:00:01:00:02     *        p2",
                                "198.18.0.9       0x1         0x0         00:00:00:00:00:00     *        p1"}));
  expectCheck("relay", Verdict::Fail, "ping the others over them and run the doctor again");
  put("proc/net/arp", arpTable({"198.18.0.2       0x1         0x2         52:54:00:00:00:01     *        p1",
                                "198.18.0.3       0x1         0x2         52:54:00:00:00:02     *        p1",
                                "198.18.0.4       0x1         0x6         52:54:00:00:00:03     *        p1",
                                "10.0.0.7         0x1         0x2         52:54:00:00:00:04     *        p1"}));
  expectCheck("relay", Verdict::Ok, "on a switch: 198.18.0.0/24 on p1 (3 neighbours in the ARP table)");
  src_.env["NCCL_SOCKET_IFNAME"] = "p1";
  expectCheck("socket-ifname", Verdict::Ok, "reaches every node on the switch");
  src_.env["NCCL_SOCKET_IFNAME"] = "p2";  // still a cable to one peer
  EXPECT_VERDICT(check("socket-ifname"), Verdict::Fail);
  src_.env["NCCL_MESH_ROUTES"] = "198.18.2.0/24=198.18.0.2";  // ignored with the relay off, switch or not
  EXPECT_VERDICT(check("relay"), Verdict::Warn);
}

// Both functions of a cable end in one subnet see the peer's two functions: one peer, no switch.
TEST_F(DoctorSharedSubnetTest, APeersTwoFunctionsInTheArpTableAreNoSwitch) {
  remove("sys/class/infiniband/rxe_p2");
  src_.nodes = 3;
  put("proc/net/arp", arpTable({"198.18.0.2       0x1         0x2         52:54:00:00:00:01     *        p1",
                                "198.18.0.12      0x1         0x2         52:54:00:00:00:02     *        p1",
                                "198.18.0.12      0x1         0x2         52:54:00:00:00:02     *        enP2p1s0f1np1"}));
  expectCheck("relay", Verdict::Fail, "cabled to 1 peer(s) over 1 subnet(s)");
}

TEST_F(DoctorTest, SparkFunctionsInTheirOwnSubnetsAreOneCable) {
  remove("sys/class/infiniband/rxe_p2");
  addPort("rocep1s0f1", "enp1s0f1np1", "198.18.4.1");
  addPort("roceP2p1s0f1", "enP2p1s0f1np1", "198.18.5.1");
  netif("enp1s0f1np1").ipv4 = {{0xc6120401, 24}};
  netif("enP2p1s0f1np1").ipv4 = {{0xc6120501, 24}};
  src_.nodes = 3;  // p1 and the Spark cable: 2 peers
  expectCheck("relay", Verdict::Ok, "cabled to 2 peer(s) over 3 subnet(s)");
}

}  // namespace
}  // namespace mesh
