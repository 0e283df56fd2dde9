// Authenticated channels: messages pass between holders of the key; a wrong key, garbage, an
// oversized message and a silent peer each end in a named refusal within the deadline, and the
// listener goes on serving the others.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "unit/atom/test_key.h"
#include "atom/wire.h"
#include "test_util.h"

namespace tessera::atom {
namespace {


// A listener that echoes each message back with its type plus one, and records refusals.
struct EchoServer {
  std::mutex mutex;
  std::vector<std::string> refusals;
  Listener listener{"127.0.0.1", 0, kTestKey, "server", 1000,
                    [](std::unique_ptr<Channel> c) {
                      for (;;) {
                        Message m = c->receive(Deadline::in(5));
                        if (m.type == 9) return;
                        c->send(static_cast<uint8_t>(m.type + 1), m.body, Deadline::in(5));
                      }
                    },
                    [this](const std::string& address, const std::string& reason) {
                      std::lock_guard<std::mutex> lock(mutex);
                      refusals.push_back(address + ": " + reason);
                    }};
  std::vector<std::string> refused() {
    std::lock_guard<std::mutex> lock(mutex);
    return refusals;
  }
  // Waits until `n` refusals were recorded (the server's threads report them).
  bool wait_refusals(size_t n) {
    for (int i = 0; i < 200 && refused().size() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return refused().size() >= n;
  }
};

int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

TEST(Wire, MessagesPassBetweenHoldersOfTheKey) {
  EchoServer server;
  auto c = Channel::connect("127.0.0.1", server.listener.port(), kTestKey, "client", Deadline::in(5), 1 << 20);
  EXPECT_EQ(c->peer_id(), "server");
  for (const std::string& body : {std::string("hello"), std::string(), std::string(900, 'x')}) {
    c->send(4, body, Deadline::in(5));
    const Message m = c->receive(Deadline::in(5), 5);
    EXPECT_EQ(m.body, body);
  }
  c->send(9, "", Deadline::in(5));
  EXPECT_TRUE(server.refused().empty());
}

TEST(Wire, AWrongKeyIsRefusedOnBothSides) {
  EchoServer server;
  const SwarmKey wrong = SwarmKey::from_bytes(std::string(32, 'w'));
  EXPECT_TRUE(test::throws_naming(
      [&] { Channel::connect("127.0.0.1", server.listener.port(), wrong, "stranger", Deadline::in(5), 1 << 20); },
      {"wrong swarm key"}));
  ASSERT_TRUE(server.wait_refusals(1));
  EXPECT_NE(server.refused()[0].find("127.0.0.1:"), std::string::npos) << server.refused()[0];
  // The server still serves a holder of the key.
  auto c = Channel::connect("127.0.0.1", server.listener.port(), kTestKey, "client", Deadline::in(5), 1 << 20);
  c->send(1, "ok", Deadline::in(5));
  EXPECT_EQ(c->receive(Deadline::in(5), 2).body, "ok");
  c->send(9, "", Deadline::in(5));
}

TEST(Wire, GarbageAndOversizedMessagesAreRefusedWithoutHarm) {
  EchoServer server;
  const int fd = raw_connect(server.listener.port());
  const std::string junk(64, '\xff');  // a header claiming an enormous length
  ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  ASSERT_TRUE(server.wait_refusals(1));
  ::close(fd);
  // A holder of the key sending more than the server's limit (1000 bytes) is refused too.
  auto big = Channel::connect("127.0.0.1", server.listener.port(), kTestKey, "client", Deadline::in(5), 1 << 20);
  try {
    big->send(1, std::string(5000, 'x'), Deadline::in(5));
  } catch (const WireError&) {
    // The server may refuse (and close) after the header, before the body is all sent.
  }
  ASSERT_TRUE(server.wait_refusals(2));
  EXPECT_NE(server.refused()[1].find("above the limit"), std::string::npos) << server.refused()[1];
  auto c = Channel::connect("127.0.0.1", server.listener.port(), kTestKey, "client", Deadline::in(5), 1 << 20);
  c->send(1, "still here", Deadline::in(5));
  EXPECT_EQ(c->receive(Deadline::in(5), 2).body, "still here");
  c->send(9, "", Deadline::in(5));
}

// The peer a client dials answers with a CHALLENGE header claiming 1 MiB: the client refuses it at
// the handshake's 4096-byte limit without waiting for (or allocating) the body, whatever its own
// limit for messages after the handshake.
TEST(Wire, AClientRefusesAnOversizedHandshakeFrameAtOnce) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  std::string header(1, static_cast<char>(241));  // CHALLENGE, sequence 0, length 2^20
  for (const uint64_t v : {uint64_t{0}, uint64_t{1} << 20})
    for (int i = 0; i < 8; ++i) header.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  ASSERT_EQ(::write(pair[0], header.data(), header.size()), static_cast<ssize_t>(header.size()));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(test::throws_naming(
      [&] { Channel::open_as_client(pair[1], "dialled", kTestKey, "client", Deadline::in(5), 1 << 30); },
      {"peer dialled", "1048576 bytes, above the limit of 4096 (a handshake message)"}));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  ::close(pair[0]);
}

TEST(Wire, ASilentPeerEndsTheCallAtItsDeadline) {
  // A socket that accepts and never answers: the handshake's deadline ends connect().
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(test::throws_naming(
      [&] { Channel::connect("127.0.0.1", ntohs(addr.sin_port), kTestKey, "client", Deadline::in(0.5), 1 << 20); },
      {"before the deadline"}));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 3.0);
  ::close(fd);
}

}  // namespace
}  // namespace tessera::atom
