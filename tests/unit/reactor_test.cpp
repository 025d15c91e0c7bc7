// SPDX-License-Identifier: Apache-2.0
// The handshake reactor: tasks run on its thread, fd handlers fire, timers repeat and stop,
// and stop() joins the thread (no thread outlives it).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "mesh/connect/reactor.h"
#include "warn_capture.h"

namespace mesh {
namespace {

TEST(Reactor, RunsPostedTasksOnItsOwnThread) {
  Reactor r;
  ASSERT_EQ(r.start(), ncclSuccess);
  std::promise<std::thread::id> where;
  ASSERT_TRUE(r.post([&] { where.set_value(std::this_thread::get_id()); }));
  auto f = where.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_NE(f.get(), std::this_thread::get_id());
  r.stop();
  EXPECT_FALSE(r.running());
  EXPECT_FALSE(r.post([] {}));
}

// The ABI load tests (tests/abi/plugin_threads.h) find the plugin's thread by this name.
TEST(Reactor, ThreadIsNamed) {
  Reactor r;
  ASSERT_EQ(r.start(), ncclSuccess);
  std::promise<std::string> name;
  ASSERT_TRUE(r.post([&] {
    char buf[16] = {};
    pthread_getname_np(pthread_self(), buf, sizeof(buf));
    name.set_value(buf);
  }));
  auto f = name.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(f.get(), "mesh-handshake");
  EXPECT_STREQ(Reactor::kThreadName, "mesh-handshake");
  r.stop();
}

TEST(Reactor, DispatchesReadableFd) {
  Reactor r;
  ASSERT_EQ(r.start(), ncclSuccess);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
  std::promise<char> got;
  r.post([&] {
    r.watch(sv[0], EPOLLIN, [&](uint32_t) {
      char c = 0;
      if (read(sv[0], &c, 1) == 1) got.set_value(c);
      r.unwatch(sv[0]);
    });
  });
  ASSERT_EQ(write(sv[1], "x", 1), 1);
  auto f = got.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(f.get(), 'x');
  r.stop();
  close(sv[0]);
  close(sv[1]);
}

TEST(Reactor, TimerRepeatsUntilItReturnsFalse) {
  Reactor r;
  ASSERT_EQ(r.start(), ncclSuccess);
  std::atomic<int> fired{0};
  std::promise<void> done;
  r.post([&] {
    r.addTimer(std::chrono::milliseconds(1), [&](Reactor::Clock::time_point) {
      if (++fired == 3) {
        done.set_value();
        return false;
      }
      return true;
    });
  });
  ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);
  r.stop();
  EXPECT_EQ(fired.load(), 3);
}

// What a task, a socket's handler or a timer throws (std::bad_alloc, say) is logged and the
// reactor goes on: out of its thread, an exception calls std::terminate and aborts NCCL's
// process. A timer that threw fires again; so does a handler whose fd is still readable.
TEST(Reactor, AnExceptionInATaskHandlerOrTimerIsLoggedAndTheThreadGoesOn) {
  testing_support::WarnCapture warnings;
  Reactor r;
  ASSERT_EQ(r.start(), ncclSuccess);
  ASSERT_TRUE(r.post([] { throw std::runtime_error("task boom"); }));
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  std::atomic<int> handlerCalls{0};
  std::atomic<int> timerCalls{0};
  std::promise<void> bothAgain;
  std::atomic<bool> told{false};
  auto maybeDone = [&] {
    if (handlerCalls.load() >= 2 && timerCalls.load() >= 2 && !told.exchange(true)) bothAgain.set_value();
  };
  ASSERT_TRUE(r.post([&] {
    ASSERT_EQ(r.watch(fds[0], EPOLLIN, [&](uint32_t) {
      if (++handlerCalls == 1) throw std::bad_alloc();
      char c;
      while (read(fds[0], &c, 1) > 0) {
      }
      maybeDone();
    }), ncclSuccess);
    r.addTimer(std::chrono::milliseconds(1), [&](Reactor::Clock::time_point) -> bool {
      if (++timerCalls == 1) throw 42;
      maybeDone();
      return timerCalls.load() < 2;
    });
  }));
  ASSERT_EQ(write(fds[1], "x", 1), 1);
  ASSERT_EQ(bothAgain.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "handler calls " << handlerCalls.load() << ", timer calls " << timerCalls.load();
  std::promise<void> after;
  ASSERT_TRUE(r.post([&] { after.set_value(); }));
  EXPECT_EQ(after.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);
  r.post([&] { r.unwatch(fds[0]); });
  r.stop();
  close(fds[0]);
  close(fds[1]);
  std::string all;
  for (const std::string& w : warnings.lines()) all += w + "\n";
  // At most one line a second: the first of the three is certain, with its reason.
  EXPECT_NE(all.find("mesh-handshake: a task failed: task boom; it goes on"), std::string::npos) << all;
}

TEST(Reactor, StopIsIdempotentAndRestartable) {
  Reactor r;
  ASSERT_EQ(r.start(), ncclSuccess);
  r.stop();
  r.stop();
  ASSERT_EQ(r.start(), ncclSuccess);
  std::promise<void> ran;
  ASSERT_TRUE(r.post([&] { ran.set_value(); }));
  EXPECT_EQ(ran.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);
  r.stop();
}

// post() returning true is a promise that the task runs: tasks still queued when stop()
// ends the loop run on the stopping thread (they are mostly socket closes before unload).
TEST(Reactor, EveryAcceptedTaskRunsEvenWhenStopComesFirst) {
  Reactor r;
  ASSERT_EQ(r.start(), ncclSuccess);
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  ASSERT_TRUE(r.post([&started, released] {
    started.set_value();
    released.wait();  // holds the loop inside this batch
  }));
  ASSERT_EQ(started.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);
  std::atomic<int> ran{0};
  int accepted = 0;
  for (int i = 0; i < 100; ++i) accepted += r.post([&ran] { ran.fetch_add(1); });
  std::thread stopper([&r] { r.stop(); });
  // Keep posting until stop() has begun refusing; every accepted task must still run.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (r.post([&ran] { ran.fetch_add(1); }) && std::chrono::steady_clock::now() < deadline) ++accepted;
  bool refused = !r.post([] {});
  release.set_value();
  stopper.join();
  EXPECT_TRUE(refused) << "post() kept accepting tasks after stop() began";
  EXPECT_EQ(accepted >= 100, true);
  EXPECT_EQ(ran.load(), accepted);
  EXPECT_FALSE(r.running());
}

}  // namespace
}  // namespace mesh
