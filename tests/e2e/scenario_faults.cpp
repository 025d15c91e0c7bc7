// SPDX-License-Identifier: Apache-2.0
// Fault injection beyond dead peers: a cable cut under traffic (link-down), the library
// unloaded and loaded again with no thread or object left behind (reload), hostile or
// careless callers (bad-input: random and damaged handles, NULL pointers, double closes,
// test() on a finished request) and a locked-memory limit too low for a registration
// (memlock), a NIC's fatal error (device-fatal, on the userspace fabric). Each checks that the plugin answers with an error in bounded time, never
// crashes or hangs, loses nothing, and keeps working for everything not affected.
#include <dirent.h>
#include <dlfcn.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>

#include "comm_setup.h"
#include "scenarios.h"
#include "stream.h"
#include "transfer.h"

namespace e2e {
namespace {

bool isError(ncclResult_t rc) { return rc != ncclSuccess && rc != ncclInProgress; }

// ---- link-down ------------------------------------------------------------------------------

// 3 nodes, full mesh. Every rank streams both ways with both peers. Rank 0 takes its
// netdev towards rank 1 down (`ip link set p1 down`) mid-stream. Ranks 0 and 1 must see
// both directions of their comms with each other fail within --bound (default: the QP
// retry time or NCCL_MESH_PEER_TIMEOUT_MS, whichever is longer, + 15 s); rank 0 must log
// the port-error async event; every stream not on that link keeps moving correct data;
// closing the failed comms succeeds.
std::string linkDown(Context& ctx) {
  requireNodes(ctx, 3);
  if (ctx.topology != "full" || ctx.linksPerPair != 1) fail("link-down needs a full mesh with one link per pair");
  size_t size = 0;
  if (!parseSize(ctx.opts.str("size", "256K"), &size) || size < 1 || size > (64u << 20)) {
    fail("--size: expected 1..64M bytes");
  }
  int after = static_cast<int>(ctx.opts.integer("after", 8));
  int ibTimeout = atoi(getenv("NCCL_MESH_IB_TIMEOUT") ? getenv("NCCL_MESH_IB_TIMEOUT") : "20");
  int retries = atoi(getenv("NCCL_MESH_IB_RETRY_CNT") ? getenv("NCCL_MESH_IB_RETRY_CNT") : "7");
  double qpRetry = 4.096e-6 * std::ldexp(1.0, ibTimeout) * (retries + 1);
  double peerTimeout = envSeconds("NCCL_MESH_PEER_TIMEOUT_MS", 30000);
  double bound = ctx.opts.real("bound", std::max(qpRetry, peerTimeout) + 15);
  const int cutter = 0, cutPeer = 1;
  bool onCut = ctx.rank == cutter || ctx.rank == cutPeer;
  int other = ctx.rank == cutter ? cutPeer : ctx.rank == cutPeer ? cutter : -1;

  std::vector<int> peers;
  for (int p = 0; p < ctx.nodes; ++p) if (p != ctx.rank) peers.push_back(p);
  CommTable t = establish(ctx, {peers, peers, 1, "linkdown"}, ctx.deadline);
  std::vector<Stream> streams(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    openStream(ctx, &streams[i], peers[i], t[peers[i]].send[0], t[peers[i]].recv[0], size);
  }
  auto pumpAll = [&] {
    for (Stream& s : streams) {
      bool cutStream = s.peer == other;
      if (cutStream && s.bothFailed()) continue;
      pump(ctx, &s, cutStream);
    }
    ctx.rv->checkAborts();
  };
  auto everyStreamAt = [&](uint64_t n) {
    for (const Stream& s : streams) if (s.done() < n) return false;
    return true;
  };

  setPhase("link-down: streaming with every peer before the cut");
  while (!everyStreamAt(4)) {
    if (ctx.deadline.expired()) fail("link-down: fewer than 4 messages each way before the deadline");
    pumpAll();
  }
  size_t mark = ctx.net.logSize();
  Clock::time_point cutAt;
  std::string netdev = format("p%d", cutPeer);
  if (ctx.rank == cutter) {
    std::string cmd = format("ip link set dev %s down", netdev.c_str());
    say("link-down: %s (every stream has moved >= 4 messages each way)", cmd.c_str());
    cutAt = Clock::now();
    int rc = system(cmd.c_str());
    if (rc != 0) fail("link-down: '%s' exited %d", cmd.c_str(), rc);
    ctx.rv->publish("down.0", "");
  }
  // Everyone else learns of the cut through the shared directory (checked every 50 ms
  // while streaming); rank 1's times are measured from then, so they undercount a little.
  Clock::time_point lastLook = Clock::now();
  auto sawFile = [&](const std::string& name) {
    if (secondsSince(lastLook) < 0.05) return false;
    lastLook = Clock::now();
    return ctx.rv->exists(name);
  };
  if (ctx.rank != cutter) {
    setPhase("link-down: streaming until rank 0 cuts its link to rank 1");
    while (!sawFile("down.0")) {
      if (ctx.deadline.expired()) fail("link-down: rank 0 never cut the link");
      pumpAll();
    }
    cutAt = Clock::now();
  }

  Stream* cut = nullptr;
  for (Stream& s : streams) if (s.peer == other) cut = &s;
  if (onCut) {
    setPhase(format("link-down: waiting for both directions with rank %d to fail (bound %.0f s)", other, bound));
    while (!cut->bothFailed()) {
      if (secondsSince(cutAt) > bound) {
        fail("link-down: %.0f s after the cut, the comms with rank %d still have not both failed "
             "(send %s, recv %s; %llu/%llu messages sent/received since start); expected errors "
             "within the QP retry time (%.1f s) or NCCL_MESH_PEER_TIMEOUT_MS (%.1f s)",
             bound, other, cut->sendFailed ? resultName(cut->sendRc) : "still working",
             cut->recvFailed ? resultName(cut->recvRc) : "still working",
             static_cast<unsigned long long>(cut->sdone), static_cast<unsigned long long>(cut->rdone),
             qpRetry, peerTimeout);
      }
      pumpAll();
    }
    for (ncclResult_t rc : {cut->sendRc, cut->recvRc}) {
      if (!isPeerFailure(rc)) fail("link-down: a comm with rank %d failed with %s; expected ncclRemoteError or ncclSystemError", other, resultName(rc));
    }
    ctx.rv->publish(format("detected.%d", ctx.rank), "");
  }
  double sendErr = onCut ? secondsBetween(cutAt, cut->sendFailedAt) : 0;
  double recvErr = onCut ? secondsBetween(cutAt, cut->recvFailedAt) : 0;
  if (onCut) {
    say("link-down: comms with rank %d failed: send %s after %.2f s, recv %s after %.2f s (bound %.0f s)",
        other, resultName(cut->sendRc), sendErr, resultName(cut->recvRc), recvErr, bound);
  }

  // The other links keep moving correct data: `after` more messages each way per healthy
  // stream once both ends of the cut have seen their errors.
  setPhase("link-down: healthy streams after the failure");
  while (!(ctx.rv->exists("detected.0") && ctx.rv->exists("detected.1"))) {
    if (ctx.deadline.expired()) fail("link-down: ranks 0 and 1 did not both report their errors");
    pumpAll();
  }
  std::map<int, std::pair<uint64_t, uint64_t>> base;
  for (const Stream& s : streams) base[s.peer] = {s.sdone, s.rdone};
  auto healthyDone = [&] {
    for (const Stream& s : streams) {
      if (s.peer == other) continue;
      if (s.sdone < base[s.peer].first + after || s.rdone < base[s.peer].second + after) return false;
    }
    return true;
  };
  while (!healthyDone()) {
    if (ctx.deadline.expired()) fail("link-down: the healthy streams stalled after the failure");
    pumpAll();
  }
  ctx.rv->publish(format("enough.%d", ctx.rank), "");
  auto allEnough = [&] {
    for (int r = 0; r < ctx.nodes; ++r) if (!ctx.rv->exists(format("enough.%d", r))) return false;
    return true;
  };
  lastLook = Clock::now();
  while (true) {  // keep serving the peers until they have their counts too
    if (sawFile("enough.0") && allEnough()) break;
    if (ctx.deadline.expired()) fail("link-down: peers did not finish their post-failure traffic");
    pumpAll();
  }

  std::string portWarn;
  if (ctx.rank == cutter) {
    portWarn = ctx.net.findWarn("port error", mark);
    if (portWarn.empty()) portWarn = ctx.net.findWarn("PORT_ERR", mark);
    if (portWarn.empty()) {
      fail("link-down: no WARN about the port error after taking %s down: the async-event "
           "watcher did not report IBV_EVENT_PORT_ERR", netdev.c_str());
    }
  }
  std::string healthy;
  for (const Stream& s : streams) {
    if (s.peer != other) healthy += format(" rank%d:%llu/%llu", s.peer, static_cast<unsigned long long>(s.sdone),
                                           static_cast<unsigned long long>(s.rdone));
  }
  setPhase("link-down: closing every comm, the failed ones included");
  ctx.barrier("before-close");
  for (Stream& s : streams) closeStream(ctx, &s);
  closeAll(ctx, t);
  ctx.barrier("closed");
  if (ctx.rank == cutter) {
    int rc = system(format("ip link set dev %s up", netdev.c_str()).c_str());
    (void)rc;
  }
  if (onCut) {
    return format("cut=p%d peer=%d send_error=%s send_error_after_s=%.2f recv_error=%s "
                  "recv_error_after_s=%.2f bound_s=%.0f healthy_sent/recv=%s%s",
                  cutPeer, other, resultName(cut->sendRc), sendErr, resultName(cut->recvRc), recvErr,
                  bound, healthy.c_str(), portWarn.empty() ? "" : " port_error_event=yes");
  }
  return format("untouched; healthy_sent/recv=%s", healthy.c_str());
}

// ---- reload ---------------------------------------------------------------------------------

// 2 nodes: the plugin main() loaded is unloaded; then --rounds (3) times: dlopen, init,
// comms both ways (2 each) with an exchange on every pair, close all, finalize, dlclose.
// After each dlclose: the library is gone from the process, and threads, fds and RDMA
// objects are what they were before the first load. (NCCL unloads a v8 plugin when the
// last communicator is destroyed and loads it again for the next one.)
std::string reload(Context& ctx) {
  requireNodes(ctx, 2);
  int rounds = static_cast<int>(ctx.opts.integer("rounds", 3));
  if (rounds < 1) fail("--rounds must be >= 1");
  int peer = 1 - ctx.rank;
  const char* libName = "libnccl-net-mesh.so";
  setPhase("reload: unloading the plugin main() loaded");
  ctx.net.unload();
  if (libraryMapped(libName)) fail("reload: %s is still mapped after the first dlclose", libName);
  int baseThreads = countThreads();
  Snapshot base = stableSnapshot(5);
  say("reload: without the plugin: %d threads, %s", baseThreads, base.describe().c_str());
  int pluginThreads = -1;
  for (int round = 1; round <= rounds; ++round) {
    setPhase(format("reload round %d: loading", round));
    ctx.net.load(ctx.pluginPath, ctx.api, ctx.trafficClass, ctx.verbose);
    int loaded = countThreads() - baseThreads;
    if (pluginThreads < 0) pluginThreads = loaded;
    if (loaded != pluginThreads) fail("reload round %d: the plugin runs %d threads, %d in round 1", round, loaded, pluginThreads);
    setPhase(format("reload round %d: comms", round));
    CommTable t = establish(ctx, {{peer}, {peer}, 2, format("reload%d", round)}, ctx.deadline);
    for (int k = 0; k < 2; ++k) {
      exchangeSmall(ctx, peer, t[peer].send[k], t[peer].recv[k], static_cast<uint64_t>(round * 10 + k),
                    format("reload round %d pair %d", round, k));
    }
    ctx.barrier(format("reload-%d-used", round));
    closeAll(ctx, t);
    setPhase(format("reload round %d: unloading", round));
    ctx.net.unload();
    if (libraryMapped(libName)) fail("reload round %d: %s is still mapped after dlclose", round, libName);
    int threads = threadsSettled(baseThreads, 5);
    if (threads != baseThreads) {
      fail("reload round %d: %d threads after dlclose, %d before the plugin was loaded: a thread "
           "outlived the library", round, threads, baseThreads);
    }
    Snapshot now;
    std::string leak = compareToBaseline(base, 10, &now);
    if (!leak.empty()) fail("reload round %d: after dlclose %s (before the first load: %s)", round, leak.c_str(), base.describe().c_str());
    say("reload round %d: unloaded; %d threads, %s", round, threads, now.describe().c_str());
    ctx.barrier(format("reload-%d-unloaded", round));
  }
  setPhase("reload: loading once more for the final unload");
  ctx.net.load(ctx.pluginPath, ctx.api, ctx.trafficClass, ctx.verbose);
  return format("rounds=%d plugin_threads=%d threads_after_unload=%d base=[%s] unmapped", rounds,
                pluginThreads, baseThreads, base.describe().c_str());
}

// ---- bad-input ------------------------------------------------------------------------------

// A 128-byte handle at the very end (or start) of a page fenced by PROT_NONE pages: a
// read outside the handle faults, so the scenario crashes instead of passing.
class GuardedHandle {
 public:
  GuardedHandle(const unsigned char* bytes, bool atPageEnd) {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    base_ = static_cast<unsigned char*>(mmap(nullptr, 3 * page_, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base_ == MAP_FAILED) fail("mmap: %s", strerror(errno));
    if (mprotect(base_, page_, PROT_NONE) != 0 || mprotect(base_ + 2 * page_, page_, PROT_NONE) != 0) {
      fail("mprotect: %s", strerror(errno));
    }
    handle_ = atPageEnd ? base_ + 2 * page_ - NCCL_NET_HANDLE_MAXSIZE : base_ + page_;
    memcpy(handle_, bytes, NCCL_NET_HANDLE_MAXSIZE);
  }
  ~GuardedHandle() { munmap(base_, 3 * page_); }
  GuardedHandle(const GuardedHandle&) = delete;
  GuardedHandle& operator=(const GuardedHandle&) = delete;
  unsigned char* get() const { return handle_; }

 private:
  size_t page_ = 0;
  unsigned char* base_ = nullptr;
  unsigned char* handle_ = nullptr;
};

struct BadConnect {
  std::string kind;
  std::unique_ptr<GuardedHandle> handle;
  void* comm = nullptr;
  ncclResult_t rc = ncclSuccess;
  bool finished = false;
  Clock::time_point started = Clock::now();
  double seconds = 0;
};

// Rank 0 connects with 256 random handles and with the real handle damaged byte by byte
// (all 128 positions) while rank 1 keeps accepting on the real listener: every connect
// must end (error or, for damage the handle format cannot see, a working comm) within the
// connect timeout + margin, no read may leave the handle, and rank 1 logs its refusals
// at most about once a second. Then misuse: NULL pointers, device out of range, test()
// on a finished request, double closes. Finally fresh comms carry data and no fd or RDMA
// object was lost.
std::string badInput(Context& ctx) {
  requireNodes(ctx, 2);
  int randomCount = static_cast<int>(ctx.opts.integer("random", 256));
  double bound = ctx.opts.real("bound", envSeconds("NCCL_MESH_CONNECT_TIMEOUT_MS", 30000) + 20);
  int peer = 1 - ctx.rank;
  Snapshot base = stableSnapshot(5);
  std::string figures;
  if (ctx.rank == 1) {
    size_t mark = ctx.net.logSize();
    void* lc = listenAndPublish(ctx, "h.1.0.bad", "rank 1's listener under attack");
    setPhase("bad-input: accepting on the attacked listener until rank 0 is done");
    Clock::time_point t0 = Clock::now();
    int accepted = 0;
    while (!ctx.rv->exists("bad-done.0")) {
      void* rc = nullptr;
      ctx.net.check(ctx.net->accept(lc, &rc), "accept", "on the attacked listener");
      if (rc != nullptr) {
        ++accepted;
        ctx.net.check(ctx.net->closeRecv(rc), "closeRecv", "a comm accepted from a damaged handle");
      }
      if (ctx.deadline.expired()) fail("bad-input: rank 0 never finished");
      pollPause(2000);
    }
    double secs = secondsSince(t0);
    ctx.net.check(ctx.net->closeListen(lc), "closeListen", "the attacked listener");
    int warns = 0;
    for (const LogLine& l : ctx.net.logSince(mark)) warns += l.level == NCCL_LOG_WARN;
    if (warns > secs + 3) {
      fail("bad-input: %d WARN lines in %.1f s under attack; refusals must be rate-limited "
           "(about one a second)", warns, secs);
    }
    figures = format("listener: accepted=%d warn_lines=%d in %.1f s", accepted, warns, secs);
  } else {
    std::string real = ctx.rv->fetch("h.1.0.bad", ctx.deadline, "rank 1's listen handle");
    if (real.size() != NCCL_NET_HANDLE_MAXSIZE) fail("handle file has %zu bytes", real.size());
    std::vector<BadConnect> cases;
    std::mt19937_64 rng(ctx.seed);
    unsigned char bytes[NCCL_NET_HANDLE_MAXSIZE];
    for (int i = 0; i < randomCount; ++i) {
      for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng());
      cases.push_back({"random", std::make_unique<GuardedHandle>(bytes, i % 2 == 0)});
    }
    for (int pos = 0; pos < NCCL_NET_HANDLE_MAXSIZE; ++pos) {
      memcpy(bytes, real.data(), sizeof(bytes));
      bytes[pos] ^= 0x5A;
      cases.push_back({format("byte %d damaged", pos), std::make_unique<GuardedHandle>(bytes, pos % 2 == 1)});
    }
    setPhase(format("bad-input: %zu connects with bad handles", cases.size()));
    size_t open = cases.size();
    Deadline giveUp(bound, "bad-input bound");
    while (open > 0) {
      for (BadConnect& c : cases) {
        if (c.finished) continue;
        c.rc = ctx.net->connect(ctx.dev, c.handle->get(), &c.comm);
        if (c.rc == ncclSuccess && c.comm == nullptr) continue;
        c.finished = true;
        c.seconds = secondsSince(c.started);
        --open;
      }
      if (open > 0 && giveUp.expired()) {
        for (const BadConnect& c : cases) {
          if (!c.finished) fail("bad-input: connect with a %s handle still pending after %.0f s", c.kind.c_str(), bound);
        }
      }
      if (open > 0) pollPause(1000);
    }
    int randomErrors = 0, damagedErrors = 0, damagedOk = 0;
    double slowest = 0;
    std::map<std::string, int> codes;
    for (BadConnect& c : cases) {
      slowest = std::max(slowest, c.seconds);
      bool random = c.kind == "random";
      if (c.rc == ncclSuccess) {
        if (random) fail("bad-input: connect with a random handle SUCCEEDED");
        ++damagedOk;  // e.g. a listener-side NIC index: still a valid handle to the real listener
        ctx.net.check(ctx.net->closeSend(c.comm), "closeSend", "comm from a damaged handle");
        continue;
      }
      ++codes[resultName(c.rc)];
      (random ? randomErrors : damagedErrors)++;
    }
    if (randomErrors != randomCount) fail("bad-input: %d of %d random handles failed", randomErrors, randomCount);
    std::string codeText;
    for (const auto& kv : codes) codeText += format("%s%s:%d", codeText.empty() ? "" : ",", kv.first.c_str(), kv.second);
    say("bad-input: %d random handles refused; %d of 128 damaged handles refused, %d still "
        "valid and connected; codes %s; slowest %.2f s", randomErrors, damagedErrors, damagedOk,
        codeText.c_str(), slowest);
    ctx.rv->publish("bad-done.0", "");
    figures = format("random_refused=%d/%d damaged_refused=%d/128 damaged_valid=%d codes=%s slowest_s=%.2f",
                     randomErrors, randomCount, damagedErrors, damagedOk, codeText.c_str(), slowest);
  }
  ctx.barrier("attack-over");

  // ---- misuse on real comms ----
  setPhase("bad-input: misuse");
  CommTable t = establish(ctx, {{peer}, {peer}, 1, "misuse"}, ctx.deadline);
  void* sc = t[peer].send[0];
  void* rcv = t[peer].recv[0];
  int misuse = 0;
  auto expectError = [&](ncclResult_t rc, const char* what) {
    if (!isError(rc)) fail("bad-input: %s returned %s; expected an error", what, resultName(rc));
    ++misuse;
  };
  void* req = nullptr;
  int done = 0;
  unsigned char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* comm = nullptr;
  HostBuffer buf(4096);
  void* mh = regHost(ctx, sc, buf, "misuse buffer");
  expectError(ctx.net->test(nullptr, &done, nullptr, 1), "test(NULL request)");
  expectError(ctx.net->isend(nullptr, buf.data(), 8, 0, mh, &req), "isend(NULL comm)");
  expectError(ctx.net->isend(sc, buf.data(), 8, 0, mh, nullptr), "isend(NULL request pointer)");
  expectError(ctx.net->irecv(nullptr, 1, nullptr, nullptr, nullptr, nullptr, &req), "irecv(NULL comm)");
  expectError(ctx.net->irecv(rcv, 1, nullptr, nullptr, nullptr, nullptr, &req), "irecv(NULL arrays)");
  expectError(ctx.net->regMr(sc, buf.data(), 4096, NCCL_PTR_HOST, nullptr), "regMr(NULL mhandle pointer)");
  expectError(ctx.net->deregMr(sc, nullptr), "deregMr(NULL)");
  expectError(ctx.net->closeSend(nullptr), "closeSend(NULL)");
  expectError(ctx.net->closeRecv(nullptr), "closeRecv(NULL)");
  expectError(ctx.net->closeListen(nullptr), "closeListen(NULL)");
  expectError(ctx.net->listen(ctx.dev, nullptr, &comm), "listen(NULL handle)");
  expectError(ctx.net->listen(99, handle, &comm), "listen(device 99)");
  expectError(ctx.net->connect(99, handle, &comm), "connect(device 99)");
  expectError(ctx.net->connect(ctx.dev, nullptr, &comm), "connect(NULL handle)");
  expectError(ctx.net->accept(nullptr, &comm), "accept(NULL listen comm)");
  deregHost(ctx, sc, mh, "misuse buffer");
  // test() again on a request that already reported done.
  {
    constexpr int kBytes = 8;
    HostBuffer out(kBytes), in(kBytes);
    void* mhOut = regHost(ctx, sc, out, "finished-request send");
    void* mhIn = regHost(ctx, rcv, in, "finished-request recv");
    // The receive first: both ranks run this, and an isend waits for the peer's irecv.
    void* rreq = postRecv(ctx, rcv, in.data(), kBytes, 5, mhIn, "finished-request check irecv");
    void* sreq = postSend(ctx, sc, out.data(), kBytes, 5, mhOut, "finished-request check isend");
    Deadline by(60, "finished-request check");
    int sdone = 0, rdone = 0;
    while (!(sdone && rdone)) {
      size_t got[1];
      if (!sdone) ctx.net.check(ctx.net->test(sreq, &sdone, got, 1), "test", "finished-request isend");
      if (!rdone) ctx.net.check(ctx.net->test(rreq, &rdone, got, 1), "test", "finished-request irecv");
      if (by.expired()) fail("bad-input: the 8-byte exchange for the finished-request check did not finish");
      if (!(sdone && rdone)) pollPause(1000);
    }
    size_t got[1];
    expectError(ctx.net->test(sreq, &done, got, 1), "test() on a finished isend");
    expectError(ctx.net->test(rreq, &done, got, 1), "test() on a finished irecv");
    deregHost(ctx, sc, mhOut, "finished-request send");
    deregHost(ctx, rcv, mhIn, "finished-request recv");
  }
  // The comms still work after all that.
  exchangeSmall(ctx, peer, sc, rcv, 42, "after the misuse");
  ctx.barrier("misuse-done");
  void* lc = t[peer].listen[0];
  closeAll(ctx, t);
  expectError(ctx.net->closeSend(sc), "a second closeSend");
  expectError(ctx.net->closeRecv(rcv), "a second closeRecv");
  expectError(ctx.net->closeListen(lc), "a second closeListen");

  // Nothing lost: a fresh pair of comms works, and fds/RDMA objects are back to the start.
  CommTable fresh = establish(ctx, {{peer}, {peer}, 1, "fresh"}, ctx.deadline);
  exchangeSmall(ctx, peer, fresh[peer].send[0], fresh[peer].recv[0], 43, "fresh comms after bad input");
  ctx.barrier("fresh-done");
  closeAll(ctx, fresh);
  Snapshot now;
  std::string leak = compareToBaseline(base, 10, &now);
  if (!leak.empty()) fail("bad-input: %s after everything was closed (start: %s)", leak.c_str(), base.describe().c_str());
  return format("%s misuse_errors=%d fresh_comms_ok released", figures.c_str(), misuse);
}

// ---- memlock --------------------------------------------------------------------------------

// Drops CAP_IPC_LOCK (root may pin memory without limit) so RLIMIT_MEMLOCK applies.
void dropIpcLock() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) fail("capget: %s", strerror(errno));
  data[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
  data[CAP_TO_INDEX(CAP_IPC_LOCK)].permitted &= ~CAP_TO_MASK(CAP_IPC_LOCK);
  if (syscall(SYS_capset, &hdr, data) != 0) fail("capset: %s", strerror(errno));
}

// 2 nodes: both ranks drop CAP_IPC_LOCK, set RLIMIT_MEMLOCK to --limit (8M) and load the
// plugin again. A registration larger than the limit must fail with a WARN naming
// `ulimit -l`; one within it, and the comms, must keep working.
std::string memlock(Context& ctx) {
  requireNodes(ctx, 2);
  size_t limit = 0, big = 0;
  if (!parseSize(ctx.opts.str("limit", "8M"), &limit) || !parseSize(ctx.opts.str("big", "64M"), &big) || big <= limit) {
    fail("need --limit < --big");
  }
  int peer = 1 - ctx.rank;
  // Before the plugin opens any device: the kernel refuses verbs commands written to a
  // uverbs fd by a process whose credentials changed since it opened it (EPERM on rxe's
  // post_send), so the plugin is reloaded under the new limits, as a job would start.
  ctx.net.unload();
  dropIpcLock();
  rlimit rl{limit, limit};
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) fail("setrlimit(RLIMIT_MEMLOCK): %s", strerror(errno));
  ctx.net.load(ctx.pluginPath, ctx.api, ctx.trafficClass, ctx.verbose);
  CommTable t = establish(ctx, {{peer}, {peer}, 1, "memlock"}, ctx.deadline);
  void* sc = t[peer].send[0];
  HostBuffer huge(big);
  size_t mark = ctx.net.logSize();
  void* mh = nullptr;
  ncclResult_t rc = ctx.net->regMr(sc, huge.data(), big, NCCL_PTR_HOST, &mh);
  if (rc == ncclSuccess) {
    fail("memlock: registering %s succeeded under RLIMIT_MEMLOCK %s without CAP_IPC_LOCK",
         humanBytes(big).c_str(), humanBytes(limit).c_str());
  }
  std::string why = ctx.net.findWarn("ulimit -l", mark);
  if (why.empty()) {
    fail("memlock: regMr failed with %s but no WARN tells the user about `ulimit -l` (last WARN: %s)",
         resultName(rc), ctx.net.lastWarn().c_str());
  }
  say("memlock: regMr(%s) failed with %s: %s", humanBytes(big).c_str(), resultName(rc), why.c_str());
  exchangeSmall(ctx, peer, sc, t[peer].recv[0], 1, "after the failed registration");
  ctx.barrier("memlock-done");
  closeAll(ctx, t);
  return format("limit=%zu big=%zu regMr_error=%s warned=ulimit-l comms_ok", limit, big, resultName(rc));
}

// ---- device-fatal ----------------------------------------------------------------------------

// 2 nodes on the userspace fabric. Rank 1's device towards rank 0 suffers a fatal error
// (meshfab_test_device_fatal, found in the verbs library the plugin loaded: every context gets
// IBV_EVENT_DEVICE_FATAL and its CQs complete nothing more, as mlx5 after a firmware failure).
// Each rank has a receive posted that nothing will match, so only an error can end it: rank
// 1's must fail within --bound (5 s) with ncclSystemError and a WARN naming the event; rank
// 0's once rank 1 closed its comms (its peer gone). Then rank 1's next connect to rank 0 must
// fail at once, naming the earlier fatal error.
std::string deviceFatal(Context& ctx) {
  requireNodes(ctx, 2);
  double bound = ctx.opts.real("bound", 5);
  int peer = 1 - ctx.rank;
  using Hook = int (*)(const char*);
  Hook hook = nullptr;
  if (ctx.rank == 1) {
    const char* lib = getenv("NCCL_MESH_IBVERBS_LIB");
    void* h = lib != nullptr ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : nullptr;
    if (h != nullptr) hook = reinterpret_cast<Hook>(dlsym(h, "meshfab_test_device_fatal"));
    if (hook == nullptr) {
      fail("device-fatal: no meshfab_test_device_fatal in NCCL_MESH_IBVERBS_LIB (%s): run it on the userspace fabric",
           lib != nullptr ? lib : "unset");
    }
    dlclose(h);  // the plugin holds it open
  }
  CommTable t = establish(ctx, {{peer}, {peer}, 1, "fatal"}, ctx.deadline);
  exchangeSmall(ctx, peer, t[peer].send[0], t[peer].recv[0], 1, "before the fatal error");
  HostBuffer buf(4096);
  void* mh = regHost(ctx, t[peer].recv[0], buf, "device-fatal receive");
  void* req = postRecv(ctx, t[peer].recv[0], buf.data(), buf.size(), 99, mh, "device-fatal receive");
  ctx.barrier("posted");
  size_t mark = ctx.net.logSize();
  std::string device = format("fab_p%d", peer);
  if (ctx.rank == 1) {
    say("device-fatal: %s suffers a fatal error now", device.c_str());
    int rc = hook(device.c_str());
    if (rc != 0) fail("device-fatal: meshfab_test_device_fatal(%s) returned %d", device.c_str(), rc);
  }
  Clock::time_point t0 = Clock::now();
  double limit = ctx.rank == 1 ? bound : bound + 10;  // rank 0: after rank 1's error and close
  ncclResult_t rc = ncclSuccess;
  for (;;) {
    int done = 0;
    size_t got[1] = {0};
    rc = ctx.net->test(req, &done, got, 1);
    if (rc != ncclSuccess) break;
    if (done) fail("device-fatal: a receive nothing matched completed (%zu bytes)", got[0]);
    if (secondsSince(t0) > limit) {
      fail("device-fatal: rank %d's pending receive still had no error %.1f s after rank 1's device failed", ctx.rank,
           limit);
    }
    pollPause(1000);
  }
  double seconds = secondsSince(t0);
  std::string warn;
  if (ctx.rank == 1) {
    if (rc != ncclSystemError) fail("device-fatal: the receive failed with %s, not ncclSystemError", resultName(rc));
    warn = ctx.net.findWarn("IBV_EVENT_DEVICE_FATAL", mark);
    if (warn.empty()) fail("device-fatal: no WARN names IBV_EVENT_DEVICE_FATAL (last WARN: %s)", ctx.net.lastWarn().c_str());
  } else if (!isPeerFailure(rc)) {
    fail("device-fatal: rank 0's receive failed with %s, not a peer failure", resultName(rc));
  }
  say("device-fatal: the pending receive failed with %s after %.3f s", resultName(rc), seconds);
  deregHost(ctx, t[peer].recv[0], mh, "device-fatal receive");
  closeAll(ctx, t);

  // A new connection from rank 1 is refused on the spot.
  std::string connectError = "n/a";
  if (ctx.rank == 0) {
    void* lc = listenAndPublish(ctx, "h.0.1.after-fatal", "listen for rank 1 after its fatal error");
    ctx.rv->fetch("tried", ctx.deadline, "rank 1's connect after the fatal error");
    ctx.net.check(ctx.net->closeListen(lc), "closeListen", "device-fatal");
  } else {
    std::string handle = ctx.rv->fetch("h.0.1.after-fatal", ctx.deadline, "rank 0's listen handle");
    size_t before = ctx.net.logSize();
    ConnectDriver driver(ctx);
    PendingConn* c = driver.addConnect(0, 0, handle, "connect rank1->rank0 after the fatal error");
    c->mayFail = true;
    c->giveUp = Deadline(10, "the connect after the fatal error");
    driver.drive(ctx.deadline);
    ctx.rv->publish("tried", "");
    if (c->comm != nullptr || c->timedOut) {
      fail("device-fatal: a connect on the failed device %s", c->comm != nullptr ? "succeeded" : "never ended");
    }
    if (ctx.net.findWarn("reported a fatal error earlier", before).empty()) {
      fail("device-fatal: the refused connect's WARN does not name the earlier fatal error (last WARN: %s)",
           ctx.net.lastWarn().c_str());
    }
    connectError = resultName(c->rc);
  }
  return format("role=%s error=%s after_s=%.3f next_connect=%s", ctx.rank == 1 ? "failed-device" : "peer",
                resultName(rc), seconds, connectError.c_str());
}

}  // namespace

std::string runDeviceFatal(Context& ctx) { return deviceFatal(ctx); }
std::string runLinkDown(Context& ctx) { return linkDown(ctx); }
std::string runReload(Context& ctx) { return reload(ctx); }
std::string runBadInput(Context& ctx) { return badInput(ctx); }
std::string runMemlock(Context& ctx) { return memlock(ctx); }

}  // namespace e2e
