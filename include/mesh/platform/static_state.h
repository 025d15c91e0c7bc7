// SPDX-License-Identifier: Apache-2.0
// Releasing state that lives in the library's static storage (the Plugin, its reactor and
// tables are never destroyed by the C++ runtime; NCCL dlcloses the library instead). Header-only.
#pragma once

#include <utility>

namespace mesh {

// Leaves `x` as a default-constructed T and frees every heap buffer it held. Assigning
// T() is not enough for every type: libstdc++'s move assignment from a short (in-place)
// string copies the characters into the existing heap buffer and keeps it, so a string
// longer than 15 characters would stay allocated in storage that dlclose then unmaps: a
// leak LeakSanitizer reports. Swapping with a local hands the buffers to a temporary that
// is destroyed here.
template <typename T>
void releaseStatic(T& x) {
  T empty;
  using std::swap;
  swap(x, empty);
}

}  // namespace mesh
