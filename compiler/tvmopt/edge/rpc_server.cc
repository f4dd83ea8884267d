// tvmopt-rpc-server: a TVM RPC server without Python, for measuring tuning candidates on a board
// (or under qemu-user here).
//
//   tvmopt-rpc-server --tracker HOST:PORT --key KEY [--host ADDR] [--port N] [--port-end N]
//                     [--custom-addr ADDR]
//
// Speaks the protocol of TVM's Python server (python/tvm/rpc/server.py and base.py): it registers
// with the tracker under KEY (length-prefixed JSON messages), offers itself with a fresh match
// key, and answers a client whose handshake names that match key. Each session runs in a forked
// child, in a work directory of its own that is removed afterwards, and is killed when it
// outlives the "-timeout=N" the client asked for. The session itself is libtvm_runtime's RPC
// endpoint ("rpc.ServerLoop" on the socket); the runtime registers upload, download, remove and
// the time evaluator, this program the work-directory functions the runtime asks for
// (tvm.rpc.server.workpath, load_module, listdir). Modules must arrive linked (.so): there is no
// compiler on the device.
//
// Whoever can reach the port can run code on this machine: trusted networks only. Errors the
// user can act on are one line on stderr and exit status 1 (2 for usage errors).

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include "run_time_checks.h"

namespace ffi = tvm::ffi;

namespace {

// Protocol constants (python/tvm/rpc/base.py).
constexpr int32_t kRPCMagic = 0xFF271;
constexpr int32_t kRPCSuccess = kRPCMagic + 0;
constexpr int32_t kRPCMismatch = kRPCMagic + 2;
constexpr int32_t kTrackerMagic = 0x2F271;
constexpr int kTrackerSuccess = 0;
constexpr int kTrackerPut = 3;
constexpr int kTrackerUpdateInfo = 5;
constexpr int kTrackerPendingMatchKeys = 7;

struct Failure : std::runtime_error {
  int code;
  explicit Failure(const std::string& msg, int code = 1) : std::runtime_error(msg), code(code) {}
};

// A lost or refused connection: the listen loop reconnects to the tracker and goes on.
struct SocketError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void Log(const std::string& msg) { std::cerr << "tvmopt-rpc-server: " << msg << std::endl; }

// ------------------------------------------------------------------------------------ sockets
void SendAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw SocketError(std::string("send: ") + std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void RecvAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) throw SocketError("connection closed by peer");
    if (k < 0) throw SocketError(std::string("recv: ") + std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// Integers on the wire are little-endian int32, as Python's struct "<i"; every target of this
// program is little-endian.
void SendInt(int fd, int32_t v) { SendAll(fd, &v, sizeof(v)); }

int32_t RecvInt(int fd) {
  int32_t v = 0;
  RecvAll(fd, &v, sizeof(v));
  return v;
}

void SendString(int fd, const std::string& s) {
  SendInt(fd, static_cast<int32_t>(s.size()));
  SendAll(fd, s.data(), s.size());
}

std::string RecvString(int fd, int32_t limit = 1 << 20) {
  int32_t n = RecvInt(fd);
  if (n < 0 || n > limit) throw SocketError("bad message length " + std::to_string(n));
  std::string s(static_cast<size_t>(n), '\0');
  if (n > 0) RecvAll(fd, &s[0], s.size());
  return s;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void SplitHostPort(const std::string& addr, std::string* host, int* port) {
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size())
    throw Failure("--tracker wants HOST:PORT, got '" + addr + "'", 2);
  *host = addr.substr(0, colon);
  try {
    *port = std::stoi(addr.substr(colon + 1));
  } catch (const std::exception&) {
    throw Failure("--tracker wants HOST:PORT, got '" + addr + "'", 2);
  }
}

int Connect(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw SocketError("cannot resolve " + host);
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) throw SocketError("cannot connect to " + host + ":" + std::to_string(port));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Binds the first free port in [port, port_end); returns the listening socket and the port.
int Listen(const std::string& host, int port, int port_end, int* bound) {
  for (int p = port; p < port_end; ++p) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), std::to_string(p).c_str(), &hints, &res) != 0 || !res)
      throw Failure("cannot resolve --host " + host);
    int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    int one = 1;
    if (fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 4) == 0) {
      freeaddrinfo(res);
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      *bound = p;
      return fd;
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
  }
  throw Failure("no free port in " + std::to_string(port) + ".." + std::to_string(port_end - 1) +
                " on " + host);
}

// --------------------------------------------------------------------------- tracker client
class Tracker {
 public:
  Tracker(std::string host, int port, std::string key, std::string custom_addr, int my_port)
      : host_(std::move(host)),
        port_(port),
        key_(std::move(key)),
        addr_json_(custom_addr.empty() ? "null" : JsonString(custom_addr)),
        my_port_(my_port),
        rng_(std::random_device{}()) {}
  ~Tracker() { Close(); }

  bool connected() const { return fd_ >= 0; }

  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  // Connects and announces this server; retries until the tracker answers.
  void Connect() {
    for (int attempt = 0;; ++attempt) {
      try {
        fd_ = ::Connect(host_, port_);
        SendInt(fd_, kTrackerMagic);
        if (RecvInt(fd_) != kTrackerMagic) {
          Close();
          throw Failure(host_ + ":" + std::to_string(port_) + " is not a TVM RPC tracker");
        }
        Call("[" + std::to_string(kTrackerUpdateInfo) + ", {\"key\": " +
             JsonString("server:" + key_) + ", \"addr\": [" + addr_json_ + ", " +
             std::to_string(my_port_) + "]}]");
        return;
      } catch (const SocketError& e) {
        Close();
        if (attempt == 0) Log("waiting for the tracker at " + host_ + ":" +
                              std::to_string(port_) + " (" + e.what() + ")");
        std::this_thread::sleep_for(std::chrono::seconds(2));
      }
    }
  }

  // Offers this server to the tracker's queue under a fresh match key; returns that key.
  std::string Put() {
    std::uniform_real_distribution<double> dist(0.0, 1.0);
    std::string match;
    do {
      std::ostringstream os;
      os << key_ << ":" << dist(rng_);
      match = os.str();
    } while (used_.count(match));
    used_.insert(match);
    Call("[" + std::to_string(kTrackerPut) + ", " + JsonString(key_) + ", [" +
         std::to_string(my_port_) + ", " + JsonString(match) + "], " + addr_json_ + "]");
    return match;
  }

  // Whether `match` is still waiting in the tracker's queue (not handed to a client).
  bool Pending(const std::string& match) {
    SendString(fd_, "[" + std::to_string(kTrackerPendingMatchKeys) + "]");
    return RecvString(fd_).find(JsonString(match)) != std::string::npos;
  }

 private:
  void Call(const std::string& msg) {
    SendString(fd_, msg);
    std::string reply = RecvString(fd_);
    if (reply != std::to_string(kTrackerSuccess))
      throw SocketError("tracker refused " + msg + ": " + reply);
  }

  std::string host_;
  int port_;
  std::string key_;
  std::string addr_json_;
  int my_port_;
  int fd_ = -1;
  std::mt19937_64 rng_;
  std::set<std::string> used_;
};

// ------------------------------------------------------------------------------- work dirs
void RemoveTree(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = opendir(path.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string name = e->d_name;
        if (name != "." && name != "..") RemoveTree(path + "/" + name);
      }
      closedir(d);
    }
    rmdir(path.c_str());
  } else {
    unlink(path.c_str());
  }
}

// Registers the functions the runtime's RPC endpoint looks up for file access, rooted at `dir`.
void RegisterWorkDir(const std::string& dir) {
  auto path_of = [dir](const std::string& name) {
    if (name.find("..") != std::string::npos || (!name.empty() && name[0] == '/'))
      TVM_FFI_THROW(ValueError) << "path outside the session's work directory: " << name;
    return name.empty() ? dir : dir + "/" + name;
  };
  ffi::Function::SetGlobal("tvm.rpc.server.workpath", ffi::Function::FromTyped(path_of), true);
  ffi::Function::SetGlobal(
      "tvm.rpc.server.load_module",
      ffi::Function::FromTyped([path_of](const std::string& name) {
        std::string file = path_of(name);
        if (file.size() < 3 || file.compare(file.size() - 3, 3, ".so") != 0)
          TVM_FFI_THROW(ValueError) << name << ": this server has no compiler; send a module "
                                    << "linked for this device (export_library to .so with the "
                                    << "cross compiler)";
        return ffi::Module::LoadFromFile(ffi::String(file));
      }),
      true);
  ffi::Function::SetGlobal("tvm.rpc.server.listdir",
                           ffi::Function::FromTyped([path_of](const std::string& name) {
                             std::string out;
                             if (DIR* d = opendir(path_of(name).c_str())) {
                               while (dirent* e = readdir(d)) {
                                 std::string n = e->d_name;
                                 if (n != "." && n != "..") out += n + ",";
                               }
                               closedir(d);
                             }
                             return out;
                           }),
                           true);
}

// ------------------------------------------------------------------------------- sessions
struct Options {
  std::string tracker_host;
  int tracker_port = 0;
  std::string key;
  std::string host = "127.0.0.1";
  int port = 9090;
  int port_end = 0;
  std::string custom_addr;
};

// Accepts connections until one completes the handshake with `match`; returns its socket and
// the session timeout the client asked for (0: none).
int Accept(int listen_fd, Tracker* tracker, const Options& o, int* timeout_s,
           std::string* peer_name) {
  std::string match = tracker->Put();
  int idle = 0;
  while (true) {
    pollfd p{listen_fd, POLLIN, 0};
    int r = poll(&p, 1, 2000);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      // A match key a client took but never used is stale after a while: offer a new one.
      idle = tracker->Pending(match) ? 0 : idle + 1;
      if (idle * 2 > 6) {
        match = tracker->Put();
        idle = 0;
      }
      continue;
    }
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    int fd = accept(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len);
    if (fd < 0) continue;
    try {
      if (RecvInt(fd) != kRPCMagic) {
        close(fd);
        continue;
      }
      std::istringstream words(RecvString(fd, 4096));
      std::string head, opt;
      words >> head;
      if (head != "client:" + match) {
        SendInt(fd, kRPCMismatch);
        close(fd);
        Log("refused a client with another match key");
        continue;
      }
      SendInt(fd, kRPCSuccess);
      SendString(fd, "server:" + o.key);
      *timeout_s = 0;
      while (words >> opt) {
        if (opt.rfind("-timeout=", 0) == 0) *timeout_s = std::atoi(opt.c_str() + 9);
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
      getnameinfo(reinterpret_cast<sockaddr*>(&peer), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV);
      *peer_name = std::string(host) + ":" + serv;
      return fd;
    } catch (const SocketError&) {
      close(fd);
    }
  }
}

void Serve(int fd, int timeout_s, const std::string& peer) {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/tvmopt-rpc-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  const char* dir = mkdtemp(buf.data());
  if (dir == nullptr) {
    Log(std::string("cannot create a work directory: ") + std::strerror(errno));
    close(fd);
    return;
  }
  std::string work = dir;
  pid_t child = fork();
  if (child == 0) {
    int rc = 0;
    try {
      RegisterWorkDir(work);
      tvmopt_checks::Register();  // a bench over RPC runs whole artifacts, checks included
      auto loop = ffi::Function::GetGlobal("rpc.ServerLoop");
      if (!loop.has_value()) {
        Log("libtvm_runtime.so has no rpc.ServerLoop");
        _exit(1);
      }
      (*loop)(fd);
    } catch (const std::exception& e) {
      Log(std::string("session ended: ") + e.what());
      rc = 1;
    }
    _exit(rc);
  }
  auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (child > 0) {
    pid_t r = waitpid(child, &status, WNOHANG);
    if (r == child || (r < 0 && errno != EINTR)) break;
    if (timeout_s > 0 && std::chrono::steady_clock::now() - start >
                             std::chrono::seconds(timeout_s)) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      // Tell the client why, as TVM's own server does.
      if (auto f = ffi::Function::GetGlobal("rpc.ReturnException")) {
        try {
          (*f)(fd, ffi::String("RPCSessionTimeoutError: the " + std::to_string(timeout_s) +
                               " s session expired on tvmopt-rpc-server"));
        } catch (const std::exception&) {
        }
      }
      Log("session killed after its " + std::to_string(timeout_s) + " s timeout");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  close(fd);
  RemoveTree(work);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ostringstream os;
  os.precision(3);
  os << "tvmopt-rpc-server: session " << peer << " ended after " << secs << " s, status "
     << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  std::cout << os.str() << std::endl;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  std::string tracker;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Failure(a + " needs a value", 2);
      return argv[++i];
    };
    auto number = [&]() {
      std::string v = value();
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || n <= 0 || n > 65535) throw Failure(a + ": bad port '" + v + "'", 2);
      return static_cast<int>(n);
    };
    if (a == "--tracker") tracker = value();
    else if (a == "--key") o.key = value();
    else if (a == "--host") o.host = value();
    else if (a == "--port") o.port = number();
    else if (a == "--port-end") o.port_end = number();
    else if (a == "--custom-addr") o.custom_addr = value();
    else if (a == "-h" || a == "--help")
      throw Failure("usage: tvmopt-rpc-server --tracker HOST:PORT --key KEY [--host ADDR] "
                    "[--port N] [--port-end N] [--custom-addr ADDR]", 0);
    else throw Failure("unknown argument '" + a + "'", 2);
  }
  if (tracker.empty() || o.key.empty()) throw Failure("--tracker and --key are required", 2);
  for (char c : o.key) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '"' || c == '\\' || c == ':')
      throw Failure("--key must not contain spaces, quotes, backslashes or ':'", 2);
  }
  SplitHostPort(tracker, &o.tracker_host, &o.tracker_port);
  if (o.port_end == 0) o.port_end = o.port + 100;
  if (o.port_end <= o.port) throw Failure("--port-end must be above --port", 2);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  try {
    Options o = ParseArgs(argc, argv);
    if (!ffi::Function::GetGlobal("rpc.ServerLoop").has_value())
      throw Failure("libtvm_runtime.so was not loaded or has no RPC support (rpc.ServerLoop)");
    int port = 0;
    int listen_fd = Listen(o.host, o.port, o.port_end, &port);
    Tracker tracker(o.tracker_host, o.tracker_port, o.key, o.custom_addr, port);
    std::cout << "tvmopt-rpc-server: listening on " << o.host << ":" << port << ", key '"
              << o.key << "', tracker " << o.tracker_host << ":" << o.tracker_port << std::endl;
    while (true) {
      try {
        if (!tracker.connected()) tracker.Connect();
        int timeout_s = 0;
        std::string peer;
        int fd = Accept(listen_fd, &tracker, o, &timeout_s, &peer);
        Serve(fd, timeout_s, peer);
      } catch (const SocketError& e) {
        Log(std::string("tracker connection lost (") + e.what() + "); reconnecting");
        tracker.Close();
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    }
  } catch (const Failure& f) {
    (f.code == 0 ? std::cout : std::cerr) << (f.code == 0 ? "" : "tvmopt-rpc-server: ")
                                          << f.what() << std::endl;
    return f.code;
  } catch (const std::exception& e) {
    std::cerr << "tvmopt-rpc-server: " << e.what() << std::endl;
    return 1;
  }
}
