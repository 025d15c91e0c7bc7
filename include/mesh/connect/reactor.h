// SPDX-License-Identifier: Apache-2.0
// The handshake reactor: ONE background thread per process (epoll) that owns every
// handshake socket and RDMA async-event fd. NCCL's threads never block on the network:
// they hand work to the reactor with post() and poll state that the reactor publishes.
//
// Lifecycle: started by Plugin::init, stopped (joined) by Plugin::shutdown, which runs
// from the library destructor, so no thread outlives the library when NCCL dlclose()s it.
//
// Threads: post()/postOrRun()/stop()/running() are callable from any thread. watch()/
// unwatch()/addTimer() run on the reactor thread only (from a posted task or a handler), or,
// once post() refuses (the thread has ended), inside postOrRun()'s inline run, which is
// serialized with other inline runs and with stop()'s teardown.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "err.h"

namespace mesh {

class Reactor {
 public:
  using Clock = std::chrono::steady_clock;
  using Handler = std::function<void(uint32_t events)>;
  using Task = std::function<void()>;
  // The thread's name (/proc/<pid>/task/<tid>/comm; at most 15 characters).
  static constexpr const char* kThreadName = "mesh-handshake";

  Reactor() = default;
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  ncclResult_t start();
  // Runs queued tasks' destructors, closes the epoll/eventfd and joins the thread.
  // Idempotent. Must not be called from the reactor thread.
  void stop();
  bool running() const { return running_.load(std::memory_order_acquire); }
  // Running and not stopping: its loop still serves what post() queues (false once stop()
  // began, or after the loop ended on an epoll error).
  bool serving() const { return running() && !stopping_.load(std::memory_order_acquire); }
  bool onReactorThread() const { return std::this_thread::get_id() == threadId_.load(); }

  // Queues fn to run on the reactor thread. Returns false when the reactor is not running:
  // never started, or its thread has run every task it accepted and is ending (stop(), or an
  // epoll failure). A task accepted while it stops still runs, on the reactor thread.
  bool post(Task fn);
  // post(), or, when refused, runs fn here at once under inlineMutex_ (teardown work that
  // must happen either way: closing a listener, a connect, a control socket). True: posted.
  bool postOrRun(const char* what, Task fn);

  // Reactor thread only.
  ncclResult_t watch(int fd, uint32_t events, Handler handler);
  ncclResult_t modify(int fd, uint32_t events);
  void unwatch(int fd);
  // Calls fn once every `period` (first call one period from now) until fn returns false.
  void addTimer(Clock::duration period, std::function<bool(Clock::time_point)> fn);

 private:
  void run();
  void drainTasks();
  void finalDrain();
  void fireTimers();
  int nextTimeoutMs() const;

  struct Timer {
    Clock::time_point due;
    Clock::duration period;
    std::function<bool(Clock::time_point)> fn;
  };

  int epollFd_ = -1;
  int wakeFd_ = -1;  // eventfd: post() and stop() wake the loop through it
  std::thread thread_;
  // Cross-thread flags (docs/DESIGN-notes.md, "Memory ordering"). threadId_: written by the
  // reactor thread, read by any (seq_cst; only compared). running_: written by start()/stop()
  // with release, read with acquire by running(). stopping_: written by stop() (release,
  // under tasksMutex_) or by the loop on an epoll failure; read with acquire by the loop and
  // by serving(). post() decides by accepting_ (below), under tasksMutex_.
  std::atomic<std::thread::id> threadId_{};
  std::atomic<bool> running_{false};
  std::atomic<bool> stopping_{false};

  std::mutex tasksMutex_;          // guards tasks_, accepting_ and post()'s eventfd write
  std::vector<Task> tasks_;
  // True from start() until the thread's finalDrain() found tasks_ empty; post() refuses
  // when false, so a refusal means the reactor thread is done with handlers_ and timers_.
  bool accepting_ = false;
  // Serializes postOrRun()'s inline runs (NCCL's threads after the reactor ended) with each
  // other and with stop()'s teardown. Recursive: an inline task may postOrRun() again.
  std::recursive_mutex inlineMutex_;
  // Reactor thread only:
  std::unordered_map<int, Handler> handlers_;
  std::vector<Timer> timers_;
};

}  // namespace mesh
