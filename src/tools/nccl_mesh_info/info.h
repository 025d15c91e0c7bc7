// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info's parts, one file each: the command line and main (info_main.cpp), what the
// plugin found in routing's terms and the relay's table (info_routes.cpp), and the text and
// JSON output with --subnets and --ring-order (info_print.cpp). Private to the tool.
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "mesh/plugin/plugin.h"
#include "mesh/routing/routes.h"
#include "mesh/routing/subnet_routing.h"
#include "mesh/tools/doctor.h"
#include "mesh/tools/probe.h"
#include "mesh/tools/probe_plan.h"
#include "mesh/wire/handle_codec.h"

namespace info {

constexpr int kExitOk = 0;
constexpr int kExitNoPort = 1;
constexpr int kExitNoRoute = 2;
constexpr int kExitBadInput = 2;  // --ring-order
constexpr int kExitUsage = 64;  // EX_USAGE
constexpr int kListenMaxS = 60;

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
  // --watch / --prometheus (info_watch.cpp)
  bool watch = false;
  double interval = 1.0;       // --interval S
  int count = 0;               // --count N: frames, 0 = until interrupted
  std::string statsDir;        // --stats-dir DIR: "" = NCCL_MESH_STATS_DIR or the default
  std::string prometheus;      // --prometheus FILE
};

struct PeerRoutes {
  const PeerSpec* spec;
  mesh::RouteResult result;
  mesh::NextHopResult relay;  // --routes, when result has no route
};

// The relay's table as the output shows it: computed by this node alone, or learned from
// the neighbours (--listen).
struct RelayView {
  std::string title;                    // the text output's heading
  std::vector<std::string> lines;       // RouteTable::describe()
  std::vector<std::string> problems;    // ignored static routes
  bool live = false;                    // --listen
  std::vector<std::string> neighbours;  // --listen: who was heard
  // --listen: the route plan this node computed (issue 31): whether it is in use, the nodes
  // as heard (RoutePlan nodes), then RoutePlan::describe() (digests, pairs, cable loads).
  std::string planState;
  std::vector<std::string> plan;
  std::function<mesh::NextHopResult(const std::vector<mesh::HandleAddress>&)> nextHops;
};

// --- shared by the outputs -----------------------------------------------------------------

// Left-aligned columns sized to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print() const { fputs(text().c_str(), stdout); }
  std::string text() const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    std::string out;
    for (const auto& row : rows_) {
      std::string line = " ";
      for (size_t c = 0; c < row.size(); ++c) {
        line += " " + row[c];
        if (c + 1 < row.size()) line += std::string(width[c] - row[c].size(), ' ');
      }
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// "200 Gbps", "unknown" (info_print.cpp).
std::string speedText(int mbps);

// --- info_routes.cpp -----------------------------------------------------------------------

RelayView computedRelay(const mesh::Plugin& plugin);
bool listenRelay(const Options& opt, const mesh::Plugin& plugin, RelayView* view);
std::vector<PeerRoutes> routeAll(const Options& opt, const mesh::Plugin& plugin, const RelayView* relay);

// --- info_print.cpp ------------------------------------------------------------------------

void printPorts(const mesh::Discovery& d);
void printCables(const mesh::Discovery& d);
void printDevices(const mesh::Plugin& plugin);
void printRoutes(const std::vector<PeerRoutes>& routes, const mesh::Discovery& d);
void printRelayTable(const RelayView& relay);
void printNoPortHint(const mesh::Plugin& plugin);
void printJson(const mesh::Plugin& plugin, const std::vector<PeerRoutes>& routes, const RelayView* relay);
int printSubnets();

// --- info_watch.cpp ------------------------------------------------------------------------

// --watch, --watch --json, --prometheus: the live counters of every process on this node.
int runWatch(const Options& opt);
int printRingOrder(const std::string& file);

}  // namespace info
