// SPDX-License-Identifier: Apache-2.0
// The tools' control channel: host:port parsing, a message round trip over loopback, and
// the deadlines a half-started pair of tools relies on.
#include <gtest/gtest.h>

#include <unistd.h>

#include <thread>

#include "mesh/tools/tool_net.h"

namespace mesh {
namespace {

CtrlClock::time_point in(int ms) { return CtrlClock::now() + std::chrono::milliseconds(ms); }

TEST(ParseHostPort, FormsAdminsType) {
  std::string host, error;
  int port = 0;
  ASSERT_TRUE(parseHostPort("nodeb", 18600, &host, &port, &error));
  EXPECT_EQ(host, "nodeb");
  EXPECT_EQ(port, 18600);
  ASSERT_TRUE(parseHostPort("10.0.0.2:9000", 18600, &host, &port, &error));
  EXPECT_EQ(host, "10.0.0.2");
  EXPECT_EQ(port, 9000);
  ASSERT_TRUE(parseHostPort("[fe80::1]:7", 1, &host, &port, &error));
  EXPECT_EQ(host, "fe80::1");
  EXPECT_EQ(port, 7);
  ASSERT_TRUE(parseHostPort("fe80::1", 5, &host, &port, &error));
  EXPECT_EQ(host, "fe80::1");
  EXPECT_EQ(port, 5);
  for (const char* bad : {"", ":80", "h:", "h:0", "h:65536", "h:8x", "[fe80::1", "[::1]x"}) {
    EXPECT_FALSE(parseHostPort(bad, 1, &host, &port, &error)) << bad;
    EXPECT_FALSE(error.empty());
  }
}

TEST(CtrlSocket, MessagesRoundTripOverLoopback) {
  CtrlListener listener;
  std::string error;
  ASSERT_TRUE(listener.listen("127.0.0.1", 0, &error)) << error;
  ASSERT_GT(listener.port(), 0);
  std::thread client([&] {
    CtrlSocket s;
    std::string err, msg;
    ASSERT_TRUE(ctrlConnect("127.0.0.1", listener.port(), in(5000), &s, &err)) << err;
    ASSERT_TRUE(s.send(std::string("hello\n") + std::string(100000, 'x'), in(5000), &err)) << err;
    ASSERT_TRUE(s.recv(&msg, in(5000), &err)) << err;
    EXPECT_EQ(msg, "");
  });
  CtrlSocket server;
  std::string peer, msg;
  ASSERT_TRUE(listener.accept(&server, &peer, in(5000), &error)) << error;
  EXPECT_EQ(peer.compare(0, 10, "127.0.0.1:"), 0) << peer;
  ASSERT_TRUE(server.recv(&msg, in(5000), &error)) << error;
  EXPECT_EQ(msg.size(), 6u + 100000u);
  ASSERT_TRUE(server.send("", in(5000), &error)) << error;
  client.join();
  // The client has gone: the next receive says so instead of waiting.
  EXPECT_FALSE(server.recv(&msg, in(5000), &error));
  EXPECT_NE(error.find("closed"), std::string::npos) << error;
}

TEST(CtrlSocket, WaitsEndAtTheirDeadline) {
  CtrlListener listener;
  std::string error;
  ASSERT_TRUE(listener.listen("127.0.0.1", 0, &error)) << error;
  CtrlSocket quiet, server;
  ASSERT_TRUE(ctrlConnect("127.0.0.1", listener.port(), in(5000), &quiet, &error)) << error;
  ASSERT_TRUE(listener.accept(&server, nullptr, in(5000), &error)) << error;
  auto t0 = CtrlClock::now();
  std::string msg;
  EXPECT_FALSE(server.recv(&msg, in(200), &error));
  EXPECT_NE(error.find("timed out"), std::string::npos) << error;
  EXPECT_LT(CtrlClock::now() - t0, std::chrono::seconds(3));
  CtrlSocket nobody;
  EXPECT_FALSE(listener.accept(&nobody, nullptr, in(200), &error));
  EXPECT_NE(error.find("timed out"), std::string::npos) << error;
}

TEST(CtrlSocket, ARefusedConnectIsRetriedUntilTheServerListens) {
  int port = 0;
  {
    CtrlListener probe;  // find a free port, then close it
    std::string error;
    ASSERT_TRUE(probe.listen("127.0.0.1", 0, &error)) << error;
    port = probe.port();
  }
  {
    CtrlListener late;
    std::string lateError;
    std::thread server([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ASSERT_TRUE(late.listen("127.0.0.1", port, &lateError)) << lateError;
      CtrlSocket s;
      ASSERT_TRUE(late.accept(&s, nullptr, in(5000), &lateError)) << lateError;
    });
    CtrlSocket s;
    std::string error;
    EXPECT_TRUE(ctrlConnect("127.0.0.1", port, in(5000), &s, &error)) << error;
    server.join();
  }  // the listener is gone again
  std::string error;
  CtrlSocket none;
  auto t0 = CtrlClock::now();
  EXPECT_FALSE(ctrlConnect("127.0.0.1", port, in(300), &none, &error));
  EXPECT_NE(error.find("Connection refused"), std::string::npos) << error;
  EXPECT_LT(CtrlClock::now() - t0, std::chrono::seconds(3));
}

TEST(CtrlSocket, AnOversizedLengthIsRefusedUnread) {
  CtrlListener listener;
  std::string error;
  ASSERT_TRUE(listener.listen("127.0.0.1", 0, &error)) << error;
  CtrlSocket a, b;
  ASSERT_TRUE(ctrlConnect("127.0.0.1", listener.port(), in(5000), &a, &error)) << error;
  ASSERT_TRUE(listener.accept(&b, nullptr, in(5000), &error)) << error;
  unsigned char huge[4] = {0x7f, 0xff, 0xff, 0xff};
  ASSERT_EQ(::write(a.fd(), huge, 4), 4);
  std::string msg;
  EXPECT_FALSE(b.recv(&msg, in(2000), &error));
  EXPECT_NE(error.find("not this protocol"), std::string::npos) << error;
}

}  // namespace
}  // namespace mesh
