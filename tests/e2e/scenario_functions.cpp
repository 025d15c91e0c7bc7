// SPDX-License-Identifier: Apache-2.0
// Both functions of a cable (issue "Spark-ready"): every cable end is two RDMA devices on one
// wire (scripts/fabric-net --functions 2, both in the cable's subnet or each in its own). Every
// rank sends to each neighbour and receives from it, messages below and above the split size,
// data checked; then, per cable, the fabric's per-device byte counters must show every function
// of this end carrying an equal share (within --tolerance) in both directions.
#include <algorithm>
#include <cmath>

#include "comm_setup.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

struct DeviceBytes {
  std::string dev;
  long sent = 0, rcvd = 0;
};

std::vector<DeviceBytes> readBytes(const std::vector<std::string>& devs) {
  std::vector<DeviceBytes> out;
  for (const std::string& d : devs) {
    DeviceBytes b;
    b.dev = d;
    b.sent = readPortCounter(d, 1, "sent_bytes");
    b.rcvd = readPortCounter(d, 1, "rcvd_bytes");
    if (b.sent < 0 || b.rcvd < 0) fail("cannot read %s's sent_bytes/rcvd_bytes (needs the fabric's stats)", d.c_str());
    out.push_back(b);
  }
  return out;
}

// What is wrong with one direction's shares ("" if each is within tolerance of 1/k).
std::string shareProblems(const char* what, const std::vector<long>& bytes, double tolerance, std::string* table) {
  long total = 0;
  for (long b : bytes) total += b;
  std::string problems;
  double fair = 1.0 / static_cast<double>(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    double share = total > 0 ? static_cast<double>(bytes[i]) / static_cast<double>(total) : 0;
    *table += format(" %s[%zu]=%.3f", what, i, share);
    if (std::fabs(share - fair) > tolerance * fair) {
      problems += format(" %s share of function %zu is %.3f, not %.3f +- %.0f%%;", what, i, share, fair,
                         tolerance * 100);
    }
  }
  return problems;
}

std::vector<Op> exchangeOps(Context& ctx, const CommTable& t, std::vector<int> peers, HostBuffer& out,
                            HostBuffer& in, const std::vector<size_t>& sizes, int perSize,
                            std::vector<void*>* mhs) {
  std::vector<Op> ops;
  if (peers.empty()) return ops;  // a relay (--relayed) only forwards
  size_t stride = out.size() / peers.size();
  for (size_t p = 0; p < peers.size(); ++p) {
    int peer = peers[p];
    void* sc = t.at(peer).send[0];
    void* rc = t.at(peer).recv[0];
    uint8_t* o = out.data() + p * stride;
    uint8_t* i = in.data() + p * stride;
    mhs->push_back(regHost(ctx, sc, out, format("functions out -> %d", peer)));
    mhs->push_back(regHost(ctx, rc, in, format("functions in <- %d", peer)));
    void* mhOut = (*mhs)[mhs->size() - 2];
    void* mhIn = mhs->back();
    size_t off = 0;
    int tag = 0;
    for (size_t size : sizes) {
      for (int k = 0; k < perSize; ++k, ++tag, off += size) {
        ops.push_back(sendOp(sc, o + off, static_cast<int>(size), tag, mhOut,
                             format("functions isend %d->%d #%d", ctx.rank, peer, tag)));
        ops.push_back(recvOp(rc, i + off, static_cast<int>(size), tag, mhIn,
                             format("functions irecv %d<-%d #%d", ctx.rank, peer, tag)));
      }
    }
  }
  return ops;
}

}  // namespace

// --relayed (a 4-node ring, NCCL_MESH_RELAY=auto): ranks 0 and 2, which no cable joins,
// exchange through a relay, and every cable that carried the relayed stream (both legs: at
// the ends and at the relay) must show each of its functions with an equal share. Ranks 1
// and 3 only relay; at least one of them must have carried the stream on both its cables.
std::string runFunctions(Context& ctx) {
  requireNodes(ctx, 0);
  double tolerance = ctx.opts.real("tolerance", 0.10);
  int perSize = static_cast<int>(ctx.opts.integer("count", 24));
  bool relayed = ctx.opts.has("relayed");
  const std::vector<size_t> sizes = {4096, 65536, 1 << 20};
  std::vector<int> peers = {ctx.next()};
  if (ctx.nodes > 2 && ctx.prev() != ctx.next()) peers.push_back(ctx.prev());
  std::sort(peers.begin(), peers.end());
  std::vector<int> cables = peers;  // the neighbours whose cables are counted
  if (relayed) {
    if (ctx.nodes != 4 || ctx.topology != "ring") fail("functions --relayed needs a 4-node ring (--topology ring)");
    peers.clear();
    if (ctx.rank % 2 == 0) peers.push_back(ctx.next(2));
  }
  std::map<int, std::vector<std::string>> devs;
  std::map<int, std::vector<DeviceBytes>> before;
  for (int peer : cables) {
    devs[peer] = labDevicesTowards(peer);
    if (devs[peer].size() < 2) {
      fail("functions needs two devices per cable end towards rank %d (scripts/fabric-net --functions 2); found %zu",
           peer, devs[peer].size());
    }
    before[peer] = readBytes(devs[peer]);
  }
  size_t perPeer = 0;
  for (size_t s : sizes) perPeer += s * static_cast<size_t>(perSize);
  HostBuffer out(perPeer * peers.size()), in(perPeer * peers.size());
  for (size_t p = 0; p < peers.size(); ++p) {
    fillPattern(out.data() + p * perPeer, perPeer, patternSeed(ctx.rank, peers[p], 11, perPeer, 0));
  }
  size_t mark = ctx.net.logSize();
  CommTable t = establish(ctx, {peers, peers, 1, "functions"}, ctx.deadline);
  std::vector<void*> mhs;
  std::vector<Op> ops = exchangeOps(ctx, t, peers, out, in, sizes, perSize, &mhs);
  setPhase("functions: exchanging with every neighbour");
  Clock::time_point t0 = Clock::now();
  Engine(ctx, ctx.seed).run(ops, ctx.deadline);
  double seconds = secondsSince(t0);
  for (size_t p = 0; p < peers.size(); ++p) {
    std::string bad = checkPattern(in.data() + p * perPeer, perPeer, patternSeed(peers[p], ctx.rank, 11, perPeer, 0));
    if (!bad.empty()) fail("functions: data from rank %d corrupt: %s", peers[p], bad.c_str());
  }
  ctx.barrier("functions-moved");
  std::string routeText = "relayed";
  if (!relayed) routeText = checkRouting(ctx, mark, std::set<int>(peers.begin(), peers.end())).describe();
  std::string table, problems;
  int busyCables = 0;
  for (int peer : cables) {
    std::vector<DeviceBytes> after = readBytes(devs[peer]);
    std::vector<long> sent, rcvd;
    long sentSum = 0, rcvdSum = 0;
    table += format(" peer%d:", peer);
    for (size_t i = 0; i < after.size(); ++i) {
      sent.push_back(after[i].sent - before[peer][i].sent);
      rcvd.push_back(after[i].rcvd - before[peer][i].rcvd);
      sentSum += sent.back();
      rcvdSum += rcvd.back();
      table += format(" %s=+%ld/+%ld", after[i].dev.c_str(), sent.back(), rcvd.back());
    }
    // Relayed: a cable direction the stream did not take carries only control traffic (the
    // route plan sends 0 -> 2 and 2 -> 0 through different relays on a 4-ring).
    bool sentData = !relayed || sentSum >= static_cast<long>(perPeer / 2);
    bool rcvdData = !relayed || rcvdSum >= static_cast<long>(perPeer / 2);
    if (!sentData && !rcvdData) continue;
    ++busyCables;
    if (sentData) problems += shareProblems("sent", sent, tolerance, &table);
    if (rcvdData) problems += shareProblems("rcvd", rcvd, tolerance, &table);
  }
  if (relayed) {
    ctx.rv->publish(format("functions-busy.%d", ctx.rank), std::to_string(busyCables));
    if (ctx.rank == 0) {
      int relays = 0;
      for (int r : {1, 3}) {
        if (std::stoi(ctx.rv->fetch(format("functions-busy.%d", r), ctx.deadline, "a relay's cable count")) == 2) ++relays;
      }
      if (relays < 1 || busyCables < 1) {
        problems += format(" the relayed stream crossed %d relay(s) on both cables and %d of rank 0's cables;", relays,
                           busyCables);
      }
      table += format(" relays=%d", relays);
    }
    ctx.barrier("functions-counted");
  }
  for (size_t i = 0; i < mhs.size(); i += 2) {
    int peer = peers[i / 2];
    deregHost(ctx, t[peer].send[0], mhs[i], "functions out");
    deregHost(ctx, t[peer].recv[0], mhs[i + 1], "functions in");
  }
  closeAll(ctx, t);
  std::string figures = format("seconds=%.3f route=[%s] bytes(sent/rcvd):%s", seconds, routeText.c_str(),
                               table.c_str());
  if (!problems.empty()) fail("functions: not an equal share per function:%s (%s)", problems.c_str(), figures.c_str());
  return figures;
}

}  // namespace e2e
