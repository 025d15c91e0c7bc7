// SPDX-License-Identifier: Apache-2.0
// What NCCL's proxy relies on, end to end through the exported ABI (issue 12):
//  contract      2 nodes, one connection rank 0 -> rank 1: a grouped receive of 8 with the
//                sends in reverse; four groups of 8 on one recvComm with the sends shuffled
//                and a next group's send tried before the current group is complete (a NULL
//                request, never an error); a tag absent from the slot, then posted; a send
//                larger than the posted buffer truncated (test() reports the posted size, a
//                guard after the buffer stays untouched, one WARN); 32 x 8 = 256 receives
//                and 256 sends outstanding, the next of each a NULL request, then all
//                complete byte-exact. With --traffic-class, every connection line of both
//                ends reports the class NCCL's precedence picks.
//  abort-reload  2 nodes: rank 0 starts a connect rank 1 never accepts, abandons it,
//                finalize + dlclose + dlopen + init, --cycles times: no crash, and threads,
//                fds and RDMA objects stay at what they were before the first cycle; then
//                once more with established comms and a listen comm left open.
//  fork          2 nodes, comms both ways: with transfers in flight each rank forks; the
//                child writes its copies of the registered buffers (when rdma-core leaves
//                them mapped in a child), is refused by the plugin, and exit()s (the
//                library destructor runs in the child); the parent's transfers, and the
//                ones after, stay byte-exact.
// The NCCL sources each point follows are cited in docs/how-it-works.md, "What NCCL can rely on".
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "comm_setup.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

// A registered host region carved into `count` slices of `slice` bytes.
struct Region {
  HostBuffer buf;
  void* mh = nullptr;
  size_t slice = 0;
  uint8_t* at(int i) const { return buf.data() + static_cast<size_t>(i) * slice; }
};

Region makeRegion(Context& ctx, void* comm, int count, size_t slice, const std::string& label) {
  Region r;
  r.buf = HostBuffer(static_cast<size_t>(count) * slice);
  r.slice = slice;
  r.mh = regHost(ctx, comm, r.buf, label);
  return r;
}

// One isend attempt: the request, or NULL ("not now"); any error fails the scenario.
void* trySend(Context& ctx, void* comm, void* data, size_t size, int tag, void* mh, const std::string& label) {
  void* req = nullptr;
  ctx.net.check(ctx.net->isend(comm, data, size, tag, mh, &req), "isend", label);
  return req;
}

void* tryRecv(Context& ctx, void* comm, int n, void** data, size_t* sizes, int* tags, void** mh,
              const std::string& label) {
  void* req = nullptr;
  ctx.net.check(ctx.net->irecv(comm, n, data, sizes, tags, mh, &req), "irecv", label);
  return req;
}

// A grouped receive of tags `tags` into consecutive slices of `r` from `first`, each
// posted with `capacity` bytes; retried while NULL (30 s).
void* postGroup(Context& ctx, void* comm, const Region& r, int first, const std::vector<int>& tags, size_t capacity,
                const std::string& label) {
  int n = static_cast<int>(tags.size());
  void* data[kMaxGroup];
  size_t sizes[kMaxGroup];
  int t[kMaxGroup];
  void* mh[kMaxGroup];
  for (int i = 0; i < n; ++i) {
    data[i] = r.at(first + i);
    memset(data[i], 0xEE, r.slice);
    sizes[i] = capacity;
    t[i] = tags[i];
    mh[i] = r.mh;
  }
  return postRecvGroup(ctx, comm, n, data, sizes, t, mh, label);
}

void expectGroup(const Region& r, int first, const std::vector<size_t>& got, const std::vector<size_t>& sizes,
                 const std::vector<uint64_t>& seeds, const std::string& label) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != sizes[i]) fail("%s: buffer %zu reported %zu bytes, expected %zu", label.c_str(), i, got[i], sizes[i]);
    std::string bad = checkPattern(r.at(first + static_cast<int>(i)), sizes[i], seeds[i]);
    if (!bad.empty()) fail("%s: buffer %zu: %s", label.c_str(), i, bad.c_str());
  }
}

uint64_t seedOf(int phase, int group, int tag) { return patternSeed(0, 1, static_cast<uint64_t>(phase), group, tag); }

// ---- contract: the sender's and the receiver's half of each phase -------------------------

struct Link {
  Context& ctx;
  void* comm;
  bool sender;
  Region region;  // 256 slices of 4 KiB
};

// A: one grouped receive of 8, the sends in reverse tag order.
std::string reverseGroup(Link& l) {
  std::vector<int> tags = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<size_t> sizes;
  std::vector<uint64_t> seeds;
  for (int t = 0; t < 8; ++t) sizes.push_back(1000 + 100 * t), seeds.push_back(seedOf(1, 0, t));
  if (!l.sender) {
    void* req = postGroup(l.ctx, l.comm, l.region, 0, tags, 4096, "reverse: grouped irecv of 8");
    l.ctx.rv->publish("A.posted", "");
    expectGroup(l.region, 0, waitDone(l.ctx, req, 8, "reverse: irecv"), sizes, seeds, "reverse");
    return "reverse=ok";
  }
  l.ctx.rv->fetch("A.posted", l.ctx.deadline, "the grouped receive");
  std::vector<void*> reqs;
  for (int t = 7; t >= 0; --t) {
    fillPattern(l.region.at(t), sizes[t], seeds[t]);
    reqs.push_back(postSend(l.ctx, l.comm, l.region.at(t), sizes[t], t, l.region.mh, format("reverse: isend tag %d", t)));
  }
  for (void* r : reqs) waitDone(l.ctx, r, 1, "reverse: isend");
  return "reverse=ok";
}

// B (sender): the sends of `groups` groups x 8 tags in a shuffled order, a tag's sends in
// group order (NCCL posts a peer's next step after the previous one); group 0's tag 0 went
// out already. Returns the NULLs seen.
int sendShuffled(Link& l, int groups, std::vector<void*>* reqs) {
  std::vector<std::pair<int, int>> order;  // (group, tag)
  for (int g = 0; g < groups; ++g) {
    for (int t = 0; t < 8; ++t) {
      if (g != 0 || t != 0) order.emplace_back(g, t);
    }
  }
  std::mt19937 rng(l.ctx.seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> next(8, 0);
  next[0] = 1;
  int nulls = 0;
  size_t sent = 0;
  Deadline by(60, "the shuffled sends");
  while (sent < order.size()) {
    for (auto& e : order) {
      if (e.first < 0 || next[e.second] != e.first) continue;
      int slice = 8 + e.first * 8 + e.second;
      void* req = trySend(l.ctx, l.comm, l.region.at(slice), 500 + 64 * e.first + e.second, e.second, l.region.mh,
                          format("shuffled: isend group %d tag %d", e.first, e.second));
      if (req == nullptr) {
        ++nulls;
        continue;
      }
      reqs->push_back(req);
      ++next[e.second];
      ++sent;
      e.first = -1;
    }
    if (by.expired()) fail("shuffled: %zu of %zu sends never matched a slot", order.size() - sent, order.size());
  }
  return nulls;
}

// B: four groups of 8 posted at once on one recvComm (as PXN / shared comms post them).
std::string shuffledGroups(Link& l) {
  const int kGroups = 4;
  std::vector<int> tags = {0, 1, 2, 3, 4, 5, 6, 7};
  if (!l.sender) {
    std::vector<void*> reqs;
    for (int g = 0; g < kGroups; ++g) {
      reqs.push_back(postGroup(l.ctx, l.comm, l.region, 8 + 8 * g, tags, 4096, format("shuffled: irecv group %d", g)));
    }
    l.ctx.rv->publish("B.posted", "");
    for (int g = 0; g < kGroups; ++g) {
      std::vector<size_t> sizes;
      std::vector<uint64_t> seeds;
      for (int t = 0; t < 8; ++t) sizes.push_back(500 + 64 * g + t), seeds.push_back(seedOf(2, g, t));
      expectGroup(l.region, 8 + 8 * g, waitDone(l.ctx, reqs[g], 8, "shuffled: irecv"), sizes, seeds,
                  format("shuffled group %d", g));
    }
    return "shuffled=ok";
  }
  for (int g = 0; g < kGroups; ++g) {
    for (int t = 0; t < 8; ++t) fillPattern(l.region.at(8 + 8 * g + t), 500 + 64 * g + t, seedOf(2, g, t));
  }
  l.ctx.rv->fetch("B.posted", l.ctx.deadline, "the four grouped receives");
  // The interleaved case, explicitly: group 0's tag 0, then group 1's tag 0 while group 0
  // still misses 7 sends: a NULL request (the next slot is group 0's), never an error.
  std::vector<void*> reqs;
  reqs.push_back(postSend(l.ctx, l.comm, l.region.at(8), 500, 0, l.region.mh, "interleaved: isend group 0 tag 0"));
  const int kEarly = 50;
  for (int i = 0; i < kEarly; ++i) {
    if (trySend(l.ctx, l.comm, l.region.at(16), 564, 0, l.region.mh, "interleaved: isend group 1 tag 0") != nullptr) {
      fail("interleaved: a send of group 1 matched while group 0 was incomplete");
    }
  }
  int nulls = sendShuffled(l, kGroups, &reqs);
  for (void* r : reqs) waitDone(l.ctx, r, 1, "shuffled: isend");
  return format("shuffled=ok next_group_nulls=%d shuffle_nulls=%d", kEarly, nulls);
}

// C: a tag the next slot does not hold is a NULL request, as often as it is tried; after
// that slot completes, a slot with the tag arrives and the same send goes through.
std::string tagAbsent(Link& l) {
  if (!l.sender) {
    void* first = postGroup(l.ctx, l.comm, l.region, 48, {1, 2}, 4096, "absent: irecv {1,2}");
    l.ctx.rv->publish("C.posted1", "");
    waitDone(l.ctx, first, 2, "absent: irecv {1,2}");
    void* second = postGroup(l.ctx, l.comm, l.region, 50, {5}, 4096, "absent: irecv {5}");
    expectGroup(l.region, 50, waitDone(l.ctx, second, 1, "absent: irecv {5}"), {777}, {seedOf(3, 0, 5)}, "absent");
    return "absent=ok";
  }
  fillPattern(l.region.at(50), 777, seedOf(3, 0, 5));
  l.ctx.rv->fetch("C.posted1", l.ctx.deadline, "the receive of tags 1 and 2");
  void* s1 = postSend(l.ctx, l.comm, l.region.at(48), 64, 1, l.region.mh, "absent: isend tag 1");  // the slot is here
  const int kTries = 100;
  for (int i = 0; i < kTries; ++i) {
    if (trySend(l.ctx, l.comm, l.region.at(50), 777, 5, l.region.mh, "absent: isend tag 5") != nullptr) {
      fail("absent: tag 5 matched a slot holding tags 1 and 2");
    }
  }
  void* s2 = postSend(l.ctx, l.comm, l.region.at(49), 64, 2, l.region.mh, "absent: isend tag 2");
  void* s5 = postSend(l.ctx, l.comm, l.region.at(50), 777, 5, l.region.mh, "absent: isend tag 5 (posted now)");
  for (void* r : {s1, s2, s5}) waitDone(l.ctx, r, 1, "absent: isend");
  return format("absent=ok absent_nulls=%d", kTries);
}

// D: 3000 bytes into a 1000-byte receive, twice: 1000 land, the receiver's and the
// sender's test() say 1000, the bytes after the buffer stay untouched, one WARN per comm.
std::string oversize(Link& l) {
  const size_t kPosted = 1000, kSent = 3000;
  size_t mark = l.ctx.net.logSize();
  for (int round = 0; round < 2; ++round) {
    uint8_t* buf = l.region.at(52 + round);  // 4 KiB: the posted 1000 bytes and a guard
    if (!l.sender) {
      void* req = postGroup(l.ctx, l.comm, l.region, 52 + round, {9}, kPosted, "oversize: irecv of 1000 B");
      l.ctx.rv->publish(format("D.posted%d", round), "");
      std::vector<size_t> got = waitDone(l.ctx, req, 1, "oversize: irecv");
      expectGroup(l.region, 52 + round, got, {kPosted}, {seedOf(4, round, 9)}, "oversize (the first 1000 bytes)");
      std::string guard = checkFill(buf + kPosted, l.region.slice - kPosted, 0xEE);
      if (!guard.empty()) fail("oversize: written past the posted 1000 bytes: %s", guard.c_str());
      continue;
    }
    fillPattern(buf, kSent, seedOf(4, round, 9));
    l.ctx.rv->fetch(format("D.posted%d", round), l.ctx.deadline, "the 1000-byte receive");
    void* req = postSend(l.ctx, l.comm, buf, kSent, 9, l.region.mh, "oversize: isend of 3000 B");
    std::vector<size_t> got = waitDone(l.ctx, req, 1, "oversize: isend");
    if (got[0] != kPosted) fail("oversize: the send's test() reported %zu bytes, expected the posted %zu", got[0], kPosted);
  }
  if (!l.sender) return "oversize=ok";
  // NCCL IB truncates without a word (2.28 net_ib.cc ncclIbIsend: size = slots[r].size); the
  // plugin says so once per comm, which is its own choice, not NCCL's contract.
  if (l.ctx.net.isNcclIb()) return "oversize=ok truncation_warns=-";
  int warns = 0;
  std::string text;
  for (const LogLine& line : l.ctx.net.logSince(mark)) {
    if (line.level == NCCL_LOG_WARN && line.text.find("truncated") != std::string::npos) ++warns, text = line.text;
  }
  if (warns != 1 || text.find("3000") == std::string::npos || text.find("1000") == std::string::npos) {
    fail("oversize: expected one WARN naming 3000 and 1000 bytes, got %d (last: %s)", warns, text.c_str());
  }
  return "oversize=ok truncation_warns=1";
}

// E: 32 grouped receives of 8 (256 buffers) and 256 sends outstanding at once; the 33rd
// receive and the 257th send are NULL requests (no FIFO slot), then everything completes.
std::string twoHundredFiftySix(Link& l) {
  const int kGroups = 32, kSize = 64;
  std::vector<int> tags = {0, 1, 2, 3, 4, 5, 6, 7};
  Region small = makeRegion(l.ctx, l.comm, 8 * kGroups + 8, kSize, "256: buffers");
  std::vector<void*> reqs;
  if (!l.sender) {
    for (int g = 0; g < kGroups; ++g) {
      reqs.push_back(postGroup(l.ctx, l.comm, small, 8 * g, tags, kSize, format("256: irecv group %d", g)));
    }
    void* data[8];
    size_t sizes[8];
    int t[8];
    void* mh[8];
    for (int i = 0; i < 8; ++i) data[i] = small.at(8 * kGroups + i), sizes[i] = kSize, t[i] = i, mh[i] = small.mh;
    // Beyond NCCL's contract (NCCL_NET_MAX_REQUESTS receives per comm, plugins/net/README.md):
    // the plugin answers "not now"; NCCL IB keeps 256 receive requests and FIFO slots per comm
    // (2.28 net_ib.cc MAX_REQUESTS = NCCL_NET_MAX_REQUESTS * NCCL_NET_IB_MAX_RECVS) and takes it.
    for (int i = 0; i < 20 && !l.ctx.net.isNcclIb(); ++i) {
      if (tryRecv(l.ctx, l.comm, 8, data, sizes, t, mh, "256: the 33rd irecv") != nullptr) {
        fail("256: a 33rd grouped receive was accepted with 32 in flight");
      }
    }
    l.ctx.rv->publish("E.posted", "");
    l.ctx.rv->fetch("E.sent", l.ctx.deadline, "the sender's 256 sends");
    for (int g = 0; g < kGroups; ++g) {
      std::vector<size_t> sizesG(8, kSize);
      std::vector<uint64_t> seeds;
      for (int i = 0; i < 8; ++i) seeds.push_back(seedOf(5, g, i));
      expectGroup(small, 8 * g, waitDone(l.ctx, reqs[g], 8, "256: irecv"), sizesG, seeds, format("256 group %d", g));
    }
  } else {
    for (int g = 0; g < kGroups; ++g) {
      for (int i = 0; i < 8; ++i) fillPattern(small.at(8 * g + i), kSize, seedOf(5, g, i));
    }
    l.ctx.rv->fetch("E.posted", l.ctx.deadline, "the 256 receives");
    for (int g = 0; g < kGroups; ++g) {
      for (int i = 0; i < 8; ++i) {
        reqs.push_back(postSend(l.ctx, l.comm, small.at(8 * g + i), kSize, i, small.mh, format("256: isend %d", 8 * g + i)));
      }
    }
    for (int i = 0; i < 20; ++i) {
      if (trySend(l.ctx, l.comm, small.at(8 * kGroups), kSize, 0, small.mh, "256: isend 257") != nullptr) {
        fail("256: a 257th send was accepted with 256 in flight and no slot posted");
      }
    }
    l.ctx.rv->publish("E.sent", "");
    for (void* r : reqs) waitDone(l.ctx, r, 1, "256: isend");
  }
  deregHost(l.ctx, l.comm, small.mh, "256: buffers");
  return l.ctx.net.isNcclIb() ? "outstanding=256 next_send_is_null=yes" : "outstanding=256 next_is_null=yes";
}

// With a class set anywhere, every connection line of this rank reports the class NCCL's
// precedence picks (NCCL_MESH_IB_TC, else the communicator's): the receiver's too, unless this
// node sets NCCL_MESH_IB_FIFO_TC (NCCL_IB_FIFO_TC's counterpart): then its receive lines report
// that class (its data QPs carry its credits and ACKs).
std::string checkTrafficClass(Context& ctx, size_t mark) {
  if (ctx.net.isNcclIb()) return "tc=- (NCCL IB logs no connection line)";
  const char* env = getenv("NCCL_MESH_IB_TC");
  int want = env != nullptr && *env != '\0' ? atoi(env) : (ctx.trafficClass >= 0 ? ctx.trafficClass : 0);
  const char* fifoEnv = getenv("NCCL_MESH_IB_FIFO_TC");
  int fifo = fifoEnv != nullptr && *fifoEnv != '\0' ? atoi(fifoEnv) : -1;
  int lines = 0;
  for (const ConnLine& c : ctx.net.connLines(mark)) {
    ++lines;
    int expect = c.dir == "recv" && fifo >= 0 ? fifo : want;
    if (c.raw.find(format("tc=%d", expect)) == std::string::npos) {
      fail("connection line without tc=%d (NCCL's precedence: NCCL_MESH_IB_TC, else the communicator's "
           "trafficClass %d; a receiver's NCCL_MESH_IB_FIFO_TC %d): %s", expect, ctx.trafficClass, fifo, c.raw.c_str());
    }
  }
  if (lines == 0) fail("no connection line logged (run with the plugin's INFO lines captured)");
  return fifo >= 0 ? format("tc=%d fifo_tc=%d conn_lines=%d", want, fifo, lines) : format("tc=%d conn_lines=%d", want, lines);
}

// ECE (NCCL_IB_ECE_ENABLE's counterpart): MESH_E2E_EXPECT_ECE names what every connection
// line of this rank must say: "0x<vendor>:0x<options>" (both ends settled on the fabric's
// options) or "none" (no ECE: NCCL_MESH_IB_ECE_ENABLE=0, or a provider without it). Unset: not
// checked (the lab's Soft-RoCE has no ECE).
std::string checkEce(Context& ctx, size_t mark) {
  const char* want = getenv("MESH_E2E_EXPECT_ECE");
  if (want == nullptr || *want == '\0' || ctx.net.isNcclIb()) return "";
  std::string expect = strcmp(want, "none") == 0 ? "" : want;
  int lines = 0;
  for (const ConnLine& c : ctx.net.connLines(mark)) {
    ++lines;
    if (c.ece != expect) fail("connection line with ece=%s, expected %s: %s", c.ece.empty() ? "(none)" : c.ece.c_str(), want, c.raw.c_str());
  }
  if (lines == 0) fail("no connection line logged (run with the plugin's INFO lines captured)");
  return format(" ece=%s", want);
}

std::string contract(Context& ctx) {
  requireNodes(ctx, 2);
  bool sender = ctx.rank == 0;
  size_t mark = ctx.net.logSize();
  EstablishSpec spec;
  if (sender) spec.connectTo = {1};
  if (!sender) spec.acceptFrom = {0};
  spec.tag = "contract";
  CommTable t = establish(ctx, spec, ctx.deadline);
  void* comm = sender ? t[1].send[0] : t[0].recv[0];
  Link l{ctx, comm, sender, makeRegion(ctx, comm, 64, 4096, "contract: buffers")};
  std::string out;
  for (auto phase : {reverseGroup, shuffledGroups, tagAbsent, oversize, twoHundredFiftySix}) {
    Clock::time_point t0 = Clock::now();
    std::string figures = phase(l);
    out += figures + format(" (%.2f s) ", secondsSince(t0));
    ctx.barrier("contract-phase");
  }
  out += checkTrafficClass(ctx, mark);
  out += checkEce(ctx, mark);
  deregHost(ctx, comm, l.region.mh, "contract: buffers");
  closeAll(ctx, t);
  return out;
}

// ---- abort-reload ----------------------------------------------------------------------------

// Rank 0's connect to a listener that never accepts, polled until its QPs exist (the
// connect is under way: TCP connected, HELLO sent, RDMA resources built), then abandoned.
void startAndAbandonConnect(Context& ctx, const std::string& handleBytes, long baseQps, int cycle) {
  alignas(16) unsigned char handle[NCCL_NET_HANDLE_MAXSIZE];
  memcpy(handle, handleBytes.data(), sizeof(handle));
  Deadline by(20, "the abandoned connect's QPs");
  for (;;) {
    void* sendComm = nullptr;
    ctx.net.check(ctx.net->connect(ctx.dev, handle, &sendComm), "connect", format("abort-reload cycle %d", cycle));
    if (sendComm != nullptr) fail("abort-reload cycle %d: connected although rank 1 never accepts", cycle);
    RdmaResources res = rdmaResources();
    if (!res.ok) fail("abort-reload: rdma res: %s", res.error.c_str());
    if (res.total["qp"] > baseQps) return;
    if (by.expired()) fail("abort-reload cycle %d: the connect built no QP within 20 s", cycle);
    pollPause(20000);
  }
}

// One comm each way with `peer`, used once (8 bytes each way); left open.
CommTable leftoverComms(Context& ctx, int peer) {
  setPhase("abort-reload: comms NCCL will not close");
  CommTable t = establish(ctx, {{peer}, {peer}, 1, "leftover"}, ctx.deadline);
  exchangeSmall(ctx, peer, t[peer].send[0], t[peer].recv[0], 1, "abort-reload leftover");
  ctx.barrier("leftover-used");
  return t;
}

// The NCCL >= 2.28 life cycle of a job that times out in connect: the communicator is
// finalized, the library dlclosed at refcount 0, and the next job dlopens and inits it.
std::string abortReload(Context& ctx) {
  requireNodes(ctx, 2);
  int cycles = static_cast<int>(ctx.opts.integer("cycles", 20));
  const char* libName = "libnccl-net-mesh.so";
  if (ctx.rank == 1) {
    Snapshot base = stableSnapshot(5);
    void* lc = listenAndPublish(ctx, "h.abort", "abort-reload: the listener that never accepts");
    ctx.rv->fetch("abort.cycles", ctx.deadline, "rank 0's cycles");
    CommTable t = leftoverComms(ctx, 0);
    ctx.rv->fetch("abort.done", ctx.deadline, "rank 0's unload with comms open");
    closeAll(ctx, t);  // the peer's side is gone: closing still succeeds
    ctx.net.check(ctx.net->closeListen(lc), "closeListen", "abort-reload");
    Snapshot now;
    std::string leak = compareToBaseline(base, 10, &now);
    if (!leak.empty()) fail("abort-reload: the listener side kept %s (before: %s)", leak.c_str(), base.describe().c_str());
    return format("listener_after=[%s]", now.describe().c_str());
  }
  std::string handle = ctx.rv->fetch("h.abort", ctx.deadline, "rank 1's listen handle");
  int baseThreads = countThreads();
  Snapshot base = stableSnapshot(5);
  say("abort-reload: plugin loaded, before any connect: %d threads, %s", baseThreads, base.describe().c_str());
  for (int c = 1; c <= cycles; ++c) {
    setPhase(format("abort-reload cycle %d: connect", c));
    startAndAbandonConnect(ctx, handle, base.res.total["qp"], c);
    setPhase(format("abort-reload cycle %d: finalize + dlclose with the connect pending", c));
    ctx.net.unload();
    if (libraryMapped(libName)) fail("abort-reload cycle %d: %s still mapped after dlclose", c, libName);
    setPhase(format("abort-reload cycle %d: dlopen + init", c));
    ctx.net.load(ctx.pluginPath, ctx.api, ctx.trafficClass, ctx.verbose);
    int threads = threadsSettled(baseThreads, 5);
    if (threads != baseThreads) fail("abort-reload cycle %d: %d threads, %d before the first cycle", c, threads, baseThreads);
    Snapshot now;
    std::string leak = compareToBaseline(base, 10, &now);
    if (!leak.empty()) fail("abort-reload cycle %d: %s (before the first cycle: %s)", c, leak.c_str(), base.describe().c_str());
    if (c == 1 || c == cycles) say("abort-reload cycle %d: %d threads, %s", c, threads, now.describe().c_str());
  }
  ctx.rv->publish("abort.cycles", "");
  // A job NCCL never closed (an abort): established comms both ways and a listen comm are
  // still open at the unload, which must release them before the devices.
  leftoverComms(ctx, 1);
  setPhase("abort-reload: finalize + dlclose with comms open");
  ctx.net.unload();
  if (libraryMapped(libName)) fail("abort-reload: %s still mapped after dlclose with comms open", libName);
  ctx.net.load(ctx.pluginPath, ctx.api, ctx.trafficClass, ctx.verbose);
  Snapshot now;
  std::string leak = compareToBaseline(base, 10, &now);
  int threads = threadsSettled(baseThreads, 5);
  if (threads != baseThreads || !leak.empty()) {
    fail("abort-reload: after an unload with comms open: %d threads (before: %d), %s", threads, baseThreads,
         leak.c_str());
  }
  ctx.rv->publish("abort.done", "");
  return format("cycles=%d threads=%d base=[%s] unchanged, also after an unload with comms open", cycles,
                baseThreads, base.describe().c_str());
}

// ---- fork ----------------------------------------------------------------------------------

// What the plugin said about fork support at init (its INFO line "fork: ...").
std::string forkState(Context& ctx) {
  for (const LogLine& l : ctx.net.logSince(0)) {
    size_t at = l.text.find("fork: ");
    if (at != std::string::npos) return l.text.substr(at + 6);
  }
  return "unknown (no 'fork:' line)";
}

// The child: writes its copies of the registered buffers when they are mapped in it
// (with ibv_fork_init's MADV_DONTFORK they are not, and touching them would fault), is
// refused by the plugin, and leaves through exit(), which runs the library destructor.
[[noreturn]] void childOfFork(Context& ctx, const std::vector<Region*>& regions, bool writeCopies) {
  alarm(30);  // a child that hangs in exit() is killed, and the parent reports it
  if (writeCopies) {
    for (Region* r : regions) memset(r->buf.data(), 0xC3, r->buf.size());
  }
  int ndev = -1;
  ncclResult_t rc = ctx.net->devices(&ndev);
  exit(rc == ncclSystemError ? 0 : 4);
}

// Forks the child and reaps it (bounded). Returns what went wrong in the child, or "":
// the caller first checks the parent's transfers, which matter more.
std::string forkDuringTraffic(Context& ctx, const std::vector<Region*>& regions, bool writeCopies) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) fail("fork: %s", strerror(errno));
  if (pid == 0) childOfFork(ctx, regions, writeCopies);
  Deadline by(40, "the forked child");
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (by.expired()) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return "the child did not exit within 40 s (hung in exit()?)";
    }
    pollPause(10000);
  }
  if (WIFSIGNALED(status)) return format("the child died of signal %d (alarm: hung in exit())", WTERMSIG(status));
  if (WEXITSTATUS(status) == 4) return "the plugin did not refuse devices() in the forked child";
  if (WEXITSTATUS(status) != 0) return format("the child exited with status %d", WEXITSTATUS(status));
  return "";
}

std::string forkScenario(Context& ctx) {
  requireNodes(ctx, 2);
  int peer = 1 - ctx.rank;
  int iters = static_cast<int>(ctx.opts.integer("iters", 3));
  size_t size = 0;
  if (!parseSize(ctx.opts.str("size", "64K"), &size) || size == 0) fail("--size: expected a size such as 64K");
  CommTable t = establish(ctx, {{peer}, {peer}, 1, "fork"}, ctx.deadline);
  void* sc = t[peer].send[0];
  void* rc = t[peer].recv[0];
  const int kBufs = 8;
  Region out = makeRegion(ctx, sc, kBufs, size, "fork: send buffers");
  Region in = makeRegion(ctx, rc, kBufs, size, "fork: receive buffers");
  std::string state = forkState(ctx);
  bool writeCopies = state.rfind("unneeded", 0) == 0 || state.rfind("unknown", 0) == 0;
  for (int it = 0; it < iters; ++it) {
    setPhase(format("fork: round %d", it));
    std::vector<void*> recvs, sends;
    for (int i = 0; i < kBufs; ++i) {
      fillPattern(out.at(i), size, patternSeed(ctx.rank, peer, 90 + it, i, 0));
      memset(in.at(i), 0xEE, size);
      recvs.push_back(postRecv(ctx, rc, in.at(i), size, i, in.mh, format("fork round %d irecv %d", it, i)));
    }
    for (int i = 0; i < kBufs; ++i) {
      sends.push_back(postSend(ctx, sc, out.at(i), size, i, out.mh, format("fork round %d isend %d", it, i)));
    }
    std::string child;
    if (it == 1) child = forkDuringTraffic(ctx, {&out, &in}, writeCopies);  // transfers in flight
    for (int i = 0; i < kBufs; ++i) {
      waitDone(ctx, recvs[i], 1, format("fork round %d irecv %d", it, i));
      waitDone(ctx, sends[i], 1, format("fork round %d isend %d", it, i));
      std::string bad = checkPattern(in.at(i), size, patternSeed(peer, ctx.rank, 90 + it, i, 0));
      if (!bad.empty()) fail("fork round %d: data from rank %d, buffer %d: %s", it, peer, i, bad.c_str());
      bad = checkPattern(out.at(i), size, patternSeed(ctx.rank, peer, 90 + it, i, 0));
      if (!bad.empty()) fail("fork round %d: the child's writes reached the parent's send buffer %d: %s", it, i, bad.c_str());
    }
    if (!child.empty()) fail("fork: %s (the parent's transfers of this round were fine)", child.c_str());
    ctx.barrier(format("fork-%d", it));
  }
  deregHost(ctx, sc, out.mh, "fork: send buffers");
  deregHost(ctx, rc, in.mh, "fork: receive buffers");
  closeAll(ctx, t);
  return format("rounds=%d buffers=%dx%zu child_wrote_copies=%s fork_state='%s'", iters, kBufs, size,
                writeCopies ? "yes" : "no", state.c_str());
}

}  // namespace

std::string runContract(Context& ctx) { return contract(ctx); }
std::string runAbortReload(Context& ctx) { return abortReload(ctx); }
std::string runFork(Context& ctx) { return forkScenario(ctx); }

}  // namespace e2e
