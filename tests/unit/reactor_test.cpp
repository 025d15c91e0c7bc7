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
#include <string>
#include <thread>

#include "mesh/connect/reactor.h"

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
