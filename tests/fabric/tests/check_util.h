// SPDX-License-Identifier: Apache-2.0
// Support for the fabric's multi-process check programs (run on every node by
// scripts/fabric-net): failures, deadlines, and a two-rank rendezvous through files in
// $VMESH_SHARED (written under a temporary name, then renamed; read by polling with a
// deadline). A rank that fails writes abort.<rank>, which stops the other at its next wait.
// Each program prints "PASS <name> rank=<r> ..." or "FAIL <name> rank=<r>: <why>".
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace check {

class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline std::string vformat(const char* fmt, va_list ap) {
  char buf[2048];
  vsnprintf(buf, sizeof(buf), fmt, ap);
  return buf;
}

[[noreturn]] inline void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  throw Failure(s);
}

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class Deadline {
 public:
  explicit Deadline(double seconds)
      : at_(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds))) {}
  bool expired() const { return Clock::now() > at_; }

 private:
  Clock::time_point at_;
};

inline int envInt(const char* name, int def) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? atoi(v) : def;
}

class Rank {
 public:
  explicit Rank(std::string name)
      : name(std::move(name)), rank(envInt("VMESH_RANK", -1)), nodes(envInt("VMESH_NODES", 0)) {
    const char* s = getenv("VMESH_SHARED");
    dir_ = s != nullptr ? s : "";
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (rank < 0 || nodes < 2 || dir_.empty()) {
      printf("FAIL %s: run on 2+ nodes under scripts/fabric-net (VMESH_RANK, VMESH_NODES, VMESH_SHARED)\n",
             this->name.c_str());
      exit(2);
    }
  }

  int peer() const { return rank == 0 ? 1 : 0; }

  void publish(const std::string& key, const std::string& bytes) {
    std::string path = dir_ + "/" + name + "." + key;
    std::string tmp = path + ".tmp" + std::to_string(getpid());
    {
      std::ofstream out(tmp, std::ios::binary);
      out << bytes;
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) fail("rename %s: %s", path.c_str(), strerror(errno));
  }

  std::string fetch(const std::string& key, double seconds = 60) {
    std::string path = dir_ + "/" + name + "." + key;
    Deadline dl(seconds);
    for (;;) {
      std::ifstream in(path, std::ios::binary);
      if (in) {
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
      }
      checkAbort();
      if (dl.expired()) fail("rank %d: '%s' never appeared (the other rank is gone?)", rank, key.c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  template <typename T>
  T exchange(const T& mine, const std::string& what = "info") {
    publish(what + "." + std::to_string(rank), std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)));
    std::string theirs = fetch(what + "." + std::to_string(peer()));
    if (theirs.size() != sizeof(T)) fail("'%s' from rank %d has %zu bytes", what.c_str(), peer(), theirs.size());
    T out;
    memcpy(&out, theirs.data(), sizeof(T));
    return out;
  }

  void barrier(const std::string& what) {
    publish("bar." + what + "." + std::to_string(rank), "");
    for (int r = 0; r < nodes; ++r) fetch("bar." + what + "." + std::to_string(r));
  }

  void checkAbort() {
    for (int r = 0; r < nodes; ++r) {
      if (r == rank) continue;
      std::ifstream in(dir_ + "/" + name + ".abort." + std::to_string(r));
      if (in) {
        std::string why;
        std::getline(in, why);
        fail("rank %d failed: %s", r, why.c_str());
      }
    }
  }

  void pass(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    printf("PASS %s rank=%d %s\n", name.c_str(), rank, s.c_str());
  }

  int failed(const std::string& why) {
    printf("FAIL %s rank=%d: %s\n", name.c_str(), rank, why.c_str());
    fflush(stdout);
    publish("abort." + std::to_string(rank), why);
    return 1;
  }

  const std::string name;
  const int rank;
  const int nodes;

 private:
  std::string dir_;
};

}  // namespace check
