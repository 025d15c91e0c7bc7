// SPDX-License-Identifier: Apache-2.0
// The handshake state machine without RDMA: a fake transport stands in for QPs, and two
// Handshakers talk over 127.0.0.1 through the real reactor, sockets and wire format.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/resource.h>
#include <sys/time.h>
#include <dirent.h>
#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>

#include "mesh/connect/handshake.h"
#include "mesh/platform/log.h"
#include "warn_capture.h"

namespace mesh {
namespace {

using Clock = std::chrono::steady_clock;

class FakeConn : public PreparedConn {
 public:
  FakeConn() { ++live; }
  ~FakeConn() override { --live; }
  uint32_t qpn = 0;
  uint32_t remoteQpn = 0;
  static std::atomic<int> live;  // FakeConns not yet destroyed (their "QPs")
};
std::atomic<int> FakeConn::live{0};

int openFds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
    closedir(d);
  }
  return n - 1;  // the directory's own fd
}

class FakeTransport : public Transport {
 public:
  std::vector<LocalNic> localNics() const override {
    LocalNic nic;
    nic.index = 0;
    nic.label = "fake0:1/lo";
    Ipv4Prefix lo;
    parsePrefix("127.0.0.1/8", &lo);
    nic.addrs.push_back(LocalAddress{lo, 3});
    std::vector<LocalNic> nics{nic};
    if (!extraAddr.empty()) {  // a second port whose address may not (or no longer) exist here
      LocalNic extra;
      extra.index = 1;
      extra.label = "fake1:1/p1";
      Ipv4Prefix p;
      parsePrefix(extraAddr, &p);
      extra.addrs.push_back(LocalAddress{p, 3});
      nics.push_back(extra);
    }
    return nics;
  }
  std::string extraAddr;
  ncclResult_t prepare(bool sender, const std::vector<Route>& routes, const ConnOptions&,
                       std::unique_ptr<PreparedConn>* out, HsMessage* local) override {
    if (holdPrepare) {  // the handshake thread busy in prepare until the test lets it go
      std::unique_lock<std::mutex> lock(holdMutex);
      holdCv.wait_for(lock, std::chrono::seconds(30), [this] { return !holdPrepare; });
    }
    auto c = std::make_unique<FakeConn>();
    c->qpn = nextQpn++;
    local->qpsPerLink = 1;
    std::vector<Route> use = routes;
    // As RdmaTransport with many QPs per link: the connector offers fewer links than it found.
    if (sender && senderLinkCap > 0 && use.size() > senderLinkCap) use.resize(senderLinkCap);
    for (const Route& r : use) {
      local->links.push_back(linkForRoute(r));
      HsQp q;
      q.qpn = c->qpn;
      q.mtu = 5;
      local->qps.push_back(q);
    }
    *out = std::move(c);
    return ncclSuccess;
  }
  ncclResult_t activate(PreparedConn* conn, const HsMessage& remote, HsMessage*) override {
    if (failActivate) return ncclSystemError;
    static_cast<FakeConn*>(conn)->remoteQpn = remote.qps.at(0).qpn;
    return ncclSuccess;
  }
  std::atomic<uint32_t> nextQpn{100};
  bool failActivate = false;
  size_t senderLinkCap = 0;  // 0: every route
  // The handshake thread held in prepare (a slow ibv_create_qp) until release().
  bool holdPrepare = false;  // under holdMutex
  std::mutex holdMutex;
  std::condition_variable holdCv;
  void hold() {
    std::lock_guard<std::mutex> lock(holdMutex);
    holdPrepare = true;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(holdMutex);
      holdPrepare = false;
    }
    holdCv.notify_all();
  }
};

class HandshakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setFallbackLevel(NCCL_LOG_NONE);
    ASSERT_EQ(reactor_.start(), ncclSuccess);
    makeHandshaker(8);
  }
  void makeHandshaker(size_t maxPending, int timeoutMs = 1500, int peerTimeoutMs = 6500, int acceptWaitMs = 0) {
    HandshakeSettings s;
    s.timeoutMs = timeoutMs;
    s.acceptWaitMs = acceptWaitMs;
    s.maxPending = maxPending;
    s.peerTimeoutMs = peerTimeoutMs;
    hs_ = std::make_unique<Handshaker>(&reactor_, &transport_, s);
  }
  void TearDown() override {
    reactor_.stop();
    hs_.reset();
    setFallbackLevel(NCCL_LOG_WARN);
  }
  std::vector<Route> routesTo(const Handle& h) {
    RouteResult r = routeToPeer(transport_.localNics(), h.addrs);
    EXPECT_TRUE(r.ok()) << r.error;
    return r.routes;
  }
  // Drives connect and accept the way NCCL's proxy thread does: alternately, never blocking.
  ncclResult_t connectAndAccept(const std::shared_ptr<Listener>& l, const Handle& h,
                                std::unique_ptr<PreparedConn>* send, std::unique_ptr<PreparedConn>* recv,
                                bool callAccept = true, const ConnOptions& opts = ConnOptions()) {
    std::shared_ptr<Connector> c;
    ncclResult_t r = hs_->startConnect(h, routesTo(h), opts, &c);
    if (r != ncclSuccess) return r;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      if (*send == nullptr) {
        r = hs_->pollConnect(c, send);
        if (r != ncclSuccess) return r;
      }
      if (callAccept && *recv == nullptr) {
        EXPECT_EQ(hs_->pollAccept(l, recv), ncclSuccess);
      }
      if (*send != nullptr && (*recv != nullptr || !callAccept)) return ncclSuccess;
      std::this_thread::yield();
    }
    return ncclInternalError;  // the test's own deadline: the handshake hung
  }
  int rawConnect(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    return fd;
  }
  Reactor reactor_;
  FakeTransport transport_;
  std::unique_ptr<Handshaker> hs_;
  friend void discardAndCheck(HandshakeTest* t, bool stopReactorFirst);
};

void discardAndCheck(HandshakeTest* t, bool stopReactorFirst) {
  int fdsBefore = openFds();
  int connsBefore = FakeConn::live.load();
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(t->hs_->listen(&l, &h), ncclSuccess);
  std::shared_ptr<Connector> c;
  ASSERT_EQ(t->hs_->startConnect(h, t->routesTo(h), ConnOptions(), &c), ncclSuccess);
  // The connector has built its side (the HELLO is out) and waits for an ACCEPT that never comes.
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (FakeConn::live.load() == connsBefore && Clock::now() < deadline) std::this_thread::yield();
  ASSERT_EQ(FakeConn::live.load(), connsBefore + 1) << "the connector never prepared its comm";
  if (stopReactorFirst) {
    int running = openFds();
    t->reactor_.stop();
    fdsBefore -= running - openFds();  // the reactor's own epoll and eventfd
  }
  t->hs_->discardConnect(c);
  t->hs_->closeListener(l);
  while ((FakeConn::live.load() != connsBefore || openFds() != fdsBefore) && Clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(FakeConn::live.load(), connsBefore) << "the half-built comm outlived the discard";
  EXPECT_EQ(openFds(), fdsBefore) << "a socket outlived the discard";
  std::unique_ptr<PreparedConn> conn;
  EXPECT_NE(t->hs_->pollConnect(c, &conn), ncclSuccess) << "a discarded connect cannot succeed";
  EXPECT_EQ(conn, nullptr);
}

TEST_F(HandshakeTest, ConnectAndAcceptExchangeQpInfo) {
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  ASSERT_EQ(h.addrs.size(), 1u);
  std::unique_ptr<PreparedConn> send, recv;
  ASSERT_EQ(connectAndAccept(l, h, &send, &recv), ncclSuccess);
  auto* s = static_cast<FakeConn*>(send.get());
  auto* r = static_cast<FakeConn*>(recv.get());
  EXPECT_EQ(s->remoteQpn, r->qpn);
  EXPECT_EQ(r->remoteQpn, s->qpn);
  ASSERT_NE(s->control, nullptr);
  EXPECT_FALSE(s->control->closed.load());
  // Both ends keep the socket under keepalive, so a peer that vanishes silently (no FIN)
  // still fails the comm: probes after 3 s, 4 probes 1 s apart, 6.5 s user timeout.
  for (FakeConn* c : {s, r}) {
    int v = 0;
    socklen_t len = sizeof(v);
    ASSERT_EQ(getsockopt(c->control->fd, SOL_SOCKET, SO_KEEPALIVE, &v, &len), 0);
    EXPECT_EQ(v, 1);
    ASSERT_EQ(getsockopt(c->control->fd, IPPROTO_TCP, TCP_KEEPIDLE, &v, &len), 0);
    EXPECT_EQ(v, 3);
    ASSERT_EQ(getsockopt(c->control->fd, IPPROTO_TCP, TCP_KEEPCNT, &v, &len), 0);
    EXPECT_EQ(v, 4);
    ASSERT_EQ(getsockopt(c->control->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, &len), 0);
    EXPECT_EQ(v, 6500);
  }
  hs_->closeControl(r->control);  // the peer goes away: the sender's control link notices
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!s->control->closed.load() && Clock::now() < deadline) std::this_thread::yield();
  EXPECT_TRUE(s->control->closed.load());
  EXPECT_EQ(s->control->error.load(), 0) << "an orderly close is not a socket error";
  hs_->closeControl(s->control);
  hs_->closeListener(l);
}

// A peer whose process is stopped (SIGSTOP) or hung keeps its socket, and its kernel keeps
// answering TCP keepalive: only the heartbeat notices. Here the receiver's end stops
// beating (its reactor lets go of the socket, which stays open) while the sender's goes on.
// A 2 s timeout, beats every 0.5 s: a false timeout needs the reactor stalled 1.5 s, and the
// bound (twice the timeout) leaves a loaded machine a full timeout of slack.
TEST_F(HandshakeTest, ASilentPeerFailsTheLinkWithinThePeerTimeoutAndHeartbeatsKeepAnIdleOneAlive) {
  makeHandshaker(8, 1500, 2000);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  std::unique_ptr<PreparedConn> send, recv;
  ASSERT_EQ(connectAndAccept(l, h, &send, &recv), ncclSuccess);
  auto* s = static_cast<FakeConn*>(send.get());
  auto* r = static_cast<FakeConn*>(recv.get());
  // Idle for 2 timeouts: the heartbeats (every 500 ms) keep both ends up.
  auto idleEnd = Clock::now() + std::chrono::milliseconds(4000);
  while (Clock::now() < idleEnd && !s->control->closed.load() && !r->control->closed.load()) {
    std::this_thread::yield();
  }
  EXPECT_FALSE(s->control->closed.load()) << "an idle link with heartbeats failed";
  EXPECT_FALSE(r->control->closed.load()) << "an idle link with heartbeats failed";
  // The receiver goes silent: its socket stays open, nothing is sent from it any more.
  std::atomic<int> silent{-1};
  auto link = r->control;
  ASSERT_TRUE(reactor_.post([this, link, &silent] {
    reactor_.unwatch(link->fd);
    silent.store(link->fd);
    link->fd = -1;
  }));
  while (silent.load() < 0) std::this_thread::yield();
  auto start = Clock::now();
  auto deadline = start + std::chrono::seconds(10);
  while (!s->control->closed.load() && Clock::now() < deadline) std::this_thread::yield();
  double waited = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_TRUE(s->control->closed.load()) << "a silent peer was not noticed in 10 s";
  EXPECT_EQ(s->control->error.load(), ETIMEDOUT);
  // Keepalive alone never notices (the peer's kernel answers it): only the heartbeat can.
  EXPECT_LT(waited, 4.0) << "noticed after " << waited << " s; the timeout is 2 s, beats every 0.5 s";
  close(silent.load());
  hs_->closeControl(s->control);
  hs_->closeListener(l);
}

TEST_F(HandshakeTest, ManyPendingConnectsOnOneListenerAllComplete) {
  // The burst is unauthenticated for a moment; parked ones are unbounded. The listener
  // answers one HELLO at a time, so under TSan on a busy 2-core machine 20 handshakes can
  // outlast a 1.5 s deadline: this test is about completion, not timeouts.
  makeHandshaker(64, 15000);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  std::vector<std::shared_ptr<Connector>> cs(20);
  for (auto& c : cs) ASSERT_EQ(hs_->startConnect(h, routesTo(h), ConnOptions(), &c), ncclSuccess);
  std::vector<std::unique_ptr<PreparedConn>> sends(cs.size()), recvs;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  size_t sent = 0;
  while ((sent < cs.size() || recvs.size() < cs.size()) && Clock::now() < deadline) {
    for (size_t i = 0; i < cs.size(); ++i) {
      if (sends[i] == nullptr && hs_->pollConnect(cs[i], &sends[i]) == ncclSuccess && sends[i]) ++sent;
    }
    std::unique_ptr<PreparedConn> r;
    ASSERT_EQ(hs_->pollAccept(l, &r), ncclSuccess);
    if (r != nullptr) recvs.push_back(std::move(r));
  }
  EXPECT_EQ(sent, cs.size());
  EXPECT_EQ(recvs.size(), cs.size());
  hs_->closeListener(l);
}

// A connect NCCL will not poll again (the plugin shuts down, or NCCL reused the handle
// buffer for another) must give back its socket and its half-built comm, whether the
// reactor still runs (the discard runs on it) or has stopped (it runs inline).
void discardAndCheck(HandshakeTest* t, bool stopReactorFirst);

TEST_F(HandshakeTest, ADiscardedConnectReleasesItsSocketAndComm) { discardAndCheck(this, false); }
TEST_F(HandshakeTest, ADiscardedConnectReleasesItsSocketAndCommAfterTheReactorStopped) {
  discardAndCheck(this, true);
}

// A mesh address removed from its netdev after init (some network managers drop a port's
// address when its cable loses carrier: a neighbour powered off) must not stop this node
// from listening on its other cables: the listen leaves it out of the handle, WARNs once,
// and the peers connect over the rest.
// With NCCL_MESH_QPS_PER_CONN 9..16 and two links to the peer (a Spark cable's two
// functions), the connector's transport offers one link, and the acceptor answers for that
// one. That ACCEPT must be taken: it was checked against the routes found (two), and every
// such connect failed as "unexpected reply".
TEST_F(HandshakeTest, AConnectorThatOffersFewerLinksThanItsRoutesConnects) {
  transport_.extraAddr = "127.0.0.2/8";  // a second port on another address
  transport_.senderLinkCap = 1;
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  ASSERT_EQ(h.addrs.size(), 2u);
  RouteResult routes = connectRoutes(transport_.localNics(), h.addrs, kHsMaxLinks);
  ASSERT_TRUE(routes.ok()) << routes.error;
  ASSERT_GE(routes.routes.size(), 2u) << "the test needs a peer reached over two links";
  std::shared_ptr<Connector> c;
  ASSERT_EQ(hs_->startConnect(h, routes.routes, ConnOptions(), &c), ncclSuccess);
  testing_support::WarnCapture warnings;
  std::unique_ptr<PreparedConn> send, recv;
  ncclResult_t r = ncclSuccess;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (r == ncclSuccess && (send == nullptr || recv == nullptr) && Clock::now() < deadline) {
    if (send == nullptr) r = hs_->pollConnect(c, &send);
    if (recv == nullptr) {
      EXPECT_EQ(hs_->pollAccept(l, &recv), ncclSuccess);
    }
    std::this_thread::yield();
  }
  ASSERT_EQ(r, ncclSuccess) << warnings.last();
  ASSERT_NE(send, nullptr);
  ASSERT_NE(recv, nullptr);
  hs_->closeControl(send->control);
  hs_->closeControl(recv->control);
  hs_->closeListener(l);
}

// NCCL's thread gives up on a connect the handshake thread has not ended well past its
// deadline (that thread busy in a slow prepare) and drops it. Its socket must still close
// when the thread gets back: the thread holds a connect only weakly, so a dropped one's
// socket stayed watched forever (and, level-triggered and writable, spun the thread).
TEST_F(HandshakeTest, AConnectGivenUpPastItsDeadlineStillClosesItsSocket) {
  // A long wait for accept does not stretch this: the thread is stuck before the HELLO.
  makeHandshaker(8, /*timeoutMs=*/200, /*peerTimeoutMs=*/6500, /*acceptWaitMs=*/60000);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  int fdsBefore = openFds();
  int connsBefore = FakeConn::live.load();
  transport_.hold();  // until NCCL's thread has given up (deadline 0.2 s + grace 2 s)
  std::shared_ptr<Connector> c;
  ASSERT_EQ(hs_->startConnect(h, routesTo(h), ConnOptions(), &c), ncclSuccess);
  testing_support::WarnCapture warnings;
  std::unique_ptr<PreparedConn> conn;
  ncclResult_t r = ncclSuccess;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (r == ncclSuccess && conn == nullptr && Clock::now() < deadline) {
    r = hs_->pollConnect(c, &conn);
    std::this_thread::yield();
  }
  EXPECT_EQ(r, ncclSystemError);
  EXPECT_NE(warnings.last().find("the handshake thread did not end it"), std::string::npos) << warnings.last();
  c.reset();  // as netConnect: the failed connect leaves its table
  transport_.release();
  while ((openFds() != fdsBefore || FakeConn::live.load() != connsBefore) && Clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(openFds(), fdsBefore) << "the given-up connect's socket stayed open";
  EXPECT_EQ(FakeConn::live.load(), connsBefore) << "the given-up connect's comm stayed alive";
  hs_->closeListener(l);
}

TEST_F(HandshakeTest, AnAddressGoneFromItsNetdevIsLeftOutOfTheHandle) {
  transport_.extraAddr = "198.19.255.254/24";  // in no netdev of this host
  std::ifstream nonlocal("/proc/sys/net/ipv4/ip_nonlocal_bind");
  int nonlocalBind = 0;
  nonlocal >> nonlocalBind;
  testing_support::WarnCapture warnings;
  for (int round = 0; round < 2; ++round) {
    std::shared_ptr<Listener> l;
    Handle h;
    ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess) << "round " << round << ": " << warnings.last();
    if (nonlocalBind != 0) {  // this host lets any address be bound: it stays in the handle
      EXPECT_EQ(h.addrs.size(), 2u);
    } else {
      ASSERT_EQ(h.addrs.size(), 1u);
      EXPECT_EQ(formatIpv4(h.addrs[0].addr), "127.0.0.1");
    }
    std::unique_ptr<PreparedConn> send, recv;
    ASSERT_EQ(connectAndAccept(l, h, &send, &recv), ncclSuccess);
    hs_->closeControl(send->control);
    hs_->closeControl(recv->control);
    hs_->closeListener(l);
  }
  if (nonlocalBind == 0) {
    ASSERT_EQ(warnings.lines().size(), 1u) << "one WARN for the address, not one per listen";
    EXPECT_NE(warnings.last().find("listen: 198.19.255.254 cannot be bound any more"), std::string::npos)
        << warnings.last();
  }
}

// A job aborted after a connection's READY arrived but before NCCL's accept took it: the
// listen comm is closed with that connection still waiting. Its control socket must close
// with it (the peer then sees its connection end at once), and nothing may stay watched:
// a leaked socket under the level-triggered reactor made it spin once the peer's first
// heartbeat or FIN arrived.
TEST_F(HandshakeTest, ClosingAListenerWithAnUnclaimedConnectionClosesItsSocket) {
  int fdsBefore = openFds();
  int connsBefore = FakeConn::live.load();
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  std::unique_ptr<PreparedConn> send, recv;
  ASSERT_EQ(hs_->pollAccept(l, &recv), ncclSuccess);  // NCCL's accept, once: nothing yet
  ASSERT_EQ(recv, nullptr);
  ASSERT_EQ(connectAndAccept(l, h, &send, &recv, /*callAccept=*/false), ncclSuccess);
  // The listener's side finished too (it waits in the listener for an accept).
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (FakeConn::live.load() < connsBefore + 2 && Clock::now() < deadline) std::this_thread::yield();
  ASSERT_EQ(FakeConn::live.load(), connsBefore + 2);
  hs_->closeListener(l);
  l.reset();
  deadline = Clock::now() + std::chrono::seconds(2);
  while (!send->control->closed.load() && Clock::now() < deadline) std::this_thread::yield();
  EXPECT_TRUE(send->control->closed.load()) << "the connector never saw the unclaimed connection close";
  hs_->closeControl(send->control);
  send.reset();
  deadline = Clock::now() + std::chrono::seconds(2);
  while (openFds() != fdsBefore && Clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(openFds(), fdsBefore) << "a socket of the unclaimed connection stayed open";
  EXPECT_EQ(FakeConn::live.load(), connsBefore);
}

// Every wait has a deadline, even without the handshake thread that enforces them (it ends
// on an epoll error, or the plugin is shutting down): a pending connect fails soon after
// its deadline instead of "not yet" forever, and an accept says the thread is gone.
TEST_F(HandshakeTest, WithoutTheHandshakeThreadConnectAndAcceptStillEnd) {
  makeHandshaker(8, /*timeoutMs=*/300);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  std::shared_ptr<Connector> c;
  ASSERT_EQ(hs_->startConnect(h, routesTo(h), ConnOptions(), &c), ncclSuccess);  // never accepted
  reactor_.stop();
  testing_support::WarnCapture warnings;
  auto start = Clock::now();
  std::unique_ptr<PreparedConn> conn;
  ncclResult_t r = ncclSuccess;
  while (r == ncclSuccess && conn == nullptr && Clock::now() - start < std::chrono::seconds(10)) {
    r = hs_->pollConnect(c, &conn);
    std::this_thread::yield();
  }
  double s = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r, ncclSystemError) << "after " << s << " s";
  EXPECT_LT(s, 5.0);
  EXPECT_NE(warnings.last().find("the handshake thread did not end it (it is not running)"), std::string::npos)
      << warnings.last();
  std::unique_ptr<PreparedConn> accepted;
  EXPECT_EQ(hs_->pollAccept(l, &accepted), ncclInternalError);
  EXPECT_NE(warnings.last().find("accept: the handshake thread is not running"), std::string::npos) << warnings.last();
  hs_->discardConnect(c);
  hs_->closeListener(l);
}

TEST_F(HandshakeTest, WrongTokenIsRefused) {
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  Handle forged = h;
  forged.token ^= 1;
  std::unique_ptr<PreparedConn> send, recv;
  auto start = Clock::now();
  EXPECT_EQ(connectAndAccept(l, forged, &send, &recv), ncclRemoteError);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));  // refused at once, not timed out
  EXPECT_EQ(recv, nullptr);
  // The listener still serves the real handle.
  ASSERT_EQ(connectAndAccept(l, h, &send, &recv), ncclSuccess);
  hs_->closeListener(l);
}

// A listener of an older build refuses a HELLO field it does not know as "reserved bytes"
// (ECE on ConnectX, a relay's fields): the connector's error says what to do about it. The
// "older listener" here is a socket that answers any HELLO with such a REJECT.
TEST_F(HandshakeTest, ARefusalOverReservedBytesNamesAnOlderPeer) {
  testing_support::WarnCapture warnings;
  int srv = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(srv, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(srv, 1), 0);
  socklen_t len = sizeof(sa);
  getsockname(srv, reinterpret_cast<sockaddr*>(&sa), &len);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);  // for a valid address list and token
  h.port = ntohs(sa.sin_port);
  std::thread older([&] {
    int fd = accept(srv, nullptr, nullptr);
    if (fd < 0) return;
    char buf[4096];
    (void)!read(fd, buf, sizeof(buf));  // the HELLO
    HsMessage reject;
    reject.type = HsType::Reject;
    reject.token = h.token;
    reject.reason = "link 0 has non-zero reserved bytes";
    std::vector<uint8_t> bytes;
    std::string error;
    if (encodeHandshake(reject, &bytes, &error)) (void)!write(fd, bytes.data(), bytes.size());
    close(fd);
  });
  std::shared_ptr<Connector> c;
  ASSERT_EQ(hs_->startConnect(h, routesTo(h), ConnOptions(), &c), ncclSuccess);
  std::unique_ptr<PreparedConn> send;
  ncclResult_t r = ncclSuccess;
  auto start = Clock::now();
  while (r == ncclSuccess && send == nullptr && Clock::now() - start < std::chrono::seconds(5)) {
    r = hs_->pollConnect(c, &send);
  }
  older.join();
  close(srv);
  EXPECT_EQ(r, ncclRemoteError);
  bool named = false;
  for (const std::string& w : warnings.lines()) {
    named = named || (w.find("non-zero reserved bytes") != std::string::npos &&
                      w.find("run one version on every node") != std::string::npos);
  }
  EXPECT_TRUE(named) << warnings.last();
  hs_->closeListener(l);
}

TEST_F(HandshakeTest, ConnectTimesOutWhenThePeerNeverAccepts) {
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  std::unique_ptr<PreparedConn> send, recv;
  auto start = Clock::now();
  EXPECT_EQ(connectAndAccept(l, h, &send, &recv, /*callAccept=*/false), ncclRemoteError);
  auto took = Clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(1400));
  EXPECT_LT(took, std::chrono::milliseconds(4000));
  hs_->closeListener(l);
}

TEST_F(HandshakeTest, ConnectFailsFastWhenTheListenerCloses) {
  makeHandshaker(8, /*timeoutMs=*/10000);  // "fast": well before this, on any machine
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  std::shared_ptr<Connector> c;
  ASSERT_EQ(hs_->startConnect(h, routesTo(h), ConnOptions(), &c), ncclSuccess);
  hs_->closeListener(l);
  std::unique_ptr<PreparedConn> send;
  ncclResult_t r = ncclSuccess;
  auto start = Clock::now();
  while (r == ncclSuccess && send == nullptr && Clock::now() - start < std::chrono::seconds(15)) {
    r = hs_->pollConnect(c, &send);
  }
  EXPECT_EQ(r, ncclRemoteError);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(5000));  // long before the 10 s timeout
}

TEST_F(HandshakeTest, GarbageAndHalfOpenSocketsDoNotBlockRealConnects) {
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  int garbage = rawConnect(h.port);
  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(write(garbage, junk, sizeof(junk)), static_cast<ssize_t>(sizeof(junk)));
  std::vector<int> halfOpen;
  for (int i = 0; i < 20; ++i) halfOpen.push_back(rawConnect(h.port));  // beyond maxPending
  std::unique_ptr<PreparedConn> send, recv;
  // Half-open sockets hold slots until their deadline; the real connect gets through after.
  ASSERT_EQ(connectAndAccept(l, h, &send, &recv), ncclSuccess);
  // The garbage sender was answered (REJECT) and disconnected: reading reaches EOF.
  timeval tv{3, 0};
  setsockopt(garbage, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  ssize_t n;
  while ((n = read(garbage, buf, sizeof(buf))) > 0) {
  }
  EXPECT_TRUE(n == 0 || errno == ECONNRESET) << "listener kept the garbage connection open";
  close(garbage);
  for (int fd : halfOpen) close(fd);
  hs_->closeListener(l);
}

TEST_F(HandshakeTest, ActivationFailureRefusesTheConnector) {
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  transport_.failActivate = true;
  std::unique_ptr<PreparedConn> send, recv;
  EXPECT_EQ(connectAndAccept(l, h, &send, &recv), ncclRemoteError);
  hs_->closeListener(l);
}

// Calls accept as NCCL's thread does until it returns a connection or an error (or the test's
// own 10 s pass: ncclInProgress stands for "still nothing").
ncclResult_t acceptUntilDone(Handshaker* hs, const std::shared_ptr<Listener>& l, std::unique_ptr<PreparedConn>* out) {
  auto start = Clock::now();
  ncclResult_t r = ncclSuccess;
  while (r == ncclSuccess && *out == nullptr && Clock::now() - start < std::chrono::seconds(10)) {
    r = hs->pollAccept(l, out);
    std::this_thread::yield();
  }
  return r == ncclSuccess && *out == nullptr ? ncclInProgress : r;
}

// NCCL's IB transport fails accept() when the connection fails (2.30.7 net_ib/connect.cc,
// ncclIbAccept's fail path); without an error NCCL's thread (src/transport.cc, the connect
// loop of ncclTransportP2pSetup) calls accept() forever while the connecting rank has failed.
// A failure on the listener's side ends accept() once no connect can still be trying (two
// connect timeouts), with the reason, once.
TEST_F(HandshakeTest, AConnectThatFailedOnTheListenersSideFailsAcceptOnceNoOtherFollows) {
  makeHandshaker(8, /*timeoutMs=*/300);
  testing_support::WarnCapture warnings;
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  transport_.failActivate = true;
  std::unique_ptr<PreparedConn> send, recv;
  auto start = Clock::now();  // the failure comes after this
  ASSERT_EQ(connectAndAccept(l, h, &send, &recv), ncclRemoteError) << "the connector is refused";
  EXPECT_EQ(acceptUntilDone(hs_.get(), l, &recv), ncclSystemError) << "accept never ended";
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(600)) << "reported before two connect timeouts";
  EXPECT_EQ(recv, nullptr);
  EXPECT_NE(warnings.last().find("failed on this side: could not set up the RDMA side"), std::string::npos)
      << warnings.last();
  size_t lines = warnings.lines().size();
  EXPECT_EQ(hs_->pollAccept(l, &recv), ncclSystemError) << "the error stays";
  EXPECT_EQ(warnings.lines().size(), lines) << "reported once";
  hs_->closeListener(l);
}

// A relayed connect asks its next relay with the same token after one fails: the listener
// takes the second attempt, and accept() returns it, never the first one's failure.
TEST_F(HandshakeTest, AFailedConnectFollowedByAGoodOneIsAccepted) {
  makeHandshaker(8, /*timeoutMs=*/500);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  transport_.failActivate = true;
  std::unique_ptr<PreparedConn> send, recv;
  ASSERT_EQ(connectAndAccept(l, h, &send, &recv), ncclRemoteError);
  transport_.failActivate = false;
  send.reset();
  ASSERT_EQ(connectAndAccept(l, h, &send, &recv), ncclSuccess);
  EXPECT_NE(recv, nullptr);
  // Past the grace (1 s): the listener's state is the good connection's.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  std::unique_ptr<PreparedConn> more;
  EXPECT_EQ(hs_->pollAccept(l, &more), ncclSuccess) << "an old failure was reported";
  EXPECT_EQ(more, nullptr);
  hs_->closeListener(l);
}

// NCCL's IB transport waits for the peer's accept without a limit while the peer is there
// (2.30.7 net_ib/connect.cc: ncclIbConnect polls its socket for the accept side's QP info);
// NCCL connects lazily (NCCL_RUNTIME_CONNECT) and exchanges every peer's handle before it
// calls connect or accept, so a rank whose accept comes late only waits for a slower rank.
// Here: a live listener's accept() 2.5 connect timeouts after the connect still connects;
// NCCL_MESH_ACCEPT_WAIT_MS bounds the wait.
TEST_F(HandshakeTest, AConnectWaitsForALateAcceptPastTheConnectTimeout) {
  makeHandshaker(8, /*timeoutMs=*/300, /*peerTimeoutMs=*/6500, /*acceptWaitMs=*/10000);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  std::shared_ptr<Connector> c;
  ASSERT_EQ(hs_->startConnect(h, routesTo(h), ConnOptions(), &c), ncclSuccess);
  std::unique_ptr<PreparedConn> send, recv;
  auto lateAccept = Clock::now() + std::chrono::milliseconds(750);
  auto end = Clock::now() + std::chrono::seconds(10);
  ncclResult_t r = ncclSuccess;
  while (r == ncclSuccess && (send == nullptr || recv == nullptr) && Clock::now() < end) {
    if (send == nullptr) r = hs_->pollConnect(c, &send);
    if (r == ncclSuccess && recv == nullptr && Clock::now() >= lateAccept) r = hs_->pollAccept(l, &recv);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(r, ncclSuccess) << "the connect gave up before the late accept";
  ASSERT_NE(send, nullptr);
  ASSERT_NE(recv, nullptr);
  EXPECT_EQ(static_cast<FakeConn*>(send.get())->remoteQpn, static_cast<FakeConn*>(recv.get())->qpn);
  hs_->closeListener(l);
}

// The wait for accept has its bound: both ends give up at NCCL_MESH_ACCEPT_WAIT_MS, and the
// connect's error names it.
TEST_F(HandshakeTest, AConnectNobodyAcceptsEndsAtTheAcceptWait) {
  makeHandshaker(8, /*timeoutMs=*/300, /*peerTimeoutMs=*/6500, /*acceptWaitMs=*/900);
  testing_support::WarnCapture warnings;
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  auto start = Clock::now();
  std::unique_ptr<PreparedConn> send, recv;
  EXPECT_EQ(connectAndAccept(l, h, &send, &recv, /*callAccept=*/false), ncclRemoteError);
  auto took = Clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(900)) << "gave up before NCCL_MESH_ACCEPT_WAIT_MS";
  EXPECT_LT(took, std::chrono::milliseconds(5000));
  // Either end may give up first (the listener drops the parked HELLO at its own wait): the
  // connect's WARN names the setting either way.
  EXPECT_TRUE(warnings.has({"connect to", "NCCL_MESH_ACCEPT_WAIT_MS"})) << warnings.last();
  hs_->closeListener(l);
}

// A relay's leg is accepted by the relay at once: its connect waits the connect timeout for
// the ACCEPT, not NCCL_MESH_ACCEPT_WAIT_MS, so a hung relay costs one timeout before the next.
TEST_F(HandshakeTest, AConnectThatExpectsAnAcceptAtOnceEndsAtTheConnectTimeout) {
  makeHandshaker(8, /*timeoutMs=*/300, /*peerTimeoutMs=*/6500, /*acceptWaitMs=*/60000);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  ConnOptions opts;
  opts.acceptAtOnce = true;
  auto start = Clock::now();
  std::unique_ptr<PreparedConn> send, recv;
  // ncclInternalError: still waiting after the helper's 10 s.
  EXPECT_EQ(connectAndAccept(l, h, &send, &recv, /*callAccept=*/false, opts), ncclRemoteError);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  hs_->closeListener(l);
}

// A connect that fails beside another one still waiting for accept() (the same handle used
// twice; a two-relay connection's legs) does not fail accept(): the waiting one decides.
TEST_F(HandshakeTest, AFailureBesideAConnectWaitingForAcceptDoesNotFailIt) {
  makeHandshaker(8, /*timeoutMs=*/300, /*peerTimeoutMs=*/6500, /*acceptWaitMs=*/10000);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  std::shared_ptr<Connector> waiting, dropped;
  ASSERT_EQ(hs_->startConnect(h, routesTo(h), ConnOptions(), &waiting), ncclSuccess);
  ASSERT_EQ(hs_->startConnect(h, routesTo(h), ConnOptions(), &dropped), ncclSuccess);
  std::unique_ptr<PreparedConn> send, recv;
  // Both HELLOs parked: wait until neither connect can still be in its TCP step (the connect
  // timeout) and is pending, then drop one (its socket closes: a failure on this side).
  auto parked = Clock::now() + std::chrono::milliseconds(400);
  while (Clock::now() < parked) {
    ASSERT_EQ(hs_->pollConnect(waiting, &send), ncclSuccess);
    ASSERT_EQ(hs_->pollConnect(dropped, &send), ncclSuccess);
    ASSERT_EQ(send, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  hs_->discardConnect(dropped);
  // Past two connect timeouts after that failure, accept() is called: the live one connects.
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // the delay under test: a late accept
  auto end = Clock::now() + std::chrono::seconds(10);
  ncclResult_t ra = ncclSuccess, rc = ncclSuccess;
  while (ra == ncclSuccess && rc == ncclSuccess && (send == nullptr || recv == nullptr) && Clock::now() < end) {
    if (recv == nullptr) ra = hs_->pollAccept(l, &recv);
    if (send == nullptr) rc = hs_->pollConnect(waiting, &send);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(ra, ncclSuccess) << "accept failed with the dropped connect's failure";
  EXPECT_EQ(rc, ncclSuccess);
  EXPECT_NE(recv, nullptr);
  EXPECT_NE(send, nullptr);
  hs_->closeListener(l);
}

TEST_F(HandshakeTest, AnAcceptCalledAfterItsConnectorGaveUpFails) {
  makeHandshaker(8, /*timeoutMs=*/300);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  std::unique_ptr<PreparedConn> send, recv;
  ASSERT_EQ(connectAndAccept(l, h, &send, &recv, /*callAccept=*/false), ncclRemoteError);
  EXPECT_EQ(acceptUntilDone(hs_.get(), l, &recv), ncclRemoteError);
  EXPECT_EQ(recv, nullptr);
  hs_->closeListener(l);
}

// Raw header bytes: magic, version, type, length, reserved, token (little-endian).
std::vector<uint8_t> rawHeader(uint32_t length, uint16_t type = 1) {
  std::vector<uint8_t> h(24, 0);
  auto put = [&](size_t off, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) h[off + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  put(0, kHsMagic, 4);
  put(4, kHsVersion, 2);
  put(6, type, 2);
  put(8, length, 4);
  return h;
}

bool closedByPeer(int fd) {
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
  }
  return n == 0 || errno == ECONNRESET;
}

// The process out of descriptors (its soft limit lowered to what it holds plus a few, those
// taken by /dev/null), with a client socket made before, for a connection the kernel queues
// while the listener cannot take it. end() gives the descriptors back; so does the destructor.
class DescriptorShortage {
 public:
  DescriptorShortage() {
    client_ = socket(AF_INET, SOCK_STREAM, 0);
    if (client_ < 0 || getrlimit(RLIMIT_NOFILE, &saved_) != 0) return;
    rlimit low = saved_;
    low.rlim_cur = static_cast<rlim_t>(openFds() + 16);
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) return;
    lowered_ = true;
    for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers_.push_back(fd);
  }
  ~DescriptorShortage() {
    end();
    if (client_ >= 0) close(client_);
  }
  DescriptorShortage(const DescriptorShortage&) = delete;
  DescriptorShortage& operator=(const DescriptorShortage&) = delete;
  bool ok() const { return client_ >= 0 && lowered_; }
  // Connects the client to the listener's loopback port: 0, or the errno.
  int connectClient(uint16_t port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return connect(client_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 ? 0 : errno;
  }
  void end() {
    for (int fd : fillers_) close(fd);
    fillers_.clear();
    if (lowered_) setrlimit(RLIMIT_NOFILE, &saved_);
    lowered_ = false;
  }
  int client() const { return client_; }

 private:
  int client_ = -1;
  rlimit saved_{};
  bool lowered_ = false;
  std::vector<int> fillers_;
};

// A process out of file descriptors: accept4 fails with EMFILE and the connection stays
// queued, so the listening socket stays readable. The reactor pauses that socket for 100 ms
// at a time instead of spinning on it (thousands of failed accept4 calls in the half second
// below before), says why once, and takes the connection once descriptors are free again.
TEST_F(HandshakeTest, AListenerOutOfDescriptorsPausesInsteadOfSpinningAndAcceptsLater) {
  testing_support::WarnCapture warnings;
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  DescriptorShortage shortage;
  ASSERT_TRUE(shortage.ok()) << strerror(errno);
  uint64_t before = hs_->acceptShortages();
  int connectErr = shortage.connectClient(h.port);  // queued by the kernel
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the window the count covers
  uint64_t shortages = hs_->acceptShortages() - before;
  shortage.end();
  ASSERT_EQ(connectErr, 0) << strerror(connectErr);
  EXPECT_GE(shortages, 1u) << "accept4 never ran out of descriptors: the test did not set up its case";
  EXPECT_LE(shortages, 10u) << "the reactor spun on the listening socket";
  EXPECT_TRUE(warnings.has({"open-file limit"})) << warnings.last();
  // With descriptors back, the paused socket takes the queued connection: it is then a
  // pending handshake, and a garbage header from it gets it refused and closed.
  const char junk[32] = "not a handshake header, refused";
  ASSERT_EQ(write(shortage.client(), junk, sizeof(junk)), static_cast<ssize_t>(sizeof(junk)));
  EXPECT_TRUE(closedByPeer(shortage.client())) << "the queued connection was never taken";
  hs_->closeListener(l);
}

// A connection the listener cannot take for want of a descriptor is still its connection:
// NCCL's IB transport fails accept() at once there (its accept4 runs in NCCL's call). Here
// the kernel queues the connection while the listener waits for descriptors; a shortage
// that lasts two connect timeouts fails accept() with the reason.
TEST_F(HandshakeTest, AnAcceptWhoseConnectionCannotBeTakenForWantOfDescriptorsFails) {
  makeHandshaker(8, /*timeoutMs=*/300);
  testing_support::WarnCapture warnings;
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  DescriptorShortage shortage;
  ASSERT_TRUE(shortage.ok()) << strerror(errno);
  auto start = Clock::now();  // before the connect: the shortage it meets comes after
  int connectErr = shortage.connectClient(h.port);  // queued by the kernel
  std::unique_ptr<PreparedConn> recv;
  ncclResult_t r = connectErr == 0 ? acceptUntilDone(hs_.get(), l, &recv) : ncclInternalError;
  auto took = Clock::now() - start;
  shortage.end();
  ASSERT_EQ(connectErr, 0) << strerror(connectErr);
  EXPECT_EQ(r, ncclSystemError) << "accept never ended";
  EXPECT_GE(took, std::chrono::milliseconds(600)) << "reported before two connect timeouts";
  EXPECT_EQ(recv, nullptr);
  EXPECT_TRUE(warnings.has({"accept on port", "open-file limit"})) << warnings.last();
  hs_->closeListener(l);
}

// A shortage that ends in time is forgotten: the connection taken then (junk here) decides.
TEST_F(HandshakeTest, ADescriptorShortageThatEndsDoesNotFailAccept) {
  makeHandshaker(8, /*timeoutMs=*/300);
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  DescriptorShortage shortage;
  ASSERT_TRUE(shortage.ok()) << strerror(errno);
  uint64_t before = hs_->acceptShortages();
  int connectErr = shortage.connectClient(h.port);
  auto waitUntil = Clock::now() + std::chrono::seconds(10);
  while (hs_->acceptShortages() == before && Clock::now() < waitUntil) std::this_thread::yield();
  uint64_t shortages = hs_->acceptShortages() - before;
  shortage.end();
  ASSERT_EQ(connectErr, 0) << strerror(connectErr);
  ASSERT_GE(shortages, 1u) << "accept4 never ran out of descriptors: the test did not set up its case";
  const char junk[32] = "not a handshake header, refused";
  ASSERT_EQ(write(shortage.client(), junk, sizeof(junk)), static_cast<ssize_t>(sizeof(junk)));
  EXPECT_TRUE(closedByPeer(shortage.client())) << "the queued connection was never taken";
  // Past two connect timeouts from the shortage: accept() still waits for its connection.
  std::unique_ptr<PreparedConn> recv;
  auto end = Clock::now() + std::chrono::milliseconds(1200);
  ncclResult_t r = ncclSuccess;
  while (r == ncclSuccess && Clock::now() < end) {
    r = hs_->pollAccept(l, &recv);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(r, ncclSuccess);
  EXPECT_EQ(recv, nullptr);
  hs_->closeListener(l);
}

TEST_F(HandshakeTest, HugeLengthFieldIsRefusedWithoutBuffering) {
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  int fd = rawConnect(h.port);
  auto header = rawHeader(0xfffffff0u);
  ASSERT_EQ(write(fd, header.data(), header.size()), static_cast<ssize_t>(header.size()));
  EXPECT_TRUE(closedByPeer(fd));
  close(fd);
  std::unique_ptr<PreparedConn> send, recv;
  EXPECT_EQ(connectAndAccept(l, h, &send, &recv), ncclSuccess);
  hs_->closeListener(l);
}

TEST_F(HandshakeTest, TruncatedMessageTimesOutAndIsDropped) {
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  int fd = rawConnect(h.port);
  auto header = rawHeader(200);  // promises 200 bytes, sends only the header
  ASSERT_EQ(write(fd, header.data(), header.size()), static_cast<ssize_t>(header.size()));
  auto start = Clock::now();
  EXPECT_TRUE(closedByPeer(fd));  // dropped at the handshake deadline (1.5 s here)
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(6000));  // the deadline, not the read's 10 s
  close(fd);
  hs_->closeListener(l);
}

TEST_F(HandshakeTest, ScannerFloodDoesNotStopLegitimateConnects) {
  makeHandshaker(64);  // a bound well above what the reactor leaves unread in a busy moment
  std::shared_ptr<Listener> l;
  Handle h;
  ASSERT_EQ(hs_->listen(&l, &h), ncclSuccess);
  constexpr int kAttempts = 1000;
  std::atomic<int> attempts{0};
  // 1,000 connections at about 1,000 a second, half sending a byte of junk, half nothing.
  std::thread scanner([&] {
    for (int i = 0; i < kAttempts; ++i) {
      int fd = rawConnect(h.port);
      if (i % 2 == 0) {
        char junk = 'x';
        (void)!write(fd, &junk, 1);
      }
      close(fd);
      attempts.store(i + 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // pacing the flood, not syncing
    }
  });
  int during = 0;
  bool allOk = true;
  while (allOk && attempts.load() < kAttempts) {  // legitimate connects while the flood lasts
    std::unique_ptr<PreparedConn> send, recv;
    allOk = connectAndAccept(l, h, &send, &recv) == ncclSuccess;
    EXPECT_TRUE(allOk) << "legitimate connect " << during << " failed during the flood";
    ++during;
    // One legitimate connect per 50 scanner attempts, so the test does not exhaust the
    // loopback's ephemeral ports itself.
    int next = std::min(kAttempts, 50 * during);
    while (attempts.load() < next) std::this_thread::yield();
  }
  scanner.join();
  EXPECT_GE(during, 5);
  std::unique_ptr<PreparedConn> send, recv;  // and after
  EXPECT_EQ(connectAndAccept(l, h, &send, &recv), ncclSuccess);
  hs_->closeListener(l);
}

// A loopback TCP connection: *a and *b are its two ends, blocking.
void tcpPair(int* a, int* b) {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(l, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(listen(l, 1), 0);
  socklen_t len = sizeof(sa);
  ASSERT_EQ(getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  *b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(connect(*b, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  *a = accept(l, nullptr, nullptr);
  ASSERT_GE(*a, 0);
  close(l);
}

// What b's next recv() returns once a closed its end with one byte from b unread: 0 (end of
// stream) or -errno. Waits for the byte to be queued at a first, with a deadline.
int closeWithUnreadByte(void (*closeIt)(int)) {
  int a = -1, b = -1;
  tcpPair(&a, &b);
  if (a < 0 || b < 0) return -EBADF;
  char beat = 0;
  EXPECT_EQ(send(b, &beat, 1, 0), 1);
  pollfd p{a, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 5000), 1) << "the byte never reached the other end";
  closeIt(a);
  timeval tv{5, 0};
  setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[8];
  ssize_t n = recv(b, buf, sizeof(buf), 0);
  int result = n < 0 ? -errno : static_cast<int>(n);
  close(b);
  return result;
}

// The relay tells a closed end (deliver what it sent, then end) from a failed one by the
// control socket's end: EOF or an error. A heartbeat not yet read when the end closed made
// plain close() send a reset (ECONNRESET at the peer: a relayed connection torn down with a
// request pending, seen under load in fabric_e2e_relay_faults_cycles). closeStream must give
// an end of stream; plain close() is the contrast that shows the case is real.
TEST(CloseStream, APeerReadsEndOfStreamEvenWithBytesUnreadAtTheClosingEnd) {
  EXPECT_EQ(closeWithUnreadByte([](int fd) { close(fd); }), -ECONNRESET)
      << "plain close() with unread bytes no longer resets: the case this test guards is gone";
  EXPECT_EQ(closeWithUnreadByte(closeStream), 0) << "the peer must read an end of stream, not an error";
  closeStream(-1);  // harmless
}

}  // namespace
}  // namespace mesh
