// SPDX-License-Identifier: Apache-2.0
// Plugin core: process-wide state behind the ABI layer — settings, the verbs library,
// discovered ports, the NCCL device list, the handshake reactor, and the tables of comms
// and connects handed to NCCL. It is the one owner of every verbs object that is not a
// comm's own (devices: context and PD; memory registrations), and of the comms NCCL left
// open when it unloads the library.
// Lifecycle: init() once per process (idempotent; NCCL >= 2.28 calls it per communicator);
// shutdown() from the library destructor at a dlclose, or explicitly in tests, tears
// everything down in one order: reactor thread (joined), pending connects, comms NCCL never
// closed, memory registrations, devices, libibverbs. Nothing outlives a dlclose(). At process
// exit it only stops this library's threads: NCCL's own threads (its proxy) may still be in
// isend/test on the comms NCCL never closed, so those, and what they use, stay to the end.
// In a forked child (its pid is not the one that ran init) shutdown() touches nothing: the
// verbs objects, their uverbs file and the reactor thread belong to the parent.
// NCCL's structs are not known here: the ABI layer translates.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "err.h"
#include "mesh/config/config.h"
#include "mesh/connect/handshake.h"
#include "mesh/connect/reactor.h"
#include "mesh/datapath/comm.h"
#include "mesh/discovery/nic_discovery.h"
#include "mesh/platform/verbs_loader.h"
#include "mesh/plugin/net.h"
#include "mesh/plugin/net_devices.h"
#include "mesh/rdma/mr_cache.h"
#include "mesh/relay/relay_service.h"
#include "mesh/relay/route_service.h"
#include "mesh/routing/routes.h"

namespace mesh {

class Plugin {
 public:
  static Plugin& instance();

  // `abi`: the ncclNet version NCCL entered through (8..12), 0 from the tools. The first
  // init with an ABI logs which NCCL loaded the library.
  ncclResult_t init(ncclDebugLogger_t logger, int abi = 0);
  // `fromExitHandler`: called by the relay's atexit handler (the verbs provider is still
  // loaded then: the relay's links end cleanly). At exit, from there or from the ELF
  // destructor, only the threads stop (see shutdown()).
  void shutdown(bool fromExitHandler = false);
  bool initialized() const { return initialized_; }
  // True in a child forked after init (set by a pthread_atfork handler: a load, no syscall,
  // so the data path may check it). Every entry point refuses to run there.
  static bool inForkedChild();

  int deviceCount() const { return static_cast<int>(netDevices_.size()); }
  ncclResult_t device(int dev, const NetDevice** out) const;

  const Config& config() const { return config_; }
  // "2.28.9 (ncclGetVersion in <lib>)": the NCCL that called init, as its log line says; empty
  // when unknown. Set in init, before the recorder starts (its header carries it).
  std::string loaderNccl() const { return loaderNccl_; }
  // What the GPUs said about GPUDirect RDMA and DMA-BUF at init (net_devices.h, decideGpuDirect).
  const GpuCaps& gpus() const { return gpus_; }
  const VerbsApi& verbs() const { return verbs_; }
  const Discovery& discovery() const { return discovery_; }
  Reactor& reactor() { return reactor_; }
  // Connection machinery, one per NCCL device (they share the reactor); nullptr when the
  // node has no usable port. `dev` must be valid (checked by the caller via device()).
  Handshaker* handshakerFor(int dev) { return handshakers_.at(static_cast<size_t>(dev)).get(); }
  Transport* transport(int dev) { return transports_.at(static_cast<size_t>(dev)).get(); }
  Handshaker* handshaker() { return handshakers_.empty() ? nullptr : handshakers_[0].get(); }
  MrRegistry* registry() { return registry_.get(); }
  NetTables& tables() { return tables_; }
  // Relay (NCCL_MESH_RELAY=auto): the neighbours that reach a peer we have no cable to,
  // preferred first; and how a relayed connect asks them.
  NextHopResult relayNextHops(const std::vector<HandleAddress>& peer);
  // relayNextHops() reduced to relayed next hops on `nics`, none of them in `exclude`, in the
  // fallback rule's order, with the route plan's next hop for the pair (origin, peer) first
  // while views agree (origin 0: this node). With `mayWait`, none while the route picture has
  // not settled (RouteService::settled): the relayed connect asks again.
  std::vector<NextHop> relayCandidates(const std::vector<HandleAddress>& peer, const std::vector<LocalNic>& nics,
                                       NodeId origin, const std::vector<NodeId>& exclude, bool mayWait);
  // The route discovery service; nullptr unless NCCL_MESH_RELAY=auto started it.
  const RouteService* routeService() const { return routes_.get(); }
  RelayConnectSettings relayConnectSettings() const;
  HandshakeSettings handshakeSettings() const;  // NCCL_MESH_* timeouts, listen address, port range
  RelayService* relayService() { return relay_.get(); }

 private:
  Plugin() = default;
  void buildNetDevices();
  void logSettings() const;
  void logLoader(ncclDebugLogger_t logger, int abi);
  void buildConnectionMachinery();
  void watchAsyncEvents();
  void initFork();
  void startRelay();
  void startStats();
  void stopForExit(bool fromExitHandler);
  CommSettings commSettings() const;

  std::mutex initMutex_;   // serializes init/shutdown (NCCL may init from several threads)
  bool initialized_ = false;
  bool loaderLogged_ = false;  // under initMutex_
  // Under initMutex_; see loaderNccl(). A fixed buffer, not a std::string: this object lives
  // in static storage that dlclose unmaps, and the text outlives shutdown (logged once).
  char loaderNccl_[320] = {};
  Config config_;
  VerbsApi verbs_;
  Discovery discovery_;
  std::vector<NetDevice> netDevices_;
  bool flushQps_ = true;       // receive comms get GPUDirect flush QPs (decideGpuDirect)
  GpuCaps gpus_;               // the CUDA driver's answer at init (unknown without one)
  Reactor reactor_;
  std::unique_ptr<MrRegistry> registry_;
  std::vector<std::unique_ptr<RdmaTransport>> transports_;
  std::vector<std::unique_ptr<Handshaker>> handshakers_;
  NetTables tables_;
  std::unique_ptr<RelayService> relay_;
  std::unique_ptr<RouteService> routes_;  // HELLOs on the mesh ports; thread-safe queries
  NodeId nodeId_ = 0;
  pid_t initPid_ = 0;      // the process that ran init
  bool stoppedForExit_ = false;  // under initMutex_: stopForExit() ran
};

}  // namespace mesh
