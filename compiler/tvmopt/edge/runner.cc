// tvmopt-run: runs a tvmopt bundle's Relax VM library without Python.
//
//   tvmopt-run MODEL_DIR --input NAME=FILE.npy ... --output-dir DIR
//              [--warmup N] [--repeat N] [--json]
//
// Before anything of the model is loaded, every file the manifest lists is checked against its
// sha256; inputs are checked against the manifest's signature (name, dtype, rank, dims). Any
// failure is one line on stderr and exit status 1 (2 for usage errors).
//
// Load sequence as in TVM's own C++ runtime (disco's LoadVMModule): Module::LoadFromFile ->
// vm_load_executable -> vm_initialization(device type, device id, pooled allocator) -> main.
// libtvm_runtime.so is opened with RTLD_GLOBAL only after the hashes are checked: it registers
// the VM executable loader the library's blob needs and the TVMBackend* symbols the kernels call.

#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include "run_time_checks.h"

namespace ffi = tvm::ffi;

namespace {

// Errors the user can act on: printed as one line.
struct Failure : std::runtime_error {
  int code;
  explicit Failure(const std::string& msg, int code = 1) : std::runtime_error(msg), code(code) {}
};

// ------------------------------------------------------------------------------------ sha256
// FIPS 180-4; small enough to carry instead of linking a crypto library.
class Sha256 {
 public:
  Sha256() { Reset(); }
  void Update(const uint8_t* data, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      block_[fill_++] = data[i];
      if (fill_ == 64) {
        Compress();
        bits_ += 512;
        fill_ = 0;
      }
    }
  }
  std::string HexDigest() {
    uint64_t total = bits_ + static_cast<uint64_t>(fill_) * 8;
    uint8_t pad = 0x80;
    Update(&pad, 1);
    uint8_t zero = 0;
    while (fill_ != 56) Update(&zero, 1);
    for (int i = 7; i >= 0; --i) {
      uint8_t b = static_cast<uint8_t>(total >> (8 * i));
      Update(&b, 1);
    }
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (uint32_t w : h_) {
      for (int i = 3; i >= 0; --i) {
        uint8_t b = static_cast<uint8_t>(w >> (8 * i));
        out += hex[b >> 4];
        out += hex[b & 15];
      }
    }
    Reset();
    return out;
  }

 private:
  static uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void Reset() {
    static const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    std::copy(init, init + 8, h_);
    fill_ = 0;
    bits_ = 0;
  }
  void Compress() {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t(block_[4 * i]) << 24) | (uint32_t(block_[4 * i + 1]) << 16) |
             (uint32_t(block_[4 * i + 2]) << 8) | uint32_t(block_[4 * i + 3]);
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6],
             h = h_[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 = h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    uint32_t add[8] = {a, b, c, d, e, f, g, h};
    for (int i = 0; i < 8; ++i) h_[i] += add[i];
  }
  uint32_t h_[8];
  uint8_t block_[64];
  size_t fill_;
  uint64_t bits_;
};

std::string Sha256File(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Failure(path + ": cannot be read");
  Sha256 h;
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.Update(reinterpret_cast<const uint8_t*>(buf.data()), static_cast<size_t>(in.gcount()));
  }
  return h.HexDigest();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Failure(path + ": cannot be read");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// --------------------------------------------------------------------------- manifest (JSON)
ffi::Any Get(const ffi::json::Object& obj, const char* key, const std::string& where) {
  auto v = obj.Get(ffi::String(key));
  if (!v.has_value()) throw Failure(where + ": manifest lacks '" + key + "'");
  return *v;
}

ffi::json::Object AsObject(const ffi::Any& v, const std::string& what) {
  auto o = v.try_cast<ffi::json::Object>();
  if (!o.has_value()) throw Failure(what + ": expected a JSON object");
  return *o;
}

ffi::json::Array AsArray(const ffi::Any& v, const std::string& what) {
  auto a = v.try_cast<ffi::json::Array>();
  if (!a.has_value()) throw Failure(what + ": expected a JSON array");
  return *a;
}

std::string AsString(const ffi::Any& v, const std::string& what) {
  auto s = v.try_cast<ffi::String>();
  if (!s.has_value()) throw Failure(what + ": expected a JSON string");
  return std::string(*s);
}

// A dimension: a fixed size, a symbolic name, or unknown.
struct Dim {
  int64_t size = -1;
  std::string name;
};

struct TensorSpec {
  std::string name;
  std::string dtype;
  bool has_shape = false;
  std::vector<Dim> shape;
};

std::string ShapeStr(const TensorSpec& t) {
  if (!t.has_shape) return "any shape";
  std::string s;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (i) s += "x";
    s += t.shape[i].size >= 0 ? std::to_string(t.shape[i].size)
                              : (t.shape[i].name.empty() ? "?" : t.shape[i].name);
  }
  return s.empty() ? "scalar" : s;
}

std::string ShapeStr(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s.empty() ? "scalar" : s;
}

std::vector<TensorSpec> ReadSpecs(const ffi::json::Object& manifest, const char* key,
                                  const std::string& where) {
  std::vector<TensorSpec> out;
  for (const ffi::Any& item : AsArray(Get(manifest, key, where), where)) {
    ffi::json::Object o = AsObject(item, where);
    TensorSpec t;
    t.name = AsString(Get(o, "name", where), where);
    t.dtype = AsString(Get(o, "dtype", where), where);
    ffi::Any shape = Get(o, "shape", where);
    if (shape != nullptr) {
      t.has_shape = true;
      for (const ffi::Any& d : AsArray(shape, where)) {
        Dim dim;
        if (auto n = d.try_cast<int64_t>()) {
          dim.size = *n;
        } else if (auto s = d.try_cast<ffi::String>()) {
          dim.name = std::string(*s);
        }
        t.shape.push_back(dim);
      }
    }
    out.push_back(t);
  }
  return out;
}

// Checks every file the manifest lists: "files" relative to the model folder, and the bundle's
// "files" relative to the bundle root (the model folder's parent).
void VerifyFiles(const std::string& model_dir, const ffi::json::Object& manifest,
                 const std::string& where) {
  auto check = [&](const std::string& base, const ffi::json::Object& files, const char* label) {
    for (const auto& kv : files) {
      std::string name = AsString(kv.first, where);
      std::string want = AsString(kv.second, where);
      std::string path = base + "/" + name;
      std::ifstream probe(path, std::ios::binary);
      if (!probe) throw Failure(std::string(label) + " file '" + name + "' listed in the manifest is missing");
      if (Sha256File(path) != want) {
        throw Failure(std::string(label) + " file '" + name +
                      "' does not match its sha256 in the manifest (modified or corrupted); "
                      "copy the bundle again");
      }
    }
  };
  check(model_dir, AsObject(Get(manifest, "files", where), where), "model");
  auto bundle = manifest.Get(ffi::String("bundle"));
  if (bundle.has_value()) {
    ffi::json::Object b = AsObject(*bundle, where);
    check(model_dir + "/..", AsObject(Get(b, "files", where), where), "bundle");
  }
}

// -------------------------------------------------------------------------------------- .npy
struct NpyType {
  const char* descr;  // little-endian numpy descr
  DLDataType dl;
};

const NpyType kNpyTypes[] = {
    {"<f4", {kDLFloat, 32, 1}}, {"<f8", {kDLFloat, 64, 1}}, {"<f2", {kDLFloat, 16, 1}},
    {"|i1", {kDLInt, 8, 1}},    {"<i2", {kDLInt, 16, 1}},   {"<i4", {kDLInt, 32, 1}},
    {"<i8", {kDLInt, 64, 1}},   {"|u1", {kDLUInt, 8, 1}},   {"<u2", {kDLUInt, 16, 1}},
    {"<u4", {kDLUInt, 32, 1}},  {"<u8", {kDLUInt, 64, 1}},  {"|b1", {kDLBool, 8, 1}},
};

bool SameType(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

const char* DescrOf(DLDataType t) {
  for (const auto& n : kNpyTypes) {
    if (SameType(n.dl, t)) return n.descr;
  }
  return nullptr;
}

std::string DtypeName(DLDataType t) { return std::string(ffi::DLDataTypeToString(t)); }

struct NpyArray {
  DLDataType dtype;
  std::vector<int64_t> shape;
  std::vector<char> data;
};

// The value of `key` in the header dict, e.g. 'descr': '<f4' -> "<f4" (quotes kept off).
std::string HeaderField(const std::string& header, const std::string& key, const std::string& path) {
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) throw Failure(path + ": not a .npy file (no '" + key + "')");
  size_t colon = header.find(':', k);
  size_t start = colon == std::string::npos ? colon : header.find_first_not_of(" ", colon + 1);
  if (start == std::string::npos) throw Failure(path + ": malformed .npy header");
  if (header[start] == '\'') {
    size_t end = header.find('\'', start + 1);
    return header.substr(start + 1, end - start - 1);
  }
  if (header[start] == '(') return header.substr(start, header.find(')', start) - start + 1);
  size_t end = header.find_first_of(",}", start);
  return header.substr(start, end - start);
}

NpyArray ReadNpy(const std::string& path) {
  std::string raw = ReadText(path);
  if (raw.size() < 10 || raw.compare(0, 6, "\x93NUMPY") != 0) {
    throw Failure(path + ": not a .npy file");
  }
  int major = static_cast<uint8_t>(raw[6]);
  size_t hlen, hstart;
  if (major == 1) {
    hlen = static_cast<uint8_t>(raw[8]) | (static_cast<uint8_t>(raw[9]) << 8);
    hstart = 10;
  } else {
    if (raw.size() < 12) throw Failure(path + ": truncated .npy header");
    hlen = 0;
    for (int i = 3; i >= 0; --i) hlen = (hlen << 8) | static_cast<uint8_t>(raw[8 + i]);
    hstart = 12;
  }
  if (hstart + hlen > raw.size()) throw Failure(path + ": truncated .npy header");
  std::string header = raw.substr(hstart, hlen);
  std::string descr = HeaderField(header, "descr", path);
  if (descr == "=f4" || descr == "f4") descr = "<f4";
  NpyArray arr;
  bool known = false;
  for (const auto& n : kNpyTypes) {
    // single-byte types may be written with '|' or '<'
    if (descr == n.descr || (n.descr[0] == '|' && descr.substr(1) == n.descr + 1)) {
      arr.dtype = n.dl;
      known = true;
    }
  }
  if (!known) throw Failure(path + ": dtype '" + descr + "' is not supported (little-endian numeric or bool only)");
  if (HeaderField(header, "fortran_order", path) != "False") {
    throw Failure(path + ": Fortran-ordered array; save it C-contiguous (np.ascontiguousarray)");
  }
  std::string shape = HeaderField(header, "shape", path);
  int64_t count = 1;
  for (size_t i = 1; i < shape.size();) {
    size_t j = shape.find_first_of(",)", i);
    if (j == std::string::npos) throw Failure(path + ": malformed shape in the .npy header");
    std::string tok = shape.substr(i, j - i);
    tok.erase(0, tok.find_first_not_of(" "));
    if (!tok.empty()) {
      char* end = nullptr;
      long long d = std::strtoll(tok.c_str(), &end, 10);
      if (end == tok.c_str() || d < 0) throw Failure(path + ": malformed shape in the .npy header");
      arr.shape.push_back(d);
      count *= d;
    }
    i = j + 1;
  }
  size_t nbytes = static_cast<size_t>(count) * ((arr.dtype.bits + 7) / 8);
  size_t offset = hstart + hlen;
  if (raw.size() - offset != nbytes) {
    throw Failure(path + ": holds " + std::to_string(raw.size() - offset) + " data bytes, shape " +
                  ShapeStr(arr.shape) + " needs " + std::to_string(nbytes));
  }
  arr.data.assign(raw.begin() + static_cast<std::ptrdiff_t>(offset), raw.end());
  return arr;
}

void WriteNpy(const std::string& path, const DLTensor& t) {
  const char* descr = DescrOf(t.dtype);
  if (descr == nullptr) throw Failure("output dtype " + DtypeName(t.dtype) + " cannot be written as .npy");
  std::string shape = "(";
  int64_t count = 1;
  for (int i = 0; i < t.ndim; ++i) {
    shape += std::to_string(t.shape[i]) + (t.ndim == 1 ? "," : (i + 1 < t.ndim ? ", " : ""));
    count *= t.shape[i];
  }
  shape += ")";
  std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " +
                       shape + ", }";
  // pad so the data starts 64-byte aligned, header ends with '\n'
  size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Failure(path + ": cannot be written");
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t hlen = static_cast<uint16_t>(header.size());
  char le[2] = {static_cast<char>(hlen & 0xff), static_cast<char>(hlen >> 8)};
  out.write(le, 2);
  out << header;
  size_t nbytes = static_cast<size_t>(count) * ((t.dtype.bits + 7) / 8);
  out.write(static_cast<const char*>(t.data) + t.byte_offset, static_cast<std::streamsize>(nbytes));
  if (!out) throw Failure(path + ": write failed");
}

// ------------------------------------------------------------------------------------ inputs
struct HostAlloc {
  void AllocData(DLTensor* t) {
    size_t n = ffi::GetDataSize(*t);
    t->data = std::aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    if (t->data == nullptr) throw std::bad_alloc();
  }
  void FreeData(DLTensor* t) { std::free(t->data); }
};

void CheckInput(const TensorSpec& spec, const NpyArray& arr, std::map<std::string, int64_t>* bound) {
  DLDataType want = ffi::StringToDLDataType(ffi::String(spec.dtype));
  if (!SameType(want, arr.dtype)) {
    throw Failure("input '" + spec.name + "': dtype " + DtypeName(arr.dtype) + ", expected " + spec.dtype);
  }
  if (!spec.has_shape) return;
  if (arr.shape.size() != spec.shape.size()) {
    throw Failure("input '" + spec.name + "': shape " + ShapeStr(arr.shape) + " has rank " +
                  std::to_string(arr.shape.size()) + ", expected rank " +
                  std::to_string(spec.shape.size()) + " (" + ShapeStr(spec) + ")");
  }
  for (size_t i = 0; i < arr.shape.size(); ++i) {
    const Dim& d = spec.shape[i];
    if (d.size >= 0 && arr.shape[i] != d.size) {
      throw Failure("input '" + spec.name + "': dimension " + std::to_string(i) + " is " +
                    std::to_string(arr.shape[i]) + ", expected " + std::to_string(d.size) +
                    " (shape " + ShapeStr(spec) + ")");
    }
    if (!d.name.empty()) {
      auto it = bound->emplace(d.name, arr.shape[i]).first;
      if (it->second != arr.shape[i]) {
        throw Failure("input '" + spec.name + "': dimension " + std::to_string(i) + " ('" + d.name +
                      "') is " + std::to_string(arr.shape[i]) + ", but '" + d.name + "' is " +
                      std::to_string(it->second) + " in another input");
      }
    }
  }
}

void Flatten(const ffi::Any& v, std::vector<ffi::Tensor>* out) {
  if (auto t = v.try_cast<ffi::Tensor>()) {
    out->push_back(*t);
    return;
  }
  if (auto a = v.try_cast<ffi::Array<ffi::Any>>()) {
    for (const ffi::Any& item : *a) Flatten(item, out);
    return;
  }
  throw Failure("the model returned a " + std::string(v.GetTypeKey()) + ", expected tensors");
}

std::string FileName(const std::string& name) {
  std::string s = name;
  for (char& c : s) {
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
  }
  return s.empty() || s[0] == '.' ? "_" + s : s;
}

double Percentile(std::vector<double> v, double p) {
  // numpy's default (linear interpolation between closest ranks)
  std::sort(v.begin(), v.end());
  double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

std::string Num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4f", x);
  return buf;
}

std::string JsonStr(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

struct Args {
  std::string model_dir;
  std::vector<std::pair<std::string, std::string>> inputs;
  std::string output_dir;
  int warmup = 1;
  int repeat = 10;
  bool json = false;
};

const char* kUsage =
    "usage: tvmopt-run MODEL_DIR --input NAME=FILE.npy ... --output-dir DIR "
    "[--warmup N] [--repeat N] [--json]";

int ParseCount(const std::string& flag, const std::string& v, int min) {
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min || n > 1000000) {
    throw Failure(flag + " '" + v + "': expected an integer >= " + std::to_string(min), 2);
  }
  return static_cast<int>(n);
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Failure(s + " needs a value; " + kUsage, 2);
      return argv[++i];
    };
    if (s == "-h" || s == "--help") {
      std::cout << kUsage << "\n";
      std::exit(0);
    } else if (s == "--input") {
      std::string v = value();
      size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0) throw Failure("--input '" + v + "': expected NAME=FILE.npy", 2);
      a.inputs.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (s == "--output-dir") {
      a.output_dir = value();
    } else if (s == "--warmup") {
      a.warmup = ParseCount(s, value(), 0);
    } else if (s == "--repeat") {
      a.repeat = ParseCount(s, value(), 1);
    } else if (s == "--json") {
      a.json = true;
    } else if (!s.empty() && s[0] == '-') {
      throw Failure("unknown option '" + s + "'; " + kUsage, 2);
    } else if (a.model_dir.empty()) {
      a.model_dir = s;
    } else {
      throw Failure("unexpected argument '" + s + "'; " + kUsage, 2);
    }
  }
  if (a.model_dir.empty()) throw Failure(std::string("no MODEL_DIR given; ") + kUsage, 2);
  if (a.output_dir.empty()) throw Failure(std::string("no --output-dir given; ") + kUsage, 2);
  return a;
}

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int Run(int argc, char** argv) {
  Args args = ParseArgs(argc, argv);
  const std::string& dir = args.model_dir;
  if (!IsDir(dir)) throw Failure(dir + ": no such model folder");
  std::string mpath = dir + "/manifest.json";
  ffi::String err;
  ffi::Any parsed = ffi::json::Parse(ffi::String(ReadText(mpath)), &err);
  if (!err.empty()) throw Failure(mpath + ": unreadable manifest: " + std::string(err));
  ffi::json::Object manifest = AsObject(parsed, mpath);

  auto t_verify = Clock::now();
  VerifyFiles(dir, manifest, mpath);
  double verify_ms = MsSince(t_verify);

  std::vector<TensorSpec> in_specs = ReadSpecs(manifest, "inputs", mpath);
  std::vector<TensorSpec> out_specs = ReadSpecs(manifest, "outputs", mpath);
  ffi::json::Object target = AsObject(Get(manifest, "target", mpath), mpath);
  std::string device = AsString(Get(target, "device", mpath), mpath);
  if (device != "cpu") throw Failure(mpath + ": built for device '" + device + "'; tvmopt-run runs cpu bundles");
  std::string library = AsString(Get(manifest, "library", mpath), mpath);

  // Inputs: every expected name exactly once, nothing else.
  std::map<std::string, std::string> given;
  for (const auto& kv : args.inputs) {
    if (!given.emplace(kv.first, kv.second).second) throw Failure("input '" + kv.first + "' given twice");
  }
  std::string expected;
  for (const auto& s : in_specs) expected += (expected.empty() ? "" : ", ") + s.name;
  for (const auto& s : in_specs) {
    if (!given.count(s.name)) throw Failure("missing input '" + s.name + "' (expected: " + expected + ")");
  }
  for (const auto& kv : given) {
    bool known = std::any_of(in_specs.begin(), in_specs.end(), [&](const TensorSpec& s) { return s.name == kv.first; });
    if (!known) throw Failure("unexpected input '" + kv.first + "' (expected: " + expected + ")");
  }
  DLDevice dev{kDLCPU, 0};
  std::vector<ffi::Tensor> inputs;
  std::map<std::string, int64_t> bound;
  for (const auto& spec : in_specs) {
    NpyArray arr = ReadNpy(given[spec.name]);
    CheckInput(spec, arr, &bound);
    ffi::Tensor t = ffi::Tensor::FromNDAlloc(HostAlloc(), ffi::ShapeView(arr.shape.data(), arr.shape.size()), arr.dtype, dev);
    if (!arr.data.empty()) std::memcpy(t.data_ptr(), arr.data.data(), arr.data.size());
    inputs.push_back(t);
  }

  // Load: the runtime (after the hashes were checked), the library, the VM.
  auto t_load = Clock::now();
  std::string runtime = dir + "/../lib/libtvm_runtime.so";
  if (dlopen(runtime.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    throw Failure(runtime + ": cannot be loaded: " + dlerror());
  }
  tvmopt_checks::Register();
  ffi::Module lib = ffi::Module::LoadFromFile(ffi::String(dir + "/" + library));
  auto load_exec = lib->GetFunction(ffi::String("vm_load_executable"));
  if (!load_exec.has_value()) throw Failure(dir + "/" + library + ": not a Relax VM library (no vm_load_executable)");
  ffi::Module vm = (*load_exec)().cast<ffi::Module>();
  constexpr int kPooledAllocator = 2;
  vm->GetFunction(ffi::String("vm_initialization")).value()(static_cast<int>(kDLCPU), 0, kPooledAllocator);
  auto main_fn = vm->GetFunction(ffi::String("main"));
  if (!main_fn.has_value()) throw Failure(dir + "/" + library + ": the VM has no 'main'");
  double load_ms = MsSince(t_load);

  std::vector<ffi::AnyView> call_args(inputs.begin(), inputs.end());
  ffi::Any result;
  auto call = [&]() {
    result = ffi::Any();
    main_fn.value().CallPacked(call_args.data(), static_cast<int32_t>(call_args.size()), &result);
  };
  auto t_first = Clock::now();
  call();
  double first_ms = MsSince(t_first);
  for (int i = 1; i < args.warmup; ++i) call();
  std::vector<double> lat;
  for (int i = 0; i < args.repeat; ++i) {
    auto t0 = Clock::now();
    call();
    lat.push_back(MsSince(t0));
  }

  std::vector<ffi::Tensor> outs;
  Flatten(result, &outs);
  if (outs.size() != out_specs.size()) {
    throw Failure("the model returned " + std::to_string(outs.size()) + " tensors, the manifest lists " +
                  std::to_string(out_specs.size()) + " outputs");
  }
  mkdir(args.output_dir.c_str(), 0755);
  if (!IsDir(args.output_dir)) throw Failure(args.output_dir + ": cannot create the output folder");
  std::vector<std::string> written;
  for (size_t i = 0; i < outs.size(); ++i) {
    std::string path = args.output_dir + "/" + FileName(out_specs[i].name) + ".npy";
    if (outs[i].device().device_type != kDLCPU) throw Failure("output '" + out_specs[i].name + "' is not on the CPU");
    WriteNpy(path, *outs[i].GetDLTensorPtr());
    written.push_back(path);
  }

  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  long peak_rss_kb = ru.ru_maxrss;  // kilobytes on Linux
  std::string stats = "{\"p50\": " + Num(Percentile(lat, 50)) + ", \"p95\": " + Num(Percentile(lat, 95)) +
                      ", \"p99\": " + Num(Percentile(lat, 99)) + ", \"min\": " +
                      Num(*std::min_element(lat.begin(), lat.end())) + ", \"max\": " +
                      Num(*std::max_element(lat.begin(), lat.end())) + "}";
  if (args.json) {
    std::string outputs;
    for (size_t i = 0; i < written.size(); ++i) {
      outputs += (i ? ", " : "") + JsonStr(out_specs[i].name) + ": " + JsonStr(written[i]);
    }
    std::cout << "{\"latency_ms\": " << stats << ", \"runs\": " << args.repeat
              << ", \"warmup\": " << args.warmup << ", \"load_ms\": " << Num(load_ms)
              << ", \"first_run_ms\": " << Num(first_ms) << ", \"verify_ms\": " << Num(verify_ms)
              << ", \"peak_rss_kb\": " << peak_rss_kb << ", \"outputs\": {" << outputs << "}}"
              << std::endl;
  } else {
    std::cout << "loaded in " << Num(load_ms) << " ms (hash check " << Num(verify_ms)
              << " ms), first run " << Num(first_ms) << " ms\n"
              << args.repeat << " runs: p50 " << Num(Percentile(lat, 50)) << " ms, p95 "
              << Num(Percentile(lat, 95)) << " ms, p99 " << Num(Percentile(lat, 99)) << " ms, min "
              << Num(*std::min_element(lat.begin(), lat.end())) << " ms, max "
              << Num(*std::max_element(lat.begin(), lat.end())) << " ms\n"
              << "peak RSS " << peak_rss_kb << " KiB\n";
    for (const auto& w : written) std::cout << "wrote " << w << "\n";
  }
  return 0;
}

// The last non-empty line of a message: TVM errors carry a traceback above it.
std::string LastLine(const std::string& msg) {
  std::istringstream ss(msg);
  std::string line, last;
  while (std::getline(ss, line)) {
    if (line.find_first_not_of(" \t") != std::string::npos) last = line;
  }
  return last.empty() ? msg : last;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const Failure& f) {
    std::cerr << "tvmopt-run: error: " << f.what() << std::endl;
    return f.code;
  } catch (const ffi::Error& e) {
    std::cerr << "tvmopt-run: error: " << e.kind() << ": " << LastLine(e.message()) << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "tvmopt-run: error: " << LastLine(e.what()) << std::endl;
    return 1;
  }
}
