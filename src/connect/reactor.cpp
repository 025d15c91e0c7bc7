// SPDX-License-Identifier: Apache-2.0
#include "mesh/connect/reactor.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "mesh/platform/check.h"
#include "mesh/platform/log.h"
#include "mesh/platform/static_state.h"
#include "mesh/platform/thread_guard.h"

namespace mesh {

Reactor::~Reactor() { stop(); }

ncclResult_t Reactor::start() {
  if (running()) return ncclSuccess;
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  MESH_SYSCHECK(epollFd_, "epoll_create1 (handshake reactor)");
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakeFd_ < 0) {
    int e = errno;
    close(epollFd_);
    epollFd_ = -1;
    MESH_WARN("eventfd (handshake reactor) failed: %s", strerror(e));
    return ncclSystemError;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wakeFd_;
  if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev) != 0) {
    int e = errno;
    close(wakeFd_);
    close(epollFd_);
    wakeFd_ = epollFd_ = -1;
    MESH_WARN("epoll_ctl (handshake reactor wake-up) failed: %s", strerror(e));
    return ncclSystemError;
  }
  stopping_.store(false);
  running_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(tasksMutex_);
    accepting_ = true;
  }
  try {
    thread_ = std::thread([this] { run(); });
    // Named before start() returns, so that `top -H`, gdb and the ABI tests can tell it
    // from the host's threads as soon as init has returned. A failure only loses the name.
    pthread_setname_np(thread_.native_handle(), kThreadName);
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(tasksMutex_);
      accepting_ = false;
      tasks_.clear();
    }
    running_.store(false);
    close(wakeFd_);
    close(epollFd_);
    wakeFd_ = epollFd_ = -1;
    MESH_WARN("cannot start the handshake reactor thread: %s", e.what());
    return ncclSystemError;
  }
  return ncclSuccess;
}

void Reactor::stop() {
  if (!thread_.joinable()) return;
  {
    // Under the lock, as post() writes: the eventfd is open until the thread has refused
    // every later post (finalDrain), which happens before the join returns.
    std::lock_guard<std::mutex> lock(tasksMutex_);
    stopping_.store(true, std::memory_order_release);
    uint64_t one = 1;
    if (write(wakeFd_, &one, sizeof(one)) < 0) { /* the loop also polls stopping_ */ }
  }
  thread_.join();
  running_.store(false, std::memory_order_release);
  // Every accepted task has run on the reactor thread (finalDrain); post() refuses now, and
  // a refused caller runs its work inline under inlineMutex_, which this teardown holds too.
  // The plugin's reactor lives in static storage that disappears with the library.
  std::lock_guard<std::recursive_mutex> inlineLock(inlineMutex_);
  releaseStatic(handlers_);
  releaseStatic(timers_);
  std::lock_guard<std::mutex> lock(tasksMutex_);
  releaseStatic(tasks_);
  close(wakeFd_);
  close(epollFd_);
  wakeFd_ = epollFd_ = -1;
}

bool Reactor::post(Task fn) {
  std::lock_guard<std::mutex> lock(tasksMutex_);
  if (!accepting_) return false;
  tasks_.push_back(std::move(fn));
  // Under the lock: stop() cannot close the eventfd between the queueing and this write.
  uint64_t one = 1;
  if (write(wakeFd_, &one, sizeof(one)) < 0 && errno != EAGAIN) {
    MESH_WARN("reactor wake-up failed: %s", strerror(errno));
  }
  return true;
}

bool Reactor::postOrRun(const char* what, Task fn) {
  if (post(fn)) return true;
  std::lock_guard<std::recursive_mutex> lock(inlineMutex_);
  runGuarded("mesh-handshake (inline)", what, fn);
  return false;
}

ncclResult_t Reactor::watch(int fd, uint32_t events, Handler handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  MESH_SYSCHECK(epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev), "epoll_ctl(ADD)");
  handlers_[fd] = std::move(handler);
  return ncclSuccess;
}

ncclResult_t Reactor::modify(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  MESH_SYSCHECK(epoll_ctl(epollFd_, EPOLL_CTL_MOD, fd, &ev), "epoll_ctl(MOD)");
  return ncclSuccess;
}

void Reactor::unwatch(int fd) {
  epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
  handlers_.erase(fd);
}

void Reactor::addTimer(Clock::duration period, std::function<bool(Clock::time_point)> fn) {
  timers_.push_back(Timer{Clock::now() + period, period, std::move(fn)});
}

void Reactor::drainTasks() {
  uint64_t count;
  while (read(wakeFd_, &count, sizeof(count)) > 0) {
  }
  std::vector<Task> tasks;
  {
    std::lock_guard<std::mutex> lock(tasksMutex_);
    tasks.swap(tasks_);
  }
  for (Task& t : tasks) runGuarded("mesh-handshake", "a task", t);
}

// The loop's last act: every task accepted runs here, on this thread (mostly closes and
// teardowns posted just before an unload; dropping them leaked their sockets), including
// those the tasks post; post() refuses from the moment the queue is found empty, so a
// refused caller knows this thread will never touch handlers_ or timers_ again.
void Reactor::finalDrain() {
  for (;;) {
    std::vector<Task> tasks;
    {
      std::lock_guard<std::mutex> lock(tasksMutex_);
      if (tasks_.empty()) {
        accepting_ = false;
        return;
      }
      tasks.swap(tasks_);
    }
    for (Task& t : tasks) runGuarded("mesh-handshake (stopping)", "a task", t);
  }
}

void Reactor::fireTimers() {
  Clock::time_point now = Clock::now();
  for (size_t i = 0; i < timers_.size();) {
    if (timers_[i].due > now) {
      ++i;
      continue;
    }
    timers_[i].due = now + timers_[i].period;
    // A copy: were a timer to add one (addTimer appends), timers_ could move under the
    // running function. Only appends can happen meanwhile, so index i stays this timer's.
    std::function<bool(Clock::time_point)> fn = timers_[i].fn;
    bool again = true;  // a timer that threw fires again next period
    runGuarded("mesh-handshake", "a timer", [&] { again = fn(now); });
    if (again) {
      ++i;
    } else {
      timers_.erase(timers_.begin() + static_cast<long>(i));
    }
  }
}

int Reactor::nextTimeoutMs() const {
  if (timers_.empty()) return 1000;
  Clock::time_point now = Clock::now();
  Clock::time_point due = timers_.front().due;
  for (const Timer& t : timers_) due = std::min(due, t.due);
  if (due <= now) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(due - now).count() + 1;
  return static_cast<int>(std::min<long long>(ms, 1000));
}

void Reactor::run() {
  threadId_.store(std::this_thread::get_id());
  epoll_event events[64];
  while (!stopping_.load(std::memory_order_acquire)) {
    int n = epoll_wait(epollFd_, events, 64, nextTimeoutMs());
    if (n < 0 && errno != EINTR) {
      MESH_WARN("epoll_wait failed: %s; handshake reactor stops", strerror(errno));
      stopping_.store(true, std::memory_order_release);  // finalDrain: post() refuses
      break;
    }
    for (int i = 0; i < n && !stopping_.load(std::memory_order_acquire); ++i) {
      int fd = events[i].data.fd;
      if (fd == wakeFd_) continue;
      auto it = handlers_.find(fd);
      if (it != handlers_.end()) {
        Handler h = it->second;  // the handler may unwatch itself
        uint32_t ev = events[i].events;
        runGuarded("mesh-handshake", "a socket's handler", [&] { h(ev); });
      }
    }
    drainTasks();
    fireTimers();
  }
  finalDrain();
  threadId_.store(std::thread::id());
}

}  // namespace mesh
