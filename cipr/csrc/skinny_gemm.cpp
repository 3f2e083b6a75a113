// y = x W^T + b for a few rows of x (decoding steps), float32 on CPU: see cipr/skinny_gemm.py.
//
// W [N, K] is packed once into panels of 16 output columns, [N / 16][K][16], so a panel streams
// contiguously. Each task takes a block of panels and keeps a chunk of rows' accumulators in registers
// over the whole K loop; the weights are read from memory once per call whatever the row count (more
// rows than a chunk re-read the task's panels from cache), and the next 2 KB of each panel are
// prefetched, so that streaming and the multiply-adds overlap. Each row's sums run over k in the same order whatever the other rows are,
// so a row's output does not depend on the batch it is in.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstring>

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
              "cipr_gemm::pack: weight must be a 2-D float32 CPU tensor, got ", weight.sizes(), " ",
              weight.scalar_type());
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(N % kPanel == 0, "cipr_gemm::pack: out_features ", N, " is not a multiple of ", kPanel);
  return weight.contiguous().view({N / kPanel, kPanel, K}).transpose(1, 2).contiguous();
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "cipr_gemm::linear: x must be a 2-D float32 CPU tensor, got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.size(1) == x.size(1) &&
                  packed.scalar_type() == at::kFloat && packed.is_contiguous(),
              "cipr_gemm::linear: packed weight ", packed.sizes(), " does not match x ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1), P = packed.size(0), N = P * kPanel;
  const float* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N && bias->scalar_type() == at::kFloat, "cipr_gemm::linear: bias of ",
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

}  // namespace

TORCH_LIBRARY(cipr_gemm, m) {
  m.def("pack(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(cipr_gemm, CPU, m) {
  m.impl("pack", &pack);
  m.impl("linear", &linear);
}
