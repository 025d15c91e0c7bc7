// SPDX-License-Identifier: Apache-2.0
// relay-faults (issue 15's fault acceptance) on the 4-ring (ranks 0..3 cabled 0-1, 1-2, 2-3,
// 3-0; NCCL_MESH_RELAY=auto). A = rank 0 connects to C = rank 2, which has no cable to it, so
// the connection goes through B, rank 1 or 3: whichever A's INFO line "relay: connected to
// ... via <addr>" names (B confirms with "relay: relaying"). The other neighbour is the
// spare. --mode:
//   kill-relay      A streams to C; B's process is SIGKILLed mid-transfer. A's and C's
//                   requests fail with ncclRemoteError/ncclSystemError within --bound
//                   (NCCL_MESH_PEER_TIMEOUT_MS + 15 s) of B's death; closing the failed comms
//                   releases every fd and RDMA object; a fresh 0<->2 pair then connects
//                   through the spare and moves data.
//   stop-relay      the same with SIGSTOP (run with a short NCCL_MESH_PEER_TIMEOUT_MS); once
//                   A and C have their errors B is continued, its relay must end the link,
//                   and the fresh pair connects (through B or the spare).
//   kill-receiver   C is SIGKILLed mid-transfer; A fails within --bound; B's relay ends that
//                   link (its WARN) and keeps serving: ranks 1 and 3 then connect both ways
//                   (relayed) and move data.
//   kill-sender     A is SIGKILLed mid-transfer (run with a --size of several relay slots, so
//                   that a message is most likely in flight at the relay): C's posted receives
//                   fail within --bound although its own peer, the relay, lives on; B's relay
//                   ends that link; ranks 1 and 3 then connect both ways and move data.
//   relay-cycles    --count (200) relayed connect / 8-byte exchange / close cycles between 0
//                   and 2; fds and RDMA objects on all four ranks (the relays included) equal
//                   after --check-at (10) and the last; cycle times.
//   relay-finalize  while A streams to C, B closes its own comms with A and C and unloads
//                   the plugin as NCCL does at its last communicator (finalize with v11+,
//                   then dlclose); the relay pins the library, so the stream completes
//                   byte-exact.
//   cut             A's cable to B goes down (`ip link set dev p<B> down` on A) with no comm
//                   open; the next 0->2 connect must go round through the spare.
//   isolation       two relayed comms through the same B: X = 0->2 and Y = 2->0, connected
//                   together (both closed and tried again until they take the same relay). X's receiver posts nothing
//                   (its isends stay NULL) while Y moves --messages (200) x --size (256K)
//                   byte-exact within --bound (60 s); then X's receiver posts and X's 8
//                   messages arrive.
//   silent-relay    two-relay connections (NCCL_MESH_RELAY_TWIN=1) while one relay takes
//                   requests and never answers (MESH_TEST_RELAY_SILENT_DIR, as a stopped
//                   process): rank 1 in one round, rank 3 in the next, so in one of them it is
//                   the way the plan prefers. A fresh 0 <-> 2 pair must connect through the
//                   other relay and exchange within --bound (1.5 x NCCL_MESH_CONNECT_TIMEOUT_MS):
//                   the fallback to one relay asks the leg's silent relay last. Then both
//                   relays silent: 0's connect to 2 must fail within --both-bound (2.5 x the
//                   timeout; the whole relayed connect ends at twice it), its WARN naming the
//                   connect's end.
//   memcap          with NCCL_MESH_RELAY_MEM = one ring (4M), two 0->2 comms opened at once:
//                   both connect, through different relays; a third finds both full and
//                   fails within the connect timeout, naming "relay memory cap reached", which
//                   both relays logged; the first two move data byte-exact.
// The rank that dies (kill-relay, stop-relay: both neighbours, since B is known only once A
// connected; kill-receiver: rank 2; kill-sender: rank 0) runs in a forked child (needsChildGuard), so its test
// process exits 0.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include <unistd.h>

#include "comm_setup.h"
#include "scenarios.h"
#include "stream.h"
#include "transfer.h"

namespace e2e {
namespace {

constexpr int kA = 0, kC = 2;
constexpr uint64_t kWarmup = 4;      // messages each way before the fault
constexpr uint64_t kAfterFinalize = 16;  // messages after B unloaded the plugin

// A rendezvous file looked for at most every 50 ms (each look is a stat over 9p in the lab).
class FileWatch {
 public:
  explicit FileWatch(Context& ctx) : ctx_(ctx) {}
  bool seen(const std::string& name) {
    if (secondsSince(last_) < 0.05) return false;
    last_ = Clock::now();
    return ctx_.rv->exists(name);
  }

 private:
  Context& ctx_;
  Clock::time_point last_;
};

// The first captured line since `mark` containing `needle`, polled until `seconds` pass.
std::string waitForLog(Context& ctx, size_t mark, const std::string& needle, double seconds, const std::string& why) {
  Deadline d(seconds, why);
  while (true) {
    for (const LogLine& l : ctx.net.logSince(mark)) {
      if (l.text.find(needle) != std::string::npos) return l.text;
    }
    if (d.expired()) fail("no plugin log line containing '%s' within %.0f s: %s", needle.c_str(), seconds, why.c_str());
    ctx.rv->checkAborts();
    pollPause(10 * 1000);
  }
}

// The neighbour carrying this rank's last relayed connect, from its INFO line
// "relay: connected to <target> via <addr> (relayed)" logged since `mark`.
int relayFromLog(Context& ctx, size_t mark, int target) {
  std::vector<RelayedConnect> all = relayedConnects(ctx, mark);
  if (all.empty()) {
    fail("rank %d's connect to rank %d logged no 'relay: connected to ... via ...' line: it did not go through a "
         "relay (NCCL_MESH_RELAY=%s, topology '%s')", ctx.rank, target,
         getenv("NCCL_MESH_RELAY") ? getenv("NCCL_MESH_RELAY") : "(unset)", ctx.topology.c_str());
  }
  const RelayedConnect& last = all.back();
  if (last.via < 0 || last.via == ctx.rank || last.via == target) {
    fail("rank %d's relayed connect to rank %d names relay node %d, not a neighbour: %s", ctx.rank, target, last.via,
         last.line.c_str());
  }
  return last.via;
}

// A connects to C (A's send comm, C's recv comm); every rank learns B; B confirms that its
// relay serves the connection. `mark` is taken by the caller before anything of this round.
int connectRelayed(Context& ctx, CommTable* t, const std::string& tag, size_t mark) {
  EstablishSpec spec{{}, {}, 1, tag};
  if (ctx.rank == kA) spec.connectTo = {kC};
  if (ctx.rank == kC) spec.acceptFrom = {kA};
  *t = establish(ctx, spec, ctx.deadline);
  if (ctx.rank == kA) ctx.rv->publish("relay." + tag, std::to_string(relayFromLog(ctx, mark, kC)));
  int b = atoi(ctx.rv->fetch("relay." + tag, ctx.deadline, "rank 0 naming the relay").c_str());
  if (ctx.rank == b) {
    std::string line = waitForLog(ctx, mark, "relay: relaying", 10, "rank 0 says this rank relays its connection");
    say("relay-faults: this rank relays 0->2: %s", line.c_str());
  }
  return b;
}

double peerTimeoutSeconds() { return envSeconds("NCCL_MESH_PEER_TIMEOUT_MS", 30000); }

void requirePeerError(Context& ctx, ncclResult_t rc, const std::string& what, double after) {
  if (!isPeerFailure(rc)) {
    fail("%s failed with %s after %.2f s; expected ncclRemoteError or ncclSystemError (last WARN: %s)", what.c_str(),
         resultName(rc), after, ctx.net.lastWarn().c_str());
  }
}

void requireReleased(const Snapshot& base, const std::string& what) {
  Snapshot now;
  std::string leak = compareToBaseline(base, 10, &now);
  if (!leak.empty()) {
    fail("%s: closing the failed comms did not release everything: %s (before: %s; after: %s)", what.c_str(),
         leak.c_str(), base.describe().c_str(), now.describe().c_str());
  }
}

// Waits (a rank that stays up to serve) until the ranks in `ranks` published done.<r>.
void awaitDone(Context& ctx, std::initializer_list<int> ranks) {
  setPhase("relay-faults: serving until the others are done");
  for (int r : ranks) ctx.rv->fetch(format("done.%d", r), ctx.deadline, format("rank %d finishing", r));
}

// A fresh pair of comms each way between this rank and `peer`, one exchange; returns the
// relay of this rank's connect (-1 when the pair is cabled).
int freshExchange(Context& ctx, int peer, const std::string& tag) {
  size_t mark = ctx.net.logSize();
  CommTable t = establish(ctx, {{peer}, {peer}, 1, tag}, ctx.deadline);
  exchangeSmall(ctx, peer, t[peer].send[0], t[peer].recv[0], 7, format("%s rank%d<->rank%d", tag.c_str(), ctx.rank, peer));
  closeAll(ctx, t);
  return countLog(ctx, mark, "relay: connected to ") > 0 ? relayFromLog(ctx, mark, peer) : -1;
}

// Rank A's connect to C through `handle` that no relay can carry: it must fail within giveUpS
// with ncclSystemError or ncclRemoteError, a WARN since it began naming `reason`. `what` names
// it in the scenario's failures ("memcap: a third 0->2 connect ...").
struct RefusedConnect {
  ncclResult_t rc = ncclSuccess;
  double seconds = 0;
};
RefusedConnect connectMustFail(Context& ctx, const std::string& handle, const std::string& what, double giveUpS,
                               const std::string& reason) {
  size_t warnMark = ctx.net.logSize();
  ConnectDriver driver(ctx);
  PendingConn* p = driver.addConnect(kC, 0, handle, "connect rank0->rank2: " + what);
  p->mayFail = true;
  p->giveUp = Deadline(giveUpS, what + ": its bound");
  driver.drive(ctx.deadline);
  if (p->comm != nullptr) fail("%s SUCCEEDED after %.2f s", what.c_str(), p->seconds());
  if (p->timedOut) fail("%s was still pending after %.1f s (%ld calls)", what.c_str(), giveUpS, p->calls);
  if (!isPeerFailure(p->rc)) {
    fail("%s failed with %s; expected ncclSystemError or ncclRemoteError (last WARN: %s)", what.c_str(),
         resultName(p->rc), ctx.net.lastWarn().c_str());
  }
  if (ctx.net.findWarn(reason, warnMark).empty()) {
    fail("%s failed (%s) but no WARN says '%s' (last WARN: %s)", what.c_str(), resultName(p->rc), reason.c_str(),
         ctx.net.lastWarn().c_str());
  }
  return {p->rc, p->seconds()};
}

// ---- kill-relay, stop-relay, kill-receiver --------------------------------------------------

struct Fault {
  std::string mode;
  double bound = 0;
  size_t size = 0;
  int relay = -1, spare = -1, victim = -1;
  bool relayDies() const { return mode != "kill-receiver" && mode != "kill-sender"; }
};

// Streams until kWarmup messages are done, then publishes streaming.<rank>.
void warmUp(Context& ctx, const std::string& mode, Stream* s) {
  setPhase(format("%s: streaming %llu messages before the fault", mode.c_str(), static_cast<unsigned long long>(kWarmup)));
  while (s->done() < kWarmup) {
    pump(ctx, s, false);
    if (ctx.deadline.expired()) {
      fail("%s: %llu of %llu messages before the deadline", mode.c_str(), static_cast<unsigned long long>(s->done()),
           static_cast<unsigned long long>(kWarmup));
    }
  }
  ctx.rv->publish(format("streaming.%d", ctx.rank), "");
}

// The victim's half: waits until A and C have streamed (C, the victim of kill-receiver, and
// A, that of kill-sender, stream themselves), announces its fault, then dies or stops. A
// stopped relay continues here once A and C have their errors, and its relay must end the link.
std::string victim(Context& ctx, const Fault& f, CommTable& t, size_t mark) {
  setPhase(format("%s: waiting for rank 0 and rank 2 to stream", f.mode.c_str()));
  // An end's stream lives until it dies: its requests stay posted, and freeing their buffers
  // under the relay's incoming writes crashed the fabric's NIC thread (1 run in ~20).
  Stream s;
  if (ctx.rank == kC || ctx.rank == kA) {
    int other = ctx.rank == kA ? kC : kA;
    if (ctx.rank == kA) {
      openStream(ctx, &s, kC, t[kC].send[0], nullptr, f.size);
    } else {
      openStream(ctx, &s, kA, nullptr, t[kA].recv[0], f.size);
    }
    warmUp(ctx, f.mode, &s);
    FileWatch watch(ctx);
    std::string streaming = format("streaming.%d", other);
    while (!watch.seen(streaming)) {
      pump(ctx, &s, false);
      if (ctx.deadline.expired()) fail("%s: rank %d never reported streaming", f.mode.c_str(), other);
    }
    // kill-sender: die with a send under way, one that two sweeps did not finish, so that
    // the relay most likely holds part of it (a message is several times its ring).
    for (uint64_t oldest = UINT64_MAX, sweeps = 0; ctx.rank == kA && sweeps < 2;) {
      pump(ctx, &s, false);
      sweeps = s.sposted > s.sdone && s.sdone == oldest ? sweeps + 1 : 0;
      oldest = s.sdone;
      if (ctx.deadline.expired()) fail("%s: no send stayed under way", f.mode.c_str());
    }
  } else {
    ctx.rv->fetch("streaming.0", ctx.deadline, "rank 0 streaming to rank 2");
    ctx.rv->fetch("streaming.2", ctx.deadline, "rank 2 receiving from rank 0");
  }
  ctx.rv->publish(format("dying.%d", ctx.rank), "");
  if (f.mode != "stop-relay") {
    say("%s: rank 0 -> rank 2 is streaming; SIGKILLing myself now", f.mode.c_str());
    dieAsPlanned(true);
  }
  say("stop-relay: rank 0 -> rank 2 is streaming through this rank; SIGSTOPping myself now");
  Clock::time_point stoppedAt = Clock::now();
  stopAsPlanned();
  double stoppedFor = secondsSince(stoppedAt);
  say("stop-relay: continued after %.2f s", stoppedFor);
  std::string why = waitForLog(ctx, mark, "relay: connection ", f.bound,
                               "the relay must end the link whose ends failed while it was stopped");
  say("stop-relay: the relay ended the link: %s", why.c_str());
  awaitDone(ctx, {kA, kC});
  return format("mode=stop-relay role=relay stopped_s=%.2f link_ended=yes", stoppedFor);
}

// A's or C's half while the victim is alive: streams, then waits for its direction to fail.
// Returns the seconds from seeing the victim's announcement to the error ("<0.05" when the
// error came first: the announcement is looked for every 50 ms).
std::string streamUntilError(Context& ctx, const Fault& f, void* send, void* recv, ncclResult_t* rc) {
  int peer = ctx.rank == kA ? kC : kA;
  const char* dir = send ? "the stream to" : "the stream from";
  Stream s;
  openStream(ctx, &s, peer, send, recv, f.size);
  warmUp(ctx, f.mode, &s);
  FileWatch watch(ctx);
  std::string dying = format("dying.%d", f.victim);
  setPhase(format("%s: streaming until rank %d's fault, then until the error (bound %.0f s)", f.mode.c_str(),
                  f.victim, f.bound));
  bool announced = false;
  Clock::time_point seenAt;
  while (!s.bothFailed()) {
    pump(ctx, &s, true);
    if (!announced && watch.seen(dying)) {
      announced = true;
      seenAt = Clock::now();
      say("%s: rank %d announced its fault after %llu messages", f.mode.c_str(), f.victim,
          static_cast<unsigned long long>(s.done()));
    }
    if (announced && secondsSince(seenAt) > f.bound) {
      fail("%s: %.0f s after rank %d's fault, %s rank %d has not failed (%llu messages done); a %s relay path "
           "must fail within NCCL_MESH_PEER_TIMEOUT_MS (%.1f s) + margin", f.mode.c_str(), f.bound, f.victim, dir,
           peer, static_cast<unsigned long long>(s.done()), f.mode == "stop-relay" ? "stopped" : "broken",
           peerTimeoutSeconds());
    }
    if (!announced && ctx.deadline.expired()) fail("%s: rank %d never announced its fault", f.mode.c_str(), f.victim);
  }
  *rc = send ? s.sendRc : s.recvRc;
  Clock::time_point failedAt = send ? s.sendFailedAt : s.recvFailedAt;
  if (!announced) {
    // The error may beat the rate-limited look at the announcement; not the announcement.
    if (!ctx.rv->exists(dying)) {
      fail("%s: %s rank %d failed with %s before rank %d's fault (last WARN: %s)", f.mode.c_str(), dir, peer,
           resultName(*rc), f.victim, ctx.net.lastWarn().c_str());
    }
    seenAt = failedAt;
  }
  double after = std::max(0.0, secondsBetween(seenAt, failedAt));
  std::string afterText = announced ? format("%.3f", after) : "<0.05";
  requirePeerError(ctx, *rc, format("%s: %s rank %d", f.mode.c_str(), dir, peer), after);
  say("%s: %s rank %d failed with %s %s s after rank %d's fault (bound %.0f s); WARN: %s", f.mode.c_str(), dir, peer,
      resultName(*rc), afterText.c_str(), f.victim, f.bound, ctx.net.lastWarn().c_str());
  setPhase(f.mode + ": closing the failed comm");
  closeStream(ctx, &s);
  return afterText;
}

std::string endpoint(Context& ctx, Fault& f, const Snapshot& base, CommTable& t) {
  void* send = ctx.rank == kA ? t[kC].send[0] : nullptr;
  void* recv = ctx.rank == kC ? t[kA].recv[0] : nullptr;
  ncclResult_t rc = ncclSuccess;
  std::string after = streamUntilError(ctx, f, send, recv, &rc);
  closeAll(ctx, t);
  requireReleased(base, f.mode);
  ctx.rv->publish(format("detected.%d", ctx.rank), "");
  std::string figures = format("mode=%s role=%s relay=%d error=%s error_after_s=%s bound_s=%.0f released",
                               f.mode.c_str(), ctx.rank == kA ? "A" : "C", f.relay, resultName(rc), after.c_str(),
                               f.bound);
  if (!f.relayDies()) {  // A: stay up (it may relay 1<->3) until they are done
    awaitDone(ctx, {1, 3});
    return figures;
  }
  if (ctx.rank == kA) {
    ctx.rv->fetch("detected.2", ctx.deadline, "rank 2's error");
    if (f.mode == "stop-relay") ctx.rv->publish(format("resume.%d", f.relay), "");
  }
  int via = freshExchange(ctx, ctx.rank == kA ? kC : kA, "after");
  if (f.mode == "kill-relay" && via != f.spare) {
    fail("kill-relay: the fresh connect to rank %d went through rank %d, but rank %d (the relay) is dead; "
         "expected the spare rank %d", ctx.rank == kA ? kC : kA, via, f.relay, f.spare);
  }
  ctx.rv->publish(format("done.%d", ctx.rank), "");
  return figures + format(" fresh_pair_via=%d", via);
}

std::string runFault(Context& ctx, Fault& f) {
  Snapshot base;
  int endVictim = f.mode == "kill-sender" ? kA : f.mode == "kill-receiver" ? kC : -1;
  bool isEnd = (ctx.rank == kA || ctx.rank == kC) && ctx.rank != endVictim;
  if (isEnd) base = stableSnapshot(5);
  size_t mark = ctx.net.logSize();
  CommTable t;
  f.relay = connectRelayed(ctx, &t, "fault", mark);
  f.spare = 4 - f.relay;
  f.victim = f.relayDies() ? f.relay : endVictim;
  ctx.barrier("relayed-up");
  if (ctx.rank == f.victim) return victim(ctx, f, t, mark);
  if (isEnd) return endpoint(ctx, f, base, t);
  if (f.relayDies()) {  // the spare: serves the fresh pair
    awaitDone(ctx, {kA, kC});
    return format("mode=%s role=spare relay=%d", f.mode.c_str(), f.relay);
  }
  // kill-receiver and kill-sender, ranks 1 and 3: B's relay ends the dead link, then 1 <-> 3
  // still connect.
  std::string ended;
  int survivor = f.victim == kA ? kC : kA;
  if (ctx.rank == f.relay) {
    ended = waitForLog(ctx, mark, "relay: connection ", f.bound + 30,
                       format("the relay must end the link of the dead rank %d", f.victim));
    say("%s: %s", f.mode.c_str(), ended.c_str());
  }
  ctx.rv->fetch(format("detected.%d", survivor), ctx.deadline, format("rank %d's error", survivor));
  int via = freshExchange(ctx, 4 - ctx.rank, "after");
  ctx.rv->publish(format("done.%d", ctx.rank), "");
  return format("mode=%s role=%s relay=%d fresh_1_3_via=%d%s", f.mode.c_str(), ctx.rank == f.relay ? "B" : "spare",
                f.relay, via, ended.empty() ? "" : " link_ended=yes");
}

// ---- relay-finalize ---------------------------------------------------------------------

std::string runFinalize(Context& ctx, size_t size) {
  // Every rank pinned the library when its relay started, at init, before any relayed
  // connection (no dlopen on the relay thread, where it could deadlock with a dlclose).
  if (countLog(ctx, 0, "stays loaded until the process exits") == 0) {
    fail("relay-finalize: no 'relay: ... stays loaded until the process exits' line at init (last WARN: %s)",
         ctx.net.lastWarn().c_str());
  }
  size_t mark = ctx.net.logSize();
  CommTable t;
  int b = connectRelayed(ctx, &t, "fin", mark);
  // B's own comms, both ways with both of its neighbours (A and C), proven with an exchange.
  EstablishSpec own{{}, {}, 1, "own"};
  if (ctx.rank == b) own.connectTo = own.acceptFrom = {kA, kC};
  if (ctx.rank == kA || ctx.rank == kC) own.connectTo = own.acceptFrom = {b};
  CommTable ownT = establish(ctx, own, ctx.deadline);
  for (auto& kv : ownT) {
    exchangeSmall(ctx, kv.first, kv.second.send[0], kv.second.recv[0], 3, format("own rank%d<->rank%d", ctx.rank, kv.first));
  }
  ctx.barrier("own-up");
  if (ctx.rank == b) {
    ctx.rv->fetch("streaming.0", ctx.deadline, "rank 0 streaming to rank 2");
    ctx.rv->fetch("streaming.2", ctx.deadline, "rank 2 receiving from rank 0");
    setPhase("relay-finalize: closing this rank's own comms and unloading the plugin while relaying");
    closeAll(ctx, ownT);
    ctx.net.unload();
    bool mapped = libraryMapped("libnccl-net-mesh");
    ctx.rv->publish(format("finalized.%d", b), "");
    say("relay-finalize: own comms closed, %s and dlclose done; the library is %s", ctx.api >= 11 ? "finalize" : "no finalize (v8)",
        mapped ? "still mapped (pinned by the relay)" : "UNMAPPED");
    if (!mapped) fail("relay-finalize: the plugin was unmapped by dlclose while it relayed rank 0 -> rank 2");
    awaitDone(ctx, {kA, kC});
    return format("mode=relay-finalize role=relay api=v%d own_comms_closed=4 unloaded pinned=yes", ctx.api);
  }
  if (ctx.rank != kA && ctx.rank != kC) {
    awaitDone(ctx, {kA, kC});
    return format("mode=relay-finalize role=spare relay=%d", b);
  }
  Stream s;
  openStream(ctx, &s, ctx.rank == kA ? kC : kA, ctx.rank == kA ? t[kC].send[0] : nullptr,
             ctx.rank == kC ? t[kA].recv[0] : nullptr, size);
  FileWatch watch(ctx);
  std::string finalized = format("finalized.%d", b);
  setPhase(format("relay-finalize: streaming until rank %d unloaded, then %llu more", b,
                  static_cast<unsigned long long>(kAfterFinalize)));
  warmUp(ctx, "relay-finalize", &s);
  uint64_t atFinalize = 0;
  while (s.limit == 0 || s.done() < s.limit) {
    pump(ctx, &s, false);
    if (s.limit == 0 && ctx.rank == kA && watch.seen(finalized)) {
      atFinalize = s.done();
      s.limit = s.sposted + kAfterFinalize;
      ctx.rv->publish("count.0", std::to_string(s.limit));
    }
    std::string count;
    if (s.limit == 0 && ctx.rank == kC && watch.seen("count.0") && ctx.rv->tryFetch("count.0", &count)) {
      atFinalize = s.done();
      s.limit = std::stoull(count);
    }
    if (ctx.deadline.expired()) {
      fail("relay-finalize: %llu of %llu messages done at the deadline (rank %d %s)",
           static_cast<unsigned long long>(s.done()), static_cast<unsigned long long>(s.limit), b,
           ctx.rv->exists(finalized) ? "had unloaded" : "never unloaded");
    }
  }
  // A's sends complete once their bytes are in the relay's ring, before C has them: A must
  // not close (which lets the relay end the link once it delivered) while C still posts.
  ctx.rv->publish(format("streamed.%d", ctx.rank), "");
  ctx.rv->fetch(format("streamed.%d", ctx.rank == kA ? kC : kA), ctx.deadline, "the other end finishing its stream");
  setPhase("relay-finalize: closing");
  closeStream(ctx, &s);
  closeAll(ctx, t);
  closeAll(ctx, ownT);
  ctx.rv->publish(format("done.%d", ctx.rank), "");
  return format("mode=relay-finalize role=%s relay=%d messages=%llu of %zu bytes, %llu after the relay unloaded, "
                "byte-exact", ctx.rank == kA ? "A" : "C", b, static_cast<unsigned long long>(s.done()), size,
                static_cast<unsigned long long>(s.done() - atFinalize));
}

// ---- relay-cycles -----------------------------------------------------------------------------

// Between cycles no comm is open anywhere: waits until this rank's relay has ended every
// link it relayed since `mark` (as many "relay: connection ..." lines as "relay: relaying"
// lines) and no QP is left (the relay tears a link down in its own thread, after the ends
// closed); returns the seconds it took. A relay that keeps a link past `seconds` fails.
double relaySettled(Context& ctx, size_t mark, double seconds) {
  Clock::time_point t0 = Clock::now();
  Deadline d(seconds, "the relay's links to end");
  while (true) {
    int opened = countLog(ctx, mark, "relay: relaying ");
    int ended = countLog(ctx, mark, "relay: connection ");
    RdmaResources r = rdmaResources();
    long qps = r.ok ? r.total["qp"] : 0;
    if (ended >= opened && qps == 0) return secondsSince(t0);
    if (d.expired()) {
      fail("%.0f s after both ends closed every comm, this rank's relay has ended %d of the %d links it relayed and "
           "%ld QP(s) are left (%s)", seconds, ended, opened, qps, describeResources(r).c_str());
    }
    pollPause(1000);
  }
}

std::string runRelayCycles(Context& ctx) {
  size_t mark = ctx.net.logSize();
  int count = static_cast<int>(ctx.opts.integer("count", 200));
  double settleMax = 0;
  std::string figures = cyclesBetween(ctx, kA, kC, count, static_cast<int>(ctx.opts.integer("check-at", 10)), [&] {
    settleMax = std::max(settleMax, relaySettled(ctx, mark, 10));
  });
  int relayed = countLog(ctx, mark, "relay: connected to ");
  int served = countLog(ctx, mark, "relay: relaying ");
  if ((ctx.rank == kA || ctx.rank == kC) && relayed < count) {
    fail("relay-cycles: %d of %d connects logged 'relay: connected to ... via': the pair must be relayed", relayed, count);
  }
  return figures + format(" relayed_connects=%d relayed_by_this_rank=%d settle_s_max=%.3f", relayed, served, settleMax);
}

// ---- cut ------------------------------------------------------------------------------------------

// A's cable to the relay it uses goes down; the next 0 <-> 2 connects go round the spare.
std::string runCut(Context& ctx) {
  int first = -1;
  if (ctx.rank == kA || ctx.rank == kC) first = freshExchange(ctx, kA + kC - ctx.rank, "before");
  if (ctx.rank == kA) ctx.rv->publish("relay.before", std::to_string(first));
  int b = atoi(ctx.rv->fetch("relay.before", ctx.deadline, "rank 0 naming the relay").c_str());
  std::string netdev = format("p%d", b);
  if (ctx.rank == kA) {
    std::string cmd = format("ip link set dev %s down", netdev.c_str());
    say("cut: %s (rank 0 -> rank 2 went through rank %d)", cmd.c_str(), b);
    int rc = system(cmd.c_str());
    if (rc != 0) fail("cut: '%s' exited %d", cmd.c_str(), rc);
  }
  ctx.barrier("cut");
  int second = -1;
  double seconds = 0;
  if (ctx.rank == kA || ctx.rank == kC) {
    Clock::time_point t0 = Clock::now();
    second = freshExchange(ctx, kA + kC - ctx.rank, "after");
    seconds = secondsSince(t0);
    if (ctx.rank == kA && second != 4 - b) {
      fail("cut: with p%d down, rank 0's connect to rank 2 went through rank %d, expected the other neighbour %d",
           b, second, 4 - b);
    }
  }
  ctx.barrier("after-cut");
  if (ctx.rank == kA) {
    int rc = system(format("ip link set dev %s up", netdev.c_str()).c_str());
    (void)rc;
  }
  return format("mode=cut cut=p%d_on_rank0 relay_before=%d relay_after=%d connect_after_s=%.2f", b, first, second,
                seconds);
}

// ---- isolation ------------------------------------------------------------------------------

// Every relay named by this rank's "relay: connected to ... via <addr>" lines since `mark`,
// in log order.
std::vector<int> relaysFromLog(Context& ctx, size_t mark) {
  std::vector<int> out;
  for (const RelayedConnect& c : relayedConnects(ctx, mark)) out.push_back(c.via);
  return out;
}

// One relayed comm: `from` connects to `to`; every rank learns the relay `from` used.
struct Relayed {
  int from = -1, to = -1, relay = -1;
  CommTable t;
  void* send(Context& ctx) { return ctx.rank == from ? t[to].send[0] : nullptr; }
  void* recv(Context& ctx) { return ctx.rank == to ? t[from].recv[0] : nullptr; }
};

// X (stalled: its receiver posts nothing) and Y (200 x 256 KiB) through the same relay B.
// Y must complete byte-exact within --bound while X's isends stay NULL; then X's receiver
// posts and X's messages arrive too.
std::string runIsolation(Context& ctx, size_t size) {
  const uint64_t yMessages = static_cast<uint64_t>(ctx.opts.integer("messages", 200));
  const uint64_t xMessages = 8;
  const double bound = ctx.opts.real("bound", 60);
  // X = 0->2 and Y = 2->0 connect together (a connect opened next to a busy relay takes the
  // other neighbour, so sequential ones spread); until both took the same relay, close both
  // and try again.
  Relayed x, y;
  std::string yDir = "2->0", tried;
  for (int attempt = 0; attempt < 6; ++attempt) {
    size_t mark = ctx.net.logSize();
    std::string tag = format("iso.%d", attempt);
    EstablishSpec spec{{}, {}, 1, tag};
    if (ctx.rank == kA || ctx.rank == kC) spec.connectTo = spec.acceptFrom = {kA + kC - ctx.rank};
    CommTable t = establish(ctx, spec, ctx.deadline);
    if (ctx.rank == kA || ctx.rank == kC) {
      ctx.rv->publish(format("relay.%s.%d", tag.c_str(), ctx.rank), std::to_string(relayFromLog(ctx, mark, kA + kC - ctx.rank)));
    }
    x.from = kA, x.to = kC, y.from = kC, y.to = kA;
    x.relay = atoi(ctx.rv->fetch(format("relay.%s.%d", tag.c_str(), kA), ctx.deadline, "rank 0's relay").c_str());
    y.relay = atoi(ctx.rv->fetch(format("relay.%s.%d", tag.c_str(), kC), ctx.deadline, "rank 2's relay").c_str());
    tried += format("%s0->2:via%d/2->0:via%d", tried.empty() ? "" : ",", x.relay, y.relay);
    if (x.relay == y.relay) {
      x.t = t;
      y.t = t;
      break;
    }
    closeAll(ctx, t);
  }
  if (y.relay != x.relay) fail("isolation: 0->2 and 2->0 never took the same relay (%s)", tried.c_str());
  const int b = x.relay;
  ctx.barrier("iso-up");
  if (ctx.rank != kA && ctx.rank != kC) {
    awaitDone(ctx, {kA, kC});
    if (ctx.rank == b) waitForLog(ctx, 0, "relay: relaying ", 10, "this rank relays X and Y");
    int relaying = countLog(ctx, 0, "relay: relaying ");
    if (ctx.rank == b && relaying < 2) fail("isolation: this rank is the relay of X and Y but logged %d 'relay: relaying' lines", relaying);
    return format("mode=isolation role=%s relay=%d relaying_lines=%d", ctx.rank == b ? "B" : "spare", b, relaying);
  }
  Stream xs, ys;
  openStream(ctx, &xs, x.from + x.to - ctx.rank, x.send(ctx), ctx.rank == x.to ? x.recv(ctx) : nullptr, size);
  openStream(ctx, &ys, y.from + y.to - ctx.rank, y.send(ctx), y.recv(ctx), size);
  xs.limit = xMessages;
  ys.limit = yMessages;
  const bool xSender = ctx.rank == x.from;
  const std::string xPosting = "iso.xposting";
  setPhase(format("isolation: Y (%s through rank %d) moves %llu x %zu bytes while X (0->2) is stalled", yDir.c_str(), b,
                  static_cast<unsigned long long>(yMessages), size));
  Clock::time_point t0 = Clock::now();
  long xTries = 0;
  while (ys.done() < yMessages) {
    pump(ctx, &ys, false);
    if (xSender) {
      pump(ctx, &xs, false);  // X's receiver has posted nothing: every isend must be NULL
      ++xTries;
      if (xs.sposted != 0) fail("isolation: an isend on stalled X got a request before X's receiver posted anything");
    }
    if (secondsSince(t0) > bound) {
      fail("isolation: Y moved %llu of %llu messages in %.0f s while X was stalled on the same relay (rank %d)",
           static_cast<unsigned long long>(ys.done()), static_cast<unsigned long long>(yMessages), bound, b);
    }
  }
  double ySeconds = secondsSince(t0);
  ctx.rv->publish(format("iso.ydone.%d", ctx.rank), "");
  if (!xSender) {
    ctx.rv->fetch(format("iso.ydone.%d", kA), ctx.deadline, "rank 0 finishing Y");
    ctx.rv->publish(xPosting, "");
  }
  // X's sender: isends stay NULL until the receiver announced that it posts.
  setPhase("isolation: X's receiver posts; X's messages must arrive");
  Clock::time_point t1 = Clock::now();
  while (xs.done() < xMessages) {
    pump(ctx, &xs, false);
    if (xSender && xs.sposted != 0 && !ctx.rv->exists(xPosting)) {
      fail("isolation: an isend on stalled X got a request before X's receiver posted anything");
    }
    if (secondsSince(t1) > bound) {
      fail("isolation: after X's receiver posted, %llu of %llu X messages in %.0f s",
           static_cast<unsigned long long>(xs.done()), static_cast<unsigned long long>(xMessages), bound);
    }
    if (ctx.deadline.expired()) fail("isolation: X never completed");
  }
  double xSeconds = secondsSince(t1);
  closeStream(ctx, &xs);
  closeStream(ctx, &ys);
  closeAll(ctx, x.t);  // y.t is the same table
  ctx.rv->publish(format("done.%d", ctx.rank), "");
  double mb = static_cast<double>(yMessages) * static_cast<double>(size) / 1e6;
  return format("mode=isolation role=%s relay=%d x=0->2 y=%s y_messages=%llu y_bytes=%zu y_s=%.2f y_MBps=%.1f "
                "x_stalled_sweeps_all_null=%ld y_tries=%s x_messages=%llu x_after_post_s=%.2f byte-exact",
                ctx.rank == kA ? "A" : "C", b, yDir.c_str(), static_cast<unsigned long long>(yMessages),
                static_cast<size_t>(yMessages) * size, ySeconds, mb / std::max(ySeconds, 1e-9),
                xSender ? xTries : 0L, tried.c_str(), static_cast<unsigned long long>(xMessages), xSeconds);
}

// ---- silent-relay ---------------------------------------------------------------------------

std::string runSilentRelay(Context& ctx) {
  const char* dir = getenv("MESH_TEST_RELAY_SILENT_DIR");
  if (dir == nullptr) fail("silent-relay: run with --env MESH_TEST_RELAY_SILENT_DIR=<a directory>");
  double timeout = envSeconds("NCCL_MESH_CONNECT_TIMEOUT_MS", 30000);
  double bound = ctx.opts.real("bound", 1.5 * timeout);
  // Every relay heard first: the rounds below then wait for no route picture to settle.
  if (ctx.rank == kA || ctx.rank == kC) freshExchange(ctx, kA + kC - ctx.rank, "warmup");
  std::string file = format("%s/relay-silent.%d", dir, static_cast<int>(getpid()));
  struct Remove {  // also when a check below fails
    const std::string& path;
    ~Remove() { unlink(path.c_str()); }
  } remove{file};
  std::string out = format("mode=silent-relay connect_timeout_s=%.1f bound_s=%.1f", timeout, bound);
  for (int silent : {1, 3}) {
    std::string round = format("silent%d", silent);
    if (ctx.rank == silent) {
      FILE* f = fopen(file.c_str(), "w");
      if (f == nullptr) fail("silent-relay: cannot create %s", file.c_str());
      fclose(f);
      say("silent-relay: this rank's relay now takes requests and never answers");
    }
    ctx.barrier(round);
    if (ctx.rank == kA || ctx.rank == kC) {
      Clock::time_point t0 = Clock::now();
      int via = freshExchange(ctx, kA + kC - ctx.rank, round);
      double seconds = secondsSince(t0);
      if (via == silent) fail("silent-relay: rank %d's connect went through rank %d, whose relay is silent", ctx.rank, silent);
      if (seconds > bound) {
        fail("silent-relay: with rank %d's relay silent, rank %d's connects and exchange with rank %d took %.2f s; "
             "bound %.2f s (NCCL_MESH_CONNECT_TIMEOUT_MS %.1f s)", silent, ctx.rank, kA + kC - ctx.rank, seconds, bound,
             timeout);
      }
      say("silent-relay: rank %d silent: connected through rank %d and exchanged in %.2f s", silent, via, seconds);
      out += format(" %s_via=%d %s_s=%.2f", round.c_str(), via, round.c_str(), seconds);
    }
    ctx.barrier("after-" + round);
    if (ctx.rank == silent) unlink(file.c_str());
  }

  // Both relays silent: nothing can answer, and the whole connect (both legs, the one-relay
  // fallback asking each relay) must end within twice the timeout, naming why.
  if (ctx.rank == 1 || ctx.rank == 3) {
    FILE* f = fopen(file.c_str(), "w");
    if (f == nullptr) fail("silent-relay: cannot create %s", file.c_str());
    fclose(f);
  }
  ctx.barrier("silent-both");
  if (ctx.rank == kC) {
    void* lc = listenAndPublish(ctx, "h.silent-both", "silent-relay: listener for the connect through no relay");
    ctx.rv->fetch("silent-both.done", ctx.deadline, "rank 0's connect through two silent relays to end");
    ctx.net.check(ctx.net->closeListen(lc), "closeListen", "silent-relay: listener for the connect through no relay");
  } else if (ctx.rank == kA) {
    std::string handle = ctx.rv->fetch("h.silent-both", ctx.deadline, "rank 2's handle");
    double allowed = 2 * timeout, bothBound = ctx.opts.real("both-bound", 2.5 * timeout);
    setPhase(format("silent-relay: 0->2 with both relays silent (must fail within %.1f s)", bothBound));
    RefusedConnect r = connectMustFail(ctx, handle, "silent-relay: a 0->2 connect with both relays silent",
                                       bothBound + 5, "the connect's end");
    if (r.seconds > bothBound) {
      fail("silent-relay: with both relays silent the connect failed after %.2f s; a relayed connect ends within "
           "twice NCCL_MESH_CONNECT_TIMEOUT_MS (%.1f s, bound %.1f s)", r.seconds, allowed, bothBound);
    }
    say("silent-relay: both relays silent: the connect failed in %.2f s with %s", r.seconds, resultName(r.rc));
    out += format(" both_silent_fail_s=%.2f", r.seconds);
    ctx.rv->publish("silent-both.done", "");
  }
  ctx.barrier("after-silent-both");
  if (ctx.rank == 1 || ctx.rank == 3) unlink(file.c_str());
  return out;
}

// ---- memcap ---------------------------------------------------------------------------------

// NCCL_MESH_RELAY_MEM holds one connection's ring: two 0 -> 2 comms opened at once must both
// connect, through different relays (a relay that holds one refuses the next); a third, opened
// once both are up, finds both relays full and must fail cleanly at once (in under half the
// connect timeout: relays that all refuse for memory end a connect without its retries),
// each relay having logged its NoMemory refusal, and WARNed about it once. (Which relay the first two take depends on
// which routes the HELLOs had announced when they looked; the third does not.)
std::string runMemcap(Context& ctx, size_t size) {
  const char* cap = getenv("NCCL_MESH_RELAY_MEM");
  if (cap == nullptr) fail("memcap: run with --env NCCL_MESH_RELAY_MEM=4M (one connection's ring)");
  const uint64_t messages = static_cast<uint64_t>(ctx.opts.integer("messages", 16));
  size_t mark = ctx.net.logSize();
  EstablishSpec spec{{}, {}, 2, "memcap"};
  if (ctx.rank == kA) spec.connectTo = {kC};
  if (ctx.rank == kC) spec.acceptFrom = {kA};
  Clock::time_point t0 = Clock::now();
  CommTable t = establish(ctx, spec, ctx.deadline);
  double connectSeconds = secondsSince(t0);
  if (ctx.rank == kA) {
    std::vector<int> via = relaysFromLog(ctx, mark);
    if (via.size() == 2 && (via[0] < 0 || via[1] < 0)) fail("memcap: a relay address is not a lab node");
    if (via.size() != 2) fail("memcap: rank 0 logged %zu 'relay: connected to ... via' lines for its 2 connects", via.size());
    ctx.rv->publish("memcap.via", format("%d %d", via[0], via[1]));
  }
  int v0 = -1, v1 = -1;
  std::string via = ctx.rv->fetch("memcap.via", ctx.deadline, "rank 0 naming its relays");
  if (sscanf(via.c_str(), "%d %d", &v0, &v1) != 2) fail("memcap: bad memcap.via '%s'", via.c_str());
  if (v0 == v1) fail("memcap: both 0->2 connections went through rank %d; with NCCL_MESH_RELAY_MEM=%s it holds one", v0, cap);

  // The third connection: both relays are full.
  std::string third;
  if (ctx.rank == kC) {
    void* lc = listenAndPublish(ctx, "h.memcap.third", "memcap: third listener");
    ctx.rv->fetch("memcap.third.done", ctx.deadline, "rank 0's third connect to end");
    ctx.net.check(ctx.net->closeListen(lc), "closeListen", "memcap: third listener");
  } else if (ctx.rank == kA) {
    std::string handle = ctx.rv->fetch("h.memcap.third", ctx.deadline, "rank 2's third handle");
    double bound = envSeconds("NCCL_MESH_CONNECT_TIMEOUT_MS", 30000) / 2;
    setPhase(format("memcap: a third 0->2 connect while both relays are full (must fail within %.1f s)", bound));
    RefusedConnect r = connectMustFail(
        ctx, handle,
        format("memcap: a third 0->2 connect, with NCCL_MESH_RELAY_MEM=%s on relays already holding one connection each",
               cap),
        bound, "relay memory cap reached");
    third = format(" third_connect=%s third_s=%.2f", resultName(r.rc), r.seconds);
    say("memcap: the third connect failed as expected in %.2f s with %s", r.seconds, resultName(r.rc));
    ctx.rv->publish("memcap.third.done", "");
  } else {
    ctx.rv->fetch("memcap.third.done", ctx.deadline, "rank 0's third connect to end");  // then count refusals
  }

  // The relays' refusals: "relay: refused ...: relay memory cap reached: NCCL_MESH_RELAY_MEM=...".
  int refused = countLog(ctx, mark, "relay memory cap reached");
  if (ctx.rank == v0 || ctx.rank == v1) waitForLog(ctx, mark, "relay: relaying ", 10, "this rank relays a 0->2 connection");
  int relaying = countLog(ctx, mark, "relay: relaying ");
  ctx.rv->publish(format("memcap.refused.%d", ctx.rank), std::to_string(refused));
  std::string refusedBy;
  for (int r = 0; r < 4; ++r) {
    int n = atoi(ctx.rv->fetch(format("memcap.refused.%d", r), ctx.deadline, format("rank %d's refusals", r)).c_str());
    if (n > 0) refusedBy += format("%srank%d:%d", refusedBy.empty() ? "" : ",", r, n);
    if ((r == v0 || r == v1) && n == 0) {
      fail("memcap: rank %d relays one 0->2 connection but logged no 'relay memory cap reached' refusal of the "
           "third (NCCL_MESH_RELAY_MEM=%s)", r, cap);
    }
  }
  if (ctx.rank == v0 || ctx.rank == v1) {
    int warned = static_cast<int>(countLog(ctx, mark, "relay: staging memory is full"));
    if (warned != 1) fail("memcap: this relay refused for memory but WARNed 'staging memory is full' %d times, not once", warned);
  }
  if ((ctx.rank == v0 || ctx.rank == v1) && relaying != 1) {
    fail("memcap: this rank relays one of the two connections but logged %d 'relay: relaying' lines", relaying);
  }
  if (ctx.rank == kA || ctx.rank == kC) {
    int peer = kA + kC - ctx.rank;
    Stream s[2];
    for (int k = 0; k < 2; ++k) {
      openStream(ctx, &s[k], peer, ctx.rank == kA ? t[kC].send[k] : nullptr, ctx.rank == kC ? t[kA].recv[k] : nullptr,
                 size);
      s[k].limit = messages;
    }
    setPhase("memcap: both connections stream");
    while (s[0].done() < messages || s[1].done() < messages) {
      pump(ctx, &s[0], false);
      pump(ctx, &s[1], false);
      if (ctx.deadline.expired()) {
        fail("memcap: %llu and %llu of %llu messages at the deadline", static_cast<unsigned long long>(s[0].done()),
             static_cast<unsigned long long>(s[1].done()), static_cast<unsigned long long>(messages));
      }
    }
    for (Stream& x : s) closeStream(ctx, &x);
    closeAll(ctx, t);
    ctx.rv->publish(format("done.%d", ctx.rank), "");
  } else {
    awaitDone(ctx, {kA, kC});
  }
  return format("mode=memcap cap=%s relays=%d,%d refused_by=%s relaying_here=%d connect_s=%.2f%s messages=2x%llu of "
                "%zu bytes byte-exact", cap, v0, v1, refusedBy.c_str(), relaying, connectSeconds, third.c_str(),
                static_cast<unsigned long long>(messages), size);
}

}  // namespace

bool relayFaultsNeedsGuard(const Context& ctx) {
  std::string mode = ctx.opts.str("mode", "");
  if (mode == "kill-relay" || mode == "stop-relay") return ctx.rank == 1 || ctx.rank == 3;
  return (mode == "kill-receiver" && ctx.rank == kC) || (mode == "kill-sender" && ctx.rank == kA);
}

std::string runRelayFaults(Context& ctx) {
  requireNodes(ctx, 4);
  if (ctx.topology != "ring") fail("relay-faults needs the 4-ring (--topology ring), got '%s'", ctx.topology.c_str());
  std::string mode = ctx.opts.str("mode", "");
  if (mode == "relay-cycles") return runRelayCycles(ctx);
  if (mode == "cut") return runCut(ctx);
  if (mode == "silent-relay") return runSilentRelay(ctx);
  size_t size = 0;
  if (!parseSize(ctx.opts.str("size", "256K"), &size) || size < 1 || size > (64u << 20)) {
    fail("--size %s: expected 1..64M bytes", ctx.opts.str("size", "").c_str());
  }
  if (mode == "relay-finalize") return runFinalize(ctx, size);
  if (mode == "isolation") return runIsolation(ctx, size);
  if (mode == "memcap") return runMemcap(ctx, size);
  if (mode != "kill-relay" && mode != "stop-relay" && mode != "kill-receiver" && mode != "kill-sender") {
    fail("relay-faults needs --mode kill-relay|stop-relay|kill-receiver|kill-sender|relay-cycles|relay-finalize|cut|"
         "silent-relay|isolation|memcap (got '%s')",
         mode.c_str());
  }
  Fault f;
  f.mode = mode;
  f.size = size;
  f.bound = ctx.opts.real("bound", peerTimeoutSeconds() + 15);
  return runFault(ctx, f);
}

}  // namespace e2e
