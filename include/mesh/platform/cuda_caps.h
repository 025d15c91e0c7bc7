// SPDX-License-Identifier: Apache-2.0
// What the GPUs of this machine can do with a NIC (issue 32): asks the CUDA driver
// (libcuda.so.1, dlopen'ed at run time: no build-time or link-time dependency, and a machine
// without it just gets "unknown") whether each GPU supports GPUDirect RDMA
// (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) and DMA-BUF export
// (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED), as NVIDIA advises. On a DGX Spark (GB10) both are
// no: cudaMalloc memory is not reachable by PCIe devices, and NCCL stages through host
// memory ("GPU Direct RDMA Disabled for HCA"). The NIC side (peermem, a DMA-BUF probe) says
// yes there, so only the GPU side can tell.
//
// NCCL has initialized CUDA before it initializes a net plugin, so the cuInit here costs
// nothing in NCCL's process; in a tool it initializes the driver.
#pragma once

#include <string>
#include <vector>

namespace mesh {

struct GpuCaps {
  enum class State { Unknown, Known };
  State state = State::Unknown;
  std::string why;                 // Unknown: why (no driver library, cuInit failed, no GPU)
  std::string library;             // the driver library asked
  struct Gpu {
    std::string name;
    bool gdr = false;              // GPUDirect RDMA
    bool dmabuf = false;           // DMA-BUF export
    bool integrated = false;       // shares the host's memory (GB10, Jetson)
  };
  std::vector<Gpu> gpus;           // Known: at least one
  bool known() const { return state == State::Known; }
  bool anyGdr() const;
  bool anyDmabuf() const;
  // "NVIDIA GB10: GPUDirect RDMA no, DMA-BUF no, integrated" per GPU, joined by "; ".
  std::string describe() const;
};

// Asks the driver at `library` (NCCL_MESH_CUDA_LIB; a path or a soname). Never fails: a
// missing library, a failing cuInit or no GPU give State::Unknown with the reason.
GpuCaps queryGpuCaps(const std::string& library);

// The CUDA attribute numbers (cuda.h, CUDA 11.3+ / 11.7+): kept here so that nothing needs
// cuda.h at build time.
constexpr int kCuAttrIntegrated = 18;
constexpr int kCuAttrGpuDirectRdmaSupported = 116;
constexpr int kCuAttrDmaBufSupported = 124;

}  // namespace mesh
