// SPDX-License-Identifier: Apache-2.0
// verbs_check: what a RoCE verbs provider does in the corner cases the plugin (and NCCL)
// depend on, run unchanged on both backends: Soft-RoCE in the QEMU lab (rxe, the kernel's
// semantics) and the userspace fabric (tests/fabric). Each case runs on two ranks (rank 0
// drives, rank 1 is the peer), and rank 0 prints one normalized line
//     OBSERVED <case> key=value ...
// that the ctest of each backend matches against what that backend must do; the table in
// tests/fabric/README.md lists both. Links -libverbs normally: in the lab it gets rdma-core
// with rxe, on the fabric the drop-in through LD_LIBRARY_PATH.
//
//   verbs_check CASE     (under scripts/vmesh run --nodes 2, or scripts/fabric-net run --nodes 2 --dropin)
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "check_util.h"

namespace {

using check::Clock;
using check::fail;
using check::since;

std::string errnoName(int e) {
  switch (e) {
    case 0: return "0";
    case EINVAL: return "EINVAL";
    case ENOMEM: return "ENOMEM";
    case ETIMEDOUT: return "ETIMEDOUT";
    case ENETUNREACH: return "ENETUNREACH";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case EAGAIN: return "EAGAIN";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    default: return "errno" + std::to_string(e);
  }
}

std::string statusName(ibv_wc_status s) {
  static const std::map<int, const char*> kNames = {
      {IBV_WC_SUCCESS, "SUCCESS"},           {IBV_WC_LOC_LEN_ERR, "LOC_LEN_ERR"},
      {IBV_WC_LOC_QP_OP_ERR, "LOC_QP_OP_ERR"}, {IBV_WC_LOC_PROT_ERR, "LOC_PROT_ERR"},
      {IBV_WC_WR_FLUSH_ERR, "WR_FLUSH_ERR"},   {IBV_WC_BAD_RESP_ERR, "BAD_RESP_ERR"},
      {IBV_WC_LOC_ACCESS_ERR, "LOC_ACCESS_ERR"}, {IBV_WC_REM_INV_REQ_ERR, "REM_INV_REQ_ERR"},
      {IBV_WC_REM_ACCESS_ERR, "REM_ACCESS_ERR"}, {IBV_WC_REM_OP_ERR, "REM_OP_ERR"},
      {IBV_WC_RETRY_EXC_ERR, "RETRY_EXC_ERR"}, {IBV_WC_RNR_RETRY_EXC_ERR, "RNR_RETRY_EXC_ERR"},
      {IBV_WC_FATAL_ERR, "FATAL_ERR"},         {IBV_WC_GENERAL_ERR, "GENERAL_ERR"}};
  auto it = kNames.find(s);
  return it != kNames.end() ? it->second : "status" + std::to_string(s);
}

std::string eventName(ibv_event_type e) {
  static const std::map<int, const char*> kNames = {
      {IBV_EVENT_CQ_ERR, "CQ_ERR"},         {IBV_EVENT_QP_FATAL, "QP_FATAL"},
      {IBV_EVENT_QP_REQ_ERR, "QP_REQ_ERR"}, {IBV_EVENT_QP_ACCESS_ERR, "QP_ACCESS_ERR"},
      {IBV_EVENT_COMM_EST, "COMM_EST"},     {IBV_EVENT_PORT_ACTIVE, "PORT_ACTIVE"},
      {IBV_EVENT_PORT_ERR, "PORT_ERR"},     {IBV_EVENT_DEVICE_FATAL, "DEVICE_FATAL"},
      {IBV_EVENT_GID_CHANGE, "GID_CHANGE"}, {IBV_EVENT_QP_LAST_WQE_REACHED, "LAST_WQE_REACHED"}};
  auto it = kNames.find(e);
  return it != kNames.end() ? it->second : "event" + std::to_string(e);
}

std::string secs(double s) {
  char b[32];
  snprintf(b, sizeof(b), "%.1fs", s);
  return b;
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = check::vformat(fmt, ap);
  va_end(ap);
  return s;
}

// --- one side of a connection ----------------------------------------------------------------

struct Info {
  uint32_t qpn;
  uint32_t psn;
  uint8_t gid[16];
  uint32_t rkey;
  uint64_t addr;
};

struct QpOpts {
  uint32_t sendWr = 16, recvWr = 16, sendSge = 4, recvSge = 4, inlineData = 64;
  int cqe = 64;
  uint8_t timeout = 14, retry = 7, rnrRetry = 7, minRnrTimer = 12;
  int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  uint32_t sqPsn = 0, rqPsn = 0;
};

class Side {
 public:
  // Opens the device whose netdev is cabled to `peer` (<prefix>_p<peer>, as vmesh and
  // fabric-net name them).
  explicit Side(int peer, size_t bytes = 1 << 20) : buf(bytes) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    std::string suffix = "_p" + std::to_string(peer);
    for (int i = 0; i < n && ctx == nullptr; ++i) {
      std::string name = ibv_get_device_name(list[i]);
      if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        ctx = ibv_open_device(list[i]);
        dev = name;
        netdev = "p" + std::to_string(peer);
      }
    }
    ibv_free_device_list(list);
    if (ctx == nullptr) fail("no RDMA device *%s (of %d)", suffix.c_str(), n);
    for (int i = 0; i < 16; ++i) {
      ibv_gid g{};
      if (ibv_query_gid(ctx, 1, i, &g) == 0 && g.raw[10] == 0xff && g.raw[11] == 0xff && g.raw[12] == 198) {
        gidIndex = i;
        gid = g;
        break;
      }
    }
    if (gidIndex < 0) fail("%s has no IPv4 GID", dev.c_str());
    pd = ibv_alloc_pd(ctx);
    mr = ibv_reg_mr(pd, buf.data(), buf.size(),
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (pd == nullptr || mr == nullptr) fail("pd/mr on %s: %s", dev.c_str(), strerror(errno));
  }

  ~Side() {
    for (ibv_qp* q : qps) ibv_destroy_qp(q);
    for (ibv_cq* c : cqs) ibv_destroy_cq(c);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }

  ibv_qp* newQp(const QpOpts& o, ibv_cq** cqOut = nullptr) {
    ibv_cq* c = ibv_create_cq(ctx, o.cqe, nullptr, nullptr, 0);
    if (c == nullptr) fail("create_cq(%d): %s", o.cqe, strerror(errno));
    cqs.push_back(c);
    ibv_qp_init_attr ia{};
    ia.send_cq = c;
    ia.recv_cq = c;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {o.sendWr, o.recvWr, o.sendSge, o.recvSge, o.inlineData};
    ibv_qp* q = ibv_create_qp(pd, &ia);
    if (q == nullptr) fail("create_qp: %s", strerror(errno));
    qps.push_back(q);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = o.access;
    if (int rc = ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
      fail("INIT: %s", strerror(rc));
    }
    if (cqOut != nullptr) *cqOut = c;
    return q;
  }

  Info info(ibv_qp* q, const QpOpts& o) const {
    Info i{};
    i.qpn = q->qp_num;
    i.psn = o.rqPsn;
    memcpy(i.gid, gid.raw, 16);
    i.rkey = mr->rkey;
    i.addr = reinterpret_cast<uintptr_t>(buf.data());
    return i;
  }

  // INIT -> RTR -> RTS; returns the errno of the first failing modify (0 when connected).
  int connect(ibv_qp* q, const Info& remote, const QpOpts& o) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = o.rqPsn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = o.minRnrTimer;
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gidIndex);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (int rc = ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
      return rc;
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry;
    a.rnr_retry = o.rnrRetry;
    a.sq_psn = o.sqPsn;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                    IBV_QP_MAX_QP_RD_ATOMIC);
  }

  int post(ibv_qp* q, ibv_wr_opcode op, uint64_t localOff, uint32_t len, const Info& remote, uint64_t remoteOff,
           bool signaled = true, uint32_t rkey = 0, uint64_t wrId = 1) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()) + localOff, len, mr->lkey};
    ibv_send_wr w{}, *bad;
    w.wr_id = wrId;
    w.sg_list = &sge;
    w.num_sge = len > 0 ? 1 : 0;
    w.opcode = op;
    w.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    w.imm_data = htonl(0x1234);
    w.wr.rdma.remote_addr = remote.addr + remoteOff;
    w.wr.rdma.rkey = rkey != 0 ? rkey : remote.rkey;
    return ibv_post_send(q, &w, &bad);
  }

  int postRecv(ibv_qp* q, uint64_t off, uint32_t len, uint64_t wrId = 7) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()) + off, len, mr->lkey};
    ibv_recv_wr w{}, *bad;
    w.wr_id = wrId;
    w.sg_list = &sge;
    w.num_sge = 1;
    return ibv_post_recv(q, &w, &bad);
  }

  // The next completion within `seconds`, or false.
  bool poll(ibv_cq* c, double seconds, ibv_wc* wc) {
    auto t0 = Clock::now();
    do {
      int n = ibv_poll_cq(c, 1, wc);
      if (n < 0) fail("poll_cq failed");
      if (n == 1) return true;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    } while (since(t0) < seconds);
    return false;
  }

  // Async events that arrive within `seconds` (names, in order); port events left out
  // unless `withPort` (rxe may still deliver the PORT_ACTIVE of the link's bring-up).
  std::string events(double seconds, bool withPort = true, bool stopAfterFirst = false) {
    std::string out;
    auto t0 = Clock::now();
    while (!(stopAfterFirst && !out.empty())) {
      double left = seconds - since(t0);
      if (left <= 0) break;
      pollfd p{ctx->async_fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) break;
      ibv_async_event ev;
      if (ibv_get_async_event(ctx, &ev) != 0) break;
      bool port = ev.event_type == IBV_EVENT_PORT_ACTIVE || ev.event_type == IBV_EVENT_PORT_ERR;
      if (withPort || !port) out += (out.empty() ? "" : "+") + eventName(ev.event_type);
      ibv_ack_async_event(&ev);
    }
    return out.empty() ? "none" : out;
  }

  ibv_qp_state state(ibv_qp* q) {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    ibv_query_qp(q, &a, IBV_QP_STATE, &ia);
    return a.qp_state;
  }

  std::vector<char> buf;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_mr* mr = nullptr;
  int gidIndex = -1;
  ibv_gid gid{};
  std::string dev, netdev;
  std::vector<ibv_qp*> qps;
  std::vector<ibv_cq*> cqs;
};

const char* kStateNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};

// A connected pair with `o` on both sides: each rank returns its side's QP and CQ.
struct Pair {
  ibv_qp* qp;
  ibv_cq* cq;
  Info remote;
};
Pair connectPair(check::Rank& r, Side& s, const QpOpts& o, const std::string& tag = "pair") {
  Pair p;
  p.qp = s.newQp(o, &p.cq);
  p.remote = r.exchange(s.info(p.qp, o), tag);
  if (int rc = s.connect(p.qp, p.remote, o)) fail("connect: %s", errnoName(rc).c_str());
  r.barrier(tag + ".up");
  return p;
}

int run(const char* cmd) {
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// --- cases ------------------------------------------------------------------------------------

// modify_qp(RTR) towards a GID the port cannot reach: another subnet, and a free address on
// its own subnet. RoCE resolves the destination's MAC at RTR (kernel: 1 s timeout).
std::string caseRtrUnreachable(check::Rank& r, Side& s) {
  std::string out;
  if (r.rank == 0) {
    QpOpts o;
    for (const char* ip : {"198.18.99.2", "198.18.0.9"}) {
      ibv_qp* q = s.newQp(o);
      Info fake{};
      fake.qpn = 0x123;
      fake.gid[10] = fake.gid[11] = 0xff;
      inet_pton(AF_INET, ip, fake.gid + 12);
      auto t0 = Clock::now();
      int rc = s.connect(q, fake, o);
      out += format("%s=%s/%s ", std::string(ip) == "198.18.99.2" ? "other_subnet" : "no_such_host",
                    errnoName(rc).c_str(), secs(since(t0)).c_str());
    }
  }
  r.barrier("done");
  return out;
}

// A WRITE to a QPN that does not exist on a reachable peer (timeout 14 = 67 ms, retry 7).
std::string caseNoRemoteQp(check::Rank& r, Side& s) {
  std::string out;
  QpOpts o;
  ibv_cq* cq;
  ibv_qp* q = s.newQp(o, &cq);
  Info remote = r.exchange(s.info(q, o));
  if (r.rank == 0) {
    remote.qpn = 0xabcde;  // nobody's
    if (int rc = s.connect(q, remote, o)) fail("connect: %s", errnoName(rc).c_str());
    auto t0 = Clock::now();
    if (s.post(q, IBV_WR_RDMA_WRITE, 0, 64, remote, 0) != 0) fail("post");
    ibv_wc wc;
    bool got = s.poll(cq, 10, &wc);
    out = got ? format("write=%s/%s", statusName(wc.status).c_str(), secs(since(t0)).c_str()) : "write=none_in_10s";
  }
  r.barrier("done");
  return out;
}

// A WRITE with a wrong rkey: the requester's completion, the responder's QP state and its
// async events.
std::string caseBadRkey(check::Rank& r, Side& s) {
  QpOpts o;
  Pair p = connectPair(r, s, o);
  std::string out;
  if (r.rank == 0) {
    if (s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 64, p.remote, 0, true, p.remote.rkey ^ 0x5a5a00) != 0) fail("post");
    ibv_wc wc;
    out = "requester=" + (s.poll(p.cq, 10, &wc) ? statusName(wc.status) : std::string("none"));
    out += std::string(" requester_state=") + kStateNames[s.state(p.qp)];
    r.publish("r0", out);
  } else {
    r.fetch("r0");
    std::string ev = s.events(1.0, false);
    r.publish("r1", format("responder_state=%s responder_events=%s", kStateNames[s.state(p.qp)], ev.c_str()));
  }
  if (r.rank == 0) out += " " + r.fetch("r1");
  r.barrier("done");
  return out;
}

// SEND with nothing posted: rnr_retry 1 gives up; rnr_retry 7 waits for a late receive.
std::string caseRnr(check::Rank& r, Side& s) {
  std::string out;
  QpOpts o;
  o.rnrRetry = 1;
  o.minRnrTimer = 1;  // 0.01 ms
  Pair a = connectPair(r, s, o, "rnr1");
  if (r.rank == 0) {
    auto t0 = Clock::now();
    if (s.post(a.qp, IBV_WR_SEND, 0, 64, a.remote, 0) != 0) fail("post");
    ibv_wc wc;
    out = "rnr_retry1=" + (s.poll(a.cq, 10, &wc) ? statusName(wc.status) + "/" + secs(since(t0)) : std::string("none"));
  }
  r.barrier("rnr1.done");
  QpOpts o7;
  o7.rnrRetry = 7;
  o7.minRnrTimer = 12;  // 0.64 ms
  Pair b = connectPair(r, s, o7, "rnr7");
  if (r.rank == 0) {
    if (s.post(b.qp, IBV_WR_SEND, 0, 64, b.remote, 0) != 0) fail("post");
    ibv_wc wc;
    out += " rnr_retry7_late_recv=" + (s.poll(b.cq, 10, &wc) ? statusName(wc.status) : std::string("none"));
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the NAKs go on meanwhile
    if (s.postRecv(b.qp, 0, 4096) != 0) fail("post_recv");
    ibv_wc wc;
    if (!s.poll(b.cq, 10, &wc) || wc.status != IBV_WC_SUCCESS) fail("the late receive did not complete");
  }
  r.barrier("done");
  return out;
}

// A SEND longer than the receive buffer.
std::string caseSendTooLong(check::Rank& r, Side& s) {
  QpOpts o;
  Pair p = connectPair(r, s, o, "pre");
  std::string out;
  if (r.rank == 1) {
    if (s.postRecv(p.qp, 0, 16) != 0) fail("post_recv");
    r.publish("posted", "");
    ibv_wc wc;
    r.publish("r1", "responder=" + (s.poll(p.cq, 10, &wc) ? statusName(wc.status) : std::string("none")));
  } else {
    r.fetch("posted");
    if (s.post(p.qp, IBV_WR_SEND, 0, 64, p.remote, 0) != 0) fail("post");
    ibv_wc wc;
    out = "requester=" + (s.poll(p.cq, 10, &wc) ? statusName(wc.status) : std::string("none")) + " " + r.fetch("r1");
  }
  r.barrier("done");
  return out;
}

// max_send_wr unsignaled WRITEs, acknowledged long ago: is there room for one more before a
// signaled completion is polled?
std::string caseUnsignaledSlots(check::Rank& r, Side& s) {
  QpOpts o;
  o.sendWr = 4;
  Pair p = connectPair(r, s, o);
  std::string out;
  if (r.rank == 0) {
    for (int i = 0; i < 4; ++i) {
      if (int rc = s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 64, p.remote, 0, false)) fail("post %d: %s", i, errnoName(rc).c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    int rc = s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 64, p.remote, 0, true);
    out = "fifth_post=" + errnoName(rc);
    ibv_wc wc;
    if (rc == 0 && (!s.poll(p.cq, 10, &wc) || wc.status != IBV_WC_SUCCESS)) fail("the fifth WRITE did not complete");
  }
  r.barrier("done");
  return out;
}

// Posting to a QP in ERR: accepted and flushed (both queues).
std::string casePostInErr(check::Rank& r, Side& s) {
  QpOpts o;
  Pair p = connectPair(r, s, o);
  std::string out;
  if (r.rank == 0) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(p.qp, &a, IBV_QP_STATE) != 0) fail("modify to ERR");
    int rcs = s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 64, p.remote, 0);
    int rcr = s.postRecv(p.qp, 0, 64);
    ibv_wc w1{}, w2{};
    bool g1 = s.poll(p.cq, 2, &w1), g2 = g1 && s.poll(p.cq, 2, &w2);
    out = format("post_send=%s post_recv=%s cqes=%s,%s", errnoName(rcs).c_str(), errnoName(rcr).c_str(),
                 g1 ? statusName(w1.status).c_str() : "none", g2 ? statusName(w2.status).c_str() : "none");
  }
  r.barrier("done");
  return out;
}

// The requester's first PSN is ahead of what the responder expects.
std::string casePsnMismatch(check::Rank& r, Side& s) {
  QpOpts o;
  if (r.rank == 0) o.sqPsn = 1000;  // rank 1 expects 0
  Pair p = connectPair(r, s, o);
  std::string out;
  if (r.rank == 0) {
    auto t0 = Clock::now();
    if (s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 64, p.remote, 0) != 0) fail("post");
    ibv_wc wc;
    out = "psn_ahead=" + (s.poll(p.cq, 10, &wc) ? statusName(wc.status) + "/" + secs(since(t0)) : std::string("none"));
  }
  r.barrier("done");
  return out;
}

// More completions than the CQ holds.
std::string caseCqOverflow(check::Rank& r, Side& s) {
  QpOpts o;
  o.cqe = 2;
  Pair p = connectPair(r, s, o);
  std::string out;
  if (r.rank == 0) {
    for (int i = 0; i < 6; ++i) {
      if (s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 64, p.remote, 0, true, 0, i) != 0) fail("post %d", i);
    }
    // The first event whenever it comes (a loaded machine delays the completions), then
    // any that follow it closely.
    std::string ev = s.events(10.0, true, /*stopAfterFirst=*/true);
    if (ev != "none") {
      std::string more = s.events(0.5);
      if (more != "none") ev += "+" + more;
    }
    int n = 0;
    ibv_wc wc[8];
    n = ibv_poll_cq(p.cq, 8, wc);
    out = format("events=%s polled=%d", ev.c_str(), n);
  }
  r.barrier("done");
  return out;
}

// The port goes down under a connected QP (rank 0 runs `ip link set <netdev> down`): the
// async events on both sides, a WRITE posted then, an RTR while down; then back up.
std::string caseLinkDown(check::Rank& r, Side& s) {
  QpOpts o;
  Pair p = connectPair(r, s, o);
  std::string out;
  std::string cmd = "ip link set dev " + s.netdev;
  if (r.rank == 0) {
    if (s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 64, p.remote, 0) != 0) fail("post");
    ibv_wc wc;
    if (!s.poll(p.cq, 10, &wc) || wc.status != IBV_WC_SUCCESS) fail("the WRITE before the cut failed");
    if (run((cmd + " down").c_str()) != 0) fail("%s down failed", cmd.c_str());
    std::string ev = s.events(3.0);
    auto t0 = Clock::now();
    int rc = s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 64, p.remote, 0);
    std::string write = rc != 0 ? "post_" + errnoName(rc)
                                : (s.poll(p.cq, 10, &wc) ? statusName(wc.status) + "/" + secs(since(t0)) : "none");
    ibv_qp* q2 = s.newQp(o);
    int rtr = s.connect(q2, p.remote, o);
    if (run((cmd + " up").c_str()) != 0) fail("%s up failed", cmd.c_str());
    std::string ev2 = s.events(5.0);
    out = format("events=%s write=%s rtr_while_down=%s after_up=%s", ev.c_str(), write.c_str(), errnoName(rtr).c_str(),
                 ev2.c_str());
    r.publish("cut-done", "");
    out += " " + r.fetch("peer");
  } else {
    r.fetch("cut-done", 60);
    r.publish("peer", "peer_events=" + s.events(0.5));
  }
  r.barrier("done");
  return out;
}

// Data: WRITE, WRITE_WITH_IMM, SEND_WITH_IMM into 2 SGEs, READ, inline, zero-length, in order.
std::string caseData(check::Rank& r, Side& s) {
  QpOpts o;
  Pair p = connectPair(r, s, o);
  std::string out;
  const uint32_t kLen = 100000;
  if (r.rank == 1) {
    for (uint32_t i = 0; i < kLen; ++i) s.buf[i] = static_cast<char>(i * 7);
    if (s.postRecv(p.qp, 500000, 64) != 0) fail("post_recv");  // WRITE_WITH_IMM
    ibv_sge sg[2] = {{reinterpret_cast<uintptr_t>(&s.buf[600000]), 1000, s.mr->lkey},
                     {reinterpret_cast<uintptr_t>(&s.buf[700000]), 9000, s.mr->lkey}};
    ibv_recv_wr w{}, *bad;
    w.wr_id = 8;
    w.sg_list = sg;
    w.num_sge = 2;
    if (ibv_post_recv(p.qp, &w, &bad) != 0) fail("post_recv 2 SGEs");
    r.publish("ready", "");
    ibv_wc wc;
    if (!s.poll(p.cq, 10, &wc) || wc.status || wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || wc.byte_len != 0 ||
        ntohl(wc.imm_data) != 0x1234) {
      fail("WRITE_WITH_IMM completion: %s opcode %d len %u", statusName(wc.status).c_str(), wc.opcode, wc.byte_len);
    }
    if (!s.poll(p.cq, 10, &wc) || wc.status || wc.opcode != IBV_WC_RECV || wc.byte_len != 6000 ||
        !(wc.wc_flags & IBV_WC_WITH_IMM)) {
      fail("SEND_WITH_IMM completion: %s opcode %d len %u", statusName(wc.status).c_str(), wc.opcode, wc.byte_len);
    }
    for (uint32_t i = 0; i < 5000; ++i) {
      if (s.buf[200000 + i] != static_cast<char>(i * 3)) fail("WRITE data wrong at %u", i);
    }
    for (uint32_t i = 0; i < 6000; ++i) {
      char got = i < 1000 ? s.buf[600000 + i] : s.buf[700000 + i - 1000];
      if (got != static_cast<char>(i * 5)) fail("SEND data wrong at %u", i);
    }
    if (memcmp(&s.buf[300000], "inline!", 8) != 0) fail("inline WRITE data wrong");
  } else {
    r.fetch("ready");
    for (uint32_t i = 0; i < 6000; ++i) s.buf[i] = static_cast<char>(i * 3);
    if (s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 5000, p.remote, 200000, false)) fail("post WRITE");
    if (s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 0, p.remote, 0, false)) fail("post zero-length WRITE");
    if (s.post(p.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 0, 0, p.remote, 0, false)) fail("post WRITE_WITH_IMM");
    char text[8] = "inline!";
    ibv_sge isge{reinterpret_cast<uintptr_t>(text), 8, 0};
    ibv_send_wr w{}, *bad;
    w.sg_list = &isge;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_INLINE;
    w.wr.rdma.remote_addr = p.remote.addr + 300000;
    w.wr.rdma.rkey = p.remote.rkey;
    if (ibv_post_send(p.qp, &w, &bad)) fail("post inline WRITE");
    memset(text, 0, sizeof(text));  // inline data was copied at post time
    for (uint32_t i = 0; i < 6000; ++i) s.buf[10000 + i] = static_cast<char>(i * 5);
    ibv_sge sge{reinterpret_cast<uintptr_t>(&s.buf[10000]), 6000, s.mr->lkey};
    ibv_send_wr sw{};
    sw.sg_list = &sge;
    sw.num_sge = 1;
    sw.opcode = IBV_WR_SEND_WITH_IMM;
    sw.imm_data = htonl(5);
    if (ibv_post_send(p.qp, &sw, &bad)) fail("post SEND_WITH_IMM");
    if (s.post(p.qp, IBV_WR_RDMA_READ, 400000, kLen, p.remote, 0, true, 0, 99)) fail("post READ");
    ibv_wc wc;
    if (!s.poll(p.cq, 10, &wc) || wc.status || wc.wr_id != 99 || wc.opcode != IBV_WC_RDMA_READ) {
      fail("READ completion: %s wr_id %llu", statusName(wc.status).c_str(), static_cast<unsigned long long>(wc.wr_id));
    }
    for (uint32_t i = 0; i < kLen; ++i) {
      if (s.buf[400000 + i] != static_cast<char>(i * 7)) fail("READ data wrong at %u", i);
    }
    out = "data=ok";
  }
  r.barrier("done");
  return out;
}

// A forked child (a PyTorch DataLoader worker) opens a device of its own and exits; the
// parent's connection must not notice.
std::string caseForkChild(check::Rank& r, Side& s) {
  QpOpts o;
  Pair p = connectPair(r, s, o);
  std::string out;
  if (r.rank == 0) {
    pid_t child = fork();
    if (child == 0) {
      int n = 0;
      ibv_device** list = ibv_get_device_list(&n);
      ibv_context* c = n > 0 ? ibv_open_device(list[0]) : nullptr;
      ibv_port_attr pa{};
      int rc = (c != nullptr && ibv_query_port(c, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) ? 0 : 1;
      if (c != nullptr) ibv_close_device(c);
      if (list != nullptr) ibv_free_device_list(list);
      exit(rc);  // runs the library's destructors in the child
    }
    int st = 0;
    waitpid(child, &st, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (s.post(p.qp, IBV_WR_RDMA_WRITE, 0, 64, p.remote, 0) != 0) fail("post");
    ibv_wc wc;
    out = format("child=%s parent_write_after=%s", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "ok" : "failed",
                 s.poll(p.cq, 10, &wc) ? statusName(wc.status).c_str() : "none");
  }
  r.barrier("done");
  return out;
}

// ECE (ibv_query_ece / ibv_set_ece: NCCL IB and the plugin negotiate it on every QP, and treat
// EOPNOTSUPP as "no ECE"): what a fresh QP offers, a set naming another vendor, a set of the
// offer, a query before the next modify (mlx5 reads 0 there), and what the QP reports once
// connected. Both ranks do the same; rank 0 reports.
std::string eceText(int rc, const ibv_ece& e) {
  return rc == 0 ? format("%x:%x", e.vendor_id, e.options) : errnoName(rc);
}

std::string caseEce(check::Rank& r, Side& s) {
  QpOpts o;
  ibv_qp* q = s.newQp(o);
  ibv_ece offer{};
  int rc = ibv_query_ece(q, &offer);
  std::string out = "query=" + eceText(rc, offer);
  ibv_ece foreign = offer;
  foreign.vendor_id ^= 0x100;
  out += " foreign_vendor=" + errnoName(ibv_set_ece(q, &foreign));
  out += " set=" + errnoName(ibv_set_ece(q, &offer));
  ibv_ece pending{};
  rc = ibv_query_ece(q, &pending);
  out += " before_rtr=" + eceText(rc, pending);
  Info remote = r.exchange(s.info(q, o));
  if (int c = s.connect(q, remote, o)) fail("connect: %s", errnoName(c).c_str());
  ibv_ece after{};
  rc = ibv_query_ece(q, &after);
  out += " connected=" + eceText(rc, after);
  r.barrier("done");
  return out;
}

const std::map<std::string, std::function<std::string(check::Rank&, Side&)>> kCases = {
    {"fork-child", caseForkChild},
    {"rtr-unreachable", caseRtrUnreachable}, {"no-remote-qp", caseNoRemoteQp},
    {"bad-rkey", caseBadRkey},               {"rnr", caseRnr},
    {"send-too-long", caseSendTooLong},      {"unsignaled-slots", caseUnsignaledSlots},
    {"post-in-err", casePostInErr},          {"psn-mismatch", casePsnMismatch},
    {"cq-overflow", caseCqOverflow},         {"link-down", caseLinkDown},
    {"data", caseData},                      {"ece", caseEce},
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> cases(argv + 1, argv + argc);
  if (cases.size() == 1 && cases[0] == "all") {
    cases.clear();
    for (const auto& kv : kCases) cases.push_back(kv.first);
  }
  bool ok = !cases.empty();
  for (const std::string& c : cases) ok = ok && kCases.count(c) != 0;
  if (!ok) {
    fprintf(stderr, "usage: verbs_check CASE... | all\ncases:");
    for (const auto& kv : kCases) fprintf(stderr, " %s", kv.first.c_str());
    fprintf(stderr, "\n");
    return 2;
  }
  int status = 0;
  for (const std::string& c : cases) {  // one after the other, each with its own rendezvous
    check::Rank r(c);
    try {
      std::string observed;
      {
        Side s(r.peer());
        observed = kCases.at(c)(r, s);
      }
      if (r.rank == 0) printf("OBSERVED %s %s\n", c.c_str(), observed.c_str());
      r.pass("%s", observed.c_str());
    } catch (const check::Failure& e) {
      status = r.failed(e.what());
      break;
    }
  }
  return status;
}
