// SPDX-License-Identifier: Apache-2.0
// relay (issue 15): every ordered pair of ranks moves byte-exact data through the exported
// ABI, whatever the cabling. On a full mesh every pair is direct; on a ring or a line the
// pairs without a cable go through a neighbour's relay (NCCL_MESH_RELAY=auto). The checks
// are the same for both, because NCCL cannot tell a relayed comm from a direct one. The
// kernel must not forward IP between the mesh links (ip_forward 0): rxe and the fabric are
// UDP underneath, so with forwarding on a missing relay would pass unseen.
//
// Schedule: every comm is set up at once (NCCL connects all its pairs at init when runtime
// connect is off), then N-1 rounds. In round r each rank sends to rank+r and receives from
// rank-r: each ordered pair is used in exactly one round, on comms nothing has used yet;
// each rank has one send and one receive comm busy (with r = N/2 both directions of a pair
// run at once) and every round has relayed pairs on a ring. Per round, in this order:
//   null      isends tried before the receiver posted are NULL requests; then it posts
//   sizes     0, 1, C-1, C, C+1 bytes (C: the relay chunk); test() reports the size sent
//   group     one grouped receive of 8 tags; the 8 sends issued in a shuffled tag order
//   oversize  sends larger than the posted buffer: truncated to it, the guard untouched
//   sequence  --messages (1000) of 8..1031 bytes, --outstanding (32) at a time, in order
//   big       one --big (64 MiB; 0: none) message
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "comm_setup.h"
#include "patterns.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

constexpr size_t kDefaultChunk = 128u << 10;  // the relay's default NCCL_MESH_RELAY_CHUNK (config.cpp)
constexpr size_t kMaxChunk = 256u << 20;      // C+1 must fit an int size (v8) with room
constexpr int kGuard = 4096;   // canary bytes after every posted receive buffer
constexpr int kSlack = 64;     // capacity beyond the size sent: test() must say what was sent
constexpr int kNullTries = 5;
constexpr int kSeqSlice = 2048;     // per sequence message: capacity, then canary
constexpr int kSeqCapacity = 1040;  // >= the largest sequence message
constexpr int kSeqTag = 77;         // one tag: receives match sends in posting order

// Pattern ids: patternSeed(src, dst, id, ...) differs per phase, so data that lands in
// another phase's (or another pair's) buffer never passes.
enum : uint64_t { kIdNull = 1, kIdSizes, kIdGroup, kIdOversize, kIdSequence, kIdBig };

int toInt(size_t v) { return static_cast<int>(v); }
size_t roundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

// The chunk the relay forwards in, whose boundaries the sizes straddle: the plugin's
// NCCL_MESH_RELAY_CHUNK when set (same K/M/G suffixes), else its default.
size_t relayChunk() {
  const char* v = getenv("NCCL_MESH_RELAY_CHUNK");
  if (v == nullptr || *v == '\0') return kDefaultChunk;
  size_t chunk = 0;
  if (!parseSize(v, &chunk) || chunk < 2 || chunk > kMaxChunk) {
    fail("NCCL_MESH_RELAY_CHUNK=%s: expected a size from 2 bytes to 256M (K/M/G suffixes)", v);
  }
  return chunk;
}

// Forwarding off is what makes a passing relay run mean the plugin forwarded.
void requireNoKernelForwarding() {
  const char* path = "/proc/sys/net/ipv4/ip_forward";
  std::ifstream in(path);
  std::string value;
  if (!(in >> value)) {
    fail("cannot read %s: the relay scenario must know that the kernel does not forward between "
         "the mesh links", path);
  }
  if (value != "0") {
    fail("%s reads '%s': the kernel routes IPv4 between the mesh links, so pairs without a cable "
         "could connect without the plugin's relay; set net.ipv4.ip_forward=0 on every node",
         path, value.c_str());
  }
}

// Whether the lab cables this rank to `peer` (-1: topology unknown).
int cabledTo(const Context& ctx, int peer) { return cabled(ctx, ctx.rank, peer); }

// The sequence phase's message m: 8..1031 bytes, its sequence number in the first 8.
int seqSize(int m) { return 8 + (m * 389) % 1024; }

struct Totals {
  long sent = 0, received = 0;           // messages (a grouped receive counts each buffer)
  size_t bytesSent = 0, bytesReceived = 0;
  double seconds = 0;                    // in the data phases
};

// One round: this rank's send comm to rank+r and receive comm from rank-r, a registered
// arena on each, and the phases (every rank runs the same phase at the same time).
class RelayRound {
 public:
  RelayRound(Context& ctx, CommTable& table, int round, size_t chunk, int messages, Totals& totals)
      : ctx_(ctx), round_(round), outPeer_(ctx.next(round)), inPeer_(ctx.prev(round)),
        sc_(table[outPeer_].send[0]), rc_(table[inPeer_].recv[0]), chunk_(chunk),
        slot_(roundUp(std::max<size_t>(chunk + 1, 65537) + kSlack + kGuard, 4096)),
        out_(arenaSize(messages)), in_(arenaSize(messages)),
        engine_(ctx, ctx.seed * 7919u + static_cast<unsigned>(ctx.rank * 131 + round)), totals_(totals) {
    mhOut_ = regHost(ctx, sc_, out_, arenaLabel(true));
    mhIn_ = regHost(ctx, rc_, in_, arenaLabel(false));
  }
  void release() {
    deregHost(ctx_, sc_, mhOut_, arenaLabel(true));
    deregHost(ctx_, rc_, mhIn_, arenaLabel(false));
  }

  // The first isend on a fresh comm, tried before the peer's receive exists, must return
  // ncclSuccess and a NULL request every time (NCCL's proxy retries it); once the receiver
  // posts (after the barrier) the same send goes through.
  void nullBeforePost() {
    Phase ph;
    ph.name = format("round %d: isend before the receiver posted", round_);
    const int size = 4096;
    send(ph, 0, size, 1, kIdNull, 0, "isend before irecv");
    for (int i = 0; i < kNullTries; ++i) {
      void* req = nullptr;
      ctx_.net.check(ctx_.net->isend(sc_, out_.data(), size, 1, mhOut_, &req), "isend",
                     ph.ops[0].label + " (before the receiver posted)");
      if (req != nullptr) {
        fail("%s: isend try %d of %d returned a request before rank %d posted any receive on this comm; "
             "the receiver drives the transfer, so it must be a NULL request",
             ph.ops[0].label.c_str(), i + 1, kNullTries, outPeer_);
      }
      // Spaced over ~100 ms (a few link round trips in the lab), so that a relay that
      // wrongly answers for the receiver has had the time to.
      pollPause(20000);
    }
    ctx_.barrier(format("relay-r%d-null-tried", round_));
    recv(ph, 0, size, size + kSlack, 1, kIdNull, 0, "irecv after the NULL isends");
    run(ph, false);
  }

  // Around the relay's chunk boundary; each in its own slot with its own tag.
  void sizes() {
    Phase ph;
    ph.name = format("round %d: sizes 0, 1, C-1, C, C+1 (C=%zu)", round_, chunk_);
    const int c = toInt(chunk_);
    const int kSizes[] = {0, 1, c - 1, c, c + 1};
    for (int i = 0; i < 5; ++i) {
      std::string what = format("size %d", kSizes[i]);
      send(ph, i * slot_, kSizes[i], 10 + i, kIdSizes, static_cast<uint64_t>(i), what);
      recv(ph, i * slot_, kSizes[i], kSizes[i] + kSlack, 10 + i, kIdSizes, static_cast<uint64_t>(i), what);
    }
    run(ph, true);
  }

  // One grouped receive of 8 tags (in a shuffled buffer order); the sender issues the 8
  // sends in another shuffled tag order. Each message must land in its tag's buffer, with
  // that buffer's size reported.
  void group() {
    Phase ph;
    ph.name = format("round %d: grouped receive of 8, sends in shuffled tag order", round_);
    const int base = 100;
    int sizes[kMaxGroup];
    Phase::GroupSide out{sc_, out_.data(), mhOut_, slot_, {}}, in{rc_, in_.data(), mhIn_, slot_, {}};
    for (int s = 0; s < kMaxGroup; ++s) {
      sizes[s] = groupSize(s);
      out.seeds[s] = patternSeed(ctx_.rank, outPeer_, kIdGroup, static_cast<uint64_t>(s), 0);
      in.seeds[s] = patternSeed(inPeer_, ctx_.rank, kIdGroup, static_cast<uint64_t>(s), 0);
    }
    std::vector<int> order = ph.addShuffledGroup(
        engine_.rng(), base, sizes, *std::max_element(sizes, sizes + kMaxGroup) + kSlack, out, in,
        [&](int s) { return label(format("group tag %d", base + s), true); }, label("group (n=8)", false), kGuard);
    std::string text;
    for (int tag : order) text += format("%s%d", text.empty() ? "" : ",", tag);
    say("relay round %d: group sends to rank %d in tag order %s", round_, outPeer_, text.c_str());
    run(ph, true);
  }

  // The sender sends more than the receiver posted: exactly the posted size lands and is
  // reported, and nothing is written after it (kGuard canary bytes). The second case cuts
  // inside the relay's second chunk.
  void oversize() {
    Phase ph;
    ph.name = format("round %d: oversize sends truncated", round_);
    const int c = toInt(chunk_);
    const int kCases[2][2] = {{3000, 1000}, {c + 1, c - 1}};  // {sent, posted}
    for (int k = 0; k < 2; ++k) {
      std::string what = format("oversize %d into %d", kCases[k][0], kCases[k][1]);
      send(ph, k * slot_, kCases[k][0], 40 + k, kIdOversize, static_cast<uint64_t>(k), what);
      recv(ph, k * slot_, kCases[k][0], kCases[k][1], 40 + k, kIdOversize, static_cast<uint64_t>(k), what);
    }
    run(ph, false);
  }

  // `messages` messages on one tag with `outstanding` requests at a time on each comm; each
  // carries its sequence number, and receive m must hold message m.
  void sequence(int messages, int outstanding) {
    std::string name = format("round %d: %d messages in order, %d outstanding", round_, messages, outstanding);
    setPhase("relay: " + name);
    std::vector<Op> ops;
    size_t bytes = 0;
    for (int m = 0; m < messages; ++m) {
      uint8_t* src = out_.data() + static_cast<size_t>(m) * kSeqSlice;
      uint64_t seq = static_cast<uint64_t>(m);
      memcpy(src, &seq, sizeof(seq));
      fillPattern(src + 8, static_cast<size_t>(seqSize(m) - 8), seqSeed(ctx_.rank, outPeer_, m));
      ops.push_back(sendOp(sc_, src, seqSize(m), kSeqTag, mhOut_, label(format("message %d", m), true)));
      bytes += static_cast<size_t>(seqSize(m));
    }
    for (int m = 0; m < messages; ++m) {
      uint8_t* dst = in_.data() + static_cast<size_t>(m) * kSeqSlice;
      memset(dst, kCanary, kSeqSlice);
      ops.push_back(recvOp(rc_, dst, kSeqCapacity, kSeqTag, mhIn_, label(format("message %d", m), false)));
    }
    EngineOptions opt;
    opt.window = outstanding;
    opt.shuffleTests = true;
    Clock::time_point t0 = Clock::now();
    engine_.run(ops, ctx_.deadline, opt);
    double seconds = secondsSince(t0);
    for (int m = 0; m < messages; ++m) {
      const Op& op = ops[static_cast<size_t>(messages + m)];
      const uint8_t* dst = static_cast<const uint8_t*>(op.data[0]);
      uint64_t seq = ~0ull;
      if (op.got[0] >= 8) memcpy(&seq, dst, sizeof(seq));
      if (seq != static_cast<uint64_t>(m)) {
        fail("%s: receive %d holds message %lld (%d bytes reported): messages out of order or lost",
             op.label.c_str(), m, static_cast<long long>(seq), op.got[0]);
      }
      if (op.got[0] != seqSize(m)) {
        fail("%s: test() reported %d bytes, message %d has %d", op.label.c_str(), op.got[0], m, seqSize(m));
      }
      std::string bad = checkPattern(dst + 8, static_cast<size_t>(seqSize(m) - 8), seqSeed(inPeer_, ctx_.rank, m));
      if (bad.empty()) bad = checkFill(dst + seqSize(m), static_cast<size_t>(kSeqSlice - seqSize(m)), kCanary);
      if (!bad.empty()) fail("%s: after its 8-byte sequence number: %s", op.label.c_str(), bad.c_str());
    }
    say("relay %s: %zu ops ok in %.3f s", name.c_str(), ops.size(), seconds);
    count(ops, bytes, bytes, seconds);  // the peer's sizes are this rank's sizes
  }

  // One message of `size` each way, in buffers of its own (registered for this only).
  void big(size_t size) {
    HostBuffer bigOut(size), bigIn(size + kGuard);
    void* mhOut = regHost(ctx_, sc_, bigOut, "relay big send buffer");
    void* mhIn = regHost(ctx_, rc_, bigIn, "relay big recv buffer");
    Phase ph;
    ph.name = format("round %d: one message of %zu bytes", round_, size);
    int n = toInt(size), tag = 90;
    uint8_t* dst = bigIn.data();
    uint64_t theirs = patternSeed(inPeer_, ctx_.rank, kIdBig, 0, 0);
    ph.addSend(sc_, bigOut.data(), n, tag, mhOut, patternSeed(ctx_.rank, outPeer_, kIdBig, 0, 0),
               label("big", true));
    ph.addRecv(rc_, 1, &dst, &n, &tag, mhIn, &n, &theirs, label("big", false), kGuard);
    run(ph, false);
    deregHost(ctx_, sc_, mhOut, "relay big send buffer");
    deregHost(ctx_, rc_, mhIn, "relay big recv buffer");
  }

  int outPeer() const { return outPeer_; }
  int inPeer() const { return inPeer_; }

 private:
  size_t arenaSize(int messages) const {
    return std::max(static_cast<size_t>(kMaxGroup) * slot_, static_cast<size_t>(messages) * kSeqSlice);
  }
  std::string arenaLabel(bool out) const {
    return format("relay round %d %s arena", round_, out ? "send" : "recv");
  }
  std::string label(const std::string& what, bool isSend) const {
    return format("relay round %d %s %s rank%d%srank%d", round_, what.c_str(), isSend ? "isend" : "irecv",
                  ctx_.rank, isSend ? "->" : "<-", isSend ? outPeer_ : inPeer_);
  }
  // The grouped receive's sizes by tag slot: both sides of the chunk boundary among small
  // ones.
  int groupSize(int slot) const {
    const int c = toInt(chunk_);
    const int kSizes[kMaxGroup] = {0, 1, 17, 4096, 333, c - 1, 65537, c + 1};
    return kSizes[slot];
  }
  static uint64_t seqSeed(int src, int dst, int m) {
    return patternSeed(src, dst, kIdSequence, static_cast<uint64_t>(m), 0);
  }
  // An isend to rank+r from out+off, and a receive from rank-r into in+off of `capacity`
  // bytes, the peer sending `size` bytes; patterns from (direction, id, a).
  void send(Phase& ph, size_t off, int size, int tag, uint64_t id, uint64_t a, const std::string& what) {
    ph.addSend(sc_, out_.data() + off, size, tag, mhOut_, patternSeed(ctx_.rank, outPeer_, id, a, 0),
               label(what, true));
  }
  void recv(Phase& ph, size_t off, int size, int capacity, int tag, uint64_t id, uint64_t a, const std::string& what) {
    uint8_t* dst = in_.data() + off;
    uint64_t seed = patternSeed(inPeer_, ctx_.rank, id, a, 0);
    ph.addRecv(rc_, 1, &dst, &capacity, &tag, mhIn_, &size, &seed, label(what, false), kGuard);
  }
  void run(Phase& ph, bool shuffle) {
    double seconds = runPhase(ctx_, engine_, ph, shuffle);
    size_t landed = 0;
    for (const Phase::Expect& e : ph.expects) landed += static_cast<size_t>(std::min(e.size, e.capacity));
    count(ph.ops, ph.bytes, landed, seconds);
  }
  void count(const std::vector<Op>& ops, size_t sentBytes, size_t receivedBytes, double seconds) {
    for (const Op& op : ops) (op.send ? totals_.sent : totals_.received) += op.send ? 1 : op.n;
    totals_.bytesSent += sentBytes;
    totals_.bytesReceived += receivedBytes;
    totals_.seconds += seconds;
  }

  Context& ctx_;
  int round_;
  int outPeer_, inPeer_;
  void* sc_;
  void* rc_;
  size_t chunk_;
  size_t slot_;  // one buffer of the sizes, group and oversize phases, its guard included
  HostBuffer out_, in_;
  void* mhOut_ = nullptr;
  void* mhIn_ = nullptr;
  Engine engine_;
  Totals& totals_;
};

// The text between `open` and `close` in `text` ("" when either is missing).
std::string between(const std::string& text, const std::string& open, const std::string& close) {
  size_t a = text.find(open);
  if (a == std::string::npos) return "";
  a += open.size();
  size_t b = text.find(close, a);
  return b == std::string::npos ? "" : text.substr(a, b - a);
}

// The process's one "relayed connections are slower" WARN names what its first relayed
// connection goes through: one relay, or both of a two-relay connection (its legs' own INFO
// lines name one relay each and are not the connection). The first is the one the plugin
// numbered 1 ("relayed connection 1 of this process"), not the first such line: two threads
// may log in either order. And this process counts only its own connections (`own`: one per
// peer without a cable): a relay that forwards another node's connection through a further
// relay (a path of several relays) logs that hop apart. Returns what the WARN named.
std::string checkFirstRelayedWarn(Context& ctx, size_t mark, int own) {
  std::string warned, first;
  int warns = 0, counted = 0;
  for (const LogLine& l : ctx.net.logSince(mark)) {
    const std::string& t = l.text;
    if (t.find("relayed connections are slower") != std::string::npos) {
      ++warns;
      warned = between(t, " goes through ", " (no cable to it)");
    }
    if (t.find(" of this process") == std::string::npos || t.find("relayed connection ") == std::string::npos) continue;
    ++counted;
    if (t.find("relayed connection 1 of this process") == std::string::npos) continue;
    first = t.find("(two relays)") != std::string::npos ? between(t, " goes through ", " (two relays)")
                                                         : between(t, " via ", " (");
  }
  if (counted != own) {
    fail("relay: %d relayed connections counted by this process for its %d connects without a cable (a relay's hop "
         "for another node's connection counted as this process's?)", counted, own);
  }
  if (warns != 1 || warned.empty() || warned != first) {
    fail("relay: %d 'relayed connections are slower' WARNs naming '%s'; the first relayed connection goes through "
         "'%s' (expected one WARN naming it)", warns, warned.c_str(), first.c_str());
  }
  return warned;
}

// Every pair's comms at once, as NCCL opens them at init. On a ring or a line without the
// relay, a pair without a cable fails here with the plugin's routing error; the hint says
// which setting is missing.
CommTable connectAll(Context& ctx, const std::vector<int>& peers) {
  try {
    return establish(ctx, {peers, peers, 1, "relay"}, ctx.deadline);
  } catch (const Failure& e) {
    const char* relay = getenv("NCCL_MESH_RELAY");
    fail("%s [topology '%s', NCCL_MESH_RELAY=%s: pairs without a cable connect only through the relay]", e.what(),
         ctx.topology.c_str(), relay != nullptr ? relay : "(unset)");
  }
}

// /sys/class/net/<dev>/statistics/<name>: bytes the netdev moved, frame headers included.
long long netdevBytes(const std::string& dev, const char* name) {
  std::string path = format("/sys/class/net/%s/statistics/%s", dev.c_str(), name);
  std::ifstream in(path);
  long long v = -1;
  if (!(in >> v)) {
    fail("--check-relay-netdevs: cannot read %s (the relay's netdev towards a neighbour, named p<rank> as "
         "vmesh names it, one cable per pair)", path.c_str());
  }
  return v;
}

// Issue 15: "B's two netdevs carried the relayed bytes". rxe is UDP in the guest kernel, so a
// relayed byte crosses B's netdev from A (rx) and B's netdev to C (tx) whoever forwards it;
// with ip_forward 0 (checked first) only the plugin can have. Rank 0 sends `size` bytes to
// rank 2 (no cable between them) on the comm round 2 used, while no other comm moves; every
// rank cabled to both (rank 1; on a 4-ring also rank 3: the route service picks one) reads
// its p0 rx_bytes and p2 tx_bytes around it, and one of them must have carried >= `size` on
// both. The userspace fabric moves bytes over shared memory, not its veths: lab only.
std::string checkRelayNetdevs(Context& ctx, CommTable& table, size_t size) {
  const int a = 0, c = 2;
  if (getenv("MESHFAB_DIR") != nullptr) {
    // Measured: a 4-ring relay run moving 64 MiB per relayed pair left ~5 KB on the relay's
    // veths (route HELLOs, handshakes); the fabric's packets never touch them.
    fail("--check-relay-netdevs runs in the QEMU lab only: the userspace fabric (MESHFAB_DIR is set) moves RDMA "
         "bytes over shared memory, not over its veths, whose counters see only the control plane");
  }
  if (cabled(ctx, a, c) != 0) {
    fail("--check-relay-netdevs needs ranks 0 and 2 without a cable between them (a ring of 4 or more nodes "
         "or a line of 3 or more); topology '%s' with %d nodes", ctx.topology.c_str(), ctx.nodes);
  }
  std::vector<int> relays;
  for (int r = 0; r < ctx.nodes; ++r) {
    if (r != a && r != c && cabled(ctx, r, a) == 1 && cabled(ctx, r, c) == 1) relays.push_back(r);
  }
  const bool relay = std::find(relays.begin(), relays.end(), ctx.rank) != relays.end();
  const std::string fromA = format("p%d", a), toC = format("p%d", c);
  long long rx0 = 0, tx0 = 0;
  if (relay) rx0 = netdevBytes(fromA, "rx_bytes"), tx0 = netdevBytes(toC, "tx_bytes");
  setPhase(format("relay: netdev check, %zu bytes rank%d->rank%d", size, a, c));
  ctx.barrier("relay-netdevs-before");  // every relay candidate has its counters before a byte moves
  if (ctx.rank == a || ctx.rank == c) {
    const bool sender = ctx.rank == a;
    void* comm = sender ? table[c].send[0] : table[a].recv[0];
    HostBuffer buf(size + kGuard);
    void* mh = regHost(ctx, comm, buf, "relay netdev-check buffer");
    Phase ph;
    ph.name = "netdev check: one relayed message";
    int n = toInt(size), tag = 95;
    uint64_t seed = patternSeed(a, c, kIdBig, 1, 0);
    uint8_t* dst = buf.data();
    if (sender) ph.addSend(comm, buf.data(), n, tag, mh, seed, format("netdev check isend rank%d->rank%d", a, c));
    if (!sender) ph.addRecv(comm, 1, &dst, &n, &tag, mh, &n, &seed, format("netdev check irecv rank%d<-rank%d", c, a), kGuard);
    Engine engine(ctx, ctx.seed);
    runPhase(ctx, engine, ph, false);
    deregHost(ctx, comm, mh, "relay netdev-check buffer");
  }
  ctx.barrier("relay-netdevs-after");
  if (relay) {
    long long rx = netdevBytes(fromA, "rx_bytes") - rx0, tx = netdevBytes(toC, "tx_bytes") - tx0;
    say("relay netdevs: %s rx_bytes +%lld, %s tx_bytes +%lld while %zu bytes went rank%d->rank%d", fromA.c_str(), rx,
        toC.c_str(), tx, size, a, c);
    ctx.rv->publish(format("netdevs.%d", ctx.rank), format("%lld %lld", rx, tx));
  }
  std::string seen, carried;
  for (int r : relays) {
    std::string text = ctx.rv->fetch(format("netdevs.%d", r), ctx.deadline, format("rank %d's netdev counts", r));
    long long rx = -1, tx = -1;
    if (sscanf(text.c_str(), "%lld %lld", &rx, &tx) != 2) fail("rank %d published netdev counts '%s'", r, text.c_str());
    seen += format("%srank%d: %s rx +%lld, %s tx +%lld", seen.empty() ? "" : "; ", r, fromA.c_str(), rx, toC.c_str(), tx);
    if (rx >= static_cast<long long>(size) && tx >= static_cast<long long>(size) && carried.empty()) {
      carried = format("rank%d:%s_rx+%lld,%s_tx+%lld", r, fromA.c_str(), rx, toC.c_str(), tx);
    }
  }
  if (carried.empty()) {
    fail("%zu bytes went rank%d->rank%d (no cable), but no rank between them carried them on both its netdevs (%s); "
         "the relay did not forward them, or something other than rxe moved them", size, a, c, seen.c_str());
  }
  return carried;
}

}  // namespace

std::string runRelay(Context& ctx) {
  requireNodes(ctx, 0);
  requireNoKernelForwarding();
  size_t chunk = relayChunk();
  long messages = ctx.opts.integer("messages", 1000);
  long outstanding = ctx.opts.integer("outstanding", kMaxRequests);
  long big = ctx.opts.integer("big", 64L << 20);
  const bool checkNetdevs = ctx.opts.has("check-relay-netdevs");
  const long netdevSize = ctx.opts.integer("netdev-bytes", 4L << 20);
  if (netdevSize < 1 || netdevSize > (1L << 30)) fail("--netdev-bytes %ld: expected 1 .. 1G", netdevSize);
  if (messages < 1 || messages > 100000) fail("--messages %ld: expected 1 .. 100000", messages);
  if (outstanding < 1 || outstanding > kMaxRequests) {
    fail("--outstanding %ld: expected 1 .. %d (requests per comm)", outstanding, kMaxRequests);
  }
  if (big < 0 || big > (1L << 30)) fail("--big %ld: expected 0 .. 1G (ncclNet v8 sizes are int)", big);
  const bool patterns = ctx.opts.has("patterns");
  PatternOptions patternOpts;
  if (patterns) patternOpts = patternOptions(ctx);

  std::vector<int> peers = otherRanks(ctx);
  int uncabled = 0;
  for (int p : peers) uncabled += cabledTo(ctx, p) == 0 ? 1 : 0;
  say("relay: %zu peers, %d without a cable (topology '%s'), chunk %zu, ip_forward 0", peers.size(), uncabled,
      ctx.topology.c_str(), chunk);
  Clock::time_point t0 = Clock::now();
  size_t mark = ctx.net.logSize();
  CommTable table = connectAll(ctx, peers);
  double upSeconds = secondsSince(t0);
  if (uncabled > 0) say("relay: the first relayed connection's WARN names %s", checkFirstRelayedWarn(ctx, mark, uncabled).c_str());
  // --twins N (NCCL_MESH_RELAY_TWIN=1): N of this rank's relayed connections went over two
  // relays and N of its relayed receives were accepted as two legs (the plugin's INFO lines).
  if (ctx.opts.has("twins")) {
    long want = ctx.opts.integer("twins", 0);
    int sent = countLog(ctx, mark, "(two relays)");
    int accepted = countLog(ctx, mark, "accepted a two-relay connection");
    int fellBack = countLog(ctx, mark, "goes through one relay");
    // --fallbacks M: M connects fell back to one relay (a leg that did not come up).
    long wantFallbacks = ctx.opts.integer("fallbacks", 0);
    // A fallback's line names the relay whose leg did not come up ("leg 2 (via ?)" once).
    int unnamed = countLog(ctx, mark, "(via ?)");
    if (unnamed > 0) fail("--twins %ld: %d relay log lines name no relay ('(via ?)')", want, unnamed);
    if (sent != want || accepted != want || fellBack != wantFallbacks) {
      fail("--twins %ld: %d relayed connects went over two relays, %d receives were accepted as two legs and "
           "%d connects fell back to one relay (expected %ld, %ld and %ld)", want, sent, accepted, fellBack, want, want,
           wantFallbacks);
    }
    say("relay: %d connects over two relays, %d accepted as two legs, %d fell back to one relay", sent, accepted,
        fellBack);
  }
  ctx.barrier("relay-up");
  say("relay: %zu send + %zu recv comms up in %.2f s", peers.size(), peers.size(), upSeconds);

  Totals totals;
  for (int r = 1; r < ctx.nodes; ++r) {
    Clock::time_point roundStart = Clock::now();
    RelayRound round(ctx, table, r, chunk, static_cast<int>(messages), totals);
    round.nullBeforePost();
    round.sizes();
    round.group();
    round.oversize();
    round.sequence(static_cast<int>(messages), static_cast<int>(outstanding));
    if (big > 0) round.big(static_cast<size_t>(big));
    round.release();
    say("relay round %d: rank%d->rank%d%s and rank%d->rank%d%s done in %.2f s", r, ctx.rank, round.outPeer(),
        cabledTo(ctx, round.outPeer()) == 0 ? " (no cable)" : "", round.inPeer(), ctx.rank,
        cabledTo(ctx, round.inPeer()) == 0 ? " (no cable)" : "", secondsSince(roundStart));
    ctx.barrier(format("relay-round-%d", r));
  }
  std::string netdevs;
  if (checkNetdevs) netdevs = " relay_netdevs=" + checkRelayNetdevs(ctx, table, static_cast<size_t>(netdevSize));
  if (patterns) netdevs += " " + runPatternsOn(ctx, table, patternOpts);
  closeAll(ctx, table);
  int pairs = ctx.nodes * (ctx.nodes - 1);
  return format("api=v%d topology=%s pairs=%d (this rank: %zu out, %zu in, %d without a cable) chunk=%zu "
                "messages=%ld sent/%ld received bytes=%s sent/%s received data_s=%.2f connect_s=%.2f "
                "big=%ld sequence=%ldx%ld ip_forward=0%s",
                ctx.api, ctx.topology.empty() ? "?" : ctx.topology.c_str(), pairs, peers.size(), peers.size(),
                uncabled, chunk, totals.sent, totals.received,
                humanBytes(static_cast<double>(totals.bytesSent)).c_str(),
                humanBytes(static_cast<double>(totals.bytesReceived)).c_str(), totals.seconds, upSeconds, big,
                messages, outstanding, netdevs.c_str());
}

}  // namespace e2e
