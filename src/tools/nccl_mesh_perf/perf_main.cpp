// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-perf: point-to-point latency and bandwidth of a ncclNet plugin between two
// ranks, measured through the plugin's ABI exactly as NCCL drives it: dlopen of the .so
// (--plugin), dlsym("ncclNetPlugin_v8"), non-blocking connect/accept, registered host
// buffers, isend/irecv/test. Of the modules it uses only the tools' helpers (the control
// channel, the data pattern, the report), never the plugin's own code.
//
//   rank 0 <-> rank 1: ping-pong latency (half the round trip; typical = median, as
//   perftest's t_typical), then rank 0 -> rank 1 bandwidth with a window of outstanding
//   sends (from the first accepted isend to the last send completion, as perftest). After
//   each size's timed transfers, one verified transfer: the sender writes a pattern, the
//   receiver (its buffer cleared first) counts the bytes that differ.
//
// How the two ranks meet:
//   --server / --client HOST[:PORT]  two real hosts, over TCP on the management network;
//       the server (rank 1) takes the client's (rank 0's) parameters and serves one run.
//   --rank R --rendezvous DIR         the lab: handles in files of a shared directory (each
//       written under a temporary name and rename()d); both ranks must be given the same
//       options.
// Rank 0 prints nccl-tests-style tables (GB/s = 1e9 B/s) and, for scripts, one line per
// measurement (MB = 2^20 B, perftest's unit; scripts/bench-lab.sh reads them):
//   PERF lat size=8 usec=<typical> avg=<> min=<> iters=<n> wrong=<bytes>
//   PERF bw size=65536 MBps=<> GBps=<> iters=<n> window=<w> wrong=<bytes>
// Exit status: 0 done and every check exact; 1 a failure (plugin, network, timeout); 2 bad
// command line; 3 hung past --timeout; 4 the data check found wrong bytes.
#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "mesh/platform/text.h"
#include "mesh/platform/version.h"
#include "mesh/tools/perf_report.h"
#include "net_v8.h"
#include "perf.h"

namespace perf {

// --- the plugin's log ------------------------------------------------------------------

std::mutex gLogMutex;
std::string gLastWarn;
bool gVerbose = false;

extern "C" void perfLogger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[2048];
  MESH_VFORMAT(buf, fmt);
  std::lock_guard<std::mutex> lock(gLogMutex);
  if (level == NCCL_LOG_WARN) {
    gLastWarn = buf;
    fprintf(stderr, "nccl-mesh-perf: plugin WARN %s\n", buf);
  } else if (gVerbose && level <= NCCL_LOG_INFO) {
    fprintf(stderr, "nccl-mesh-perf: plugin %s\n", buf);
  }
}

const char* resultName(ncclResult_t r) {
  static const char* const kNames[] = {"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
                                       "ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage",
                                       "ncclRemoteError", "ncclInProgress"};
  return r >= 0 && r < ncclNumResults ? kNames[r] : "ncclResult(unknown)";
}

void check(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return;
  std::lock_guard<std::mutex> lock(gLogMutex);
  throw Error(strf("%s returned %s (%d)%s%s", what.c_str(), resultName(r), static_cast<int>(r),
                   gLastWarn.empty() ? "" : "; plugin's last WARN: ", gLastWarn.c_str()));
}

void writeFile(const std::string& path, const std::string& text) {
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr || fputs(text.c_str(), f) < 0 || fclose(f) != 0) {
    throw Error("cannot write " + path + ": " + strerror(errno));
  }
}

void printResults(const Options& o, const Perf& perf) {
  const mesh::PerfReport& r = perf.report();
  for (const mesh::LatRow& l : r.lat) {
    printf("PERF lat size=%zu usec=%.2f avg=%.2f min=%.2f iters=%d wrong=%lld\n", l.size, l.typUs, l.avgUs, l.minUs,
           l.iters, l.wrong);
  }
  for (const mesh::BwRow& b : r.bw) {
    printf("PERF bw size=%zu MBps=%.2f GBps=%.4f iters=%d window=%d wrong=%lld\n", b.size, b.mibPerSec(),
           b.algbwGBps(), b.iters, r.window, b.wrong);
  }
  printf("\n%s", mesh::formatTable(r).c_str());
  if (!o.csvFile.empty()) writeFile(o.csvFile, mesh::formatCsv(r));
  if (!o.jsonFile.empty()) writeFile(o.jsonFile, mesh::formatJson(r));
  fflush(stdout);
}

int run(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Options o;
  try {
    o = parseArgs(argc, argv);
  } catch (const Error& e) {
    fprintf(stderr, "nccl-mesh-perf: %s\n", e.what());
    usage(stderr);
    return kExitUsage;
  }
  // A hung peer or plugin must not hang the run.
  double limit = o.timeout;
  std::thread([limit] {
    std::this_thread::sleep_for(std::chrono::duration<double>(limit + 15));
    fprintf(stderr, "nccl-mesh-perf: FAIL: still running %.0f s after --timeout; exiting\n", limit + 15);
    _exit(kExitHung);
  }).detach();
  try {
    Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout));
    std::unique_ptr<Rendezvous> rv = makeRendezvous(o, deadline);
    void* lib = dlopen(o.plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) throw Error(strf("dlopen(%s): %s", o.plugin.c_str(), dlerror()));
    auto* net = static_cast<const ncclNet_v8_t*>(dlsym(lib, "ncclNetPlugin_v8"));
    if (net == nullptr) throw Error(o.plugin + " has no ncclNetPlugin_v8");
    check(net->init(perfLogger), "init");
    int ndev = 0;
    check(net->devices(&ndev), "devices");
    if (o.dev < 0 || o.dev >= ndev) throw Error(strf("--dev %d, but the plugin reports %d device(s)", o.dev, ndev));
    ncclNetProperties_v8_t props;
    memset(&props, 0, sizeof(props));
    check(net->getProperties(o.dev, &props), "getProperties");
    Perf perf(o, net, rv.get(), deadline);
    perf.connect();
    if (perf.params().lat) perf.latency();
    if (perf.params().bw) perf.bandwidth();
    perf.exchangeChecks();
    perf.close();
    long long wrong = perf.myWrong();
    if (o.rank == 0) {
      mesh::PerfReport& r = perf.report();
      r.version = mesh::versionText();
      r.plugin = net->name;
      r.device = strf("%d: %s, %d Mbps", o.dev, props.name ? props.name : "?", props.speed);
      printResults(o, perf);
      wrong = std::max(wrong, r.totalWrong());
    } else {
      printf("nccl-mesh-perf: rank 1 served rank 0 (%s); data check: %s\n", rv->describe().c_str(),
             perf.params().check ? strf("%lld byte(s) wrong in what rank 1 received", wrong).c_str() : "off");
    }
    dlclose(lib);
    if (wrong > 0) {
      fprintf(stderr, "nccl-mesh-perf: FAIL: the data check found %lld wrong byte(s)\n", wrong);
      return kExitWrongData;
    }
    return 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "nccl-mesh-perf: FAIL (rank %d): %s\n", o.rank, e.what());
    fflush(stderr);
    _exit(kExitFail);  // no teardown through a plugin in an unknown state
  }
}

}  // namespace perf

int main(int argc, char** argv) { return perf::run(argc, argv); }
