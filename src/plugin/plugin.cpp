// SPDX-License-Identifier: Apache-2.0
#include "mesh/plugin/plugin.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include <cstdio>
#include <cstdlib>
#include <new>

#include "mesh/datapath/async_events.h"
#include "mesh/platform/check.h"
#include "mesh/platform/log.h"
#include "mesh/platform/static_state.h"
#include "mesh/platform/version.h"
#include "mesh/plugin/nccl_compat.h"

// The C++ ABI's exit-handler registration and this object's DSO handle (crtbegin's).
extern "C" void* __dso_handle;
extern "C" int __cxa_atexit(void (*fn)(void*), void* arg, void* dso);

namespace mesh {

Plugin& Plugin::instance() {
  // Never destroyed by the C++ runtime: shutdown() runs from the library destructor below,
  // in a known order, instead of whenever static destructors happen to run. Static storage
  // (not the heap) so an unloaded library leaves no allocation behind.
  alignas(Plugin) static unsigned char storage[sizeof(Plugin)];
  static Plugin* plugin = new (storage) Plugin();
  return *plugin;
}

namespace {
// Set in a child forked once init began; see Plugin::inForkedChild(). Relaxed: written by the
// pthread_atfork child handler and read by the same, only, thread of the child.
std::atomic<bool> gForkedChild{false};
void markForkedChild() { gForkedChild.store(true, std::memory_order_relaxed); }

// Set by an exit handler registered at init. exit() runs the exit handlers before any ELF
// destructor (ld.so's _dl_fini is the first handler registered, so the last to run), while a
// dlclose runs this library's destructor first and its exit handlers after (__cxa_finalize
// comes last in its fini array): in the destructor, set means the process is exiting.
// Registered with __cxa_atexit and this library's __dso_handle, which is what atexit() means
// in a shared library, said outright: an interposed atexit() (ThreadSanitizer's) registers
// for the program, and the handler then ran at exit in a library dlclosed long before.
std::atomic<bool> gProcessExiting{false};
void markProcessExiting(void*) { gProcessExiting.store(true, std::memory_order_release); }
}  // namespace

bool Plugin::inForkedChild() { return gForkedChild.load(std::memory_order_relaxed); }

ncclResult_t Plugin::init(ncclDebugLogger_t logger, int abi) {
  std::lock_guard<std::mutex> lock(initMutex_);
  if (logger != nullptr) setLogger(logger);
  if (initialized_) {
    if (abi > 0 && !loaderLogged_) logLoader(logger, abi);
    return ncclSuccess;
  }
  // Registered once per load of the library, before anything else: glibc drops a DSO's fork
  // and exit handlers when it is dlclosed (__cxa_finalize), so a reloaded copy registers its
  // own. A child forked while this init runs holds initMutex_ locked by a thread it does not
  // have: marked at once, it never waits for it (shutdown(), every entry point).
  static bool forkHandler = false;
  static bool exitHandler = false;
  if (!forkHandler) forkHandler = pthread_atfork(nullptr, nullptr, markForkedChild) == 0;
  if (!exitHandler) exitHandler = __cxa_atexit(markProcessExiting, nullptr, &__dso_handle) == 0;
  MESH_INFO(NCCL_INIT | NCCL_NET, "%s", versionText().c_str());
  if (abi > 0) logLoader(logger, abi);

  std::vector<std::string> warnings;
  config_ = loadConfig([](const char* name) { return getenv(name); }, &warnings);
  for (const std::string& w : warnings) MESH_WARN("%s", w.c_str());
  logSettings();

  std::string why;
  if (loadVerbs(config_.ibverbsLib, &verbs_, &why) != ncclSuccess) {
    MESH_WARN("no RDMA: %s. The Mesh network reports 0 devices.", why.c_str());
  } else {
    initFork();  // before any device is opened or memory registered
    MESH_CHECK(discoverPorts(verbs_, config_, &discovery_));
    if (discovery_.ports.empty()) {
      std::string filter = config_.hca.empty() ? "" : ", NCCL_MESH_HCA=" + config_.hca;
      MESH_WARN("no usable RDMA port%s%s: need an ACTIVE RoCE port with an IPv4 address "
                "(check `ibv_devinfo`, `rdma link`, `ip addr`%s). The Mesh network reports 0 devices.",
                discovery_.emptyReason.empty() ? "" : ": ", discovery_.emptyReason.c_str(), filter.c_str());
    }
  }
  // The reactor serves handshakes and async events: with no port there are none, and no
  // thread. Started last, so a failed init leaves no thread behind.
  if (!discovery_.ports.empty()) MESH_CHECK(reactor_.start());
  startStats();
  buildNetDevices();
  buildConnectionMachinery();
  watchAsyncEvents();
  startRelay();
  initPid_ = getpid();
  initialized_ = true;
  return ncclSuccess;
}

// Live counters (mesh/stats/stats.h): a file per loaded plugin. Not being able to publish
// them never stops NCCL: the comms count into a sink and one WARN says why.
void Plugin::startStats() {
  if (!config_.stats || discovery_.ports.empty()) return;
  std::string path, why;
  // A process killed by a signal leaves its file behind (48 KiB of /dev/shm, which is RAM);
  // without a sweep here they would pile up on a node whose jobs crash until somebody ran
  // nccl-mesh-info. Only our own files of processes gone from our PID namespace go.
  const std::string dir = config_.statsDir.empty() ? stats::defaultDir() : config_.statsDir;
  stats::ReadResult swept = stats::readDir(dir, /*removeStale=*/true);
  if (!swept.removed.empty()) {
    MESH_INFO(NCCL_INIT, "live counters: removed %zu stale file(s) of ended processes from %s", swept.removed.size(),
              dir.c_str());
  }
  if (stats::Publisher::open(config_.statsDir, &path, &why)) {
    MESH_INFO(NCCL_INIT, "live counters: %s (nccl-mesh-info --watch; NCCL_MESH_STATS=0 turns them off)", path.c_str());
  } else {
    MESH_WARN("live counters not published: %s (NCCL_MESH_STATS=0 silences this)", why.c_str());
  }
}

// As NCCL's IB transport, which calls ibv_fork_init() before it opens a device (2.28.9
// net_ib.cc ncclIbInitDevices; 2.30.7 net_ib/init.cc): PyTorch's DataLoader workers and
// inference servers fork while NCCL runs. rdma-core's own state is honoured: nothing to do
// when the kernel already copies pinned pages into the child (IBV_FORK_UNNEEDED) or fork
// support is on (RDMAV_FORK_SAFE / IBV_FORK_SAFE made rdma-core enable it).
void Plugin::initFork() {
  if (verbs_.isForkInitialized != nullptr) {
    ibv_fork_status state = verbs_.isForkInitialized();
    if (state == IBV_FORK_UNNEEDED || state == IBV_FORK_ENABLED) {
      MESH_INFO(NCCL_INIT, "fork: %s", state == IBV_FORK_UNNEEDED
                                           ? "unneeded (the kernel copies registered pages into a forked child)"
                                           : "enabled (rdma-core's fork support is already on)");
      return;
    }
  } else if (getenv("RDMAV_FORK_SAFE") != nullptr || getenv("IBV_FORK_SAFE") != nullptr) {
    MESH_INFO(NCCL_INIT, "fork: enabled (RDMAV_FORK_SAFE/IBV_FORK_SAFE: rdma-core turns it on itself)");
    return;
  }
  int rc = verbs_.forkInit != nullptr ? verbs_.forkInit() : ENOSYS;
  if (rc != 0) {
    MESH_WARN("ibv_fork_init failed: %s; a process that forks after registering memory may corrupt "
              "RDMA transfers (set RDMAV_FORK_SAFE=1 before anything initializes rdma-core)",
              strerror(rc));
    return;
  }
  MESH_INFO(NCCL_INIT, "fork: enabled (ibv_fork_init: registered pages are not mapped in a forked child)");
}

void Plugin::shutdown(bool fromExitHandler) {
  // A forked child shares the parent's uverbs file: deregistering, deallocating or closing
  // through it would tear down the PARENT's objects, and the reactor thread does not exist
  // here to be joined. The child's copy is left as it is; exit() reclaims its memory. Asked
  // before the lock: a child forked while NCCL's thread was in init has it locked for good.
  if (inForkedChild()) return;
  std::lock_guard<std::mutex> lock(initMutex_);
  // Never initialized, or shut down already (the relay's exit handler, then the destructor).
  if (!initialized_ && !reactor_.running()) return;
  if (initPid_ != 0 && getpid() != initPid_) return;
  // Process exit: NCCL's proxy thread may still be in isend/test on comms NCCL never closed
  // (a rank that exits with collectives in flight); they stay, with all they use.
  if (fromExitHandler || gProcessExiting.load(std::memory_order_acquire)) {
    stopForExit(fromExitHandler);
    return;
  }
  // Reverse order of construction: the reactor first (its handlers hold pending handshakes
  // and their half-built comms), then the comms and connects NCCL left behind, then what
  // the comms used, then the devices.
  // Everything is released with releaseStatic (static_state.h): this object lives in the
  // library's static storage, so whatever it still points to when NCCL dlcloses the
  // library would be leaked for good.
  // The relay's thread drives handshakes on the reactor and owns its links' comms: first.
  // Its Handshaker goes only after the reactor stopped: the reactor's handlers for the
  // relay's control links (a peer closing, the heartbeat) point at it.
  if (relay_ != nullptr) relay_->stop();
  if (routes_ != nullptr) routes_->stop();
  reactor_.stop();
  releaseStatic(relay_);
  releaseStatic(routes_);
  size_t connects = 0, comms = 0;
  tables_.releaseAll(this, &connects, &comms);
  if (connects + comms > 0) {
    MESH_INFO(NCCL_INIT | NCCL_NET, "shutdown: ended %zu pending connect(s) and closed %zu comm(s) NCCL left open",
              connects, comms);
  }
  releaseStatic(handshakers_);
  releaseStatic(transports_);
  stats::Publisher::close();  // every comm is gone: nothing counts any more
  registry_.reset();
  releaseStatic(netDevices_);
  releaseStatic(gpus_);
  discovery_.devices.clear();  // closes PDs and contexts before anything else goes
  releaseStatic(discovery_);
  unloadVerbs(&verbs_);
  releaseStatic(config_);
  initPid_ = 0;
  initialized_ = false;
}

// At process exit (under initMutex_): this library's threads stop; every comm, registration,
// device and socket stays for the kernel to reclaim. NCCL's threads still run until the
// process ends and may be inside isend/test on comms NCCL never closed: freeing those here
// crashed the exit of a rank that left with collectives in flight. The ELF destructor may
// run after a verbs provider's (loaded later, finalized first), so from there no verbs call
// is made, the relay's links included (abandon()). The relay's own exit handler runs while
// the provider is still loaded: its links end cleanly there (stop()).
void Plugin::stopForExit(bool fromExitHandler) {
  if (stoppedForExit_) return;
  stoppedForExit_ = true;
  if (relay_ != nullptr) {
    if (fromExitHandler) {
      relay_->stop();
    } else {
      relay_->abandon();
    }
  }
  if (routes_ != nullptr) routes_->stop();
  reactor_.stop();
  stats::Publisher::close(false);  // the comms left alive may still count into the mapping
  size_t open = tables_.openCount();
  if (open > 0) {
    MESH_INFO(NCCL_INIT | NCCL_NET, "process exit: %zu comm(s) or connect(s) NCCL did not close stay until the "
              "process ends (NCCL's threads may still use them)", open);
  }
}

ncclResult_t Plugin::device(int dev, const NetDevice** out) const {
  if (dev < 0 || dev >= deviceCount()) {
    MESH_WARN("device %d does not exist (the Mesh network has %d)", dev, deviceCount());
    return ncclInvalidArgument;
  }
  *out = &netDevices_[dev];
  return ncclSuccess;
}

void Plugin::buildNetDevices() {
  netDevices_ = makeNetDevices(discovery_.ports, config_);
  const std::vector<MeshPort>& ports = discovery_.ports;
  flushQps_ = true;
  if (!netDevices_.empty()) {
    // The GPUs' side of GPUDirect (issue 32): on a GB10 the NIC's "yes" is not the answer.
    gpus_ = queryGpuCaps(config_.cudaLib);
    const GpuCaps& gpus = gpus_;
    bool nicGdr = (netDevices_[0].ptrSupport & kPtrCuda) != 0;
    bool nicDmabuf = (netDevices_[0].ptrSupport & kPtrDmabuf) != 0;
    for (const NetDevice& d : netDevices_) {
      nicGdr = nicGdr || (d.ptrSupport & kPtrCuda) != 0;
      nicDmabuf = nicDmabuf || (d.ptrSupport & kPtrDmabuf) != 0;
    }
    GpuDirectDecision gd = decideGpuDirect(gpus, nicGdr, nicDmabuf);
    applyGpuDirect(gd, &netDevices_);
    flushQps_ = gd.flushQps;
    if (!gd.info.empty()) {
      MESH_INFO(NCCL_INIT | NCCL_NET, "%s", gd.info.c_str());
    } else if (!gpus.known()) {
      MESH_INFO(NCCL_INIT | NCCL_NET, "GPUDirect: the GPUs' answer is unknown (%s); the NIC's stands",
                gpus.why.c_str());
    }
  }
  for (const NetDevice& d : netDevices_) {
    MESH_INFO(NCCL_INIT | NCCL_NET, "device %s: %zu port(s), speed %d Mbps, ptrSupport 0x%x, pciPath %s, guid 0x%llx",
              d.name.c_str(), d.ports.size(), d.speedMbps, d.ptrSupport,
              d.pciPath.empty() ? "none (ports on several PCI devices, or none)" : d.pciPath.c_str(),
              static_cast<unsigned long long>(d.guid));
  }
  for (const MeshPort& p : ports) {
    for (const PortAddress& a : p.addrs) {
      MESH_INFO(NCCL_INIT | NCCL_NET, "port %s %s GID index %d MTU %d speed %d Mbps",
                p.label().c_str(), formatPrefix(a.ip).c_str(), a.gidIndex, p.mtuBytes,
                p.speedMbps);
    }
  }
}

CommSettings Plugin::commSettings() const {
  CommSettings s;
  s.qpsPerLink = config_.qpsPerConn;
  s.splitMin = config_.splitMin;
  s.maxWrBytes = config_.chunkSize;
  for (const MeshPort& p : discovery_.ports) {
    if (p.maxMsgSize > 0 && p.maxMsgSize < s.maxWrBytes) s.maxWrBytes = p.maxMsgSize;
  }
  s.mtuCap = config_.mtu;
  s.gidIndex = config_.gidIndex;
  s.forceFlush = config_.forceFlush;
  s.gdrFlushDisable = config_.gdrFlushDisable;
  s.flushQps = receiverFlushQps(flushQps_, config_.gdrFlushDisable, config_.forceFlush);
  s.tuning.timeout = config_.ibTimeout;
  s.tuning.retryCnt = config_.ibRetryCnt;
  s.tuning.rnrRetry = config_.ibRnrRetry;
  s.envTrafficClass = config_.trafficClass;
  s.fifoTrafficClass = config_.fifoTrafficClass;
  s.ece = config_.ibEce;
  s.tuning.serviceLevel = config_.serviceLevel;
  return s;
}

HandshakeSettings Plugin::handshakeSettings() const {
  HandshakeSettings hs;
  hs.timeoutMs = config_.connectTimeoutMs;
  hs.peerTimeoutMs = config_.peerTimeoutMs;
  hs.acceptWaitMs = config_.acceptWaitMs;
  hs.listenAny = config_.listenAddr == "any";
  hs.portMin = config_.portMin;
  hs.portMax = config_.portMax;
  return hs;
}

void Plugin::buildConnectionMachinery() {
  if (netDevices_.empty()) return;
  std::vector<Registrar> registrars;
  bool relaxed = config_.relaxedOrdering != 0;
  for (const auto& dev : discovery_.devices) registrars.push_back(verbsRegistrar(dev.get(), relaxed));
  if (!discovery_.devices.empty()) {
    // As NCCL IB's "[RO]" in its "NET/IB : Using" line.
    bool used = usesRelaxedOrdering(discovery_.devices.front().get(), relaxed);
    const char* why = !relaxed ? "NCCL_MESH_PCI_RELAXED_ORDERING=0"
                      : used   ? "rdma-core has ibv_reg_mr_iova2"
                               : "rdma-core has no ibv_reg_mr_iova2";
    MESH_INFO(NCCL_INIT | NCCL_NET, "NCCL's buffers are registered %s PCIe relaxed ordering (%s)",
              used ? "with" : "without", why);
  }
  registry_ = std::make_unique<MrRegistry>(std::move(registrars));
  HandshakeSettings hs = handshakeSettings();
  for (const NetDevice& d : netDevices_) {
    std::vector<int> filter;
    if (config_.devices == DeviceMode::Port) filter = d.ports;
    transports_.push_back(std::make_unique<RdmaTransport>(&discovery_, commSettings(), filter));
    handshakers_.push_back(std::make_unique<Handshaker>(&reactor_, transports_.back().get(), hs));
  }
}

// One watcher for every device's asynchronous events, on the reactor thread (what each
// event does: async_events.cpp).
void Plugin::watchAsyncEvents() {
  for (const auto& devPtr : discovery_.devices) {
    VerbsDevice* dev = devPtr.get();
    int fd = dev->context()->async_fd;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) continue;
    reactor_.post([this, dev, fd] {
      reactor_.watch(fd, EPOLLIN, [dev](uint32_t) {
        ibv_async_event ev;
        while (dev->api().getAsyncEvent(dev->context(), &ev) == 0) {
          handleAsyncEvent(dev->name(), dev->api().eventTypeStr(ev.event_type), ev, dev);
          dev->api().ackAsyncEvent(&ev);
        }
      });
    });
  }
}

// NCCL_MESH_RELAY=auto: every process serves as a relay when it binds the relay port first
// on this node (mesh/relay/relay_service.h), and asks its neighbours' relays for peers it has
// no cable to.
void Plugin::startRelay() {
  if (config_.relay != RelayMode::Auto || netDevices_.empty()) return;
  // Every mesh port of the node, whatever NCCL_MESH_DEVICES splits NCCL's devices into.
  std::vector<LocalNic> nics = RdmaTransport(&discovery_, commSettings()).localNics();
  // The relay's leg listeners: on mesh addresses only, in NCCL_MESH_PORT_RANGE like NCCL's.
  HandshakeSettings hs = handshakeSettings();
  hs.listenAny = false;
  nodeId_ = nodeIdFromPorts(nics);
  RelayLookup lookup = [this, nics](const std::vector<HandleAddress>& peer, NodeId origin,
                                    const std::vector<NodeId>& exclude, bool mayWait) {
    return relayCandidates(peer, nics, origin, exclude, mayWait);
  };
  // Exit handlers run before any library's ELF destructor (ld.so's _dl_fini is the first
  // handler registered, so the last to run): once the relay relayed, its links end there,
  // cleanly, with the verbs provider it dlopened still loaded (stopForExit).
  // The route service exists before the relay thread starts: that thread's lookups read
  // routes_ (relayCandidates), which must not change under it. It starts (sends HELLOs)
  // after the relay port is bound, so that what the HELLOs announce is reachable; one that
  // failed to start stays, with an empty table.
  routes_ = std::make_unique<RouteService>(&reactor_, nics, routeServiceSettings(config_));
  relay_ = std::make_unique<RelayService>(&discovery_, &reactor_, commSettings(), hs, relaySettingsFrom(config_),
                                          nodeId_, lookup, [] { Plugin::instance().shutdown(true); });
  if (relay_->start() != ncclSuccess) relay_.reset();
  (void)routes_->start();  // it WARNs why
}

NextHopResult Plugin::relayNextHops(const std::vector<HandleAddress>& peer) {
  if (routes_ == nullptr) return NextHopResult{{}, "the relay is off"};
  return routes_->nextHops(peer);
}

std::vector<NextHop> Plugin::relayCandidates(const std::vector<HandleAddress>& peer, const std::vector<LocalNic>& nics,
                                             NodeId origin, const std::vector<NodeId>& exclude, bool mayWait) {
  // A path picked while a node is still being heard keeps its detour: wait (the connector
  // bounds it) until the picture is closed or has stopped changing (RouteService::settled).
  if (mayWait && routes_ != nullptr && !routes_->settled()) return {};
  auto onNics = [&nics](int port) {
    return std::any_of(nics.begin(), nics.end(), [port](const LocalNic& nic) { return nic.index == port; });
  };
  auto excluded = [&exclude](NodeId n) { return n != 0 && std::find(exclude.begin(), exclude.end(), n) != exclude.end(); };
  std::vector<NextHop> out;
  for (const NextHop& h : relayNextHops(peer).hops) {
    bool usable = h.route.hops > 0 && h.route.nextHopAddr != 0 && !excluded(h.route.nextHop);
    if (usable && onNics(h.route.localPort)) out.push_back(h);
  }
  preferIdlePorts(&out, [this](int port) { return tables_.sendsOnPort(port); });
  if (routes_ == nullptr || peer.empty() || !config_.relayPlan) return out;
  // While every node's view agrees, the route plan's neighbour first (issue 31); the fallback
  // rule's order stays behind it, for when that neighbour refuses.
  NodeId planned = routes_->planNextHop(origin, peer);
  if (planned == 0 || excluded(planned)) return out;
  std::vector<NeighbourLink> links;
  for (const NeighbourLink& l : routes_->neighbours()) {
    if (onNics(l.localPort)) links.push_back(l);
  }
  preferPlannedHop(&out, planned, peer.front().addr, links);
  return out;
}

RelayConnectSettings Plugin::relayConnectSettings() const {
  RelayConnectSettings s;
  s.port = config_.relayPort;
  s.maxHops = config_.relayMaxHops;
  s.timeoutMs = config_.connectTimeoutMs;
  s.self = nodeId_;
  return s;
}

namespace {

// ncclGetVersion of the NCCL that called init: in the global scope (NCCL linked into the
// program, or loaded RTLD_GLOBAL), else in the library holding the logger NCCL passed (its
// ncclDebugLog; PyTorch loads libnccl in a local scope, where RTLD_DEFAULT cannot see it).
// Both are lookups in libraries already loaded: nothing is loaded or initialized here.
NcclVersion loadingNcclVersion(ncclDebugLogger_t logger, std::string* where) {
  using GetVersion = int (*)(int*);
  auto ask = [](void* sym) {
    int code = 0;
    return sym != nullptr && reinterpret_cast<GetVersion>(sym)(&code) == 0 ? decodeNcclVersionCode(code)
                                                                            : NcclVersion();
  };
  NcclVersion v = ask(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  if (v.known()) {
    *where = "the process's global scope";
    return v;
  }
  Dl_info info{};
  if (logger == nullptr || dladdr(reinterpret_cast<void*>(logger), &info) == 0 || info.dli_fname == nullptr) {
    return v;
  }
  void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return v;
  v = ask(dlsym(lib, "ncclGetVersion"));
  dlclose(lib);
  if (v.known()) *where = info.dli_fname;
  return v;
}

}  // namespace

void Plugin::logLoader(ncclDebugLogger_t logger, int abi) {
  loaderLogged_ = true;
  std::string where;
  NcclVersion v = loadingNcclVersion(logger, &where);
  if (v.known()) {
    std::string text = v.text() + (where.empty() ? "" : " (ncclGetVersion in " + where + ")");
    snprintf(loaderNccl_, sizeof(loaderNccl_), "%s", text.c_str());
  }
  MESH_INFO(NCCL_INIT | NCCL_NET, "%s", describeLoader(v, where, abi).c_str());
  std::string reload = ncclReloadAdvice(v, std::getenv("NCCL_NET_PLUGIN_REF_COUNT"));
  if (!reload.empty()) MESH_INFO(NCCL_INIT | NCCL_NET, "%s", reload.c_str());
}

// Several lines when one would not fit: NCCL's logger cuts a message at 1023 bytes with its
// own prefix (host, pid, thread), and the defaults alone are about 900 characters.
void Plugin::logSettings() const {
  std::vector<std::string> lines = packLines(describeConfig(config_), kLogLineMax);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines.size() == 1) {
      MESH_INFO(NCCL_INIT | NCCL_ENV, "settings:%s", lines[i].c_str());
    } else {
      MESH_INFO(NCCL_INIT | NCCL_ENV, "settings (%zu/%zu):%s", i + 1, lines.size(), lines[i].c_str());
    }
  }
}

namespace {
// Runs when the library is unloaded (dlclose by NCCL) or at process exit: joins the
// reactor thread before its code disappears.
__attribute__((destructor)) void meshLibraryUnload() { Plugin::instance().shutdown(); }
}  // namespace

}  // namespace mesh
