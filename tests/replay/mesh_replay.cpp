// SPDX-License-Identifier: Apache-2.0
// mesh_replay: replays the NCCL_MESH_TRACE files of one job against the plugin on the
// userspace fabric (tests/replay/README.md).
//   mesh_replay run   [options] TRACE|DIR...  the whole job: scripts/fabric-net cables the
//                                             recorded mesh (functions per cable end included)
//                                             and runs `node` on every node
//   mesh_replay node  [options] TRACE|DIR...  in a fabric node: replays its processes
//   mesh_replay check TRACE|DIR...            parses and places the traces, replays nothing
// Exit status: 0 every call as recorded; 1 a divergence (each printed as a DIVERGENCE line
// naming the file, the line and the call); 2 bad arguments or an unreadable trace.
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "e2e_util.h"
#include "nccl_ib.h"
#include "replayer.h"

namespace replay {
namespace {

const char kUsage[] =
    "usage: mesh_replay run [options] TRACE|DIR...   replay a job on the fabric (one node per recorded node)\n"
    "       mesh_replay node [options] TRACE|DIR...  inside a fabric node (VMESH_RANK, VMESH_SHARED)\n"
    "       mesh_replay check TRACE|DIR...           parse and place the traces only\n"
    "options:\n"
    "  --plugin PATH      the plugin as NCCL opens it (libnccl-net-mesh.so, through LD_LIBRARY_PATH);\n"
    "                     nccl-ib[:LIB]: NCCL's own IB transport out of LIB (libnccl.so.2) instead, v11\n"
    "                     traces only (root; the drop-in first in LD_LIBRARY_PATH: --plugin-dir)\n"
    "  --deadline S       the whole replay (120)\n"
    "  --wait S           one call's retries, one test, one handle or dependency (30)\n"
    "  --run-id ID        separates runs sharing a rendezvous directory (1)\n"
    "  --verbose          echo the plugin's INFO lines\n"
    "run only:\n"
    "  --fabric-net PATH  scripts/fabric-net\n"
    "  --dropin LIB       the fabric's libibverbs.so.1 (NCCL_MESH_IBVERBS_LIB)\n"
    "  --plugin-dir DIR   put first in LD_LIBRARY_PATH (the build folder of the plugin)\n"
    "  --env NAME=VALUE   set in every node's environment (repeatable)\n";

struct Args {
  std::string mode;
  Options opts;
  std::string fabricNet, dropin, pluginDir;
  std::vector<std::string> env;  // --env NAME=VALUE: into every node's environment
  std::vector<std::string> traces;
};

bool parseArgs(int argc, char** argv, Args* a, std::string* error) {
  if (argc < 2) return (*error = "no mode given", false);
  a->mode = argv[1];
  if (a->mode != "run" && a->mode != "node" && a->mode != "check") return (*error = "unknown mode " + a->mode, false);
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) {
      a->traces.push_back(k);
      continue;
    }
    if (k == "--verbose") {
      a->opts.verbose = true;
      continue;
    }
    if (i + 1 >= argc) return (*error = k + " needs a value", false);
    std::string v = argv[++i];
    char* end = nullptr;
    if (k == "--plugin") {
      a->opts.plugin = v;
    } else if (k == "--deadline" || k == "--wait") {
      double s = strtod(v.c_str(), &end);
      if (*end != '\0' || s <= 0) return (*error = k + " " + v + ": expected seconds > 0", false);
      (k == "--deadline" ? a->opts.deadline : a->opts.wait) = s;
    } else if (k == "--run-id") {
      a->opts.runId = v;
    } else if (k == "--fabric-net") {
      a->fabricNet = v;
    } else if (k == "--dropin") {
      a->dropin = v;
    } else if (k == "--plugin-dir") {
      a->pluginDir = v;
    } else if (k == "--env") {
      if (v.find('=') == std::string::npos) return (*error = "--env " + v + ": expected NAME=VALUE", false);
      a->env.push_back(v);
    } else {
      return (*error = "unknown option " + k, false);
    }
  }
  if (a->traces.empty()) return (*error = "no trace file or directory given", false);
  return true;
}

std::string absolute(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) != nullptr ? buf : p;
}

// `run`: scripts/fabric-net cables the recorded mesh, with as many PCIe functions per cable end
// as the recording had (the plugin then finds the same ports), and starts `node` on every node.
int runJob(const Args& a, const Plan& plan) {
  if (a.fabricNet.empty() || a.dropin.empty()) {
    fprintf(stderr, "mesh_replay run: --fabric-net and --dropin are required\n");
    return 2;
  }
  char self[PATH_MAX] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) < 0) return 2;
  const char* ld = getenv("LD_LIBRARY_PATH");
  std::string libPath =
      a.pluginDir.empty() ? (ld ? ld : "") : absolute(a.pluginDir) + (ld ? std::string(":") + ld : "");
  std::vector<std::string> cmd = {a.fabricNet,
                                  "run",
                                  "--nodes",
                                  std::to_string(plan.nodes),
                                  "--topology",
                                  plan.topology,
                                  "--links",
                                  std::to_string(plan.links),
                                  "--functions",
                                  std::to_string(plan.functions),
                                  "--fn-subnets",
                                  plan.fnSubnets,
                                  "--timeout",
                                  std::to_string(static_cast<int>(a.opts.deadline) + 30),
                                  "--",
                                  "env",
                                  "LD_LIBRARY_PATH=" + libPath,
                                  "NCCL_MESH_IBVERBS_LIB=" + absolute(a.dropin)};
  cmd.insert(cmd.end(), a.env.begin(), a.env.end());
  cmd.insert(cmd.end(), {self, "node", "--plugin", a.opts.plugin, "--deadline", std::to_string(a.opts.deadline),
                         "--wait", std::to_string(a.opts.wait), "--run-id", a.opts.runId});
  if (a.opts.verbose) cmd.push_back("--verbose");
  for (const TraceFile& f : plan.files) cmd.push_back(absolute(f.path));
  printf("mesh_replay: %s\n", describePlan(plan).c_str());
  fflush(stdout);
  std::vector<char*> argv;
  for (std::string& s : cmd) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  fprintf(stderr, "mesh_replay: cannot run %s: %s\n", argv[0], strerror(errno));
  return 2;
}

// `node`: this fabric node's processes, each in its own process (a plugin per process).
int runNode(const Args& a, const Plan& plan) {
  const char* rank = getenv("VMESH_RANK");
  const char* shared = getenv("VMESH_SHARED");
  if (rank == nullptr || shared == nullptr) {
    fprintf(stderr, "mesh_replay node: run it through scripts/fabric-net (VMESH_RANK, VMESH_SHARED unset)\n");
    return 2;
  }
  int node = atoi(rank);
  e2e::setRankLabel(node);
  Options opts = a.opts;
  opts.shared = shared;
  std::vector<size_t> mine;
  for (size_t p = 0; p < plan.processes.size(); ++p) {
    if (plan.processes[p].node == node) mine.push_back(p);
  }
  if (mine.empty()) return 0;
  std::string ncclLib;
  if (e2e::parseNcclIbPlugin(opts.plugin, &ncclLib)) {
    // NCCL IB's /sys/class/infiniband (tests/e2e/nccl_ib.h) for every thread that calls it:
    // a mount namespace is per thread once threads exist, so before any starts.
    try {
      e2e::fakeIbSysfs(e2e::verbsDeviceNames());
    } catch (const std::exception& e) {
      fprintf(stderr, "mesh_replay node: %s\n", e.what());
      return 2;
    }
  }
  if (mine.size() == 1) {
    e2e::startWatchdog("replay", node, opts.deadline + 20);
    return replayProcess(plan, mine[0], opts) == 0 ? 0 : 1;
  }
  std::vector<pid_t> children;
  for (size_t p : mine) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      e2e::startWatchdog("replay", node, opts.deadline + 20);
      _exit(replayProcess(plan, p, opts) == 0 ? 0 : 1);
    }
    children.push_back(pid);
  }
  int status = 0;
  for (pid_t c : children) {
    int st = 0;
    if (waitpid(c, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) status = 1;
  }
  return status;
}

int check(const Plan& plan) {
  printf("mesh_replay: %s\n", describePlan(plan).c_str());
  for (const TraceFile& f : plan.files) {
    std::vector<bool> threads(1, false);
    size_t nThreads = 0;
    for (const mesh::trace::Record& r : f.trace.records) {
      if (r.thread >= threads.size()) threads.resize(r.thread + 1, false);
      if (!threads[r.thread]) ++nThreads;
      threads[r.thread] = true;
    }
    std::string nccl = f.trace.header.nccl.empty() ? "" : ", NCCL " + f.trace.header.nccl;
    printf("  %s: %s%s, host %s pid %ld, %zu records, %zu thread(s)%s%s%s\n", f.name.c_str(),
           f.trace.header.plugin.c_str(), nccl.c_str(), f.trace.header.host.c_str(), f.trace.header.pid,
           f.trace.records.size(), nThreads,
           f.trace.endReason.empty() ? "" : ", stopped early: ", f.trace.endReason.c_str(),
           f.trace.cut ? ", no end line (killed before exit() or an unload, or recorded before 2026-11-30)" : "");
  }
  return 0;
}

}  // namespace
}  // namespace replay

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  replay::Args a;
  std::string error;
  if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    fputs(replay::kUsage, stdout);
    return 0;
  }
  if (!replay::parseArgs(argc, argv, &a, &error)) {
    fprintf(stderr, "mesh_replay: %s\n%s", error.c_str(), replay::kUsage);
    return 2;
  }
  std::vector<replay::TraceFile> files;
  replay::Plan plan;
  if (!replay::loadTraces(a.traces, &files, &error) || !replay::makePlan(std::move(files), &plan, &error)) {
    fprintf(stderr, "mesh_replay: %s\n", error.c_str());
    return 2;
  }
  if (a.mode == "check") return replay::check(plan);
  if (a.mode == "run") return replay::runJob(a, plan);
  try {
    return replay::runNode(a, plan);
  } catch (const std::exception& e) {
    printf("REPLAY FAIL: %s\n", e.what());
    return 1;
  }
}
