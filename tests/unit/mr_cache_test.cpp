// SPDX-License-Identifier: Apache-2.0
#include "mesh/rdma/mr_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "mesh/discovery/nic_discovery.h"

namespace mesh {
namespace {

// A device without RDMA: counts calls and hands out increasing keys from `keyBase`.
class FakeDevice {
 public:
  struct Call {
    uintptr_t start;
    size_t len;
    MemKind kind;
    int fd;
    uint64_t offset;
  };

  explicit FakeDevice(uint32_t keyBase = 0x100) : nextKey_(keyBase) {}

  Registrar registrar() {
    Registrar r;
    r.reg = [this](uintptr_t start, size_t len, MemKind kind, int fd, uint64_t offset,
                   Registration* out, std::string* error) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (fail_) {
        *error = "fake: RLIMIT_MEMLOCK too low";
        return false;
      }
      calls_.push_back({start, len, kind, fd, offset});
      uint32_t key = nextKey_++;
      out->mr = reinterpret_cast<void*>(static_cast<uintptr_t>(key));
      out->lkey = key;
      out->rkey = key | 0x80000000u;
      ++live_;
      return true;
    };
    r.dereg = [this](const Registration& reg) {
      std::lock_guard<std::mutex> lock(mutex_);
      EXPECT_NE(reg.mr, nullptr);
      ++deregs_;
      --live_;
    };
    return r;
  }

  void setFail(bool fail) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_ = fail;
  }
  int regs() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(calls_.size());
  }
  int deregs() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return deregs_;
  }
  int live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_;
  }
  Call call(size_t i) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_.at(i);
  }

 private:
  mutable std::mutex mutex_;
  uint32_t nextKey_;
  std::vector<Call> calls_;
  int deregs_ = 0;
  int live_ = 0;
  bool fail_ = false;
};

// The cases below are written in 4 KiB pages; page_test.cpp runs the rounding with 16 and
// 64 KiB pages too (aarch64 kernels), and the default (0) takes the system's page size.
constexpr size_t kPage4K = size_t{4} << 10;

const Registration* acquireOk(RegCache* cache, uintptr_t addr, size_t size,
                              MemKind kind = MemKind::Host, int fd = -1, uint64_t offset = 0) {
  const Registration* reg = nullptr;
  std::string error;
  EXPECT_EQ(cache->acquire(addr, size, kind, fd, offset, &reg, &error), ncclSuccess) << error;
  EXPECT_NE(reg, nullptr);
  return reg;
}

TEST(RegCache, RegistersThePageAlignedRange) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  acquireOk(&cache, 0x10ff0, 0x20);  // straddles the 0x11000 boundary
  ASSERT_EQ(dev.regs(), 1);
  EXPECT_EQ(dev.call(0).start, 0x10000u);
  EXPECT_EQ(dev.call(0).len, 0x2000u);
  EXPECT_EQ(dev.call(0).kind, MemKind::Host);
}

TEST(RegCache, SizeZeroRegistersOnePage) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  acquireOk(&cache, 0x20010, 0);
  ASSERT_EQ(dev.regs(), 1);
  EXPECT_EQ(dev.call(0).start, 0x20000u);
  EXPECT_EQ(dev.call(0).len, 0x1000u);
}

TEST(RegCache, ExactRangeIsAHit) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  const Registration* a = acquireOk(&cache, 0x10000, 0x3000);
  const Registration* b = acquireOk(&cache, 0x10000, 0x3000);
  EXPECT_EQ(a, b);
  EXPECT_EQ(dev.regs(), 1);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.entryCount(), 1u);
}

TEST(RegCache, SubRangeIsAHit) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  const Registration* a = acquireOk(&cache, 0x10000, 0x4000);
  const Registration* b = acquireOk(&cache, 0x11234, 0x100);
  const Registration* c = acquireOk(&cache, 0x13fff, 1);  // last byte of the range
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_EQ(dev.regs(), 1);
  EXPECT_EQ(cache.hits(), 2u);
}

TEST(RegCache, AdjacentRangeIsAMiss) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  const Registration* a = acquireOk(&cache, 0x10000, 0x1000);
  const Registration* b = acquireOk(&cache, 0x11000, 0x1000);
  const Registration* c = acquireOk(&cache, 0x10800, 0x1000);  // spills into the next page
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(b, c);
  EXPECT_EQ(dev.regs(), 3);
  EXPECT_EQ(cache.hits(), 0u);
}

TEST(RegCache, FindsACoveringEntryBehindANearerOne) {
  // Entry B starts closer to the request but ends too early; A, further back, covers it.
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  const Registration* b = acquireOk(&cache, 0x18000, 0x1000);
  const Registration* a = acquireOk(&cache, 0x10000, 0x10000);
  EXPECT_NE(a, b);
  const Registration* hit = acquireOk(&cache, 0x1f000, 0x1000);
  EXPECT_EQ(hit, a);
  EXPECT_EQ(dev.regs(), 2);
}

TEST(RegCache, RefcountToZeroDeregisters) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  const Registration* a = acquireOk(&cache, 0x10000, 0x2000);
  acquireOk(&cache, 0x10000, 0x100);
  cache.release(a);
  EXPECT_EQ(dev.deregs(), 0);
  EXPECT_EQ(cache.entryCount(), 1u);
  cache.release(a);
  EXPECT_EQ(dev.deregs(), 1);
  EXPECT_EQ(cache.entryCount(), 0u);
  // A fresh acquire after the entry is gone registers again.
  acquireOk(&cache, 0x10000, 0x100);
  EXPECT_EQ(dev.regs(), 2);
}

TEST(RegCache, KindsDoNotShare) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  const Registration* host = acquireOk(&cache, 0x10000, 0x1000, MemKind::Host);
  const Registration* cuda = acquireOk(&cache, 0x10000, 0x1000, MemKind::Cuda);
  EXPECT_NE(host, cuda);
  EXPECT_EQ(dev.regs(), 2);
  EXPECT_EQ(dev.call(1).kind, MemKind::Cuda);
  EXPECT_EQ(acquireOk(&cache, 0x10000, 0x10, MemKind::Cuda), cuda);
}

TEST(RegCache, DmabufIsNeverShared) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  const Registration* a = acquireOk(&cache, 0x10000, 0x1000, MemKind::Dmabuf, 7, 0);
  const Registration* b = acquireOk(&cache, 0x10000, 0x1000, MemKind::Dmabuf, 7, 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(dev.regs(), 2);
  EXPECT_EQ(cache.hits(), 0u);
  EXPECT_EQ(dev.call(0).fd, 7);
  cache.release(a);
  cache.release(b);
  EXPECT_EQ(dev.deregs(), 2);
}

TEST(RegCache, DmabufOffsetMovesWithTheAlignedStart) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  acquireOk(&cache, 0x10100, 0x100, MemKind::Dmabuf, 5, 0x2100);
  EXPECT_EQ(dev.call(0).start, 0x10000u);
  EXPECT_EQ(dev.call(0).len, 0x1000u);
  EXPECT_EQ(dev.call(0).offset, 0x2000u);
  // Too small an offset to move down: the caller's exact range is registered instead.
  acquireOk(&cache, 0x10100, 0x100, MemKind::Dmabuf, 5, 0x10);
  EXPECT_EQ(dev.call(1).start, 0x10100u);
  EXPECT_EQ(dev.call(1).len, 0x100u);
  EXPECT_EQ(dev.call(1).offset, 0x10u);
}

TEST(RegCache, RegistrarFailurePropagatesTheMessage) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  dev.setFail(true);
  const Registration* reg = nullptr;
  std::string error;
  EXPECT_EQ(cache.acquire(0x10000, 0x1000, MemKind::Host, -1, 0, &reg, &error), ncclSystemError);
  EXPECT_EQ(error, "fake: RLIMIT_MEMLOCK too low");
  EXPECT_EQ(cache.entryCount(), 0u);
  dev.setFail(false);
  acquireOk(&cache, 0x10000, 0x1000);
  EXPECT_EQ(cache.entryCount(), 1u);
}

TEST(RegCache, RejectsARangeThatWraps) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  const Registration* reg = nullptr;
  std::string error;
  EXPECT_EQ(cache.acquire(UINTPTR_MAX - 10, 100, MemKind::Host, -1, 0, &reg, &error),
            ncclInvalidArgument);
  EXPECT_FALSE(error.empty());
  EXPECT_EQ(dev.regs(), 0);
}

TEST(RegCache, ReleaseOfAnUnknownPointerIsIgnored) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  const Registration* a = acquireOk(&cache, 0x10000, 0x1000);
  Registration stranger;
  cache.release(&stranger);
  cache.release(nullptr);
  EXPECT_EQ(cache.entryCount(), 1u);
  EXPECT_EQ(dev.deregs(), 0);
  cache.release(a);
  cache.release(a);  // double release: the entry is gone, nothing happens
  EXPECT_EQ(dev.deregs(), 1);
}

TEST(RegCache, DestructorDeregistersLeftovers) {
  FakeDevice dev;
  {
    RegCache cache(dev.registrar(), kPage4K);
    acquireOk(&cache, 0x10000, 0x1000);
    acquireOk(&cache, 0x10000, 0x1000);  // hit: still one entry
    acquireOk(&cache, 0x40000, 0x1000, MemKind::Cuda);
    acquireOk(&cache, 0x40000, 0x1000, MemKind::Dmabuf, 3, 0);
  }
  EXPECT_EQ(dev.regs(), 3);
  EXPECT_EQ(dev.deregs(), 3);
  EXPECT_EQ(dev.live(), 0);
}

TEST(RegCache, ConcurrentAcquireReleaseKeepsCountsConsistent) {
  FakeDevice dev;
  RegCache cache(dev.registrar(), kPage4K);
  constexpr int kThreads = 4;
  constexpr int kIterations = 2000;
  std::atomic<int> failures{0};
  auto worker = [&](int seed) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    std::vector<const Registration*> held;
    for (int i = 0; i < kIterations; ++i) {
      uintptr_t base = 0x100000 + (rng() % 8) * 0x4000;  // 8 buffers of 4 pages, shared
      uintptr_t addr = base + rng() % 0x3000;
      MemKind kind = rng() % 4 == 0 ? MemKind::Cuda : MemKind::Host;
      const Registration* reg = nullptr;
      std::string error;
      if (cache.acquire(addr, 1 + rng() % 0x1000, kind, -1, 0, &reg, &error) != ncclSuccess) {
        ++failures;
        continue;
      }
      held.push_back(reg);
      if (held.size() > 3) {
        size_t victim = rng() % held.size();
        cache.release(held[victim]);
        held.erase(held.begin() + static_cast<long>(victim));
      }
    }
    for (const Registration* reg : held) cache.release(reg);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t + 1);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(cache.entryCount(), 0u);
  EXPECT_EQ(dev.live(), 0);
  EXPECT_EQ(dev.regs(), dev.deregs());
  EXPECT_EQ(static_cast<size_t>(dev.regs()) + cache.hits(),
            static_cast<size_t>(kThreads * kIterations));
  EXPECT_GT(cache.hits(), 0u);
}

// --- MrRegistry -------------------------------------------------------------------------

struct ThreeDevices {
  FakeDevice devs[3] = {FakeDevice(0x1000), FakeDevice(0x2000), FakeDevice(0x3000)};
  std::vector<Registrar> registrars() {
    return {devs[0].registrar(), devs[1].registrar(), devs[2].registrar()};
  }
};

TEST(MrRegistry, RegistersOnEveryDeviceWithItsOwnKeys) {
  ThreeDevices fake;
  MrRegistry registry(fake.registrars());
  ASSERT_EQ(registry.deviceCount(), 3);
  std::vector<char> buf(10000);
  MrHandle* h = nullptr;
  ASSERT_EQ(registry.reg(buf.data(), buf.size(), MemKind::Host, -1, 0, {}, &h), ncclSuccess);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->ndevs, 3);
  EXPECT_EQ(h->addr, reinterpret_cast<uintptr_t>(buf.data()));
  EXPECT_EQ(h->size, buf.size());
  EXPECT_EQ(h->kind, MemKind::Host);
  for (int d = 0; d < 3; ++d) {
    SCOPED_TRACE(d);
    ASSERT_NE(h->regs[d], nullptr);
    EXPECT_EQ(h->lkey[d], 0x1000u * (d + 1));
    EXPECT_EQ(h->rkey[d], (0x1000u * (d + 1)) | 0x80000000u);
    EXPECT_EQ(fake.devs[d].regs(), 1);
  }
  // The second registration of a sub-range is a hit on every device, with the same keys.
  MrHandle* sub = nullptr;
  ASSERT_EQ(registry.reg(buf.data() + 100, 100, MemKind::Host, -1, 0, {}, &sub), ncclSuccess);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(sub->lkey[d], h->lkey[d]);
    EXPECT_EQ(registry.cache(d).hits(), 1u);
  }
  EXPECT_EQ(registry.dereg(sub), ncclSuccess);
  EXPECT_EQ(registry.dereg(h), ncclSuccess);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(fake.devs[d].deregs(), 1);
    EXPECT_EQ(registry.cache(d).entryCount(), 0u);
  }
}

// A comm's registration covers its own devices only (issue 32: four registrations of every
// buffer on a node with two Spark cables); another comm on a shared device hits the cache.
TEST(MrRegistry, RegistersOnTheCommsDevicesOnly) {
  ThreeDevices fake;
  MrRegistry registry(fake.registrars());
  std::vector<char> buf(10000);
  MrHandle* a = nullptr;
  ASSERT_EQ(registry.reg(buf.data(), buf.size(), MemKind::Host, -1, 0, {0, 2}, &a), ncclSuccess);
  EXPECT_EQ(a->ndevs, 2);
  EXPECT_NE(a->regs[0], nullptr);
  EXPECT_EQ(a->regs[1], nullptr);
  EXPECT_NE(a->regs[2], nullptr);
  EXPECT_EQ(fake.devs[0].regs() + fake.devs[1].regs() + fake.devs[2].regs(), 2);
  MrHandle* b = nullptr;
  ASSERT_EQ(registry.reg(buf.data(), buf.size(), MemKind::Host, -1, 0, {2, 1}, &b), ncclSuccess);
  EXPECT_EQ(fake.devs[1].regs(), 1);
  EXPECT_EQ(fake.devs[2].regs(), 1);  // a hit: the cache is the device's, not the comm's
  EXPECT_EQ(registry.cache(2).hits(), 1u);
  EXPECT_EQ(registry.dereg(a), ncclSuccess);
  EXPECT_EQ(fake.devs[0].deregs(), 1);
  EXPECT_EQ(fake.devs[2].deregs(), 0);  // b still holds it
  EXPECT_EQ(registry.dereg(b), ncclSuccess);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(registry.cache(d).entryCount(), 0u) << d;
  MrHandle* bad = nullptr;
  EXPECT_EQ(registry.reg(buf.data(), buf.size(), MemKind::Host, -1, 0, {3}, &bad), ncclInternalError);
}

TEST(MrRegistry, RollsBackWhenDeviceTwoFails) {
  ThreeDevices fake;
  MrRegistry registry(fake.registrars());
  fake.devs[2].setFail(true);
  std::vector<char> buf(4096);
  MrHandle* h = reinterpret_cast<MrHandle*>(0x1);
  EXPECT_EQ(registry.reg(buf.data(), buf.size(), MemKind::Cuda, -1, 0, {}, &h), ncclSystemError);
  EXPECT_EQ(h, nullptr);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(fake.devs[d].regs(), 1);
    EXPECT_EQ(fake.devs[d].deregs(), 1);
    EXPECT_EQ(registry.cache(d).entryCount(), 0u);
  }
  EXPECT_EQ(fake.devs[2].regs(), 0);
}

TEST(MrRegistry, RollbackKeepsEarlierRegistrationsAlive) {
  ThreeDevices fake;
  MrRegistry registry(fake.registrars());
  std::vector<char> buf(8192);
  MrHandle* first = nullptr;
  ASSERT_EQ(registry.reg(buf.data(), buf.size(), MemKind::Host, -1, 0, {}, &first), ncclSuccess);
  fake.devs[2].setFail(true);
  MrHandle* second = nullptr;
  // The CUDA registrations made on devices 0 and 1 are undone; the first handle's host
  // entries stay registered.
  EXPECT_EQ(registry.reg(buf.data(), 16, MemKind::Cuda, -1, 0, {}, &second), ncclSystemError);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(registry.cache(d).entryCount(), 1u);
  EXPECT_EQ(fake.devs[0].deregs(), 1);  // only the CUDA registration made for `second`
  EXPECT_EQ(registry.dereg(first), ncclSuccess);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(fake.devs[d].live(), 0);
}

TEST(MrRegistry, SizeZeroIsLegal) {
  FakeDevice dev;
  MrRegistry registry(std::vector<Registrar>{dev.registrar()});
  char byte = 0;
  MrHandle* h = nullptr;
  ASSERT_EQ(registry.reg(&byte, 0, MemKind::Host, -1, 0, {}, &h), ncclSuccess);
  EXPECT_EQ(h->ndevs, 1);
  EXPECT_EQ(dev.call(0).len, 4096u);
  EXPECT_EQ(registry.dereg(h), ncclSuccess);
  EXPECT_EQ(dev.deregs(), 1);
}

TEST(MrRegistry, ZeroDevicesIsAnInternalError) {
  MrRegistry registry(std::vector<Registrar>{});
  char byte = 0;
  MrHandle* h = nullptr;
  EXPECT_EQ(registry.reg(&byte, 1, MemKind::Host, -1, 0, {}, &h), ncclInternalError);
  EXPECT_EQ(h, nullptr);
}

TEST(MrRegistry, RejectsNullArguments) {
  FakeDevice dev;
  MrRegistry registry(std::vector<Registrar>{dev.registrar()});
  MrHandle* h = nullptr;
  EXPECT_EQ(registry.dereg(nullptr), ncclInvalidArgument);
  EXPECT_EQ(registry.reg(nullptr, 16, MemKind::Host, -1, 0, {}, &h), ncclInvalidArgument);
  char byte = 0;
  EXPECT_EQ(registry.reg(&byte, 1, MemKind::Host, -1, 0, {}, nullptr), ncclInvalidArgument);
  EXPECT_EQ(dev.regs(), 0);
}

TEST(MrRegistry, DestructorReleasesLeftovers) {
  ThreeDevices fake;
  MrHandle* h = nullptr;
  std::vector<char> buf(4096);
  {
    MrRegistry registry(fake.registrars());
    ASSERT_EQ(registry.reg(buf.data(), buf.size(), MemKind::Host, -1, 0, {}, &h), ncclSuccess);
  }
  for (int d = 0; d < 3; ++d) EXPECT_EQ(fake.devs[d].live(), 0);
  delete h;  // the handle itself is the caller's; only the MRs went with the registry
}

// --- verbsRegistrar against a fake VerbsApi table -------------------------------------------

struct FakeVerbs {
  int regMrCalls = 0;
  int iova2Calls = 0;
  int dmabufCalls = 0;
  int deregCalls = 0;
  int lastAccess = 0;
  uint64_t lastIova = 0;
  int failErrno = 0;  // non-zero: registrations fail with this errno
  ibv_mr mr{};
};
FakeVerbs g_verbs;
int g_pdStorage;
int g_ctxStorage;

ibv_mr* fakeRegMr(ibv_pd*, void* addr, size_t, int access) {
  ++g_verbs.regMrCalls;
  g_verbs.lastAccess = access;
  g_verbs.lastIova = reinterpret_cast<uintptr_t>(addr);
  if (g_verbs.failErrno != 0) {
    errno = g_verbs.failErrno;
    return nullptr;
  }
  return &g_verbs.mr;
}

ibv_mr* fakeRegMrIova2(ibv_pd* pd, void* addr, size_t len, uint64_t iova, unsigned int access) {
  ++g_verbs.iova2Calls;
  ibv_mr* mr = fakeRegMr(pd, addr, len, static_cast<int>(access));
  --g_verbs.regMrCalls;
  g_verbs.lastIova = iova;
  return mr;
}

ibv_mr* fakeRegDmabufMr(ibv_pd*, uint64_t, size_t, uint64_t iova, int fd, int access) {
  if (fd < 0) {  // VerbsDevice::open's support probe
    errno = EBADF;
    return nullptr;
  }
  ++g_verbs.dmabufCalls;
  g_verbs.lastAccess = access;
  g_verbs.lastIova = iova;
  if (g_verbs.failErrno != 0) {
    errno = g_verbs.failErrno;
    return nullptr;
  }
  return &g_verbs.mr;
}

int fakeDeregMr(ibv_mr*) {
  ++g_verbs.deregCalls;
  return 0;
}
int fakeQueryDevice(ibv_context*, ibv_device_attr*) { return 0; }
ibv_pd* fakeAllocPd(ibv_context*) { return reinterpret_cast<ibv_pd*>(&g_pdStorage); }
int fakeDeallocPd(ibv_pd*) { return 0; }
int fakeCloseDevice(ibv_context*) { return 0; }

class MrRegistryVerbs : public ::testing::Test {
 protected:
  void SetUp() override {
    g_verbs = FakeVerbs{};
    g_verbs.mr.lkey = 0x1111;
    g_verbs.mr.rkey = 0x2222;
    api_.regMr = fakeRegMr;
    api_.deregMr = fakeDeregMr;
    api_.queryDevice = fakeQueryDevice;
    api_.allocPd = fakeAllocPd;
    api_.deallocPd = fakeDeallocPd;
    api_.closeDevice = fakeCloseDevice;
  }
  std::unique_ptr<VerbsDevice> openDevice() {
    auto dev = std::make_unique<VerbsDevice>(&api_, "rxe_fake",
                                             reinterpret_cast<ibv_context*>(&g_ctxStorage));
    EXPECT_EQ(dev->open(), ncclSuccess);
    return dev;
  }
  bool reg(const Registrar& r, MemKind kind, Registration* out, std::string* error) {
    return r.reg(0x7f0000010000u, 0x2000, kind, kind == MemKind::Dmabuf ? 9 : -1, 0, out, error);
  }
  VerbsApi api_;
};

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

TEST_F(MrRegistryVerbs, UsesPlainRegMrWithoutIova2) {
  auto dev = openDevice();
  Registrar r = verbsRegistrar(dev.get());
  Registration out;
  std::string error;
  ASSERT_TRUE(reg(r, MemKind::Host, &out, &error)) << error;
  EXPECT_EQ(g_verbs.regMrCalls, 1);
  EXPECT_EQ(g_verbs.lastAccess, kAccess);
  EXPECT_EQ(out.mr, &g_verbs.mr);
  EXPECT_EQ(out.lkey, 0x1111u);
  EXPECT_EQ(out.rkey, 0x2222u);
  r.dereg(out);
  EXPECT_EQ(g_verbs.deregCalls, 1);
}

TEST_F(MrRegistryVerbs, PrefersIova2WithRelaxedOrdering) {
  api_.regMrIova2 = fakeRegMrIova2;
  auto dev = openDevice();
  Registrar r = verbsRegistrar(dev.get());
  Registration out;
  std::string error;
  ASSERT_TRUE(reg(r, MemKind::Cuda, &out, &error)) << error;
  EXPECT_EQ(g_verbs.iova2Calls, 1);
  EXPECT_EQ(g_verbs.regMrCalls, 0);
  EXPECT_EQ(g_verbs.lastAccess, kAccess | IBV_ACCESS_RELAXED_ORDERING);
  EXPECT_EQ(g_verbs.lastIova, 0x7f0000010000u);
}

// NCCL_MESH_PCI_RELAXED_ORDERING=0, as NCCL_IB_PCI_RELAXED_ORDERING=0: the plain entry point
// and no relaxed-ordering bit, for host and DMA-BUF memory alike, even where iova2 exists.
TEST_F(MrRegistryVerbs, RelaxedOrderingOffRegistersWithoutIt) {
  api_.regMrIova2 = fakeRegMrIova2;
  api_.regDmabufMr = fakeRegDmabufMr;
  auto dev = openDevice();
  EXPECT_TRUE(usesRelaxedOrdering(dev.get(), true));
  EXPECT_FALSE(usesRelaxedOrdering(dev.get(), false));
  Registrar r = verbsRegistrar(dev.get(), /*relaxedOrdering=*/false);
  Registration out;
  std::string error;
  ASSERT_TRUE(reg(r, MemKind::Host, &out, &error)) << error;
  EXPECT_EQ(g_verbs.iova2Calls, 0);
  EXPECT_EQ(g_verbs.regMrCalls, 1);
  EXPECT_EQ(g_verbs.lastAccess, kAccess);
  ASSERT_TRUE(reg(r, MemKind::Dmabuf, &out, &error)) << error;
  EXPECT_EQ(g_verbs.dmabufCalls, 1);
  EXPECT_EQ(g_verbs.lastAccess, kAccess);
  // Allowed: DMA-BUF memory carries the bit too, as NCCL IB registers it.
  Registrar on = verbsRegistrar(dev.get(), true);
  ASSERT_TRUE(reg(on, MemKind::Dmabuf, &out, &error)) << error;
  EXPECT_EQ(g_verbs.lastAccess, kAccess | IBV_ACCESS_RELAXED_ORDERING);
}

TEST_F(MrRegistryVerbs, DmabufNeedsTheSymbol) {
  auto dev = openDevice();
  Registrar r = verbsRegistrar(dev.get());
  Registration out;
  std::string error;
  EXPECT_FALSE(reg(r, MemKind::Dmabuf, &out, &error));
  EXPECT_NE(error.find("rdma-core lacks ibv_reg_dmabuf_mr (needs rdma-core 34+)"),
            std::string::npos) << error;

  api_.regDmabufMr = fakeRegDmabufMr;
  auto dev2 = openDevice();
  Registrar r2 = verbsRegistrar(dev2.get());
  ASSERT_TRUE(reg(r2, MemKind::Dmabuf, &out, &error)) << error;
  EXPECT_EQ(g_verbs.dmabufCalls, 1);
  EXPECT_EQ(g_verbs.lastIova, 0x7f0000010000u);
}

TEST_F(MrRegistryVerbs, HostFailureExplainsTheMemlockLimit) {
  auto dev = openDevice();
  Registrar r = verbsRegistrar(dev.get());
  g_verbs.failErrno = ENOMEM;
  Registration out;
  std::string error;
  EXPECT_FALSE(reg(r, MemKind::Host, &out, &error));
  for (const char* part : {"ibv_reg_mr", "rxe_fake", "0x7f0000010000", "8192 bytes",
                           "RLIMIT_MEMLOCK", "ulimit -l unlimited", "--ulimit memlock=-1"}) {
    EXPECT_NE(error.find(part), std::string::npos) << part << " missing from: " << error;
  }
  EXPECT_NE(error.find(std::strerror(ENOMEM)), std::string::npos) << error;
}

TEST_F(MrRegistryVerbs, CudaFailureMentionsPeermem) {
  auto dev = openDevice();
  Registrar r = verbsRegistrar(dev.get());
  g_verbs.failErrno = EFAULT;
  Registration out;
  std::string error;
  EXPECT_FALSE(reg(r, MemKind::Cuda, &out, &error));
  EXPECT_NE(error.find("nvidia-peermem"), std::string::npos) << error;
  EXPECT_EQ(error.find("RLIMIT_MEMLOCK"), std::string::npos) << error;
}

TEST_F(MrRegistryVerbs, FailureReachesTheRegistryCaller) {
  auto dev = openDevice();
  MrRegistry registry(std::vector<Registrar>{verbsRegistrar(dev.get())});
  g_verbs.failErrno = EPERM;
  std::vector<char> buf(64);
  MrHandle* h = nullptr;
  EXPECT_EQ(registry.reg(buf.data(), buf.size(), MemKind::Host, -1, 0, {}, &h), ncclSystemError);
  EXPECT_EQ(h, nullptr);
  g_verbs.failErrno = 0;
  ASSERT_EQ(registry.reg(buf.data(), buf.size(), MemKind::Host, -1, 0, {}, &h), ncclSuccess);
  EXPECT_EQ(h->lkey[0], 0x1111u);
  EXPECT_EQ(registry.dereg(h), ncclSuccess);
  EXPECT_EQ(g_verbs.deregCalls, 1);
}

}  // namespace
}  // namespace mesh
