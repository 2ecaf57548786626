//! Native tensor capture: PyTorch's caching allocator reports each block to the preload
//! directly, with no Python callback per tensor (issue 19; docs/architecture.md, "PyTorch's
//! caching allocator, natively").
//!
//! Two sources, both called by `libc10_cuda.so` on the allocating (or freeing) thread while it
//! holds that device's allocator lock, one after the other:
//!
//! 1. **The trace tracker.** `NativeCachingAllocator::attachAllocatorTraceTracker` (a virtual
//!    method, the one PyTorch's NCCL memory registration uses; not exported, found by the
//!    Python probe in the library's `.symtab`) takes a `std::function<void(const
//!    TraceEntry&)>`. `DeviceCachingAllocator::record_trace` calls every tracker whether or not
//!    `_record_memory_history` is on (c10/cuda/CUDACachingAllocator.cpp, `record_trace`:
//!    "if (!record_history && trace_trackers_.empty()) return"). The ALLOC entry, made in
//!    `alloc_found_block` before the statistics move, carries the block's address, the bytes
//!    asked for (`orig_size`), the stream and the device, but not the block's own size.
//! 2. **The profiler report.** Right after, still under the lock, `alloc_found_block` (and
//!    `free`) call `c10::reportMemoryUsageToProfiler(ptr, ±block->size, allocated, reserved,
//!    Device)`, an exported function of `libc10.so` that `libc10_cuda.so` reaches through its
//!    PLT: the preload exports the same symbol, so the call reaches us first, and we pass it on
//!    to libc10's own (found in the loaded objects' symbol tables: libc10 is loaded
//!    `RTLD_LOCAL`, out of `dlsym(RTLD_NEXT)`'s sight). Its size is the block's, exact.
//!
//! The tracker leaves the ALLOC entry in a thread-local slot; the report that follows on the
//! same thread for the same address completes it into one TENSOR record (block bytes,
//! requested bytes, stream, segment, the thread's Python frames). The segment comes from the
//! tracker's SEGMENT_ALLOC / SEGMENT_MAP entries (kept in a small table; SEGMENT_FREE /
//! SEGMENT_UNMAP forget them): the base of the one holding the block, 0 for a segment made
//! before the tracker was attached. Both happen under the device's lock,
//! so nothing of another thread comes between them: sizes are exact per block with any number
//! of threads. A free is the report with a negative size.
//!
//! What we read of PyTorch's types is PyTorch's, not a promise: `TraceEntry`'s first fields
//! (action `int` at 0, device `int8` at 4, address at 8, the context `shared_ptr` at 16, the
//! stream at 32, the size at 40; the same from 2.5 to 2.11), its action numbers (ALLOC 0,
//! FREE_REQUESTED 1), libstdc++'s `std::function` (two words of functor storage, the manager,
//! the invoker) and the Itanium C++ ABI (a by-value `std::function` argument travels as a
//! pointer to the caller's temporary). So recording starts [`State::Checking`]: the probe
//! allocates and frees one tensor of a known size, compares what arrived here
//! ([`vramtrace_torch_native_last`]) with PyTorch's own figures, and only then turns recording
//! on ([`vramtrace_torch_native_enable`]); otherwise it turns it off, which is said in the
//! trace, and records through its callbacks as before. A tracker cannot be detached, so an
//! off tracker stays attached and returns at once.

use core::cell::Cell;
use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering};

use vramtrace_format::{TensorAction, TensorEvent};

use crate::fork::ForkHandler;
use crate::labels::c_str;

/// `TraceEntry::Action::ALLOC`.
const ACTION_ALLOC: u32 = 0;
/// `TraceEntry::Action::FREE_REQUESTED`.
const ACTION_FREE_REQUESTED: u32 = 1;
/// `TraceEntry::Action::SEGMENT_ALLOC`, `SEGMENT_FREE`, `SEGMENT_MAP`, `SEGMENT_UNMAP`.
const ACTION_SEGMENT_ALLOC: u32 = 3;
const ACTION_SEGMENT_FREE: u32 = 4;
const ACTION_SEGMENT_MAP: u32 = 5;
const ACTION_SEGMENT_UNMAP: u32 = 6;
/// Most segments (or mapped ranges) kept; a block in one beyond them gets segment 0 (the
/// reader then finds it among the driver's allocations).
const MAX_SEGMENTS: usize = 4096;
/// `c10::DeviceType::CUDA`.
const DEVICE_TYPE_CUDA: i8 = 1;
/// How many vtable slots are searched for the attach method (PyTorch 2.5: slot 30, 2.11: 44).
const MAX_VTABLE_SLOTS: usize = 256;

/// Where native capture stands in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum State {
    /// No tracker attached, or capture turned off after a failed check: nothing recorded here.
    Off = 0,
    /// Attached; what arrives is kept for the probe's check, not recorded.
    Checking = 1,
    /// Checked: every block is recorded.
    On = 2,
}

static STATE: AtomicU8 = AtomicU8::new(State::Off as u8);
/// Whether a tracker was ever attached (it cannot be detached).
static ATTACHED: AtomicU8 = AtomicU8::new(0);
/// libc10's own `reportMemoryUsageToProfiler`; null until first needed, [`NOT_FOUND`] when
/// no other object defines it.
static REAL_REPORT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
const NOT_FOUND: *mut c_void = usize::MAX as *mut c_void;
const REPORT_SYMBOL: &core::ffi::CStr = c"_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE";

fn state() -> State {
    match STATE.load(Ordering::Acquire) {
        1 => State::Checking,
        2 => State::On,
        _ => State::Off,
    }
}

/// The first fields of PyTorch's `TraceEntry` (2.5 to 2.11), the only ones read.
#[repr(C)]
struct TraceEntryPrefix {
    action: u32,
    device: i8,
    addr: u64,
    context: [u64; 2],
    stream: u64,
    size: u64,
}

/// libstdc++'s `std::function<void(const TraceEntry&)>`: `_Any_data` (two words), the manager,
/// the invoker.
#[repr(C)]
struct StdFunction {
    functor: [usize; 2],
    manager: Option<Manager>,
    invoker: Option<Invoker>,
}

/// `bool _M_manager(_Any_data& dest, const _Any_data& source, _Manager_operation op)`.
type Manager = unsafe extern "C" fn(*mut [usize; 2], *const [usize; 2], c_int) -> bool;
/// `void _M_invoke(const _Any_data& functor, const TraceEntry& entry)`.
type Invoker = unsafe extern "C" fn(*const [usize; 2], *const TraceEntryPrefix);
/// `NativeCachingAllocator::attachAllocatorTraceTracker(this, std::function tracker)`, the
/// argument as a pointer to the caller's temporary.
type AttachFn = unsafe extern "C" fn(*mut c_void, *mut StdFunction);
/// `c10::Device`: the device type and index, one byte each.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Device {
    kind: i8,
    index: i8,
}
type ReportFn = unsafe extern "C" fn(*mut c_void, i64, u64, u64, Device);

/// One tracker entry as kept for the report that follows it, or for the check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    action: u32,
    device: i32,
    addr: u64,
    size: u64,
    stream: u64,
}

impl Seen {
    const NONE: Seen = Seen {
        action: u32::MAX,
        device: -1,
        addr: 0,
        size: 0,
        stream: 0,
    };
}

/// One report, as kept for the check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Report {
    ptr: u64,
    size: i64,
    device: i32,
    count: u64,
}

thread_local! {
    // `const` initialisation, no destructors: usable from any thread at any time.
    /// The ALLOC entry the tracker just saw on this thread, for the report that follows.
    static PENDING: Cell<Seen> = const { Cell::new(Seen::NONE) };
    /// The last FREE_REQUESTED entry on this thread (for the check).
    static LAST_FREE: Cell<Seen> = const { Cell::new(Seen::NONE) };
    /// The last ALLOC entry on this thread (for the check).
    static LAST_ALLOC: Cell<Seen> = const { Cell::new(Seen::NONE) };
    /// The last report on this thread (for the check).
    static LAST_REPORT: Cell<Report> = const { Cell::new(Report { ptr: 0, size: 0, device: -1, count: 0 }) };
    /// The segment this thread found last: its table, the table's generation, base and end.
    static LAST_SEGMENT: Cell<(usize, u64, u64, u64)> = const { Cell::new((0, 0, 0, 0)) };
}

/// The segments the allocator announced (SEGMENT_ALLOC, or SEGMENT_MAP for expandable
/// segments, whose mapped ranges stand for segments here) since the tracker was attached: sorted
/// base addresses and their ends, under a spin lock (the tracker runs under one device's lock,
/// and devices run in parallel). Nothing allocates; a fork child starts empty.
///
/// Each thread keeps the last segment it found ([`LAST_SEGMENT`]) with the table's generation
/// then: while no segment came or went, a block in it is answered without the lock or the
/// search. Between a model's allocations its own work pushes the table out of the caches, and
/// the lock (an atomic exchange on a line another thread may own) and a binary search over a
/// server's hundreds of segments are then a cache miss each (docs/performance.md).
struct SegmentTable {
    lock: AtomicBool,
    /// Bumped under the lock by every change.
    generation: AtomicU64,
    inner: UnsafeCell<Segments>,
}

struct Segments {
    len: usize,
    bases: [u64; MAX_SEGMENTS],
    ends: [u64; MAX_SEGMENTS],
}

// Safety: `inner` is only touched with `lock` held.
unsafe impl Sync for SegmentTable {}

static SEGMENTS: SegmentTable = SegmentTable::new();
static FORK: ForkHandler = ForkHandler::new(after_fork_child);

impl SegmentTable {
    /// An empty table.
    const fn new() -> SegmentTable {
        SegmentTable {
            lock: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            inner: UnsafeCell::new(Segments {
                len: 0,
                bases: [0; MAX_SEGMENTS],
                ends: [0; MAX_SEGMENTS],
            }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Segments) -> R) -> R {
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        // Safety: the lock is held, so this is the only reference.
        let r = f(unsafe { &mut *self.inner.get() });
        self.lock.store(false, Ordering::Release);
        r
    }

    /// [`SegmentTable::with`] for a change: the generation moves on.
    fn change(&self, f: impl FnOnce(&mut Segments)) {
        self.with(|s| {
            f(s);
            self.generation.fetch_add(1, Ordering::Release);
        })
    }

    fn add(&self, base: u64, size: u64) {
        FORK.register();
        self.change(|s| {
            let at = s.bases[..s.len].partition_point(|&b| b < base);
            if at < s.len && s.bases[at] == base {
                s.ends[at] = base.saturating_add(size);
                return;
            }
            if s.len == MAX_SEGMENTS {
                return;
            }
            s.bases.copy_within(at..s.len, at + 1);
            s.ends.copy_within(at..s.len, at + 1);
            s.bases[at] = base;
            s.ends[at] = base.saturating_add(size);
            s.len += 1;
        });
    }

    /// Forgets every segment starting inside `[base, base + size)` (an unmap may cover several
    /// mapped ranges).
    fn remove(&self, base: u64, size: u64) {
        let end = base.saturating_add(size.max(1));
        self.change(|s| {
            let from = s.bases[..s.len].partition_point(|&b| b < base);
            let to = s.bases[..s.len].partition_point(|&b| b < end);
            if from < to {
                s.bases.copy_within(to..s.len, from);
                s.ends.copy_within(to..s.len, from);
                s.len -= to - from;
            }
        });
    }

    /// The base of the segment holding `ptr`, or 0.
    fn base_of(&self, ptr: u64) -> u64 {
        let me = self as *const SegmentTable as usize;
        let generation = self.generation.load(Ordering::Acquire);
        let last = LAST_SEGMENT.try_with(Cell::get).unwrap_or((0, 0, 0, 0));
        if last.0 == me && last.1 == generation && last.2 <= ptr && ptr < last.3 {
            return last.2;
        }
        let (generation, base, end) = self.with(|s| {
            let at = s.bases[..s.len].partition_point(|&b| b <= ptr);
            let (base, end) = if at > 0 && ptr < s.ends[at - 1] {
                (s.bases[at - 1], s.ends[at - 1])
            } else {
                (0, 0)
            };
            (self.generation.load(Ordering::Relaxed), base, end)
        });
        if base != 0 {
            let _ = LAST_SEGMENT.try_with(|c| c.set((me, generation, base, end)));
        }
        base
    }
}

/// In the child after `fork`: no holder of the lock survives, and the child's allocator
/// starts over.
extern "C" fn after_fork_child() {
    SEGMENTS.lock.store(false, Ordering::Release);
    // The forking thread's last segment is the parent's: a new generation outdates it.
    SEGMENTS.generation.fetch_add(1, Ordering::Release);
    // Safety: the child has one thread, and no other reference exists.
    unsafe { (*SEGMENTS.inner.get()).len = 0 };
}

/// The functor's manager: the functor is two words of nothing, stored in place, so copying is
/// copying them and destroying is nothing. `__get_type_info` (0) answers null: nothing in
/// PyTorch asks a tracker for its type.
unsafe extern "C" fn manage(dest: *mut [usize; 2], source: *const [usize; 2], op: c_int) -> bool {
    // Safety: libstdc++ passes valid `_Any_data` storage for both.
    unsafe {
        match op {
            0 => (*dest)[0] = 0,
            1 => (*dest)[0] = source as usize,
            2 => *dest = *source,
            _ => {}
        }
    }
    false
}

/// The tracker: called by PyTorch for every trace entry, under the device's allocator lock.
/// Keeps an ALLOC entry for the report that follows; nothing else is done here.
unsafe extern "C" fn on_trace(_functor: *const [usize; 2], entry: *const TraceEntryPrefix) {
    if state() == State::Off || entry.is_null() {
        return;
    }
    let _timer = crate::self_time::start(crate::self_time::Step::Tracker);
    // Safety: PyTorch passes its TraceEntry, whose first fields are TraceEntryPrefix's (checked
    // by the probe before recording is turned on).
    let e = unsafe { &*entry };
    let seen = Seen {
        action: e.action,
        device: i32::from(e.device),
        addr: e.addr,
        size: e.size,
        stream: e.stream,
    };
    match e.action {
        ACTION_ALLOC => {
            let _ = PENDING.try_with(|p| p.set(seen));
            if state() == State::Checking {
                let _ = LAST_ALLOC.try_with(|p| p.set(seen));
            }
        }
        ACTION_SEGMENT_ALLOC | ACTION_SEGMENT_MAP => SEGMENTS.add(e.addr, e.size),
        ACTION_SEGMENT_FREE | ACTION_SEGMENT_UNMAP => SEGMENTS.remove(e.addr, e.size),
        ACTION_FREE_REQUESTED if state() == State::Checking => {
            let _ = LAST_FREE.try_with(|p| p.set(seen));
        }
        _ => {}
    }
}

/// `c10::reportMemoryUsageToProfiler(void* ptr, int64_t alloc_size, size_t total_allocated,
/// size_t total_reserved, c10::Device device)`: libc10's own is called first, always; then a
/// CUDA block becomes a TENSOR record when native capture is on.
///
/// # Safety
/// Called by PyTorch with its own arguments.
#[unsafe(export_name = "_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE")]
pub unsafe extern "C" fn report_memory_usage_to_profiler(
    ptr: *mut c_void,
    alloc_size: i64,
    total_allocated: u64,
    total_reserved: u64,
    device: Device,
) {
    let real = real_report();
    if !real.is_null() {
        let _timer = crate::self_time::start(crate::self_time::Step::Libc10);
        // Safety: libc10's definition of this very symbol, with this signature.
        unsafe {
            core::mem::transmute::<*mut c_void, ReportFn>(real)(
                ptr,
                alloc_size,
                total_allocated,
                total_reserved,
                device,
            )
        };
    }
    if device.kind != DEVICE_TYPE_CUDA || alloc_size == 0 {
        return;
    }
    match state() {
        State::Off => {}
        State::Checking => keep_for_check(ptr as u64, alloc_size, device.index),
        State::On => {
            let _timer = crate::self_time::start(crate::self_time::Step::Report);
            record(ptr as u64, alloc_size, device.index)
        }
    }
}

/// libc10's own `reportMemoryUsageToProfiler`: the first other loaded object defining it,
/// searched once (PyTorch loads libc10.so with `RTLD_LOCAL`, out of `RTLD_NEXT`'s sight; any
/// caller of this function has it loaded).
fn real_report() -> *mut c_void {
    let p = REAL_REPORT.load(Ordering::Acquire);
    if !p.is_null() {
        return if p == NOT_FOUND {
            core::ptr::null_mut()
        } else {
            p
        };
    }
    let own = report_memory_usage_to_profiler as *const () as usize;
    let found = crate::elf_lookup::default_function_elsewhere(REPORT_SYMBOL, own)
        .map_or(NOT_FOUND, |a| a as *mut c_void);
    REAL_REPORT.store(found, Ordering::Release);
    if found == NOT_FOUND {
        core::ptr::null_mut()
    } else {
        found
    }
}

/// Makes `trampoline` libc10's `reportMemoryUsageToProfiler` (`vramtrace attach` hooks that
/// function in place: its entry jumps to [`report_memory_usage_to_profiler`], and the
/// trampoline runs its first instructions and continues in it). Returns the real function now
/// in use: `trampoline`, unless one was found before.
pub(crate) fn publish_real_report(trampoline: *mut c_void) -> *mut c_void {
    match REAL_REPORT.compare_exchange(
        core::ptr::null_mut(),
        trampoline,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => trampoline,
        Err(p) => p,
    }
}

/// Whether `name` is the symbol [`report_memory_usage_to_profiler`] stands in for.
pub(crate) fn is_report_symbol(name: &core::ffi::CStr) -> bool {
    name == REPORT_SYMBOL
}

/// The ALLOC entry this report completes, if the tracker left one for this very block.
fn take_pending(ptr: u64) -> Option<Seen> {
    PENDING
        .try_with(|p| {
            let seen = p.replace(Seen::NONE);
            (seen.addr == ptr).then_some(seen)
        })
        .ok()
        .flatten()
}

fn keep_for_check(ptr: u64, size: i64, device: i8) {
    if size > 0 {
        take_pending(ptr);
    }
    let _ = LAST_REPORT.try_with(|r| {
        let count = r.get().count + 1;
        r.set(Report {
            ptr,
            size,
            device: i32::from(device),
            count,
        })
    });
}

fn record(ptr: u64, size: i64, device: i8) {
    let t = if size > 0 {
        let seen = take_pending(ptr);
        // What `tensors::record` would decide too, taken here so that a paused allocation
        // skips the segment's lookup (docs/performance.md, "One codegen unit…").
        if crate::tensors::paused() {
            return;
        }
        TensorEvent {
            device: i32::from(device),
            action: TensorAction::Alloc,
            ptr,
            size: size as u64,
            segment: SEGMENTS.base_of(ptr),
            requested: seen.map_or(0, |s| s.size),
            stream: seen.map_or(0, |s| s.stream),
            ..TensorEvent::default()
        }
    } else {
        TensorEvent {
            device: i32::from(device),
            action: TensorAction::Free,
            ptr,
            ..TensorEvent::default()
        }
    };
    crate::tensors::record(t, None, None, &[]);
}

/// `int vramtrace_torch_native_attach(uint64_t allocator_var, uint64_t attach_fn, uint64_t
/// vtable, uint64_t vtable_size)`: attaches the tracker to PyTorch's caching allocator and
/// starts checking. `allocator_var` is the address of `c10::cuda::CUDACachingAllocator::
/// allocator` (the exported `std::atomic<CUDAAllocator*>`), `attach_fn` that of
/// `NativeCachingAllocator::attachAllocatorTraceTracker` and `vtable`/`vtable_size` that of
/// `NativeCachingAllocator`'s vtable, all in this process (the probe finds them in
/// `libc10_cuda.so`'s symbol table). Call it after CUDA is initialised (the allocator attaches
/// to the devices it has). Returns 0 when attached (state: checking); -1 no allocator yet, -2
/// the allocator in use is not the native caching allocator (its vtable is another), -3 the
/// vtable does not hold `attach_fn`, -4 a tracker is already attached (then nothing is done).
///
/// # Safety
/// The addresses must be what they are said to be, in this process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_torch_native_attach(
    allocator_var: u64,
    attach_fn: u64,
    vtable: u64,
    vtable_size: u64,
) -> i32 {
    if ATTACHED.load(Ordering::Acquire) != 0 {
        return -4;
    }
    if allocator_var == 0 || attach_fn == 0 || vtable == 0 {
        return -1;
    }
    // Safety: `allocator_var` is the allocator pointer's own address (an atomic pointer,
    // read as PyTorch's `get()` does: a plain load on x86-64 and aarch64).
    let allocator = unsafe {
        (*(allocator_var as *const core::sync::atomic::AtomicUsize)).load(Ordering::Acquire)
    };
    if allocator == 0 {
        return -1;
    }
    // Safety: a polymorphic object starts with its vtable pointer.
    let vptr = unsafe { *(allocator as *const usize) };
    // The vtable object starts with the offset to top and the type info; an object of that
    // class points two words in.
    if vptr as u64 != vtable + 16 {
        return -2;
    }
    let slots = ((vtable_size.saturating_sub(16)) / 8).min(MAX_VTABLE_SLOTS as u64) as usize;
    // Safety: the vtable symbol's own extent, read-only data of the loaded library.
    let holds = (0..slots).any(|i| unsafe { *(vptr as *const u64).add(i) } == attach_fn);
    if !holds {
        return -3;
    }
    if ATTACHED
        .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return -4;
    }
    // Found now, outside the allocator's lock, rather than at the first report.
    real_report();
    STATE.store(State::Checking as u8, Ordering::Release);
    let mut tracker = StdFunction {
        functor: [0, 0],
        manager: Some(manage),
        invoker: Some(on_trace),
    };
    // Safety: the method found in this allocator's vtable, called as the Itanium C++ ABI
    // passes a by-value class argument with a non-trivial destructor: a pointer to the
    // caller's temporary, which the caller destroys afterwards (below).
    unsafe {
        core::mem::transmute::<u64, AttachFn>(attach_fn)(allocator as *mut c_void, &mut tracker)
    };
    if let Some(m) = tracker.manager {
        // Safety: our own manager; destroying our functor is nothing, but the call is what
        // the destructor of a `std::function` left non-empty would do.
        unsafe { m(&mut tracker.functor, &tracker.functor, 3) };
    }
    0
}

/// `void vramtrace_torch_native_last(uint64_t out[14])`: what native capture saw last on the
/// calling thread while checking, and forgets it: the last ALLOC entry (action, device,
/// address, size, stream), the last FREE_REQUESTED entry (the same five),
/// and the last report (pointer, size as a signed number, device, how many reports so far).
/// Fields of what was not seen are all ones for the action and device, zero otherwise.
///
/// # Safety
/// `out` points at 14 writable `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_torch_native_last(out: *mut u64) {
    if out.is_null() {
        return;
    }
    let alloc = LAST_ALLOC
        .try_with(|c| c.replace(Seen::NONE))
        .unwrap_or(Seen::NONE);
    let free = LAST_FREE
        .try_with(|c| c.replace(Seen::NONE))
        .unwrap_or(Seen::NONE);
    let report = LAST_REPORT
        .try_with(|c| {
            let r = c.get();
            c.set(Report {
                ptr: 0,
                size: 0,
                device: -1,
                count: r.count,
            });
            r
        })
        .unwrap_or(Report {
            ptr: 0,
            size: 0,
            device: -1,
            count: 0,
        });
    let fields = [
        u64::from(alloc.action),
        alloc.device as u64,
        alloc.addr,
        alloc.size,
        alloc.stream,
        u64::from(free.action),
        free.device as u64,
        free.addr,
        free.size,
        free.stream,
        report.ptr,
        report.size as u64,
        report.device as u64,
        report.count,
    ];
    // Safety: the caller's array of 14 values.
    unsafe { core::ptr::copy_nonoverlapping(fields.as_ptr(), out, fields.len()) };
}

/// `int vramtrace_torch_native_enable(int on, const char *why)`: after the check, turns
/// recording on (`on` nonzero; only once a tracker is attached) or off, in which case `why`
/// (if not null) is written to the trace as a NOTE. Returns 1 when native capture is now on,
/// else 0.
///
/// # Safety
/// `why` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_torch_native_enable(on: c_int, why: *const c_char) -> c_int {
    if on != 0 && ATTACHED.load(Ordering::Acquire) != 0 {
        STATE.store(State::On as u8, Ordering::Release);
        return 1;
    }
    STATE.store(State::Off as u8, Ordering::Release);
    // Safety: the caller's string.
    if let Some(why) = unsafe { c_str(why) } {
        crate::recorder::note(why);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layouts this module assumes of PyTorch's types, as the C++ ABI lays them out.
    #[test]
    fn layouts_match_pytorchs() {
        assert_eq!(core::mem::offset_of!(TraceEntryPrefix, device), 4);
        assert_eq!(core::mem::offset_of!(TraceEntryPrefix, addr), 8);
        assert_eq!(core::mem::offset_of!(TraceEntryPrefix, stream), 32);
        assert_eq!(core::mem::offset_of!(TraceEntryPrefix, size), 40);
        assert_eq!(core::mem::size_of::<StdFunction>(), 32);
        assert_eq!(core::mem::size_of::<Device>(), 2);
    }

    #[test]
    fn the_manager_copies_and_points_at_the_functor() {
        let src = [7usize, 9];
        let mut dst = [0usize; 2];
        // Safety: two valid arrays.
        unsafe {
            assert!(!manage(&mut dst, &src, 2));
            assert_eq!(dst, src);
            manage(&mut dst, &src, 1);
            assert_eq!(dst[0], &src as *const _ as usize);
            manage(&mut dst, &src, 0);
            assert_eq!(dst[0], 0);
        }
    }

    #[test]
    fn segments_are_found_added_and_forgotten() {
        let t = SegmentTable::new();
        t.add(0x3000, 0x1000);
        t.add(0x1000, 0x800);
        t.add(0x8000, 0x4000);
        assert_eq!(t.base_of(0x1000), 0x1000);
        assert_eq!(t.base_of(0x17ff), 0x1000);
        assert_eq!(t.base_of(0x1800), 0, "past its end");
        assert_eq!(t.base_of(0x3fff), 0x3000);
        assert_eq!(t.base_of(0x9000), 0x8000);
        assert_eq!(t.base_of(0x0fff), 0);
        // An unmap over two mapped ranges forgets both.
        t.remove(0x1000, 0x3000);
        assert_eq!((t.base_of(0x1000), t.base_of(0x3000)), (0, 0));
        assert_eq!(t.base_of(0x9000), 0x8000);
        t.remove(0x8000, 0x4000);
        assert_eq!(t.base_of(0x9000), 0);
    }

    #[test]
    fn the_segment_a_thread_found_last_is_forgotten_when_the_table_changes() {
        let t = SegmentTable::new();
        t.add(0x10000, 0x8000);
        assert_eq!(t.base_of(0x12000), 0x10000);
        // Answered from the thread's last segment.
        assert_eq!(t.base_of(0x17fff), 0x10000);
        assert_eq!(t.base_of(0x18000), 0, "past its end");
        // The segment is released and another begins inside its old range: the last one
        // found must not answer for it.
        t.remove(0x10000, 0x8000);
        assert_eq!(t.base_of(0x12000), 0);
        t.add(0x14000, 0x1000);
        assert_eq!(t.base_of(0x14800), 0x14000);
        assert_eq!(t.base_of(0x12000), 0);
        // Another table's answer is never taken for this one's.
        let u = SegmentTable::new();
        assert_eq!(u.base_of(0x14800), 0);
    }

    #[test]
    fn a_report_completes_only_the_entry_of_its_own_block() {
        PENDING.with(|p| {
            p.set(Seen {
                action: ACTION_ALLOC,
                device: 0,
                addr: 0x1000,
                size: 333,
                stream: 5,
            })
        });
        assert_eq!(take_pending(0x2000), None);
        // Taken (and forgotten) by the report of another block: a later report of 0x1000
        // does not pick up a stale entry.
        assert_eq!(take_pending(0x1000), None);
        PENDING.with(|p| {
            p.set(Seen {
                action: ACTION_ALLOC,
                device: 0,
                addr: 0x1000,
                size: 333,
                stream: 5,
            })
        });
        assert_eq!(
            take_pending(0x1000).map(|s| (s.size, s.stream)),
            Some((333, 5))
        );
    }
}
