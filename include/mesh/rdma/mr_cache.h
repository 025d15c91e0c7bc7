// SPDX-License-Identifier: Apache-2.0
// Memory registration: NCCL's regMr/regMrDmaBuf/deregMr. A handle covers the buffer on the
// RDMA devices of the comm it was registered through (issue 32: registering every buffer on
// every device of a node with two Spark cables made four registrations, four times the
// pinned-memory accounting, of each): NCCL registers through the comm that uses the buffer
// (2.24 - 2.30 never read regIsGlobal; 2.20 - 2.23 share a registration across comms only when
// regIsGlobal is 1, and the plugin reports 0). A regMr without a known comm covers every
// device. Per device, a cache of page-aligned ranges with refcounts makes re-registering a
// (sub-)range a hit, whichever comm asks.
//
// Threads: any NCCL thread may register/deregister; the cache is guarded by a mutex (not on
// the hot path). The data path reads MrHandle::lkey/rkey without locks: they are immutable
// after regMr returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "err.h"
#include "mesh/discovery/nic_discovery.h"

namespace mesh {

constexpr int kMaxDevices = kMaxMeshDevices;  // discovery takes no more (nic_discovery.h)

enum class MemKind { Host, Cuda, Dmabuf };

// One verbs registration; the real one wraps an ibv_mr*, tests use fakes.
struct Registration {
  void* mr = nullptr;  // ibv_mr* in production
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

// What the cache asks of the device: register / deregister one page-aligned range.
struct Registrar {
  // Returns false and sets *error on failure (message names the cause: memlock limit with
  // the current value, peermem missing for CUDA memory, ...).
  std::function<bool(uintptr_t start, size_t len, MemKind kind, int dmabufFd, uint64_t dmabufOffset,
                     Registration* out, std::string* error)>
      reg;
  std::function<void(const Registration&)> dereg;
};

// Page-aligned range cache of one device. Pure logic around the Registrar; unit-tested.
// pageSize: 0 means the system's (mesh/platform/page.h); tests pass 4, 16 and 64 KiB.
class RegCache {
 public:
  explicit RegCache(Registrar registrar, size_t pageSize = 0);
  ~RegCache();  // deregisters whatever is left

  // Finds a cached range covering [addr, addr+size) or registers the page-aligned range.
  // DMA-BUF registrations are never shared (the fd/offset identify them, not the VA).
  ncclResult_t acquire(uintptr_t addr, size_t size, MemKind kind, int dmabufFd, uint64_t dmabufOffset,
                       const Registration** out, std::string* error);
  // Drops one reference to the entry returned by acquire(); deregisters at zero.
  void release(const Registration* reg);

  size_t entryCount() const;
  size_t hits() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return hits_;
  }

 private:
  struct Entry {
    uintptr_t start;
    size_t len;
    MemKind kind;
    int refs;
    Registration reg;
  };
  Registrar registrar_;
  size_t pageSize_;
  mutable std::mutex mutex_;
  std::multimap<uintptr_t, std::unique_ptr<Entry>> entries_;  // by start address
  size_t hits_ = 0;
};

// What regMr hands NCCL. Immutable once returned.
struct MrHandle {
  uintptr_t addr = 0;
  size_t size = 0;
  MemKind kind = MemKind::Host;
  int ndevs = 0;                               // registrations made (devices covered)
  const Registration* regs[kMaxDevices] = {};  // per discovered device index; nullptr: not covered
  uint32_t lkey[kMaxDevices] = {};
  uint32_t rkey[kMaxDevices] = {};
};

// Owns one RegCache per RDMA device of the node and builds MrHandles across them.
class MrRegistry {
 public:
  explicit MrRegistry(std::vector<Registrar> perDevice);
  // Registers on `devices` (device indexes; empty: every device).
  ncclResult_t reg(void* data, size_t size, MemKind kind, int dmabufFd, uint64_t dmabufOffset,
                   const std::vector<int>& devices, MrHandle** out);
  ncclResult_t dereg(MrHandle* handle);
  int deviceCount() const { return static_cast<int>(caches_.size()); }
  const RegCache& cache(int dev) const { return *caches_[dev]; }

 private:
  std::vector<std::unique_ptr<RegCache>> caches_;
};

class VerbsDevice;
// The production registrar of one device: ibv_reg_mr_iova2 with relaxed ordering when
// rdma-core has it and `relaxedOrdering` allows it (else ibv_reg_mr), ibv_reg_dmabuf_mr for
// DMA-BUF (relaxed ordering on the same terms); access LOCAL_WRITE | REMOTE_WRITE |
// REMOTE_READ. Failures explain the likely cause (RLIMIT_MEMLOCK with its current value for
// ENOMEM/EPERM on host memory, nvidia-peermem missing for CUDA memory).
Registrar verbsRegistrar(const VerbsDevice* device, bool relaxedOrdering = true);
// Whether NCCL's buffers are registered with relaxed ordering on `device` (for the init log).
bool usesRelaxedOrdering(const VerbsDevice* device, bool allowed);

}  // namespace mesh
