// SPDX-License-Identifier: Apache-2.0
// load_via_fake_nccl FAKE_NCCL_SO PLUGIN_SO TABLE: loads the stand-in NCCL RTLD_LOCAL (as
// PyTorch loads libnccl) and has it load the plugin through TABLE; prints the plugin's log.
#include <dlfcn.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: load_via_fake_nccl FAKE_NCCL_SO PLUGIN_SO TABLE\n");
    return 64;
  }
  void* nccl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (nccl == nullptr) {
    fprintf(stderr, "load_via_fake_nccl: %s\n", dlerror());
    return 1;
  }
  auto load = reinterpret_cast<int (*)(const char*, const char*)>(dlsym(nccl, "fakeNcclLoadPlugin"));
  if (load == nullptr) return 1;
  int rc = load(argv[2], argv[3]);
  fflush(stdout);
  return rc;
}
