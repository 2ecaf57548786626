//! Labels: named ranges per thread, marks, and names given to allocations, from the annotation
//! C ABI (`include/vramtrace.h`) and from NVTX ([`crate::nvtx`]).
//!
//! Each thread keeps its stack of range names as one path (`"prefill/layer.3/gdn"`) with the
//! interned id of every prefix, so an event's label is one array read and a pop is O(1). Ranges
//! deeper than [`MAX_DEPTH`] are counted but not named; the path is cut at [`MAX_PATH`] bytes.
//! After `fork` the child's intern table is empty, so a thread's cached ids are recomputed on
//! first use (the check of [`crate::intern::generation`]).

use core::cell::UnsafeCell;
use core::ffi::{CStr, c_char, c_int};

use vramtrace_format::{Encoder, FRAME_HEADER_LEN, kind};

use crate::intern::intern;
use crate::sink::{File, mono_ns, tid, with_file};

/// Deepest range named on a thread.
pub(crate) const MAX_DEPTH: usize = 64;
/// Longest range path, in bytes.
pub(crate) const MAX_PATH: usize = 1024;
/// Largest rank of an annotated shape that is kept.
pub(crate) const MAX_RANK: usize = 16;

struct RangeStack {
    generation: u32,
    depth: usize,
    /// Pushes beyond MAX_DEPTH not yet popped.
    overflow: usize,
    path: [u8; MAX_PATH],
    /// `path_len[d]`: bytes of the path with `d` ranges open.
    path_len: [u16; MAX_DEPTH + 1],
    /// `label[d]`: interned id of the path with `d` ranges open (`label[0]` = 0, no label).
    label: [u32; MAX_DEPTH + 1],
}

thread_local! {
    // Const-initialised, no destructor: no allocation and no TLS destructor registration.
    static RANGES: UnsafeCell<RangeStack> = const {
        UnsafeCell::new(RangeStack {
            generation: 0,
            depth: 0,
            overflow: 0,
            path: [0; MAX_PATH],
            path_len: [0; MAX_DEPTH + 1],
            label: [0; MAX_DEPTH + 1],
        })
    };
}

/// Runs `f` on this thread's range stack (none during thread teardown).
fn with_ranges<R>(f: impl FnOnce(&mut RangeStack) -> R) -> Option<R> {
    RANGES
        .try_with(|r| {
            // Safety: the stack is only reached through this function, whose callers never
            // nest it, and it is thread-local: this is the only reference.
            f(unsafe { &mut *r.get() })
        })
        .ok()
}

impl RangeStack {
    /// Re-interns every open prefix after a fork (the child's file has none of the strings).
    fn refresh(&mut self, file: File) {
        let generation = crate::intern::generation();
        if self.generation == generation {
            return;
        }
        for d in 1..=self.depth {
            self.label[d] = intern(file, &self.path[..self.path_len[d] as usize]);
        }
        self.generation = generation;
    }

    fn push(&mut self, file: File, name: &[u8]) {
        self.refresh(file);
        if self.depth >= MAX_DEPTH {
            self.overflow += 1;
            return;
        }
        let mut len = self.path_len[self.depth] as usize;
        if self.depth > 0 && len < MAX_PATH {
            self.path[len] = b'/';
            len += 1;
        }
        let take = name.len().min(MAX_PATH - len);
        self.path[len..len + take].copy_from_slice(&name[..take]);
        len += take;
        self.depth += 1;
        self.path_len[self.depth] = len as u16;
        self.label[self.depth] = intern(file, &self.path[..len]);
    }

    fn pop(&mut self) {
        if self.overflow > 0 {
            self.overflow -= 1;
        } else if self.depth > 0 {
            self.depth -= 1;
        }
    }
}

/// The label of an event made now on this thread: the interned range path, 0 outside ranges.
pub(crate) fn current_label(file: File) -> u32 {
    with_ranges(|r| {
        if r.depth == 0 {
            return 0;
        }
        r.refresh(file);
        r.label[r.depth]
    })
    .unwrap_or(0)
}

/// Opens a named range on this thread; returns the depth it opened at (0-based).
pub(crate) fn range_push(name: &[u8]) -> c_int {
    let mut level = 0;
    with_file(|file| {
        let name_id = intern(file, name);
        level = with_ranges(|r| {
            r.push(file, name);
            (r.depth + r.overflow) as c_int - 1
        })
        .unwrap_or(0);
        let mut buf = [0u8; FRAME_HEADER_LEN + 16];
        let mut e = Encoder::new(&mut buf);
        e.u64(mono_ns()).u32(tid()).u32(name_id);
        file.write(e.finish(kind::RANGE_PUSH));
    });
    level
}

/// Closes this thread's innermost range; returns the depth it closed (0-based), -1 if none.
pub(crate) fn range_pop() -> c_int {
    let mut level = -1;
    with_file(|file| {
        level = with_ranges(|r| {
            let open = (r.depth + r.overflow) as c_int;
            r.pop();
            open - 1
        })
        .unwrap_or(-1);
        let mut buf = [0u8; FRAME_HEADER_LEN + 12];
        let mut e = Encoder::new(&mut buf);
        e.u64(mono_ns()).u32(tid());
        file.write(e.finish(kind::RANGE_POP));
    });
    level
}

/// An instantaneous named mark.
pub(crate) fn mark(text: &[u8]) {
    with_file(|file| {
        let name_id = intern(file, text);
        let mut buf = [0u8; FRAME_HEADER_LEN + 16];
        let mut e = Encoder::new(&mut buf);
        e.u64(mono_ns()).u32(tid()).u32(name_id);
        file.write(e.finish(kind::MARK));
    });
}

/// Names the live allocation at `ptr`.
pub(crate) fn annotate(ptr: u64, name: &[u8], dtype: Option<&[u8]>, shape: &[i64], op: bool) {
    with_file(|file| {
        let name_id = intern(file, name);
        let dtype_id = dtype.map_or(0, |d| intern(file, d));
        let shape = &shape[..shape.len().min(MAX_RANK)];
        let mut buf = [0u8; FRAME_HEADER_LEN + 8 + 4 + 8 + 4 + 4 + 2 + 8 * MAX_RANK];
        let mut e = Encoder::new(&mut buf);
        e.u64(mono_ns())
            .u32(tid())
            .u64(ptr)
            .u32(name_id)
            .u32(dtype_id)
            .u16(shape.len() as u16);
        for &d in shape {
            e.i64(d);
        }
        if op {
            // An operator's output is tensor-level detail: droppable under a size budget.
            if let Some((_, Some(reused))) = file.write_droppable(e.finish(kind::OP_OUTPUT)) {
                crate::live_tensors::restate_reused(file, reused);
            }
        } else {
            file.write(e.finish(kind::ANNOTATE));
        }
    });
}

/// Reads a C string argument; `None` for null.
///
/// # Safety
/// `s` is null or a valid NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(s: *const c_char) -> Option<&'a [u8]> {
    if s.is_null() {
        None
    } else {
        // Safety: guaranteed by the caller.
        Some(unsafe { CStr::from_ptr(s) }.to_bytes())
    }
}

// ---- the annotation C ABI (include/vramtrace.h) -----------------------------------------

/// Version of the annotation ABI; see `include/vramtrace.h`.
pub const VRAMTRACE_ABI_VERSION: u32 = 2;

/// `uint32_t vramtrace_abi_version(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn vramtrace_abi_version() -> u32 {
    VRAMTRACE_ABI_VERSION
}

/// `void vramtrace_annotate(uint64_t ptr, const char *name, const char *dtype,
/// const int64_t *shape, uint32_t rank)`: names the live allocation at `ptr`.
///
/// # Safety
/// `name` and `dtype` are null or NUL-terminated; `shape` is null or points at `rank` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_annotate(
    ptr: u64,
    name: *const c_char,
    dtype: *const c_char,
    shape: *const i64,
    rank: u32,
) {
    // Safety: the caller's strings, valid for the call.
    let (name, dtype) = unsafe { (c_str(name), c_str(dtype)) };
    let shape: &[i64] = if shape.is_null() || rank == 0 {
        &[]
    } else {
        // Safety: the caller's array of `rank` values; only the first MAX_RANK are read.
        unsafe { core::slice::from_raw_parts(shape, (rank as usize).min(MAX_RANK)) }
    };
    annotate(ptr, name.unwrap_or(b""), dtype, shape, false);
}

/// `void vramtrace_annotate_op(uint64_t ptr, const char *op, const char *dtype,
/// const int64_t *shape, uint32_t rank)` (ABI 2): the live allocation at `ptr` is an output of
/// operator `op` with that dtype and shape. Unlike [`vramtrace_annotate`] this is not a name:
/// the PyTorch probe's `--torch-shapes` mode describes every operator output with it, and
/// attribution still matches such an allocation by size, weighing its shape as evidence.
///
/// # Safety
/// `op` and `dtype` are null or NUL-terminated; `shape` is null or points at `rank` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_annotate_op(
    ptr: u64,
    op: *const c_char,
    dtype: *const c_char,
    shape: *const i64,
    rank: u32,
) {
    // Safety: the caller's strings, valid for the call.
    let (op, dtype) = unsafe { (c_str(op), c_str(dtype)) };
    let shape: &[i64] = if shape.is_null() || rank == 0 {
        &[]
    } else {
        // Safety: the caller's array of `rank` values; only the first MAX_RANK are read.
        unsafe { core::slice::from_raw_parts(shape, (rank as usize).min(MAX_RANK)) }
    };
    annotate(ptr, op.unwrap_or(b""), dtype, shape, true);
}

/// `void vramtrace_range_push(const char *name)`: opens a named range on this thread.
///
/// # Safety
/// `name` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_range_push(name: *const c_char) {
    // Safety: the caller's string.
    range_push(unsafe { c_str(name) }.unwrap_or(b""));
}

/// `void vramtrace_range_pop(void)`: closes this thread's innermost range.
#[unsafe(no_mangle)]
pub extern "C" fn vramtrace_range_pop() {
    range_pop();
}

/// `void vramtrace_mark(const char *text)`: an instantaneous named mark.
///
/// # Safety
/// `text` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_mark(text: *const c_char) {
    // Safety: the caller's string.
    mark(unsafe { c_str(text) }.unwrap_or(b""));
}
