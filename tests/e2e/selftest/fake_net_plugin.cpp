// SPDX-License-Identifier: Apache-2.0
// A stand-in ncclNet v8 plugin over TCP, for testing mesh_e2e itself on one host without
// RDMA (the e2e selftest tier). NOT a model of the real plugin's internals; it only keeps
// the ABI semantics the driver relies on:
//  - connect/accept never block: a helper thread per pending connect; connect returns the
//    comm only after the listener's side called accept() (it sends the ACK then);
//  - receiver-driven isend: a NULL request until the receiver's irecv (a CTS message) with a
//    buffer of that tag has arrived; grouped receives of up to 8 tagged buffers, sizes
//    reported per buffer; a send larger than its buffer is truncated to it;
//  - a peer that dies or closes turns pending requests into ncclRemoteError;
//  - the conn INFO lines and the routing WARN of the real plugin, with lab-style addresses
//    computed from VMESH_RANK/VMESH_NODES/VMESH_TOPOLOGY/VMESH_LINKS;
//  - NCCL_MESH_ACCEPT_WAIT_MS (at least NCCL_MESH_CONNECT_TIMEOUT_MS) bounds a connect to a
//    listener that never accepts.
// Listeners bind all addresses and publish VMESH_MGMT_ADDR (or 127.0.0.1) in the handle.
// Fault injection for testing the driver's checks: FAKE_CORRUPT (flip a byte of every
// message > 1000 B), FAKE_BADSIZE (report 4097 for 4096-byte messages), FAKE_WRONG_NETDEV
// (log conn lines naming the wrong netdev), FAKE_LEAK_FD (leak an fd per connect),
// FAKE_HANG_CONNECT (connect never completes). Built with FAKE_NCCL_IB it is a stand-in
// libnccl.so.2 instead (see the end of this file).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "net_v11.h"

namespace {

ncclDebugLogger_t gLog;
std::mutex gMu;
int gRank = 0, gNodes = 1, gLinks = 1;
std::string gTopo = "full";
std::atomic<int> gQpn{100};

#define LOG(level, ...) do { if (gLog) gLog(level, NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); } while (0)

struct Handle { uint32_t magic; uint16_t port; int32_t rank; uint32_t ip; };
enum : uint32_t { kHello = 1, kAck, kCts, kData };
struct Hdr { uint32_t type; int32_t a; int32_t b; int32_t c; int32_t sizes[8]; int32_t tags[8]; };

bool writeAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    c += w, n -= static_cast<size_t>(w);
  }
  return true;
}
bool readAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t r = recv(fd, c, n, 0);
    if (r <= 0) return false;
    c += r, n -= static_cast<size_t>(r);
  }
  return true;
}

std::vector<std::pair<int, int>> pairs() {
  std::vector<std::pair<int, int>> out;
  if (gTopo == "full" || gTopo == "switch") {  // a switch: every pair reaches the other
    for (int i = 0; i < gNodes; ++i) for (int j = i + 1; j < gNodes; ++j) out.push_back({i, j});
  } else if (gTopo == "line") {
    for (int i = 0; i + 1 < gNodes; ++i) out.push_back({i, i + 1});
  } else {
    std::map<std::pair<int, int>, int> s;
    for (int i = 0; i < gNodes; ++i) {
      int a = i, b = (i + 1) % gNodes;
      if (a != b) s[{std::min(a, b), std::max(a, b)}] = 1;
    }
    for (auto& kv : s) out.push_back(kv.first);
  }
  return out;
}
// First link index between me and peer, or -1 when not cabled.
int linkIndex(int peer) {
  int idx = 0;
  for (auto& p : pairs()) {
    if ((p.first == gRank && p.second == peer) || (p.first == peer && p.second == gRank)) return idx;
    idx += gLinks;
  }
  return -1;
}
void logConn(const char* dir, int peer) {
  int l0 = linkIndex(peer);
  for (int n = 0; n < gLinks; ++n) {
    int L = l0 + n;
    std::string nd = "p" + std::to_string(getenv("FAKE_WRONG_NETDEV") ? (peer + 1) % gNodes : peer) + (n ? std::string(1, static_cast<char>('a' + n)) : "");
    LOG(NCCL_LOG_INFO, "NET/Mesh : conn %s peer=198.18.%d.%d link=%d local=rxe_%s:1/%s addr=198.18.%d.%d gid_index=1 qpn=%d mtu=4096 extra=1",
        dir, L, peer + 1, n, nd.c_str(), nd.c_str(), L, gRank + 1, gQpn++);
  }
}

struct Req {
  bool send;
  bool done = false, error = false;
  int n = 1;
  void* data[8];
  int caps[8];
  int got[8];
  int remaining = 0;
};

struct Listen {
  int fd = -1;
  std::thread th;
  std::deque<std::pair<int, int>> ready;  // fd, peer rank
};

struct Cts { int seq, n; int sizes[8], tags[8]; bool used[8]; };
struct WriteItem { int seq, idx; void* data; int size; Req* req; };

struct Comm {
  bool send;
  int fd = -1;
  int peer = -1;
  bool error = false;
  std::thread reader, writer;
  std::deque<Cts> cts;                  // send side
  std::deque<WriteItem> wq;             // send side
  std::condition_variable cv;
  bool closing = false;
  std::map<int, Req*> posted;           // recv side, by seq
  int nextSeq = 0;
  std::mutex wmu;
};

struct Pending {
  std::thread th;
  bool ready = false, failed = false;
  int fd = -1;
  int peer;
};
std::map<void*, Pending*> gPending;  // by handle pointer

void readerSend(Comm* c) {
  Hdr h;
  while (readAll(c->fd, &h, sizeof(h))) {
    if (h.type != kCts) break;
    std::lock_guard<std::mutex> l(gMu);
    Cts x;
    x.seq = h.a, x.n = h.b;
    for (int i = 0; i < 8; ++i) x.sizes[i] = h.sizes[i], x.tags[i] = h.tags[i], x.used[i] = false;
    c->cts.push_back(x);
  }
  std::lock_guard<std::mutex> l(gMu);
  c->error = true;
  c->cv.notify_all();
}

void writerSend(Comm* c) {
  for (;;) {
    WriteItem w;
    {
      std::unique_lock<std::mutex> l(gMu);
      c->cv.wait(l, [&] { return c->closing || !c->wq.empty(); });
      if (c->wq.empty()) return;
      w = c->wq.front();
      c->wq.pop_front();
    }
    Hdr h{};
    h.type = kData, h.a = w.seq, h.b = w.idx, h.c = w.size;
    bool ok = writeAll(c->fd, &h, sizeof(h)) && writeAll(c->fd, w.data, static_cast<size_t>(w.size));
    std::lock_guard<std::mutex> l(gMu);
    if (ok) w.req->done = true; else { w.req->error = true; c->error = true; }
  }
}

void readerRecv(Comm* c) {
  Hdr h;
  while (readAll(c->fd, &h, sizeof(h))) {
    if (h.type != kData) break;
    Req* r;
    {
      std::lock_guard<std::mutex> l(gMu);
      auto it = c->posted.find(h.a);
      if (it == c->posted.end()) break;
      r = it->second;
    }
    if (h.c > r->caps[h.b]) break;
    if (!readAll(c->fd, r->data[h.b], static_cast<size_t>(h.c))) break;
    std::lock_guard<std::mutex> l(gMu);
    r->got[h.b] = h.c + (getenv("FAKE_BADSIZE") && h.c == 4096 ? 1 : 0);
    if (getenv("FAKE_CORRUPT") && h.c > 1000) static_cast<char*>(r->data[h.b])[777] ^= 1;
    if (--r->remaining == 0) { r->done = true; c->posted.erase(h.a); }
  }
  std::lock_guard<std::mutex> l(gMu);
  c->error = true;
  for (auto& kv : c->posted) kv.second->error = true;
}

ncclResult_t fInit(ncclDebugLogger_t f) {
  gLog = f;
  if (getenv("VMESH_RANK")) gRank = atoi(getenv("VMESH_RANK"));
  if (getenv("VMESH_NODES")) gNodes = atoi(getenv("VMESH_NODES"));
  if (getenv("VMESH_LINKS")) gLinks = atoi(getenv("VMESH_LINKS"));
  if (getenv("VMESH_TOPOLOGY")) gTopo = getenv("VMESH_TOPOLOGY");
  LOG(NCCL_LOG_INFO, "NET/Mesh : fake plugin rank %d of %d topo %s links %d", gRank, gNodes, gTopo.c_str(), gLinks);
  return ncclSuccess;
}
ncclResult_t fDevices(int* n) { *n = 1; return ncclSuccess; }
ncclResult_t fProps(int, ncclNetProperties_v8_t* p) {
  memset(p, 0, sizeof(*p));
  static char name[] = "fake";
  p->name = name;
  p->ptrSupport = NCCL_PTR_HOST;
  p->speed = 1000;
  p->maxComms = 65536;
  p->maxRecvs = 8;
  return ncclSuccess;
}
ncclResult_t fListen(int, void* handle, void** lc) {
  Listen* L = new Listen;
  L->fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  bind(L->fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  listen(L->fd, 64);
  socklen_t len = sizeof(a);
  getsockname(L->fd, reinterpret_cast<sockaddr*>(&a), &len);
  const char* mg = getenv("VMESH_MGMT_ADDR");
  Handle h{0x4b414b46, ntohs(a.sin_port), gRank, inet_addr(mg && *mg ? mg : "127.0.0.1")};
  memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  memcpy(handle, &h, sizeof(h));
  L->th = std::thread([L] {
    for (;;) {
      int fd = accept(L->fd, nullptr, nullptr);
      if (fd < 0) return;
      timeval tv{5, 0};  // a connector that never says hello must not wedge closeListen
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      Hdr hh;
      if (!readAll(fd, &hh, sizeof(hh)) || hh.type != kHello) { close(fd); continue; }
      timeval zero{0, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &zero, sizeof(zero));
      std::lock_guard<std::mutex> l(gMu);
      L->ready.push_back({fd, hh.a});
    }
  });
  *lc = L;
  return ncclSuccess;
}
ncclResult_t fConnect(int, void* handle, void** sc, ncclNetDeviceHandle_v8_t**) {
  *sc = nullptr;
  std::unique_lock<std::mutex> l(gMu);
  auto it = gPending.find(handle);
  if (it == gPending.end()) {
    Handle h;
    memcpy(&h, handle, sizeof(h));
    if (h.magic != 0x4b414b46) { LOG(NCCL_LOG_WARN, "NET/Mesh : bad handle"); return ncclInvalidUsage; }
    if (linkIndex(h.rank) < 0) {
      LOG(NCCL_LOG_WARN, "NET/Mesh : no local RoCEv2 port shares a subnet with peer rank %d (fake)", h.rank);
      return ncclSystemError;
    }
    Pending* p = new Pending;
    p->peer = h.rank;
    gPending[handle] = p;
    int port = h.port;
    uint32_t ip = h.ip;
    // The wait for accept, as the plugin's: NCCL_MESH_ACCEPT_WAIT_MS, at least the timeout.
    const char* t = getenv("NCCL_MESH_CONNECT_TIMEOUT_MS");
    const char* w = getenv("NCCL_MESH_ACCEPT_WAIT_MS");
    int tmo = std::max(t ? atoi(t) : 30000, w ? atoi(w) : 1800000);
    p->th = std::thread([p, port, tmo, ip] {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = ip;
      a.sin_port = htons(static_cast<uint16_t>(port));
      int one = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      Hdr hh{};
      hh.type = kHello, hh.a = gRank;
      ok = ok && writeAll(fd, &hh, sizeof(hh));
      timeval tv{tmo / 1000, (tmo % 1000) * 1000};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ok = ok && readAll(fd, &hh, sizeof(hh)) && hh.type == kAck;
      timeval zero{0, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &zero, sizeof(zero));
      std::lock_guard<std::mutex> l2(gMu);
      if (ok) { p->ready = true; p->fd = fd; } else { p->failed = true; close(fd); }
    });
    return ncclSuccess;
  }
  Pending* p = it->second;
  if ((!p->ready && !p->failed) || getenv("FAKE_HANG_CONNECT")) return ncclSuccess;
  gPending.erase(it);
  l.unlock();
  p->th.join();
  if (p->failed) {
    LOG(NCCL_LOG_WARN, "NET/Mesh : connect to rank %d failed (refused, closed or timed out)", p->peer);
    delete p;
    return ncclSystemError;
  }
  if (getenv("FAKE_LEAK_FD") && dup(0) < 0) LOG(NCCL_LOG_WARN, "NET/Mesh : FAKE_LEAK_FD: dup failed");
  Comm* c = new Comm;
  c->send = true;
  c->fd = p->fd;
  c->peer = p->peer;
  delete p;
  c->reader = std::thread(readerSend, c);
  c->writer = std::thread(writerSend, c);
  logConn("send", c->peer);
  *sc = c;
  return ncclSuccess;
}
ncclResult_t fAccept(void* lc, void** rc, ncclNetDeviceHandle_v8_t**) {
  Listen* L = static_cast<Listen*>(lc);
  *rc = nullptr;
  std::pair<int, int> got;
  {
    std::lock_guard<std::mutex> l(gMu);
    if (L->ready.empty()) return ncclSuccess;
    got = L->ready.front();
    L->ready.pop_front();
  }
  Hdr hh{};
  hh.type = kAck;
  if (!writeAll(got.first, &hh, sizeof(hh))) return ncclSystemError;
  Comm* c = new Comm;
  c->send = false;
  c->fd = got.first;
  c->peer = got.second;
  c->reader = std::thread(readerRecv, c);
  logConn("recv", c->peer);
  *rc = c;
  return ncclSuccess;
}
ncclResult_t fRegMr(void*, void*, size_t, int, void** mh) { *mh = new int(1); return ncclSuccess; }
ncclResult_t fRegMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void**) { return ncclInternalError; }
ncclResult_t fDeregMr(void*, void* mh) { delete static_cast<int*>(mh); return ncclSuccess; }
ncclResult_t fIsend(void* sc, void* data, int size, int tag, void*, void** req) {
  Comm* c = static_cast<Comm*>(sc);
  std::lock_guard<std::mutex> l(gMu);
  *req = nullptr;
  if (c->error) return ncclRemoteError;
  if (c->cts.empty()) return ncclSuccess;
  Cts& x = c->cts.front();
  int idx = -1;
  for (int i = 0; i < x.n; ++i) if (!x.used[i] && x.tags[i] == tag) { idx = i; break; }
  if (idx < 0) return ncclSuccess;
  if (size > x.sizes[idx]) {  // as NCCL IB and the real plugin: truncate to the posted size
    LOG(NCCL_LOG_WARN, "NET/Mesh : send %d > recv %d: truncated", size, x.sizes[idx]);
    size = x.sizes[idx];
  }
  x.used[idx] = true;
  Req* r = new Req;
  r->send = true;
  c->wq.push_back({x.seq, idx, data, size, r});
  bool all = true;
  for (int i = 0; i < x.n; ++i) all = all && x.used[i];
  if (all) c->cts.pop_front();
  c->cv.notify_all();
  *req = r;
  return ncclSuccess;
}
ncclResult_t fIrecv(void* rc, int n, void** data, int* sizes, int* tags, void**, void** req) {
  Comm* c = static_cast<Comm*>(rc);
  *req = nullptr;
  Req* r = new Req;
  r->send = false;
  r->n = n;
  r->remaining = n;
  Hdr h{};
  h.type = kCts;
  h.b = n;
  for (int i = 0; i < n; ++i) {
    r->data[i] = data[i], r->caps[i] = sizes[i], r->got[i] = 0;
    h.sizes[i] = sizes[i], h.tags[i] = tags[i];
  }
  {
    std::lock_guard<std::mutex> l(gMu);
    if (c->error) { delete r; return ncclRemoteError; }
    h.a = c->nextSeq++;
    c->posted[h.a] = r;
  }
  std::lock_guard<std::mutex> w(c->wmu);
  if (!writeAll(c->fd, &h, sizeof(h))) return ncclRemoteError;
  *req = r;
  return ncclSuccess;
}
ncclResult_t fIflush(void*, int, void**, int*, void**, void** req) { *req = nullptr; return ncclSuccess; }
ncclResult_t fTest(void* request, int* done, int* sizes) {
  Req* r = static_cast<Req*>(request);
  std::lock_guard<std::mutex> l(gMu);
  *done = 0;
  if (r->error) return ncclRemoteError;
  if (!r->done) return ncclSuccess;
  *done = 1;
  if (sizes) for (int i = 0; i < r->n; ++i) sizes[i] = r->send ? 0 : r->got[i];
  delete r;
  return ncclSuccess;
}
ncclResult_t fCloseSend(void* sc) {
  Comm* c = static_cast<Comm*>(sc);
  { std::lock_guard<std::mutex> l(gMu); c->closing = true; c->cv.notify_all(); }
  shutdown(c->fd, SHUT_RDWR);
  c->reader.join();
  c->writer.join();
  close(c->fd);
  delete c;
  return ncclSuccess;
}
ncclResult_t fCloseRecv(void* rc) {
  Comm* c = static_cast<Comm*>(rc);
  shutdown(c->fd, SHUT_RDWR);
  c->reader.join();
  close(c->fd);
  delete c;
  return ncclSuccess;
}
ncclResult_t fCloseListen(void* lc) {
  Listen* L = static_cast<Listen*>(lc);
  shutdown(L->fd, SHUT_RDWR);
  L->th.join();
  close(L->fd);
  for (auto& p : L->ready) close(p.first);
  delete L;
  return ncclSuccess;
}
ncclResult_t fGetDeviceMr(void*, void*, void** d) { *d = nullptr; return ncclSuccess; }
ncclResult_t fConsumed(void*, int, void*) { return ncclSuccess; }

}  // namespace

#ifndef FAKE_NCCL_IB
extern "C" __attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    "FakeMesh", fInit, fDevices, fProps, fListen, fConnect, fAccept, fRegMr, fRegMrDmaBuf,
    fDeregMr, fIsend, fIrecv, fIflush, fTest, fCloseSend, fCloseRecv, fCloseListen,
    fGetDeviceMr, fConsumed};
#else
// Built as a stand-in libnccl.so.2 for mesh_e2e --plugin nccl-ib:<this> (tests/e2e/nccl_ib.h):
// the same transport as NCCL's own IB one is found in a real libnccl, a local (unexported)
// v11 table named ncclNetIb with name "IB", plus ncclGetVersion. FAKE_NCCL_IB_WRONG_SIZE
// gives the table a v8 table's size instead, which the loader must refuse.
#ifndef FAKE_NCCL_IB_WRONG_SIZE
namespace {
ncclResult_t gInit(void** ctx, uint64_t, ncclNetCommConfig_v11_t*, ncclDebugLogger_t f, ncclProfilerCallback_t) {
  static int context;
  *ctx = &context;
  return fInit(f);
}
ncclResult_t gProps(int d, ncclNetProperties_v11_t* p) {
  ncclNetProperties_v8_t v8;
  fProps(d, &v8);
  memset(p, 0, sizeof(*p));
  p->name = v8.name;
  p->ptrSupport = v8.ptrSupport;
  p->speed = v8.speed;
  p->maxComms = v8.maxComms;
  p->maxRecvs = v8.maxRecvs;
  p->maxP2pBytes = size_t{1} << 30;
  p->maxCollBytes = size_t{1} << 30;
  return ncclSuccess;
}
ncclResult_t gListen(void*, int d, void* handle, void** lc) { return fListen(d, handle, lc); }
ncclResult_t gConnect(void*, int d, void* handle, void** sc, ncclNetDeviceHandle_v11_t** dc) {
  return fConnect(d, handle, sc, dc);
}
ncclResult_t gIsend(void* sc, void* data, size_t size, int tag, void* mh, void*, void** req) {
  return fIsend(sc, data, static_cast<int>(size), tag, mh, req);
}
ncclResult_t gIrecv(void* rc, int n, void** data, size_t* sizes, int* tags, void** mh, void**, void** req) {
  int narrow[8];
  for (int i = 0; i < n && i < 8; ++i) narrow[i] = static_cast<int>(sizes[i]);
  return fIrecv(rc, n, data, narrow, tags, mh, req);
}
ncclResult_t gFinalize(void*) { return ncclSuccess; }
}  // namespace

// External linkage but hidden, as in libnccl: a local symbol of the library, unmangled.
extern __attribute__((visibility("hidden"))) const ncclNet_v11_t ncclNetIb;
const ncclNet_v11_t ncclNetIb = {
    "IB", gInit, fDevices, gProps, gListen, gConnect, fAccept, fRegMr, fRegMrDmaBuf,
    fDeregMr, gIsend, gIrecv, fIflush, fTest, fCloseSend, fCloseRecv, fCloseListen,
    fGetDeviceMr, fConsumed, nullptr, gFinalize, nullptr};
#else
extern __attribute__((visibility("hidden"))) const ncclNet_v8_t ncclNetIb;
const ncclNet_v8_t ncclNetIb = {
    "IB", fInit, fDevices, fProps, fListen, fConnect, fAccept, fRegMr, fRegMrDmaBuf,
    fDeregMr, fIsend, fIrecv, fIflush, fTest, fCloseSend, fCloseRecv, fCloseListen,
    fGetDeviceMr, fConsumed};
#endif

extern "C" __attribute__((visibility("default"))) int ncclGetVersion(int* version) {
  *version = 22809;
  return 0;
}
#endif
