// SPDX-License-Identifier: Apache-2.0
// What NCCL sees as network devices, built from the discovered ports. Pure code (no verbs),
// unit-tested.
//
// NCCL_MESH_DEVICES=port: one device per RDMA port, with that port's own PCI path and its
// function's node GUID. (NCCL's IB transport reports the card's sys_image_guid, and its
// search counts devices with one GUID and port number against one bandwidth budget: on a
// DGX Spark, all four functions. Port mode keeps them apart; not measured on a GPU.)
// NCCL_MESH_DEVICES=node (default): ONE device for the node; whatever device NCCL picks for
// a channel, each connection leaves on the port cabled to its peer. Its speed is the fastest
// cable's, all of that cable's functions together (cableGroups): what one peer can get. Its PCI path and GUID
// tell NCCL's topology where that device sits (src/graph/topo.cc ncclTopoAddNet, xml.cc
// ncclTopoFillNet, 2.28-2.30):
//  - all ports on one PCI function: that function's path and GUID, exact;
//  - ports on several PCI devices: no PCI path (NULL), so NCCL attaches the device to the
//    first CPU, as it does for a NIC with no PCI device. One device cannot sit at two PCI
//    positions, and reporting one port's position would let NCCL judge GPUDirect and PXN
//    by a GPU-NIC distance that the other ports' traffic does not have; NCCL's own NIC
//    fusion (makeVDevice) places a fused device at the physical NICs' common ancestor, a
//    made-up PCI node a plugin cannot report. Without a PCI path NCCL decides GPUDirect
//    by NCCL_NET_GDR_LEVEL against a CPU-attached NIC (host staging by default), which is
//    correct on any board. The GUID is the first port's node GUID (NCCL only needs it to
//    tell devices of one node apart and to hash a PCI id when there is no path).
// Rail and plane (ncclNet v12, NCCL 2.30 src/graph/search.cc ncclTopoSearchCheckNet): every
// device is on rail 0 and plane 0. A mesh has no rails (any port may carry a channel's
// traffic in one direction and another port the other way) and is one fabric; with equal
// rail ids NCCL lets a channel enter and leave a node through different devices, which is
// exactly what per-port mode needs, and with one device nothing changes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mesh/config/config.h"
#include "mesh/discovery/cables.h"
#include "mesh/discovery/nic_discovery.h"
#include "mesh/platform/cuda_caps.h"

namespace mesh {

enum PtrSupport : int { kPtrHost = 0x1, kPtrCuda = 0x2, kPtrDmabuf = 0x4 };

constexpr int kMeshRailId = 0;
constexpr int kMeshPlaneId = 0;

struct NetDevice {
  std::string name;
  std::vector<int> ports;  // indexes into Discovery::ports
  std::string pciPath;     // empty: none (NCCL gets NULL)
  uint64_t guid = 0;
  int ptrSupport = kPtrHost;
  int speedMbps = 0;
  int port = 1;
  float latencyUs = 0;
  int maxComms = 65536;
  int maxRecvs = 8;        // set from kGroupMax
  bool regIsGlobal = false;  // registrations cover the registering comm's devices (mr_cache.h)
  int railId = kMeshRailId;
  int planeId = kMeshPlaneId;
};

// The devices NCCL sees for these ports under config.devices (none without ports).
std::vector<NetDevice> makeNetDevices(const std::vector<MeshPort>& ports, const Config& config);

// The cables of this node (mesh/discovery/cables.h, the one rule the doctor uses too), as
// port indexes.
std::vector<std::vector<int>> cableGroups(const std::vector<MeshPort>& ports);

// What one peer can get through a cable: its functions together. Socket Direct functions
// each report the port's link speed (the largest is the cable's); other ports that share a
// subnet add up.
int cableSpeedMbps(const std::vector<MeshPort>& ports, const std::vector<int>& cable);


// The GPU side of ptrSupport (issue 32). The NIC side (a peermem module, a DMA-BUF probe)
// says whether the NIC could reach GPU memory; the CUDA driver says whether the GPUs let it.
// On a DGX Spark the NIC says yes to DMA-BUF and the GB10 says no to both: NCCL then stages
// through host memory, at full speed, and a plugin that offered CUDA or DMA-BUF memory would
// only mislead (and its hints would send users after nvidia-peermem, which cannot load there).
//  - the driver's answer unknown (no libcuda, no GPU): the NIC's answer, as before;
//  - known: CUDA only if the NIC has peermem and some GPU supports GPUDirect RDMA; DMA-BUF
//    only if the NIC does and some GPU supports DMA-BUF export;
//  - no GPU supports either: host memory only, no flush QPs (nothing to flush), and one
//    INFO line saying NCCL stages through host memory, which is expected on this hardware.
struct GpuDirectDecision {
  bool cuda = false;
  bool dmabuf = false;
  bool flushQps = true;     // receive comms need GPUDirect flush QPs (GPU memory can be registered)
  bool hostOnly = false;    // the GPUs rule out GPUDirect here
  std::string info;         // the INFO line; empty when the NIC's answer stands
};
GpuDirectDecision decideGpuDirect(const GpuCaps& gpus, bool nicGdr, bool nicDmabuf);
// Whether receive comms build flush QPs: where GPU memory can be registered (`gpuMemory`, a
// GpuDirectDecision's flushQps), unless NCCL_GDR_FLUSH_DISABLE (then no flush is ever
// posted); with NCCL_MESH_FORCE_FLUSH always.
bool receiverFlushQps(bool gpuMemory, bool gdrFlushDisable, bool forceFlush);
// ptrSupport of every device after `d`.
void applyGpuDirect(const GpuDirectDecision& d, std::vector<NetDevice>* devices);

}  // namespace mesh
