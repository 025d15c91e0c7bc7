// SPDX-License-Identifier: Apache-2.0
// The reader side of the live counters (mesh/stats/stats.h): every process's file, mapped
// read-only, validated, copied out with atomic loads; stale files of dead processes; sums
// and deltas.
#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <type_traits>
#include <string>

#include "mesh/platform/sysinfo.h"
#include "mesh/stats/stats.h"

namespace mesh {
namespace stats {

namespace {

std::string nameOf(const char* field, size_t cap) { return std::string(field, strnlen(field, cap)); }

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <typename T>
void addInto(std::vector<T>* rows, const T& row) {
  for (T& r : *rows) {
    if (r.sameKey(row)) {
      r.txBytes += row.txBytes;
      r.rxBytes += row.rxBytes;
      r.errors += row.errors;
      if constexpr (std::is_same<T, LinkCount>::value) {
        r.txOps += row.txOps;
      } else {
        r.opened += row.opened;
        r.closed += row.closed;
      }
      return;
    }
  }
  rows->push_back(row);
}

uint64_t minus(uint64_t after, uint64_t before) { return after > before ? after - before : 0; }

template <typename T>
T subtract(const T& after, const T& before) {
  T d = after;
  d.txBytes = minus(after.txBytes, before.txBytes);
  d.rxBytes = minus(after.rxBytes, before.rxBytes);
  d.errors = minus(after.errors, before.errors);
  if constexpr (std::is_same<T, LinkCount>::value) {
    d.txOps = minus(after.txOps, before.txOps);
  } else {
    d.opened = minus(after.opened, before.opened);
    d.closed = minus(after.closed, before.closed);
  }
  return d;
}

// Every row of `after` less its row in `before` (a row new since then: all of it), into *out.
template <typename T>
void addDeltas(std::vector<T>* out, const std::vector<T>& after, const std::vector<T>* before) {
  for (const T& a : after) {
    T d = a;
    if (before != nullptr) {
      for (const T& o : *before) {
        if (o.sameKey(a)) d = subtract(a, o);
      }
    }
    addInto(out, d);
  }
}

}  // namespace

uint64_t processStartTicks(int64_t pid) {
  std::string text, err;
  if (!readTextFile("/proc/" + std::to_string(pid) + "/stat", &text, &err, 4096)) return 0;
  // "pid (comm) state ..." : comm may hold spaces and parentheses; fields resume after the
  // last ')'. starttime is field 22, the 20th after the comm.
  size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  size_t pos = close + 1;
  for (int field = 3; field <= 22; ++field) {
    while (pos < text.size() && text[pos] == ' ') ++pos;
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    if (field == 22) return strtoull(text.substr(pos, end - pos).c_str(), nullptr, 10);
    pos = end;
  }
  return 0;
}

uint64_t pidNamespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

bool processAlive(int64_t pid, uint64_t startTicks) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  if (startTicks == 0) return true;
  uint64_t now = processStartTicks(pid);
  return now == 0 || now == startTicks;  // unknown: believe the pid
}

bool readFile(const std::string& path, ProcessCounts* out, std::string* why) {
  // O_NONBLOCK: a FIFO named *.stats (anyone may create one in a shared directory) would
  // block the open until a writer came; the type is checked right after.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    *why = std::string("cannot open: ") + strerror(errno);
    return false;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *why = "not a regular file";
    close(fd);
    return false;
  }
  if (static_cast<size_t>(st.st_size) < sizeof(StatsHeader)) {
    *why = "too short for a stats file (" + std::to_string(st.st_size) + " bytes)";
    close(fd);
    return false;
  }
  size_t len = static_cast<size_t>(st.st_size);
  void* mem = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (mem == MAP_FAILED) {
    *why = std::string("cannot map: ") + strerror(errno);
    return false;
  }
  const StatsFile* f = static_cast<const StatsFile*>(mem);
  const StatsHeader& h = f->header;
  bool ok = false;
  if (__atomic_load_n(&h.magic, __ATOMIC_ACQUIRE) != kMagic) {
    *why = "not an nccl-mesh stats file (bad magic)";
  } else if (h.version != kLayoutVersion) {
    *why = "layout version " + std::to_string(h.version) + ", this reader knows " + std::to_string(kLayoutVersion) +
           " (a plugin of another release)";
  } else if (h.fileBytes != sizeof(StatsFile) || len < sizeof(StatsFile) || h.headerBytes != sizeof(StatsHeader) ||
             h.linkCap != kMaxLinkSlots || h.flowCap != kMaxFlowSlots) {
    *why = "unexpected size (" + std::to_string(len) + " bytes)";
  } else {
    ok = true;
  }
  if (!ok) {
    munmap(mem, len);
    return false;
  }
  ProcessCounts p;
  p.pid = h.pid;
  p.startTicks = h.startTicks;
  p.pidNs = h.pidNs;
  p.host = nameOf(h.host, sizeof(h.host));
  p.process = nameOf(h.process, sizeof(h.process));
  for (int e = 0; e < kEventCount; ++e) p.events[e] = load(&h.events[e]);
  for (const LinkSlot& l : f->links) {
    // Slots are claimed in order: the first free one ends the list.
    if (__atomic_load_n(&l.state, __ATOMIC_ACQUIRE) != 1) break;
    LinkCount c;
    c.device = nameOf(l.device, sizeof(l.device));
    c.port = static_cast<int>(l.port);
    c.localAddr = l.localAddr;
    c.peerAddr = l.peerAddr;
    c.txBytes = load(&l.txBytes);
    c.rxBytes = load(&l.rxBytes);
    c.txOps = load(&l.txOps);
    c.errors = load(&l.errors);
    p.links.push_back(c);
  }
  for (const FlowSlot& fl : f->flows) {
    if (__atomic_load_n(&fl.state, __ATOMIC_ACQUIRE) != 1) break;
    FlowCount c;
    c.kind = static_cast<FlowKind>(fl.kind);
    c.peerAddr = fl.peerAddr;
    c.viaAddr = fl.viaAddr;
    c.originAddr = fl.originAddr;
    c.txBytes = load(&fl.txBytes);
    c.rxBytes = load(&fl.rxBytes);
    c.opened = load(&fl.opened);
    c.closed = load(&fl.closed);
    c.errors = load(&fl.errors);
    p.flows.push_back(c);
  }
  munmap(mem, len);
  *out = std::move(p);
  return true;
}

ReadResult readDir(const std::string& dir, bool removeStale, AliveCheck alive) {
  ReadResult r;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    if (errno != ENOENT) r.warnings.push_back("cannot read " + dir + ": " + strerror(errno));
    return r;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name[0] != '.' && endsWith(name, ".stats")) names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  const uint64_t myNs = pidNamespace();
  for (const std::string& name : names) {
    std::string path = dir + "/" + name;
    ProcessCounts p;
    std::string why;
    if (!readFile(path, &p, &why)) {
      if (why.rfind("cannot open", 0) == 0 && errno == ENOENT) continue;  // ended while we listed
      r.warnings.push_back(path + ": " + why);
      continue;
    }
    bool foreignNs = p.pidNs != 0 && myNs != 0 && p.pidNs != myNs;
    if (!foreignNs && !alive(p.pid, p.startTicks)) {
      struct stat st {};
      bool ours = lstat(path.c_str(), &st) == 0 && st.st_uid == geteuid();
      if (removeStale && ours && unlink(path.c_str()) == 0) {
        r.removed.push_back(path + " (pid " + std::to_string(p.pid) + " is gone)");
      } else {
        ++r.staleSkipped;
      }
      continue;
    }
    p.file = name;
    r.processes.push_back(std::move(p));
  }
  return r;
}

std::vector<std::string> readerDirs(const std::string& dir) {
  if (!dir.empty()) return {dir};
  std::vector<std::string> dirs{defaultDir()};
  if (geteuid() == 0) {
    glob_t g{};
    if (glob("/dev/shm/nccl-mesh-*", GLOB_ONLYDIR, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        if (std::find(dirs.begin(), dirs.end(), g.gl_pathv[i]) == dirs.end()) dirs.push_back(g.gl_pathv[i]);
      }
    }
    globfree(&g);
  }
  return dirs;
}

Totals merge(const std::vector<ProcessCounts>& processes) {
  Totals t;
  t.processes = static_cast<int>(processes.size());
  for (const ProcessCounts& p : processes) {
    for (int e = 0; e < kEventCount; ++e) t.events[e] += p.events[e];
    for (const LinkCount& l : p.links) addInto(&t.links, l);
    for (const FlowCount& f : p.flows) addInto(&t.flows, f);
  }
  return t;
}

Totals deltas(const std::vector<ProcessCounts>& before, const std::vector<ProcessCounts>& after) {
  Totals t;
  t.processes = static_cast<int>(after.size());
  for (const ProcessCounts& a : after) {
    const ProcessCounts* b = nullptr;
    for (const ProcessCounts& c : before) {
      if (c.file == a.file && c.pid == a.pid) b = &c;
    }
    for (int e = 0; e < kEventCount; ++e) t.events[e] += b != nullptr ? minus(a.events[e], b->events[e]) : a.events[e];
    addDeltas(&t.links, a.links, b != nullptr ? &b->links : nullptr);
    addDeltas(&t.flows, a.flows, b != nullptr ? &b->flows : nullptr);
  }
  return t;
}

void foldDeparted(const std::vector<ProcessCounts>& before, const std::vector<ProcessCounts>& after,
                  std::vector<ProcessCounts>* departed) {
  for (const ProcessCounts& b : before) {
    bool ended = true;
    for (const ProcessCounts& a : after) ended = ended && !(a.file == b.file && a.pid == b.pid);
    if (!ended) continue;
    // One row for all of them, summed by key: a reader that runs for weeks beside jobs that
    // come and go keeps one row per link and flow, not one process record per job.
    if (departed->empty()) {
      departed->emplace_back();
      departed->back().file = kDepartedFile;
    }
    ProcessCounts& sum = departed->front();
    for (int e = 0; e < kEventCount; ++e) sum.events[e] += b.events[e];
    for (const LinkCount& l : b.links) addInto(&sum.links, l);
    for (FlowCount f : b.flows) {
      f.closed = f.opened;  // its comms are closed now
      addInto(&sum.flows, f);
    }
  }
}

}  // namespace stats
}  // namespace mesh
