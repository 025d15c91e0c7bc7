// SPDX-License-Identifier: Apache-2.0
// Fences between the CPU and a NIC (docs/DESIGN-notes.md, "Memory ordering"). What a NIC
// writes is published by a completion; what it reads is handed over by ibv_post_send. The
// provider puts device barriers around both; these fences add what the compiler and the
// CPU's own ordering need: a dmb on aarch64, nothing but a compiler barrier on x86.
//
// They pair with hardware (or rxe's kernel thread), not with another C++ thread, so
// ThreadSanitizer has nothing to model in them; GCC warns that it does not (-Wtsan), which
// -Werror would turn into an error in the sanitize tier's TSan build.
#pragma once

namespace mesh {

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtsan"
#endif

// After a poll returned completions: no later load is satisfied before the CQE was seen.
inline void afterCompletionFence() { __atomic_thread_fence(__ATOMIC_ACQUIRE); }
// Before posting work requests: the plain stores they point at are visible first.
inline void beforePostFence() { __atomic_thread_fence(__ATOMIC_RELEASE); }

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

}  // namespace mesh
