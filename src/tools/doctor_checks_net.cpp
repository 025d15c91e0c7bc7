// SPDX-License-Identifier: Apache-2.0
// The doctor's checks of ports and addresses: RDMA ports and their state, MTU, a RoCEv2 GID
// for every IPv4 address, a pinned GID index against IPv6 GIDs, ARP and reverse-path
// filtering where two ports share a subnet, the bootstrap interface, and the relay setting
// against this node's cables (or a switch, seen in the ARP table). Pure: each judges
// DoctorFacts only.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "mesh/discovery/cables.h"
#include "mesh/discovery/hca_filter.h"
#include "mesh/platform/text.h"
#include "mesh/routing/routes.h"
#include "mesh/tools/doctor.h"

namespace mesh {

namespace {

std::string joined(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

// ACTIVE Ethernet ports with a netdev: what the plugin can use.
std::vector<const PortFact*> meshPorts(const DoctorFacts& f) {
  std::vector<const PortFact*> out;
  for (const PortFact& p : f.ports) {
    if (p.active() && p.ethernet() && !p.netdev.empty()) out.push_back(&p);
  }
  return out;
}

std::vector<std::string> meshNetdevs(const DoctorFacts& f) {
  std::vector<std::string> out;
  for (const PortFact* p : meshPorts(f)) {
    if (std::find(out.begin(), out.end(), p->netdev) == out.end()) out.push_back(p->netdev);
  }
  return out;
}

// The lab's parallel cables to node j are named p<j>, p<j>b, p<j>c, ...: one peer, several
// cables (a cable's functions are grouped by mesh/discovery/cables.h, as the plugin does).
std::string parallelLinkKey(const std::string& netdev) {
  size_t digits = netdev.find_first_not_of("0123456789", 1);
  bool labParallel = netdev.size() > 2 && netdev[0] == 'p' && digits == netdev.size() - 1 && digits > 1 &&
                     netdev.back() >= 'b' && netdev.back() <= 'h';
  return labParallel ? netdev.substr(0, digits) : netdev;
}

struct Subnet {
  Ipv4Prefix net;
  std::vector<std::string> netdevs;
};

// The subnets (prefix < 32) of the mesh netdevs' addresses, each with its netdevs.
std::vector<Subnet> meshSubnets(const DoctorFacts& f) {
  std::vector<Subnet> out;
  for (const std::string& nd : meshNetdevs(f)) {
    const NetIf* i = f.netif(nd);
    if (i == nullptr) continue;
    for (const Ipv4Prefix& a : i->ipv4) {
      if (a.prefixLen >= 32) continue;
      Ipv4Prefix net{a.addr & prefixMask(a.prefixLen), a.prefixLen};
      auto it = std::find_if(out.begin(), out.end(), [&](const Subnet& s) { return s.net == net; });
      if (it == out.end()) it = out.insert(out.end(), Subnet{net, {}});
      if (std::find(it->netdevs.begin(), it->netdevs.end(), nd) == it->netdevs.end()) it->netdevs.push_back(nd);
    }
  }
  return out;
}

// Peers this node is cabled to, as far as one node can tell: a cable's ends (its functions,
// by the plugin's rule: PCI siblings, a shared subnet, Spark's and the fabric's names) reach
// one peer, and so do the lab's parallel cables.
int cabledPeers(const DoctorFacts& f, const std::vector<Subnet>& subnets) {
  std::vector<std::string> nodes;
  for (const Subnet& s : subnets) {
    for (const std::string& n : s.netdevs) {
      if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    }
  }
  std::vector<CableEnd> ends;
  for (const std::string& n : nodes) {
    CableEnd e;
    e.netdev = n;
    auto pci = f.netdevPci.find(n);
    if (pci != f.netdevPci.end()) e.pciPath = pci->second;
    if (const NetIf* i = f.netif(n)) {
      for (const Ipv4Prefix& a : i->ipv4) {
        if (a.prefixLen < 32) e.addrs.push_back(a);
      }
    }
    ends.push_back(e);
  }
  std::vector<size_t> parent(nodes.size());
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](size_t i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
  };
  for (const std::vector<int>& cable : groupCableEnds(ends)) {
    for (int i : cable) parent[find(static_cast<size_t>(i))] = find(static_cast<size_t>(cable[0]));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (parallelLinkKey(nodes[i]) == parallelLinkKey(nodes[j])) parent[find(i)] = find(j);
    }
  }
  std::set<size_t> roots;
  for (size_t i = 0; i < nodes.size(); ++i) roots.insert(find(i));
  return static_cast<int>(roots.size());
}

// A subnet on a switch, as far as one node can tell: the kernel's ARP table holds more
// neighbours in it than this node has ports in it. A cable reaches one peer, whose functions
// in the subnet pair up with ours (an address each), so more neighbours than our ports means
// more than one node answers on that wire: a switch (NVIDIA's layout for more than three DGX
// Sparks, two subnets shared by every node). Only as good as the ARP table, which is empty
// until traffic has flowed on the port.
struct SwitchedSubnet {
  Ipv4Prefix net;
  std::vector<std::string> netdevs;
  size_t neighbours = 0;
};

std::vector<SwitchedSubnet> switchedSubnets(const DoctorFacts& f, const std::vector<Subnet>& subnets) {
  std::vector<SwitchedSubnet> out;
  for (const Subnet& s : subnets) {
    std::set<uint32_t> seen;
    for (const std::string& nd : s.netdevs) {
      auto it = f.neighbours.find(nd);
      if (it == f.neighbours.end()) continue;
      for (uint32_t a : it->second) {
        if (sameSubnet(a, s.net.addr, s.net.prefixLen)) seen.insert(a);
      }
    }
    if (seen.size() > s.netdevs.size()) out.push_back({s.net, s.netdevs, seen.size()});
  }
  return out;
}

std::string describeSwitched(const std::vector<SwitchedSubnet>& switched) {
  std::vector<std::string> parts;
  for (const SwitchedSubnet& s : switched) {
    parts.push_back(strf("%s on %s (%zu neighbours in the ARP table)", formatPrefix(s.net).c_str(),
                         joined(s.netdevs, "+").c_str(), s.neighbours));
  }
  return "on a switch: " + joined(parts, ", ");
}

bool onSwitch(const std::vector<SwitchedSubnet>& switched, const std::string& netdev) {
  for (const SwitchedSubnet& s : switched) {
    if (std::find(s.netdevs.begin(), s.netdevs.end(), netdev) != s.netdevs.end()) return true;
  }
  return false;
}

CheckResult checkPorts(const DoctorFacts& f) {
  std::string problems = f.sysfsProblems.empty() ? "" : "; unreadable: " + joined(f.sysfsProblems, "; ");
  if (f.ports.empty()) {
    std::string why = !f.verbsError.empty() ? "rdma-core cannot be loaded"
                      : !f.portsNote.empty() ? f.portsNote
                                             : "no RDMA device (/sys/class/infiniband is empty and verbs lists none)";
    return {"ports", Verdict::Fail, why + problems,
            "load the NIC's RDMA driver (mlx5_ib for ConnectX) and ib_uverbs; `ibv_devinfo` must list the ports"};
  }
  std::vector<std::string> active, down, other;
  for (const PortFact& p : f.ports) {
    std::string label = p.label() + (p.netdev.empty() ? "" : " (" + p.netdev + ")");
    if (!p.ethernet()) {
      other.push_back(label + " " + (p.linkLayer.empty() ? "link layer unknown" : p.linkLayer));
    } else if (!p.active()) {
      down.push_back(label + " " + p.state);
    } else if (p.netdev.empty()) {
      other.push_back(label + " ACTIVE but without a netdev");
    } else {
      active.push_back(label);
    }
  }
  std::string found = std::to_string(active.size()) + " ACTIVE RoCE port(s) (" + f.portsSource + "): " + joined(active);
  if (!down.empty()) found += "; not ACTIVE: " + joined(down);
  if (!other.empty()) found += "; not usable: " + joined(other);
  found += problems;
  if (active.empty()) {
    return {"ports", Verdict::Fail, found,
            "cable the ports and bring their netdevs up (`ip link set DEV up`); nccl-mesh drives RoCE (Ethernet) ports"};
  }
  if (!down.empty() || !problems.empty()) {
    return {"ports", Verdict::Warn, found,
            "a port that is not ACTIVE is skipped: check its cable and the peer, then `ip link set DEV up`"};
  }
  return {"ports", Verdict::Ok, found, ""};
}

CheckResult checkMtu(const DoctorFacts& f) {
  std::vector<std::string> seen, low, missing;
  std::set<int> mtus;
  for (const PortFact* p : meshPorts(f)) {
    const NetIf* i = f.netif(p->netdev);
    if (i == nullptr) {
      missing.push_back(p->netdev);
      continue;
    }
    int roce = p->activeMtu > 0 ? p->activeMtu : roceMtuForNetdev(i->mtu);
    // RoCE MTUs, not the netdevs': 9000 and 9216 both give 4096, and what breaks a cable is
    // its two ends disagreeing, which one node cannot see.
    mtus.insert(roce);
    std::string text = strf("%s %d (RoCE %d)", p->netdev.c_str(), i->mtu, roce);
    seen.push_back(text);
    if (roce < 4096) low.push_back(p->netdev);
  }
  if (seen.empty() && missing.empty()) return {"mtu", Verdict::Ok, "no ACTIVE RoCE port to check", ""};
  std::string found = "MTU " + joined(seen);
  if (!missing.empty()) found += "; netdev not in this namespace: " + joined(missing);
  const char* fix = "`ip link set dev DEV mtu 9000` on both ends of every cable, and in netplan or NetworkManager "
                    "so that it survives a reboot";
  if (!low.empty()) {
    return {"mtu", Verdict::Warn, found + ": RoCE MTU below 4096 on " + joined(low) +
            " (the plugin uses the smaller MTU of the two ends; NCCL's IB transport between mismatched ends "
            "ends in retry-exceeded errors)", fix};
  }
  if (!missing.empty()) {
    return {"mtu", Verdict::Warn, found + ": their MTU cannot be read here",
            "run the doctor in the host's network namespace (`docker run --network host`), where NCCL's "
            "ranks see the mesh ports"};
  }
  if (mtus.size() > 1) return {"mtu", Verdict::Warn, found + ": the ports' RoCE MTUs differ", fix};
  return {"mtu", Verdict::Ok, found, ""};
}

bool gidIsIpv4(const GidEntry& g, uint32_t* addr) { return g.rocev2 && gidToIpv4(g.gid, addr); }
bool gidIsLinkLocal(const GidEntry& g) { return g.gid[0] == 0xfe && (g.gid[1] & 0xc0) == 0x80; }

CheckResult checkRoceGids(const DoctorFacts& f) {
  std::vector<std::string> good, missing, noAddress;
  for (const PortFact* p : meshPorts(f)) {
    const NetIf* i = f.netif(p->netdev);
    if (i == nullptr || i->ipv4.empty()) {
      noAddress.push_back(p->label() + " (" + p->netdev + ")");
      continue;
    }
    for (const Ipv4Prefix& a : i->ipv4) {
      auto g = std::find_if(p->gids.begin(), p->gids.end(), [&](const GidEntry& e) {
        uint32_t v = 0;
        return gidIsIpv4(e, &v) && v == a.addr;
      });
      std::string where = p->netdev + " " + formatIpv4(a.addr);
      if (g == p->gids.end()) {
        missing.push_back(where + " on " + p->label());
      } else {
        good.push_back(where + " = GID " + std::to_string(g->index));
      }
    }
  }
  if (!missing.empty()) {
    return {"roce-gids", Verdict::Fail, "no RoCEv2 GID for " + joined(missing),
            "the RDMA device is not bound to that netdev, or the GID table is stale: check `rdma link` and "
            "`ibv_devinfo -v`, then delete and re-add the address (ip addr del/add)"};
  }
  if (!noAddress.empty()) {
    return {"roce-gids", Verdict::Warn, "no IPv4 address on " + joined(noAddress) + " (the plugin skips them)" +
            (good.empty() ? "" : "; " + joined(good)),
            "give each cable's ends addresses in one subnet of their own (ip addr add A.B.C.D/24 dev DEV)"};
  }
  if (good.empty()) return {"roce-gids", Verdict::Ok, "no ACTIVE RoCE port to check", ""};
  return {"roce-gids", Verdict::Ok, "every IPv4 address has its RoCEv2 GID: " + joined(good), ""};
}

CheckResult checkGidIndex(const DoctorFacts& f) {
  int ipv6 = 0;
  for (const PortFact* p : meshPorts(f)) {
    for (const GidEntry& g : p->gids) {
      uint32_t v = 0;
      if (!gidToIpv4(g.gid, &v) && !gidIsLinkLocal(g)) ++ipv6;
    }
    const NetIf* i = f.netif(p->netdev);
    if (i != nullptr && ipv6 == 0) ipv6 += i->ipv6Global;
  }
  int pinned = f.config.gidIndex;
  if (pinned < 0) {
    return {"gid-index", Verdict::Ok, strf("NCCL_MESH_GID_INDEX not pinned: the plugin uses the RoCEv2 GID of each "
                                           "address (global IPv6 GIDs: %d, harmless)", ipv6), ""};
  }
  std::vector<std::string> wrong;
  for (const PortFact* p : meshPorts(f)) {
    auto g = std::find_if(p->gids.begin(), p->gids.end(), [&](const GidEntry& e) { return e.index == pinned; });
    uint32_t v = 0;
    if (g == p->gids.end() || !gidIsIpv4(*g, &v)) wrong.push_back(p->label() + " (" + p->netdev + ")");
  }
  std::string fix = "unset NCCL_MESH_GID_INDEX: the plugin finds each address's RoCEv2 GID itself";
  if (!wrong.empty()) {
    return {"gid-index", Verdict::Fail, strf("NCCL_MESH_GID_INDEX=%d is not a RoCEv2 IPv4 GID on ", pinned) + joined(wrong), fix};
  }
  if (ipv6 > 0) {
    return {"gid-index", Verdict::Warn, strf("NCCL_MESH_GID_INDEX=%d with %d global IPv6 GID(s) or address(es) on the "
                                             "ports: GID indexes move when IPv6 addresses come and go", pinned, ipv6),
            fix + " (or disable IPv6 on the mesh netdevs)"};
  }
  return {"gid-index", Verdict::Ok, strf("NCCL_MESH_GID_INDEX=%d is the RoCEv2 IPv4 GID on every port", pinned), ""};
}

// The value the kernel applies for `key` on `netdev`: the larger of all's and the netdev's.
int effectiveSysctl(const DoctorFacts& f, const std::string& netdev, const std::string& key, bool* known) {
  auto a = f.sysctl.find("all/" + key);
  auto i = f.sysctl.find(netdev + "/" + key);
  *known = a != f.sysctl.end() && i != f.sysctl.end();
  return std::max(a == f.sysctl.end() ? 0 : a->second, i == f.sysctl.end() ? 0 : i->second);
}

std::string sysctlProblems(const DoctorFacts& f) {
  return f.sysctlProblems.empty() ? "" : "; unreadable: " + joined(f.sysctlProblems, "; ");
}

std::vector<std::string> sharedNetdevs(const std::vector<Subnet>& subnets, std::vector<std::string>* names) {
  std::vector<std::string> out;
  for (const Subnet& s : subnets) {
    if (s.netdevs.size() < 2) continue;
    names->push_back(joined(s.netdevs, "+") + " in " + formatPrefix(s.net));
    for (const std::string& n : s.netdevs) out.push_back(n);
  }
  return out;
}

CheckResult checkArp(const DoctorFacts& f) {
  std::vector<std::string> groups;
  std::vector<std::string> shared = sharedNetdevs(meshSubnets(f), &groups);
  if (shared.empty()) return {"arp", Verdict::Ok, "no two ports share a subnet: no ARP settings needed", ""};
  std::vector<std::string> bad, unknown;
  for (const std::string& n : shared) {
    bool k1 = false, k2 = false;
    int ignore = effectiveSysctl(f, n, "arp_ignore", &k1);
    int announce = effectiveSysctl(f, n, "arp_announce", &k2);
    if (!k1 || !k2) unknown.push_back(n);
    if (ignore < 1 || announce < 2) bad.push_back(strf("%s arp_ignore=%d arp_announce=%d", n.c_str(), ignore, announce));
  }
  std::string found = "ports share a subnet (" + joined(groups, "; ") + ")";
  const char* fix = "sysctl -w net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2, and the same in "
                    "/etc/sysctl.d/ so that it survives a reboot";
  if (!bad.empty()) {
    return {"arp", Verdict::Fail, found + ": " + joined(bad) + " (the wrong function may answer ARP for the "
            "other's address, and its RoCE frames then go to a port that does not own the GID)" + sysctlProblems(f), fix};
  }
  if (!unknown.empty()) return {"arp", Verdict::Warn, found + sysctlProblems(f), fix};
  return {"arp", Verdict::Ok, found + ": arp_ignore >= 1 and arp_announce = 2 on each", ""};
}

CheckResult checkRpFilter(const DoctorFacts& f) {
  std::vector<std::string> groups;
  std::vector<std::string> shared = sharedNetdevs(meshSubnets(f), &groups);
  std::vector<std::string> strictShared, values;
  bool allKnown = true;
  for (const std::string& n : meshNetdevs(f)) {
    bool known = false;
    int v = effectiveSysctl(f, n, "rp_filter", &known);
    allKnown = allKnown && known;
    values.push_back(n + "=" + std::to_string(v));
    if (v == 1 && std::find(shared.begin(), shared.end(), n) != shared.end()) strictShared.push_back(n);
  }
  std::string found = "rp_filter (the larger of all and the port's) " + (values.empty() ? "-" : joined(values));
  if (!strictShared.empty()) {
    return {"rp-filter", Verdict::Fail, found + ": strict on " + joined(strictShared) + ", which share a subnet with "
            "another port: packets arriving on the other function are dropped" + sysctlProblems(f),
            "sysctl -w net.ipv4.conf.all.rp_filter=2 (loose), and in /etc/sysctl.d/"};
  }
  if (!allKnown) return {"rp-filter", Verdict::Warn, found + sysctlProblems(f), "check that /proc/sys is mounted"};
  return {"rp-filter", Verdict::Ok, found + (shared.empty() ? " (strict is harmless with one subnet per port)" : ""), ""};
}

CheckResult checkSocketIfname(const DoctorFacts& f, int peers, const std::vector<SwitchedSubnet>& switched) {
  const SettingSource* s = f.setting("NCCL_SOCKET_IFNAME");
  const char* fix = "export NCCL_SOCKET_IFNAME=<the management interface> (and GLOO_SOCKET_IFNAME for PyTorch's gloo)";
  if (s == nullptr) {
    return {"socket-ifname", Verdict::Warn, "NCCL_SOCKET_IFNAME unset: NCCL picks its bootstrap interface itself and may "
            "pick a mesh port, which reaches only the peer on its cable", fix};
  }
  HcaFilter filter = parseHcaFilter(s->value);
  std::vector<std::string> matched, mesh;
  std::vector<std::string> netdevs = meshNetdevs(f);
  for (const NetIf& i : f.netifs) {
    if (!hcaMatches(filter, i.name, 1)) continue;
    matched.push_back(i.name);
    if (std::find(netdevs.begin(), netdevs.end(), i.name) != netdevs.end()) mesh.push_back(i.name);
  }
  std::string found = "NCCL_SOCKET_IFNAME=" + s->value + " (" + s->source + ") matches " +
                      (matched.empty() ? std::string("no interface") : joined(matched));
  if (matched.empty() && !f.netifs.empty()) {
    return {"socket-ifname", Verdict::Fail, found + ": NCCL's bootstrap fails (no socket interface found)", fix};
  }
  bool allSwitched = !mesh.empty();
  for (const std::string& m : mesh) allSwitched = allSwitched && onSwitch(switched, m);
  if (allSwitched) {
    return {"socket-ifname", Verdict::Ok, found + ": a mesh port, " + describeSwitched(switched) +
            ": NCCL's bootstrap reaches every node on the switch", ""};
  }
  if (!mesh.empty()) {
    return {"socket-ifname", peers >= 2 ? Verdict::Fail : Verdict::Warn,
            found + ": " + joined(mesh) + " is a mesh port; NCCL's bootstrap then reaches only the peer on that cable",
            fix};
  }
  return {"socket-ifname", Verdict::Ok, found, ""};
}

CheckResult checkRelay(const DoctorFacts& f, int peers, size_t subnets, const std::vector<SwitchedSubnet>& switched) {
  const Config& c = f.config;
  std::string setting = strf("NCCL_MESH_RELAY=%s", c.relay == RelayMode::Auto ? "auto" : "off");
  if (f.nodes > 0) setting += strf(", a job of %d node(s)", f.nodes);
  std::string found = strf("cabled to %d peer(s) over %zu subnet(s); ", peers, subnets) + setting;
  const char* fix = "export NCCL_MESH_RELAY=auto on every node (pairs without a cable then go through a neighbour)";
  if (!switched.empty() && c.staticRoutes.empty()) {
    // One node cannot count the nodes behind a switch, only see that there are several; its
    // ports there are not cables to one peer each, so no peer count is given.
    return {"relay", Verdict::Ok, strf("ports in %zu subnet(s); ", subnets) + setting + "; " + describeSwitched(switched) +
            ": every node on the switch is reached directly, no relay needed for it (NCCL_MESH_RELAY=auto covers "
            "nodes it does not reach)", ""};
  }
  if (c.relay == RelayMode::Auto) {
    int ringHops = f.nodes / 2 - 1;  // a ring of N: the farthest pair is N/2 cables apart
    if (f.nodes > 0 && peers < f.nodes - 1 && c.relayMaxHops < ringHops) {
      // The setting takes 1..kRouteMaxHopsLimit: a suggestion past it would be refused (a
      // WARN, and the default 2) by the plugin it is meant for.
      int line = f.nodes - 2;
      std::string fix = strf("export NCCL_MESH_RELAY_MAX_HOPS=%d on every node", std::min(line, kRouteMaxHopsLimit));
      if (line > kRouteMaxHopsLimit) {
        fix += strf(" (its largest value: a line of %d nodes needs %d relays, and the route plan covers at most 16 "
                    "nodes; see the README's Limits)", f.nodes, line);
      }
      return {"relay", Verdict::Warn, found + strf(", NCCL_MESH_RELAY_MAX_HOPS=%d: a ring of %d nodes needs %d (a line %d)",
                                                   c.relayMaxHops, f.nodes, ringHops, line),
              fix};
    }
    return {"relay", Verdict::Ok, found + " (used only for pairs without a cable)", ""};
  }
  if (!c.staticRoutes.empty()) {
    return {"relay", Verdict::Warn, found + ": NCCL_MESH_ROUTES is set but the relay is off, so it is ignored", fix};
  }
  if (peers == 0) return {"relay", Verdict::Ok, found + " (no cable found: see ports)", ""};
  if (f.nodes > 0) {
    if (peers >= f.nodes - 1) return {"relay", Verdict::Ok, found + ": a full mesh, no relay needed", ""};
    return {"relay", Verdict::Fail, found + strf(": %d node(s) have no cable to this one (a ring or a line): their "
                                                 "connections fail with the routing error (ports on a switch show "
                                                 "several nodes in the ARP table once traffic has flowed: ping the "
                                                 "others over them and run the doctor again)", f.nodes - 1 - peers), fix};
  }
  if (peers >= 2) {
    return {"relay", Verdict::Warn, found + ": one node cannot tell a full mesh of " + std::to_string(peers + 1) +
            " from a ring or line of more nodes, which needs the relay",
            "run the doctor with --nodes N (the job's node count), or export NCCL_MESH_RELAY=auto on every node "
            "(harmless on a full mesh)"};
  }
  return {"relay", Verdict::Ok, found + " (a pair; a node at the end of a longer line needs NCCL_MESH_RELAY=auto: "
          "--nodes N checks it)", ""};
}

}  // namespace

std::vector<CheckResult> networkChecks(const DoctorFacts& f) {
  std::vector<Subnet> subnets = meshSubnets(f);
  int peers = cabledPeers(f, subnets);
  std::vector<SwitchedSubnet> switched = switchedSubnets(f, subnets);
  return {checkPorts(f),     checkMtu(f),      checkRoceGids(f),
          checkGidIndex(f),  checkArp(f),      checkRpFilter(f),
          checkSocketIfname(f, peers, switched), checkRelay(f, peers, subnets.size(), switched)};
}

std::vector<CheckResult> runChecks(const DoctorFacts& facts) {
  std::vector<CheckResult> out = settingsChecks(facts);
  for (CheckResult& r : networkChecks(facts)) out.push_back(std::move(r));
  return out;
}

}  // namespace mesh
