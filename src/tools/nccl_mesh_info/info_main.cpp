// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info: what the plugin would see on this node, without NCCL. Runs the plugin
// core's own init (settings, verbs loader, NIC discovery), prints every usable RoCE port,
// the devices NCCL would be offered, and, for each --peer, the local port(s) the subnet
// routing picks to reach it. Exit status: 0 all good, 1 no usable port, 2 a peer has no
// route, 64 bad command line.
// --probe PEER / --serve test the cables to another node end to end (src/tools/probe.cpp), with
// the exit statuses of mesh/tools/probe.h. --routes adds the relay's route table (routes.h) as
// this node alone can compute it: its own links and NCCL_MESH_ROUTES; with --listen, as
// the route service (route_service.h) learns it from the neighbours' HELLOs.
// --subnets prints this node's line for --ring-order, which reads every node's line and
// prints the launch order that makes NCCL's ring follow the cables (ring_order.h); it
// needs no RDMA. Exit status: 0, or 2 on bad input.
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mesh/connect/reactor.h"
#include "mesh/discovery/nic_discovery.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/log.h"
#include "mesh/platform/text.h"
#include "mesh/platform/version.h"
#include "mesh/plugin/net_devices.h"
#include "mesh/plugin/plugin.h"
#include "mesh/relay/route_service.h"
#include "mesh/routing/ring_order.h"
#include "mesh/routing/routes.h"
#include "mesh/routing/subnet_routing.h"
#include "mesh/tools/doctor.h"
#include "mesh/tools/probe.h"
#include "mesh/tools/probe_plan.h"
#include "mesh/wire/handle_codec.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitNoPort = 1;
constexpr int kExitNoRoute = 2;
constexpr int kExitBadInput = 2;  // --ring-order
constexpr int kExitUsage = 64;  // EX_USAGE
constexpr int kListenMaxS = 60;

const char kUsage[] =
    "usage: nccl-mesh-info [-v] [--json] [--routes [--listen S]] [--peer ADDR[/LEN][,ADDR[/LEN]...]]...\n"
    "       nccl-mesh-info --probe PEER[:PORT] [--timeout S] [-v]\n"
    "       nccl-mesh-info --serve [--port PORT] [--bind ADDR] [--once [--timeout S]] [-v]\n"
    "       nccl-mesh-info --settings | --version | --help\n"
    "       nccl-mesh-info --subnets | --ring-order FILE\n"
    "       nccl-mesh-info --doctor [--json] [--nodes N] [--root PREFIX]\n"
    "\n"
    "Shows what the nccl-mesh plugin finds on this node: every usable RoCEv2 port (an\n"
    "ACTIVE Ethernet RDMA port with an IPv4 address), the devices NCCL is offered, and how\n"
    "each --peer is reached.\n"
    "\n"
    "  --peer SPEC   a peer node, given by its mesh address(es), comma-separated; repeat the\n"
    "                option for several peers. Each address is taken to sit on its own peer\n"
    "                NIC, as in the handle a peer's listener publishes. An address without\n"
    "                /LEN gets the prefix length of the longest local prefix that contains\n"
    "                it (so it routes exactly when it is on a local link), or /32 if none.\n"
    "                Every parallel link to the peer is listed.\n"
    "  --probe PEER  check end to end that every cable between this node and PEER carries\n"
    "                RDMA: for each local port that shares a subnet with a port of PEER, a QP\n"
    "                connection through the plugin and one verified 64 KiB RDMA write, each\n"
    "                port alone. PEER is PEER's name or address on the management network,\n"
    "                where `nccl-mesh-info --serve` must be running (default port 18601).\n"
    "                Exit status: 0 every cable OK; 1 no usable port here; 2 no cable to\n"
    "                PEER (both sides' subnets are named); 3 a cable failed (port, subnet and\n"
    "                the error are named); 4 PEER's responder unreachable; 64 bad command line\n"
    "  --serve       answer --probe from other nodes (TCP --port, default 18601, on --bind,\n"
    "                default every interface); runs until killed, or one probe with --once\n"
    "  --timeout S   --probe: seconds per cable and to reach PEER (10); --serve --once: how\n"
    "                long to wait for a prober (0 = for ever)\n"
    "  --routes      also print the relay's route table (used with NCCL_MESH_RELAY=auto)\n"
    "                from this node's links and NCCL_MESH_ROUTES, and for each --peer\n"
    "                without a cable the neighbour a relay would go through. Routes learned\n"
    "                from neighbours appear with --listen\n"
    "  --listen S    with --routes: run the relay's route discovery for up to S seconds\n"
    "                (1..60): send HELLOs on every port (UDP NCCL_MESH_RELAY_PORT) and print\n"
    "                the table learned from the neighbours' HELLOs once every port has heard\n"
    "                a neighbour and the table has not changed for 2 HELLO periods, or when S\n"
    "                run out. Run it on every node at about the same time\n"
    "  --subnets     print this node's line for --ring-order: its name and its mesh ports'\n"
    "                subnets (\"node1 198.18.0.0/24 198.18.1.0/24\"). Exit status 1 when no\n"
    "                port is usable\n"
    "  --ring-order FILE  print the order to launch the nodes in (rank 0 on the first) so that\n"
    "                NCCL's ring goes from node to node over cables; where no order can, the\n"
    "                pairs that go through the relay. FILE (- for stdin) has one --subnets\n"
    "                line per node, e.g. from `for h in a b c d; do ssh $h nccl-mesh-info\n"
    "                --subnets; done > nodes.txt`; blank lines and # comments are skipped.\n"
    "                Needs no RDMA. Exit status: 0; 2 bad input (the line is named)\n"
    "  --doctor      check this node before a job, changing nothing: one line per check (OK,\n"
    "                WARN or FAIL, what was found, the fix); exit 0 all OK, 1 a WARN, 2 a FAIL.\n"
    "                --nodes N: the job's node count; --root PREFIX: files under PREFIX\n"
    "  --json        machine-readable output on stdout\n"
    "  -v            print the plugin's INFO log on stderr (why ports were skipped, settings)\n"
    "  --settings    print every NCCL_MESH_* setting (name, default, meaning) as a markdown\n"
    "                table and exit\n"
    "  --version     print the version (and git revision) and exit\n"
    "  -h, --help    this text\n"
    "\n"
    "Settings come from the environment as for the plugin (NCCL_MESH_HCA, NCCL_MESH_DEVICES,\n"
    "NCCL_MESH_IBVERBS_LIB, ...).\n"
    "\n"
    "Exit status: 0 at least one usable port and every --peer routes; 1 no usable port (or\n"
    "the plugin failed to initialize); 2 some --peer has no route; 64 bad command line.\n"
    "\n"
    "Example: nccl-mesh-info --peer 198.18.0.2 --peer 198.18.1.3,198.18.2.3\n";

// --- command line ---------------------------------------------------------------------------

struct PeerAddr {
  uint32_t addr = 0;
  int prefixLen = -1;  // -1: not given, inferred from the local prefixes
};

struct PeerSpec {
  std::string text;
  std::vector<PeerAddr> addrs;
};

struct Options {
  bool help = false;
  bool verbose = false;
  bool json = false;
  bool settings = false;
  bool version = false;
  bool routes = false;
  bool subnets = false;
  bool doctor = false;
  mesh::DoctorOptions doctorOpts;  // --doctor --root --nodes
  std::string ringOrder;  // --ring-order FILE
  int listenS = 0;  // --listen: 0 = off
  std::string probe;  // --probe PEER
  bool serve = false;
  bool once = false;
  int port = mesh::kProbeDefaultPort;
  std::string bind;
  double timeout = -1;  // -1: the mode's default
  std::vector<PeerSpec> peers;
};

bool parsePeerAddr(const std::string& text, PeerAddr* out) {
  size_t slash = text.find('/');
  if (slash == std::string::npos) return mesh::parseIpv4(text, &out->addr);
  mesh::Ipv4Prefix p;
  if (!mesh::parsePrefix(text, &p)) return false;
  out->addr = p.addr;
  out->prefixLen = p.prefixLen;
  return true;
}

bool parsePeer(const std::string& text, PeerSpec* out, std::string* error) {
  out->text = text;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = std::min(text.find(',', start), text.size());
    PeerAddr a;
    std::string item = text.substr(start, comma - start);
    if (!parsePeerAddr(item, &a)) {
      *error = "--peer: '" + item + "' is not an IPv4 address (A.B.C.D or A.B.C.D/LEN)";
      return false;
    }
    out->addrs.push_back(a);
    start = comma + 1;
  }
  if (out->addrs.size() > mesh::kHandleMaxAddresses) {
    *error = "--peer: at most " + std::to_string(mesh::kHandleMaxAddresses) +
             " addresses per peer (what one handle carries)";
    return false;
  }
  return true;
}

bool parseArgs(int argc, char** argv, Options* opt, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      opt->help = true;
    } else if (arg == "-v" || arg == "--verbose") {
      opt->verbose = true;
    } else if (arg == "--json") {
      opt->json = true;
    } else if (arg == "--settings") {
      opt->settings = true;
    } else if (arg == "--routes") {
      opt->routes = true;
    } else if (arg == "--subnets") {
      opt->subnets = true;
    } else if (arg == "--doctor") {
      opt->doctor = true;
    } else if (arg == "--version") {
      opt->version = true;
    } else if (arg == "--serve") {
      opt->serve = true;
    } else if (arg == "--once") {
      opt->once = true;
    } else if (arg == "--listen") {
      char* end = nullptr;
      long v = i + 1 < argc ? strtol(argv[++i], &end, 10) : 0;
      if (end == nullptr || *end != '\0' || v < 1 || v > kListenMaxS) {
        *error = "--listen needs a number of seconds, 1.." + std::to_string(kListenMaxS);
        return false;
      }
      opt->listenS = static_cast<int>(v);
    } else if (arg == "--probe" || arg == "--port" || arg == "--bind" || arg == "--timeout" ||
               arg == "--ring-order" || arg == "--root" || arg == "--nodes") {
      if (i + 1 >= argc) {
        *error = arg + " needs a value";
        return false;
      }
      std::string value = argv[++i];
      char* end = nullptr;
      if (arg == "--probe") {
        opt->probe = value;
      } else if (arg == "--ring-order") {
        opt->ringOrder = value;
      } else if (arg == "--bind") {
        opt->bind = value;
      } else if (arg == "--root") {
        opt->doctorOpts.root = value;
      } else if (arg == "--nodes") {
        opt->doctorOpts.nodes = static_cast<int>(strtol(value.c_str(), &end, 10));
        if (*end != '\0' || opt->doctorOpts.nodes < 1 || opt->doctorOpts.nodes > 1024) {
          *error = "--nodes: '" + value + "' is not a node count (1..1024)";
          return false;
        }
      } else if (arg == "--port") {
        long v = strtol(value.c_str(), &end, 10);
        if (*end != '\0' || v < 0 || v > 65535) {
          *error = "--port: '" + value + "' is not a port number (0..65535)";
          return false;
        }
        opt->port = static_cast<int>(v);
      } else {
        opt->timeout = strtod(value.c_str(), &end);
        if (*end != '\0' || !(opt->timeout >= 0)) {
          *error = "--timeout: '" + value + "' is not a number of seconds";
          return false;
        }
      }
    } else if (arg == "--peer" || arg.rfind("--peer=", 0) == 0) {
      std::string value;
      if (arg != "--peer") {
        value = arg.substr(strlen("--peer="));
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        *error = "--peer needs a value";
        return false;
      }
      PeerSpec spec;
      if (!parsePeer(value, &spec, error)) return false;
      opt->peers.push_back(spec);
    } else {
      *error = "unknown argument '" + arg + "'";
      return false;
    }
  }
  if (opt->listenS > 0 && !opt->routes) {
    *error = "--listen shows the route table: use it with --routes";
    return false;
  }
  return true;
}

// --- what the plugin found, in routing's terms -------------------------------------------

std::vector<mesh::LocalNic> localNics(const mesh::Discovery& d) {
  std::vector<mesh::LocalNic> nics;
  for (size_t i = 0; i < d.ports.size(); ++i) {
    mesh::LocalNic nic;
    nic.index = static_cast<int>(i);
    nic.label = d.ports[i].label();
    for (const mesh::PortAddress& a : d.ports[i].addrs) nic.addrs.push_back({a.ip, a.gidIndex});
    nics.push_back(nic);
  }
  return nics;
}

// Longest local prefix containing addr, or 32 when no local subnet does.
uint8_t inferPrefix(const std::vector<mesh::LocalNic>& nics, uint32_t addr) {
  int best = -1;
  for (const mesh::LocalNic& nic : nics) {
    for (const mesh::LocalAddress& a : nic.addrs) {
      if (a.ip.prefixLen > best && mesh::sameSubnet(a.ip.addr, addr, a.ip.prefixLen)) {
        best = a.ip.prefixLen;
      }
    }
  }
  return static_cast<uint8_t>(best < 0 ? 32 : best);
}

std::vector<mesh::HandleAddress> peerAddresses(const PeerSpec& spec,
                                               const std::vector<mesh::LocalNic>& nics) {
  std::vector<mesh::HandleAddress> out;
  for (size_t i = 0; i < spec.addrs.size(); ++i) {
    const PeerAddr& a = spec.addrs[i];
    mesh::HandleAddress h;
    h.addr = a.addr;
    h.prefixLen = a.prefixLen >= 0 ? static_cast<uint8_t>(a.prefixLen) : inferPrefix(nics, a.addr);
    h.nic = static_cast<uint8_t>(i);
    out.push_back(h);
  }
  return out;
}

struct PeerRoutes {
  const PeerSpec* spec;
  mesh::RouteResult result;
  mesh::NextHopResult relay;  // --routes, when result has no route
};

// The relay's table as this node alone computes it (no HELLOs heard): its links and its
// static routes. The node id does not matter for a table nobody else sees.
mesh::RouteTable relayTable(const mesh::Plugin& plugin) {
  mesh::RouteSettings settings;
  settings.maxHops = plugin.config().relayMaxHops;
  return mesh::RouteTable(0, localNics(plugin.discovery()), settings, plugin.config().staticRoutes);
}

// The relay's table as the output shows it: computed by this node alone, or learned from
// the neighbours (--listen).
struct RelayView {
  std::string title;                    // the text output's heading
  std::vector<std::string> lines;       // RouteTable::describe()
  std::vector<std::string> problems;    // ignored static routes
  bool live = false;                    // --listen
  std::vector<std::string> neighbours;  // --listen: who was heard
  std::function<mesh::NextHopResult(const std::vector<mesh::HandleAddress>&)> nextHops;
};

RelayView computedRelay(const mesh::Plugin& plugin) {
  auto table = std::make_shared<mesh::RouteTable>(relayTable(plugin));
  RelayView v;
  v.title = mesh::strf("Relay routes (computed: this node's links and NCCL_MESH_ROUTES only, no\n"
                   "neighbour heard; --listen S learns the rest), max %d relay hop(s): %zu",
                   plugin.config().relayMaxHops, table->routes().size());
  v.lines = table->describe();
  v.problems = table->staticProblems();
  v.nextHops = [table](const std::vector<mesh::HandleAddress>& peer) { return table->nextHops(peer); };
  return v;
}

// --listen: a reactor and a route service of the tool's own (init starts neither), alive
// until the output is written, so that a --peer's relay way comes from the learned table.
struct LiveRelay {
  mesh::Reactor reactor;
  std::unique_ptr<mesh::RouteService> service;
  ~LiveRelay() {
    if (service) service->stop();
    reactor.stop();
  }
};

// Every port that can have a neighbour (an address other than a /32) has heard one.
bool everyPortHeard(const std::vector<mesh::LocalNic>& nics, const std::vector<mesh::NeighbourLink>& heard) {
  for (const mesh::LocalNic& nic : nics) {
    bool linked = std::any_of(nic.addrs.begin(), nic.addrs.end(),
                              [](const mesh::LocalAddress& a) { return a.ip.prefixLen < 32; });
    bool found = std::any_of(heard.begin(), heard.end(),
                             [&](const mesh::NeighbourLink& n) { return n.localPort == nic.index; });
    if (linked && !found) return false;
  }
  return true;
}

bool listenRelay(const Options& opt, const mesh::Plugin& plugin, RelayView* view) {
  using Clock = std::chrono::steady_clock;
  std::vector<mesh::LocalNic> nics = localNics(plugin.discovery());
  mesh::RouteServiceSettings settings = mesh::routeServiceSettings(plugin.config());
  auto live = std::make_shared<LiveRelay>();
  if (live->reactor.start() != ncclSuccess) return false;
  live->service = std::make_unique<mesh::RouteService>(&live->reactor, nics, settings);
  if (live->service->start() != ncclSuccess) return false;
  Clock::time_point begin = Clock::now();
  Clock::time_point changed = begin;
  std::vector<std::string> last = live->service->describe();
  bool settled = false;
  while (!settled && Clock::now() - begin < std::chrono::seconds(opt.listenS)) {
    // Watching the table is all the tool does meanwhile; 100 ms is a tenth of a period.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<std::string> lines = live->service->describe();
    if (lines != last) {
      last.swap(lines);
      changed = Clock::now();
    }
    settled = Clock::now() - changed >= std::chrono::milliseconds(2 * settings.helloMs) &&
              everyPortHeard(nics, live->service->neighbours());
  }
  view->live = true;
  view->title = mesh::strf("Relay routes learned by listening %.1f s (%s; node 0x%016llx, UDP port %d),\n"
                       "max %d relay hop(s): %zu",
                       std::chrono::duration<double>(Clock::now() - begin).count(),
                       settled ? "settled" : "--listen time ran out",
                       static_cast<unsigned long long>(live->service->self()), live->service->udpPort(),
                       settings.routes.maxHops, last.size());
  view->lines = last;
  view->problems = relayTable(plugin).staticProblems();  // the same ports and routes, the same problems
  for (const mesh::NeighbourLink& n : live->service->neighbours()) {
    view->neighbours.push_back(mesh::strf("neighbour node 0x%016llx on %s (%s)",
                                          static_cast<unsigned long long>(n.node),
                                          nics[static_cast<size_t>(n.localPort)].label.c_str(),
                                          mesh::formatIpv4(n.linkAddr).c_str()));
  }
  view->nextHops = [live](const std::vector<mesh::HandleAddress>& peer) {
    return live->service->nextHops(peer);
  };
  return true;
}

std::vector<PeerRoutes> routeAll(const Options& opt, const mesh::Plugin& plugin, const RelayView* relay) {
  std::vector<mesh::LocalNic> nics = localNics(plugin.discovery());
  std::vector<PeerRoutes> out;
  for (const PeerSpec& spec : opt.peers) {
    std::vector<mesh::HandleAddress> peer = peerAddresses(spec, nics);
    PeerRoutes pr{&spec, mesh::routeToPeer(nics, peer), {}};
    if (relay != nullptr && !pr.result.ok()) pr.relay = relay->nextHops(peer);
    out.push_back(pr);
  }
  return out;
}

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

// Left-aligned columns sized to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print() const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (const auto& row : rows_) {
      std::string line = " ";
      for (size_t c = 0; c < row.size(); ++c) {
        line += " " + row[c];
        if (c + 1 < row.size()) line += std::string(width[c] - row[c].size(), ' ');
      }
      printf("%s\n", line.c_str());
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// --- text output -----------------------------------------------------------------------------

void printPorts(const mesh::Discovery& d) {
  printf("RDMA ports usable by the mesh: %zu\n", d.ports.size());
  if (d.ports.empty()) return;
  Table t({"PORT", "NETDEV", "STATE", "ADDRESS", "GID IDX", "GID", "MTU", "SPEED", "GDR",
           "DMA-BUF", "GUID", "PCI PATH"});
  for (const mesh::MeshPort& p : d.ports) {
    for (const mesh::PortAddress& a : p.addrs) {
      t.add({p.device + ":" + std::to_string(p.port), p.netdev, "ACTIVE",
             mesh::formatPrefix(a.ip), std::to_string(a.gidIndex), gidText(a.gid),
             std::to_string(p.mtuBytes), speedText(p.speedMbps), yesNo(p.gdr), yesNo(p.dmabuf),
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

std::string jsonPort(const mesh::MeshPort& p) {
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
         (p.dmabuf ? "true" : "false") + "}";
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
  printf("  \"ports\": %s,\n", jsonList(d.ports, jsonPort).c_str());
  printf("  \"cables\": %s,\n", jsonList(mesh::cableGroups(d.ports), [&](const std::vector<int>& c) {
           return "{\"functions\": " + jsonString(cableFunctionsText(c, d)) +
                  ", \"speed_mbps\": " + std::to_string(mesh::cableSpeedMbps(d.ports, c)) + "}";
         }).c_str());
  printf("  \"devices\": %s,\n",
         jsonList(devices, [&](const mesh::NetDevice& n) { return jsonDevice(n, d); }).c_str());
  if (relay != nullptr) {
    printf("  \"relay_routes\": %s,\n", jsonList(relay->lines, jsonString).c_str());
    printf("  \"relay_problems\": %s,\n", jsonList(relay->problems, jsonString).c_str());
    if (relay->live) printf("  \"relay_neighbours\": %s,\n", jsonList(relay->neighbours, jsonString).c_str());
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
    std::ifstream in(file);
    if (!in) {
      fprintf(stderr, "nccl-mesh-info: --ring-order: cannot read '%s': %s\n", file.c_str(), strerror(errno));
      return kExitBadInput;
    }
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
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

// --- main ------------------------------------------------------------------------------------

int exitStatus(const mesh::Plugin& plugin, const std::vector<PeerRoutes>& routes) {
  if (plugin.discovery().ports.empty()) return kExitNoPort;
  for (const PeerRoutes& pr : routes) {
    if (!pr.result.ok()) return kExitNoRoute;
  }
  return kExitOk;
}

int report(const Options& opt) {
  mesh::Plugin& plugin = mesh::Plugin::instance();
  if (plugin.init(nullptr) != ncclSuccess) {
    fprintf(stderr, "nccl-mesh-info: the plugin failed to initialize (see the messages above)\n");
    return kExitNoPort;
  }
  RelayView relay;
  if (opt.routes && opt.listenS > 0 && !plugin.discovery().ports.empty()) {
    if (!listenRelay(opt, plugin, &relay)) {
      fprintf(stderr, "nccl-mesh-info: route discovery could not start (see the messages above)\n");
      return kExitNoPort;
    }
  } else if (opt.routes) {
    relay = computedRelay(plugin);
  }
  std::vector<PeerRoutes> routes = routeAll(opt, plugin, opt.routes ? &relay : nullptr);
  if (opt.json) {
    printJson(plugin, routes, opt.routes ? &relay : nullptr);
  } else {
    printPorts(plugin.discovery());
    printCables(plugin.discovery());
    printDevices(plugin);
    if (opt.routes) printRelayTable(relay);
    printRoutes(routes, plugin.discovery());
    if (plugin.discovery().ports.empty()) printNoPortHint(plugin);
  }
  return exitStatus(plugin, routes);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  std::string error;
  if (!parseArgs(argc, argv, &opt, &error)) {
    fprintf(stderr, "nccl-mesh-info: %s\n\n%s", error.c_str(), kUsage);
    return kExitUsage;
  }
  if (opt.help) {
    fputs(kUsage, stdout);
    return kExitOk;
  }
  if (opt.version) {
    printf("nccl-mesh-info: %s\n", mesh::versionText().c_str());
    return kExitOk;
  }
  if (opt.settings) {
    printf("| Variable | Default | Meaning |\n|---|---|---|\n");
    for (const mesh::SettingInfo& s : mesh::settingsTable()) {
      printf("| `%s` | %s | %s |\n", s.name, *s.defaultText ? (std::string("`") + s.defaultText + "`").c_str() : "(empty)", s.doc);
    }
    return kExitOk;
  }
  if (!opt.ringOrder.empty()) return printRingOrder(opt.ringOrder);  // before any RDMA: pure input
  if (opt.doctor) {
    opt.doctorOpts.json = opt.json;
    return mesh::runDoctor(opt.doctorOpts);
  }
  if (opt.subnets) {
    int status = printSubnets();
    mesh::Plugin::instance().shutdown();
    return status;
  }
  if (!opt.probe.empty()) {
    mesh::ProbeOptions p;
    p.peer = opt.probe;
    if (opt.timeout > 0) p.timeoutS = opt.timeout;
    p.verbose = opt.verbose;
    int status = mesh::runProbe(p);
    mesh::Plugin::instance().shutdown();
    return status;
  }
  if (opt.serve) {
    mesh::ServeOptions s;
    s.bind = opt.bind;
    s.port = opt.port;
    s.once = opt.once;
    s.timeoutS = opt.timeout > 0 ? opt.timeout : 0;
    s.verbose = opt.verbose;
    int status = mesh::runServe(s);
    mesh::Plugin::instance().shutdown();
    return status;
  }
  if (opt.verbose) mesh::setFallbackLevel(NCCL_LOG_INFO);
  int status = report(opt);
  mesh::Plugin::instance().shutdown();
  return status;
}
