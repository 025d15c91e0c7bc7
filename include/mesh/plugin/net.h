// SPDX-License-Identifier: Apache-2.0
// Core entry points behind the ABI layer, one per ncclNet call, with internal types only.
// The ABI layer validates pointers and translates; these own the semantics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "err.h"
#include "mesh/datapath/comm.h"
#include "mesh/rdma/mr_cache.h"

namespace mesh {

struct ListenComm;
class Connector;
class RelayConnector;
class TwinConnector;
class Plugin;

// What the entry points keep between calls, owned by the Plugin (never by a static: a
// static's destructor runs from __cxa_finalize after Plugin::shutdown() has closed the
// devices and unloaded libibverbs):
//  - every comm handed to NCCL with its kind, so a double close or a close through the
//    wrong entry point is an error instead of a double free, and so comms NCCL never
//    closed are released before the devices close;
//  - every connect NCCL has started and not yet seen finish, keyed by the handle buffer
//    NCCL passes on every retry (and the token in it, so a reused buffer with a new handle
//    starts afresh); an abandoned connect (a job that timed out) stays here until shutdown.
// Threads: NCCL's threads; consulted on create/close/connect only, never on the data path.
class NetTables {
 public:
  enum class Kind { Send, Recv, Listen };

  // `ports`: the local ports (LocalNic::index) a send comm's links leave on, kept until
  // forget() (sendsOnPort; the relay's choice of direction, preferIdlePorts).
  void remember(const void* comm, Kind kind, const std::vector<int>& ports = {});
  ncclResult_t forget(const void* comm, Kind kind, const char* what);
  // Whether `comm` is a send or receive comm handed to NCCL and not closed yet (*kind: which).
  bool isDataComm(const void* comm, Kind* kind);
  struct PendingConnect {
    uint64_t token = 0;
    std::shared_ptr<Connector> connector;       // a direct connect, or
    std::shared_ptr<TwinConnector> relay;      // one through a relay or two (no shared cable)
    int dev = 0;
  };

  PendingConnect pendingConnect(const void* handle, uint64_t token);
  // Returns the connect it replaces (NCCL reused the handle buffer for a new handle, so it
  // abandoned that one), for the caller to discard; an empty one otherwise.
  PendingConnect addPendingConnect(const void* handle, PendingConnect connect);
  void endPendingConnect(const void* handle);
  // Open send comms leaving on `port` (a scan: called once per relayed connect candidate).
  int sendsOnPort(int port);
  // Plugin::shutdown(), after the reactor stopped: ends the pending connects (socket
  // closed, half-built comm released) and closes every comm NCCL left open. Returns how
  // many of each it found.
  void releaseAll(Plugin* plugin, size_t* connects, size_t* comms);
  // Comms (send, receive, listen) and pending connects NCCL has not closed: what a process
  // exit leaves to the kernel (Plugin::shutdown).
  size_t openCount();

 private:
  std::mutex mutex_;
  struct Live {
    Kind kind;
    std::vector<int> ports;
  };
  std::unordered_map<const void*, Live> live_;
  std::unordered_map<const void*, PendingConnect> pending_;
};

ncclResult_t netListen(int dev, void* handle, ListenComm** out);
ncclResult_t netConnect(int dev, void* handle, const ConnOptions& opts, SendComm** out);
ncclResult_t netAccept(ListenComm* listen, RecvComm** out);
ncclResult_t netRegMr(void* comm, void* data, size_t size, int type, int dmabufFd, uint64_t offset,
                      MrHandle** out);
ncclResult_t netDeregMr(MrHandle* handle);
ncclResult_t netIsend(SendComm* comm, void* data, size_t size, int tag, MrHandle* mh, Request** out);
ncclResult_t netIrecv(RecvComm* comm, int n, void** data, const size_t* sizes, const int* tags,
                      MrHandle* const* mh, Request** out);
ncclResult_t netIflush(RecvComm* comm, int n, void** data, const int* sizes, MrHandle* const* mh,
                       Request** out);
ncclResult_t netTest(Request* req, int* done, size_t* sizes, int* count);
ncclResult_t netCloseSend(SendComm* comm);
ncclResult_t netCloseRecv(RecvComm* comm);
ncclResult_t netCloseListen(ListenComm* comm);

}  // namespace mesh
