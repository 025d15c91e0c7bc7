// SPDX-License-Identifier: Apache-2.0
// Communicator contexts for ncclNet v11 and v12 (see comm_context.h).
#include "comm_context.h"

#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>

#include "abi_common.h"
#include "mesh/platform/static_state.h"
#include "mesh/plugin/plugin.h"

namespace mesh {
namespace abi {
namespace {

struct CommContext {
  uint64_t commId = 0;
  ConnOptions conn;
};

// Threads: NCCL initializes and destroys communicators from any application thread and
// calls listen/connect/setNetAttr from its proxy threads; every member is under mutex_.
class ContextRegistry {
 public:

  void* add(std::unique_ptr<CommContext> ctx, size_t* live) {
    std::lock_guard<std::mutex> lock(mutex_);
    void* key = ctx.get();
    live_[key] = std::move(ctx);
    *live = live_.size();
    return key;
  }
  bool remove(void* key, size_t* live) {
    std::lock_guard<std::mutex> lock(mutex_);
    bool found = live_.erase(key) == 1;
    *live = live_.size();
    return found;
  }
  // Copies the context out: finalize may run concurrently on another thread.
  bool find(void* key, CommContext* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    // Test-only (MESH_TEST_CONTEXT_HOLD_MS, AbiVersions.AChildForkedWhileTheProxyThread...):
    // each lookup holds the lock that long, so that a fork lands while it is held.
    static const char* hold = getenv("MESH_TEST_CONTEXT_HOLD_MS");
    static const int holdMs = hold != nullptr ? atoi(hold) : 0;
    if (holdMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(holdMs));
    auto it = live_.find(key);
    if (it == live_.end()) return false;
    *out = *it->second;
    return true;
  }
  // Contexts NCCL never finalized, and the table's own buffers, go with the library.
  void releaseAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    releaseStatic(live_);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, std::unique_ptr<CommContext>> live_;
};

// Never destroyed by the C++ runtime, as the Plugin: a library loaded before this one can
// finalize a context from its own static destructors, which run after ours at exit. Emptied
// by the library destructor below (ELF destructors run after every exit handler), so an
// unloaded library leaves no allocation behind.
ContextRegistry& contexts() {
  alignas(ContextRegistry) static unsigned char storage[sizeof(ContextRegistry)];
  static ContextRegistry* registry = new (storage) ContextRegistry();
  return *registry;
}

// A forked child leaves the table alone: another thread of its parent may have held the
// lock at the fork (NCCL's proxy thread looks a context up before every connect try), and
// that thread does not exist here to release it.
__attribute__((destructor)) void meshContextsUnload() {
  if (Plugin::inForkedChild()) return;
  contexts().releaseAll();
}

ncclResult_t lookup(void* ctx, const char* what, CommContext* out) {
  if (ctx == nullptr) {
    MESH_WARN("%s: ctx is NULL (v11 and v12 need the context init returned)", what);
    return ncclInvalidArgument;
  }
  if (!contexts().find(ctx, out)) {
    MESH_WARN("%s: ctx %p is not a live context (never returned by init, or already finalized)",
              what, ctx);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t ctxInit(int abi, void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                     ncclDebugLogger_t logFunction, ncclProfilerCallback_t /*no profiler events*/) {
  MESH_ABI_NOT_NULL(ctx, "init");
  *ctx = nullptr;
  MESH_CHECK(init(logFunction, abi));  // first, so what follows logs through NCCL
  return guarded("init", [&] {
    auto c = std::make_unique<CommContext>();
    c->commId = commId;
    MESH_CHECK(connOptions(config, "init", /*reportEveryCall=*/true, &c->conn));
    int tc = c->conn.trafficClass;
    size_t live = 0;
    *ctx = contexts().add(std::move(c), &live);
    MESH_INFO(NCCL_INIT | NCCL_NET, "init: communicator %016" PRIx64 " (traffic class %d%s), %zu live",
              commId, tc, tc < 0 ? ": NCCL_MESH_IB_TC" : "", live);
    return ncclSuccess;
  });
}

// NCCL only finalizes a context its init returned (2.28.9/2.30.7 src/plugin/net.cc), so it
// never passes NULL here; NCCL IB's finalize takes NULL silently (net_ib.cc ncclIbFinalize:
// free(ctx)), and so does this one.
ncclResult_t ctxFinalize(void* ctx) {
  if (ctx == nullptr) {
    MESH_TRACE(NCCL_INIT | NCCL_NET, "finalize: NULL context, nothing to end");
    return ncclSuccess;
  }
  return guarded("finalize", [&] {
    size_t live = 0;
    if (!contexts().remove(ctx, &live)) {
      MESH_WARN("finalize: ctx %p is not a live context (never returned by init, or already finalized)", ctx);
      return ncclInvalidArgument;
    }
    MESH_INFO(NCCL_INIT | NCCL_NET, "finalize: %zu communicator(s) still live", live);
    return ncclSuccess;
  });
}

ncclResult_t ctxListen(void* ctx, int dev, void* handle, void** listenComm) {
  return guarded("listen", [&] {
    CommContext c;
    MESH_CHECK(lookup(ctx, "listen", &c));
    return listen(dev, handle, listenComm);
  });
}

ncclResult_t ctxConnect(void* ctx, int dev, void* handle, void** sendComm,
                        ncclNetDeviceHandle_v11_t** sendDevComm) {
  return guarded("connect", [&] {
    CommContext c;
    MESH_CHECK(lookup(ctx, "connect", &c));
    return connect(dev, handle, c.conn, sendComm, sendDevComm);
  });
}

ncclResult_t ctxIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void*, void** request) {
  return isend(sendComm, data, size, tag, mhandle, request);
}

ncclResult_t ctxIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void**,
                      void** request) {
  return irecv(recvComm, n, data, sizes, tags, mhandles, request);
}

// NCCL's concurrency hints (peers and flows per peer for the coming operations). Accepted
// and not acted on: the QPs per connection are fixed by NCCL_MESH_QPS_PER_CONN when
// the connection is made, and the receiver-driven FIFO needs no per-flow tuning.
ncclResult_t ctxSetNetAttr(void* ctx, ncclNetAttr_v11_t* netAttr) {
  MESH_ABI_NOT_NULL(netAttr, "setNetAttr");
  return guarded("setNetAttr", [&] {
    CommContext c;
    MESH_CHECK(lookup(ctx, "setNetAttr", &c));
    MESH_TRACE(NCCL_NET, "setNetAttr: communicator %016" PRIx64 " send peers %d..%d flows %d..%d, "
               "recv peers %d..%d flows %d..%d (not used)", c.commId,
               netAttr->sendCommAttr.minConcurrentPeers, netAttr->sendCommAttr.maxConcurrentPeers,
               netAttr->sendCommAttr.minFlowsPerPeer, netAttr->sendCommAttr.maxFlowsPerPeer,
               netAttr->recvCommAttr.minConcurrentPeers, netAttr->recvCommAttr.maxConcurrentPeers,
               netAttr->recvCommAttr.minFlowsPerPeer, netAttr->recvCommAttr.maxFlowsPerPeer);
    return ncclSuccess;
  });
}

}  // namespace abi
}  // namespace mesh
