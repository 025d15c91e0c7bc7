// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info's output: ports, cables, devices, routes and the relay's table as text or
// JSON, and the --subnets line and --ring-order answer.
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "info.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/text.h"
#include "mesh/platform/version.h"
#include "mesh/plugin/net_devices.h"
#include "mesh/rdma/qp.h"
#include "mesh/routing/ring_order.h"

namespace info {

// --- formatting ------------------------------------------------------------------------------

std::string gidText(const uint8_t gid[16]) {
  char buf[INET6_ADDRSTRLEN] = {};
  return inet_ntop(AF_INET6, gid, buf, sizeof(buf)) != nullptr ? buf : "?";
}

// As ibv_devinfo prints a node GUID: four groups of four hex digits.
std::string guidText(uint64_t guid) {
  char buf[24];
  snprintf(buf, sizeof(buf), "%04x:%04x:%04x:%04x", static_cast<unsigned>(guid >> 48) & 0xffff,
           static_cast<unsigned>(guid >> 32) & 0xffff, static_cast<unsigned>(guid >> 16) & 0xffff,
           static_cast<unsigned>(guid) & 0xffff);
  return buf;
}

std::string speedText(int mbps) {
  if (mbps <= 0) return "unknown";
  if (mbps % 1000 == 0) return std::to_string(mbps / 1000) + " Gbps";
  return std::to_string(mbps) + " Mbps";
}

std::string ptrSupportText(int ptr) {
  std::string out;
  if (ptr & mesh::kPtrHost) out += "HOST";
  if (ptr & mesh::kPtrCuda) out += out.empty() ? "CUDA" : "|CUDA";
  if (ptr & mesh::kPtrDmabuf) out += out.empty() ? "DMABUF" : "|DMABUF";
  return out.empty() ? "none" : out;
}

std::string portsText(const mesh::NetDevice& dev, const mesh::Discovery& d) {
  std::string out;
  for (int p : dev.ports) {
    if (!out.empty()) out += ",";
    out += d.ports[p].device + ":" + std::to_string(d.ports[p].port);
  }
  return out;
}

const char* yesNo(bool b) { return b ? "yes" : "no"; }

// What a new QP on the port offers for ECE, which NCCL IB and the plugin negotiate per
// connection: "0x15b3:0x…" on ConnectX, "no" where the provider has none (rxe), "?" when no
// QP could be made to ask.
std::string portEceText(const mesh::Discovery& d, const mesh::MeshPort& p) {
  mesh::Ece ece;
  switch (mesh::probeEce(d.devices.at(static_cast<size_t>(p.deviceIndex)).get(), p.port, &ece)) {
    case mesh::EceResult::Ok: return mesh::eceText(ece);
    case mesh::EceResult::Unsupported: return "no";
    default: return "?";
  }
}


// --- text output -----------------------------------------------------------------------------

void printPorts(const mesh::Discovery& d) {
  printf("RDMA ports usable by the mesh: %zu\n", d.ports.size());
  if (d.ports.empty()) return;
  // GDR and DMA-BUF are the NIC's side (a peermem module, a DMA-BUF probe); whether the GPUs
  // allow them is printed with the NCCL devices.
  Table t({"PORT", "NETDEV", "STATE", "ADDRESS", "GID IDX", "GID", "MTU", "SPEED", "NIC GDR",
           "NIC DMA-BUF", "ECE", "GUID", "PCI PATH"});
  for (const mesh::MeshPort& p : d.ports) {
    std::string ece = portEceText(d, p);
    for (const mesh::PortAddress& a : p.addrs) {
      t.add({p.device + ":" + std::to_string(p.port), p.netdev, "ACTIVE",
             mesh::formatPrefix(a.ip), std::to_string(a.gidIndex), gidText(a.gid),
             std::to_string(p.mtuBytes), speedText(p.speedMbps), yesNo(p.gdr), yesNo(p.dmabuf), ece,
             guidText(p.guid), p.pciPath.empty() ? "-" : p.pciPath});
    }
  }
  t.print();
}

// The cables: ports that drive one wire (both PCIe functions of a DGX Spark port, or ports
// in one subnet), and the speed one peer gets through them (net_devices.h).
std::string cableFunctionsText(const std::vector<int>& cable, const mesh::Discovery& d) {
  std::string out;
  for (int i : cable) out += (out.empty() ? "" : " + ") + d.ports[i].label();
  return out;
}

void printCables(const mesh::Discovery& d) {
  auto cables = mesh::cableGroups(d.ports);
  if (cables.empty()) return;
  printf("\nCables (a cable end's PCIe functions together): %zu\n", cables.size());
  Table t({"CABLE", "FUNCTIONS", "SUBNETS", "SPEED"});
  for (size_t c = 0; c < cables.size(); ++c) {
    std::vector<std::string> subnets;
    for (int i : cables[c]) {
      for (const mesh::PortAddress& a : d.ports[i].addrs) {
        std::string net = mesh::formatPrefix(mesh::Ipv4Prefix{a.ip.addr & mesh::prefixMask(a.ip.prefixLen), a.ip.prefixLen});
        if (std::find(subnets.begin(), subnets.end(), net) == subnets.end()) subnets.push_back(net);
      }
    }
    std::string subnetText;
    for (const std::string& n : subnets) subnetText += (subnetText.empty() ? "" : ", ") + n;
    t.add({std::to_string(c), cableFunctionsText(cables[c], d), subnetText,
           speedText(mesh::cableSpeedMbps(d.ports, cables[c]))});
  }
  t.print();
}

void printDevices(const mesh::Plugin& plugin) {
  const char* mode = plugin.config().devices == mesh::DeviceMode::Port ? "port" : "node";
  printf("\nNCCL devices (NCCL_MESH_DEVICES=%s): %d\n", mode, plugin.deviceCount());
  if (plugin.deviceCount() == 0) return;
  Table t({"DEV", "NAME", "PORTS", "SPEED", "PTR SUPPORT", "MAX RECVS", "MAX COMMS"});
  for (int i = 0; i < plugin.deviceCount(); ++i) {
    const mesh::NetDevice* dev = nullptr;
    if (plugin.device(i, &dev) != ncclSuccess) continue;
    t.add({std::to_string(i), dev->name, portsText(*dev, plugin.discovery()),
           speedText(dev->speedMbps), ptrSupportText(dev->ptrSupport),
           std::to_string(dev->maxRecvs), std::to_string(dev->maxComms)});
  }
  t.print();
  const mesh::GpuCaps& gpus = plugin.gpus();
  printf("GPUs (GPUDirect as the CUDA driver answers): %s\n", gpus.describe().c_str());
  if (gpus.known() && !gpus.anyGdr() && !gpus.anyDmabuf()) {
    printf("  no GPU supports GPUDirect RDMA or DMA-BUF: host memory only; NCCL stages through host buffers\n"
           "  (expected on a DGX Spark's GB10, whose GPU shares the host's memory)\n");
  }
}

std::string routeText(const mesh::Route& r, const mesh::Discovery& d) {
  return mesh::formatIpv4(r.peerAddr) + " -> " + d.ports[r.localNic].label() + " via " +
         mesh::formatPrefix(r.local) + " (GID index " + std::to_string(r.gidIndex) + ")";
}

std::string relayWayText(const mesh::NextHop& h) {
  return "via " + mesh::formatIpv4(h.route.nextHopAddr) + " (" + mesh::routeSourceName(h.route.source) +
         ", " + std::to_string(h.route.hops) + " relay hop" + (h.route.hops == 1 ? "" : "s") +
         ") to " + mesh::formatIpv4(h.peerAddr);
}

void printRoutes(const std::vector<PeerRoutes>& routes, const mesh::Discovery& d) {
  if (routes.empty()) return;
  printf("\nRoutes to peers:\n");
  for (const PeerRoutes& pr : routes) {
    if (!pr.result.ok()) {
      printf("  peer %s: NO ROUTE: %s\n", pr.spec->text.c_str(), pr.result.error.c_str());
      for (const mesh::NextHop& h : pr.relay.hops) {
        printf("    with NCCL_MESH_RELAY=auto a relay goes %s\n", relayWayText(h).c_str());
      }
      continue;
    }
    size_t n = pr.result.routes.size();
    printf("  peer %s: %zu link%s\n", pr.spec->text.c_str(), n, n == 1 ? "" : "s");
    for (const mesh::Route& r : pr.result.routes) printf("    %s\n", routeText(r, d).c_str());
  }
}

void printRelayTable(const RelayView& relay) {
  printf("\n%s\n", relay.title.c_str());
  for (const std::string& line : relay.lines) printf("  %s\n", line.c_str());
  for (const std::string& problem : relay.problems) printf("  %s\n", problem.c_str());
  if (relay.live) {
    printf("Neighbours heard: %zu\n", relay.neighbours.size());
    for (const std::string& n : relay.neighbours) printf("  %s\n", n.c_str());
    printf("Route plan (the same table digest on two nodes = the same table): %s\n", relay.planState.c_str());
    for (const std::string& line : relay.plan) printf("  %s\n", line.c_str());
  }
}

// One line saying why no port is usable, for --json (the text output has printNoPortHint).
std::string noPortReason(const mesh::Plugin& plugin) {
  if (plugin.verbs().libHandle == nullptr) {
    return "libibverbs (" + plugin.config().ibverbsLib +
           ") could not be loaded: rdma-core is not installed, or NCCL_MESH_IBVERBS_LIB is wrong";
  }
  if (!plugin.discovery().emptyReason.empty()) return plugin.discovery().emptyReason;
  std::string reason = "no ACTIVE RoCE (Ethernet) RDMA port with an IPv4 address on its netdev";
  if (!plugin.config().hca.empty()) reason += " passed NCCL_MESH_HCA='" + plugin.config().hca + "'";
  return reason + "; run with -v to see why each port was skipped";
}

void printNoPortHint(const mesh::Plugin& plugin) {
  if (plugin.verbs().libHandle == nullptr) {
    printf("\nhint: no usable RDMA port: libibverbs (%s) could not be loaded. Install\n"
           "      rdma-core (Debian/Ubuntu: apt-get install libibverbs1 ibverbs-providers;\n"
           "      RHEL: dnf install rdma-core libibverbs) or set NCCL_MESH_IBVERBS_LIB.\n",
           plugin.config().ibverbsLib.c_str());
    return;
  }
  printf("\nhint: no usable RDMA port. The mesh needs an ACTIVE RoCE (Ethernet) RDMA port\n"
         "      whose netdev has an IPv4 address. Check `ibv_devinfo` (no device at all:\n"
         "      load the NIC driver, or for Soft-RoCE `rdma link add rxe0 type rxe netdev\n"
         "      eth0`), `rdma link`, `ip addr` and NCCL_MESH_HCA. Run with -v to see why\n"
         "      each port was skipped.\n");
}

// --- JSON output -----------------------------------------------------------------------------

using mesh::jsonString;

std::string jsonPort(const mesh::MeshPort& p, const mesh::Discovery& d) {
  std::string addrs;
  for (const mesh::PortAddress& a : p.addrs) {
    if (!addrs.empty()) addrs += ", ";
    addrs += "{\"address\": " + jsonString(mesh::formatPrefix(a.ip)) +
             ", \"gid_index\": " + std::to_string(a.gidIndex) +
             ", \"gid\": " + jsonString(gidText(a.gid)) + "}";
  }
  return "{\"device\": " + jsonString(p.device) + ", \"port\": " + std::to_string(p.port) +
         ", \"label\": " + jsonString(p.label()) + ", \"netdev\": " + jsonString(p.netdev) +
         ", \"state\": \"ACTIVE\", \"addresses\": [" + addrs + "]" +
         ", \"mtu\": " + std::to_string(p.mtuBytes) +
         ", \"speed_mbps\": " + std::to_string(p.speedMbps) +
         ", \"pci_path\": " + jsonString(p.pciPath) + ", \"guid\": " + jsonString(guidText(p.guid)) +
         ", \"gdr\": " + (p.gdr ? "true" : "false") + ", \"dmabuf\": " +
         (p.dmabuf ? "true" : "false") + ", \"ece\": " + jsonString(portEceText(d, p)) + "}";
}

std::string jsonDevice(const mesh::NetDevice& dev, const mesh::Discovery& d) {
  return "{\"name\": " + jsonString(dev.name) + ", \"ports\": " +
         jsonString(portsText(dev, d)) + ", \"speed_mbps\": " + std::to_string(dev.speedMbps) +
         ", \"ptr_support\": " + std::to_string(dev.ptrSupport) +
         ", \"max_recvs\": " + std::to_string(dev.maxRecvs) + "}";
}

std::string jsonPeer(const PeerRoutes& pr, const mesh::Discovery& d) {
  std::string links;
  for (const mesh::Route& r : pr.result.routes) {
    if (!links.empty()) links += ", ";
    links += "{\"peer_address\": " + jsonString(mesh::formatIpv4(r.peerAddr)) +
             ", \"port\": " + jsonString(d.ports[r.localNic].label()) +
             ", \"local\": " + jsonString(mesh::formatPrefix(r.local)) +
             ", \"gid_index\": " + std::to_string(r.gidIndex) + "}";
  }
  std::string relay;
  for (const mesh::NextHop& h : pr.relay.hops) relay += (relay.empty() ? "" : ", ") + jsonString(relayWayText(h));
  return "{\"peer\": " + jsonString(pr.spec->text) + ", \"ok\": " +
         (pr.result.ok() ? "true" : "false") + ", \"links\": [" + links + "]" +
         ", \"error\": " + jsonString(pr.result.error) + ", \"relay_ways\": [" + relay + "]}";
}

template <typename T, typename Fn>
std::string jsonList(const std::vector<T>& items, Fn&& fn) {
  std::string out;
  for (const T& item : items) out += (out.empty() ? "\n    " : ",\n    ") + fn(item);
  return "[" + out + (items.empty() ? "]" : "\n  ]");
}

void printJson(const mesh::Plugin& plugin, const std::vector<PeerRoutes>& routes, const RelayView* relay) {
  const mesh::Discovery& d = plugin.discovery();
  std::vector<mesh::NetDevice> devices;
  for (int i = 0; i < plugin.deviceCount(); ++i) {
    const mesh::NetDevice* dev = nullptr;
    if (plugin.device(i, &dev) == ncclSuccess) devices.push_back(*dev);
  }
  printf("{\n  \"version\": %s,\n", jsonString(mesh::versionText()).c_str());
  printf("  \"verbs_loaded\": %s,\n", plugin.verbs().libHandle != nullptr ? "true" : "false");
  if (d.ports.empty()) printf("  \"reason\": %s,\n", jsonString(noPortReason(plugin)).c_str());
  printf("  \"ports\": %s,\n", jsonList(d.ports, [&](const mesh::MeshPort& p) { return jsonPort(p, d); }).c_str());
  printf("  \"cables\": %s,\n", jsonList(mesh::cableGroups(d.ports), [&](const std::vector<int>& c) {
           return "{\"functions\": " + jsonString(cableFunctionsText(c, d)) +
                  ", \"speed_mbps\": " + std::to_string(mesh::cableSpeedMbps(d.ports, c)) + "}";
         }).c_str());
  printf("  \"devices\": %s,\n",
         jsonList(devices, [&](const mesh::NetDevice& n) { return jsonDevice(n, d); }).c_str());
  if (relay != nullptr) {
    printf("  \"relay_routes\": %s,\n", jsonList(relay->lines, jsonString).c_str());
    printf("  \"relay_problems\": %s,\n", jsonList(relay->problems, jsonString).c_str());
    if (relay->live) {
      printf("  \"relay_neighbours\": %s,\n", jsonList(relay->neighbours, jsonString).c_str());
      printf("  \"relay_plan_state\": %s,\n", jsonString(relay->planState).c_str());
      printf("  \"relay_plan\": %s,\n", jsonList(relay->plan, jsonString).c_str());
    }
  }
  printf("  \"peers\": %s\n}\n",
         jsonList(routes, [&](const PeerRoutes& pr) { return jsonPeer(pr, d); }).c_str());
}

// --- --subnets and --ring-order ---------------------------------------------------------------

int printSubnets() {
  mesh::Plugin& plugin = mesh::Plugin::instance();
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) snprintf(host, sizeof(host), "unknown-host");
  std::vector<mesh::Ipv4Prefix> subnets;
  if (plugin.init(nullptr) == ncclSuccess) {
    for (const mesh::MeshPort& p : plugin.discovery().ports) {
      for (const mesh::PortAddress& a : p.addrs) {
        // A /32 is nobody's cable: no other node can share it.
        mesh::Ipv4Prefix net{a.ip.addr & mesh::prefixMask(a.ip.prefixLen), a.ip.prefixLen};
        if (net.prefixLen < 32 && std::find(subnets.begin(), subnets.end(), net) == subnets.end()) {
          subnets.push_back(net);
        }
      }
    }
  }
  // The name alone when nothing is usable, so that --ring-order names this node's line.
  printf("%s\n", mesh::subnetsLine(host, subnets).c_str());
  if (!subnets.empty()) return kExitOk;
  fprintf(stderr, "nccl-mesh-info --subnets: no usable mesh port with a subnet on %s; run "
                  "`nccl-mesh-info -v` there to see why\n", host);
  return kExitNoPort;
}

int printRingOrder(const std::string& file) {
  std::string text;
  if (file == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    // readTextFile, not an ifstream: reading a directory throws from the stream's buffer.
    std::string why;
    if (!mesh::readTextFile(file, &text, &why, 16u << 20)) {
      size_t cause = why.rfind(": ");  // readTextFile says "cannot read PATH: <reason>"
      fprintf(stderr, "nccl-mesh-info: --ring-order: cannot read '%s': %s\n", file.c_str(),
              cause == std::string::npos ? why.c_str() : why.c_str() + cause + 2);
      return kExitBadInput;
    }
  }
  std::vector<mesh::RingNode> nodes;
  std::string error;
  mesh::RingOrder ring;
  if (mesh::parseNodeLines(text, &nodes, &error)) {
    ring = mesh::ringOrder(nodes);
    error = ring.error;
  }
  if (!error.empty()) {
    fprintf(stderr, "nccl-mesh-info: --ring-order %s: %s\n", file.c_str(), error.c_str());
    return kExitBadInput;
  }
  for (const std::string& line : mesh::describeRingOrder(nodes, ring)) printf("%s\n", line.c_str());
  return kExitOk;
}

}  // namespace info
