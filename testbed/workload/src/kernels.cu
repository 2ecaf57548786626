// vramtrace reference workload kernels, compiled at run time with NVRTC.
//
// One kernel per stage of fla 0.6.0's chunked gated delta rule forward and one
// for FlashAttention-2's varlen forward. They are written for clarity, not
// speed: plain fp32 arithmetic, shared-memory tiles, no tensor cores. They do
// round intermediates to the storage type exactly where fla does (each `rnd`
// below names the fla expression it mirrors), so that their results match fla
// within the storage type's precision.
//
// The storage type E is chosen with -DVT_DTYPE=0 (bf16), 1 (f16) or 2 (f32).
// No headers are included: the conversions are written out, so the source
// compiles with nothing but libnvrtc.
//
// Layouts (row-major, outermost first), T tokens over N sequences:
//   q, k [T, HK, K]   v, u, v_new, o [T, H, V]   w [T, H, K]   A [T, H, 64]
//   g, g_cumsum, beta [T, H]   h [NT, H, K, V]   h0, final_state [N, H, K, V]
// H value heads share HK query/key heads (H % HK == 0, fla's GVA).
// Varlen: cu_seqlens [N+1], chunk_indices [NT, 2] (sequence, chunk-in-sequence)
// and chunk_offsets [N+1] are int64 as in fla; null pointers mean one sequence.

#ifndef VT_DTYPE
#define VT_DTYPE 0
#endif

#if VT_DTYPE == 0
typedef unsigned short E;
__device__ __forceinline__ float e2f(E x) { return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ E f2e(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (E)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (E)(u >> 16);
}
#elif VT_DTYPE == 1
typedef unsigned short E;
__device__ __forceinline__ float e2f(E x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
__device__ __forceinline__ E f2e(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
typedef float E;
__device__ __forceinline__ float e2f(E x) { return x; }
__device__ __forceinline__ E f2e(float f) { return f; }
#endif

// Round to the storage type and back: what `.to(x.dtype)` does in Triton.
__device__ __forceinline__ float rnd(float x) { return e2f(f2e(x)); }

#define BT 64

// Where chunk `ic` (a row of chunk_indices, or the plain chunk number) starts.
__device__ __forceinline__ void chunk_pos(const long long* cu, const long long* ci, long long T, long long ic,
                                          long long* bos, long long* len, long long* it) {
    if (cu) {
        long long n = ci[2 * ic];
        *it = ci[2 * ic + 1];
        *bos = cu[n];
        *len = cu[n + 1] - *bos;
    } else {
        *bos = 0;
        *len = T;
        *it = ic;
    }
}

// fla/modules/norm/l2norm.py l2norm_fwd_kernel: y = x / sqrt(sum(x^2) + eps),
// rstd in fp32. One warp per row.
extern "C" __global__ void vt_l2norm_fwd(const E* __restrict__ x, E* __restrict__ y, float* __restrict__ rstd,
                                         long long rows, int D, float eps) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const E* xr = x + row * D;
    float s = 0.f;
    for (int d = lane; d < D; d += 32) {
        float v = e2f(xr[d]);
        s += v * v;
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    const float r = 1.f / sqrtf(s + eps);
    for (int d = lane; d < D; d += 32) y[row * D + d] = f2e(e2f(xr[d]) * r);
    if (lane == 0) rstd[row] = r;
}

// fla/ops/utils/cumsum.py chunk_local_cumsum_scalar_kernel: the cumulative sum
// of g inside each 64-token chunk, times `scale` (RCP_LN2: the rest of fla works
// in log2 space with exp2), in fp32. Grid: one block per chunk.
extern "C" __global__ void vt_chunk_local_cumsum(const float* __restrict__ g, float* __restrict__ out,
                                                 const long long* cu, const long long* ci, long long T, int H,
                                                 float scale) {
    long long bos, len, it;
    chunk_pos(cu, ci, T, blockIdx.x, &bos, &len, &it);
    const long long t0 = it * BT;
    const long long n = min((long long)BT, len - t0);
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        float s = 0.f;
        for (long long t = 0; t < n; ++t) {
            const long long idx = (bos + t0 + t) * H + h;
            s += g[idx];
            out[idx] = s * scale;
        }
    }
}

// fla/ops/gated_delta_rule/chunk_fwd.py chunk_gated_delta_rule_fwd_kkt_solve_kernel:
// A = (I + L)^-1 with L[i][j] = beta_i * (k_i . k_j) * exp2(g_i - g_j) for j < i
// inside the chunk, stored in the input dtype. Grid (NT, H), 256 threads.
extern "C" __global__ void vt_gdn_kkt_solve(const E* __restrict__ k, const float* __restrict__ gc,
                                            const E* __restrict__ beta, E* __restrict__ A, const long long* cu,
                                            const long long* ci, long long T, int H, int HK, int K) {
    __shared__ float ks[BT][33];
    __shared__ float Lm[BT][BT + 1];
    __shared__ float Ti[BT][BT + 1];
    const int tid = threadIdx.x;
    const int h = blockIdx.y;
    const int hk = h / (H / HK);
    long long bos, len, it;
    chunk_pos(cu, ci, T, blockIdx.x, &bos, &len, &it);
    const long long t0 = it * BT;
    const int n = (int)min((long long)BT, len - t0);

    float acc[16];
#pragma unroll
    for (int m = 0; m < 16; ++m) acc[m] = 0.f;
    for (int kc = 0; kc < K; kc += 32) {
        for (int idx = tid; idx < BT * 32; idx += blockDim.x) {
            const int r = idx >> 5, c = idx & 31;
            float x = 0.f;
            if (r < n && kc + c < K) x = e2f(k[((bos + t0 + r) * HK + hk) * (long long)K + kc + c]);
            ks[r][c] = x;
        }
        __syncthreads();
#pragma unroll
        for (int m = 0; m < 16; ++m) {
            const int idx = tid + 256 * m;
            const int i = idx >> 6, j = idx & 63;
            if (j < i) {
                float s = acc[m];
                for (int c = 0; c < 32; ++c) s += ks[i][c] * ks[j][c];
                acc[m] = s;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < 16; ++m) {
        const int idx = tid + 256 * m;
        const int i = idx >> 6, j = idx & 63;
        float a = 0.f;
        if (j < i && i < n) {
            const long long ri = (bos + t0 + i) * H + h, rj = (bos + t0 + j) * H + h;
            // b_A *= exp2(b_g_i - b_g_j); b_A = b_A * b_b[:, None]
            a = acc[m] * exp2f(gc[ri] - gc[rj]) * e2f(beta[ri]);
        }
        Lm[i][j] = a;
    }
    __syncthreads();
    // Forward substitution, one row at a time: Ti[i] = e_i - sum_{j<i} L[i][j] Ti[j].
    for (int i = 0; i < BT; ++i) {
        if (tid < BT) {
            float s = (i == tid) ? 1.f : 0.f;
            for (int j = 0; j < i; ++j) s -= Lm[i][j] * Ti[j][tid];
            Ti[i][tid] = s;
        }
        __syncthreads();
    }
    for (int idx = tid; idx < n * BT; idx += blockDim.x) {
        const int i = idx >> 6, c = idx & 63;
        A[((bos + t0 + i) * H + h) * BT + c] = f2e(Ti[i][c]);
    }
}

// fla/ops/gated_delta_rule/wy_fast.py recompute_w_u_fwd_kernel:
// u = A @ (v * beta), w = A @ (k * beta * exp2(g)). Grid (NT, H), 256 threads.
extern "C" __global__ void vt_gdn_recompute_w_u(const E* __restrict__ k, const E* __restrict__ v,
                                                const E* __restrict__ beta, const float* __restrict__ gc,
                                                const E* __restrict__ A, E* __restrict__ w, E* __restrict__ u,
                                                const long long* cu, const long long* ci, long long T, int H,
                                                int HK, int K, int V) {
    __shared__ float As[BT][BT + 1];
    __shared__ float xs[BT][BT + 1];
    const int tid = threadIdx.x;
    const int h = blockIdx.y;
    const int hk = h / (H / HK);
    long long bos, len, it;
    chunk_pos(cu, ci, T, blockIdx.x, &bos, &len, &it);
    const long long t0 = it * BT;
    const int n = (int)min((long long)BT, len - t0);

    for (int idx = tid; idx < BT * BT; idx += blockDim.x) {
        const int i = idx >> 6, j = idx & 63;
        As[i][j] = i < n ? e2f(A[((bos + t0 + i) * H + h) * BT + j]) : 0.f;
    }
    for (int c0 = 0; c0 < V; c0 += BT) {
        __syncthreads();
        for (int idx = tid; idx < BT * BT; idx += blockDim.x) {
            const int r = idx >> 6, c = idx & 63;
            float x = 0.f;
            if (r < n && c0 + c < V) {
                const long long row = bos + t0 + r;
                // b_vb = (b_v * b_b[:, None]).to(b_v.dtype)
                x = rnd(e2f(v[(row * H + h) * (long long)V + c0 + c]) * e2f(beta[row * H + h]));
            }
            xs[r][c] = x;
        }
        __syncthreads();
        for (int idx = tid; idx < BT * BT; idx += blockDim.x) {
            const int i = idx >> 6, c = idx & 63;
            if (i < n && c0 + c < V) {
                float s = 0.f;
                for (int j = 0; j < BT; ++j) s += As[i][j] * xs[j][c];
                u[((bos + t0 + i) * H + h) * (long long)V + c0 + c] = f2e(s);
            }
        }
    }
    for (int c0 = 0; c0 < K; c0 += BT) {
        __syncthreads();
        for (int idx = tid; idx < BT * BT; idx += blockDim.x) {
            const int r = idx >> 6, c = idx & 63;
            float x = 0.f;
            if (r < n && c0 + c < K) {
                const long long row = bos + t0 + r;
                // b_kb = b_k * b_b[:, None] (input dtype); b_kb *= exp2(b_g) (fp32); .to(b_k.dtype)
                const float kb = rnd(e2f(k[(row * HK + hk) * (long long)K + c0 + c]) * e2f(beta[row * H + h]));
                x = rnd(kb * exp2f(gc[row * H + h]));
            }
            xs[r][c] = x;
        }
        __syncthreads();
        for (int idx = tid; idx < BT * BT; idx += blockDim.x) {
            const int i = idx >> 6, c = idx & 63;
            if (i < n && c0 + c < K) {
                float s = 0.f;
                for (int j = 0; j < BT; ++j) s += As[i][j] * xs[j][c];
                w[((bos + t0 + i) * H + h) * (long long)K + c0 + c] = f2e(s);
            }
        }
    }
}

// fla/ops/common/chunk_delta_h.py chunk_gated_delta_rule_fwd_kernel_h_blockdim64:
// the state S [K, V] (fp32) walked chunk by chunk through each sequence.
//   h[c] = S (stored in the input dtype, the state *before* chunk c)
//   v_new = u - w @ S (S rounded to the input dtype, as b_h.to(b_w.dtype))
//   S = S * exp2(g_last) + k^T @ round(v_new * exp2(g_last - g))
// Grid (ceil(V/32), N, H), 256 threads; each block owns 32 columns of S.
extern "C" __global__ void vt_gdn_chunk_fwd_h(const E* __restrict__ k, const E* __restrict__ w,
                                              const E* __restrict__ u, const float* __restrict__ gc,
                                              const float* __restrict__ h0, E* __restrict__ hs,
                                              float* __restrict__ ht, E* __restrict__ v_new, const long long* cu,
                                              const long long* co, long long T, int H, int HK, int K, int V) {
    __shared__ float S[256][32];
    __shared__ float vg[BT][33];
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int seq = blockIdx.y;
    const int h = blockIdx.z;
    const int hk = h / (H / HK);
    const int v = blockIdx.x * 32 + lane;
    const bool vok = v < V;
    long long bos, len, boh;
    if (cu) {
        bos = cu[seq];
        len = cu[seq + 1] - bos;
        boh = co[seq];
    } else {
        bos = 0;
        len = T;
        boh = 0;
    }
    const long long nt = (len + BT - 1) / BT;
    const long long state = ((long long)seq * H + h) * K;
    for (int r = warp; r < K; r += nwarps) S[r][lane] = (h0 && vok) ? h0[(state + r) * V + v] : 0.f;

    for (long long c = 0; c < nt; ++c) {
        __syncthreads();
        const long long t0 = c * BT;
        const int nr = (int)min((long long)BT, len - t0);
        E* hc = hs + ((boh + c) * H + h) * (long long)K * V;
        if (vok)
            for (int r = warp; r < K; r += nwarps) hc[(long long)r * V + v] = f2e(S[r][lane]);
        const float glast = gc[(bos + t0 + nr - 1) * H + h];
        for (int t = warp; t < BT; t += nwarps) {
            float val = 0.f;
            if (t < nr && vok) {
                const long long row = bos + t0 + t;
                const E* wr = w + (row * H + h) * (long long)K;
                float acc = 0.f;
                for (int kk = 0; kk < K; ++kk) acc += e2f(wr[kk]) * rnd(S[kk][lane]);
                const float vn = e2f(u[(row * H + h) * (long long)V + v]) - acc;
                v_new[(row * H + h) * (long long)V + v] = f2e(vn);
                // b_v = b_v * exp2(b_g_last - b_g); b_v = b_v.to(k.dtype)
                val = rnd(vn * exp2f(glast - gc[row * H + h]));
            }
            vg[t][lane] = val;
        }
        __syncthreads();
        const float eg = exp2f(glast);
        for (int r = warp; r < K; r += nwarps) {
            float s = S[r][lane] * eg;
            for (int t = 0; t < nr; ++t) s += e2f(k[((bos + t0 + t) * HK + hk) * (long long)K + r]) * vg[t][lane];
            S[r][lane] = s;
        }
    }
    __syncthreads();
    if (ht && vok)
        for (int r = warp; r < K; r += nwarps) ht[(state + r) * V + v] = S[r][lane];
}

// fla/ops/common/chunk_o.py chunk_fwd_kernel_o:
//   o = scale * exp2(g) * (q @ h[c]) + scale * (round(causal(q k^T * exp2(g_i - g_j))) @ v_new)
// Grid (NT, H), 256 threads.
extern "C" __global__ void vt_gdn_chunk_fwd_o(const E* __restrict__ q, const E* __restrict__ k,
                                              const E* __restrict__ v_new, const E* __restrict__ hs,
                                              const float* __restrict__ gc, E* __restrict__ o, const long long* cu,
                                              const long long* ci, long long T, int H, int HK, int K, int V,
                                              float scale) {
    __shared__ float qs[BT][33];
    __shared__ float ks[BT][33];
    __shared__ float Aq[BT][BT + 1];
    const int tid = threadIdx.x;
    const int h = blockIdx.y;
    const int hk = h / (H / HK);
    long long bos, len, it;
    chunk_pos(cu, ci, T, blockIdx.x, &bos, &len, &it);
    const long long t0 = it * BT;
    const int n = (int)min((long long)BT, len - t0);
    // The global chunk number indexes h in both layouts (chunk_offsets[seq] + it).
    const E* hc = hs + ((long long)blockIdx.x * H + h) * (long long)K * V;

    float acc[16];
#pragma unroll
    for (int m = 0; m < 16; ++m) acc[m] = 0.f;
    for (int kc = 0; kc < K; kc += 32) {
        for (int idx = tid; idx < BT * 32; idx += blockDim.x) {
            const int r = idx >> 5, c = idx & 31;
            float xq = 0.f, xk = 0.f;
            if (r < n && kc + c < K) {
                const long long off = ((bos + t0 + r) * HK + hk) * (long long)K + kc + c;
                xq = e2f(q[off]);
                xk = e2f(k[off]);
            }
            qs[r][c] = xq;
            ks[r][c] = xk;
        }
        __syncthreads();
#pragma unroll
        for (int m = 0; m < 16; ++m) {
            const int idx = tid + 256 * m;
            const int i = idx >> 6, j = idx & 63;
            if (j <= i) {
                float s = acc[m];
                for (int c = 0; c < 32; ++c) s += qs[i][c] * ks[j][c];
                acc[m] = s;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < 16; ++m) {
        const int idx = tid + 256 * m;
        const int i = idx >> 6, j = idx & 63;
        float a = 0.f;
        if (j <= i && i < n) {
            // b_A * exp2(b_g_i - b_g_j), masked causal, then b_A.to(b_v.dtype)
            a = rnd(acc[m] * exp2f(gc[(bos + t0 + i) * H + h] - gc[(bos + t0 + j) * H + h]));
        }
        Aq[i][j] = a;
    }
    __syncthreads();
    for (int idx = tid; idx < BT * V; idx += blockDim.x) {
        const int i = idx / V, c = idx % V;
        if (i >= n) continue;
        const long long row = bos + t0 + i;
        const E* qr = q + (row * HK + hk) * (long long)K;
        float a1 = 0.f;
        for (int kk = 0; kk < K; ++kk) a1 += e2f(qr[kk]) * e2f(hc[(long long)kk * V + c]);
        float a2 = 0.f;
        for (int j = 0; j <= i; ++j) a2 += Aq[i][j] * e2f(v_new[((bos + t0 + j) * H + h) * (long long)V + c]);
        // b_o = b_o * exp2(b_g); b_o = b_o * scale + dot(b_A, b_v) * scale
        const float out = a1 * exp2f(gc[row * H + h]) * scale + a2 * scale;
        o[(row * H + h) * (long long)V + c] = f2e(out);
    }
}

// FlashAttention-2 varlen forward (csrc/flash_attn/flash_api.cpp mha_varlen_fwd):
// out [total_q, H, D] and softmax_lse in fp32, either unpadded [H, total_q]
// (FA >= 2.6) or padded [B, H, max_seqlen_q] (FA <= 2.5). Causal masks are
// aligned to the bottom right, as FA >= 2.1 does when seqlen_k != seqlen_q.
// One warp per (query, head), online softmax in fp32.
// Grid (ceil(max_seqlen_q / 4), B, H), 128 threads.
extern "C" __global__ void vt_flash_attn_varlen_fwd(const E* __restrict__ q, const E* __restrict__ k,
                                                    const E* __restrict__ v, const int* __restrict__ cu_q,
                                                    const int* __restrict__ cu_k, E* __restrict__ out,
                                                    float* __restrict__ lse, int H, int HKV, int D, float scale,
                                                    int causal, int padded_lse, int max_seqlen_q, long long total_q) {
    const int lane = threadIdx.x & 31;
    const int i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int b = blockIdx.y;
    const int h = blockIdx.z;
    const int hk = h / (H / HKV);
    const int bq = cu_q[b], lq = cu_q[b + 1] - bq;
    const int bk = cu_k[b], lk = cu_k[b + 1] - bk;
    if (i >= lq) return;
    int nkeys = lk;
    if (causal) nkeys = max(0, min(lk, lk - lq + i + 1));
    float qv[8], acc[8];
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        const int d = lane + 32 * m;
        qv[m] = d < D ? e2f(q[((long long)(bq + i) * H + h) * D + d]) : 0.f;
        acc[m] = 0.f;
    }
    const float neg_inf = __int_as_float(0xff800000);
    float mx = neg_inf, l = 0.f;
    for (int j = 0; j < nkeys; ++j) {
        const long long kv = ((long long)(bk + j) * HKV + hk) * D;
        float s = 0.f;
#pragma unroll
        for (int m = 0; m < 8; ++m) {
            const int d = lane + 32 * m;
            if (d < D) s += qv[m] * e2f(k[kv + d]);
        }
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= scale;
        const float mnew = fmaxf(mx, s);
        const float corr = expf(mx - mnew);
        const float p = expf(s - mnew);
        l = l * corr + p;
#pragma unroll
        for (int m = 0; m < 8; ++m) {
            const int d = lane + 32 * m;
            if (d < D) acc[m] = acc[m] * corr + p * e2f(v[kv + d]);
        }
        mx = mnew;
    }
    const long long row = bq + i;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        const int d = lane + 32 * m;
        if (d < D) out[(row * H + h) * D + d] = f2e(l > 0.f ? acc[m] / l : 0.f);
    }
    if (lane == 0) {
        const float val = l > 0.f ? mx + logf(l) : __int_as_float(0x7f800000);
        if (padded_lse)
            lse[((long long)b * H + h) * max_seqlen_q + i] = val;
        else
            lse[(long long)h * total_q + row] = val;
    }
}
