// SPDX-License-Identifier: Apache-2.0
// The trace format: what NCCL_MESH_TRACE records of every ncclNet call (src/abi/trace.h)
// and what tests/replay's mesh_replay reads back. Pure code, no plugin state: the plugin,
// the unit tests and the replayer compile this one file.
//
// Format version 1, text, one line per item, fields separated by one space:
//   nccl-mesh-trace 1                      magic and format version (first line)
//   host NAME | pid N | t0 NS | plugin TEXT | addr A/P A/P ... | setting NAME=VALUE | env NAME=VALUE
//   records                                end of the header
//   SEQ T_US THREAD CALL key=value ...     one per ABI call (see TraceRecord)
//   end REASON                             optional: recording stopped (the size cap)
// Values are escaped (%XX for space, '%', '=', ',' and bytes outside 0x21..0x7e). Object
// arguments are stable ids (1, 2, ...; 0 = NULL), never pointers; buffers are named by
// their registration (m=) and offset in it, never their contents. Decoding never trusts
// the input: every malformed line is an error naming the line and what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mesh {
namespace trace {

constexpr int kFormatVersion = 1;
constexpr int kMaxBuffers = 8;          // irecv/iflush n and test sizes (maxRecvs)
constexpr size_t kMaxLine = 4096;       // an encoded record never exceeds this
constexpr size_t kHandleBytes = 128;    // NCCL_NET_HANDLE_MAXSIZE

enum class Call : uint8_t {
  Init, Finalize, Devices, Props, Listen, Connect, Accept, RegMr, DeregMr, Isend, Irecv, Iflush,
  Test, CloseSend, CloseRecv, CloseListen, GetDeviceMr, IrecvConsumed, SetNetAttr,
};
const char* callName(Call call);
bool callFromName(const std::string& name, Call* out);

// One ABI call. Which fields a call carries (the rest stay at their defaults):
//   init        v r [ctx commid tc]        v11/v12 contexts; tc: the config's traffic class
//   finalize    v ctx r
//   devices     v r n
//   props       v dev r maxrecvs ptr speed name
//   listen      v [ctx] dev r obj(l=) h
//   connect     v [ctx] dev h [tc] r obj(s=) nulls
//   accept      v comm(l=) r obj(c=) nulls
//   regmr       v comm size type [dmabuf] r obj(m=)
//   deregmr     v comm m r
//   isend       v comm(s=) m off size tag r obj(req=) nulls      n = 1
//   irecv       v comm(c=) n m off size tag r obj(req=) nulls    per-buffer lists
//   iflush      v comm(c=) n m off size r obj(req=)
//   test        v req r done [sizes] polls
//   close-send/close-recv/close-listen  v comm r
//   getdevicemr v comm m r;  irecvconsumed v comm n req r
//   setnetattr  v [ctx] r again         again: identical calls (thread, ctx, r) right after it
// A call that returned success and a NULL object (connect, accept, isend, irecv: "not yet")
// is recorded once, at the first such return; the retries that follow are counted, and the
// record of the call that finally returned an object carries that count (nulls=). A test()
// is recorded only when it ends (done, or an error), with how many polls said "not done".
struct Record {
  uint64_t seq = 0;
  uint64_t tUs = 0;       // microseconds since the header's t0
  uint32_t thread = 0;    // 1, 2, ... in the order threads first called the plugin
  Call call = Call::Init;
  int api = 0;            // ncclNet version of the entry point: 8..12
  int result = 0;         // ncclResult_t
  uint64_t ctx = 0;
  int dev = -1;
  uint64_t comm = 0;      // the comm argument: s=, c= or l= by call
  uint64_t obj = 0;       // the returned comm, mhandle or request; 0 = NULL
  uint64_t handle = 0;    // h=: the listen handle's key (its token)
  bool hasHandle = false;
  int n = 0;              // buffers of isend (1), irecv, iflush
  uint64_t mh[kMaxBuffers] = {};
  int64_t off[kMaxBuffers] = {};   // -1: not inside the registration
  uint64_t size[kMaxBuffers] = {};
  int tag[kMaxBuffers] = {};
  int type = 0;           // regmr pointer type (NCCL_PTR_*)
  bool dmabuf = false;
  int done = 0;
  int nsizes = 0;         // test: sizes reported when done
  int64_t sizes[kMaxBuffers] = {};
  uint64_t repeats = 0;   // nulls= (connect/accept/isend/irecv), polls= (test) or again= (setnetattr)
  int ndev = 0;           // devices
  int maxRecvs = 0, ptrSupport = 0, speed = 0;  // props
  std::string name;       // props
  uint64_t commId = 0;    // init (v11+)
  int trafficClass = -1;  // init (v11+), connect (v10)
  size_t line = 0;        // set by the parser: the line it came from (1-based)
};

struct Header {
  std::string host;
  long pid = 0;
  uint64_t t0Ns = 0;                     // CLOCK_MONOTONIC at the start of recording
  std::string plugin;                    // the plugin's version line
  std::string nccl;                      // "2.28.9 (ncclGetVersion in <lib>)": the NCCL that loaded it
  std::vector<std::string> addrs;        // "198.18.0.1/24", the node's mesh addresses
  std::vector<std::string> settings;     // "NCCL_MESH_X=value": the plugin's settings
  std::vector<std::string> env;          // "NCCL_X=value": NCCL's own variables, for reading
};

struct Trace {
  Header header;
  std::vector<Record> records;
  std::string endReason;                 // "" when the recording ran to the end
  // No "end" line: the process ended without unloading the plugin or exiting normally (a
  // signal: mpirun or slurm ending a hung job); up to a second of calls before it is missing.
  // Traces recorded before 2026-11-30 never had "end exit", so theirs is cut too.
  bool cut = false;
};

// "%XX" escaping of everything but 0x21..0x7e minus '%', '=', ','.
std::string escape(const std::string& text);
bool unescape(const std::string& text, std::string* out);

// The header lines, "records" included.
std::string encodeHeader(const Header& header);
// Writes one line (with '\n') into buf; returns its length, 0 when cap is too small.
size_t encodeRecord(const Record& r, char* buf, size_t cap);
// One record line (without '\n'); false with *error saying what is wrong.
bool decodeRecord(const std::string& line, Record* out, std::string* error);
// A whole file. False with *error = "line N: what", for a truncated file (no final newline,
// no "records" line), garbage, an unknown format version or an out-of-order sequence.
bool parseTrace(const std::string& text, Trace* out, std::string* error);

// The handle key recorded as h=: the token of a mesh handle, else a hash of its 128 bytes.
uint64_t handleKey(const void* handle, size_t size);

}  // namespace trace
}  // namespace mesh
