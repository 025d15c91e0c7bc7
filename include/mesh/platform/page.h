// SPDX-License-Identifier: Apache-2.0
// Page geometry. The page size always comes from the system (sysconf(_SC_PAGESIZE)): 4 KiB
// on x86-64, but 4, 16 or 64 KiB on aarch64 depending on the kernel (some Grace/GB10
// distributions run 64 KiB pages). Everything that depends on it takes it as a parameter,
// so unit tests run the same logic with 4, 16 and 64 KiB pages on any host.
//
// Why it matters: memory registration pins whole pages, and with ibv_fork_init rdma-core
// marks the registered range MADV_DONTFORK, which the kernel applies to whole pages; a
// range rounded to a smaller page than the system's would leave heap data sharing the
// last page unmapped in a forked child.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mesh {

// The system's page size, read once (sysconf(_SC_PAGESIZE), else the auxiliary vector's
// AT_PAGESZ). Thread-safe.
size_t systemPageSize();

// [start, start+len): the smallest run of whole pages covering [addr, addr+size) (one byte
// when size is 0). len is 0 when the range wraps around the address space. pageSize must be
// a power of two.
struct PageSpan {
  uintptr_t start = 0;
  size_t len = 0;
};
PageSpan pageSpan(uintptr_t addr, size_t size, size_t pageSize);

// size rounded up to whole pages (0 stays 0; 0 on overflow).
size_t roundUpToPages(size_t size, size_t pageSize);

// Whole, page-aligned, zeroed pages for at least `size` bytes (nullptr on failure; *allocated
// gets the rounded size). Free with std::free.
void* allocPages(size_t size, size_t pageSize, size_t* allocated);

}  // namespace mesh
