// SPDX-License-Identifier: Apache-2.0
#include "rendezvous.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace e2e {
namespace {

bool readWhole(const std::string& path, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string data;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  *out = data;
  return true;
}

// Poll interval for files: short, but each stat over 9p is a round trip to the host.
constexpr int kFilePollMicros = 2000;
// Check other ranks' abort files every this many polls.
constexpr unsigned kAbortCheckEvery = 25;

}  // namespace

Rendezvous::Rendezvous(const std::string& sharedDir, const std::string& scenario,
                       const std::string& runId, int rank, int nodes)
    : dir_(sharedDir + "/e2e." + scenario + "." + runId), rank_(rank), nodes_(nodes) {
  if (mkdir(dir_.c_str(), 0777) != 0 && errno != EEXIST) {
    fail("cannot create the rendezvous directory %s: %s (is VMESH_SHARED/--shared writable?)",
         dir_.c_str(), strerror(errno));
  }
}

void Rendezvous::publish(const std::string& name, const std::string& bytes) {
  std::string final = path(name);
  std::string tmp = format("%s/.tmp.%s.%d.%d", dir_.c_str(), name.c_str(), rank_,
                           static_cast<int>(getpid()));
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create %s: %s", tmp.c_str(), strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      fail("cannot write %s: %s", tmp.c_str(), strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) fail("cannot close %s: %s", tmp.c_str(), strerror(errno));
  if (rename(tmp.c_str(), final.c_str()) != 0) {
    fail("cannot rename %s to %s: %s", tmp.c_str(), final.c_str(), strerror(errno));
  }
}

bool Rendezvous::exists(const std::string& name) const {
  struct stat st;
  return stat(path(name).c_str(), &st) == 0;
}

bool Rendezvous::tryFetch(const std::string& name, std::string* bytes) {
  if (++polls_ % kAbortCheckEvery == 0) checkAborts();
  return readWhole(path(name), bytes);
}

std::string Rendezvous::fetch(const std::string& name, const Deadline& deadline,
                              const std::string& why) {
  std::string bytes;
  while (!tryFetch(name, &bytes)) {
    if (deadline.expired()) {
      fail("timed out (%s) waiting for %s in %s: %s", deadline.what().c_str(), name.c_str(),
           dir_.c_str(), why.c_str());
    }
    pollPause(kFilePollMicros);
  }
  return bytes;
}

void Rendezvous::barrier(const std::string& name, const Deadline& deadline) {
  publish(format("bar.%s.%d", name.c_str(), rank_), "");
  for (int r = 0; r < nodes_; ++r) {
    if (r == rank_) continue;
    fetch(format("bar.%s.%d", name.c_str(), r), deadline,
          format("barrier '%s': rank %d has not arrived", name.c_str(), r));
  }
}

void Rendezvous::abort(const std::string& reason) noexcept {
  try {
    publish(format("abort.%d", rank_), reason);
  } catch (...) {
  }
}

void Rendezvous::checkAborts() {
  for (int r = 0; r < nodes_; ++r) {
    if (r == rank_) continue;
    std::string reason;
    if (readWhole(path(format("abort.%d", r)), &reason)) {
      fail("rank %d failed first, stopping too (its reason: %s)", r, reason.c_str());
    }
  }
}

}  // namespace e2e
