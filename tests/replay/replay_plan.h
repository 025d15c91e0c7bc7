// SPDX-License-Identifier: Apache-2.0
// Which traces make up the job, and the mesh that replays them: one process per recorded
// process (host + pid; a process that reloaded the plugin left one file per load, replayed
// in order by one process), placed on the fabric node its mesh addresses say, and a fabric
// cabled as the recording was (nodes, full/ring/line, links per pair).
// Addresses are read with the lab's plan (scripts/vmesh, scripts/fabric-net): link L between
// nodes i < j is 198.18.L.0/24, node n is 198.18.L.(n+1). A cable end with two PCIe functions
// (a DGX Spark; fabric-net --functions 2) has its second in the same /24 at 198.18.L.(128+n+1)
// (--fn-subnets shared) or at 198.18.(128+L).(n+1) (split). Traces recorded on the fabric or
// in the lab (scripts/nccl-e2e.sh, tests/replay/record_fixtures.sh) follow it.
// Pure code apart from reading files; unit-tested.
#pragma once

#include <string>
#include <vector>

#include "../../src/abi/trace_format.h"

namespace replay {

struct TraceFile {
  std::string path;
  std::string name;  // the file name, for messages
  mesh::trace::Trace trace;
};

struct ProcessPlan {
  int node = 0;
  long pid = 0;
  std::vector<size_t> files;  // into Plan::files, in the order they were loaded (t0)
  std::string label;          // "node1 pid 4242"
};

struct Plan {
  std::vector<TraceFile> files;
  std::vector<ProcessPlan> processes;  // by node, then pid
  int nodes = 0;
  std::string topology;  // "full", "ring" or "line" (fabric-net --topology)
  int links = 1;         // parallel links per cabled pair (fabric-net --links)
  int functions = 1;     // PCIe functions per cable end (fabric-net --functions)
  std::string fnSubnets = "shared";  // where second functions are numbered (--fn-subnets)
};

// Reads every file (a directory: its *.trace files, sorted). False with *error naming the
// file and the line on the first one that does not parse.
bool loadTraces(const std::vector<std::string>& paths, std::vector<TraceFile>* out, std::string* error);

// Groups and places the traces. False with *error when an address is outside the lab's
// plan, a trace's addresses disagree on its node, a second function has no first one beside
// it, cable ends have different numbers of functions, a node between 0 and the highest has
// no trace, or the cabling is none of full, ring and line with the same links per pair.
bool makePlan(std::vector<TraceFile> files, Plan* out, std::string* error);

// "2 nodes, full, 1 link(s) per pair: node0 pid 11 (a.trace), node1 pid 12 (b.trace)", with
// ", 2 functions per cable end (shared subnets)" before the colon when there are two.
std::string describePlan(const Plan& plan);

}  // namespace replay
