// Few-row matrix products for MLX's CPU backend (Linux x86-64): C = alpha A B^T + beta C for
// A with at most SPECSCOPE_SMALL_GEMM_ROWS (default 6) rows -- a decode step, a verify of up to
// 5 drafts -- which is every nn.Linear of such a forward. Why 6: on this 2-core machine, the
// kernel on one thread (below) against OpenBLAS on two, SmolLM2's forward of 6 tokens was 1.11x
// faster with it, of 8 0.96x, of 16 0.55x (OpenBLAS's own gemm pays from there: a batch's verify).
//
// Why: MLX's CPU matmul calls cblas_sgemm, and the BLAS libraries at hand all run a few-row
// product far below this machine's memory bandwidth (SmolLM2's 49152 x 576 head, 113 MB in
// float32, 2 threads: OpenBLAS 0.3.21 6.1 ms for 1 row, 7.5 for 2, 10.6 for 4; BLIS and MKL
// alike), so a forward of 2 tokens cost 1.2 forwards of 1 and a speculative round paid for a
// draft before it was accepted. Streaming B once and multiplying each of its rows by all of
// A's rows (A is a few KB and stays in L1) takes 2.6 ms for 1 or 2 rows, 4.1 for 4 on two
// threads (5.8 on one). bench/cpu_gemm.py has the forwards.
//
// Lossless: every element of C is summed in one fixed order -- 8 lanes over k in steps of 8,
// the lanes added, then the tail -- whatever M is and wherever its row falls in a tile. So row
// i of a verify's product equals the one-row product of row i bit for bit: a verify sees the
// very logits plain decoding would (which no BLAS promises across its kernels).
//
// Preloaded ahead of the BLAS (app/launch.py), it takes cblas_sgemm; anything it does not
// cover (other layouts, more rows, CPUs without AVX2/FMA) goes on to the next library's.
// Built on first use by engines/mlx_chat/cpu_gemm.py with the system's C compiler.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <immintrin.h>
#include <omp.h>
#include <stddef.h>
#include <stdlib.h>

enum { RowMajor = 101, NoTrans = 111, Trans = 112 };
enum { PER_THREAD = 1 << 17 };  // elements of B a thread should stream: below, waking one costs more

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
static sgemm_fn next_sgemm;  // the BLAS's own, for everything else
static int max_rows = -1;    // 0: off (SPECSCOPE_SMALL_GEMM=0, or no AVX2/FMA)
static int team = 1;         // threads for the largest products

#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline float lanes_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The reference order: the tiles below sum each of their elements exactly so.
AVX2 static float dot(const float *a, const float *b, int K) {
  __m256 acc = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
  float s = lanes_sum(acc);
  for (; k < K; k++) s += a[k] * b[k];
  return s;
}

// Rows a0, a1 of A against rows b[0..3] of B (one and two rows: decoding, one draft).
AVX2 static void tile2x4(const float *a0, const float *a1, const float *const b[4], int K, float out[2][4]) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00;
  int k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 x0 = _mm256_loadu_ps(a0 + k), x1 = _mm256_loadu_ps(a1 + k);
    __m256 w = _mm256_loadu_ps(b[0] + k);
    c00 = _mm256_fmadd_ps(x0, w, c00); c10 = _mm256_fmadd_ps(x1, w, c10);
    w = _mm256_loadu_ps(b[1] + k);
    c01 = _mm256_fmadd_ps(x0, w, c01); c11 = _mm256_fmadd_ps(x1, w, c11);
    w = _mm256_loadu_ps(b[2] + k);
    c02 = _mm256_fmadd_ps(x0, w, c02); c12 = _mm256_fmadd_ps(x1, w, c12);
    w = _mm256_loadu_ps(b[3] + k);
    c03 = _mm256_fmadd_ps(x0, w, c03); c13 = _mm256_fmadd_ps(x1, w, c13);
  }
  float s[2][4] = {{lanes_sum(c00), lanes_sum(c01), lanes_sum(c02), lanes_sum(c03)},
                   {lanes_sum(c10), lanes_sum(c11), lanes_sum(c12), lanes_sum(c13)}};
  for (; k < K; k++)
    for (int j = 0; j < 4; j++) { s[0][j] += a0[k] * b[j][k]; s[1][j] += a1[k] * b[j][k]; }
  for (int j = 0; j < 4; j++) { out[0][j] = s[0][j]; out[1][j] = s[1][j]; }
}

// Rows a[0..3] of A against rows b0, b1 of B (three rows and more).
AVX2 static void tile4x2(const float *const a[4], const float *b0, const float *b1, int K, float out[4][2]) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
  int k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 w0 = _mm256_loadu_ps(b0 + k), w1 = _mm256_loadu_ps(b1 + k);
    __m256 x = _mm256_loadu_ps(a[0] + k);
    c00 = _mm256_fmadd_ps(x, w0, c00); c01 = _mm256_fmadd_ps(x, w1, c01);
    x = _mm256_loadu_ps(a[1] + k);
    c10 = _mm256_fmadd_ps(x, w0, c10); c11 = _mm256_fmadd_ps(x, w1, c11);
    x = _mm256_loadu_ps(a[2] + k);
    c20 = _mm256_fmadd_ps(x, w0, c20); c21 = _mm256_fmadd_ps(x, w1, c21);
    x = _mm256_loadu_ps(a[3] + k);
    c30 = _mm256_fmadd_ps(x, w0, c30); c31 = _mm256_fmadd_ps(x, w1, c31);
  }
  float s[4][2] = {{lanes_sum(c00), lanes_sum(c01)}, {lanes_sum(c10), lanes_sum(c11)},
                   {lanes_sum(c20), lanes_sum(c21)}, {lanes_sum(c30), lanes_sum(c31)}};
  for (; k < K; k++)
    for (int r = 0; r < 4; r++) { s[r][0] += a[r][k] * b0[k]; s[r][1] += a[r][k] * b1[k]; }
  for (int r = 0; r < 4; r++) { out[r][0] = s[r][0]; out[r][1] = s[r][1]; }
}

static inline void put(float *c, float s, float alpha, float beta) {
  *c = beta == 0.0f ? alpha * s : alpha * s + beta * *c;  // beta 0: C may hold garbage (BLAS's rule)
}

// Columns n0..n1-1 of C (rows n0..n1-1 of B: one thread's share).
static void columns(int M, int n0, int n1, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
  int n = n0;
  if (M <= 2) {
    for (; n + 4 <= n1; n += 4) {
      const float *b[4] = {B + (size_t)n * ldb, B + (size_t)(n + 1) * ldb, B + (size_t)(n + 2) * ldb,
                           B + (size_t)(n + 3) * ldb};
      float out[2][4];
      tile2x4(A, M > 1 ? A + lda : A, b, K, out);
      for (int r = 0; r < M; r++)
        for (int j = 0; j < 4; j++) put(C + (size_t)r * ldc + n + j, out[r][j], alpha, beta);
    }
  } else {
    for (; n + 2 <= n1; n += 2) {
      const float *b0 = B + (size_t)n * ldb, *b1 = b0 + ldb;  // 2 rows of B, re-read from L1 per 4 of A
      for (int m = 0; m < M; m += 4) {
        const float *a[4];
        for (int r = 0; r < 4; r++) a[r] = A + (size_t)(m + r < M ? m + r : m) * lda;
        float out[4][2];
        tile4x2(a, b0, b1, K, out);
        for (int r = 0; r < 4 && m + r < M; r++) {
          put(C + (size_t)(m + r) * ldc + n, out[r][0], alpha, beta);
          put(C + (size_t)(m + r) * ldc + n + 1, out[r][1], alpha, beta);
        }
      }
    }
  }
  for (; n < n1; n++)
    for (int m = 0; m < M; m++) put(C + (size_t)m * ldc + n, dot(A + (size_t)m * lda, B + (size_t)n * ldb, K), alpha, beta);
}

static void configure(void) {
  const char *off = getenv("SPECSCOPE_SMALL_GEMM"), *rows = getenv("SPECSCOPE_SMALL_GEMM_ROWS");
  __builtin_cpu_init();
  int usable = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !(off && off[0] == '0');
  max_rows = usable ? (rows ? atoi(rows) : 6) : 0;
  // One core is left to the Python thread that builds the next forward while this one runs.
  // On this 2-core machine a second thread made each product 2.2x faster alone and decoding
  // slower: plain 27-28 tok/s against 30-32 single-threaded, and --spec mtp fell to 1.0x plain
  // with OpenMP's default spin-wait (SmolLM2, 12 open chat prompts). OMP_NUM_THREADS caps it.
  team = omp_get_num_procs() - 1;
  if (team > omp_get_max_threads()) team = omp_get_max_threads();
  if (team < 1) team = 1;
}

void cblas_sgemm(int order, int transa, int transb, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (max_rows < 0) configure();
  if (!next_sgemm) next_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
  // x @ W.T with W stored [N, K] row-major: how MLX multiplies by an nn.Linear's weight
  if (!(order == RowMajor && transa == NoTrans && transb == Trans && M >= 1 && M <= max_rows && N >= 1 && K >= 1)) {
    next_sgemm(order, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  long want = (long)N * K / PER_THREAD;
  int threads = want < 1 ? 1 : (want < team ? (int)want : team);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    int share = ((N + T - 1) / T + 3) / 4 * 4;  // whole tiles per thread
    int n0 = t * share < N ? t * share : N, n1 = n0 + share < N ? n0 + share : N;
    columns(M, n0, n1, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}
