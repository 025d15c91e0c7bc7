// SPDX-License-Identifier: Apache-2.0
// Memory registration: per-device page-aligned caches behind NCCL's regMr/deregMr, and the
// production Registrar that turns a range into an ibv_mr through the loaded VerbsApi table
// (never verbs.h's inline wrappers: the plugin must not link against libibverbs).
#include "mesh/rdma/mr_cache.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "mesh/discovery/nic_discovery.h"
#include "mesh/platform/log.h"
#include "mesh/platform/page.h"
#include "mesh/platform/sysinfo.h"
#include "mesh/platform/verbs_loader.h"

namespace mesh {

// --- RegCache ---------------------------------------------------------------------------

RegCache::RegCache(Registrar registrar, size_t pageSize)
    : registrar_(std::move(registrar)), pageSize_(pageSize == 0 ? systemPageSize() : pageSize) {}

RegCache::~RegCache() {
  // Leftovers mean NCCL never deregistered them (e.g. the process tears the plugin down
  // mid-job); their PD is about to go, so drop them now rather than leak MRs into it.
  for (auto& kv : entries_) registrar_.dereg(kv.second->reg);
}

ncclResult_t RegCache::acquire(uintptr_t addr, size_t size, MemKind kind, int dmabufFd,
                               uint64_t dmabufOffset, const Registration** out,
                               std::string* error) {
  // NCCL registers zero-sized buffers at times; one page keeps the MR valid and harmless.
  // Whole pages of the system's size: the kernel pins, and rdma-core's fork protection
  // (MADV_DONTFORK) marks, whole pages anyway; the cache must agree on what it covers.
  size_t span = size == 0 ? 1 : size;
  PageSpan pages = pageSpan(addr, size, pageSize_);
  if (out == nullptr || pages.len == 0) {
    if (error) *error = "invalid registration range (address wraps around or no output)";
    return ncclInvalidArgument;
  }
  uintptr_t start = pages.start;
  uintptr_t end = pages.start + pages.len;
  size_t len = pages.len;

  std::lock_guard<std::mutex> lock(mutex_);
  if (kind != MemKind::Dmabuf) {
    // Any entry starting at or before `start` may cover the range; a later one cannot.
    auto last = entries_.upper_bound(start);
    for (auto it = entries_.begin(); it != last; ++it) {
      Entry& e = *it->second;
      if (e.kind == kind && e.start + e.len >= end) {
        ++e.refs;
        ++hits_;
        *out = &e.reg;
        return ncclSuccess;
      }
    }
  } else {
    // The MR maps fd offsets to iovas one for one, so moving the start down a few bytes
    // must move the offset down as much; an fd offset too small to allow that keeps the
    // caller's exact range (the kernel pins whole pages either way).
    uint64_t shift = addr - start;
    if (dmabufOffset >= shift) {
      dmabufOffset -= shift;
    } else {
      start = addr;
      len = span;
    }
  }

  auto entry = std::make_unique<Entry>(Entry{start, len, kind, 1, Registration{}});
  std::string why;
  if (!registrar_.reg(start, len, kind, dmabufFd, dmabufOffset, &entry->reg, &why)) {
    if (error) *error = why.empty() ? "memory registration failed" : why;
    return ncclSystemError;
  }
  *out = &entry->reg;
  entries_.emplace(start, std::move(entry));
  return ncclSuccess;
}

void RegCache::release(const Registration* reg) {
  if (reg == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    Entry& e = *it->second;
    if (&e.reg != reg) continue;
    if (--e.refs == 0) {
      registrar_.dereg(e.reg);
      entries_.erase(it);
    }
    return;
  }
  // Not ours: the caller (MrRegistry) only hands back what acquire() returned, so this is
  // a double dereg by NCCL; ignoring it beats deregistering someone else's MR.
}

size_t RegCache::entryCount() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

// --- MrRegistry ---------------------------------------------------------------------------

MrRegistry::MrRegistry(std::vector<Registrar> perDevice) {
  caches_.reserve(perDevice.size());
  for (Registrar& r : perDevice) caches_.push_back(std::make_unique<RegCache>(std::move(r)));
}

namespace {

const char* kindName(MemKind kind) {
  switch (kind) {
    case MemKind::Host: return "host";
    case MemKind::Cuda: return "CUDA";
    case MemKind::Dmabuf: return "DMA-BUF";
  }
  return "unknown";
}

}  // namespace

ncclResult_t MrRegistry::reg(void* data, size_t size, MemKind kind, int dmabufFd,
                             uint64_t dmabufOffset, const std::vector<int>& devices, MrHandle** out) {
  if (out == nullptr || data == nullptr) {
    MESH_WARN("regMr: %s (data %p, size %zu)", out == nullptr ? "no output handle" : "null buffer",
              data, size);
    return ncclInvalidArgument;
  }
  *out = nullptr;
  int ndevs = deviceCount();
  if (ndevs == 0 || ndevs > kMaxDevices) {
    MESH_WARN("regMr: cannot register memory on %d RDMA devices (supported: 1..%d); "
              "the plugin found no usable device or too many",
              ndevs, kMaxDevices);
    return ncclInternalError;
  }
  std::vector<int> which = devices;
  if (which.empty()) {
    for (int d = 0; d < ndevs; ++d) which.push_back(d);
  }
  for (int d : which) {
    if (d < 0 || d >= ndevs) {
      MESH_WARN("regMr: device %d does not exist (%d devices)", d, ndevs);
      return ncclInternalError;
    }
  }
  auto handle = std::make_unique<MrHandle>();
  handle->addr = reinterpret_cast<uintptr_t>(data);
  handle->size = size;
  handle->kind = kind;
  for (size_t i = 0; i < which.size(); ++i) {
    int d = which[i];
    if (handle->regs[d] != nullptr) continue;  // listed twice
    std::string error;
    ncclResult_t res = caches_[d]->acquire(handle->addr, size, kind, dmabufFd, dmabufOffset,
                                           &handle->regs[d], &error);
    if (res != ncclSuccess) {
      MESH_WARN("regMr of %s memory %p (%zu bytes) failed on device %d of %d: %s",
                kindName(kind), data, size, d, ndevs, error.c_str());
      // Every device asked for or none: a handle missing one would fail later, far from here.
      for (int undo = 0; undo < ndevs; ++undo) {
        if (handle->regs[undo] != nullptr && undo != d) caches_[undo]->release(handle->regs[undo]);
      }
      return ncclSystemError;
    }
    handle->lkey[d] = handle->regs[d]->lkey;
    handle->rkey[d] = handle->regs[d]->rkey;
    ++handle->ndevs;
  }
  *out = handle.release();
  return ncclSuccess;
}

ncclResult_t MrRegistry::dereg(MrHandle* handle) {
  if (handle == nullptr) {
    MESH_WARN("deregMr: null handle");
    return ncclInvalidArgument;
  }
  // Every device the handle covers, even if one complains.
  for (int d = kMaxDevices - 1; d >= 0; --d) {
    if (handle->regs[d] != nullptr && d < deviceCount()) caches_[d]->release(handle->regs[d]);
  }
  delete handle;
  return ncclSuccess;
}

// --- verbs registrar ------------------------------------------------------------------

namespace {

constexpr int kBaseAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// The likely cause behind a failed registration, phrased as what to do about it.
std::string registrationHint(MemKind kind, int err) {
  if (kind == MemKind::Cuda) {
    return "; on a discrete GPU, GPU memory registration needs the nvidia-peermem kernel module "
           "(modprobe nvidia-peermem) or DMA-BUF; a GPU without GPUDirect (DGX Spark's GB10) cannot be "
           "registered at all, and NCCL stages through host memory there (nccl-mesh-info --doctor: gpudirect)";
  }
  if (kind == MemKind::Dmabuf) {
    return "; DMA-BUF registration needs kernel and driver support (Linux 5.12+, a provider "
           "with dma-buf MRs)";
  }
  if (err != ENOMEM && err != EPERM && err != EFAULT) return "";
  return pinningAdviceForThisProcess();
}

std::string describeFailure(const VerbsDevice& dev, const char* call, uintptr_t start,
                            size_t len, MemKind kind, int err) {
  char range[96];
  std::snprintf(range, sizeof(range), "%#llx (%zu bytes)", static_cast<unsigned long long>(start),
                len);
  return std::string(call) + " on " + dev.name() + " for " + kindName(kind) + " memory at " +
         range + " failed: " + std::strerror(err) + " (errno " + std::to_string(err) + ")" +
         registrationHint(kind, err);
}

bool verbsReg(const VerbsDevice* dev, uintptr_t start, size_t len, MemKind kind, int fd,
              uint64_t offset, bool relaxedOrdering, Registration* out, std::string* error) {
  if (dev == nullptr || dev->pd() == nullptr) {
    *error = "memory registration on a device that is not open";
    return false;
  }
  const VerbsApi& api = dev->api();
  // Relaxed ordering lets PCIe reorder the NIC's writes into the buffer (the CQE, strictly
  // ordered, still comes after them); it is an optional access bit (ignored where
  // unsupported), usable only through the iova2-era entry points. As NCCL's IB transport:
  // NCCL's buffers only; control memory the peer writes and we poll is registered without it.
  bool ro = usesRelaxedOrdering(dev, relaxedOrdering);
  int access = kBaseAccess | (ro ? IBV_ACCESS_RELAXED_ORDERING : 0);
  ibv_mr* mr = nullptr;
  const char* call = nullptr;
  errno = 0;
  if (kind == MemKind::Dmabuf) {
    call = "ibv_reg_dmabuf_mr";
    if (api.regDmabufMr == nullptr) {
      *error = "cannot register DMA-BUF memory on " + dev->name() +
               ": rdma-core lacks ibv_reg_dmabuf_mr (needs rdma-core 34+)";
      return false;
    }
    mr = api.regDmabufMr(dev->pd(), offset, len, start, fd, access);
  } else if (ro) {
    call = "ibv_reg_mr_iova2";
    mr = api.regMrIova2(dev->pd(), reinterpret_cast<void*>(start), len, start,
                        static_cast<unsigned int>(access));
  } else {
    call = "ibv_reg_mr";
    mr = api.regMr(dev->pd(), reinterpret_cast<void*>(start), len, access);
  }
  if (mr == nullptr) {
    int err = errno != 0 ? errno : EINVAL;
    *error = describeFailure(*dev, call, start, len, kind, err);
    return false;
  }
  out->mr = mr;
  out->lkey = mr->lkey;
  out->rkey = mr->rkey;
  return true;
}

void verbsDereg(const VerbsDevice* dev, const Registration& reg) {
  if (dev == nullptr || reg.mr == nullptr) return;
  int rc = dev->api().deregMr(static_cast<ibv_mr*>(reg.mr));
  if (rc != 0) {
    // rdma-core returns the errno value; a busy MR usually means a QP still references it.
    MESH_WARN("ibv_dereg_mr on %s (lkey %#x) failed: %s", dev->name().c_str(), reg.lkey,
              std::strerror(rc));
  }
}

}  // namespace

bool usesRelaxedOrdering(const VerbsDevice* device, bool allowed) {
  return allowed && device != nullptr && device->api().regMrIova2 != nullptr;
}

Registrar verbsRegistrar(const VerbsDevice* device, bool relaxedOrdering) {
  Registrar r;
  r.reg = [device, relaxedOrdering](uintptr_t start, size_t len, MemKind kind, int fd, uint64_t offset,
                                    Registration* out, std::string* error) {
    return verbsReg(device, start, len, kind, fd, offset, relaxedOrdering, out, error);
  };
  r.dereg = [device](const Registration& reg) { verbsDereg(device, reg); };
  return r;
}

}  // namespace mesh
