// Wire: TLS 1.3 connections between the peers of one swarm (atom/).
//
// A Channel is one TCP connection that completed a TLS 1.3 handshake authenticated by the swarm
// key (K, swarm_key.h); nothing of a peer's state crosses before it. The handshake (OpenSSL) uses
// an external pre-shared key (RFC 8446, 2.2): PSK = HMAC(K, "tessera swarm tls 1.3 psk"), identity
// "tessera swarm", cipher suite TLS_AES_128_GCM_SHA256, with an ephemeral (EC)DHE exchange
// (psk_dhe_ke), so:
//   - both sides prove they hold K (the PSK binder and the Finished messages), and K never travels;
//   - every byte after the handshake is encrypted and authenticated (AES-GCM): a reader on the
//     path learns nothing of the gradients, parameters or states, and an altered, reordered or
//     replayed record fails its tag;
//   - the traffic keys are fresh per connection (the DHE shares), so a key stolen later does not
//     decrypt recorded traffic, and a recorded handshake replayed opens nothing (the server's
//     share and random differ, so the replayed Finished fails).
// TLS 1.3 only (a TLS 1.2 or older ClientHello is refused: no downgrade), no session tickets and no
// resumption (a session is never reused), no early data (no 0-RTT replay); TLS 1.3 has no
// renegotiation. A side whose handshake fails closes the connection: the client's connect() throws
// (naming the address and OpenSSL's reason), the server refuses it with the client's address
// (Listener's refusal callback). After the handshake each side sends its peer id (at most 64
// bytes) as the first message. Every message is then
//   [type u8][length u64][body]
// inside the TLS records, `length` at most the channel's limit (a larger one is refused before
// anything is allocated; before the ids are exchanged the limit is 4096 bytes).
//
// The process ignores SIGPIPE once a channel exists (OpenSSL's writes would raise it on a dead
// peer's socket). Every read and write has a deadline: a silent, stalled or dead peer ends the call with a
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

struct ssl_st;  // OpenSSL's SSL (openssl/ssl.h), kept out of this header

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

// The bytes a message with a body of `body` bytes takes on the wire: its frame header and the TLS
// records that carry them (5 bytes of header, 1 of content type and 16 of tag per record of at
// most 16 KiB).
uint64_t wire_bytes(uint64_t body);

class Channel {
 public:
  // Connects to host:port and runs the handshake as the client.
  static std::unique_ptr<Channel> connect(const std::string& host, int port, const SwarmKey& key,
                                          const std::string& my_id, Deadline deadline, size_t max_bytes);
  // Runs the handshake as the server on an accepted socket (owned from here on).
  static std::unique_ptr<Channel> accept(int fd, const std::string& address, const SwarmKey& key,
                                         const std::string& my_id, Deadline deadline, size_t max_bytes);
  // Runs the handshake as the client on a connected socket (owned from here on): connect() once
  // connected (the fuzz target drives it over a socket pair).
  static std::unique_ptr<Channel> open_as_client(int fd, const std::string& address, const SwarmKey& key,
                                                 const std::string& my_id, Deadline deadline, size_t max_bytes);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void send(uint8_t type, std::string_view body, Deadline deadline);
  // A message whose body is `head` followed by `payload`, the payload written from where it lies
  // (a part's values, not copied into one body first); its receiver reads the message
  // send(type, head + payload) sends.
  void send(uint8_t type, std::string_view head, std::string_view payload, Deadline deadline);
  // The next message; `expect` (when nonzero) is the only type accepted.
  Message receive(Deadline deadline, uint8_t expect = 0);
  // Between messages on a kept channel: true once the next message has begun to arrive or the peer
  // closed the connection (receive() then says which), false when `until` passed first. At once
  // (Deadline::in(0)) it tells whether an idle channel is still open and clean: a kept channel
  // whose peer went away reads as true.
  bool wait_readable(Deadline until);
  const std::string& peer_id() const { return peer_id_; }
  const std::string& address() const { return address_; }
  // The bytes this channel's socket carried so far, TLS's handshake and records included.
  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;

 private:
  Channel(int fd, std::string address, size_t max_bytes);
  // The TLS handshake on this side, then the ids.
  static std::unique_ptr<Channel> handshake(std::unique_ptr<Channel> c, bool server, const SwarmKey& key,
                                            const std::string& my_id, Deadline deadline);
  // Runs `op` (an OpenSSL call on ssl_, > 0 on success) until it succeeds, waiting for the socket
  // as OpenSSL asks until the deadline; throws WireError naming `what` otherwise.
  template <class Op>
  void drive(Op op, Deadline deadline, const std::string& what);
  void write_all(std::string_view bytes, Deadline deadline, const char* what);
  void read_all(char* out, size_t n, Deadline deadline, const char* what);

  int fd_;
  std::string address_, peer_id_;
  size_t max_bytes_;
  bool open_ = false;  // the ids are exchanged: `max_bytes_` holds
  std::string psk_;    // read by the handshake's callbacks (SSL_get_app_data)
  ::ssl_st* ssl_ = nullptr;  // OpenSSL's SSL
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
