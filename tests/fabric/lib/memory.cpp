// SPDX-License-Identifier: Apache-2.0
// Protection domains and memory regions: keys, access flags, range checks, the locked-
// memory limit as the kernel applies it, and the emulated DMA copies.
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "fabric.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#if defined(__SANITIZE_THREAD__)
#define MESHFAB_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MESHFAB_TSAN 1
#endif
#endif

#ifdef MESHFAB_TSAN
// The TSan runtime's dynamic annotations: accesses between Begin and End are not recorded.
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

namespace meshfab {

namespace {
// The emulated DMA engine's copy. Under TSan it is not recorded at all: the NIC is not a
// thread of the program on hardware (tests/fabric/tsan.supp says why). The suppressions
// there stay as a second line, but they match only while the writer's stack is still in
// TSan's history, which long runs (many comms, many relayed chunks) outlive.
inline void dmaCopy(void* dst, const void* src, size_t n) {
#ifdef MESHFAB_TSAN
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  memcpy(dst, src, n);
  AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#else
  memcpy(dst, src, n);
#endif
}
}  // namespace

__attribute__((noinline)) void dmaWrite(void* dst, const void* src, size_t n) {
  if (n != 0) dmaCopy(dst, src, n);
}

__attribute__((noinline)) void dmaRead(void* dst, const void* src, size_t n) {
  if (n != 0) dmaCopy(dst, src, n);
}

Mr* Fabric::findMr(uint32_t key) const {
  auto it = mrs.find(key);
  return it == mrs.end() ? nullptr : it->second;
}

char* translate(Fabric* f, Pd* pd, uint32_t key, uint64_t va, uint64_t len, int access) {
  static char zeroLength;
  if (len == 0) return &zeroLength;  // a zero-length access checks no key (IBA 9.4.4)
  Mr* mr = f->findMr(key);
  if (mr == nullptr || mr->pd != pd || (mr->access & access) != access) return nullptr;
  if (va < mr->iova || len > mr->mr.length || va - mr->iova > mr->mr.length - len) return nullptr;
  return static_cast<char*>(mr->mr.addr) + (va - mr->iova);
}

namespace {

constexpr int kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                             IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;

bool hasCapIpcLock() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32));
}

uint64_t gPinned = 0;  // page-rounded bytes of every live MR (under Fabric::mu)

uint64_t pinnedBytes(const void* addr, size_t len) {
  uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t start = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(addr) + len + page - 1) & ~(page - 1);
  return end - start;
}

ibv_mr* registerMr(ibv_pd* ipd, void* addr, size_t len, uint64_t iova, unsigned access) {
  Fabric* f = Fabric::get();
  Pd* pd = reinterpret_cast<Pd*>(ipd);
  unsigned required = access & ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);  // e.g. RELAXED_ORDERING: ignored
  if ((required & ~static_cast<unsigned>(kKnownAccess)) != 0 || len == 0 || addr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  // IBA 10.6.3.1: remote write or atomic access needs local write.
  if ((required & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(required & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;
    return nullptr;
  }
  // The kernel pins the pages: an unmapped range fails with EFAULT.
  uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  void* start = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(addr) & ~(page - 1));
  if (msync(start, pinnedBytes(addr, len), MS_ASYNC) != 0) {
    errno = EFAULT;
    return nullptr;
  }
  std::lock_guard<std::mutex> lk(f->mu);
  uint64_t pin = pinnedBytes(addr, len);
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
      gPinned + pin > lim.rlim_cur && !hasCapIpcLock()) {
    errno = ENOMEM;  // what ib_umem_get returns over RLIMIT_MEMLOCK
    return nullptr;
  }
  static std::mt19937 rng(static_cast<unsigned>(getpid() ^ time(nullptr)));
  uint32_t key;
  do {
    key = ((++f->nextKey & 0xffffff) << 8) | (rng() & 0xff);
  } while (key == 0 || f->mrs.count(key) != 0);
  auto* mr = new Mr();
  mr->pd = pd;
  mr->iova = iova;
  mr->access = static_cast<int>(required);
  mr->mr.context = pd->pd.context;
  mr->mr.pd = ipd;
  mr->mr.addr = addr;
  mr->mr.length = len;
  mr->mr.handle = key;
  mr->mr.lkey = key;
  mr->mr.rkey = key;
  f->mrs[key] = mr;
  pd->users++;
  gPinned += pin;
  f->devStats(pd->ctx->dev)->res[kResMr]++;
  return &mr->mr;
}

}  // namespace

void Fabric::forgetMr(Mr* mr) {
  mrs.erase(mr->mr.lkey);
  gPinned -= pinnedBytes(mr->mr.addr, mr->mr.length);
  mr->pd->users--;
  devStats(mr->pd->ctx->dev)->res[kResMr]--;
}

}  // namespace meshfab

using namespace meshfab;

extern "C" {

ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  Fabric* f = Fabric::get();
  std::lock_guard<std::mutex> lk(f->mu);
  auto* pd = new Pd();
  pd->ctx = contextOf(ctx);
  pd->pd.context = ctx;
  pd->pd.handle = ++f->nextKey;
  f->devStats(pd->ctx->dev)->res[kResPd]++;
  return &pd->pd;
}

int ibv_dealloc_pd(ibv_pd* ipd) {
  Fabric* f = Fabric::get();
  Pd* pd = reinterpret_cast<Pd*>(ipd);
  std::lock_guard<std::mutex> lk(f->mu);
  if (pd->users != 0) return EBUSY;
  f->devStats(pd->ctx->dev)->res[kResPd]--;
  delete pd;
  return 0;
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t len, int access) {
  return registerMr(pd, addr, len, reinterpret_cast<uintptr_t>(addr), static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t len, uint64_t iova, int access) {
  return registerMr(pd, addr, len, iova, static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t len, uint64_t iova, unsigned int access) {
  return registerMr(pd, addr, len, iova, access);
}

// Host memory only: no DMA-BUF (EOPNOTSUPP is what NCCL and the plugin probe for).
// MESHFAB_DMABUF_PROBE=ebadf answers as a NIC with DMA-BUF support answers a probe with fd
// -1 (a DGX Spark's ConnectX-7): EBADF. Registration still fails: tests of what the plugin
// offers NCCL (the GPU side decides, issue 32) never register such memory.
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  const char* probe = getenv("MESHFAB_DMABUF_PROBE");
  errno = probe != nullptr && strcmp(probe, "ebadf") == 0 ? EBADF : EOPNOTSUPP;
  return nullptr;
}

int ibv_rereg_mr(ibv_mr*, int, ibv_pd*, void*, size_t, int) {
  errno = EOPNOTSUPP;
  return IBV_REREG_MR_ERR_INPUT;
}

int ibv_dereg_mr(ibv_mr* imr) {
  Fabric* f = Fabric::get();
  Mr* mr = reinterpret_cast<Mr*>(imr);
  std::lock_guard<std::mutex> lk(f->mu);
  f->forgetMr(mr);
  delete mr;
  return 0;
}

}  // extern "C"
