// SPDX-License-Identifier: Apache-2.0
// Replays one recorded process against the plugin, loaded as NCCL loads it: dlopen, then
// the recorded ncclNetPlugin_v<N> table (tests/abi_versions/net_api.h). One thread per
// recorded thread, each making its calls in recorded order; a call waits until the calls
// of other threads that touched the same comm, registration, request or context before it
// are done. How each recorded outcome is reproduced and checked:
//  - "not yet" (a NULL comm or request, recorded once with the retries counted): the call
//    is made once; the call that got an object is retried while the plugin says "not yet",
//    as NCCL's proxy does, until a deadline (--wait);
//  - listen publishes the fresh handle in the rendezvous directory under the recorded
//    handle's key; connect takes it from there;
//  - isend fills its buffer with a pattern of (connection, tag, message number); a receive
//    checks every byte it was told arrived against the same pattern;
//  - test is polled until the recorded outcome, its sizes compared.
// Every difference is a DIVERGENCE line naming the trace file, the line and the recorded
// call, with what NCCL got and what the replay got. A call that NCCL saw succeed and that
// fails now, or that never completes, stops the process (its later calls depend on it);
// wrong sizes and wrong data are reported and the replay goes on.
#pragma once

#include <string>

#include "replay_plan.h"

namespace replay {

struct Options {
  std::string plugin = "libnccl-net-mesh.so";  // as NCCL opens it (LD_LIBRARY_PATH)
  std::string shared;                          // rendezvous directory shared by every process
  std::string runId = "1";
  double deadline = 120;  // the whole replay
  double wait = 30;       // one call's retries, one test, one handle, one dependency
  bool verbose = false;
};

// Replays plan.processes[process] (its files in order); prints PASS/FAIL lines and every
// divergence. Returns the number of divergences; never returns after a fatal one (the
// process exits 1 without unloading the plugin, as a failed NCCL job would).
int replayProcess(const Plan& plan, size_t process, const Options& opts);

}  // namespace replay
