// SPDX-License-Identifier: Apache-2.0
// A stand-in for libnccl.so.2, loaded RTLD_LOCAL as PyTorch loads NCCL: it exports
// ncclGetVersion (NCCL 2.30.7's code) and loads the plugin as NCCL 2.30 does (dlopen the
// path, RTLD_NOW | RTLD_LOCAL; init through the table named), passing a logger that lives
// in this library. The plugin must find this library's ncclGetVersion through the logger's
// address, since nothing here is in the global scope. Used by load_via_fake_nccl.
#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "net_v12.h"
#include "net_v8.h"

extern "C" __attribute__((visibility("default"))) ncclResult_t ncclGetVersion(int* version) {
  *version = 23007;  // NCCL_VERSION(2, 30, 7)
  return ncclSuccess;
}

namespace {

void printLog(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("[%d] ", static_cast<int>(level));
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

}  // namespace

// 0 when init through `table` (ncclNetPlugin_v12 or ncclNetPlugin_v8) returned success.
extern "C" __attribute__((visibility("default"))) int fakeNcclLoadPlugin(const char* plugin, const char* table) {
  void* lib = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    printf("fake_nccl: %s\n", dlerror());
    return 1;
  }
  void* sym = dlsym(lib, table);
  if (sym == nullptr) {
    printf("fake_nccl: no %s in %s\n", table, plugin);
    return 1;
  }
  ncclResult_t rc;
  if (strcmp(table, "ncclNetPlugin_v12") == 0) {
    void* ctx = nullptr;
    rc = static_cast<const ncclNet_v12_t*>(sym)->init(&ctx, 1, nullptr, printLog, nullptr);
    if (rc == ncclSuccess) static_cast<const ncclNet_v12_t*>(sym)->finalize(ctx);
  } else {
    rc = static_cast<const ncclNet_v8_t*>(sym)->init(printLog);
  }
  printf("fake_nccl: init through %s returned %d\n", table, static_cast<int>(rc));
  return rc == ncclSuccess ? 0 : 1;
}
