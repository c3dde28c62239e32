/* The per-channel passes of lbtrain's synchronised BatchNorm on a CPU rank.

   Each layer of a step runs a statistics pass and a normalisation forward, a reduction and
   an input-gradient pass backward. In torch these take 30-60 calls of Python and dispatch
   on 64-value tensors around the tensor work (0.2-0.6 ms a layer and step on one CPU thread),
   which a ResNet-44's 43 layers turn into 12-25% of a small batch's step. Here each pass is
   one call. lbtrain/parallel/batchnorm_host.py builds this file with the system's C compiler
   on first use and calls it through ctypes; without a compiler, torch's kernels run instead.

   The input is contiguous, (n, c, s): n samples, c channels, s values a channel and sample.
   Sums are float64 whatever the input's type; `omp simd` (-fopenmp-simd, no OpenMP runtime)
   lets the compiler vectorise the sums, whose order then differs from a plain loop's by the
   rounding of float64, far below the float32 input's. */

#include <math.h>
#include <stdint.h>

typedef int64_t size;  /* sizes and indices: 64 bits on every platform */

#define ROW(p, i, j) ((p) + ((i) * c + (j)) * s)

#define KERNELS(T, NAME)                                                                       \
  /* Channel j's sum of x and of x^2, from the mean and then the sums of x less it (the        \
     corrected two-pass variance), so the figures do not cancel however far the mean is        \
     from 0 or one sample from the others. */                                                  \
  void stats_##NAME(const T *x, size n, size c, size s, double *sum, double *sumsq) {          \
    double count = (double)n * (double)s;                                                      \
    for (size j = 0; j < c; j++) {                                                             \
      double acc = 0.0;                                                                        \
      for (size i = 0; i < n; i++) {                                                           \
        const T *p = ROW(x, i, j);                                                             \
        _Pragma("omp simd reduction(+ : acc)") for (size k = 0; k < s; k++) acc += p[k];       \
      }                                                                                        \
      double m = acc / count, d1 = 0.0, d2 = 0.0;                                              \
      for (size i = 0; i < n; i++) {                                                           \
        const T *p = ROW(x, i, j);                                                             \
        _Pragma("omp simd reduction(+ : d1, d2)") for (size k = 0; k < s; k++) {               \
          double d = (double)p[k] - m;                                                         \
          d1 += d;                                                                             \
          d2 += d * d;                                                                         \
        }                                                                                      \
      }                                                                                        \
      /* sum x = d1 + n m; sum x^2 = d2 + 2 m d1 + n m^2 = d2 + m (d1 + sum x). */             \
      double total = d1 + count * m;                                                           \
      sum[j] = total;                                                                          \
      sumsq[j] = d2 + m * (d1 + total);                                                        \
    }                                                                                          \
  }                                                                                            \
                                                                                               \
  /* From the summed figures (count, then sum x and sum x^2 a channel): figures = [mean,       \
     scale = weight / std, shift = bias, 1 / std], and the running mean and unbiased           \
     variance moved `factor` toward the batch's (NULL where the layer has none). */            \
  void finish_##NAME(const double *summed, size c, double count, double eps,                   \
                     const T *weight, const T *bias, T *running_mean, T *running_var,          \
                     double factor, double *figures) {                                         \
    for (size j = 0; j < c; j++) {                                                             \
      double mean = summed[j] / count, var = summed[c + j] / count - mean * mean;              \
      double invstd;                                                                           \
      if (var < 0.0) var = 0.0;                                                                \
      invstd = 1.0 / sqrt(var + eps);                                                          \
      figures[j] = mean;                                                                       \
      figures[c + j] = weight ? weight[j] * invstd : invstd;                                   \
      figures[2 * c + j] = bias ? bias[j] : 0.0;                                               \
      figures[3 * c + j] = invstd;                                                             \
      if (running_mean) {                                                                      \
        running_mean[j] = (T)((1.0 - factor) * running_mean[j] + factor * mean);               \
        running_var[j] =                                                                       \
            (T)((1.0 - factor) * running_var[j] + factor * var * (count / (count - 1.0)));     \
      }                                                                                        \
    }                                                                                          \
  }                                                                                            \
                                                                                               \
  /* y = (x - mean) scale + shift, channel by channel. */                                      \
  void normalise_##NAME(const T *x, T *y, size n, size c, size s, const double *figures) {     \
    for (size i = 0; i < n; i++) {                                                             \
      for (size j = 0; j < c; j++) {                                                           \
        const T *p = ROW(x, i, j);                                                             \
        T *q = ROW(y, i, j), m = (T)figures[j], a = (T)figures[c + j];                         \
        T b = (T)figures[2 * c + j];                                                           \
        _Pragma("omp simd") for (size k = 0; k < s; k++) q[k] = (p[k] - m) * a + b;            \
      }                                                                                        \
    }                                                                                          \
  }                                                                                            \
                                                                                               \
  /* Channel j's sum of dy and of dy x_hat into `sums` (for the collective: the slots torch's  \
     kernels fill on every other rank, a CUDA one or one without a compiler, so ranks on       \
     either path sum alike), and this rank's gradients of the bias (sum dy) and the weight     \
     (sum dy x_hat) where not NULL. */                                                         \
  void grad_sums_##NAME(const T *dy, const T *x, size n, size c, size s,                       \
                        const double *figures, double *sums, T *grad_weight, T *grad_bias) {   \
    for (size j = 0; j < c; j++) {                                                             \
      double m = figures[j], a = 0.0, b = 0.0;                                                 \
      for (size i = 0; i < n; i++) {                                                           \
        const T *g = ROW(dy, i, j), *p = ROW(x, i, j);                                         \
        _Pragma("omp simd reduction(+ : a, b)") for (size k = 0; k < s; k++) {                 \
          a += g[k];                                                                           \
          b += (double)g[k] * ((double)p[k] - m);                                              \
        }                                                                                      \
      }                                                                                        \
      b *= figures[3 * c + j]; /* sum dy (x - mean) / std */                                   \
      sums[j] = a;                                                                             \
      sums[c + j] = b;                                                                         \
      if (grad_bias) grad_bias[j] = (T)a;                                                      \
      if (grad_weight) grad_weight[j] = (T)b;                                                  \
    }                                                                                          \
  }                                                                                            \
                                                                                               \
  /* The whole batch's input gradient from the summed sums of dy and dy x_hat:                 \
     dx = scale (dy - mean(dy) - x_hat mean(dy x_hat)) = dy scale + (x - mean) slope + offset, \
     with slope = -scale mean(dy x_hat) / std and offset = -scale mean(dy). */                 \
  void input_grad_##NAME(const T *dy, const T *x, T *dx, size n, size c, size s,               \
                         const double *figures, const double *summed, double count) {          \
    for (size i = 0; i < n; i++) {                                                             \
      for (size j = 0; j < c; j++) {                                                           \
        double scale = figures[c + j], invstd = figures[3 * c + j];                            \
        const T *g = ROW(dy, i, j), *p = ROW(x, i, j);                                         \
        T *q = ROW(dx, i, j), m = (T)figures[j], a = (T)scale;                                 \
        T b = (T)(-scale * invstd * summed[c + j] / count);                                    \
        T o = (T)(-scale * summed[j] / count);                                                 \
        _Pragma("omp simd") for (size k = 0; k < s; k++) q[k] = g[k] * a + (p[k] - m) * b + o; \
      }                                                                                        \
    }                                                                                          \
  }

KERNELS(float, f32)
KERNELS(double, f64)
