// SPDX-License-Identifier: Apache-2.0
// relay-bench (issue 15's benchmark): a relayed pair against a direct pair in one run, on the
// same cabling. Rank 0 measures with rank 1 (cabled: direct) and with rank 2 (no cable:
// through the relay of the rank between them, NCCL_MESH_RELAY=auto), one after the other,
// alternating, while the other ranks only serve their relay:
//   latency    8-byte ping-pong, half the round trip (median and min of --lat-iters)
//   bandwidth  rank 0 streams --bw-bytes per size (--sizes, default 64K,1M,4M) with --window
//              sends outstanding; the time runs from the first isend until the receiver's
//              8-byte "all received" message is back, so a relay that buffers cannot flatter
//              the figure (a send completes at A once its bytes sit in B's ring)
// Every wait polls test() as NCCL's proxy does: spin while requests complete, sched_yield()
// after a poll that found nothing (--idle-sleep-us N: sleep N us instead, for TCG guests).
// A benchmark asserts no speed; it fails only on a wrong size reported or wrong bytes (each
// receive slot's last message is checked after a stream) or at the deadline. Rank 0's PASS line has the figures and the ratios:
//   bw_ratio_<size> = relayed / direct; lat_extra_us = relayed - direct, and lat_extra_links
//   = that over the direct latency (one link's latency: the issue allows two).
//   bw_two_legs_<size>: rank 0 -> 1 and 1 -> 2 streaming at once, rank 1 polling both from one
//   thread: what this machine gives a node that copies every byte in and out, as a relay
//   does; bw_vs_legs_<size> = relayed / that (the relay's own overhead, apart from the copies).
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "comm_setup.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

constexpr int kDirect = 1, kRelayed = 2;  // rank 0's peers
constexpr int kLatSize = 8;
constexpr int kDataTag = 7, kPingTag = 8, kDoneTag = 9;
constexpr int kSpinsPerDeadlineCheck = 4096;

struct Settings {
  std::vector<size_t> sizes;
  size_t bwBytes = 0;
  int window = 8;
  int latIters = 0;
  int idleSleepUs = 0;
  int rounds = 3;
};

// Rank 0's or its peer's end of one pair: a send and a receive comm, a data arena of
// `window` slots of the largest size (rank 0 streams from its slots, the peer receives into
// its own) and a small buffer each way for pings and "done".
class BenchPair {
 public:
  BenchPair(Context& ctx, PeerComms& comms, int peer, const Settings& s)
      : ctx_(ctx), peer_(peer), s_(s), sc_(comms.send[0]), rc_(comms.recv[0]),
        slot_(*std::max_element(s.sizes.begin(), s.sizes.end())),
        data_(slot_ * static_cast<size_t>(s.window)), smallOut_(4096), smallIn_(4096) {
    void* dataComm = ctx.rank == 0 ? sc_ : rc_;
    mhData_ = regHost(ctx, dataComm, data_, "relay-bench data arena");
    mhOut_ = regHost(ctx, sc_, smallOut_, "relay-bench small send buffer");
    mhIn_ = regHost(ctx, rc_, smallIn_, "relay-bench small recv buffer");
  }
  void release() {
    deregHost(ctx_, ctx_.rank == 0 ? sc_ : rc_, mhData_, "relay-bench data arena");
    deregHost(ctx_, sc_, mhOut_, "relay-bench small send buffer");
    deregHost(ctx_, rc_, mhIn_, "relay-bench small recv buffer");
  }

  // Rank 0 pings, the peer answers; the peer posts its next receive before answering, so
  // no ping waits on a NULL isend (on a relayed comm the receive must travel back through
  // the relay before A may send). Returns the half round trips in microseconds (rank 0).
  std::vector<double> pingPong(int iters) {
    std::vector<double> half;
    if (ctx_.rank == 0) {
      for (int i = 0; i < iters; ++i) {
        Clock::time_point t0 = Clock::now();
        void* r = spinRecv(rc_, smallIn_.data(), kLatSize, kPingTag, mhIn_, "pong irecv");
        void* s = spinSend(sc_, smallOut_.data(), kLatSize, kPingTag, mhOut_, "ping isend");
        waitDone(s, -1, "ping isend");
        waitDone(r, kLatSize, "pong irecv");
        half.push_back(secondsSince(t0) * 1e6 / 2);
      }
    } else {
      void* r = spinRecv(rc_, smallIn_.data(), kLatSize, kPingTag, mhIn_, "ping irecv");
      for (int i = 0; i < iters; ++i) {
        waitDone(r, kLatSize, "ping irecv");
        if (i + 1 < iters) r = spinRecv(rc_, smallIn_.data(), kLatSize, kPingTag, mhIn_, "ping irecv");
        void* s = spinSend(sc_, smallOut_.data(), kLatSize, kPingTag, mhOut_, "pong isend");
        waitDone(s, -1, "pong isend");
      }
    }
    return half;
  }

  // `count` messages of `size` from rank 0 with `window` outstanding; the peer answers an
  // 8-byte "done" after the last. Returns rank 0's seconds from the first isend to "done".
  double stream(size_t size, long count) {
    const int n = static_cast<int>(size), w = s_.window;
    if (ctx_.rank == 0) {
      for (int k = 0; k < w; ++k) fillPattern(slotAt(k), size, slotSeed(size, k));
      void* done = spinRecv(rc_, smallIn_.data(), kLatSize, kDoneTag, mhIn_, "done irecv");
      Clock::time_point t0 = Clock::now();
      std::vector<void*> inflight(static_cast<size_t>(w), nullptr);
      for (long m = 0; m < count; ++m) {
        void*& slot = inflight[static_cast<size_t>(m % w)];
        if (slot != nullptr) waitDone(slot, -1, "stream isend");
        slot = spinSend(sc_, slotAt(static_cast<int>(m % w)), n, kDataTag, mhData_, "stream isend");
      }
      for (void* r : inflight) {
        if (r != nullptr) waitDone(r, -1, "stream isend");
      }
      waitDone(done, kLatSize, "done irecv");
      return secondsSince(t0);
    }
    memset(data_.data(), kCanary, data_.size());
    std::vector<void*> posted(static_cast<size_t>(w), nullptr);
    long next = 0;
    for (; next < std::min<long>(count, w); ++next) {
      posted[static_cast<size_t>(next)] =
          spinRecv(rc_, slotAt(static_cast<int>(next)), n, kDataTag, mhData_, "stream irecv");
    }
    for (long m = 0; m < count; ++m) {
      const int k = static_cast<int>(m % w);
      waitDone(posted[static_cast<size_t>(k)], n, "stream irecv");
      posted[static_cast<size_t>(k)] =
          next < count ? spinRecv(rc_, slotAt(k), n, kDataTag, mhData_, "stream irecv") : nullptr;
      next += next < count ? 1 : 0;
    }
    void* s = spinSend(sc_, smallOut_.data(), kLatSize, kDoneTag, mhOut_, "done isend");
    waitDone(s, -1, "done isend");
    // Receives complete in posting order: slot k holds the last message sent from slot k.
    for (int k = 0; k < std::min<long>(count, w); ++k) {
      std::string bad = checkPattern(slotAt(k), size, slotSeed(size, k));
      if (!bad.empty()) fail("relay-bench %zu B from rank 0 to rank %d, slot %d: %s", size, ctx_.rank, k, bad.c_str());
    }
    return 0;
  }

 private:
  // After a poll that found nothing: sched_yield(), as NCCL's proxy does; or, with
  // --idle-sleep-us (emulated labs only), a short sleep, because a spinning process takes
  // the CPU the guest's emulated NIC needs to move the very bytes it waits for.
  void idle() const {
    if (s_.idleSleepUs > 0) {
      pollPause(s_.idleSleepUs);
    } else {
      sched_yield();
    }
  }
  // One request to completion, spinning like NCCL's proxy (see idle()); the size test()
  // reports must be `expect` (-1: any).
  void waitDone(void* req, int expect, const std::string& what) {
    unsigned spins = 0;
    while (true) {
      int done = 0;
      size_t got = 0;
      ctx_.net.check(ctx_.net->test(req, &done, &got, 1), "test", what);
      if (done) {
        if (expect >= 0 && got != static_cast<size_t>(expect)) {
          fail("%s: test() reported %zu bytes, %d were sent", what.c_str(), got, expect);
        }
        return;
      }
      if (++spins % kSpinsPerDeadlineCheck == 0 && ctx_.deadline.expired()) {
        fail("%s: not done at the deadline", what.c_str());
      }
      idle();
    }
  }

  // isend/irecv retried without sleeping while the plugin says "not yet" (a NULL request).
  void* spinSend(void* comm, void* data, int size, int tag, void* mh, const char* what) {
    for (unsigned spins = 1;; ++spins) {
      void* req = nullptr;
      ctx_.net.check(ctx_.net->isend(comm, data, static_cast<size_t>(size), tag, mh, &req), "isend", what);
      if (req != nullptr) return req;
      if (spins % kSpinsPerDeadlineCheck == 0 && ctx_.deadline.expired()) fail("%s: NULL until the deadline", what);
      idle();
    }
  }
  void* spinRecv(void* comm, void* data, int size, int tag, void* mh, const char* what) {
    size_t sizes[1] = {static_cast<size_t>(size)};
    int tags[1] = {tag};
    void* datas[1] = {data};
    void* mhs[1] = {mh};
    for (unsigned spins = 1;; ++spins) {
      void* req = nullptr;
      ctx_.net.check(ctx_.net->irecv(comm, 1, datas, sizes, tags, mhs, &req), "irecv", what);
      if (req != nullptr) return req;
      if (spins % kSpinsPerDeadlineCheck == 0 && ctx_.deadline.expired()) fail("%s: NULL until the deadline", what);
      idle();
    }
  }
  uint8_t* slotAt(int k) const { return data_.data() + static_cast<size_t>(k) * slot_; }
  uint64_t slotSeed(size_t size, int k) const {
    return patternSeed(0, ctx_.rank == 0 ? peer_ : ctx_.rank, size, static_cast<uint64_t>(k), 0);
  }

  Context& ctx_;
  int peer_;
  const Settings& s_;
  void* sc_;
  void* rc_;
  size_t slot_;
  HostBuffer data_, smallOut_, smallIn_;
  void* mhData_ = nullptr;
  void* mhOut_ = nullptr;
  void* mhIn_ = nullptr;
};

// The reference for the relayed figure: rank 0 -> 1 and rank 1 -> 2 streaming at the same
// time, rank 1 driving its receive and its send from one thread (as a relay thread does), so
// rank 1 does per byte what a relay does (one copy in, one copy out) on the same machine.
// `count` messages of `size` per leg, `window` outstanding per comm; every poller spins
// (sched_yield when idle) or sleeps --idle-sleep-us. Returns rank 1's seconds (both legs
// done), 0 on the other ranks.
double twoLegs(Context& ctx, CommTable& table, const Settings& s, size_t size, long count) {
  if (ctx.rank > kRelayed) return 0;
  HostBuffer buf(size * static_cast<size_t>(s.window));
  memset(buf.data(), 0x5A, buf.size());
  struct Lane {
    void* comm;
    bool send;
    void* mh = nullptr;
  };
  std::vector<Lane> lanes;
  if (ctx.rank == 0) lanes.push_back({table[kDirect].send[0], true});
  if (ctx.rank == kDirect) lanes = {{table[0].recv[0], false}, {table[kRelayed].send[0], true}};
  if (ctx.rank == kRelayed) lanes.push_back({table[kDirect].recv[0], false});
  for (Lane& l : lanes) l.mh = regHost(ctx, l.comm, buf, "relay-bench two-legs buffer");
  std::vector<Op> ops;
  for (long m = 0; m < count; ++m) {
    for (const Lane& l : lanes) {
      uint8_t* slot = buf.data() + static_cast<size_t>(m % s.window) * size;
      std::string what = format("two-legs %s #%ld", l.send ? "isend" : "irecv", m);
      ops.push_back(l.send ? sendOp(l.comm, slot, static_cast<int>(size), kDataTag, l.mh, what)
                           : recvOp(l.comm, slot, static_cast<int>(size), kDataTag, l.mh, what));
    }
  }
  Engine engine(ctx, ctx.seed);
  EngineOptions opt;
  opt.window = s.window;
  opt.idleSleepUs = s.idleSleepUs;
  Clock::time_point t0 = Clock::now();
  engine.run(ops, ctx.deadline, opt);
  double seconds = secondsSince(t0);
  for (const Op& op : ops) {
    if (!op.send && op.got[0] != static_cast<int>(size)) fail("%s: %d bytes, %zu sent", op.label.c_str(), op.got[0], size);
  }
  for (Lane& l : lanes) deregHost(ctx, l.comm, l.mh, "relay-bench two-legs buffer");
  return ctx.rank == kDirect ? seconds : 0;
}

std::string sizeName(size_t s) {
  if (s % (1u << 20) == 0) return format("%zuM", s >> 20);
  if (s % (1u << 10) == 0) return format("%zuK", s >> 10);
  return format("%zu", s);
}

Settings parseSettings(Context& ctx) {
  Settings s;
  std::string list = ctx.opts.str("sizes", "64K,1M,4M");
  for (size_t at = 0; at <= list.size();) {
    size_t end = std::min(list.find(',', at), list.size());
    size_t v = 0;
    if (!parseSize(list.substr(at, end - at), &v) || v < 1 || v > (256u << 20)) {
      fail("--sizes %s: expected a list of sizes from 1 byte to 256M", list.c_str());
    }
    s.sizes.push_back(v);
    at = end + 1;
  }
  if (!parseSize(ctx.opts.str("bw-bytes", "256M"), &s.bwBytes) || s.bwBytes < 1) fail("--bw-bytes: expected a size");
  s.window = static_cast<int>(ctx.opts.integer("window", 8));
  s.latIters = static_cast<int>(ctx.opts.integer("lat-iters", 1000));
  s.idleSleepUs = static_cast<int>(ctx.opts.integer("idle-sleep-us", 0));
  s.rounds = static_cast<int>(ctx.opts.integer("rounds", 3));
  if (s.rounds < 1 || s.rounds > 20) fail("--rounds %d: expected 1 .. 20", s.rounds);
  if (s.idleSleepUs < 0 || s.idleSleepUs > 100000) fail("--idle-sleep-us %d: expected 0 .. 100000", s.idleSleepUs);
  if (s.window < 1 || s.window > kMaxRequests) fail("--window %d: expected 1 .. %d", s.window, kMaxRequests);
  if (s.latIters < 1 || s.latIters > 1000000) fail("--lat-iters %d: expected 1 .. 1000000", s.latIters);
  return s;
}

}  // namespace

std::string runRelayBench(Context& ctx) {
  requireNodes(ctx, 0);
  if ((ctx.topology != "ring" && ctx.topology != "line") || ctx.nodes < 3 || cabled(ctx, 0, kDirect) != 1 ||
      cabled(ctx, 0, kRelayed) != 0) {
    fail("relay-bench needs rank 0 cabled to rank 1 and not to rank 2: a ring of 4 or more nodes or a line of 3 or "
         "more (topology '%s', %d nodes)", ctx.topology.c_str(), ctx.nodes);
  }
  Settings s = parseSettings(ctx);
  // Rank 1 <-> 2 carries the two-legs reference (twoLegs).
  std::vector<int> peers;
  if (ctx.rank == 0) peers = {kDirect, kRelayed};
  if (ctx.rank == kDirect) peers = {0, kRelayed};
  if (ctx.rank == kRelayed) peers = {0, kDirect};
  Clock::time_point t0 = Clock::now();
  CommTable table = establish(ctx, {peers, peers, 1, "relay-bench"}, ctx.deadline);
  double upSeconds = secondsSince(t0);
  ctx.barrier("relay-bench-up");

  std::vector<std::unique_ptr<BenchPair>> pairs(3);
  // Indexed by kind (kDirect, kRelayed): rank 0 holds both, its peers their own.
  for (int p : peers) {
    if (ctx.rank != 0 && p != 0) continue;  // the two-legs comms
    pairs[static_cast<size_t>(ctx.rank == 0 ? p : ctx.rank)] = std::make_unique<BenchPair>(ctx, table[p], p, s);
  }
  auto mine = [&](int kind) {
    return ctx.rank == 0 || ctx.rank == kind ? pairs[static_cast<size_t>(kind)].get() : nullptr;
  };
  const char* kKind[3] = {"", "direct", "relayed"};

  // Latency: a warm-up of a tenth, then the timed iterations; direct, then relayed.
  double lat[3] = {0, 0, 0}, latMin[3] = {0, 0, 0};
  for (int kind : {kDirect, kRelayed}) {
    setPhase(format("relay-bench: 8 B ping-pong %s", kKind[kind]));
    if (BenchPair* bp = mine(kind)) {
      bp->pingPong(std::max(1, s.latIters / 10));
      std::vector<double> half = bp->pingPong(s.latIters);
      if (ctx.rank == 0) lat[kind] = median(half), latMin[kind] = *std::min_element(half.begin(), half.end());
    }
    ctx.barrier(format("relay-bench-lat-%s", kKind[kind]));
  }
  std::string figures;
  if (ctx.rank == 0) {
    say("relay-bench: latency 8 B  direct %.1f us (min %.1f)  relayed %.1f us (min %.1f)  extra %.1f us = %.2f x the "
        "link's", lat[kDirect], latMin[kDirect], lat[kRelayed], latMin[kRelayed], lat[kRelayed] - lat[kDirect],
        (lat[kRelayed] - lat[kDirect]) / lat[kDirect]);
  }
  // Bandwidth per size: a warm-up of 2 windows, then the timed stream; direct, then relayed.
  for (size_t size : s.sizes) {
    long count = std::max<long>(2L * s.window, static_cast<long>(s.bwBytes / size));
    double mbps[3] = {0, 0, 0}, legSeconds = 0;
    // --rounds alternations of the three streams, the best of each kept: a 2-core host's
    // scheduler swings any single stream by 2x.
    for (int round = 0; round < s.rounds; ++round) {
      for (int kind : {kDirect, kRelayed}) {
        setPhase(format("relay-bench: round %d, %s stream of %ld x %zu B", round, kKind[kind], count, size));
        if (BenchPair* bp = mine(kind)) {
          if (round == 0) bp->stream(size, 2L * s.window);
          double seconds = bp->stream(size, count);
          double v = static_cast<double>(size) * static_cast<double>(count) / seconds / 1e6;
          if (ctx.rank == 0) mbps[kind] = std::max(mbps[kind], v);
        }
        ctx.barrier(format("relay-bench-bw-%zu-%s-%d", size, kKind[kind], round));
      }
      setPhase(format("relay-bench: round %d, two legs at once, %ld x %zu B each", round, count, size));
      if (round == 0) twoLegs(ctx, table, s, size, 2L * s.window);
      ctx.barrier(format("relay-bench-legs-warm-%zu-%d", size, round));
      double t = twoLegs(ctx, table, s, size, count);
      if (ctx.rank == kDirect && (legSeconds == 0 || t < legSeconds)) legSeconds = t;
      ctx.barrier(format("relay-bench-legs-%zu-%d", size, round));
    }
    if (ctx.rank == kDirect) ctx.rv->publish(format("legs.%zu", size), format("%.9f", legSeconds));
    if (ctx.rank == 0) {
      legSeconds = atof(ctx.rv->fetch(format("legs.%zu", size), ctx.deadline, "rank 1's two-legs time").c_str());
      double legs = static_cast<double>(size) * static_cast<double>(count) / legSeconds / 1e6;
      say("relay-bench: bandwidth %s (%ld messages, window %d)  direct %.1f MB/s  relayed %.1f MB/s  ratio %.3f  "
          "(two legs at once through rank 1: %.1f MB/s each; relayed / that %.3f; best of %d)",
          sizeName(size).c_str(), count, s.window, mbps[kDirect], mbps[kRelayed], mbps[kRelayed] / mbps[kDirect], legs,
          mbps[kRelayed] / legs, s.rounds);
      figures += format(" bw_direct_%s=%.1f bw_relayed_%s=%.1f bw_ratio_%s=%.3f bw_two_legs_%s=%.1f bw_vs_legs_%s=%.3f",
                        sizeName(size).c_str(), mbps[kDirect], sizeName(size).c_str(), mbps[kRelayed],
                        sizeName(size).c_str(), mbps[kRelayed] / mbps[kDirect], sizeName(size).c_str(), legs,
                        sizeName(size).c_str(), mbps[kRelayed] / legs);
    }
    ctx.barrier(format("relay-bench-legs-%zu", size));
  }
  for (auto& bp : pairs) {
    if (bp) bp->release();
  }
  closeAll(ctx, table);
  if (ctx.rank != 0) {
    return format("role=%s connect_s=%.2f", ctx.rank == kDirect ? "direct peer (and relay candidate)"
                                            : ctx.rank == kRelayed ? "relayed peer" : "relay candidate", upSeconds);
  }
  return format("topology=%s%s lat_direct_us=%.1f lat_relayed_us=%.1f lat_extra_us=%.1f lat_extra_links=%.2f "
                "lat_direct_min_us=%.1f lat_relayed_min_us=%.1f lat_iters=%d window=%d rounds=%d idle_sleep_us=%d MB/s=1e6B/s "
                "connect_s=%.2f",
                ctx.topology.c_str(), figures.c_str(), lat[kDirect], lat[kRelayed], lat[kRelayed] - lat[kDirect],
                (lat[kRelayed] - lat[kDirect]) / lat[kDirect], latMin[kDirect], latMin[kRelayed], s.latIters, s.window,
                s.rounds, s.idleSleepUs, upSeconds);
}

}  // namespace e2e
