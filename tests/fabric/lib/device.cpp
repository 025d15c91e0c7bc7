// SPDX-License-Identifier: Apache-2.0
// Devices, contexts and their queries: one RoCE v2 device per selected netdev of the
// caller's network namespace, each with one Ethernet port whose GID table holds the
// link-local GID (index 0) and one IPv4-mapped GID per address (index 1, ...), all RoCE v2,
// as rxe builds it. Also the asynchronous events (port up/down, QP and CQ errors).
#include <arpa/inet.h>
#include <fnmatch.h>
#include <ifaddrs.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "fabric.h"

#undef ibv_get_device_list
#undef ibv_query_port

namespace meshfab {

namespace {

constexpr int kGidTableLen = 16;
constexpr uint32_t kVendorId = 0x1af4;  // shown by ibv_devinfo; no PCI device behind it

// Default selection: netdevs with an IPv4 address in 198.18.0.0/16, where scripts/vmesh and
// scripts/fabric-net number their cables (198.18.L.0/24); not their management network
// (198.19.0.0/24).
bool defaultSelected(const std::vector<Ipv4Net>& addrs) {
  for (const Ipv4Net& a : addrs) {
    if ((a.addr & 0xffff0000u) == 0xc6120000u) return true;
  }
  return false;
}

bool selectedByList(const std::string& list, const std::string& name) {
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string pat = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!pat.empty() && fnmatch(pat.c_str(), name.c_str(), 0) == 0) return true;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return false;
}

void linkLocalGid(const uint8_t mac[6], ibv_gid* g) {
  memset(g, 0, sizeof(*g));
  g->raw[0] = 0xfe;
  g->raw[1] = 0x80;
  g->raw[8] = mac[0] ^ 2;
  g->raw[9] = mac[1];
  g->raw[10] = mac[2];
  g->raw[11] = 0xff;
  g->raw[12] = 0xfe;
  g->raw[13] = mac[3];
  g->raw[14] = mac[4];
  g->raw[15] = mac[5];
}

void ipv4Gid(uint32_t addr, ibv_gid* g) {
  memset(g, 0, sizeof(*g));
  g->raw[10] = 0xff;
  g->raw[11] = 0xff;
  uint32_t be = htonl(addr);
  memcpy(&g->raw[12], &be, 4);
}

struct NetdevInfo {
  std::string name;
  std::vector<Ipv4Net> addrs;
  unsigned flags = 0;
  int ifindex = 0;
  uint8_t mac[6] = {};
  bool haveMac = false;
};

std::map<std::string, NetdevInfo> scanNetdevs() {
  std::map<std::string, NetdevInfo> out;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    NetdevInfo& n = out[i->ifa_name];
    n.name = i->ifa_name;
    n.flags = i->ifa_flags;
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family == AF_INET && i->ifa_netmask != nullptr) {
      auto* a = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      auto* m = reinterpret_cast<sockaddr_in*>(i->ifa_netmask);
      n.addrs.push_back({ntohl(a->sin_addr.s_addr), __builtin_popcount(m->sin_addr.s_addr)});
    } else if (i->ifa_addr->sa_family == AF_PACKET) {
      auto* ll = reinterpret_cast<sockaddr_ll*>(i->ifa_addr);
      n.ifindex = ll->sll_ifindex;
      if (ll->sll_halen == 6) {
        memcpy(n.mac, ll->sll_addr, 6);
        n.haveMac = true;
      }
    }
  }
  freeifaddrs(ifs);
  return out;
}

int netdevMtu(const std::string& name) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return 1500;
  ifreq r{};
  snprintf(r.ifr_name, sizeof(r.ifr_name), "%s", name.c_str());
  int mtu = ioctl(s, SIOCGIFMTU, &r) == 0 ? r.ifr_mtu : 1500;
  close(s);
  return mtu;
}

std::string macHex(const uint8_t mac[6]) {
  char buf[16];
  snprintf(buf, sizeof(buf), "%02x%02x%02x%02x%02x%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
  return buf;
}

Device* deviceOf(ibv_device* d) { return reinterpret_cast<Device*>(d); }

// The count of read-but-unacknowledged events of the object an event names (destroying it
// waits for zero, as rdma-core's ibv_destroy_qp/cq do), or nullptr for port/device events.
int* asyncOutOf(const ibv_async_event& ev) {
  switch (ev.event_type) {
    case IBV_EVENT_CQ_ERR:
      return &reinterpret_cast<Cq*>(ev.element.cq)->asyncOut;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return &reinterpret_cast<Qp*>(ev.element.qp)->asyncOut;
    default:
      return nullptr;
  }
}

}  // namespace

ibv_mtu Port::activeMtu() const {
  // rxe: eth_mtu_int(mtu - RoCE v2 headers) rounded down to an IB MTU.
  int payload = mtu - 20 - 8 - 12 - 4 - 4;  // IPv4, UDP, BTH, ICRC, slack as rxe counts it
  if (payload >= 4096) return IBV_MTU_4096;
  if (payload >= 2048) return IBV_MTU_2048;
  if (payload >= 1024) return IBV_MTU_1024;
  if (payload >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

void Fabric::refreshDevices() {
  auto netdevs = scanNetdevs();
  for (auto& d : devices) d->present = false;
  for (auto& kv : netdevs) {
    NetdevInfo& n = kv.second;
    if (n.name == "lo" || !n.haveMac) continue;
    bool chosen = settings.netdevs.empty() ? defaultSelected(n.addrs) : selectedByList(settings.netdevs, n.name);
    if (!chosen) continue;
    std::string name = "fab_" + n.name;
    Device* dev = nullptr;
    for (auto& d : devices) {
      if (d->name == name) dev = d.get();
    }
    if (dev == nullptr) {
      devices.push_back(std::make_unique<Device>());
      dev = devices.back().get();
      memset(&dev->head, 0, sizeof(dev->head));
      dev->name = name;
      dev->index = static_cast<int>(devices.size()) - 1;
      ibv_device& id = dev->head.dev;
      id.node_type = IBV_NODE_CA;
      id.transport_type = IBV_TRANSPORT_IB;
      snprintf(id.name, sizeof(id.name), "%s", name.c_str());
      snprintf(id.dev_name, sizeof(id.dev_name), "uverbs%d", dev->index);
      snprintf(id.dev_path, sizeof(id.dev_path), "/sys/class/infiniband_verbs/uverbs%d", dev->index);
      snprintf(id.ibdev_path, sizeof(id.ibdev_path), "/sys/class/infiniband/%s", name.c_str());
    }
    dev->present = true;
    Port& p = dev->port;
    p.netdev = n.name;
    p.ifindex = n.ifindex;
    memcpy(p.mac, n.mac, 6);
    p.mtu = netdevMtu(n.name);
    p.addrs = n.addrs;
    p.up = (n.flags & IFF_UP) && (n.flags & IFF_RUNNING);
    p.gids.assign(1 + p.addrs.size(), ibv_gid{});
    linkLocalGid(p.mac, &p.gids[0]);
    for (size_t i = 0; i < p.addrs.size(); ++i) ipv4Gid(p.addrs[i].addr, &p.gids[i + 1]);
    dev->key = macHex(p.mac);
    uint8_t eui[8] = {static_cast<uint8_t>(p.mac[0] ^ 2), p.mac[1], p.mac[2], 0xff, 0xfe, p.mac[3], p.mac[4], p.mac[5]};
    memcpy(&dev->guidBe, eui, 8);
    loadPace(dev);
  }
}

// The rates file (pace.h), read once: the cables of a network do not change while it is up.
// No file: no caps.
const std::map<std::string, PaceConfig>& Fabric::rateTable() {
  if (ratesRead) return rates;
  ratesRead = true;
  std::ifstream in(settings.rates);
  if (!in) return rates;
  std::stringstream text;
  text << in.rdbuf();
  std::string errors;
  rates = parseRates(text.str(), &errors);
  if (!errors.empty()) fprintf(stderr, "meshfab: %s: skipped:\n%s", settings.rates.c_str(), errors.c_str());
  return rates;
}

// A port's rate caps and delay, once per device.
void Fabric::loadPace(Device* d) {
  if (d->paceLoaded) return;
  d->paceLoaded = true;
  const auto& table = rateTable();
  auto it = table.find(d->key);
  if (it == table.end() || !it->second.any()) return;
  std::string why;
  if (!d->pacer.configure(settings.dir, d->key, it->second, settings.burstNs, &why)) {
    fprintf(stderr, "meshfab: %s: link rate not applied: %s\n", d->name.c_str(), why.c_str());
    return;
  }
  paced = true;
  trace("%s: link rate %.0f B/s (wire %s %.0f B/s), delay %lld ns", d->name.c_str(), it->second.fnRate,
        it->second.wire.c_str(), it->second.wireRate, static_cast<long long>(it->second.delayNs));
}

Pacer* Fabric::inboundPacer(uint32_t addr) {
  auto found = inbound.find(addr);
  if (found != inbound.end()) return found->second.get();
  std::unique_ptr<Pacer>& slot = inbound[addr];
  const auto& table = rateTable();
  auto it = table.find(inboundKey(addr));
  if (it == table.end() || !it->second.capped()) return nullptr;
  auto p = std::make_unique<Pacer>();
  std::string why;
  if (!p->configure(settings.dir, it->first, it->second, settings.burstNs, &why)) {
    fprintf(stderr, "meshfab: %s: inbound rate not applied: %s\n", it->first.c_str(), why.c_str());
    return nullptr;
  }
  paced = true;
  trace("%s: inbound rate %.0f B/s (wire %s %.0f B/s)", it->first.c_str(), it->second.fnRate,
        it->second.wire.c_str(), it->second.wireRate);
  slot = std::move(p);
  return slot.get();
}

Device* Fabric::deviceForGid(const uint8_t gid[16]) {
  for (auto& d : devices) {
    if (!d->present || d->contexts.empty()) continue;
    for (const ibv_gid& g : d->port.gids) {
      if (memcmp(g.raw, gid, 16) == 0) return d.get();
    }
  }
  return nullptr;
}

void Fabric::queueAsyncEvent(Context* c, const ibv_async_event& ev) {
  c->events.push_back(ev);
  uint64_t one = 1;
  if (write(c->asyncFd, &one, sizeof(one)) != sizeof(one)) {
    trace("async event lost on %s: %s", c->dev->name.c_str(), strerror(errno));
  }
}

void Fabric::portStateChanged() {
  auto netdevs = scanNetdevs();
  for (auto& d : devices) {
    if (d->contexts.empty()) continue;
    auto it = netdevs.find(d->port.netdev);
    bool up = it != netdevs.end() && (it->second.flags & IFF_UP) && (it->second.flags & IFF_RUNNING);
    if (up == d->port.up) continue;
    d->port.up = up;
    trace("%s: port %s", d->name.c_str(), up ? "ACTIVE" : "DOWN");
    ibv_async_event ev{};
    ev.event_type = up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR;
    ev.element.port_num = 1;
    for (Context* c : d->contexts) queueAsyncEvent(c, ev);
  }
}

// --- queries ----------------------------------------------------------------------------------

namespace {

void fillDeviceAttr(const Device* d, ibv_device_attr* a) {
  memset(a, 0, sizeof(*a));
  snprintf(a->fw_ver, sizeof(a->fw_ver), "meshfab-1");
  a->node_guid = d->guidBe;
  a->sys_image_guid = d->guidBe;
  a->max_mr_size = uint64_t{1} << 40;
  a->page_size_cap = 0xfffff000;
  a->vendor_id = kVendorId;
  a->vendor_part_id = 0x4d46;
  a->hw_ver = 1;
  a->max_qp = 1 << 16;
  a->max_qp_wr = 16384;
  a->device_cap_flags = IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR | IBV_DEVICE_SHUTDOWN_PORT |
                        IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
  a->max_sge = 32;
  a->max_sge_rd = 32;
  a->max_cq = 1 << 16;
  a->max_cqe = (1 << 20) - 1;
  a->max_mr = 1 << 20;
  a->max_pd = 1 << 16;
  a->max_qp_rd_atom = 128;
  a->max_ee_rd_atom = 0;
  a->max_res_rd_atom = 128 << 10;
  a->max_qp_init_rd_atom = 128;
  a->atomic_cap = IBV_ATOMIC_NONE;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 15;
  a->phys_port_cnt = 1;
}

void fillPortAttr(const Device* d, ibv_port_attr* a) {
  memset(a, 0, sizeof(*a));
  const Port& p = d->port;
  a->state = p.up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = p.activeMtu();
  a->gid_tbl_len = kGidTableLen;
  a->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_REINIT_SUP | IBV_PORT_VENDOR_CLASS_SUP;
  a->max_msg_sz = 0x80000000u;
  a->pkey_tbl_len = 1;
  a->max_vl_num = 1;
  a->active_width = 2;   // 4X
  a->active_speed = 32;  // EDR: 25 Gb/s per lane, 100 Gb/s in all
  a->phys_state = p.up ? 5 : 3;  // LinkUp / Disabled
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
}

// One GID entry; ENODATA for an empty slot, EINVAL past the table.
int gidEntry(const Device* d, uint32_t port, uint32_t index, ibv_gid_entry* e) {
  if (port != 1 || index >= static_cast<uint32_t>(kGidTableLen)) return EINVAL;
  if (index >= d->port.gids.size()) return ENODATA;
  memset(e, 0, sizeof(*e));
  e->gid = d->port.gids[index];
  e->gid_index = index;
  e->port_num = 1;
  e->gid_type = IBV_GID_TYPE_ROCE_V2;
  e->ndev_ifindex = static_cast<uint32_t>(d->port.ifindex);
  return 0;
}

int queryPortOp(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t len) {
  Fabric* f = Fabric::get();
  if (port != 1) return EINVAL;
  ibv_port_attr full;
  {
    std::lock_guard<std::mutex> lk(f->mu);
    fillPortAttr(contextOf(ctx)->dev, &full);
  }
  // MESHFAB_PORT_SPEED=xdr: the kernel's 8-bit copy of 0x100 in active_speed is 0.
  if (f->settings.portSpeedEx != 0) full.active_speed = 0;
  memcpy(attr, &full, std::min(len, sizeof(full)));
  // rdma-core 49 appended `uint32_t active_speed_ex` at byte 52 (these headers may predate it).
  constexpr size_t kActiveSpeedExOffset = 52;
  uint32_t speedEx = f->settings.portSpeedEx;
  if (len >= kActiveSpeedExOffset + sizeof(speedEx)) {
    memcpy(reinterpret_cast<unsigned char*>(attr) + kActiveSpeedExOffset, &speedEx, sizeof(speedEx));
  }
  return 0;
}

int queryDeviceExOp(ibv_context* ctx, const ibv_query_device_ex_input*, ibv_device_attr_ex* attr,
                    size_t size) {
  if (size < sizeof(ibv_device_attr)) return EINVAL;
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  memset(attr, 0, std::min(size, sizeof(ibv_device_attr_ex)));
  fillDeviceAttr(contextOf(ctx)->dev, &attr->orig_attr);
  return 0;
}

}  // namespace

// Defined in the other object files; the context's op tables point at them.
int pollCq(ibv_cq* cq, int n, ibv_wc* wc);
int reqNotifyCq(ibv_cq* cq, int solicitedOnly);
int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
ibv_qp* createQpEx(ibv_context* ctx, ibv_qp_init_attr_ex* attr);
ibv_cq_ex* createCqEx(ibv_context* ctx, ibv_cq_init_attr_ex* attr);
void closeContextObjects(Fabric* f, Context* c);

}  // namespace meshfab

using namespace meshfab;

extern "C" {

ibv_device** ibv_get_device_list(int* num) {
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  f->refreshDevices();
  std::vector<ibv_device*> list;
  for (auto& d : f->devices) {
    if (d->present) list.push_back(&d->head.dev);
  }
  auto** out = static_cast<ibv_device**>(calloc(list.size() + 1, sizeof(ibv_device*)));
  if (out == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < list.size(); ++i) out[i] = list[i];
  if (num != nullptr) *num = static_cast<int>(list.size());
  return out;
}

void ibv_free_device_list(ibv_device** list) { free(list); }

const char* ibv_get_device_name(ibv_device* d) { return d->name; }

__be64 ibv_get_device_guid(ibv_device* d) { return deviceOf(d)->guidBe; }

int ibv_get_device_index(ibv_device* d) { return deviceOf(d)->index; }

ibv_context* ibv_open_device(ibv_device* d) {
  Fabric* f = Fabric::get();
  Device* dev = deviceOf(d);
  std::lock_guard<std::mutex> lk(f->mu);
  std::string why;
  if (!f->startTransport(&why)) {
    fprintf(stderr, "meshfab: cannot open %s: %s\n", dev->name.c_str(), why.c_str());
    errno = EIO;
    return nullptr;
  }
  auto* c = new Context();
  memset(&c->vctx, 0, sizeof(c->vctx));
  c->dev = dev;
  c->asyncFd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (c->asyncFd < 0) {
    int e = errno;
    delete c;
    errno = e;
    return nullptr;
  }
  verbs_context& v = c->vctx;
  v.sz = sizeof(verbs_context);
  v.query_port = queryPortOp;
  v.query_device_ex = queryDeviceExOp;
  v.create_qp_ex = createQpEx;
  v.create_cq_ex = createCqEx;
  ibv_context& ctx = v.context;
  ctx.device = d;
  ctx.cmd_fd = -1;
  ctx.async_fd = c->asyncFd;
  ctx.num_comp_vectors = 1;
  ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
  pthread_mutex_init(&ctx.mutex, nullptr);
  ctx.ops.poll_cq = pollCq;
  ctx.ops.req_notify_cq = reqNotifyCq;
  ctx.ops.post_send = postSend;
  ctx.ops.post_recv = postRecv;
  dev->contexts.push_back(c);
  f->openContexts++;
  f->registerDevice(dev);
  f->devStats(dev)->res[kResCtx]++;
  return &ctx;
}

int ibv_close_device(ibv_context* ctx) {
  Fabric* f = Fabric::get();
  Context* c = contextOf(ctx);
  std::unique_lock<std::mutex> lk(f->mu);
  closeContextObjects(f, c);
  auto& list = c->dev->contexts;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == c) list.erase(list.begin() + static_cast<long>(i));
  }
  f->devStats(c->dev)->res[kResCtx]--;
  close(c->asyncFd);
  pthread_mutex_destroy(&ctx->mutex);
  delete c;
  if (--f->openContexts == 0) f->stopTransport(lk);
  return 0;
}

int ibv_query_device(ibv_context* ctx, ibv_device_attr* attr) {
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  fillDeviceAttr(contextOf(ctx)->dev, attr);
  return 0;
}

// IBVERBS_1.1: the attribute struct of that ABI ends at `flags` (rdma-core's
// _compat_ibv_port_attr); newer callers reach queryPortOp through verbs.h's inline wrapper.
int ibv_query_port(ibv_context* ctx, uint8_t port, _compat_ibv_port_attr* attr) {
  return queryPortOp(ctx, port, reinterpret_cast<ibv_port_attr*>(attr), offsetof(ibv_port_attr, port_cap_flags2));
}

// IBVERBS_1.16 (rdma-core 62): the port's rate in 100 Mb/s units; EOPNOTSUPP unless
// MESHFAB_PORT_SPEED=query:N, as rdma-core's dummy op for a provider that has none.
int ibv_query_port_speed(ibv_context*, uint32_t port, uint64_t* speed) {
  Fabric* f = Fabric::get();
  if (port != 1) return EINVAL;
  if (f->settings.portSpeedQuery == 0) return EOPNOTSUPP;
  *speed = f->settings.portSpeedQuery;
  return 0;
}

int ibv_query_gid(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) {
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  ibv_gid_entry e;
  int rc = index < 0 ? EINVAL : gidEntry(contextOf(ctx)->dev, port, static_cast<uint32_t>(index), &e);
  if (rc == ENODATA) {  // rdma-core: an empty slot reads as zeros
    memset(gid, 0, sizeof(*gid));
    return 0;
  }
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  *gid = e.gid;
  return 0;
}

// rdma-core's private (IBVERBS_PRIVATE_*) helper that ibv_devinfo uses: 0 = IB/RoCE v1, 1 = RoCE v2.
int ibv_query_gid_type(ibv_context* ctx, uint8_t port, unsigned int index, int* type) {
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  ibv_gid_entry e;
  int rc = gidEntry(contextOf(ctx)->dev, port, index, &e);
  if (rc == EINVAL) {
    errno = rc;
    return -1;
  }
  *type = 1;
  return 0;
}

int _ibv_query_gid_ex(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entrySize) {
  if (flags != 0 || entrySize < sizeof(ibv_gid_entry)) return EINVAL;
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  return gidEntry(contextOf(ctx)->dev, port, index, entry);
}

ssize_t _ibv_query_gid_table(ibv_context* ctx, ibv_gid_entry* entries, size_t max, uint32_t flags,
                             size_t entrySize) {
  if (flags != 0 || entrySize < sizeof(ibv_gid_entry)) return -EINVAL;
  // rdma-core marshals the buffer's length in 16 bits: longer fails with EINVAL, unasked.
  if (max > UINT16_MAX / entrySize) return -EINVAL;
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  const Device* d = contextOf(ctx)->dev;
  size_t n = d->port.gids.size();
  if (max < n) return -EINVAL;
  for (size_t i = 0; i < n; ++i) {
    auto* e = reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + i * entrySize);
    gidEntry(d, 1, static_cast<uint32_t>(i), e);
  }
  return static_cast<ssize_t>(n);
}

int ibv_query_pkey(ibv_context*, uint8_t port, int index, __be16* pkey) {
  if (port != 1 || index != 0) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htons(0xffff);
  return 0;
}

int ibv_get_pkey_index(ibv_context*, uint8_t port, __be16 pkey) {
  if (port != 1 || ntohs(pkey) != 0xffff) {
    errno = ENOENT;
    return -1;
  }
  return 0;
}

int ibv_get_async_event(ibv_context* ctx, ibv_async_event* ev) {
  Context* c = contextOf(ctx);
  Fabric* f = Fabric::get();
  for (;;) {
    uint64_t n;
    ssize_t r = read(c->asyncFd, &n, sizeof(n));  // blocks unless the caller set O_NONBLOCK
    if (r != sizeof(n)) {
      if (r < 0 && errno == EINTR) continue;
      return -1;
    }
    std::lock_guard<std::mutex> lk(f->mu);
    if (c->events.empty()) continue;  // its object was destroyed before it was read
    *ev = c->events.front();
    c->events.pop_front();
    if (int* out = asyncOutOf(*ev)) ++*out;
    return 0;
  }
}

// Test-only (not rdma-core's): device `name` suffers a fatal error, as a NIC whose firmware
// died: every context of it gets IBV_EVENT_DEVICE_FATAL and its CQs never complete anything
// again. 0, or ENODEV when no device has that name. The e2e scenario device-fatal finds it
// with dlsym in the library the plugin loaded.
int meshfab_test_device_fatal(const char* name) {
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  for (auto& d : f->devices) {
    if (name == nullptr || d->name != name) continue;
    d->fatal = true;
    trace("%s: fatal error (test)", d->name.c_str());
    ibv_async_event ev{};
    ev.event_type = IBV_EVENT_DEVICE_FATAL;
    for (Context* c : d->contexts) f->queueAsyncEvent(c, ev);
    return 0;
  }
  return ENODEV;
}

void ibv_ack_async_event(ibv_async_event* ev) {
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  if (int* out = asyncOutOf(*ev)) --*out;
  f->cv.notify_all();  // a destroy may be waiting for this ack
}

}  // extern "C"
