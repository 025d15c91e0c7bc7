// SPDX-License-Identifier: Apache-2.0
// NIC discovery: finds every port the mesh can use — ACTIVE, Ethernet link layer, with
// RoCEv2 GIDs that carry IPv4 addresses — and what routing and the data path need to know
// about it (netdev, IPv4 prefixes, GID index per address, MTU, speed, PCI path, GUID,
// GPUDirect and DMA-BUF support). Owns the opened verbs devices (context + PD) for the
// life of the plugin. Everything else is skipped with an INFO line saying why.
#pragma once

#include <cstdint>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "err.h"
#include "mesh/config/config.h"
#include "mesh/platform/ipv4.h"
#include "mesh/platform/verbs_loader.h"

namespace mesh {

// One opened RDMA device. Closed (PD first) when destroyed; failures are logged, never fatal.
class VerbsDevice {
 public:
  VerbsDevice(const VerbsApi* api, std::string name, ibv_context* ctx);
  ~VerbsDevice();
  VerbsDevice(const VerbsDevice&) = delete;
  VerbsDevice& operator=(const VerbsDevice&) = delete;

  const VerbsApi& api() const { return *api_; }
  const std::string& name() const { return name_; }
  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  const ibv_device_attr& attr() const { return attr_; }
  bool dmabufSupported() const { return dmabuf_; }

  ncclResult_t open();  // queries attributes, allocates the PD, probes DMA-BUF

  // IBV_EVENT_DEVICE_FATAL came (the reactor thread marks it): every comm on the device
  // fails at its next call and none is built on it again, as in NCCL's IB transport
  // (ncclIbDevFatalError; its isend, irecv and test check the device's fatal count): after a
  // fatal error a provider may never complete another WR, so nothing else would end them.
  void markFatal() { fatal_.store(true, std::memory_order_release); }
  bool fatal() const { return fatal_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> fatal_{false};
  const VerbsApi* api_;
  std::string name_;
  ibv_context* ctx_;
  ibv_pd* pd_ = nullptr;
  ibv_device_attr attr_{};
  bool dmabuf_ = false;
};

struct PortAddress {
  Ipv4Prefix ip;
  int gidIndex = -1;
  uint8_t gid[16] = {};
};

struct MeshPort {
  int deviceIndex = 0;      // into Discovery::devices
  std::string device;       // e.g. rxe_p1
  int port = 1;
  std::string netdev;       // e.g. p1
  std::vector<PortAddress> addrs;
  int activeMtu = 0;        // enum ibv_mtu
  int mtuBytes = 0;
  int speedMbps = 0;
  uint32_t maxMsgSize = 0;
  std::string pciPath;      // empty when the device has none (e.g. a virtual NIC)
  uint64_t guid = 0;        // node GUID, host order
  bool gdr = false;         // GPUDirect RDMA via peermem
  bool dmabuf = false;      // ibv_reg_dmabuf_mr works on this device
  std::string label() const;  // "rxe_p1:1/p1"
};

// The RDMA devices the plugin takes at most (a registration keeps a key per device:
// mr_cache.h). Devices with mesh ports beyond it are left out at init, with a WARN.
constexpr int kMaxMeshDevices = 16;

struct Discovery {
  std::vector<std::unique_ptr<VerbsDevice>> devices;
  std::vector<MeshPort> ports;
  std::string emptyReason;  // why no device was even listed (e.g. no RDMA in the kernel)
};

// Probes every device through `api`, applying config.hca. Returns ncclSuccess with zero
// ports when nothing is usable (the reasons are logged at INFO).
ncclResult_t discoverPorts(const VerbsApi& api, const Config& config, Discovery* out);

// --- pure helpers, unit-tested ---------------------------------------------------------
// IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d); false for any other GID.
bool gidToIpv4(const uint8_t gid[16], uint32_t* addr);
// Port speed in Mbps from ibv_port_attr's speed (active_speed, or active_speed_ex) and
// active_width codes, as NCCL's IB transport reads them; 0 when either code is 0.
int portSpeedMbps(uint32_t activeSpeed, uint8_t activeWidth);
// The speed a port reports, in NCCL 2.30's order: ibv_query_port_speed's answer (100 Mb/s
// units) when it returned 0 and a non-zero speed, else active_speed_ex when non-zero, else
// active_speed; times the width.
int reportedPortSpeedMbps(int querySpeedRc, uint64_t querySpeed100Mbps, uint32_t activeSpeedEx,
                          uint8_t activeSpeed, uint8_t activeWidth);
// Bytes for an enum ibv_mtu value (0 for unknown).
int mtuToBytes(int ibvMtu);
// enum ibv_mtu value for a byte count (0 for unsupported sizes).
int bytesToMtu(int bytes);

struct GidEntry {
  int index = 0;
  uint8_t gid[16] = {};
  bool rocev2 = false;
  std::string netdev;
};
// sysfs fallback for GID tables: reads <root>/class/infiniband/<dev>/ports/<port>/gids/<i>,
// gid_attrs/types/<i> and gid_attrs/ndevs/<i> for i < tableLen. `root` is "/sys" in
// production and a fake tree in tests. Unreadable or empty entries are skipped; with
// `problems`, each unreadable or malformed GID file is named there ("cannot read PATH: why").
std::vector<GidEntry> readSysfsGids(const std::string& root, const std::string& device, int port,
                                    int tableLen, std::vector<std::string>* problems = nullptr);
// The same for the listed indices only (those of the gids/ directory's entries that are
// numbers), each below kGidTableMaxLen: a stray gids/2000000 in a damaged tree is skipped
// rather than read as a table of two million entries.
std::vector<GidEntry> readSysfsGidIndices(const std::string& root, const std::string& device, int port,
                                          const std::vector<int>& indices, std::vector<std::string>* problems);
// GID table of one port of an open device: _ibv_query_gid_table when rdma-core has it (and
// it answers: at most 2047 populated entries, rdma-core's limit), the sysfs fallback
// otherwise. Netdev names are resolved in the caller's network namespace. `tableLen` is
// taken up to kGidTableMaxLen.
constexpr int kGidTableMaxLen = 4096;
// The largest GID index a QP can name (ibv_global_route.sgid_index is 8 bits, and so is the
// handshake's): discovery skips an address whose RoCEv2 GID sits beyond it.
constexpr int kGidIndexMax = 255;
std::vector<GidEntry> queryPortGids(const VerbsApi& api, ibv_context* ctx, const std::string& device,
                                    int port, int tableLen);
// Parses the text form of a GID ("fe80:0000:...:0001", as in sysfs). False on bad input.
bool parseGidText(const std::string& text, uint8_t gid[16]);

// Where the RoCEv2 GID of a local address sits in its port's GID table now. The table can
// change under a running process: an address removed and added again (a link flap with
// NetworkManager, `netplan apply`) comes back at another index when IPv6 GIDs took its slot
// meanwhile, so NCCL's IB transport looks the index up at every connect, and so do we.
struct GidNow {
  enum class State {
    Same,     // still at the index discovery found
    Moved,    // at `index` now (`gid` is its GID)
    Gone,     // the table was read and holds no RoCEv2 GID of the address
    Unknown,  // the table cannot be read here: keep what discovery found
  };
  State state = State::Unknown;
  int index = -1;
  uint8_t gid[16] = {};
};
GidNow gidNow(const VerbsApi& api, ibv_context* ctx, const std::string& device, int port, uint32_t addr,
              int knownIndex, const uint8_t knownGid[16]);

}  // namespace mesh
