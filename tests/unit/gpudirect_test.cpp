// SPDX-License-Identifier: Apache-2.0
// What the GPUs say about GPUDirect, through a stand-in CUDA driver (cuda_standin.cpp), and
// what the plugin offers NCCL for each answer (issue 32: a DGX Spark's GB10 says no to both
// GPUDirect RDMA and DMA-BUF while its ConnectX-7 says yes to DMA-BUF).
#include <gtest/gtest.h>

#include <cstdlib>

#include "mesh/platform/cuda_caps.h"
#include "mesh/plugin/net_devices.h"

namespace mesh {
namespace {

class FakeGpus {
 public:
  FakeGpus(const char* gpus, const char* init = "0") {
    setenv("MESH_FAKE_CUDA_GPUS", gpus, 1);
    setenv("MESH_FAKE_CUDA_INIT", init, 1);
  }
  ~FakeGpus() {
    unsetenv("MESH_FAKE_CUDA_GPUS");
    unsetenv("MESH_FAKE_CUDA_INIT");
  }
};

TEST(CudaCaps, Gb10SaysNoToBoth) {
  FakeGpus env("NVIDIA GB10:gdr=0:dmabuf=0:integrated=1");
  GpuCaps c = queryGpuCaps(MESH_CUDA_STANDIN);
  ASSERT_TRUE(c.known()) << c.why;
  ASSERT_EQ(c.gpus.size(), 1u);
  EXPECT_FALSE(c.anyGdr());
  EXPECT_FALSE(c.anyDmabuf());
  EXPECT_EQ(c.describe(), "NVIDIA GB10: GPUDirect RDMA no, DMA-BUF no, integrated (shares host memory)");
}

TEST(CudaCaps, DiscreteGpusAnswerEach) {
  FakeGpus env("H100:gdr=1:dmabuf=1,L4:gdr=0:dmabuf=1");
  GpuCaps c = queryGpuCaps(MESH_CUDA_STANDIN);
  ASSERT_TRUE(c.known()) << c.why;
  ASSERT_EQ(c.gpus.size(), 2u);
  EXPECT_TRUE(c.anyGdr());
  EXPECT_TRUE(c.anyDmabuf());
  EXPECT_FALSE(c.gpus[1].gdr);
}

TEST(CudaCaps, NoDriverNoInitNoGpuAreUnknownWithTheReason) {
  GpuCaps missing = queryGpuCaps("/nonexistent/libcuda.so.1");
  EXPECT_FALSE(missing.known());
  EXPECT_NE(missing.why.find("cannot load /nonexistent/libcuda.so.1"), std::string::npos) << missing.why;
  {
    FakeGpus env("GB10", "100");
    GpuCaps c = queryGpuCaps(MESH_CUDA_STANDIN);
    EXPECT_FALSE(c.known());
    EXPECT_NE(c.why.find("cuInit returned 100 (no CUDA-capable device)"), std::string::npos) << c.why;
  }
  {
    FakeGpus env("");
    GpuCaps c = queryGpuCaps(MESH_CUDA_STANDIN);
    EXPECT_FALSE(c.known());
    EXPECT_EQ(c.why, "no GPU");
  }
}

GpuCaps caps(std::vector<GpuCaps::Gpu> gpus) {
  GpuCaps c;
  c.state = GpuCaps::State::Known;
  c.gpus = std::move(gpus);
  return c;
}

TEST(GpuDirectDecision, UnknownGpusLeaveTheNicsAnswer) {
  GpuDirectDecision d = decideGpuDirect(GpuCaps(), true, true);
  EXPECT_TRUE(d.cuda);
  EXPECT_TRUE(d.dmabuf);
  EXPECT_TRUE(d.flushQps);
  EXPECT_TRUE(d.info.empty());
}

// A driver older than CUDA 11.3 has no GPUDirect RDMA attribute: its error was read as "no",
// and an A100 or V100 with nv_peer_mem, where NCCL's IB transport uses GPUDirect, got host
// memory only ("expected on this hardware (DGX Spark's GB10...)"). NCCL then asks the NIC
// (src/plugin/net.cc ncclGpuGdrSupport): the GPUs' answer is unknown, the NIC's stands. A
// driver of 11.3..11.6 has that attribute but none for DMA-BUF: a "no", as NCCL takes it.
TEST(CudaCaps, ADriverWithoutTheGpuDirectAttributeIsNoAnswer) {
  FakeGpus env("A100:gdr=1:dmabuf=0");
  setenv("MESH_FAKE_CUDA_DRIVER", "11020", 1);
  GpuCaps c = queryGpuCaps(MESH_CUDA_STANDIN);
  EXPECT_FALSE(c.known());
  EXPECT_NE(c.why.find("GPU_DIRECT_RDMA_SUPPORTED) returned 1 (a driver older than CUDA 11.3?)"), std::string::npos)
      << c.why;
  GpuDirectDecision d = decideGpuDirect(c, true, false);
  EXPECT_TRUE(d.cuda);
  EXPECT_FALSE(d.hostOnly);
  setenv("MESH_FAKE_CUDA_DRIVER", "11040", 1);
  c = queryGpuCaps(MESH_CUDA_STANDIN);
  ASSERT_TRUE(c.known()) << c.why;
  EXPECT_TRUE(c.anyGdr());
  EXPECT_FALSE(c.anyDmabuf());
  unsetenv("MESH_FAKE_CUDA_DRIVER");
}

// Flush QPs only where GPU memory can be registered, and never with NCCL_GDR_FLUSH_DISABLE:
// NCCL's IB transport builds them only then (2.30.7 net_ib/connect.cc flushEnabled). Each
// receive comm built one per device anyway: an RC QP, 256 send WRs and 257 CQ entries unused.
TEST(GpuDirectDecision, FlushQpsOnlyWhereGpuMemoryCanBeRegistered) {
  EXPECT_FALSE(decideGpuDirect(GpuCaps(), false, false).flushQps) << "no peermem, no DMA-BUF: nothing to flush";
  EXPECT_FALSE(decideGpuDirect(caps({{"H100", true, true, false}}), false, false).flushQps);
  EXPECT_TRUE(decideGpuDirect(caps({{"H100", true, true, false}}), true, false).flushQps);
  EXPECT_TRUE(receiverFlushQps(true, false, false));
  EXPECT_FALSE(receiverFlushQps(true, true, false)) << "NCCL_GDR_FLUSH_DISABLE: no flush is ever posted";
  EXPECT_TRUE(receiverFlushQps(false, true, true)) << "NCCL_MESH_FORCE_FLUSH flushes host memory too";
  EXPECT_FALSE(receiverFlushQps(false, false, false));
}

TEST(GpuDirectDecision, Gb10IsHostMemoryOnlyWithoutFlushQps) {
  // The Spark's ConnectX-7 answers the DMA-BUF probe; peermem cannot load there.
  GpuDirectDecision d = decideGpuDirect(caps({{"NVIDIA GB10", false, false, true}}), false, true);
  EXPECT_FALSE(d.cuda);
  EXPECT_FALSE(d.dmabuf);
  EXPECT_FALSE(d.flushQps);
  EXPECT_TRUE(d.hostOnly);
  EXPECT_NE(d.info.find("no GPU here supports GPUDirect RDMA or DMA-BUF (NVIDIA GB10"), std::string::npos) << d.info;
  EXPECT_NE(d.info.find("expected on this hardware"), std::string::npos) << d.info;
  std::vector<NetDevice> devs(2);
  for (NetDevice& n : devs) n.ptrSupport = kPtrHost | kPtrCuda | kPtrDmabuf;
  applyGpuDirect(d, &devs);
  for (const NetDevice& n : devs) EXPECT_EQ(n.ptrSupport, kPtrHost);
}

TEST(GpuDirectDecision, EachSideMustAllowIt) {
  // A discrete GPU with both: the NIC decides (no peermem: DMA-BUF only).
  GpuDirectDecision d = decideGpuDirect(caps({{"H100", true, true, false}}), false, true);
  EXPECT_FALSE(d.cuda);
  EXPECT_TRUE(d.dmabuf);
  EXPECT_TRUE(d.flushQps);
  EXPECT_TRUE(d.info.empty());
  // GPUDirect RDMA but no DMA-BUF export (an older driver): peermem's CUDA only.
  d = decideGpuDirect(caps({{"A100", true, false, false}}), true, true);
  EXPECT_TRUE(d.cuda);
  EXPECT_FALSE(d.dmabuf);
  EXPECT_TRUE(d.flushQps);
  EXPECT_NE(d.info.find("the GPUs allow GPUDirect RDMA (A100"), std::string::npos) << d.info;
  // Any GPU that allows it is enough (NCCL checks each GPU-NIC pair itself).
  d = decideGpuDirect(caps({{"GB10", false, false, true}, {"H100", true, true, false}}), true, true);
  EXPECT_TRUE(d.cuda);
  EXPECT_TRUE(d.dmabuf);
}

}  // namespace
}  // namespace mesh
