// SPDX-License-Identifier: Apache-2.0
// Fuzzes the handshake parser: the listener parses bytes from anyone who can reach its TCP
// port. Under ASan/UBSan this checks that handshakeLength and parseHandshake never read
// past len, that the two agree on where a message ends, and that whatever parse accepts
// re-encodes to exactly the bytes it read (no field silently dropped or altered).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "mesh/wire/handshake_proto.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "handshake_parse_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string lengthError;
  long length = mesh::handshakeLength(data, size, &lengthError);
  if (length < 0 && lengthError.empty()) fail("bad header without a message", "");
  if (size < mesh::kHsHeaderSize && length != 0) fail("length from a partial header", "");
  if (length > static_cast<long>(mesh::kHsMaxMessage)) fail("length above the maximum", "");

  mesh::HsMessage msg;
  std::string error;
  if (!mesh::parseHandshake(data, size, &msg, &error)) {
    if (error.empty()) fail("rejected without a message", "");
    return 0;
  }
  // A message parse accepts is one the incremental reader would have framed the same way.
  if (length != static_cast<long>(size)) {
    fail("parse accepted what handshakeLength framed differently", std::to_string(length));
  }
  std::vector<uint8_t> encoded;
  if (!mesh::encodeHandshake(msg, &encoded, &error)) fail("parsed message does not encode", error);
  if (encoded.size() != size || std::memcmp(encoded.data(), data, size) != 0) {
    fail("re-encoding differs from the input",
         std::to_string(size) + " bytes in, " + std::to_string(encoded.size()) + " out");
  }
  return 0;
}
