// Authenticated channels and the listener (wire.h).
#include "atom/wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tessera::atom {
namespace {

constexpr std::string_view kMagic = "TSWM1";
constexpr size_t kNonce = 32;
constexpr size_t kMaxId = 64;
constexpr size_t kHeader = 1 + 8 + 8;  // type, sequence, length
constexpr size_t kHandshakeBytes = 4096;  // the largest frame either side reads before the session

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string_view view(const Tag& t) { return {reinterpret_cast<const char*>(t.data()), t.size()}; }

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

// Waits until fd is ready for `events` or the deadline passes (false).
bool wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    const double left = deadline.seconds_left();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min(left * 1000.0 + 1, 1e9)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // the read or write that follows names the error
  }
}

// The handshake's bodies: id (length-prefixed), then fixed-size fields.
std::string pack_id(const std::string& id) { return std::string(1, static_cast<char>(id.size())) + id; }

std::string unpack_id(std::string_view& in, const std::string& address) {
  if (in.empty() || static_cast<unsigned char>(in[0]) > kMaxId || in.size() < 1 + static_cast<size_t>(in[0]))
    throw WireError("peer " + address + " sent a malformed handshake");
  const size_t n = static_cast<unsigned char>(in[0]);
  std::string id(in.substr(1, n));
  in.remove_prefix(1 + n);
  return id;
}

std::string take(std::string_view& in, size_t n, const std::string& address) {
  if (in.size() < n) throw WireError("peer " + address + " sent a malformed handshake");
  std::string out(in.substr(0, n));
  in.remove_prefix(n);
  return out;
}

enum Step : uint8_t { kHello = 240, kChallenge = 241, kProof = 242 };

}  // namespace

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
  if (fd_ >= 0) ::close(fd_);
}

void Channel::write_all(std::string_view bytes, Deadline deadline, const char* what) {
  size_t done = 0;
  while (done < bytes.size()) {
    if (!wait_for(fd_, POLLOUT, deadline))
      throw WireError("peer " + address_ + " did not take " + what + " before the deadline");
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) throw WireError("sending " + std::string(what) + " to peer " + address_ + " failed: " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  bytes_sent_ += bytes.size();
}

void Channel::read_all(char* out, size_t n, Deadline deadline, const char* what) {
  size_t done = 0;
  while (done < n) {
    if (!wait_for(fd_, POLLIN, deadline))
      throw WireError("peer " + address_ + " sent no " + what + " before the deadline");
    const ssize_t got = ::recv(fd_, out + done, n - done, 0);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (got == 0) throw WireError("peer " + address_ + " closed the connection while " + what + " was awaited");
    if (got < 0) throw WireError("receiving " + std::string(what) + " from peer " + address_ + " failed: " + std::strerror(errno));
    done += static_cast<size_t>(got);
  }
  bytes_received_ += n;
}

Tag Channel::message_tag(char direction, uint64_t sequence, std::string_view header, std::string_view body) const {
  std::string prefix(1, direction);
  put_u64(prefix, sequence);
  return session_->tag({prefix, header, body});
}

void Channel::send(uint8_t type, std::string_view body, Deadline deadline) {
  std::string header(1, static_cast<char>(type));
  put_u64(header, send_sequence_);
  put_u64(header, body.size());
  const Tag tag = session_ ? message_tag(send_direction_, send_sequence_, header, body) : Tag{};
  ++send_sequence_;
  write_all(header, deadline, "a message header");
  write_all(body, deadline, "a message");
  if (session_) write_all(view(tag), deadline, "a message tag");
}

Message Channel::receive(Deadline deadline, uint8_t expect) {
  char header[kHeader];
  read_all(header, kHeader, deadline, "a message header");
  Message m;
  m.type = static_cast<uint8_t>(header[0]);
  const uint64_t sequence = get_u64(header + 1), length = get_u64(header + 9);
  const size_t limit = session_ ? max_bytes_ : std::min(max_bytes_, kHandshakeBytes);
  if (length > limit)
    throw WireError("peer " + address_ + " sent a message of " + std::to_string(length) + " bytes, above the limit of " +
                    std::to_string(limit) + (session_ ? " (swarm.max_message_mb)" : " (a handshake message)") +
                    ": refused");
  if (sequence != receive_sequence_) throw WireError("peer " + address_ + " sent a message out of sequence");
  m.body.resize(length);
  read_all(m.body.data(), length, deadline, "a message body");
  if (session_) {
    Tag got{};
    read_all(reinterpret_cast<char*>(got.data()), got.size(), deadline, "a message tag");
    if (!same_tag(got, message_tag(receive_direction_, sequence, std::string_view(header, kHeader), m.body)))
      throw WireError("peer " + address_ + " sent a message whose tag does not match the swarm key: refused");
  }
  ++receive_sequence_;
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
  return client_handshake(std::move(c), key, my_id, deadline);
}

std::unique_ptr<Channel> Channel::open_as_client(int fd, const std::string& address, const SwarmKey& key,
                                                 const std::string& my_id, Deadline deadline, size_t max_bytes) {
  std::unique_ptr<Channel> c(new Channel(fd, address, max_bytes));
  set_nonblocking(fd);
  return client_handshake(std::move(c), key, my_id, deadline);
}

std::unique_ptr<Channel> Channel::client_handshake(std::unique_ptr<Channel> c, const SwarmKey& key,
                                                   const std::string& my_id, Deadline deadline) {
  const std::string& address = c->address_;
  const std::string nonce_c = random_bytes(kNonce);
  c->send(kHello, std::string(kMagic) + pack_id(my_id) + nonce_c, deadline);
  const Message challenge = c->receive(deadline, kChallenge);
  std::string_view in = challenge.body;
  c->peer_id_ = unpack_id(in, address);
  const std::string nonce_s = take(in, kNonce, address), proof_s = take(in, 32, address);
  const std::string ids = pack_id(my_id) + pack_id(c->peer_id_);
  Tag want = key.tag({"server", nonce_c, nonce_s, ids});
  Tag got{};
  std::memcpy(got.data(), proof_s.data(), got.size());
  if (!same_tag(got, want)) throw WireError("peer " + address + " does not hold this swarm's key (wrong swarm key)");
  c->send(kProof, view(key.tag({"client", nonce_s, nonce_c, ids})), deadline);
  c->session_ = std::make_unique<SwarmKey>(key.derive("session" + nonce_c + nonce_s));
  c->send_direction_ = 'c';
  c->receive_direction_ = 's';
  return c;
}

std::unique_ptr<Channel> Channel::accept(int fd, const std::string& address, const SwarmKey& key,
                                         const std::string& my_id, Deadline deadline, size_t max_bytes) {
  std::unique_ptr<Channel> c(new Channel(fd, address, max_bytes));
  set_nonblocking(fd);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const Message hello = c->receive(deadline, kHello);
  std::string_view in = hello.body;
  if (take(in, kMagic.size(), address) != kMagic) throw WireError("peer " + address + " does not speak tessera's swarm protocol");
  c->peer_id_ = unpack_id(in, address);
  const std::string nonce_c = take(in, kNonce, address), nonce_s = random_bytes(kNonce);
  const std::string ids = pack_id(c->peer_id_) + pack_id(my_id);
  c->send(kChallenge, pack_id(my_id) + nonce_s + std::string(view(key.tag({"server", nonce_c, nonce_s, ids}))), deadline);
  const Message proof = c->receive(deadline, kProof);
  Tag got{};
  if (proof.body.size() != got.size()) throw WireError("peer " + address + " sent a malformed handshake");
  std::memcpy(got.data(), proof.body.data(), got.size());
  if (!same_tag(got, key.tag({"client", nonce_s, nonce_c, ids})))
    throw WireError("peer " + address + " does not hold this swarm's key (wrong swarm key)");
  c->session_ = std::make_unique<SwarmKey>(key.derive("session" + nonce_c + nonce_s));
  c->send_direction_ = 's';
  c->receive_direction_ = 'c';
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
