// SPDX-License-Identifier: Apache-2.0
// The production DataOps: rdma-core's inline data-path calls (see data_ops.h).
#include "mesh/datapath/data_ops.h"

namespace mesh {
namespace {

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return ibv_post_send(qp, wr, bad); }
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp, wr, bad); }
int pollCq(ibv_cq* cq, int n, ibv_wc* wc) { return ibv_poll_cq(cq, n, wc); }

constexpr DataOps kVerbs = {postSend, postRecv, pollCq};

}  // namespace

const DataOps* verbsDataOps() { return &kVerbs; }

}  // namespace mesh
