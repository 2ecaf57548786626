//! A stand-in `libcuda.so.1`: the CUDA driver API backed by host bookkeeping,
//! so that the vramtrace interposer and the reference workload run end to end
//! on machines without a GPU (CI, laptops).
//!
//! It is a test double, not an emulator: no kernel ever runs and device memory
//! holds no bytes. What it gets right is everything an allocation tracer
//! observes: allocation sizes, fake but stable device addresses, capacity and
//! `CUDA_ERROR_OUT_OF_MEMORY`, a truthful `cuMemGetInfo_v2`, the error codes of
//! the real driver for bad frees and stale handles, contexts per thread, and
//! `cuGetProcAddress(_v2)` with base names, versions, `_ptsz` twins and the
//! self-lookup, as the CUDA 13 runtime uses it.
//!
//! # Using it
//!
//! Build the crate and make the loader find `libcuda.so.1` (or `libcuda.so`)
//! in the target directory before any real driver, for example by linking
//! `libcuda.so.1 -> target/debug/libcuda.so` into a directory on
//! `LD_LIBRARY_PATH`:
//!
//! ```sh
//! cargo build -p vramtrace-fakecuda
//! mkdir -p /tmp/fakecuda && ln -sf "$PWD/target/debug/libcuda.so" /tmp/fakecuda/libcuda.so.1
//! LD_LIBRARY_PATH=/tmp/fakecuda VRAMTRACE_FAKE_CAPACITY=16GiB my-cuda-program
//! ```
//!
//! # Configuration
//!
//! Read once, on the first `cuInit`. Unset or empty variables take defaults.
//!
//! | Variable | Meaning | Default |
//! |---|---|---|
//! | `VRAMTRACE_FAKE_DEVICES` | device count, 0–8 (0: `cuInit` gives `CUDA_ERROR_NO_DEVICE`) | 1, or the length of a capacity list |
//! | `VRAMTRACE_FAKE_CAPACITY` | bytes per device: `25769803776`, `24GiB`, `512MiB`, `80GB`, ...; a comma-separated list gives one value per device | `24GiB` |
//! | `VRAMTRACE_FAKE_NAME` | what `cuDeviceGetName` reports | `vramtrace stand-in GPU` |
//!
//! A value that cannot be understood makes `cuInit` return
//! `CUDA_ERROR_INVALID_VALUE` and prints one line naming the variable on
//! stderr. Nothing is ever printed on stdout.
//!
//! # Design constraints
//!
//! - **Accounting is exact.** The bytes asked for are the bytes charged (pitch
//!   × height for pitched memory, the descriptor's size for arrays), so tests
//!   can assert exact numbers: an allocation that fits in the free memory
//!   succeeds and one byte more fails with `CUDA_ERROR_OUT_OF_MEMORY`,
//!   changing nothing. Physical memory (`cuMemAlloc*`, `cuMemAllocManaged`,
//!   stream-ordered allocations, arrays, `cuMemCreate`) counts; address-space
//!   reservations and mappings do not; pinned host memory is real and tracked
//!   apart.
//! - **Device addresses are fake.** Device *d* hands out 512-byte aligned
//!   addresses in `0x1000_0000_0000 + d·2⁴³`, far from where Linux maps real
//!   memory, never reusing an address still live. Dereferencing one faults.
//! - **Work completes immediately.** Streams and events are validated handles;
//!   synchronisation succeeds at once; a device-to-host copy writes zeros.
//! - **Our own symbols.** The library is linked with `-Bsymbolic-functions`,
//!   so `cuGetProcAddress` returns this library's functions even when an
//!   `LD_PRELOAD`ed interposer exports the same names.
//! - **One lock.** All bookkeeping sits behind one mutex; the current context
//!   is thread-local. No panic crosses the C boundary.
//!
//! Besides the CUDA API the library exports `vramtrace_fake_call_count(name)`,
//! the number of calls of an exported function so far, so tests can check
//! which entry points a client really used.

// Every exported function follows the CUDA driver API's own contract for its
// pointer arguments; repeating it in a `# Safety` section on each of them
// would add nothing.
#![allow(clippy::missing_safety_doc)]

mod abi;
mod address_space;
mod api;
mod attributes;
mod config;
mod driver;
mod proc_table;
mod result;
mod state;
