//! `libvramtrace_preload.so`: an `LD_PRELOAD` interposer that records every device allocation
//! the CUDA driver sees into a vramtrace trace file (format: `vramtrace_format`).
//!
//! ```text
//! VRAMTRACE_DIR=/tmp/trace LD_PRELOAD=target/debug/libvramtrace_preload.so python3 train.py
//! vramtrace events /tmp/trace
//! ```
//!
//! # What it hooks
//! - `dlsym`, so that lookups on a driver handle (cudart, cudarc, anything that `dlopen`s
//!   libcuda) get our wrappers; `dlvsym`, so that another `dlsym` interposer loaded before us,
//!   which finds "the next `dlsym`" with `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`, gets ours
//!   rather than glibc's (`src/dlsym.rs`); `cuGetProcAddress` and `cuGetProcAddress_v2`,
//!   including the runtime's self-lookup, so that every entry point resolved through them does
//!   too.
//! - The allocation entry points, also exported under their own names for programs linked to
//!   libcuda directly: `cuMemAlloc_v2`, `cuMemAllocPitch_v2`, `cuMemAllocManaged`,
//!   `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemFree_v2`, `cuMemFreeAsync` (and the
//!   `_ptsz` twins of the async ones), `cuMemCreate`, `cuMemRelease`, `cuMemMap`, `cuMemUnmap`,
//!   `cuMemAddressReserve`, `cuMemAddressFree`, `cuMemAllocHost_v2`, `cuMemHostAlloc`,
//!   `cuMemFreeHost`, `cuArrayCreate_v2`, `cuArray3DCreate_v2`, `cuArrayDestroy`.
//!
//! A wrapper handed out by `dlsym` or `cuGetProcAddress` is chosen by the *address* the real
//! driver returned, so its ABI is the one the driver chose (version, `_ptsz` twin); see
//! `src/routing.rs` for the routing and what it assumes of the driver.
//!
//! # What each event carries
//! Monotonic time, thread, device (current context; `cuMemCreate`'s location; -1 for host
//! memory, and for successful releases, whose device the reader takes from the allocation
//! they release), the driver function, pointer or handle, requested size (0 for releases: the
//! reader pairs them), result code, stream, an extra operand (pool, pitch, physical handle,
//! host flags, released range size), free and total device memory for failed allocations (our
//! own `cuMemGetInfo_v2`), the native stack (`src/stacks.rs`, with MODULE records for offline
//! symbolisation; a successful release's only with `VRAMTRACE_FREE_STACKS=1`), on a CPython
//! thread the Python frames beside it (file, function, line; a PY_STACK record under the same
//! stack id, `src/python.rs`, CPython 3.10 to 3.13, read without the GIL and without importing
//! anything) and the label (the thread's open ranges, `src/labels.rs`).
//!
//! # Labels
//! - The annotation C ABI, declared in `include/vramtrace.h`: `vramtrace_annotate`,
//!   `vramtrace_annotate_op` (an operator's output, ABI 2),
//!   `vramtrace_range_push`, `vramtrace_range_pop`, `vramtrace_mark`, `vramtrace_abi_version`.
//!   Callers find them with `dlsym(RTLD_DEFAULT, …)`; the header's `vramtrace_try_*` helpers
//!   are no-ops without the preload.
//! - The tensor ABI, `vramtrace_tensor`, its five-argument `vramtrace_tensor_block` for the
//!   per-tensor reports (`src/tensors.rs`): PyTorch's caching allocator as the
//!   Python probe sees it (blocks handed out and taken back, refused requests with PyTorch's own
//!   numbers), each a TENSOR record with the reporting thread's Python frames.
//! - Native tensor capture (`src/torch_tracker.rs`): a trace tracker attached to PyTorch's
//!   caching allocator (`vramtrace_torch_native_attach`, checked by the probe, then
//!   `vramtrace_torch_native_enable`) and the allocator's own call to libc10's exported
//!   `c10::reportMemoryUsageToProfiler`, which the preload also exports and passes on: each
//!   block a TENSOR record, with no Python callback.
//! - `vramtrace_note` (`src/notes.rs`): a NOTE record from a probe; the PyTorch probe says with
//!   it whether it started in the process and why not (a standing note, written into the file
//!   when the process records anything, and into a fork child's file).
//! - NVTX: with `NVTX_INJECTION64_PATH` set to this library, `InitializeInjectionNvtx2` accepts
//!   NVTX's injection and turns range pushes/pops and marks into the same ranges
//!   (`src/nvtx.rs`).
//!
//! # Environment
//! - `VRAMTRACE_DIR`: the trace directory (created if missing). Unset or empty: the library
//!   does nothing but pass calls through.
//! - `VRAMTRACE_DISABLE`: any value but empty or `0` turns recording off.
//! - `VRAMTRACE_STACKS`: `0` (or `off`, `false`, `no`) records no native stacks.
//! - `VRAMTRACE_FREE_STACKS`: `1` (or `on`, `true`, `yes`) also records the native stacks of
//!   successful releases (off by default: allocations, mappings and failures get theirs).
//! - `VRAMTRACE_PYTHON`: `0` (or `off`, `false`, `no`) records no Python frames.
//! - `VRAMTRACE_MAX_SIZE`: a size budget in bytes: tensor-level records go into droppable
//!   blocks, the oldest reused once the file would pass it (`src/sink.rs`); the live tensors
//!   are kept in a table and restated, and written whole at failures and on `SIGUSR2` (a
//!   flight record, `src/live_tensors.rs`; the handler is installed only where the program has
//!   none).
//!
//! Each process writes `<dir>/<pid>.vtr` (`<pid>-<n>.vtr` if the name is taken), created
//! exclusively on its first recorded event (or its first range, mark or annotation): a program
//! that never touches CUDA writes nothing. Children made by `fork` write their own file; `exec`'d
//! and spawned children inherit `LD_PRELOAD` and `VRAMTRACE_DIR` and do the same.
//!
//! # Design constraints
//! - **Never changes what the program sees.** The real function is always called first and its
//!   result returned unchanged; nothing goes to stdout; stderr gets one line if recording stops
//!   because of an error. A recorder failure (write error, panic) stops recording, never the
//!   host: panics are caught at every FFI boundary, errno is preserved.
//! - **Cheap.** A process that never touches CUDA pays one comparison per `dlsym` on a handle
//!   (`RTLD_NEXT`/`RTLD_DEFAULT` lookups are a tail jump). The hot path allocates nothing and
//!   makes no system call: a record is encoded on the stack and stored into the thread's block
//!   of a shared file mapping (format version 2), so every record stored before a `SIGKILL` is
//!   in the page cache. The locks are the stack unwinder's spin lock and the sink's, taken
//!   only to reserve and map more of the file, and under a size budget the ring's (once per
//!   64 KiB block) and the live-tensor table's (once per tensor report); none is held while
//!   the driver runs.
//! - **Lazy and fork-aware.** Nothing happens in constructors (they run while the dynamic linker
//!   sets the process up); the environment is read and the file created on first use. A fork
//!   child forgets the parent's file, strings and stacks and creates its own file, with its own
//!   pid and ppid.
//! - **Re-entrancy.** A per-thread RAII guard (`src/guard.rs`) passes nested hooked
//!   calls straight through.
//! - Depends on `vramtrace-format`, `libc` and `framehop`. Linux with glibc (2.17 or newer), on
//!   x86-64 and aarch64.
//!
//! # Layers
//! Each module imports only from those below it. Bottom to top: the leaves `clock` (the
//! monotonic clock, from the TSC where that is safe), `config`, `ffi`, `guard`, `fork` (each
//! module that keeps per-process state registers its own fork child handler) and `real_dlsym`
//! (glibc's `dlsym` and `dlvsym`, read from glibc's symbol table by `elf_lookup`); `driver`, the table of the driver's real entry points; `sink`, the trace
//! file (per-thread blocks in a shared mapping, the clock, the thread id, the file's fork
//! handling); `intern`, `modules`, `stacks`, `labels`, `notes`, `live_tensors` and `nvtx`, which
//! need only the sink (`stacks` asks `python`, which reads the interpreter's frames and interns
//! their names, for the Python half of a stack); `recorder`, one body per event family, with its stack and label; `tensors` (the tensor ABI) and
//! `torch_tracker` (native capture, which writes through `tensors` and notes through `recorder`);
//! `hooks`, the recording wrappers; `routing`, which hands those wrappers out for the driver's
//! pointers and wraps `cuGetProcAddress`; `dlsym`, the `dlsym` and `dlvsym` overrides, and `attach`, what `vramtrace attach` calls
//! in a running process, on top.

mod attach;
mod clock;
mod config;
mod dlsym;
mod driver;
mod elf_lookup;
mod ffi;
mod fork;
mod guard;
mod hooks;
mod intern;
mod labels;
mod live_tensors;
mod modules;
mod notes;
mod nvtx;
mod python;
mod real_dlsym;
mod recorder;
mod routing;
mod self_time;
mod sink;
mod stacks;
mod tensors;
mod torch_tracker;

pub use attach::{
    vramtrace_attach_pid, vramtrace_attach_python, vramtrace_attach_real, vramtrace_attach_seed,
    vramtrace_attach_seed_block, vramtrace_attach_start, vramtrace_attach_state,
    vramtrace_attach_stop,
};
pub use dlsym::{dlsym, dlvsym};
pub use hooks::*;
pub use labels::{
    VRAMTRACE_ABI_VERSION, vramtrace_abi_version, vramtrace_annotate, vramtrace_annotate_op,
    vramtrace_mark, vramtrace_range_pop, vramtrace_range_push,
};
pub use notes::{NOTE_STANDING, vramtrace_note};
pub use nvtx::InitializeInjectionNvtx2;
pub use routing::{cuGetProcAddress, cuGetProcAddress_v2};
pub use tensors::{vramtrace_tensor, vramtrace_tensor_block, vramtrace_tensor_pause};
pub use torch_tracker::{
    report_memory_usage_to_profiler, vramtrace_torch_native_attach, vramtrace_torch_native_enable,
    vramtrace_torch_native_last,
};
