// SPDX-License-Identifier: Apache-2.0
// `coll-bench`: NCCL's collectives through the plugin on links with a rate (scripts/fabric-net
// --rate), as fractions of what the cabling allows (issue "Links with a rate"):
//   --algo ring      ring all-reduce, every channel's ring in NCCL's direction (rank r sends to
//                    r+1: NCCL 2.28 connect.cc duplicates channels without reversing them)
//   --algo tree      NCCL's double binary tree all-reduce (half the channels per tree), reduce
//                    and broadcast pipelined as runTreeSplit does
//   --algo alltoall  every rank sends S/N to every other rank
//   --algo sendrecv  nccl-tests' sendrecv: every rank sends S to rank+1 and receives S from
//                    rank-1, the way NCCL's p2p runs over a network: S cut over the channels,
//                    each in 128 KiB chunks (--slice; NCCL's P2P chunk size) on its own comm
//                    pair (NCCL 2.28 net.cc shares a comm per device, peer and channel, between
//                    a node's GPUs only), the tag the sender's rank, as net.cc posts them
//   --algo contention  4-ring or longer: rank 0 -> 2 relayed and the relay -> 2 direct at once:
//                    each stream's share of the relay's cable to rank 2 (measured at rank 2)
// Data is checked after the last iteration. --ceiling is one cable direction's goodput in
// bytes/s (rate x 4096 / 4178 at MTU 4096); the bound is computed from the topology
// (coll_pipeline.h algbwBound).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "coll_pipeline.h"
#include "nccl_ib.h"
#include "probes.h"
#include "scenarios.h"

namespace e2e {
namespace {

float inputValue(int rank, size_t i, int iter) {
  return static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13 + static_cast<size_t>(iter) * 5) % 47);
}

// [lo, hi) of part k of `parts` of [0, total), 4-byte aligned.
std::pair<size_t, size_t> part(size_t total, size_t k, size_t parts) {
  size_t lo = total * k / parts / 4 * 4, hi = k + 1 == parts ? total : total * (k + 1) / parts / 4 * 4;
  return {lo, hi};
}

using Step = Pipeline::Step;
using Xfer = Pipeline::Xfer;
using POp = Pipeline::Op;

// NCCL's ring all-reduce on one channel's region (all_reduce.h runRing): per loop of N chunks,
// send; recvReduceSend x (N-2); recvReduceCopySend; recvCopySend x (N-2); recv.
std::vector<Step> ringSteps(int n, int rank, int sendC, int recvC, size_t lo, size_t hi, size_t slice) {
  std::vector<Step> steps;
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  for (size_t base = lo; base < hi; base += static_cast<size_t>(n) * slice) {
    size_t end = std::min(hi, base + static_cast<size_t>(n) * slice);
    size_t cs = ((end - base + static_cast<size_t>(n) - 1) / static_cast<size_t>(n) + 3) / 4 * 4;
    auto chunk = [&](int c) {
      size_t a = std::min(end, base + static_cast<size_t>(mod(c)) * cs), b = std::min(end, a + cs);
      return std::make_pair(a, b - a);
    };
    auto step = [&](int c, POp op, bool recv, bool send) {
      Step s;
      auto [off, bytes] = chunk(c);
      if (recv) s.recvs.push_back(Xfer{recvC, off, bytes, op});
      if (send) s.sends.push_back(Xfer{sendC, off, bytes, POp::None});
      steps.push_back(s);
    };
    step(rank - 1, POp::None, false, true);
    for (int j = 2; j < n; ++j) step(rank - j, POp::Reduce, true, true);
    step(rank, POp::Reduce, true, true);
    for (int j = 1; j < n - 1; ++j) step(rank - j, POp::Copy, true, true);
    step(rank + 1, POp::Copy, true, false);
  }
  return steps;
}

struct Comms {
  CommTable table;
  std::vector<int> peers;
};

class CollBench {
 public:
  // `name` keeps a second bench's rendezvous apart (--vs: the reference's comms and barriers).
  CollBench(Context& ctx, const std::string& algo, size_t bytes, int channels, size_t slice, bool twins = false,
            const std::string& name = "coll")
      : ctx_(ctx), name_(name), algo_(algo), bytes_(bytes), channels_(channels), slice_(slice), twins_(twins),
        data_(algo == "alltoall" || algo == "sendrecv" ? 2 * bytes : bytes),
        pipe_(ctx, data_.data(), data_.size(), slice) {}

  void connect() {
    std::set<int> peers;
    int count = channels_;
    if (algo_ == "ring") {
      comms_.table = establish(ctx_, {{ctx_.next()}, {ctx_.prev()}, count, name_ + "-ring"}, ctx_.deadline);
      return;
    }
    if (algo_ == "tree") {
      for (int which = 0; which < 2; ++which) {
        TreeNode me = which == 0 ? binaryTree(ctx_.nodes, ctx_.rank) : secondTree(ctx_.nodes, ctx_.rank);
        if (me.up >= 0) peers.insert(me.up);
        for (int d : me.down) peers.insert(d);
      }
    } else if (algo_ == "sendrecv") {
      comms_.peers = {ctx_.next()};
      EstablishSpec spec{{ctx_.next()}, {ctx_.prev()}, count, name_ + "-sendrecv"};
      if (spread_) ctx_.net.check(ctx_.net->devices(&spec.devices), "devices", "--spread-devices");
      comms_.table = establish(ctx_, spec, ctx_.deadline);
      return;
    } else {
      for (int p : otherRanks(ctx_)) peers.insert(p);
      count = peerChannels_;
    }
    comms_.peers.assign(peers.begin(), peers.end());
    size_t mark = ctx_.net.logSize();
    EstablishSpec spec{comms_.peers, comms_.peers, count, name_ + "-" + algo_};
    if (spread_) ctx_.net.check(ctx_.net->devices(&spec.devices), "devices", "--spread-devices");
    comms_.table = establish(ctx_, spec, ctx_.deadline);
    if (twins_) {
      // --twin-relays (NCCL_MESH_RELAY_TWIN=1): every connection to an uncabled peer went over
      // two relays (the plugin's INFO line per connect).
      int uncabled = 0;
      for (int p : comms_.peers) uncabled += cabled(ctx_, ctx_.rank, p) == 0 ? 1 : 0;
      int twins = countLog(ctx_, mark, "(two relays)");
      if (twins != uncabled * count) {
        fail("--twin-relays: %d of this rank's %d relayed connects went over two relays (NCCL_MESH_RELAY_TWIN=1 on "
             "every node?)", twins, uncabled * count);
      }
    }
  }

  void build() {
    if (algo_ == "ring") return buildRing();
    if (algo_ == "tree") return buildTree();
    if (algo_ == "sendrecv") return buildSendrecv();
    buildAlltoall();
  }

  // All-to-all: the same block to every rank, at block * rank in the send half and received
  // at block * source in the receive half.
  size_t block() const { return bytes_ / static_cast<size_t>(ctx_.nodes) / 4 * 4; }

  void fill(int iter) {
    if (algo_ == "sendrecv") {
      fillPattern(data_.data(), bytes_, patternSeed(ctx_.rank, ctx_.next(), 22, static_cast<uint64_t>(iter), 0));
      memset(data_.data() + bytes_, 0, bytes_);
      return;
    }
    if (algo_ == "alltoall") {
      for (int p = 0; p < ctx_.nodes; ++p) {
        size_t off = block() * static_cast<size_t>(p);
        fillPattern(data_.data() + off, block(), patternSeed(ctx_.rank, p, 21, static_cast<uint64_t>(iter), 0));
        memset(data_.data() + bytes_ + off, 0, block());
      }
      return;
    }
    float* d = reinterpret_cast<float*>(data_.data());
    for (size_t i = 0; i < bytes_ / sizeof(float); ++i) d[i] = inputValue(ctx_.rank, i, iter);
  }

  std::string check(int iter) const {
    if (algo_ == "sendrecv") {
      std::string bad = checkPattern(data_.data() + bytes_, bytes_,
                                     patternSeed(ctx_.prev(), ctx_.rank, 22, static_cast<uint64_t>(iter), 0));
      return bad.empty() ? "" : format("from rank %d: %s", ctx_.prev(), bad.c_str());
    }
    if (algo_ == "alltoall") {
      for (int p = 0; p < ctx_.nodes; ++p) {
        if (p == ctx_.rank) continue;
        std::string bad = checkPattern(data_.data() + bytes_ + block() * static_cast<size_t>(p), block(),
                                       patternSeed(p, ctx_.rank, 21, static_cast<uint64_t>(iter), 0));
        if (!bad.empty()) return format("block from rank %d: %s", p, bad.c_str());
      }
      return "";
    }
    const float* d = reinterpret_cast<const float*>(data_.data());
    for (size_t i = 0; i < bytes_ / sizeof(float); ++i) {
      float want = 0;
      for (int r = 0; r < ctx_.nodes; ++r) want += inputValue(r, i, iter);
      if (d[i] != want) return format("element %zu is %g, expected %g", i, static_cast<double>(d[i]), static_cast<double>(want));
    }
    return "";
  }

  double runOnce(int iter) {
    fill(iter);
    ctx_.barrier(format("%s-%s-%d", name_.c_str(), algo_.c_str(), iter));
    Clock::time_point t0 = Clock::now();
    pipe_.run(ctx_.deadline);
    return secondsSince(t0);
  }

  // sendrecv and alltoall: channel k on device k % (the transport's devices), as NCCL spreads
  // its channels over a node's NICs (a Spark cable is two devices to NCCL IB, or to the plugin
  // in port mode).
  void spreadDevices(bool on) { spread_ = on; }
  // alltoall: comms per peer, each carrying an equal part of every block (NCCL's channels per
  // net peer, NCCL_NCHANNELS_PER_NET_PEER).
  void peerChannels(int n) { peerChannels_ = n; }
  void testOldestOnly(bool on) { pipe_.testOldestOnly(on); }
  size_t streak() const { return pipe_.longestStreak(); }
  std::string calls() const { return pipe_.callSummary(); }

  void close() {
    pipe_.release();
    closeAll(ctx_, comms_.table);
  }

 private:
  void buildRing() {
    for (int ch = 0; ch < channels_; ++ch) {
      PeerComms& next = comms_.table[ctx_.next()];
      PeerComms& prev = comms_.table[ctx_.prev()];
      int s = pipe_.addConn(next.send[static_cast<size_t>(ch)], true, format("ring ch%d send to rank %d", ch, ctx_.next()));
      int r = pipe_.addConn(prev.recv[static_cast<size_t>(ch)], false, format("ring ch%d recv from rank %d", ch, ctx_.prev()));
      auto [lo, hi] = part(bytes_, static_cast<size_t>(ch), static_cast<size_t>(channels_));
      pipe_.addLane(ringSteps(ctx_.nodes, ctx_.rank, s, r, lo, hi, slice_));
    }
  }

  // runTreeSplit: the reduce towards the root and the broadcast from it run at once; the
  // root broadcasts a slice once it has reduced it.
  void buildTree() {
    for (int ch = 0; ch < channels_; ++ch) {
      TreeNode me = ch % 2 == 0 ? binaryTree(ctx_.nodes, ctx_.rank) : secondTree(ctx_.nodes, ctx_.rank);
      auto conn = [&](int peer, bool send) {
        PeerComms& pc = comms_.table[peer];
        size_t k = static_cast<size_t>(ch);
        void* c = send ? pc.send[k] : pc.recv[k];
        return pipe_.addConn(c, send, format("tree%d ch%d %s rank %d", ch % 2, ch, send ? "send to" : "recv from", peer));
      };
      int upSend = me.up >= 0 ? conn(me.up, true) : -1, upRecv = me.up >= 0 ? conn(me.up, false) : -1;
      std::vector<int> childRecv, childSend;
      for (int c : me.down) {
        childRecv.push_back(conn(c, false));
        childSend.push_back(conn(c, true));
      }
      auto [lo, hi] = part(bytes_, static_cast<size_t>(ch), static_cast<size_t>(channels_));
      std::vector<Step> up, down;
      for (size_t off = lo; off < hi; off += slice_) {
        size_t n = std::min(slice_, hi - off);
        Step u, d;
        for (int rc : childRecv) u.recvs.push_back(Xfer{rc, off, n, POp::Reduce});
        if (upSend >= 0) u.sends.push_back(Xfer{upSend, off, n, POp::None});
        if (upRecv >= 0) d.recvs.push_back(Xfer{upRecv, off, n, POp::Copy});
        for (int sc : childSend) d.sends.push_back(Xfer{sc, off, n, POp::None});
        up.push_back(u);
        down.push_back(d);
      }
      int upLane = pipe_.addLane(up);
      if (me.up < 0) {
        for (size_t k = 0; k < down.size(); ++k) {
          down[k].afterLane = upLane;
          down[k].afterStep = static_cast<int>(k);
        }
      }
      pipe_.addLane(down);
    }
  }

  void buildSendrecv() {
    int next = ctx_.next(), prev = ctx_.prev();
    for (int ch = 0; ch < channels_; ++ch) {
      size_t k = static_cast<size_t>(ch);
      int s = pipe_.addConn(comms_.table[next].send[k], true, format("sendrecv ch%d send to rank %d", ch, next), ctx_.rank);
      int r = pipe_.addConn(comms_.table[prev].recv[k], false, format("sendrecv ch%d recv from rank %d", ch, prev), prev);
      auto [lo, hi] = part(bytes_, static_cast<size_t>(ch), static_cast<size_t>(channels_));
      std::vector<Step> sends, recvs;
      for (size_t off = lo; off < hi; off += slice_) {
        size_t n = std::min(slice_, hi - off);
        Step st, rt;
        st.sends.push_back(Xfer{s, off, n, POp::None});
        rt.recvs.push_back(Xfer{r, bytes_ + off, n, POp::Copy});
        sends.push_back(st);
        recvs.push_back(rt);
      }
      pipe_.addLane(sends);
      pipe_.addLane(recvs);
    }
  }

  void buildAlltoall() {
    size_t blk = block();
    int count = peerChannels_;
    size_t part = blk / static_cast<size_t>(count) / 4 * 4;  // channel c: [c * part, ...); the last takes the rest
    for (int p : comms_.peers) {
      for (int c = 0; c < count; ++c) {
        int s = pipe_.addConn(comms_.table[p].send[static_cast<size_t>(c)], true, format("alltoall send to rank %d #%d", p, c));
        int r = pipe_.addConn(comms_.table[p].recv[static_cast<size_t>(c)], false, format("alltoall recv from rank %d #%d", p, c));
        size_t lo = part * static_cast<size_t>(c), hi = c + 1 == count ? blk : lo + part;
        std::vector<Step> sends, recvs;
        for (size_t off = lo; off < hi; off += slice_) {
          size_t n = std::min(slice_, hi - off);
          Step st, rt;
          st.sends.push_back(Xfer{s, blk * static_cast<size_t>(p) + off, n, POp::None});
          rt.recvs.push_back(Xfer{r, bytes_ + blk * static_cast<size_t>(p) + off, n, POp::Copy});
          sends.push_back(st);
          recvs.push_back(rt);
        }
        pipe_.addLane(sends);
        pipe_.addLane(recvs);
      }
    }
  }

  Context& ctx_;
  std::string name_;
  std::string algo_;
  size_t bytes_;
  int channels_;
  size_t slice_;
  bool twins_ = false;
  bool spread_ = false;
  int peerChannels_ = 1;
  HostBuffer data_;
  Pipeline pipe_;
  Comms comms_;
};

}  // namespace

std::string runContention(Context& ctx);

// The larger leg's share of each two-relay connection's sends, from the plugin's close lines
// ("its sends went A (..) via leg 1, B (..) via leg 2"), comma-separated; fails when one with
// data is under `least` (0: no check).
std::string twinLegShares(Context& ctx, size_t mark, double least) {
  static const std::string kWent = "its sends went ", kLeg2 = " via leg 1, ";
  std::string out;
  for (const LogLine& l : ctx.net.logSince(mark)) {
    size_t at = l.text.find(kWent), mid = l.text.find(kLeg2);
    if (at == std::string::npos || mid == std::string::npos) continue;
    double a = std::strtod(l.text.c_str() + at + kWent.size(), nullptr);
    double b = std::strtod(l.text.c_str() + mid + kLeg2.size(), nullptr);
    if (a + b == 0) continue;
    double share = std::max(a, b) / (a + b);
    out += format("%s%.2f", out.empty() ? "" : ",", share);
    if (least > 0 && share < least) {
      fail("--quiet-leg-share %.2f: a two-relay connection split its sends %.0f / %.0f (%s)", least, a, b,
           l.text.c_str());
    }
  }
  if (least > 0 && out.empty()) fail("--quiet-leg-share: no two-relay connection reported its sends at close");
  return out;
}

std::string runCollBench(Context& ctx) {
  requireNodes(ctx, 0);
  std::string algo = ctx.opts.str("algo", "ring");
  if (algo == "contention") {
    if (ctx.opts.has("vs")) fail("--vs is for ring, tree, alltoall and sendrecv");
    return runContention(ctx);
  }
  if (algo != "ring" && algo != "tree" && algo != "alltoall" && algo != "sendrecv") {
    fail("--algo %s: expected ring, tree, alltoall, sendrecv or contention", algo.c_str());
  }
  size_t bytes = 0, slice = 0;
  if (!parseSize(ctx.opts.str("bytes", "64M"), &bytes) || bytes < 4 || bytes > (size_t{1} << 30) || bytes % 4 != 0) {
    fail("--bytes: expected a multiple of 4 up to 1G");
  }
  if (!parseSize(ctx.opts.str("slice", algo == "sendrecv" ? "128K" : "512K"), &slice) || slice < 4096 || slice % 4 != 0) fail("--slice: at least 4K, a multiple of 4");
  int channels = static_cast<int>(ctx.opts.integer("channels", 4));
  int iters = static_cast<int>(ctx.opts.integer("iters", 3));
  int warmup = static_cast<int>(ctx.opts.integer("warmup", 1));
  double ceiling = ctx.opts.real("ceiling", 0);
  long maxStreak = ctx.opts.integer("max-streak", 0);
  // --max-passed-over N (on the fabric): no QP waited while other QPs of its port took more
  // than N of the port's turns (the fabric's max_passed_over). Unlike the streak, which the
  // host's scheduling moves (a rank off the CPU lets its peer finish a window of transfers),
  // this is the fabric's arbitration alone: round robin keeps it below the QPs per port.
  long maxPassedOver = ctx.opts.integer("max-passed-over", 0);
  // --quiet-leg-share X (with --twin-relays): every two-relay connection of this rank that
  // carried data sent at least X of its sends over one leg (the plugin's close line): on a
  // 4-ring NCCL's tree fills one cable of each relayed pair's ways with direct traffic, and
  // the steering must keep the relayed bytes on the other (mesh/relay/relay_twin.h).
  double quietShare = ctx.opts.real("quiet-leg-share", 0);
  if (quietShare > 0 && !ctx.opts.has("twin-relays")) fail("--quiet-leg-share needs --twin-relays");
  if (channels < 1 || channels > 32 || iters < 1 || warmup < 0) fail("--channels 1..32, --iters >= 1, --warmup >= 0");
  if (algo == "tree" && channels % 2 != 0) fail("--algo tree needs an even --channels (half per tree)");
  if (algo == "sendrecv" && ctx.nodes < 2) fail("--algo sendrecv needs 2 or more ranks");
  // --vs nccl-ib[:LIB]: NCCL's own IB transport in the same processes, on the same devices
  // (tests/e2e/nccl_ib.h), its own comms and buffers, the iterations alternating with the
  // plugin's: whatever the host does to one run (core placement, a busy neighbour) it does to
  // both, so each iteration pair's ratio compares the transports, not two runs.
  std::string vsLib;
  bool vs = ctx.opts.has("vs");
  if (vs && !parseNcclIbPlugin(ctx.opts.str("vs", ""), &vsLib)) fail("--vs: expected nccl-ib or nccl-ib:LIB");
  if (vs && ctx.opts.has("twin-relays")) fail("--vs compares one connection's transports: not with --twin-relays");
  bool spread = ctx.opts.has("spread-devices");
  if (spread && algo != "sendrecv" && algo != "alltoall") fail("--spread-devices is for --algo sendrecv and alltoall");
  int peerChannels = static_cast<int>(ctx.opts.integer("peer-channels", 1));
  if (ctx.opts.has("peer-channels") && algo != "alltoall") fail("--peer-channels is for --algo alltoall");
  if (peerChannels < 1 || peerChannels > 8) fail("--peer-channels 1..8");
  int refChannels = static_cast<int>(ctx.opts.integer("ref-channels", channels));
  if (refChannels < 1 || refChannels > 32) fail("--ref-channels 1..32");
  CollBench bench(ctx, algo, bytes, channels, slice, ctx.opts.has("twin-relays"));
  bench.spreadDevices(spread);
  bench.peerChannels(peerChannels);
  bench.testOldestOnly(ctx.opts.has("test-oldest"));
  Clock::time_point t0 = Clock::now();
  bench.connect();
  double connectS = secondsSince(t0);
  bench.build();
  std::unique_ptr<CollBench> ref;
  if (vs) {
    ctx.net.addNcclIb(vsLib, ctx.trafficClass);
    ctx.barrier("coll-bench-reference-loaded");
    ctx.net.use(1);
    ref.reset(new CollBench(ctx, algo, bytes, refChannels, slice, false, "ref"));
    ref->spreadDevices(spread);
    ref->peerChannels(peerChannels);
    ref->testOldestOnly(ctx.opts.has("test-oldest"));
    ref->connect();
    ref->build();
    ctx.net.use(0);
  }
  double best = 1e30, refBest = 1e30;
  size_t streak = 0;
  std::string each, refEach;  // every timed iteration's seconds: is a slow round slow in every iteration, or in one?
  std::vector<double> ratios;   // --vs: the reference's time / the plugin's, per iteration pair
  for (int it = 0; it < warmup + iters; ++it) {
    double s = bench.runOnce(it);
    double r = 0;
    if (ref) {
      ctx.net.use(1);
      r = ref->runOnce(it);
      ctx.net.use(0);
    }
    if (it >= warmup) {
      each += format("%s%.3f", each.empty() ? "" : ",", s);
      best = std::min(best, s);
      streak = std::max(streak, bench.streak());
      if (ref) {
        refEach += format("%s%.3f", refEach.empty() ? "" : ",", r);
        refBest = std::min(refBest, r);
        ratios.push_back(r / s);
      }
    }
  }
  std::string bad = bench.check(warmup + iters - 1);
  std::string refBad = ref ? ref->check(warmup + iters - 1) : "";
  ctx.barrier("coll-bench-done");
  if (ref) {
    ctx.net.use(1);
    ref->close();
    ctx.net.use(0);
  }
  size_t closeMark = ctx.net.logSize();
  bench.close();
  std::string shares = twinLegShares(ctx, closeMark, quietShare);
  ctx.barrier("coll-bench-closed");  // a relaying rank stays until the others closed
  if (!bad.empty()) fail("coll-bench %s: data wrong after the last iteration: %s", algo.c_str(), bad.c_str());
  if (!refBad.empty()) fail("coll-bench %s: the reference's data wrong after the last iteration: %s", algo.c_str(), refBad.c_str());
  long passedOver = fabricNodeMax("max_passed_over");
  if (maxPassedOver > 0 && passedOver < 0) fail("--max-passed-over needs the fabric (its counter max_passed_over)");
  if (maxPassedOver > 0 && passedOver > maxPassedOver) {
    fail("coll-bench %s: a QP waited while other QPs of its port sent %ld packets (--max-passed-over %ld): the "
         "fabric did not give the port's turns round robin",
         algo.c_str(), passedOver, maxPassedOver);
  }
  if (maxStreak > 0 && streak > static_cast<size_t>(maxStreak)) {
    fail("coll-bench %s: one connection completed %zu transfers in a row while another, with transfers still "
         "to come, completed none (--max-streak %ld): one direction of a cable waited for the other",
         algo.c_str(), streak, maxStreak);
  }
  int n = ctx.nodes;
  double factor = algo == "alltoall" ? (n - 1.0) / n : algo == "sendrecv" ? 1.0 : 2.0 * (n - 1) / n;
  double algbw = static_cast<double>(bytes) / best, busbw = algbw * factor;
  std::string out = format("algo=%s bytes=%zu channels=%d slice=%zu connect_s=%.2f best_s=%.4f algbw_MBps=%.1f "
                           "busbw_MBps=%.1f data exact",
                           algo.c_str(), bytes, algo == "alltoall" ? peerChannels : channels, slice, connectS, best,
                           algbw / 1e6, busbw / 1e6);
  out += format(" streak=%zu", streak);
  if (passedOver >= 0) out += format(" passed_over=%ld", passedOver);
  out += format(" iters_s=%s calls=%s", each.c_str(), bench.calls().c_str());
  if (ceiling > 0 && algo != "sendrecv") {
    std::string how;
    Traffic t = algo == "ring" ? ringAllreduceTraffic(n) : algo == "tree" ? treeAllreduceTraffic(n) : alltoallTraffic(n);
    double bound = algbwBound(ctx, t, ceiling, &how) * factor;
    out += format(" bound_busbw_MBps=%.1f fraction=%.3f (%s; cable ceiling %.1f MB/s)", bound / 1e6, busbw / bound,
                  how.c_str(), ceiling / 1e6);
  }
  if (!shares.empty()) out += " leg_shares=" + shares;
  if (ref) {
    std::sort(ratios.begin(), ratios.end());
    size_t k = ratios.size();
    double median = k % 2 ? ratios[k / 2] : (ratios[k / 2 - 1] + ratios[k / 2]) / 2;
    out += format(" ref_algbw_MBps=%.1f ref_busbw_MBps=%.1f ref_iters_s=%s vs_ratio_median=%.3f vs_ratio_min=%.3f "
                  "vs_ratio_max=%.3f (plugin / NCCL IB, per iteration pair)",
                  static_cast<double>(bytes) / refBest / 1e6, static_cast<double>(bytes) / refBest * factor / 1e6,
                  refEach.c_str(), median, ratios.front(), ratios.back());
    out += " ref_calls=" + ref->calls();
  }
  std::string sent = fabricSentBytes();
  if (!sent.empty()) out += " sent: " + sent;  // how the node's cables and functions shared it
  return out;
}

// --- contention -----------------------------------------------------------------------------

std::string runContention(Context& ctx) {
  if (ctx.nodes < 4 || cabled(ctx, 0, 2) != 0) fail("--algo contention needs a ring of 4 or more (rank 0 -> 2 relayed)");
  double ceiling = ctx.opts.real("ceiling", 0);
  double seconds = ctx.opts.real("seconds", 3);
  size_t msg = 0;
  if (!parseSize(ctx.opts.str("slice", "1M"), &msg) || msg < 4096) fail("--slice: at least 4K");
  if (ceiling <= 0 || seconds < 1) fail("--algo contention needs --ceiling (bytes/s) and --seconds >= 1");
  const int kRegions = 16;
  size_t messages = static_cast<size_t>(std::ceil(ceiling * (seconds + 1) / static_cast<double>(msg)));
  size_t mark = ctx.net.logSize();
  CommTable relayed = establish(ctx, {ctx.rank == 0 ? std::vector<int>{2} : std::vector<int>{},
                                      ctx.rank == 2 ? std::vector<int>{0} : std::vector<int>{}, 1, "cont-relayed"},
                                ctx.deadline);
  if (ctx.rank == 0) {
    std::vector<RelayedConnect> rc = relayedConnects(ctx, mark);
    // Leg 1 of a two-relay connection is the way its sends take unless the loads decide.
    auto first = std::find_if(rc.begin(), rc.end(), [](const RelayedConnect& c) { return c.leg != 2; });
    if (first == rc.end() || first->via < 0) fail("contention: rank 0 -> 2 did not go through a relay");
    ctx.rv->publish("contention.via", std::to_string(first->via));
  }
  int via = std::stoi(ctx.rv->fetch("contention.via", ctx.deadline, "the relay rank 0 -> 2 took"));
  CommTable direct = establish(ctx, {ctx.rank == via ? std::vector<int>{2} : std::vector<int>{},
                                     ctx.rank == 2 ? std::vector<int>{via} : std::vector<int>{}, 1, "cont-direct"},
                               ctx.deadline);
  HostBuffer data(msg * kRegions * 2);
  Pipeline pipe(ctx, data.data(), data.size(), msg);
  std::vector<int> recvConns;
  auto lane = [&](void* comm, bool send, int src, size_t base, const std::string& label) {
    int c = pipe.addConn(comm, send, label);
    if (!send) recvConns.push_back(c);
    for (int k = 0; k < kRegions && send; ++k) {
      fillPattern(data.data() + base + static_cast<size_t>(k) * msg, msg, patternSeed(src, 2, 31, static_cast<uint64_t>(k), 0));
    }
    std::vector<Step> steps(messages);
    for (size_t i = 0; i < messages; ++i) {
      Xfer x{c, base + (i % kRegions) * msg, msg, send ? POp::None : POp::Copy};
      (send ? steps[i].sends : steps[i].recvs).push_back(x);
    }
    pipe.addLane(steps);
  };
  if (ctx.rank == 0) lane(relayed[2].send[0], true, 0, 0, "relayed stream 0 -> 2");
  if (ctx.rank == via) lane(direct[2].send[0], true, via, 0, format("direct stream %d -> 2", via));
  if (ctx.rank == 2) {
    lane(relayed[0].recv[0], false, 0, 0, "relayed stream from rank 0");
    lane(direct[via].recv[0], false, via, msg * kRegions, format("direct stream from rank %d", via));
  }
  ctx.barrier("contention-start");
  Clock::time_point t0 = Clock::now();
  pipe.run(ctx.deadline);
  double total = secondsSince(t0);
  std::string out = format("relayed_via=%d messages=%zu x %zu B seconds=%.2f", via, messages, msg, total);
  if (ctx.rank == 2) {
    for (int k = 0; k < kRegions; ++k) {
      for (int s = 0; s < 2; ++s) {
        int src = s == 0 ? 0 : via;
        std::string bad = checkPattern(data.data() + (static_cast<size_t>(s) * kRegions + static_cast<size_t>(k)) * msg, msg,
                                       patternSeed(src, 2, 31, static_cast<uint64_t>(k), 0));
        if (!bad.empty()) fail("contention: data from rank %d wrong: %s", src, bad.c_str());
      }
    }
    double from = 0.5, to = seconds, share[2];
    for (int s = 0; s < 2; ++s) {
      double bytes = 0;
      for (const auto& e : pipe.completions(recvConns[static_cast<size_t>(s)])) {
        double at = secondsBetween(t0, e.first);
        if (at >= from && at < to) bytes += static_cast<double>(e.second);
      }
      share[s] = bytes / (to - from) / ceiling;
    }
    out += format(" window=%.1f-%.1f_s share_relayed=%.3f share_direct=%.3f share_min=%.3f share_sum=%.3f data exact",
                  from, to, share[0], share[1], std::min(share[0], share[1]), share[0] + share[1]);
  }
  ctx.barrier("contention-done");
  pipe.release();
  closeAll(ctx, relayed);
  closeAll(ctx, direct);
  ctx.barrier("contention-closed");
  return out;
}

}  // namespace e2e
