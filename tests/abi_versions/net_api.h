// SPDX-License-Identifier: Apache-2.0
// One C++ interface over the plugin's five ncclNet tables (v8, v9, v10, v11, v12), for test
// drivers that exercise every ABI the same way (e.g. `mesh_e2e --api v8|...|v12`).
// Header-only and standalone: it needs only nccl/ (net_v12.h pulls in v11, v10, v9, v8)
// and <dlfcn.h>; it never links the plugin's code.
//
// Conventions, the same for every version:
//  - sizes are size_t; a version with int sizes gets them narrowed here, and a size its
//    integers cannot hold is refused (ncclInvalidArgument) without calling the plugin, so
//    any limit below that (v8's 1 GiB) is the plugin's own;
//  - init(...) is per NetApi object: v11/v12 create a context for it (one "communicator"),
//    finalize() ends that context; for v8..v10 init is per process and finalize() does
//    nothing (NCCL's own shims behave the same);
//  - the traffic class given to init reaches the plugin as NCCL passes it: v10 with every
//    connect, v11/v12 in init's config; v8 and v9 have no way to pass it;
//  - test() widens the plugin's int sizes; a slot it did not write (or wrote negative)
//    reads kUnwrittenSize, so callers can check it wrote exactly one size per buffer;
//  - getProperties() returns the v12 view; for older versions the fields they lack are
//    filled the way NCCL's compatibility shims fill them (railId/planeId NCCL_NET_ID_UNDEF).
//
// Usage:
//   void* lib = dlopen("libnccl-net-mesh.so", RTLD_NOW | RTLD_LOCAL);
//   netapi::NetApi net;
//   std::string why;
//   if (!net.bind(lib, 11, &why)) ...;
//   net.init(logger);  ...  net.finalize();  dlclose(lib);
#pragma once

#include <dlfcn.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "net_v12.h"

namespace netapi {

constexpr int kVersions[] = {8, 9, 10, 11, 12};
constexpr int kMaxTestSizes = 8;  // the plugin's maxRecvs
constexpr size_t kUnwrittenSize = SIZE_MAX;
// What NCCL's v8 shim reports for fields v8 lacks (MAX_NET_SIZE, MAX_COLLNET_SIZE).
constexpr size_t kV8MaxP2pBytes = size_t{1} << 30;
constexpr size_t kV8MaxCollBytes = size_t{512} << 20;

// "v8" / "8" -> 8, ...; 0 when not one of kVersions.
inline int parseVersion(const std::string& text) {
  std::string digits = (!text.empty() && (text[0] == 'v' || text[0] == 'V')) ? text.substr(1) : text;
  for (int v : kVersions) {
    if (digits == std::to_string(v)) return v;
  }
  return 0;
}

inline const char* symbolFor(int version) {
  switch (version) {
    case 8: return "ncclNetPlugin_v8";
    case 9: return "ncclNetPlugin_v9";
    case 10: return "ncclNetPlugin_v10";
    case 11: return "ncclNetPlugin_v11";
    case 12: return "ncclNetPlugin_v12";
    default: return nullptr;
  }
}

// A copy of the device's properties, whatever the version (strings copied).
struct Properties {
  std::string name;
  std::string pciPath;
  bool hasPciPath = false;
  uint64_t guid = 0;
  int ptrSupport = 0;
  int regIsGlobal = 0;
  int forceFlush = 0;
  int speed = 0;
  int port = 0;
  float latency = 0;
  int maxComms = 0;
  int maxRecvs = 0;
  int netDeviceType = 0;
  int netDeviceVersion = 0;
  int vDevCount = 0;
  int vDevs[NCCL_NET_MAX_DEVS_PER_NIC_V12] = {};
  size_t maxP2pBytes = 0;
  size_t maxCollBytes = 0;
  int maxMultiRequestSize = 0;
  int railId = NCCL_NET_ID_UNDEF;
  int planeId = NCCL_NET_ID_UNDEF;
};

class NetApi {
 public:
  NetApi() = default;
  NetApi(const NetApi&) = delete;
  NetApi& operator=(const NetApi&) = delete;

  // Resolves ncclNetPlugin_v<version> in an open library. False (reason in *why) when the
  // version is unknown, the symbol is missing, or the table has no name/init.
  bool bind(void* lib, int version, std::string* why) {
    const char* sym = symbolFor(version);
    if (sym == nullptr) {
      *why = "unknown ncclNet version " + std::to_string(version) + " (have 8, 9, 10, 11, 12)";
      return false;
    }
    dlerror();
    const void* table = dlsym(lib, sym);
    if (table == nullptr) {
      const char* err = dlerror();
      *why = std::string("dlsym(") + sym + ") failed: " + (err ? err : "no such symbol");
      return false;
    }
    return bindTable(table, version, sym, why);
  }

  // The same for a table found another way (NCCL's own IB transport inside libnccl.so.2 is
  // an ncclNet_v11_t that no symbol exports); `what` names it in *why.
  bool bindTable(const void* table, int version, const std::string& what, std::string* why) {
    if (symbolFor(version) == nullptr) {
      *why = "unknown ncclNet version " + std::to_string(version) + " (have 8, 9, 10, 11, 12)";
      return false;
    }
    // name and init are the first two members in every version.
    const ncclNet_v8_t* head = static_cast<const ncclNet_v8_t*>(table);
    if (head->name == nullptr || head->init == nullptr) {
      *why = what + " has a NULL name or init";
      return false;
    }
    version_ = version;
    table_ = table;
    ctx_ = nullptr;
    return true;
  }

  int version() const { return version_; }
  const char* symbol() const { return symbolFor(version_); }
  const char* name() const { return static_cast<const ncclNet_v8_t*>(table_)->name; }
  const void* table() const { return table_; }
  void* context() const { return ctx_; }  // v11/v12 only; NULL otherwise or before init
  int trafficClass() const { return config_.trafficClass; }

  // v11/v12: one context per NetApi; init again only after finalize() (ncclInvalidUsage
  // otherwise, without calling the plugin).
  ncclResult_t init(ncclDebugLogger_t logger, int trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF,
                    uint64_t commId = 0, ncclProfilerCallback_t profiler = nullptr) {
    if (ctx_ != nullptr) return ncclInvalidUsage;
    config_.trafficClass = trafficClass;
    switch (version_) {
      case 8: return v8()->init(logger);
      case 9: return v9()->init(logger);
      case 10: return v10()->init(logger, profiler);
      case 11: return v11()->init(&ctx_, commId, &config_, logger, profiler);
      case 12: return v12()->init(&ctx_, commId, &config_, logger, profiler);
      default: return unbound();
    }
  }
  ncclResult_t finalize() {
    if (version_ < 11) return version_ == 0 ? unbound() : ncclSuccess;
    ncclResult_t r = version_ == 11 ? v11()->finalize(ctx_) : v12()->finalize(ctx_);
    if (r == ncclSuccess) ctx_ = nullptr;
    return r;
  }

  ncclResult_t devices(int* ndev) { return call([&](auto t) { return t->devices(ndev); }); }

  ncclResult_t getProperties(int dev, Properties* out) {
    *out = Properties();
    switch (version_) {
      case 8: {
        ncclNetProperties_v8_t p;
        memset(&p, 0, sizeof(p));
        ncclResult_t r = v8()->getProperties(dev, &p);
        if (r != ncclSuccess) return r;
        copyBase(p, out);
        out->vDevCount = 1;
        out->vDevs[0] = dev;
        out->maxP2pBytes = kV8MaxP2pBytes;
        out->maxCollBytes = kV8MaxCollBytes;
        out->maxMultiRequestSize = 1;
        return ncclSuccess;
      }
      case 9:
      case 10: {
        ncclNetProperties_v9_t p;  // v10's properties are v9's
        memset(&p, 0, sizeof(p));
        ncclResult_t r = version_ == 9 ? v9()->getProperties(dev, &p) : v10()->getProperties(dev, &p);
        if (r != ncclSuccess) return r;
        copyBase(p, out);
        copyWide(p, out);
        out->maxMultiRequestSize = 1;
        return ncclSuccess;
      }
      case 11: {
        ncclNetProperties_v11_t p;
        memset(&p, 0, sizeof(p));
        ncclResult_t r = v11()->getProperties(dev, &p);
        if (r != ncclSuccess) return r;
        copyBase(p, out);
        copyWide(p, out);
        out->maxMultiRequestSize = p.maxMultiRequestSize;
        return ncclSuccess;
      }
      case 12: {
        ncclNetProperties_v12_t p;
        memset(&p, 0, sizeof(p));
        ncclResult_t r = v12()->getProperties(dev, &p);
        if (r != ncclSuccess) return r;
        copyBase(p, out);
        copyWide(p, out);
        out->maxMultiRequestSize = p.maxMultiRequestSize;
        out->railId = p.railId;
        out->planeId = p.planeId;
        return ncclSuccess;
      }
      default: return unbound();
    }
  }

  ncclResult_t listen(int dev, void* handle, void** listenComm) {
    switch (version_) {
      case 8: return v8()->listen(dev, handle, listenComm);
      case 9: return v9()->listen(dev, handle, listenComm);
      case 10: return v10()->listen(dev, handle, listenComm);
      case 11: return v11()->listen(ctx_, dev, handle, listenComm);
      case 12: return v12()->listen(ctx_, dev, handle, listenComm);
      default: return unbound();
    }
  }

  ncclResult_t connect(int dev, void* handle, void** sendComm,
                       ncclNetDeviceHandle_v8_t** sendDevComm = nullptr) {
    switch (version_) {
      case 8: return v8()->connect(dev, handle, sendComm, sendDevComm);
      case 9: return v9()->connect(dev, handle, sendComm, sendDevComm);
      case 10: return v10()->connect(dev, &config_, handle, sendComm, sendDevComm);
      case 11: return v11()->connect(ctx_, dev, handle, sendComm, sendDevComm);
      case 12: return v12()->connect(ctx_, dev, handle, sendComm, sendDevComm);
      default: return unbound();
    }
  }

  ncclResult_t accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm = nullptr) {
    return call([&](auto t) { return t->accept(listenComm, recvComm, recvDevComm); });
  }
  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
    return call([&](auto t) { return t->regMr(comm, data, size, type, mhandle); });
  }
  ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle) {
    return call([&](auto t) { return t->regMrDmaBuf(comm, data, size, type, offset, fd, mhandle); });
  }
  ncclResult_t deregMr(void* comm, void* mhandle) {
    return call([&](auto t) { return t->deregMr(comm, mhandle); });
  }

  ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
    switch (version_) {
      case 8:
        if (size > static_cast<size_t>(INT_MAX)) return ncclInvalidArgument;  // not expressible in v8
        return v8()->isend(sendComm, data, static_cast<int>(size), tag, mhandle, request);
      case 9: return v9()->isend(sendComm, data, size, tag, mhandle, request);
      case 10: return v10()->isend(sendComm, data, size, tag, mhandle, nullptr, request);
      case 11: return v11()->isend(sendComm, data, size, tag, mhandle, nullptr, request);
      case 12: return v12()->isend(sendComm, data, size, tag, mhandle, nullptr, request);
      default: return unbound();
    }
  }

  // n <= kMaxTestSizes buffers.
  ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
                     void** mhandles, void** request) {
    // NULL arrays pass through untouched, so the plugin's own argument checks can be tested.
    if (n < 0 || n > kMaxTestSizes) return ncclInvalidArgument;
    int tagCopy[kMaxTestSizes];
    size_t sizeCopy[kMaxTestSizes];
    int narrow[kMaxTestSizes];
    for (int i = 0; i < n; ++i) {
      if (tags != nullptr) tagCopy[i] = tags[i];
      if (sizes == nullptr) continue;
      sizeCopy[i] = sizes[i];
      if (version_ == 8 && sizes[i] > static_cast<size_t>(INT_MAX)) return ncclInvalidArgument;
      narrow[i] = static_cast<int>(sizes[i]);
    }
    int* t = tags != nullptr ? tagCopy : nullptr;
    size_t* s = sizes != nullptr ? sizeCopy : nullptr;
    switch (version_) {
      case 8: return v8()->irecv(recvComm, n, data, sizes != nullptr ? narrow : nullptr, t, mhandles, request);
      case 9: return v9()->irecv(recvComm, n, data, s, t, mhandles, request);
      case 10: return v10()->irecv(recvComm, n, data, s, t, mhandles, nullptr, request);
      case 11: return v11()->irecv(recvComm, n, data, s, t, mhandles, nullptr, request);
      case 12: return v12()->irecv(recvComm, n, data, s, t, mhandles, nullptr, request);
      default: return unbound();
    }
  }

  // iflush's sizes are int in every version.
  ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
    return call([&](auto t) { return t->iflush(recvComm, n, data, sizes, mhandles, request); });
  }

  // `sizes` (may be NULL) receives nsizes <= kMaxTestSizes entries: 1 for a send, n for a
  // grouped receive; see kUnwrittenSize above.
  ncclResult_t test(void* request, int* done, size_t* sizes, int nsizes) {
    if (nsizes < 0 || nsizes > kMaxTestSizes) return ncclInvalidArgument;
    int narrow[kMaxTestSizes];
    for (int i = 0; i < kMaxTestSizes; ++i) narrow[i] = INT_MIN;
    ncclResult_t r = call([&](auto t) { return t->test(request, done, sizes ? narrow : nullptr); });
    if (sizes != nullptr) {
      for (int i = 0; i < nsizes; ++i) {
        sizes[i] = narrow[i] < 0 ? kUnwrittenSize : static_cast<size_t>(narrow[i]);
      }
    }
    return r;
  }

  ncclResult_t closeSend(void* sendComm) { return call([&](auto t) { return t->closeSend(sendComm); }); }
  ncclResult_t closeRecv(void* recvComm) { return call([&](auto t) { return t->closeRecv(recvComm); }); }
  ncclResult_t closeListen(void* listenComm) {
    return call([&](auto t) { return t->closeListen(listenComm); });
  }
  // NCCL calls these two only when the table has them (NCCL's own IB transport leaves both
  // NULL); a NULL one is skipped the same way here. The plugin's own tables are checked
  // member by member in tests/abi.
  ncclResult_t getDeviceMr(void* comm, void* mhandle, void** dptr) {
    return call([&](auto t) {
      if (t->getDeviceMr == nullptr) {
        if (dptr != nullptr) *dptr = nullptr;
        return ncclSuccess;
      }
      return t->getDeviceMr(comm, mhandle, dptr);
    });
  }
  ncclResult_t irecvConsumed(void* recvComm, int n, void* request) {
    return call([&](auto t) {
      return t->irecvConsumed == nullptr ? ncclSuccess : t->irecvConsumed(recvComm, n, request);
    });
  }

 private:
  const ncclNet_v8_t* v8() const { return static_cast<const ncclNet_v8_t*>(table_); }
  const ncclNet_v9_t* v9() const { return static_cast<const ncclNet_v9_t*>(table_); }
  const ncclNet_v10_t* v10() const { return static_cast<const ncclNet_v10_t*>(table_); }
  const ncclNet_v11_t* v11() const { return static_cast<const ncclNet_v11_t*>(table_); }
  const ncclNet_v12_t* v12() const { return static_cast<const ncclNet_v12_t*>(table_); }
  static ncclResult_t unbound() { return ncclInvalidUsage; }

  // For entry points with the same signature in every version.
  template <typename Fn>
  ncclResult_t call(Fn&& fn) const {
    switch (version_) {
      case 8: return fn(v8());
      case 9: return fn(v9());
      case 10: return fn(v10());
      case 11: return fn(v11());
      case 12: return fn(v12());
      default: return unbound();
    }
  }

  template <typename P>
  static void copyBase(const P& p, Properties* out) {
    out->name = p.name ? p.name : "";
    out->hasPciPath = p.pciPath != nullptr;
    out->pciPath = p.pciPath ? p.pciPath : "";
    out->guid = p.guid;
    out->ptrSupport = p.ptrSupport;
    out->regIsGlobal = p.regIsGlobal;
    out->speed = p.speed;
    out->port = p.port;
    out->latency = p.latency;
    out->maxComms = p.maxComms;
    out->maxRecvs = p.maxRecvs;
    out->netDeviceType = p.netDeviceType;
    out->netDeviceVersion = p.netDeviceVersion;
  }
  template <typename P>
  static void copyWide(const P& p, Properties* out) {
    out->forceFlush = p.forceFlush;
    out->vDevCount = p.vProps.ndevs;
    int cap = static_cast<int>(sizeof(p.vProps.devs) / sizeof(p.vProps.devs[0]));
    for (int i = 0; i < p.vProps.ndevs && i < cap; ++i) out->vDevs[i] = p.vProps.devs[i];
    out->maxP2pBytes = p.maxP2pBytes;
    out->maxCollBytes = p.maxCollBytes;
  }

  int version_ = 0;
  const void* table_ = nullptr;
  void* ctx_ = nullptr;
  ncclNetCommConfig_v11_t config_ = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
};

}  // namespace netapi
