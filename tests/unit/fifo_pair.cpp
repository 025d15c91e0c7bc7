// SPDX-License-Identifier: Apache-2.0
// The in-process connection of fifo_pair.h.
#include "fifo_pair.h"

#include <gtest/gtest.h>

#include <cstring>

namespace mesh {
namespace fake {

namespace {

// Link l joins A's 198.18.l.1/24 and B's 198.18.l.2/24, GID index 1 (IPv4-mapped).
uint32_t linkAddr(int link, bool senderSide) {
  return (198u << 24) | (18u << 16) | (static_cast<uint32_t>(link) << 8) | (senderSide ? 1u : 2u);
}

CommSettings settingsFor(const PairOptions& o, const FakeRdma& fake, int envTc, int fifoTc, bool ece) {
  CommSettings s;
  s.qpsPerLink = o.qpsPerLink;
  s.splitMin = o.splitMin;
  s.maxWrBytes = o.maxWrBytes;
  s.forceFlush = o.forceFlush;
  s.envTrafficClass = envTc;
  s.fifoTrafficClass = fifoTc;
  s.ece = ece;
  s.ops = fake.ops();
  return s;
}

}  // namespace

FifoPair::FifoPair(FakeRdma& fake, PairOptions options) : fake_(fake), options_(options) {
  buildSide(&discA_, "a", true);
  buildSide(&discB_, "b", false);
  transportA_ = std::make_unique<RdmaTransport>(&discA_, settingsFor(options_, fake_, options_.senderEnvTc, options_.senderFifoTc, options_.senderEce));
  transportB_ = std::make_unique<RdmaTransport>(&discB_, settingsFor(options_, fake_, options_.receiverEnvTc, options_.receiverFifoTc, options_.receiverEce));
  ConnOptions opts;
  opts.trafficClass = options_.connTc;
  HsMessage hello, accept;
  EXPECT_EQ(transportA_->prepare(true, routes(true), opts, &connA_, &hello), ncclSuccess);
  EXPECT_EQ(transportB_->prepare(false, routes(false), ConnOptions(), &connB_, &accept), ncclSuccess);
  activatedB_ = transportB_->activate(connB_.get(), hello, &accept);
  if (options_.editAccept) options_.editAccept(&accept);
  if (activatedB_ == ncclSuccess) activatedA_ = transportA_->activate(connA_.get(), accept, nullptr);
  if (!options_.mayFail) {
    EXPECT_EQ(activatedB_, ncclSuccess);
    EXPECT_EQ(activatedA_, ncclSuccess);
  }
  sender_ = static_cast<SendComm*>(connA_.get());
  receiver_ = static_cast<RecvComm*>(connB_.get());
}

FifoPair::~FifoPair() {
  closeComms();
  for (auto& b : buffers_) {
    for (ibv_mr* mr : b->mrs) fake_.api()->deregMr(mr);
  }
  buffers_.clear();
  transportA_.reset();
  transportB_.reset();
  discA_.devices.clear();
  discB_.devices.clear();
}

void FifoPair::closeComms() {
  if (connA_ != nullptr) static_cast<Comm*>(connA_.get())->close();
  if (connB_ != nullptr) static_cast<Comm*>(connB_.get())->close();
  connA_.reset();
  connB_.reset();
  sender_ = nullptr;
  receiver_ = nullptr;
}

void mappedGid(uint32_t ip, uint8_t gid[16]) {
  memset(gid, 0, 16);
  gid[10] = gid[11] = 0xff;
  gid[12] = static_cast<uint8_t>(ip >> 24);
  gid[13] = static_cast<uint8_t>(ip >> 16);
  gid[14] = static_cast<uint8_t>(ip >> 8);
  gid[15] = static_cast<uint8_t>(ip);
}

Route fakeRoute(int nic, uint32_t local, uint32_t peer) {
  Route r;
  r.localNic = nic;
  r.gidIndex = 1;
  r.local = Ipv4Prefix{local, 24};
  r.peerAddr = peer;
  r.peerNic = static_cast<uint8_t>(nic);
  r.prefixLen = 24;
  return r;
}

void addFakePort(FakeRdma& fake, Discovery* disc, const std::string& device, uint32_t addr) {
  auto dev = std::make_unique<VerbsDevice>(fake.api(), device, fake.openDevice(device));
  ASSERT_EQ(dev->open(), ncclSuccess);
  MeshPort p;
  p.deviceIndex = static_cast<int>(disc->devices.size());
  p.device = device;
  p.port = 1;
  p.netdev = "p" + std::to_string(disc->ports.size());
  PortAddress a;
  a.ip = Ipv4Prefix{addr, 24};
  a.gidIndex = 1;
  mappedGid(a.ip.addr, a.gid);
  p.addrs.push_back(a);
  p.activeMtu = IBV_MTU_4096;
  p.mtuBytes = 4096;
  p.maxMsgSize = 1u << 31;
  disc->ports.push_back(p);
  disc->devices.push_back(std::move(dev));
}

std::unique_ptr<Buffer> makeBuffer(FakeRdma& fake, const Discovery& disc, size_t size, uint8_t fill) {
  auto b = std::make_unique<Buffer>();
  b->bytes.assign(size == 0 ? 1 : size, fill);
  b->mh.addr = reinterpret_cast<uintptr_t>(b->bytes.data());
  b->mh.size = size;
  b->mh.kind = MemKind::Host;
  b->mh.ndevs = static_cast<int>(disc.devices.size());
  for (size_t d = 0; d < disc.devices.size(); ++d) {
    ibv_mr* mr = registerMemory(fake, disc.devices[d]->pd(), b->bytes.data(), b->bytes.size());
    b->mrs.push_back(mr);
    b->mh.lkey[d] = mr->lkey;
    b->mh.rkey[d] = mr->rkey;
    b->regs[d] = Registration{mr, mr->lkey, mr->rkey};
    b->mh.regs[d] = &b->regs[d];
  }
  return b;
}

void FifoPair::buildSide(Discovery* disc, const char* prefix, bool senderSide) {
  for (int l = 0; l < options_.links; ++l) {
    addFakePort(fake_, disc, std::string(prefix) + std::to_string(l), linkAddr(l, senderSide));
  }
}

std::vector<Route> FifoPair::routes(bool senderSide) const {
  std::vector<Route> out;
  for (int l = 0; l < options_.links; ++l) {
    Route r;
    r.localNic = l;
    r.gidIndex = 1;
    r.local = Ipv4Prefix{linkAddr(l, senderSide), 24};
    r.peerAddr = linkAddr(l, !senderSide);
    r.peerNic = static_cast<uint8_t>(l);
    r.prefixLen = 24;
    out.push_back(r);
  }
  return out;
}

Buffer* FifoPair::buffer(bool senderSide, size_t size, uint8_t fill) {
  buffers_.push_back(makeBuffer(fake_, senderSide ? discA_ : discB_, size, fill));
  return buffers_.back().get();
}

bool FifoPair::waitDone(Request* req, size_t* sizes, ncclResult_t* rc) {
  Comm* owner = req->comm;
  for (;;) {
    int done = 0;
    size_t local[kGroupMax] = {};
    ncclResult_t r = owner->test(req, &done, sizes != nullptr ? sizes : local);
    if (rc != nullptr) *rc = r;
    if (r != ncclSuccess) return false;
    if (done) return true;
    if (fake_.run() == 0) {
      // Nothing moved: one more test() sees what the last steps completed.
      r = owner->test(req, &done, sizes != nullptr ? sizes : local);
      if (rc != nullptr) *rc = r;
      return r == ncclSuccess && done;
    }
  }
}

void fillPattern(uint8_t* data, size_t size, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < size; ++i) {
    x = x * 1103515245u + 12345u;
    data[i] = static_cast<uint8_t>(x >> 16);
  }
}

bool matchesPattern(const uint8_t* data, size_t size, uint32_t seed) {
  std::vector<uint8_t> expect(size);
  fillPattern(expect.data(), size, seed);
  return size == 0 || memcmp(expect.data(), data, size) == 0;
}

}  // namespace fake
}  // namespace mesh
