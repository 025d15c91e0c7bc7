// SPDX-License-Identifier: Apache-2.0
// A stand-in for the CUDA driver (libcuda.so.1), for tests of what the plugin does with its
// answers (mesh/platform/cuda_caps.h): the five calls the plugin makes, with GPUs described by
// the environment, so every combination can be tested where no GPU is (CI).
//   MESH_FAKE_CUDA_INIT=<code>   cuInit's result (default 0; 100 = CUDA_ERROR_NO_DEVICE)
//   MESH_FAKE_CUDA_GPUS=<list>   GPUs, comma-separated: NAME[:gdr=0|1][:dmabuf=0|1][:integrated=0|1]
//                                (default: none), e.g. "GB10:gdr=0:dmabuf=0:integrated=1"
//   MESH_FAKE_CUDA_DRIVER=<ver>  the driver's CUDA version (1000*major + 10*minor, default 13000):
//                                below 11030 there is no GPUDirect RDMA attribute, below 11070
//                                no DMA-BUF one (CUDA_ERROR_INVALID_VALUE, as a real old driver)
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Gpu {
  std::string name;
  int gdr = 0, dmabuf = 0, integrated = 0;
};

std::vector<Gpu> gpus() {
  std::vector<Gpu> out;
  const char* env = getenv("MESH_FAKE_CUDA_GPUS");
  std::string list = env != nullptr ? env : "";
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(pos, end - pos);
    pos = end + 1;
    Gpu g;
    size_t colon = item.find(':');
    g.name = item.substr(0, colon);
    while (colon != std::string::npos) {
      size_t next = item.find(':', colon + 1);
      std::string kv = item.substr(colon + 1, next == std::string::npos ? std::string::npos : next - colon - 1);
      colon = next;
      int v = kv.size() > 2 ? atoi(kv.substr(kv.find('=') + 1).c_str()) : 0;
      if (kv.rfind("gdr=", 0) == 0) g.gdr = v;
      if (kv.rfind("dmabuf=", 0) == 0) g.dmabuf = v;
      if (kv.rfind("integrated=", 0) == 0) g.integrated = v;
    }
    if (!g.name.empty()) out.push_back(g);
  }
  return out;
}

}  // namespace

extern "C" {
__attribute__((visibility("default"))) int cuInit(unsigned) {
  const char* rc = getenv("MESH_FAKE_CUDA_INIT");
  return rc != nullptr ? atoi(rc) : 0;
}
__attribute__((visibility("default"))) int cuDeviceGetCount(int* n) {
  *n = static_cast<int>(gpus().size());
  return 0;
}
__attribute__((visibility("default"))) int cuDeviceGet(int* dev, int ordinal) {
  if (ordinal < 0 || ordinal >= static_cast<int>(gpus().size())) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *dev = ordinal;
  return 0;
}
__attribute__((visibility("default"))) int cuDeviceGetName(char* name, int len, int dev) {
  std::vector<Gpu> g = gpus();
  if (dev < 0 || dev >= static_cast<int>(g.size())) return 101;
  snprintf(name, static_cast<size_t>(len), "%s", g[static_cast<size_t>(dev)].name.c_str());
  return 0;
}
__attribute__((visibility("default"))) int cuDeviceGetAttribute(int* value, int attr, int dev) {
  std::vector<Gpu> g = gpus();
  if (dev < 0 || dev >= static_cast<int>(g.size())) return 101;
  const Gpu& x = g[static_cast<size_t>(dev)];
  const char* env = getenv("MESH_FAKE_CUDA_DRIVER");
  int driver = env != nullptr ? atoi(env) : 13000;
  if ((attr == 116 && driver < 11030) || (attr == 124 && driver < 11070)) return 1;
  switch (attr) {
    case 18: *value = x.integrated; return 0;   // CU_DEVICE_ATTRIBUTE_INTEGRATED
    case 116: *value = x.gdr; return 0;         // ..._GPU_DIRECT_RDMA_SUPPORTED
    case 124: *value = x.dmabuf; return 0;      // ..._DMA_BUF_SUPPORTED
    default: return 1;                          // CUDA_ERROR_INVALID_VALUE
  }
}
}
