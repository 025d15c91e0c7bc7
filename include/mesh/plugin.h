// Plugin core: process-wide state behind the ABI layer — settings, the verbs library,
// discovered ports, the NCCL device list, and the handshake reactor.
// Lifecycle: init() once per process (idempotent); shutdown() from the library destructor
// (or explicitly in tests) stops the reactor and closes devices, so nothing outlives a
// dlclose(). NCCL's structs are not known here: the ABI layer translates.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "err.h"
#include "mesh/comm.h"
#include "mesh/config.h"
#include "mesh/handshake.h"
#include "mesh/mr_cache.h"
#include "mesh/nic_discovery.h"
#include "mesh/reactor.h"
#include "mesh/verbs_loader.h"

namespace mesh {

enum PtrSupport : int { kPtrHost = 0x1, kPtrCuda = 0x2, kPtrDmabuf = 0x4 };

// What NCCL sees as one network device: by default the whole node (all mesh ports, traffic
// to each peer leaves on the port cabled to it); with NCCL_MESH_DEVICES=port, one port.
struct NetDevice {
  std::string name;
  std::vector<int> ports;  // indexes into Discovery::ports
  std::string pciPath;
  uint64_t guid = 0;
  int ptrSupport = kPtrHost;
  int speedMbps = 0;
  int port = 1;
  float latencyUs = 0;
  int maxComms = 65536;
  int maxRecvs = kGroupMax;
  bool regIsGlobal = true;
};

class Plugin {
 public:
  static Plugin& instance();

  ncclResult_t init(ncclDebugLogger_t logger);
  void shutdown();
  bool initialized() const { return initialized_; }

  int deviceCount() const { return static_cast<int>(netDevices_.size()); }
  ncclResult_t device(int dev, const NetDevice** out) const;

  const Config& config() const { return config_; }
  const VerbsApi& verbs() const { return verbs_; }
  const Discovery& discovery() const { return discovery_; }
  Reactor& reactor() { return reactor_; }
  // Connection machinery, one per NCCL device (they share the reactor); nullptr when the
  // node has no usable port. `dev` must be valid (checked by the caller via device()).
  Handshaker* handshakerFor(int dev) { return handshakers_.at(static_cast<size_t>(dev)).get(); }
  Transport* transport(int dev) { return transports_.at(static_cast<size_t>(dev)).get(); }
  Handshaker* handshaker() { return handshakers_.empty() ? nullptr : handshakers_[0].get(); }
  MrRegistry* registry() { return registry_.get(); }

 private:
  Plugin() = default;
  void buildNetDevices();
  void logSettings() const;
  void buildConnectionMachinery();
  void watchAsyncEvents();
  CommSettings commSettings() const;

  std::mutex initMutex_;   // serializes init/shutdown (NCCL may init from several threads)
  bool initialized_ = false;
  Config config_;
  VerbsApi verbs_;
  Discovery discovery_;
  std::vector<NetDevice> netDevices_;
  Reactor reactor_;
  std::unique_ptr<MrRegistry> registry_;
  std::vector<std::unique_ptr<RdmaTransport>> transports_;
  std::vector<std::unique_ptr<Handshaker>> handshakers_;
};

}  // namespace mesh
