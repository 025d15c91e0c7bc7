// SPDX-License-Identifier: Apache-2.0
// The scenarios (one function each, dispatched by name from main) and the checks several
// of them share: routing of connections as the plugin's INFO `conn` lines report it, and
// resource snapshots for leak checks.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "context.h"
#include "probes.h"

namespace e2e {

// scenario_connect.cpp
std::string runConnectMesh(Context& ctx);
std::string runRingDiagonal(Context& ctx);
std::string runCycles(Context& ctx);
// --count cycles of connect/accept both ways, one 8-byte exchange, close, between ranks a
// and b; every rank (the others too: they may relay) compares fds and rdma resources after
// --check-at and the last cycle, after `settle` returned (e.g. a relay's links all ended).
// PASS figures: cycle times, the snapshots.
std::string cyclesBetween(Context& ctx, int a, int b, int count, int checkAt,
                          const std::function<void()>& settle = {});
// scenario_failure.cpp
std::string runDeadPeer(Context& ctx);
std::string runLateAccept(Context& ctx);
std::string runCloseInflight(Context& ctx);
std::string runCloseAfterReceive(Context& ctx);
// scenario_faults.cpp
std::string runLinkDown(Context& ctx);
std::string runReload(Context& ctx);
std::string runBadInput(Context& ctx);
std::string runMemlock(Context& ctx);
std::string runDeviceFatal(Context& ctx);
// scenario_data.cpp
std::string runPair(Context& ctx);
std::string runLinks(Context& ctx);
// scenario_functions.cpp
std::string runFunctions(Context& ctx);
// scenario_coll_bench.cpp
std::string runCollBench(Context& ctx);
// scenario_ring.cpp
std::string runAllreduce(Context& ctx);
std::string runDemo(Context& ctx);
// scenario_contract.cpp
std::string runContract(Context& ctx);
std::string runAbortReload(Context& ctx);
std::string runFork(Context& ctx);
// scenario_relay.cpp
std::string runRelay(Context& ctx);
// scenario_patterns.cpp
std::string runPatterns(Context& ctx);
// scenario_relay_bench.cpp
std::string runRelayBench(Context& ctx);
std::string runRegistrations(Context& ctx);
// scenario_route_plan.cpp
std::string runRoutePlan(Context& ctx);

// scenario_gid_move.cpp
std::string runGidMove(Context& ctx);

// scenario_relay_faults.cpp
std::string runRelayFaults(Context& ctx);
bool relayFaultsNeedsGuard(const Context& ctx);

// A rank that dies or stops on purpose (dead-peer's rank 1, relay-faults' relay or
// receiver) runs the scenario in a child that main forks before loading the plugin; the
// parent waits for it and turns its planned death into exit 0. A child that stops itself
// (stopAsPlanned) is continued (SIGCONT) once another rank publishes resume.<rank>; a child
// that runs to its end passes with its own PASS line. scenario_failure.cpp.
bool needsChildGuard(const Context& ctx);
int childGuardParent(const Context& ctx, Rendezvous& rv, int childPid, int reportFd, double deadlineS);
// In the child: the pipe to the parent.
void setChildReportFd(int fd);
// Tells the parent the death is planned, then SIGKILLs itself (kill9) or _exit(0)s.
[[noreturn]] void dieAsPlanned(bool kill9);
// Tells the parent the death is planned, then exit(0)s: exit handlers and destructors run.
[[noreturn]] void exitAsPlanned();
// Tells the parent, then SIGSTOPs itself; returns once the parent continued it.
void stopAsPlanned();

// Options every scenario accepts.
std::set<std::string> commonOptions();
std::set<std::string> withCommon(std::set<std::string> extra);

// The errors a dead or unreachable peer must produce.
inline bool isPeerFailure(ncclResult_t rc) { return rc == ncclRemoteError || rc == ncclSystemError; }
// A *_MS environment variable in seconds; `fallbackMs` when unset or not positive.
double envSeconds(const char* name, double fallbackMs);

// Requires the run to have `nodes` ranks (0: at least 2).
void requireNodes(const Context& ctx, int nodes);
// Every rank but this one, ascending.
std::vector<int> otherRanks(const Context& ctx);
// Whether the lab's topology (ctx.topology, ctx.nodes) cables rank i to rank j: 1 yes, 0 no,
// -1 topology unknown. On a switch (fabric-net --topology switch) every pair is one hop apart.
int cabled(const Context& ctx, int i, int j);

// --- routing ---------------------------------------------------------------------------------
struct RouteReport {
  std::map<int, int> sendLines, recvLines;               // peer rank -> conn lines
  std::map<int, std::map<std::string, int>> netdevs;     // peer rank -> local netdev -> lines
  std::map<int, std::set<std::string>> ports;            // peer rank -> "dev:port"
  std::map<int, int> mtu;                                // peer rank -> last MTU seen
  bool ncclIb = false;                                   // NCCL IB ran, not the plugin: no lines
  std::string describe() const;                          // "peer1: p1 x16 ..."
};
// Checks every conn line logged since `mark`: its peer address is a lab node in `peers`,
// its local netdev is cabled to that node (p<j>, p<j>b, ...), its local address is on the
// peer's link subnet. Throws Failure naming the first offending line.
RouteReport checkRouting(Context& ctx, size_t mark, const std::set<int>& peers);
// Requires at least `perDirection` send and recv conn lines for each peer (the plugin's own
// lines: nothing is required of NCCL IB, which logs none).
void requireConnLines(const RouteReport& r, const std::set<int>& peers, int perDirection);

// --- the relay -------------------------------------------------------------------------------
// One relayed connect of this rank, from the plugin's INFO line "relay: connected to <target
// addresses> via <relay address> (...)": the lab nodes of the first target address and of
// the relay (-1: not a lab address), and the line itself.
struct RelayedConnect {
  int target = -1;
  int via = -1;
  int leg = 0;  // 1 or 2: a leg of a two-relay connection ("; leg N of a two-relay connection"); else 0
  std::string line;
};
// Every such line logged since `mark`, in log order.
std::vector<RelayedConnect> relayedConnects(Context& ctx, size_t mark);
// How many plugin log lines since `mark` contain `needle`.
int countLog(Context& ctx, size_t mark, const std::string& needle);

// --- leaks -----------------------------------------------------------------------------------
struct Snapshot {
  int fds = -1;
  RdmaResources res;
  std::string describe() const;
};
// Reads fds and rdma resources until two readings agree (at most `seconds`): the plugin
// may still be finishing a teardown in its own thread.
Snapshot stableSnapshot(double seconds);
// Polls until no count of `now` is above `base` (at most `seconds`); returns "" or what
// grew (a leak; fewer than the baseline is not one).
std::string compareToBaseline(const Snapshot& base, double seconds, Snapshot* now);
// The thread count once it equals `base`, or after `seconds` whatever it is then. A thread
// the plugin joined at unload can still be listed in /proc/self/task for a moment (the
// kernel reaps it after pthread_join returned), so a count taken at once may be one high.
int threadsSettled(int base, double seconds);

}  // namespace e2e
