// SPDX-License-Identifier: Apache-2.0
/* A deliberately wrong plugin for abi_exports' own tests: it exports a second symbol and
 * (when libibverbs could be linked) references ibv_get_device_list directly. check_exports.sh
 * must reject it; see tests/abi/CMakeLists.txt. */
#include <stddef.h>

#ifdef BAD_PLUGIN_LINK_VERBS
#include <infiniband/verbs.h>
#endif

__attribute__((visibility("default"))) const char ncclNetPlugin_v8[8] = "Mesh";

__attribute__((visibility("default"))) int meshLeakedHelper(void) {
#ifdef BAD_PLUGIN_LINK_VERBS
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  return list == NULL ? -1 : n;
#else
  return 0;
#endif
}
