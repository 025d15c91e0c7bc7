// SPDX-License-Identifier: Apache-2.0
// scale_bench: connection setup time and memory per comm through the plugin, on every node
// of a fabric-net full mesh, for 1..N-1 peers x 1..32 comms per peer and direction.
//
//   scripts/fabric-net run --nodes 8 -- env LD_LIBRARY_PATH=build
//       NCCL_MESH_IBVERBS_LIB=$PWD/build/tests/fabric/dropin/libibverbs.so.1
//       build/tests/fabric/meshfab_scale_bench [--comms 1,4,16,32] [--max-peers N]
//
// For each (peers p, comms c): every rank opens c send comms to each of its next p ranks
// and accepts c recv comms from each of its previous p ranks, all at once, driven as NCCL
// drives connect/accept (tests/e2e/comm_setup); then closes them. Rank 0 prints one line
// per point: the slowest rank's setup time, and the growth of the largest rank's heap per
// comm (the plugin's comms with their FIFOs and request pools, the fabric's QPs, CQs and
// MRs; not the fabric's shared-memory rings, which are per pair of processes, 5 MiB each,
// not per comm). Figures describe the emulator on this
// machine, not hardware.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "comm_setup.h"
#include "context.h"

namespace {

using namespace e2e;

// Heap bytes in use (malloc'ed and not freed, mmap'ed blocks included): unlike the resident
// set, it does not hide a point's memory in what earlier points freed.
long heapBytes() {
  struct mallinfo2 m = mallinfo2();
  return static_cast<long>(m.uordblks + m.hblkhd);
}

std::vector<int> parseList(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(atoi(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Context ctx;
  ctx.scenario = "scale";
  try {
    ctx.opts.parse(argc, argv, 1);
    ctx.opts.requireKnown({"comms", "max-peers", "deadline", "plugin"});
    ctx.rank = atoi(getenv("VMESH_RANK") ? getenv("VMESH_RANK") : "-1");
    ctx.nodes = atoi(getenv("VMESH_NODES") ? getenv("VMESH_NODES") : "0");
    const char* shared = getenv("VMESH_SHARED");
    if (ctx.rank < 0 || ctx.nodes < 2 || shared == nullptr) fail("run under scripts/fabric-net on 2+ nodes");
    setRankLabel(ctx.rank);
    double deadline = ctx.opts.real("deadline", 600);
    ctx.deadline = Deadline(deadline, "--deadline");
    ctx.rv.reset(new Rendezvous(shared, "scale", "1", ctx.rank, ctx.nodes));
    ctx.net.load(ctx.opts.str("plugin", "libnccl-net-mesh.so"), 8, NCCL_NET_TRAFFIC_CLASS_UNDEF, false);
    std::vector<int> comms = parseList(ctx.opts.str("comms", "1,2,4,8,16,32"));
    int maxPeers = static_cast<int>(ctx.opts.integer("max-peers", ctx.nodes - 1));
    if (ctx.rank == 0) {
      printf("SCALE %d ranks (full mesh), one process per node; per point: every rank connects to its next P ranks and\n"
             "SCALE accepts from its previous P, C comms per peer and direction (2*P*C comms per rank)\n"
             "SCALE %5s %5s %10s %12s %12s %14s\n", ctx.nodes, "peers", "comms", "comms/rank", "setup_s", "setup_ms/comm",
             "heap_KiB/comm");
    }
    for (int p = 1; p <= maxPeers && p < ctx.nodes; ++p) {
      for (int c : comms) {
        std::string tag = "p" + std::to_string(p) + "c" + std::to_string(c);
        EstablishSpec spec;
        for (int k = 1; k <= p; ++k) {
          spec.connectTo.push_back(ctx.next(k));
          spec.acceptFrom.push_back(ctx.prev(k));
        }
        spec.count = c;
        spec.tag = tag;
        ctx.barrier("start." + tag);
        long heap0 = heapBytes();
        Clock::time_point t0 = Clock::now();
        CommTable t = establish(ctx, spec, ctx.deadline);
        double setup = secondsSince(t0);
        long heap1 = heapBytes();
        ctx.rv->publish("res." + tag + "." + std::to_string(ctx.rank), format("%.6f %ld", setup, heap1 - heap0));
        ctx.barrier("up." + tag);
        closeAll(ctx, t);
        if (ctx.rank == 0) {
          double slowest = 0;
          long heapMax = 0;
          for (int r = 0; r < ctx.nodes; ++r) {
            std::string v = ctx.rv->fetch("res." + tag + "." + std::to_string(r), ctx.deadline, "results");
            double s = 0;
            long bytes = 0;
            sscanf(v.c_str(), "%lf %ld", &s, &bytes);
            slowest = std::max(slowest, s);
            heapMax = std::max(heapMax, bytes);
          }
          int perRank = 2 * p * c;
          printf("SCALE %5d %5d %10d %12.3f %12.3f %14.1f\n", p, c, perRank, slowest, slowest * 1e3 / perRank,
                 static_cast<double>(heapMax) / 1024 / perRank);
        }
        ctx.barrier("closed." + tag);
      }
    }
    ctx.net.unload();
    printf("PASS scale rank=%d\n", ctx.rank);
    return 0;
  } catch (const std::exception& e) {
    printf("FAIL scale rank=%d: %s\n", ctx.rank, e.what());
    if (ctx.rv) ctx.rv->abort(e.what());
    fflush(stdout);
    _exit(1);
  }
}
