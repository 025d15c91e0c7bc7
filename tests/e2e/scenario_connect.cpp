// SPDX-License-Identifier: Apache-2.0
// Connection scenarios: many comms at once over a full mesh (connect-mesh), the routing
// error for an uncabled peer (ring-diagonal), and 200 open/use/close cycles with a leak
// check (cycles).
#include <algorithm>
#include <functional>

#include "comm_setup.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

double maxOf(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// Rank 0 -> rank 2 in a 4-node ring: no cable, so connect must fail with the routing
// error (and a WARN saying so) well within `timeout`.
std::string diagonalMustFail(Context& ctx, double timeout) {
  setPhase("rank 0 connecting to rank 2 across the missing diagonal");
  std::string handle = ctx.rv->fetch("h.2.0.diag", ctx.deadline, "rank 2's diagonal handle");
  size_t warnMark = ctx.net.logSize();
  ConnectDriver driver(ctx);
  PendingConn* diag = driver.addConnect(2, 0, handle, "connect rank0->rank2 (diagonal)");
  diag->mayFail = true;
  diag->giveUp = Deadline(timeout, "--diag-timeout");
  driver.drive(ctx.deadline);
  if (diag->comm != nullptr) {
    fail("connect rank0->rank2 across the missing diagonal SUCCEEDED (comm %p) after %.2f s; "
         "there is no cable between them, so it must fail with a routing error",
         diag->comm, diag->seconds());
  }
  if (diag->timedOut) {
    fail("connect rank0->rank2 across the missing diagonal neither failed nor succeeded in "
         "%.1f s (%ld calls returned a NULL comm); expected an immediate routing error",
         timeout, diag->calls);
  }
  std::string warnLine = ctx.net.findWarn("no local RoCEv2 port shares a subnet", warnMark);
  if (warnLine.empty()) {
    fail("connect rank0->rank2 failed with %s after %.2f s, but no WARN containing 'no local "
         "RoCEv2 port shares a subnet' was logged (last WARN: %s)",
         resultName(diag->rc), diag->seconds(), ctx.net.lastWarn().c_str());
  }
  say("diagonal connect failed as expected in %.3f s with %s; WARN: %s", diag->seconds(),
      resultName(diag->rc), warnLine.c_str());
  return format("diagonal_error=%s diagonal_s=%.3f ", resultName(diag->rc), diag->seconds());
}

}  // namespace

// Every rank opens --comms (8) send comms and 8 recv comms to every other rank, all
// pending connects and accepts driven together; every connection must leave on the
// netdev cabled to its peer.
std::string runConnectMesh(Context& ctx) {
  requireNodes(ctx, 0);
  int comms = static_cast<int>(ctx.opts.integer("comms", 8));
  std::vector<int> peers = otherRanks(ctx);
  std::set<int> peerSet(peers.begin(), peers.end());
  size_t mark = ctx.net.logSize();
  Clock::time_point t0 = Clock::now();
  CommTable table = establish(ctx, {peers, peers, comms, "mesh"}, ctx.deadline);
  double upSeconds = secondsSince(t0);
  double slowest = 0;
  for (auto& kv : table) {
    slowest = std::max({slowest, maxOf(kv.second.connectSeconds), maxOf(kv.second.acceptSeconds)});
  }
  say("all %zu comms up in %.2f s (slowest single connect/accept %.2f s)",
      peers.size() * static_cast<size_t>(comms) * 2, upSeconds, slowest);

  // Everyone's accepts must have returned before anyone closes a send comm.
  ctx.barrier("mesh-up");
  setPhase("checking routing from the conn lines");
  RouteReport route = checkRouting(ctx, mark, peerSet);
  say("routing: %s", route.describe().c_str());
  requireConnLines(route, peerSet, comms);
  closeAll(ctx, table);
  ctx.barrier("mesh-closed");
  return format("peers=%zu comms_per_peer=%d(send)+%d(recv) up_s=%.2f slowest_s=%.2f routing=[%s]",
                peers.size(), comms, comms, upSeconds, slowest, route.describe().c_str());
}

// 4-node ring: neighbours connect; rank 0 -> rank 2 (not cabled) must fail with the
// routing error, and rank 0 must still connect to a neighbour afterwards.
std::string runRingDiagonal(Context& ctx) {
  requireNodes(ctx, 4);
  if (!ctx.topology.empty() && ctx.topology != "ring") {
    fail("ring-diagonal needs the ring topology (vmesh run --topology ring), this run is '%s'",
         ctx.topology.c_str());
  }
  double diagTimeout = ctx.opts.real("diag-timeout", 60);
  std::vector<int> neighbours = {ctx.next(), ctx.prev()};
  std::set<int> neighbourSet(neighbours.begin(), neighbours.end());
  size_t mark = ctx.net.logSize();

  // Extra listeners first, so their handles are there whenever rank 0 looks.
  void* diagListen = nullptr;
  if (ctx.rank == 2) diagListen = listenAndPublish(ctx, "h.2.0.diag", "listen for rank0 (diagonal)");

  CommTable ring = establish(ctx, {neighbours, neighbours, 1, "ring"}, ctx.deadline);
  ctx.barrier("ring-up");
  RouteReport route = checkRouting(ctx, mark, neighbourSet);
  requireConnLines(route, neighbourSet, 1);
  say("neighbours up: %s", route.describe().c_str());

  std::string figures = ctx.rank == 0 ? diagonalMustFail(ctx, diagTimeout) : std::string();

  // Rank 0 is still healthy: a fresh pair of comms with rank 1 carries data.
  setPhase("rank 0 <-> rank 1 after the diagonal failure");
  CommTable after;
  if (ctx.rank == 0 || ctx.rank == 1) {
    int peer = 1 - ctx.rank;
    after = establish(ctx, {{peer}, {peer}, 1, "after"}, ctx.deadline);
    exchangeSmall(ctx, peer, after[peer].send[0], after[peer].recv[0], 1,
                  format("after-diagonal rank%d<->rank%d", ctx.rank, peer));
    say("connection rank0<->rank1 after the diagonal failure works");
  }
  ctx.barrier("diag-done");
  closeAll(ctx, after);
  closeAll(ctx, ring);
  if (diagListen != nullptr) {
    ctx.net.check(ctx.net->closeListen(diagListen), "closeListen", "rank 2's diagonal listener");
  }
  ctx.barrier("closed");
  return figures + format("neighbours=[%s]", route.describe().c_str());
}

std::string cyclesBetween(Context& ctx, int a, int b, int count, int checkAt, const std::function<void()>& settle) {
  if (count < 1 || checkAt < 1 || checkAt > count) {
    fail("need 1 <= --check-at (%d) <= --count (%d)", checkAt, count);
  }
  bool cycling = ctx.rank == a || ctx.rank == b;
  int peer = ctx.rank == a ? b : a;
  std::vector<double> times;
  Snapshot base, last;
  auto cycle = [&](int c) {
    Clock::time_point t0 = Clock::now();
    std::string tag = format("c%d", c);
    CommTable t = establish(ctx, {{peer}, {peer}, 1, tag}, ctx.deadline);
    setPhase(format("cycle %d/%d: exchange", c, count));
    exchangeSmall(ctx, peer, t[peer].send[0], t[peer].recv[0], static_cast<uint64_t>(c),
                  format("cycle %d rank%d<->rank%d", c, ctx.rank, peer));
    closeAll(ctx, t);
    times.push_back(secondsSince(t0));
    if (c % 50 == 0) say("cycle %d/%d: %.3f s (median so far %.3f s)", c, count, times.back(), median(times));
  };
  for (int c = 1; cycling && c <= checkAt; ++c) cycle(c);
  // Every rank (those not cycling too: they may serve the cycles, e.g. as a relay) takes
  // its baseline after cycle checkAt.
  ctx.barrier(format("cycle-%d", checkAt));
  setPhase(format("cycle %d: resource baseline", checkAt));
  if (settle) settle();
  base = stableSnapshot(5);
  say("after cycle %d: %s", checkAt, base.describe().c_str());
  if (!base.res.ok) warn("rdma resource counts unavailable, checking fds only: %s", base.res.error.c_str());
  // Nobody starts the next cycle before every rank has its baseline (a relay's would see it).
  ctx.barrier(format("baseline-%d", checkAt));
  for (int c = checkAt + 1; cycling && c <= count; ++c) cycle(c);
  ctx.barrier("cycles-done");
  setPhase("comparing resources to the baseline");
  if (settle) settle();
  std::string leak = compareToBaseline(base, 10, &last);
  say("after cycle %d: %s", count, last.describe().c_str());
  std::string figures = format("cycles=%d", count);
  if (cycling) {
    double mn = *std::min_element(times.begin(), times.end());
    double mx = *std::max_element(times.begin(), times.end());
    figures += format(" cycle_s min=%.3f median=%.3f max=%.3f", mn, median(times), mx);
  } else {
    figures += format(" (rank %d <-> rank %d; this rank only served)", a, b);
  }
  figures += format(" at_%d=[%s] at_%d=[%s]", checkAt, base.describe().c_str(), count, last.describe().c_str());
  if (!leak.empty()) fail("resource leak between cycle %d and cycle %d: %s (%s)", checkAt, count, leak.c_str(), figures.c_str());
  return figures;
}

// 2 nodes: --count (200) times listen, connect/accept, one 8-byte exchange each way,
// close everything. Open fds and kernel RDMA objects must be the same after cycle
// --check-at (10) and after the last one.
std::string runCycles(Context& ctx) {
  requireNodes(ctx, 2);
  return cyclesBetween(ctx, 0, 1, static_cast<int>(ctx.opts.integer("count", 200)),
                       static_cast<int>(ctx.opts.integer("check-at", 10)));
}

}  // namespace e2e
