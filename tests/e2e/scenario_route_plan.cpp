// SPDX-License-Identifier: Apache-2.0
// route-plan (issue 31): every node computes the same relay route table from the HELLOs, and
// relayed connects follow it while every node's view agrees; connections come up with the
// fallback rule while views disagree.
//   --expect agree (default)  every rank's plugin logs "route plan in use: all N nodes agree"
//                             with one table digest, the same on every rank; every ordered
//                             pair connects and carries data; every relayed connect says it
//                             followed the route plan; on a 4-ring each of the 8 cable
//                             directions carries exactly one relayed pair. A two-relay
//                             connection's second leg (the other way as short) is counted
//                             apart (two_relays=) and must pair with a first leg.
//   --expect disagree         run with MESH_TEST_DROP_HELLOS_FROM naming one cable end's
//                             address (route_service.h): every rank logs "route plan views
//                             disagree" naming the half-heard cable; every ordered pair still
//                             connects and carries data, every relayed connect by the fallback rule.
// Power-of-two node counts (the exchange pairs rank with rank ^ k).
#include <algorithm>
#include <map>
#include <set>

#include "comm_setup.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

constexpr double kViewSeconds = 30;  // for the views to settle (agree) or the disagreement to be logged

// The first plugin log line containing `needle` (and `also`, when not empty), polled until the
// deadline; fails naming what it waited for.
std::string waitForLogLine(Context& ctx, const std::string& needle, const std::string& also) {
  Deadline d = Deadline(kViewSeconds, "the plugin to log '" + needle + "'").min(ctx.deadline);
  for (;;) {
    for (const LogLine& l : ctx.net.logSince(0)) {
      if (l.text.find(needle) != std::string::npos && (also.empty() || l.text.find(also) != std::string::npos)) {
        return l.text;
      }
    }
    if (d.expired()) fail("no plugin log line with '%s%s%s' within %.0f s", needle.c_str(), also.empty() ? "" : "' and '",
                          also.c_str(), kViewSeconds);
    pollPause(100 * 1000);
  }
}

// "table 0123456789abcdef" in a plan line.
std::string tableDigestOf(const std::string& line) {
  size_t at = line.find("table ");
  if (at == std::string::npos || line.size() < at + 6 + 16) fail("no table digest in '%s'", line.c_str());
  return line.substr(at + 6, 16);
}

// Every rank's table digest is this rank's.
void requireSameDigest(Context& ctx, const std::string& mine) {
  ctx.rv->publish(format("plan.digest.%d", ctx.rank), mine);
  for (int r = 0; r < ctx.nodes; ++r) {
    std::string theirs = ctx.rv->fetch(format("plan.digest.%d", r), ctx.deadline, "every rank's route plan digest");
    if (theirs != mine) fail("rank %d's route plan table is %s, rank %d's is %s", r, theirs.c_str(), ctx.rank, mine.c_str());
  }
}

// On a 4-ring every relayed pair has one relay: src -> via -> dst loads two cable
// directions. Each of the 8 must carry exactly one.
std::string requireOnePerDirection(Context& ctx, const std::vector<RelayedConnect>& mine) {
  std::string list;
  for (const RelayedConnect& c : mine) list += format("%s%d:%d", list.empty() ? "" : ",", c.target, c.via);
  ctx.rv->publish(format("plan.via.%d", ctx.rank), list.empty() ? "-" : list);
  std::map<std::pair<int, int>, int> load;
  for (int r = 0; r < ctx.nodes; ++r) {
    std::string theirs = ctx.rv->fetch(format("plan.via.%d", r), ctx.deadline, "every rank's relays");
    for (size_t at = 0; theirs != "-" && at < theirs.size();) {
      size_t end = theirs.find(',', at);
      std::string item = theirs.substr(at, end == std::string::npos ? std::string::npos : end - at);
      int target = -1, via = -1;
      if (sscanf(item.c_str(), "%d:%d", &target, &via) != 2) fail("rank %d published '%s'", r, theirs.c_str());
      ++load[{r, via}];
      ++load[{via, target}];
      at = end == std::string::npos ? theirs.size() : end + 1;
    }
  }
  std::string out;
  for (int a = 0; a < ctx.nodes; ++a) {
    for (int b : {(a + 1) % ctx.nodes, (a + ctx.nodes - 1) % ctx.nodes}) {
      int n = load[{a, b}];
      if (n != 1) fail("cable direction %d -> %d carries %d relayed pairs; the route plan puts one on each", a, b, n);
      out += format("%s%d>%d", out.empty() ? "" : ",", a, b);
    }
  }
  return out;
}

}  // namespace

std::string runRoutePlan(Context& ctx) {
  requireNodes(ctx, 0);
  if ((ctx.nodes & (ctx.nodes - 1)) != 0) fail("route-plan: run on a power-of-two number of nodes, not %d", ctx.nodes);
  std::string expect = ctx.opts.str("expect", "agree");
  if (expect != "agree" && expect != "disagree") fail("--expect agree|disagree, not '%s'", expect.c_str());
  bool agree = expect == "agree";

  setPhase("waiting for the route plan's views to " + expect);
  std::string line = agree ? waitForLogLine(ctx, "relay: route plan in use: all " + std::to_string(ctx.nodes) + " nodes",
                                            "")
                           : waitForLogLine(ctx, "relay: route plan views disagree: ", "does not hear");
  say("%s", line.c_str());
  std::string digest = agree ? tableDigestOf(line) : std::string();
  if (agree) requireSameDigest(ctx, digest);
  ctx.barrier("views");

  setPhase("every ordered pair connects");
  size_t mark = ctx.net.logSize();
  std::vector<int> peers = otherRanks(ctx);
  CommTable table = establish(ctx, {peers, peers, 1, "route-plan"}, ctx.deadline);
  for (int k = 1; k < ctx.nodes; ++k) {
    int peer = ctx.rank ^ k;
    setPhase(format("exchange with rank %d", peer));
    exchangeSmall(ctx, peer, table[peer].send[0], table[peer].recv[0], static_cast<uint64_t>(k),
                  format("route-plan rank%d<->rank%d", ctx.rank, peer));
  }
  // A two-relay connection (NCCL_MESH_RELAY_TWIN=1, the default) logs two lines: leg 1 takes
  // the way one relay would (the plan's, or the fallback rule's), leg 2 the other way as short.
  // The plan is leg 1's; leg 2 must pair with a leg 1 to the same peer through another relay.
  std::vector<RelayedConnect> relayed, second;
  for (const RelayedConnect& c : relayedConnects(ctx, mark)) (c.leg == 2 ? second : relayed).push_back(c);
  for (const RelayedConnect& s : second) {
    auto first = std::find_if(relayed.begin(), relayed.end(), [&](const RelayedConnect& c) { return c.target == s.target; });
    if (first == relayed.end() || first->leg != 1 || first->via == s.via) {
      fail("a second relay's leg with no first leg to the same peer through another relay: %s", s.line.c_str());
    }
  }
  size_t uncabled = 0;
  for (int p : peers) uncabled += cabled(ctx, ctx.rank, p) == 0 ? 1 : 0;
  if (relayed.size() != uncabled) {
    fail("%zu relayed connects logged for %zu uncabled peers", relayed.size(), uncabled);
  }
  const char* rule = agree ? "(route plan;" : "(fallback rule;";
  for (const RelayedConnect& c : relayed) {
    if (c.line.find(rule) == std::string::npos) fail("relayed connect not by the %s: %s", rule, c.line.c_str());
  }
  std::string directions;
  if (agree && ctx.nodes == 4 && ctx.topology == "ring") directions = " one_relayed_pair_on=" + requireOnePerDirection(ctx, relayed);
  ctx.barrier("exchanged");
  closeAll(ctx, table);
  ctx.barrier("closed");
  return format("expect=%s%s%s relayed=%zu two_relays=%zu%s", expect.c_str(), agree ? " table=" : "", digest.c_str(),
                relayed.size(), second.size(), directions.c_str());
}

}  // namespace e2e
