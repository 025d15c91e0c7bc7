// SPDX-License-Identifier: Apache-2.0
// Page geometry (mesh/platform/page.h) and what depends on it, with 4, 16 and 64 KiB pages: the
// registration cache's rounding and the whole-page rule for memory that rdma-core's fork
// protection (MADV_DONTFORK on the registered range) covers. The kernel's page size cannot
// change under a test, so the size is a parameter, as it is in the code.
#include "mesh/platform/page.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "mesh/rdma/mr_cache.h"

namespace mesh {
namespace {

TEST(Page, SystemPageSizeIsTheKernels) {
  EXPECT_EQ(systemPageSize(), static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(systemPageSize() & (systemPageSize() - 1), 0u) << "not a power of two";
}

class PageSizes : public ::testing::TestWithParam<size_t> {
 protected:
  size_t page() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Kib, PageSizes,
                         ::testing::Values(size_t{4} << 10, size_t{16} << 10, size_t{64} << 10),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::to_string(info.param >> 10) + "KiB";
                         });

TEST_P(PageSizes, SpanCoversWholePages) {
  const size_t p = page();
  const uintptr_t base = 0x40000000;  // aligned to every size under test
  PageSpan s = pageSpan(base + 10, 20, p);
  EXPECT_EQ(s.start, base);
  EXPECT_EQ(s.len, p);
  s = pageSpan(base + p - 1, 2, p);  // straddles one boundary
  EXPECT_EQ(s.start, base);
  EXPECT_EQ(s.len, 2 * p);
  s = pageSpan(base, p, p);  // exactly one page
  EXPECT_EQ(s.start, base);
  EXPECT_EQ(s.len, p);
  s = pageSpan(base + 5, 0, p);  // zero bytes still name their page
  EXPECT_EQ(s.start, base);
  EXPECT_EQ(s.len, p);
  EXPECT_EQ(pageSpan(UINTPTR_MAX - 10, 100, p).len, 0u);
  EXPECT_EQ(pageSpan(UINTPTR_MAX - p / 2, 1, p).len, 0u);  // the end would wrap when rounded
}

TEST_P(PageSizes, RoundUp) {
  const size_t p = page();
  EXPECT_EQ(roundUpToPages(0, p), 0u);
  EXPECT_EQ(roundUpToPages(1, p), p);
  EXPECT_EQ(roundUpToPages(p, p), p);
  EXPECT_EQ(roundUpToPages(p + 1, p), 2 * p);
  EXPECT_EQ(roundUpToPages(SIZE_MAX, p), 0u);
}

// Control regions (FIFO, sizes): whole pages of their own, so the fork-protected range of
// their registration (pageSpan of the region) is exactly the allocation, and no heap
// object shares a page with it.
TEST_P(PageSizes, ControlRegionOwnsItsPages) {
  const size_t p = page();
  for (size_t need : {size_t{1}, size_t{3000}, p - 1, p, p + 1, 5 * p / 2}) {
    size_t got = 0;
    void* mem = allocPages(need, p, &got);
    ASSERT_NE(mem, nullptr) << need;
    uintptr_t a = reinterpret_cast<uintptr_t>(mem);
    EXPECT_EQ(a % p, 0u) << need;
    EXPECT_EQ(got % p, 0u) << need;
    EXPECT_GE(got, need);
    EXPECT_LT(got - need, p);
    PageSpan prot = pageSpan(a, got, p);
    EXPECT_EQ(prot.start, a) << "DONTFORK would start before the region";
    EXPECT_EQ(prot.len, got) << "DONTFORK would reach past the region";
    for (size_t i = 0; i < got; ++i) ASSERT_EQ(static_cast<unsigned char*>(mem)[i], 0u);
    std::free(mem);
  }
}

// What a 4 KiB rounding gets wrong on a 64 KiB kernel: a control region sized in 4 KiB
// pages leaves the rest of its 64 KiB page to the heap, and the kernel protects (and takes
// from a forked child) that whole page.
TEST(PageSizes64K, FourKiBRoundingWouldShareThePage) {
  const size_t small = size_t{4} << 10, big = size_t{64} << 10;
  const uintptr_t region = 0x40000000;  // 64 KiB aligned
  size_t len4k = roundUpToPages(3000, small);
  PageSpan kernel = pageSpan(region, len4k, big);
  EXPECT_GT(kernel.len, len4k) << "the kernel's protection reaches heap data after the region";
  EXPECT_EQ(pageSpan(region, roundUpToPages(3000, big), big).len, roundUpToPages(3000, big));
}

// The registration cache with each page size: what it registers, and that requests within
// one page (of that size) share the registration.
struct Recorder {
  std::vector<std::pair<uintptr_t, size_t>> regs;
  int live = 0;
  Registrar registrar() {
    Registrar r;
    r.reg = [this](uintptr_t start, size_t len, MemKind, int, uint64_t, Registration* out, std::string*) {
      regs.emplace_back(start, len);
      out->mr = reinterpret_cast<void*>(regs.size());
      out->lkey = out->rkey = static_cast<uint32_t>(regs.size());
      ++live;
      return true;
    };
    r.dereg = [this](const Registration&) { --live; };
    return r;
  }
};

const Registration* acquire(RegCache* cache, uintptr_t addr, size_t size) {
  const Registration* reg = nullptr;
  std::string error;
  EXPECT_EQ(cache->acquire(addr, size, MemKind::Host, -1, 0, &reg, &error), ncclSuccess) << error;
  return reg;
}

TEST_P(PageSizes, CacheRegistersWholePagesOfThatSize) {
  const size_t p = page();
  const uintptr_t base = 0x40000000;
  Recorder dev;
  {
    RegCache cache(dev.registrar(), p);
    const Registration* a = acquire(&cache, base + p - 16, 32);  // straddles a boundary
    ASSERT_EQ(dev.regs.size(), 1u);
    EXPECT_EQ(dev.regs[0].first, base);
    EXPECT_EQ(dev.regs[0].second, 2 * p);
    // Anywhere in those two pages: a hit, whatever the page size.
    EXPECT_EQ(acquire(&cache, base, 1), a);
    EXPECT_EQ(acquire(&cache, base + 2 * p - 1, 1), a);
    EXPECT_EQ(dev.regs.size(), 1u);
    EXPECT_EQ(cache.hits(), 2u);
    // The next page is not covered.
    const Registration* b = acquire(&cache, base + 2 * p, 1);
    EXPECT_NE(a, b);
    EXPECT_EQ(dev.regs.size(), 2u);
    EXPECT_EQ(dev.regs[1].first, base + 2 * p);
    EXPECT_EQ(dev.regs[1].second, p);
    // 4 KiB apart is the same page when pages are larger: a hit there, a miss at 4 KiB.
    const Registration* c = acquire(&cache, base + 4 * p + (size_t{4} << 10), 16);
    const Registration* d = acquire(&cache, base + 4 * p, 16);
    EXPECT_EQ(c == d, p > (size_t{4} << 10));
    for (const Registration* r : {a, a, a, b, c, d}) cache.release(r);
  }
  EXPECT_EQ(dev.live, 0);
}

TEST(PageSizesDefault, CacheDefaultsToTheSystemPage) {
  Recorder dev;
  RegCache cache(dev.registrar());
  const uintptr_t base = 0x40000000;
  cache.release(acquire(&cache, base + 1, 1));
  ASSERT_EQ(dev.regs.size(), 1u);
  EXPECT_EQ(dev.regs[0].second, systemPageSize());
}

}  // namespace
}  // namespace mesh
