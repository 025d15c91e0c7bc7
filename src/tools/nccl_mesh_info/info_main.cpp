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
// This file: the usage, the command line and main; info.h names the tool's other parts.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "info.h"
#include "mesh/config/config.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/log.h"
#include "mesh/platform/version.h"

using namespace info;  // the tool's own parts (info.h)

namespace {

const char kUsage[] =
    "usage: nccl-mesh-info [-v] [--json] [--routes [--listen S]] [--peer ADDR[/LEN][,ADDR[/LEN]...]]...\n"
    "       nccl-mesh-info --probe PEER[:PORT] [--timeout S] [-v]\n"
    "       nccl-mesh-info --serve [--port PORT] [--bind ADDR] [--once [--timeout S]] [-v]\n"
    "       nccl-mesh-info --settings | --version | --help\n"
    "       nccl-mesh-info --subnets | --ring-order FILE\n"
    "       nccl-mesh-info --doctor [--json] [--nodes N] [--root PREFIX]\n"
    "       nccl-mesh-info --watch [--json] [--interval S] [--count N] [--prometheus FILE]\n"
    "                      [--stats-dir DIR] [--root PREFIX]\n"
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
    "                a neighbour, every node's view agrees and the table has not changed for\n"
    "                2 HELLO periods, or when S run out; then the route plan this node\n"
    "                computed (every relayed pair's path, each cable direction's load, the\n"
    "                table digest: equal digests on two nodes = the same table). Run it on\n"
    "                every node at about the same time\n"
    "  --watch       live traffic of every process on this node that loaded the plugin, refreshed\n"
    "                every --interval S (1) seconds, in place on a terminal (plain frames\n"
    "                otherwise): each cable and PCIe function (Gb/s each way, its share of the\n"
    "                cable, the cable's share of its ceiling), each peer (direct, relayed and via\n"
    "                whom, forwarded by this node's relay), events, and the NICs' own sysfs\n"
    "                counters (all traffic; retransmissions, sequence errors, congestion). With\n"
    "                --json: one snapshot as JSON after one interval. --count N: stop after N\n"
    "                frames. --stats-dir DIR: where the processes publish (NCCL_MESH_STATS_DIR;\n"
    "                default /dev/shm/nccl-mesh-<uid>, and every user's for root). --root: sysfs\n"
    "                prefix. Stale files of killed processes are removed (or ignored)\n"
    "  --prometheus FILE  write every interval, atomically, the counters in the node_exporter\n"
    "                textfile-collector format (with --watch: the table too)\n"
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
    } else if (arg == "--watch") {
      opt->watch = true;
    } else if (arg == "--interval" || arg == "--count" || arg == "--stats-dir" || arg == "--prometheus") {
      if (i + 1 >= argc) {
        *error = arg + " needs a value";
        return false;
      }
      std::string value = argv[++i];
      char* end = nullptr;
      if (arg == "--interval") {
        opt->interval = strtod(value.c_str(), &end);
        if (*end != '\0' || !(opt->interval >= 0.1 && opt->interval <= 3600)) {
          *error = "--interval: '" + value + "' is not a number of seconds (0.1..3600)";
          return false;
        }
      } else if (arg == "--count") {
        long v = strtol(value.c_str(), &end, 10);
        if (*end != '\0' || v < 1 || v > 1000000) {
          *error = "--count: '" + value + "' is not a number of frames (1..1000000)";
          return false;
        }
        opt->count = static_cast<int>(v);
      } else if (arg == "--stats-dir") {
        opt->statsDir = value;
      } else {
        opt->prometheus = value;
      }
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
  if ((opt->count > 0 || opt->interval != 1.0 || !opt->statsDir.empty()) && !opt->watch && opt->prometheus.empty()) {
    *error = "--interval, --count and --stats-dir go with --watch or --prometheus";
    return false;
  }
  if (opt->listenS > 0 && !opt->routes) {
    *error = "--listen shows the route table: use it with --routes";
    return false;
  }
  return true;
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
  // The modes that move no data publish no live counters (no file, no directory created);
  // --probe and --serve do, as any process of the plugin.
  if (opt.subnets || (opt.probe.empty() && !opt.serve)) setenv("NCCL_MESH_STATS", "0", 1);
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
  if (opt.watch || !opt.prometheus.empty()) return runWatch(opt);
  if (opt.verbose) mesh::setFallbackLevel(NCCL_LOG_INFO);
  int status = report(opt);
  mesh::Plugin::instance().shutdown();
  return status;
}
