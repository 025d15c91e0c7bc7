// SPDX-License-Identifier: Apache-2.0
// Completion queues and completion channels. A CQ is a ring of `cqe` entries; one that
// overflows raises IBV_EVENT_CQ_ERR and drops the completion (as rxe does). Polling a send
// or receive completion frees the work-queue slots up to it, as mlx5 does: the slots of
// unsignaled WRs come back only with a later signaled completion.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <sched.h>

#include "fabric.h"

namespace meshfab {

namespace {

ibv_wc_opcode sendOpcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    default: return IBV_WC_SEND;
  }
}

void removeChannelEvents(Cq* cq) {
  if (cq->chan == nullptr) return;
  auto& q = cq->chan->events;
  q.erase(std::remove(q.begin(), q.end(), cq), q.end());
}

}  // namespace

bool Fabric::pushCqe(Cq* cq, const Cqe& e) {
  // A device after a fatal error (as mlx5 after IBV_EVENT_DEVICE_FATAL) polls nothing more.
  if (cq->ctx->dev->fatal) return true;
  if (cq->count == cq->ring.size()) {
    if (!cq->overflowed) {
      cq->overflowed = true;
      trace("CQ %p overflow (%zu entries)", static_cast<void*>(cq), cq->ring.size());
      ibv_async_event ev{};
      ev.event_type = IBV_EVENT_CQ_ERR;
      ev.element.cq = &cq->cq;
      queueAsyncEvent(cq->ctx, ev);
    }
    return false;
  }
  cq->ring[(cq->head + cq->count) % cq->ring.size()] = e;
  cq->count++;
  if (cq->armed && (!cq->solicitedOnly || e.solicited || e.wc.status != IBV_WC_SUCCESS)) {
    cq->armed = false;
    if (cq->chan != nullptr) {
      cq->chan->events.push_back(cq);
      uint64_t one = 1;
      if (write(cq->chan->ch.fd, &one, sizeof(one)) != sizeof(one)) trace("completion event lost");
    }
  }
  return true;
}

void Fabric::completeSend(Qp* qp, uint64_t idx, ibv_wc_status st) {
  SendWqe& w = qp->swqe(idx);
  if (st == IBV_WC_SUCCESS && !w.signaled && !qp->sigAll) return;
  Cqe e;
  memset(&e.wc, 0, sizeof(e.wc));
  e.wc.wr_id = w.wrId;
  e.wc.status = st;
  e.wc.opcode = sendOpcode(w.opcode);
  e.wc.byte_len = static_cast<uint32_t>(w.len);
  e.wc.qp_num = qp->qpn();
  e.wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : 0x100 + st;
  e.qp = qp;
  e.send = true;
  e.wqe = idx;
  pushCqe(qp->scq, e);
}

void Fabric::completeRecv(Qp* qp, uint64_t idx, ibv_wc_status st, uint32_t len, ibv_wc_opcode op,
                          bool imm, uint32_t immData, bool solicited) {
  Cqe e;
  memset(&e.wc, 0, sizeof(e.wc));
  e.wc.wr_id = qp->rwqe(idx).wrId;
  e.wc.status = st;
  e.wc.opcode = op;
  e.wc.byte_len = len;
  e.wc.qp_num = qp->qpn();
  e.wc.src_qp = qp->attr.dest_qp_num;
  e.wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : 0x100 + st;
  if (imm) {
    e.wc.wc_flags |= IBV_WC_WITH_IMM;
    e.wc.imm_data = immData;
  }
  e.solicited = solicited;
  e.qp = qp;
  e.send = false;
  e.wqe = idx;
  pushCqe(qp->rcq, e);
}

int pollCq(ibv_cq* icq, int n, ibv_wc* wc) {
  Fabric* f = Fabric::get();
  Cq* cq = reinterpret_cast<Cq*>(icq);
  // A real CQ is memory the NIC writes: polling it never waits for the NIC. Here the CQ, the
  // rings and the QPs share one lock, so a poller that finds it held (by the NIC thread or
  // another poller moving packets) and nothing in its CQ returns at once instead of queueing
  // for it. std::mutex is not fair: with the application's spinning threads (NCCL's proxy,
  // the relay) queueing for it on every poll, the NIC thread waited for it for seconds on a
  // 2-core host, all sends of the process stopped meanwhile, and collectives on rated links
  // lost 10-70 % of an iteration at random (MESHFAB_STALL_MS shows the waits).
  std::unique_lock<std::mutex> lk(f->mu, std::try_to_lock);
  if (!lk.owns_lock()) {
    if (cq->count.load() == 0) {
      if (f->paced) sched_yield();
      return 0;
    }
    lk.lock();  // completions are there: the caller gets them, as from a real CQ
  }
  if (cq->count == 0) f->progress();  // a spinning poller moves the packets itself
  if (cq->count == 0 && f->paced) {
    // Links with a rate: the emulated NICs of every node share this machine's cores with
    // the pollers. A real NIC sends while its host spins; here a poller that found nothing
    // lets a runnable emulated NIC (another process's paced sender, a NIC thread woken by
    // its rate timer) run first, or a spinning perftest on an oversubscribed machine would
    // hold the core for a whole timeslice while other cables fall idle. sched_yield returns
    // at once when nothing else is runnable.
    lk.unlock();
    sched_yield();
    return 0;
  }
  int got = 0;
  while (got < n && cq->count > 0) {
    Cqe& e = cq->ring[cq->head];
    wc[got++] = e.wc;
    if (e.send) {
      e.qp->sqFree = std::max(e.qp->sqFree, e.wqe + 1);
    } else {
      e.qp->rqFree = std::max(e.qp->rqFree, e.wqe + 1);
    }
    cq->head = (cq->head + 1) % cq->ring.size();
    cq->count--;
  }
  return got;
}

int reqNotifyCq(ibv_cq* icq, int solicitedOnly) {
  Fabric* f = Fabric::get();
  Cq* cq = reinterpret_cast<Cq*>(icq);
  std::lock_guard<std::mutex> lk(f->mu);
  cq->armed = true;
  cq->solicitedOnly = solicitedOnly != 0;
  return 0;
}

// Drops the completions of `qp` from its CQs (destroy or reset), as mlx5 cleans its CQs.
void purgeCqes(Qp* qp) {
  for (Cq* cq : {qp->scq, qp->rcq}) {
    if (cq == nullptr) continue;
    std::vector<Cqe> keep;
    for (size_t i = 0; i < cq->count; ++i) {
      const Cqe& e = cq->ring[(cq->head + i) % cq->ring.size()];
      if (e.qp != qp) keep.push_back(e);
    }
    for (size_t i = 0; i < keep.size(); ++i) cq->ring[i] = keep[i];
    cq->head = 0;
    cq->count = keep.size();
  }
}

ibv_cq* createCq(Fabric* f, ibv_context* ctx, int cqe, void* cqContext, ibv_comp_channel* chan,
                 int compVector) {
  if (cqe < 1 || cqe > (1 << 20) - 1 || compVector < 0 || compVector >= ctx->num_comp_vectors) {
    errno = EINVAL;
    return nullptr;
  }
  std::lock_guard<std::mutex> lk(f->mu);
  auto* cq = new Cq();
  cq->ctx = contextOf(ctx);
  cq->ring.resize(static_cast<size_t>(cqe));
  cq->chan = reinterpret_cast<Channel*>(chan);
  if (cq->chan != nullptr) cq->chan->refs++;
  cq->cq.context = ctx;
  cq->cq.channel = chan;
  cq->cq.cq_context = cqContext;
  cq->cq.cqe = cqe;
  cq->cq.handle = ++f->nextKey;
  pthread_mutex_init(&cq->cq.mutex, nullptr);
  pthread_cond_init(&cq->cq.cond, nullptr);
  f->cqs.push_back(cq);
  f->devStats(cq->ctx->dev)->res[kResCq]++;
  return &cq->cq;
}

ibv_cq_ex* createCqEx(ibv_context*, ibv_cq_init_attr_ex*) {
  errno = EOPNOTSUPP;  // the extended CQ API (ibv_start_poll ...) is not emulated
  return nullptr;
}

// Frees a CQ (caller holds mu, no QP uses it).
void freeCq(Fabric* f, Cq* cq) {
  removeChannelEvents(cq);
  if (cq->chan != nullptr) cq->chan->refs--;
  for (Context* c : {cq->ctx}) {
    auto& q = c->events;
    q.erase(std::remove_if(q.begin(), q.end(),
                           [cq](const ibv_async_event& ev) {
                             return ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == &cq->cq;
                           }),
            q.end());
  }
  f->cqs.erase(std::remove(f->cqs.begin(), f->cqs.end(), cq), f->cqs.end());
  f->devStats(cq->ctx->dev)->res[kResCq]--;
  pthread_mutex_destroy(&cq->cq.mutex);
  pthread_cond_destroy(&cq->cq.cond);
  delete cq;
}

}  // namespace meshfab

using namespace meshfab;

extern "C" {

ibv_comp_channel* ibv_create_comp_channel(ibv_context* ctx) {
  Fabric* f = Fabric::get();
  int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return nullptr;
  std::lock_guard<std::mutex> lk(f->mu);
  auto* ch = new Channel();
  ch->ch.context = ctx;
  ch->ch.fd = fd;
  ch->ch.refcnt = 0;
  return &ch->ch;
}

int ibv_destroy_comp_channel(ibv_comp_channel* ich) {
  Fabric* f = Fabric::get();
  Channel* ch = reinterpret_cast<Channel*>(ich);
  std::lock_guard<std::mutex> lk(f->mu);
  if (ch->refs != 0) {
    errno = EBUSY;
    return EBUSY;
  }
  close(ch->ch.fd);
  delete ch;
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cqContext, ibv_comp_channel* chan, int compVector) {
  return createCq(Fabric::get(), ctx, cqe, cqContext, chan, compVector);
}

int ibv_resize_cq(ibv_cq* icq, int cqe) {
  Fabric* f = Fabric::get();
  Cq* cq = reinterpret_cast<Cq*>(icq);
  std::lock_guard<std::mutex> lk(f->mu);
  if (cqe < 1 || cqe > (1 << 20) - 1 || static_cast<size_t>(cqe) < cq->count) return EINVAL;
  std::vector<Cqe> ring(static_cast<size_t>(cqe));
  for (size_t i = 0; i < cq->count; ++i) ring[i] = cq->ring[(cq->head + i) % cq->ring.size()];
  cq->ring.swap(ring);
  cq->head = 0;
  cq->cq.cqe = cqe;
  return 0;
}

int ibv_destroy_cq(ibv_cq* icq) {
  Fabric* f = Fabric::get();
  Cq* cq = reinterpret_cast<Cq*>(icq);
  std::unique_lock<std::mutex> lk(f->mu);
  if (cq->users != 0) return EBUSY;
  removeChannelEvents(cq);  // unread events vanish; read ones must be acknowledged first
  f->cv.wait(lk, [cq] { return cq->eventsAcked == cq->eventsRead && cq->asyncOut == 0; });
  freeCq(f, cq);
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* ich, ibv_cq** cqOut, void** cqContext) {
  Fabric* f = Fabric::get();
  Channel* ch = reinterpret_cast<Channel*>(ich);
  for (;;) {
    uint64_t n;
    ssize_t r = read(ch->ch.fd, &n, sizeof(n));  // blocks unless the caller set O_NONBLOCK
    if (r != sizeof(n)) {
      if (r < 0 && errno == EINTR) continue;
      return -1;
    }
    std::lock_guard<std::mutex> lk(f->mu);
    if (ch->events.empty()) continue;  // its CQ was destroyed before the event was read
    Cq* cq = ch->events.front();
    ch->events.pop_front();
    cq->eventsRead++;
    *cqOut = &cq->cq;
    *cqContext = cq->cq.cq_context;
    return 0;
  }
}

void ibv_ack_cq_events(ibv_cq* icq, unsigned int n) {
  Fabric* f = Fabric::get();
  Cq* cq = reinterpret_cast<Cq*>(icq);
  std::lock_guard<std::mutex> lk(f->mu);
  cq->eventsAcked += n;
  f->cv.notify_all();
}

}  // extern "C"
