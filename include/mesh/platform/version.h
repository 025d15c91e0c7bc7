// SPDX-License-Identifier: Apache-2.0
// The plugin's version: project(VERSION) from CMakeLists.txt and the git revision the build
// came from (cmake/version_header.cmake writes both at build time). Logged once at init and
// printed by the tools' --version.
#pragma once

#include <string>

namespace mesh {

// "0.1.0"
const char* versionString();
// "1a2b3c4d5e6f", "1a2b3c4d5e6f-dirty", or "" when the build had no git checkout.
const char* gitRevision();
// "nccl-mesh 0.1.0 (git 1a2b3c4d5e6f)", or "nccl-mesh 0.1.0" without a revision.
std::string versionText();

}  // namespace mesh
