// SPDX-License-Identifier: Apache-2.0
// The CUDA driver's answers about GPUDirect RDMA and DMA-BUF (mesh/platform/cuda_caps.h).
#include "mesh/platform/cuda_caps.h"

#include <dlfcn.h>

#include <cstdio>

namespace mesh {

bool GpuCaps::anyGdr() const {
  for (const Gpu& g : gpus) {
    if (g.gdr) return true;
  }
  return false;
}

bool GpuCaps::anyDmabuf() const {
  for (const Gpu& g : gpus) {
    if (g.dmabuf) return true;
  }
  return false;
}

std::string GpuCaps::describe() const {
  if (!known()) return "unknown (" + why + ")";
  std::string out;
  for (const Gpu& g : gpus) {
    if (!out.empty()) out += "; ";
    out += g.name + ": GPUDirect RDMA " + (g.gdr ? "yes" : "no") + ", DMA-BUF " + (g.dmabuf ? "yes" : "no");
    if (g.integrated) out += ", integrated (shares host memory)";
  }
  return out;
}

GpuCaps queryGpuCaps(const std::string& library) {
  GpuCaps caps;
  caps.library = library;
  // RTLD_NOW | RTLD_LOCAL: nothing of the driver leaks into the global scope. The handle is
  // kept: NCCL and the CUDA runtime hold the driver anyway, and unloading it is not safe.
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    caps.why = "cannot load " + library + (err != nullptr ? std::string(": ") + err : std::string());
    return caps;
  }
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  using GetFn = int (*)(int*, int);
  using AttrFn = int (*)(int*, int, int);
  using NameFn = int (*)(char*, int, int);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  auto get = reinterpret_cast<GetFn>(dlsym(lib, "cuDeviceGet"));
  auto attr = reinterpret_cast<AttrFn>(dlsym(lib, "cuDeviceGetAttribute"));
  auto name = reinterpret_cast<NameFn>(dlsym(lib, "cuDeviceGetName"));
  if (init == nullptr || count == nullptr || get == nullptr || attr == nullptr) {
    caps.why = library + " lacks cuInit/cuDeviceGetCount/cuDeviceGet/cuDeviceGetAttribute";
    return caps;
  }
  int rc = init(0);
  if (rc != 0) {
    caps.why = "cuInit returned " + std::to_string(rc) + (rc == 100 ? " (no CUDA-capable device)" : "");
    return caps;
  }
  int n = 0;
  rc = count(&n);
  if (rc != 0 || n <= 0) {
    caps.why = rc != 0 ? "cuDeviceGetCount returned " + std::to_string(rc) : std::string("no GPU");
    return caps;
  }
  for (int i = 0; i < n; ++i) {
    int dev = 0;
    if (get(&dev, i) != 0) continue;
    GpuCaps::Gpu g;
    char buf[256] = {};
    if (name != nullptr && name(buf, sizeof(buf) - 1, dev) == 0) g.name = buf;
    if (g.name.empty()) g.name = "GPU " + std::to_string(i);
    int v = 0;
    rc = attr(&v, kCuAttrGpuDirectRdmaSupported, dev);
    if (rc != 0) {
      // A driver older than CUDA 11.3 has no such attribute (CUDA_ERROR_INVALID_VALUE): it is
      // no "no". NCCL then asks the NIC by registering GPU memory (src/plugin/net.cc
      // ncclGpuGdrSupport), so the NIC's answer stands here too.
      caps.gpus.clear();
      caps.why = "cuDeviceGetAttribute(GPU_DIRECT_RDMA_SUPPORTED) returned " + std::to_string(rc) +
                 " (a driver older than CUDA 11.3?)";
      return caps;
    }
    g.gdr = v != 0;
    v = 0;
    // No DMA-BUF attribute (a driver older than 11.7) is a "no", as NCCL takes it.
    g.dmabuf = attr(&v, kCuAttrDmaBufSupported, dev) == 0 && v != 0;
    v = 0;
    g.integrated = attr(&v, kCuAttrIntegrated, dev) == 0 && v != 0;
    caps.gpus.push_back(g);
  }
  if (caps.gpus.empty()) {
    caps.why = "cuDeviceGet failed for every GPU";
    return caps;
  }
  caps.state = GpuCaps::State::Known;
  return caps;
}

}  // namespace mesh
