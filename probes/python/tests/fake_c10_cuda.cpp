// A stand-in for the two symbols of PyTorch's libc10_cuda.so the probe's native size source
// reads (probes/python/vramtrace_torch.py, _NativeCounters): the allocator pointer
// `c10::cuda::CUDACachingAllocator::allocator` (exported) and
// `NativeCachingAllocator::getDeviceStats` (only in the symbol table),
// returning a DeviceStats in PyTorch's field order. The stand-in torch package
// (fake_torch/torch/cuda) sets its counters with fake_set after each block, as the real
// allocator updates its statistics; FAKE_C10_SKEW=1 makes them disagree with the dictionary.
// Built by tests/torch_probe_cli.rs into a copy of fake_torch (torch/lib/libc10_cuda.so).
#include <cstdint>
#include <array>
#include <atomic>
namespace c10 { namespace cuda { namespace CUDACachingAllocator {
struct Stat { int64_t current = 0, peak = 0, allocated = 0, freed = 0; };
using StatArray = std::array<Stat, 3>;
struct DeviceStats {
  StatArray allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes,
      active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries = 0, num_ooms = 0;
  Stat oversize_allocations, oversize_segments;
  int64_t max_split_size = 0;
};
struct CUDAAllocator { virtual ~CUDAAllocator() {} virtual DeviceStats getDeviceStats(signed char) = 0; };
namespace Native {
struct NativeCachingAllocator : CUDAAllocator {
  int64_t a = 0, r = 0;
  DeviceStats getDeviceStats(signed char device) override;
};
// Hidden, as in PyTorch's wheels: found through the symbol table, not the dynamic one.
__attribute__((visibility("hidden"))) DeviceStats NativeCachingAllocator::getDeviceStats(signed char device) {
  DeviceStats s; s.allocated_bytes[0].current = a + device; s.requested_bytes[0].current = r; return s;
}
static NativeCachingAllocator native;
}
__attribute__((visibility("default"))) std::atomic<CUDAAllocator*> allocator{&Native::native};
}}}
#include <cstdlib>
extern "C" void fake_set(int64_t a, int64_t r) {
  if (const char* s = std::getenv("FAKE_C10_SKEW"); s && s[0] == '1') a += 1;
  c10::cuda::CUDACachingAllocator::Native::native.a = a; c10::cuda::CUDACachingAllocator::Native::native.r = r; }
