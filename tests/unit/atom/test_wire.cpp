// TLS 1.3 channels: messages pass between holders of the key, encrypted on the wire; a wrong key,
// a plaintext client, a TLS 1.2 client (a downgrade), a recorded handshake replayed, garbage, an
// oversized message and a silent peer each end in a named refusal within the deadline, and the
// listener goes on serving the others.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <poll.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <openssl/ssl.h>

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

// A socket listening on 127.0.0.1 at a free port, that port in `port`.
int raw_listen(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
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

TEST(Wire, AHeadAndAPayloadArriveAsOneBody) {
  Listener listener{"127.0.0.1", 0, kTestKey, "server", 1 << 20,
                    [](std::unique_ptr<Channel> c) {
                      for (;;) {
                        Message m = c->receive(Deadline::in(5));
                        if (m.type == 9) return;
                        c->send(static_cast<uint8_t>(m.type + 1), m.body, Deadline::in(5));
                      }
                    },
                    [](const std::string&, const std::string& reason) { ADD_FAILURE() << reason; }};
  auto c = Channel::connect("127.0.0.1", listener.port(), kTestKey, "client", Deadline::in(5), 1 << 20);
  // Small enough for one record with the header; a large payload; a head past one record, with and
  // without a payload; no head.
  const std::vector<std::pair<size_t, size_t>> sizes = {{20, 300}, {20, 100000}, {40000, 50000}, {40000, 0}, {0, 30000}};
  for (const auto& [h, p] : sizes) {
    std::string head(h, 'h'), payload(p, 'p');
    for (size_t i = 0; i < h; i += 997) head[i] = static_cast<char>('a' + i % 26);
    for (size_t i = 0; i < p; i += 991) payload[i] = static_cast<char>('A' + i % 26);
    c->send(4, head, payload, Deadline::in(5));
    EXPECT_EQ(c->receive(Deadline::in(5), 5).body, head + payload) << "head " << h << ", payload " << p;
  }
  c->send(9, "", Deadline::in(5));
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

// The peer a client dials answers in tessera's old plaintext protocol (a CHALLENGE header claiming
// 1 MiB): the client refuses it at once, naming TLS, without waiting for (or allocating) the body.
TEST(Wire, AClientRefusesAPeerThatDoesNotSpeakTls) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  std::string header(1, static_cast<char>(241));  // CHALLENGE, sequence 0, length 2^20
  for (const uint64_t v : {uint64_t{0}, uint64_t{1} << 20})
    for (int i = 0; i < 8; ++i) header.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  ASSERT_EQ(::write(pair[0], header.data(), header.size()), static_cast<ssize_t>(header.size()));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(test::throws_naming(
      [&] { Channel::open_as_client(pair[1], "dialled", kTestKey, "client", Deadline::in(5), 1 << 30); },
      {"peer dialled", "the TLS 1.3 handshake failed"}));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  ::close(pair[0]);
}

// A client that speaks plaintext (tessera's old HELLO), one that offers TLS 1.2 at most (a
// downgrade), and one that replays the bytes a holder of the key sent in an earlier connection
// (its handshake and a message) are each refused, with their address, and get nothing.
TEST(Wire, PlaintextDowngradeAndReplayedHandshakesAreRefusedByAddress) {
  EchoServer server;
  const int port = server.listener.port();
  size_t refusals = 0;
  // Plaintext.
  {
    const int fd = raw_connect(port);
    std::string hello(1, static_cast<char>(240));
    for (const uint64_t v : {uint64_t{0}, uint64_t{5 + 1 + 6 + 32}})
      for (int i = 0; i < 8; ++i) hello.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    hello += "TSWM1" + std::string(1, '\x06') + "client" + std::string(32, 'n');
    ASSERT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello.size()));
    ASSERT_TRUE(server.wait_refusals(++refusals));
    EXPECT_NE(server.refused().back().find("the TLS 1.3 handshake failed"), std::string::npos) << server.refused().back();
    char byte;
    EXPECT_LE(::recv(fd, &byte, 1, 0), 1) << "the server closes: no echo comes";
    ::close(fd);
  }
  // TLS 1.2 at most.
  {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION);
    SSL* ssl = SSL_new(ctx);
    const int fd = raw_connect(port);
    SSL_set_fd(ssl, fd);
    EXPECT_LE(SSL_connect(ssl), 0) << "a TLS 1.2 handshake completed";
    ASSERT_TRUE(server.wait_refusals(++refusals));
    EXPECT_NE(server.refused().back().find("unsupported protocol"), std::string::npos) << server.refused().back();
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    ::close(fd);
  }
  // A recorded connection replayed: a proxy records what a holder of the key sends through it.
  std::string recorded;
  {
    int front_port = 0;
    const int front = raw_listen(front_port);
    std::thread proxy([&] {
      const int in = ::accept(front, nullptr, nullptr), out = raw_connect(port);
      char buffer[65536];
      for (bool open = true; open;) {
        pollfd fds[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
        if (::poll(fds, 2, 5000) <= 0) break;
        for (int k = 0; k < 2 && open; ++k) {
          if (!(fds[k].revents & (POLLIN | POLLHUP))) continue;
          const ssize_t n = ::recv(fds[k].fd, buffer, sizeof(buffer), 0);
          if (n <= 0) {
            open = false;
            break;
          }
          if (k == 0) recorded.append(buffer, static_cast<size_t>(n));
          ::send(k == 0 ? out : in, buffer, static_cast<size_t>(n), MSG_NOSIGNAL);
        }
      }
      ::close(in);
      ::close(out);
    });
    {
      auto c = Channel::connect("127.0.0.1", front_port, kTestKey, "client", Deadline::in(5), 1 << 20);
      c->send(4, "the secret gradients", Deadline::in(5));
      EXPECT_EQ(c->receive(Deadline::in(5), 5).body, "the secret gradients");
      c->send(9, "", Deadline::in(5));
    }
    proxy.join();
    ::close(front);
  }
  EXPECT_EQ(recorded.find("the secret gradients"), std::string::npos) << "the message crossed in the clear";
  EXPECT_EQ(recorded.find("client"), std::string::npos) << "the id crossed in the clear";
  ASSERT_FALSE(recorded.empty());
  const int fd = raw_connect(port);
  ASSERT_EQ(::send(fd, recorded.data(), recorded.size(), MSG_NOSIGNAL), static_cast<ssize_t>(recorded.size()));
  ASSERT_TRUE(server.wait_refusals(++refusals));
  EXPECT_NE(server.refused().back().find("127.0.0.1:"), std::string::npos) << server.refused().back();
  EXPECT_NE(server.refused().back().find("the TLS 1.3 handshake failed"), std::string::npos) << server.refused().back();
  ::close(fd);
  // Through all of it the server serves a holder of the key.
  auto c = Channel::connect("127.0.0.1", port, kTestKey, "client", Deadline::in(5), 1 << 20);
  c->send(1, "ok", Deadline::in(5));
  EXPECT_EQ(c->receive(Deadline::in(5), 2).body, "ok");
  c->send(9, "", Deadline::in(5));
  EXPECT_EQ(server.refused().size(), refusals);
}

TEST(Wire, ASilentPeerEndsTheCallAtItsDeadline) {
  // A socket that accepts and never answers: the handshake's deadline ends connect().
  int port = 0;
  const int fd = raw_listen(port);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(test::throws_naming(
      [&] { Channel::connect("127.0.0.1", port, kTestKey, "client", Deadline::in(0.5), 1 << 20); },
      {"before the deadline"}));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 3.0);
  ::close(fd);
}

}  // namespace
}  // namespace tessera::atom
