// SPDX-License-Identifier: Apache-2.0
// Loads a net plugin the way NCCL does (NCCL 2.30.7 src/plugin/plugin_open.cc, read for this
// test; the same steps since 2.21.5 src/net.cc): dlopen(NCCL_NET_PLUGIN's value) with
// RTLD_NOW | RTLD_LOCAL, and when that fails, dlopen("libnccl-net-<value>.so"); then
// dlsym on that handle, never RTLD_DEFAULT, newest ABI first.
//
//   load_like_nccl [--expect-file PATH] [--init] [--log-check SOURCE_DIR] VALUE
//
// Prints which file was loaded and which ncclNetPlugin_v* symbols it has; fails unless
// v8, v9, v10 and v11 are all there. --expect-file: the loaded object must be PATH (as
// with LD_PRELOAD, where dlopen by name must return the preloaded copy). --init: calls the
// v8 init twice and devices once. --log-check: with --init, captures the plugin's log and
// fails when a file name or message holds SOURCE_DIR or an absolute path, when the version
// line is missing or repeated, or when a message repeats its own "NCCL_MESH_HCA" prefix.
#include <dlfcn.h>
#include <link.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "net_v8.h"

namespace {

struct LogLine {
  int level;
  std::string file;
  std::string text;
};
std::vector<LogLine> gLog;

extern "C" void captureLog(ncclDebugLogLevel level, unsigned long, const char* file, int,
                           const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  gLog.push_back({static_cast<int>(level), file ? file : "", buf});
}

int fail(const std::string& why) {
  fprintf(stderr, "load_like_nccl: FAIL: %s\n", why.c_str());
  return 1;
}

void* openLikeNccl(const std::string& value, std::string* tried) {
  void* h = dlopen(value.c_str(), RTLD_NOW | RTLD_LOCAL);
  *tried = value + " (" + (h ? "ok" : dlerror()) + ")";
  if (h != nullptr || value.find('/') != std::string::npos) return h;
  std::string name = "libnccl-net-" + value + ".so";
  h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  *tried += ", " + name + " (" + (h ? "ok" : dlerror()) + ")";
  return h;
}

int checkLog(const std::string& sourceDir) {
  int versionLines = 0;
  for (const LogLine& l : gLog) {
    printf("  log: [%d] %s: %s\n", l.level, l.file.c_str(), l.text.c_str());
    if (!l.file.empty() && l.file[0] == '/') return fail("absolute file name in a log call: " + l.file);
    if (l.file.find(sourceDir) != std::string::npos || l.text.find(sourceDir) != std::string::npos) {
      return fail("the source directory " + sourceDir + " appears in a log line");
    }
    if (l.text.find("NCCL_MESH_HCA: NCCL_MESH_HCA") != std::string::npos ||
        l.text.find("NCCL_MESH_HCA='") != l.text.rfind("NCCL_MESH_HCA='")) {
      return fail("a message names NCCL_MESH_HCA twice: " + l.text);
    }
    if (l.level == NCCL_LOG_INFO && l.text.find("NET/Mesh : nccl-mesh ") == 0) ++versionLines;
  }
  if (versionLines != 1) {
    return fail("expected one INFO line 'NET/Mesh : nccl-mesh <version>' over two inits, got " +
                std::to_string(versionLines));
  }
  printf("load_like_nccl: log ok (%zu lines, one version line, no absolute paths)\n", gLog.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string expectFile, sourceDir, value;
  bool init = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--expect-file" && i + 1 < argc) expectFile = argv[++i];
    else if (a == "--init") init = true;
    else if (a == "--log-check" && i + 1 < argc) sourceDir = argv[++i];
    else if (value.empty() && a[0] != '-') value = a;
    else return fail("usage: load_like_nccl [--expect-file PATH] [--init] [--log-check DIR] VALUE");
  }
  if (value.empty()) return fail("no NCCL_NET_PLUGIN value given");
  std::string tried;
  void* lib = openLikeNccl(value, &tried);
  if (lib == nullptr) return fail("could not load the plugin; tried " + tried);
  link_map* map = nullptr;
  if (dlinfo(lib, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr) return fail("dlinfo failed");
  printf("load_like_nccl: %s -> loaded %s\n", value.c_str(), map->l_name);
  if (!expectFile.empty()) {
    char want[4096], got[4096];
    if (!realpath(expectFile.c_str(), want) || !realpath(map->l_name, got) || strcmp(want, got) != 0) {
      return fail("loaded " + std::string(map->l_name) + ", expected " + expectFile);
    }
  }
  std::string found;
  for (int v = 12; v >= 6; --v) {
    std::string sym = "ncclNetPlugin_v" + std::to_string(v);
    if (dlsym(lib, sym.c_str()) != nullptr) found += " v" + std::to_string(v);
    else if (v >= 8 && v <= 11) return fail(sym + " not found in " + map->l_name);
  }
  printf("load_like_nccl: symbols:%s\n", found.c_str());
  if (init) {
    auto* net = static_cast<const ncclNet_v8_t*>(dlsym(lib, "ncclNetPlugin_v8"));
    int ndev = -1;
    if (net->init(captureLog) != ncclSuccess || net->init(captureLog) != ncclSuccess) return fail("init failed");
    if (net->devices(&ndev) != ncclSuccess || ndev < 0) return fail("devices failed");
    printf("load_like_nccl: %s: init twice, %d device(s)\n", net->name, ndev);
    if (!sourceDir.empty() && checkLog(sourceDir) != 0) return 1;
  }
  return 0;
}
