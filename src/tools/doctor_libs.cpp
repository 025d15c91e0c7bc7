// SPDX-License-Identifier: Apache-2.0
// Which NCCL a job would load and whether it would load this plugin: the libnccl.so.2 of
// PyTorch in the current Python (found from python3's sys.path without importing torch), the
// one the dynamic loader finds by name, and the plugin NCCL_NET_PLUGIN names. Each library is
// loaded only in a forked child with a deadline, so a broken one (a crash in a constructor, a
// hang) is a verdict and not the doctor's end.
#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <link.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>

#include "mesh/platform/text.h"
#include "mesh/tools/doctor.h"

namespace mesh {

namespace {

bool fileExists(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::vector<std::string> splitOn(const std::string& text, const std::string& seps) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find_first_of(seps, start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Directories named by an ld.so.conf file and the files it includes (depth-limited).
void ldSoConfDirs(const std::string& root, const std::string& file, int depth,
                  std::vector<std::pair<std::string, std::string>>* dirs) {
  std::string text, error;
  if (depth > 4 || !readTextFile(root + file, &text, &error)) return;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    line = trim(line.substr(0, line.find('#')));
    if (line.rfind("include", 0) == 0 && line.size() > 7 && isspace(static_cast<unsigned char>(line[7]))) {
      std::string pattern = trim(line.substr(7));
      if (pattern[0] != '/') pattern = file.substr(0, file.rfind('/') + 1) + pattern;
      glob_t g{};
      if (glob((root + pattern).c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) {
          ldSoConfDirs(root, std::string(g.gl_pathv[i]).substr(root.size()), depth + 1, dirs);
        }
      }
      globfree(&g);
      continue;
    }
    for (const std::string& d : splitOn(line, " \t,:")) dirs->emplace_back(d, file);
  }
}

}  // namespace

LibProbe locateTorchNccl(const std::string& root, const std::vector<std::string>& sysPath) {
  LibProbe p;
  p.label = "PyTorch's NCCL";
  for (const std::string& entry : sysPath) {
    if (!fileExists(root + entry + "/torch/__init__.py")) continue;
    for (const char* rel : {"/torch/lib/libnccl.so.2", "/nvidia/nccl/lib/libnccl.so.2"}) {
      if (fileExists(root + entry + rel)) {
        p.path = entry + rel;
        p.note = "PyTorch at " + entry + "/torch loads it (its libraries' RUNPATH; a libnccl.so.2 in an "
                 "LD_LIBRARY_PATH directory would come first)";
        return p;
      }
    }
    p.note = "PyTorch at " + entry + "/torch has no libnccl.so.2 beside it (a CPU or ROCm build, or NCCL "
             "built into libtorch)";
    return p;
  }
  for (const std::string& entry : sysPath) {
    if (fileExists(root + entry + "/nvidia/nccl/lib/libnccl.so.2")) {
      p.label = "pip NCCL (nvidia-nccl wheel)";
      p.path = entry + "/nvidia/nccl/lib/libnccl.so.2";
      p.note = "no PyTorch in python3's sys.path; an nvidia-nccl wheel is installed";
      return p;
    }
  }
  p.note = "no PyTorch and no nvidia-nccl wheel in python3's sys.path";
  return p;
}

LibProbe locateSystemNccl(const std::string& root, const std::map<std::string, std::string>& env) {
  // An NCCL in LD_PRELOAD is loaded before the program's own libraries, so every job with
  // this environment uses it, PyTorch included (its libnccl.so.2 by RUNPATH never loads).
  // A bare name ("libnccl.so.2") is looked up as below, then preloaded.
  bool preloadByName = false;
  auto pre = env.find("LD_PRELOAD");
  if (pre != env.end()) {
    for (const std::string& entry : splitOn(pre->second, ": ")) {
      std::string base = entry.substr(entry.rfind('/') + 1);
      if (base.rfind("libnccl.so", 0) != 0) continue;
      if (entry.find('/') == std::string::npos) {
        preloadByName = true;
        break;
      }
      LibProbe p;
      p.label = "system NCCL (LD_PRELOAD)";
      p.path = entry;
      p.preloaded = true;
      p.note = "named by LD_PRELOAD" + std::string(fileExists(root + entry) ? "" : ", which does not exist");
      return p;
    }
  }
  std::vector<std::pair<std::string, std::string>> dirs;  // directory, why it is searched
  auto it = env.find("LD_LIBRARY_PATH");
  if (it != env.end()) {
    for (const std::string& d : splitOn(it->second, ":;")) dirs.emplace_back(d, "LD_LIBRARY_PATH");
  }
  ldSoConfDirs(root, "/etc/ld.so.conf", 0, &dirs);
  for (const char* d : {"/lib64", "/usr/lib64", "/lib", "/usr/lib"}) dirs.emplace_back(d, "the default path");
  LibProbe p;
  p.label = "system NCCL (ld.so)";
  for (const auto& [dir, why] : dirs) {
    if (fileExists(root + dir + "/libnccl.so.2")) {
      p.path = dir + "/libnccl.so.2";
      p.note = "found by name in " + dir + " (" + why + ")";
      p.fromLdLibraryPath = why == "LD_LIBRARY_PATH";
      if (preloadByName) {
        p.preloaded = true;
        p.label = "system NCCL (LD_PRELOAD)";
        p.note += "; LD_PRELOAD names it";
      }
      return p;
    }
  }
  p.note = "no libnccl.so.2 on the dynamic loader's path (LD_LIBRARY_PATH, /etc/ld.so.conf, /lib, /usr/lib)";
  return p;
}

std::vector<std::string> pluginOpenNames(const std::string& entry) {
  std::vector<std::string> names = {entry};
  bool libName = entry.rfind("lib", 0) == 0 && entry.size() >= 3 && entry.compare(entry.size() - 3, 3, ".so") == 0;
  if (entry.find('/') == std::string::npos && !libName) names.push_back("libnccl-net-" + entry + ".so");
  return names;
}

bool namesMeshPlugin(const std::string& entry) {
  std::string base = entry.substr(entry.rfind('/') + 1);
  return entry == "mesh" || base == "libnccl-net-mesh.so";
}

// --- forked children ---------------------------------------------------------------------------

namespace {

// Runs `child` in a forked process whose only output is what it writes to the fd it gets;
// the parent reads it for up to timeoutMs, then kills the child. False (and *error) when the
// child could not start, died of a signal or overran the deadline.
bool runInChild(const std::function<void(int fd)>& child, int timeoutMs, std::string* out, std::string* error) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    *error = std::string("pipe: ") + strerror(errno);
    return false;
  }
  pid_t pid = fork();
  if (pid < 0) {
    *error = std::string("fork: ") + strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return false;
  }
  if (pid == 0) {
    close(fds[0]);
    child(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  bool timedOut = false;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pfd{fds[0], POLLIN, 0};
    int rc = left.count() > 0 ? poll(&pfd, 1, static_cast<int>(left.count())) : 0;
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) {
      timedOut = true;
      break;
    }
    ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timedOut) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timedOut) {
    *error = strf("did not finish within %.0f s (killed)", timeoutMs / 1000.0);
    return false;
  }
  if (WIFSIGNALED(status)) {
    *error = strf("crashed while loading (signal %d, %s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    return false;
  }
  return true;
}

void writeAll(int fd, const std::string& text) {
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n <= 0 && errno != EINTR) return;
    if (n > 0) off += static_cast<size_t>(n);
  }
}

std::string loadedPath(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  return dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name[0] != '\0' ? map->l_name
                                                                                                   : fallback;
}

}  // namespace

LibProbe probeNcclInChild(const std::string& path, int timeoutMs) {
  LibProbe p;
  p.path = path;
  std::string out;
  bool ran = runInChild(
      [&](int fd) {
        void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) return writeAll(fd, std::string("E dlopen: ") + dlerror());
        using GetVersion = int (*)(int*);
        auto fn = reinterpret_cast<GetVersion>(dlsym(h, "ncclGetVersion"));
        int code = 0;
        if (fn == nullptr) return writeAll(fd, "E it has no ncclGetVersion: not an NCCL library");
        if (fn(&code) != 0) return writeAll(fd, "E ncclGetVersion returned an error");
        writeAll(fd, "V " + std::to_string(code));
      },
      timeoutMs, &out, &p.error);
  if (!ran) return p;
  if (out.rfind("V ", 0) == 0) {
    p.version = decodeNcclVersionCode(atoi(out.c_str() + 2));
    p.loaded = p.version.known();
    if (!p.loaded) p.error = "ncclGetVersion gave an unknown code " + out.substr(2);
  } else {
    p.error = out.size() > 2 ? out.substr(2) : "no answer from the child";
  }
  return p;
}

GpuCaps probeGpusInChild(const std::string& library, int timeoutMs) {
  std::string out, error;
  bool ran = runInChild(
      [&](int fd) {
        GpuCaps c = queryGpuCaps(library);
        std::string text;
        if (!c.known()) {
          text = "U " + c.why;
        } else {
          for (const GpuCaps::Gpu& g : c.gpus) {
            text += "G " + std::to_string(g.gdr) + std::to_string(g.dmabuf) + std::to_string(g.integrated) + " " +
                    g.name + "\n";
          }
        }
        writeAll(fd, text);
      },
      timeoutMs, &out, &error);
  GpuCaps caps;
  caps.library = library;
  if (!ran) {
    caps.why = "asking " + library + ": " + error;
    return caps;
  }
  if (out.rfind("U ", 0) == 0) {
    caps.why = out.substr(2);
    return caps;
  }
  size_t pos = 0;
  while (pos < out.size()) {
    size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    std::string line = out.substr(pos, end - pos);
    pos = end + 1;
    if (line.size() < 6 || line.rfind("G ", 0) != 0) continue;
    GpuCaps::Gpu g;
    g.gdr = line[2] == '1';
    g.dmabuf = line[3] == '1';
    g.integrated = line[4] == '1';
    g.name = line.substr(6);
    caps.gpus.push_back(g);
  }
  if (caps.gpus.empty()) {
    caps.why = "no answer from the child";
    return caps;
  }
  caps.state = GpuCaps::State::Known;
  return caps;
}

LibProbe probePluginInChild(const std::string& nameOrPath, int timeoutMs) {
  LibProbe p;
  std::string out;
  bool ran = runInChild(
      [&](int fd) {
        std::string errors;
        for (const std::string& name : pluginOpenNames(nameOrPath)) {
          void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
          if (h == nullptr) {
            errors += (errors.empty() ? "" : "; ") + std::string(dlerror());
            continue;
          }
          int mask = 0;
          for (int v = kMeshAbiOldest; v <= kMeshAbiNewest; ++v) {
            if (dlsym(h, ("ncclNetPlugin_v" + std::to_string(v)).c_str()) != nullptr) mask |= 1 << v;
          }
          return writeAll(fd, "P " + std::to_string(mask) + " " + loadedPath(h, name));
        }
        writeAll(fd, "E " + errors);
      },
      timeoutMs, &out, &p.error);
  if (!ran) return p;
  if (out.rfind("P ", 0) == 0) {
    size_t sp = out.find(' ', 2);
    p.abiMask = atoi(out.c_str() + 2);
    p.path = sp == std::string::npos ? nameOrPath : out.substr(sp + 1);
    p.loaded = true;
  } else {
    p.error = out.size() > 2 ? out.substr(2) : "no answer from the child";
  }
  return p;
}

std::vector<std::string> pythonSysPath(int timeoutMs, std::string* error) {
  std::string out;
  bool ran = runInChild(
      [](int fd) {
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) {
          dup2(devnull, 0);
          dup2(devnull, 2);
        }
        dup2(fd, 1);
        execlp("python3", "python3", "-c", "import sys\nfor p in sys.path:\n    print(p)", static_cast<char*>(nullptr));
        _exit(127);
      },
      timeoutMs, &out, error);
  std::vector<std::string> paths;
  if (!ran) return paths;
  for (const std::string& line : splitOn(out, "\n")) {
    if (line[0] == '/') paths.push_back(line);
  }
  if (paths.empty()) *error = "python3 is not on PATH, or printed no sys.path";
  return paths;
}

void locateLibraries(const DoctorSources& sources, DoctorFacts* facts) {
  const SettingSource* plugin = facts->setting("NCCL_NET_PLUGIN");
  std::string spec = "mesh";  // what the fix would set when NCCL_NET_PLUGIN names no mesh plugin
  if (plugin != nullptr) {
    for (const std::string& entry : splitOn(plugin->value, ",")) {
      if (namesMeshPlugin(entry)) {
        spec = entry;
        break;
      }
    }
  }
  if (sources.probePlugin) facts->plugin = sources.probePlugin(spec);
  facts->plugin.label = "NCCL_NET_PLUGIN=" + spec;

  std::string pyError;
  std::vector<std::string> sysPath = sources.pythonPath ? sources.pythonPath(&pyError) : std::vector<std::string>();
  facts->ncclTorch = locateTorchNccl(facts->root, sysPath);
  if (sysPath.empty()) facts->ncclTorch.note = "python3's sys.path unknown: " + pyError;
  facts->ncclSystem = locateSystemNccl(facts->root, facts->env);
  for (LibProbe* p : {&facts->ncclTorch, &facts->ncclSystem}) {
    if (p->path.empty() || !sources.probeNccl) continue;
    LibProbe r = sources.probeNccl(facts->root + p->path);
    p->loaded = r.loaded;
    p->error = r.error;
    p->version = r.version;
  }
}

}  // namespace mesh
