// The CPU stand-in for cuDNN's fused attention, as an XLA FFI custom call.
//
// Why C++: te_on_cpu used to lower TE's fused-attention primitives to the pure-JAX blockwise
// kernel (tutorial_utils.reference, bounds mode). That kernel is correct, but every call site
// inlines its whole loop nest into the program, so XLA spends most of a test's time compiling
// it, once per call site (a Ring step, a backward, a layer). A custom call compiles to one
// instruction, as cuDNN's does on a GPU, and runs the same maths with plain loops.
//
// Semantics are those of the JAX kernel in bounds mode (tests/te_on_cpu/test_cpu_kernel.py
// compares the two, NaN cases included):
//   * query row i of batch b sees key rows lo[b,i]..hi[b,i] (inclusive; lo > hi: none);
//   * logits scale * q.k in float32; softmax over the visible keys plus an optional sink
//     logit per query head; GQA: query head h reads KV head h / (Hq / Hkv);
//   * a row that sees no key gives output 0, LSE = -1e30, and gradient 0;
//   * a NaN/Inf in a visible pair's logit, or in a visible key's value, makes the row's output
//     and LSE NaN; non-finite values outside what a row sees never reach it;
//   * backward takes the forward's output and LSE (D = rowsum(dO * O), P = exp(S - LSE)),
//     zeroes non-finite q/k/v/dO inside the products, and makes dV of a key NaN when a row
//     that sees it has a non-finite dO.
// All buffers are float32 (or int32 for the ranges); dtype casts happen in JAX around the call.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr float kLseEmpty = -1.0e30f;
constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

inline float Dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// A copy of x (rows of width n) with non-finite entries set to 0, each row zero padded to
// `stride` floats, and per row whether it had a non-finite entry.
void Clean(const float* x, int64_t rows, int64_t n, int64_t stride, std::vector<float>* out,
           std::vector<uint8_t>* bad) {
  out->assign(rows * stride, 0.0f);
  if (bad) bad->assign(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < n; ++d) {
      float v = x[r * n + d];
      bool ok = std::isfinite(v);
      (*out)[r * stride + d] = ok ? v : 0.0f;
      if (!ok && bad) (*bad)[r] = 1;
    }
  }
}

// Runs fn(task, worker) for every task in [0, tasks), on the calling thread and on helpers
// scheduled on XLA's own intra-op thread pool (so the kernel never oversubscribes the cores
// XLA is using). `worker` is a participant's index, < Workers(pool): per-worker scratch.
// The caller does whatever work helpers have not taken and waits only for helpers that started;
// a helper that starts after the end finds the shared state closed and touches nothing else.
struct Participation {
  std::atomic<int64_t> next{0}, ids{1}, active{0};
  std::atomic<bool> closed{false};
  std::mutex mu;
  std::condition_variable done;
};

inline int64_t Workers(const ffi::ThreadPool& pool) {
  int64_t threads = pool.num_threads();  // the caller is usually one of them
  if (const char* env = std::getenv("TUTORIAL_CPU_KERNEL_THREADS")) threads = std::atoll(env);
  return std::max<int64_t>(1, threads);
}

template <typename Fn>
void ParallelFor(ffi::ThreadPool pool, int64_t tasks, int64_t workers, Fn fn) {
  workers = std::max<int64_t>(1, std::min<int64_t>(workers, tasks));
  auto state = std::make_shared<Participation>();
  auto work = [state, tasks, &fn](int64_t worker) {
    for (int64_t t; (t = state->next.fetch_add(1)) < tasks;) fn(t, worker);
  };
  for (int64_t w = 1; w < workers; ++w)
    pool.Schedule([state, work] {
      state->active.fetch_add(1);
      if (!state->closed.load()) work(state->ids.fetch_add(1));
      if (state->active.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->done.notify_all();
      }
    });
  work(0);
  state->closed.store(true);
  std::unique_lock<std::mutex> lock(state->mu);
  state->done.wait(lock, [&] { return state->active.load() == 0; });
}

struct Dims {
  int64_t b, sq, skv, hq, hkv, g, d, dv;
};

// The problem's sizes from q [b, sq, hq, d], k [b, skv, hkv, d] and v [b, skv, hkv, dv].
ffi::Error ReadDims(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& k, const ffi::Buffer<ffi::F32>& v,
                    Dims* x) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4)
    return ffi::Error::InvalidArgument("cpu attention kernel: q, k, v must be [b, s, h, d]");
  *x = Dims{qd[0], qd[1], kd[1], qd[2], kd[2], 0, qd[3], vd[3]};
  if (kd[3] != x->d || vd[1] != x->skv)
    return ffi::Error::InvalidArgument("cpu attention kernel: q and k need one head_dim, k and v one length");
  if (x->hkv <= 0 || x->hq % x->hkv != 0)
    return ffi::Error::InvalidArgument("cpu attention kernel: query heads must be a multiple of KV heads");
  x->g = x->hq / x->hkv;
  return ffi::Error::Success();
}

// The clamped key range of one row, [a, e) in half-open form (e == a: the row sees nothing).
inline void Range(const int32_t* lo, const int32_t* hi, int64_t row, int64_t skv, int64_t* a, int64_t* e) {
  *a = std::max<int64_t>(lo[row], 0);
  *e = std::min<int64_t>(static_cast<int64_t>(hi[row]) + 1, skv);
  if (*e < *a) *e = *a;
}

constexpr int64_t kLanes = 16;  // floats per vector in the score products

inline int64_t Padded(int64_t s) { return (s + kLanes - 1) / kLanes * kLanes; }

// x [b, s, h, n] -> per (b, h) an [n, Padded(s)] block (zero padded): products over keys then
// run along contiguous memory, whole vectors at a time.
std::vector<float> Transpose(const float* x, int64_t b, int64_t s, int64_t h, int64_t n, int64_t src_stride) {
  const int64_t sp = Padded(s);
  std::vector<float> t(b * h * n * sp, 0.0f);
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t j = 0; j < s; ++j)
      for (int64_t hh = 0; hh < h; ++hh) {
        const float* src = x + ((bb * s + j) * h + hh) * src_stride;
        float* dst = t.data() + (bb * h + hh) * n * sp + j;
        for (int64_t d = 0; d < n; ++d) dst[d * sp] = src[d];
      }
  return t;
}

// exp(x) in float32 that the compiler can vectorize (std::exp is a scalar call): Cephes' expf
// polynomial on x = n ln2 + r, |r| <= ln2 / 2, about 1 ulp. exp(-inf) and anything below
// float's normal range give exactly 0, +inf gives +inf, NaN stays NaN.
inline float FastExp(float x) {
  constexpr float kHi = 88.3762626647949f, kLo = -87.3365447504f;
  float xc = x < kLo ? kLo : x;
  xc = xc > kHi ? kHi : xc;
  const float t = xc * 1.44269504088896341f;
  const int32_t n = static_cast<int32_t>(t + (t >= 0.0f ? 0.5f : -0.5f));  // round half away (no libm call)
  const float fx = static_cast<float>(n);
  float r = xc - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t bits = (n + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  float res = y * pow2n;
  res = x < kLo ? 0.0f : res;
  res = x > kHi ? kInf : res;
  return x != x ? x : res;
}

inline float NanMax(float a, float b) { return (std::isnan(a) || std::isnan(b)) ? kNaN : std::max(a, b); }

constexpr int64_t kRows = 4;    // query rows per tile
constexpr int64_t kKeys = 64;   // keys per chunk

typedef float V16 __attribute__((vector_size(kLanes * sizeof(float))));

// S[r][0:n] = q_r . kt[:, c0:c0+n] for the tile's rows (kt is [d, stride], zero padded past
// the keys). Four rows share each loaded vector of keys; the accumulators stay in registers.
inline void Scores(const float* const* qr, int64_t rows, const float* kt, int64_t stride, int64_t d, int64_t c0,
                   int64_t n, float (*S)[kKeys]) {
  static_assert(kRows == 4 && kKeys % kLanes == 0, "Scores is written for 4 rows and whole vectors");
  const float* q0 = qr[0];
  const float* q1 = rows > 1 ? qr[1] : q0;
  const float* q2 = rows > 2 ? qr[2] : q0;
  const float* q3 = rows > 3 ? qr[3] : q0;
  for (int64_t j0 = 0; j0 < n; j0 += kLanes) {
    V16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    const float* kp = kt + c0 + j0;
    for (int64_t dd = 0; dd < d; ++dd) {
      V16 kv;
      std::memcpy(&kv, kp + dd * stride, sizeof kv);
      a0 += q0[dd] * kv;
      a1 += q1[dd] * kv;
      a2 += q2[dd] * kv;
      a3 += q3[dd] * kv;
    }
    const V16* acc[kRows] = {&a0, &a1, &a2, &a3};
    for (int64_t r = 0; r < rows; ++r) std::memcpy(S[r] + j0, acc[r], sizeof(V16));
  }
}

// out_r[0:np] += sum_jj W[r][jj] * M_jj[0:np] for the tile's rows, M_jj = m + jj * key_stride
// (rows of np floats, np a whole number of vectors): P.V in the forward, dS.K in the backward.
inline void AccumRows(const float (*W)[kKeys], int64_t rows, int64_t n, const float* m, int64_t key_stride,
                      int64_t np, float* const* outr) {
  for (int64_t d0 = 0; d0 < np; d0 += kLanes) {
    V16 a[kRows] = {};
    for (int64_t r = 0; r < rows; ++r) std::memcpy(&a[r], outr[r] + d0, sizeof(V16));
    for (int64_t jj = 0; jj < n; ++jj) {
      V16 mv;
      std::memcpy(&mv, m + jj * key_stride + d0, sizeof mv);
      a[0] += W[0][jj] * mv;
      a[1] += W[1][jj] * mv;
      a[2] += W[2][jj] * mv;
      a[3] += W[3][jj] * mv;
    }
    for (int64_t r = 0; r < rows; ++r) std::memcpy(outr[r] + d0, &a[r], sizeof(V16));
  }
}

// out_jj[0:np] += sum_r W[r][jj] * X_r[0:np] for the chunk's keys: dS^T.Q and P^T.dO.
inline void AccumKeys(const float (*W)[kKeys], int64_t rows, int64_t n, const float* const* xr, float* out,
                      int64_t key_stride, int64_t np) {
  for (int64_t jj = 0; jj < n; ++jj) {
    float* o = out + jj * key_stride;
    for (int64_t d0 = 0; d0 < np; d0 += kLanes) {
      V16 acc;
      std::memcpy(&acc, o + d0, sizeof acc);
      for (int64_t r = 0; r < rows; ++r) {
        V16 xv;
        std::memcpy(&xv, xr[r] + d0, sizeof xv);
        acc += W[r][jj] * xv;
      }
      std::memcpy(o + d0, &acc, sizeof acc);
    }
  }
}

ffi::Error FwdImpl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                   ffi::Buffer<ffi::S32> lo, ffi::Buffer<ffi::S32> hi, ffi::Buffer<ffi::F32> sink,
                   ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse,
                   ffi::ResultBuffer<ffi::F32> mx, float scale, int32_t use_sink, ffi::ThreadPool pool) {
  Dims x;
  if (auto err = ReadDims(q, k, v, &x); err.failure()) return err;
  const float* Q = q.typed_data();
  const int32_t* LO = lo.typed_data();
  const int32_t* HI = hi.typed_data();
  const float* SINK = sink.typed_data();
  float* O = out->typed_data();
  float* L = lse->typed_data();
  float* M = mx->typed_data();
  // logits use the raw keys (a NaN there reaches exactly the rows that see it); values are
  // cleaned, and a row that sees a non-finite value is marked NaN at the end instead
  const int64_t dvp = Padded(x.dv), skp = Padded(x.skv);
  std::vector<float> kt = Transpose(k.typed_data(), x.b, x.skv, x.hkv, x.d, x.d);
  std::vector<float> vclean;
  std::vector<uint8_t> vbad;  // [b, skv, hkv]
  Clean(v.typed_data(), x.b * x.skv * x.hkv, x.dv, dvp, &vclean, &vbad);
  const float* V = vclean.data();

  const int64_t tiles = (x.sq + kRows - 1) / kRows;
  ParallelFor(pool, x.b * x.hq * tiles, Workers(pool), [&](int64_t task, int64_t) {
    const int64_t tile = task % tiles, bh = task / tiles;
    const int64_t b = bh / x.hq, h = bh % x.hq, hk = h / x.g;
    const int64_t i0 = tile * kRows, rows = std::min(kRows, x.sq - i0);
    const float* ktb = kt.data() + (b * x.hkv + hk) * x.d * skp;
    const float* qr[kRows];
    int64_t a[kRows], e[kRows];
    float m[kRows], l[kRows], rowmax[kRows];
    bool poisoned[kRows];
    std::vector<float> acc(kRows * dvp, 0.0f);
    float* accr[kRows];
    int64_t A = x.skv, E = 0;
    for (int64_t r = 0; r < rows; ++r) {
      qr[r] = Q + ((b * x.sq + i0 + r) * x.hq + h) * x.d;
      accr[r] = acc.data() + r * dvp;
      Range(LO, HI, b * x.sq + i0 + r, x.skv, &a[r], &e[r]);
      if (e[r] > a[r]) A = std::min(A, a[r]), E = std::max(E, e[r]);
      m[r] = use_sink ? SINK[h] : -kInf;
      l[r] = use_sink ? 1.0f : 0.0f;
      rowmax[r] = -kInf;
      poisoned[r] = false;
    }
    float S[kRows][kKeys] = {};
    for (int64_t c0 = A / kLanes * kLanes; c0 < E; c0 += kKeys) {  // whole vectors of keys from an aligned start
      const int64_t n = std::min(kKeys, E - c0);
      Scores(qr, rows, ktb, skp, x.d, c0, n, S);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t ja = std::max(a[r], c0) - c0, je = std::min(e[r], c0 + n) - c0;
        float* sr = S[r];
        if (je <= ja) {  // nothing visible in this chunk: the online update is the identity
          std::fill(sr, sr + n, 0.0f);
          continue;
        }
        float cmax = -kInf;
        for (int64_t jj = ja; jj < je; ++jj) {
          sr[jj] *= scale;
          cmax = NanMax(cmax, sr[jj]);
          poisoned[r] |= vbad[(b * x.skv + c0 + jj) * x.hkv + hk] != 0;
        }
        rowmax[r] = NanMax(rowmax[r], cmax);
        const float m_new = NanMax(m[r], cmax);
        const float m_safe = std::isfinite(m_new) ? m_new : 0.0f;
        const float alpha = std::exp(m[r] - m_safe);
        float psum = 0.0f;
#pragma omp simd reduction(+ : psum)
        for (int64_t jj = ja; jj < je; ++jj) {
          sr[jj] = FastExp(sr[jj] - m_safe);
          psum += sr[jj];
        }
        std::fill(sr, sr + ja, 0.0f);
        std::fill(sr + je, sr + n, 0.0f);
        l[r] = l[r] * alpha + psum;
        for (int64_t dd = 0; dd < dvp; ++dd) accr[r][dd] *= alpha;
        m[r] = m_new;
      }
      AccumRows(S, rows, n, V + ((b * x.skv + c0) * x.hkv + hk) * dvp, x.hkv * dvp, dvp, accr);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r, stat = (b * x.hq + h) * x.sq + i;
      float* oi = O + ((b * x.sq + i) * x.hq + h) * x.dv;
      M[stat] = rowmax[r];
      if (e[r] == a[r]) {  // sees no key
        std::fill(oi, oi + x.dv, 0.0f);
        L[stat] = kLseEmpty;
        continue;
      }
      const float m_fin = std::isfinite(m[r]) ? m[r] : 0.0f;
      const float poison = poisoned[r] ? kNaN : 0.0f;
      for (int64_t dd = 0; dd < x.dv; ++dd) oi[dd] = accr[r][dd] / l[r] + poison;
      L[stat] = m_fin + std::log(l[r]) + poison;
    }
  });
  return ffi::Error::Success();
}

ffi::Error BwdImpl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                   ffi::Buffer<ffi::S32> lo, ffi::Buffer<ffi::S32> hi, ffi::Buffer<ffi::F32> out,
                   ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> dout, ffi::Buffer<ffi::F32> sink,
                   ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                   ffi::ResultBuffer<ffi::F32> dv, ffi::ResultBuffer<ffi::F32> dsink, float scale,
                   int32_t use_sink, ffi::ThreadPool pool) {
  Dims x;
  if (auto err = ReadDims(q, k, v, &x); err.failure()) return err;
  const int32_t* LO = lo.typed_data();
  const int32_t* HI = hi.typed_data();
  const float* OUT = out.typed_data();
  const float* LSE = lse.typed_data();
  const float* DO_RAW = dout.typed_data();
  const float* SINK = sink.typed_data();
  const int64_t dp = Padded(x.d), dvp = Padded(x.dv), skp = Padded(x.skv);
  std::vector<float> qc, kc, vc, doc;
  std::vector<uint8_t> dobad;  // [b, sq, hq]: the row's dO has a NaN/Inf
  Clean(q.typed_data(), x.b * x.sq * x.hq, x.d, dp, &qc, nullptr);
  Clean(k.typed_data(), x.b * x.skv * x.hkv, x.d, dp, &kc, nullptr);
  Clean(v.typed_data(), x.b * x.skv * x.hkv, x.dv, dvp, &vc, nullptr);
  Clean(DO_RAW, x.b * x.sq * x.hq, x.dv, dvp, &doc, &dobad);
  std::vector<float> kt = Transpose(kc.data(), x.b, x.skv, x.hkv, x.d, dp);
  std::vector<float> vt = Transpose(vc.data(), x.b, x.skv, x.hkv, x.dv, dvp);
  // dterm = -rowsum(dO * O), from the raw values: a NaN there reaches the row's gradients
  std::vector<float> dterm(x.b * x.sq * x.hq);
  for (int64_t r = 0; r < x.b * x.sq * x.hq; ++r) dterm[r] = -Dot(DO_RAW + r * x.dv, OUT + r * x.dv, x.dv);
  const int64_t nq = x.b * x.sq * x.hq * dp;
  std::vector<float> dkp(x.b * x.skv * x.hkv * dp, 0.0f), dvpad(x.b * x.skv * x.hkv * dvp, 0.0f);

  // one task per (batch, KV head, chunk of keys): it owns those keys' dK/dV; dQ gathers
  // contributions from many chunks, so each worker adds into its own copy, summed at the end
  const int64_t chunks = (x.skv + kKeys - 1) / kKeys;
  const int64_t tasks = x.b * x.hkv * chunks;
  const int64_t workers = std::max<int64_t>(1, std::min(Workers(pool), tasks));
  std::vector<std::vector<float>> dq_parts(workers);
  ParallelFor(pool, tasks, workers, [&](int64_t task, int64_t worker) {
    std::vector<float>& dqw = dq_parts[worker];
    if (dqw.empty()) dqw.assign(nq, 0.0f);
    const int64_t chunk = task % chunks, bk = task / chunks;
    const int64_t b = bk / x.hkv, hk = bk % x.hkv;
    const int64_t c0 = chunk * kKeys, n = std::min(kKeys, x.skv - c0);
    const float* ktb = kt.data() + (b * x.hkv + hk) * x.d * skp;
    const float* vtb = vt.data() + (b * x.hkv + hk) * x.dv * skp;
    const int64_t key0 = (b * x.skv + c0) * x.hkv + hk;  // this chunk's first key row
    std::vector<int64_t> seen, ra, re;  // rows whose key range meets this chunk
    for (int64_t i = 0; i < x.sq; ++i) {
      int64_t a, e;
      Range(LO, HI, b * x.sq + i, x.skv, &a, &e);
      if (a < c0 + n && e > c0 && e > a) seen.push_back(i), ra.push_back(a), re.push_back(e);
    }
    if (seen.empty()) return;
    uint8_t dv_poison[kKeys] = {0};
    float S[kRows][kKeys] = {}, DP[kRows][kKeys] = {};
    for (int64_t h = hk * x.g; h < (hk + 1) * x.g; ++h) {
      for (size_t t0 = 0; t0 < seen.size(); t0 += kRows) {
        const int64_t rows = std::min<int64_t>(kRows, seen.size() - t0);
        const float* qr[kRows];
        const float* dor[kRows];
        float* dqr[kRows];
        int64_t row[kRows];
        for (int64_t r = 0; r < rows; ++r) {
          row[r] = (b * x.sq + seen[t0 + r]) * x.hq + h;
          qr[r] = qc.data() + row[r] * dp;
          dor[r] = doc.data() + row[r] * dvp;
          dqr[r] = dqw.data() + row[r] * dp;
        }
        Scores(qr, rows, ktb, skp, x.d, c0, n, S);
        Scores(dor, rows, vtb, skp, x.dv, c0, n, DP);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t ja = std::max(ra[t0 + r], c0) - c0, je = std::min(re[t0 + r], c0 + n) - c0;
          const float lse_i = LSE[(b * x.hq + h) * x.sq + seen[t0 + r]], dt = dterm[row[r]];
          float* sr = S[r];
          float* dpr = DP[r];
          std::fill(sr, sr + ja, 0.0f), std::fill(dpr, dpr + ja, 0.0f);
          std::fill(sr + je, sr + n, 0.0f), std::fill(dpr + je, dpr + n, 0.0f);
#pragma omp simd
          for (int64_t jj = ja; jj < je; ++jj) {
            const float p = FastExp(sr[jj] * scale - lse_i);
            sr[jj] = p;                            // P
            dpr[jj] = scale * p * (dpr[jj] + dt);  // scale * dS
          }
          if (dobad[row[r]])
            for (int64_t jj = ja; jj < je; ++jj) dv_poison[jj] = 1;
        }
        AccumRows(DP, rows, n, kc.data() + key0 * dp, x.hkv * dp, dp, dqr);   // dQ += scale dS K
        AccumKeys(DP, rows, n, qr, dkp.data() + key0 * dp, x.hkv * dp, dp);   // dK += scale dS^T Q
        AccumKeys(S, rows, n, dor, dvpad.data() + key0 * dvp, x.hkv * dvp, dvp);  // dV += P^T dO
      }
    }
    for (int64_t jj = 0; jj < n; ++jj)
      if (dv_poison[jj]) {
        float* dvj = dvpad.data() + (key0 + jj * x.hkv) * dvp;
        std::fill(dvj, dvj + x.dv, kNaN);
      }
  });
  float* DQ = dq->typed_data();
  float* DK = dk->typed_data();
  float* DV = dv->typed_data();
  for (int64_t r = 0; r < x.b * x.sq * x.hq; ++r)
    for (int64_t d = 0; d < x.d; ++d) {
      float total = 0.0f;
      for (auto& part : dq_parts)
        if (!part.empty()) total += part[r * dp + d];
      DQ[r * x.d + d] = total;
    }
  for (int64_t r = 0; r < x.b * x.skv * x.hkv; ++r) {
    std::memcpy(DK + r * x.d, dkp.data() + r * dp, x.d * sizeof(float));
    std::memcpy(DV + r * x.dv, dvpad.data() + r * dvp, x.dv * sizeof(float));
  }

  float* DS = dsink->typed_data();
  for (int64_t h = 0; h < x.hq; ++h) {
    float total = 0.0f;
    if (use_sink) {
      for (int64_t b = 0; b < x.b; ++b)
        for (int64_t i = 0; i < x.sq; ++i) {
          float l = LSE[(b * x.hq + h) * x.sq + i];
          bool alive = l > kLseEmpty / 2;
          float p = alive ? std::exp(SINK[h] - l) : 0.0f;
          total += p * dterm[(b * x.sq + i) * x.hq + h];
        }
    }
    DS[h] = total;
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TutorialCpuAttentionFwd, FwdImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("use_sink")
                                  .Ctx<ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(TutorialCpuAttentionBwd, BwdImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("use_sink")
                                  .Ctx<ffi::ThreadPool>());
