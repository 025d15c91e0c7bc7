// SPDX-License-Identifier: Apache-2.0
// Collectives as NCCL runs them over a network, for benchmarks on links with a rate: every
// channel has its own connections, each connection NCCL_STEPS (8) staging slots, and a
// channel's work is a sequence of steps (NCCL's primitives: send, recvReduceSend,
// recvReduceCopySend, recvCopySend, recv) executed in order, while receives are posted up to
// 8 steps ahead and sends stay in flight up to 8 per connection. Data goes through staging
// slots as NCCL's buffers do (a send copies its slice into a slot, a receive lands in one), so
// a region may be overwritten while an earlier send of it is still on the wire.
// Owns: the step engine (Pipeline) and the topology bound of a traffic pattern.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm_setup.h"
#include "patterns.h"
#include "transfer.h"

namespace e2e {

constexpr int kNcclSteps = 8;  // NCCL_STEPS: staging slots (and requests in flight) per connection

class Pipeline {
 public:
  enum class Op { None, Reduce, Copy };  // what a receive does with the data region (float sums)
  struct Xfer {
    int conn = -1;      // addConn's index
    size_t off = 0;     // in the data buffer
    size_t bytes = 0;
    Op op = Op::None;   // receives only
  };
  struct Step {
    std::vector<Xfer> recvs, sends;  // receives complete (and are applied) before sends post
    int afterLane = -1, afterStep = -1;  // also waits for that step of another lane to finish
  };

  Pipeline(Context& ctx, uint8_t* data, size_t dataBytes, size_t slotBytes)
      : ctx_(ctx), data_(data), dataBytes_(dataBytes), slotBytes_(slotBytes) {}
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // `tag` goes with each of the connection's isend/irecv calls (NCCL's p2p: the sender's rank).
  int addConn(void* comm, bool send, const std::string& label, int tag = 0);
  int addLane(std::vector<Step> steps);
  // NCCL's proxy tests only a connection's oldest request, once per pass (net.cc
  // sendProxyProgress / recvProxyProgress); by default every request in flight is tested each
  // pass (completion order is not promised). true: NCCL's way.
  void testOldestOnly(bool on) { oldestOnly_ = on; }
  // Runs every lane to its end and waits for every send; throws Failure on an error or at
  // the deadline. Completion times are kept per connection (completions).
  void run(const Deadline& deadline);
  // Completion time and bytes (a receive: the bytes received) of every transfer of connection
  // c in the last run, in the order they were seen complete.
  const std::vector<std::pair<Clock::time_point, size_t>>& completions(int c) const { return conns_[c].doneLog; }
  void release();  // deregisters the staging slots (before the comms close)
  // The most transfers one connection completed in a row while another connection, with
  // transfers still to come, completed none (in the last run; connections of at least two
  // transfers). A few when connections share the cables' turns; tens when one direction of a
  // cable waits for the other. Completions seen in one sweep over the connections count as
  // simultaneous: a sweep after the process was off the CPU finds several connections' work
  // done, and the order it tests them in is not the order the cables finished it.
  size_t longestStreak() const;
  // The transport calls of the last run: how many, how many returned no request (isend,
  // irecv) or not done (test), and the time spent inside them; "isend=N/null/us ...".
  std::string callSummary() const;

 private:
  struct Conn {
    void* comm = nullptr;
    bool send = false;
    std::string label;
    int tag = 0;
    HostBuffer staging;
    void* mh = nullptr;
    std::vector<Xfer> items;        // every transfer of this connection, in order
    size_t posted = 0, done = 0, consumed = 0;
    void* req[kNcclSteps] = {};
    bool ready[kNcclSteps] = {};
    std::vector<std::pair<Clock::time_point, size_t>> doneLog;  // completions()
    std::vector<uint64_t> doneSweep;                            // the sweep that saw each
  };
  struct Lane {
    std::vector<Step> steps;
    size_t cur = 0;
    bool applied = false;  // the current step's receives were applied
    size_t sent = 0;       // sends of the current step posted
  };
  bool postReceives(Conn& c);
  bool testRequests(Conn& c);
  bool advance(Lane& lane);
  bool sendOne(Conn& c, const Xfer& x);
  void apply(const Conn& c, size_t slot, const Xfer& x);

  struct Calls {
    uint64_t n = 0, idle = 0;  // idle: no request / not done
    double seconds = 0;
  };
  Calls isends_, irecvs_, tests_;
  bool oldestOnly_ = false;
  uint64_t sweep_ = 0;  // run()'s passes over the connections
  static void count(Calls* calls, Clock::time_point t0, bool idle);

  Context& ctx_;
  uint8_t* data_;
  size_t dataBytes_, slotBytes_;
  std::vector<Conn> conns_;
  std::vector<Lane> lanes_;
};

// --- the topology's bound -------------------------------------------------------------------

// Bytes each ordered pair moves per byte of the collective's buffer S: traffic[a][b].
using Traffic = std::vector<std::vector<double>>;
Traffic ringAllreduceTraffic(int n);  // NCCL's rings: rank r sends 2(n-1)/n S to r+1
Traffic treeAllreduceTraffic(int n);  // both trees: S/2 up and S/2 down on each tree edge
Traffic alltoallTraffic(int n);       // S/n to every other rank

// The largest algorithm bandwidth (S per second) the cabling allows for `traffic` when
// every cable moves `cableBytesPerS` per direction and a pair without a cable goes over a
// shortest path of cables (the best choice of paths, one path per pair); on a switch
// (topology "switch") every node's one cable carries all it sends and all it receives;
// *how describes it.
double algbwBound(const Context& ctx, const Traffic& traffic, double cableBytesPerS, std::string* how);

}  // namespace e2e
