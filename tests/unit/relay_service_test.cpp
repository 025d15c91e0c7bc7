// SPDX-License-Identifier: Apache-2.0
// The relay service's front door (mesh/relay/relay_service.h) over real sockets on 127.0.0.1,
// its node's one port a fake RDMA device with that address: what connections that never
// send a whole RELAY-OPEN (a port scan, a half-open socket, a peer gone quiet) may cost.
// And the requesting side (RelayConnector) against relays that never answer: how long it
// asks, and whom.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fake_rdma.h"
#include "fifo_pair.h"
#include "mesh/connect/reactor.h"
#include "mesh/platform/log.h"
#include "mesh/relay/relay_proto.h"
#include "mesh/relay/relay_service.h"
#include "warn_capture.h"

using mesh::testing_support::WarnCapture;

namespace mesh {
namespace fake {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kLoopback = 0x7f000001u;

// A port nobody listens on right now (the relay binds it a moment later).
int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(kLoopback);
  socklen_t len = sizeof(sa);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  return ntohs(sa.sin_port);
}

int connectTo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(kLoopback);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

// True once the relay closed `fd` (end of stream) within `ms`; false while it stays open.
bool closedByRelay(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return false;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

// True once the other end closed `fd` within `ms`, whatever it sent before (read and dropped).
bool endOfStream(int fd, int ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return errno == ECONNRESET;
  }
}

// The relay thread's CPU time so far (user + system, clock ticks), -1 when it is not found.
long relayThreadTicks() {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  long ticks = -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::string comm;
    std::getline(std::ifstream(dir + "/comm"), comm);
    if (comm != "mesh-relay") continue;
    std::string stat;
    std::getline(std::ifstream(dir + "/stat"), stat);
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    std::istringstream in(stat.substr(stat.rfind(')') + 2));
    std::string field;
    long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
      if (i == 14) utime = std::stol(field);
      if (i == 15) stime = std::stol(field);
    }
    ticks = utime + stime;
  }
  closedir(d);
  return ticks;
}

// A listening socket on 127.0.0.1 that accepts (the kernel does) and never answers: a
// target C whose process stopped. Its port in *port.
int silentListener(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(kLoopback);
  socklen_t len = sizeof(sa);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(fd, 8) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(sa.sin_port);
  return fd;
}

// A RELAY-OPEN for the listener at 127.0.0.1:port (cabled to the relay: its one port is on
// 127.0.0.0/24), written whole to fd.
void sendOpen(int fd, int port, uint64_t request, uint32_t target = kLoopback, int hopBudget = 1) {
  RelayMessage open;
  open.type = RelayType::Open;
  open.open.origin = 7;
  open.open.request = request;
  open.open.hopBudget = hopBudget;
  open.open.target.port = static_cast<uint16_t>(port);
  open.open.target.token = 1;
  open.open.target.addrs.push_back(HandleAddress{target, 24, 0});
  std::vector<uint8_t> bytes;
  std::string error;
  ASSERT_TRUE(encodeRelay(open, &bytes, &error)) << error;
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

class RelayServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setFallbackLevel(NCCL_LOG_NONE);
    addFakePort(fake_, &disc_, "lo0", kLoopback);
    ASSERT_EQ(reactor_.start(), ncclSuccess);
  }
  void TearDown() override {
    for (int fd : clients_) close(fd);
    // As the plugin's shutdown: the relay's thread, then the reactor (its tasks may still
    // point at the relay's Handshaker), then the relay's objects.
    if (svc_ != nullptr) svc_->stop();
    reactor_.stop();
    svc_.reset();
    setFallbackLevel(NCCL_LOG_WARN);
  }
  // A relay serving 127.0.0.1 that keeps at most `maxPending` silent connections.
  void startRelay(size_t maxPending, RelayLookup lookup = RelayLookup()) {
    CommSettings comm;
    comm.ops = fake_.ops();
    HandshakeSettings hs;
    hs.timeoutMs = 30000;
    RelaySettings rs;
    rs.maxPending = maxPending;
    rs.timeoutMs = 30000;  // a silent connection is never timed out during the test
    for (int attempt = 0; attempt < 20; ++attempt) {
      rs.port = freePort();
      ASSERT_GT(rs.port, 0);
      svc_ = std::make_unique<RelayService>(&disc_, &reactor_, comm, hs, rs, /*self=*/1, lookup);
      ASSERT_EQ(svc_->start(), ncclSuccess);
      if (svc_->serving()) break;  // another process took the port in between: try another
      svc_.reset();
    }
    ASSERT_NE(svc_, nullptr);
    ASSERT_TRUE(svc_->serving());
    port_ = rs.port;
  }
  int client() {
    int fd = connectTo(port_);
    EXPECT_GE(fd, 0) << strerror(errno);
    clients_.push_back(fd);
    return fd;
  }

  FakeRdma fake_;
  Discovery disc_;
  Reactor reactor_;
  std::unique_ptr<RelayService> svc_;
  int port_ = 0;
  std::vector<int> clients_;
};

TEST_F(RelayServiceTest, SilentConnectionsAreBoundedAndLeaveTheThreadIdle) {
  startRelay(/*maxPending=*/4);
  WarnCapture warnings;
  std::vector<int> silent;
  for (int i = 0; i < 7; ++i) silent.push_back(client());
  // Only silent connections: the relay thread sleeps in poll(). (It spun, a whole core, for
  // as long as any connection was open: up to the 30 s connect timeout per scanner's socket.)
  long before = -1;
  for (auto until = Clock::now() + std::chrono::seconds(10); before < 0 && Clock::now() < until;) {
    before = relayThreadTicks();  // the thread names itself once it runs
    if (before < 0) std::this_thread::yield();
  }
  ASSERT_GE(before, 0) << "no thread named mesh-relay";
  auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  long used = relayThreadTicks() - before;
  double wallTicks = std::chrono::duration<double>(Clock::now() - start).count() * sysconf(_SC_CLK_TCK);
  EXPECT_LT(used, wallTicks * 0.3) << "the relay thread used " << used << " of " << wallTicks
                                   << " clock ticks while only silent connections were open";

  // The three oldest are closed (in the order they came), the four newest kept.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(closedByRelay(silent[i], 10000)) << "connection " << i << " still open";
  for (int i = 3; i < 7; ++i) EXPECT_FALSE(closedByRelay(silent[i], 0)) << "connection " << i << " was closed";

  // A real request still gets its answer: here a refusal (the target is not cabled to this
  // relay and the hop budget allows no other), which the newest connection reads.
  int fd = client();
  RelayMessage open;
  open.type = RelayType::Open;
  open.open.origin = 7;
  open.open.request = 42;
  open.open.hopBudget = 1;
  open.open.target.port = 1;
  open.open.target.token = 1;
  open.open.target.addrs.push_back(HandleAddress{(198u << 24) | (18u << 16) | (9u << 8) | 2u, 24, 0});
  std::vector<uint8_t> bytes;
  std::string error;
  ASSERT_TRUE(encodeRelay(open, &bytes, &error)) << error;
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  std::vector<uint8_t> in;
  long need = 0;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((need == 0 || in.size() < static_cast<size_t>(need)) && Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    uint8_t buf[kRelayMaxMessage];
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    ASSERT_GT(n, 0) << "the relay closed the request's connection without an answer";
    in.insert(in.end(), buf, buf + n);
    need = relayMessageLength(in.data(), in.size(), &error);
    ASSERT_GE(need, 0) << error;
  }
  ASSERT_GT(need, 0) << "no answer within 10 s";
  RelayMessage reply;
  ASSERT_TRUE(parseRelay(in.data(), static_cast<size_t>(need), &reply, &error)) << error;
  ASSERT_EQ(reply.type, RelayType::OpenReply);
  EXPECT_EQ(reply.reply.request, 42u);
  EXPECT_EQ(reply.reply.status, RelayStatus::HopBudget) << reply.reply.reason;
  // Room for it was made by closing the oldest silent connection left.
  EXPECT_TRUE(closedByRelay(silent[3], 10000));
  EXPECT_FALSE(closedByRelay(silent[6], 0));

  // One WARN for the first eviction, INFO after it (read once the relay thread is joined).
  svc_->stop();
  int evictionWarnings = 0;
  for (const std::string& line : warnings.lines()) {
    evictionWarnings += line.find("have not sent a request; closed the oldest") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(evictionWarnings, 1);
}

// A requester that hangs up while the relay is still connecting to C (its own wait ran out, or
// its two-relay attempt ended): the relay stops building that connection and gives back its
// staging memory at once, not at the relay's own deadline (30 s here).
TEST_F(RelayServiceTest, ARequesterThatHangsUpWhileTheRelayConnectsIsDroppedAtOnce) {
  startRelay(/*maxPending=*/16);
  int cPort = 0;
  int c = silentListener(&cPort);
  ASSERT_GE(c, 0) << strerror(errno);
  clients_.push_back(c);
  int fd = client();
  sendOpen(fd, cPort, 43);
  // The relay took the request: it reserved a ring and its handshake reached C.
  pollfd p{c, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "the relay never connected to the target";
  int toC = accept4(c, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(toC, 0) << strerror(errno);
  clients_.push_back(toC);
  EXPECT_GT(svc_->ringBytesInUse(), 0u);

  close(fd);  // the requester gives up
  clients_.erase(std::find(clients_.begin(), clients_.end(), fd));
  EXPECT_TRUE(endOfStream(toC, 10000)) << "the relay kept its connection to the target";
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (svc_->ringBytesInUse() != 0 && Clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(svc_->ringBytesInUse(), 0u) << "the dropped request still holds its staging memory";
}

// What a request's step throws (std::bad_alloc, say) ends that request, logged, and the relay
// thread goes on serving: out of the thread, the exception called std::terminate and aborted
// NCCL's process. Here the route lookup for an onward hop throws (the target, 127.0.5.1, is
// on none of the relay's subnets, and the hop budget lets it forward).
TEST_F(RelayServiceTest, ARequestWhoseStepThrowsIsEndedAndTheRelayGoesOn) {
  startRelay(/*maxPending=*/16, [](const std::vector<HandleAddress>&, NodeId, const std::vector<NodeId>&,
                                   bool) -> std::vector<NextHop> { throw std::runtime_error("lookup boom"); });
  WarnCapture warnings;
  int fd = client();
  sendOpen(fd, /*port=*/9, 44, kLoopback + (5u << 8), /*hopBudget=*/2);
  EXPECT_TRUE(endOfStream(fd, 10000)) << "the request whose step threw was kept";
  // Still serving: the next request reaches its target.
  int cPort = 0;
  int c = silentListener(&cPort);
  ASSERT_GE(c, 0) << strerror(errno);
  clients_.push_back(c);
  sendOpen(client(), cPort, 45);
  pollfd p{c, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 10000), 1) << "the relay stopped serving after the exception";
  svc_->stop();  // the relay thread logged: read the capture after it is joined
  bool logged = false;
  for (const std::string& w : warnings.lines()) {
    logged = logged || w.find("mesh-relay: a relay request failed: lookup boom; it goes on") != std::string::npos;
  }
  EXPECT_TRUE(logged) << ::testing::PrintToString(warnings.lines());
}

// A RelayConnector's candidate relays at 127.0.0.1, .2, .3, each a listener on one port that
// takes connections and never reads them (a stopped relay process: its kernel still completes
// the TCP handshake). The connector has no Handshaker: no relay ever answers, so no leg starts.
class RelayConnectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int attempt = 0; attempt < 20 && listeners_.empty(); ++attempt) {
      int port = freePort();
      ASSERT_GT(port, 0);
      std::vector<int> fds;
      for (uint32_t i = 0; i < 3; ++i) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(kLoopback + i);
        sa.sin_port = htons(static_cast<uint16_t>(port));
        if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(fd, 8) != 0) {
          if (fd >= 0) close(fd);
          break;  // the port was taken meanwhile: another one
        }
        fds.push_back(fd);
      }
      if (fds.size() == 3) {
        listeners_ = fds;
        port_ = port;
      } else {
        for (int fd : fds) close(fd);
      }
    }
    ASSERT_EQ(listeners_.size(), 3u) << "no port free on 127.0.0.1-3";
  }
  void TearDown() override {
    for (int fd : listeners_) close(fd);
  }
  std::unique_ptr<RelayConnector> connector(RelayConnectSettings s) {
    std::vector<NextHop> hops(3);
    for (uint32_t i = 0; i < 3; ++i) {
      hops[i].peerAddr = 0xc6120909u;  // 198.18.9.9, the target
      hops[i].route.hops = 1;
      hops[i].route.nextHop = 100 + i;
      hops[i].route.nextHopAddr = kLoopback + i;
    }
    Handle target;
    target.token = 1;
    target.port = 1;
    target.addrs.push_back(HandleAddress{0xc6120909u, 24, 0});
    s.port = port_;
    s.self = 7;
    return std::make_unique<RelayConnector>(nullptr, std::vector<LocalNic>{}, target,
                                            [hops](bool) { return hops; }, ConnOptions{}, s);
  }
  // Polls as NCCL's connect does until the connector fails (true) or 20 s passed.
  static bool pollUntilFailed(RelayConnector* c) {
    auto giveUp = Clock::now() + std::chrono::seconds(20);
    std::unique_ptr<PreparedConn> out;
    while (Clock::now() < giveUp) {
      if (c->poll(&out) != ncclSuccess) return true;
      EXPECT_EQ(out, nullptr);
      std::this_thread::yield();
    }
    return false;
  }
  // Whether relay i was connected to (its listener has a connection waiting).
  bool asked(int i) const {
    pollfd p{listeners_[static_cast<size_t>(i)], POLLIN, 0};
    return poll(&p, 1, 0) == 1;
  }
  std::vector<int> listeners_;
  int port_ = 0;
};

// Without an end (a relay's onward connect), every candidate gets its own timeout in turn.
TEST_F(RelayConnectorTest, WithoutAnEndEverySilentRelayIsAskedInTurn) {
  RelayConnectSettings s;
  s.timeoutMs = 150;
  auto c = connector(s);
  ASSERT_TRUE(pollUntilFailed(c.get())) << "the connect did not fail";
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(asked(i)) << "relay " << i << " was never asked" << c->tried();
    std::string line = "via 127.0.0." + std::to_string(i + 1) + ": no answer within 150 ms";
    EXPECT_NE(c->tried().find(line), std::string::npos) << c->tried();
  }
  EXPECT_EQ(c->tried().find("connect's end"), std::string::npos) << c->tried();
}

// With an end (TwinConnector's: twice the timeout after the connect began), the connect gives
// up the relay it waits on there and asks no other: the third relay never sees a connection,
// and the failure names it.
TEST_F(RelayConnectorTest, TheConnectsEndStopsItAtTheRelayItWaitsOnAndNamesTheRest) {
  RelayConnectSettings s;
  s.timeoutMs = 300;
  s.endBy = Clock::now() + std::chrono::milliseconds(450);
  auto c = connector(s);
  ASSERT_TRUE(pollUntilFailed(c.get())) << "the connect did not fail";
  EXPECT_TRUE(asked(0));
  EXPECT_FALSE(asked(2)) << "the third relay was asked after the connect's end" << c->tried();
  std::string tried = c->tried();
  EXPECT_NE(tried.find("via 127.0.0.1: no answer within 300 ms (NCCL_MESH_CONNECT_TIMEOUT_MS)"), std::string::npos)
      << tried;
  EXPECT_NE(tried.find("via 127.0.0.3: not asked before the connect's end"), std::string::npos) << tried;
  // The second was either given up at the end or (a slow poll) not asked at all.
  EXPECT_TRUE(tried.find("via 127.0.0.2: no answer before the connect's end (twice NCCL_MESH_CONNECT_TIMEOUT_MS, "
                         "600 ms, after it began)") != std::string::npos ||
              tried.find("via 127.0.0.2: not asked before the connect's end") != std::string::npos)
      << tried;
}

}  // namespace
}  // namespace fake
}  // namespace mesh
