// SPDX-License-Identifier: Apache-2.0
// Two ends of one connection in one process, over the fake RDMA of fake_rdma.h: node A
// (devices a0, a1, ...) holds the SendComm, node B (b0, b1, ...) the RecvComm, one device
// and port per link. Both comms are built and connected exactly as the handshake does it
// (RdmaTransport::prepare on each side, the receiver activated with the sender's HELLO,
// the sender with the receiver's ACCEPT), so everything but the TCP exchange is the
// production code. Buffers are registered on every device of their side, as regMr does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fake_rdma.h"
#include "mesh/datapath/comm.h"
#include "mesh/discovery/nic_discovery.h"
#include "mesh/rdma/mr_cache.h"

namespace mesh {
namespace fake {

struct PairOptions {
  int links = 1;            // parallel links, each on its own device
  int qpsPerLink = 1;
  size_t splitMin = 65536;
  size_t maxWrBytes = size_t{1} << 30;
  bool forceFlush = false;  // flush host memory too
  int senderEnvTc = -1;     // NCCL_MESH_IB_TC on the sender's node (-1: unset)
  int receiverEnvTc = -1;   // ... on the receiver's node
  int connTc = -1;          // the communicator's trafficClass (v10/v11), -1: unset
  int senderFifoTc = -1;    // NCCL_MESH_IB_FIFO_TC on the sender's node (-1: unset)
  int receiverFifoTc = -1;  // ... on the receiver's node
  bool senderEce = true;    // NCCL_MESH_IB_ECE_ENABLE on the sender's node
  bool receiverEce = true;  // ... on the receiver's node
  bool mayFail = false;     // activate() may fail: see activated() instead of expecting success
  std::function<void(HsMessage*)> editAccept;  // changes the ACCEPT before the sender reads it
};

struct Buffer {
  std::vector<uint8_t> bytes;
  MrHandle mh;
  std::vector<ibv_mr*> mrs;
  Registration regs[kMaxDevices];  // what mh.regs point at (the fake's keys)
  uint8_t* data() { return bytes.data(); }
};

class FifoPair {
 public:
  FifoPair(FakeRdma& fake, PairOptions options = {});
  ~FifoPair();
  FifoPair(const FifoPair&) = delete;
  FifoPair& operator=(const FifoPair&) = delete;

  // What the receiver's and the sender's activate() returned (mayFail).
  ncclResult_t receiverActivated() const { return activatedB_; }
  ncclResult_t senderActivated() const { return activatedA_; }
  SendComm* sender() const { return sender_; }
  RecvComm* receiver() const { return receiver_; }
  // A registered buffer of `size` bytes on the sender's (A) or receiver's (B) node,
  // filled with `fill`. Stays registered until the pair is destroyed.
  Buffer* buffer(bool senderSide, size_t size, uint8_t fill = 0);
  // Closes both comms (as closeSend/closeRecv do) before the buffers and devices go.
  void closeComms();
  const Discovery& discovery(bool senderSide) const { return senderSide ? discA_ : discB_; }

  // test() until done or until the wire has nothing left to run; true when done.
  bool waitDone(Request* req, size_t* sizes = nullptr, ncclResult_t* rc = nullptr);

 private:
  void buildSide(Discovery* disc, const char* prefix, bool senderSide);
  std::vector<Route> routes(bool senderSide) const;

  FakeRdma& fake_;
  PairOptions options_;
  Discovery discA_, discB_;
  std::unique_ptr<RdmaTransport> transportA_, transportB_;
  std::unique_ptr<PreparedConn> connA_, connB_;
  ncclResult_t activatedA_ = ncclSuccess, activatedB_ = ncclSuccess;
  SendComm* sender_ = nullptr;
  RecvComm* receiver_ = nullptr;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

// A port on the fake node `disc`: device `device` (opened on `fake`), port 1, one IPv4
// address /24 with its RoCEv2 GID at index 1, MTU 4096.
void addFakePort(FakeRdma& fake, Discovery* disc, const std::string& device, uint32_t addr);
// A buffer of `size` bytes filled with `fill`, registered on every device of `disc`, as regMr
// does. The caller deregisters b->mrs before the devices close.
std::unique_ptr<Buffer> makeBuffer(FakeRdma& fake, const Discovery& disc, size_t size, uint8_t fill);

// The IPv4-mapped GID of `ip` (::ffff:a.b.c.d).
void mappedGid(uint32_t ip, uint8_t gid[16]);
// A /24 route from local NIC `nic` at `local` to `peer` (on the peer's NIC of the same
// number), GID index 1, as addFakePort's ports have.
Route fakeRoute(int nic, uint32_t local, uint32_t peer);

// A byte pattern that differs per (seed, offset).
void fillPattern(uint8_t* data, size_t size, uint32_t seed);
bool matchesPattern(const uint8_t* data, size_t size, uint32_t seed);

}  // namespace fake
}  // namespace mesh
