// SPDX-License-Identifier: Apache-2.0
// Sender side of the FIFO protocol (see comm.h). Hot path: no allocation, no locks, no
// syscalls beyond the provider's doorbell in post_send.
#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "mesh/datapath/chunk_plan.h"
#include "mesh/datapath/comm.h"
#include "mesh/platform/check.h"
#include "mesh/platform/log.h"

namespace mesh {

SendComm::SendComm(const Discovery* disc, CommSettings settings) : Comm(true, disc, settings) {}

void SendComm::describeCtrl(uint64_t* addr) const {
  *addr = reinterpret_cast<uintptr_t>(ctrl()->fifo);
}

// The NIC writes the slot; fifoSlotArrived's acquire loads keep the CPU (and compiler) from
// reading the slot's other fields before both sequence words were seen complete.
bool SendComm::slotArrived(int slot, int pos, uint64_t expect) const {
  return fifoSlotArrived(ctrl()->fifo[slot][pos], expect);
}

// The group of the next slot (seq), once every entry of it has landed: NULL while it has
// not, or while the slot's previous group (seq - kFifoDepth) is still on the wire.
ncclResult_t SendComm::nextGroup(Group** out) {
  *out = nullptr;
  int slot = static_cast<int>(seq_ % kFifoDepth);
  uint64_t expect = seq_ + 1;
  Group& g = groups_[slot];
  if ((g.nreqs != 0 && g.assigned == g.nreqs) || !slotArrived(slot, 0, expect)) return progress();
  const FifoSlot* slots = ctrl()->fifo[slot];
  int nreqs = slots[0].nreqs;
  if (nreqs < 1 || nreqs > kGroupMax) {
    fail("corrupt FIFO slot from the receiver (nreqs " + std::to_string(nreqs) + ")", ncclRemoteError);
    return failure_;
  }
  for (int r = 1; r < nreqs; ++r) {
    if (!slotArrived(slot, r, expect)) return ncclSuccess;
  }
  if (g.nreqs == 0) {
    g = Group();
    g.nreqs = nreqs;
  }
  *out = &g;
  return ncclSuccess;
}

// NCCL's IB transport truncates silently (ncclIbIsend: size = min(size, slot size)); one
// WARN per comm says it happened, since NCCL never sends more than it posted itself.
void SendComm::warnTruncation(size_t size, uint64_t posted, int tag) {
  if (warnedTruncation_) return;
  warnedTruncation_ = true;
  MESH_WARN("isend to %s: %zu bytes truncated to the %llu bytes the peer posted (tag %d), as NCCL's IB "
            "transport does; further truncations on this comm are not logged",
            peer.c_str(), size, static_cast<unsigned long long>(posted), tag);
}

ncclResult_t SendComm::isend(void* data, size_t size, int tag, const MrHandle* mh, Request** out) {
  *out = nullptr;
  MESH_CHECK(checkPeer("before isend"));  // an earlier failure, or a peer gone since
  Group* g = nullptr;
  MESH_CHECK(nextGroup(&g));
  if (g == nullptr) return ncclSuccess;  // no slot yet: NCCL retries
  int slot = static_cast<int>(seq_ % kFifoDepth);
  const FifoSlot* slots = ctrl()->fifo[slot];
  int pos = -1;
  for (int r = 0; r < g->nreqs && pos < 0; ++r) {
    if (slots[r].tag == tag && g->reqs[r] == nullptr) pos = r;
  }
  if (pos < 0) return ncclSuccess;  // the tag is for a later slot (or none): NCCL retries
  if (size > slots[pos].size) {
    warnTruncation(size, slots[pos].size, tag);
    size = slots[pos].size;
  }
  MESH_REQUIRE(size == 0 || mh != nullptr, ncclInvalidArgument, "isend of %zu bytes without a memory handle", size);
  Request* req = allocRequest(Request::Kind::Send);
  if (req == nullptr) return ncclSuccess;  // every request in flight: NCCL retries
  req->data = static_cast<const char*>(data);
  req->size = size;
  req->mh = mh;
  req->slot = slot;
  req->sizes[0] = size;
  req->pending = 1;  // cleared when the group's final WRs complete
  g->reqs[pos] = req;
  *out = req;
  if (++g->assigned < g->nreqs) return ncclSuccess;
  return queueGroup(slot);
}

// Every entry of the group has its send: queue its writes (posted in slot order) and move
// on to the next slot. Writing each buffer as its send arrives would need a completion per
// buffer on the receiver; the group's immediate and sizes write cover all of them at once.
ncclResult_t SendComm::queueGroup(int slot) {
  Group& g = groups_[slot];
  for (int r = 0; r < g.nreqs; ++r) ctrl()->sizesStage[slot][r] = g.reqs[r]->size;
  // A relayed group travels on QP 0 alone (its chunks must reach the relay in ring order).
  g.pendingQps = relayedSlot(slot) ? 1 : nqps_;
  postQueue_[(postHead_ + postCount_) % kFifoDepth] = slot;
  ++postCount_;
  ++seq_;
  return pump();
}

void SendComm::shareOf(const Request* r, int q, size_t* lo, size_t* hi) const {
  // Unsplit messages rotate over the QPs with the FIFO slot (kFifoDepth is a multiple of every
  // QP count that divides it; the others still spread, less evenly).
  Span span = qpShare(r->size, q, nqps_, settings_.splitMin, r->slot);
  *lo = span.lo;
  *hi = span.hi;
}

// Posts as much of group `slot`'s share on QP q as credits allow.
ncclResult_t SendComm::postShare(int slot, int q, bool* finished) {
  Group& g = groups_[slot];
  Cursor& c = g.cursor[q];
  Qp& qp = qps_[q];
  const Link& link = links_[qp.link];
  const FifoSlot* slots = ctrl()->fifo[slot];
  int count = 0;
  int budget = std::min(qp.credits, kMaxBatch);
  while (c.r < g.nreqs && count < budget) {
    const Request* r = g.reqs[c.r];
    size_t lo, hi;
    shareOf(r, q, &lo, &hi);
    if (lo + c.off >= hi) {
      ++c.r;
      c.off = 0;
      continue;
    }
    size_t len = std::min(hi - lo - c.off, settings_.maxWrBytes);
    ibv_send_wr& wr = wrs_[count];
    ibv_sge& sge = sges_[count];
    sge.addr = reinterpret_cast<uintptr_t>(r->data) + lo + c.off;
    sge.length = static_cast<uint32_t>(len);
    sge.lkey = r->mh->lkey[devs_[qp.devSlot].deviceIndex];
    wr = ibv_send_wr();
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = slots[c.r].addr + lo + c.off;
    wr.wr.rdma.rkey = slots[c.r].rkeys[qp.link];
    wr.wr_id = encodeWrId(WrId{WrKind::SendBatch, static_cast<uint8_t>(q), static_cast<uint16_t>(slot), 0});
    c.off += len;
    ++count;
  }
  *finished = false;
  if (c.r == g.nreqs && count < budget) {
    // The final WR: an immediate telling the receiver this QP's share is complete.
    bool viaSizes = sizesViaArray(g.nreqs, g.reqs[0]->size);
    bool attach = count > 0 && !(viaSizes && q == 0);
    if (!attach) {
      ibv_send_wr& wr = wrs_[count];
      ibv_sge& sge = sges_[count];
      wr = ibv_send_wr();
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.wr.rdma.remote_addr = slots[0].addr;
      wr.wr.rdma.rkey = slots[0].rkeys[qp.link];
      if (viaSizes && q == 0) {
        // Sizes of a grouped receive land in the receiver's sizes[slot] with this immediate.
        sge.addr = reinterpret_cast<uintptr_t>(ctrl()->sizesStage[slot]);
        sge.length = static_cast<uint32_t>(g.nreqs * sizeof(uint64_t));
        sge.lkey = devs_[qp.devSlot].ctrlMr->lkey;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.wr.rdma.remote_addr = remoteSizes(qp.link, slot);
        wr.wr.rdma.rkey = link.remoteRkey;
      }
      ++count;
    }
    ibv_send_wr& last = wrs_[count - 1];
    last.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    last.imm_data = htonl(viaSizes ? kImmViaSizes : static_cast<uint32_t>(g.reqs[0]->size));
    last.wr_id = encodeWrId(WrId{WrKind::SendFinal, static_cast<uint8_t>(q), static_cast<uint16_t>(slot), 0});
    c.done = true;
    *finished = true;
  }
  return postBatch(q, count);
}

// Posts queued groups in order; a group that runs out of send-queue credits resumes from
// its cursors when completions return them.
ncclResult_t SendComm::pump() {
  while (postCount_ > 0) {
    int slot = postQueue_[postHead_];
    bool all = true;
    if (relayedSlot(slot)) {
      MESH_CHECK(postRelayed(slot, &all));
    } else {
      for (int q = 0; q < nqps_; ++q) {
        if (groups_[slot].cursor[q].done) continue;
        bool finished = false;
        MESH_CHECK(postShare(slot, q, &finished));
        all = all && finished;
      }
    }
    if (!all) return ncclSuccess;
    postHead_ = (postHead_ + 1) % kFifoDepth;
    --postCount_;
  }
  return ncclSuccess;
}

// A relayed group (the receiver is a relay node's staging ring; docs/relay.md): on QP 0,
// first the group's sizes into the relay's sizes[slot] (a plain WRITE), then every
// entry's bytes in order, cut into chunks of the ring's slot size, each a WRITE_WITH_IMM
// into the next ring slot once the relay has freed it (SendCtrl::relayReleased), its
// immediate the chunk's byte count; the group's last WR carries kRelayLastChunk (a 0-byte
// WRITE_WITH_IMM when the group has no bytes left to carry it). RC executes one QP's WRs
// in order, so the relay sees the sizes before the first chunk and chunks in ring order.
ncclResult_t SendComm::postRelayed(int slot, bool* finished) {
  *finished = false;
  Group& g = groups_[slot];
  Cursor& c = g.cursor[0];
  Qp& qp = qps_[0];
  const FifoSlot& ring = ctrl()->fifo[slot][0];
  uint32_t chunk = relayRingChunk(ring.relayRing);
  uint64_t depth = relayRingDepth(ring.relayRing);
  if (chunk == 0 || depth == 0 || chunk > kRelayLastChunk - 1) {
    fail("corrupt relay ring geometry in a FIFO slot from the relay", ncclRemoteError);
    return failure_;
  }
  uint64_t released = __atomic_load_n(&ctrl()->relayReleased, __ATOMIC_ACQUIRE);
  int budget = std::min(qp.credits, kMaxBatch);
  int count = 0;
  auto add = [&](uint64_t local, uint32_t lkey, uint32_t len, uint64_t remote, ibv_wr_opcode op) {
    ibv_send_wr& wr = wrs_[count];
    ibv_sge& sge = sges_[count];
    wr = ibv_send_wr();
    sge.addr = local;
    sge.length = len;
    sge.lkey = lkey;
    wr.sg_list = len > 0 ? &sge : nullptr;
    wr.num_sge = len > 0 ? 1 : 0;
    wr.opcode = op;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = ring.rkeys[qp.link];
    wr.wr_id = encodeWrId(WrId{WrKind::SendBatch, 0, static_cast<uint16_t>(slot), 0});
    ++count;
  };
  if (!g.relaySizesPosted && count < budget) {
    add(reinterpret_cast<uintptr_t>(ctrl()->sizesStage[slot]), devs_[qp.devSlot].ctrlMr->lkey,
        static_cast<uint32_t>(g.nreqs * sizeof(uint64_t)),
        remoteSizes(qp.link, slot), IBV_WR_RDMA_WRITE);
    wrs_[count - 1].wr.rdma.rkey = links_[qp.link].remoteRkey;
    g.relaySizesPosted = true;
  }
  bool lastIsChunk = false;
  while (c.r < g.nreqs && count < budget) {
    const Request* r = g.reqs[c.r];
    if (c.off >= r->size) {
      ++c.r;
      c.off = 0;
      continue;
    }
    if (ringPosted_ - released >= depth) break;  // no free ring slot: afterPoll() resumes
    uint32_t len = static_cast<uint32_t>(std::min<size_t>(chunk, r->size - c.off));
    uint64_t remote = ring.addr + (ringPosted_ % depth) * chunk;
    add(reinterpret_cast<uintptr_t>(r->data) + c.off, r->mh->lkey[devs_[qp.devSlot].deviceIndex], len, remote,
        IBV_WR_RDMA_WRITE_WITH_IMM);
    wrs_[count - 1].imm_data = htonl(len);
    ++ringPosted_;
    c.off += len;
    lastIsChunk = true;
  }
  if (c.r == g.nreqs && (lastIsChunk || count < budget)) {
    if (!lastIsChunk) {
      add(ring.addr, 0, 0, ring.addr, IBV_WR_RDMA_WRITE_WITH_IMM);
      wrs_[count - 1].imm_data = 0;
    }
    ibv_send_wr& last = wrs_[count - 1];
    last.imm_data = htonl(ntohl(last.imm_data) | kRelayLastChunk);
    last.wr_id = encodeWrId(WrId{WrKind::SendFinal, 0, static_cast<uint16_t>(slot), 0});
    c.done = true;
    *finished = true;
  }
  return postBatch(0, count);
}

// Ring credits arrive as a remote write, not as a completion: a relayed group waiting for
// them is resumed from every progress().
void SendComm::afterPoll() {
  if (postCount_ > 0 && relayedSlot(postQueue_[postHead_])) pump();
}

void SendComm::onCompletion(const ibv_wc& wc) {
  WrId id = decodeWrId(wc.wr_id);
  if (id.qp >= nqps_) return;
  returnCredits(id.qp);
  if (id.kind == WrKind::SendFinal) {
    Group& g = groups_[id.index % kFifoDepth];
    if (--g.pendingQps == 0) {
      for (int r = 0; r < g.nreqs; ++r) g.reqs[r]->pending = 0;
      g = Group();
    }
  }
  if (postCount_ > 0) pump();
}

}  // namespace mesh
