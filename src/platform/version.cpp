// SPDX-License-Identifier: Apache-2.0
#include "mesh/platform/version.h"

#include "mesh_version_gen.h"

namespace mesh {

const char* versionString() { return MESH_VERSION_STRING; }

const char* gitRevision() { return MESH_GIT_REVISION; }

std::string versionText() {
  std::string text = std::string("nccl-mesh ") + versionString();
  if (*gitRevision() != '\0') text += std::string(" (git ") + gitRevision() + ")";
  return text;
}

}  // namespace mesh
