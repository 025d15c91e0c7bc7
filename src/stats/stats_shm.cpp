// SPDX-License-Identifier: Apache-2.0
// The writer side of the live counters (mesh/stats/stats.h): the stats directory, the file,
// and the slots comms count into.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "mesh/platform/sysinfo.h"
#include "mesh/platform/text.h"
#include "mesh/stats/stats.h"

namespace mesh {
namespace stats {

namespace {

struct Published {
  std::mutex mutex;
  StatsFile* file = nullptr;  // mapped shared; nullptr: not published (comms count into their sinks)
  char path[4096] = {};
  pid_t owner = 0;
  int links = 0, flows = 0;
  dev_t fileDev = 0;  // the file we created: close() unlinks the path only while it still is
  ino_t fileIno = 0;
};

// Constant-initialized and trivially destroyed (no heap, nothing for a static destructor to
// undo): NCCL may dlclose the library, and whatever static state still pointed to would leak.
Published gState;
Published& state() { return gState; }

void copyName(char* dst, size_t cap, const std::string& src) {
  size_t n = src.size() < cap - 1 ? src.size() : cap - 1;
  memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

std::string processName() {
  std::string text, err;
  if (!readTextFile("/proc/self/comm", &text, &err, 256)) return "?";
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

std::string host() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

std::string defaultDir() { return "/dev/shm/nccl-mesh-" + std::to_string(geteuid()); }

bool prepareDir(const std::string& dir, std::string* why) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = "cannot create " + dir + ": " + strerror(errno);
    return false;
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) {
    *why = "cannot stat " + dir + ": " + strerror(errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    *why = dir + " is not a directory";
    return false;
  }
  if (st.st_uid != geteuid()) {
    *why = dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to us (uid " + std::to_string(geteuid()) +
           "): set NCCL_MESH_STATS_DIR to a directory of our own";
    return false;
  }
  if ((st.st_mode & 022) != 0) {
    *why = dir + " is writable by others (mode " + strf("%03o", static_cast<unsigned>(st.st_mode & 0777)) +
           "): the counters are not published there";
    return false;
  }
  return true;
}

bool Publisher::open(const std::string& dirIn, std::string* path, std::string* why) {
  Published& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.file != nullptr) {
    *path = s.path;
    return true;
  }
  std::string dir = dirIn.empty() ? defaultDir() : dirIn;
  if (!prepareDir(dir, why)) return false;
  static unsigned loads = 0;
  // The PID namespace is in the name: containers sharing /dev/shm (--ipc=host) have the
  // host's hostname, and their ranks often the same pid; without it one process's file was
  // renamed over another's, and its close deleted the other's, still live.
  std::string name = host() + "." + std::to_string(getpid()) + "." + std::to_string(++loads) + "." +
                     std::to_string(pidNamespace()) + ".stats";
  std::string final = dir + "/" + name;
  std::string tmp = dir + "/." + name + ".tmp";
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    *why = "cannot create " + tmp + ": " + strerror(errno);
    return false;
  }
  auto failWith = [&](const std::string& text) {
    *why = text + ": " + strerror(errno);
    ::close(fd);
    unlink(tmp.c_str());
    return false;
  };
  if (ftruncate(fd, sizeof(StatsFile)) != 0) return failWith("cannot size " + tmp);
  struct stat created {};
  if (fstat(fd, &created) != 0) return failWith("cannot stat " + tmp);
  void* mem = mmap(nullptr, sizeof(StatsFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return failWith("cannot map " + tmp);
  ::close(fd);
  // A forked child must not write into (nor inherit a view of) the parent's counters.
  madvise(mem, sizeof(StatsFile), MADV_DONTFORK);
  StatsFile* f = static_cast<StatsFile*>(mem);
  StatsHeader& h = f->header;
  h.version = kLayoutVersion;
  h.headerBytes = sizeof(StatsHeader);
  h.fileBytes = sizeof(StatsFile);
  h.pid = getpid();
  h.startTicks = processStartTicks(getpid());
  h.pidNs = pidNamespace();
  h.startUnixNs = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  h.linkCap = kMaxLinkSlots;
  h.flowCap = kMaxFlowSlots;
  copyName(h.host, sizeof(h.host), host());
  copyName(h.process, sizeof(h.process), processName());
  __atomic_store_n(&h.magic, kMagic, __ATOMIC_RELEASE);
  if (rename(tmp.c_str(), final.c_str()) != 0) {
    *why = "cannot rename " + tmp + " to " + final + ": " + strerror(errno);
    munmap(mem, sizeof(StatsFile));
    unlink(tmp.c_str());
    return false;
  }
  if (final.size() >= sizeof(s.path)) {
    *why = "path too long: " + final;
    munmap(mem, sizeof(StatsFile));
    unlink(final.c_str());
    return false;
  }
  s.file = f;
  copyName(s.path, sizeof(s.path), final);
  s.owner = getpid();
  s.links = s.flows = 0;
  s.fileDev = created.st_dev;
  s.fileIno = created.st_ino;
  *path = final;
  return true;
}

void Publisher::close(bool unmap) {
  Published& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.file == nullptr) return;
  if (getpid() != s.owner) return;  // a forked child: the parent's file is not ours
  // Every comm is closed before this (Plugin::shutdown): none counts into the mapping any
  // more. Where some may still live (the relay's exit path) the caller keeps it mapped.
  struct stat now {};
  if (lstat(s.path, &now) == 0 && now.st_dev == s.fileDev && now.st_ino == s.fileIno) unlink(s.path);
  if (unmap) munmap(s.file, sizeof(StatsFile));
  s.file = nullptr;
  s.path[0] = '\0';
}

bool Publisher::active() {
  Published& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.file != nullptr && getpid() == s.owner;
}

LinkSlot* Publisher::link(const std::string& device, int port, uint32_t localAddr, uint32_t peerAddr) {
  Published& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.file == nullptr || getpid() != s.owner) return nullptr;
  for (int i = 0; i < s.links; ++i) {
    LinkSlot& l = s.file->links[i];
    if (static_cast<int>(l.port) == port && l.localAddr == localAddr && l.peerAddr == peerAddr &&
        strncmp(l.device, device.c_str(), kNameBytes) == 0) {
      return &l;
    }
  }
  if (s.links == kMaxLinkSlots) {
    add(&s.file->header.events[kSlotsFull], 1);
    return nullptr;
  }
  LinkSlot& l = s.file->links[s.links++];
  copyName(l.device, sizeof(l.device), device);
  l.port = static_cast<uint32_t>(port);
  l.localAddr = localAddr;
  l.peerAddr = peerAddr;
  __atomic_store_n(&l.state, 1u, __ATOMIC_RELEASE);
  return &l;
}

uint64_t* Publisher::relayPathCounter(const LinkSlot* slot) {
  // Process-local and never freed: a comm may hold its pointer past a close of the file.
  static uint64_t counters[kMaxLinkSlots];
  Published& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.file == nullptr || slot < s.file->links || slot >= s.file->links + kMaxLinkSlots) return nullptr;
  return &counters[slot - s.file->links];
}

FlowSlot* Publisher::flow(FlowKind kind, uint32_t peerAddr, uint32_t viaAddr, uint32_t originAddr) {
  Published& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.file == nullptr || getpid() != s.owner) return nullptr;
  for (int i = 0; i < s.flows; ++i) {
    FlowSlot& f = s.file->flows[i];
    if (f.kind == static_cast<uint32_t>(kind) && f.peerAddr == peerAddr && f.viaAddr == viaAddr &&
        f.originAddr == originAddr) {
      return &f;
    }
  }
  if (s.flows == kMaxFlowSlots) {
    add(&s.file->header.events[kSlotsFull], 1);
    return nullptr;
  }
  FlowSlot& f = s.file->flows[s.flows++];
  f.kind = static_cast<uint32_t>(kind);
  f.peerAddr = peerAddr;
  f.viaAddr = viaAddr;
  f.originAddr = originAddr;
  __atomic_store_n(&f.state, 1u, __ATOMIC_RELEASE);
  return &f;
}

void Publisher::event(int e, uint64_t n) {
  if (e < 0 || e >= kEventCount) return;
  Published& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.file == nullptr || getpid() != s.owner) return;
  add(&s.file->header.events[e], n);
}

}  // namespace stats
}  // namespace mesh
