// TLS 1.3 channels and the listener (wire.h).
#include "atom/wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>

#include <cerrno>
#include <csignal>
#include <cstring>

namespace tessera::atom {
namespace {

constexpr size_t kMaxId = 64;
constexpr size_t kHeader = 1 + 8;  // type, length
constexpr size_t kHandshakeBytes = 4096;  // the largest message either side reads before the ids
constexpr size_t kRecord = 16384, kRecordOverhead = 5 + 1 + 16;
constexpr size_t kWriteChunk = size_t{1} << 20;  // bytes handed to one SSL_write
constexpr uint8_t kHello = 240;  // the ids, first message each way
constexpr std::string_view kIdentity = "tessera swarm";
constexpr unsigned char kSuite[2] = {0x13, 0x01};  // TLS_AES_128_GCM_SHA256

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

// Waits until fd is ready for `events` or the deadline passes (false). Looks at least once, so a
// deadline already passed (Deadline::in(0)) asks whether fd is ready now.
bool wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    const double left = deadline.seconds_left();
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, left > 0 ? static_cast<int>(std::min(left * 1000.0 + 1, 1e9)) : 0);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // the read or write that follows names the error
    if (left <= 0) return false;
  }
}

// OpenSSL's queued reasons, oldest first, and the queue cleared.
std::string openssl_reason() {
  std::string out;
  char line[256];
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    ERR_error_string_n(e, line, sizeof(line));
    out += (out.empty() ? "" : "; ") + std::string(line);
  }
  return out;
}

// A TLS 1.3 session holding the PSK, for the handshake's callbacks (nullptr on failure).
SSL_SESSION* psk_session(SSL* ssl) {
  const auto* psk = static_cast<const std::string*>(SSL_get_app_data(ssl));
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kSuite);
  SSL_SESSION* session = psk && cipher ? SSL_SESSION_new() : nullptr;
  if (!session) return nullptr;
  if (!SSL_SESSION_set1_master_key(session, reinterpret_cast<const unsigned char*>(psk->data()), psk->size()) ||
      !SSL_SESSION_set_cipher(session, cipher) || !SSL_SESSION_set_protocol_version(session, TLS1_3_VERSION)) {
    SSL_SESSION_free(session);
    return nullptr;
  }
  return session;
}

// The client offers the PSK (a second call, after a HelloRetryRequest, names the hash the server
// chose: the PSK goes only with SHA-256, its suite's).
int use_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* id_length, SSL_SESSION** session) {
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kSuite);
  if (md && (!cipher || EVP_MD_get_type(md) != EVP_MD_get_type(SSL_CIPHER_get_handshake_digest(cipher)))) {
    *session = nullptr;
    return 1;
  }
  *session = psk_session(ssl);
  if (!*session) return 0;
  *id = reinterpret_cast<const unsigned char*>(kIdentity.data());
  *id_length = kIdentity.size();
  return 1;  // the session is OpenSSL's from here
}

// The server takes the PSK for its identity only; its binder (checked by OpenSSL) proves the
// client holds the key.
int find_psk(SSL* ssl, const unsigned char* id, size_t id_length, SSL_SESSION** session) {
  if (id_length != kIdentity.size() || std::memcmp(id, kIdentity.data(), id_length) != 0) {
    *session = nullptr;
    return 1;
  }
  *session = psk_session(ssl);
  return *session ? 1 : 0;
}

SSL_CTX* make_context(bool server) {
  // OpenSSL writes to the socket with write(), not send(..., MSG_NOSIGNAL): a write to a peer that
  // died would raise SIGPIPE and end the process silently (a swarm test caught a peer dying so when
  // the peer it sent to was killed), so, as comm/mesh.h does for a world of several ranks, the
  // process ignores SIGPIPE from its first channel on and the write fails with EPIPE, a WireError
  // naming the peer.
  std::signal(SIGPIPE, SIG_IGN);
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  require(ctx != nullptr, "cannot make a TLS context: ", openssl_reason());
  const bool ok = SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) &&
                  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) &&
                  SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256") &&
                  SSL_CTX_set_num_tickets(ctx, 0) && SSL_CTX_set_max_early_data(ctx, 0);
  require(ok, "cannot configure TLS 1.3: ", openssl_reason());
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (server) SSL_CTX_set_psk_find_session_callback(ctx, find_psk);
  else SSL_CTX_set_psk_use_session_callback(ctx, use_psk);
  return ctx;
}

// One context per side for the process (OpenSSL's contexts are safe to share once configured).
SSL_CTX* context(bool server) {
  static SSL_CTX* const client_context = make_context(false);
  static SSL_CTX* const server_context = make_context(true);
  return server ? server_context : client_context;
}

std::string check_id(const std::string& id, const std::string& address) {
  if (id.empty() || id.size() > kMaxId) throw WireError("peer " + address + " sent a malformed id");
  return id;
}

}  // namespace

uint64_t wire_bytes(uint64_t body) {
  const uint64_t plain = kHeader + body;
  return plain + kRecordOverhead * ((plain + kRecord - 1) / kRecord);
}

Deadline Deadline::in(double seconds) {
  return {std::chrono::steady_clock::now() +
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds))};
}

double Deadline::seconds_left() const {
  return std::max(0.0, std::chrono::duration<double>(at - std::chrono::steady_clock::now()).count());
}

std::pair<std::string, int> split_address(const std::string& address, const std::string& what) {
  const size_t colon = address.rfind(':');
  require(colon != std::string::npos && colon > 0 && colon + 1 < address.size(), what, " ", address,
          ": expected HOST:PORT");
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  require(port.find_first_not_of("0123456789") == std::string::npos && port.size() <= 5 && std::stoi(port) <= 65535,
          what, " ", address, ": the port must be a number from 0 to 65535");
  return {host, std::stoi(port)};
}

Channel::Channel(int fd, std::string address, size_t max_bytes)
    : fd_(fd), address_(std::move(address)), max_bytes_(max_bytes) {}

Channel::~Channel() {
  if (ssl_) {
    SSL_shutdown(ssl_);  // one try at close_notify: the socket is non-blocking, nothing waits
    SSL_free(ssl_);
    ERR_clear_error();
  }
  if (fd_ >= 0) ::close(fd_);
}

uint64_t Channel::bytes_sent() const { return ssl_ ? BIO_number_written(SSL_get_wbio(ssl_)) : 0; }

uint64_t Channel::bytes_received() const { return ssl_ ? BIO_number_read(SSL_get_rbio(ssl_)) : 0; }

template <class Op>
void Channel::drive(Op op, Deadline deadline, const std::string& what) {
  for (;;) {
    ERR_clear_error();
    errno = 0;
    const int r = op();
    if (r > 0) return;
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      if (!wait_for(fd_, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline))
        throw WireError("peer " + address_ + ": " + what + " did not complete before the deadline");
      continue;
    }
    const std::string reason = openssl_reason();
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && reason.empty()))
      throw WireError("peer " + address_ + " closed the connection during " + what +
                      (errno != 0 ? std::string(" (") + std::strerror(errno) + ")" : ""));
    throw WireError("peer " + address_ + ": " + what + " failed: " + (reason.empty() ? "TLS error" : reason));
  }
}

void Channel::write_all(std::string_view bytes, Deadline deadline, const char* what) {
  size_t done = 0;
  while (done < bytes.size()) {
    size_t written = 0;
    const size_t n = std::min(bytes.size() - done, kWriteChunk);
    drive([&] { return SSL_write_ex(ssl_, bytes.data() + done, n, &written); }, deadline,
          std::string("sending ") + what);
    done += written;
  }
}

void Channel::read_all(char* out, size_t n, Deadline deadline, const char* what) {
  size_t done = 0;
  while (done < n) {
    size_t got = 0;
    drive([&] { return SSL_read_ex(ssl_, out + done, n - done, &got); }, deadline, std::string("receiving ") + what);
    done += got;
  }
}

void Channel::send(uint8_t type, std::string_view body, Deadline deadline) { send(type, body, {}, deadline); }

void Channel::send(uint8_t type, std::string_view head, std::string_view payload, Deadline deadline) {
  std::string first(1, static_cast<char>(type));
  put_u64(first, head.size() + payload.size());
  // A small message travels in one record with its header; a large one's header goes first, with
  // its head where that is small.
  if (head.size() + payload.size() <= kRecord) {
    first.append(head).append(payload);
    write_all(first, deadline, "a message");
    return;
  }
  if (head.size() <= kRecord) {
    first.append(head);
    head = {};
  }
  write_all(first, deadline, "a message header");
  if (!head.empty()) write_all(head, deadline, "a message");
  if (!payload.empty()) write_all(payload, deadline, "a message");
}

bool Channel::wait_readable(Deadline until) { return SSL_pending(ssl_) > 0 || wait_for(fd_, POLLIN, until); }

Message Channel::receive(Deadline deadline, uint8_t expect) {
  char header[kHeader];
  read_all(header, kHeader, deadline, "a message header");
  Message m;
  m.type = static_cast<uint8_t>(header[0]);
  const uint64_t length = get_u64(header + 1);
  const size_t limit = open_ ? max_bytes_ : std::min(max_bytes_, kHandshakeBytes);
  if (length > limit)
    throw WireError("peer " + address_ + " sent a message of " + std::to_string(length) + " bytes, above the limit of " +
                    std::to_string(limit) + (open_ ? " (swarm.max_message_mb)" : " (a message before the ids)") +
                    ": refused");
  m.body.resize(length);
  read_all(m.body.data(), length, deadline, "a message body");
  if (expect && m.type != expect)
    throw WireError("peer " + address_ + " sent message type " + std::to_string(m.type) + " where " +
                    std::to_string(expect) + " was expected");
  return m;
}

std::unique_ptr<Channel> Channel::connect(const std::string& host, int port, const SwarmKey& key,
                                          const std::string& my_id, Deadline deadline, size_t max_bytes) {
  const std::string address = host + ":" + std::to_string(port);
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    throw WireError("cannot resolve peer address " + address);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    ::freeaddrinfo(found);
    throw WireError("cannot open a socket to " + address);
  }
  std::unique_ptr<Channel> c(new Channel(fd, address, max_bytes));
  set_nonblocking(fd);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const int rc = ::connect(fd, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  if (rc != 0 && errno != EINPROGRESS) throw WireError("cannot connect to peer " + address + ": " + std::strerror(errno));
  if (!wait_for(fd, POLLOUT, deadline)) throw WireError("peer " + address + " did not accept a connection in time");
  int error = 0;
  socklen_t len = sizeof(error);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
  if (error != 0) throw WireError("cannot connect to peer " + address + ": " + std::strerror(error));
  return handshake(std::move(c), false, key, my_id, deadline);
}

std::unique_ptr<Channel> Channel::open_as_client(int fd, const std::string& address, const SwarmKey& key,
                                                 const std::string& my_id, Deadline deadline, size_t max_bytes) {
  std::unique_ptr<Channel> c(new Channel(fd, address, max_bytes));
  set_nonblocking(fd);
  return handshake(std::move(c), false, key, my_id, deadline);
}

std::unique_ptr<Channel> Channel::accept(int fd, const std::string& address, const SwarmKey& key,
                                         const std::string& my_id, Deadline deadline, size_t max_bytes) {
  std::unique_ptr<Channel> c(new Channel(fd, address, max_bytes));
  set_nonblocking(fd);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return handshake(std::move(c), true, key, my_id, deadline);
}

std::unique_ptr<Channel> Channel::handshake(std::unique_ptr<Channel> c, bool server, const SwarmKey& key,
                                            const std::string& my_id, Deadline deadline) {
  const Tag psk = key.tag("tessera swarm tls 1.3 psk");
  c->psk_.assign(reinterpret_cast<const char*>(psk.data()), psk.size());
  c->ssl_ = SSL_new(context(server));
  if (!c->ssl_ || !SSL_set_fd(c->ssl_, c->fd_)) throw WireError("cannot start TLS: " + openssl_reason());
  SSL_set_app_data(c->ssl_, &c->psk_);
  try {
    c->drive([&] { return server ? SSL_accept(c->ssl_) : SSL_connect(c->ssl_); }, deadline,
             "the TLS 1.3 handshake");
  } catch (const WireError& e) {
    throw WireError(std::string(e.what()) +
                    " (a peer without this swarm's key (wrong swarm key), or one that does not speak TLS 1.3)");
  }
  if (!SSL_session_reused(c->ssl_))
    throw WireError("peer " + c->address_ + " completed a handshake without the swarm's key: refused");
  if (server) {
    c->peer_id_ = check_id(c->receive(deadline, kHello).body, c->address_);
    c->send(kHello, my_id, deadline);
  } else {
    c->send(kHello, my_id, deadline);
    c->peer_id_ = check_id(c->receive(deadline, kHello).body, c->address_);
  }
  c->open_ = true;
  return c;
}

Listener::Listener(const std::string& host, int port, const SwarmKey& key, std::string my_id, size_t max_bytes,
                   Serve serve, Refused refused)
    : key_(key), my_id_(std::move(my_id)), max_bytes_(max_bytes), serve_(std::move(serve)), refused_(std::move(refused)) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  require(fd_ >= 0, "cannot open a listening socket");
  const int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    ::close(fd_);
    fail("--listen ", host, ":", port, ": the host must be an IPv4 address");
  }
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd_, 64) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd_);
    fail("cannot listen on ", host, ":", port, ": ", reason);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { run(); });
}

Listener::~Listener() { stop(); }

void Listener::stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
  std::vector<Worker> workers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    workers.swap(workers_);
  }
  for (Worker& w : workers) w.thread.join();
}

void Listener::run() {
  while (!stopping_) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    sockaddr_in from{};
    socklen_t len = sizeof(from);
    const int client = ::accept(fd_, reinterpret_cast<sockaddr*>(&from), &len);
    if (client < 0) continue;
    char ip[INET_ADDRSTRLEN] = {0};
    ::inet_ntop(AF_INET, &from.sin_addr, ip, sizeof(ip));
    const std::string address = std::string(ip) + ":" + std::to_string(ntohs(from.sin_port));
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < workers_.size();) {
      if (!*workers_[i].done) {
        ++i;
        continue;
      }
      workers_[i].thread.join();
      workers_[i] = std::move(workers_.back());
      workers_.pop_back();
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers_.push_back({std::thread([this, client, address, done] {
      struct Finished {
        std::atomic<bool>& flag;
        ~Finished() { flag = true; }
      } finished{*done};
      std::unique_ptr<Channel> channel;
      try {
        channel = Channel::accept(client, address, key_, my_id_, Deadline::in(10), max_bytes_);
      } catch (const std::exception& e) {
        if (refused_) refused_(address, e.what());
        return;
      }
      try {
        serve_(std::move(channel));
      } catch (const std::exception& e) {
        if (refused_) refused_(address, e.what());
      }
    }), done});
  }
}

}  // namespace tessera::atom
