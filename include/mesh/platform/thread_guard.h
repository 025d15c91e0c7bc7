// SPDX-License-Identifier: Apache-2.0
// The exception barrier of the plugin's own threads (the handshake reactor, the relay). An
// exception leaving a std::thread's function calls std::terminate, which aborts NCCL's
// process; NCCL's threads have theirs in the ABI layer (src/abi). Each unit of work a thread
// runs (a handler, a task, a timer, a round of the relay) goes through runGuarded(): what it
// throws is logged and the thread goes on with its next unit.
#pragma once

#include <exception>

namespace mesh {

// WARNs "<thread>: <what> failed: <why>; it goes on", at most once a second per thread, the
// next line counting those not logged.
void noteThreadException(const char* thread, const char* what, const char* why) noexcept;

// Runs fn(); returns false when it threw (logged, swallowed).
template <typename Fn>
bool runGuarded(const char* thread, const char* what, Fn&& fn) noexcept {
  try {
    fn();
    return true;
  } catch (const std::exception& e) {
    noteThreadException(thread, what, e.what());
  } catch (...) {
    noteThreadException(thread, what, "an exception that is not a std::exception");
  }
  return false;
}

}  // namespace mesh
