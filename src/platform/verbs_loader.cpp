// SPDX-License-Identifier: Apache-2.0
#include "mesh/platform/verbs_loader.h"

#include <dlfcn.h>

#include <cstddef>
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

namespace {
// rdma-core 49's ibv_port_attr: the fields of every version, then `uint32_t active_speed_ex`
// at byte 52 (after port_cap_flags2 and its padding), 56 bytes in all. Fixed here, not taken
// from the headers we build with (Debian bookworm's rdma-core 44 has no such field).
constexpr size_t kActiveSpeedExOffset = 52;
constexpr size_t kPortAttrExLen = 56;
static_assert(offsetof(ibv_port_attr, port_cap_flags2) == 48, "ibv_port_attr's layout is rdma-core's ABI");
}  // namespace

int queryPort(const VerbsApi& api, ibv_context* ctx, uint8_t port, ibv_port_attr* attr,
              uint32_t* activeSpeedEx) {
  memset(attr, 0, sizeof(*attr));
  if (activeSpeedEx != nullptr) *activeSpeedEx = 0;
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx == nullptr) return api.queryPort(ctx, port, attr);
  // The length tells rdma-core which struct we hold: an older library zeroes the tail and
  // fills its own fields; a newer one copies our 56 bytes out of its larger struct.
  alignas(ibv_port_attr) unsigned char buf[sizeof(ibv_port_attr) > kPortAttrExLen ? sizeof(ibv_port_attr)
                                                                                 : kPortAttrExLen] = {};
  int rc = vctx->query_port(ctx, port, reinterpret_cast<ibv_port_attr*>(buf), kPortAttrExLen);
  if (rc != 0) return rc;
  memcpy(attr, buf, sizeof(*attr));
  if (activeSpeedEx != nullptr) memcpy(activeSpeedEx, buf + kActiveSpeedExOffset, sizeof(*activeSpeedEx));
  return 0;
}

}  // namespace mesh
