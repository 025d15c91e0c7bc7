// SPDX-License-Identifier: Apache-2.0
// Between processes: the fabric directory (endpoints, the QPN registry, GIDs, stats),
// connections (a Unix socket hands over a memfd with two rings, then only signals death by
// EOF), doorbells, and the NIC thread. Also the process-wide instance, its settings, and
// what a forked child and an unloading library do with it.
//
// Fabric directory layout (MESHFAB_DIR, default /tmp/meshfab):
//   ep/<pid>.<nonce>              a process's listening Unix socket (its "endpoint")
//   gid/<32 hex digits>           per GID: "<device key> <netdev> <addr/prefix>..."
//   dev/<device key>/qp/<qpn>     symlink -> the endpoint of the process owning that QPN
//   stats/<pid>.<nonce>           meshfab/stats.h
// The device key is the netdev's MAC: several processes that open the same netdev share
// one QPN space, like processes sharing a NIC.
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "fabric.h"

namespace meshfab {

bool gTrace = false;

void trace(const char* fmt, ...) {
  if (!gTrace) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  fprintf(stderr, "meshfab[%d]: %s\n", getpid(), buf);
}

namespace {

size_t roundPow2(size_t v) {
  size_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

double envReal(const char* name, double def) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  double d = strtod(v, &end);
  return (end != v && d > 0) ? d : def;
}

}  // namespace

void Settings::load() {
  const char* d = getenv("MESHFAB_DIR");
  dir = d != nullptr && *d != '\0' ? d : "/tmp/meshfab";
  const char* n = getenv("MESHFAB_NETDEVS");
  netdevs = n != nullptr ? n : "";
  timeoutScale = envReal("MESHFAB_TIMEOUT_SCALE", 1.0);
  resolveMs = static_cast<int>(envReal("MESHFAB_RESOLVE_MS", 1000));
  size_t segKb = static_cast<size_t>(envReal("MESHFAB_SEGMENT_KB", 256));
  segment = std::max<size_t>(4, (segKb + 3) / 4 * 4) << 10;  // a multiple of the largest MTU
  size_t ringKb = static_cast<size_t>(envReal("MESHFAB_RING_KB", 4096));
  reqRing = roundPow2(std::max<size_t>(ringKb << 10, 2 * (segment + sizeof(Packet))));
  respRing = roundPow2(std::max<size_t>(reqRing / 4, 2 * (segment + sizeof(Packet))));
  size_t pacedKb = static_cast<size_t>(envReal("MESHFAB_PACED_SEGMENT_KB", 64));
  pacedSegment = std::max<size_t>(4, (pacedKb + 3) / 4 * 4) << 10;
  const char* r = getenv("MESHFAB_RATES");
  rates = r != nullptr && *r != '\0' ? r : dir + "/rates";
  burstNs = static_cast<int64_t>(envReal("MESHFAB_PACE_BURST_US", 500) * 1000);
  const char* t = getenv("MESHFAB_TRACE");
  trace = t != nullptr && *t == '1';
  stallMs = static_cast<int>(envReal("MESHFAB_STALL_MS", 0));
  const char* e = getenv("MESHFAB_ECE");
  if (e != nullptr && *e != '\0') {
    unsigned vendor = 0, options = 0;
    if (strcmp(e, "off") == 0 || strcmp(e, "0") == 0) {
      ece = false;
    } else if (sscanf(e, "%x:%x", &vendor, &options) == 2) {
      eceVendor = vendor;
      eceOptions = options;
    } else {
      fprintf(stderr, "meshfab: MESHFAB_ECE=%s is neither 'off' nor VENDOR:OPTIONS in hex; using %x:%x\n", e,
              eceVendor, eceOptions);
    }
  }
  const char* ps = getenv("MESHFAB_PORT_SPEED");
  unsigned long long q = 0;
  if (ps != nullptr && strcmp(ps, "xdr") == 0) {
    portSpeedEx = 0x100;
  } else if (ps != nullptr && sscanf(ps, "query:%llu", &q) == 1 && q > 0) {
    portSpeedQuery = q;
  } else if (ps != nullptr && *ps != '\0') {
    fprintf(stderr, "meshfab: MESHFAB_PORT_SPEED=%s is neither 'xdr' nor 'query:N'; ports report EDR 4X\n", ps);
  }
  gTrace = trace;
}

// --- the instance -------------------------------------------------------------------------------

namespace {

std::atomic<Fabric*> gInstance{nullptr};
std::mutex gCreate;

void closeQuietly(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// In a forked child: the parent's fabric is not ours. Close its descriptors so that the
// parent's death is still seen as EOF by its peers, and forget it (nothing is freed or
// unlinked: those belong to the parent). The child starts a fabric of its own if it uses
// verbs.
void afterForkInChild() {
  Fabric* f = gInstance.load(std::memory_order_relaxed);
  if (f == nullptr) return;
  closeQuietly(f->listenFd);
  closeQuietly(f->epollFd);
  closeQuietly(f->doorbellFd);
  closeQuietly(f->netlinkFd);
  closeQuietly(f->statusFd);
  closeQuietly(f->timerFd);
  for (auto& kv : f->outgoing) {
    closeQuietly(kv.second->sock);
    closeQuietly(kv.second->peerDoorbell);
  }
  for (auto& c : f->incoming) {
    closeQuietly(c->sock);
    closeQuietly(c->peerDoorbell);
  }
  gInstance.store(nullptr, std::memory_order_relaxed);
}

}  // namespace

Fabric* Fabric::existing() { return gInstance.load(std::memory_order_acquire); }

Fabric* Fabric::get() {
  Fabric* f = gInstance.load(std::memory_order_acquire);
  if (f != nullptr) return f;
  std::lock_guard<std::mutex> lk(gCreate);
  f = gInstance.load(std::memory_order_acquire);
  if (f != nullptr) return f;
  static bool atforkDone = false;
  if (!atforkDone) {
    pthread_atfork(nullptr, nullptr, afterForkInChild);
    atforkDone = true;
  }
  f = new Fabric();
  f->pid = getpid();
  f->settings.load();
  std::random_device rd;
  f->qpnCursor = 0x1000 + (rd() % 0xe00000);
  gInstance.store(f, std::memory_order_release);
  return f;
}

void Fabric::shutdown() {
  Fabric* f = gInstance.load(std::memory_order_acquire);
  if (f == nullptr || f->pid != getpid()) return;
  std::unique_lock<std::mutex> lk(f->mu);
  f->stopTransport(lk);
  if (f->openContexts != 0) return;  // unloaded or exiting with devices open: keep the objects
  lk.unlock();
  gInstance.store(nullptr, std::memory_order_release);
  delete f;
}

namespace {
// Library unload (dlclose) or process exit: no thread may outlive the code.
__attribute__((destructor)) void meshfabUnload() { Fabric::shutdown(); }
}  // namespace

// --- fabric directory ---------------------------------------------------------------------------

namespace {

void mkdirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) {
      cur = cur.empty() ? "/" : cur;
      continue;
    }
    cur += (cur.empty() || cur.back() == '/' ? "" : "/") + part;
    mkdir(cur.c_str(), 0777);
  }
}

std::string gidHex(const uint8_t gid[16]) {
  char buf[40];
  for (int i = 0; i < 16; ++i) snprintf(buf + 2 * i, 3, "%02x", gid[i]);
  return buf;
}

bool readFile(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::getline(in, *out);
  return true;
}

std::string readLink(const std::string& path) {
  char buf[256];
  ssize_t n = readlink(path.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

// An endpoint's owner is gone: its socket file was removed (clean exit) or its pid is dead.
bool endpointGone(const std::string& dir, const std::string& ep) {
  if (access((dir + "/ep/" + ep).c_str(), F_OK) != 0) return true;
  int pid = atoi(ep.c_str());
  return pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH);
}

}  // namespace

void Fabric::registerDevice(Device* d) {
  const std::string& dir = settings.dir;
  mkdirs(dir + "/dev/" + d->key + "/qp");
  mkdirs(dir + "/gid");
  std::string line = d->key + " " + d->port.netdev;
  for (const Ipv4Net& n : d->port.addrs) {
    char buf[32];
    snprintf(buf, sizeof(buf), " %u.%u.%u.%u/%d", n.addr >> 24, (n.addr >> 16) & 255, (n.addr >> 8) & 255,
             n.addr & 255, n.prefix);
    line += buf;
  }
  for (const ibv_gid& g : d->port.gids) {
    std::string path = dir + "/gid/" + gidHex(g.raw);
    std::string tmp = path + ".tmp." + std::to_string(pid);
    {
      std::ofstream out(tmp);
      out << line << "\n";
    }
    rename(tmp.c_str(), path.c_str());
  }
}

bool gidSubnets(Fabric* f, const uint8_t gid[16], std::vector<Ipv4Net>* nets) {
  std::string line;
  if (!readFile(f->settings.dir + "/gid/" + gidHex(gid), &line)) return false;
  std::istringstream in(line);
  std::string key, netdev, net;
  in >> key >> netdev;
  while (in >> net) {
    unsigned a, b, c, d;
    int p;
    if (sscanf(net.c_str(), "%u.%u.%u.%u/%d", &a, &b, &c, &d, &p) == 5) {
      nets->push_back({(a << 24) | (b << 16) | (c << 8) | d, p});
    }
  }
  return true;
}

bool Fabric::lookupQp(const uint8_t dgid[16], uint32_t qpn, std::string* ep) {
  std::string line;
  if (!readFile(settings.dir + "/gid/" + gidHex(dgid), &line)) return false;
  std::string key = line.substr(0, line.find(' '));
  *ep = readLink(settings.dir + "/dev/" + key + "/qp/" + std::to_string(qpn));
  return !ep->empty() && !endpointGone(settings.dir, *ep);
}

uint32_t Fabric::allocQpn(Device* d, std::string* regPath) {
  std::string base = settings.dir + "/dev/" + d->key + "/qp/";
  mkdirs(base);
  for (int tries = 0; tries < (1 << 16); ++tries) {
    uint32_t qpn = qpnCursor++;
    if (qpnCursor > 0xffffff) qpnCursor = 0x100;
    if (qpn < 0x100) continue;
    std::string path = base + std::to_string(qpn);
    if (symlink(endpoint.c_str(), path.c_str()) == 0) {
      *regPath = path;
      return qpn;
    }
    if (errno != EEXIST) return 0;
    std::string owner = readLink(path);
    if (!owner.empty() && owner != endpoint && endpointGone(settings.dir, owner)) {
      unlink(path.c_str());  // left by a process that died: reuse the number
      qpnCursor = qpn;
    }
  }
  return 0;
}

void Fabric::countFds() {
  if (stats == nullptr) return;
  int64_t n = 0;
  for (int fd : {listenFd, epollFd, doorbellFd, netlinkFd, statusFd, timerFd}) n += fd >= 0;
  for (auto& kv : outgoing) n += (kv.second->sock >= 0) + (kv.second->peerDoorbell >= 0);
  for (auto& c : incoming) n += (c->sock >= 0) + (c->peerDoorbell >= 0);
  stats->transportFds.store(n, std::memory_order_relaxed);
}

DevStats* Fabric::devStats(Device* d) {
  static DevStats dummy;
  if (d->stats != nullptr) return d->stats;
  if (stats == nullptr || stats->ndev >= static_cast<uint32_t>(kStatsMaxDevices)) return &dummy;
  DevStats* s = &stats->dev[stats->ndev];
  snprintf(s->name, sizeof(s->name), "%s", d->name.c_str());
  snprintf(s->netdev, sizeof(s->netdev), "%s", d->port.netdev.c_str());
  __atomic_store_n(&stats->ndev, stats->ndev + 1, __ATOMIC_RELEASE);
  d->stats = s;
  return s;
}

// --- transport lifecycle ----------------------------------------------------------------------

bool Fabric::startTransport(std::string* why) {
  if (nicRunning) return true;
  const std::string& dir = settings.dir;
  for (const char* sub : {"/ep", "/dev", "/gid", "/stats"}) mkdirs(dir + sub);
  std::random_device rd;
  nonce = (uint64_t(rd()) << 32) | rd();
  char name[64];
  snprintf(name, sizeof(name), "%d.%016llx", pid, static_cast<unsigned long long>(nonce));
  endpoint = name;
  netns = currentNetns();
  std::string path = dir + "/ep/" + endpoint;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    *why = "fabric directory path too long for a Unix socket (" + path + "); set MESHFAB_DIR to a shorter one";
    return false;
  }
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  listenFd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listenFd < 0 || bind(listenFd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listenFd, 256) != 0) {
    *why = "cannot listen on " + path + ": " + strerror(errno);
    closeQuietly(listenFd);
    return false;
  }
  statusFd = memfd_create("meshfab-status", MFD_CLOEXEC);
  if (statusFd < 0 || ftruncate(statusFd, 4096) != 0) {
    *why = std::string("memfd: ") + strerror(errno);
    return false;
  }
  status = static_cast<ProcStatus*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, statusFd, 0));
  if (status == MAP_FAILED) {
    status = nullptr;
    *why = std::string("mmap: ") + strerror(errno);
    return false;
  }
  new (status) ProcStatus();
  status->magic = kWireMagic;
  status->version = kWireVersion;
  status->pid = pid;
  doorbellFd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timerFd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  epollFd = epoll_create1(EPOLL_CLOEXEC);
  netlinkFd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (netlinkFd >= 0) {
    sockaddr_nl nl{};
    nl.nl_family = AF_NETLINK;
    nl.nl_groups = RTMGRP_LINK;
    if (bind(netlinkFd, reinterpret_cast<sockaddr*>(&nl), sizeof(nl)) != 0) closeQuietly(netlinkFd);
  }
  if (doorbellFd < 0 || epollFd < 0 || timerFd < 0) {
    *why = std::string("eventfd/timerfd/epoll: ") + strerror(errno);
    return false;
  }
  for (int* fd : {&listenFd, &doorbellFd, &netlinkFd, &timerFd}) {
    if (*fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = fd;
    epoll_ctl(epollFd, EPOLL_CTL_ADD, *fd, &ev);
  }
  statsPath = dir + "/stats/" + endpoint;
  int sfd = open(statsPath.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0644);
  if (sfd >= 0 && ftruncate(sfd, sizeof(StatsFile)) == 0) {
    void* m = mmap(nullptr, sizeof(StatsFile), PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
    if (m != MAP_FAILED) {
      stats = static_cast<StatsFile*>(m);
      stats->pid = pid;
      stats->netns = netns;
      stats->nonce = nonce;
      stats->version = kStatsVersion;
      __atomic_store_n(&stats->magic, kStatsMagic, __ATOMIC_RELEASE);
    }
  }
  if (sfd >= 0) close(sfd);
  for (auto& d : devices) d->stats = nullptr;
  stopping = false;
  // The NIC thread takes no signals: they belong to the application's threads.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  nic = std::thread(&Fabric::nicLoop, this);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_setname_np(nic.native_handle(), "meshfab-nic");
  nicRunning = true;
  if (settings.stallMs > 0) {
    stallStop = false;
    stallWatch = std::thread([this] { stallWatchLoop(settings.stallMs); });
  }
  countFds();
  return true;
}

void Fabric::stopTransport(std::unique_lock<std::mutex>& lk) {
  if (!nicRunning) return;
  stopping = true;
  kickSelf();
  lk.unlock();
  nic.join();
  stallStop = true;
  if (stallWatch.joinable()) stallWatch.join();
  lk.lock();
  nicRunning = false;
  stopping = false;
  for (auto& kv : qps) {
    kv.second->conn = nullptr;
    kv.second->inTxList = false;
  }
  for (auto& kv : outgoing) closeConn(kv.second.get(), "fabric stopped");
  for (auto& c : incoming) closeConn(c.get(), "fabric stopped");
  outgoing.clear();
  incoming.clear();
  unlink((settings.dir + "/ep/" + endpoint).c_str());
  closeQuietly(listenFd);
  closeQuietly(epollFd);
  closeQuietly(doorbellFd);
  closeQuietly(netlinkFd);
  closeQuietly(timerFd);
  if (status != nullptr) munmap(status, 4096);
  status = nullptr;
  closeQuietly(statusFd);
  if (stats != nullptr) munmap(stats, sizeof(StatsFile));
  stats = nullptr;
  unlink(statsPath.c_str());
  for (auto& d : devices) d->stats = nullptr;
}

void Fabric::kickSelf() {
  if (doorbellFd < 0) return;
  uint64_t one = 1;
  if (write(doorbellFd, &one, sizeof(one)) < 0 && errno != EAGAIN) trace("doorbell: %s", strerror(errno));
}

// --- connections -------------------------------------------------------------------------------

namespace {

bool sendHello(int sock, const Hello& h, const int* fds, int nfds) {
  iovec iov{const_cast<Hello*>(&h), sizeof(h)};
  char cbuf[CMSG_SPACE(sizeof(int) * 3)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
  memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h));
}

// Returns bytes read (0: EOF, -1: error/EAGAIN) and the fds that came with them.
ssize_t recvHello(int sock, Hello* h, std::vector<int>* fds) {
  iovec iov{h, sizeof(*h)};
  char cbuf[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof(cbuf);
  ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        fds->push_back(fd);
      }
    }
  }
  return n;
}

void initRing(char* base, uint64_t size) {
  auto* ctl = new (base) RingCtl();
  ctl->magic = kWireMagic;
  ctl->version = kWireVersion;
  ctl->size = size;
}

bool viewRing(char* base, RingView* v) {
  auto* ctl = reinterpret_cast<RingCtl*>(base);
  if (ctl->magic != kWireMagic || ctl->version != kWireVersion) return false;
  v->ctl = ctl;
  v->data = base + kRingDataOffset;
  v->size = ctl->size;
  return true;
}

}  // namespace

Conn* Fabric::connectTo(const std::string& ep) {
  auto it = outgoing.find(ep);
  if (it != outgoing.end()) return it->second.get();
  auto owned = std::make_unique<Conn>();
  Conn* c = owned.get();
  outgoing[ep] = std::move(owned);
  c->initiator = true;
  c->peerEp = ep;
  c->peerPid = atoi(ep.c_str());
  std::string path = settings.dir + "/ep/" + ep;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->sock < 0 || connect(c->sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    closeConn(c, std::string("connect to ") + ep + ": " + strerror(errno));
    return c;
  }
  size_t len = 2 * kRingDataOffset + settings.reqRing + settings.respRing;
  int memfd = memfd_create("meshfab-rings", MFD_CLOEXEC);
  void* m = MAP_FAILED;
  if (memfd >= 0 && ftruncate(memfd, static_cast<off_t>(len)) == 0) {
    m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  }
  if (m == MAP_FAILED) {
    closeQuietly(memfd);
    closeConn(c, std::string("ring memory: ") + strerror(errno));
    return c;
  }
  c->rings = m;
  c->ringsLen = len;
  char* base = static_cast<char*>(m);
  initRing(base, settings.reqRing);
  initRing(base + kRingDataOffset + settings.reqRing, settings.respRing);
  viewRing(base, &c->tx);
  viewRing(base + kRingDataOffset + settings.reqRing, &c->rx);
  Hello h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.kind = kHello;
  h.pid = pid;
  h.reqRingSize = settings.reqRing;
  h.respRingSize = settings.respRing;
  snprintf(h.endpoint, sizeof(h.endpoint), "%s", endpoint.c_str());
  int fds[3] = {memfd, statusFd, doorbellFd};
  bool sent = sendHello(c->sock, h, fds, 3);
  close(memfd);
  if (!sent) {
    closeConn(c, std::string("hello to ") + ep + ": " + strerror(errno));
    return c;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = c;
  epoll_ctl(epollFd, EPOLL_CTL_ADD, c->sock, &ev);
  trace("connecting to %s", ep.c_str());
  countFds();
  return c;
}

void Fabric::acceptConns() {
  for (;;) {
    int s = accept4(listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s < 0) return;
    auto c = std::make_unique<Conn>();
    c->sock = s;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = c.get();
    epoll_ctl(epollFd, EPOLL_CTL_ADD, s, &ev);
    incoming.push_back(std::move(c));
  }
}

void Fabric::handshake(Conn* c) {
  Hello h{};
  std::vector<int> fds;
  ssize_t n = recvHello(c->sock, &h, &fds);
  auto closeFds = [&fds] {
    for (int fd : fds) close(fd);
  };
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
  if (n != static_cast<ssize_t>(sizeof(h)) || h.magic != kWireMagic || h.version != kWireVersion) {
    closeFds();
    closeConn(c, n == 0 ? "peer closed during the handshake" : "bad handshake");
    return;
  }
  if (c->initiator) {
    if (h.kind != kHelloAck || fds.size() != 2) {
      closeFds();
      closeConn(c, "bad HELLO_ACK");
      return;
    }
    void* st = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    close(fds[0]);
    if (st == MAP_FAILED) {
      close(fds[1]);
      closeConn(c, "cannot map the peer's status");
      return;
    }
    c->peerStatus = static_cast<ProcStatus*>(st);
    c->peerDoorbell = fds[1];
    c->state = Conn::State::Up;
    trace("connected to %s", c->peerEp.c_str());
    std::deque<Qp*> waiting;
    waiting.swap(c->txQps);
    for (Qp* qp : waiting) qp->inTxList = false;
    for (Qp* qp : waiting) scheduleTx(qp);
    return;
  }
  if (h.kind != kHello || fds.size() != 3) {
    closeFds();
    closeConn(c, "bad HELLO");
    return;
  }
  size_t len = 2 * kRingDataOffset + h.reqRingSize + h.respRingSize;
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  void* st = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
  close(fds[0]);
  close(fds[1]);
  c->peerDoorbell = fds[2];
  c->peerEp = h.endpoint;
  c->peerPid = h.pid;
  if (m != MAP_FAILED) {
    c->rings = m;
    c->ringsLen = len;
  }
  if (st != MAP_FAILED) c->peerStatus = static_cast<ProcStatus*>(st);
  char* base = static_cast<char*>(m);
  if (m == MAP_FAILED || st == MAP_FAILED || !viewRing(base, &c->rx) ||
      !viewRing(base + kRingDataOffset + h.reqRingSize, &c->tx)) {
    closeConn(c, "cannot map the connection's rings");
    return;
  }
  Hello ack{};
  ack.magic = kWireMagic;
  ack.version = kWireVersion;
  ack.kind = kHelloAck;
  ack.pid = pid;
  snprintf(ack.endpoint, sizeof(ack.endpoint), "%s", endpoint.c_str());
  int out[2] = {statusFd, doorbellFd};
  if (!sendHello(c->sock, ack, out, 2)) {
    closeConn(c, std::string("HELLO_ACK: ") + strerror(errno));
    return;
  }
  c->state = Conn::State::Up;
  trace("accepted %s", c->peerEp.c_str());
}

void Fabric::closeConn(Conn* c, const std::string& why) {
  if (c->state == Conn::State::Dead) return;
  trace("connection %s %s: %s", c->initiator ? "to" : "from", c->peerEp.c_str(), why.c_str());
  c->state = Conn::State::Dead;
  c->why = why;
  if (c->sock >= 0) {
    if (epollFd >= 0) epoll_ctl(epollFd, EPOLL_CTL_DEL, c->sock, nullptr);
    closeQuietly(c->sock);
  }
  if (c->rings != nullptr) munmap(c->rings, c->ringsLen);
  c->rings = nullptr;
  if (c->peerStatus != nullptr) munmap(c->peerStatus, 4096);
  c->peerStatus = nullptr;
  closeQuietly(c->peerDoorbell);
  countFds();
  c->resp.clear();
  std::deque<Qp*> waiting;
  waiting.swap(c->txQps);
  for (Qp* qp : waiting) qp->inTxList = false;
  if (nicRunning && !stopping) {
    for (Qp* qp : waiting) scheduleTx(qp);  // now lost on the wire: their timers run
  }
}

// --- the NIC thread -----------------------------------------------------------------------------

void Fabric::handleEpoll(void* tag, uint32_t events) {
  if (tag == &listenFd) {
    acceptConns();
  } else if (tag == &doorbellFd) {
    uint64_t v;
    while (read(doorbellFd, &v, sizeof(v)) == sizeof(v)) {
    }
  } else if (tag == &timerFd) {
    uint64_t v;
    if (read(timerFd, &v, sizeof(v)) < 0) {
      // EAGAIN: re-armed after it fired; nothing to consume
    }
  } else if (tag == &netlinkFd) {
    char buf[8192];
    while (recv(netlinkFd, buf, sizeof(buf), 0) > 0) {
    }
    portStateChanged();
  } else {
    Conn* c = static_cast<Conn*>(tag);
    if (c->state == Conn::State::Handshake) {
      handshake(c);
    } else if (c->state == Conn::State::Up && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
      char b;
      ssize_t n = recv(c->sock, &b, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) {
        drainRx(c);
        closeConn(c, "peer process exited");
      }
    }
  }
}

// Sleeps until the NIC thread's next timer with the timerfd (microseconds matter for link
// rates: a capped port waits for its bucket a few tens of microseconds at a time); no timer
// disarms it.
static void armWake(int timerFd, Clock::time_point wake) {
  itimerspec its{};
  if (wake != Clock::time_point::max()) {
    int64_t ns = std::max<int64_t>(toNs(wake), 1);
    its.it_value.tv_sec = ns / 1000000000;
    its.it_value.tv_nsec = ns % 1000000000;
  }
  timerfd_settime(timerFd, TFD_TIMER_ABSTIME, &its, nullptr);
}

void Fabric::nicLoop() {
  prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us, not the default 50 us: rate caps are that fine
  std::unique_lock<std::mutex> lk(mu);
  epoll_event evs[32];
  Clock::time_point armed = Clock::time_point::max();
  while (!stopping) {
    progress();
    Clock::time_point now = Clock::now();
    runTimers(now);
    Clock::time_point wake = nextTimer();
    status->sleeping.store(1, std::memory_order_seq_cst);  // then anyWork() reads the rings
    if (anyWork() || stopping) {
      status->sleeping.store(0, std::memory_order_relaxed);
      // Let the application's threads in (post_send, poll_cq): std::mutex is not fair.
      lk.unlock();
      nicPhase = 3;
      std::this_thread::yield();
      nicPhase = 1;
      lk.lock();
      nicPhase = 0;
      continue;
    }
    nicWakeAt = wake;
    if (wake != armed) {
      armWake(timerFd, wake);
      armed = wake;
    }
    lk.unlock();
    nicPhase = 2;
    int n = epoll_wait(epollFd, evs, 32, wake != Clock::time_point::max() && wake <= Clock::now() ? 0 : -1);
    nicPhase = 1;
    lk.lock();
    nicPhase = 0;
    status->sleeping.store(0, std::memory_order_relaxed);
    nicWakeAt = Clock::time_point::min();
    for (int i = 0; i < n; ++i) handleEpoll(evs[i].data.ptr, evs[i].events);
    if (n > 0) countFds();
    // Connections are freed only here, after this batch of events named them.
    incoming.erase(std::remove_if(incoming.begin(), incoming.end(),
                                  [](const std::unique_ptr<Conn>& c) { return c->state == Conn::State::Dead; }),
                   incoming.end());
  }
}

}  // namespace meshfab
