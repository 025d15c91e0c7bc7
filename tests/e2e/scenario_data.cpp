// SPDX-License-Identifier: Apache-2.0
// Data scenarios between two ranks: every size and receive shape NCCL uses, checked byte
// for byte (pair), and striping over parallel links checked on the NIC counters (links).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "comm_setup.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

// Sizes of the 32-outstanding phase and of the grouped phase, indexed by message/tag.
int windowSize(int m) {
  static const int kSizes[] = {0, 1, 7, 100, 4096, 4097, 65536, 12345};
  return kSizes[m % 8] + (m / 8) * 3;  // all different, all <= 65536 + 9
}
int groupSize(int group, int slot) {
  static const int kSizes[] = {0, 1, 4096, 65536, 333, 8191, 50000, 17};
  return kSizes[(slot + group) % 8];
}

// The pair scenario's state: one send comm and one recv comm with the peer, a registered
// arena on each, and the phases (each rank runs the same phases at the same time).
class PairTest {
 public:
  PairTest(Context& ctx, void* sendComm, void* recvComm, size_t arena)
      : ctx_(ctx), peer_(1 - ctx.rank), sc_(sendComm), rc_(recvComm), out_(arena), in_(arena),
        engine_(ctx, ctx.seed * 7919u + static_cast<unsigned>(ctx.rank)) {
    mhOut_ = regHost(ctx, sc_, out_, "pair send arena");
    mhIn_ = regHost(ctx, rc_, in_, "pair recv arena");
  }
  void release() {
    deregHost(ctx_, sc_, mhOut_, "pair send arena");
    deregHost(ctx_, rc_, mhIn_, "pair recv arena");
  }

  // Every size, exact-size receives (odd iterations at an odd offset).
  void sizes(int iters) {
    const int kSizes[] = {0, 1, 7, 4096, 65537, (1 << 20) + 13};
    for (int it = 0; it < iters; ++it) {
      for (int size : kSizes) {
        Phase ph;
        ph.name = format("size %d iteration %d", size, it);
        size_t off = (it % 2) ? 13 : 0;
        oneEach(ph, off, size, size, 1, 1, static_cast<uint64_t>(size), static_cast<uint64_t>(it),
                ph.name.c_str(), 0);
        run(ph, false);
      }
    }
  }

  // 32 sends and 32 receives outstanding; test() polled in a shuffled order.
  void window() {
    Phase ph;
    ph.name = "32 outstanding";
    for (int m = 0; m < kMaxRequests; ++m) {
      oneEach(ph, static_cast<size_t>(m) * kSlot, windowSize(m), 65536 + 64, m, 2,
              static_cast<uint64_t>(m), 0, "window", m);
    }
    run(ph, true);
  }

  // Grouped receives of 8: the receiver's tag order and the sender's are both shuffled;
  // each message must land in the buffer of its tag.
  void group(int g) {
    Phase ph;
    ph.name = format("group %d of 8", g);
    int sizes[kMaxGroup];
    Phase::GroupSide out{sc_, out_.data(), mhOut_, kSlot, {}}, in{rc_, in_.data(), mhIn_, kSlot, {}};
    for (int s = 0; s < kMaxGroup; ++s) {
      sizes[s] = groupSize(g, s);
      out.seeds[s] = patternSeed(ctx_.rank, peer_, 3, static_cast<uint64_t>(g), static_cast<uint64_t>(s));
      in.seeds[s] = patternSeed(peer_, ctx_.rank, 3, static_cast<uint64_t>(g), static_cast<uint64_t>(s));
    }
    ph.addShuffledGroup(
        engine_.rng(), 100 + g * kMaxGroup, sizes, 65536, out, in,
        [&](int s) { return label(format("group %d tag %d", g, 100 + g * kMaxGroup + s).c_str(), s, true); },
        label(format("group %d (n=8)", g).c_str(), 0, false));
    run(ph, true);
  }

  // Short sends into larger buffers: the reported size is the sent size.
  void shortSends() {
    Phase ph;
    ph.name = "short sends";
    const int kShort[] = {100, 0, 4095, 1, 65535};
    for (int m = 0; m < 5; ++m) {
      oneEach(ph, static_cast<size_t>(m) * kSlot, kShort[m], 65536, 50 + m, 4, static_cast<uint64_t>(m), 0,
              "short", m);
    }
    run(ph, true);
  }

  // One message of `size` each way into a buffer kBigSlack larger; with a small
  // NCCL_MESH_CHUNK_SIZE the plugin posts it as many work requests.
  void big(size_t size) {
    Phase ph;
    ph.name = format("big %zu bytes", size);
    oneEach(ph, 0, static_cast<int>(size), static_cast<int>(size + kBigSlack), 60, 5, size, 0, "big", 0);
    run(ph, false);
  }

  double seconds() const { return seconds_; }
  long flushes() const { return engine_.flushes(); }
  size_t bytes() const { return bytes_; }

  static constexpr size_t kArena = 4u << 20;
  static constexpr size_t kBigSlack = 4096;

 private:
  static constexpr size_t kSlot = 65600;  // > 64 KiB + 64: slots never overlap

  std::string label(const char* what, int i, bool send) const {
    return format("pair %s #%d %s rank%d%srank%d", what, i, send ? "isend" : "irecv", ctx_.rank,
                  send ? "->" : "<-", peer_);
  }
  // One send of `size` from out+off and one receive of up to `cap` into in+off, same tag;
  // patterns from (phase id, a, b) and the direction.
  void oneEach(Phase& ph, size_t off, int size, int cap, int tag, uint64_t id, uint64_t a, uint64_t b,
               const char* what, int i) {
    ph.addSend(sc_, out_.data() + off, size, tag, mhOut_, patternSeed(ctx_.rank, peer_, id, a, b),
               label(what, i, true));
    uint8_t* dst = in_.data() + off;
    uint64_t theirs = patternSeed(peer_, ctx_.rank, id, a, b);
    ph.addRecv(rc_, 1, &dst, &cap, &tag, mhIn_, &size, &theirs, label(what, i, false));
  }
  void run(Phase& ph, bool shuffle) {
    seconds_ += runPhase(ctx_, engine_, ph, shuffle);
    bytes_ += ph.bytes;
  }

  Context& ctx_;
  int peer_;
  void* sc_;
  void* rc_;
  HostBuffer out_, in_;
  void* mhOut_ = nullptr;
  void* mhIn_ = nullptr;
  Engine engine_;
  double seconds_ = 0;
  size_t bytes_ = 0;
};

// The value the plugin logged for setting `name` on its "settings:" INFO line(s) ("" if none).
std::string pluginSetting(Context& ctx, const std::string& name) {
  for (const LogLine& l : ctx.net.logSince(0)) {
    size_t at = l.text.find(" " + name + "=");
    bool settings = l.text.find("settings:") != std::string::npos || l.text.find("settings (") != std::string::npos;
    if (!settings || at == std::string::npos) continue;
    size_t from = at + name.size() + 2;
    return l.text.substr(from, l.text.find(' ', from) - from);
  }
  return std::string();
}

// The big message is there to be split: the chunk size this rank's environment sets must
// be the one the plugin uses (vmesh passes NCCL_* to the guests). Returns the plugin's.
std::string checkChunkSize(Context& ctx) {
  std::string used = pluginSetting(ctx, "NCCL_MESH_CHUNK_SIZE");
  const char* wanted = getenv("NCCL_MESH_CHUNK_SIZE");
  size_t a = 0, b = 0;
  if (wanted != nullptr && (!parseSize(wanted, &a) || !parseSize(used, &b) || a != b)) {
    fail("NCCL_MESH_CHUNK_SIZE=%s in this rank's environment, but the plugin's settings line says '%s'",
         wanted, used.c_str());
  }
  return used.empty() ? "?" : used;
}

}  // namespace

// 2 nodes, both directions at once (each rank sends on its send comm and receives on its
// recv comm): sizes 0..1 MiB+13, 32 outstanding with test() in a shuffled order, grouped
// receives of 8 with shuffled tags, short sends into larger buffers; with --big SIZE,
// one SIZE-byte message each way last.
std::string runPair(Context& ctx) {
  requireNodes(ctx, 2);
  int iters = static_cast<int>(ctx.opts.integer("iters", 2));
  int groups = static_cast<int>(ctx.opts.integer("groups", 4));
  size_t big = 0;
  if (!parseSize(ctx.opts.str("big", "0"), &big) || big > (size_t{1} << 30)) {
    fail("--big %s: expected a size up to 1G (bytes, K/M/G suffixes)", ctx.opts.str("big", "").c_str());
  }
  std::string chunk = big > 0 ? checkChunkSize(ctx) : "";
  int peer = 1 - ctx.rank;
  size_t mark = ctx.net.logSize();
  CommTable t = establish(ctx, {{peer}, {peer}, 1, "pair"}, ctx.deadline);
  RouteReport route = checkRouting(ctx, mark, {peer});
  requireConnLines(route, {peer}, 1);
  // A flush is an RDMA READ: on the fabric, count the READs this node executed (the flush's
  // loopback READ is served here), so that a flush request that completes without reading
  // fails the test.
  long readsBefore = fabricNodeCounter("executed_reads");
  size_t arena = std::max(PairTest::kArena, big + PairTest::kBigSlack);
  PairTest test(ctx, t[peer].send[0], t[peer].recv[0], arena);
  test.sizes(iters);
  test.window();
  for (int g = 0; g < groups; ++g) test.group(g);
  test.shortSends();
  if (big > 0) test.big(big);
  ctx.barrier("pair-done");
  test.release();
  closeAll(ctx, t);
  long reads = readsBefore >= 0 ? fabricNodeCounter("executed_reads") - readsBefore : -1;
  if (test.flushes() > 0 && reads >= 0) {
    setPhase("counting the flushes' READs");
    if (reads < test.flushes()) {
      fail("%ld flushes completed, but the fabric executed %ld RDMA READs on this node", test.flushes(), reads);
    }
  }
  std::string bigText = big > 0 ? format(", big %zu B with chunk size %s", big, chunk.c_str()) : "";
  std::string flushText = test.flushes() > 0 ? format(", %ld flushes", test.flushes()) : "";
  if (test.flushes() > 0 && reads >= 0) flushText += format(" (%ld READs executed)", reads);
  return format("api=v%d sent=%s in %.2f s (sizes x%d, 32 outstanding, %d groups of 8, short sends%s%s) "
                "route=[%s]",
                ctx.api, humanBytes(static_cast<double>(test.bytes())).c_str(), test.seconds(), iters, groups,
                bigText.c_str(), flushText.c_str(), route.describe().c_str());
}

namespace {

// Soft-RoCE packet counters of the devices cabled to one peer, before and after.
class LinkCounters {
 public:
  explicit LinkCounters(int peer) : devs_(labDevicesTowards(peer)) {
    if (devs_.size() < 2) {
      std::string list;
      for (const std::string& d : devs_) list += " " + d;
      fail("links needs two cables to rank %d (vmesh run --links 2); found RDMA devices:%s", peer,
           list.empty() ? " none" : list.c_str());
    }
    for (const std::string& d : devs_) {
      before_.push_back(read(d));
      if (before_.back().sent < 0 || before_.back().rcvd < 0) {
        fail("cannot read /sys/class/infiniband/%s/ports/1/hw_counters/{sent,rcvd}_pkts", d.c_str());
      }
    }
  }

  // Prints before/after per device; returns what is wrong ("" if every device carried
  // traffic both ways and at least minShare of `dataPackets` in the data direction).
  std::string report(bool sender, double dataPackets, double minShare, std::string* table) const {
    std::string problems;
    for (size_t i = 0; i < devs_.size(); ++i) {
      Counters after = read(devs_[i]);
      long ds = after.sent - before_[i].sent, dr = after.rcvd - before_[i].rcvd;
      say("links: %-10s sent_pkts %ld -> %ld (+%ld)  rcvd_pkts %ld -> %ld (+%ld)", devs_[i].c_str(),
          before_[i].sent, after.sent, ds, before_[i].rcvd, after.rcvd, dr);
      *table += format("%s%s:+%ld/+%ld", table->empty() ? "" : " ", devs_[i].c_str(), ds, dr);
      if (ds <= 0 || dr <= 0) {
        problems += format(" %s carried nothing in one direction (sent +%ld, rcvd +%ld);", devs_[i].c_str(), ds, dr);
      }
      long data = sender ? ds : dr;  // data packets, on the side that counts them
      if (data < minShare * dataPackets) {
        problems += format(" %s carried %ld data packets, below %.0f%% of the ~%.0f the transfer needs;",
                           devs_[i].c_str(), data, minShare * 100, dataPackets);
      }
    }
    return problems;
  }

 private:
  struct Counters {
    long sent, rcvd;
  };
  static Counters read(const std::string& d) {
    return Counters{readPortCounter(d, 1, "sent_pkts"), readPortCounter(d, 1, "rcvd_pkts")};
  }
  std::vector<std::string> devs_;
  std::vector<Counters> before_;
};

}  // namespace

// 2 nodes cabled twice (vmesh --links 2): a --size (4 MiB) transfer rank 0 -> rank 1 must
// move packets over both rxe devices on both sides, and the conn lines must name both.
std::string runLinks(Context& ctx) {
  requireNodes(ctx, 2);
  long size = ctx.opts.integer("size", 4 << 20);
  double minShare = ctx.opts.real("min-share", 0.10);
  if (size < 1 || size > (1L << 30)) fail("--size must be 1 .. 1 GiB");
  int peer = 1 - ctx.rank;
  LinkCounters counters(peer);
  size_t mark = ctx.net.logSize();
  bool sender = ctx.rank == 0;
  std::vector<int> none, other = {peer};
  CommTable t = establish(ctx, {sender ? other : none, sender ? none : other, 1, "links"}, ctx.deadline);
  void* comm = sender ? t[peer].send[0] : t[peer].recv[0];
  HostBuffer buf(static_cast<size_t>(size));
  uint64_t seed = patternSeed(0, 1, 5, static_cast<uint64_t>(size), 0);
  if (sender) fillPattern(buf.data(), buf.size(), seed);
  void* mh = regHost(ctx, comm, buf, "links buffer");
  std::vector<Op> ops;
  ops.push_back(sender ? sendOp(comm, buf.data(), static_cast<int>(size), 9, mh, "links isend rank0->rank1")
                       : recvOp(comm, buf.data(), static_cast<int>(size), 9, mh, "links irecv rank1<-rank0"));
  setPhase(format("links: %s %ld bytes", sender ? "sending" : "receiving", size));
  Clock::time_point t0 = Clock::now();
  Engine(ctx, ctx.seed).run(ops, ctx.deadline);
  double seconds = secondsSince(t0);
  if (!sender) {
    if (ops[0].got[0] != size) fail("links: received %d bytes, expected %ld", ops[0].got[0], size);
    std::string bad = checkPattern(buf.data(), buf.size(), seed);
    if (!bad.empty()) fail("links: data from rank 0 corrupt: %s", bad.c_str());
  }
  ctx.barrier("links-moved");

  RouteReport route = checkRouting(ctx, mark, {peer});
  say("links: conn lines: %s", route.describe().c_str());
  if (route.netdevs[peer].size() < 2) {
    fail("links: the conn lines name %zu local netdev(s) towards rank %d (%s); with two cables the "
         "plugin must connect (and log) one per link", route.netdevs[peer].size(), peer,
         route.describe().c_str());
  }
  int mtu = route.mtu[peer] > 0 ? route.mtu[peer] : 4096;
  std::string table;
  std::string problems = counters.report(sender, static_cast<double>(size) / mtu, minShare, &table);
  deregHost(ctx, comm, mh, "links buffer");
  closeAll(ctx, t);
  std::string figures = format("size=%ld seconds=%.3f MBps=%.1f counters(sent/rcvd)=[%s]", size, seconds,
                               size / seconds / 1048576.0, table.c_str());
  if (!problems.empty()) fail("links: not striped over both cables:%s (%s)", problems.c_str(), figures.c_str());
  return figures;
}

}  // namespace e2e
