// SPDX-License-Identifier: Apache-2.0
// Handshake engine (see handshake.h). Everything below the public methods runs on the
// reactor thread.
#include "mesh/connect/handshake.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "mesh/platform/check.h"
#include "mesh/platform/log.h"
#include "mesh/routing/subnet_routing.h"

namespace mesh {

using Clock = Reactor::Clock;

// --- shared state ------------------------------------------------------------------------

struct PendingAccept {
  enum class Stage { Hello, Parked, WaitReady };
  int fd = -1;
  Stage stage = Stage::Hello;
  Clock::time_point deadline;
  std::vector<uint8_t> inbuf;
  HsMessage hello;
  std::vector<Route> routes;
  std::unique_ptr<PreparedConn> conn;
  std::string peer;
  bool authenticated = false;  // its HELLO carried the listener's token: a connect meant for it
};

class Listener {
 public:
  // Immutable after Handshaker::listen.
  uint64_t token = 0;
  uint16_t port = 0;
  std::vector<int> fds;
  std::vector<LocalNic> nics;
  // Reactor thread only.
  std::vector<std::shared_ptr<PendingAccept>> pending;
  std::shared_ptr<PendingAccept> inflight;
  bool closed = false;
  Clock::time_point lastRefusalLog;
  int refusalsSinceLog = 0;
  // Cross-thread.
  std::mutex mutex;                                  // guards ready and the failure below
  std::deque<std::unique_ptr<PreparedConn>> ready;   // pushed by the reactor, popped by accept
  // Why the last connect meant for this listener (its token) failed on this side; empty when
  // none did, or another has arrived since. accept() reports it once nobody can still be
  // trying (see Handshaker::pollAccept).
  std::string failure;
  ncclResult_t failureCode = ncclSystemError;
  Clock::time_point failedAt;
  bool failureReported = false;
  // The failure is a descriptor shortage on one of its sockets: a connection may wait in the
  // kernel's queue that it cannot take. Taking any connection ends it.
  bool failureIsShortage = false;
  std::atomic<bool> acceptWanted{false};             // set by accept(), cleared by the reactor
};

class Connector {
 public:
  enum State : int { kPending = 0, kReady = 1, kFailed = 2 };
  enum class Step { Connect, WaitAccept };
  // Immutable after startConnect.
  Handle handle;
  std::vector<Route> routes;
  ConnOptions opts;
  Clock::time_point deadline;        // the TCP connect and the HELLO
  Clock::time_point acceptDeadline;  // the peer's ACCEPT (acceptWait)
  std::string peer;  // "198.18.0.2:41234"
  // Reactor thread only.
  int fd = -1;
  Step step = Step::Connect;
  std::vector<uint8_t> inbuf;
  std::unique_ptr<PreparedConn> conn;
  size_t helloLinks = 0;  // links our HELLO offered: the transport may use fewer than `routes`
  // Published to NCCL's thread: result/error are written before state (release).
  std::atomic<int> state{kPending};
  std::atomic<bool> awaitingAccept{false};  // its HELLO is out: the step that may last acceptWait
  std::string error;
  ncclResult_t errorCode = ncclSystemError;
  std::unique_ptr<PreparedConn> result;
};

int newTcpSocket() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

std::chrono::milliseconds acceptWait(const HandshakeSettings& s) {
  return std::chrono::milliseconds(std::max(s.timeoutMs, s.acceptWaitMs));
}

void closeStream(int fd) {
  if (fd < 0) return;
  (void)shutdown(fd, SHUT_WR);
  char buf[4096];
  // Bounded: what a peer that keeps writing sends past this is its own reset to read.
  for (int i = 0; i < 16 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; ++i) {
  }
  close(fd);
}

namespace {

// A peer that vanishes without closing its socket (host down, link down, cable pulled) sends
// no FIN: TCP keepalive turns its silence into ETIMEDOUT after about `timeoutMs`. Probing
// starts after half of it, then four probes share the rest; TCP_USER_TIMEOUT bounds the
// whole wait (and any unacknowledged data). 0 disables it; the floor is 1 s. Best effort:
// a failure is logged.
void armKeepalive(int fd, int timeoutMs, const std::string& peer) {
  if (timeoutMs <= 0) return;
  timeoutMs = std::max(timeoutMs, 1000);  // keepalive counts whole seconds
  int on = 1;
  int idle = std::max(1, timeoutMs / 2000);
  int count = 4;
  int interval = std::max(1, timeoutMs / 2000 / count);
  unsigned user = static_cast<unsigned>(timeoutMs);
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof(user)) != 0) {
    MESH_WARN("cannot enable keepalive on the connection to %s: %s; a silently vanished peer "
              "is then only detected through its QPs", peer.c_str(), strerror(errno));
  }
}

const char* stepName(Connector::Step s) {
  return s == Connector::Step::Connect ? "the TCP connect" : "the peer's ACCEPT (has it called accept?)";
}

uint64_t randomToken() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    std::random_device rd;
    v = (uint64_t{rd()} << 32) ^ rd();
  }
  return v;
}

// Messages are at most kHsMaxMessage bytes and each side sends one message per step into
// an otherwise idle socket, so one send() normally takes it whole; a short write is
// reported as an error rather than buffered.
bool sendMessage(int fd, const HsMessage& msg, std::string* error) {
  std::vector<uint8_t> bytes;
  if (!encodeHandshake(msg, &bytes, error)) return false;
  ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  if (n == static_cast<ssize_t>(bytes.size())) return true;
  *error = n < 0 ? std::string("send failed: ") + strerror(errno) : "short send";
  return false;
}

// Reads what is available. Returns 1 with *msg when a whole message arrived, 0 when more
// is needed, -1 on a protocol error (*error set), -2 when the peer closed the socket.
int readMessage(int fd, std::vector<uint8_t>* buf, HsMessage* msg, std::string* error) {
  for (;;) {
    long need = handshakeLength(buf->data(), buf->size(), error);
    if (need < 0) return -1;
    size_t want = need == 0 ? kHsHeaderSize : static_cast<size_t>(need);
    if (need > 0 && buf->size() >= want) {
      bool ok = parseHandshake(buf->data(), want, msg, error);
      buf->erase(buf->begin(), buf->begin() + static_cast<long>(want));
      return ok ? 1 : -1;
    }
    size_t old = buf->size();
    buf->resize(want);
    ssize_t n = recv(fd, buf->data() + old, want - old, 0);
    if (n <= 0) {
      buf->resize(old);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
      if (n < 0) *error = strerror(errno);
      return -2;
    }
    buf->resize(old + static_cast<size_t>(n));
  }
}

void closeFd(Reactor* reactor, int* fd) {
  if (*fd < 0) return;
  reactor->unwatch(*fd);
  closeStream(*fd);
  *fd = -1;
}

std::string peerOf(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "?";
  return formatIpv4(ntohl(sa.sin_addr.s_addr)) + ":" + std::to_string(ntohs(sa.sin_port));
}

}  // namespace

// --- listener side -------------------------------------------------------------------------

namespace {

// A refused or broken handshake attempt: logged at most once a second per listener, so a
// port scanner cannot flood NCCL's log.
void logRefusal(Listener* l, const std::string& peer, const std::string& why) {
  Clock::time_point now = Clock::now();
  if (now - l->lastRefusalLog < std::chrono::seconds(1)) {
    ++l->refusalsSinceLog;
    return;
  }
  MESH_WARN("handshake from %s on port %u refused: %s%s", peer.c_str(), l->port, why.c_str(),
            l->refusalsSinceLog > 0
                ? (" (" + std::to_string(l->refusalsSinceLog) + " more refusals not shown)").c_str()
                : "");
  l->refusalsSinceLog = 0;
  l->lastRefusalLog = now;
}

void dropPending(Handshaker* hs, Listener* l, const std::shared_ptr<PendingAccept>& pa) {
  closeFd(hs->reactor(), &pa->fd);
  pa->conn.reset();
  if (l->inflight == pa) l->inflight.reset();
  for (size_t i = 0; i < l->pending.size(); ++i) {
    if (l->pending[i] == pa) {
      l->pending.erase(l->pending.begin() + static_cast<long>(i));
      break;
    }
  }
}

// Another connect meant for this listener (its HELLO read) is waiting for accept() or
// finishing: what happens to that one decides, whatever failed beside it.
bool holdsLiveConnect(const Listener* l, const PendingAccept* except) {
  for (const auto& pa : l->pending) {
    if (pa.get() != except && pa->authenticated && pa->stage != PendingAccept::Stage::Hello) return true;
  }
  return false;
}

// A connect meant for this listener ended without a connection: accept() reports it if no
// other follows (a relayed connect tries its next relay with the same token).
void noteFailed(Listener* l, const std::shared_ptr<PendingAccept>& pa, const std::string& why, ncclResult_t code) {
  if (!pa->authenticated || l->closed || holdsLiveConnect(l, pa.get())) return;
  std::lock_guard<std::mutex> lock(l->mutex);
  l->failure = "the connection from " + pa->peer + " failed on this side: " + why;
  l->failureCode = code;
  l->failedAt = Clock::now();
  l->failureIsShortage = false;
}

void refuse(Handshaker* hs, Listener* l, const std::shared_ptr<PendingAccept>& pa,
            const std::string& why, ncclResult_t code = ncclRemoteError) {
  logRefusal(l, pa->peer, why);
  noteFailed(l, pa, why, code);
  HsMessage reject;
  reject.type = HsType::Reject;
  reject.token = l->token;
  reject.reason = why.substr(0, kHsMaxReason);
  std::string ignored;
  sendMessage(pa->fd, reject, &ignored);
  dropPending(hs, l, pa);
}

void maybeProcess(Handshaker* hs, const std::shared_ptr<Listener>& l);

void onHello(Handshaker* hs, const std::shared_ptr<Listener>& l,
             const std::shared_ptr<PendingAccept>& pa, const HsMessage& msg) {
  if (msg.type != HsType::Hello) return refuse(hs, l.get(), pa, "expected HELLO");
  if (msg.token != l->token) return refuse(hs, l.get(), pa, "wrong token (stale or forged handle)");
  pa->authenticated = true;
  {
    std::lock_guard<std::mutex> lock(l->mutex);
    l->failure.clear();  // a newer attempt: what happens to it decides
    l->failureIsShortage = false;
  }
  RouteResult route = acceptRoutes(l->nics, msg.links);
  if (!route.ok()) return refuse(hs, l.get(), pa, route.error, ncclSystemError);
  pa->routes = std::move(route.routes);
  pa->hello = msg;
  pa->stage = PendingAccept::Stage::Parked;
  // It waits for NCCL's accept(), which may come late (NCCL exchanges every peer's handle
  // before it connects or accepts, so this rank may be waiting for a slower one): as long as
  // NCCL_MESH_ACCEPT_WAIT_MS while its connector is alive; keepalive notices a vanished one.
  pa->deadline = Clock::now() + acceptWait(hs->settings());
  armKeepalive(pa->fd, hs->settings().peerTimeoutMs, pa->peer);
  maybeProcess(hs, l);
}

void onReady(Handshaker* hs, const std::shared_ptr<Listener>& l,
             const std::shared_ptr<PendingAccept>& pa) {
  hs->adoptControl(&pa->fd, pa->conn.get(), pa->peer);
  {
    std::lock_guard<std::mutex> lock(l->mutex);
    l->ready.push_back(std::move(pa->conn));
  }
  l->acceptWanted.store(false, std::memory_order_release);
  dropPending(hs, l.get(), pa);
}

void onPendingEvent(Handshaker* hs, const std::shared_ptr<Listener>& l,
                    const std::shared_ptr<PendingAccept>& pa) {
  HsMessage msg;
  std::string error;
  int rc = readMessage(pa->fd, &pa->inbuf, &msg, &error);
  if (rc == 0) return;
  if (rc == -2) {
    if (pa->stage != PendingAccept::Stage::Hello) logRefusal(l.get(), pa->peer, "peer closed the connection mid-handshake");
    noteFailed(l.get(), pa, "the peer closed the connection mid-handshake", ncclRemoteError);
    return dropPending(hs, l.get(), pa);
  }
  if (rc == -1) return refuse(hs, l.get(), pa, error);
  switch (pa->stage) {
    case PendingAccept::Stage::Hello: return onHello(hs, l, pa, msg);
    case PendingAccept::Stage::WaitReady:
      if (msg.type == HsType::Ready && msg.token == l->token) return onReady(hs, l, pa);
      return refuse(hs, l.get(), pa, "expected READY");
    case PendingAccept::Stage::Parked: return refuse(hs, l.get(), pa, "unexpected message before ACCEPT");
  }
}

// Answers the oldest parked HELLO once NCCL has asked for a connection (accept), so a
// connect completes only when the peer really accepts — as with NCCL's own transports.
void maybeProcess(Handshaker* hs, const std::shared_ptr<Listener>& l) {
  while (!l->closed && l->inflight == nullptr && l->acceptWanted.load(std::memory_order_acquire)) {
    std::shared_ptr<PendingAccept> next;
    for (const auto& pa : l->pending) {
      if (pa->stage == PendingAccept::Stage::Parked) {
        next = pa;
        break;
      }
    }
    if (next == nullptr) return;
    HsMessage accept;
    ncclResult_t r = hs->transport()->prepare(false, next->routes, ConnOptions(), &next->conn, &accept);
    if (r == ncclSuccess) r = hs->transport()->activate(next->conn.get(), next->hello, &accept);
    if (r != ncclSuccess) {
      refuse(hs, l.get(), next, "could not set up the RDMA side of the connection (see the peer's log)", r);
      continue;
    }
    accept.type = HsType::Accept;
    accept.token = l->token;
    std::string error;
    if (!sendMessage(next->fd, accept, &error)) {
      logRefusal(l.get(), next->peer, "sending ACCEPT failed: " + error);
      noteFailed(l.get(), next, "sending ACCEPT failed: " + error, ncclRemoteError);
      dropPending(hs, l.get(), next);
      continue;
    }
    next->stage = PendingAccept::Stage::WaitReady;
    next->deadline = Clock::now() + std::chrono::milliseconds(hs->settings().timeoutMs);
    l->inflight = next;
  }
}

// Only sockets that have not yet presented the token are bounded: a scanner or a flood of
// half-open connections cannot grow memory, and evicting its oldest socket (rather than
// refusing the newcomer) keeps a real connect, which sends its HELLO at once, from being
// locked out. Authenticated connects are never evicted: they wait for accept() up to
// NCCL_MESH_ACCEPT_WAIT_MS, as their connector does.
void evictIfFull(Handshaker* hs, const std::shared_ptr<Listener>& l) {
  auto unauthenticated = [&] {
    std::vector<std::shared_ptr<PendingAccept>> out;  // in arrival order
    for (const auto& pa : l->pending) {
      if (pa->stage == PendingAccept::Stage::Hello) out.push_back(pa);
    }
    return out;
  };
  auto waiting = unauthenticated();
  if (waiting.size() < hs->settings().maxPending) return;
  // A HELLO may already sit unread in a socket buffer: read before judging anyone.
  for (const auto& pa : waiting) onPendingEvent(hs, l, pa);
  waiting = unauthenticated();
  if (waiting.size() < hs->settings().maxPending) return;
  logRefusal(l.get(), waiting.front()->peer, "too many unauthenticated connections; dropping the oldest");
  dropPending(hs, l.get(), waiting.front());
}

void onListenReadable(Handshaker* hs, const std::shared_ptr<Listener>& l, int lfd) {
  for (;;) {
    int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // The connection stays queued and the socket readable: without a pause the reactor
      // would spin on it while the process has no descriptor (or memory) to take it with.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) hs->pauseListening(l, lfd, errno);
      return;  // EAGAIN, or a transient error: the next event retries
    }
    {
      std::lock_guard<std::mutex> lock(l->mutex);
      if (l->failureIsShortage) {
        l->failure.clear();  // the shortage is over: the connections it held decide
        l->failureIsShortage = false;
      }
    }
    evictIfFull(hs, l);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto pa = std::make_shared<PendingAccept>();
    pa->fd = fd;
    pa->peer = peerOf(fd);
    pa->deadline = Clock::now() + std::chrono::milliseconds(hs->settings().timeoutMs);
    l->pending.push_back(pa);
    std::weak_ptr<PendingAccept> weak = pa;
    hs->reactor()->watch(fd, EPOLLIN | EPOLLRDHUP, [hs, l, weak](uint32_t) {
      if (auto p = weak.lock()) onPendingEvent(hs, l, p);
    });
  }
}

// Drops handshakes past their deadline (half-open sockets, connectors that went silent).
bool expirePending(Handshaker* hs, const std::shared_ptr<Listener>& l, Clock::time_point now) {
  if (l->closed) return false;
  std::vector<std::shared_ptr<PendingAccept>> expired;
  for (const auto& pa : l->pending) {
    if (now > pa->deadline) expired.push_back(pa);
  }
  for (const auto& pa : expired) {
    logRefusal(l.get(), pa->peer, "handshake timed out");
    noteFailed(l.get(), pa,
               pa->stage == PendingAccept::Stage::Parked ? "its HELLO waited for accept() past NCCL_MESH_ACCEPT_WAIT_MS"
                                                         : "handshake timed out",
               ncclRemoteError);
    dropPending(hs, l.get(), pa);
  }
  maybeProcess(hs, l);
  return true;
}

// Binds one socket per address (or one wildcard socket) on a common port. An address the
// kernel no longer has (EADDRNOTAVAIL: removed from its netdev since init, as some network
// managers do on carrier loss) is left out and named in *unbound; the others still listen.
// False when nothing could be bound, or on any other error (EADDRINUSE: the caller tries
// another port).
bool bindListeners(const HandshakeSettings& s, const std::vector<uint32_t>& addrs, uint16_t port,
                   std::vector<int>* fds, uint16_t* boundPort, std::vector<uint32_t>* unbound, std::string* why) {
  std::vector<uint32_t> targets = s.listenAny ? std::vector<uint32_t>{INADDR_ANY} : addrs;
  unbound->clear();
  for (uint32_t addr : targets) {
    int fd = newTcpSocket();
    if (fd < 0) {
      *why = std::string("socket: ") + strerror(errno);
      return false;
    }
    sockaddr_in sa = ipv4SockAddr(addr, port);
    if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      int err = errno;
      close(fd);
      *why = "bind/listen on " + formatIpv4(addr) + ":" + std::to_string(port) + ": " + strerror(err);
      if (err == EADDRNOTAVAIL && addr != INADDR_ANY) {
        unbound->push_back(addr);
        continue;
      }
      return false;
    }
    fds->push_back(fd);
    if (listen(fd, 128) != 0) {
      *why = "bind/listen on " + formatIpv4(addr) + ":" + std::to_string(port) + ": " + strerror(errno);
      return false;
    }
    socklen_t len = sizeof(sa);
    getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    port = ntohs(sa.sin_port);
  }
  if (fds->empty()) {
    *why = "none of this node's mesh addresses can be bound (last: " + *why + ")";
    return false;
  }
  *boundPort = port;
  return true;
}

}  // namespace

// --- connector side ------------------------------------------------------------------------

namespace {

void finishConnect(Handshaker* hs, Connector* c, const std::string& error, ncclResult_t code) {
  if (c->state.load(std::memory_order_relaxed) != Connector::kPending) return;
  if (!error.empty()) {
    closeFd(hs->reactor(), &c->fd);
    c->conn.reset();
    c->error = error;
    c->errorCode = code;
    c->state.store(Connector::kFailed, std::memory_order_release);
    return;
  }
  hs->adoptControl(&c->fd, c->conn.get(), c->peer);
  c->result = std::move(c->conn);
  c->state.store(Connector::kReady, std::memory_order_release);
}

void onConnectWritable(Handshaker* hs, Connector* c) {
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    return finishConnect(hs, c, "cannot reach " + c->peer + ": " + strerror(err) +
                                    (err == ECONNREFUSED ? " (no listener: closed listen comm or stale handle?)" : ""),
                         ncclRemoteError);
  }
  HsMessage hello;
  ncclResult_t r = hs->transport()->prepare(true, c->routes, c->opts, &c->conn, &hello);
  if (r != ncclSuccess) return finishConnect(hs, c, "could not create the RDMA resources", r);
  hello.type = HsType::Hello;
  hello.token = c->handle.token;
  c->helloLinks = hello.links.size();
  std::string error;
  if (!sendMessage(c->fd, hello, &error)) return finishConnect(hs, c, "sending HELLO: " + error, ncclSystemError);
  c->step = Connector::Step::WaitAccept;
  c->awaitingAccept.store(true, std::memory_order_release);
  // The peer's accept() may come late (see onHello): keepalive notices a peer whose host or
  // link went away meanwhile; a stopped process is only bounded by acceptDeadline.
  armKeepalive(c->fd, hs->settings().peerTimeoutMs, c->peer);
  hs->reactor()->modify(c->fd, EPOLLIN | EPOLLRDHUP);
}

void onConnectReadable(Handshaker* hs, Connector* c) {
  HsMessage msg;
  std::string error;
  int rc = readMessage(c->fd, &c->inbuf, &msg, &error);
  if (rc == 0) return;
  if (rc == -2 && !error.empty()) {
    // A receive error, not an end of stream: keepalive got no answer (ETIMEDOUT), or a reset.
    return finishConnect(hs, c,
                         "lost the connection to " + c->peer + " while waiting for " + stepName(c->step) + ": " +
                             error +
                             (c->step == Connector::Step::WaitAccept
                                  ? " (no keepalive answer within NCCL_MESH_PEER_TIMEOUT_MS: its host or cable is down?)"
                                  : ""),
                         ncclRemoteError);
  }
  if (rc == -2) {
    // One hint per case: a listener alive but not accepting closes the connection at its
    // NCCL_MESH_ACCEPT_WAIT_MS (dead-peer never-accept), one closed or killed at once
    // (listener-dies).
    return finishConnect(hs, c,
                         c->peer + (c->step == Connector::Step::Connect
                                        ? std::string(" closed the connection during the TCP connect (did the peer "
                                                      "process exit?)")
                                        : std::string(" closed the connection before accepting it (it did not call "
                                                      "accept within its NCCL_MESH_ACCEPT_WAIT_MS, closed its listen "
                                                      "comm, or its process exited)")),
                         ncclRemoteError);
  }
  if (rc == -1) return finishConnect(hs, c, "bad message from " + c->peer + ": " + error, ncclRemoteError);
  if (msg.type == HsType::Reject) {
    // Fields a build does not know are reserved bytes to it (the traffic class, a relay's
    // origin, two-relay legs, ECE): name the likely cause, not only the byte.
    bool reserved = msg.reason.find("reserved") != std::string::npos;
    return finishConnect(hs, c,
                         c->peer + " refused the connection: " + msg.reason +
                             (reserved ? " (probably an older nccl-mesh there, which refuses fields it does not know: "
                                         "run one version on every node; NCCL_MESH_IB_ECE_ENABLE=0 here leaves ECE out)"
                                       : ""),
                         ncclRemoteError);
  }
  if (msg.type != HsType::Accept || msg.token != c->handle.token || msg.links.size() != c->helloLinks) {
    return finishConnect(hs, c, "unexpected reply from " + c->peer, ncclRemoteError);
  }
  ncclResult_t r = hs->transport()->activate(c->conn.get(), msg, nullptr);
  if (r != ncclSuccess) return finishConnect(hs, c, "bringing the QPs to RTS failed", r);
  HsMessage ready;
  ready.type = HsType::Ready;
  ready.token = c->handle.token;
  if (!sendMessage(c->fd, ready, &error)) return finishConnect(hs, c, "sending READY: " + error, ncclRemoteError);
  finishConnect(hs, c, "", ncclSuccess);
}

void beginConnect(Handshaker* hs, const std::shared_ptr<Connector>& c) {
  const Route& first = c->routes.front();
  c->fd = newTcpSocket();
  if (c->fd < 0) return finishConnect(hs, c.get(), std::string("socket: ") + strerror(errno), ncclSystemError);
  // The source address pins the handshake to the cable the data will use.
  sockaddr_in local = ipv4SockAddr(first.local.addr, 0);
  sockaddr_in remote = ipv4SockAddr(first.peerAddr, c->handle.port);
  if (bind(c->fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      (connect(c->fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) != 0 && errno != EINPROGRESS)) {
    return finishConnect(hs, c.get(), "connect from " + formatIpv4(first.local.addr) + " to " + c->peer + ": " + strerror(errno),
                         ncclRemoteError);
  }
  std::weak_ptr<Connector> weak = c;
  hs->reactor()->watch(c->fd, EPOLLOUT | EPOLLIN | EPOLLRDHUP, [hs, weak](uint32_t events) {
    auto conn = weak.lock();
    if (conn == nullptr || conn->state.load() != Connector::kPending) return;
    if (conn->step == Connector::Step::Connect && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) != 0) {
      return onConnectWritable(hs, conn.get());
    }
    if (conn->step == Connector::Step::WaitAccept) onConnectReadable(hs, conn.get());
  });
  hs->reactor()->addTimer(std::chrono::milliseconds(50), [hs, weak](Clock::time_point now) {
    auto conn = weak.lock();
    if (conn == nullptr || conn->state.load() != Connector::kPending) return false;
    bool accepting = conn->step == Connector::Step::WaitAccept && !conn->opts.acceptAtOnce;
    if (now < (accepting ? conn->acceptDeadline : conn->deadline)) return true;
    finishConnect(hs, conn.get(),
                  "timed out after " +
                      (accepting ? std::to_string(acceptWait(hs->settings()).count()) + " ms (NCCL_MESH_ACCEPT_WAIT_MS)"
                                 : std::to_string(hs->settings().timeoutMs) + " ms") +
                      " waiting for " + stepName(conn->step) + " from " + conn->peer,
                  ncclRemoteError);
    return false;
  });
}

}  // namespace

// --- public API ----------------------------------------------------------------------------

Handshaker::Handshaker(Reactor* reactor, Transport* transport, HandshakeSettings settings)
    : reactor_(reactor), transport_(transport), settings_(settings) {}

Handshaker::~Handshaker() = default;

ncclResult_t Handshaker::listen(std::shared_ptr<Listener>* out, Handle* handle) {
  auto l = std::make_shared<Listener>();
  l->nics = transport_->localNics();
  std::vector<uint32_t> addrs;
  handle->addrs.clear();
  for (const LocalNic& nic : l->nics) {
    for (const LocalAddress& a : nic.addrs) {
      addrs.push_back(a.ip.addr);
      handle->addrs.push_back(HandleAddress{a.ip.addr, a.ip.prefixLen, static_cast<uint8_t>(nic.index)});
    }
  }
  MESH_REQUIRE(!addrs.empty(), ncclInternalError, "listen: this node has no mesh address");
  std::string why;
  bool bound = false;
  std::vector<uint32_t> unbound;
  int span = settings_.portMin > 0 ? settings_.portMax - settings_.portMin + 1 : 0;
  for (int attempt = 0; attempt < 16 && !bound; ++attempt) {
    for (int fd : l->fds) close(fd);
    l->fds.clear();
    uint16_t port = span > 0 ? static_cast<uint16_t>(settings_.portMin + (randomToken() % span)) : 0;
    bound = bindListeners(settings_, addrs, port, &l->fds, &l->port, &unbound, &why);
  }
  if (!bound) {
    for (int fd : l->fds) close(fd);
    MESH_WARN("listen failed: %s (NCCL_MESH_PORT_RANGE / NCCL_MESH_LISTEN_ADDR)", why.c_str());
    return ncclSystemError;
  }
  // The handle offers only what listens: a peer routes to this node over the other cables.
  for (uint32_t addr : unbound) {
    handle->addrs.erase(std::remove_if(handle->addrs.begin(), handle->addrs.end(),
                                       [addr](const HandleAddress& a) { return a.addr == addr; }),
                        handle->addrs.end());
    bool first;
    {
      std::lock_guard<std::mutex> lock(unboundMutex_);
      first = std::find(unboundWarned_.begin(), unboundWarned_.end(), addr) == unboundWarned_.end();
      if (first) unboundWarned_.push_back(addr);
    }
    if (first) {
      MESH_WARN("listen: %s cannot be bound any more (%s: was it removed from its netdev since init?); listening "
                "on this node's other addresses, so peers reach it over the other cables only",
                formatIpv4(addr).c_str(), strerror(EADDRNOTAVAIL));
    } else {
      MESH_INFO(NCCL_NET, "listen: %s still cannot be bound; left out of the handle", formatIpv4(addr).c_str());
    }
  }
  l->token = randomToken();
  handle->token = l->token;
  handle->port = l->port;
  bool posted = reactor_->post([this, l] {
    for (int fd : l->fds) {
      reactor_->watch(fd, EPOLLIN, [this, l, fd](uint32_t) { onListenReadable(this, l, fd); });
    }
    reactor_->addTimer(std::chrono::milliseconds(100),
                       [this, l](Clock::time_point now) { return expirePending(this, l, now); });
  });
  if (!posted) {
    for (int fd : l->fds) close(fd);
    MESH_WARN("listen: the handshake reactor is not running (plugin shut down?)");
    return ncclInternalError;
  }
  *out = std::move(l);
  return ncclSuccess;
}

void Handshaker::pauseListening(const std::shared_ptr<Listener>& l, int lfd, int err) {
  if (!shortageWarned_) {
    shortageWarned_ = true;
    MESH_WARN("listen on port %u: cannot take an incoming connection: %s%s; it waits in the kernel's queue, "
              "retried every 100 ms (further shortages are not logged)",
              l->port, strerror(err), err == EMFILE ? " (this process's open-file limit, ulimit -n)" : "");
  }
  if (!holdsLiveConnect(l.get(), nullptr)) {
    // A connection meant for this listener may be the one waiting in the kernel's queue:
    // NCCL's IB transport fails accept() when its accept4 does. A shortage that lasts two
    // connect timeouts is no passing one: accept() then fails with it (NCCL aborts and closes
    // the listen comm, and the queued connection's connector fails at that close).
    std::lock_guard<std::mutex> lock(l->mutex);
    if (l->failure.empty()) {
      l->failure = std::string("an incoming connection could not be taken: ") + strerror(err) +
                   (err == EMFILE ? " (this process's open-file limit, ulimit -n)" : "");
      l->failureCode = ncclSystemError;
      l->failedAt = Clock::now();
      l->failureIsShortage = true;
    }
  }
  acceptShortages_.fetch_add(1, std::memory_order_release);  // after the WARN: a reader of the count sees it
  if (reactor_->modify(lfd, 0) != ncclSuccess) return;
  std::weak_ptr<Listener> weak = l;
  reactor_->addTimer(std::chrono::milliseconds(100), [this, weak, lfd](Clock::time_point) {
    auto listener = weak.lock();
    // Closed since: its sockets are gone (and the number may be another file's now).
    if (listener == nullptr || listener->closed) return false;
    if (std::find(listener->fds.begin(), listener->fds.end(), lfd) == listener->fds.end()) return false;
    (void)reactor_->modify(lfd, EPOLLIN);
    return false;
  });
}

ncclResult_t Handshaker::pollAccept(const std::shared_ptr<Listener>& l,
                                    std::unique_ptr<PreparedConn>* conn) {
  {
    std::lock_guard<std::mutex> lock(l->mutex);
    if (!l->ready.empty()) {
      *conn = std::move(l->ready.front());
      l->ready.pop_front();
      return ncclSuccess;
    }
    // NCCL's IB transport fails accept() when its connection fails; here a connect may come
    // again with the same token (a relayed connect tries its next relay, a two-relay one
    // falls back to one relay), so the failure counts once no connector can still be
    // trying: every connect gives up within two connect timeouts of its start, which was
    // before this failure, and a newer attempt would have cleared it.
    auto grace = 2 * std::chrono::milliseconds(settings_.timeoutMs);
    if (!l->failure.empty() && Clock::now() - l->failedAt >= grace) {
      if (!l->failureReported) {
        l->failureReported = true;
        MESH_WARN("accept on port %u: %s; no other connect came within %lld ms (2 x NCCL_MESH_CONNECT_TIMEOUT_MS)",
                  l->port, l->failure.c_str(), static_cast<long long>(grace.count()));
      }
      conn->reset();
      return l->failureCode;
    }
  }
  conn->reset();
  // Not serving: nothing will ever arrive (the post would be refused too, unless the thread
  // stopped between the two looks).
  bool running = reactor_->serving() && (l->acceptWanted.exchange(true, std::memory_order_acq_rel) ||
                                         reactor_->post([this, l] { maybeProcess(this, l); }));
  if (!running) {
    MESH_WARN("accept: the handshake thread is not running (plugin shut down, or it stopped on an error above)");
    return ncclInternalError;
  }
  return ncclSuccess;
}

void Handshaker::closeListener(std::shared_ptr<Listener> l) {
  auto teardown = [this, l] {
    l->closed = true;
    for (int& fd : l->fds) closeFd(reactor_, &fd);
    auto pending = l->pending;
    for (const auto& pa : pending) dropPending(this, l.get(), pa);
    std::lock_guard<std::mutex> lock(l->mutex);
    // Established but never accepted (a job aborted mid-connect): their control sockets close
    // here, so the peers see the connection end, and their destructors release the rest.
    for (auto& conn : l->ready) {
      if (conn != nullptr && conn->control != nullptr) closeFd(reactor_, &conn->control->fd);
    }
    l->ready.clear();
  };
  reactor_->postOrRun("a listener's close", teardown);
}

ncclResult_t Handshaker::startConnect(const Handle& handle, const std::vector<Route>& routes,
                                      const ConnOptions& opts, std::shared_ptr<Connector>* out) {
  MESH_REQUIRE(!routes.empty(), ncclInternalError, "connect: no route");
  auto c = std::make_shared<Connector>();
  c->handle = handle;
  c->routes = routes;
  c->opts = opts;
  c->peer = formatIpv4(routes.front().peerAddr) + ":" + std::to_string(handle.port);
  c->deadline = Clock::now() + std::chrono::milliseconds(settings_.timeoutMs);
  // A relay's leg is accepted by the relay at once: waiting longer would only delay trying the
  // next relay when that one hangs.
  c->acceptDeadline = opts.acceptAtOnce ? c->deadline : std::max(c->deadline, Clock::now() + acceptWait(settings_));
  if (!reactor_->post([this, c] { beginConnect(this, c); })) {
    MESH_WARN("connect: the handshake reactor is not running (plugin shut down?)");
    return ncclInternalError;
  }
  *out = std::move(c);
  return ncclSuccess;
}

ncclResult_t Handshaker::pollConnect(const std::shared_ptr<Connector>& c, std::unique_ptr<PreparedConn>* conn) {
  conn->reset();
  switch (c->state.load(std::memory_order_acquire)) {
    case Connector::kReady:
      *conn = std::move(c->result);
      return ncclSuccess;
    case Connector::kFailed:
      MESH_WARN("connect to %s failed: %s", c->peer.c_str(), c->error.c_str());
      return c->errorCode;
    default:
      // The handshake thread fails a connect at its deadline; one that is still pending
      // well after it has no thread to finish it (it stopped on an error): fail here
      // rather than let NCCL wait forever. Only a connect whose HELLO is out may wait past
      // the connect timeout (for the peer's accept), and only while the thread runs.
      bool accepting = c->awaitingAccept.load(std::memory_order_acquire) && reactor_->serving() &&
                       !c->opts.acceptAtOnce;
      if (Clock::now() > (accepting ? c->acceptDeadline : c->deadline) + std::chrono::seconds(2)) {
        MESH_WARN("connect to %s failed: no outcome %lld ms after it started (%s) and the handshake thread did not "
                  "end it%s", c->peer.c_str(),
                  static_cast<long long>(accepting ? acceptWait(settings_).count() : settings_.timeoutMs),
                  accepting ? "NCCL_MESH_ACCEPT_WAIT_MS" : "NCCL_MESH_CONNECT_TIMEOUT_MS",
                  reactor_->serving() ? "" : " (it is not running)");
        // Its socket and comm go with it, now or when the thread gets to it (the thread
        // holds it only weakly: a dropped one would leave its socket watched forever).
        discardConnect(c);
        return ncclSystemError;
      }
      return ncclSuccess;
  }
}

void Handshaker::discardConnect(std::shared_ptr<Connector> c) {
  auto discard = [this, c] {
    finishConnect(this, c.get(), "abandoned", ncclInternalError);  // a pending one: socket, comm
    if (c->result != nullptr) {
      closeControl(c->result->control);
      c->result.reset();
    }
  };
  reactor_->postOrRun("a connect's discard", discard);
}


void Handshaker::adoptControl(int* fd, PreparedConn* conn, const std::string& peer) {
  reactor_->unwatch(*fd);  // the handshake's handler lets go of the socket
  auto control = std::make_shared<ControlLink>();
  control->fd = *fd;
  *fd = -1;
  conn->control = control;
  conn->peer = peer;
  armKeepalive(control->fd, settings_.peerTimeoutMs, peer);
  std::weak_ptr<ControlLink> weak = control;
  control->lastHeard = Clock::now();
  if (settings_.peerTimeoutMs > 0) {
    // The heartbeat: one byte every timeout / 4 from this end; silence from the other end for
    // the timeout fails the link as keepalive would (ETIMEDOUT). A stopped or hung process
    // still has its kernel answering keepalive, so keepalive alone never notices it; a
    // relay stopped that way would leave both ends of a relayed connection waiting forever.
    auto timeout = std::chrono::milliseconds(std::max(settings_.peerTimeoutMs, 1000));
    reactor_->addTimer(timeout / 4, [this, weak, peer, timeout](Clock::time_point now) {
      auto link = weak.lock();
      if (link == nullptr || link->fd < 0) return false;
      char beat = 0;
      (void)!send(link->fd, &beat, 1, MSG_NOSIGNAL | MSG_DONTWAIT);  // a full buffer: the peer is silent anyway
      if (now - link->lastHeard < timeout) return true;
      MESH_WARN("control connection to %s: nothing heard for %lld ms (NCCL_MESH_PEER_TIMEOUT_MS): the peer "
                "process is stopped or hung, or its host unreachable",
                peer.c_str(), static_cast<long long>(timeout.count()));
      closeFd(reactor_, &link->fd);
      link->error.store(ETIMEDOUT, std::memory_order_relaxed);
      link->closed.store(true, std::memory_order_release);
      return false;
    });
  }
  reactor_->watch(control->fd, EPOLLIN | EPOLLRDHUP, [this, weak, peer, watched = control->fd](uint32_t) {
    auto link = weak.lock();
    if (link == nullptr) {
      // Its comm is gone without closing the socket (a path that forgot closeControl): still
      // watched, level-triggered, it would wake the reactor forever. Close it now.
      MESH_INFO(NCCL_NET, "control connection to %s outlived its comm; closed", peer.c_str());
      int fd = watched;
      closeFd(reactor_, &fd);
      return;
    }
    if (link->fd < 0) return;
    char buf[64];
    ssize_t n = recv(link->fd, buf, sizeof(buf), 0);
    if (n > 0) {
      link->lastHeard = Clock::now();  // heartbeats; their content means nothing
      return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    int err = n < 0 ? errno : 0;
    if (err == 0) {
      MESH_INFO(NCCL_NET, "peer %s closed its control connection", peer.c_str());
    } else {
      MESH_WARN("control connection to %s failed: %s%s", peer.c_str(), strerror(err),
                err == ETIMEDOUT ? " (no keepalive reply within NCCL_MESH_PEER_TIMEOUT_MS)" : "");
    }
    closeFd(reactor_, &link->fd);
    link->error.store(err, std::memory_order_relaxed);
    link->closed.store(true, std::memory_order_release);
  });
}

void Handshaker::closeControl(const std::shared_ptr<ControlLink>& control) {
  if (control == nullptr) return;
  reactor_->postOrRun("a control connection's close", [this, control] { closeFd(reactor_, &control->fd); });
}

}  // namespace mesh
