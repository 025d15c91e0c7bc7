// SPDX-License-Identifier: Apache-2.0
#include "mesh/platform/verbs_loader.h"

#include <dlfcn.h>

#include <cstring>

#include "mesh/platform/log.h"
#include "mesh/platform/static_state.h"

namespace mesh {

ncclResult_t loadVerbs(const std::string& path, VerbsApi* api, std::string* why) {
  unloadVerbs(api);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    *why = "cannot load " + path + " (" + (err ? err : "unknown error") +
           "); install rdma-core (Debian/Ubuntu: apt-get install libibverbs1 ibverbs-providers; "
           "RHEL: dnf install rdma-core libibverbs) or point NCCL_MESH_IBVERBS_LIB at it";
    return ncclSystemError;
  }
  VerbsApi loaded;
  std::string missing;
#define MESH_VERBS_BIND(member, sym, ver, required, ret, params)                    \
  loaded.member = reinterpret_cast<ret(*) params>(dlvsym(handle, sym, ver));        \
  if (loaded.member == nullptr && (required)) missing += std::string(" ") + sym + "@" + ver;
  MESH_VERBS_SYMBOLS(MESH_VERBS_BIND)
#undef MESH_VERBS_BIND
  if (!missing.empty()) {
    dlclose(handle);
    *why = path + " lacks required symbols:" + missing +
           "; rdma-core is too old or not rdma-core's libibverbs";
    return ncclSystemError;
  }
  loaded.libHandle = handle;
  loaded.path = path;
  *api = loaded;
  return ncclSuccess;
}

void unloadVerbs(VerbsApi* api) {
  if (api->libHandle != nullptr && dlclose(api->libHandle) != 0) {
    MESH_WARN("dlclose(%s) failed: %s", api->path.c_str(), dlerror());
  }
  releaseStatic(*api);  // the plugin's table lives in static storage
}

int queryPort(const VerbsApi& api, ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  memset(attr, 0, sizeof(*attr));
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx != nullptr) return vctx->query_port(ctx, port, attr, sizeof(*attr));
  return api.queryPort(ctx, port, attr);
}

}  // namespace mesh
