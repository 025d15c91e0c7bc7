// SPDX-License-Identifier: Apache-2.0
// Failure scenarios: a peer that never accepts, dies while listening, is killed with a
// receive posted, while the comms are idle, or while this rank's send is on the wire, or
// leaves through exit() while its other thread is still in isend, as NCCL's proxy may be
// (dead-peer); comms closed with requests in flight (close-inflight); a receiver that closes
// the moment it has its data (close-after-receive: the send completes). In every failure the
// surviving rank must get an error in bounded time, never hang, release everything when it
// closes the failed comms, and stay usable.
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm_setup.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

double connectTimeoutSeconds() { return envSeconds("NCCL_MESH_CONNECT_TIMEOUT_MS", 30000); }
// How long a connect waits for a live peer's accept: NCCL_MESH_ACCEPT_WAIT_MS, at least the
// connect timeout (the plugin's rule).
double acceptWaitSeconds() {
  return std::max(connectTimeoutSeconds(), envSeconds("NCCL_MESH_ACCEPT_WAIT_MS", 1800000));
}

// A fresh listen/closeListen: the plugin still works after the failure.
void checkHealthy(Context& ctx, const std::string& after) {
  alignas(16) unsigned char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  ctx.net.check(ctx.net->listen(ctx.dev, handle, &lc), "listen", "health check " + after);
  ctx.net.check(ctx.net->closeListen(lc), "closeListen", "health check " + after);
  int ndev = 0;
  ctx.net.check(ctx.net->devices(&ndev), "devices", "health check " + after);
}

// Rank 0's connect to a listener that never accepts / has died: must fail in `bound` s.
std::string connectMustFail(Context& ctx, const std::string& mode, double bound) {
  std::string handle = ctx.rv->fetch("h.1.0.dead", ctx.deadline, "rank 1's listen handle");
  size_t warnMark = ctx.net.logSize();
  ctx.rv->publish("start.0", "");
  setPhase(format("dead-peer %s: rank 0 connecting (must fail within %.1f s)", mode.c_str(), bound));
  ConnectDriver driver(ctx);
  PendingConn* p = driver.addConnect(1, 0, handle, format("connect rank0->rank1 (%s)", mode.c_str()));
  p->mayFail = true;
  p->giveUp = Deadline(bound, "dead-peer bound");
  driver.drive(ctx.deadline);
  if (p->comm != nullptr) {
    fail("%s: connect rank0->rank1 SUCCEEDED after %.2f s (comm %p), but rank 1 %s", mode.c_str(),
         p->seconds(), p->comm,
         mode == "never-accept" ? "never called accept" : "died right after publishing its handle");
  }
  if (p->timedOut) {
    fail("%s: connect rank0->rank1 still pending after %.1f s (%ld calls returned a NULL comm); "
         "expected an error within %s=%.0f ms + margin", mode.c_str(), bound, p->calls,
         mode == "never-accept" ? "NCCL_MESH_ACCEPT_WAIT_MS" : "NCCL_MESH_CONNECT_TIMEOUT_MS",
         (mode == "never-accept" ? acceptWaitSeconds() : connectTimeoutSeconds()) * 1000);
  }
  if (!isPeerFailure(p->rc)) {
    fail("%s: connect failed after %.2f s with %s; expected ncclSystemError or ncclRemoteError "
         "(last WARN: %s)", mode.c_str(), p->seconds(), resultName(p->rc), ctx.net.lastWarn().c_str());
  }
  // A live listener's accept may come late (NCCL's IB transport waits for it without a
  // limit): the connect waits NCCL_MESH_ACCEPT_WAIT_MS, past the connect timeout.
  if (mode == "never-accept" && p->seconds() < 0.8 * acceptWaitSeconds()) {
    fail("never-accept: connect failed after only %.2f s with %s, well before "
         "NCCL_MESH_ACCEPT_WAIT_MS (%.0f ms; connect timeout %.0f ms); the listener was alive, so the "
         "error must be the end of the wait for accept (last WARN: %s)", p->seconds(), resultName(p->rc),
         acceptWaitSeconds() * 1000, connectTimeoutSeconds() * 1000, ctx.net.lastWarn().c_str());
  }
  std::string why = ctx.net.findWarn("", warnMark);
  say("%s: connect failed as expected after %.3f s with %s (bound %.1f s); WARN: %s", mode.c_str(),
      p->seconds(), resultName(p->rc), bound, why.empty() ? "<none>" : why.c_str());
  checkHealthy(ctx, "after the failed connect");
  ctx.rv->publish("done.0", "");
  return format("mode=%s connect_error=%s error_after_s=%.3f bound_s=%.1f", mode.c_str(),
                resultName(p->rc), p->seconds(), bound);
}

// After closing the failed comms, fds and RDMA objects must be back where they were before
// the comms were set up.
void requireReleased(const Snapshot& base, const std::string& mode) {
  Snapshot now;
  std::string leak = compareToBaseline(base, 10, &now);
  if (!leak.empty()) {
    fail("%s: closing the failed comms did not release everything: %s (before: %s; after: %s)",
         mode.c_str(), leak.c_str(), base.describe().c_str(), now.describe().c_str());
  }
}

// Polls test() on `req` until it fails; fails the scenario if it completes or outlives
// `bound` seconds from t0. Returns the error.
ncclResult_t testUntilError(Context& ctx, void* req, const std::string& what, Clock::time_point t0,
                            double bound) {
  long calls = 0;
  while (true) {
    int done = 0;
    size_t got[1] = {0};
    ncclResult_t rc = ctx.net->test(req, &done, got, 1);
    ++calls;
    if (rc != ncclSuccess) return rc;
    if (done) fail("%s COMPLETED (%zu bytes) although the peer died", what.c_str(), got[0]);
    if (secondsSince(t0) > bound) {
      fail("%s: test() still reports 'not done' %.1f s after the peer died (%ld calls); a dead "
           "peer must turn into ncclRemoteError/ncclSystemError", what.c_str(), bound, calls);
    }
    pollPause(1000);
  }
}

void requirePeerFailure(Context& ctx, ncclResult_t rc, const std::string& what, double after) {
  if (!isPeerFailure(rc)) {
    fail("%s failed with %s after %.2f s; expected ncclRemoteError or ncclSystemError (last "
         "WARN: %s)", what.c_str(), resultName(rc), after, ctx.net.lastWarn().c_str());
  }
}

struct SeenFailure {
  ncclResult_t rc;
  double after;  // seconds from telling rank 1 to die
};

// The survivor's half of peer-killed and mid-send, once `req` is in flight on `comm`:
// publishes `ready` (rank 1 dies when it sees it), tests `req` until it fails with a
// peer-failure code within `bound`, then deregisters `mh`, closes every comm and requires
// everything released. `ifCompleted` is added to the message should the request complete.
SeenFailure requestFailsThenReleased(Context& ctx, CommTable& t, const Snapshot& base, const std::string& mode,
                                     const char* ready, void* comm, void* mh, void* req,
                                     const std::string& what, const char* ifCompleted, double bound) {
  ctx.rv->publish(ready, "");
  Clock::time_point t0 = Clock::now();
  setPhase(format("%s: testing %s (must fail within %.0f s)", mode.c_str(), what.c_str(), bound));
  ncclResult_t rc = testUntilError(ctx, req, mode + ": " + what + ifCompleted, t0, bound);
  double after = secondsSince(t0);
  requirePeerFailure(ctx, rc, mode + ": test() on " + what, after);
  say("%s: test() returned %s %.3f s after rank 1 was told to die (bound %.0f s); WARN: %s", mode.c_str(),
      resultName(rc), after, bound, ctx.net.lastWarn().c_str());
  setPhase(mode + ": closing the broken comm");
  deregHost(ctx, comm, mh, mode + " buffer (after the error)");
  closeAll(ctx, t);
  requireReleased(base, mode);
  checkHealthy(ctx, "after the dead peer");
  return {rc, after};
}

// peer-killed and exits, rank 0: a receive is posted when rank 1 SIGKILLs itself (or leaves
// through exit()); test() must fail.
std::string receiveMustFail(Context& ctx, const std::string& mode, double bound) {
  Snapshot base = stableSnapshot(5);
  CommTable t = establish(ctx, {{}, {1}, 1, "dead"}, ctx.deadline);
  void* recvComm = t[1].recv[0];
  HostBuffer buf(4096);
  void* mh = regHost(ctx, recvComm, buf, mode + " recv buffer");
  // First prove the path works: one 8-byte message from rank 1.
  std::vector<Op> first = {recvOp(recvComm, buf.data(), 4096, 1, mh, mode + ": first irecv rank0<-rank1")};
  Engine(ctx, ctx.seed).run(first, ctx.deadline);
  if (first[0].got[0] != 8) fail("%s: first message reported %d bytes, expected 8", mode.c_str(), first[0].got[0]);

  setPhase(mode + ": posting the receive that rank 1 dies under");
  void* req = postRecv(ctx, recvComm, buf.data(), 4096, 2, mh, mode + ": irecv rank0<-rank1 before rank 1 dies");
  SeenFailure seen = requestFailsThenReleased(ctx, t, base, mode, "posted.0", recvComm, mh, req,
                                              "the receive from the dead rank 1", "", bound);
  return format("mode=%s test_error=%s error_after_s=%.3f bound_s=%.0f released", mode.c_str(), resultName(seen.rc),
                seen.after, bound);
}

// idle, rank 0: comms both ways, proven with one exchange, then idle while rank 1 is
// SIGKILLed. The next isend (which can never get a FIFO slot) and the next receive must
// fail within `bound` of rank 1 announcing its death.
std::string idleMustFail(Context& ctx, double bound) {
  Snapshot base = stableSnapshot(5);
  CommTable t = establish(ctx, {{1}, {1}, 1, "idle"}, ctx.deadline);
  void* sendComm = t[1].send[0];
  void* recvComm = t[1].recv[0];
  exchangeSmall(ctx, 1, sendComm, recvComm, 1, "idle: before rank 1 dies");
  HostBuffer out(4096), in(4096);
  void* mhOut = regHost(ctx, sendComm, out, "idle send buffer");
  void* mhIn = regHost(ctx, recvComm, in, "idle recv buffer");
  ctx.rv->publish("idle.0", "");
  ctx.rv->fetch("dying.1", ctx.deadline, "rank 1 announcing its death");
  Clock::time_point t0 = Clock::now();
  setPhase(format("idle: isend to the dead rank 1 (must fail within %.0f s)", bound));
  ncclResult_t rc = ncclSuccess;
  void* req = nullptr;
  long calls = 0;
  while (rc == ncclSuccess) {
    rc = ctx.net->isend(sendComm, out.data(), 8, 3, mhOut, &req);
    ++calls;
    if (req != nullptr) {
      fail("idle: isend to the dead rank 1 returned a request after %.2f s (%ld calls): no "
           "receive was ever posted for it", secondsSince(t0), calls);
    }
    if (rc == ncclSuccess && secondsSince(t0) > bound) {
      fail("idle: isend to the dead rank 1 still returns 'not yet' after %.1f s (%ld calls); NCCL "
           "would retry it forever", bound, calls);
    }
    if (rc == ncclSuccess) pollPause(1000);
  }
  double sendAfter = secondsSince(t0);
  requirePeerFailure(ctx, rc, "idle: isend to the dead rank 1", sendAfter);
  std::string sendWarn = ctx.net.lastWarn();
  setPhase("idle: irecv from the dead rank 1");
  void* data[1] = {in.data()};
  size_t sizes[1] = {4096};
  int tags[1] = {3};
  void* mhs[1] = {mhIn};
  req = nullptr;
  rc = ncclSuccess;
  while (rc == ncclSuccess && req == nullptr) {
    rc = ctx.net->irecv(recvComm, 1, data, sizes, tags, mhs, &req);
    if (rc == ncclSuccess && req == nullptr) {
      if (secondsSince(t0) > bound) fail("idle: irecv from the dead rank 1 kept returning 'not yet'");
      pollPause(1000);
    }
  }
  if (rc == ncclSuccess) rc = testUntilError(ctx, req, "idle: the receive from the dead rank 1", t0, bound);
  double recvAfter = secondsSince(t0);
  requirePeerFailure(ctx, rc, "idle: the receive from the dead rank 1", recvAfter);
  say("idle: isend failed with %s after %.3f s, the receive after %.3f s (bound %.0f s); WARN: %s",
      resultName(rc), sendAfter, recvAfter, bound, sendWarn.c_str());
  setPhase("idle: closing the failed comms");
  deregHost(ctx, sendComm, mhOut, "idle send buffer (after the error)");
  deregHost(ctx, recvComm, mhIn, "idle recv buffer (after the error)");
  closeAll(ctx, t);
  requireReleased(base, "idle");
  checkHealthy(ctx, "after the dead peer");
  return format("mode=idle isend_error=%s isend_error_after_s=%.3f recv_error_after_s=%.3f bound_s=%.0f released",
                resultName(rc), sendAfter, recvAfter, bound);
}

[[noreturn]] void idleVictim(Context& ctx) {
  CommTable t = establish(ctx, {{0}, {0}, 1, "idle"}, ctx.deadline);
  exchangeSmall(ctx, 0, t[0].send[0], t[0].recv[0], 1, "idle: before rank 1 dies");
  ctx.rv->fetch("idle.0", ctx.deadline, "rank 0 going idle");
  ctx.rv->publish("dying.1", "");
  say("idle: comms are idle; SIGKILLing myself now");
  dieAsPlanned(true);
}

// mid-send, rank 0: sending one large message into rank 1's posted receive when rank 1 is
// SIGKILLed; test() on the send must fail.
std::string sendMustFail(Context& ctx, size_t size, double bound) {
  Snapshot base = stableSnapshot(5);
  CommTable t = establish(ctx, {{1}, {}, 1, "midsend"}, ctx.deadline);
  void* sendComm = t[1].send[0];
  HostBuffer out(size);
  fillPattern(out.data(), size, 5);
  void* mh = regHost(ctx, sendComm, out, "mid-send buffer");
  ctx.rv->fetch("posted.1", ctx.deadline, "rank 1 posting its receive");
  setPhase("mid-send: posting the send");
  void* req = postSend(ctx, sendComm, out.data(), size, 4, mh, "mid-send: isend rank0->rank1");
  int done = 0;
  size_t got[1];
  ctx.net.check(ctx.net->test(req, &done, got, 1), "test", "mid-send: first test of the send");
  if (done) fail("mid-send: the %s send completed at once; use a larger --size", humanBytes(size).c_str());
  SeenFailure seen = requestFailsThenReleased(ctx, t, base, "mid-send", "sending.0", sendComm, mh, req,
                                              "the send to the dead rank 1",
                                              " (use a larger --size if it won the race)", bound);
  return format("mode=mid-send size=%zu test_error=%s error_after_s=%.3f bound_s=%.0f released", size,
                resultName(seen.rc), seen.after, bound);
}

[[noreturn]] void midSendVictim(Context& ctx, size_t size) {
  CommTable t = establish(ctx, {{}, {0}, 1, "midsend"}, ctx.deadline);
  void* recvComm = t[0].recv[0];
  HostBuffer in(size);
  void* mh = regHost(ctx, recvComm, in, "mid-send receive buffer");
  postRecv(ctx, recvComm, in.data(), size, 4, mh, "mid-send: irecv rank1<-rank0");
  ctx.rv->publish("posted.1", "");
  ctx.rv->fetch("sending.0", ctx.deadline, "rank 0 sending");
  say("mid-send: rank 0's send is on the wire; SIGKILLing myself now");
  dieAsPlanned(true);
}

// exits, rank 1: NCCL's proxy thread of a rank that leaves with work in flight (an exception,
// sys.exit, no ncclCommDestroy). A second thread spins in isend on the comm, as the proxy
// does for a send whose receive is not posted (tag 3: rank 0 posted tag 2, so every call is a
// NULL request), while the main thread calls exit(): the exit handlers and the plugin's
// destructor run under it. The guard requires exit status 0: a comm freed under the spinning
// thread crashed here.
struct ProxySpin {
  Context* ctx = nullptr;
  void* comm = nullptr;
  void* data = nullptr;
  void* mh = nullptr;
  std::atomic<long> calls{0};
  std::atomic<int> stopped{0};  // 1: an error, 2: a request (neither may happen before exit)
};

void* proxySpin(void* arg) {
  auto* p = static_cast<ProxySpin*>(arg);
  while (true) {
    void* req = nullptr;
    ncclResult_t rc = (*p->ctx).net->isend(p->comm, p->data, 8, 3, p->mh, &req);
    p->calls.fetch_add(1, std::memory_order_relaxed);
    if (rc != ncclSuccess || req != nullptr) {
      p->stopped.store(rc != ncclSuccess ? 1 : 2);
      return nullptr;
    }
  }
}

// Rank 1 of peer-killed and exits: its send comm to rank 0 (registered `buf`, 8 bytes, in
// *mh), proven with one 8-byte message; returns once rank 0 posted the receive it dies under.
void* provenSendThenWaitForRank0(Context& ctx, const std::string& mode, HostBuffer& buf, void** mh) {
  CommTable t = establish(ctx, {{0}, {}, 1, "dead"}, ctx.deadline);
  void* sendComm = t[0].send[0];
  fillPattern(buf.data(), 8, 1);
  *mh = regHost(ctx, sendComm, buf, mode + " send buffer");
  std::vector<Op> first = {sendOp(sendComm, buf.data(), 8, 1, *mh, mode + ": first isend rank1->rank0")};
  Engine(ctx, ctx.seed).run(first, ctx.deadline);
  ctx.rv->fetch("posted.0", ctx.deadline, "rank 0 posting the receive");
  return sendComm;
}

[[noreturn]] void exitsVictim(Context& ctx) {
  HostBuffer buf(8);
  void* mh = nullptr;
  void* sendComm = provenSendThenWaitForRank0(ctx, "exits", buf, &mh);
  // Never freed: the thread runs until the process ends.
  auto* spin = new ProxySpin;
  spin->ctx = &ctx;
  spin->comm = sendComm;
  spin->data = buf.data();
  spin->mh = mh;
  pthread_t thread;
  if (pthread_create(&thread, nullptr, proxySpin, spin) != 0) fail("exits: pthread_create failed");
  pthread_detach(thread);
  Deadline by(30, "the spinning thread");
  while (spin->calls.load() < 1000 && spin->stopped.load() == 0) {
    if (by.expired()) fail("exits: the spinning thread made %ld isend calls in 30 s", spin->calls.load());
    pollPause(1000);
  }
  if (spin->stopped.load() != 0) {
    fail("exits: isend with tag 3 (never posted) returned %s before the exit",
         spin->stopped.load() == 1 ? "an error" : "a request");
  }
  say("exits: a second thread spins in isend (%ld calls so far); calling exit(0) now", spin->calls.load());
  exitAsPlanned();
}

[[noreturn]] void peerKilledVictim(Context& ctx) {
  HostBuffer buf(8);
  void* mh = nullptr;
  provenSendThenWaitForRank0(ctx, "peer-killed", buf, &mh);
  say("peer-killed: rank 0 has posted its receive; SIGKILLing myself now");
  dieAsPlanned(true);
}

struct RoundResult {
  size_t recvs = 0, sends = 0;
  int refused = 0;
};

// One close-inflight round: connect both ways, post, close with the requests in flight.
RoundResult closeInflightRound(Context& ctx, int round, int inflight, int size) {
  int peer = 1 - ctx.rank;
  bool strict = round % 2 == 1;
  CommTable t = establish(ctx, {{peer}, {peer}, 1, format("r%d", round)}, ctx.deadline);
  void* sc = t[peer].send[0];
  void* rc = t[peer].recv[0];
  size_t bytes = static_cast<size_t>(inflight) * static_cast<size_t>(size);
  HostBuffer out(bytes), in(bytes);
  void* mhOut = regHost(ctx, sc, out, "close-inflight send arena");
  void* mhIn = regHost(ctx, rc, in, "close-inflight recv arena");
  std::vector<Op> recvs, sends;
  for (int i = 0; i < inflight; ++i) {
    size_t off = static_cast<size_t>(i) * static_cast<size_t>(size);
    recvs.push_back(recvOp(rc, in.data() + off, size, i, mhIn,
                           format("round %d irecv #%d rank%d<-rank%d", round, i, ctx.rank, peer)));
    sends.push_back(sendOp(sc, out.data() + off, size, i, mhOut,
                           format("round %d isend #%d rank%d->rank%d", round, i, ctx.rank, peer)));
  }
  setPhase(format("close-inflight round %d (%s): posting", round, strict ? "strict" : "racing"));
  Engine engine(ctx, ctx.seed + static_cast<unsigned>(round));
  RoundResult r;
  int* errors = strict ? nullptr : &r.refused;
  r.recvs = engine.postOnly(recvs, Deadline(10, "posting receives"), errors);
  r.sends = engine.postOnly(sends, Deadline(10, "posting sends"), errors);
  if (strict && (r.recvs != recvs.size() || r.sends != sends.size())) {
    fail("round %d: only %zu of %zu irecvs and %zu of %zu isends could be posted in 10 s while the "
         "peer was posting too (without test() calls)", round, r.recvs, recvs.size(), r.sends, sends.size());
  }
  if (strict) ctx.barrier(format("posted-%d", round));
  setPhase(format("close-inflight round %d: closing with %zu irecvs and %zu isends posted", round, r.recvs, r.sends));
  deregHost(ctx, sc, mhOut, "close-inflight send arena (requests in flight)");
  deregHost(ctx, rc, mhIn, "close-inflight recv arena (requests in flight)");
  closeAll(ctx, t);
  if (round <= 2 || round % 5 == 0) {
    say("round %d (%s): closed with %zu irecvs and %zu isends posted%s", round,
        strict ? "both posted first" : "racing the peer's close", r.recvs, r.sends,
        r.refused ? format(", %d post(s) refused by the closing peer", r.refused).c_str() : "");
  }
  return r;
}

}  // namespace

namespace {
int gReportFd = -1;  // guarded child -> guard parent

void report(char what) {
  if (gReportFd >= 0) {
    ssize_t w = write(gReportFd, &what, 1);
    (void)w;
  }
  fflush(stdout);
  fflush(stderr);
}

bool readsPlanned(int fd) {
  char buf[64];
  bool planned = false;
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
    for (ssize_t i = 0; i < n; ++i) planned = planned || buf[i] == 'D';
  }
  return planned;
}
}  // namespace

void setChildReportFd(int fd) { gReportFd = fd; }

void dieAsPlanned(bool kill9) {
  report('D');
  if (kill9) kill(getpid(), SIGKILL);
  _exit(0);
}

void exitAsPlanned() {
  report('D');
  exit(0);
}

void stopAsPlanned() {
  report('S');
  raise(SIGSTOP);
}

bool needsChildGuard(const Context& ctx) {
  std::string mode = ctx.opts.str("mode", "");
  if (ctx.scenario == "dead-peer") {
    return ctx.rank == 1 && (mode == "listener-dies" || mode == "peer-killed" || mode == "idle" ||
                             mode == "mid-send" || mode == "exits");
  }
  if (ctx.scenario == "relay-faults") return relayFaultsNeedsGuard(ctx);
  return false;
}

int childGuardParent(const Context& ctx, Rendezvous& rv, int childPid, int reportFd, double deadlineS) {
  const char* scenario = ctx.scenario.c_str();
  std::string mode = ctx.opts.str("mode", "");
  int rank = ctx.rank;
  setPhase(format("%s guard: waiting for rank %d's child", scenario, rank));
  startWatchdog(ctx.scenario, rank, deadlineS + 30);
  Deadline deadline(deadlineS, "--deadline");
  std::string resume = format("resume.%d", rank);
  int status = 0;
  bool stopped = false;
  while (true) {
    pid_t r = waitpid(childPid, &status, WNOHANG | WUNTRACED);
    if (r == childPid && WIFSTOPPED(status)) {
      printf("[e2e r%d guard] the child (pid %d) is stopped; it is continued once %s/%s exists\n", rank,
             childPid, rv.dir().c_str(), resume.c_str());
      stopped = true;
    } else if (r == childPid) {
      break;
    }
    if (r < 0 && errno != EINTR) {
      printf("FAIL %s rank=%d mode=%s: waitpid: %s\n", scenario, rank, mode.c_str(), strerror(errno));
      return 1;
    }
    if (stopped && rv.exists(resume)) {
      printf("[e2e r%d guard] %s: SIGCONT to the child (pid %d)\n", rank, resume.c_str(), childPid);
      kill(childPid, SIGCONT);
      stopped = false;
    }
    if (stopped) {  // a stopped child cannot see another rank fail: stop waiting for it here
      try {
        rv.checkAborts();
      } catch (const std::exception& e) {
        kill(childPid, SIGKILL);
        waitpid(childPid, &status, 0);
        printf("FAIL %s rank=%d mode=%s: killed the stopped child (pid %d): %s\n", scenario, rank, mode.c_str(),
               childPid, e.what());
        return 1;
      }
    }
    if (deadline.expired()) {
      kill(childPid, SIGKILL);
      waitpid(childPid, &status, 0);
      printf("FAIL %s rank=%d mode=%s: the child (pid %d) was still %s at the deadline (%.0f s); "
             "killed it\n", scenario, rank, mode.c_str(), childPid, stopped ? "stopped" : "running", deadlineS);
      return 1;
    }
    pollPause(10 * 1000);
  }
  bool planned = readsPlanned(reportFd);
  std::string how = WIFSIGNALED(status) ? format("signal %d", WTERMSIG(status))
                                        : format("exit %d", WEXITSTATUS(status));
  bool exited0 = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!planned && exited0) {
    // It ran to its end and printed its own PASS line (a rank that was spared).
    printf("[e2e r%d guard] the child (pid %d) was not needed to die and passed\n", rank, childPid);
    return 0;
  }
  bool expected = planned && ((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) || exited0);
  if (!expected) {
    printf("FAIL %s rank=%d mode=%s: the child (pid %d) ended with %s %s\n", scenario, rank, mode.c_str(),
           childPid, how.c_str(), planned ? "(unexpected way to die)" : "before its planned death (see its FAIL line)");
    return 1;
  }
  printf("PASS %s rank=%d mode=%s: child pid %d died as planned (%s)\n", scenario, rank, mode.c_str(), childPid,
         how.c_str());
  return 0;
}

// 2 nodes, --mode never-accept | listener-dies | peer-killed | idle | mid-send (--size, 64M:
// the message rank 1 dies under); see the file comment.
std::string runDeadPeer(Context& ctx) {
  requireNodes(ctx, 2);
  std::string mode = ctx.opts.str("mode", "");
  double margin = ctx.opts.real("margin", 20);
  bool connectMode = mode == "never-accept" || mode == "listener-dies";
  if (!connectMode && mode != "peer-killed" && mode != "idle" && mode != "mid-send" && mode != "exits") {
    fail("dead-peer needs --mode never-accept|listener-dies|peer-killed|idle|mid-send|exits (got '%s')",
         mode.c_str());
  }
  double bound = ctx.opts.real("bound", mode == "never-accept" ? acceptWaitSeconds() + margin
                                        : connectMode              ? connectTimeoutSeconds() + margin
                                                                   : 60);
  size_t size = 0;
  if (!parseSize(ctx.opts.str("size", "64M"), &size) || size < 1 || size > (size_t{1} << 30)) {
    fail("--size %s: expected 1..1G bytes", ctx.opts.str("size", "").c_str());
  }
  if (ctx.rank == 0) {
    if (connectMode) return connectMustFail(ctx, mode, bound);
    if (mode == "idle") return idleMustFail(ctx, bound);
    if (mode == "mid-send") return sendMustFail(ctx, size, bound);
    return receiveMustFail(ctx, mode, bound);
  }
  if (mode == "peer-killed") peerKilledVictim(ctx);
  if (mode == "exits") exitsVictim(ctx);
  if (mode == "idle") idleVictim(ctx);
  if (mode == "mid-send") midSendVictim(ctx, size);
  void* lc = listenAndPublish(ctx, "h.1.0.dead", "rank 1's listener for the dead-peer test");
  if (mode == "listener-dies") {
    ctx.rv->fetch("start.0", ctx.deadline, "rank 0 starting to connect");
    say("listener-dies: rank 0 is connecting; exiting now without closing anything");
    dieAsPlanned(false);
  }
  // never-accept: stay alive, never call accept, until rank 0 is done.
  setPhase("never-accept: listening without accepting until rank 0 is done");
  ctx.rv->fetch("done.0", ctx.deadline, "rank 0 finishing its connect attempt");
  ctx.net.check(ctx.net->closeListen(lc), "closeListen", "never-accept listener (never accepted)");
  return "mode=never-accept listened without accepting; closeListen ok";
}

// 2 nodes: rank 1 calls accept --delay s (default 1.5 x NCCL_MESH_CONNECT_TIMEOUT_MS) after
// rank 0 began its connect, as a rank does whose NCCL is still exchanging handles with a
// slower rank (NCCL_RUNTIME_CONNECT: every peer's handle before any connect or accept).
// NCCL's IB transport waits for that accept without a limit; the plugin must wait too (up to
// NCCL_MESH_ACCEPT_WAIT_MS), then the pair carries a message. PASS figures: how long the
// connect waited.
std::string lateAcceptCut(Context& ctx);

std::string runLateAccept(Context& ctx) {
  requireNodes(ctx, 2);
  if (ctx.opts.has("cut")) return lateAcceptCut(ctx);
  double delay = ctx.opts.real("delay", 1.5 * connectTimeoutSeconds());
  if (delay <= 0 || delay >= acceptWaitSeconds()) {
    fail("late-accept: --delay %.1f s must lie between 0 and NCCL_MESH_ACCEPT_WAIT_MS (%.1f s)", delay,
         acceptWaitSeconds());
  }
  constexpr size_t kSize = 1 << 20;
  HostBuffer buf(kSize);
  uint64_t seed = patternSeed(0, 1, 7, 0, 0);
  if (ctx.rank == 0) {
    std::string handle = ctx.rv->fetch("h.1.0.late", ctx.deadline, "rank 1's listen handle");
    setPhase(format("late-accept: connecting; rank 1 accepts after %.1f s", delay));
    ConnectDriver driver(ctx);
    PendingConn* p = driver.addConnect(1, 0, handle, "connect rank0->rank1 (accepted late)");
    ctx.rv->publish("start.0", "");  // after the connect's start: rank 1's delay counts from later
    p->mayFail = true;
    p->giveUp = Deadline(acceptWaitSeconds() + 20, "the accept wait");
    driver.drive(ctx.deadline);
    if (p->comm == nullptr) {
      fail("late-accept: connect failed after %.2f s with %s although rank 1 accepts after %.1f s "
           "(NCCL_MESH_CONNECT_TIMEOUT_MS %.1f s, NCCL_MESH_ACCEPT_WAIT_MS %.1f s; last WARN: %s)",
           p->seconds(), resultName(p->rc), delay, connectTimeoutSeconds(), acceptWaitSeconds(),
           ctx.net.lastWarn().c_str());
    }
    if (p->seconds() < 0.9 * delay) {
      fail("late-accept: connected after %.2f s, before rank 1's accept (%.1f s): the test did not set up its case",
           p->seconds(), delay);
    }
    double waited = p->seconds();
    fillPattern(buf.data(), kSize, seed);
    void* mh = regHost(ctx, p->comm, buf, "late-accept send buffer");
    void* req = postSend(ctx, p->comm, buf.data(), kSize, 1, mh, "late-accept: 1 MiB to rank 1");
    waitDone(ctx, req, 1, "late-accept: 1 MiB to rank 1");
    deregHost(ctx, p->comm, mh, "late-accept send buffer");
    ctx.rv->fetch("late-done.1", ctx.deadline, "rank 1 checking the message");
    ctx.net.check(ctx.net->closeSend(p->comm), "closeSend", "late-accept send comm");
    say("late-accept: connected after %.2f s (accept after %.1f s, connect timeout %.1f s); 1 MiB delivered",
        waited, delay, connectTimeoutSeconds());
    return format("connect_s=%.2f delay_s=%.1f connect_timeout_s=%.1f", waited, delay, connectTimeoutSeconds());
  }
  void* lc = listenAndPublish(ctx, "h.1.0.late", "rank 1's late-accepting listener");
  ctx.rv->fetch("start.0", ctx.deadline, "rank 0 starting its connect");
  setPhase(format("late-accept: waiting %.1f s before calling accept", delay));
  Deadline late(delay, "the late accept");
  while (!late.expired()) pollPause(100000);  // the delay under test: the slower rank's
  ConnectDriver driver(ctx);
  PendingConn* a = driver.addAccept(0, 0, lc, "accept rank0->rank1 (late)");
  driver.drive(ctx.deadline);
  void* mh = regHost(ctx, a->comm, buf, "late-accept receive buffer");
  void* req = postRecv(ctx, a->comm, buf.data(), kSize, 1, mh, "late-accept: 1 MiB from rank 0");
  size_t got = waitDone(ctx, req, 1, "late-accept: 1 MiB from rank 0")[0];
  if (got != kSize) fail("late-accept: test() reported %zu bytes, expected %zu", got, kSize);
  std::string bad = checkPattern(buf.data(), kSize, seed);
  if (!bad.empty()) fail("late-accept: %s", bad.c_str());
  deregHost(ctx, a->comm, mh, "late-accept receive buffer");
  ctx.rv->publish("late-done.1", "");
  ctx.net.check(ctx.net->closeRecv(a->comm), "closeRecv", "late-accept recv comm");
  ctx.net.check(ctx.net->closeListen(lc), "closeListen", "late-accept listener");
  return format("accepted after %.1f s; 1 MiB checked", delay);
}

// --cut: rank 1 never accepts; once rank 0's connect has outlived the connect timeout (so it
// waits for the accept), rank 1 takes its cable to rank 0 down (`ip link set p0 down`): no
// FIN ever comes. TCP keepalive must end the wait within NCCL_MESH_PEER_TIMEOUT_MS + 10 s of
// the cut, long before NCCL_MESH_ACCEPT_WAIT_MS, and the WARN must say so. PASS figures: the
// time from the cut. (Rank 1 leaves its cable down: the fabric's namespaces go with the run.)
std::string lateAcceptCut(Context& ctx) {
  double peerTimeout = envSeconds("NCCL_MESH_PEER_TIMEOUT_MS", 30000);
  double bound = ctx.opts.real("bound", peerTimeout + 10);
  if (bound >= acceptWaitSeconds()) {
    fail("late-accept --cut: the bound (%.1f s) must be below NCCL_MESH_ACCEPT_WAIT_MS (%.1f s), or the test "
         "cannot tell keepalive from the end of the wait", bound, acceptWaitSeconds());
  }
  if (ctx.rank == 0) {
    std::string handle = ctx.rv->fetch("h.1.0.cut", ctx.deadline, "rank 1's listen handle");
    ConnectDriver driver(ctx);
    PendingConn* p = driver.addConnect(1, 0, handle, "connect rank0->rank1 (its cable cut while it waits)");
    p->mayFail = true;
    p->giveUp = Deadline(acceptWaitSeconds() + 20, "the accept wait");
    setPhase("late-accept --cut: connecting; waiting past the connect timeout");
    bool told = false;
    Clock::time_point cutSeen;
    bool cut = false;
    driver.drive(ctx.deadline, [&] {
      if (!told && p->seconds() > connectTimeoutSeconds() + 0.5) {
        told = true;  // still pending past the connect timeout: it waits for the accept
        ctx.rv->publish("waiting.0", "");
        setPhase(format("late-accept --cut: waiting for the cut, then for the connect to fail (bound %.1f s)", bound));
      }
      if (told && !cut && ctx.rv->exists("cut.1")) {
        cut = true;
        cutSeen = Clock::now();
      }
      if (cut && secondsSince(cutSeen) > bound) {
        fail("late-accept --cut: connect still pending %.1f s after rank 1's cable went down (bound %.1f s: "
             "NCCL_MESH_PEER_TIMEOUT_MS %.1f s + 10): nothing noticed the peer vanish", secondsSince(cutSeen), bound,
             peerTimeout);
      }
      return false;
    });
    if (p->comm != nullptr) fail("late-accept --cut: connected although rank 1 never accepted");
    if (!told) fail("late-accept --cut: the connect failed after %.2f s, before the connect timeout", p->seconds());
    if (!cut) fail("late-accept --cut: the connect failed (%s) before rank 1 cut its cable", resultName(p->rc));
    if (!isPeerFailure(p->rc)) {
      fail("late-accept --cut: connect failed with %s; expected ncclSystemError or ncclRemoteError (last WARN: %s)",
           resultName(p->rc), ctx.net.lastWarn().c_str());
    }
    if (ctx.net.lastWarn().find("NCCL_MESH_PEER_TIMEOUT_MS") == std::string::npos) {
      fail("late-accept --cut: the connect's WARN does not say that keepalive ended it (NCCL_MESH_PEER_TIMEOUT_MS): %s",
           ctx.net.lastWarn().c_str());
    }
    double afterCut = secondsBetween(cutSeen, p->finishedAt);
    ctx.rv->publish("done.0", "");
    say("late-accept --cut: connect failed %.2f s after the cut (%.2f s in all) with %s; WARN: %s", afterCut,
        p->seconds(), resultName(p->rc), ctx.net.lastWarn().c_str());
    return format("cut_to_error_s=%.2f connect_s=%.2f bound_s=%.1f", afterCut, p->seconds(), bound);
  }
  void* lc = listenAndPublish(ctx, "h.1.0.cut", "rank 1's listener that never accepts");
  ctx.rv->fetch("waiting.0", ctx.deadline, "rank 0's connect waiting past the connect timeout");
  std::string cmd = "ip link set dev p0 down";
  say("late-accept --cut: %s", cmd.c_str());
  int rc = system(cmd.c_str());
  if (rc != 0) fail("late-accept --cut: '%s' exited %d", cmd.c_str(), rc);
  ctx.rv->publish("cut.1", "");
  setPhase("late-accept --cut: cable down, waiting for rank 0's connect to fail");
  ctx.rv->fetch("done.0", ctx.deadline, "rank 0's connect failing");
  ctx.net.check(ctx.net->closeListen(lc), "closeListen", "the listener whose cable was cut");
  return "cut the cable while rank 0 waited for the accept; closeListen ok";
}

// The receiver closes its comm the moment its receive completes, as NCCL may at the end of a
// job; the sender's test() of that send must complete, not fail with "the peer closed ... with
// a request pending": the close (a TCP FIN) can reach the sender before its NIC's last
// acknowledgement does (a software NIC, or the fabric's --delay, which delays the ACK and not
// the FIN). The sender keeps calling test(), as NCCL's proxy does, so it sees the close first.
// PASS figures: how many sends completed after the peer's close (the plugin's INFO line).
std::string runCloseAfterReceive(Context& ctx) {
  requireNodes(ctx, 2);
  int rounds = static_cast<int>(ctx.opts.integer("rounds", 10));
  size_t size = static_cast<size_t>(ctx.opts.integer("size", 64 * 1024));
  if (rounds < 1 || size < 1 || size > (1u << 30)) fail("need --rounds >= 1 and 1 <= --size <= 1G");
  bool sender = ctx.rank == 0;
  int peer = 1 - ctx.rank;
  int late = 0;
  for (int round = 1; round <= rounds; ++round) {
    setPhase(format("close-after-receive round %d: connecting", round));
    EstablishSpec spec;
    if (sender) spec.connectTo = {peer};
    else spec.acceptFrom = {peer};
    spec.tag = format("car%d", round);
    CommTable t = establish(ctx, spec, ctx.deadline);
    HostBuffer buf(size);
    uint64_t seed = patternSeed(0, 1, static_cast<uint64_t>(round), 0, 0);
    size_t mark = ctx.net.logSize();
    void* mh = nullptr;
    if (sender) {
      fillPattern(buf.data(), size, seed);
      mh = regHost(ctx, t[peer].send[0], buf, "close-after-receive send buffer");
      std::string what = format("round %d: isend of %zu bytes to a receiver that closes once it has them", round, size);
      setPhase(what);
      void* req = postSend(ctx, t[peer].send[0], buf.data(), size, round, mh, what);
      waitDone(ctx, req, 1, what + " (the receiver had all the bytes and closed: the send was complete)");
      late += countLog(ctx, mark, "after the peer closed its connection");
      deregHost(ctx, t[peer].send[0], mh, "close-after-receive send buffer");
    } else {
      mh = regHost(ctx, t[peer].recv[0], buf, "close-after-receive receive buffer");
      std::string what = format("round %d: irecv of %zu bytes", round, size);
      void* req = postRecv(ctx, t[peer].recv[0], buf.data(), size, round, mh, what);
      size_t got = waitDone(ctx, req, 1, what)[0];
      if (got != size) fail("%s: test() reported %zu bytes", what.c_str(), got);
      std::string bad = checkPattern(buf.data(), size, seed);
      if (!bad.empty()) fail("%s: %s", what.c_str(), bad.c_str());
    }
    // The receiver closes at once (its registration first, as NCCL deregisters before closing).
    if (!sender) deregHost(ctx, t[peer].recv[0], mh, "close-after-receive receive buffer");
    closeAll(ctx, t);
    ctx.barrier(format("car-closed-%d", round));
  }
  return format("rounds=%d size=%zu every send completed%s", rounds, size,
                sender ? format(" (%d after the receiver's close)", late).c_str() : "");
}

// 2 nodes: --rounds (20) times: connect both ways, post --inflight (16) receives and
// sends of --size bytes, close with requests in flight. Odd rounds: both ranks finish
// posting (barrier) before either closes, so every post must succeed. Even rounds: no
// barrier, the peer may be closing while this rank still posts, so isend/irecv errors
// are tolerated (counted). No crash, no hang, closes succeed, fds and RDMA objects stable
// from round 1 to the last; the plugin still works afterwards.
std::string runCloseInflight(Context& ctx) {
  requireNodes(ctx, 2);
  int rounds = static_cast<int>(ctx.opts.integer("rounds", 20));
  int inflight = static_cast<int>(ctx.opts.integer("inflight", 16));
  int size = static_cast<int>(ctx.opts.integer("size", 256 * 1024));
  if (rounds < 2 || inflight < 1 || inflight > kMaxRequests || size < 1) {
    fail("need --rounds >= 2, 1 <= --inflight <= %d, --size >= 1", kMaxRequests);
  }
  int peer = 1 - ctx.rank;
  Snapshot base, last;
  size_t postedSends = 0, postedRecvs = 0;
  int refused = 0;
  for (int round = 1; round <= rounds; ++round) {
    RoundResult r = closeInflightRound(ctx, round, inflight, size);
    postedRecvs += r.recvs;
    postedSends += r.sends;
    refused += r.refused;
    ctx.barrier(format("round-%d", round));
    if (round == 1) {
      base = stableSnapshot(5);
      say("after round 1: %s", base.describe().c_str());
    }
  }
  setPhase("close-inflight: comparing resources to round 1");
  std::string leak = compareToBaseline(base, 10, &last);
  say("after round %d: %s", rounds, last.describe().c_str());
  if (!leak.empty()) fail("resources grew between round 1 and round %d: %s", rounds, leak.c_str());
  setPhase("close-inflight: health check");
  CommTable t = establish(ctx, {{peer}, {peer}, 1, "health"}, ctx.deadline);
  exchangeSmall(ctx, peer, t[peer].send[0], t[peer].recv[0], 99, "health check after close-inflight");
  ctx.barrier("health");
  closeAll(ctx, t);
  return format("rounds=%d posted_irecvs=%zu posted_isends=%zu refused_posts=%d round1=[%s] last=[%s] healthy",
                rounds, postedRecvs, postedSends, refused, base.describe().c_str(), last.describe().c_str());
}

}  // namespace e2e
