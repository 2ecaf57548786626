// Runs kernels.cu on the CPU (see emu.hpp). Exports one entry point:
//   int vt_emu_launch(const char *kernel, const unsigned grid[3], const unsigned block[3],
//                     const uint64_t *args, int nargs)
// Arguments come as 64-bit slots: pointers and int64 as is, int32 and float in the low 32 bits.
// Returns 0, or -1 for an unknown kernel or a wrong argument count.
#include "emu.hpp"

#include "kernels.cu"

#include <functional>
#include <mutex>
#include <thread>

namespace {

template <typename T>
T ptr(uint64_t v) {
    return reinterpret_cast<T>(static_cast<uintptr_t>(v));
}
int i32(uint64_t v) { return static_cast<int>(static_cast<uint32_t>(v)); }
long long i64(uint64_t v) { return static_cast<long long>(v); }
float f32(uint64_t v) { return __uint_as_float(static_cast<uint32_t>(v)); }

std::function<void()> bind(const char* k, const uint64_t* a, int n) {
    auto is = [&](const char* name, int want) { return std::strcmp(k, name) == 0 && n == want; };
    if (is("vt_l2norm_fwd", 6))
        return [=] { vt_l2norm_fwd(ptr<const E*>(a[0]), ptr<E*>(a[1]), ptr<float*>(a[2]), i64(a[3]), i32(a[4]), f32(a[5])); };
    if (is("vt_chunk_local_cumsum", 7))
        return [=] {
            vt_chunk_local_cumsum(ptr<const float*>(a[0]), ptr<float*>(a[1]), ptr<const long long*>(a[2]),
                                  ptr<const long long*>(a[3]), i64(a[4]), i32(a[5]), f32(a[6]));
        };
    if (is("vt_gdn_kkt_solve", 10))
        return [=] {
            vt_gdn_kkt_solve(ptr<const E*>(a[0]), ptr<const float*>(a[1]), ptr<const E*>(a[2]), ptr<E*>(a[3]),
                             ptr<const long long*>(a[4]), ptr<const long long*>(a[5]), i64(a[6]), i32(a[7]), i32(a[8]),
                             i32(a[9]));
        };
    if (is("vt_gdn_recompute_w_u", 14))
        return [=] {
            vt_gdn_recompute_w_u(ptr<const E*>(a[0]), ptr<const E*>(a[1]), ptr<const E*>(a[2]), ptr<const float*>(a[3]),
                                 ptr<const E*>(a[4]), ptr<E*>(a[5]), ptr<E*>(a[6]), ptr<const long long*>(a[7]),
                                 ptr<const long long*>(a[8]), i64(a[9]), i32(a[10]), i32(a[11]), i32(a[12]), i32(a[13]));
        };
    if (is("vt_gdn_chunk_fwd_h", 15))
        return [=] {
            vt_gdn_chunk_fwd_h(ptr<const E*>(a[0]), ptr<const E*>(a[1]), ptr<const E*>(a[2]), ptr<const float*>(a[3]),
                               ptr<const float*>(a[4]), ptr<E*>(a[5]), ptr<float*>(a[6]), ptr<E*>(a[7]),
                               ptr<const long long*>(a[8]), ptr<const long long*>(a[9]), i64(a[10]), i32(a[11]),
                               i32(a[12]), i32(a[13]), i32(a[14]));
        };
    if (is("vt_gdn_chunk_fwd_o", 14))
        return [=] {
            vt_gdn_chunk_fwd_o(ptr<const E*>(a[0]), ptr<const E*>(a[1]), ptr<const E*>(a[2]), ptr<const E*>(a[3]),
                               ptr<const float*>(a[4]), ptr<E*>(a[5]), ptr<const long long*>(a[6]),
                               ptr<const long long*>(a[7]), i64(a[8]), i32(a[9]), i32(a[10]), i32(a[11]), i32(a[12]),
                               f32(a[13]));
        };
    if (is("vt_flash_attn_varlen_fwd", 15))
        return [=] {
            vt_flash_attn_varlen_fwd(ptr<const E*>(a[0]), ptr<const E*>(a[1]), ptr<const E*>(a[2]),
                                     ptr<const int*>(a[3]), ptr<const int*>(a[4]), ptr<E*>(a[5]), ptr<float*>(a[6]),
                                     i32(a[7]), i32(a[8]), i32(a[9]), f32(a[10]), i32(a[11]), i32(a[12]), i32(a[13]),
                                     i64(a[14]));
        };
    return nullptr;
}

}  // namespace

extern "C" int vt_emu_launch(const char* kernel, const unsigned grid[3], const unsigned block[3],
                             const uint64_t* args, int nargs) {
    std::function<void()> body = bind(kernel, args, nargs);
    if (!body || block[1] != 1 || block[2] != 1 || block[0] % 32 != 0) return -1;
    // The emulated device state (blockDim, barriers, __shared__ statics) is
    // global: one launch at a time, whichever thread asks.
    static std::mutex one_launch;
    std::lock_guard<std::mutex> guard(one_launch);
    const unsigned nthreads = block[0];
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {nthreads, 1, 1};
    std::barrier<> block_barrier(nthreads);
    std::barrier<> between_blocks(nthreads);
    vt_block_barrier = &block_barrier;
    vt_warp_barriers.clear();
    for (unsigned w = 0; w < nthreads / 32; ++w) vt_warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
    vt_warp_lanes.assign(nthreads, 0.f);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < nthreads; ++t) {
        threads.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            for (unsigned z = 0; z < grid[2]; ++z)
                for (unsigned y = 0; y < grid[1]; ++y)
                    for (unsigned x = 0; x < grid[0]; ++x) {
                        blockIdx = {x, y, z};
                        body();
                        // Blocks share the static __shared__ arrays: one at a time.
                        between_blocks.arrive_and_wait();
                    }
        });
    }
    for (auto& th : threads) th.join();
    return 0;
}
