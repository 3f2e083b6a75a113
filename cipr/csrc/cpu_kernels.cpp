// CIPR's float32 CPU kernels for decoding steps (see cipr/cpu_kernels.py): `linear`, y = x W^T + b for a
// few rows of x, and `decode_attention`, one query position per row over a key/value cache.
//
// linear: W [N, K] is packed once into panels of 16 output columns, [N / 16][K][16], so a panel streams
// contiguously. Each task takes a block of panels and keeps a chunk of rows' accumulators in registers
// over the whole K loop; the weights are read from memory once per call whatever the row count (more
// rows than a chunk re-read the task's panels from cache), and the next 2 KB of each panel are
// prefetched, so that streaming and the multiply-adds overlap. Each row's sums run over k in the same
// order whatever the other rows are, so a row's output does not depend on the batch it is in.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kPanel = 16;      // output columns per panel
constexpr int64_t kPrefetch = 512;  // floats ahead in each panel stream

// Register blocking by vector width: with AVX-512 a panel is one 16-float register and a block is
// 8 rows x 2 panels (16 accumulators of 32 registers); otherwise (AVX2: 16 registers of 8 floats) a
// panel is two registers and a block 6 rows x 1 panel (12 accumulators).
#if defined(__AVX512F__)
typedef float vec __attribute__((vector_size(64)));
constexpr int kHalves = 1;
constexpr int kPanels = 2;
constexpr int64_t kRows = 8;
#else
typedef float vec __attribute__((vector_size(32)));
constexpr int kHalves = 2;
constexpr int kPanels = 1;
constexpr int64_t kRows = 6;
#endif
constexpr int64_t kWidth = kPanel / kHalves;  // floats per register

// Rows [0, M) of x [M, K] (row stride K) times panels [p, p + NP) into out (row stride N).
template <int M, int NP>
inline void block(const float* x, int64_t K, const float* panels, int64_t p, float* out, int64_t N,
                  const float* bias) {
  vec acc[NP][kHalves][M];
  for (int j = 0; j < NP; ++j)
    for (int h = 0; h < kHalves; ++h)
      for (int r = 0; r < M; ++r) acc[j][h][r] = (vec){0};
  const float* w[NP];
  for (int j = 0; j < NP; ++j) w[j] = panels + (p + j) * K * kPanel;
  for (int64_t k = 0; k < K; ++k) {
    vec wk[NP][kHalves];
    for (int j = 0; j < NP; ++j) {
      __builtin_prefetch(w[j] + k * kPanel + kPrefetch, 0, 3);
      for (int h = 0; h < kHalves; ++h) std::memcpy(&wk[j][h], w[j] + k * kPanel + h * kWidth, sizeof(vec));
    }
    for (int r = 0; r < M; ++r) {
      const float xv = x[r * K + k];
      for (int j = 0; j < NP; ++j)
        for (int h = 0; h < kHalves; ++h) acc[j][h][r] += xv * wk[j][h];
    }
  }
  for (int j = 0; j < NP; ++j) {
    for (int h = 0; h < kHalves; ++h) {
      const int64_t col = (p + j) * kPanel + h * kWidth;
      vec b = (vec){0};
      if (bias != nullptr) std::memcpy(&b, bias + col, sizeof(vec));
      for (int r = 0; r < M; ++r) {
        const vec y = bias != nullptr ? acc[j][h][r] + b : acc[j][h][r];
        std::memcpy(out + r * N + col, &y, sizeof(vec));
      }
    }
  }
}

template <int NP>
void rows_block(int64_t m, const float* x, int64_t K, const float* panels, int64_t p, float* out, int64_t N,
                const float* bias) {
  switch (m) {
    case 1: block<1, NP>(x, K, panels, p, out, N, bias); break;
    case 2: block<2, NP>(x, K, panels, p, out, N, bias); break;
    case 3: block<3, NP>(x, K, panels, p, out, N, bias); break;
    case 4: block<4, NP>(x, K, panels, p, out, N, bias); break;
    case 5: block<5, NP>(x, K, panels, p, out, N, bias); break;
    case 6: block<6, NP>(x, K, panels, p, out, N, bias); break;
#if defined(__AVX512F__)
    case 7: block<7, NP>(x, K, panels, p, out, N, bias); break;
    default: block<8, NP>(x, K, panels, p, out, N, bias); break;
#else
    default: block<6, NP>(x, K, panels, p, out, N, bias); break;
#endif
  }
}

at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
              "cipr_cpu::pack: weight must be a 2-D float32 CPU tensor, got ", weight.sizes(), " ",
              weight.scalar_type());
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(N % kPanel == 0, "cipr_cpu::pack: out_features ", N, " is not a multiple of ", kPanel);
  return weight.contiguous().view({N / kPanel, kPanel, K}).transpose(1, 2).contiguous();
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "cipr_cpu::linear: x must be a 2-D float32 CPU tensor, got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.size(1) == x.size(1) &&
                  packed.scalar_type() == at::kFloat && packed.is_contiguous(),
              "cipr_cpu::linear: packed weight ", packed.sizes(), " does not match x ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1), P = packed.size(0), N = P * kPanel;
  const float* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N && bias->scalar_type() == at::kFloat, "cipr_cpu::linear: bias of ",
                bias->numel(), " values for ", N, " outputs");
    bias_c = bias->contiguous();
    b = bias_c.data_ptr<float>();
  }
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({M, N}, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t blocks = (P + kPanels - 1) / kPanels;
  at::parallel_for(0, blocks, 16 / kPanels, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t p = kPanels * i;
      for (int64_t r = 0; r < M; r += kRows) {
        const int64_t m = std::min(kRows, M - r);
        if (p + kPanels <= P) {
          rows_block<kPanels>(m, xp + r * K, K, wp, p, op + r * N, N, b);
        } else {
          rows_block<1>(m, xp + r * K, K, wp, p, op + r * N, N, b);
        }
      }
    }
  });
  return out;
}

// ---- Decoding attention: one query position per row, grouped-query heads, over a key/value cache ----
//
// Per (row, key/value head) task: the G query heads of its group score every cached position (one pass
// over the keys), a softmax per head (max subtracted, exp vectorized), then one pass over the values.
// Each key and value row is read once per step, contiguously, whatever G is.

#if defined(__AVX512F__)
typedef int ivec __attribute__((vector_size(64)));
inline float hsum(vec a) {
  a += __builtin_shuffle(a, (ivec){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  a += __builtin_shuffle(a, (ivec){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
  a += __builtin_shuffle(a, (ivec){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  a += __builtin_shuffle(a, (ivec){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  return a[0];
}
#else
typedef int ivec __attribute__((vector_size(32)));
inline float hsum(vec a) {
  a += __builtin_shuffle(a, (ivec){4, 5, 6, 7, 0, 1, 2, 3});
  a += __builtin_shuffle(a, (ivec){2, 3, 0, 1, 6, 7, 4, 5});
  a += __builtin_shuffle(a, (ivec){1, 0, 3, 2, 5, 4, 7, 6});
  return a[0];
}
#endif

// exp(x) for x <= 0 (scores minus their max): 2^n times a degree-6 Taylor polynomial on [-ln2/2, ln2/2]
// (truncation error below 2e-7 relative there); below -87 (a masked position) exactly 0.
inline vec exp_nonpositive(vec x) {
  const vec lo = (vec){0} - 87.0f;
  const auto dead = x < lo;
  x = dead ? lo : x;
  const vec magic = (vec){0} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  vec n = x * 1.44269504088896341f + magic;
  const ivec ni = (ivec)n - (ivec)magic;
  n -= magic;
  const vec r = x - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
  vec p = (vec){0} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const vec scale = (vec)((ni + 127) << 23);
  return dead ? (vec){0} : p * scale;
}

constexpr int64_t kAhead = 16;  // key/value rows prefetched ahead

template <int G, int ND>
void attend(const float* q, const float* k, int64_t ks, const float* v, int64_t vs, const float* mask, int64_t T,
            float scale, float* out, float* s) {
  vec qv[G][ND];
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < ND; ++d) {
      std::memcpy(&qv[g][d], q + g * ND * kWidth + d * kWidth, sizeof(vec));
      qv[g][d] *= scale;
    }
  float mx[G];
  for (int g = 0; g < G; ++g) mx[g] = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < T; ++t) {
    vec kv[ND];
    for (int l = 0; l < ND * kWidth; l += 16) __builtin_prefetch(k + (t + kAhead) * ks + l, 0, 3);
    for (int d = 0; d < ND; ++d) std::memcpy(&kv[d], k + t * ks + d * kWidth, sizeof(vec));
    const float m = mask != nullptr ? mask[t] : 0.0f;
    for (int g = 0; g < G; ++g) {
      vec a = qv[g][0] * kv[0];
      for (int d = 1; d < ND; ++d) a += qv[g][d] * kv[d];
      const float sc = hsum(a) + m;
      s[g * T + t] = sc;
      mx[g] = sc > mx[g] ? sc : mx[g];
    }
  }
  float total[G];
  for (int g = 0; g < G; ++g) {
    float* sg = s + g * T;
    vec acc = (vec){0};
    int64_t t = 0;
    for (; t + kWidth <= T; t += kWidth) {
      vec x;
      std::memcpy(&x, sg + t, sizeof(vec));
      x = exp_nonpositive(x - mx[g]);
      std::memcpy(sg + t, &x, sizeof(vec));
      acc += x;
    }
    float sum = hsum(acc);
    for (; t < T; ++t) {
      vec x = (vec){0} + (sg[t] - mx[g]);
      sg[t] = exp_nonpositive(x)[0];
      sum += sg[t];
    }
    total[g] = sum;
  }
  vec acc[G][ND];
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < ND; ++d) acc[g][d] = (vec){0};
  for (int64_t t = 0; t < T; ++t) {
    vec vv[ND];
    for (int l = 0; l < ND * kWidth; l += 16) __builtin_prefetch(v + (t + kAhead) * vs + l, 0, 3);
    for (int d = 0; d < ND; ++d) std::memcpy(&vv[d], v + t * vs + d * kWidth, sizeof(vec));
    for (int g = 0; g < G; ++g) {
      const float p = s[g * T + t];
      for (int d = 0; d < ND; ++d) acc[g][d] += p * vv[d];
    }
  }
  for (int g = 0; g < G; ++g) {
    const float inv = 1.0f / total[g];
    for (int d = 0; d < ND; ++d) {
      const vec y = acc[g][d] * inv;
      std::memcpy(out + g * ND * kWidth + d * kWidth, &y, sizeof(vec));
    }
  }
}

template <int ND>
void attend_g(int64_t G, const float* q, const float* k, int64_t ks, const float* v, int64_t vs, const float* mask,
              int64_t T, float scale, float* out, float* s) {
  switch (G) {
    case 1: attend<1, ND>(q, k, ks, v, vs, mask, T, scale, out, s); break;
    case 2: attend<2, ND>(q, k, ks, v, vs, mask, T, scale, out, s); break;
    case 3: attend<3, ND>(q, k, ks, v, vs, mask, T, scale, out, s); break;
    case 4: attend<4, ND>(q, k, ks, v, vs, mask, T, scale, out, s); break;
    case 5: attend<5, ND>(q, k, ks, v, vs, mask, T, scale, out, s); break;
    case 6: attend<6, ND>(q, k, ks, v, vs, mask, T, scale, out, s); break;
    case 7: attend<7, ND>(q, k, ks, v, vs, mask, T, scale, out, s); break;
    default: attend<8, ND>(q, k, ks, v, vs, mask, T, scale, out, s); break;
  }
}

// query [B, H, D], key/value [B, Hk, T, D] (rows of D contiguous, other strides free), mask [B, T]
// (additive, last stride 1) or none -> [B, H, D].
at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const std::optional<at::Tensor>& mask, double scale) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 4 && value.dim() == 4, "cipr_cpu::decode_attention: query [B, H, D] "
              "and key/value [B, Hk, T, D] expected, got ", query.sizes(), ", ", key.sizes(), ", ", value.sizes());
  const int64_t B = query.size(0), H = query.size(1), D = query.size(2), Hk = key.size(1), T = key.size(2);
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(0) == B && key.size(3) == D && H % Hk == 0 &&
                  H / Hk <= 8 && (D == 64 || D == 128),
              "cipr_cpu::decode_attention: unsupported shapes ", query.sizes(), ", ", key.sizes(), ", ",
              value.sizes());
  for (const at::Tensor* t : {&query, &key, &value})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu() && t->stride(-1) == 1,
                "cipr_cpu::decode_attention: float32 CPU tensors with contiguous last dimension expected");
  const float* m = nullptr;
  int64_t mstride = 0;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->dim() == 2 && mask->size(0) == B && mask->size(1) == T && mask->stride(1) == 1 &&
                    mask->scalar_type() == at::kFloat,
                "cipr_cpu::decode_attention: mask [B, T] float32 expected, got ", mask->sizes());
    m = mask->data_ptr<float>();
    mstride = mask->stride(0);
  }
  const at::Tensor qc = query.contiguous();
  at::Tensor out = at::empty({B, H, D}, query.options());
  const int64_t G = H / Hk;
  const float* qp = qc.data_ptr<float>();
  const float* kp = key.data_ptr<float>();
  const float* vp = value.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B * Hk, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(G * T);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / Hk, h = i % Hk;
      const float* q = qp + (b * H + h * G) * D;
      const float* k = kp + b * key.stride(0) + h * key.stride(1);
      const float* v = vp + b * value.stride(0) + h * value.stride(1);
      const float* mb = m != nullptr ? m + b * mstride : nullptr;
      float* o = op + (b * H + h * G) * D;
      if (D == 64) {
        attend_g<64 / kWidth>(G, q, k, key.stride(2), v, value.stride(2), mb, T, static_cast<float>(scale), o, scratch.data());
      } else {
        attend_g<128 / kWidth>(G, q, k, key.stride(2), v, value.stride(2), mb, T, static_cast<float>(scale), o, scratch.data());
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(cipr_cpu, m) {
  m.def("pack(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
  m.def("decode_attention(Tensor query, Tensor key, Tensor value, Tensor? mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(cipr_cpu, CPU, m) {
  m.impl("pack", &pack);
  m.impl("linear", &linear);
  m.impl("decode_attention", &decode_attention);
}
