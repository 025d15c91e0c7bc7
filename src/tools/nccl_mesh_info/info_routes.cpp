// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info: the plugin's ports as subnet routing sees them, the routes to each --peer,
// and the relay's route table, computed by this node alone or learned by listening (--listen).
#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "info.h"
#include "mesh/connect/reactor.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/text.h"
#include "mesh/relay/route_service.h"

namespace info {

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

// The relay's table as this node alone computes it (no HELLOs heard): its links and its
// static routes. The node id does not matter for a table nobody else sees.
mesh::RouteTable relayTable(const mesh::Plugin& plugin) {
  mesh::RouteSettings settings;
  settings.maxHops = plugin.config().relayMaxHops;
  return mesh::RouteTable(0, localNics(plugin.discovery()), settings, plugin.config().staticRoutes);
}

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

// The route plan as this node computed it, for comparing nodes by eye: the same table
// digest on two nodes means the same table.
void describePlan(const mesh::RouteService& service, RelayView* view) {
  mesh::RoutePlan plan = service.plan();
  mesh::PlanAgreement agreement = service.agreement();
  mesh::PlanAgreement closure = service.closure();
  view->planState = agreement.agree ? mesh::strf("every node's view agrees: relayed connects follow the plan "
                                                 "(%zu node(s))", plan.nodes.size())
                                    : "views disagree: " + agreement.why +
                                          "; relayed connects use the fallback rule";
  // An open picture: a node not heard yet, or a cable to a node without the plugin (then for good).
  if (!closure.agree) view->planState += "; the picture is open: " + closure.why;
  for (const mesh::PlanNode& n : plan.nodes) {
    std::string line = "node " + mesh::hex64(n.id) + (n.id == service.self() ? " (this node)" : "") + ":";
    for (const mesh::Ipv4Prefix& a : n.addrs) line += " " + mesh::formatPrefix(a);
    line += "; hears";
    for (mesh::NodeId nb : n.neighbours) line += " " + mesh::hex64(nb);
    if (n.neighbours.empty()) line += " nobody";
    view->plan.push_back(line);
  }
  std::vector<std::string> table = plan.describe();
  view->plan.insert(view->plan.end(), table.begin(), table.end());
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
  uint64_t lastPlan = live->service->plan().tableDigest;
  bool settled = false;
  while (!settled && Clock::now() - begin < std::chrono::seconds(opt.listenS)) {
    // Watching the table is all the tool does meanwhile; 100 ms is a tenth of a period.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<std::string> lines = live->service->describe();
    uint64_t plan = live->service->plan().tableDigest;
    if (lines != last || plan != lastPlan) {
      last.swap(lines);
      lastPlan = plan;
      changed = Clock::now();
    }
    settled = Clock::now() - changed >= std::chrono::milliseconds(2 * settings.helloMs) &&
              everyPortHeard(nics, live->service->neighbours()) && live->service->agreement().agree;
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
  describePlan(*live->service, view);
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

}  // namespace info
