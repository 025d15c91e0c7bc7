// SPDX-License-Identifier: Apache-2.0
// Small text helpers shared by the settings and filter parsers and the tools. Header-only.
#pragma once

#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

namespace mesh {

// `s` without leading and trailing whitespace.
inline std::string trim(const std::string& s) {
  size_t b = 0;
  size_t e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// The one prologue of every printf-style logger here (log.cpp's logMessage, the tools'
// loggers the plugin calls): the arguments after `fmt` of the enclosing variadic function,
// formatted into the char array `buf`, cut at its size as they always were.
#define MESH_VFORMAT(buf, fmt)                  \
  do {                                          \
    va_list meshVformatAp_;                     \
    va_start(meshVformatAp_, fmt);              \
    vsnprintf(buf, sizeof(buf), fmt, meshVformatAp_); \
    va_end(meshVformatAp_);                     \
  } while (0)

// printf into a std::string, whatever its length.
inline std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strf(const char* fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof(small), fmt, ap);
  va_end(ap);
  if (n < 0) return std::string();
  if (static_cast<size_t>(n) < sizeof(small)) return std::string(small, static_cast<size_t>(n));
  std::vector<char> big(static_cast<size_t>(n) + 1);
  va_start(ap, fmt);
  vsnprintf(big.data(), big.size(), fmt, ap);
  va_end(ap);
  return std::string(big.data(), static_cast<size_t>(n));
}

// `s` as a JSON string literal, quotes included (control characters as \u00XX).
inline std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += strf("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace mesh
