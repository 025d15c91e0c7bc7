// SPDX-License-Identifier: Apache-2.0
// Fuzzes the NCCL_MESH_ROUTES parser (text a person typed, or a launcher generated): it must
// never crash or read out of bounds, must explain every refusal, and what it accepts must
// format back to text that parses to the same routes.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mesh/routing/routes.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "static_routes_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<mesh::StaticRoute> routes;
  std::string error;
  if (!mesh::parseStaticRoutes(text, &routes, &error)) {
    if (error.empty()) fail("rejected without a message", text);
    if (!routes.empty()) fail("a refusal changed the output", text);
    return 0;
  }
  if (routes.size() > mesh::kStaticRoutesMax) fail("more routes than the maximum", text);
  std::string canonical = mesh::formatStaticRoutes(routes);
  std::vector<mesh::StaticRoute> again;
  if (!mesh::parseStaticRoutes(canonical, &again, &error)) fail("canonical text refused", canonical + ": " + error);
  if (again != routes) fail("canonical text parses differently", canonical);
  return 0;
}
