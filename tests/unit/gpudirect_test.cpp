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
