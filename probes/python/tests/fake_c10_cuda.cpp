// A stand-in for the parts of PyTorch's libc10_cuda.so the probe and the preload use, with
// the same symbols and calling conventions (the layouts are written from PyTorch 2.11's
// headers, c10/core/CachingDeviceAllocator.h and c10/cuda/CUDACachingAllocator.h):
//
// - `c10::cuda::CUDACachingAllocator::allocator`, the exported atomic allocator pointer, to a
//   `NativeCachingAllocator` whose methods are hidden, as in PyTorch's wheels (found through
//   the symbol table, not the dynamic one):
//   - `getDeviceStats`, returning a DeviceStats in PyTorch's field order (the probe's native
//     size source on the callback path, probes/python/vramtrace_torch.py, _NativeCounters);
//   - `attachAllocatorTraceTracker(std::function<void(const TraceEntry&)>)`, a virtual method
//     (native capture, probes/preload/src/torch_tracker.rs).
// - A caching allocator of sorts, `fake_c10_malloc` / `fake_c10_free` (called by the stand-in
//   torch package, fake_torch/torch/cuda): under one lock per device, as PyTorch's
//   `DeviceCachingAllocator`, it calls the trackers with an ALLOC entry (the bytes asked for),
//   then moves its statistics, then calls libc10's `c10::reportMemoryUsageToProfiler` with the
//   block's size; a free calls them with FREE_REQUESTED, FREE_COMPLETED and a negative size.
//   Blocks are the request rounded up to 512 bytes, and above 1 MiB to whole MiB (so that a
//   block's size cannot be told from the request alone), carved in turn from 20 MiB segments
//   (SEGMENT_ALLOC entries announce each new one). With FAKE_C10_DAWDLE=1 each
//   allocation sleeps 50 µs between its trace entry and its report, so that two threads on
//   two devices interleave there.
//
// FAKE_C10_SKEW=1 makes getDeviceStats disagree with the statistics dictionary;
// FAKE_C10_ALLOCATOR=other puts another allocator class behind the allocator pointer;
// FAKE_C10_NO_REPORT=1 leaves libc10's report function uncalled;
// FAKE_C10_LAYOUT=skew swaps the stream and size fields of every TraceEntry (a PyTorch whose
// layout is not the one the preload reads). Built by tests/torch_probe_cli.rs into a copy of
// fake_torch (torch/lib/libc10_cuda.so, linked to the stand-in torch/lib/libc10.so).
#include <array>
#include <chrono>
#include <thread>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace c10 {
enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
struct Device { DeviceType type; int8_t index; };
void reportMemoryUsageToProfiler(void* ptr, int64_t alloc_size, size_t total_allocated,
                                 size_t total_reserved, Device device);
struct GatheredContext { virtual ~GatheredContext() = default; };

namespace CachingDeviceAllocator {
struct TraceEntry {
  enum Action { ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP,
                SEGMENT_UNMAP, SNAPSHOT, OOM };
  Action action_;
  int8_t device_;
  size_t addr_;
  std::shared_ptr<GatheredContext> context_;
  void* stream_ = nullptr;
  size_t size_;
  std::pair<unsigned long long, unsigned long long> mempool_;
  uint64_t time_ = 0;
  std::string compile_context_;
  std::string user_metadata_;
};
using AllocatorTraceTracker = std::function<void(const TraceEntry&)>;
}  // namespace CachingDeviceAllocator

namespace cuda { namespace CUDACachingAllocator {
using CachingDeviceAllocator::AllocatorTraceTracker;
using CachingDeviceAllocator::TraceEntry;
struct Stat { int64_t current = 0, peak = 0, allocated = 0, freed = 0; };
using StatArray = std::array<Stat, 3>;
struct DeviceStats {
  StatArray allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes,
      active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries = 0, num_ooms = 0;
  Stat oversize_allocations, oversize_segments;
  int64_t max_split_size = 0;
};
struct CUDAAllocator {
  virtual ~CUDAAllocator() {}
  virtual DeviceStats getDeviceStats(signed char) = 0;
  virtual void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) = 0;
};
namespace Native {
constexpr int kDevices = 2;
struct DeviceState {
  std::recursive_mutex mutex;
  std::vector<AllocatorTraceTracker> trackers;
  std::unordered_map<uint64_t, std::pair<size_t, size_t>> live;  // ptr -> (block, requested)
  std::unordered_map<uint64_t, uint64_t> segment_of;               // ptr -> its segment's base
  uint64_t seg_base = 0, seg_next = 0, seg_end = 0;  // the segment blocks are carved from
  int64_t allocated = 0, requested = 0, reserved = 0;
};
struct NativeCachingAllocator : CUDAAllocator {
  int64_t a = 0, r = 0;
  std::array<DeviceState, kDevices> devices;
  DeviceStats getDeviceStats(signed char device) override;
  void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) override;
};
// Hidden, as in PyTorch's wheels: found through the symbol table, not the dynamic one.
__attribute__((visibility("hidden"))) DeviceStats NativeCachingAllocator::getDeviceStats(signed char device) {
  DeviceStats s; s.allocated_bytes[0].current = a + device; s.requested_bytes[0].current = r; return s;
}
__attribute__((visibility("hidden"))) void NativeCachingAllocator::attachAllocatorTraceTracker(
    AllocatorTraceTracker tracker) {
  for (auto& d : devices) {
    std::lock_guard<std::recursive_mutex> lock(d.mutex);
    d.trackers.push_back(tracker);
  }
}
static NativeCachingAllocator native;
}  // namespace Native
// Another allocator class (as with `backend:cudaMallocAsync`): its vtable is not the native one.
struct OtherAllocator : CUDAAllocator {
  DeviceStats getDeviceStats(signed char) override { return {}; }
  void attachAllocatorTraceTracker(AllocatorTraceTracker) override {}
};
static OtherAllocator other;
static CUDAAllocator* in_use() {
  const char* s = std::getenv("FAKE_C10_ALLOCATOR");
  if (s && std::string(s) == "other") return &other;
  return &Native::native;
}
__attribute__((visibility("default"))) std::atomic<CUDAAllocator*> allocator{in_use()};
}}  // namespace cuda::CUDACachingAllocator
}  // namespace c10

using namespace c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::TraceEntry;

static bool skewed_layout() {
  static const bool skew = [] {
    const char* s = std::getenv("FAKE_C10_LAYOUT");
    return s && std::string(s) == "skew";
  }();
  return skew;
}

static void trace(Native::DeviceState& d, TraceEntry::Action action, int device, uint64_t ptr,
                  size_t size, uint64_t stream) {
  if (d.trackers.empty()) return;
  TraceEntry e{action, static_cast<int8_t>(device), ptr, nullptr,
               reinterpret_cast<void*>(stream), size, {0, 0}};
  if (skewed_layout()) std::swap(reinterpret_cast<size_t&>(e.stream_), e.size_);
  for (const auto& t : d.trackers) t(e);
}

static bool env_on(const char* name) {
  const char* s = std::getenv(name);
  return s && s[0] == '1';
}
// FAKE_C10_DAWDLE=1: each allocation sleeps between its trace entry and its report.
static bool dawdle() {
  static const bool on = env_on("FAKE_C10_DAWDLE");
  return on;
}
// FAKE_C10_NO_REPORT=1: blocks are not reported to libc10 (a PyTorch that stopped calling it).
static bool no_report() {
  static const bool on = env_on("FAKE_C10_NO_REPORT");
  return on;
}

static size_t block_of(size_t size) {
  size_t b = (size + 511) / 512 * 512;
  if (size > (1u << 20)) b = (size + (1u << 20) - 1) >> 20 << 20;
  return b;
}

static std::atomic<uint64_t> next_ptr{0x7e00'0000'0000};

constexpr uint64_t kSegment = 20u << 20;

// The block handed out for `size` bytes on `device` for `stream`; its size in `*block`, the
// base of the segment it was carved from in `*segment`. A block that does not fit in the
// device's current segment gets a new one (20 MiB, or the block's size if larger), announced
// to the trackers with SEGMENT_ALLOC, as PyTorch's allocator does after its cudaMalloc.
extern "C" uint64_t fake_c10_malloc(size_t size, int device, uint64_t stream, uint64_t* block,
                                    uint64_t* segment) {
  auto& d = Native::native.devices[device];
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  size_t b = block_of(size);
  if (d.seg_next + b > d.seg_end || d.seg_end == 0) {
    uint64_t seg_size = b > kSegment ? b : kSegment;
    d.seg_base = d.seg_next = next_ptr.fetch_add(seg_size);
    d.seg_end = d.seg_base + seg_size;
    trace(d, TraceEntry::SEGMENT_ALLOC, device, d.seg_base, seg_size, stream);
  }
  uint64_t ptr = d.seg_next;
  d.seg_next += b;
  d.segment_of[ptr] = d.seg_base;
  *segment = d.seg_base;
  trace(d, TraceEntry::ALLOC, device, ptr, size, stream);
  if (dawdle()) std::this_thread::sleep_for(std::chrono::microseconds(50));  // let the other device's thread in
  d.allocated += b; d.requested += size; d.reserved += b;
  d.live[ptr] = {b, size};
  if (!no_report())
    c10::reportMemoryUsageToProfiler(reinterpret_cast<void*>(ptr), static_cast<int64_t>(b),
                                     d.allocated, d.reserved, {c10::DeviceType::CUDA, static_cast<int8_t>(device)});
  *block = b;
  return ptr;
}

// Takes `ptr` back; returns its block's size (0 if it is not live).
extern "C" uint64_t fake_c10_free(uint64_t ptr, int device, uint64_t stream) {
  auto& d = Native::native.devices[device];
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  auto it = d.live.find(ptr);
  if (it == d.live.end()) return 0;
  auto [b, size] = it->second;
  d.live.erase(it);
  d.allocated -= b; d.requested -= size;
  trace(d, TraceEntry::FREE_REQUESTED, device, ptr, size, stream);
  trace(d, TraceEntry::FREE_COMPLETED, device, ptr, size, stream);
  if (!no_report())
    c10::reportMemoryUsageToProfiler(reinterpret_cast<void*>(ptr), -static_cast<int64_t>(b),
                                     d.allocated, d.reserved, {c10::DeviceType::CUDA, static_cast<int8_t>(device)});
  return b;
}

// The stand-in torch package's own counters, for getDeviceStats (the callback path's size
// source).
extern "C" void fake_set(int64_t a, int64_t r) {
  if (const char* s = std::getenv("FAKE_C10_SKEW"); s && s[0] == '1') a += 1;
  Native::native.a = a; Native::native.r = r;
}
