// SPDX-License-Identifier: Apache-2.0
// Ring all-reduce through the plugin (reduce-scatter, then all-gather) of float32 vectors
// whose sums are exact, with every chunk split over --pairs concurrent comm pairs to each
// neighbour. `allreduce` checks it; `demo` also shows which port carries each peer's
// traffic and the bandwidth (what the README's first command prints).
// Neighbours are (rank +- 1) mod N, cabled in both the full and the ring topology.
#include <algorithm>
#include <cstring>

#include "comm_setup.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

// Small integers: every partial sum is exact in float32, in any order.
float inputValue(int rank, size_t i, int iter) {
  return static_cast<float>((i * 7 + static_cast<size_t>(rank) * 3 + static_cast<size_t>(iter) * 5) % 61);
}

class RingAllreduce {
 public:
  RingAllreduce(Context& ctx, CommTable& table, int pairs, size_t count)
      : ctx_(ctx), pairs_(pairs), count_(count), data_(count * sizeof(float)),
        tmp_(count * sizeof(float)), engine_(ctx, ctx.seed + 17u * static_cast<unsigned>(ctx.rank)) {
    PeerComms& next = table[ctx.next()];
    PeerComms& prev = table[ctx.prev()];
    for (int k = 0; k < pairs; ++k) {
      send_.push_back(next.send[static_cast<size_t>(k)]);
      recv_.push_back(prev.recv[static_cast<size_t>(k)]);
      mhSendData_.push_back(regHost(ctx, send_.back(), data_, format("allreduce data on send comm #%d", k)));
      mhRecvData_.push_back(regHost(ctx, recv_.back(), data_, format("allreduce data on recv comm #%d", k)));
      mhRecvTmp_.push_back(regHost(ctx, recv_.back(), tmp_, format("allreduce tmp on recv comm #%d", k)));
    }
  }

  void release() {
    for (int k = 0; k < pairs_; ++k) {
      deregHost(ctx_, send_[k], mhSendData_[k], "allreduce data (send)");
      deregHost(ctx_, recv_[k], mhRecvData_[k], "allreduce data (recv)");
      deregHost(ctx_, recv_[k], mhRecvTmp_[k], "allreduce tmp");
    }
  }

  void fill(int iter) {
    float* d = values();
    for (size_t i = 0; i < count_; ++i) d[i] = inputValue(ctx_.rank, i, iter);
  }

  // Empty if every element equals the sum over ranks; else the first mismatch.
  std::string check(int iter) const {
    const float* d = reinterpret_cast<const float*>(data_.data());
    size_t bad = 0, first = 0;
    float want0 = 0;
    for (size_t i = 0; i < count_; ++i) {
      float want = 0;
      for (int r = 0; r < ctx_.nodes; ++r) want += inputValue(r, i, iter);
      if (d[i] != want && bad++ == 0) first = i, want0 = want;
    }
    if (bad == 0) return std::string();
    return format("%zu of %zu elements wrong, first [%zu] = %g, expected %g (chunk %zu)", bad, count_,
                  first, static_cast<double>(d[first]), static_cast<double>(want0), chunkOf(first));
  }

  void run(int iter) {
    int n = ctx_.nodes;
    for (int s = 0; s < n - 1; ++s) {  // reduce-scatter
      int sendChunk = mod(ctx_.rank - s), recvChunk = mod(ctx_.rank - s - 1);
      step(iter, "reduce-scatter", s, sendChunk, recvChunk, true);
      float* d = values();
      const float* t = reinterpret_cast<const float*>(tmp_.data());
      for (size_t i = begin(recvChunk); i < begin(recvChunk + 1); ++i) d[i] += t[i];
    }
    for (int s = 0; s < n - 1; ++s) {  // all-gather
      step(iter, "all-gather", s, mod(ctx_.rank + 1 - s), mod(ctx_.rank - s), false);
    }
  }

  size_t bytes() const { return data_.size(); }

 private:
  int mod(int x) const { return ((x % ctx_.nodes) + ctx_.nodes) % ctx_.nodes; }
  size_t begin(int chunk) const { return count_ * static_cast<size_t>(chunk) / static_cast<size_t>(ctx_.nodes); }
  size_t chunkOf(size_t i) const {
    for (int c = 0; c < ctx_.nodes; ++c) {
      if (i < begin(c + 1)) return static_cast<size_t>(c);
    }
    return 0;
  }
  float* values() { return reinterpret_cast<float*>(data_.data()); }

  // One ring step: chunk `sendChunk` to next and `recvChunk` from prev, each split over
  // the comm pairs (slice k on comm k). Receives land in tmp (reduce) or in place (gather).
  void step(int iter, const char* stage, int s, int sendChunk, int recvChunk, bool intoTmp) {
    setPhase(format("allreduce iteration %d %s step %d: send chunk %d to rank %d, receive chunk %d from rank %d",
                    iter, stage, s, sendChunk, ctx_.next(), recvChunk, ctx_.prev()));
    std::vector<Op> ops;
    for (int k = 0; k < pairs_; ++k) {
      size_t sb, se, rb, re;
      slice(sendChunk, k, &sb, &se);
      slice(recvChunk, k, &rb, &re);
      uint8_t* recvBase = intoTmp ? tmp_.data() : data_.data();
      void* recvMh = intoTmp ? mhRecvTmp_[k] : mhRecvData_[k];
      int tag = s + (intoTmp ? 0 : 1000);
      ops.push_back(recvOp(recv_[k], recvBase + rb * sizeof(float), static_cast<int>((re - rb) * sizeof(float)),
                           tag, recvMh,
                           format("%s step %d irecv chunk %d slice %d rank%d<-rank%d comm #%d", stage, s,
                                  recvChunk, k, ctx_.rank, ctx_.prev(), k)));
      ops.push_back(sendOp(send_[k], data_.data() + sb * sizeof(float), static_cast<int>((se - sb) * sizeof(float)),
                           tag, mhSendData_[k],
                           format("%s step %d isend chunk %d slice %d rank%d->rank%d comm #%d", stage, s,
                                  sendChunk, k, ctx_.rank, ctx_.next(), k)));
    }
    engine_.run(ops, ctx_.deadline);
    for (const Op& op : ops) {
      if (!op.send && op.got[0] != op.sizes[0]) {
        fail("%s: received %d bytes, expected %d", op.label.c_str(), op.got[0], op.sizes[0]);
      }
    }
  }

  void slice(int chunk, int k, size_t* b, size_t* e) const {
    size_t cb = begin(chunk), len = begin(chunk + 1) - cb;
    *b = cb + len * static_cast<size_t>(k) / static_cast<size_t>(pairs_);
    *e = cb + len * static_cast<size_t>(k + 1) / static_cast<size_t>(pairs_);
  }

  Context& ctx_;
  int pairs_;
  size_t count_;
  HostBuffer data_, tmp_;
  Engine engine_;
  std::vector<void*> send_, recv_, mhSendData_, mhRecvData_, mhRecvTmp_;
};

CommTable connectRing(Context& ctx, int pairs) {
  return establish(ctx, {{ctx.next()}, {ctx.prev()}, pairs, "ring"}, ctx.deadline);
}

std::set<int> neighbours(const Context& ctx) { return {ctx.next(), ctx.prev()}; }

// "to rank 1 via p1 (rxe_p1:1, 198.18.0.1 -> 198.18.0.2, MTU 4096)", from the conn lines.
std::string describePath(Context& ctx, size_t mark, int peer, const char* dir) {
  std::string out;
  for (const ConnLine& c : ctx.net.connLines(mark)) {
    if (labNodeOf(c.peer) != peer || c.dir != dir) continue;
    std::string one = format("%s (%s:%d, %s -> %s, MTU %d)", c.netdev.c_str(), c.dev.c_str(), c.port,
                             c.addr.c_str(), c.peer.c_str(), c.mtu);
    if (out.find(one) == std::string::npos) out += (out.empty() ? "" : " + ") + one;
  }
  return out.empty() ? "<no conn line logged>" : out;
}

}  // namespace

// Ring all-reduce on N >= 2 ranks, --pairs (4) comms per neighbour, --count (256K)
// floats, --iters (2) iterations; exact check on every rank.
std::string runAllreduce(Context& ctx) {
  requireNodes(ctx, 0);
  int pairs = static_cast<int>(ctx.opts.integer("pairs", 4));
  size_t count = static_cast<size_t>(ctx.opts.integer("count", 256 * 1024));
  int iters = static_cast<int>(ctx.opts.integer("iters", 2));
  if (pairs < 1 || pairs > 16 || count < 1) fail("need 1 <= --pairs <= 16 and --count >= 1");
  size_t mark = ctx.net.logSize();
  CommTable table = connectRing(ctx, pairs);
  RouteReport route = checkRouting(ctx, mark, neighbours(ctx));
  say("ring up: %s", route.describe().c_str());
  RingAllreduce ar(ctx, table, pairs, count);
  std::vector<double> times;
  for (int it = 0; it < iters; ++it) {
    ar.fill(it);
    Clock::time_point t0 = Clock::now();
    ar.run(it);
    times.push_back(secondsSince(t0));
    std::string bad = ar.check(it);
    if (!bad.empty()) fail("allreduce iteration %d on rank %d: %s", it, ctx.rank, bad.c_str());
    say("allreduce iteration %d: %zu floats exact in %.3f s", it, count, times.back());
  }
  ctx.barrier("allreduce-done");
  ar.release();
  closeAll(ctx, table);
  return format("nodes=%d pairs=%d floats=%zu iters=%d median_s=%.3f route=[%s]", ctx.nodes, pairs,
                count, iters, median(times), route.describe().c_str());
}

// The README's demo: which port carries each neighbour's traffic, and the all-reduce
// bandwidth (algbw = bytes / time, busbw = algbw * 2(N-1)/N; MB = 2^20 bytes).
std::string runDemo(Context& ctx) {
  requireNodes(ctx, 0);
  size_t bytes = static_cast<size_t>(ctx.opts.integer("bytes", 8 << 20));
  int pairs = static_cast<int>(ctx.opts.integer("pairs", 2));
  int iters = static_cast<int>(ctx.opts.integer("iters", 3));
  int warmup = static_cast<int>(ctx.opts.integer("warmup", 1));
  if (pairs < 1 || pairs > 16 || bytes < sizeof(float) || iters < 1 || warmup < 0) {
    fail("need 1 <= --pairs <= 16, --bytes >= 4, --iters >= 1, --warmup >= 0");
  }
  size_t count = bytes / sizeof(float);
  size_t mark = ctx.net.logSize();
  Clock::time_point t0 = Clock::now();
  CommTable table = connectRing(ctx, pairs);
  double connectSeconds = secondsSince(t0);
  checkRouting(ctx, mark, neighbours(ctx));
  std::string toNext = describePath(ctx, mark, ctx.next(), "send");
  std::string fromPrev = describePath(ctx, mark, ctx.prev(), "recv");
  say("demo: rank %d of %d: traffic to   rank %d leaves on %s", ctx.rank, ctx.nodes, ctx.next(), toNext.c_str());
  say("demo: rank %d of %d: traffic from rank %d arrives on %s", ctx.rank, ctx.nodes, ctx.prev(), fromPrev.c_str());

  RingAllreduce ar(ctx, table, pairs, count);
  std::vector<double> times;
  for (int it = 0; it < warmup + iters; ++it) {
    ar.fill(it);
    ctx.barrier(format("demo-%d", it));  // start together: the slowest rank sets the pace
    Clock::time_point s = Clock::now();
    ar.run(it);
    double secs = secondsSince(s);
    std::string bad = ar.check(it);
    if (!bad.empty()) fail("demo all-reduce iteration %d on rank %d: %s", it, ctx.rank, bad.c_str());
    if (it >= warmup) times.push_back(secs);
  }
  double t = median(times);
  double algbw = static_cast<double>(count * sizeof(float)) / t / 1048576.0;
  double busbw = algbw * 2.0 * (ctx.nodes - 1) / ctx.nodes;
  say("demo: rank %d: all-reduce of %s float32 over %d ranks, %d comm pair(s) per neighbour: "
      "%.3f s, algbw %.1f MB/s, busbw %.1f MB/s (median of %d, data exact)",
      ctx.rank, humanBytes(static_cast<double>(count * sizeof(float))).c_str(), ctx.nodes, pairs, t,
      algbw, busbw, iters);
  ctx.barrier("demo-done");
  ar.release();
  closeAll(ctx, table);
  return format("nodes=%d bytes=%zu pairs=%d connect_s=%.2f time_s=%.3f algbw_MBps=%.1f busbw_MBps=%.1f "
                "to_next=[%s] from_prev=[%s]", ctx.nodes, count * sizeof(float), pairs, connectSeconds, t,
                algbw, busbw, toNext.c_str(), fromPrev.c_str());
}

}  // namespace e2e
