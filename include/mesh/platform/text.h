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

// Length of the well-formed UTF-8 sequence at s[i] (1..4), or 0 when it is not one (a
// stray continuation byte, a sequence cut short, an overlong form, a surrogate, > U+10FFFF).
inline size_t utf8SequenceAt(const std::string& s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  if (len == 0 || c < 0xC2 || c > 0xF4 || i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  unsigned char c1 = byte(i + 1);
  if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) {
    return 0;
  }
  return len;
}

// `s` as a JSON string literal, quotes included (control characters as \u00XX). JSON is
// UTF-8: a byte that is not part of a well-formed sequence (a process name the kernel cut
// mid-character at 15 bytes) becomes U+FFFD, so every reader can parse the document.
inline std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    char c = s[i];
    size_t len = utf8SequenceAt(s, i);
    if (len == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (len > 1) {
      out.append(s, i, len);
      i += len;
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += strf("\\u%04x", c);
    } else {
      out += c;
    }
    ++i;
  }
  return out + "\"";
}

}  // namespace mesh
