// SPDX-License-Identifier: Apache-2.0
// Receiver side of the FIFO protocol (see comm.h) and the GPUDirect flush.
#include <arpa/inet.h>

#include <cstring>

#include "mesh/datapath/comm.h"
#include "mesh/platform/check.h"
#include "mesh/platform/log.h"

namespace mesh {

RecvComm::RecvComm(const Discovery* disc, CommSettings settings) : Comm(false, disc, settings) {}

void RecvComm::describeCtrl(uint64_t* addr) const {
  *addr = reinterpret_cast<uintptr_t>(ctrl()->sizes);
}

// One flush QP per device of the comm, connected to itself through the port of the first
// link on that device: an RDMA READ through it reaches the NIC's PCIe path to GPU memory
// after every earlier write that NIC placed, which is what NCCL needs. Data striped over
// several links lands through several NICs, so the flush reads through each of them.
ncclResult_t RecvComm::createExtra() {
  if (!settings_.flushQps) return ncclSuccess;  // host memory only: nothing to flush
  QpCaps caps;
  caps.maxSendWr = kFlushQueueDepth;
  caps.maxRecvWr = 1;
  for (int s = 0; s < ndevs_; ++s) {
    DevSlot& d = devs_[s];
    MESH_CHECK(d.flushQp.create(d.dev, links_[d.firstLink].port->port, d.cq.get(), caps, this));
    MESH_CHECK(d.flushQp.toInit());
  }
  return ncclSuccess;
}

ncclResult_t RecvComm::activateExtra() {
  for (int s = 0; s < ndevs_ && settings_.flushQps; ++s) {
    DevSlot& d = devs_[s];
    const Link& l = links_[d.firstLink];
    QpRemote self;
    self.qpn = d.flushQp.qpn();
    self.psn = d.flushQp.psn();
    memcpy(self.gid, l.gid, 16);
    self.localGidIndex = l.route.gidIndex;
    self.mtu = l.port->activeMtu;
    MESH_CHECK(d.flushQp.toRtr(self, tuning_));
    MESH_CHECK(d.flushQp.toRts(tuning_));
  }
  return ncclSuccess;
}

ncclResult_t RecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags,
                             MrHandle* const* mh, Request** out) {
  *out = nullptr;
  MESH_CHECK(checkPeer("before irecv"));  // an earlier failure, or a peer gone since
  MESH_REQUIRE(n >= 1 && n <= kGroupMax, ncclInvalidArgument, "irecv: n=%d (must be 1..%d)", n, kGroupMax);
  for (int r = 0; r < n; ++r) {
    MESH_REQUIRE(mh[r] == nullptr || sizes[r] == 0 || covers(mh[r]), ncclInvalidUsage,
                 "irecv from %s: the memory handle of buffer %d was registered through another comm, on other "
                 "RDMA devices (register through the comm that receives into it, as NCCL does)",
                 peer.c_str(), r);
  }
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
  MESH_CHECK(postSlots(n, data, sizes, tags, mh, slot));
  slotOwner_[slot] = req;
  ++seq_;
  *out = req;
  return ncclSuccess;
}

// Fills the group's FIFO entries in the staging area and RDMA-writes them into the
// sender's FIFO[slot], seqHead first and seqTail last (see comm.h).
ncclResult_t RecvComm::postSlots(int n, void** data, const size_t* sizes, const int* tags, MrHandle* const* mh,
                                 int slot) {
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
    s.relayRing = 0;  // a direct receiver
    s.seqTail = seqMark;
  }
  // As NCCL 2.28.9 net_ib.cc ncclIbPostFifo: one FIFO write in kFifoSignalEvery is signaled,
  // enough to keep the send queue draining; the others cost the NIC no completion and the
  // proxy no poll.
  bool signal = qps_[0].unsignaled + 1 >= kFifoSignalEvery;
  return postCtrlWrite(stage, static_cast<uint32_t>(n * sizeof(FifoSlot)),
                       static_cast<uint64_t>(slot) * sizeof(SendCtrl::fifo[0]), static_cast<uint16_t>(slot), signal);
}

// As NCCL 2.28.9 net_ib.cc ncclIbIflush: one READ of the last non-empty buffer per device
// of the comm, since the data may have landed through any of them.
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
  MESH_REQUIRE(settings_.flushQps, ncclInternalError,
               "iflush of GPU memory on a node whose GPUs support no GPUDirect (host memory only)");
  // kFlushQueueDepth >= kRequestPool: a free request guarantees a free flush WR.
  Request* req = allocRequest(Request::Kind::Flush);
  MESH_REQUIRE(req != nullptr, ncclInternalError, "iflush: all %d requests of the comm are in flight", kRequestPool);
  req->pending = ndevs_;
  req->n = 0;
  for (int s = 0; s < ndevs_; ++s) {
    DevSlot& d = devs_[s];
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(&ctrl()->flushWord);
    sge.length = 1;
    sge.lkey = d.ctrlMr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = encodeWrId(WrId{WrKind::Flush, static_cast<uint8_t>(s), req->index, req->gen});
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(data[last]);
    wr.wr.rdma.rkey = mh[last]->rkey[d.deviceIndex];
    ibv_send_wr* bad = nullptr;
    int rc = settings_.ops->postSend(d.flushQp.get(), &wr, &bad);
    if (rc != 0) {
      // The READs already posted complete (or flush) with this request's generation;
      // the comm is failed, so nobody waits for them.
      fail(std::string("posting the flush READ on ") + d.dev->name() + " failed: " + strerror(rc), ncclSystemError);
      return failure_;
    }
  }
  *out = req;
  return ncclSuccess;
}

void RecvComm::onRecv(const WrId& id, const ibv_wc& wc) {
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
      // The sender's NIC wrote these before this completion; progress()'s acquire fence
      // after the poll orders these loads after the CQE (comm.h, RecvCtrl::sizes).
      const uint64_t* sz = ctrl()->sizes[r.slot];
      for (int i = 0; i < r.n; ++i) r.sizes[i] = __atomic_load_n(&sz[i], __ATOMIC_RELAXED);
    }
    slotOwner_[r.slot] = nullptr;
  }
}

void RecvComm::onCompletion(const ibv_wc& wc) {
  WrId id = decodeWrId(wc.wr_id);
  switch (id.kind) {
    case WrKind::Ctrl:
      returnCredits(0);
      return;
    case WrKind::Flush: {
      Request& r = reqs_[id.index % kRequestPool];
      if (r.gen == id.gen && r.kind == Request::Kind::Flush && r.pending > 0) --r.pending;
      return;
    }
    case WrKind::Recv:
      onRecv(id, wc);
      return;
    default:
      return;
  }
}

}  // namespace mesh
