// SPDX-License-Identifier: Apache-2.0
// Page geometry from the system; see include/mesh/platform/page.h.
#include "mesh/platform/page.h"

#include <sys/auxv.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace mesh {

size_t systemPageSize() {
  static const size_t page = [] {
    long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? static_cast<size_t>(v) : static_cast<size_t>(getauxval(AT_PAGESZ));
  }();
  return page;
}

PageSpan pageSpan(uintptr_t addr, size_t size, size_t pageSize) {
  size_t span = size == 0 ? 1 : size;
  uintptr_t mask = static_cast<uintptr_t>(pageSize) - 1;
  if (addr + span < addr || addr + span + mask < addr + span) return PageSpan{};
  uintptr_t start = addr & ~mask;
  uintptr_t end = (addr + span + mask) & ~mask;
  return PageSpan{start, static_cast<size_t>(end - start)};
}

size_t roundUpToPages(size_t size, size_t pageSize) {
  size_t mask = pageSize - 1;
  if (size + mask < size) return 0;
  return (size + mask) & ~mask;
}

void* allocPages(size_t size, size_t pageSize, size_t* allocated) {
  size_t len = roundUpToPages(size == 0 ? 1 : size, pageSize);
  if (len == 0) return nullptr;
  void* p = std::aligned_alloc(pageSize, len);
  if (p == nullptr) return nullptr;
  std::memset(p, 0, len);
  if (allocated != nullptr) *allocated = len;
  return p;
}

}  // namespace mesh
