// SPDX-License-Identifier: Apache-2.0
// A connection has at most kMaxQps (16) data QPs: links x NCCL_MESH_QPS_PER_CONN. With more
// QPs per link than two links allow (9..16 on a DGX Spark cable, which is two links: one per
// PCIe function), the connector uses as many of its links as fit instead of failing every
// connect; the acceptor follows the connector's HELLO.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "fake_rdma.h"
#include "fifo_pair.h"

namespace mesh {
namespace fake {
namespace {

uint32_t ip(int link, int host) { return (198u << 24) | (18u << 16) | (static_cast<uint32_t>(link) << 8) | static_cast<uint32_t>(host); }

TEST(LinkCap, ManyQpsPerLinkUseFewerLinksInsteadOfFailing) {
  FakeRdma fake;
  Discovery a, b;
  for (int l = 0; l < 2; ++l) {
    addFakePort(fake, &a, "a" + std::to_string(l), ip(l, 1));
    addFakePort(fake, &b, "b" + std::to_string(l), ip(l, 2));
  }
  for (int qps : {1, 8, 9, 16}) {
    SCOPED_TRACE("qpsPerLink " + std::to_string(qps));
    CommSettings s;
    s.ops = fake.ops();
    s.qpsPerLink = qps;
    RdmaTransport ta(&a, s), tb(&b, s);
    std::unique_ptr<PreparedConn> send, recv;
    HsMessage hello, accept;
    ASSERT_EQ(ta.prepare(true, {fakeRoute(0, ip(0, 1), ip(0, 2)), fakeRoute(1, ip(1, 1), ip(1, 2))}, ConnOptions(), &send,
                         &hello),
              ncclSuccess);
    size_t links = qps <= 8 ? 2 : 1;
    EXPECT_EQ(hello.links.size(), links);
    EXPECT_EQ(hello.qps.size(), links * static_cast<size_t>(qps));
    // The acceptor's side: the links the HELLO names.
    std::vector<Route> back;
    for (size_t l = 0; l < hello.links.size(); ++l) back.push_back(fakeRoute(static_cast<int>(l), ip(static_cast<int>(l), 2), ip(static_cast<int>(l), 1)));
    ASSERT_EQ(tb.prepare(false, back, ConnOptions(), &recv, &accept), ncclSuccess);
    EXPECT_EQ(tb.activate(recv.get(), hello, &accept), ncclSuccess);
    EXPECT_EQ(ta.activate(send.get(), accept, nullptr), ncclSuccess);
    static_cast<Comm*>(send.get())->close();
    static_cast<Comm*>(recv.get())->close();
  }
  a.devices.clear();
  b.devices.clear();
}

}  // namespace
}  // namespace fake
}  // namespace mesh
