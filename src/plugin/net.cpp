// SPDX-License-Identifier: Apache-2.0
#include "mesh/plugin/net.h"

#include <algorithm>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "mesh/connect/handshake.h"
#include "mesh/platform/check.h"
#include "mesh/platform/log.h"
#include "mesh/platform/static_state.h"
#include "mesh/plugin/plugin.h"
#include "mesh/relay/relay_service.h"
#include "mesh/relay/relay_twin.h"
#include "mesh/routing/subnet_routing.h"
#include "mesh/wire/handle_codec.h"

namespace mesh {

struct ListenComm {
  int dev = 0;
  std::shared_ptr<Listener> listener;
  TwinAccept twins;  // legs of a two-relay connection, until both are here
};

// --- NetTables ------------------------------------------------------------------------------

void NetTables::remember(const void* comm, Kind kind, const std::vector<int>& ports) {
  if (comm == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  live_[comm] = Live{kind, ports};
}

ncclResult_t NetTables::forget(const void* comm, Kind kind, const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(comm);
  MESH_REQUIRE(it != live_.end(), ncclInvalidUsage, "%s: %p is not an open comm (closed twice?)", what, comm);
  MESH_REQUIRE(it->second.kind == kind, ncclInvalidUsage, "%s: %p is a different kind of comm", what, comm);
  live_.erase(it);
  return ncclSuccess;
}

bool NetTables::isDataComm(const void* comm, Kind* kind) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(comm);
  if (it == live_.end() || it->second.kind == Kind::Listen) return false;
  *kind = it->second.kind;
  return true;
}

int NetTables::sendsOnPort(int port) {
  std::lock_guard<std::mutex> lock(mutex_);
  int n = 0;
  for (const auto& kv : live_) n += static_cast<int>(std::count(kv.second.ports.begin(), kv.second.ports.end(), port));
  return n;
}

NetTables::PendingConnect NetTables::pendingConnect(const void* handle, uint64_t token) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(handle);
  return it != pending_.end() && it->second.token == token ? it->second : PendingConnect();
}

NetTables::PendingConnect NetTables::addPendingConnect(const void* handle, PendingConnect connect) {
  std::lock_guard<std::mutex> lock(mutex_);
  PendingConnect& slot = pending_[handle];
  PendingConnect replaced = std::move(slot);
  slot = std::move(connect);
  return replaced;
}

void NetTables::endPendingConnect(const void* handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.erase(handle);
}

namespace {
ncclResult_t closeComm(Comm* comm);
}  // namespace

size_t NetTables::openCount() {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_.size() + pending_.size();
}

void NetTables::releaseAll(Plugin* plugin, size_t* connects, size_t* comms) {
  std::unordered_map<const void*, Live> live;
  std::vector<PendingConnect> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live.swap(live_);
    for (auto& kv : pending_) pending.push_back(std::move(kv.second));
    releaseStatic(pending_);  // this lives in static storage
  }
  for (PendingConnect& p : pending) {
    if (p.connector != nullptr) plugin->handshakerFor(p.dev)->discardConnect(p.connector);
    p.relay.reset();  // its own leg connect is discarded with it
  }
  for (auto& kv : live) {
    void* comm = const_cast<void*>(kv.first);
    if (kv.second.kind == Kind::Listen) {
      auto* lc = static_cast<ListenComm*>(comm);
      plugin->handshakerFor(lc->dev)->closeListener(lc->listener);
      lc->twins.clear(plugin->handshaker());
      delete lc;
    } else if (kv.second.kind == Kind::Send) {
      closeComm(static_cast<SendComm*>(comm));  // NCCL holds the SendComm*/RecvComm* as void*
    } else {
      closeComm(static_cast<RecvComm*>(comm));
    }
  }
  *connects = pending.size();
  *comms = live.size();
}

namespace {

// The connection machinery of NCCL device `dev`, once the node has a mesh device and `dev`
// is one of them.
ncclResult_t handshakerFor(int dev, Handshaker** out) {
  MESH_REQUIRE(Plugin::instance().handshaker() != nullptr, ncclInvalidUsage,
               "no mesh device (init found no usable RDMA port)");
  const NetDevice* d = nullptr;
  MESH_CHECK(Plugin::instance().device(dev, &d));
  *out = Plugin::instance().handshakerFor(dev);
  return ncclSuccess;
}

// A direct connect over the cables to the peer; with none and NCCL_MESH_RELAY=auto, a
// relayed one through the neighbours the route table names (mesh/relay/relay_service.h).
ncclResult_t startConnect(Handshaker* hs, int dev, const Handle& handle, const ConnOptions& opts,
                          NetTables::PendingConnect* out) {
  Plugin& plugin = Plugin::instance();
  std::vector<LocalNic> nics = plugin.transport(dev)->localNics();
  RouteResult route = connectRoutes(nics, handle.addrs, kMaxLinks);
  if (route.ok()) return hs->startConnect(handle, route.routes, opts, &out->connector);
  if (plugin.config().relay != RelayMode::Auto) {
    MESH_WARN("connect: %s (NCCL_MESH_RELAY=off: pairs without a cable are not relayed)", route.error.c_str());
    return ncclSystemError;
  }
  auto lookup = [nics, addrs = handle.addrs](bool mayWait) {
    return Plugin::instance().relayCandidates(addrs, nics, 0, {}, mayWait);
  };
  // Over two relays where two ways are as short (NCCL_MESH_RELAY_TWIN=1; relay_twin.h).
  out->relay = std::make_shared<TwinConnector>(hs, nics, handle, lookup, opts, plugin.relayConnectSettings(),
                                               plugin.config().relayTwin);
  return ncclSuccess;
}

}  // namespace

ncclResult_t netListen(int dev, void* handle, ListenComm** out) {
  Handshaker* hs = nullptr;
  MESH_CHECK(handshakerFor(dev, &hs));
  auto lc = std::make_unique<ListenComm>();
  lc->dev = dev;
  Handle h;
  MESH_CHECK(hs->listen(&lc->listener, &h));
  std::string error;
  uint8_t bytes[kHandleSize] = {};
  if (!encodeHandle(h, bytes, &error)) {
    MESH_WARN("listen: %s", error.c_str());
    hs->closeListener(lc->listener);
    return ncclInternalError;
  }
  memcpy(handle, bytes, kHandleSize);
  *out = lc.release();
  Plugin::instance().tables().remember(*out, NetTables::Kind::Listen);
  return ncclSuccess;
}

ncclResult_t netConnect(int dev, void* handle, const ConnOptions& opts, SendComm** out) {
  *out = nullptr;
  Handshaker* hs = nullptr;
  MESH_CHECK(handshakerFor(dev, &hs));
  Handle h;
  std::string error;
  if (!decodeHandle(static_cast<const uint8_t*>(handle), kHandleSize, &h, &error)) {
    MESH_WARN("connect: malformed handle: %s", error.c_str());
    return ncclInvalidArgument;
  }
  NetTables& tables = Plugin::instance().tables();
  NetTables::PendingConnect pending = tables.pendingConnect(handle, h.token);
  if (pending.connector == nullptr && pending.relay == nullptr) {
    pending.token = h.token;
    pending.dev = dev;
    MESH_CHECK(startConnect(hs, dev, h, opts, &pending));
    NetTables::PendingConnect replaced = tables.addPendingConnect(handle, pending);
    if (replaced.connector != nullptr) Plugin::instance().handshakerFor(replaced.dev)->discardConnect(replaced.connector);
  }
  std::unique_ptr<PreparedConn> conn;
  ncclResult_t r = pending.relay != nullptr ? pending.relay->poll(&conn) : hs->pollConnect(pending.connector, &conn);
  if (r != ncclSuccess || conn != nullptr) tables.endPendingConnect(handle);
  if (r != ncclSuccess) stats::Publisher::event(stats::kConnectFails);
  MESH_CHECK(r);
  *out = static_cast<SendComm*>(conn.release());
  if (*out != nullptr) {
    (*out)->markOpen();  // a relayed one was counted as relayed by its connector
    stats::Publisher::event(stats::kConnects);
    tables.remember(*out, NetTables::Kind::Send, (*out)->twin() != nullptr ? (*out)->twin()->localPorts() : (*out)->localPorts());
  }
  return ncclSuccess;
}

ncclResult_t netAccept(ListenComm* listen, RecvComm** out) {
  *out = nullptr;
  std::unique_ptr<PreparedConn> conn;
  Handshaker* hs = Plugin::instance().handshakerFor(listen->dev);
  std::unique_ptr<PreparedConn> ready;
  // Legs of a two-relay connection come as two accepts; NCCL gets one comm for both.
  for (int guard = 0; guard < 4 && ready == nullptr; ++guard) {
    ncclResult_t r = hs->pollAccept(listen->listener, &conn);
    if (r != ncclSuccess) stats::Publisher::event(stats::kConnectFails);
    MESH_CHECK(r);
    if (conn == nullptr) break;
    listen->twins.take(hs, std::move(conn), &ready);
  }
  if (ready == nullptr) listen->twins.dropDead(hs);
  *out = static_cast<RecvComm*>(ready.release());
  if (*out != nullptr) {
    // From a relay: counted as relayed from the sender through that relay, as the sender
    // counts it (without the origin it would read as direct from the relay node).
    if (TwinComm* t = (*out)->twin()) {
      for (int i = 0; i < 2; ++i) {
        Comm* c = t->leg(i);
        c->countAs(stats::FlowKind::Relayed, c->originAddr(), c->peerAddr(), 0);
        c->markOpen();
      }
    } else if ((*out)->originAddr() != 0) {
      (*out)->countAs(stats::FlowKind::Relayed, (*out)->originAddr(), (*out)->peerAddr(), 0);
    }
    (*out)->markOpen();
    stats::Publisher::event(stats::kAccepts);
  }
  Plugin::instance().tables().remember(*out, NetTables::Kind::Recv);
  return ncclSuccess;
}

// On the devices of the comm NCCL registers through (its links' ports; a relayed comm's leg),
// every device when the comm is not one of ours (mr_cache.h).
ncclResult_t netRegMr(void* comm, void* data, size_t size, int type, int dmabufFd, uint64_t offset,
                      MrHandle** out) {
  MrRegistry* reg = Plugin::instance().registry();
  MESH_REQUIRE(reg != nullptr, ncclInvalidUsage, "regMr: no mesh device");
  MemKind kind = dmabufFd >= 0 ? MemKind::Dmabuf : (type == kPtrCuda ? MemKind::Cuda : MemKind::Host);
  MESH_REQUIRE(type == kPtrHost || type == kPtrCuda, ncclInvalidArgument, "regMr: unknown pointer type %d", type);
  std::vector<int> devices;
  NetTables::Kind k;
  if (Plugin::instance().tables().isDataComm(comm, &k)) {
    const Comm* c = k == NetTables::Kind::Send ? static_cast<const Comm*>(static_cast<const SendComm*>(comm))
                                               : static_cast<const Comm*>(static_cast<const RecvComm*>(comm));
    devices = c->twin() != nullptr ? c->twin()->deviceIndexes() : c->deviceIndexes();  // both legs'
  }
  return reg->reg(data, size, kind, dmabufFd, offset, devices, out);
}

ncclResult_t netDeregMr(MrHandle* handle) {
  MrRegistry* reg = Plugin::instance().registry();
  MESH_REQUIRE(reg != nullptr, ncclInvalidUsage, "deregMr: no mesh device");
  return reg->dereg(handle);
}

ncclResult_t netIsend(SendComm* comm, void* data, size_t size, int tag, MrHandle* mh, Request** out) {
  if (TwinComm* t = comm->twin()) return t->isend(data, size, tag, mh, out);
  return comm->isend(data, size, tag, mh, out);
}

ncclResult_t netIrecv(RecvComm* comm, int n, void** data, const size_t* sizes, const int* tags,
                      MrHandle* const* mh, Request** out) {
  if (TwinComm* t = comm->twin()) return t->irecv(n, data, sizes, tags, mh, out);
  return comm->irecv(n, data, sizes, tags, mh, out);
}

ncclResult_t netIflush(RecvComm* comm, int n, void** data, const int* sizes, MrHandle* const* mh,
                       Request** out) {
  if (TwinComm* t = comm->twin()) return t->iflush(n, data, sizes, mh, out);
  return comm->iflush(n, data, sizes, mh, out);
}

ncclResult_t netTest(Request* req, int* done, size_t* sizes, int* count) {
  MESH_REQUIRE(req->comm != nullptr && req->kind != Request::Kind::Free, ncclInvalidUsage,
               "test: request is not in flight (already completed?)");
  *count = req->n;
  if (req->twinned) return req->comm->twin()->test(req, done, sizes);
  return req->comm->test(req, done, sizes);
}

namespace {
ncclResult_t closeComm(Comm* comm) {
  stats::Publisher::event(stats::kCloses);
  Handshaker* hs = Plugin::instance().handshaker();
  if (TwinComm* t = comm->twin()) {  // a two-relay connection: its second leg first
    discardComm(hs, t->releaseSecond());
    comm->setTwin(nullptr);
    delete t;
  }
  discardComm(hs, std::unique_ptr<PreparedConn>(comm));
  return ncclSuccess;
}
}  // namespace

ncclResult_t netCloseSend(SendComm* comm) {
  MESH_CHECK(Plugin::instance().tables().forget(comm, NetTables::Kind::Send, "closeSend"));
  return closeComm(comm);
}

ncclResult_t netCloseRecv(RecvComm* comm) {
  MESH_CHECK(Plugin::instance().tables().forget(comm, NetTables::Kind::Recv, "closeRecv"));
  return closeComm(comm);
}

ncclResult_t netCloseListen(ListenComm* comm) {
  MESH_CHECK(Plugin::instance().tables().forget(comm, NetTables::Kind::Listen, "closeListen"));
  Plugin::instance().handshakerFor(comm->dev)->closeListener(comm->listener);
  comm->twins.clear(Plugin::instance().handshaker());
  delete comm;
  return ncclSuccess;
}

}  // namespace mesh
