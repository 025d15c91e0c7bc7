// SPDX-License-Identifier: Apache-2.0
// patterns (issue 15): the pairs NCCL's algorithms other than Ring connect, driven through
// the exported ABI as collectives whose results are checked exactly. On a ring or a line of
// cables most of these pairs have no cable, so they go through the relay; the scenario runs
// the same on a full mesh (every pair direct). Every pair's comms are set up at once, as NCCL
// does at init with runtime connect off, then:
//   tree      all-reduce over NCCL's double binary tree (its ncclGetBtree/ncclGetDtree rules:
//             tree 0 is the binary tree over ranks, tree 1 its mirror for even N, its shift
//             by one for odd N); half the vector on each tree, both trees in the same steps:
//             reduce up (children's partial sums received into scratch and added), then
//             broadcast down into place. On 4 ranks its edges must be {0-1, 0-2, 1-2, 1-3,
//             2-3}: both diagonals of a cable-ordered 4-ring.
//   pat       the rank +- 2^k exchanges of NCCL's PAT (AllGather/ReduceScatter): a
//             reduce-scatter by distance halving (N/2, ..., 1: send to rank + d, receive
//             from rank - d) and an all-gather by distance doubling (1, ..., N/2: send to
//             rank - d, receive from rank + d), each block its own tagged isend, the
//             receiver's blocks one grouped irecv. Power-of-two N.
//   alltoall  every rank sends a distinct block to every other rank, all at once.
// With --ring-first (a ring of cables) the comms come up in NCCL's init order, ring first, and
// every relayed connect must take the shorter way round; where both ways are equally long, the
// direction the ring leaves idle when it used the fallback rule (connectRingFirst).
// The vector is --count floats (small integers: every partial sum is exact in float32);
// blocks and halves have odd sizes by default so relay chunks end mid-element.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "comm_setup.h"
#include "patterns.h"
#include "probes.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {

// NCCL's binary tree over ranks 0..n-1: a rank's parent clears its lowest set bit and sets
// the next one up (or, past the end, only clears it); its children are rank -+ half that bit,
// the upper one moved down by halving until it exists. Rank 0 is the root with one child.
TreeNode binaryTree(int n, int r) {
  TreeNode t;
  int bit = 1;
  while (bit < n && (bit & r) == 0) bit <<= 1;
  if (r == 0) {
    if (n > 1) t.down.push_back(bit >> 1);
    return t;
  }
  t.up = (r ^ bit) | (bit << 1);
  if (t.up >= n) t.up = r ^ bit;
  int low = bit >> 1;
  if (low == 0) return t;
  t.down.push_back(r - low);
  while (low > 0 && r + low >= n) low >>= 1;
  if (low > 0) t.down.push_back(r + low);
  return t;
}

// Tree 1 of NCCL's double binary tree: for even n the mirror image (rank n-1-r), for odd n
// the tree shifted by one rank.
TreeNode secondTree(int n, int r) {
  auto map = [n](int x, bool mirror) { return x < 0 ? -1 : mirror ? n - 1 - x : (x + 1) % n; };
  bool mirror = n % 2 == 0;
  TreeNode base = binaryTree(n, mirror ? n - 1 - r : (r - 1 + n) % n), t;
  t.up = map(base.up, mirror);
  for (int d : base.down) t.down.push_back(map(d, mirror));
  return t;
}

namespace {

struct Tree {
  std::vector<TreeNode> node;  // by rank
  std::vector<int> height;     // 0 for leaves
  std::vector<int> depth;      // 0 for the root
  int root = -1;
  int levels = 0;              // max height + 1
};

Tree buildTree(int n, int which) {
  Tree t;
  for (int r = 0; r < n; ++r) t.node.push_back(which == 0 ? binaryTree(n, r) : secondTree(n, r));
  // Consistency: every parent lists its child, exactly one root, no cycles (depths settle).
  for (int r = 0; r < n; ++r) {
    const TreeNode& me = t.node[static_cast<size_t>(r)];
    if (me.up < 0) {
      if (t.root >= 0) fail("tree %d of %d ranks: two roots (%d, %d)", which, n, t.root, r);
      t.root = r;
      continue;
    }
    const std::vector<int>& siblings = t.node[static_cast<size_t>(me.up)].down;
    if (std::find(siblings.begin(), siblings.end(), r) == siblings.end()) {
      fail("tree %d of %d ranks: rank %d's parent %d does not list it as a child", which, n, r, me.up);
    }
  }
  if (t.root < 0) fail("tree %d of %d ranks: no root", which, n);
  t.depth.assign(static_cast<size_t>(n), -1);
  t.height.assign(static_cast<size_t>(n), 0);
  std::vector<int> order{t.root};
  t.depth[static_cast<size_t>(t.root)] = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    for (int c : t.node[static_cast<size_t>(order[i])].down) {
      if (t.depth[static_cast<size_t>(c)] >= 0) fail("tree %d of %d ranks: rank %d reached twice", which, n, c);
      t.depth[static_cast<size_t>(c)] = t.depth[static_cast<size_t>(order[i])] + 1;
      order.push_back(c);
    }
  }
  if (order.size() != static_cast<size_t>(n)) fail("tree %d of %d ranks: %zu ranks reachable", which, n, order.size());
  for (size_t i = order.size(); i-- > 0;) {  // children after parents in `order`
    int r = order[i];
    for (int c : t.node[static_cast<size_t>(r)].down) {
      t.height[static_cast<size_t>(r)] = std::max(t.height[static_cast<size_t>(r)], t.height[static_cast<size_t>(c)] + 1);
    }
  }
  t.levels = t.height[static_cast<size_t>(t.root)] + 1;
  return t;
}

float inputValue(int rank, size_t i, int iter) {
  return static_cast<float>((i * 5 + static_cast<size_t>(rank) * 11 + static_cast<size_t>(iter) * 3) % 53);
}

uint8_t alltoallByte(int from, int to, size_t i, int iter) {
  return static_cast<uint8_t>((i * 131 + static_cast<size_t>(from) * 29 + static_cast<size_t>(to) * 7 +
                               static_cast<size_t>(iter) * 17 + (i >> 9)) & 0xff);
}

class Patterns {
 public:
  Patterns(Context& ctx, CommTable& table, size_t count, size_t a2aBytes)
      : ctx_(ctx), table_(table), n_(ctx.nodes), count_(count), a2aBytes_(a2aBytes),
        data_(count * sizeof(float)), tmp_(4 * count * sizeof(float)),
        a2aOut_(a2aBytes * static_cast<size_t>(ctx.nodes)), a2aIn_(a2aBytes * static_cast<size_t>(ctx.nodes)),
        engine_(ctx, ctx.seed + 31u * static_cast<unsigned>(ctx.rank)) {
    for (auto& kv : table_) {
      for (void* c : kv.second.send) registerAll(c, format("send comm to rank %d", kv.first));
      for (void* c : kv.second.recv) registerAll(c, format("recv comm from rank %d", kv.first));
    }
  }

  void release() {
    for (auto& kv : mh_) {
      for (auto& b : kv.second) deregHost(ctx_, kv.first, b.second, "patterns buffer");
    }
    mh_.clear();
  }

  // The set of undirected tree edges "a-b" (a < b) of both trees.
  static std::set<std::pair<int, int>> treeEdges(int n) {
    std::set<std::pair<int, int>> edges;
    for (int w = 0; w < 2; ++w) {
      Tree t = buildTree(n, w);
      for (int r = 0; r < n; ++r) {
        int up = t.node[static_cast<size_t>(r)].up;
        if (up >= 0) edges.insert({std::min(r, up), std::max(r, up)});
      }
    }
    return edges;
  }

  double tree(int iter) {
    fill(iter);
    Tree trees[2] = {buildTree(n_, 0), buildTree(n_, 1)};
    const size_t me = static_cast<size_t>(ctx_.rank);
    Clock::time_point t0 = Clock::now();
    int levels = std::max(trees[0].levels, trees[1].levels);
    // Reduce: at step s every rank of height s sends its half's partial sum to its parent.
    for (int s = 0; s + 1 < levels; ++s) {
      std::vector<Op> ops;
      std::vector<std::pair<size_t, int>> adds;  // (scratch offset in floats, tree)
      for (int w = 0; w < 2; ++w) {
        const Tree& t = trees[w];
        const TreeNode& node = t.node[me];
        size_t b = halfBegin(w), len = halfBegin(w + 1) - b;
        for (size_t j = 0; j < node.down.size(); ++j) {
          int c = node.down[j];
          if (t.height[static_cast<size_t>(c)] != s) continue;
          size_t off = (static_cast<size_t>(w) * 2 + j) * count_;
          ops.push_back(recvOp(recvComm(c), tmpFloats() + off, bytesOf(len), 100 * w + s, mh(recvComm(c), tmp_),
                               format("tree %d reduce step %d irecv half from child rank %d", w, s, c)));
          adds.push_back({off, w});
        }
        if (t.height[me] == s && node.up >= 0) {
          ops.push_back(sendOp(sendComm(node.up), values() + b, bytesOf(len), 100 * w + s,
                               mh(sendComm(node.up), data_),
                               format("tree %d reduce step %d isend partial half to parent rank %d", w, s, node.up)));
        }
      }
      runStep(ops, format("patterns: tree all-reduce iteration %d, reduce step %d", iter, s));
      for (const auto& a : adds) {
        size_t b = halfBegin(a.second), e = halfBegin(a.second + 1);
        const float* src = tmpFloats() + a.first;
        for (size_t i = b; i < e; ++i) values()[i] += src[i - b];
      }
    }
    // Broadcast: at step s every rank of depth s sends the finished half to its children.
    for (int s = 0; s + 1 < levels; ++s) {
      std::vector<Op> ops;
      for (int w = 0; w < 2; ++w) {
        const Tree& t = trees[w];
        const TreeNode& node = t.node[me];
        size_t b = halfBegin(w), len = halfBegin(w + 1) - b;
        if (t.depth[me] == s + 1) {
          ops.push_back(recvOp(recvComm(node.up), values() + b, bytesOf(len), 200 + 100 * w + s,
                               mh(recvComm(node.up), data_),
                               format("tree %d broadcast step %d irecv half from parent rank %d", w, s, node.up)));
        }
        if (t.depth[me] == s) {
          for (int c : node.down) {
            ops.push_back(sendOp(sendComm(c), values() + b, bytesOf(len), 200 + 100 * w + s, mh(sendComm(c), data_),
                                 format("tree %d broadcast step %d isend half to child rank %d", w, s, c)));
          }
        }
      }
      runStep(ops, format("patterns: tree all-reduce iteration %d, broadcast step %d", iter, s));
    }
    double secs = secondsSince(t0);
    checkSum(iter, "tree all-reduce");
    return secs;
  }

  double pat(int iter) {
    fill(iter);
    Clock::time_point t0 = Clock::now();
    // Reduce-scatter: before the step of distance d this rank holds partial sums of blocks
    // [r, r + 2d); it keeps the lower half and hands the upper half to rank r + d.
    for (int d = n_ / 2; d >= 1; d /= 2) {
      std::vector<Op> ops;
      ops.push_back(blockRecv(ctx_.prev(d), ctx_.rank, d, tmpFloats(), tmp_, 300 + d,
                              format("pat reduce-scatter distance %d", d)));
      for (int j = 0; j < d; ++j) {
        int blk = ctx_.next(d + j);
        ops.push_back(sendOp(sendComm(ctx_.next(d)), values() + blockBegin(blk), bytesOf(blockLen(blk)),
                             tagOf(300 + d, blk), mh(sendComm(ctx_.next(d)), data_),
                             format("pat reduce-scatter distance %d isend block %d to rank %d", d, blk, ctx_.next(d))));
      }
      runStep(ops, format("patterns: pat iteration %d, reduce-scatter distance %d", iter, d));
      for (int j = 0; j < d; ++j) {
        int blk = ctx_.next(j);
        for (size_t i = blockBegin(blk); i < blockBegin(blk + 1); ++i) values()[i] += tmpFloats()[i];
      }
    }
    // All-gather: before the step of distance d this rank holds the sums of blocks [r, r + d);
    // it sends them to rank r - d and receives [r + d, r + 2d) from rank r + d.
    for (int d = 1; d < n_; d *= 2) {
      std::vector<Op> ops;
      ops.push_back(blockRecv(ctx_.next(d), ctx_.next(d), d, values(), data_, 400 + d,
                              format("pat all-gather distance %d", d)));
      for (int j = 0; j < d; ++j) {
        int blk = ctx_.next(j);
        ops.push_back(sendOp(sendComm(ctx_.prev(d)), values() + blockBegin(blk), bytesOf(blockLen(blk)),
                             tagOf(400 + d, blk), mh(sendComm(ctx_.prev(d)), data_),
                             format("pat all-gather distance %d isend block %d to rank %d", d, blk, ctx_.prev(d))));
      }
      runStep(ops, format("patterns: pat iteration %d, all-gather distance %d", iter, d));
    }
    double secs = secondsSince(t0);
    checkSum(iter, "pat reduce-scatter + all-gather");
    return secs;
  }

  double alltoall(int iter) {
    for (int p = 0; p < n_; ++p) {
      uint8_t* out = a2aOut_.data() + static_cast<size_t>(p) * a2aBytes_;
      for (size_t i = 0; i < a2aBytes_; ++i) out[i] = alltoallByte(ctx_.rank, p, i, iter);
    }
    memset(a2aIn_.data(), kCanary, a2aIn_.size());
    std::vector<Op> ops;
    std::vector<int> peers = otherRanks(ctx_);
    std::shuffle(peers.begin(), peers.end(), engine_.rng());  // post in a different order on every rank
    for (int p : peers) {
      size_t off = static_cast<size_t>(p) * a2aBytes_;
      ops.push_back(recvOp(recvComm(p), a2aIn_.data() + off, static_cast<int>(a2aBytes_), 500 + iter, mh(recvComm(p), a2aIn_), format("alltoall irecv from rank %d", p)));
      ops.push_back(sendOp(sendComm(p), a2aOut_.data() + off, static_cast<int>(a2aBytes_), 500 + iter,
                           mh(sendComm(p), a2aOut_), format("alltoall isend to rank %d", p)));
    }
    Clock::time_point t0 = Clock::now();
    runStep(ops, format("patterns: all-to-all iteration %d", iter));
    double secs = secondsSince(t0);
    for (int p : peers) {
      const uint8_t* in = a2aIn_.data() + static_cast<size_t>(p) * a2aBytes_;
      for (size_t i = 0; i < a2aBytes_; ++i) {
        if (in[i] != alltoallByte(p, ctx_.rank, i, iter)) {
          fail("all-to-all iteration %d: byte %zu of %zu from rank %d is 0x%02x, expected 0x%02x", iter, i,
               a2aBytes_, p, in[i], alltoallByte(p, ctx_.rank, i, iter));
        }
      }
    }
    return secs;
  }

 private:
  void registerAll(void* comm, const std::string& what) {
    for (const HostBuffer* b : {&data_, &tmp_, &a2aOut_, &a2aIn_}) {
      mh_[comm][b] = regHost(ctx_, comm, *b, "patterns buffer on " + what);
    }
  }
  void* mh(void* comm, const HostBuffer& b) { return mh_.at(comm).at(&b); }
  void* sendComm(int peer) { return table_.at(peer).send.at(0); }
  void* recvComm(int peer) { return table_.at(peer).recv.at(0); }
  float* values() { return reinterpret_cast<float*>(data_.data()); }
  float* tmpFloats() { return reinterpret_cast<float*>(tmp_.data()); }
  static int bytesOf(size_t floats) { return static_cast<int>(floats * sizeof(float)); }
  size_t halfBegin(int h) const { return count_ * static_cast<size_t>(h) / 2; }
  size_t blockBegin(int b) const { return count_ * static_cast<size_t>(b) / static_cast<size_t>(n_); }
  size_t blockLen(int b) const { return blockBegin(b + 1) - blockBegin(b); }
  static int tagOf(int step, int block) { return step * 64 + block; }

  // One grouped irecv of blocks first, first+1, ... (d of them, mod N) from `peer`, each into
  // its own place in `base` (data or scratch, both indexed like the vector).
  Op blockRecv(int peer, int first, int d, float* base, const HostBuffer& buf, int step, const std::string& what) {
    if (d > kMaxGroup) fail("%s: %d blocks in one grouped receive (at most %d)", what.c_str(), d, kMaxGroup);
    Op op;
    op.send = false;
    op.comm = recvComm(peer);
    op.n = d;
    for (int j = 0; j < d; ++j) {
      int blk = (first + j) % n_;
      op.data[j] = base + blockBegin(blk);
      op.sizes[j] = bytesOf(blockLen(blk));
      op.tags[j] = tagOf(step, blk);
      op.mh[j] = mh(op.comm, buf);
    }
    op.label = format("%s irecv %d block(s) from %d, grouped, from rank %d", what.c_str(), d, first, peer);
    return op;
  }

  void runStep(std::vector<Op>& ops, const std::string& phase) {
    setPhase(phase);
    if (ops.empty()) return;
    engine_.run(ops, ctx_.deadline);
    for (const Op& op : ops) {
      if (op.send) continue;
      for (int j = 0; j < op.n; ++j) {
        if (op.got[j] != op.sizes[j]) {
          fail("%s: buffer %d received %d bytes, expected %d", op.label.c_str(), j, op.got[j], op.sizes[j]);
        }
      }
    }
  }

  void fill(int iter) {
    for (size_t i = 0; i < count_; ++i) values()[i] = inputValue(ctx_.rank, i, iter);
  }

  void checkSum(int iter, const char* what) {
    size_t bad = 0, first = 0;
    float want0 = 0;
    for (size_t i = 0; i < count_; ++i) {
      float want = 0;
      for (int r = 0; r < n_; ++r) want += inputValue(r, i, iter);
      if (values()[i] != want && bad++ == 0) first = i, want0 = want;
    }
    if (bad != 0) {
      fail("%s iteration %d on rank %d: %zu of %zu elements wrong, first [%zu] = %g, expected %g", what, iter,
           ctx_.rank, bad, count_, first, static_cast<double>(values()[first]), static_cast<double>(want0));
    }
  }

  Context& ctx_;
  CommTable& table_;
  int n_;
  size_t count_, a2aBytes_;
  HostBuffer data_, tmp_, a2aOut_, a2aIn_;
  Engine engine_;
  std::map<void*, std::map<const HostBuffer*, void*>> mh_;
};

std::string edgeList(const std::set<std::pair<int, int>>& edges) {
  std::ostringstream out;
  for (const auto& e : edges) out << (out.tellp() > 0 ? "," : "") << e.first << "-" << e.second;
  return out.str();
}

void merge(CommTable* into, CommTable&& from) {
  for (auto& kv : from) {
    PeerComms& d = (*into)[kv.first];
    PeerComms& x = kv.second;
    d.send.insert(d.send.end(), x.send.begin(), x.send.end());
    d.recv.insert(d.recv.end(), x.recv.begin(), x.recv.end());
    d.listen.insert(d.listen.end(), x.listen.begin(), x.listen.end());
    d.connectSeconds.insert(d.connectSeconds.end(), x.connectSeconds.begin(), x.connectSeconds.end());
    d.acceptSeconds.insert(d.acceptSeconds.end(), x.acceptSeconds.begin(), x.acceptSeconds.end());
  }
}

// --ring-first on a ring of cables, the order NCCL connects at init with runtime connect off
// (src/init.cc initTransportsRank calls src/transport/generic.cc's ncclTransportRingConnect,
// which sets up every ring channel, before ncclTransportTreeConnect and ncclTransportPatConnect):
// its ring (rank -> rank + 1, direct) first, then the uncabled pairs (relayed), then the rest. Each relayed connect must
// take the shorter way round; where both ways are equally long, the one the ring leaves idle
// (through rank - 1: the ring sends on the cable to rank + 1) by the fallback rule, either by
// the route plan (issue 31; scenario route-plan checks its balance). From the plugin's "relay:
// connected to <peer> via <neighbour>" lines. Returns "peer:via" for each relayed peer.
std::string connectRingFirst(Context& ctx, CommTable* table) {
  if (ctx.topology != "ring" || ctx.nodes < 3) fail("--ring-first: run on a ring of 3 or more nodes (--topology ring)");
  std::vector<int> uncabled, rest;
  for (int p : otherRanks(ctx)) (cabled(ctx, ctx.rank, p) == 0 ? uncabled : rest).push_back(p);
  *table = establish(ctx, {{ctx.next()}, {ctx.prev()}, 1, "patterns-ring"}, ctx.deadline);
  ctx.barrier("patterns-ring-up");  // every rank's ring sends are open before any relayed connect
  size_t mark = ctx.net.logSize();
  merge(table, establish(ctx, {uncabled, uncabled, 1, "patterns-relayed"}, ctx.deadline));
  std::map<int, int> via;  // relayed peer -> the neighbour its connect went through
  std::set<int> planned;   // relayed peers whose connect followed the route plan (issue 31)
  for (const RelayedConnect& c : relayedConnects(ctx, mark)) {
    if (c.leg == 2) continue;  // a two-relay connection's second way; leg 1 is the one-relay choice
    via[c.target] = c.via;
    if (c.line.find("(route plan;") != std::string::npos) planned.insert(c.target);
  }
  std::string out;
  for (int p : uncabled) {
    int forward = ((p - ctx.rank) % ctx.nodes + ctx.nodes) % ctx.nodes, backward = ctx.nodes - forward;
    int want = forward < backward ? ctx.next() : ctx.prev();
    auto it = via.find(p);
    if (it == via.end()) fail("--ring-first: rank %d's connect to rank %d logged no 'relay: connected to' line", ctx.rank, p);
    // The route plan (every node's view agreed) balances relayed pairs over both directions
    // of every cable, so where both ways are equally long either may be its choice; the
    // fallback rule takes the one the ring leaves idle. Both take the shorter way.
    bool either = forward == backward && planned.count(p) != 0;
    if (it->second != want && !(either && it->second == ctx.next())) {
      fail("--ring-first: rank %d's relayed connect to rank %d went through rank %d; expected rank %d (%s)", ctx.rank, p,
           it->second, want,
           forward == backward ? "both ways equally long: the one the ring's sends to rank + 1 leave idle"
                               : "the shorter way round");
    }
    out += format("%s%d:via%d", out.empty() ? "" : ",", p, it->second);
  }
  std::vector<int> sendRest, recvRest;
  for (int p : rest) {
    if (p != ctx.next()) sendRest.push_back(p);
    if (p != ctx.prev()) recvRest.push_back(p);
  }
  merge(table, establish(ctx, {sendRest, recvRest, 1, "patterns-rest"}, ctx.deadline));
  return out.empty() ? "-" : out;
}

// --check-port-range: with NCCL_MESH_PORT_RANGE=lo-hi every TCP socket of this process (the
// plugin's and its relay thread's) is a listener in the range or on NCCL_MESH_RELAY_PORT, or a
// connection one of whose ends is: nothing listens on an ephemeral port, not even a relay's
// one-shot listener for a leg. Returns the counts.
std::string checkPortRange() {
  const char* range = getenv("NCCL_MESH_PORT_RANGE");
  int lo = 0, hi = 0;
  if (range == nullptr || sscanf(range, "%d-%d", &lo, &hi) != 2 || lo < 1 || hi < lo) {
    fail("--check-port-range: run with NCCL_MESH_PORT_RANGE=lo-hi (got '%s')", range != nullptr ? range : "(unset)");
  }
  const char* rp = getenv("NCCL_MESH_RELAY_PORT");
  const int relayPort = rp != nullptr ? atoi(rp) : 41517;
  auto fixed = [&](int port) { return (port >= lo && port <= hi) || port == relayPort; };
  int listening = 0, connected = 0;
  std::string bad;
  for (const TcpSocket& t : ownTcpSockets()) {
    if (t.listening) {
      ++listening;
      if (!fixed(t.localPort)) bad += format(" listening on %d;", t.localPort);
    } else if (t.established) {
      ++connected;
      if (!fixed(t.localPort) && !fixed(t.remotePort)) bad += format(" %d <-> %d;", t.localPort, t.remotePort);
    }
  }
  if (!bad.empty()) {
    fail("--check-port-range: with NCCL_MESH_PORT_RANGE=%d-%d (relay port %d) these TCP sockets of this process use "
         "neither:%s", lo, hi, relayPort, bad.c_str());
  }
  if (listening == 0 || connected == 0) {
    fail("--check-port-range: %d listening and %d connected TCP sockets found; expected some of each", listening,
         connected);
  }
  return format(" port_range=%d-%d listening=%d connected=%d", lo, hi, listening, connected);
}

}  // namespace

PatternOptions patternOptions(const Context& ctx) {
  PatternOptions o;
  o.count = static_cast<size_t>(ctx.opts.integer("count", 262144 + 1021));
  o.iters = static_cast<int>(ctx.opts.integer("iters", 2));
  o.a2aBytes = static_cast<size_t>(ctx.opts.integer("alltoall-bytes", (1 << 20) + 3));
  std::string which = ctx.opts.str("patterns", "tree,pat,alltoall");
  std::stringstream in(which);
  std::string one;
  while (std::getline(in, one, ',')) {
    if (one == "tree") o.tree = true;
    else if (one == "pat") o.pat = true;
    else if (one == "alltoall") o.alltoall = true;
    else fail("--patterns '%s': expected a list of tree, pat, alltoall", which.c_str());
  }
  if (o.count < static_cast<size_t>(2 * ctx.nodes) || o.count > (64u << 20)) {
    fail("--count %zu: expected %d .. 64M floats", o.count, 2 * ctx.nodes);
  }
  if (o.a2aBytes < 1 || o.a2aBytes > (256u << 20)) fail("--alltoall-bytes %zu: expected 1 .. 256M", o.a2aBytes);
  if (o.iters < 1 || o.iters > 100) fail("--iters %d: expected 1 .. 100", o.iters);
  if (o.pat && (ctx.nodes & (ctx.nodes - 1)) != 0) {
    fail("--patterns pat needs a power-of-two number of ranks (PAT's +-2^k distances), not %d: leave it out",
         ctx.nodes);
  }
  if (o.pat && ctx.nodes / 2 > kMaxGroup) fail("--patterns pat: at most %d ranks", 2 * kMaxGroup);
  return o;
}

std::string runPatternsOn(Context& ctx, CommTable& table, const PatternOptions& o) {
  std::set<std::pair<int, int>> edges = Patterns::treeEdges(ctx.nodes);
  if (ctx.nodes == 4 && edgeList(edges) != "0-1,0-2,1-2,1-3,2-3") {
    fail("NCCL's double binary tree on 4 ranks uses edges 0-1,0-2,1-2,1-3,2-3; computed %s", edgeList(edges).c_str());
  }
  Patterns p(ctx, table, o.count, o.a2aBytes);
  std::vector<double> tree, pat, a2a;
  for (int it = 0; it < o.iters; ++it) {
    ctx.barrier(format("patterns-%d", it));
    if (o.tree) tree.push_back(p.tree(it));
    if (o.pat) pat.push_back(p.pat(it));
    if (o.alltoall) a2a.push_back(p.alltoall(it));
    say("patterns iteration %d: %s%s%s exact", it, o.tree ? "tree all-reduce, " : "",
        o.pat ? "pat reduce-scatter+all-gather, " : "", o.alltoall ? "all-to-all" : "");
  }
  ctx.barrier("patterns-done");
  p.release();
  auto fig = [](const std::vector<double>& v) { return v.empty() ? std::string("-") : format("%.3f", median(v)); };
  return format("patterns floats=%zu alltoall_bytes=%zu iters=%d tree_edges=%s tree_s=%s pat_s=%s alltoall_s=%s",
                o.count, o.a2aBytes, o.iters, edgeList(edges).c_str(), fig(tree).c_str(), fig(pat).c_str(),
                fig(a2a).c_str());
}

std::string runPatterns(Context& ctx) {
  requireNodes(ctx, 0);
  PatternOptions o = patternOptions(ctx);
  std::vector<int> peers = otherRanks(ctx);
  int uncabled = 0;
  for (int p : peers) uncabled += cabled(ctx, ctx.rank, p) == 0 ? 1 : 0;
  Clock::time_point t0 = Clock::now();
  CommTable table;
  std::string directions;
  if (ctx.opts.has("ring-first")) {
    directions = " relayed_via=" + connectRingFirst(ctx, &table);
  } else {
    table = establish(ctx, {peers, peers, 1, "patterns"}, ctx.deadline);
  }
  double upSeconds = secondsSince(t0);
  if (ctx.opts.has("check-port-range")) {
    ctx.barrier("patterns-ports");  // every relay has served its legs
    directions += checkPortRange();
  }
  say("patterns: %zu send + %zu recv comms up in %.2f s (%d peers without a cable)", peers.size(), peers.size(),
      upSeconds, uncabled);
  std::string figures = runPatternsOn(ctx, table, o);
  closeAll(ctx, table);
  ctx.barrier("patterns-closed");  // a rank relaying others' comms stays until they closed them
  return format("api=v%d topology=%s uncabled_peers=%d connect_s=%.2f%s %s", ctx.api,
                ctx.topology.empty() ? "?" : ctx.topology.c_str(), uncabled, upSeconds, directions.c_str(),
                figures.c_str());
}

}  // namespace e2e
