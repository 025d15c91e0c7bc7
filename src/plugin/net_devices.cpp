// SPDX-License-Identifier: Apache-2.0
// NCCL's devices from the discovered ports (see net_devices.h for the choices).
#include "mesh/plugin/net_devices.h"

#include "mesh/datapath/comm.h"
#include "mesh/routing/subnet_routing.h"

#include <algorithm>

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

// The path of function 0 of the PCI device `path` (".../0000:01:00.1" -> ".../0000:01:00.0"):
// the functions of one card (each port of a ConnectX is its own function) sit at one PCIe
// position, and NCCL's IB transport reports every port of a multi-port NIC at function 0
// (net_ib ncclIbGetPciPath: "Merge multi-port NICs into the same PCI device").
std::string pciFunctionZero(const std::string& path) {
  size_t n = path.size();
  if (n < 2 || path[n - 2] != '.' || path[n - 1] < '0' || path[n - 1] > '7') return path;
  return path.substr(0, n - 1) + "0";
}

// One device for the node. Its speed is one cable's (all its functions): NCCL sizes channels
// per device, and any one peer is normally reached over a single cable.
NetDevice nodeDevice(const std::vector<MeshPort>& ports, const Config& config) {
  NetDevice d = fromPort(ports[0], config);
  d.name = "mesh";
  d.pciPath = pciFunctionZero(d.pciPath);
  if (config.speedMbps <= 0) {
    d.speedMbps = 0;
    for (const auto& cable : cableGroups(ports)) d.speedMbps = std::max(d.speedMbps, cableSpeedMbps(ports, cable));
  }
  for (size_t i = 0; i < ports.size(); ++i) {
    const MeshPort& p = ports[i];
    d.ports.push_back(static_cast<int>(i));
    if (!p.gdr) d.ptrSupport &= ~kPtrCuda;
    if (!p.dmabuf) d.ptrSupport &= ~kPtrDmabuf;
    // Several PCI devices (not functions of one card): no single position.
    if (pciFunctionZero(p.pciPath) != d.pciPath) d.pciPath.clear();
  }
  return d;
}

}  // namespace

std::vector<std::vector<int>> cableGroups(const std::vector<MeshPort>& ports) {
  std::vector<CableEnd> ends;
  for (const MeshPort& p : ports) {
    CableEnd e;
    e.netdev = p.netdev;
    e.pciPath = p.pciPath;
    for (const PortAddress& a : p.addrs) e.addrs.push_back(a.ip);
    ends.push_back(e);
  }
  return groupCableEnds(ends);
}

int cableSpeedMbps(const std::vector<MeshPort>& ports, const std::vector<int>& cable) {
  int sum = 0, largest = 0;
  bool socketDirect = cable.size() > 1;
  for (size_t i = 0; i < cable.size(); ++i) {
    const MeshPort& p = ports[cable[i]];
    sum += p.speedMbps;
    largest = std::max(largest, p.speedMbps);
    for (size_t j = 0; j < i; ++j) {
      socketDirect = socketDirect && socketDirectSiblings(ports[cable[j]].pciPath, p.pciPath);
    }
  }
  return socketDirect ? largest : sum;
}

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

GpuDirectDecision decideGpuDirect(const GpuCaps& gpus, bool nicGdr, bool nicDmabuf) {
  GpuDirectDecision d;
  d.cuda = nicGdr;
  d.dmabuf = nicDmabuf;
  // Flush QPs only where GPU memory can be registered at all, as NCCL's IB transport builds
  // them only with peermem or the NIC's DMA-BUF (2.30.7 net_ib/connect.cc flushEnabled).
  d.flushQps = d.cuda || d.dmabuf;
  if (!gpus.known()) return d;
  d.cuda = nicGdr && gpus.anyGdr();
  d.dmabuf = nicDmabuf && gpus.anyDmabuf();
  d.flushQps = d.cuda || d.dmabuf;
  if (!gpus.anyGdr() && !gpus.anyDmabuf()) {
    d.hostOnly = true;
    d.flushQps = false;
    d.info = "GPUDirect: no GPU here supports GPUDirect RDMA or DMA-BUF (" + gpus.describe() +
             "), so the plugin offers host memory only and NCCL stages through host buffers; this is expected "
             "on this hardware (DGX Spark's GB10 shares the host's memory and runs at full speed this way)";
  } else if (d.cuda != nicGdr || d.dmabuf != nicDmabuf) {
    d.info = std::string("GPUDirect: the GPUs allow ") + (d.cuda ? "GPUDirect RDMA" : "") +
             (d.cuda && d.dmabuf ? " and " : "") + (d.dmabuf ? "DMA-BUF" : "") + " (" + gpus.describe() + ")";
  }
  return d;
}

bool receiverFlushQps(bool gpuMemory, bool gdrFlushDisable, bool forceFlush) {
  return (gpuMemory && !gdrFlushDisable) || forceFlush;
}

void applyGpuDirect(const GpuDirectDecision& d, std::vector<NetDevice>* devices) {
  for (NetDevice& dev : *devices) {
    if (!d.cuda) dev.ptrSupport &= ~kPtrCuda;
    if (!d.dmabuf) dev.ptrSupport &= ~kPtrDmabuf;
  }
}

}  // namespace mesh
