// SPDX-License-Identifier: Apache-2.0
// plugin_threads.h: counts the plugin's own threads in this process, for the ABI load tests.
//
// The plugin names its one thread (the handshake reactor) "mesh-handshake"; see
// Reactor::kThreadName in include/mesh/connect/reactor.h (the unit test Reactor.ThreadIsNamed pins it).
// Counting by name, not all of /proc/self/task, keeps these checks true whatever else runs
// in the process: a thread joined by an earlier test may stay listed a moment after
// pthread_join returns, and a loaded library may start threads of its own.
#pragma once

#include <dirent.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace abitest {

constexpr const char* kPluginThreadName = "mesh-handshake";

// Threads of this process named kPluginThreadName; -1 when /proc/self/task cannot be read.
inline int pluginThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    if (std::getline(comm, name) && name == kPluginThreadName) ++n;
  }
  closedir(dir);
  return n;
}

// pthread_join returns once the thread has left user code; the kernel may list the task a
// moment longer. Polls until the count is `want` or 5 s pass, and returns the last count.
inline int waitForPluginThreads(int want) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int n = pluginThreadCount();
  while (n != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = pluginThreadCount();
  }
  return n;
}

}  // namespace abitest
