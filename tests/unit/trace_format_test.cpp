// SPDX-License-Identifier: Apache-2.0
// The trace format (src/abi/trace_format.h): every call round-trips through encode/decode,
// and malformed input (truncated, garbage, wrong version, bad values) is a clear error.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "../../src/abi/trace_format.h"

namespace mesh {
namespace trace {
namespace {

Record sample(Call call) {
  Record r;
  r.seq = 42;
  r.tUs = 123456;
  r.thread = 3;
  r.call = call;
  r.api = 11;
  r.result = 0;
  return r;
}

std::string encode(const Record& r) {
  char buf[kMaxLine];
  size_t n = encodeRecord(r, buf, sizeof(buf));
  EXPECT_GT(n, 0u);
  EXPECT_EQ(buf[n - 1], '\n');
  return std::string(buf, n - 1);
}

Record roundTrip(const Record& r) {
  Record back;
  std::string error;
  std::string line = encode(r);
  EXPECT_TRUE(decodeRecord(line, &back, &error)) << line << ": " << error;
  EXPECT_EQ(back.seq, r.seq);
  EXPECT_EQ(back.tUs, r.tUs);
  EXPECT_EQ(back.thread, r.thread);
  EXPECT_EQ(back.call, r.call);
  EXPECT_EQ(back.api, r.api);
  EXPECT_EQ(back.result, r.result);
  return back;
}

Header sampleHeader() {
  Header h;
  h.host = "node 0";
  h.pid = 4321;
  h.t0Ns = 987654321;
  h.plugin = "nccl-mesh 0.1.0 (git abc)";
  h.addrs = {"198.18.0.1/24", "198.18.1.1/24"};
  h.settings = {"NCCL_MESH_RELAY=auto", "NCCL_MESH_ROUTES=198.18.2.0/24=198.18.0.2"};
  h.env = {"NCCL_DEBUG=INFO"};
  return h;
}

TEST(TraceFormat, EveryCallHasANameThatMapsBack) {
  for (int i = 0; i <= static_cast<int>(Call::SetNetAttr); ++i) {
    Call c;
    ASSERT_TRUE(callFromName(callName(static_cast<Call>(i)), &c)) << i;
    EXPECT_EQ(static_cast<int>(c), i);
  }
  Call c;
  EXPECT_FALSE(callFromName("frobnicate", &c));
}

TEST(TraceFormat, ConnectAndAcceptRoundTripWithRetryCounts) {
  Record r = sample(Call::Connect);
  r.ctx = 2;
  r.dev = 0;
  r.hasHandle = true;
  r.handle = 0xfedcba9876543210ull;
  r.obj = 7;
  r.repeats = 31;
  Record back = roundTrip(r);
  EXPECT_EQ(back.ctx, 2u);
  EXPECT_EQ(back.dev, 0);
  EXPECT_TRUE(back.hasHandle);
  EXPECT_EQ(back.handle, r.handle);
  EXPECT_EQ(back.obj, 7u);
  EXPECT_EQ(back.repeats, 31u);
  EXPECT_EQ(back.trafficClass, -1);

  Record a = sample(Call::Accept);
  a.comm = 4;
  a.obj = 0;  // the first "not yet"
  back = roundTrip(a);
  EXPECT_EQ(back.comm, 4u);
  EXPECT_EQ(back.obj, 0u);
  EXPECT_EQ(back.repeats, 0u);
}

TEST(TraceFormat, SetNetAttrCarriesItsRunOfIdenticalCalls) {
  Record r = sample(Call::SetNetAttr);
  r.ctx = 3;
  r.repeats = 2960;
  Record back = roundTrip(r);
  EXPECT_EQ(back.ctx, 3u);
  EXPECT_EQ(back.repeats, 2960u);
  r.repeats = 0;
  char line[512];
  size_t len = encodeRecord(r, line, sizeof(line));
  EXPECT_EQ(std::string(line, len).find("again="), std::string::npos) << "no again= for a single call";
  EXPECT_EQ(roundTrip(r).repeats, 0u);
}

TEST(TraceFormat, GroupedReceiveKeepsEveryBuffer) {
  Record r = sample(Call::Irecv);
  r.comm = 9;
  r.n = 8;
  for (int i = 0; i < 8; ++i) {
    r.mh[i] = 1 + i % 2;
    r.off[i] = i == 3 ? -1 : 65600 * i;
    r.size[i] = (uint64_t{1} << 33) + i;  // beyond 32 bits: v9+ sizes
    r.tag[i] = -5 + i;
  }
  r.obj = 12;
  Record back = roundTrip(r);
  ASSERT_EQ(back.n, 8);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(back.mh[i], r.mh[i]);
    EXPECT_EQ(back.off[i], r.off[i]);
    EXPECT_EQ(back.size[i], r.size[i]);
    EXPECT_EQ(back.tag[i], r.tag[i]);
  }
}

TEST(TraceFormat, SendTestAndRegistrationRoundTrip) {
  Record s = sample(Call::Isend);
  s.comm = 3;
  s.n = 1;
  s.mh[0] = 1;
  s.off[0] = 13;
  s.size[0] = 1048589;
  s.tag[0] = 7;
  s.obj = 5;
  s.repeats = 2;
  Record back = roundTrip(s);
  EXPECT_EQ(back.n, 1);
  EXPECT_EQ(back.off[0], 13);
  EXPECT_EQ(back.size[0], 1048589u);
  EXPECT_EQ(back.tag[0], 7);
  EXPECT_EQ(back.repeats, 2u);

  Record t = sample(Call::Test);
  t.obj = 5;
  t.done = 1;
  t.nsizes = 2;
  t.sizes[0] = 0;
  t.sizes[1] = 2147483647;
  t.repeats = 1000;
  back = roundTrip(t);
  EXPECT_EQ(back.done, 1);
  ASSERT_EQ(back.nsizes, 2);
  EXPECT_EQ(back.sizes[1], 2147483647);
  EXPECT_EQ(back.repeats, 1000u);

  Record m = sample(Call::RegMr);
  m.comm = 3;
  m.n = 1;
  m.size[0] = 4u << 20;
  m.type = 2;
  m.dmabuf = true;
  m.obj = 1;
  back = roundTrip(m);
  EXPECT_EQ(back.size[0], 4u << 20);
  EXPECT_EQ(back.type, 2);
  EXPECT_TRUE(back.dmabuf);
}

TEST(TraceFormat, PropertiesNameIsEscaped) {
  Record p = sample(Call::Props);
  p.dev = 1;
  p.maxRecvs = 8;
  p.ptrSupport = 3;
  p.speed = 200000;
  p.name = "mlx5 0,=%\n";
  Record back = roundTrip(p);
  EXPECT_EQ(back.name, p.name);
  EXPECT_EQ(encode(p).find('\n'), std::string::npos);
}

TEST(TraceFormat, EscapeRoundTripsEveryByte) {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  std::string esc = escape(all);
  for (char c : esc) EXPECT_TRUE(c > 0x20 && c < 0x7f && c != '=' && c != ',') << int(c);
  std::string back;
  ASSERT_TRUE(unescape(esc, &back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(unescape("abc%4", &back));
  EXPECT_FALSE(unescape("abc%zz", &back));
  EXPECT_FALSE(unescape("%", &back));
}

// The NCCL that loaded the plugin (its log line's "2.28.9 (ncclGetVersion in <lib>)") is a
// header line of its own; traces from before it have none and still parse.
TEST(TraceFormat, HeaderNamesTheNcclThatLoadedThePlugin) {
  Header h = sampleHeader();
  h.nccl = "2.28.9 (ncclGetVersion in /opt/x y/libnccl.so.2)";
  std::string text = encodeHeader(h);
  EXPECT_NE(text.find("\nnccl 2.28.9%20(ncclGetVersion%20in%20/opt/x%20y/libnccl.so.2)\n"), std::string::npos)
      << text;
  Trace t;
  std::string error;
  ASSERT_TRUE(parseTrace(text, &t, &error)) << error;
  EXPECT_EQ(t.header.nccl, h.nccl);
  EXPECT_EQ(t.header.plugin, h.plugin);
}

TEST(TraceFormat, WholeFileRoundTrips) {
  std::string text = encodeHeader(sampleHeader());
  Record a = sample(Call::Init);
  a.seq = 1;
  Record b = sample(Call::Devices);
  b.seq = 2;
  b.ndev = 1;
  text += encode(a) + "\n" + encode(b) + "\n";
  Trace t;
  std::string error;
  ASSERT_TRUE(parseTrace(text, &t, &error)) << error;
  EXPECT_EQ(t.header.host, "node 0");
  EXPECT_EQ(t.header.pid, 4321);
  EXPECT_EQ(t.header.t0Ns, 987654321u);
  EXPECT_EQ(t.header.plugin, "nccl-mesh 0.1.0 (git abc)");
  EXPECT_EQ(t.header.nccl, "");  // no nccl line: an NCCL the plugin could not ask
  EXPECT_EQ(t.header.addrs, sampleHeader().addrs);
  EXPECT_EQ(t.header.settings, sampleHeader().settings);
  EXPECT_EQ(t.header.env, sampleHeader().env);
  ASSERT_EQ(t.records.size(), 2u);
  EXPECT_EQ(t.records[1].ndev, 1);
  EXPECT_EQ(t.records[0].line, 11u);  // 10 header lines before it
  EXPECT_EQ(t.endReason, "");
  EXPECT_TRUE(t.cut) << "no end line: the process never unloaded the plugin or exited (a signal)";

  ASSERT_TRUE(parseTrace(text + "end cap\n", &t, &error)) << error;
  EXPECT_EQ(t.endReason, "cap");
  EXPECT_FALSE(t.cut);

  ASSERT_TRUE(parseTrace(text + "end exit\n", &t, &error)) << error;
  EXPECT_EQ(t.endReason, "") << "the recording ran to the end";
  EXPECT_FALSE(t.cut);
}

// The recorder numbers records 1, 2, 3... as it writes them: a gap (or a first record that is
// not 1) is a line lost or edited, which replayed clean as if NCCL had never made the call.
TEST(TraceFormat, ASequenceGapIsALostLine) {
  std::string text = encodeHeader(sampleHeader());
  Record a = sample(Call::Init);
  a.seq = 1;
  Record b = sample(Call::Devices);
  b.seq = 2;
  Record c = sample(Call::Devices);
  c.seq = 4;
  Trace t;
  std::string error;
  EXPECT_FALSE(parseTrace(text + encode(a) + "\n" + encode(b) + "\n" + encode(c) + "\n", &t, &error));
  EXPECT_EQ(error.rfind("line 13: sequence number 4 where 3 belongs", 0), 0u) << error;
  EXPECT_FALSE(parseTrace(text + encode(b) + "\n", &t, &error));
  EXPECT_EQ(error.rfind("line 11: sequence number 2 where 1 belongs", 0), 0u) << error;
  c.seq = 3;
  EXPECT_TRUE(parseTrace(text + encode(a) + "\n" + encode(b) + "\n" + encode(c) + "\n", &t, &error)) << error;
}

// Malformed input: an error that names the line and the problem, never a crash.
TEST(TraceFormat, TruncatedOrGarbageFilesAreClearErrors) {
  std::string good = encodeHeader(sampleHeader());
  Record a = sample(Call::Init);
  a.seq = 1;
  good += encode(a) + "\n";
  Trace t;
  std::string error;

  EXPECT_FALSE(parseTrace("", &t, &error));
  EXPECT_NE(error.find("empty"), std::string::npos) << error;

  EXPECT_FALSE(parseTrace(good.substr(0, good.size() - 5), &t, &error));
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;

  EXPECT_FALSE(parseTrace(good.substr(0, good.find("records")), &t, &error));
  EXPECT_NE(error.find("header never ends"), std::string::npos) << error;

  EXPECT_FALSE(parseTrace("\x7f" "ELF\x02\x01\x01\n", &t, &error));
  EXPECT_NE(error.find("not an nccl-mesh trace"), std::string::npos) << error;

  EXPECT_FALSE(parseTrace("nccl-mesh-trace 99\nrecords\n", &t, &error));
  EXPECT_NE(error.find("not version 1"), std::string::npos) << error;

  EXPECT_FALSE(parseTrace(good + "garbage here\n", &t, &error));
  EXPECT_EQ(error.rfind("line 12: ", 0), 0u) << error;

  EXPECT_FALSE(parseTrace(good + "1 5 1 devices v=8 r=0 ndev=1\n", &t, &error));
  EXPECT_NE(error.find("sequence number 1 where 2 belongs"), std::string::npos) << error;

  EXPECT_FALSE(parseTrace(good + "end cap\n2 1 1 init v=8 r=0\n", &t, &error));
  EXPECT_NE(error.find("data after 'end'"), std::string::npos) << error;

  EXPECT_FALSE(parseTrace("nccl-mesh-trace 1\npid -3\nrecords\n", &t, &error));
  EXPECT_EQ(error.rfind("line 2: bad pid", 0), 0u) << error;
}

TEST(TraceFormat, BadRecordsSayWhatIsWrong) {
  struct Case {
    const char* line;
    const char* says;
  } cases[] = {
      {"1 2 3", "at least 4 fields"},
      {"x 2 3 init v=8 r=0", "bad sequence number"},
      {"1 2 0 init v=8 r=0", "thread"},
      {"1 2 3 bogus v=8 r=0", "unknown call 'bogus'"},
      {"1 2 3 init r=0", "init without v="},
      {"1 2 3 init v=7 r=0", "bad value of v"},
      {"1 2 3 init v=8 r=0 r=1", "repeated r"},
      {"1 2 3 init v=8 novalue r=0", "not key=value"},
      {"1 2 3 isend v=8 s=1 m=1 off=0 size=-4 tag=0 r=0 req=1", "bad value of size"},
      {"1 2 3 irecv v=8 c=1 n=2 m=1 off=0 size=1 tag=0 r=0 req=1", "n=2 but 1 buffers"},
      {"1 2 3 irecv v=8 c=1 n=2 m=1,1 off=0 size=1,1 tag=0,0 r=0 req=1", "different lengths"},
      {"1 2 3 irecv v=8 c=1 n=9 m=1 off=0 size=1 tag=0 r=0 req=1", "bad value of n"},
      {"1 2 3 irecv v=8 c=1 n=1 m=1,1,1,1,1,1,1,1,1 off=0 size=1 tag=0 r=0 req=1", "bad value of m"},
      {"1 2 3 test v=8 req=1 r=0 done=2", "bad value of done"},
      {"1 2 3 connect v=8 dev=0 h=xyz r=0 s=1", "bad value of h"},
      {"1 2 3 props v=8 dev=0 r=0 name=%G1", "bad value of name"},
      {"99999999999999999999999 2 3 init v=8 r=0", "bad sequence number"},
  };
  for (const Case& c : cases) {
    Record r;
    std::string error;
    EXPECT_FALSE(decodeRecord(c.line, &r, &error)) << c.line;
    EXPECT_NE(error.find(c.says), std::string::npos) << c.line << " -> " << error;
  }
  // Keys a later format adds are skipped, so old readers keep working.
  Record r;
  std::string error;
  EXPECT_TRUE(decodeRecord("1 2 3 init v=8 r=0 future=1", &r, &error)) << error;
}

// Random bytes and random cuts of a good file never crash the parser (a poor man's fuzzer,
// deterministic so a failure reproduces).
TEST(TraceFormat, RandomDamageNeverCrashes) {
  std::string good = encodeHeader(sampleHeader());
  for (uint64_t i = 1; i <= 20; ++i) {
    Record r = sample(i % 2 ? Call::Isend : Call::Test);
    r.seq = i;
    r.n = 1;
    r.done = 1;
    r.nsizes = 1;
    good += encode(r) + "\n";
  }
  std::mt19937 rng(7);
  Trace t;
  std::string error;
  for (int round = 0; round < 2000; ++round) {
    std::string bad = good;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) bad[rng() % bad.size()] = static_cast<char>(rng() % 256);
    if (round % 3 == 0) bad.resize(rng() % bad.size());
    if (!parseTrace(bad, &t, &error)) {
      EXPECT_FALSE(error.empty());
    }
  }
}

TEST(TraceFormat, HandleKeyIsTheTokenOfAMeshHandle) {
  unsigned char h[kHandleBytes] = {'M', 'E', 'S', 'H', 1, 0, 0x12, 0x34, 1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(handleKey(h, sizeof(h)), 0x0807060504030201ull);
  h[100] = 9;  // bytes past the encoded handle do not matter
  EXPECT_EQ(handleKey(h, sizeof(h)), 0x0807060504030201ull);
  unsigned char other[kHandleBytes] = {1, 2, 3};
  unsigned char other2[kHandleBytes] = {1, 2, 4};
  EXPECT_NE(handleKey(other, sizeof(other)), handleKey(other2, sizeof(other2)));
}

}  // namespace
}  // namespace trace
}  // namespace mesh
