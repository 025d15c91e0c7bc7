// Receiver side of the FIFO protocol (see comm.h) and the GPUDirect flush.
#include <arpa/inet.h>

#include <cstring>

#include "mesh/check.h"
#include "mesh/comm.h"
#include "mesh/log.h"

namespace mesh {

RecvComm::RecvComm(const Discovery* disc, CommSettings settings) : Comm(false, disc, settings) {}

void RecvComm::describeCtrl(uint64_t* addr) const {
  *addr = reinterpret_cast<uintptr_t>(ctrl()->sizes);
}

// The flush QP is connected to itself on link 0's port: an RDMA READ through it reaches
// the NIC's PCIe path to GPU memory after every earlier write, which is what NCCL needs.
ncclResult_t RecvComm::createExtra() {
  const DevSlot& d = devs_[links_[0].devSlot];
  QpCaps caps;
  caps.maxSendWr = 2 * kFifoDepth;
  caps.maxRecvWr = 1;
  flushCredits_ = caps.maxSendWr;
  MESH_CHECK(flushQp_.create(d.dev, links_[0].port->port, d.cq.get(), caps, this));
  return flushQp_.toInit();
}

ncclResult_t RecvComm::activateExtra() {
  QpRemote self;
  self.qpn = flushQp_.qpn();
  self.psn = flushQp_.psn();
  memcpy(self.gid, links_[0].gid, 16);
  self.localGidIndex = links_[0].route.gidIndex;
  self.mtu = links_[0].port->activeMtu;
  MESH_CHECK(flushQp_.toRtr(self, settings_.tuning));
  return flushQp_.toRts(settings_.tuning);
}

ncclResult_t RecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags,
                             MrHandle* const* mh, Request** out) {
  *out = nullptr;
  MESH_CHECK(checkPeer("before irecv"));  // an earlier failure, or a peer gone since
  MESH_REQUIRE(n >= 1 && n <= kGroupMax, ncclInvalidArgument, "irecv: n=%d (must be 1..%d)", n, kGroupMax);
  int slot = static_cast<int>(seq_ % kFifoDepth);
  Qp& ctrlQp = qps_[0];
  if (slotOwner_[slot] != nullptr || ctrlQp.credits == 0) {
    MESH_CHECK(progress());
    if (slotOwner_[slot] != nullptr || ctrlQp.credits == 0) return ncclSuccess;  // not yet
  }
  Request* req = allocRequest(Request::Kind::Recv);
  if (req == nullptr) return ncclSuccess;  // every request in flight: NCCL retries
  req->n = n;
  req->slot = slot;
  req->pending = nqps_;
  // One RECV per QP consumes that QP's immediate for this message.
  for (int q = 0; q < nqps_; ++q) {
    ibv_recv_wr wr{};
    wr.wr_id = encodeWrId(WrId{WrKind::Recv, static_cast<uint8_t>(q), req->index, req->gen});
    ibv_recv_wr* bad = nullptr;
    int rc = settings_.ops->postRecv(qps_[q].qp.get(), &wr, &bad);
    if (rc != 0) {
      fail(std::string("ibv_post_recv failed: ") + strerror(rc), ncclSystemError);
      return failure_;
    }
  }
  uint64_t seqMark = seq_ + 1;
  FifoSlot* stage = ctrl()->stage[slot];
  for (int r = 0; r < n; ++r) {
    FifoSlot& s = stage[r];
    s.seqHead = seqMark;
    s.addr = reinterpret_cast<uintptr_t>(data[r]);
    for (size_t l = 0; l < links_.size(); ++l) {
      s.rkeys[l] = mh[r] != nullptr ? mh[r]->rkey[devs_[links_[l].devSlot].deviceIndex] : 0;
    }
    s.size = sizes[r];
    s.tag = tags[r];
    s.nreqs = n;
    s.seqTail = seqMark;
  }
  ibv_send_wr& wr = wrs_[0];
  ibv_sge& sge = sges_[0];
  sge.addr = reinterpret_cast<uintptr_t>(stage);
  sge.length = static_cast<uint32_t>(n * sizeof(FifoSlot));
  sge.lkey = devs_[ctrlQp.devSlot].ctrlMr->lkey;
  wr = ibv_send_wr();
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = links_[0].remoteCtrl + static_cast<uint64_t>(slot) * sizeof(SendCtrl::fifo[0]);
  wr.wr.rdma.rkey = links_[0].remoteRkey;
  wr.wr_id = encodeWrId(WrId{WrKind::Ctrl, 0, static_cast<uint16_t>(slot), 0});
  MESH_CHECK(postBatch(0, 1));
  slotOwner_[slot] = req;
  ++seq_;
  *out = req;
  return ncclSuccess;
}

ncclResult_t RecvComm::iflush(int n, void** data, const int* sizes, MrHandle* const* mh, Request** out) {
  *out = nullptr;
  MESH_CHECK(failure_);
  int last = -1;
  bool gpu = false;
  for (int r = 0; r < n; ++r) {
    if (sizes[r] > 0 && mh[r] != nullptr) {
      last = r;
      gpu = gpu || mh[r]->kind != MemKind::Host;
    }
  }
  // Host memory needs no flush; neither does GPU memory when NCCL says so.
  if (last < 0 || settings_.gdrFlushDisable || !(gpu || settings_.forceFlush)) return ncclSuccess;
  MESH_REQUIRE(flushCredits_ > 0, ncclInternalError, "iflush: too many flushes in flight");
  Request* req = allocRequest(Request::Kind::Flush);
  MESH_REQUIRE(req != nullptr, ncclInternalError, "iflush: no free request");
  req->pending = 1;
  req->n = 0;
  const DevSlot& d = devs_[links_[0].devSlot];
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(&ctrl()->flushWord);
  sge.length = 1;
  sge.lkey = d.ctrlMr->lkey;
  ibv_send_wr wr{};
  wr.wr_id = encodeWrId(WrId{WrKind::Flush, 0, req->index, req->gen});
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(data[last]);
  wr.wr.rdma.rkey = mh[last]->rkey[d.deviceIndex];
  ibv_send_wr* bad = nullptr;
  int rc = settings_.ops->postSend(flushQp_.get(), &wr, &bad);
  if (rc != 0) {
    freeRequest(req);
    fail(std::string("posting the flush READ failed: ") + strerror(rc), ncclSystemError);
    return failure_;
  }
  --flushCredits_;
  *out = req;
  return ncclSuccess;
}

void RecvComm::onCompletion(const ibv_wc& wc) {
  WrId id = decodeWrId(wc.wr_id);
  switch (id.kind) {
    case WrKind::Ctrl:
      returnCredits(0);
      return;
    case WrKind::Flush: {
      ++flushCredits_;
      Request& r = reqs_[id.index % kRequestPool];
      if (r.gen == id.gen && r.kind == Request::Kind::Flush) r.pending = 0;
      return;
    }
    case WrKind::Recv: {
      Request& r = reqs_[id.index % kRequestPool];
      if (r.gen != id.gen || r.kind != Request::Kind::Recv || r.pending == 0) return;
      uint32_t imm = ntohl(wc.imm_data);
      if (r.n > 1 || imm == kImmViaSizes) {
        r.viaSizes = true;
      } else {
        r.sizes[0] = imm;
      }
      if (--r.pending == 0) {
        if (r.viaSizes) {
          const volatile uint64_t* sz = ctrl()->sizes[r.slot];
          for (int i = 0; i < r.n; ++i) r.sizes[i] = sz[i];
        }
        slotOwner_[r.slot] = nullptr;
      }
      return;
    }
    default:
      return;
  }
}

}  // namespace mesh
