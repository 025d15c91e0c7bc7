// SPDX-License-Identifier: Apache-2.0
// What every scenario gets: who this rank is, the loaded plugin, the rendezvous directory
// and the global deadline. Built once by main() from the command line and the lab's
// environment (VMESH_RANK, VMESH_NODES, VMESH_SHARED, VMESH_TOPOLOGY, VMESH_LINKS).
#pragma once

#include <memory>
#include <string>

#include "e2e_util.h"
#include "plugin_net.h"
#include "rendezvous.h"

namespace e2e {

struct Context {
  std::string scenario;
  Options opts;
  int rank = -1;
  int nodes = 0;
  int dev = 0;              // the plugin device every comm uses (--dev)
  int api = 8;              // the ncclNet ABI version every call goes through (--api)
  int trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF;  // given to init (--traffic-class)
  std::string topology;     // "full", "ring", "line" or "" when unknown
  int linksPerPair = 1;     // parallel cables per pair (VMESH_LINKS)
  unsigned seed = 1;        // --seed: shuffles and patterns
  std::string pluginPath;   // what load() opens (--plugin), for scenarios that reload it
  bool verbose = false;     // echo the plugin's INFO lines
  PluginNet net;
  std::unique_ptr<Rendezvous> rv;
  Deadline deadline;        // the soft global deadline (--deadline)
  Clock::time_point started = Clock::now();
  int barrierSeq = 0;

  // A barrier with a unique name (every rank must call them in the same order).
  void barrier(const std::string& what) {
    rv->barrier(format("%03d.%s", barrierSeq++, what.c_str()), deadline);
  }
  int next(int step = 1) const { return ((rank + step) % nodes + nodes) % nodes; }
  int prev(int step = 1) const { return next(-step); }
};

// Each scenario returns the figures for its PASS line, or throws Failure.
using ScenarioFn = std::string (*)(Context& ctx);

}  // namespace e2e
