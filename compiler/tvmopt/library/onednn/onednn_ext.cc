// tvm-ffi extension that runs conv2d / matmul through oneDNN, in fp32 or with bf16 compute,
// and the int8 convolutions / matmuls of QDQ models.
//
// Calling convention (shared with library/onednn/, keep in sync):
//   tvmopt.onednn.conv2d(data, weight, [bias], [residual], attrs, out)
//   tvmopt.onednn.matmul(a, b, [bias], attrs, out)
//   tvmopt.onednn.qconv2d(data, weight_s8, weight_scales, [bias], [residual], attrs, out)
//     (data and out fp32, or u8/s8 with attrs kQSrcInt8 / kQDstQuant; kQDynamic: data is
//     quantized with its own min/max, for quantize_dynamic's ConvInteger)
//   tvmopt.onednn.qmatmul(a, b_s8, b_scales, [bias], attrs, out)
//     (attrs kQMDynamic = 1: a's scale and zero point are computed in the call, as ONNX
//     DynamicQuantizeLinear does, for onnxruntime's quantize_dynamic models)
//   tvmopt.onednn.batch_matmul(a, b, attrs, out)   (two activations, e.g. attention)
//   tvmopt.onednn.attention(q, k, v, [mask], attrs, out)
//     (softmax(q.k^T * scale [masked]).v, in blocks of query rows)
// R.call_dps_packed appends the output after all listed arguments, so attrs comes before out.
// Optional inputs are present or absent according to flags in `attrs`, an int64 ffi Shape
// (what R.shape([...]) becomes at run time) or an int64 tensor. Float attributes (clip bounds)
// travel as the raw bits of a float32, because Shape entries are integers.
//
// Activations come and go in the caller's plain layout (NCHW or NHWC for conv, row-major for
// matmul). Matmul and conv layout mode 1 compute on them in place; conv layout mode 0 lets
// oneDNN choose its own (often blocked) activation layout and reorders into it and back around
// each call. Weights are constants of the compiled module, so they are reordered into oneDNN's
// preferred layout once and cached with the primitive, keyed by the weight pointer plus shapes
// and attrs.

#include <dnnl.hpp>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <exception>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <dlfcn.h>
#include <sched.h>

namespace {

using tvm::ffi::AnyView;
using tvm::ffi::PackedArgs;
using tvm::ffi::Shape;
using tvm::ffi::Tensor;
using tvm::ffi::TensorView;
using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

enum Act : int64_t { kNone = 0, kRelu = 1, kClip = 2, kGeluErf = 3, kGeluTanh = 4, kSwish = 5 };

// Conv attrs layout.
enum ConvAttr {
  kStrideH, kStrideW, kPadT, kPadL, kPadB, kPadR, kDilH, kDilW, kGroups,
  kConvHasBias, kConvHasResidual, kConvAct, kConvClipLo, kConvClipHi, kConvPostAct,
  kConvLayout, kConvNHWC, kConvCompute, kConvNumAttrs
};
// Matmul attrs layout.
// kMMHasRes: a tensor of the output's shape added after bias and activation (a transformer's
// residual connection), as a sum post-op.
enum MatmulAttr { kTransB, kMMHasBias, kMMAct, kMMCompute, kMMHasRes, kMMNumAttrs };
// Compute precision (kConvCompute / kMMCompute). bf16: weights are converted once, fp32
// activations to bf16 on the way in, with fp32 accumulation. Activations (and outputs) may
// also be bf16 tensors: the type is read from each tensor, so a graph hands a bf16 call bf16
// activations where its producer can write them and keeps fp32 where not. Attrs written before this
// entry existed (one entry shorter) mean fp32.
enum Compute : int64_t { kComputeF32 = 0, kComputeBF16 = 1 };

// Int8 conv attrs (qconv2d). The call computes what the QDQ graph
//   conv2d(dequantize(quantize(data, src_scale, src_zp)), dequantize(weight_s8, weight_scales))
// computes: data is quantized inside the call (a oneDNN reorder, which also moves it into the
// primitive's layout), the convolution accumulates u8/s8 x s8 products in int32, and the scales
// bring the sum back to fp32 before bias and activation. kQWeightLayout: 0 = NCHW data / OIHW
// weights, 1 = NHWC / OHWI, 2 = NHWC / HWIO; kQSrcNCHW: data arrives NCHW although the
// convolution is NHWC (the graph's transpose into the convolution happens inside the reorder).
enum QConvAttr {
  kQStrideH, kQStrideW, kQPadT, kQPadL, kQPadB, kQPadR, kQDilH, kQDilW, kQGroups,
  kQHasBias, kQAct, kQClipLo, kQClipHi, kQWeightLayout, kQSrcNCHW, kQSrcSigned, kQSrcScale,
  kQSrcZp, kQConvBaseAttrs,
  // Optional tail (artifacts from before it have kQConvBaseAttrs entries): the QDQ pair on the
  // output, then `+ residual [-> relu]`, as post-ops, so a residual block's join is no separate
  // kernel: out = [relu](dequantize(quantize(conv_out, out_scale, out_zp)) + residual).
  kQHasRes = kQConvBaseAttrs, kQOutSigned, kQOutScale, kQOutZp, kQPostRelu, kQResAttrs,
  // (kQOutScale 0: a plain `+ residual`, no QDQ pair before it.)
  // Second optional tail (artifacts from before it have kQResAttrs entries, meaning 0):
  // kQDynamic: data is fp32 quantized to u8 with a scale and zero point computed from its own
  // min/max at every call (ONNX DynamicQuantizeLinear + ConvInteger; kQSrcScale / kQSrcZp
  // unused). kQSrcInt8: data already is the u8/s8 tensor (kQSrcSigned) whose scale and zero
  // point kQSrcScale / kQSrcZp give, so it is only reordered if the primitive wants another
  // layout. kQDstQuant: the output is quantized in the call (QuantizeLinear folded into
  // oneDNN's destination scale and zero point), u8 or s8 (kQDstSigned), so consecutive int8
  // convolutions pass 8-bit tensors with no quantize / dequantize kernel between them.
  kQDynamic = kQResAttrs, kQSrcInt8, kQDstQuant, kQDstSigned, kQDstScale, kQDstZp,
  kQConvNumAttrs
};
// Int8 matmul attrs (qmatmul): b is a constant s8 (K, N), or (N, K) with trans_b.
// kQMDynamic (optional tail; older artifacts have kQMBaseAttrs entries, meaning 0): a is
// quantized to u8 with a scale and zero point computed from its own min/max at every call
// (ONNX DynamicQuantizeLinear), and kQMSrcScale / kQMSrcZp are unused.
enum QMatmulAttr { kQMTransB, kQMHasBias, kQMAct, kQMSrcSigned, kQMSrcScale, kQMSrcZp,
                   kQMBaseAttrs, kQMDynamic = kQMBaseAttrs, kQMNumAttrs };

// Attrs of an older artifact lack the trailing compute entry: fp32.
std::vector<int64_t> WithCompute(std::vector<int64_t> a, size_t n) {
  if (a.size() + 1 == n) a.push_back(kComputeF32);
  return a;
}

struct Runtime {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  int num_threads = 0;  // 0: leave the OpenMP default alone
};

Runtime& GetRuntime() {
  static Runtime* rt = [] {
    auto* r = new Runtime();
    // Follow TVM's thread setting so TVM kernels and oneDNN kernels use the same cores.
    if (const char* env = std::getenv("TVM_NUM_THREADS")) r->num_threads = std::atoi(env);
    return r;
  }();
  return *rt;
}

// Pins the OpenMP workers of the calling thread's team (not the calling thread, which is the
// user's) each to a CPU of its own, where the team has one thread per allowed CPU. Unpinned, a
// worker that went to sleep while the model sat idle is woken by Linux onto the waking thread's
// CPU, and the two share that CPU until one of them stops spinning: the first calls after an
// idle spell take a whole spin period. A smaller team (processes that split the cores between
// them) is left alone.
void PinWorkers() {
#if defined(_OPENMP) && defined(__linux__)
  thread_local int pinned = 0;
  int team = omp_get_max_threads();
  if (pinned == team || team < 2) return;
  pinned = team;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (static_cast<int>(cpus.size()) != team) return;
#pragma omp parallel num_threads(team)
  {
    int t = omp_get_thread_num();
    if (t > 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[t], &one);
      sched_setaffinity(0, sizeof(one), &one);
    }
  }
#endif
}

// The OpenMP thread-count ICV belongs to the calling thread, so it is re-applied on every call
// (omp_set_num_threads is cheap) instead of once at load time on another thread.
void ApplyThreads() {
#ifdef _OPENMP
  int n = GetRuntime().num_threads;
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
  PinWorkers();
#endif
}

// ---------------------------------------------------------------------------------------
// One thread pool for a model's TVM kernels and its oneDNN kernels.
//
// oneDNN from PyPI runs on OpenMP, TVM kernels on TVM's own pool. On a machine with few
// cores the two pools fight: whichever ran last still spins or sleeps while the other needs
// the cores, and a model that alternates them ran several times slower than either alone.
// A compiled TVM library calls its parallel loops through the function pointer
// `__TVMBackendParallelLaunch`, which the runtime fills in when it loads the library; pointing
// it at an OpenMP launcher puts the TVM kernels on the same OpenMP team as oneDNN. This is
// what a TVM runtime built with USE_OPENMP does for every library.

// TVM's C ABI for parallel loops (tvm/runtime/c_backend_api.h).
struct ParallelGroupEnv {
  void* sync_handle;
  int32_t num_task;
};
using ParallelLambda = int (*)(int task_id, ParallelGroupEnv* penv, void* cdata);

int OmpParallelLaunch(ParallelLambda flambda, void* cdata, int num_task) {
#ifdef _OPENMP
  ApplyThreads();
  int team = GetRuntime().num_threads > 0 ? GetRuntime().num_threads : omp_get_max_threads();
  int tasks = num_task > 0 ? num_task : team;
  if (team > tasks) team = tasks;
  int rc = 0;
#pragma omp parallel num_threads(team)
  {
    // Every task id runs exactly once, also when the kernel asks for more tasks than threads.
    ParallelGroupEnv env{nullptr, tasks};
    int nthreads = omp_get_num_threads();
    for (int t = omp_get_thread_num(); t < tasks; t += nthreads) {
      int r = flambda(t, &env, cdata);
      if (r != 0) {
#pragma omp atomic write
        rc = r;
      }
    }
  }
  return rc;
#else
  ParallelGroupEnv env{nullptr, num_task > 0 ? num_task : 1};
  for (int t = 0; t < env.num_task; ++t) {
    int r = flambda(t, &env, cdata);
    if (r != 0) return r;
  }
  return 0;
#endif
}

// The `__TVMBackendParallelLaunch` slot of an already loaded library, null when the library
// is not loaded or has none. The dlopen reference lives as long as this object; the
// library itself stays loaded by whoever loaded it first.
class LaunchSlot {
 public:
  explicit LaunchSlot(const std::string& path)
      : handle_(dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {}
  ~LaunchSlot() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  LaunchSlot(const LaunchSlot&) = delete;
  LaunchSlot& operator=(const LaunchSlot&) = delete;

  void** get() const {
    return handle_ == nullptr
               ? nullptr
               : reinterpret_cast<void**>(dlsym(handle_, "__TVMBackendParallelLaunch"));
  }
  // TVM's parallel barrier needs TVM's own pool.
  bool uses_barrier() const {
    return handle_ != nullptr && dlsym(handle_, "__TVMBackendParallelBarrier") != nullptr;
  }

 private:
  void* handle_;
};

// Point a loaded TVM library's parallel launcher at OmpParallelLaunch. Returns false (and
// changes nothing) when the library is not loaded, has no launcher pointer, or uses TVM's
// parallel barrier.
bool SharePool(const std::string& path) {
  LaunchSlot slot(path);
  if (slot.get() == nullptr || slot.uses_barrier()) return false;
  *slot.get() = reinterpret_cast<void*>(&OmpParallelLaunch);
  return true;
}

// Whether a loaded library's parallel loops run on OmpParallelLaunch.
bool UsesSharedPool(const std::string& path) {
  LaunchSlot slot(path);
  return slot.get() != nullptr && *slot.get() == reinterpret_cast<void*>(&OmpParallelLaunch);
}

std::vector<int64_t> ReadAttrs(const AnyView& v) {
  if (auto s = v.try_cast<Shape>()) return std::vector<int64_t>(s->begin(), s->end());
  if (auto t = v.try_cast<TensorView>()) {
    TVM_FFI_ICHECK(t->dtype().code == kDLInt && t->dtype().bits == 64)
        << "attrs must be int64, got a tensor of " << tvm::ffi::DLDataTypeToString(t->dtype())
        << " type " << v.GetTypeKey() << " ndim " << t->ndim();
    const int64_t* p = reinterpret_cast<const int64_t*>(
        static_cast<const char*>(t->data_ptr()) + t->byte_offset());
    return std::vector<int64_t>(p, p + t->numel());
  }
  TVM_FFI_THROW(TypeError) << "attrs must be a Shape or an int64 tensor, got "
                           << v.GetTypeKey();
}

float BitsToFloat(int64_t bits) {
  uint32_t u = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

void* DataPtr(const TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

memory::dims Dims(const TensorView& t) {
  return memory::dims(t.shape().begin(), t.shape().end());
}

void CheckF32Contig(const TensorView& t, const char* what) {
  TVM_FFI_ICHECK(t.dtype().code == kDLFloat && t.dtype().bits == 32 && t.dtype().lanes == 1)
      << what << " must be float32";
  TVM_FFI_ICHECK(t.IsContiguous()) << what << " must be contiguous";
  TVM_FFI_ICHECK(t.device().device_type == kDLCPU) << what << " must be on CPU";
}

// An activation's type: float32, or bfloat16 where a bf16 call's neighbour hands it over (or
// takes it) already converted, so no conversion runs between two bf16 library kernels.
dt ActType(const TensorView& t, const char* what) {
  TVM_FFI_ICHECK(t.dtype().lanes == 1 &&
                 ((t.dtype().code == kDLFloat && t.dtype().bits == 32) ||
                  (t.dtype().code == kDLBfloat && t.dtype().bits == 16)))
      << what << " must be float32 or bfloat16, got " << tvm::ffi::DLDataTypeToString(t.dtype());
  TVM_FFI_ICHECK(t.IsContiguous()) << what << " must be contiguous";
  TVM_FFI_ICHECK(t.device().device_type == kDLCPU) << what << " must be on CPU";
  return t.dtype().code == kDLBfloat ? dt::bf16 : dt::f32;
}

size_t TypeSize(dt type) { return type == dt::bf16 ? 2 : 4; }

std::string TypesKey(std::initializer_list<dt> types) {
  std::string k = "|";
  for (dt t : types) k += std::to_string(static_cast<int>(t)) + ",";
  return k;
}

void CheckInt8Contig(const TensorView& t, bool is_signed, const char* what) {
  TVM_FFI_ICHECK(t.dtype().code == (is_signed ? kDLInt : kDLUInt) && t.dtype().bits == 8 &&
                 t.dtype().lanes == 1)
      << what << " must be " << (is_signed ? "int8" : "uint8");
  TVM_FFI_ICHECK(t.IsContiguous()) << what << " must be contiguous";
  TVM_FFI_ICHECK(t.device().device_type == kDLCPU) << what << " must be on CPU";
}

tag PlainTag(int nd) {
  switch (nd) {
    case 2: return tag::ab;
    case 3: return tag::abc;
    case 4: return tag::abcd;
    default: TVM_FFI_THROW(ValueError) << "matmul supports rank 2-4, got " << nd;
  }
}

void AppendAct(dnnl::post_ops* po, int64_t act, float lo, float hi) {
  switch (act) {
    case kNone: break;
    case kRelu: po->append_eltwise(dnnl::algorithm::eltwise_relu, 0.f, 0.f); break;
    case kClip: po->append_eltwise(dnnl::algorithm::eltwise_clip, lo, hi); break;
    case kGeluErf: po->append_eltwise(dnnl::algorithm::eltwise_gelu_erf, 0.f, 0.f); break;
    case kGeluTanh: po->append_eltwise(dnnl::algorithm::eltwise_gelu_tanh, 0.f, 0.f); break;
    case kSwish: po->append_eltwise(dnnl::algorithm::eltwise_swish, 1.f, 0.f); break;
    default: TVM_FFI_THROW(ValueError) << "unknown activation " << act;
  }
}

// Random weights can be freed and a new constant of the same shape allocated at the same
// address (e.g. many modules compiled in one process); a sparse content fingerprint catches
// that without hashing the whole tensor on every call.
template <typename T>
std::vector<float> Fingerprint(const T* p, int64_t n) {
  constexpr int64_t kSamples = 32;
  std::vector<float> fp;
  int64_t step = n > kSamples ? n / kSamples : 1;
  for (int64_t i = 0; i < n && static_cast<int64_t>(fp.size()) < kSamples; i += step) {
    fp.push_back(p[i]);
  }
  fp.push_back(p[n - 1]);
  return fp;
}

bool SameFingerprint(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The cached entry for `key`, or a new one from `create()` when there is none or the weight at
// that address has other contents now (see Fingerprint). Called with g_mu held.
template <typename Entry, typename T, typename Create>
std::shared_ptr<Entry> Cached(std::unordered_map<std::string, std::shared_ptr<Entry>>* cache,
                              const std::string& key, const T* weight, int64_t n,
                              Create create) {
  auto fp = Fingerprint(weight, n);
  auto it = cache->find(key);
  if (it != cache->end() && SameFingerprint(it->second->fingerprint, fp)) return it->second;
  std::shared_ptr<Entry> e = create();
  e->fingerprint = std::move(fp);
  (*cache)[key] = e;
  return e;
}

std::string MakeKey(const char* op, const void* wptr, const std::vector<int64_t>& attrs,
                    std::initializer_list<memory::dims> shapes) {
  std::ostringstream os;
  os << op << '|' << wptr;
  for (auto a : attrs) os << ',' << a;
  for (const auto& s : shapes) {
    os << '|';
    for (auto d : s) os << d << 'x';
  }
  return os.str();
}

struct ConvEntry {
  dnnl::convolution_forward prim;
  memory::desc src_md, dst_md, user_src_md, user_dst_md;  // user_*: the caller's tensors
  memory weights;
  std::vector<float> fingerprint;
  bool reorder_src = false, reorder_dst = false;
  memory src_buf, dst_buf;  // blocked activation buffers when the primitive wants them
};

struct MatmulEntry {
  dnnl::matmul prim;
  memory::desc a_md, dst_md, user_a_md;  // user_a_md: the caller's a
  memory weights;
  std::vector<float> fingerprint;
  bool convert_a = false;  // bf16 compute on an fp32 a: a is converted into a_buf first
  memory a_buf;
};

// An int8 call: the quantizing reorder of the fp32 input and the int8 primitive, with the
// weights reordered once and the scale / zero-point arguments both of them read.
struct QuantEntry {
  dnnl::primitive prim;
  dnnl::reorder quantize;
  memory::desc user_src_md, user_dst_md, dst_md;
  memory src_buf, dst_buf, weights;
  memory src_scale, wei_scale, src_zp, dst_scale, dst_zp;
  bool has_zp = false, reorder_dst = false;
  // src_int8: the source arrives quantized; `quantize` is then only a layout reorder, run when
  // reorder_src. dst_quant: the output is u8/s8 (destination scale, and zero point if has_dst_zp).
  bool src_int8 = false, reorder_src = true, dst_quant = false, has_dst_zp = false;
  std::vector<float> fingerprint;
};

std::mutex g_mu;
std::unordered_map<std::string, std::shared_ptr<ConvEntry>> g_conv_cache;
std::unordered_map<std::string, std::shared_ptr<MatmulEntry>> g_matmul_cache;
std::unordered_map<std::string, std::shared_ptr<QuantEntry>> g_quant_cache;

std::shared_ptr<ConvEntry> CreateConv(const TensorView& data, const TensorView& weight,
                                      const TensorView& out, const std::vector<int64_t>& a,
                                      bool has_bias) {
  Runtime& rt = GetRuntime();
  auto e = std::make_shared<ConvEntry>();
  // oneDNN dims are always logical (N, C, H, W) / (O, I, KH, KW); the tag says how the
  // caller's buffer is laid out, so NHWC/OHWI tensors need no copy.
  // kConvNHWC: 0 = NCHW data / OIHW weights, 1 = NHWC / OHWI, 2 = NHWC / HWIO (the layout
  // tvmopt's default schedules use, so both kinds of kernel share one graph layout).
  bool nhwc = a[kConvNHWC] != 0, hwio = a[kConvNHWC] == 2;
  auto to_nchw = [nhwc](memory::dims d) {
    return nhwc ? memory::dims{d[0], d[3], d[1], d[2]} : d;
  };
  memory::dims src_dims = to_nchw(Dims(data)), dst_dims = to_nchw(Dims(out));
  memory::dims wd = Dims(weight);
  memory::dims w_dims = hwio ? memory::dims{wd[3], wd[2], wd[0], wd[1]} : to_nchw(wd);
  tag act_tag = nhwc ? tag::nhwc : tag::nchw;
  int64_t groups = a[kGroups];
  memory::dims wg_dims = w_dims;
  tag w_tag = hwio ? tag::hwio : nhwc ? tag::ohwi : tag::oihw;
  if (groups > 1) {
    wg_dims = {groups, w_dims[0] / groups, w_dims[1], w_dims[2], w_dims[3]};
    w_tag = hwio ? tag::hwigo : nhwc ? tag::gohwi : tag::goihw;
  }
  e->user_src_md = memory::desc(src_dims, ActType(data, "data"), act_tag);
  e->user_dst_md = memory::desc(dst_dims, ActType(out, "out"), act_tag);
  // layout 1 pins activations to the caller's layout (no reorders, but oneDNN may pick a
  // slower kernel);
  // layout 0 lets oneDNN choose and reorders activations in and out around the call.
  bool plain = a[kConvLayout] == 1;
  // bf16 compute: source and weights in bf16 (the source converted by the reorder in, which
  // then always runs), output and post-ops in fp32.
  dt cdt = a[kConvCompute] == kComputeBF16 ? dt::bf16 : dt::f32;
  memory::desc src_any = plain ? memory::desc(src_dims, cdt, act_tag)
                               : memory::desc(src_dims, cdt, tag::any);
  memory::desc dst_any =
      plain ? e->user_dst_md : memory::desc(dst_dims, e->user_dst_md.get_data_type(), tag::any);
  memory::desc w_any(wg_dims, cdt, tag::any);
  memory::desc b_md = has_bias ? memory::desc({dst_dims[1]}, dt::f32, tag::x) : memory::desc();

  dnnl::post_ops po;
  AppendAct(&po, a[kConvAct], BitsToFloat(a[kConvClipLo]), BitsToFloat(a[kConvClipHi]));
  if (a[kConvHasResidual]) po.append_sum(1.f);
  AppendAct(&po, a[kConvPostAct], 0.f, 0.f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);

  // oneDNN dilation counts the gaps between taps: TVM/ONNX dilation 1 is oneDNN 0.
  memory::dims strides{a[kStrideH], a[kStrideW]};
  memory::dims dil{a[kDilH] - 1, a[kDilW] - 1};
  memory::dims pad_l{a[kPadT], a[kPadL]}, pad_r{a[kPadB], a[kPadR]};
  auto make = [&](const memory::desc& src, const memory::desc& dst) {
    return dnnl::convolution_forward::primitive_desc(
        rt.eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src,
        w_any, b_md, dst, strides, dil, pad_l, pad_r, attr);
  };
  auto pd = make(src_any, dst_any);
  if (!plain && pd.dst_desc() != e->user_dst_md) {
    // oneDNN's own choice writes a blocked layout that a reorder then turns back into the
    // caller's: a whole extra pass over the output (and usually one over the input), which
    // costs more than the blocked kernel saves on the convolutions that get it (few input
    // channels: a network's stem). A JIT kernel on the caller's layout is taken instead.
    try {
      auto pinned = make(memory::desc(src_dims, cdt, act_tag), e->user_dst_md);
      std::string impl = pinned.impl_info_str();
      if (impl.rfind("jit", 0) == 0 || impl.rfind("brg", 0) == 0) pd = pinned;
    } catch (const dnnl::error&) {
      // no kernel on the caller's layout: keep oneDNN's choice
    }
  }
  e->prim = dnnl::convolution_forward(pd);
  e->src_md = pd.src_desc();
  e->dst_md = pd.dst_desc();
  e->reorder_src = e->src_md != e->user_src_md;
  e->reorder_dst = e->dst_md != e->user_dst_md;
  if (e->reorder_src) e->src_buf = memory(e->src_md, rt.eng);
  if (e->reorder_dst) e->dst_buf = memory(e->dst_md, rt.eng);

  memory user_w({wg_dims, dt::f32, w_tag}, rt.eng, DataPtr(weight));
  if (pd.weights_desc() != user_w.get_desc()) {
    e->weights = memory(pd.weights_desc(), rt.eng);
    dnnl::reorder(user_w, e->weights).execute(rt.strm, user_w, e->weights);
    rt.strm.wait();
  } else {
    // Own a copy so the cache never points into a buffer the caller may free.
    e->weights = memory(pd.weights_desc(), rt.eng);
    std::memcpy(e->weights.get_data_handle(), DataPtr(weight), weight.numel() * sizeof(float));
  }
  return e;
}

// The sum post-op accumulates into dst, so dst starts as the residual, given as `res_md`
// says: copied where that is dst's own layout and type, else reordered (converted) into it.
void StartFromResidual(Runtime& rt, const memory::desc& res_md, const TensorView& residual,
                       memory& dst) {
  memory user_res(res_md, rt.eng, DataPtr(residual));
  if (res_md != dst.get_desc()) {
    dnnl::reorder(user_res, dst).execute(rt.strm, user_res, dst);
  } else if (DataPtr(residual) != dst.get_data_handle()) {
    std::memcpy(dst.get_data_handle(), DataPtr(residual), res_md.get_size());
  }
}

void Conv2d(PackedArgs args, tvm::ffi::Any* rv) {
  int n = args.size();
  TVM_FFI_ICHECK_GE(n, 4) << "conv2d(data, weight, [bias], [residual], attrs, out)";
  std::vector<int64_t> a = WithCompute(ReadAttrs(args[n - 2]), kConvNumAttrs);
  TVM_FFI_ICHECK_EQ(a.size(), static_cast<size_t>(kConvNumAttrs)) << "bad conv2d attrs";
  bool has_bias = a[kConvHasBias] != 0, has_res = a[kConvHasResidual] != 0;
  TVM_FFI_ICHECK_EQ(n, 4 + has_bias + has_res) << "conv2d arg count does not match attrs";
  TensorView data = args[0].cast<TensorView>();
  TensorView weight = args[1].cast<TensorView>();
  int idx = 2;
  std::optional<TensorView> bias, residual;
  if (has_bias) bias = args[idx++].cast<TensorView>();
  if (has_res) residual = args[idx++].cast<TensorView>();
  TensorView out = args[n - 1].cast<TensorView>();
  dt data_t = ActType(data, "data"), out_t = ActType(out, "out");
  CheckF32Contig(weight, "weight");
  TVM_FFI_ICHECK(data.ndim() == 4 && weight.ndim() == 4 && out.ndim() == 4) << "conv2d is 2-D";

  std::lock_guard<std::mutex> lock(g_mu);
  ApplyThreads();
  Runtime& rt = GetRuntime();
  const float* wptr = static_cast<const float*>(DataPtr(weight));
  std::string key = MakeKey("conv", wptr, a, {Dims(data), Dims(weight), Dims(out)}) +
                    TypesKey({data_t, out_t});
  std::shared_ptr<ConvEntry> e = Cached(&g_conv_cache, key, wptr, weight.numel(), [&] {
    return CreateConv(data, weight, out, a, has_bias);
  });

  memory user_src(e->user_src_md, rt.eng, DataPtr(data));
  memory user_dst(e->user_dst_md, rt.eng, DataPtr(out));
  memory src = user_src, dst = user_dst;
  if (e->reorder_src) {
    dnnl::reorder(user_src, e->src_buf).execute(rt.strm, user_src, e->src_buf);
    src = e->src_buf;
  }
  if (e->reorder_dst) dst = e->dst_buf;
  if (has_res) {
    dt res_t = ActType(*residual, "residual");
    StartFromResidual(rt, {e->user_dst_md.get_dims(), res_t, a[kConvNHWC] ? tag::nhwc : tag::nchw},
                      *residual, dst);
  }
  std::unordered_map<int, memory> exec_args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, e->weights}, {DNNL_ARG_DST, dst}};
  if (has_bias) {
    CheckF32Contig(*bias, "bias");
    exec_args[DNNL_ARG_BIAS] = memory({{bias->numel()}, dt::f32, tag::x}, rt.eng, DataPtr(*bias));
  }
  e->prim.execute(rt.strm, exec_args);
  if (e->reorder_dst) dnnl::reorder(dst, user_dst).execute(rt.strm, dst, user_dst);
  rt.strm.wait();
}

// Strides of a matmul's b, given its logical dims (..., K, N), as it lies in memory: row-major
// (..., K, N), or row-major (..., N, K) read transposed, without copying it.
memory::dims BStrides(const memory::dims& b_dims, bool trans_b) {
  int nd = static_cast<int>(b_dims.size());
  int64_t K = b_dims[nd - 2], N = b_dims[nd - 1];
  memory::dims strides(nd);
  strides[nd - 2] = trans_b ? 1 : N;
  strides[nd - 1] = trans_b ? K : 1;
  int64_t acc = K * N;
  for (int i = nd - 3; i >= 0; --i) {
    strides[i] = acc;
    acc *= b_dims[i];
  }
  return strides;
}

// a: (..., M, K) row-major. b: constant (K, N), or (N, K) with trans_b, optionally with batch
// dims matching a's. A 2-D b folds a's batch dims into M, which is what dense layers are.
void Matmul(PackedArgs args, tvm::ffi::Any* rv) {
  int n = args.size();
  TVM_FFI_ICHECK_GE(n, 4) << "matmul(a, b, [bias], attrs, out)";
  std::vector<int64_t> at = WithCompute(ReadAttrs(args[n - 2]), kMMNumAttrs - 1);
  if (at.size() + 1 == kMMNumAttrs) at.push_back(0);  // attrs from before the residual
  TVM_FFI_ICHECK_EQ(at.size(), static_cast<size_t>(kMMNumAttrs)) << "bad matmul attrs";
  bool has_bias = at[kMMHasBias] != 0, trans_b = at[kTransB] != 0, has_res = at[kMMHasRes] != 0;
  TVM_FFI_ICHECK_EQ(n, 4 + has_bias + has_res) << "matmul arg count does not match attrs";
  TensorView A = args[0].cast<TensorView>();
  TensorView B = args[1].cast<TensorView>();
  std::optional<TensorView> bias, residual;
  if (has_bias) bias = args[2].cast<TensorView>();
  if (has_res) residual = args[2 + has_bias].cast<TensorView>();
  TensorView out = args[n - 1].cast<TensorView>();
  dt a_t = ActType(A, "a"), out_t = ActType(out, "out");
  CheckF32Contig(B, "b");
  TVM_FFI_ICHECK(A.ndim() >= 2 && B.ndim() >= 2) << "matmul needs ndim >= 2";

  int64_t K = A.size(A.ndim() - 1);
  int64_t N = trans_b ? B.size(B.ndim() - 2) : B.size(B.ndim() - 1);
  memory::dims a_dims, b_dims, o_dims;
  if (B.ndim() == 2) {
    int64_t M = A.numel() / K;
    a_dims = {M, K};
    b_dims = {K, N};
    o_dims = {M, N};
  } else {
    TVM_FFI_ICHECK_EQ(A.ndim(), B.ndim()) << "batched b needs a of the same rank";
    a_dims = Dims(A);
    b_dims = Dims(B);
    if (trans_b) std::swap(b_dims[b_dims.size() - 1], b_dims[b_dims.size() - 2]);
    o_dims = Dims(out);
  }
  int nd = static_cast<int>(a_dims.size());
  int64_t o_numel = 1;
  for (auto d : o_dims) o_numel *= d;
  TVM_FFI_ICHECK_EQ(out.numel(), o_numel) << "out shape mismatch";

  std::lock_guard<std::mutex> lock(g_mu);
  ApplyThreads();
  Runtime& rt = GetRuntime();
  const float* bptr = static_cast<const float*>(DataPtr(B));
  std::string key =
      MakeKey("matmul", bptr, at, {a_dims, b_dims, o_dims}) + TypesKey({a_t, out_t});
  std::shared_ptr<MatmulEntry> e = Cached(&g_matmul_cache, key, bptr, B.numel(), [&] {
    auto e = std::make_shared<MatmulEntry>();
    memory::desc user_b_md(b_dims, dt::f32, BStrides(b_dims, trans_b));
    // bf16 compute: a and b in bf16 (a converted on each call), fp32 accumulation and output.
    dt cdt = at[kMMCompute] == kComputeBF16 ? dt::bf16 : dt::f32;
    e->user_a_md = memory::desc(a_dims, a_t, PlainTag(nd));
    e->a_md = memory::desc(a_dims, cdt, PlainTag(nd));
    e->convert_a = cdt != a_t;
    if (e->convert_a) e->a_buf = memory(e->a_md, rt.eng);
    e->dst_md = memory::desc(o_dims, out_t, PlainTag(nd));
    memory::desc b_any(b_dims, cdt, tag::any);
    memory::desc bias_md;
    if (has_bias) {
      memory::dims bd(nd, 1);
      bd[nd - 1] = N;
      bias_md = memory::desc(bd, dt::f32, PlainTag(nd));
    }
    dnnl::post_ops po;
    AppendAct(&po, at[kMMAct], 0.f, 0.f);
    if (has_res) po.append_sum(1.f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    auto pd = dnnl::matmul::primitive_desc(rt.eng, e->a_md, b_any, bias_md, e->dst_md, attr);
    e->prim = dnnl::matmul(pd);
    memory user_b(user_b_md, rt.eng, const_cast<float*>(bptr));
    e->weights = memory(pd.weights_desc(), rt.eng);
    dnnl::reorder(user_b, e->weights).execute(rt.strm, user_b, e->weights);
    rt.strm.wait();
    return e;
  });
  memory a_mem(e->user_a_md, rt.eng, DataPtr(A));
  if (e->convert_a) {
    dnnl::reorder(a_mem, e->a_buf).execute(rt.strm, a_mem, e->a_buf);
    a_mem = e->a_buf;
  }
  memory dst(e->dst_md, rt.eng, DataPtr(out));
  if (has_res) {
    dt res_t = ActType(*residual, "residual");
    TVM_FFI_ICHECK(residual->IsContiguous() && residual->numel() == out.numel())
        << "matmul residual must be a contiguous tensor of the output's shape";
    StartFromResidual(rt, {e->dst_md.get_dims(), res_t, PlainTag(nd)}, *residual, dst);
  }
  std::unordered_map<int, memory> exec_args{
      {DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, e->weights}, {DNNL_ARG_DST, dst}};
  if (has_bias) {
    CheckF32Contig(*bias, "bias");
    memory::dims bd(nd, 1);
    bd[nd - 1] = N;
    exec_args[DNNL_ARG_BIAS] =
        memory({bd, dt::f32, PlainTag(nd)}, rt.eng,
               DataPtr(*bias));
  }
  e->prim.execute(rt.strm, exec_args);
  rt.strm.wait();
}

// ---------------------------------------------------------------------------------------
// Int8 (QDQ) convolution and matmul.

void CheckInt8Weight(const TensorView& w, const TensorView& scales) {
  TVM_FFI_ICHECK(w.dtype().code == kDLInt && w.dtype().bits == 8 && w.IsContiguous())
      << "int8 weight must be a contiguous int8 tensor";
  TVM_FFI_ICHECK(scales.dtype().code == kDLFloat && scales.dtype().bits == 32 &&
                 scales.IsContiguous())
      << "weight scales must be a contiguous float32 tensor";
}

// One f32 / s32 value as a oneDNN memory (scales and zero points are run-time arguments).
memory ScalarMemory(const dnnl::engine& eng, dt type, const void* value, int64_t n = 1) {
  memory m({{n}, type, tag::x}, eng);
  std::memcpy(m.get_data_handle(), value, n * 4);
  return m;
}

// The quantize step of the QDQ graph as a reorder: round(x / scale) + zero_point, saturated
// to the int8 type of `to` (oneDNN rounds to nearest even, as QuantizeLinear does).
void MakeQuantize(QuantEntry* e, const dnnl::engine& eng, const memory::desc& to) {
  if (e->src_int8) {
    e->reorder_src = e->user_src_md != to;
    if (e->reorder_src) {
      e->quantize = dnnl::reorder(dnnl::reorder::primitive_desc(eng, e->user_src_md, eng, to));
      e->src_buf = memory(to, eng);
    }
    return;
  }
  dnnl::primitive_attr ra;
  ra.set_scales_mask(DNNL_ARG_DST, 0);
  if (e->has_zp) ra.set_zero_points_mask(DNNL_ARG_DST, 0);
  e->quantize = dnnl::reorder(dnnl::reorder::primitive_desc(eng, e->user_src_md, eng, to, ra));
  e->src_buf = memory(to, eng);
}

void SetQuantParams(QuantEntry* e, const dnnl::engine& eng, int64_t scale_bits, int64_t zp,
                    const TensorView& wscales) {
  float s = BitsToFloat(scale_bits);
  int32_t z = static_cast<int32_t>(zp);
  e->src_scale = ScalarMemory(eng, dt::f32, &s);
  e->src_zp = ScalarMemory(eng, dt::s32, &z);
  e->wei_scale = ScalarMemory(eng, dt::f32, DataPtr(wscales), wscales.numel());
}

void RunQuant(QuantEntry* e, const TensorView& data, const TensorView& out,
              const std::optional<TensorView>& bias, const memory::desc& bias_md,
              const std::optional<TensorView>& residual = std::nullopt) {
  Runtime& rt = GetRuntime();
  memory user_src(e->user_src_md, rt.eng, DataPtr(data));
  memory src = e->src_buf;
  if (!e->src_int8) {
    std::unordered_map<int, memory> qargs{{DNNL_ARG_FROM, user_src}, {DNNL_ARG_TO, e->src_buf},
                                          {DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, e->src_scale}};
    if (e->has_zp) qargs[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST] = e->src_zp;
    e->quantize.execute(rt.strm, qargs);
  } else if (e->reorder_src) {
    e->quantize.execute(rt.strm, user_src, e->src_buf);
  } else {
    src = user_src;
  }
  memory user_dst(e->user_dst_md, rt.eng, DataPtr(out));
  memory dst = e->reorder_dst ? e->dst_buf : user_dst;
  if (residual) {
    TVM_FFI_ICHECK(!e->dst_quant) << "a residual needs an fp32 output";
    CheckF32Contig(*residual, "residual");
    StartFromResidual(rt, e->user_dst_md, *residual, dst);
  }
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, e->weights}, {DNNL_ARG_DST, dst},
      {DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, e->src_scale},
      {DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, e->wei_scale}};
  if (e->has_zp) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = e->src_zp;
  if (e->dst_quant) args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = e->dst_scale;
  if (e->has_dst_zp) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST] = e->dst_zp;
  if (bias) {
    CheckF32Contig(*bias, "bias");
    args[DNNL_ARG_BIAS] = memory(bias_md, rt.eng, DataPtr(*bias));
  }
  e->prim.execute(rt.strm, args);
  if (e->reorder_dst) dnnl::reorder(dst, user_dst).execute(rt.strm, dst, user_dst);
  rt.strm.wait();
}

std::shared_ptr<QuantEntry> CreateQConv(const TensorView& data, const TensorView& weight,
                                        const TensorView& wscales, const TensorView& out,
                                        const std::vector<int64_t>& a) {
  Runtime& rt = GetRuntime();
  auto e = std::make_shared<QuantEntry>();
  bool nhwc = a[kQWeightLayout] != 0, hwio = a[kQWeightLayout] == 2;
  bool src_nchw = !nhwc || a[kQSrcNCHW] != 0;
  auto logical = [](memory::dims d, bool is_nhwc) {
    return is_nhwc ? memory::dims{d[0], d[3], d[1], d[2]} : d;
  };
  memory::dims src_dims = logical(Dims(data), !src_nchw), dst_dims = logical(Dims(out), nhwc);
  memory::dims wd = Dims(weight);
  memory::dims w_dims = hwio ? memory::dims{wd[3], wd[2], wd[0], wd[1]} : logical(wd, nhwc);
  int64_t groups = a[kQGroups];
  memory::dims wg_dims = w_dims;
  tag w_tag = hwio ? tag::hwio : nhwc ? tag::ohwi : tag::oihw;
  // Per-output-channel scales: the O axis, which a grouped weight splits into (G, O/G).
  int wei_mask = wscales.numel() > 1 ? 1 : 0;
  if (groups > 1) {
    wg_dims = {groups, w_dims[0] / groups, w_dims[1], w_dims[2], w_dims[3]};
    w_tag = hwio ? tag::hwigo : nhwc ? tag::gohwi : tag::goihw;
    wei_mask = wscales.numel() > 1 ? 3 : 0;
  }
  TVM_FFI_ICHECK(wscales.numel() == 1 || wscales.numel() == w_dims[0])
      << "weight scales must be one per tensor or one per output channel";
  bool dynamic = a[kQDynamic] != 0;
  // A dynamic call's zero point is known only at run time: always a primitive input.
  e->has_zp = dynamic || a[kQSrcZp] != 0;
  e->src_int8 = a[kQSrcInt8] != 0;
  e->dst_quant = a[kQDstQuant] != 0;
  e->has_dst_zp = e->dst_quant && a[kQDstZp] != 0;
  dt sdt = a[kQSrcSigned] && !dynamic ? dt::s8 : dt::u8;
  dt ddt = !e->dst_quant ? dt::f32 : a[kQDstSigned] ? dt::s8 : dt::u8;
  e->user_src_md = memory::desc(src_dims, e->src_int8 ? sdt : dt::f32,
                                src_nchw ? tag::nchw : tag::nhwc);
  e->user_dst_md = memory::desc(dst_dims, ddt, nhwc ? tag::nhwc : tag::nchw);
  memory::desc src_any(src_dims, sdt, tag::any), dst_any(dst_dims, ddt, tag::any);
  memory::desc w_any(wg_dims, dt::s8, tag::any);
  memory::desc b_md = a[kQHasBias] ? memory::desc({dst_dims[1]}, dt::f32, tag::x)
                                   : memory::desc();
  dnnl::post_ops po;
  AppendAct(&po, a[kQAct], BitsToFloat(a[kQClipLo]), BitsToFloat(a[kQClipHi]));
  if (a[kQHasRes]) {
    // quantize -> dequantize of the output, written as relax legalizes it:
    // (clip(round(x / s) + zp, qmin, qmax) - zp) * s; then the residual, then relu.
    float s = BitsToFloat(a[kQOutScale]), zp = static_cast<float>(a[kQOutZp]);
    float qmin = a[kQOutSigned] ? -128.f : 0.f, qmax = a[kQOutSigned] ? 127.f : 255.f;
    if (a[kQOutScale] != 0) {
      po.append_eltwise(dnnl::algorithm::eltwise_linear, 1.f / s, zp);
      po.append_eltwise(dnnl::algorithm::eltwise_round, 0.f, 0.f);
      po.append_eltwise(dnnl::algorithm::eltwise_clip, qmin, qmax);
      po.append_eltwise(dnnl::algorithm::eltwise_linear, s, -zp * s);
    }
    po.append_sum(1.f);
    if (a[kQPostRelu]) po.append_eltwise(dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  }
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);
  attr.set_scales_mask(DNNL_ARG_SRC, 0);
  attr.set_scales_mask(DNNL_ARG_WEIGHTS, wei_mask);
  if (e->has_zp) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
  if (e->dst_quant) attr.set_scales_mask(DNNL_ARG_DST, 0);
  if (e->has_dst_zp) attr.set_zero_points_mask(DNNL_ARG_DST, 0);
  memory::dims strides{a[kQStrideH], a[kQStrideW]};
  memory::dims dil{a[kQDilH] - 1, a[kQDilW] - 1};
  memory::dims pad_l{a[kQPadT], a[kQPadL]}, pad_r{a[kQPadB], a[kQPadR]};
  auto pd = dnnl::convolution_forward::primitive_desc(
      rt.eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_any,
      w_any, b_md, dst_any, strides, dil, pad_l, pad_r, attr);
  e->prim = dnnl::convolution_forward(pd);
  MakeQuantize(e.get(), rt.eng, pd.src_desc());
  e->dst_md = pd.dst_desc();
  e->reorder_dst = e->dst_md != e->user_dst_md;
  if (e->reorder_dst) e->dst_buf = memory(e->dst_md, rt.eng);
  // The reorder into oneDNN's weight layout also computes the zero-point compensation the
  // primitive's weights descriptor asks for.
  memory user_w({wg_dims, dt::s8, w_tag}, rt.eng, DataPtr(weight));
  e->weights = memory(pd.weights_desc(), rt.eng);
  dnnl::reorder(user_w, e->weights).execute(rt.strm, user_w, e->weights);
  rt.strm.wait();
  SetQuantParams(e.get(), rt.eng, a[kQSrcScale], a[kQSrcZp], wscales);
  if (e->dst_quant) {
    float s = BitsToFloat(a[kQDstScale]);
    int32_t z = static_cast<int32_t>(a[kQDstZp]);
    e->dst_scale = ScalarMemory(rt.eng, dt::f32, &s);
    e->dst_zp = ScalarMemory(rt.eng, dt::s32, &z);
  }
  return e;
}

void DynamicQuantParams(const float* x, int64_t n, float* scale, int32_t* zp);

void QConv2d(PackedArgs args, tvm::ffi::Any* rv) {
  int n = args.size();
  TVM_FFI_ICHECK_GE(n, 5) << "qconv2d(data, weight, weight_scales, [bias], [residual], attrs, out)";
  std::vector<int64_t> a = ReadAttrs(args[n - 2]);
  if (a.size() == static_cast<size_t>(kQConvBaseAttrs) ||
      a.size() == static_cast<size_t>(kQResAttrs)) {
    a.resize(kQConvNumAttrs, 0);
  }
  TVM_FFI_ICHECK_EQ(a.size(), static_cast<size_t>(kQConvNumAttrs)) << "bad qconv2d attrs";
  bool has_bias = a[kQHasBias] != 0, has_res = a[kQHasRes] != 0;
  TVM_FFI_ICHECK_EQ(n, 5 + has_bias + has_res) << "qconv2d arg count does not match attrs";
  TensorView data = args[0].cast<TensorView>();
  TensorView weight = args[1].cast<TensorView>();
  TensorView wscales = args[2].cast<TensorView>();
  std::optional<TensorView> bias;
  if (has_bias) bias = args[3].cast<TensorView>();
  std::optional<TensorView> residual;
  if (has_res) residual = args[3 + has_bias].cast<TensorView>();
  TensorView out = args[n - 1].cast<TensorView>();
  if (a[kQSrcInt8]) {
    CheckInt8Contig(data, a[kQSrcSigned] != 0, "data");
  } else {
    CheckF32Contig(data, "data");
  }
  if (a[kQDstQuant]) {
    CheckInt8Contig(out, a[kQDstSigned] != 0, "out");
  } else {
    CheckF32Contig(out, "out");
  }
  CheckInt8Weight(weight, wscales);
  TVM_FFI_ICHECK(data.ndim() == 4 && weight.ndim() == 4 && out.ndim() == 4) << "qconv2d is 2-D";
  TVM_FFI_ICHECK(!(a[kQDynamic] && a[kQSrcInt8])) << "a dynamic qconv2d quantizes fp32 data";

  std::lock_guard<std::mutex> lock(g_mu);
  ApplyThreads();
  const int8_t* wptr = static_cast<const int8_t*>(DataPtr(weight));
  std::string key = MakeKey("qconv", wptr, a, {Dims(data), Dims(weight), Dims(out)});
  std::shared_ptr<QuantEntry> e = Cached(&g_quant_cache, key, wptr, weight.numel(), [&] {
    return CreateQConv(data, weight, wscales, out, a);
  });
  if (a[kQDynamic]) {
    // The scale and zero point memories feed both the quantizing reorder and the convolution.
    DynamicQuantParams(static_cast<const float*>(DataPtr(data)), data.numel(),
                       static_cast<float*>(e->src_scale.get_data_handle()),
                       static_cast<int32_t*>(e->src_zp.get_data_handle()));
  }
  memory::desc b_md;
  if (has_bias) b_md = memory::desc({bias->numel()}, dt::f32, tag::x);
  RunQuant(e.get(), data, out, bias, b_md, residual);
}

// The minimum and maximum of x[0, n) and 0, in four vectors of independent lanes: one running
// min/max is a chain of dependent instructions, one element per instruction latency, and the
// compiler does not turn it into vector code without -ffast-math (min/max are not associative
// under NaN). Like the scalar loop, a NaN element is skipped: minps/maxps return the running
// value when the element is NaN.
void MinMaxWithZero(const float* x, int64_t n, float* mn, float* mx) {
  int64_t i = 0;
  float a = 0.f, b = 0.f;
#if defined(__SSE2__)
  __m128 lo[4], hi[4];
  for (int j = 0; j < 4; ++j) lo[j] = hi[j] = _mm_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 4; ++j) {
      __m128 v = _mm_loadu_ps(x + i + 4 * j);
      lo[j] = _mm_min_ps(v, lo[j]);
      hi[j] = _mm_max_ps(v, hi[j]);
    }
  }
  alignas(16) float l[16], h[16];
  for (int j = 0; j < 4; ++j) {
    _mm_store_ps(l + 4 * j, lo[j]);
    _mm_store_ps(h + 4 * j, hi[j]);
  }
  for (int j = 0; j < 16; ++j) {
    a = std::min(a, l[j]);
    b = std::max(b, h[j]);
  }
#endif
  for (; i < n; ++i) {
    a = x[i] < a ? x[i] : a;
    b = x[i] > b ? x[i] : b;
  }
  *mn = a;
  *mx = b;
}

// ONNX DynamicQuantizeLinear's parameters of x (u8), as onnxruntime computes them: the range
// is widened to hold 0, scale = (max - min) / 255 (1 when the range is empty), and
// zero_point = round_half_even(clamp(0 - min / scale, 0, 255)).
void DynamicQuantParams(const float* x, int64_t n, float* scale, int32_t* zp) {
  // Below this many floats one thread is faster than waking the OpenMP team for one more
  // parallel region (on a busy machine that can wait a scheduler quantum for a preempted
  // worker); above it the pass is a memory stream each core can share.
  constexpr int64_t kParallelMin = int64_t{1} << 16, kChunk = int64_t{1} << 14;
  float mn = 0.f, mx = 0.f;
#ifdef _OPENMP
  if (n >= kParallelMin && omp_get_max_threads() > 1) {
    int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) reduction(min : mn) reduction(max : mx)
    for (int64_t c = 0; c < chunks; ++c) {
      float a, b;
      MinMaxWithZero(x + c * kChunk, std::min(kChunk, n - c * kChunk), &a, &b);
      mn = std::min(mn, a);
      mx = std::max(mx, b);
    }
  } else {
    MinMaxWithZero(x, n, &mn, &mx);
  }
#else
  MinMaxWithZero(x, n, &mn, &mx);
#endif
  float s = mx == mn ? 1.f : (mx - mn) / 255.f;
  float z = std::max(0.f, std::min(255.f, 0.f - mn / s));
  *scale = s;
  *zp = static_cast<int32_t>(std::nearbyint(z));  // the default rounding mode: half to even
}

// a: (..., M, K) fp32, its batch dims folded into M; b: constant s8 (K, N) or (N, K).
void QMatmul(PackedArgs args, tvm::ffi::Any* rv) {
  int n = args.size();
  TVM_FFI_ICHECK_GE(n, 5) << "qmatmul(a, b, b_scales, [bias], attrs, out)";
  std::vector<int64_t> at = ReadAttrs(args[n - 2]);
  if (at.size() == static_cast<size_t>(kQMBaseAttrs)) at.resize(kQMNumAttrs, 0);
  TVM_FFI_ICHECK_EQ(at.size(), static_cast<size_t>(kQMNumAttrs)) << "bad qmatmul attrs";
  bool dynamic = at[kQMDynamic] != 0;
  bool has_bias = at[kQMHasBias] != 0, trans_b = at[kQMTransB] != 0;
  TVM_FFI_ICHECK_EQ(n, 5 + has_bias) << "qmatmul arg count does not match attrs";
  TensorView A = args[0].cast<TensorView>();
  TensorView B = args[1].cast<TensorView>();
  TensorView bscales = args[2].cast<TensorView>();
  std::optional<TensorView> bias;
  if (has_bias) bias = args[3].cast<TensorView>();
  TensorView out = args[n - 1].cast<TensorView>();
  CheckF32Contig(A, "a");
  CheckF32Contig(out, "out");
  CheckInt8Weight(B, bscales);
  TVM_FFI_ICHECK(A.ndim() >= 2 && B.ndim() == 2) << "qmatmul needs a 2-D constant b";
  int64_t K = A.size(A.ndim() - 1);
  int64_t N = trans_b ? B.size(0) : B.size(1);
  int64_t M = A.numel() / K;
  TVM_FFI_ICHECK_EQ(out.numel(), M * N) << "out shape mismatch";
  TVM_FFI_ICHECK(bscales.numel() == 1 || bscales.numel() == N)
      << "b scales must be one per tensor or one per output column";
  memory::dims a_dims{M, K}, b_dims{K, N}, o_dims{M, N};

  std::lock_guard<std::mutex> lock(g_mu);
  ApplyThreads();
  Runtime& rt = GetRuntime();
  const int8_t* bptr = static_cast<const int8_t*>(DataPtr(B));
  std::string key = MakeKey("qmatmul", bptr, at, {a_dims, b_dims});
  std::shared_ptr<QuantEntry> e = Cached(&g_quant_cache, key, bptr, B.numel(), [&] {
    auto e = std::make_shared<QuantEntry>();
    // A dynamic call's zero point is known only at run time: always a primitive input.
    e->has_zp = dynamic || at[kQMSrcZp] != 0;
    e->user_src_md = memory::desc(a_dims, dt::f32, tag::ab);
    e->user_dst_md = e->dst_md = memory::desc(o_dims, dt::f32, tag::ab);
    memory::desc a_md(a_dims, at[kQMSrcSigned] && !dynamic ? dt::s8 : dt::u8, tag::ab);
    memory::desc b_any(b_dims, dt::s8, tag::any);
    memory::desc bias_md;
    if (has_bias) bias_md = memory::desc({1, N}, dt::f32, tag::ab);
    dnnl::post_ops po;
    AppendAct(&po, at[kQMAct], 0.f, 0.f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, bscales.numel() > 1 ? 2 : 0);  // per column: N
    if (e->has_zp) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
    auto pd = dnnl::matmul::primitive_desc(rt.eng, a_md, b_any, bias_md, e->dst_md, attr);
    e->prim = dnnl::matmul(pd);
    MakeQuantize(e.get(), rt.eng, a_md);
    memory::desc user_b_md(b_dims, dt::s8,
                           trans_b ? memory::dims{1, K} : memory::dims{N, 1});
    memory user_b(user_b_md, rt.eng, const_cast<int8_t*>(bptr));
    e->weights = memory(pd.weights_desc(), rt.eng);
    dnnl::reorder(user_b, e->weights).execute(rt.strm, user_b, e->weights);
    rt.strm.wait();
    SetQuantParams(e.get(), rt.eng, at[kQMSrcScale], at[kQMSrcZp], bscales);
    return e;
  });
  if (dynamic) {
    // The scale and zero point memories feed both the quantizing reorder and the matmul.
    DynamicQuantParams(static_cast<const float*>(DataPtr(A)), A.numel(),
                       static_cast<float*>(e->src_scale.get_data_handle()),
                       static_cast<int32_t*>(e->src_zp.get_data_handle()));
  }
  RunQuant(e.get(), A, out, bias, memory::desc({1, N}, dt::f32, tag::ab));
}

// ---------------------------------------------------------------------------------------
// Matmul of two activations (attention's scores and weighted sum): nothing is constant, so the
// primitive is cached by shape alone and both operands are read where they are. b may be read
// transposed through its strides (a permute_dims of the last two axes folded into the call),
// and the output scaled (attention's 1/sqrt(d)).

enum BmmAttr { kBTransB, kBScaleBits, kBCompute, kBNumAttrs };

struct BmmEntry {
  dnnl::matmul prim;
  memory::desc a_md, b_md, user_a_md, user_b_md, dst_md;
  // bf16 compute: an fp32 operand is converted into a_buf / b_buf first
  bool convert_a = false, convert_b = false;
  memory a_buf, b_buf;
};

std::unordered_map<std::string, std::shared_ptr<BmmEntry>> g_bmm_cache;

// a: (..., M, K); b: (..., K, N), or (..., N, K) read transposed; batch dims equal or 1.
void BatchMatmul(PackedArgs args, tvm::ffi::Any* rv) {
  TVM_FFI_ICHECK_EQ(args.size(), 4) << "batch_matmul(a, b, attrs, out)";
  std::vector<int64_t> at = ReadAttrs(args[2]);
  TVM_FFI_ICHECK_EQ(at.size(), static_cast<size_t>(kBNumAttrs)) << "bad batch_matmul attrs";
  TensorView A = args[0].cast<TensorView>();
  TensorView B = args[1].cast<TensorView>();
  TensorView out = args[3].cast<TensorView>();
  dt a_t = ActType(A, "a"), b_t = ActType(B, "b"), out_t = ActType(out, "out");
  int nd = static_cast<int>(A.ndim());
  TVM_FFI_ICHECK(nd >= 2 && nd <= 4 && B.ndim() == nd && out.ndim() == nd)
      << "batch_matmul needs a, b and out of one rank in 2-4";
  bool trans_b = at[kBTransB] != 0;
  memory::dims a_dims = Dims(A), b_dims = Dims(B), o_dims = Dims(out);
  int64_t K = a_dims[nd - 1];
  if (trans_b) std::swap(b_dims[nd - 1], b_dims[nd - 2]);  // logical (..., K, N)
  int64_t N = b_dims[nd - 1];
  TVM_FFI_ICHECK_EQ(b_dims[nd - 2], K) << "batch_matmul: inner dims differ";
  TVM_FFI_ICHECK(o_dims[nd - 1] == N && o_dims[nd - 2] == a_dims[nd - 2])
      << "batch_matmul: out shape mismatch";
  for (int i = 0; i < nd - 2; ++i) {
    TVM_FFI_ICHECK((a_dims[i] == b_dims[i] || a_dims[i] == 1 || b_dims[i] == 1) &&
                   o_dims[i] == std::max(a_dims[i], b_dims[i]))
        << "batch_matmul: batch dims do not broadcast";
  }
  memory::dims b_strides = BStrides(b_dims, trans_b);

  std::lock_guard<std::mutex> lock(g_mu);
  ApplyThreads();
  Runtime& rt = GetRuntime();
  std::string key =
      MakeKey("bmm", nullptr, at, {a_dims, b_dims, o_dims}) + TypesKey({a_t, b_t, out_t});
  auto it = g_bmm_cache.find(key);
  std::shared_ptr<BmmEntry> e;
  if (it != g_bmm_cache.end()) {
    e = it->second;
  } else {
    e = std::make_shared<BmmEntry>();
    dt cdt = at[kBCompute] == kComputeBF16 ? dt::bf16 : dt::f32;
    e->user_a_md = memory::desc(a_dims, a_t, PlainTag(nd));
    e->user_b_md = memory::desc(b_dims, b_t, b_strides);
    e->a_md = memory::desc(a_dims, cdt, PlainTag(nd));
    e->b_md = memory::desc(b_dims, cdt, b_strides);
    e->convert_a = a_t != cdt;
    e->convert_b = b_t != cdt;
    if (e->convert_a) e->a_buf = memory(e->a_md, rt.eng);
    if (e->convert_b) e->b_buf = memory(e->b_md, rt.eng);
    e->dst_md = memory::desc(o_dims, out_t, PlainTag(nd));
    float scale;
    uint32_t bits = static_cast<uint32_t>(at[kBScaleBits]);
    std::memcpy(&scale, &bits, sizeof(scale));
    dnnl::post_ops po;
    if (scale != 1.f) po.append_eltwise(dnnl::algorithm::eltwise_linear, scale, 0.f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    auto pd = dnnl::matmul::primitive_desc(rt.eng, e->a_md, e->b_md, e->dst_md, attr);
    e->prim = dnnl::matmul(pd);
    g_bmm_cache[key] = e;
  }
  memory a_mem(e->user_a_md, rt.eng, DataPtr(A)), b_mem(e->user_b_md, rt.eng, DataPtr(B));
  if (e->convert_a) {
    dnnl::reorder(a_mem, e->a_buf).execute(rt.strm, a_mem, e->a_buf);
    a_mem = e->a_buf;
  }
  if (e->convert_b) {
    dnnl::reorder(b_mem, e->b_buf).execute(rt.strm, b_mem, e->b_buf);
    b_mem = e->b_buf;
  }
  e->prim.execute(rt.strm, {{DNNL_ARG_SRC, a_mem},
                            {DNNL_ARG_WEIGHTS, b_mem},
                            {DNNL_ARG_DST, memory(e->dst_md, rt.eng, DataPtr(out))}});
  rt.strm.wait();
}

// ---------------------------------------------------------------------------------------
// Attention, softmax(q.k^T * scale).v, over blocks of query rows: each block's scores are
// computed, normalised and multiplied by v while they are in the core's cache, so a long
// sequence's score matrix (heads x M x N floats) is never written to memory and read back,
// as three separate kernels do. Every step is a oneDNN primitive (matmul with the scale as a
// post-op, softmax, matmul); only the blocking is ours. The (batch, block) pairs are shared
// among the threads of one parallel region, each running the primitives on its own (oneDNN
// runs a primitive on the calling thread alone inside a parallel region) with its own
// buffers and scratchpad: one fork and join per call instead of three per block, which on a
// busy machine each wait for the slowest thread.
//
// q: (..., M, D); k: (..., N, D) read transposed (kATransK), or (..., D, N); v: (..., N, Dv);
// out: (..., M, Dv); batch dims equal. Types per tensor (fp32 or bf16), as for batch_matmul.
// kALayout: a bit per tensor (kSeqMajor*) given as (batch, seq, heads, d) rather than
// (batch, heads, seq, d): the head split / merge transposes of a transformer. A thread copies
// the rows of one head it works on into a buffer of its own (oneDNN's AMX matmul takes only
// dense rows) and the block's output rows back: in cache, instead of a transpose kernel and a
// tensor each way. Such a k is read transposed. kAHeads (when not 0) is the number of heads of
// the attention and kAHeadOff* the first head of q, k and v among a sequence-major tensor's:
// the three can be one (batch, seq, 3 * heads, d) projection, read without splitting it.

// kAMask: 0 none; 1 / 2: scores set to the kAFillBits value where a boolean mask (the input
// after v) is true / false (a where() between the scores and the softmax); 3: a float mask
// added to the scores (an additive attention bias). The mask broadcasts to the scores.
enum AttnAttr {
  kATransK, kAScaleBits, kACompute, kAMask, kAFillBits, kALayout,
  kAHeadOffQ, kAHeadOffK, kAHeadOffV, kAHeads, kANumAttrs
};
enum AttnLayout { kSeqMajorQ = 1, kSeqMajorK = 2, kSeqMajorV = 4, kSeqMajorOut = 8 };
enum AttnMask { kMaskNone = 0, kMaskFillTrue = 1, kMaskFillFalse = 2, kMaskAdd = 3 };

// Scores and probabilities of one block stay within this many bytes: half a Sapphire Rapids
// core's L2, leaving room for the block's rows of q and out and a panel of k and v.
constexpr int64_t kAttnBlockBytes = int64_t{1} << 20;

// The scores of a block are computed in panels of at most this many columns of k. For a
// bf16 matmul with a short reduction (attention's head dim) and a wide output, oneDNN's
// dispatch leaves AMX for its AVX512-BF16 kernel once the output is wider than this, which
// runs at a seventh of AMX's rate (and at half of the fp32 kernel's); panels keep it on AMX.
// A panel is written whole and copied into its columns of the scores: written in place
// through the scores' row stride, the matmul leaves AMX too.
constexpr int64_t kAttnPanelCols = 512;

struct AttnPanel {
  int64_t col0 = 0;      // first column of the scores (row of k) this panel computes
  dnnl::matmul qk;
  dnnl::reorder place;   // panel -> its columns of the scores (with more than one panel)
  memory::desc k_md, out_md, cols_md;
};

struct AttnSteps {
  std::vector<AttnPanel> panels;  // the scores' columns, left to right
  int64_t panel_cols = 0;         // widest panel (0: one panel, written in place)
  dnnl::reorder q_in, o_out;      // a sequence-major block's rows of q in; of out back
  memory::desc q_user_md, o_user_md;
  dnnl::matmul pv;
  dnnl::softmax_forward softmax;
  memory::desc q_md, s_md, p_md, v_md, o_md;  // one block's operands
  size_t pad_bytes = 0;
};

struct AttnEntry {
  int64_t rows = 0, tail = 0;  // rows per block; rows of the last, shorter block (0: none)
  AttnSteps full, last;
  dnnl::reorder k_in, v_in;    // a sequence-major head's k, v into a thread's buffers
  memory::desc k_user_md, v_user_md, k_md, v_md;
  memory::desc user_q_md, user_k_md, user_v_md;  // the whole tensors as given
  bool convert_q = false, convert_k = false, convert_v = false;
  memory q_buf, k_buf, v_buf;
  dt cdt = dt::f32;
  int copies = 0;        // the sequence-major tensors copied to / from dense rows
  size_t pad_bytes = 0;  // the largest scratchpad of the steps
  // per thread: a stream, a block's scores and probabilities, a scratchpad
  std::vector<dnnl::stream> strms;
  std::vector<memory> scores, probs, pads, panels;
  // per thread, for sequence-major operands: dense copies, and the head whose k, v they hold
  std::vector<memory> qs, ks, vs, os;
  std::vector<int64_t> kv_of;
};

std::unordered_map<std::string, std::shared_ptr<AttnEntry>> g_attn_cache;

// Row strides (elements) of one (batch, head) matrix of q, k, v and out in the whole tensors.
struct AttnStrides {
  int64_t q, k, v, o;
};

// Which sequence-major tensors a call copies to dense rows rather than reads in place. In
// place, oneDNN's matmul takes its plain gemm kernel for the strided rows instead of brgemm:
// faster for short sequences, where the copies cost more than they save, but off AMX in bf16
// and slower in fp32 for long ones. The crossovers are in scores per head (queries x keys),
// timed on Sapphire Rapids: about 256 x 256 in bf16, 1024 x 1024 in fp32.
constexpr int64_t kAttnCopyScoresBF16 = int64_t{256} * 256;
constexpr int64_t kAttnCopyScoresF32 = int64_t{1024} * 1024;

int AttnCopies(int layout, int64_t M, int64_t N, dt cdt) {
  int64_t at_least = cdt == dt::f32 ? kAttnCopyScoresF32 : kAttnCopyScoresBF16;
  return M * N >= at_least ? layout : 0;
}

// ld: the row strides of the tensors as given; in: as the steps read and write them (those
// of the tensors `copies` names are dense: copied from / to their rows ld apart).
AttnSteps MakeAttnSteps(const dnnl::engine& eng, int64_t rows, int64_t N, int64_t D,
                        int64_t Dv, bool trans_k, dt cdt, dt out_t, float scale,
                        const AttnStrides& ld, const AttnStrides& in, int copies) {
  AttnSteps s;
  s.q_md = memory::desc({rows, D}, cdt, memory::dims{in.q, 1});
  s.s_md = memory::desc({rows, N}, dt::f32, tag::ab);
  s.p_md = memory::desc({rows, N}, cdt, tag::ab);
  s.v_md = memory::desc({N, Dv}, cdt, memory::dims{in.v, 1});
  s.o_md = memory::desc({rows, Dv}, out_t, memory::dims{in.o, 1});
  s.q_user_md = memory::desc({rows, D}, cdt, memory::dims{ld.q, 1});
  s.o_user_md = memory::desc({rows, Dv}, out_t, memory::dims{ld.o, 1});
  if (copies & kSeqMajorQ) {
    s.q_in = dnnl::reorder(dnnl::reorder::primitive_desc(eng, s.q_user_md, eng, s.q_md));
  }
  if (copies & kSeqMajorOut) {
    s.o_out = dnnl::reorder(dnnl::reorder::primitive_desc(eng, s.o_md, eng, s.o_user_md));
  }
  dnnl::post_ops po;
  if (scale != 1.f) po.append_eltwise(dnnl::algorithm::eltwise_linear, scale, 0.f);
  // Threads run the steps concurrently: each passes its own scratchpad.
  dnnl::primitive_attr attr, plain;
  attr.set_post_ops(po);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  plain.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // fp32 runs at one rate at any width: one panel. Otherwise equal panels of whole vectors.
  int64_t npanels = cdt == dt::f32 ? 1 : (N + kAttnPanelCols - 1) / kAttnPanelCols;
  int64_t width = (N + npanels - 1) / npanels;
  if (npanels > 1) width = (width + 15) / 16 * 16;
  size_t pad = 0;
  for (int64_t c0 = 0; c0 < N; c0 += width) {
    AttnPanel p;
    p.col0 = c0;
    int64_t w = std::min(width, N - c0);
    p.k_md = memory::desc({D, w}, cdt, trans_k ? memory::dims{1, in.k} : memory::dims{in.k, 1});
    p.out_md = memory::desc({rows, w}, dt::f32, tag::ab);
    auto qk = dnnl::matmul::primitive_desc(eng, s.q_md, p.k_md, p.out_md, attr);
    pad = std::max(pad, qk.scratchpad_desc().get_size());
    p.qk = dnnl::matmul(qk);
    if (npanels > 1) {
      p.cols_md = memory::desc({rows, w}, dt::f32, memory::dims{N, 1});
      p.place = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p.out_md, eng, p.cols_md));
      s.panel_cols = width;
    }
    s.panels.push_back(std::move(p));
  }
  auto sm = dnnl::softmax_forward::primitive_desc(
      eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_accurate, s.s_md,
      s.p_md, 1, plain);
  auto pv = dnnl::matmul::primitive_desc(eng, s.p_md, s.v_md, s.o_md, plain);
  s.pad_bytes = std::max({pad, sm.scratchpad_desc().get_size(), pv.scratchpad_desc().get_size()});
  s.softmax = dnnl::softmax_forward(sm);
  s.pv = dnnl::matmul(pv);
  return s;
}

// Where a block's scores read the mask: element (b, row, col) of the scores is at
// b_off[b] + row * row_stride + col * col_stride of the mask (0 strides where it broadcasts).
struct MaskView {
  const char* data = nullptr;
  int mode = kMaskNone;
  float fill = 0.f;
  std::vector<int64_t> b_off;
  int64_t row_stride = 0, col_stride = 0;

  void Apply(float* s, int64_t b, int64_t r0, int64_t rows, int64_t N) const {
    if (mode == kMaskNone) return;
    for (int64_t i = 0; i < rows; ++i) {
      float* row = s + i * N;
      int64_t base = b_off[b] + (r0 + i) * row_stride;
      if (mode == kMaskAdd) {
        const float* m = reinterpret_cast<const float*>(data) + base;
        for (int64_t j = 0; j < N; ++j) row[j] += m[j * col_stride];
      } else {
        const uint8_t* m = reinterpret_cast<const uint8_t*>(data) + base;
        uint8_t when = mode == kMaskFillTrue ? 1 : 0;
        for (int64_t j = 0; j < N; ++j) {
          if ((m[j * col_stride] != 0) == (when != 0)) row[j] = fill;
        }
      }
    }
  }
};

MaskView MakeMaskView(const TensorView& mask, int mode, float fill,
                      const memory::dims& batch_dims, int64_t M, int64_t N) {
  MaskView mv;
  mv.mode = mode;
  mv.fill = fill;
  auto dtype = mask.dtype();
  if (mode == kMaskAdd) {
    TVM_FFI_ICHECK(dtype.code == kDLFloat && dtype.bits == 32 && dtype.lanes == 1)
        << "an additive attention mask must be float32";
  } else {
    TVM_FFI_ICHECK((dtype.code == kDLBool || dtype.code == kDLUInt || dtype.code == kDLInt) &&
                   dtype.bits <= 8 && dtype.lanes == 1)
        << "a boolean attention mask must have one byte per element";
  }
  TVM_FFI_ICHECK(mask.IsContiguous()) << "attention mask must be contiguous";
  mv.data = static_cast<const char*>(DataPtr(mask));
  // The mask's dims aligned to the scores' (batch..., M, N) from the right; a missing or
  // size-1 dim broadcasts (stride 0).
  int nb = static_cast<int>(batch_dims.size()), nd = nb + 2, md = static_cast<int>(mask.ndim());
  TVM_FFI_ICHECK(md <= nd) << "attention mask has more dims than the scores";
  std::vector<int64_t> dims(nd, 1), strides(nd, 0);
  int64_t acc = 1;
  for (int i = md - 1, j = nd - 1; i >= 0; --i, --j) {
    dims[j] = mask.shape()[i];
    strides[j] = dims[j] == 1 ? 0 : acc;
    acc *= mask.shape()[i];
  }
  std::vector<int64_t> want(batch_dims.begin(), batch_dims.end());
  want.push_back(M);
  want.push_back(N);
  for (int j = 0; j < nd; ++j) {
    TVM_FFI_ICHECK(dims[j] == 1 || dims[j] == want[j])
        << "attention mask does not broadcast to the scores";
  }
  mv.row_stride = strides[nd - 2];
  mv.col_stride = strides[nd - 1];
  int64_t batch = 1;
  for (auto d : batch_dims) batch *= d;
  mv.b_off.resize(batch);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t rest = b, off = 0;
    for (int j = nb - 1; j >= 0; --j) {
      off += (rest % want[j]) * strides[j];
      rest /= want[j];
    }
    mv.b_off[b] = off;
  }
  return mv;
}

void Attention(PackedArgs args, tvm::ffi::Any* rv) {
  int n = args.size();
  TVM_FFI_ICHECK(n == 5 || n == 6) << "attention(q, k, v, [mask], attrs, out)";
  std::vector<int64_t> at = ReadAttrs(args[n - 2]);
  if (at.size() == 3 || at.size() == 5 || at.size() == 6) at.resize(kANumAttrs, 0);
  TVM_FFI_ICHECK_EQ(at.size(), static_cast<size_t>(kANumAttrs)) << "bad attention attrs";
  int mask_mode = static_cast<int>(at[kAMask]);
  TVM_FFI_ICHECK_EQ(n, 5 + (mask_mode != kMaskNone)) << "attention: mask and attrs disagree";
  TensorView Q = args[0].cast<TensorView>(), K = args[1].cast<TensorView>();
  TensorView V = args[2].cast<TensorView>(), out = args[n - 1].cast<TensorView>();
  dt q_t = ActType(Q, "q"), k_t = ActType(K, "k"), v_t = ActType(V, "v");
  dt out_t = ActType(out, "out");
  int nd = static_cast<int>(Q.ndim());
  TVM_FFI_ICHECK(nd >= 2 && nd <= 4 && K.ndim() == nd && V.ndim() == nd && out.ndim() == nd)
      << "attention needs q, k, v and out of one rank in 2-4";
  bool trans_k = at[kATransK] != 0;
  int layout = static_cast<int>(at[kALayout]);
  TVM_FFI_ICHECK(layout == 0 || (nd == 4 && (!(layout & kSeqMajorK) || trans_k)))
      << "attention: sequence-major tensors need rank 4 (and k read transposed)";
  // (batch, seq, heads, d) given -> the logical (batch, heads, seq, d); a tensor holding more
  // heads than the attention's (kAHeads) contributes `heads` of them from its offset on.
  int64_t heads_attr = at[kAHeads];
  auto logical = [&](const TensorView& t, int bit, int64_t off) {
    memory::dims d = Dims(t);
    if (!(layout & bit)) {
      TVM_FFI_ICHECK(off == 0) << "attention: a head offset needs a sequence-major tensor";
      return d;
    }
    int64_t held = d[2];
    if (heads_attr) d[2] = heads_attr;
    TVM_FFI_ICHECK(off >= 0 && off + d[2] <= held) << "attention: heads out of the tensor";
    std::swap(d[1], d[2]);
    return d;
  };
  memory::dims q_dims = logical(Q, kSeqMajorQ, at[kAHeadOffQ]);
  memory::dims k_dims = logical(K, kSeqMajorK, at[kAHeadOffK]);
  memory::dims v_dims = logical(V, kSeqMajorV, at[kAHeadOffV]);
  memory::dims o_dims = logical(out, kSeqMajorOut, 0);
  int64_t M = q_dims[nd - 2], D = q_dims[nd - 1];
  int64_t N = trans_k ? k_dims[nd - 2] : k_dims[nd - 1];
  int64_t Dk = trans_k ? k_dims[nd - 1] : k_dims[nd - 2], Dv = v_dims[nd - 1];
  TVM_FFI_ICHECK(Dk == D && v_dims[nd - 2] == N && o_dims[nd - 2] == M && o_dims[nd - 1] == Dv)
      << "attention: q, k, v and out shapes do not agree";
  int64_t batch = 1;
  for (int i = 0; i < nd - 2; ++i) {
    TVM_FFI_ICHECK(q_dims[i] == k_dims[i] && q_dims[i] == v_dims[i] && q_dims[i] == o_dims[i])
        << "attention: batch dims must be equal";
    batch *= q_dims[i];
  }
  float scale;
  uint32_t bits = static_cast<uint32_t>(at[kAScaleBits]);
  std::memcpy(&scale, &bits, sizeof(scale));
  MaskView mask;
  if (mask_mode != kMaskNone) {
    float fill;
    uint32_t fbits = static_cast<uint32_t>(at[kAFillBits]);
    std::memcpy(&fill, &fbits, sizeof(fill));
    mask = MakeMaskView(args[3].cast<TensorView>(), mask_mode, fill,
                        memory::dims(q_dims.begin(), q_dims.end() - 2), M, N);
  }

  // Heads of a sequence-major tensor are interleaved along its rows.
  int64_t heads = nd == 4 ? q_dims[1] : 1;
  // heads a sequence-major tensor holds along its rows (more than `heads` for a fused q/k/v)
  int64_t held_q = layout & kSeqMajorQ ? Q.size(2) : heads;
  int64_t held_k = layout & kSeqMajorK ? K.size(2) : heads;
  int64_t held_v = layout & kSeqMajorV ? V.size(2) : heads;
  auto row_stride = [&](int bit, int64_t held, int64_t cols) {
    return layout & bit ? held * cols : cols;
  };
  AttnStrides ld{row_stride(kSeqMajorQ, held_q, D),
                 row_stride(kSeqMajorK, held_k, trans_k ? D : N),
                 row_stride(kSeqMajorV, held_v, Dv), row_stride(kSeqMajorOut, heads, Dv)};
  // Where matrix (batch, head) `bh` of a tensor starts, in elements: `rows` x `cols` each.
  auto start_of = [&](int bit, int64_t held, int64_t off, int64_t bh, int64_t rows,
                      int64_t cols) {
    if (!(layout & bit)) return bh * rows * cols;
    return (bh / heads * rows * held + off + bh % heads) * cols;
  };
  auto start = [&](int bit, int64_t bh, int64_t rows, int64_t cols) {
    switch (bit) {
      case kSeqMajorQ: return start_of(bit, held_q, at[kAHeadOffQ], bh, rows, cols);
      case kSeqMajorK: return start_of(bit, held_k, at[kAHeadOffK], bh, rows, cols);
      case kSeqMajorV: return start_of(bit, held_v, at[kAHeadOffV], bh, rows, cols);
      default: return start_of(bit, heads, 0, bh, rows, cols);
    }
  };

  std::lock_guard<std::mutex> lock(g_mu);
  ApplyThreads();
  Runtime& rt = GetRuntime();
  std::string key = MakeKey("attn", nullptr, at, {Dims(Q), Dims(K), Dims(V), Dims(out)}) +
                    TypesKey({q_t, k_t, v_t, out_t});
  auto it = g_attn_cache.find(key);
  std::shared_ptr<AttnEntry> e;
  if (it != g_attn_cache.end()) {
    e = it->second;
  } else {
    e = std::make_shared<AttnEntry>();
    e->cdt = at[kACompute] == kComputeBF16 ? dt::bf16 : dt::f32;
    int64_t per_row = N * (4 + static_cast<int64_t>(TypeSize(e->cdt)));
    int64_t rows = std::max<int64_t>(16, kAttnBlockBytes / per_row / 16 * 16);
    e->rows = std::min(rows, M);
    e->tail = M % e->rows;
    e->copies = AttnCopies(layout, M, N, e->cdt);
    AttnStrides in{e->copies & kSeqMajorQ ? D : ld.q, e->copies & kSeqMajorK ? D : ld.k,
                   e->copies & kSeqMajorV ? Dv : ld.v, e->copies & kSeqMajorOut ? Dv : ld.o};
    e->full = MakeAttnSteps(rt.eng, e->rows, N, D, Dv, trans_k, e->cdt, out_t, scale, ld, in,
                            e->copies);
    if (e->tail) {
      e->last = MakeAttnSteps(rt.eng, e->tail, N, D, Dv, trans_k, e->cdt, out_t, scale, ld, in,
                              e->copies);
    }
    e->pad_bytes = std::max(e->full.pad_bytes, e->tail ? e->last.pad_bytes : size_t{0});
    // A sequence-major k is (N, D) rows of one head ld.k apart (it is read transposed).
    e->k_md = memory::desc({N, D}, e->cdt, tag::ab);
    e->v_md = memory::desc({N, Dv}, e->cdt, tag::ab);
    if (e->copies & kSeqMajorK) {
      e->k_user_md = memory::desc({N, D}, e->cdt, memory::dims{ld.k, 1});
      e->k_in = dnnl::reorder(dnnl::reorder::primitive_desc(rt.eng, e->k_user_md, rt.eng, e->k_md));
    }
    if (e->copies & kSeqMajorV) {
      e->v_user_md = memory::desc({N, Dv}, e->cdt, memory::dims{ld.v, 1});
      e->v_in = dnnl::reorder(dnnl::reorder::primitive_desc(rt.eng, e->v_user_md, rt.eng, e->v_md));
    }
    // Operands in another type than the compute one are converted whole, once per call.
    // (whole tensors as given: a fused q/k/v is converted once, see `operand`)
    auto flat = [&](const TensorView& t, dt type) {
      int64_t last = t.size(t.ndim() - 1);
      return memory::desc({t.numel() / last, last}, type, tag::ab);
    };
    e->user_q_md = flat(Q, q_t);
    e->user_k_md = flat(K, k_t);
    e->user_v_md = flat(V, v_t);
    e->convert_q = q_t != e->cdt;
    e->convert_k = k_t != e->cdt;
    e->convert_v = v_t != e->cdt;
    if (e->convert_q) e->q_buf = memory(flat(Q, e->cdt), rt.eng);
    if (e->convert_k) e->k_buf = memory(flat(K, e->cdt), rt.eng);
    if (e->convert_v) e->v_buf = memory(flat(V, e->cdt), rt.eng);
    g_attn_cache[key] = e;
  }
  auto operand = [&](const TensorView& t, const memory::desc& md, bool convert,
                     memory& buf) -> char* {
    if (!convert) return static_cast<char*>(DataPtr(t));
    memory user(md, rt.eng, DataPtr(t));
    dnnl::reorder(user, buf).execute(rt.strm, user, buf);
    return static_cast<char*>(buf.get_data_handle());
  };
  // One tensor passed as q, k and v (a fused projection) is converted once.
  char* q = operand(Q, e->user_q_md, e->convert_q, e->q_buf);
  bool k_is_q = DataPtr(K) == DataPtr(Q) && k_t == q_t && e->user_k_md == e->user_q_md;
  char* k = k_is_q ? q : operand(K, e->user_k_md, e->convert_k, e->k_buf);
  bool v_is_q = DataPtr(V) == DataPtr(Q) && v_t == q_t && e->user_v_md == e->user_q_md;
  char* v = v_is_q ? q : operand(V, e->user_v_md, e->convert_v, e->v_buf);
  rt.strm.wait();  // the conversions are done before any thread reads their results
  char* o = static_cast<char*>(DataPtr(out));
  size_t cs = TypeSize(e->cdt), os = TypeSize(out_t);
  int64_t blocks = (M + e->rows - 1) / e->rows;
  int nthr = 1;
#ifdef _OPENMP
  nthr = std::max(1, static_cast<int>(std::min<int64_t>(omp_get_max_threads(), batch * blocks)));
#endif
  while (static_cast<int>(e->strms.size()) < nthr) {
    e->strms.emplace_back(rt.eng);
    e->scores.emplace_back(memory({{e->rows, N}, dt::f32, tag::ab}, rt.eng));
    e->probs.push_back(e->cdt == dt::f32 ? e->scores.back()
                                         : memory({{e->rows, N}, e->cdt, tag::ab}, rt.eng));
    e->pads.emplace_back(memory({{static_cast<int64_t>(std::max<size_t>(e->pad_bytes, 1))},
                                 dt::u8, tag::a}, rt.eng));
    e->panels.emplace_back(memory({{e->rows, std::max<int64_t>(e->full.panel_cols, 1)},
                                   dt::f32, tag::ab}, rt.eng));
    auto own = [&](bool seq_major, const memory::desc& md) {
      return seq_major ? memory(md, rt.eng) : memory();
    };
    e->qs.push_back(own(e->copies & kSeqMajorQ, e->full.q_md));
    e->ks.push_back(own(e->copies & kSeqMajorK, e->k_md));
    e->vs.push_back(own(e->copies & kSeqMajorV, e->v_md));
    e->os.push_back(own(e->copies & kSeqMajorOut, e->full.o_md));
  }
  e->kv_of.assign(e->strms.size(), -1);  // this call's k and v are not copied yet
  int copies = e->copies;
  // elements between two columns of k (keys) as the steps read it
  int64_t k_col = trans_k ? (copies & kSeqMajorK ? D : ld.k) : 1;
  auto work = [&](int ithr, int64_t unit) {
    int64_t b = unit / blocks, r0 = unit % blocks * e->rows;
    AttnSteps& st = std::min(e->rows, M - r0) == e->rows ? e->full : e->last;
    dnnl::stream& strm = e->strms[ithr];
    memory& pad = e->pads[ithr];
    memory qm(st.q_user_md, rt.eng, q + (start(kSeqMajorQ, b, M, D) + r0 * ld.q) * cs);
    memory vm(copies & kSeqMajorV ? e->v_user_md : st.v_md, rt.eng,
              v + start(kSeqMajorV, b, N, Dv) * cs);
    memory om(st.o_user_md, rt.eng, o + (start(kSeqMajorOut, b, M, Dv) + r0 * ld.o) * os);
    char* kh = k + (trans_k ? start(kSeqMajorK, b, N, D) : start(kSeqMajorK, b, D, N)) * cs;
    if (copies & kSeqMajorQ) {
      memory dense(st.q_md, rt.eng, e->qs[ithr].get_data_handle());
      st.q_in.execute(strm, qm, dense);
      qm = dense;
    }
    if (copies & (kSeqMajorK | kSeqMajorV) && e->kv_of[ithr] != b) {
      // A thread's blocks follow each other within a head: its k and v are copied once.
      if (copies & kSeqMajorK) {
        memory user(e->k_user_md, rt.eng, kh);
        e->k_in.execute(strm, user, e->ks[ithr]);
      }
      if (copies & kSeqMajorV) e->v_in.execute(strm, vm, e->vs[ithr]);
      e->kv_of[ithr] = b;
    }
    if (copies & kSeqMajorK) kh = static_cast<char*>(e->ks[ithr].get_data_handle());
    if (copies & kSeqMajorV) vm = memory(st.v_md, rt.eng, e->vs[ithr].get_data_handle());
    memory dense_out = copies & kSeqMajorOut
                           ? memory(st.o_md, rt.eng, e->os[ithr].get_data_handle()) : om;
    memory sm(st.s_md, rt.eng, e->scores[ithr].get_data_handle());
    memory pm(st.p_md, rt.eng, e->probs[ithr].get_data_handle());
    float* scores = static_cast<float*>(e->scores[ithr].get_data_handle());
    for (const AttnPanel& p : st.panels) {
      // Column col0 of the scores is row col0 of k: (col0, 0) read transposed, else (0, col0).
      memory km(p.k_md, rt.eng, kh + p.col0 * k_col * cs);
      if (!st.panel_cols) {
        p.qk.execute(strm, {{DNNL_ARG_SRC, qm}, {DNNL_ARG_WEIGHTS, km}, {DNNL_ARG_DST, sm},
                            {DNNL_ARG_SCRATCHPAD, pad}});
        continue;
      }
      memory panel(p.out_md, rt.eng, e->panels[ithr].get_data_handle());
      p.qk.execute(strm, {{DNNL_ARG_SRC, qm}, {DNNL_ARG_WEIGHTS, km}, {DNNL_ARG_DST, panel},
                          {DNNL_ARG_SCRATCHPAD, pad}});
      memory placed(p.cols_md, rt.eng, scores + p.col0);
      p.place.execute(strm, panel, placed);
    }
    if (mask.mode != kMaskNone) {
      strm.wait();
      mask.Apply(scores, b, r0,
                 std::min(e->rows, M - r0), N);
    }
    st.softmax.execute(strm, {{DNNL_ARG_SRC, sm}, {DNNL_ARG_DST, pm},
                              {DNNL_ARG_SCRATCHPAD, pad}});
    st.pv.execute(strm, {{DNNL_ARG_SRC, pm}, {DNNL_ARG_WEIGHTS, vm}, {DNNL_ARG_DST, dense_out},
                         {DNNL_ARG_SCRATCHPAD, pad}});
    if (copies & kSeqMajorOut) st.o_out.execute(strm, dense_out, om);
    strm.wait();
  };
  int64_t units = batch * blocks;
#ifdef _OPENMP
  if (nthr > 1) {
    // An exception may not leave a parallel region: the first one is rethrown after it.
    std::exception_ptr failed;
#pragma omp parallel num_threads(nthr)
    {
      int ithr = omp_get_thread_num();
      try {
        // Consecutive units: a thread's blocks share heads (and their copies of k and v).
        for (int64_t u = units * ithr / nthr; u < units * (ithr + 1) / nthr; ++u) work(ithr, u);
      } catch (...) {
#pragma omp critical
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
    return;
  }
#endif
  for (int64_t u = 0; u < units; ++u) work(0, u);
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed("tvmopt.onednn.conv2d", Conv2d)
      .def_packed("tvmopt.onednn.matmul", Matmul)
      .def_packed("tvmopt.onednn.qconv2d", QConv2d)
      .def_packed("tvmopt.onednn.qmatmul", QMatmul)
      .def_packed("tvmopt.onednn.batch_matmul", BatchMatmul)
      .def_packed("tvmopt.onednn.attention", Attention)
      .def("tvmopt.onednn.share_pool",
           [](const std::string& path) -> bool { return SharePool(path); })
      .def("tvmopt.onednn.uses_shared_pool",
           [](const std::string& path) -> bool { return UsesSharedPool(path); })
      .def("tvmopt.onednn.set_num_threads",
           [](int64_t n) {
             std::lock_guard<std::mutex> lock(g_mu);
             GetRuntime().num_threads = static_cast<int>(n);
           });
}

// ---------------------------------------------------------------------------------------
// Recurrent layers: ONNX LSTM / GRU / RNN on oneDNN's RNN primitives.
//
//   tvmopt.onednn.rnn(x, w_layer, w_iter, bias, [peephole], [h0], [c0], [seq_lens], attrs,
//                     y, y_h, [y_c])
//
// One call runs a whole ONNX node: the input projection of every step and both directions
// (one GEMM inside oneDNN), then the recurrence with the gate GEMM, bias, activations and cell
// update fused per step. Shapes are ONNX's time-major ones: x [T, B, I], h0 / c0 / y_h / y_c
// [D, B, H], y [T, D, B, H]. The weights arrive already in oneDNN's logical order (library/onednn/
// onednn.py rearranges the ONNX constants at compile time): w_layer [1, D, I, G, H] and
// w_iter [1, D, H, G, H] (ldigo), bias [1, D, Gb, H] (ldgo; lbr-GRU has a fourth gate row,
// the recurrent bias of the candidate), peephole [1, D, 3, H] (gates i, f, o). They are
// reordered into the primitive's packed layout once and cached by address, as the other calls
// do.
//
// sequence_lens: oneDNN has no per-sequence length, so unequal lengths run as a packed
// sequence (RunPacked): one call per span between distinct lengths, over the sequences still
// running. With every length equal to T this is one call.
namespace {

enum RnnAttr {
  kRnnCell, kRnnDirs, kRnnReverse, kRnnAct, kRnnHasPeephole, kRnnHasH0, kRnnHasC0,
  kRnnHasSeqLens, kRnnNumAttrs
};
enum RnnCell : int64_t { kCellLSTM = 0, kCellGRU = 1, kCellLbrGRU = 2, kCellVanilla = 3 };
// Vanilla RNN activation (kRnnAct).
enum RnnAct : int64_t { kRnnTanh = 0, kRnnRelu = 1, kRnnSigmoid = 2 };

struct RnnEntry {
  dnnl::primitive prim;
  memory w_layer, w_iter, bias, peephole;
  memory::desc src_layer_md, state_md, dst_layer_md;
  memory dst_layer_buf;  // bidirectional: oneDNN's [T, B, 2H], copied into ONNX's [T, 2, B, H]
  memory scratchpad;  // the entry's own, so that two entries may run at the same time
  std::vector<float> fingerprint;
};

std::mutex g_rnn_mu;
std::unordered_map<std::string, std::shared_ptr<RnnEntry>> g_rnn_cache;

std::shared_ptr<RnnEntry> CreateRnn(const std::vector<int64_t>& a, int64_t T, int64_t N,
                                    int64_t I, int64_t H, const float* wl, const float* wi,
                                    const float* b, const float* p, int64_t gates,
                                    int64_t bias_gates) {
  Runtime& rt = GetRuntime();
  auto e = std::make_shared<RnnEntry>();
  int64_t D = a[kRnnDirs];
  using dir = dnnl::rnn_direction;
  dir direction = D == 2 ? dir::bidirectional_concat
                         : (a[kRnnReverse] ? dir::unidirectional_right2left
                                           : dir::unidirectional_left2right);
  e->src_layer_md = memory::desc({T, N, I}, dt::f32, tag::tnc);
  e->state_md = memory::desc({1, D, N, H}, dt::f32, tag::ldnc);
  e->dst_layer_md = memory::desc({T, N, D * H}, dt::f32, tag::tnc);
  memory::desc wl_any({1, D, I, gates, H}, dt::f32, tag::any);
  memory::desc wi_any({1, D, H, gates, H}, dt::f32, tag::any);
  memory::desc b_md({1, D, bias_gates, H}, dt::f32, tag::ldgo);
  memory::desc p_md = p ? memory::desc({1, D, 3, H}, dt::f32, tag::ldgo) : memory::desc();
  auto inf = dnnl::prop_kind::forward_inference;
  const memory::desc& s = e->state_md;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::primitive_desc_base pd;
  switch (a[kRnnCell]) {
    case kCellLSTM: {
      auto d = dnnl::lstm_forward::primitive_desc(rt.eng, inf, direction, e->src_layer_md, s, s,
                                                  wl_any, wi_any, p_md, b_md, e->dst_layer_md,
                                                  s, s, attr);
      e->prim = dnnl::lstm_forward(d);
      pd = d;
      break;
    }
    case kCellGRU: {
      auto d = dnnl::gru_forward::primitive_desc(rt.eng, inf, direction, e->src_layer_md, s,
                                                 wl_any, wi_any, b_md, e->dst_layer_md, s, attr);
      e->prim = dnnl::gru_forward(d);
      pd = d;
      break;
    }
    case kCellLbrGRU: {
      auto d = dnnl::lbr_gru_forward::primitive_desc(rt.eng, inf, direction, e->src_layer_md,
                                                     s, wl_any, wi_any, b_md,
                                                     e->dst_layer_md, s, attr);
      e->prim = dnnl::lbr_gru_forward(d);
      pd = d;
      break;
    }
    case kCellVanilla: {
      dnnl::algorithm act = a[kRnnAct] == kRnnRelu      ? dnnl::algorithm::eltwise_relu
                            : a[kRnnAct] == kRnnSigmoid ? dnnl::algorithm::eltwise_logistic
                                                        : dnnl::algorithm::eltwise_tanh;
      auto d = dnnl::vanilla_rnn_forward::primitive_desc(rt.eng, inf, act, direction,
                                                         e->src_layer_md, s, wl_any, wi_any,
                                                         b_md, e->dst_layer_md, s, attr);
      e->prim = dnnl::vanilla_rnn_forward(d);
      pd = d;
      break;
    }
    default: TVM_FFI_THROW(ValueError) << "unknown recurrent cell " << a[kRnnCell];
  }
  auto reorder_in = [&](const float* src, const memory::desc& user_md,
                        const memory::desc& want) {
    memory user(user_md, rt.eng, const_cast<float*>(src));
    memory out(want, rt.eng);
    dnnl::reorder(user, out).execute(rt.strm, user, out);
    return out;
  };
  e->w_layer = reorder_in(wl, memory::desc({1, D, I, gates, H}, dt::f32, tag::ldigo),
                          pd.query_md(dnnl::query::weights_md, 0));
  e->w_iter = reorder_in(wi, memory::desc({1, D, H, gates, H}, dt::f32, tag::ldigo),
                         pd.query_md(dnnl::query::weights_md, 1));
  e->bias = reorder_in(b, b_md, b_md);
  if (p) e->peephole = reorder_in(p, p_md, p_md);
  rt.strm.wait();
  if (D == 2) e->dst_layer_buf = memory(e->dst_layer_md, rt.eng);
  e->scratchpad = memory(pd.scratchpad_desc(), rt.eng);
  return e;
}

// Run one entry on contiguous buffers: x [T, N, I], states [D, N, H] (null: zeros), y [T, D,
// N, H] (written through dst_layer_buf when bidirectional).
void RunRnn(RnnEntry* e, int64_t T, int64_t N, int64_t D, int64_t H, float* x, float* h0,
            float* c0, float* y, float* yh, float* yc, bool lstm, dnnl::stream* strm = nullptr) {
  Runtime& rt = GetRuntime();
  if (strm == nullptr) strm = &rt.strm;
  // The primitive always takes initial states: absent ones are zeros, as ONNX defines them.
  std::vector<float> zeros;
  if (h0 == nullptr || (lstm && c0 == nullptr)) {
    zeros.assign(D * N * H, 0.f);
    if (h0 == nullptr) h0 = zeros.data();
    if (c0 == nullptr) c0 = zeros.data();
  }
  std::unordered_map<int, memory> args;
  args[DNNL_ARG_SRC_LAYER] = memory(e->src_layer_md, rt.eng, x);
  args[DNNL_ARG_SRC_ITER] = memory(e->state_md, rt.eng, h0);
  if (lstm) args[DNNL_ARG_SRC_ITER_C] = memory(e->state_md, rt.eng, c0);
  args[DNNL_ARG_WEIGHTS_LAYER] = e->w_layer;
  args[DNNL_ARG_WEIGHTS_ITER] = e->w_iter;
  args[DNNL_ARG_BIAS] = e->bias;
  if (e->peephole) args[DNNL_ARG_WEIGHTS_PEEPHOLE] = e->peephole;
  args[DNNL_ARG_DST_LAYER] = D == 2 ? e->dst_layer_buf : memory(e->dst_layer_md, rt.eng, y);
  args[DNNL_ARG_DST_ITER] = memory(e->state_md, rt.eng, yh);
  if (lstm) args[DNNL_ARG_DST_ITER_C] = memory(e->state_md, rt.eng, yc);
  args[DNNL_ARG_SCRATCHPAD] = e->scratchpad;
  e->prim.execute(*strm, args);
  strm->wait();
  if (D == 2) {
    const float* buf = static_cast<const float*>(e->dst_layer_buf.get_data_handle());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < 2; ++d)
        for (int64_t n = 0; n < N; ++n)
          std::memcpy(y + ((t * 2 + d) * N + n) * H, buf + (t * N + n) * 2 * H + d * H,
                      H * sizeof(float));
  }
}

// The unidirectional primitive of direction `d` of a node with D directions (its slice of the
// weights), running right to left when `reverse`, over `steps` steps of `batch` sequences.
// Called with g_rnn_mu held, outside any parallel region (the cache is shared).
std::shared_ptr<RnnEntry> DirectionEntry(const std::vector<int64_t>& a, int64_t D, int64_t d,
                                         bool reverse, int64_t steps, int64_t batch, int64_t I,
                                         int64_t H, int64_t gates, int64_t bias_gates,
                                         const float* wl, const float* wi, const float* bp,
                                         const float* pp, int64_t wl_numel) {
  std::vector<int64_t> ua = a;
  ua[kRnnDirs] = 1;
  ua[kRnnReverse] = reverse;
  const float* dwl = wl + d * I * gates * H;
  const float* dwi = wi + d * H * gates * H;
  const float* dbp = bp + d * bias_gates * H;
  const float* dpp = pp ? pp + d * 3 * H : nullptr;
  std::string key = MakeKey("rnn_dir", dwl, ua, {{steps, batch, I, H}, {gates, bias_gates},
                                                 {reinterpret_cast<int64_t>(dwi),
                                                  reinterpret_cast<int64_t>(dbp),
                                                  reinterpret_cast<int64_t>(dpp)}});
  return Cached(&g_rnn_cache, key, dwl, wl_numel / D, [&] {
    return CreateRnn(ua, steps, batch, I, H, dwl, dwi, dbp, dpp, gates, bias_gates);
  });
}

#ifdef _OPENMP
// A bidirectional node as two unidirectional primitives run at the same time, one per thread
// (oneDNN runs single-threaded inside a parallel region): the two directions are independent,
// and at small batches each step's GEMM is too small to share between threads without a
// barrier per step. Called with g_rnn_mu held.
void RunDirectionsApart(const std::vector<int64_t>& a, int64_t T, int64_t N, int64_t I,
                        int64_t H, int64_t gates, int64_t bias_gates, const float* wl,
                        const float* wi, const float* bp, const float* pp, int64_t wl_numel,
                        float* x, float* h0, float* c0, float* y, float* yh, float* yc,
                        bool lstm) {
  static dnnl::stream* streams[2] = {new dnnl::stream(GetRuntime().eng),
                                     new dnnl::stream(GetRuntime().eng)};
  std::shared_ptr<RnnEntry> ed[2];
  for (int d = 0; d < 2; ++d)
    ed[d] = DirectionEntry(a, 2, d, d != 0, T, N, I, H, gates, bias_gates, wl, wi, bp, pp,
                           wl_numel);
  std::vector<float> yd[2] = {std::vector<float>(T * N * H), std::vector<float>(T * N * H)};
#pragma omp parallel num_threads(2)
  {
    int d = omp_get_thread_num();
    RunRnn(ed[d].get(), T, N, 1, H, x, h0 ? h0 + d * N * H : nullptr,
           c0 ? c0 + d * N * H : nullptr, yd[d].data(), yh + d * N * H,
           yc ? yc + d * N * H : nullptr, lstm, streams[d]);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int d = 0; d < 2; ++d)
      std::memcpy(y + (t * 2 + d) * N * H, yd[d].data() + t * N * H, N * H * sizeof(float));
}
#endif

// Unequal sequence_lens, run as a packed sequence is: per direction, the sequences sorted
// longest first; the steps between two consecutive distinct lengths run as one call over the
// sequences still running (a prefix of that order), from the states the previous span ended
// in, so every step is one batched GEMM over all the sequences that have it (grouping equal
// lengths instead ran each short group as its own narrow call over all its steps). A sequence
// that ends with a span takes that span's final states as its own; a reverse direction runs
// forward over each sequence reversed within its own length, so it starts at the sequence's
// own last step, as ONNX defines. Rows past a sequence's end are zero, and a sequence of no
// steps has zero final states, as onnxruntime gives them. The two directions of a
// bidirectional node run at the same time, one per thread, where there are two. Called with
// g_rnn_mu held.
void RunPacked(const std::vector<int64_t>& a, const std::vector<int64_t>& lens, int64_t T,
               int64_t N, int64_t D, int64_t I, int64_t H, int64_t gates, int64_t bias_gates,
               const float* wl, const float* wi, const float* bp, const float* pp,
               int64_t wl_numel, const float* x, const float* h0, const float* c0, float* y,
               float* yh, float* yc, bool lstm) {
  std::vector<int64_t> order(N);
  for (int64_t b = 0; b < N; ++b) order[b] = b;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t p, int64_t q) { return lens[p] > lens[q]; });
  std::vector<int64_t> ends;  // distinct positive lengths, ascending
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    if (lens[*it] > 0 && (ends.empty() || ends.back() != lens[*it])) ends.push_back(lens[*it]);
  auto running = [&](int64_t step_end) {  // sequences with at least step_end steps
    int64_t nb = 0;
    while (nb < N && lens[order[nb]] >= step_end) ++nb;
    return nb;
  };
  // The entries first, outside any parallel region (the cache is shared).
  std::vector<std::vector<std::shared_ptr<RnnEntry>>> entries(D);
  for (int64_t d = 0; d < D; ++d) {
    int64_t t0 = 0;
    for (int64_t t1 : ends) {
      // reversed inputs run left to right
      entries[d].push_back(DirectionEntry(a, D, d, false, t1 - t0, running(t1), I, H, gates,
                                          bias_gates, wl, wi, bp, pp, wl_numel));
      t0 = t1;
    }
  }
  std::memset(y, 0, sizeof(float) * T * D * N * H);
  auto direction = [&](int64_t d, dnnl::stream* strm) {
    bool rev = D == 2 ? d == 1 : a[kRnnReverse] != 0;
    // States by position in `order`.
    std::vector<float> h(N * H, 0.f), c(N * H, 0.f), oh(N * H), oc(N * H);
    for (int64_t j = 0; j < N; ++j) {
      if (h0) std::memcpy(&h[j * H], h0 + (d * N + order[j]) * H, H * sizeof(float));
      if (c0) std::memcpy(&c[j * H], c0 + (d * N + order[j]) * H, H * sizeof(float));
    }
    int64_t t0 = 0;
    for (size_t k = 0; k < ends.size(); ++k) {
      int64_t t1 = ends[k], steps = t1 - t0, nb = running(t1);
      auto at = [&](int64_t t, int64_t j) { return rev ? lens[order[j]] - 1 - t : t; };
      std::vector<float> gx(steps * nb * I), gy(steps * nb * H);
      for (int64_t s = 0; s < steps; ++s)
        for (int64_t j = 0; j < nb; ++j)
          std::memcpy(&gx[(s * nb + j) * I], x + (at(t0 + s, j) * N + order[j]) * I,
                      I * sizeof(float));
      RunRnn(entries[d][k].get(), steps, nb, 1, H, gx.data(), h.data(),
             lstm ? c.data() : nullptr, gy.data(), oh.data(), lstm ? oc.data() : nullptr, lstm,
             strm);
      for (int64_t s = 0; s < steps; ++s)
        for (int64_t j = 0; j < nb; ++j)
          std::memcpy(y + ((at(t0 + s, j) * D + d) * N + order[j]) * H, &gy[(s * nb + j) * H],
                      H * sizeof(float));
      std::memcpy(h.data(), oh.data(), nb * H * sizeof(float));
      if (lstm) std::memcpy(c.data(), oc.data(), nb * H * sizeof(float));
      t0 = t1;
    }
    for (int64_t j = 0; j < N; ++j) {
      bool empty = lens[order[j]] == 0;
      float* dh = yh + (d * N + order[j]) * H;
      if (empty) std::fill(dh, dh + H, 0.f); else std::memcpy(dh, &h[j * H], H * sizeof(float));
      if (yc) {
        float* dc = yc + (d * N + order[j]) * H;
        if (empty) std::fill(dc, dc + H, 0.f); else std::memcpy(dc, &c[j * H], H * sizeof(float));
      }
    }
  };
#ifdef _OPENMP
  int team = GetRuntime().num_threads > 0 ? GetRuntime().num_threads : omp_get_max_threads();
  const char* split_env = std::getenv("TVMOPT_RNN_SPLIT_DIRECTIONS");
  if (D == 2 && team >= 2 && (split_env == nullptr || std::atoi(split_env) != 0)) {
    static dnnl::stream* streams[2] = {new dnnl::stream(GetRuntime().eng),
                                       new dnnl::stream(GetRuntime().eng)};
#pragma omp parallel num_threads(2)
    direction(omp_get_thread_num(), streams[omp_get_thread_num()]);
    return;
  }
#endif
  for (int64_t d = 0; d < D; ++d) direction(d, nullptr);
}

void Rnn(PackedArgs args, tvm::ffi::Any* rv) {
  ApplyThreads();
  int n = args.size();
  TVM_FFI_ICHECK_GE(n, 7) << "tvmopt.onednn.rnn: too few arguments";
  // The attrs sit before the outputs; y_c is present exactly for LSTM.
  std::vector<int64_t> a;
  int attrs_at = -1;
  for (int i = 4; i < n; ++i) {
    if (args[i].try_cast<Shape>().has_value()) {
      attrs_at = i;
      break;
    }
  }
  TVM_FFI_ICHECK_GE(attrs_at, 0) << "tvmopt.onednn.rnn: no attrs argument";
  a = ReadAttrs(args[attrs_at]);
  TVM_FFI_ICHECK_EQ(a.size(), static_cast<size_t>(kRnnNumAttrs)) << "rnn attrs size";
  bool lstm = a[kRnnCell] == kCellLSTM;
  int k = 0;
  TensorView X = args[k++].cast<TensorView>();
  TensorView WL = args[k++].cast<TensorView>();
  TensorView WI = args[k++].cast<TensorView>();
  TensorView B = args[k++].cast<TensorView>();
  std::optional<TensorView> P, H0, C0, L;
  if (a[kRnnHasPeephole]) P = args[k++].cast<TensorView>();
  if (a[kRnnHasH0]) H0 = args[k++].cast<TensorView>();
  if (a[kRnnHasC0]) C0 = args[k++].cast<TensorView>();
  if (a[kRnnHasSeqLens]) L = args[k++].cast<TensorView>();
  TVM_FFI_ICHECK_EQ(k, attrs_at) << "tvmopt.onednn.rnn: arguments do not match attrs";
  TensorView Y = args[attrs_at + 1].cast<TensorView>();
  TensorView YH = args[attrs_at + 2].cast<TensorView>();
  std::optional<TensorView> YC;
  if (lstm) YC = args[attrs_at + 3].cast<TensorView>();
  for (auto* t : {&X, &WL, &WI, &B, &Y, &YH}) CheckF32Contig(*t, "rnn operand");
  int64_t T = X.shape()[0], N = X.shape()[1], I = X.shape()[2];
  int64_t D = a[kRnnDirs];
  int64_t H = WI.shape()[2];
  int64_t gates = WI.shape()[3], bias_gates = B.shape()[2];
  const float* wl = static_cast<const float*>(DataPtr(WL));
  const float* wi = static_cast<const float*>(DataPtr(WI));
  const float* bp = static_cast<const float*>(DataPtr(B));
  const float* pp = P ? static_cast<const float*>(DataPtr(*P)) : nullptr;
  float* x = static_cast<float*>(DataPtr(X));
  float* h0 = H0 ? static_cast<float*>(DataPtr(*H0)) : nullptr;
  float* c0 = C0 ? static_cast<float*>(DataPtr(*C0)) : nullptr;
  float* y = static_cast<float*>(DataPtr(Y));
  float* yh = static_cast<float*>(DataPtr(YH));
  float* yc = YC ? static_cast<float*>(DataPtr(*YC)) : nullptr;

  auto entry = [&](int64_t steps, int64_t batch) {
    std::string key = MakeKey("rnn", wl, a, {{steps, batch, I, H}, {gates, bias_gates},
                                             {reinterpret_cast<int64_t>(wi),
                                              reinterpret_cast<int64_t>(bp),
                                              reinterpret_cast<int64_t>(pp)}});
    return Cached(&g_rnn_cache, key, wl, WL.numel(), [&] {
      return CreateRnn(a, steps, batch, I, H, wl, wi, bp, pp, gates, bias_gates);
    });
  };

  // Lengths per batch entry (all T without sequence_lens).
  std::vector<int64_t> lens(N, T);
  if (L) {
    TVM_FFI_ICHECK(L->dtype().code == kDLInt && (L->dtype().bits == 32 || L->dtype().bits == 64))
        << "sequence_lens must be int32 or int64";
    for (int64_t b = 0; b < N; ++b) {
      int64_t v = L->dtype().bits == 32 ? static_cast<const int32_t*>(DataPtr(*L))[b]
                                        : static_cast<const int64_t*>(DataPtr(*L))[b];
      TVM_FFI_ICHECK(v >= 0 && v <= T)
          << "sequence_lens[" << b << "] = " << v << " is outside [0, " << T << "]";
      lens[b] = v;
    }
  }
  std::lock_guard<std::mutex> lock(g_rnn_mu);
  if (std::all_of(lens.begin(), lens.end(), [T](int64_t v) { return v == T; })) {
#ifdef _OPENMP
    int team = GetRuntime().num_threads > 0 ? GetRuntime().num_threads : omp_get_max_threads();
    const char* split_env = std::getenv("TVMOPT_RNN_SPLIT_DIRECTIONS");
    bool split = D == 2 && team >= 2 && (split_env == nullptr || std::atoi(split_env) != 0);
    if (split) {
      RunDirectionsApart(a, T, N, I, H, gates, bias_gates, wl, wi, bp, pp, WL.numel(), x, h0, c0,
                         y, yh, yc, lstm);
      return;
    }
#endif
    auto e = entry(T, N);
    RunRnn(e.get(), T, N, D, H, x, h0, c0, y, yh, yc, lstm);
    return;
  }
  RunPacked(a, lens, T, N, D, I, H, gates, bias_gates, wl, wi, bp, pp, WL.numel(), x, h0, c0, y,
            yh, yc, lstm);
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  tvm::ffi::reflection::GlobalDef().def_packed("tvmopt.onednn.rnn", Rnn);
}
