// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-perf's pure parts: the verification pattern, the parameters and check counts the
// two ranks exchange, and the report's figures and formats.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "mesh/tools/perf_report.h"

namespace mesh {
namespace {

TEST(PerfPattern, RoundTripsAndCountsEveryWrongByte) {
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(4097), size_t(1) << 20}) {
    std::vector<unsigned char> buf(n + 1, 0xee);
    fillPattern(buf.data(), n, 42);
    EXPECT_EQ(buf[n], 0xee) << "wrote past " << n << " bytes";
    EXPECT_EQ(countPatternErrors(buf.data(), n, 42), 0u) << n;
    if (n == 0) continue;
    buf[n / 2] ^= 0x10;
    buf[n - 1] ^= 0x01;
    EXPECT_EQ(countPatternErrors(buf.data(), n, 42), n == 1 ? 1u : 2u) << n;
  }
}

TEST(PerfPattern, SeedsDifferAndAClearedBufferFails) {
  std::vector<unsigned char> a(4096), b(4096), zero(4096, 0);
  fillPattern(a.data(), a.size(), 1);
  fillPattern(b.data(), b.size(), 2);
  EXPECT_NE(memcmp(a.data(), b.data(), a.size()), 0);
  EXPECT_GT(countPatternErrors(a.data(), a.size(), 2), 4000u) << "data of another slot must not pass";
  EXPECT_GT(countPatternErrors(zero.data(), zero.size(), 1), 4000u) << "data that never landed must not pass";
}

TEST(PerfParams, EncodeDecodeRoundTrip) {
  PerfParams p;
  p.lat = false;
  p.check = false;
  p.latIters = 7;
  p.bwWindow = 3;
  p.bwBytes = size_t(4) << 30;
  p.latSizes = {8, 64};
  p.bwSizes = {4096, size_t(1) << 30};
  PerfParams q;
  std::string error;
  ASSERT_TRUE(decodePerfParams(encodePerfParams(p), &q, &error)) << error;
  EXPECT_TRUE(q == p);
  EXPECT_EQ(encodePerfParams(q), encodePerfParams(p));
  PerfParams empty;  // no sizes at all still round-trips
  ASSERT_TRUE(decodePerfParams(encodePerfParams(empty), &q, &error)) << error;
  EXPECT_TRUE(q.latSizes.empty() && q.bwSizes.empty());
}

TEST(PerfParams, DecodeRejectsWhatItDidNotWrite) {
  PerfParams q;
  std::string error;
  for (const char* bad : {"", "perf-params 1 lat=1", "perf-params 2 lat=2 bw=1 check=1 li=1 lw=1 bi=1 bwu=1 win=1 bb=1 ls= bs=",
                          "perf-params 2 lat=1 bw=1 check=1 li=-1 lw=1 bi=1 bwu=1 win=1 bb=1 ls= bs=",
                          "perf-params 2 lat=1 bw=1", "perf-params 2 lat=1 bw=1 check=1 li=1 lw=1 bi=1 bwu=1 win=1 bb=1 ls=8,x bs=",
                          "perf-params 2 lat=1 bw=1 check=1 li=1 lw=1 bi=1 bwu=1 win=1 bb=1 ls= bs= extra=1"}) {
    EXPECT_FALSE(decodePerfParams(bad, &q, &error)) << bad;
    EXPECT_FALSE(error.empty());
  }
}

TEST(PerfChecks, RoundTripAndRejects) {
  CheckCounts c;
  c.lat[8] = 0;
  c.bw[1 << 20] = 17;
  CheckCounts d;
  std::string error;
  ASSERT_TRUE(decodeCheckCounts(encodeCheckCounts(c), &d, &error)) << error;
  EXPECT_EQ(d.lat, c.lat);
  EXPECT_EQ(d.bw, c.bw);
  EXPECT_FALSE(decodeCheckCounts("perf-checks 1 bw:x=1", &d, &error));
  EXPECT_FALSE(decodeCheckCounts("perf-checks 1 foo:8=1", &d, &error));
  EXPECT_FALSE(decodeCheckCounts("hello", &d, &error));
}

TEST(PerfReport, FiguresAreNcclTestsUnits) {
  BwRow b;
  b.size = 1 << 20;
  b.iters = 1000;
  b.seconds = 0.5;
  EXPECT_NEAR(b.timeUs(), 500.0, 1e-9);
  EXPECT_NEAR(b.algbwGBps(), 1048576.0 * 1000 / 0.5 / 1e9, 1e-9);  // 1e9 B/s, as nccl-tests
  EXPECT_EQ(b.busbwGBps(), b.algbwGBps());                          // point to point
  EXPECT_NEAR(b.mibPerSec(), 2000.0, 1e-9);                         // perftest's MB = 2^20
}

TEST(PerfReport, FormatsCarryEveryRowAndTheErrors) {
  PerfReport r;
  r.version = "nccl-mesh 9.9.9";
  r.plugin = "Mesh";
  r.device = "0: mesh, 100000 Mbps";
  r.peer = "TCP 10.0.0.2:18600";
  r.window = 8;
  LatRow l;
  l.size = 8;
  l.iters = 30;
  l.typUs = 2.5;
  l.avgUs = 2.6;
  l.minUs = 2.4;
  l.wrong = 0;
  r.lat.push_back(l);
  BwRow b;
  b.size = 1 << 20;
  b.iters = 10;
  b.seconds = 0.001;
  b.wrong = 3;
  r.bw.push_back(b);
  EXPECT_EQ(r.totalWrong(), 3);
  std::string table = formatTable(r);
  EXPECT_NE(table.find("algbw(GB/s)"), std::string::npos) << table;
  EXPECT_NE(table.find("#wrong"), std::string::npos);
  EXPECT_NE(table.find("# Data check: 3 byte(s) wrong\n"), std::string::npos) << table;
  EXPECT_NE(table.find("TCP 10.0.0.2:18600"), std::string::npos);
  std::string csv = formatCsv(r);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "test,size_bytes,count,type,iters,time_us,avg_us,min_us,algbw_GBps,busbw_GBps,wrong");
  EXPECT_NE(csv.find("latency,8,8,uint8,30,2.500,2.600,2.400,,,0\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find("bandwidth,1048576,1048576,uint8,10,100.000,,,10.485760,10.485760,3\n"), std::string::npos)
      << csv;
  std::string json = formatJson(r);
  EXPECT_NE(json.find("\"wrong\": 3\n}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"algbw_GBps\": 10.485760"), std::string::npos) << json;
  r.bw[0].wrong = -1;
  r.lat[0].wrong = -1;
  EXPECT_EQ(r.totalWrong(), -1);
  EXPECT_NE(formatTable(r).find("not done (--no-check)"), std::string::npos);
  EXPECT_NE(formatJson(r).find("\"wrong\": null\n}"), std::string::npos);
}

}  // namespace
}  // namespace mesh
