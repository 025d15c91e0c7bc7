// SPDX-License-Identifier: Apache-2.0
// Fuzzes the listen-handle decoder: a peer (or a corrupted bootstrap) controls every byte.
// Under ASan/UBSan this checks decodeHandle never reads past len, and that whatever it
// accepts re-encodes to exactly the bytes it read (no field silently dropped or altered).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "mesh/wire/handle_codec.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "handle_decode_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

bool sameHandle(const mesh::Handle& a, const mesh::Handle& b) {
  return a.token == b.token && a.port == b.port && a.addrs == b.addrs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mesh::Handle handle;
  std::string error;
  if (!mesh::decodeHandle(data, size, &handle, &error)) {
    if (error.empty()) fail("rejected without a message", "");
    return 0;
  }
  uint8_t encoded[mesh::kHandleSize];
  if (!mesh::encodeHandle(handle, encoded, &error)) fail("decoded handle does not encode", error);
  size_t used = mesh::kHandleHeaderSize + handle.addrs.size() * mesh::kHandleAddressSize;
  if (used > size || std::memcmp(encoded, data, used) != 0) {
    fail("re-encoding differs from the input", std::to_string(handle.addrs.size()) + " addrs");
  }
  mesh::Handle again;
  if (!mesh::decodeHandle(encoded, sizeof(encoded), &again, &error)) {
    fail("re-encoded handle does not decode", error);
  }
  if (!sameHandle(handle, again)) fail("round trip changed the handle", "");
  return 0;
}
