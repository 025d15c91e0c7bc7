// SPDX-License-Identifier: Apache-2.0
// Route discovery on the wire (see route_service.h). Everything in Core below the public
// methods runs on the reactor thread, or on the stopping thread once the reactor is gone.
#include "mesh/relay/route_service.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "mesh/platform/ipv4.h"
#include "mesh/platform/log.h"
#include "mesh/platform/text.h"
#include "mesh/relay/relay_proto.h"

namespace mesh {

using Clock = Reactor::Clock;

namespace {

// A garbled datagram or a refused HELLO is worth one WARN per sender and minute: enough to
// find a misconfigured neighbour, too few for a sender on the link to flood NCCL's log.
constexpr auto kWarnEvery = std::chrono::minutes(1);
constexpr size_t kWarnSourcesMax = 256;  // senders remembered for that; beyond, forgotten
// Datagrams read per wake-up: the rest wait for the next epoll round (level-triggered), so
// a flood on the HELLO port cannot starve the handshakes sharing the reactor.
constexpr int kReadBurst = 64;
// stop() waits this long for the reactor to close the sockets; a reactor that takes longer
// is stuck elsewhere, and the shared Core keeps the late teardown safe.
constexpr auto kStopWait = std::chrono::seconds(5);

uint64_t nowMs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count());
}

std::string portLabel(const LocalNic& nic) {
  return nic.label.empty() ? "port " + std::to_string(nic.index) : nic.label;
}

std::string nodeText(NodeId id) {
  char buf[24];
  snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(id));
  return buf;
}

// A UDP socket for HELLOs: non-blocking (only the reactor touches it) and closed on exec
// (a forked worker must not keep the port).
int udpSocket(bool broadcast, bool reuseAddr) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  if ((broadcast && setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &one, sizeof(one)) != 0) ||
      (reuseAddr && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

struct SendSocket {
  size_t nic = 0;  // position in Core::ports
  LocalAddress addr;
  int fd = -1;
  bool failing = false;  // a sendto failure was logged; cleared (and said) by the next success
};

}  // namespace

NodeId nodeIdFromPorts(const std::vector<LocalNic>& ports) {
  std::vector<std::pair<uint32_t, uint8_t>> addrs;
  for (const LocalNic& nic : ports) {
    for (const LocalAddress& a : nic.addrs) addrs.emplace_back(a.ip.addr, a.ip.prefixLen);
  }
  std::sort(addrs.begin(), addrs.end());
  addrs.erase(std::unique(addrs.begin(), addrs.end()), addrs.end());
  Fnv64 h;
  for (const auto& [addr, len] : addrs) {
    for (int shift = 24; shift >= 0; shift -= 8) h.byte(static_cast<uint8_t>(addr >> shift));
    h.byte(len);
  }
  return h.value() != 0 ? h.value() : Fnv64().value();
}

std::vector<uint32_t> parseDropHellosFrom(const char* text) {
  std::vector<uint32_t> out;
  std::string all = text != nullptr ? text : "";
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) end = all.size();
    uint32_t addr = 0;
    if (parseIpv4(trim(all.substr(start, end - start)), &addr)) out.push_back(addr);
    start = end + 1;
  }
  return out;
}

std::vector<sockaddr_in> helloDestinations(const LocalNic&, const LocalAddress& addr, int udpPort) {
  uint8_t len = addr.ip.prefixLen;
  if (len >= 32) return {};
  if (len == 31) return {ipv4SockAddr(INADDR_BROADCAST, static_cast<uint16_t>(udpPort))};  // RFC 3021: no broadcast address
  return {ipv4SockAddr(addr.ip.addr | ~prefixMask(len), static_cast<uint16_t>(udpPort))};
}

RouteServiceSettings routeServiceSettings(const Config& config) {
  RouteServiceSettings s;
  s.udpPort = config.relayPort;
  s.helloMs = 1000;
  s.routes.maxHops = config.relayMaxHops;
  s.routes.holdMs = 4 * static_cast<uint64_t>(s.helloMs);
  s.statics = config.staticRoutes;
  s.dropHellosFrom = parseDropHellosFrom(getenv("MESH_TEST_DROP_HELLOS_FROM"));
  return s;
}

struct RouteService::Core {
  Core(Reactor* r, std::vector<LocalNic> p, RouteServiceSettings s, NodeId id)
      : reactor(r),
        ports(std::move(p)),
        settings(std::move(s)),
        self(id),
        table(id, ports, settings.routes, settings.statics),
        topology(id, settings.routes.maxHops, settings.routes.holdMs) {
    closure = topology.closure();
  }

  void closeAll(bool unwatch);
  bool tick();
  void sendHellos();
  void onReadable();
  void handleDatagram(uint32_t src, const uint8_t* data, size_t len, size_t wireLen);
  bool afterChange();
  bool refreshOwnLocked();
  void noteAgreementLocked();
  void notePlan();
  bool dropped(uint32_t localAddr) const;
  void warnLimited(uint32_t src, const std::string& what);
  bool isOwnAddress(uint32_t addr) const;
  int portFor(uint32_t src) const;
  const LocalNic* nicByIndex(int index) const;

  Reactor* const reactor;
  const std::vector<LocalNic> ports;
  const RouteServiceSettings settings;
  const NodeId self;
  // Written by start() before the reactor sees the sockets, and by stop(); read anywhere.
  std::atomic<bool> started{false};
  std::atomic<bool> stopped{false};
  std::atomic<int> boundPort{0};

  mutable std::mutex mutex;  // guards table, topology, agreement and counters (any thread reads)
  RouteTable table;
  TopologyView topology;
  PlanAgreement agreement;  // topology.agreement() as of the last change
  PlanAgreement closure;    // topology.closure() as of the last change
  // The plan's digests, whether views agree and whom they name, and whether the picture is closed.
  std::tuple<uint64_t, uint64_t, bool, NodeId, bool, NodeId> picture;
  uint64_t pictureSinceMs = 0;  // when `picture` last changed (nowMs)
  RouteServiceCounters counters;

  // Reactor thread only (the stopping thread once the reactor is gone): the sockets, and
  // what was last logged, to log changes only.
  int recvFd = -1;
  std::vector<SendSocket> senders;
  std::set<NeighbourLink> known;
  std::vector<std::string> lastLines;
  std::map<uint32_t, Clock::time_point> warned;  // sender → its last WARN
  uint64_t lastSeq = 0;          // our records' numbering (topology_view.h)
  uint64_t loggedPlan = 0;       // table digest of the last plan logged
  uint64_t loggedInUse = 0;      // table digest last logged as agreed on; 0 = not in use
  bool disagreeLogged = false;   // this disagreement was logged
  Clock::time_point disagreeSince{};  // when views last started to disagree
};

RouteService::RouteService(Reactor* reactor, std::vector<LocalNic> ports, RouteServiceSettings s)
    : reactor_(reactor), self_(nodeIdFromPorts(ports)) {
  core_ = std::make_shared<Core>(reactor, std::move(ports), std::move(s), self_);
}

RouteService::~RouteService() { stop(); }

ncclResult_t RouteService::start() {
  Core& c = *core_;
  if (c.stopped.load()) {
    MESH_WARN("relay: route service start() after stop(); make a new one");
    return ncclInternalError;
  }
  if (c.started.exchange(true)) return ncclSuccess;
  if (reactor_ == nullptr || !reactor_->running()) {
    c.started.store(false);
    MESH_WARN("relay: route service started without a running reactor (plugin shut down?)");
    return ncclInternalError;
  }
  c.recvFd = udpSocket(false, true);
  sockaddr_in any = ipv4SockAddr(INADDR_ANY, static_cast<uint16_t>(c.settings.udpPort));
  socklen_t len = sizeof(any);
  if (c.recvFd < 0 || bind(c.recvFd, reinterpret_cast<sockaddr*>(&any), len) != 0 ||
      getsockname(c.recvFd, reinterpret_cast<sockaddr*>(&any), &len) != 0) {
    int e = errno;
    c.closeAll(false);
    c.started.store(false);
    MESH_WARN("relay: cannot receive route HELLOs on UDP port %d: %s; another program holds the "
              "port without SO_REUSEADDR: free it or set NCCL_MESH_RELAY_PORT (the same on every node)",
              c.settings.udpPort, strerror(e));
    return ncclSystemError;
  }
  c.boundPort.store(ntohs(any.sin_port));
  for (size_t i = 0; i < c.ports.size(); ++i) {
    for (const LocalAddress& a : c.ports[i].addrs) {
      if (a.ip.prefixLen >= 32) continue;  // nobody else can be on a /32
      SendSocket s{i, a, udpSocket(true, false), false};
      sockaddr_in local = ipv4SockAddr(a.ip.addr, 0);
      if (s.fd < 0 || bind(s.fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) {
        // This address cannot announce us; the others still can, and we still listen.
        MESH_WARN("relay: no route HELLOs from %s on %s: %s", formatPrefix(a.ip).c_str(),
                  portLabel(c.ports[i]).c_str(), strerror(errno));
        if (s.fd >= 0) close(s.fd);
        continue;
      }
      c.senders.push_back(s);
    }
  }
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    for (const std::string& p : c.table.staticProblems()) MESH_WARN("relay: NCCL_MESH_ROUTES: %s", p.c_str());
  }
  for (uint32_t a : c.settings.dropHellosFrom) {
    MESH_INFO(NCCL_NET, "relay: test switch MESH_TEST_DROP_HELLOS_FROM: no HELLO is sent from %s",
              formatIpv4(a).c_str());
  }
  std::shared_ptr<Core> core = core_;
  bool posted = reactor_->post([core] {
    if (core->stopped.load()) return;  // stop()'s teardown, queued behind us, closes them
    int fd = core->recvFd;
    if (core->reactor->watch(fd, EPOLLIN, [core](uint32_t) { core->onReadable(); }) != ncclSuccess) {
      MESH_WARN("relay: route HELLOs are not received (the reactor cannot watch their socket)");
    }
    core->reactor->addTimer(std::chrono::milliseconds(core->settings.helloMs),
                            [core](Clock::time_point) { return core->tick(); });
    {
      std::lock_guard<std::mutex> lock(core->mutex);
      core->refreshOwnLocked();
    }
    core->afterChange();
    core->sendHellos();
  });
  if (!posted) {
    c.closeAll(false);
    c.started.store(false);
    MESH_WARN("relay: route service not started: the reactor is not running (plugin shut down?)");
    return ncclInternalError;
  }
  MESH_INFO(NCCL_NET,
            "relay: route discovery as node %s on UDP port %d, HELLOs every %d ms on %zu address(es)",
            nodeText(self_).c_str(), c.boundPort.load(), c.settings.helloMs, c.senders.size());
  return ncclSuccess;
}

void RouteService::stop() {
  std::shared_ptr<Core> core = core_;
  if (core->stopped.exchange(true) || !core->started.load()) return;
  if (reactor_->onReactorThread()) {
    core->closeAll(true);
    return;
  }
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> closed = done->get_future();
  if (!reactor_->postOrRun("the route service's close", [core, done] {
        core->closeAll(true);
        done->set_value();
      })) {
    return;  // the reactor had ended: closed here
  }
  if (closed.wait_for(kStopWait) != std::future_status::ready) {
    MESH_WARN("relay: the reactor did not close the route service's sockets within %lld s; "
              "they close when it gets to it",
              static_cast<long long>(std::chrono::seconds(kStopWait).count()));
  }
}

int RouteService::udpPort() const { return core_->boundPort.load(); }

NextHopResult RouteService::nextHops(const std::vector<HandleAddress>& peer) const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->table.nextHops(peer);
}

std::vector<std::string> RouteService::describe() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->table.describe();
}

NodeId RouteService::planNextHop(NodeId origin, const std::vector<HandleAddress>& target) const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  if (!core_->agreement.agree) return 0;
  const RoutePlan& plan = core_->topology.plan();
  NodeId dst = 0;
  for (const HandleAddress& a : target) dst = dst != 0 ? dst : plan.nodeOf(a.addr);
  if (dst == 0 || dst == self_) return 0;
  return plan.nextHop(self_, origin != 0 ? origin : self_, dst);
}

bool RouteService::settled() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  const Core& c = *core_;
  if (c.agreement.agree && c.closure.agree) return true;
  return c.pictureSinceMs != 0 && nowMs() - c.pictureSinceMs >= 2 * static_cast<uint64_t>(c.settings.helloMs);
}

PlanAgreement RouteService::closure() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->closure;
}

RoutePlan RouteService::plan() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->topology.plan();
}

PlanAgreement RouteService::agreement() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->agreement;
}

std::vector<TopologyRecord> RouteService::records() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->topology.records();
}

size_t RouteService::neighbourCount() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->table.neighbourCount();
}

std::vector<NeighbourLink> RouteService::neighbours() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->table.neighbours();
}

RouteServiceCounters RouteService::counters() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->counters;
}

// --- the reactor's side ----------------------------------------------------------------------

void RouteService::Core::closeAll(bool unwatch) {
  if (recvFd >= 0) {
    if (unwatch) reactor->unwatch(recvFd);
    close(recvFd);
    recvFd = -1;
  }
  for (SendSocket& s : senders) close(s.fd);
  senders.clear();
}

bool RouteService::Core::tick() {
  if (stopped.load()) return false;
  bool changed;
  {
    std::lock_guard<std::mutex> lock(mutex);
    uint64_t now = nowMs();
    changed = table.expire(now);
    changed = topology.expire(now) || changed;
    changed = refreshOwnLocked() || changed;
  }
  if (changed) afterChange();
  notePlan();
  sendHellos();
  return true;
}

// This node's own record: the addresses its HELLOs list and the nodes it hears now. Returns
// whether the plan changed. Caller holds `mutex`.
bool RouteService::Core::refreshOwnLocked() {
  std::vector<Ipv4Prefix> addrs;
  if (!ports.empty()) addrs = table.helloFor(ports.front().index).addrs;
  std::vector<NodeId> heard;
  for (const NeighbourLink& n : table.neighbours()) heard.push_back(n.node);
  bool changed = topology.setOwn(addrs, heard);
  noteAgreementLocked();
  return changed;
}

// agreement and closure from the view, and since when the picture has been as it is now.
// Caller holds `mutex`.
void RouteService::Core::noteAgreementLocked() {
  agreement = topology.agreement();
  closure = topology.closure();
  const RoutePlan& plan = topology.plan();
  auto now = std::make_tuple(plan.tableDigest, plan.topologyDigest, agreement.agree, agreement.node, closure.agree,
                             closure.node);
  if (now != picture || pictureSinceMs == 0) {
    picture = now;
    pictureSinceMs = nowMs();
  }
}

bool RouteService::Core::dropped(uint32_t localAddr) const {
  const std::vector<uint32_t>& drop = settings.dropHellosFrom;
  return std::find(drop.begin(), drop.end(), localAddr) != drop.end();
}

void RouteService::Core::sendHellos() {
  int port = boundPort.load();
  // One burst: every port's HELLO is built under one lock, with one record number, and the
  // records are sent as overflow when any port's HELLO would not fit one datagram.
  std::vector<RelayMessage> msgs(senders.size());
  {
    std::lock_guard<std::mutex> lock(mutex);
    uint64_t seq = std::max(lastSeq + 1, static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::system_clock::now().time_since_epoch()).count()));
    lastSeq = seq;
    // Whether the records fit is measured on the records themselves: measured on what was
    // last advertised, an overflow HELLO (no records: small) read as "fits" and the next
    // burst's full records as "does not", flipping every burst, and every other burst's
    // HELLO could not be encoded at all.
    bool was = topology.ownOverflow();
    topology.setOwnOverflow(false);
    HelloTopology mine = topology.advertise(seq);
    bool overflow = false;
    for (size_t i = 0; i < senders.size(); ++i) {
      msgs[i].type = RelayType::Hello;
      msgs[i].hello = table.helloFor(ports[senders[i].nic].index);
      overflow = overflow || relayHelloSize(msgs[i].hello, mine) > kRelayMaxHello;
    }
    topology.setOwnOverflow(overflow);
    if (overflow) mine = topology.advertise(seq);
    if (overflow != was) noteAgreementLocked();
    for (RelayMessage& m : msgs) m.topology = mine;
  }
  for (size_t i = 0; i < senders.size(); ++i) {
    SendSocket& s = senders[i];
    const LocalNic& nic = ports[s.nic];
    const RelayMessage& msg = msgs[i];
    if (dropped(s.addr.ip.addr)) continue;
    std::vector<uint8_t> bytes;
    std::string why;
    if (!encodeRelay(msg, &bytes, &why)) {
      // Only a table that breaks the codec's limits gets here; one WARN per socket.
      if (!s.failing) {
        MESH_WARN("relay: cannot encode the HELLO for %s: %s", portLabel(nic).c_str(), why.c_str());
      }
      s.failing = true;
      continue;
    }
    for (const sockaddr_in& to : settings.destinations(nic, s.addr, port)) {
      ssize_t n = sendto(s.fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
                         reinterpret_cast<const sockaddr*>(&to), sizeof(to));
      if (n == static_cast<ssize_t>(bytes.size())) {
        if (s.failing) {
          MESH_INFO(NCCL_NET, "relay: HELLOs from %s on %s are sent again",
                    formatIpv4(s.addr.ip.addr).c_str(), portLabel(nic).c_str());
        }
        s.failing = false;
        std::lock_guard<std::mutex> lock(mutex);
        ++counters.hellosSent;
        continue;
      }
      // A full socket buffer loses one HELLO of many: the next period repeats it.
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) continue;
      // A link that is down fails every period (ENETUNREACH): said once, until it works.
      if (!s.failing) {
        MESH_INFO(NCCL_NET, "relay: cannot send HELLOs from %s on %s to %s: %s (link down?); "
                  "retrying every %d ms quietly",
                  formatIpv4(s.addr.ip.addr).c_str(), portLabel(nic).c_str(),
                  formatIpv4(ntohl(to.sin_addr.s_addr)).c_str(), n < 0 ? strerror(errno) : "short send",
                  settings.helloMs);
      }
      s.failing = true;
    }
  }
}

void RouteService::Core::onReadable() {
  // One byte more than the largest message: a longer datagram is seen as such (MSG_TRUNC
  // returns its real length) instead of parsing as a cut-off one.
  uint8_t buf[kRelayMaxMessage + 1];
  for (int i = 0; i < kReadBurst && recvFd >= 0; ++i) {
    sockaddr_in from{};
    socklen_t fromLen = sizeof(from);
    ssize_t n = recvfrom(recvFd, buf, sizeof(buf), MSG_TRUNC, reinterpret_cast<sockaddr*>(&from), &fromLen);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        MESH_INFO(NCCL_NET, "relay: receiving route HELLOs failed: %s", strerror(errno));
      }
      return;
    }
    size_t wireLen = static_cast<size_t>(n);
    handleDatagram(ntohl(from.sin_addr.s_addr), buf, std::min(wireLen, sizeof(buf)), wireLen);
  }
}

void RouteService::Core::handleDatagram(uint32_t src, const uint8_t* data, size_t len, size_t wireLen) {
  // Our own broadcasts come back, and so do those of this node's other processes.
  if (isOwnAddress(src)) return;
  int port = portFor(src);
  if (port < 0) {
    std::lock_guard<std::mutex> lock(mutex);
    ++counters.foreign;
    return;
  }
  RelayMessage msg;
  std::string why;
  if (wireLen > kRelayMaxMessage) {
    why = std::to_string(wireLen) + " bytes, longer than any relay message";
  } else if (parseRelay(data, len, &msg, &why) && msg.type != RelayType::Hello) {
    why = "a relay message of type " + std::to_string(static_cast<int>(msg.type)) +
          " (only HELLOs come by UDP)";
  }
  if (!why.empty()) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++counters.malformed;
    }
    warnLimited(src, "relay: ignoring a datagram from " + formatIpv4(src) + " on " +
                         portLabel(*nicByIndex(port)) + " that is not a HELLO: " + why);
    return;
  }
  if (msg.hello.node == self) return;  // a process of this node whose address we lack
  bool accepted;
  bool viewChanged = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    uint64_t now = nowMs();
    accepted = table.onHello(port, msg.hello, now, &why);
    ++(accepted ? counters.hellosAccepted : counters.refused);
    if (accepted) {
      viewChanged = topology.onHello(msg.hello.node, msg.topology, now);
      viewChanged = refreshOwnLocked() || viewChanged;
    }
  }
  if (!accepted) {
    warnLimited(src, "relay: route " + why);
    return;
  }
  // Triggered update: a new neighbour, or a route that changed, is announced now, not a
  // period later, so a route N hops away is known in N round trips (NCCL connects right
  // after init) rather than N periods. An answer that changes nothing ends the exchange;
  // a lost link counts to at most NCCL_MESH_RELAY_MAX_HOPS. The same for the route plan's
  // records: a new picture or new digests travel at once; a renewed number does not.
  bool routesChanged = afterChange();
  notePlan();
  if (routesChanged || viewChanged) sendHellos();
}

// Logs the plan when it changes, and whether it is used: at once when views agree, after two
// HELLO periods when they disagree (a disagreement that short is nodes starting or a cable
// changing, bridged by the fallback rule, not news).
void RouteService::Core::notePlan() {
  RoutePlan plan;
  PlanAgreement now, closed;
  {
    std::lock_guard<std::mutex> lock(mutex);
    plan = topology.plan();
    now = agreement;
    closed = closure;
  }
  if (plan.tableDigest != loggedPlan && plan.nodes.size() > 1) {
    loggedPlan = plan.tableDigest;
    MESH_INFO(NCCL_NET, "relay: route plan of node %s: %zu node(s), topology %s, table %s, %zu relayed pair(s), "
              "%d..%d relayed pair(s) per cable direction, %zu unreachable",
              nodeText(self).c_str(), plan.nodes.size(), hex64(plan.topologyDigest).c_str(),
              hex64(plan.tableDigest).c_str(), plan.paths.size(), plan.minRelayed(), plan.maxRelayed(),
              plan.unreachable.size());
  }
  Clock::time_point t = Clock::now();
  if (now.agree) {
    disagreeSince = Clock::time_point{};
    disagreeLogged = false;
    if (plan.nodes.size() > 1 && loggedInUse != plan.tableDigest) {
      loggedInUse = plan.tableDigest;
      MESH_INFO(NCCL_NET, "relay: route plan in use: all %zu nodes agree (topology %s, table %s); relayed "
                "connects follow it%s%s", plan.nodes.size(), hex64(plan.topologyDigest).c_str(),
                hex64(plan.tableDigest).c_str(), closed.agree ? "" : " once the picture has settled: ",
                closed.why.c_str());
    }
    return;
  }
  if (disagreeSince == Clock::time_point{}) disagreeSince = t;
  if (disagreeLogged || t - disagreeSince < std::chrono::milliseconds(2 * settings.helloMs)) return;
  disagreeLogged = true;
  loggedInUse = 0;
  MESH_INFO(NCCL_NET, "relay: route plan views disagree: %s; relayed connects use the fallback rule (fewest "
            "relays, node id, idle port) until they agree", now.why.c_str());
}

// Logs what changed since the last call: neighbours that appeared or went, and the whole
// table when any line differs. Returns whether a neighbour appeared or a route changed.
bool RouteService::Core::afterChange() {
  std::vector<NeighbourLink> now;
  std::vector<std::string> lines;
  {
    std::lock_guard<std::mutex> lock(mutex);
    now = table.neighbours();
    lines = table.describe();
  }
  std::set<NeighbourLink> current(now.begin(), now.end());
  bool appeared = false;
  auto say = [this](const NeighbourLink& n, const char* what) {
    const LocalNic* nic = nicByIndex(n.localPort);
    MESH_INFO(NCCL_NET, "relay: neighbour node %s on %s (%s) %s", nodeText(n.node).c_str(),
              nic != nullptr ? portLabel(*nic).c_str() : "?", formatIpv4(n.linkAddr).c_str(), what);
  };
  for (const NeighbourLink& n : current) {
    if (known.count(n) == 0) {
      say(n, "appeared");
      appeared = true;
    }
  }
  for (const NeighbourLink& n : known) {
    if (current.count(n) == 0) say(n, "gone (silent or port down)");
  }
  known.swap(current);
  bool routesChanged = lines != lastLines;
  if (routesChanged) {
    MESH_INFO(NCCL_NET, "relay: route table of node %s, %zu route(s):", nodeText(self).c_str(), lines.size());
    for (const std::string& l : lines) MESH_INFO(NCCL_NET, "relay:   %s", l.c_str());
    lastLines.swap(lines);
  }
  return appeared || routesChanged;
}

void RouteService::Core::warnLimited(uint32_t src, const std::string& what) {
  Clock::time_point now = Clock::now();
  auto it = warned.find(src);
  if (it != warned.end() && now - it->second < kWarnEvery) return;
  if (it == warned.end() && warned.size() >= kWarnSourcesMax) {
    // Many senders (spoofed sources?): forget the quiet ones, or everyone if none is.
    for (auto w = warned.begin(); w != warned.end();) {
      w = now - w->second >= kWarnEvery ? warned.erase(w) : std::next(w);
    }
    if (warned.size() >= kWarnSourcesMax) warned.clear();
  }
  warned[src] = now;
  MESH_WARN("%s (said once a minute per sender)", what.c_str());
}

bool RouteService::Core::isOwnAddress(uint32_t addr) const {
  for (const LocalNic& nic : ports) {
    for (const LocalAddress& a : nic.addrs) {
      if (a.ip.addr == addr) return true;
    }
  }
  return false;
}

// The port whose subnet holds src, longest prefix first, as the kernel would route back.
int RouteService::Core::portFor(uint32_t src) const {
  int best = -1;
  int bestLen = -1;
  for (const LocalNic& nic : ports) {
    for (const LocalAddress& a : nic.addrs) {
      if (a.ip.prefixLen > bestLen && sameSubnet(a.ip.addr, src, a.ip.prefixLen)) {
        best = nic.index;
        bestLen = a.ip.prefixLen;
      }
    }
  }
  return best;
}

const LocalNic* RouteService::Core::nicByIndex(int index) const {
  for (const LocalNic& nic : ports) {
    if (nic.index == index) return &nic;
  }
  return nullptr;
}

}  // namespace mesh
