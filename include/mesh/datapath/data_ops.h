// SPDX-License-Identifier: Apache-2.0
// The verbs calls of the data path (post a send WR chain, post a receive WR, poll a CQ),
// behind one table of function pointers. Production uses verbsDataOps(): rdma-core's inline
// ibv_post_send/ibv_post_recv/ibv_poll_cq, which dispatch through the provider's ops in the
// QP's/CQ's context (no link-time dependency on libibverbs). Unit tests install a fake that
// executes RDMA WRITE / WRITE_WITH_IMM / READ between two comms of one process, so the FIFO
// protocol runs under GoogleTest without RDMA (tests/unit/fake_rdma.h).
//
// Same contract as the verbs calls: return 0 or an errno value; pollCq returns the number of
// completions written to `wc` (at most n) or a negative value on error. Hot path: the table
// is read-only after the comm is built; calling through it allocates and locks nothing.
#pragma once

#include <infiniband/verbs.h>

namespace mesh {

struct DataOps {
  int (*postSend)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
  int (*postRecv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
  int (*pollCq)(ibv_cq* cq, int n, ibv_wc* wc);
};

// The production table (rdma-core's provider calls).
const DataOps* verbsDataOps();

}  // namespace mesh
