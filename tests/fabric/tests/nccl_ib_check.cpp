// SPDX-License-Identifier: Apache-2.0
// nccl_ib_check: loads libibverbs exactly as NCCL's IB transport does (NCCL 2.28
// src/misc/ibvsymbols.cc: dlopen("libibverbs.so"), then "libibverbs.so.1"; every symbol
// by dlvsym at "IBVERBS_1.1", ibv_reg_mr_iova2 at 1.8, ibv_reg_dmabuf_mr at 1.12,
// ibv_query_ece/ibv_set_ece at 1.10) and drives a connection the way net_ib.cc does:
// ibv_fork_init, GID selection over the whole table (the IPv4 RoCE v2 GID must win without
// sysfs), an async-event thread blocked in ibv_get_async_event, QPs with NCCL's init, RTR
// and RTS attributes, memory registered through ibv_reg_mr_iova2 with RELAXED_ORDERING,
// then NCCL's data pattern: the receiver RDMA-writes a FIFO slot (inline, selectively
// signaled) to the sender; the sender posts RDMA_WRITE (unsignaled) + 0-byte
// RDMA_WRITE_WITH_IMM (signaled) in one list; the receiver, which posted empty receives,
// gets RECV_RDMA_WITH_IMM with the size and checks the data; then NCCL's GPU flush: a
// 1-byte RDMA READ on a QP connected to itself.
//
// Two ranks (scripts/fabric-net run --nodes 2 --dropin -- nccl_ib_check), rendezvous
// through files in $VMESH_SHARED. Prints "PASS nccl-ib rank=R ..." or "FAIL ...".
#include <arpa/inet.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <link.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "check_util.h"

namespace {

using check::fail;

// NCCL's symbol table (ibvsymbols.h), bound the same way.
struct IbvSymbols {
  ibv_device** (*get_device_list)(int*);
  int (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
  int (*get_async_event)(ibv_context*, ibv_async_event*);
  void (*ack_async_event)(ibv_async_event*);
  int (*query_device)(ibv_context*, ibv_device_attr*);
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*);
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*);
  int (*query_qp)(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  ibv_mr* (*reg_mr_iova2)(ibv_pd*, void*, size_t, uint64_t, unsigned);
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);
  int (*dereg_mr)(ibv_mr*);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  int (*destroy_qp)(ibv_qp*);
  int (*fork_init)(void);
  const char* (*event_type_str)(ibv_event_type);
  int (*query_ece)(ibv_qp*, ibv_ece*);
  int (*set_ece)(ibv_qp*, ibv_ece*);
};

IbvSymbols g;
std::string gLoadedFrom;

// NCCL prints completion errors with its own table; a number is enough here.
std::string statusName(ibv_wc_status s) { return "status " + std::to_string(static_cast<int>(s)); }

void loadLikeNccl() {
  void* h = dlopen("libibverbs.so", RTLD_NOW);
  if (h == nullptr) h = dlopen("libibverbs.so.1", RTLD_NOW);
  if (h == nullptr) fail("dlopen libibverbs.so[.1]: %s", dlerror());
  link_map* lm = nullptr;
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr) gLoadedFrom = lm->l_name;
  auto sym = [h](void* out, const char* name, const char* version, bool required) {
    void* p = dlvsym(h, name, version);
    if (p == nullptr && required) fail("dlvsym(%s, %s): %s", name, version, dlerror());
    memcpy(out, &p, sizeof(p));
  };
#define LOAD(member, name) sym(&g.member, name, "IBVERBS_1.1", true)
  LOAD(get_device_list, "ibv_get_device_list");
  LOAD(free_device_list, "ibv_free_device_list");
  LOAD(get_device_name, "ibv_get_device_name");
  LOAD(open_device, "ibv_open_device");
  LOAD(close_device, "ibv_close_device");
  LOAD(get_async_event, "ibv_get_async_event");
  LOAD(ack_async_event, "ibv_ack_async_event");
  LOAD(query_device, "ibv_query_device");
  LOAD(query_port, "ibv_query_port");
  LOAD(query_gid, "ibv_query_gid");
  LOAD(query_qp, "ibv_query_qp");
  LOAD(alloc_pd, "ibv_alloc_pd");
  LOAD(dealloc_pd, "ibv_dealloc_pd");
  LOAD(reg_mr, "ibv_reg_mr");
  LOAD(dereg_mr, "ibv_dereg_mr");
  LOAD(create_cq, "ibv_create_cq");
  LOAD(destroy_cq, "ibv_destroy_cq");
  LOAD(create_qp, "ibv_create_qp");
  LOAD(modify_qp, "ibv_modify_qp");
  LOAD(destroy_qp, "ibv_destroy_qp");
  LOAD(fork_init, "ibv_fork_init");
  LOAD(event_type_str, "ibv_event_type_str");
#undef LOAD
  // NCCL binds these with LOAD_SYM_VERSION (optional there); the fabric must have them.
  sym(&g.reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8", true);
  sym(&g.reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12", true);
  sym(&g.query_ece, "ibv_query_ece", "IBVERBS_1.10", true);
  sym(&g.set_ece, "ibv_set_ece", "IBVERBS_1.10", true);
}

// ncclIbGetGidIndex for RoCE with NCCL_IB_GID_INDEX unset, AF_INET, RoCE v2: a candidate
// of the user's family wins over one of another family; ties would read sysfs, which the
// fabric does not have, so a tie is a failure here.
int ncclGidIndex(ibv_context* ctx, int tableLen) {
  auto family = [](const ibv_gid& gid) {
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(gid.raw, mapped, 12) == 0 ? AF_INET : AF_INET6;
  };
  int index = 0;
  for (int cand = 1; cand < tableLen; ++cand) {
    ibv_gid cur, next;
    if (g.query_gid(ctx, 1, index, &cur) != 0 || g.query_gid(ctx, 1, cand, &next) != 0) {
      fail("ibv_query_gid(index %d or %d) failed: %s (NCCL queries every index below gid_tbl_len)", index, cand,
           strerror(errno));
    }
    static const uint8_t zero[16] = {};
    bool candValid = memcmp(next.raw, zero, 16) != 0 && !(next.raw[0] == 0xfe && next.raw[1] == 0x80);
    if (family(next) != family(cur) && family(next) == AF_INET) {
      index = cand;
    } else if (family(next) == AF_INET && candValid) {
      fail("GID %d and %d tie on family: NCCL would read sysfs gid_attrs/types, which the fabric lacks", index, cand);
    }
  }
  return index;
}

std::atomic<int> gAsyncEvents{0};

void* asyncThread(void* arg) {  // ncclIbAsyncThreadMain: blocks in ibv_get_async_event
  auto* ctx = static_cast<ibv_context*>(arg);
  for (;;) {
    ibv_async_event ev;
    if (g.get_async_event(ctx, &ev) != 0) break;
    fprintf(stderr, "async event: %s\n", g.event_type_str(ev.event_type));
    gAsyncEvents++;
    g.ack_async_event(&ev);
  }
  return nullptr;
}

struct QpInfo {
  uint32_t qpn;
  uint8_t gid[16];
  uint32_t rkey;
  uint64_t addr;
  int mtu;
};

ibv_qp* createQp(ibv_pd* pd, ibv_cq* cq, int access) {  // ncclIbCreateQp
  ibv_qp_init_attr ia{};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 2 * 32;
  ia.cap.max_recv_wr = 32;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = 64;  // NCCL_IB_USE_INLINE=1: sizeof(struct ncclIbSendFifo)
  ibv_qp* qp = g.create_qp(pd, &ia);
  if (qp == nullptr) fail("ibv_create_qp: %s", strerror(errno));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = access;
  if (int rc = g.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    fail("modify_qp(INIT): %s", strerror(rc));
  }
  ibv_ece ece{};
  int rc = g.query_ece(qp, &ece);
  if (rc != 0 && rc != EOPNOTSUPP) fail("ibv_query_ece: %d (NCCL accepts 0 or EOPNOTSUPP)", rc);
  return qp;
}

void connectQp(ibv_qp* qp, int gidIndex, const QpInfo& remote) {  // ncclIbRtrQp + ncclIbRtsQp
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(remote.mtu);
  a.dest_qp_num = remote.qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
  a.ah_attr.grh.flow_label = 0;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gidIndex);
  a.ah_attr.grh.hop_limit = 255;
  a.ah_attr.grh.traffic_class = 0;
  a.ah_attr.sl = 0;
  a.ah_attr.src_path_bits = 0;
  a.ah_attr.port_num = 1;
  if (int rc = g.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    fail("modify_qp(RTR): %s", strerror(rc));
  }
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 20;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  if (int rc = g.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
    fail("modify_qp(RTS): %s", strerror(rc));
  }
}

// wrap_ibv_poll_cq: the verbs.h inline, through ctx->ops.
ibv_wc pollOne(ibv_cq* cq, const check::Deadline& dl, const char* what) {
  ibv_wc wc;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) fail("ibv_poll_cq failed waiting for %s", what);
    if (n == 1) return wc;
    if (dl.expired()) fail("no completion for %s before the deadline", what);
  }
}

}  // namespace

int main() {
  check::Rank r("nccl-ib");
  try {
    loadLikeNccl();
    if (gLoadedFrom.find("dropin") == std::string::npos) {
      fail("dlopen(\"libibverbs.so\") loaded %s, not the fabric's drop-in (LD_LIBRARY_PATH?)", gLoadedFrom.c_str());
    }
    if (g.fork_init() != 0) fail("ibv_fork_init failed");
    int ndev = 0;
    ibv_device** list = g.get_device_list(&ndev);
    if (list == nullptr || ndev < 1) fail("no device (ndev %d)", ndev);
    ibv_context* ctx = g.open_device(list[0]);
    std::string devName = g.get_device_name(list[0]);
    g.free_device_list(list);
    if (ctx == nullptr) fail("ibv_open_device(%s): %s", devName.c_str(), strerror(errno));
    ibv_device_attr da;
    if (g.query_device(ctx, &da) != 0) fail("ibv_query_device");
    ibv_port_attr pa{};
    if (g.query_port(ctx, 1, &pa) != 0) fail("ibv_query_port@IBVERBS_1.1");
    if (pa.state != IBV_PORT_ACTIVE || pa.link_layer != IBV_LINK_LAYER_ETHERNET || pa.active_mtu != IBV_MTU_4096) {
      fail("%s port: state %d link layer %d active_mtu %d (want ACTIVE, Ethernet, 4096)", devName.c_str(), pa.state,
           pa.link_layer, pa.active_mtu);
    }
    int gidIndex = ncclGidIndex(ctx, pa.gid_tbl_len);
    if (gidIndex != 1) fail("NCCL's GID selection chose index %d (want 1, the IPv4 RoCE v2 GID)", gidIndex);
    pthread_t async;
    pthread_create(&async, nullptr, asyncThread, ctx);
    pthread_detach(async);  // as NCCL: never joined

    ibv_pd* pd = g.alloc_pd(ctx);
    errno = 0;
    if (g.reg_dmabuf_mr(pd, 0, 0, 0, -1, 0) != nullptr || (errno != EOPNOTSUPP && errno != EPROTONOSUPPORT)) {
      fail("DMA-BUF probe: want EOPNOTSUPP, got errno %d", errno);
    }
    ibv_cq* cq = g.create_cq(ctx, 2 * 32 * 2, nullptr, nullptr, 0);
    if (cq == nullptr) fail("ibv_create_cq: %s", strerror(errno));
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    const size_t kSize = 1 << 20;
    std::vector<uint8_t> buf(kSize), fifo(64 * 32);
    ibv_mr* mr = g.reg_mr_iova2(pd, buf.data(), kSize, reinterpret_cast<uintptr_t>(buf.data()),
                                access | IBV_ACCESS_RELAXED_ORDERING);
    ibv_mr* fifoMr = g.reg_mr(pd, fifo.data(), fifo.size(), access);
    if (mr == nullptr || fifoMr == nullptr) fail("ibv_reg_mr_iova2 with RELAXED_ORDERING / ibv_reg_mr: %s", strerror(errno));
    ibv_qp* qp = createQp(pd, cq, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);

    QpInfo me{};
    me.qpn = qp->qp_num;
    ibv_gid gid;
    g.query_gid(ctx, 1, gidIndex, &gid);
    memcpy(me.gid, gid.raw, 16);
    me.mtu = pa.active_mtu;
    me.rkey = r.rank == 0 ? fifoMr->rkey : mr->rkey;  // sender exposes its FIFO, receiver its buffer
    me.addr = r.rank == 0 ? reinterpret_cast<uintptr_t>(fifo.data()) : reinterpret_cast<uintptr_t>(buf.data());
    QpInfo peer = r.exchange(me);
    connectQp(qp, gidIndex, peer);
    r.barrier("connected");
    check::Deadline dl(60);
    const int kIters = 64;
    int checkedBytes = 0;
    int fifoSignaled = 0, fifoCompleted = 0;  // the receiver's signaled FIFO writes (one in 16)
    for (int it = 0; it < kIters; ++it) {
      uint32_t size = static_cast<uint32_t>(((it * 7919) % kSize) + 1);
      if (r.rank == 1) {  // receiver: empty receive, then the FIFO slot to the sender
        ibv_recv_wr rw{}, *bad;
        rw.wr_id = it;
        rw.sg_list = nullptr;
        rw.num_sge = 0;
        if (ibv_post_recv(qp, &rw, &bad) != 0) fail("post_recv (empty)");
        struct Slot {
          uint64_t addr;
          uint32_t rkey, size, idx, pad;
        } slot{reinterpret_cast<uintptr_t>(buf.data()), mr->rkey, size, static_cast<uint32_t>(it), 0};
        ibv_sge sge{reinterpret_cast<uintptr_t>(&slot), sizeof(slot), 0};
        ibv_send_wr w{}, *bw;
        w.wr_id = 1000 + it;
        w.sg_list = &sge;
        w.num_sge = 1;
        w.opcode = IBV_WR_RDMA_WRITE;
        w.send_flags = IBV_SEND_INLINE | ((it % 16) == 15 ? IBV_SEND_SIGNALED : 0);
        w.wr.rdma.remote_addr = peer.addr + (it % 32) * 64;
        w.wr.rdma.rkey = peer.rkey;
        if (ibv_post_send(qp, &w, &bw) != 0) fail("post_send (FIFO slot, inline)");
        if (w.send_flags & IBV_SEND_SIGNALED) ++fifoSignaled;
        bool gotImm = false;
        while (!gotImm) {
          ibv_wc wc = pollOne(cq, dl, "the WRITE_WITH_IMM");
          if (wc.status != IBV_WC_SUCCESS) fail("completion error: %s", statusName(wc.status).c_str());
          if (wc.opcode == IBV_WC_RDMA_WRITE) {  // a signaled FIFO write
            ++fifoCompleted;
            continue;
          }
          if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc.wc_flags & IBV_WC_WITH_IMM) || wc.imm_data != size) {
            fail("iteration %d: opcode %d imm %u (want RECV_RDMA_WITH_IMM, imm %u)", it, wc.opcode, wc.imm_data, size);
          }
          gotImm = true;
        }
        for (uint32_t i = 0; i < size; ++i) {
          if (buf[i] != static_cast<uint8_t>(i * 13 + it)) fail("iteration %d: byte %u is %u", it, i, buf[i]);
        }
        checkedBytes += static_cast<int>(size);
      } else {  // sender: waits for the slot (no completion on this side), then WRITE + WRITE_WITH_IMM
        volatile auto* idx = reinterpret_cast<volatile uint32_t*>(&fifo[(it % 32) * 64 + 16]);
        volatile auto* sz = reinterpret_cast<volatile uint32_t*>(&fifo[(it % 32) * 64 + 12]);
        while (*idx != static_cast<uint32_t>(it) || *sz != size) {
          ibv_wc wc;
          if (ibv_poll_cq(cq, 1, &wc) > 0 && wc.status != IBV_WC_SUCCESS) fail("completion error: %s", statusName(wc.status).c_str());
          if (dl.expired()) fail("iteration %d: the FIFO slot never arrived", it);
        }
        uint64_t raddr;
        uint32_t rkey;
        memcpy(&raddr, &fifo[(it % 32) * 64], 8);
        memcpy(&rkey, &fifo[(it % 32) * 64 + 8], 4);
        for (uint32_t i = 0; i < size; ++i) buf[i] = static_cast<uint8_t>(i * 13 + it);
        ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), size, mr->lkey};
        ibv_send_wr w[2]{}, *bw;
        w[0].wr_id = it;
        w[0].sg_list = &sge;
        w[0].num_sge = 1;
        w[0].opcode = IBV_WR_RDMA_WRITE;
        w[0].wr.rdma.remote_addr = raddr;
        w[0].wr.rdma.rkey = rkey;
        w[0].next = &w[1];
        w[1].wr_id = it;
        w[1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        w[1].imm_data = size;
        w[1].send_flags = IBV_SEND_SIGNALED;
        w[1].wr.rdma.remote_addr = raddr;
        w[1].wr.rdma.rkey = rkey;
        if (ibv_post_send(qp, w, &bw) != 0) fail("post_send (WRITE + WRITE_WITH_IMM)");
        ibv_wc wc = pollOne(cq, dl, "the WRITE_WITH_IMM's send completion");
        if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RDMA_WRITE) {
          fail("send completion: %s opcode %d", statusName(wc.status).c_str(), wc.opcode);
        }
      }
    }
    // NCCL's GPU flush: a 1-byte READ from the received buffer over a QP connected to itself.
    int flushes = 0;
    if (r.rank == 1) {
      // The last signaled FIFO write may complete after the data it asked for has arrived
      // (its ACK is late on a loaded host): take those completions first, so the flush's
      // completions below are the flush's.
      while (fifoCompleted < fifoSignaled) {
        ibv_wc wc = pollOne(cq, dl, "the last signaled FIFO write");
        if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RDMA_WRITE) {
          fail("FIFO write completion: %s opcode %d", statusName(wc.status).c_str(), wc.opcode);
        }
        ++fifoCompleted;
      }
      ibv_qp* lqp = createQp(pd, cq, IBV_ACCESS_REMOTE_READ);
      QpInfo self = me;
      self.qpn = lqp->qp_num;
      connectQp(lqp, gidIndex, self);
      uint32_t flushByte = 0;
      ibv_mr* fmr = g.reg_mr(pd, &flushByte, sizeof(flushByte), IBV_ACCESS_LOCAL_WRITE);
      for (int i = 0; i < 8; ++i) {
        ibv_sge sge{reinterpret_cast<uintptr_t>(&flushByte), 1, fmr->lkey};
        ibv_send_wr w{}, *bw;
        w.sg_list = &sge;
        w.num_sge = 1;
        w.opcode = IBV_WR_RDMA_READ;
        w.send_flags = IBV_SEND_SIGNALED;
        w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf.data()) + i;
        w.wr.rdma.rkey = mr->rkey;
        if (ibv_post_send(lqp, &w, &bw) != 0) fail("post_send (flush READ)");
        ibv_wc wc = pollOne(cq, dl, "the flush READ");
        if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RDMA_READ || (flushByte & 0xff) != buf[i]) {
          fail("flush READ: %s opcode %d byte %u (want %u)", statusName(wc.status).c_str(), wc.opcode, flushByte & 0xff, buf[i]);
        }
        ++flushes;
      }
      g.destroy_qp(lqp);
      g.dereg_mr(fmr);
    }
    r.barrier("done");
    g.destroy_qp(qp);
    g.dereg_mr(mr);
    g.dereg_mr(fifoMr);
    g.destroy_cq(cq);
    g.dealloc_pd(pd);
    if (gAsyncEvents.load() != 0) fail("%d unexpected async events", gAsyncEvents.load());
    r.pass("loaded=%s dev=%s gid_index=1 iters=%d checked_bytes=%d flush_reads=%d", gLoadedFrom.c_str(),
           devName.c_str(), kIters, checkedBytes, flushes);
    return 0;  // the async thread stays blocked in ibv_get_async_event, as NCCL's does
  } catch (const check::Failure& e) {
    return r.failed(e.what());
  }
}
