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
// not, or while the slot's previous group (seq - kFifoDepth) is still on the wire. Only the
// latter polls (its completions free the slot): a slot the receiver has not posted yet is a
// load, as in ncclIbIsend (NCCL's proxy calls isend many times per message while it
// waits; its test() calls poll for everything in flight), plus the fatal events.
ncclResult_t SendComm::nextGroup(Group** out) {
  *out = nullptr;
  int slot = static_cast<int>(seq_ % kFifoDepth);
  uint64_t expect = seq_ + 1;
  Group& g = groups_[slot];
  if (g.nreqs != 0 && g.assigned == g.nreqs) return progress();
  if (!slotArrived(slot, 0, expect)) return checkEvents();
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
    stats::Publisher::event(stats::kTruncations);
    warnTruncation(size, slots[pos].size, tag);
    size = slots[pos].size;
  }
  MESH_REQUIRE(size == 0 || mh != nullptr, ncclInvalidArgument, "isend of %zu bytes without a memory handle", size);
  MESH_REQUIRE(size == 0 || covers(mh), ncclInvalidUsage,
               "isend to %s: the memory handle was registered through another comm, on other RDMA devices "
               "(register through the comm that sends it, as NCCL does)", peer.c_str());
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
  g.pendingQps = nqps_;  // every QP ends the group with one SendFinal (relayed ones too)
  if (relayedSlot(slot)) {
    for (int r = 0; r < g.nreqs; ++r) {
      if (g.reqs[r]->size > 0) g.relayLastData = r;
    }
    g.relayFinalsLeft = nqps_ > 1 ? (1u << nqps_) - 1 : 0;
  }
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

// A relayed group (the receiver is a relay node's staging ring; docs/DESIGN-notes.md,
// "Relay"): its bytes as tickets (comm.h), each entry cut into ring-chunk pieces in order,
// each piece one WRITE_WITH_IMM into the next ring slot once the relay has freed it
// (SendCtrl::relayReleased), on the QPs in turn unless one is busier (pickRelayQp), so that
// every link of the leg (both functions of a Spark cable) carries its share. The group's
// sizes go first, a plain WRITE on the QP of its first ticket (RC keeps one QP's WRs in
// order, so they are in place when the relay takes that ticket). The last data ticket
// carries kRelayLast; a group without bytes is one no-data ticket. Then every other QP gets
// a 0-byte WRITE as its SendFinal, so the send completes only when every QP's share was
// acknowledged. Each ticket is its own signaled batch: chunks are large, and the relay frees
// slots one ticket at a time anyway.
ncclResult_t SendComm::postRelayed(int slot, bool* finished) {
  *finished = false;
  Group& g = groups_[slot];
  Cursor& c = g.cursor[0];
  const FifoSlot& ring = ctrl()->fifo[slot][0];
  uint32_t chunk = relayRingChunk(ring.relayRing);
  uint64_t depth = relayRingDepth(ring.relayRing);
  if (chunk == 0 || depth == 0 || depth > static_cast<uint64_t>(kRelayMaxDepth)) {
    fail("corrupt relay ring geometry in a FIFO slot from the relay", ncclRemoteError);
    return failure_;
  }
  uint64_t released = __atomic_load_n(&ctrl()->relayReleased, __ATOMIC_ACQUIRE);
  auto wr = [&](int i, uint64_t local, uint32_t lkey, uint32_t len, uint64_t remote, uint32_t rkey) {
    ibv_send_wr& w = wrs_[i];
    ibv_sge& sge = sges_[i];
    w = ibv_send_wr();
    sge.addr = local;
    sge.length = len;
    sge.lkey = lkey;
    w.sg_list = len > 0 ? &sge : nullptr;
    w.num_sge = len > 0 ? 1 : 0;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.wr.rdma.remote_addr = remote;
    w.wr.rdma.rkey = rkey;
    return &w;
  };
  bool ticketsDone = c.done;
  while (!ticketsDone) {
    // The next piece: skip entries (and ends of entries) with nothing left.
    while (c.r < g.nreqs && c.off >= g.reqs[c.r]->size) {
      ++c.r;
      c.off = 0;
    }
    bool noData = g.relayLastData < 0;
    if (!noData && c.r >= g.nreqs) {  // the last piece ends the loop before this
      fail("relayed group ran out of pieces before its last one", ncclInternalError);
      return failure_;
    }
    if (ringPosted_ - released >= depth) return ncclSuccess;  // no free ring slot: afterPoll() resumes
    int need = g.relaySizesPosted ? 1 : 2;
    int q = pickRelayQp(ringPosted_, need);
    if (q < 0) return ncclSuccess;  // no QP has the credits: a completion resumes
    Qp& qp = qps_[q];
    int count = 0;
    if (!g.relaySizesPosted) {
      wr(count++, reinterpret_cast<uintptr_t>(ctrl()->sizesStage[slot]), devs_[qp.devSlot].ctrlMr->lkey,
         static_cast<uint32_t>(g.nreqs * sizeof(uint64_t)), remoteSizes(qp.link, slot), links_[qp.link].remoteRkey);
      g.relaySizesPosted = true;
    }
    uint64_t remote = ring.addr + (ringPosted_ % depth) * chunk;
    bool last = true;
    ibv_send_wr* t;
    if (noData) {
      t = wr(count++, 0, 0, 0, remote, ring.rkeys[qp.link]);
    } else {
      const Request* r = g.reqs[c.r];
      uint32_t len = static_cast<uint32_t>(relayPieceBytes(r->size, c.off, chunk));
      t = wr(count++, reinterpret_cast<uintptr_t>(r->data) + c.off, r->mh->lkey[devs_[qp.devSlot].deviceIndex], len,
             remote, ring.rkeys[qp.link]);
      c.off += len;
      last = c.r == g.relayLastData && c.off >= r->size;
    }
    t->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    t->imm_data = htonl(relayImm(ringPosted_, last, noData));
    WrKind kind = last ? WrKind::SendFinal : WrKind::SendBatch;
    t->wr_id = encodeWrId(WrId{kind, static_cast<uint8_t>(q), static_cast<uint16_t>(slot), 0});
    ++ringPosted_;
    MESH_CHECK(postBatch(q, count));
    if (last) {
      c.done = ticketsDone = true;
      g.relayFinalsLeft &= ~(1u << q);
    }
  }
  // Every other QP's SendFinal: a 0-byte WRITE after its share of the group.
  for (int q = 0; q < nqps_ && g.relayFinalsLeft != 0; ++q) {
    if ((g.relayFinalsLeft & (1u << q)) == 0 || qps_[q].credits < 1) continue;
    ibv_send_wr* t = wr(0, 0, 0, 0, ring.addr, ring.rkeys[qps_[q].link]);
    t->wr_id = encodeWrId(WrId{WrKind::SendFinal, static_cast<uint8_t>(q), static_cast<uint16_t>(slot), 0});
    MESH_CHECK(postBatch(q, 1));
    g.relayFinalsLeft &= ~(1u << q);
  }
  *finished = c.done && g.relayFinalsLeft == 0;
  return ncclSuccess;
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
