// Wire: authenticated TCP connections between the peers of one swarm (atom/).
//
// A Channel is one TCP connection that passed the handshake; nothing of a peer's state crosses
// before it. The handshake is mutual and the key never travels (K: the swarm key, swarm_key.h):
//   client -> server  HELLO      "TSWM1", client id, nonce_c (32 random bytes)
//   server -> client  CHALLENGE  server id, nonce_s, HMAC(K, "server" | nonce_c | nonce_s | ids)
//   client -> server  PROOF      HMAC(K, "client" | nonce_s | nonce_c | ids)
// A side whose check fails closes the connection: the client's connect() throws ("wrong swarm
// key"), the server refuses it with the client's address (Listener's refusal callback). Every later
// message is
//   [type u8][sequence u64][length u64][body][HMAC(K_s, direction | sequence | type | length | body)]
// with K_s = HMAC(K, "session" | nonce_c | nonce_s), a sequence per direction (a replayed,
// reordered or altered message fails its tag) and `length` at most the channel's limit (a larger
// one is refused before anything is allocated).
//
// Every read and write has a deadline: a silent, stalled or dead peer ends the call with a
// WireError naming its address and what was awaited, never a hang. A WireError is the peer's or
// the network's failure, for the caller to survive (drop the peer, retry the round); a malformed
// message is one too.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "atom/swarm_key.h"
#include "core/error.h"

namespace tessera::atom {

class WireError : public Error {
 public:
  using Error::Error;
};

struct Deadline {
  std::chrono::steady_clock::time_point at;
  static Deadline in(double seconds);
  double seconds_left() const;  // 0 once passed
};

// "host:port" -> host, port (throws naming `what`, e.g. "--listen").
std::pair<std::string, int> split_address(const std::string& address, const std::string& what);

struct Message {
  uint8_t type = 0;
  std::string body;
};

class Channel {
 public:
  // Connects to host:port and runs the handshake as the client.
  static std::unique_ptr<Channel> connect(const std::string& host, int port, const SwarmKey& key,
                                          const std::string& my_id, Deadline deadline, size_t max_bytes);
  // Runs the handshake as the server on an accepted socket (owned from here on).
  static std::unique_ptr<Channel> accept(int fd, const std::string& address, const SwarmKey& key,
                                         const std::string& my_id, Deadline deadline, size_t max_bytes);
  // Runs the handshake as the client on a connected socket (owned from here on): connect() once
  // connected (the fuzz target drives it over a socket pair). Until the session begins, receive()
  // reads frames of at most 4096 bytes on either side; `max_bytes` holds after it.
  static std::unique_ptr<Channel> open_as_client(int fd, const std::string& address, const SwarmKey& key,
                                                 const std::string& my_id, Deadline deadline, size_t max_bytes);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void send(uint8_t type, std::string_view body, Deadline deadline);
  // The next message; `expect` (when nonzero) is the only type accepted.
  Message receive(Deadline deadline, uint8_t expect = 0);
  const std::string& peer_id() const { return peer_id_; }
  const std::string& address() const { return address_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  Channel(int fd, std::string address, size_t max_bytes);
  static std::unique_ptr<Channel> client_handshake(std::unique_ptr<Channel> c, const SwarmKey& key,
                                                   const std::string& my_id, Deadline deadline);
  void write_all(std::string_view bytes, Deadline deadline, const char* what);
  void read_all(char* out, size_t n, Deadline deadline, const char* what);
  Tag message_tag(char direction, uint64_t sequence, std::string_view header, std::string_view body) const;

  int fd_;
  std::string address_, peer_id_;
  size_t max_bytes_;
  std::unique_ptr<SwarmKey> session_;
  char send_direction_ = 'c', receive_direction_ = 's';
  uint64_t send_sequence_ = 0, receive_sequence_ = 0;
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
};

// Accepts connections on host:port (port 0: any free one) on its own thread and hands each
// authenticated Channel to `serve`, on a thread of its own; a connection that fails the handshake
// is closed and reported to `refused` with its address and reason. Stopped (and its threads
// joined) by stop() or the destructor.
class Listener {
 public:
  using Serve = std::function<void(std::unique_ptr<Channel>)>;
  using Refused = std::function<void(const std::string& address, const std::string& reason)>;
  Listener(const std::string& host, int port, const SwarmKey& key, std::string my_id, size_t max_bytes, Serve serve,
           Refused refused);
  ~Listener();
  int port() const { return port_; }
  void stop();

 private:
  void run();

  int fd_ = -1, port_ = 0;
  SwarmKey key_;
  std::string my_id_;
  size_t max_bytes_;
  Serve serve_;
  Refused refused_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex mutex_;
  std::vector<Worker> workers_;  // finished ones joined at the next accept
};

}  // namespace tessera::atom
