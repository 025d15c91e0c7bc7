// SPDX-License-Identifier: Apache-2.0
// mesh_e2e: end-to-end scenarios for the nccl-mesh plugin, run on every node of a mesh
// (the lab: scripts/vmesh run --nodes N -- mesh_e2e SCENARIO ...). Talks to the plugin
// only as NCCL does: dlopen + ncclNetPlugin_v<N> (--api). Each rank prints one line
//   PASS <scenario> rank=<r> ... figures      or      FAIL <scenario> rank=<r>: reason
// and exits 0 only on PASS. A global deadline turns any hang into a FAIL.
#include <fcntl.h>
#include <signal.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "nccl_ib.h"
#include "probes.h"
#include "scenarios.h"

namespace e2e {
namespace {

struct ScenarioInfo {
  const char* name;
  ScenarioFn fn;
  std::set<std::string> options;  // besides commonOptions()
  const char* usage;
};

const ScenarioInfo kScenarios[] = {
    {"connect-mesh", runConnectMesh, {"comms"},
     "[--comms 8]            every rank <-> every rank, 8 send + 8 recv comms per peer, routing checked"},
    {"ring-diagonal", runRingDiagonal, {"diag-timeout"},
     "[--diag-timeout 60]    4-node ring: rank 0 -> rank 2 must fail with the routing error"},
    {"cycles", runCycles, {"count", "check-at"},
     "[--count 200] [--check-at 10]  2 nodes: listen/connect/exchange/close cycles, leak check"},
    {"dead-peer", runDeadPeer, {"mode", "bound", "margin", "size"},
     "--mode never-accept|listener-dies|peer-killed|idle|mid-send|exits [--bound S] [--margin 20]\n"
     "                  [--size 64M]  2 nodes: rank 1 dies, rank 0 must get errors in bounded time"},
    {"late-accept", runLateAccept, {"delay", "cut", "bound"},
     "[--delay S]           2 nodes: rank 1 accepts S s (1.5 x NCCL_MESH_CONNECT_TIMEOUT_MS) after the\n"
     "                  connect began; the connect must wait for it, then 1 MiB is checked; --cut: rank 1\n"
     "                  never accepts and takes its cable down while the connect waits: the connect must fail\n"
     "                  within --bound (NCCL_MESH_PEER_TIMEOUT_MS + 10 s)"},
    {"pair", runPair, {"iters", "groups", "big"},
     "[--iters 2] [--groups 4] [--big 0]  2 nodes: sizes, 32 outstanding, grouped, short, one big"},
    {"allreduce", runAllreduce, {"pairs", "count", "iters"},
     "[--pairs 4] [--count 262144] [--iters 2]  ring all-reduce, exact check"},
    {"links", runLinks, {"size", "min-share"},
     "[--size 4M] [--min-share 0.1]  2 nodes, vmesh --links 2: striping on both rxe devices"},
    {"functions", runFunctions, {"count", "tolerance", "relayed", "watch", "two-relays"},
     "[--count 24] [--tolerance 0.1]  fabric-net --functions 2: every function of every cable end\n"
     "                  carries an equal share both ways (per-device byte counters), data exact\n"
     "                  [--relayed]  4-node ring, NCCL_MESH_RELAY=auto: ranks 0 <-> 2 through a relay,\n"
     "                  every function of both legs an equal share; [--two-relays] (NCCL_MESH_RELAY_TWIN=1)\n"
     "                  both relays and both of rank 0's cables carry it\n"
     "                  [--watch PATH]  and PATH (nccl-mesh-info) --watch, run during the exchange,\n"
     "                  shows those shares too; relayed: the relays' forwarded bytes equal what\n"
     "                  ranks 0 and 2 sent through them; a killed process's counters file is cleaned"},
    {"coll-bench", runCollBench, {"algo", "bytes", "channels", "slice", "iters", "warmup", "ceiling", "seconds", "max-streak", "max-passed-over", "twin-relays", "quiet-leg-share", "vs", "ref-channels", "spread-devices", "peer-channels", "test-oldest"},
     "[--algo ring|tree|alltoall|sendrecv|contention] [--bytes 64M] [--channels 4] [--slice 512K]\n"
     "                  [--iters 3] [--warmup 1] [--vs nccl-ib[:LIB]] [--ceiling B/s] [--seconds 3] [--max-streak N]  NCCL's collectives\n"
     "                  pipelined as NCCL runs them (8 slots per connection), busbw and, with --ceiling, the\n"
     "                  cabling's bound; data exact; streak= the most transfers one connection completed while\n"
     "                  another with work left completed none (--max-streak fails above N); on the fabric\n"
     "                  passed_over= the most packets other QPs of a port sent while one waited for its turn\n"
     "                  (--max-passed-over fails above N); --twin-relays\n"
     "                  (NCCL_MESH_RELAY_TWIN=1 on every node): every connection to an uncabled peer must have\n"
     "                  gone over two relays; [--quiet-leg-share X] each of them sent at least X of its\n"
     "                  sends over one leg (NCCL's tree on a 4-ring: the leg whose first cable has no tree edge);\n"
     "                  --vs nccl-ib[:LIB]: NCCL's own IB transport beside the plugin in the same processes,\n"
     "                  iterations alternating, vs_ratio_median= plugin / NCCL IB per iteration pair (root),\n"
     "                  [--ref-channels N] its channels; sendrecv, alltoall [--spread-devices]: channel k on\n"
     "                  device k % devices (a Spark cable: two devices to NCCL IB, or to the plugin in port\n"
     "                  mode); alltoall [--peer-channels 1]: comms per peer, each an equal part of each block;\n"
     "                  --test-oldest: test only each connection's oldest request per pass, as NCCL's proxy"},
    {"device-fatal", runDeviceFatal, {"bound"},
     "[--bound 5]           2 nodes, the userspace fabric: rank 1's device reports IBV_EVENT_DEVICE_FATAL and\n"
     "                  completes nothing more; pending receives fail in bounded time, its next connect at once"},
    {"gid-move", runGidMove, {},
     "(no options)          2 nodes, the QEMU lab: rank 1's address leaves its netdev and comes back\n"
     "                  behind an IPv6 address, its RoCEv2 GID at a new index; fresh comms use it, data exact"},
    {"close-after-receive", runCloseAfterReceive, {"rounds", "size"},
     "[--rounds 10] [--size 64K]  2 nodes: the receiver closes once its receive is done; the\n"
     "                  sender's test() must still complete (run it on cables with --delay)"},
    {"close-inflight", runCloseInflight, {"rounds", "inflight", "size"},
     "[--rounds 20] [--inflight 16] [--size 256K]  2 nodes: close with requests in flight"},
    {"link-down", runLinkDown, {"size", "after", "bound"},
     "[--size 256K] [--after 8] [--bound S]  3 nodes (full): rank 0 downs its link to rank 1\n"
     "                  mid-stream; both ends fail in bounded time, rank 2's traffic is untouched"},
    {"reload", runReload, {"rounds"},
     "[--rounds 3]           2 nodes: comms, close, dlclose, dlopen again; no thread/fd/RDMA object left"},
    {"bad-input", runBadInput, {"random", "bound"},
     "[--random 256] [--bound S]  2 nodes: random and damaged handles, NULLs, double closes"},
    {"memlock", runMemlock, {"limit", "big"},
     "[--limit 8M] [--big 64M]  2 nodes: RLIMIT_MEMLOCK without CAP_IPC_LOCK; a clear regMr error"},
    {"demo", runDemo, {"bytes", "pairs", "iters", "warmup"},
     "[--bytes 8M] [--pairs 2] [--iters 3] [--warmup 1]  ring all-reduce, ports and bandwidth"},
    {"contract", runContract, {},
     "                       2 nodes: groups of 8 sent reversed/shuffled/early, absent tag, oversize,\n"
     "                  256 outstanding then NULL (what NCCL's proxy relies on)"},
    {"abort-reload", runAbortReload, {"cycles"},
     "[--cycles 20]          2 nodes: abandoned connect + dlclose + dlopen + init; nothing leaks"},
    {"fork", runFork, {"iters", "size"},
     "[--iters 3] [--size 64K]  2 nodes: a forked child writes its buffers and exit()s mid-traffic"},
    {"relay", runRelay, {"big", "messages", "outstanding", "check-relay-netdevs", "netdev-bytes", "patterns",
                         "count", "alltoall-bytes", "iters", "twins", "fallbacks"},
     "[--big 64M] [--messages 1000] [--outstanding 32]  >= 2 nodes, any topology (ring/line: relayed\n"
     "                  pairs): every ordered pair byte-exact; ip_forward must be 0\n"
     "                  [--check-relay-netdevs] [--netdev-bytes 4M]  lab ring/line: rank 0 -> rank 2's\n"
     "                  bytes crossed the relay's netdevs from rank 0 and to rank 2\n"
     "                  [--twins N [--fallbacks M]]  N of this rank's relayed connects went over two relays,\n"
     "                  N of its relayed receives were accepted as two legs and M connects fell back to one\n"
     "                  relay (NCCL_MESH_RELAY_TWIN=1)\n"
     "                  [--patterns LIST [--count N] [--alltoall-bytes B] [--iters I]]  then `patterns` on\n"
     "                  the same comms"},
    {"patterns", runPatterns, {"patterns", "count", "alltoall-bytes", "iters", "ring-first", "check-port-range"},
     "[--patterns tree,pat,alltoall] [--count 263165] [--alltoall-bytes 1048579] [--iters 2]\n"
     "                  every pair connected; NCCL's double-binary-tree all-reduce, PAT's +-2^k\n"
     "                  reduce-scatter + all-gather (power-of-two ranks), all-to-all; exact\n"
     "                  [--ring-first]  ring of cables: ring comms first, then the relayed ones, which\n"
     "                  must take the direction the ring leaves idle\n"
     "                  [--check-port-range]  with NCCL_MESH_PORT_RANGE: every TCP socket of the process\n"
     "                  (relay legs too) listens in it or on the relay port, or is connected to one that does"},
    {"relay-bench", runRelayBench, {"sizes", "bw-bytes", "window", "lat-iters", "idle-sleep-us", "rounds"},
     "[--sizes 64K,1M,4M] [--bw-bytes 256M] [--window 8] [--lat-iters 1000]  ring >= 4 or line >= 3:\n"
     "                  [--idle-sleep-us 0] [--rounds 3]  rank 0 -> 1 (direct) against rank 0 -> 2 (relayed):\n"
     "                  8 B latency, bandwidth (best of the rounds), ratios; and 0 -> 1 with 1 -> 2 at once"},
    {"registrations", runRegistrations, {"sizes", "count"},
     "[--sizes 256K,4M,64M] [--count 5]  >= 2 nodes: rank 0 registers through its comm to rank 1\n"
     "                  (only the devices towards it) and through no comm (every device): devices,\n"
     "                  bytes pinned and the time of one regMr per size"},
    {"relay-faults", runRelayFaults, {"mode", "count", "check-at", "bound", "both-bound", "size"},
     "--mode kill-relay|stop-relay|kill-receiver|kill-sender|relay-cycles|relay-finalize|cut|silent-relay\n"
     "                  |isolation|memcap [--count 200]\n"
     "                  [--bound S] [--size 256K]  4-node ring: faults of a relayed 0->2 connection"},
    {"route-plan", runRoutePlan, {"expect"},
     "[--expect agree|disagree]  2^k nodes, NCCL_MESH_RELAY=auto: every node computes the same relay\n"
     "                  route table and relayed connects follow it (4-ring: one relayed pair per cable\n"
     "                  direction); disagree (with MESH_TEST_DROP_HELLOS_FROM): the fallback rule connects"},
};

void usage(FILE* out) {
  fprintf(out,
          "usage: mesh_e2e SCENARIO [options]\n"
          "Runs on every rank of a mesh; talks to the plugin only through ncclNetPlugin_v<--api>.\n\n"
          "Scenarios:\n");
  for (const ScenarioInfo& s : kScenarios) fprintf(out, "  %-15s %s\n", s.name, s.usage);
  fprintf(out,
          "\nCommon options (defaults from the vmesh lab's environment):\n"
          "  --rank R        this rank (VMESH_RANK)\n"
          "  --nodes N       number of ranks (VMESH_NODES)\n"
          "  --shared DIR    directory shared by all ranks for rendezvous files (VMESH_SHARED)\n"
          "  --deadline S    fail instead of waiting past S seconds (240)\n"
          "  --plugin PATH   plugin library (libnccl-net-mesh.so, found via LD_LIBRARY_PATH);\n"
          "                  nccl-ib[:LIB]: NCCL's own IB transport out of LIB (libnccl.so.2) instead,\n"
          "                  as the reference for benchmarks (root; tests/e2e/nccl_ib.h)\n"
          "  --dev D         plugin device for every comm (0)\n"
          "  --api V         ncclNet ABI every call goes through: v8, v9, v10, v11, v12 (v8)\n"
          "  --traffic-class N  given to init, v10+ only (-1: unset; NCCL_MESH_IB_TC wins when set)\n"
          "  --run-id ID     separates repeated runs in one shared directory (1)\n"
          "  --seed N        shuffles (1)\n"
          "  --verbose       echo the plugin's INFO lines (also with NCCL_DEBUG=INFO)\n");
}

const ScenarioInfo* findScenario(const std::string& name) {
  for (const ScenarioInfo& s : kScenarios) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

int envInt(const char* name, int def) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : def;
}

std::string envStr(const char* name) {
  const char* v = getenv(name);
  return v ? v : "";
}

void describeDevice(Context& ctx) {
  int ndev = 0;
  ctx.net.check(ctx.net->devices(&ndev), "devices", "after init");
  if (ndev < 1) {
    fail("the plugin reports %d devices (expected >= 1 in the lab: are the rxe ports up? see "
         "the plugin's WARN lines above)", ndev);
  }
  if (ctx.dev < 0 || ctx.dev >= ndev) fail("--dev %d, but the plugin has %d device(s)", ctx.dev, ndev);
  netapi::Properties props;
  ctx.net.check(ctx.net->getProperties(ctx.dev, &props), "getProperties", format("dev %d", ctx.dev));
  say("plugin '%s' via %s: %d device(s); dev %d = %s, speed %d Mbps, maxRecvs %d, maxComms %d, "
      "ptrSupport 0x%x, maxP2pBytes %zu",
      ctx.net->name(), ctx.net->symbol(), ndev, ctx.dev, props.name.empty() ? "?" : props.name.c_str(),
      props.speed, props.maxRecvs, props.maxComms, props.ptrSupport, props.maxP2pBytes);
  if (!(props.ptrSupport & NCCL_PTR_HOST)) fail("dev %d does not support host memory (ptrSupport 0x%x)", ctx.dev, props.ptrSupport);
  if (props.maxRecvs < 8) fail("dev %d: maxRecvs %d, the scenarios use grouped receives of 8", ctx.dev, props.maxRecvs);
}

// Runs the scenario; returns the process exit status.
int runScenario(Context& ctx, const ScenarioInfo& info, const std::string& shared,
                const std::string& plugin, bool verbose) {
  try {
    ctx.rv.reset(new Rendezvous(shared, ctx.scenario, ctx.opts.str("run-id", "1"), ctx.rank, ctx.nodes));
    setPhase("loading the plugin");
    ctx.pluginPath = plugin;
    ctx.verbose = verbose;
    std::string ncclLib;
    if (parseNcclIbPlugin(plugin, &ncclLib)) {
      ctx.net.loadNcclIb(ncclLib, ctx.trafficClass, verbose);
    } else {
      ctx.net.load(plugin, ctx.api, ctx.trafficClass, verbose);
    }
    describeDevice(ctx);
    // As NCCL orders it (src/init.cc, initTransportsRank: the bootstrapAllGather of every
    // rank's peer info comes before any transport connects): every rank has loaded the
    // plugin before any rank connects (a rank still starting is not yet heard on the mesh,
    // and a relayed path picked without it detours round it).
    if (ctx.nodes > 1) {
      setPhase("waiting for every rank to load the plugin");
      ctx.barrier("plugin-loaded");
    }
    setPhase(ctx.scenario);
    std::string figures = info.fn(ctx);
    setPhase("unloading the plugin");
    ctx.net.unload();
    printf("PASS %s rank=%d nodes=%d time_s=%.2f %s\n", ctx.scenario.c_str(), ctx.rank, ctx.nodes,
           secondsSince(ctx.started), figures.c_str());
    fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::string reason = e.what();
    printf("FAIL %s rank=%d nodes=%d after %.2f s in phase '%s': %s\n", ctx.scenario.c_str(), ctx.rank,
           ctx.nodes, secondsSince(ctx.started), currentPhase().c_str(), reason.c_str());
    fflush(stdout);
    ctx.net.dumpTail(25);
    for (const std::string& line : retransmitCounters()) say("port counters %s", line.c_str());
    if (ctx.rv) ctx.rv->abort(format("rank %d: %s", ctx.rank, reason.c_str()));
    fflush(stdout);
    fflush(stderr);
    // No teardown: a plugin in a bad state may hang in it, and the verdict is out.
    _exit(1);
  }
}

// A rank that dies on purpose (needsChildGuard): fork before anything starts a thread; the
// child runs the scenario and dies, the parent reports. Returns the parent's exit status,
// or -1 in the child.
int forkChildGuard(const Context& ctx, const std::string& shared, double deadline) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    printf("FAIL %s rank=%d: pipe: %s\n", ctx.scenario.c_str(), ctx.rank, strerror(errno));
    return 1;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    printf("FAIL %s rank=%d: fork: %s\n", ctx.scenario.c_str(), ctx.rank, strerror(errno));
    return 1;
  }
  if (pid > 0) {
    close(fds[1]);
    try {
      Rendezvous rv(shared, ctx.scenario, ctx.opts.str("run-id", "1"), ctx.rank, ctx.nodes);
      return childGuardParent(ctx, rv, pid, fds[0], deadline + 15);
    } catch (const std::exception& e) {
      kill(pid, SIGKILL);
      printf("FAIL %s rank=%d: guard: %s\n", ctx.scenario.c_str(), ctx.rank, e.what());
      return 1;
    }
  }
  close(fds[0]);
  setChildReportFd(fds[1]);
  return -1;
}

// Options and environment into ctx; returns false (after printing FAIL) when unusable.
bool configure(Context& ctx, const ScenarioInfo& info, int argc, char** argv) {
  try {
    ctx.opts.parse(argc, argv, 2);
    ctx.opts.requireKnown(withCommon(info.options));
    ctx.rank = static_cast<int>(ctx.opts.integer("rank", envInt("VMESH_RANK", -1)));
    ctx.nodes = static_cast<int>(ctx.opts.integer("nodes", envInt("VMESH_NODES", 0)));
    ctx.dev = static_cast<int>(ctx.opts.integer("dev", 0));
    ctx.seed = static_cast<unsigned>(ctx.opts.integer("seed", 1));
    ctx.api = netapi::parseVersion(ctx.opts.str("api", "v8"));
    if (ctx.api == 0) fail("--api %s: expected v8, v9, v10, v11 or v12", ctx.opts.str("api", "").c_str());
    ctx.trafficClass = static_cast<int>(ctx.opts.integer("traffic-class", NCCL_NET_TRAFFIC_CLASS_UNDEF));
    if (ctx.trafficClass != NCCL_NET_TRAFFIC_CLASS_UNDEF && ctx.api < 10) {
      fail("--traffic-class %d: ncclNet v%d has no way to pass one (use --api v10, v11 or v12)",
           ctx.trafficClass, ctx.api);
    }
    ctx.topology = envStr("VMESH_TOPOLOGY");
    ctx.linksPerPair = envInt("VMESH_LINKS", 1);
    if (ctx.rank < 0 || ctx.nodes < 1 || ctx.rank >= ctx.nodes) {
      fail("need 0 <= rank < nodes (got rank %d, nodes %d): run under scripts/vmesh or pass "
           "--rank and --nodes", ctx.rank, ctx.nodes);
    }
    ctx.opts.real("deadline", 240);  // validated here, used by the caller
    return true;
  } catch (const std::exception& e) {
    printf("FAIL %s: %s\n", ctx.scenario.c_str(), e.what());
    return false;
  }
}

int mainImpl(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const ScenarioInfo* info = findScenario(argv[1]);
  if (info == nullptr) {
    fprintf(stderr, "mesh_e2e: unknown scenario '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
  }
  Context ctx;
  ctx.scenario = info->name;
  if (!configure(ctx, *info, argc, argv)) return 2;
  setRankLabel(ctx.rank);
  std::string shared = ctx.opts.str("shared", envStr("VMESH_SHARED"));
  std::string plugin = ctx.opts.str("plugin", "libnccl-net-mesh.so");
  const char* debug = getenv("NCCL_DEBUG");
  bool verbose = ctx.opts.has("verbose") || (debug && (!strcasecmp(debug, "INFO") || !strcasecmp(debug, "TRACE")));
  double deadline = ctx.opts.real("deadline", 240);
  if (shared.empty()) {
    printf("FAIL %s rank=%d: no rendezvous directory: set VMESH_SHARED or pass --shared DIR\n",
           ctx.scenario.c_str(), ctx.rank);
    return 2;
  }
  say("%s: rank %d of %d, topology '%s', %d link(s) per pair, ncclNet v%d, deadline %.0f s, options:%s",
      ctx.scenario.c_str(), ctx.rank, ctx.nodes, ctx.topology.c_str(), ctx.linksPerPair, ctx.api, deadline,
      ctx.opts.describe().c_str());

  if (needsChildGuard(ctx)) {
    int status = forkChildGuard(ctx, shared, deadline);
    if (status >= 0) return status;  // the parent is done; the child goes on
  }
  // --watch: this rank's live counters in a directory of its own (the nodes of a fabric
  // share one /dev/shm), before the plugin is loaded.
  if (ctx.opts.has("watch") && getenv("NCCL_MESH_STATS_DIR") == nullptr) {
    setenv("NCCL_MESH_STATS_DIR", format("%s/stats.%d", shared.c_str(), ctx.rank).c_str(), 1);
  }
  ctx.deadline = Deadline(deadline, format("--deadline %.0f s", deadline));
  startWatchdog(ctx.scenario, ctx.rank, deadline + 20);
  return runScenario(ctx, *info, shared, plugin, verbose);
}

}  // namespace
}  // namespace e2e

int main(int argc, char** argv) { return e2e::mainImpl(argc, argv); }
