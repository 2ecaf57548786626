// A CPU emulation of the small part of CUDA that kernels.cu uses, so that the
// kernels themselves (index math, barriers, shuffles, launch configurations and
// argument order) can be tested without a GPU. Each block's threads are OS
// threads; __syncthreads is a std::barrier over the block, __shfl_xor_sync one
// over the warp. Blocks run one after another, so `__shared__` is a static.
// Test support only: never linked into vramtrace.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

struct vt_dim3 {
    unsigned x = 0, y = 0, z = 0;
};

// `static`, not `inline`: GCC makes inline variables STB_GNU_UNIQUE, which the
// dynamic linker merges across libraries even under RTLD_LOCAL, so the bf16 and
// f32 builds of the emulator would share one device.
static thread_local vt_dim3 threadIdx;
static thread_local vt_dim3 blockIdx;
static vt_dim3 blockDim;
static vt_dim3 gridDim;

static std::barrier<>* vt_block_barrier = nullptr;
static std::vector<std::unique_ptr<std::barrier<>>> vt_warp_barriers;
static std::vector<float> vt_warp_lanes;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

using std::max;
using std::min;

inline void __syncthreads() { vt_block_barrier->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    const unsigned t = threadIdx.x;
    const unsigned warp = t / 32, lane = t % 32;
    float* lanes = &vt_warp_lanes[warp * 32];
    lanes[lane] = v;
    vt_warp_barriers[warp]->arrive_and_wait();
    const float r = lanes[lane ^ lane_mask];
    vt_warp_barriers[warp]->arrive_and_wait();
    return r;
}

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
