// Per-record weight gradients of a 2-d convolution on a CPU, without unfolding the input into patches.
//
// Record r's gradient of weight W (O outputs, D = C·kh·kw inputs) is Σ_t g_rt a_rtᵀ over its positions t
// (K rows × Ho × Wo output pixels), a_rt the input patch output pixel t sees (Bu et al. 2022, Eq. 2). Here the
// patch values are read in place from the record's zero-padded input: value d = (c, i, j) of position
// t = (k, y, x) sits at base[t] + off[d], so no copy of the patches is written. A block of
// NB patch values × 16·NV outputs is kept in vector registers while the positions stream past, then stored
// (the per-record gradient, layout (D, O)) and squared into the record's norm (accumulated in double). The
// bias's per-record gradient, the output gradients summed over the record's positions, and its squared norm come
// from the same transposed copy of the output gradients (optional: null pointers skip them).
// Records are independent: `threads` threads take contiguous ranges of them (the result does not depend on
// the split). Plain C++ with a C entry point (no torch headers), loaded with ctypes: it builds in a second or two.
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

typedef float v16 __attribute__((vector_size(64)));

inline v16 load16(const float* p) { v16 v; __builtin_memcpy(&v, p, sizeof v); return v; }
inline void store16(float* p, v16 v) { __builtin_memcpy(p, &v, sizeof v); }

// NB patch values d0..d0+NB-1 (offsets off[0..NB)) × 16·NV outputs from column o0 of g's rows (stride og).
template <int NB, int NV>
double block(const float* x, const int64_t* base, int64_t T, const float* g, int64_t og, const int64_t* off,
             float* out, int64_t oo) {
  v16 acc[NB][NV];
  for (int a = 0; a < NB; ++a)
    for (int v = 0; v < NV; ++v) acc[a][v] = v16{};
  for (int64_t t = 0; t < T; ++t) {
    const float* gr = g + t * og;
    v16 gv[NV];
    for (int v = 0; v < NV; ++v) gv[v] = load16(gr + 16 * v);
    const float* xb = x + base[t];
    for (int a = 0; a < NB; ++a) {
      const float xs = xb[off[a]];
      for (int v = 0; v < NV; ++v) acc[a][v] += xs * gv[v];
    }
  }
  v16 s{};
  for (int a = 0; a < NB; ++a)
    for (int v = 0; v < NV; ++v) {
      s += acc[a][v] * acc[a][v];
      store16(out + a * oo + 16 * v, acc[a][v]);
    }
  double r = 0;
  for (int q = 0; q < 16; ++q) r += s[q];
  return r;
}

// all D patch values × NV vectors of outputs starting at column o0
template <int NV>
double columns(const float* x, const int64_t* base, int64_t T, const float* g, int64_t og, const int64_t* off,
               int64_t D, float* out, int64_t oo) {
  constexpr int NB = 6;  // NB·NV ≤ 24 accumulators: AVX-512 has 32 vector registers, AVX2 spills (still correct)
  double total = 0;
  int64_t d = 0;
  for (; d + NB <= D; d += NB) total += block<NB, NV>(x, base, T, g, og, off + d, out + d * oo, oo);
  for (; d < D; ++d) total += block<1, NV>(x, base, T, g, og, off + d, out + d * oo, oo);
  return total;
}

}  // namespace

// x: the input (records·K, C, H, W) and gz: the output gradients (records·K, O, Ho, Wo), fp32 contiguous, a
// record's K rows consecutive; grads: (records, C·kh·kw, Op) fp32 contiguous, Op = O rounded up to a multiple
// of 16, overwritten with each record's gradient (layout (d, o), columns beyond O zero); sq: (records,),
// overwritten with each record's squared gradient norm; bd: (records, Op) and sbd: (records,), or both null,
// overwritten with each record's bias gradient (columns beyond O zero) and its squared norm. Each thread pads its record's rows and transposes its
// output gradients into scratch of its own (a record's worth: cache-resident), whose borders and extra columns
// stay zero. Returns 0, or 1 if the sizes are inconsistent (nothing written); the caller checks dtypes and
// layouts (dpgen/privacy/ghost_kernel.py).
extern "C" int dpgen_conv_record_grads(const float* xd, const float* gd, float* od, float* sd, float* bd, float* sbd,
                                       int64_t records,
                                       int64_t K, int64_t C, int64_t H, int64_t W, int64_t O, int64_t Ho,
                                       int64_t Wo, int64_t Op, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                       int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t threads) {
  const int64_t Hp = H + 2 * ph, Wp = W + 2 * pw, T = K * Ho * Wo, D = C * kh * kw;
  if (records < 1 || K < 1 || C < 1 || O < 1 || kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 ||
      ph < 0 || pw < 0 || (bd == nullptr) != (sbd == nullptr) || Op % 16 != 0 || Op < O || Op >= O + 16 || Ho < 1 || Wo < 1 ||
      Ho != (Hp - dh * (kh - 1) - 1) / sh + 1 || Wo != (Wp - dw * (kw - 1) - 1) / sw + 1 ||
      Hp < dh * (kh - 1) + 1 || Wp < dw * (kw - 1) + 1)
    return 1;
  std::vector<int64_t> base(T), off(D);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t y = 0; y < Ho; ++y)
      for (int64_t v = 0; v < Wo; ++v) base[(k * Ho + y) * Wo + v] = k * C * Hp * Wp + y * sh * Wp + v * sw;
  for (int64_t c = 0; c < C; ++c)  // the weight's own order: W[o, c, i, j]
    for (int64_t i = 0; i < kh; ++i)
      for (int64_t j = 0; j < kw; ++j) off[(c * kh + i) * kw + j] = c * Hp * Wp + i * dh * Wp + j * dw;
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> xl(K * C * Hp * Wp, 0.f), gl(T * Op, 0.f);
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t kc = 0; kc < K * C; ++kc)  // the record's rows into the padded scratch's interior
        for (int64_t y = 0; y < H; ++y)
          std::copy_n(xd + ((r * K * C + kc) * H + y) * W, W, xl.data() + (kc * Hp + y + ph) * Wp + pw);
      for (int64_t k = 0; k < K; ++k)  // (O, Ho·Wo) per row → (K·Ho·Wo, Op)
        for (int64_t o = 0; o < O; ++o) {
          const float* src = gd + ((r * K + k) * O + o) * Ho * Wo;
          float* dst = gl.data() + k * Ho * Wo * Op + o;
          for (int64_t t = 0; t < Ho * Wo; ++t) dst[t * Op] = src[t];
        }
      if (bd) {
        float* b = bd + r * Op;
        std::fill_n(b, Op, 0.f);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t o = 0; o < Op; ++o) b[o] += gl[t * Op + o];
        double s = 0;
        for (int64_t o = 0; o < Op; ++o) s += double(b[o]) * b[o];
        sbd[r] = static_cast<float>(s);
      }
      const float* xs = xl.data();
      const float* gs = gl.data();
      float* orr = od + r * D * Op;
      double total = 0;
      int64_t o = 0;
      for (; o + 64 <= Op; o += 64) total += columns<4>(xs, base.data(), T, gs + o, Op, off.data(), D, orr + o, Op);
      const int64_t rest = (Op - o) / 16;
      if (rest == 3) total += columns<3>(xs, base.data(), T, gs + o, Op, off.data(), D, orr + o, Op);
      if (rest == 2) total += columns<2>(xs, base.data(), T, gs + o, Op, off.data(), D, orr + o, Op);
      if (rest == 1) total += columns<1>(xs, base.data(), T, gs + o, Op, off.data(), D, orr + o, Op);
      sd[r] = static_cast<float>(total);
    }
  };
  const int64_t n = std::max<int64_t>(1, std::min(threads, records));
  if (n == 1) {
    run(0, records);
    return 0;
  }
  std::vector<std::thread> pool;
  for (int64_t i = 1; i < n; ++i) pool.emplace_back(run, records * i / n, records * (i + 1) / n);
  run(0, records / n);
  for (auto& t : pool) t.join();
  return 0;
}
