// SPDX-License-Identifier: Apache-2.0
#include "mesh/discovery/nic_discovery.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <endian.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "mesh/discovery/hca_filter.h"
#include "mesh/platform/check.h"
#include "mesh/platform/log.h"

namespace mesh {

// --- VerbsDevice -----------------------------------------------------------------------

VerbsDevice::VerbsDevice(const VerbsApi* api, std::string name, ibv_context* ctx)
    : api_(api), name_(std::move(name)), ctx_(ctx) {}

VerbsDevice::~VerbsDevice() {
  // Reverse acquisition order; keep going when one step fails.
  if (pd_ != nullptr && api_->deallocPd(pd_) != 0) {
    MESH_WARN("ibv_dealloc_pd on %s failed: %s (a QP or MR still uses it)", name_.c_str(),
              strerror(errno));
  }
  if (ctx_ != nullptr && api_->closeDevice(ctx_) != 0) {
    MESH_WARN("ibv_close_device(%s) failed: %s", name_.c_str(), strerror(errno));
  }
}

ncclResult_t VerbsDevice::open() {
  if (api_->queryDevice(ctx_, &attr_) != 0) {
    MESH_WARN("ibv_query_device(%s) failed: %s", name_.c_str(), strerror(errno));
    return ncclSystemError;
  }
  pd_ = api_->allocPd(ctx_);
  if (pd_ == nullptr) {
    MESH_WARN("ibv_alloc_pd(%s) failed: %s", name_.c_str(), strerror(errno));
    return ncclSystemError;
  }
  // DMA-BUF probe: a registration of fd -1 fails with EOPNOTSUPP/EPROTONOSUPPORT when the
  // kernel or provider lacks support, and with another errno (EBADF) when it has it.
  if (api_->regDmabufMr != nullptr) {
    errno = 0;
    ibv_mr* mr = api_->regDmabufMr(pd_, 0, 0, 0, -1, 0);
    if (mr != nullptr) {
      api_->deregMr(mr);
      dmabuf_ = true;
    } else {
      dmabuf_ = errno != EOPNOTSUPP && errno != EPROTONOSUPPORT;
    }
  }
  return ncclSuccess;
}

std::string MeshPort::label() const {
  return device + ":" + std::to_string(port) + "/" + netdev;
}

// --- pure helpers ----------------------------------------------------------------------

bool gidToIpv4(const uint8_t gid[16], uint32_t* addr) {
  static const uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(gid, kMappedPrefix, sizeof(kMappedPrefix)) != 0) return false;
  *addr = (uint32_t{gid[12]} << 24) | (uint32_t{gid[13]} << 16) | (uint32_t{gid[14]} << 8) |
          gid[15];
  return *addr != 0;
}

// As NCCL's IB transport (net_ib/init.cc ncclIbSpeed/ncclIbWidth): the code's lowest set bit
// picks the entry, and a bit past the table counts as its last entry (a faster rate than
// this table knows is reported as the fastest it does, not as unknown).
int portSpeedMbps(uint32_t activeSpeed, uint8_t activeWidth) {
  static const int kLaneMbps[] = {2500,  5000,  10000,  10000,  14000,  // SDR DDR QDR FDR10 FDR
                                  25000, 50000, 100000, 200000};        // EDR HDR NDR XDR
  static const int kLanes[] = {1, 4, 8, 12, 2};                         // 1X 4X 8X 12X 2X
  if (activeSpeed == 0 || activeWidth == 0) return 0;
  auto entry = [](uint32_t code, int last) {
    int i = 0;
    while (i < last && (code & (1u << i)) == 0) ++i;
    return i;
  };
  return kLaneMbps[entry(activeSpeed, 8)] * kLanes[entry(activeWidth, 4)];
}

int reportedPortSpeedMbps(int querySpeedRc, uint64_t querySpeed100Mbps, uint32_t activeSpeedEx,
                          uint8_t activeSpeed, uint8_t activeWidth) {
  if (querySpeedRc == 0 && querySpeed100Mbps > 0) {
    return static_cast<int>(std::min<uint64_t>(querySpeed100Mbps * 100, INT_MAX));
  }
  return portSpeedMbps(activeSpeedEx != 0 ? activeSpeedEx : activeSpeed, activeWidth);
}

int mtuToBytes(int ibvMtu) {
  return (ibvMtu >= IBV_MTU_256 && ibvMtu <= IBV_MTU_4096) ? 128 << ibvMtu : 0;
}

int bytesToMtu(int bytes) {
  for (int m = IBV_MTU_256; m <= IBV_MTU_4096; ++m) {
    if (mtuToBytes(m) == bytes) return m;
  }
  return 0;
}

bool parseGidText(const std::string& text, uint8_t gid[16]) {
  std::string s = text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  in6_addr a{};
  if (inet_pton(AF_INET6, s.c_str(), &a) != 1) return false;
  memcpy(gid, a.s6_addr, 16);
  return true;
}

namespace {

bool readLine(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in || !std::getline(in, *out)) return false;
  while (!out->empty() && (out->back() == '\n' || out->back() == ' ')) out->pop_back();
  return true;
}

bool isZeroGid(const uint8_t gid[16]) {
  for (int i = 0; i < 16; ++i) {
    if (gid[i] != 0) return false;
  }
  return true;
}

std::string realPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) != nullptr ? std::string(buf) : std::string();
}

}  // namespace

namespace {

void readSysfsGid(const std::string& base, int i, std::vector<GidEntry>* out, std::vector<std::string>* problems) {
  std::string text, type, ndev;
  GidEntry e;
  e.index = i;
  std::string path = base + "/gids/" + std::to_string(i);
  if (!readLine(path, &text)) {
    if (problems != nullptr) problems->push_back("cannot read " + path);
    return;
  }
  if (!parseGidText(text, e.gid)) {
    if (problems != nullptr) problems->push_back(path + " is not a GID: '" + text + "'");
    return;
  }
  if (isZeroGid(e.gid)) return;
  if (readLine(base + "/gid_attrs/types/" + std::to_string(i), &type)) {
    e.rocev2 = type == "RoCE v2";
  }
  if (readLine(base + "/gid_attrs/ndevs/" + std::to_string(i), &ndev)) e.netdev = ndev;
  out->push_back(e);
}

std::string portBase(const std::string& root, const std::string& device, int port) {
  return root + "/class/infiniband/" + device + "/ports/" + std::to_string(port);
}

}  // namespace

std::vector<GidEntry> readSysfsGids(const std::string& root, const std::string& device, int port,
                                    int tableLen, std::vector<std::string>* problems) {
  std::vector<GidEntry> out;
  std::string base = portBase(root, device, port);
  tableLen = std::min(tableLen, kGidTableMaxLen);
  for (int i = 0; i < tableLen; ++i) readSysfsGid(base, i, &out, problems);
  return out;
}

std::vector<GidEntry> readSysfsGidIndices(const std::string& root, const std::string& device, int port,
                                          const std::vector<int>& indices, std::vector<std::string>* problems) {
  std::vector<int> sorted;
  for (int i : indices) {
    if (i >= 0 && i < kGidTableMaxLen) sorted.push_back(i);
  }
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::vector<GidEntry> out;
  std::string base = portBase(root, device, port);
  for (int i : sorted) readSysfsGid(base, i, &out, problems);
  return out;
}

std::vector<GidEntry> queryPortGids(const VerbsApi& api, ibv_context* ctx, const std::string& dev,
                                    int port, int tableLen) {
  // A provider's table length bounds the sysfs walk (a file per index): no real one comes
  // near this (mlx5 RoCE 255, rxe 1024, IB 128). readSysfsGids caps it too.
  tableLen = std::min(tableLen, kGidTableMaxLen);
  if (api.queryGidTable == nullptr || tableLen <= 0) {
    return readSysfsGids("/sys", dev, port, tableLen);
  }
  // The table call returns the populated entries of every port: room for eight ports' worth,
  // but never more than rdma-core can pass, whose ioctl carries the buffer's length in 16
  // bits and refuses a longer one with EINVAL before the kernel is asked (an rxe port's 1024
  // x 8 entries did, every time, and only sysfs answered). More populated entries than that
  // fail the call, and sysfs answers.
  size_t room = std::min(static_cast<size_t>(tableLen) * 8, static_cast<size_t>(UINT16_MAX) / sizeof(ibv_gid_entry));
  std::vector<ibv_gid_entry> entries(room);
  ssize_t n = api.queryGidTable(ctx, entries.data(), entries.size(), 0, sizeof(ibv_gid_entry));
  if (n < 0) return readSysfsGids("/sys", dev, port, tableLen);
  std::vector<GidEntry> out;
  for (ssize_t i = 0; i < n; ++i) {
    const ibv_gid_entry& g = entries[i];
    if (static_cast<int>(g.port_num) != port || isZeroGid(g.gid.raw)) continue;
    GidEntry e;
    e.index = static_cast<int>(g.gid_index);
    memcpy(e.gid, g.gid.raw, 16);
    e.rocev2 = g.gid_type == IBV_GID_TYPE_ROCE_V2;
    char name[IF_NAMESIZE] = {};
    if (g.ndev_ifindex != 0 && if_indextoname(g.ndev_ifindex, name) != nullptr) e.netdev = name;
    out.push_back(e);
  }
  return out;
}

GidNow gidNow(const VerbsApi& api, ibv_context* ctx, const std::string& device, int port, uint32_t addr,
              int knownIndex, const uint8_t knownGid[16]) {
  GidNow now;
  now.index = knownIndex;
  memcpy(now.gid, knownGid, 16);
  // One entry first: the index discovery found, its GID and type unchanged (every connect
  // but those after a change).
  if (api.queryGidEx != nullptr) {
    ibv_gid_entry e{};
    if (api.queryGidEx(ctx, static_cast<uint32_t>(port), static_cast<uint32_t>(knownIndex), &e, 0, sizeof(e)) == 0 &&
        memcmp(e.gid.raw, knownGid, 16) == 0 && e.gid_type == IBV_GID_TYPE_ROCE_V2) {
      now.state = GidNow::State::Same;
      return now;
    }
  } else if (api.queryGid != nullptr) {
    ibv_gid g{};
    if (api.queryGid(ctx, static_cast<uint8_t>(port), knownIndex, &g) == 0 && memcmp(g.raw, knownGid, 16) == 0) {
      now.state = GidNow::State::Same;
      return now;
    }
  }
  ibv_port_attr pattr{};
  if (api.queryPort == nullptr || queryPort(api, ctx, static_cast<uint8_t>(port), &pattr) != 0) return now;
  std::vector<GidEntry> gids = queryPortGids(api, ctx, device, port, pattr.gid_tbl_len);
  if (gids.empty()) return now;  // nothing readable (no sysfs here): cannot tell
  for (const GidEntry& g : gids) {
    uint32_t a = 0;
    if (!g.rocev2 || g.index > kGidIndexMax || !gidToIpv4(g.gid, &a) || a != addr) continue;
    now.state = g.index == knownIndex ? GidNow::State::Same : GidNow::State::Moved;
    now.index = g.index;
    memcpy(now.gid, g.gid, 16);
    return now;
  }
  now.state = GidNow::State::Gone;
  return now;
}

namespace {

// Prefix length of `addr` on `netdev`, from the kernel's interface list; -1 if absent.
int prefixOnNetdev(const ifaddrs* list, const std::string& netdev, uint32_t addr) {
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != AF_INET) continue;
    if (netdev != ifa->ifa_name) continue;
    auto* sin = reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr);
    if (ntohl(sin->sin_addr.s_addr) != addr || ifa->ifa_netmask == nullptr) continue;
    auto* mask = reinterpret_cast<const sockaddr_in*>(ifa->ifa_netmask);
    return __builtin_popcount(mask->sin_addr.s_addr);
  }
  return -1;
}

bool gdrAvailable() {
  static const char* const kPeermemFiles[] = {"/sys/kernel/mm/memory_peers/nv_mem/version",
                                              "/sys/module/nvidia_peermem/version",
                                              "/sys/module/nv_peer_mem/version"};
  for (const char* f : kPeermemFiles) {
    if (access(f, F_OK) == 0) return true;
  }
  return false;
}

// Fills port.addrs from the port's RoCEv2 IPv4 GIDs; returns why none qualified.
std::string collectAddresses(const std::vector<GidEntry>& gids, const ifaddrs* ifs,
                             MeshPort* port) {
  int rocev2 = 0;
  for (const GidEntry& g : gids) {
    uint32_t addr = 0;
    if (!g.rocev2) continue;
    ++rocev2;
    if (!gidToIpv4(g.gid, &addr)) continue;
    if (g.index > kGidIndexMax) {
      // A QP's source GID index is 8 bits in verbs (ibv_global_route.sgid_index) and on the
      // wire: a larger one would silently name another GID.
      MESH_INFO(NCCL_INIT, "%s:%d GID %d (%s) is beyond index %d, the largest a QP can use; skipped",
                port->device.c_str(), port->port, g.index, formatIpv4(addr).c_str(), kGidIndexMax);
      continue;
    }
    if (port->netdev.empty()) port->netdev = g.netdev;
    int prefix = prefixOnNetdev(ifs, g.netdev, addr);
    if (prefix < 0) {
      MESH_INFO(NCCL_INIT, "%s:%d GID %d (%s) has no matching address on %s; skipped",
                port->device.c_str(), port->port, g.index, formatIpv4(addr).c_str(),
                g.netdev.c_str());
      continue;
    }
    PortAddress pa;
    pa.ip = {addr, static_cast<uint8_t>(prefix)};
    pa.gidIndex = g.index;
    memcpy(pa.gid, g.gid, 16);
    port->addrs.push_back(pa);
  }
  if (!port->addrs.empty()) return "";
  if (rocev2 == 0) return "no RoCEv2 GID (is the port RoCE v1 only?)";
  return "no RoCEv2 GID carries an IPv4 address (assign one to " +
         (port->netdev.empty() ? std::string("its netdev") : port->netdev) + ")";
}

// Examines one port; returns true and fills *out when the mesh can use it.
bool probePort(const VerbsApi& api, const VerbsDevice& dev, int deviceIndex, int portNum,
               const ifaddrs* ifs, bool gdr, MeshPort* out) {
  const char* name = dev.name().c_str();
  ibv_port_attr pattr;
  uint32_t activeSpeedEx = 0;
  if (queryPort(api, dev.context(), static_cast<uint8_t>(portNum), &pattr, &activeSpeedEx) != 0) {
    MESH_INFO(NCCL_INIT, "%s:%d skipped: ibv_query_port failed: %s", name, portNum, strerror(errno));
    return false;
  }
  if (pattr.state != IBV_PORT_ACTIVE) {
    MESH_INFO(NCCL_INIT, "%s:%d skipped: port is not ACTIVE (state %d)", name, portNum, pattr.state);
    return false;
  }
  if (pattr.link_layer != IBV_LINK_LAYER_ETHERNET) {
    MESH_INFO(NCCL_INIT, "%s:%d skipped: InfiniBand link layer (nccl-mesh drives RoCE ports)", name,
              portNum);
    return false;
  }
  MeshPort p;
  p.deviceIndex = deviceIndex;
  p.device = dev.name();
  p.port = portNum;
  std::string why =
      collectAddresses(queryPortGids(api, dev.context(), dev.name(), portNum, pattr.gid_tbl_len), ifs, &p);
  if (!why.empty()) {
    MESH_INFO(NCCL_INIT, "%s:%d skipped: %s", name, portNum, why.c_str());
    return false;
  }
  p.activeMtu = pattr.active_mtu;
  p.mtuBytes = mtuToBytes(pattr.active_mtu);
  // NCCL 2.30's order: ibv_query_port_speed (rdma-core 62) when it answers, else the codes.
  uint64_t querySpeed = 0;
  int querySpeedRc = api.queryPortSpeed != nullptr
                         ? api.queryPortSpeed(dev.context(), static_cast<uint32_t>(portNum), &querySpeed)
                         : EOPNOTSUPP;
  p.speedMbps = reportedPortSpeedMbps(querySpeedRc, querySpeed, activeSpeedEx, pattr.active_speed,
                                      pattr.active_width);
  p.maxMsgSize = pattr.max_msg_sz;
  p.pciPath = realPath("/sys/class/infiniband/" + dev.name() + "/device");
  if (p.pciPath.empty() && !p.netdev.empty()) p.pciPath = realPath("/sys/class/net/" + p.netdev + "/device");
  p.guid = be64toh(dev.attr().node_guid);
  p.gdr = gdr;
  p.dmabuf = dev.dmabufSupported();
  *out = std::move(p);
  return true;
}

// An include entry that selects no device is almost always a typo or a missing NIC, and
// otherwise shows only as fewer ports than expected.
void warnUnmatchedHcaEntries(const HcaFilter& filter, const std::string& spec,
                             const std::vector<HcaDevice>& devices) {
  std::vector<HcaFilter::Entry> unmatched = unmatchedHcaEntries(filter, devices);
  if (unmatched.empty()) return;
  std::string names;
  for (const HcaDevice& d : devices) names += (names.empty() ? "" : ", ") + d.name;
  for (const HcaFilter::Entry& e : unmatched) {
    MESH_WARN("NCCL_MESH_HCA='%s': entry '%s' matches no RDMA device (devices here: %s)",
              spec.c_str(), hcaEntryText(e).c_str(), names.c_str());
  }
}

}  // namespace

ncclResult_t discoverPorts(const VerbsApi& api, const Config& config, Discovery* out) {
  out->ports.clear();
  out->devices.clear();
  std::string filterError;
  HcaFilter filter = parseHcaFilter(config.hca, &filterError);
  if (!filterError.empty()) MESH_WARN("NCCL_MESH_HCA='%s': %s", config.hca.c_str(), filterError.c_str());

  int ndev = 0;
  ibv_device** list = api.getDeviceList(&ndev);
  if (list == nullptr || ndev == 0) {
    int e = errno;
    out->emptyReason = list == nullptr
                           ? std::string("ibv_get_device_list failed: ") + strerror(e) +
                                 (e == ENOSYS ? " (the kernel has no RDMA support loaded: ib_uverbs?)" : "")
                           : "rdma-core lists no RDMA device (driver or rdma_rxe not loaded?)";
    if (list != nullptr) api.freeDeviceList(list);
    return ncclSuccess;
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) {
    MESH_WARN("getifaddrs failed: %s; no address can be matched to a port", strerror(errno));
    ifs = nullptr;
  }
  bool gdr = gdrAvailable();
  std::vector<HcaDevice> seen;  // every device listed, for the NCCL_MESH_HCA check below
  std::string overCap;  // devices left out beyond kMaxMeshDevices
  for (int d = 0; d < ndev; ++d) {
    std::string name = api.getDeviceName(list[d]);
    seen.push_back({name, -1});
    ibv_context* ctx = api.openDevice(list[d]);
    if (ctx == nullptr) {
      MESH_INFO(NCCL_INIT, "%s skipped: ibv_open_device failed: %s", name.c_str(), strerror(errno));
      continue;
    }
    auto dev = std::make_unique<VerbsDevice>(&api, name, ctx);
    if (dev->open() != ncclSuccess) continue;
    seen.back().portCount = dev->attr().phys_port_cnt;
    size_t before = out->ports.size();
    for (int p = 1; p <= dev->attr().phys_port_cnt; ++p) {
      if (!hcaMatches(filter, name, p)) {
        MESH_INFO(NCCL_INIT, "%s:%d skipped: excluded by NCCL_MESH_HCA=%s", name.c_str(), p,
                  config.hca.c_str());
        continue;
      }
      MeshPort port;
      if (probePort(api, *dev, static_cast<int>(out->devices.size()), p, ifs, gdr, &port)) {
        out->ports.push_back(std::move(port));
      }
    }
    if (out->ports.size() > before) {
      if (out->devices.size() == static_cast<size_t>(kMaxMeshDevices)) {
        out->ports.resize(before);  // a registration could not cover it: every regMr would fail
        overCap += (overCap.empty() ? "" : ", ") + name;
        continue;
      }
      out->devices.push_back(std::move(dev));
    }
  }
  if (!overCap.empty()) {
    MESH_WARN("RDMA devices with mesh ports beyond the first %d are not used: %s (NCCL_MESH_HCA chooses which "
              "devices the plugin takes)", kMaxMeshDevices, overCap.c_str());
  }
  if (ifs != nullptr) freeifaddrs(ifs);
  api.freeDeviceList(list);
  warnUnmatchedHcaEntries(filter, config.hca, seen);
  return ncclSuccess;
}

}  // namespace mesh
