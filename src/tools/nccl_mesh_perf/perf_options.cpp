// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-perf's command line: --help, the sizes, and the checks of what was given.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mesh/platform/version.h"
#include "mesh/tools/tool_net.h"
#include "perf.h"

namespace perf {

void usage(FILE* out) {
  fprintf(out,
          "usage: nccl-mesh-perf --server [--port P] [--bind ADDR] [options]     (on one host)\n"
          "       nccl-mesh-perf --client HOST[:P] [options]                     (on the other)\n"
          "       nccl-mesh-perf --rank R --rendezvous DIR [options]              (lab: both ranks)\n"
          "       nccl-mesh-perf --version | --help\n"
          "Meeting:\n"
          "  --server            rank 1: wait for one client on TCP port P (%d) of the management\n"
          "                      network, take its parameters, serve one run, exit\n"
          "  --client HOST[:P]   rank 0: connect to the server, run, print the results\n"
          "  --bind ADDR         the server's listening address (default: every interface)\n"
          "  --rank R            0 or 1 (default $VMESH_RANK), with --rendezvous DIR: a directory\n"
          "                      both ranks can write (default $VMESH_SHARED); --tag NAME file\n"
          "                      prefix in DIR (perf), new for each run in a reused directory\n"
          "Plugin:\n"
          "  --plugin PATH       plugin library (libnccl-net-mesh.so via LD_LIBRARY_PATH)\n"
          "  --dev D             plugin device (0)\n"
          "Sizes (K/M/G suffixes, binary):\n"
          "  --min-lat B --max-lat B --lat-factor F   latency sizes (8 .. 64K, x4; max always run)\n"
          "  --lat-sizes B,B,... latency sizes, explicitly\n"
          "  --iters N | --lat-iters N   ping-pongs per size (30); --lat-warmup N (5)\n"
          "  --min-bw B --max-bw B --bw-factor F      bandwidth sizes (4K .. 64M, x4)\n"
          "  --bw-sizes B,B,...  bandwidth sizes, explicitly\n"
          "  --bw-iters N (20) --bw-warmup N (2, within a quarter of --bw-bytes)\n"
          "  --bw-window W       outstanding sends (8, at most 32)\n"
          "  --bw-bytes B        cap on bytes per bandwidth size: iters = min(bw-iters,\n"
          "                      max(1, B / size)) (8M; raise it on real hardware, e.g. 4G)\n"
          "  --no-lat | --no-bw  skip a part\n"
          "  --no-check          skip the verified transfer after each size\n"
          "Output (rank 0):\n"
          "  --csv FILE, --json FILE   the results as CSV / JSON as well (plot the CSV with\n"
          "                      scripts/plot-perf.py)\n"
          "  --progress          a progress line on stderr even when it is not a terminal\n"
          "                      (on a terminal it is always shown)\n"
          "  -v | --verbose      echo the plugin's INFO lines\n"
          "Other:\n"
          "  --timeout S         give up after S seconds (300)\n"
          "  --bw-idle-sleep-us N  in the bandwidth phase, after a poll that found nothing,\n"
          "                      sleep N us instead of sched_yield() (0). Receivers poll as NCCL's\n"
          "                      proxy does (spin, yielding the CPU when idle); only in emulated\n"
          "                      labs, where a spinning poller takes the host CPU the emulated\n"
          "                      NIC needs, does sleeping measure better\n"
          "Exit status: 0 ok; 1 failure; 2 bad command line; 3 hung; 4 wrong data received.\n",
          kDefaultPort);
}

size_t parseSize(const std::string& s) {
  char* end = nullptr;
  unsigned long long v = strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) throw Error("bad size '" + s + "'");
  std::string suf(end);
  if (suf == "K" || suf == "k") v <<= 10;
  else if (suf == "M" || suf == "m") v <<= 20;
  else if (suf == "G" || suf == "g") v <<= 30;
  else if (!suf.empty()) throw Error("bad size '" + s + "'");
  return static_cast<size_t>(v);
}

std::vector<size_t> parseList(const std::string& s) {
  std::vector<size_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(parseSize(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<size_t> geometric(size_t lo, size_t hi, size_t factor) {
  std::vector<size_t> out;
  if (factor < 2) throw Error("size factor must be >= 2");
  for (size_t s = lo; s <= hi && s != 0; s *= factor) out.push_back(s);
  if (out.empty() || out.back() != hi) out.push_back(hi);
  return out;
}

void validate(const mesh::PerfParams& p) {
  if (p.latIters < 1 || p.latWarmup < 0 || p.bwIters < 1 || p.bwWarmup < 0) {
    throw Error("iterations must be >= 1, warmups >= 0");
  }
  if (p.bwWindow < 1 || p.bwWindow > NCCL_NET_MAX_REQUESTS) throw Error("--bw-window must be 1..32");
  for (size_t s : p.latSizes) {
    if (s > (1u << 30)) throw Error("sizes must be <= 1 GiB (v8 isend takes an int)");
  }
  for (size_t s : p.bwSizes) {
    if (s == 0 || s > (1u << 30)) throw Error("bandwidth sizes must be 1 B .. 1 GiB");
  }
}

Options parseArgs(int argc, char** argv) {
  Options o;
  const char* r = getenv("VMESH_RANK");
  if (r && *r) o.rank = atoi(r);
  const char* d = getenv("VMESH_SHARED");
  if (d) o.rendezvous = d;
  size_t minLat = 8, maxLat = 64 << 10, latFactor = 4, minBw = 4 << 10, maxBw = 64 << 20, bwFactor = 4;
  bool latList = false, bwList = false, portSet = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      usage(stdout);
      exit(0);
    } else if (a == "--version") {
      printf("nccl-mesh-perf: %s\n", mesh::versionText().c_str());
      exit(0);
    } else if (a == "--server") o.mode = Mode::Server;
    else if (a == "--client") o.mode = Mode::Client, o.host = value();
    else if (a == "--port") o.port = atoi(value().c_str()), portSet = true;
    else if (a == "--bind") o.bind = value();
    else if (a == "--rank") o.rank = atoi(value().c_str());
    else if (a == "--rendezvous") o.rendezvous = value();
    else if (a == "--tag") o.tag = value();
    else if (a == "--plugin") o.plugin = value();
    else if (a == "--dev") o.dev = atoi(value().c_str());
    else if (a == "--min-lat") minLat = parseSize(value());
    else if (a == "--max-lat") maxLat = parseSize(value());
    else if (a == "--lat-factor") latFactor = parseSize(value());
    else if (a == "--lat-sizes") o.p.latSizes = parseList(value()), latList = true;
    else if (a == "--iters" || a == "--lat-iters") o.p.latIters = atoi(value().c_str());
    else if (a == "--lat-warmup" || a == "--warmup") o.p.latWarmup = atoi(value().c_str());
    else if (a == "--min-bw") minBw = parseSize(value());
    else if (a == "--max-bw") maxBw = parseSize(value());
    else if (a == "--bw-factor") bwFactor = parseSize(value());
    else if (a == "--bw-sizes") o.p.bwSizes = parseList(value()), bwList = true;
    else if (a == "--bw-iters") o.p.bwIters = atoi(value().c_str());
    else if (a == "--bw-warmup") o.p.bwWarmup = atoi(value().c_str());
    else if (a == "--bw-window") o.p.bwWindow = atoi(value().c_str());
    else if (a == "--bw-bytes") o.p.bwBytes = parseSize(value());
    else if (a == "--no-lat") o.p.lat = false;
    else if (a == "--no-bw") o.p.bw = false;
    else if (a == "--no-check") o.p.check = false;
    else if (a == "--bw-idle-sleep-us") o.bwIdleSleepUs = atoi(value().c_str());
    else if (a == "--timeout") o.timeout = atof(value().c_str());
    else if (a == "--csv") o.csvFile = value();
    else if (a == "--json") o.jsonFile = value();
    else if (a == "--progress") o.progress = true;
    else if (a == "-v" || a == "--verbose") gVerbose = true;
    else throw Error("unknown option " + a + " (see --help)");
  }
  if (!latList) o.p.latSizes = geometric(minLat, maxLat, latFactor);
  if (!bwList) o.p.bwSizes = geometric(minBw, maxBw, bwFactor);
  if (o.mode == Mode::Client) {
    std::string error, spec = o.host;
    if (!mesh::parseHostPort(spec, portSet ? o.port : kDefaultPort, &o.host, &o.port, &error)) {
      throw Error("--client " + error);
    }
  }
  if (o.port < (o.mode == Mode::Server ? 0 : 1) || o.port > 65535) {
    throw Error("--port must be 1..65535 (0 for --server: any free port, printed at start)");
  }
  if (o.mode == Mode::Files) {
    if (o.rank != 0 && o.rank != 1) throw Error("need --server, --client HOST, or --rank 0|1 (or VMESH_RANK)");
    if (o.rendezvous.empty()) throw Error("need --rendezvous DIR (or VMESH_SHARED) with --rank");
  } else {
    o.rank = o.mode == Mode::Client ? 0 : 1;
  }
  validate(o.p);
  return o;
}

}  // namespace perf
