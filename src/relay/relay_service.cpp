// SPDX-License-Identifier: Apache-2.0
// The relay service at the middle node B (mesh/relay/relay_service.h).
#include "mesh/relay/relay_service.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mesh/platform/check.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/log.h"
#include "mesh/platform/thread_guard.h"
#include "mesh/relay/relay_proto.h"
#include "mesh/routing/subnet_routing.h"

namespace mesh {

namespace {
// At exit, how long links whose ends are closing get to end cleanly (RelayService::run).
// Longer than a link's receiver-gone grace: on a path of two relays the second relay's link,
// whose receiver closed, ends only when the first relay's forward closes or its grace has
// passed, and the first relay's ends only after that (fabric_e2e_patterns_ring8 under CPU
// load: both relays of 7 -> 4 still held the link when a 250 ms drain ran out).
constexpr std::chrono::milliseconds kExitDrain{kRelayReceiverGoneGraceMs + 500};
// While busy, how often the relay thread looks for new RELAY-OPEN connections.
constexpr std::chrono::microseconds kAcceptEvery{500};
}  // namespace

using Clock = std::chrono::steady_clock;

RelaySettings relaySettingsFrom(const Config& config) {
  RelaySettings s;
  s.port = config.relayPort;
  s.maxHops = config.relayMaxHops;
  s.geometry.depth = static_cast<uint32_t>(config.relayDepth);
  s.geometry.chunk = static_cast<uint32_t>(config.relayChunk);
  s.memCap = config.relayMem;
  s.timeoutMs = config.connectTimeoutMs;
  return s;
}

std::unique_ptr<Comm> RelayTransport::makeComm(bool sender) const {
  if (sender) return std::make_unique<RelayFwdComm>(disc_, settings_);
  return std::make_unique<RelayLegComm>(disc_, settings_, geometry_);
}

namespace {
// A relay's connect to C: its HELLO names the relayed connection's sender.
ConnOptions originOptions(uint32_t originAddr, int twinLeg) {
  ConnOptions o;
  o.originAddr = originAddr;
  o.twinLeg = twinLeg;
  return o;
}
}  // namespace

struct RelayService::Session {
  enum class State { Reading, Connecting, Accepting };
  int fd = -1;
  uint32_t peerAddr = 0;  // the OPEN's source address
  std::vector<uint8_t> in;
  RelayOpen open;
  State state = State::Reading;
  bool readable = true;  // Reading: poll() saw bytes (or an end) since the last read
  bool silent = false;   // test only: never read, closed without an answer at the deadline
  Clock::time_point deadline;
  std::shared_ptr<Connector> toC;         // C is cabled to us, or
  std::unique_ptr<RelayConnector> onward;  // through the next relay
  std::unique_ptr<PreparedConn> fwd;
  std::shared_ptr<Listener> legListener;
  size_t reserved = 0;  // ring bytes counted in memUsed_ for this open
  std::string target;   // C's addresses, for messages
};

RelayService::RelayService(const Discovery* disc, Reactor* reactor, CommSettings comm, HandshakeSettings hs,
                           RelaySettings s, NodeId self, RelayLookup lookup, void (*atExit)())
    : disc_(disc), reactor_(reactor), settings_(s), self_(self), lookup_(std::move(lookup)), atExit_(atExit) {
  transport_ = std::make_unique<RelayTransport>(disc, comm, s.geometry);
  hs_ = std::make_unique<Handshaker>(reactor, transport_.get(), hs);
  nics_ = transport_->localNics();
}

RelayService::~RelayService() { stop(); }

ncclResult_t RelayService::start() {
  if (thread_.joinable()) return ncclSuccess;
  stop_.store(false);
  pinLibrary();
  // Bound before the route service announces us: a neighbour that learned a route through
  // this node finds the port open (unless another process of the node serves it).
  bindListeners(&listenFds_);
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::exception& e) {
    MESH_WARN("relay: cannot start its thread: %s", e.what());
    for (int fd : listenFds_) close(fd);  // nobody would serve the port
    listenFds_.clear();
    return ncclSystemError;
  }
  return ncclSuccess;
}

void RelayService::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  thread_.join();
}

void RelayService::abandon() {
  abandon_.store(true);
  stop();
}

// All of the node's mesh addresses or none: a relay that answers on some links only would
// be chosen by neighbours it then cannot serve consistently.
void RelayService::bindListeners(std::vector<int>* fds) {
  for (const LocalNic& nic : nics_) {
    for (const LocalAddress& a : nic.addrs) {
      int fd = newTcpSocket();
      int one = 1;
      sockaddr_in sa = ipv4SockAddr(a.ip.addr, static_cast<uint16_t>(settings_.port));
      if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
          bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(fd, 64) != 0) {
        int err = errno;
        if (fd >= 0) close(fd);
        for (int f : *fds) close(f);
        fds->clear();
        if (serving_.exchange(false) || err != EADDRINUSE) {
          MESH_INFO(NCCL_INIT | NCCL_NET, "relay: not serving: port %d on %s: %s%s", settings_.port,
                    formatIpv4(a.ip.addr).c_str(), strerror(err),
                    err == EADDRINUSE ? " (another process of this node serves)" : "");
        }
        return;
      }
      fds->push_back(fd);
    }
  }
  serving_.store(true);
  size_t ring = settings_.geometry.ringBytes();
  MESH_INFO(NCCL_INIT | NCCL_NET,
            "relay: serving on port %d of %zu mesh address(es); staging memory for %zu relayed connections "
            "(NCCL_MESH_RELAY_MEM=%zu bytes, %zu each)",
            settings_.port, fds->size(), ring == 0 ? size_t{0} : settings_.memCap / ring, settings_.memCap, ring);
}

void RelayService::acceptSessions(int lfd) {
  for (;;) {
    sockaddr_in sa{};
    socklen_t len = sizeof(sa);
    int fd = accept4(lfd, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    makeRoom();
    auto s = std::make_unique<Session>();
    s->fd = fd;
    s->silent = testSilent();
    s->peerAddr = ntohl(sa.sin_addr.s_addr);
    s->deadline = Clock::now() + std::chrono::milliseconds(settings_.timeoutMs);
    sessions_.push_back(std::move(s));
  }
}

// Test-only (MESH_TEST_RELAY_SILENT_DIR, fabric_e2e_relay_faults_silent_relay): while the file
// relay-silent.<pid> exists there, new requests are taken and never answered, as by a stopped
// relay process whose kernel still completes the TCP handshake.
bool RelayService::testSilent() {
  static const char* dir = getenv("MESH_TEST_RELAY_SILENT_DIR");
  if (dir == nullptr) return false;
  std::string file = std::string(dir) + "/relay-silent." + std::to_string(getpid());
  return access(file.c_str(), F_OK) == 0;
}

// Only connections that have not sent their OPEN yet are bounded (the others hold staging
// memory, which NCCL_MESH_RELAY_MEM bounds). The oldest goes, after every one was read once:
// an OPEN may already sit unread in a socket buffer.
void RelayService::makeRoom() {
  auto reading = [this] {
    return static_cast<size_t>(std::count_if(sessions_.begin(), sessions_.end(), [](const auto& s) {
      return s->state == Session::State::Reading;
    }));
  };
  if (reading() < settings_.maxPending) return;
  stepSessions(/*readingOnly=*/true);
  if (reading() < settings_.maxPending) return;
  auto oldest = std::find_if(sessions_.begin(), sessions_.end(),
                             [](const auto& s) { return s->state == Session::State::Reading; });
  if (oldest == sessions_.end()) return;  // maxPending 0: nothing to make room in
  uint32_t peer = (*oldest)->peerAddr;
  if (evicted_++ == 0) {
    MESH_WARN("relay: %zu connections to port %d have not sent a request; closed the oldest (from %s), and will "
              "close the oldest again whenever more come (a port scan, or a misbehaving peer?)",
              settings_.maxPending, settings_.port, formatIpv4(peer).c_str());
  } else {
    MESH_INFO(NCCL_NET, "relay: closed the oldest of %zu connections that sent no request (from %s; %llu so far)",
              settings_.maxPending, formatIpv4(peer).c_str(), static_cast<unsigned long long>(evicted_));
  }
  close((*oldest)->fd);
  sessions_.erase(oldest);
}

void RelayService::replyError(Session& s, RelayStatus status, const std::string& reason) {
  MESH_INFO(NCCL_NET, "relay: refused %s's request for %s: %s: %s", formatIpv4(s.peerAddr).c_str(), s.target.c_str(),
            relayStatusName(status), reason.c_str());
  // The cap is this node's setting, and the jobs whose connects it refuses are other nodes':
  // this node's log says so once, where the setting would be raised.
  if (status == RelayStatus::NoMemory && !memCapWarned_) {
    memCapWarned_ = true;
    MESH_WARN("relay: staging memory is full (%s); relayed connects through this node are refused: raise "
              "NCCL_MESH_RELAY_MEM here (further refusals are INFO)", reason.c_str());
  }
  RelayMessage m;
  m.type = RelayType::OpenReply;
  m.reply.request = s.open.request;
  m.reply.status = status;
  m.reply.reason = reason.substr(0, kRelayMaxReason);
  std::vector<uint8_t> bytes;
  std::string error;
  // One short message into an empty socket buffer: a non-blocking send takes it whole.
  if (encodeRelay(m, &bytes, &error)) (void)!send(s.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

// false: the session is over (its resources released or handed to a link).
bool RelayService::stepSession(Session& s) {
  auto end = [&](RelayStatus status, const std::string& reason) {
    if (s.state != Session::State::Accepting) replyError(s, status, reason);
    return false;
  };
  if (Clock::now() > s.deadline) {
    return end(RelayStatus::PeerRefused, "timed out after " + std::to_string(settings_.timeoutMs) +
                                             " ms (NCCL_MESH_CONNECT_TIMEOUT_MS)");
  }
  switch (s.state) {
    case Session::State::Reading: {
      uint8_t buf[kRelayMaxMessage];
      ssize_t n = recv(s.fd, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
      if (n > 0) s.in.insert(s.in.end(), buf, buf + n);
      std::string error;
      long need = relayMessageLength(s.in.data(), s.in.size(), &error);
      if (need < 0) return end(RelayStatus::BadRequest, error);
      if (need == 0 || s.in.size() < static_cast<size_t>(need)) return true;
      RelayMessage m;
      if (!parseRelay(s.in.data(), static_cast<size_t>(need), &m, &error)) return end(RelayStatus::BadRequest, error);
      if (m.type != RelayType::Open) return end(RelayStatus::BadRequest, "expected RELAY-OPEN");
      s.open = m.open;
      // The relayed connection's sender: as the OPEN names it, else (a sender that does not
      // say) the address the OPEN came from, which is the sender's when we are its first relay.
      if (s.open.originAddr == 0) s.open.originAddr = s.peerAddr;
      for (const HandleAddress& a : s.open.target.addrs) {
        s.target += (s.target.empty() ? "" : ",") + formatIpv4(a.addr);
      }
      RouteResult route = connectRoutes(nics_, s.open.target.addrs, kMaxLinks);
      if (!route.ok()) {
        if (s.open.hopBudget <= 1) {
          return end(RelayStatus::HopBudget, "the target is not cabled to this relay (" + route.error +
                                                 ") and the path may not take another relay "
                                                 "(NCCL_MESH_RELAY_MAX_HOPS on the first node)");
        }
        for (NodeId v : s.open.visited) {
          if (v == self_) return end(RelayStatus::Loop, "this relay is already on the path");
        }
      }
      size_t ring = settings_.geometry.ringBytes();
      size_t used = memUsed_.load();
      if (used + ring > settings_.memCap) {
        return end(RelayStatus::NoMemory, "NCCL_MESH_RELAY_MEM=" + std::to_string(settings_.memCap) + " bytes: " +
                                              std::to_string(used) + " in use, a connection needs " +
                                              std::to_string(ring));
      }
      memUsed_ += ring;
      s.reserved = ring;
      if (!route.ok()) {
        // Ask the next relay as A asked us; what comes back is an ordinary send comm to its
        // leg, spliced like a direct one (its FIFO slots name its ring: RelayFwdComm).
        RelayConnectSettings cs;
        cs.port = settings_.port;
        cs.maxHops = s.open.hopBudget - 1;
        cs.timeoutMs = settings_.timeoutMs;
        cs.self = self_;
        cs.origin = s.open.origin;
        cs.originAddr = s.open.originAddr;
        cs.visited = s.open.visited;
        cs.visited.push_back(self_);
        std::vector<NodeId> exclude = cs.visited;
        exclude.push_back(s.open.origin);
        // The next relay is the one the route plan gives the original pair (A, C), so a
        // path of several relays is the plan's from end to end.
        RelayLookup lookup = lookup_;
        std::vector<HandleAddress> addrs = s.open.target.addrs;
        NodeId origin = s.open.origin;
        s.onward = std::make_unique<RelayConnector>(
            hs_.get(), nics_, s.open.target,
            [lookup, addrs, origin, exclude](bool mayWait) { return lookup(addrs, origin, exclude, mayWait); },
            originOptions(0, s.open.twinLeg), cs);
      } else if (hs_->startConnect(s.open.target, route.routes, originOptions(s.open.originAddr, s.open.twinLeg), &s.toC) !=
                 ncclSuccess) {
        return end(RelayStatus::PeerRefused, "cannot start the connection to the target (see the relay's log)");
      }
      s.state = Session::State::Connecting;
      return true;
    }
    case Session::State::Connecting: {
      // The requester hung up before our answer (its wait for this relay ran out, or its
      // two-relay attempt ended): stop building a connection to C that nobody will use, and
      // free its staging memory now rather than at the deadline. (After the answer A closes
      // this socket as a rule, so only here does a close mean that.)
      char probe;
      ssize_t peeked = recv(s.fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
      if (peeked == 0 || (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        MESH_INFO(NCCL_NET, "relay: %s gave up its request for %s before the answer; dropped",
                  formatIpv4(s.peerAddr).c_str(), s.target.c_str());
        return false;
      }
      ncclResult_t r = s.onward != nullptr ? s.onward->poll(&s.fwd) : hs_->pollConnect(s.toC, &s.fwd);
      if (r != ncclSuccess) {
        if (s.onward != nullptr) {
          MESH_INFO(NCCL_NET, "relay: no next relay took the hop to %s for a connection this node relays%s",
                    s.target.c_str(), s.onward->tried().c_str());
        }
        return end(RelayStatus::PeerRefused, std::string(s.onward != nullptr ? "no next relay took it"
                                                                              : "the target refused or did not answer") +
                                                 " (see the relay's log)");
      }
      if (s.fwd == nullptr) return true;
      if (s.onward != nullptr) {
        // Not a connection of this process (its first node counts it and WARNs): INFO only.
        MESH_INFO(NCCL_INIT | NCCL_NET, "relay: next hop to %s via %s (%s) for a connection this node relays",
                  s.target.c_str(), s.onward->via().c_str(), s.onward->rule().c_str());
      }
      s.toC.reset();
      s.onward.reset();
      Handle leg;
      if (hs_->listen(&s.legListener, &leg) != ncclSuccess) return end(RelayStatus::PeerRefused, "cannot listen for the leg");
      RelayMessage m;
      m.type = RelayType::OpenReply;
      m.reply.request = s.open.request;
      m.reply.status = RelayStatus::Ok;
      m.reply.hops = 1;
      m.reply.leg = leg;
      std::vector<uint8_t> bytes;
      std::string error;
      if (!encodeRelay(m, &bytes, &error) ||
          send(s.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
        return end(RelayStatus::BadRequest, "cannot answer: " + error);
      }
      s.state = Session::State::Accepting;
      return true;
    }
    case Session::State::Accepting: {
      std::unique_ptr<PreparedConn> legConn;
      if (hs_->pollAccept(s.legListener, &legConn) != ncclSuccess) return false;
      if (legConn == nullptr) return true;
      auto* leg = static_cast<RelayLegComm*>(legConn.get());
      auto* fwd = static_cast<RelayFwdComm*>(s.fwd.get());
      if (fwd->registerRing(leg->ring(), leg->geometry().ringBytes(), leg->geometry().chunk) != ncclSuccess) {
        hs_->closeControl(leg->control);
        return false;
      }
      // Live counters: both comms count into one forwarded flow (origin -> C); the leg
      // counts what arrived, the hop what went on; the leg counts the connection.
      uint32_t dest = s.open.target.addrs.empty() ? fwd->peerAddr() : nodeAddress(s.open.target.addrs);
      leg->countAs(stats::FlowKind::Forwarded, dest, 0, s.open.originAddr);
      fwd->countAs(stats::FlowKind::Forwarded, dest, 0, s.open.originAddr);
      leg->markOpen();
      std::string name = formatIpv4(s.peerAddr) + " -> " + s.target;
      legConn.release();
      s.fwd.release();
      links_.push_back(std::make_unique<RelayLink>(std::unique_ptr<RelayLegComm>(leg),
                                                   std::unique_ptr<RelayFwdComm>(fwd), name));
      s.reserved = 0;  // the link holds it now
      liveLinks_.fetch_add(1);
      ++relayedTotal_;
      // From the first link on, the relay's links end cleanly at exit, before the verbs
      // provider they use is finalized (the owner's exit shutdown; atexit takes no loader
      // lock). A process that never relayed has none to end: the library destructor stops it.
      if (!exitHandlerSet_ && pinned_ && atExit_ != nullptr) {
        atexit(atExit_);
        exitHandlerSet_ = true;
      }
      MESH_INFO(NCCL_INIT | NCCL_NET, "relay: relaying %s (ring %u x %u bytes; %zu connection(s) relayed by this node)",
                name.c_str(), leg->geometry().depth, leg->geometry().chunk, liveLinks_.load());
      return false;
    }
  }
  return false;
}

void RelayService::endLink(std::unique_ptr<RelayLink> link, const std::string& why) {
  if (link->closedCleanly()) {
    MESH_INFO(NCCL_NET, "relay: connection %s closed: %s (%llu bytes relayed)", link->name().c_str(), why.c_str(),
              static_cast<unsigned long long>(link->bytesRelayed()));
  } else {
    MESH_WARN("relay: connection %s ended: %s; both ends see their peer gone", link->name().c_str(), why.c_str());
  }
  hs_->closeControl(link->leg()->control);
  hs_->closeControl(link->fwd()->control);
  memUsed_ -= link->ringBytes();
  liveLinks_.fetch_sub(1);
  link.reset();
}

// NCCL dlcloses the plugin when this node's last communicator ends; connections of other
// nodes through this one must not end with it, so a process that may relay keeps the library
// until it exits. Taken at start, on NCCL's thread: dladdr and dlopen take the loader's lock,
// which dlclose holds while it runs the library destructor, and that destructor joins the
// relay thread; pinned from the relay thread at its first link (as it once was), a dlclose at
// that moment deadlocked NCCL's thread.
void RelayService::pinLibrary() {
  if (pinned_) return;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&relaySettingsFrom), &info) == 0 || info.dli_fname == nullptr) return;
  void* self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  if (self == nullptr) return;  // not a shared library (unit tests link the core statically)
  pinned_ = true;
  MESH_INFO(NCCL_INIT | NCCL_NET, "relay: %s stays loaded until the process exits (NCCL_MESH_RELAY=auto: other "
            "nodes' connections may go through this process)",
            info.dli_fname);
}

bool RelayService::stepSessions(bool readingOnly) {
  bool ended = false;
  Clock::time_point now = Clock::now();
  for (size_t i = 0; i < sessions_.size();) {
    Session& s = *sessions_[i];
    bool reading = s.state == Session::State::Reading;
    bool wait = reading && now <= s.deadline && (s.silent || (!readingOnly && !s.readable));
    if ((readingOnly && !reading) || wait) {
      ++i;
      continue;
    }
    s.readable = false;
    // A request whose step throws (std::bad_alloc) is ended like a failed one (logged).
    bool keep = false;
    if (!s.silent) runGuarded("mesh-relay", "a relay request", [&] { keep = stepSession(s); });
    if (keep) {
      ++i;
      continue;
    }
    if (s.toC != nullptr) hs_->discardConnect(s.toC);
    if (s.fwd != nullptr) hs_->closeControl(s.fwd->control);
    if (s.legListener != nullptr) hs_->closeListener(s.legListener);
    memUsed_ -= s.reserved;
    close(s.fd);
    sessions_.erase(sessions_.begin() + static_cast<long>(i));
    ended = true;
  }
  return ended;
}

bool RelayService::stepLinks() {
  bool active = false;
  for (size_t i = 0; i < links_.size();) {
    bool moved = false;
    ncclResult_t r = ncclInternalError;
    // A connection whose step throws is ended like a failed one (logged).
    bool stepped = runGuarded("mesh-relay", "a relayed connection", [&] { r = links_[i]->step(&moved); });
    active = active || moved;
    if (r == ncclSuccess) {
      ++i;
      continue;
    }
    std::string why = stepped ? links_[i]->failureText() : "an exception in the relay thread (the WARN before)";
    endLink(std::move(links_[i]), why);
    links_.erase(links_.begin() + static_cast<long>(i));
  }
  return active;
}

void RelayService::run() {
  pthread_setname_np(pthread_self(), "mesh-relay");
  std::vector<int> lfds;
  lfds.swap(listenFds_);
  auto lastBind = Clock::now();
  auto lastWork = Clock::now();
  auto lastAccept = Clock::time_point();
  std::vector<pollfd> pfds;
  while (!stop_.load(std::memory_order_acquire)) {  // acquire: abandon_, stored before stop_, is read below
    // One round; one that throws (std::bad_alloc) is logged and the next round goes on.
    runGuarded("mesh-relay", "a round", [&] {
      auto now = Clock::now();
      if (lfds.empty() && now - lastBind > std::chrono::seconds(2)) {
        bindListeners(&lfds);
        lastBind = now;
      }
      // A session building a connection is polled every round; one still waiting for its OPEN
      // (which may never come: a port scan, a half-open socket) is read when poll() says so.
      bool building = std::any_of(sessions_.begin(), sessions_.end(),
                                  [](const auto& s) { return s->state != Session::State::Reading; });
      bool spin = building || now - lastWork < std::chrono::milliseconds(50);
      // Idle: sleep in poll (1 ms) so an idle relay costs nothing. Busy: never sleep, and look
      // at the listeners once per kAcceptEvery, not on every round: the rounds are what moves
      // relayed data, and a syscall per round took a tenth of the relay thread's time.
      if (!spin || now - lastAccept >= kAcceptEvery) {
        lastAccept = now;
        pfds.clear();
        for (int fd : lfds) pfds.push_back(pollfd{fd, POLLIN, 0});
        std::vector<Session*> reading;
        for (const auto& s : sessions_) {
          if (s->state != Session::State::Reading || s->silent) continue;
          pfds.push_back(pollfd{s->fd, POLLIN, 0});
          reading.push_back(s.get());
        }
        int ready = poll(pfds.data(), pfds.size(), spin ? 0 : 1);
        if (ready > 0) {
          for (size_t i = 0; i < reading.size(); ++i) {
            if (pfds[lfds.size() + i].revents != 0) reading[i]->readable = true;
          }
          for (size_t i = 0; i < lfds.size(); ++i) {
            if (pfds[i].revents & POLLIN) acceptSessions(pfds[i].fd);
          }
        }
      }
      bool active = stepSessions(/*readingOnly=*/false);
      active = stepLinks() || active;
      if (active) {
        lastWork = now;  // this round's start: close enough for a 50 ms idle threshold
      } else if (spin) {
        // A round with nothing to do gives the core away once, as NCCL's proxy does: on a
        // host with fewer cores than busy threads (or a 1-vCPU guest whose NIC is a kernel
        // thread) a relay that never yields delays the very completions it waits for.
        sched_yield();
      }
    });
  }
  if (abandon_.load()) {
    // Exit: no verbs call (see abandon()); sockets and memory go with the process.
    for (auto& l : links_) (void)l.release();
    for (auto& s : sessions_) (void)s.release();
    links_.clear();
    sessions_.clear();
    for (int fd : lfds) close(fd);
    return;
  }
  for (auto& s : sessions_) {
    if (s->toC != nullptr) hs_->discardConnect(s->toC);
    if (s->fwd != nullptr) hs_->closeControl(s->fwd->control);
    if (s->legListener != nullptr) hs_->closeListener(s->legListener);
    close(s->fd);
  }
  sessions_.clear();
  // A job ends on every node at about the same time: the ends of most links are closing
  // their comms right now. Their closes get a moment to arrive (bounded), so that only
  // connections still in use are reported as cut.
  auto drainEnd = Clock::now() + kExitDrain;
  while (!links_.empty() && Clock::now() < drainEnd) {
    bool active = false;
    runGuarded("mesh-relay", "the exit drain", [&] { active = stepLinks(); });
    if (!active) usleep(200);
  }
  for (auto& l : links_) endLink(std::move(l), "the relay service is stopping (process exit)");
  links_.clear();
  for (int fd : lfds) close(fd);
  memUsed_.store(0);
  serving_.store(false);
}

}  // namespace mesh
