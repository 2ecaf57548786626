// A stand-in for the one function of PyTorch's libc10.so the preload interposes:
// `c10::reportMemoryUsageToProfiler`, which the caching allocator in libc10_cuda.so calls
// through its PLT after each block it hands out (size > 0) or takes back (size < 0). This one
// counts the calls it receives, so a test can tell that the preload passed each one on.
// Built by tests/torch_probe_cli.rs beside the stand-in libc10_cuda.so (torch/lib/libc10.so).
#include <atomic>
#include <cstdint>
#include <cstddef>
namespace c10 {
enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
struct Device { DeviceType type; int8_t index; };
static std::atomic<uint64_t> reports{0};
__attribute__((visibility("default"))) void reportMemoryUsageToProfiler(
    void*, int64_t, size_t, size_t, Device) {
  reports.fetch_add(1);
}
}  // namespace c10
extern "C" __attribute__((visibility("default"))) uint64_t fake_c10_reports() { return c10::reports.load(); }
