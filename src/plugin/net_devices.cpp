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

// The PCI address a sysfs device path ends in ("0002:01:00.1"), split at the domain.
bool splitPciAddress(const std::string& path, std::string* domain, std::string* rest) {
  std::string last = path.substr(path.find_last_of('/') + 1);
  size_t colon = last.find(':');
  if (colon == std::string::npos || last.find('.') == std::string::npos || last.size() < 12) return false;
  *domain = last.substr(0, colon);
  *rest = last.substr(colon + 1);
  return true;
}

bool shareSubnet(const MeshPort& a, const MeshPort& b) {
  for (const PortAddress& x : a.addrs) {
    for (const PortAddress& y : b.addrs) {
      if (onSameLink(x.ip, y.ip)) return true;
    }
  }
  return false;
}

int findRoot(std::vector<int>& parent, int i) {
  while (parent[i] != i) i = parent[i] = parent[parent[i]];
  return i;
}

// One device for the node. Its speed is one cable's (all its functions): NCCL sizes channels
// per device, and any one peer is normally reached over a single cable.
NetDevice nodeDevice(const std::vector<MeshPort>& ports, const Config& config) {
  NetDevice d = fromPort(ports[0], config);
  d.name = "mesh";
  if (config.speedMbps <= 0) {
    d.speedMbps = 0;
    for (const auto& cable : cableGroups(ports)) d.speedMbps = std::max(d.speedMbps, cableSpeedMbps(ports, cable));
  }
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

bool socketDirectSiblings(const std::string& pciPathA, const std::string& pciPathB) {
  std::string da, ra, db, rb;
  return splitPciAddress(pciPathA, &da, &ra) && splitPciAddress(pciPathB, &db, &rb) && ra == rb && da != db;
}

std::vector<std::vector<int>> cableGroups(const std::vector<MeshPort>& ports) {
  std::vector<int> parent(ports.size());
  for (size_t i = 0; i < ports.size(); ++i) parent[i] = static_cast<int>(i);
  for (size_t i = 0; i < ports.size(); ++i) {
    for (size_t j = i + 1; j < ports.size(); ++j) {
      if (socketDirectSiblings(ports[i].pciPath, ports[j].pciPath) || shareSubnet(ports[i], ports[j])) {
        parent[findRoot(parent, static_cast<int>(j))] = findRoot(parent, static_cast<int>(i));
      }
    }
  }
  std::vector<std::vector<int>> groups;
  std::vector<int> groupOfRoot(ports.size(), -1);
  for (size_t i = 0; i < ports.size(); ++i) {
    int root = findRoot(parent, static_cast<int>(i));
    if (groupOfRoot[root] < 0) {
      groupOfRoot[root] = static_cast<int>(groups.size());
      groups.emplace_back();
    }
    groups[groupOfRoot[root]].push_back(static_cast<int>(i));
  }
  return groups;
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
  if (!gpus.known()) return d;
  d.cuda = nicGdr && gpus.anyGdr();
  d.dmabuf = nicDmabuf && gpus.anyDmabuf();
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

void applyGpuDirect(const GpuDirectDecision& d, std::vector<NetDevice>* devices) {
  for (NetDevice& dev : *devices) {
    if (!d.cuda) dev.ptrSupport &= ~kPtrCuda;
    if (!d.dmabuf) dev.ptrSupport &= ~kPtrDmabuf;
  }
}

}  // namespace mesh
