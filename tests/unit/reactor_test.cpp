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
#include <vector>

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

// post() returning true is a promise that the task runs, on the reactor thread: tasks posted
// while stop() waits for the loop (mostly socket closes before an unload) are accepted and
// run before the thread ends; only then does post() refuse.
TEST(Reactor, EveryTaskAcceptedWhileStoppingRunsOnTheReactorThread) {
  Reactor r;
  ASSERT_EQ(r.start(), ncclSuccess);
  std::promise<std::thread::id> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ASSERT_TRUE(r.post([&started, released] {
    started.set_value(std::this_thread::get_id());
    released.wait();  // holds the loop inside this batch
  }));
  std::future<std::thread::id> loopThread = started.get_future();
  ASSERT_EQ(loopThread.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  std::thread::id reactorId = loopThread.get();
  std::thread stopper([&r] { r.stop(); });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (r.serving() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_FALSE(r.serving()) << "stop() never began";
  std::atomic<int> ran{0}, elsewhere{0};
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(r.post([&] {
      ran.fetch_add(1);
      if (std::this_thread::get_id() != reactorId) elsewhere.fetch_add(1);
    })) << "a task posted while stop() waits for the loop is refused";
  }
  release.set_value();
  stopper.join();
  EXPECT_EQ(ran.load(), 100);
  EXPECT_EQ(elsewhere.load(), 0);
  EXPECT_FALSE(r.running());
  EXPECT_FALSE(r.post([] {})) << "post() after stop()";
}

// A post() that races stop() wrote to the wake-up eventfd after stop() had closed it (EBADF,
// or 8 bytes into whatever file reused the number): the write is now under the queue's lock.
TEST(Reactor, APostRacingStopNeverWritesToAClosedWakeFd) {
  testing_support::WarnCapture warnings;
  for (int round = 0; round < 200; ++round) {
    Reactor r;
    ASSERT_EQ(r.start(), ncclSuccess);
    std::atomic<int> going{0};
    std::vector<std::thread> posters;
    for (int t = 0; t < 3; ++t) {
      posters.emplace_back([&] {
        going.fetch_add(1);
        while (r.post([] {})) {
        }
      });
    }
    while (going.load() < 3) std::this_thread::yield();
    r.stop();
    for (std::thread& t : posters) t.join();
  }
  for (const std::string& w : warnings.lines()) ADD_FAILURE() << w;
}

// Work that must happen whether or not the thread still runs (closing a socket it watches)
// goes through postOrRun(): while the loop is stopping the work is queued behind the loop's
// last tasks, never run on the caller's thread beside them (both touched the handler table);
// once the thread has ended it runs inline.
TEST(Reactor, PostOrRunNeverRunsBesideTheLoopsLastTasks) {
  Reactor r;
  ASSERT_EQ(r.start(), ncclSuccess);
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> loopTaskRunning{false};
  ASSERT_TRUE(r.post([&] {
    loopTaskRunning.store(true);
    started.set_value();
    released.wait();
    loopTaskRunning.store(false);
  }));
  ASSERT_EQ(started.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);
  std::thread stopper([&r] { r.stop(); });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (r.serving() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_FALSE(r.serving()) << "stop() never began";
  std::atomic<int> ran{0};
  std::atomic<bool> besideTheLoop{false};
  bool posted = r.postOrRun("a test close", [&] {
    if (loopTaskRunning.load()) besideTheLoop.store(true);
    ran.fetch_add(1);
  });
  release.set_value();
  stopper.join();
  EXPECT_TRUE(posted);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(besideTheLoop.load()) << "the work ran on the caller's thread while the loop's task still ran";
  std::thread::id inlineOn;
  EXPECT_FALSE(r.postOrRun("a test close", [&] { inlineOn = std::this_thread::get_id(); }));
  EXPECT_EQ(inlineOn, std::this_thread::get_id()) << "after stop(): inline, on the caller's thread";
}

}  // namespace
}  // namespace mesh
