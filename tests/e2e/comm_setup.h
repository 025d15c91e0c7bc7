// SPDX-License-Identifier: Apache-2.0
// Bringing comms up the way NCCL does: connect() and accept() never block; they return
// success with a NULL comm until the connection is there, and are called again with the
// same handle pointer. One thread drives every pending connect and accept round-robin,
// so no rank ever waits for one connection before starting the next (which would
// deadlock ranks that connect to each other in different orders).
// Owns: the pending connections (stable addresses: the plugin may keep state in the
// handle bytes between calls) and the comm tables that establish() returns.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "context.h"

namespace e2e {

struct PendingConn {
  bool isConnect = true;
  int peer = -1;
  int k = 0;
  int dev = -1;                         // connect on this device; -1: ctx.dev
  std::string label;                    // e.g. "connect rank0->rank2 #3"
  // connect: the handle (from the listener); accept: the listen comm.
  alignas(16) unsigned char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listenComm = nullptr;
  void* comm = nullptr;                 // the result, once non-NULL
  ncclNetDeviceHandle_v8_t* devComm = nullptr;
  bool mayFail = false;                 // an error is recorded instead of thrown
  Deadline giveUp;                      // mayFail only: stop calling at this point
  bool finished = false;
  bool timedOut = false;
  ncclResult_t rc = ncclSuccess;
  long calls = 0;
  Clock::time_point started = Clock::now();
  Clock::time_point finishedAt;
  double seconds() const { return secondsBetween(started, finished ? finishedAt : Clock::now()); }
};

class ConnectDriver {
 public:
  explicit ConnectDriver(Context& ctx) : ctx_(ctx) {}
  PendingConn* addConnect(int peer, int k, const std::string& handle, const std::string& label);
  PendingConn* addAccept(int peer, int k, void* listenComm, const std::string& label);
  // One call to every unfinished item. Throws Failure on an error of an item that may
  // not fail. Returns true if anything finished.
  bool sweep();
  bool allFinished() const;
  // Sweeps until everything finished. `extra` runs between sweeps (e.g. to pick up
  // handles as peers publish them) and returns true if it made progress. Throws Failure
  // at the deadline, listing what is still pending.
  template <typename Extra>
  void drive(const Deadline& deadline, Extra&& extra);
  void drive(const Deadline& deadline) {
    drive(deadline, [] { return false; });
  }
  std::string pendingSummary() const;
  std::deque<PendingConn>& items() { return items_; }

 private:
  void timeoutFailure(const Deadline& deadline) const;

  Context& ctx_;
  std::deque<PendingConn> items_;
};

template <typename Extra>
void ConnectDriver::drive(const Deadline& deadline, Extra&& extra) {
  while (true) {
    bool progress = extra();
    progress = sweep() || progress;
    if (allFinished()) return;
    if (deadline.expired()) timeoutFailure(deadline);
    if (!progress) pollPause(500);
  }
}

// The comms between this rank and one peer; index k in each vector.
struct PeerComms {
  std::vector<void*> send;    // connect()ed: this rank -> peer
  std::vector<void*> recv;    // accept()ed: peer -> this rank
  std::vector<void*> listen;  // the listen comms behind `recv`
  std::vector<double> connectSeconds, acceptSeconds;
};
using CommTable = std::map<int, PeerComms>;

struct EstablishSpec {
  std::vector<int> connectTo;   // peers this rank opens `count` send comms to
  std::vector<int> acceptFrom;  // peers this rank accepts `count` recv comms from
  int count = 1;
  std::string tag;              // unique per call within a scenario run (file names)
  // > 0: comm k listens and connects on device k % devices, as NCCL spreads its channels
  // over a node's NICs; 0: every comm on ctx.dev.
  int devices = 0;
};

// Listens count times per peer in acceptFrom and publishes each handle as
// h.<listener>.<connector>.<k>.<tag>; picks up the peers' handles as they appear and
// connects; drives all connects and accepts together until every comm is up.
// Every rank's spec must mirror its peers' (A connects to B <=> B accepts from A).
CommTable establish(Context& ctx, const EstablishSpec& spec, const Deadline& deadline);

// listen() once and publish the handle under `name`. Returns the listen comm.
void* listenAndPublish(Context& ctx, const std::string& name, const std::string& label, int dev = -1);

// closeSend / closeRecv / closeListen on every comm of the table, checking each result
// (all are attempted even after a failure; the first failure is thrown at the end).
void closeAll(Context& ctx, CommTable& table);

}  // namespace e2e
