// The ncclNet v11 ABI (NCCL 2.28+). A thin adapter over abi_common.h, plus the one thing
// v11 adds: a context per communicator.
//
// NCCL calls init(&ctx, commId, config, ...) for every communicator and finalize(ctx) when
// it is destroyed; listen/connect name the communicator by its ctx. Underneath, the plugin
// is still initialized once per process (Plugin::init is idempotent) and torn down only by
// the library destructor: finalizing the last context frees the context, nothing more.
// A context carries what the communicator's config asked for (its traffic class).
//
// Contexts are looked up in a registry rather than dereferenced, so a NULL, stale or
// foreign ctx is an error with a WARN, never a crash. The lookup costs a mutex on listen and
// connect only (connection setup), never on the data path.
// makeVDevice stays NULL, as in v9 (see net_v9.cpp).
#include <cinttypes>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "abi_common.h"
#include "net_v11.h"

namespace mesh {
namespace {

struct CommContext {
  uint64_t commId = 0;
  ConnOptions conn;
};

// Threads: NCCL initializes and destroys communicators from any application thread and
// calls listen/connect/setNetAttr from its proxy threads; every member is under mutex_.
class ContextRegistry {
 public:
  ~ContextRegistry() = default;  // contexts NCCL never finalized die with the library

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
    auto it = live_.find(key);
    if (it == live_.end()) return false;
    *out = *it->second;
    return true;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, std::unique_ptr<CommContext>> live_;
};

ContextRegistry gContexts;

ncclResult_t lookup(void* ctx, const char* what, CommContext* out) {
  if (ctx == nullptr) {
    MESH_WARN("%s: ctx is NULL (v11 needs the context init returned)", what);
    return ncclInvalidArgument;
  }
  if (!gContexts.find(ctx, out)) {
    MESH_WARN("%s: ctx %p is not a live context (never returned by init, or already finalized)",
              what, ctx);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t v11Init(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                     ncclDebugLogger_t logFunction, ncclProfilerCallback_t /*no profiler events*/) {
  MESH_ABI_NOT_NULL(ctx, "init");
  *ctx = nullptr;
  MESH_CHECK(abi::init(logFunction));  // first, so what follows logs through NCCL
  return abi::guarded("init", [&] {
    auto c = std::make_unique<CommContext>();
    c->commId = commId;
    MESH_CHECK(abi::connOptions(config, "init", &c->conn));
    int tc = c->conn.trafficClass;
    size_t live = 0;
    *ctx = gContexts.add(std::move(c), &live);
    MESH_INFO(NCCL_INIT | NCCL_NET, "init: communicator %016" PRIx64 " (traffic class %d%s), %zu live",
              commId, tc, tc < 0 ? ": NCCL_MESH_IB_TC" : "", live);
    return ncclSuccess;
  });
}

// NCCL only finalizes a context its init returned (2.28.9/2.30.7 src/plugin/net.cc), so it
// never passes NULL here; NCCL IB's finalize takes NULL silently (net_ib.cc ncclIbFinalize:
// free(ctx)), and so does this one.
ncclResult_t v11Finalize(void* ctx) {
  if (ctx == nullptr) {
    MESH_TRACE(NCCL_INIT | NCCL_NET, "finalize: NULL context, nothing to end");
    return ncclSuccess;
  }
  return abi::guarded("finalize", [&] {
    size_t live = 0;
    if (!gContexts.remove(ctx, &live)) {
      MESH_WARN("finalize: ctx %p is not a live context (never returned by init, or already finalized)", ctx);
      return ncclInvalidArgument;
    }
    MESH_INFO(NCCL_INIT | NCCL_NET, "finalize: %zu communicator(s) still live", live);
    return ncclSuccess;
  });
}

ncclResult_t v11Listen(void* ctx, int dev, void* handle, void** listenComm) {
  return abi::guarded("listen", [&] {
    CommContext c;
    MESH_CHECK(lookup(ctx, "listen", &c));
    return abi::listen(dev, handle, listenComm);
  });
}

ncclResult_t v11Connect(void* ctx, int dev, void* handle, void** sendComm,
                        ncclNetDeviceHandle_v11_t** sendDevComm) {
  return abi::guarded("connect", [&] {
    CommContext c;
    MESH_CHECK(lookup(ctx, "connect", &c));
    return abi::connect(dev, handle, c.conn, sendComm, sendDevComm);
  });
}

ncclResult_t v11Isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void*, void** request) {
  return abi::isend(sendComm, data, size, tag, mhandle, request);
}

ncclResult_t v11Irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void**,
                      void** request) {
  return abi::irecv(recvComm, n, data, sizes, tags, mhandles, request);
}

// NCCL's concurrency hints (peers and flows per peer for the coming operations). Accepted
// and not acted on: the QPs per connection are fixed by NCCL_MESH_QPS_PER_CONN when
// the connection is made, and the receiver-driven FIFO needs no per-flow tuning.
ncclResult_t v11SetNetAttr(void* ctx, ncclNetAttr_v11_t* netAttr) {
  MESH_ABI_NOT_NULL(netAttr, "setNetAttr");
  return abi::guarded("setNetAttr", [&] {
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

}  // namespace
}  // namespace mesh

extern "C" __attribute__((visibility("default"))) const ncclNet_v11_t ncclNetPlugin_v11 = {
    "Mesh",
    mesh::v11Init,
    mesh::abi::devices,
    mesh::abi::getProperties<ncclNetProperties_v11_t>,
    mesh::v11Listen,
    mesh::v11Connect,
    mesh::abi::accept,
    mesh::abi::regMr,
    mesh::abi::regMrDmaBuf,
    mesh::abi::deregMr,
    mesh::v11Isend,
    mesh::v11Irecv,
    mesh::abi::iflush,
    mesh::abi::test,
    mesh::abi::closeSend,
    mesh::abi::closeRecv,
    mesh::abi::closeListen,
    mesh::abi::getDeviceMr,
    mesh::abi::irecvConsumed,
    nullptr,  // makeVDevice
    mesh::v11Finalize,
    mesh::v11SetNetAttr,
};
