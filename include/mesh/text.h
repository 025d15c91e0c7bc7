// SPDX-License-Identifier: Apache-2.0
// Small text helpers shared by the settings and filter parsers. Header-only.
#pragma once

#include <cctype>
#include <string>

namespace mesh {

// `s` without leading and trailing whitespace.
inline std::string trim(const std::string& s) {
  size_t b = 0;
  size_t e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace mesh
