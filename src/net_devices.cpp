// SPDX-License-Identifier: Apache-2.0
// NCCL's devices from the discovered ports (see net_devices.h for the choices).
#include "mesh/net_devices.h"

#include "mesh/comm.h"

namespace mesh {
namespace {

NetDevice fromPort(const MeshPort& p, const Config& config) {
  NetDevice d;
  d.pciPath = p.pciPath;
  d.guid = p.guid;
  d.port = p.port;
  d.speedMbps = config.speedMbps > 0 ? config.speedMbps : p.speedMbps;
  d.ptrSupport = kPtrHost | (p.gdr ? kPtrCuda : 0) | (p.dmabuf ? kPtrDmabuf : 0);
  d.maxRecvs = kGroupMax;
  return d;
}

// One device for the node. Its speed is one link's: NCCL sizes channels per device, and any
// one peer is normally reached over a single cable.
NetDevice nodeDevice(const std::vector<MeshPort>& ports, const Config& config) {
  NetDevice d = fromPort(ports[0], config);
  d.name = "mesh";
  for (size_t i = 0; i < ports.size(); ++i) {
    const MeshPort& p = ports[i];
    d.ports.push_back(static_cast<int>(i));
    if (!p.gdr) d.ptrSupport &= ~kPtrCuda;
    if (!p.dmabuf) d.ptrSupport &= ~kPtrDmabuf;
    if (p.pciPath != d.pciPath) d.pciPath.clear();  // several PCI devices: no single position
  }
  return d;
}

}  // namespace

std::vector<NetDevice> makeNetDevices(const std::vector<MeshPort>& ports, const Config& config) {
  std::vector<NetDevice> out;
  if (ports.empty()) return out;
  if (config.devices == DeviceMode::Node) {
    out.push_back(nodeDevice(ports, config));
    return out;
  }
  for (size_t i = 0; i < ports.size(); ++i) {
    NetDevice d = fromPort(ports[i], config);
    d.name = ports[i].device + ":" + std::to_string(ports[i].port);
    d.ports = {static_cast<int>(i)};
    out.push_back(d);
  }
  return out;
}

}  // namespace mesh
