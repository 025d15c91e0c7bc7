// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cstdlib>

#include "scenarios.h"

namespace e2e {

std::set<std::string> commonOptions() {
  return {"rank", "nodes", "shared", "deadline", "plugin", "dev", "verbose", "seed", "run-id",
          "api", "traffic-class"};
}

std::set<std::string> withCommon(std::set<std::string> extra) {
  std::set<std::string> all = commonOptions();
  all.insert(extra.begin(), extra.end());
  return all;
}

double envSeconds(const char* name, double fallbackMs) {
  const char* v = getenv(name);
  return (v && atoi(v) > 0 ? atoi(v) : fallbackMs) / 1000.0;
}

void requireNodes(const Context& ctx, int nodes) {
  if (nodes == 0 && ctx.nodes < 2) {
    fail("%s needs at least 2 ranks, this run has %d", ctx.scenario.c_str(), ctx.nodes);
  }
  if (nodes > 0 && ctx.nodes != nodes) {
    fail("%s needs exactly %d ranks, this run has %d (vmesh run --nodes %d)",
         ctx.scenario.c_str(), nodes, ctx.nodes, nodes);
  }
}

std::vector<int> otherRanks(const Context& ctx) {
  std::vector<int> out;
  for (int r = 0; r < ctx.nodes; ++r) {
    if (r != ctx.rank) out.push_back(r);
  }
  return out;
}

int cabled(const Context& ctx, int i, int j) {
  int d = std::abs(i - j);
  if (ctx.topology == "full" || ctx.topology == "switch") return 1;  // a switch: every pair one hop
  if (ctx.topology == "ring") return d == 1 || d == ctx.nodes - 1 ? 1 : 0;
  if (ctx.topology == "line") return d == 1 ? 1 : 0;
  return -1;
}

std::string RouteReport::describe() const {
  std::string out;
  for (const auto& kv : netdevs) {
    out += format("%speer %d via", out.empty() ? "" : "; ", kv.first);
    for (const auto& nd : kv.second) out += format(" %s x%d", nd.first.c_str(), nd.second);
    auto s = sendLines.find(kv.first), r = recvLines.find(kv.first);
    out += format(" (send %d, recv %d)", s == sendLines.end() ? 0 : s->second,
                  r == recvLines.end() ? 0 : r->second);
  }
  if (ncclIb) return "NCCL IB (no conn lines)";
  return out.empty() ? "no conn lines" : out;
}

RouteReport checkRouting(Context& ctx, size_t mark, const std::set<int>& peers) {
  RouteReport report;
  report.ncclIb = ctx.net.isNcclIb();
  for (const ConnLine& c : ctx.net.connLines(mark)) {
    int peer = labNodeOf(c.peer);
    if (peer < 0 || peers.count(peer) == 0) {
      fail("conn line names peer %s, which is not a lab node this rank connected with: %s",
           c.peer.c_str(), c.raw.c_str());
    }
    if (!isNetdevTowards(c.netdev, peer)) {
      fail("rank %d's connection to rank %d (peer %s) used local netdev %s, not one cabled to "
           "rank %d (p%d or p%db...): %s",
           ctx.rank, peer, c.peer.c_str(), c.netdev.c_str(), peer, peer, peer, c.raw.c_str());
    }
    if (!c.addr.empty() && labLinkOf(c.addr) != labLinkOf(c.peer)) {
      fail("rank %d's connection to rank %d: local address %s is not on the peer's link "
           "subnet (%s): %s", ctx.rank, peer, c.addr.c_str(), c.peer.c_str(), c.raw.c_str());
    }
    (c.dir == "send" ? report.sendLines : report.recvLines)[peer]++;
    report.netdevs[peer][c.netdev]++;
    report.ports[peer].insert(format("%s:%d", c.dev.c_str(), c.port));
    report.mtu[peer] = c.mtu;
  }
  return report;
}

void requireConnLines(const RouteReport& r, const std::set<int>& peers, int perDirection) {
  if (r.ncclIb) return;
  for (int peer : peers) {
    auto s = r.sendLines.find(peer), v = r.recvLines.find(peer);
    int ns = s == r.sendLines.end() ? 0 : s->second;
    int nr = v == r.recvLines.end() ? 0 : v->second;
    if (ns < perDirection || nr < perDirection) {
      fail("expected at least %d INFO 'conn send' and %d 'conn recv' lines for peer rank %d "
           "(the plugin logs one per connection per link), got %d and %d; routing of the "
           "others cannot be checked",
           perDirection, perDirection, peer, ns, nr);
    }
  }
}

std::string Snapshot::describe() const {
  return format("fds %d, rdma %s", fds, describeResources(res).c_str());
}

namespace {
Snapshot takeSnapshot() {
  Snapshot s;
  s.res = rdmaResources();  // first: spawning the tool briefly opens a pipe
  s.fds = countOpenFds();
  return s;
}
bool same(const Snapshot& a, const Snapshot& b) {
  return a.fds == b.fds && diffResources(a.res, b.res).empty() && a.res.ok == b.res.ok;
}
}  // namespace

int countLog(Context& ctx, size_t mark, const std::string& needle) {
  int n = 0;
  for (const LogLine& l : ctx.net.logSince(mark)) n += l.text.find(needle) != std::string::npos ? 1 : 0;
  return n;
}

std::vector<RelayedConnect> relayedConnects(Context& ctx, size_t mark) {
  static const std::string kConnected = "relay: connected to ", kVia = " via ";
  std::vector<RelayedConnect> out;
  for (const LogLine& l : ctx.net.logSince(mark)) {
    size_t at = l.text.find(kConnected), via = l.text.find(kVia);
    if (at == std::string::npos || via == std::string::npos) continue;
    std::string target = l.text.substr(at + kConnected.size()), relay = l.text.substr(via + kVia.size());
    RelayedConnect c;
    c.target = labNodeOf(target.substr(0, target.find_first_of(" ,")));
    c.via = labNodeOf(relay.substr(0, relay.find_first_of(" ,(")));
    size_t leg = l.text.find("; leg ");
    if (leg != std::string::npos && l.text.find(" of a two-relay connection", leg) != std::string::npos) {
      c.leg = atoi(l.text.c_str() + leg + 6);
    }
    c.line = l.text;
    out.push_back(c);
  }
  return out;
}

Snapshot stableSnapshot(double seconds) {
  Deadline d(seconds, "resource counts to settle");
  Snapshot prev = takeSnapshot();
  while (!d.expired()) {
    pollPause(100 * 1000);
    Snapshot now = takeSnapshot();
    if (same(prev, now)) return now;
    prev = now;
  }
  return prev;
}

// Only growth is a leak. A count below the baseline means the baseline caught something of
// the run before still closing (the handshake thread closes sockets when it gets to them,
// and stableSnapshot's quiet 100 ms proves nothing on a loaded machine).
std::string compareToBaseline(const Snapshot& base, double seconds, Snapshot* now) {
  Deadline d(seconds, "resource counts to return to the baseline");
  for (;;) {
    *now = takeSnapshot();
    std::string diff = grownResources(base.res, now->res);
    if (now->fds > base.fds) {
      diff = format("open fds %d -> %d%s%s", base.fds, now->fds, diff.empty() ? "" : ", ",
                    diff.c_str());
    }
    if (diff.empty() || d.expired()) return diff;
    pollPause(200 * 1000);
  }
}

int threadsSettled(int base, double seconds) {
  Deadline d(seconds, "the thread count to return to the baseline");
  for (;;) {
    int n = countThreads();
    if (n == base || d.expired()) return n;
    pollPause(50 * 1000);
  }
}

}  // namespace e2e
