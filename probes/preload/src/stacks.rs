//! Native stacks of the hooked calls, captured in-process with `framehop` from the modules'
//! `.eh_frame` (frame pointers find nothing in libraries built without them), de-duplicated
//! into the trace's STACK table by content, with MODULE records for offline symbolisation.
//!
//! - The unwinder, its rule cache, the module list and the stack table are shared behind one
//!   spin lock ([`SpinLock`]), held only while unwinding and writing the new records, never
//!   while the driver runs. A fork child resets it (the lock may have been held by a thread
//!   that does not exist in the child).
//! - The module list follows the loader: each capture compares `dl_iterate_phdr`'s counters of
//!   objects added and removed, and rescans when they moved. MODULE records are written when the
//!   first stack of a file is, and for each module that appears later.
//! - Stack memory is read only between the captured stack pointer and the top of the thread's
//!   stack (`pthread_getattr_np`, once per thread).
//! - The recorder's own frames are dropped except the innermost one, so frame 0 is an
//!   instruction pointer in the preload (which the reader drops) and every later frame a return
//!   address in the program: the convention the CLI's symboliser expects.
//! - A panic inside the unwinder turns stacks off, not recording.

use core::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

#[cfg(target_arch = "aarch64")]
use framehop::aarch64::{
    CacheAarch64 as NativeCache, PtrAuthMask, UnwindRegsAarch64, UnwinderAarch64 as NativeUnwinder,
};
#[cfg(target_arch = "x86_64")]
use framehop::x86_64::{
    CacheX86_64 as NativeCache, UnwindRegsX86_64, UnwinderX86_64 as NativeUnwinder,
};
use framehop::{MustNotAllocateDuringUnwind, Unwinder};
use vramtrace_format::{Encoder, FRAME_HEADER_LEN, PY_FRAME_LEN, PyFrame, kind};

use crate::fork::ForkHandler;
use crate::modules::{LoadedModule, Mapped, generation, scan};
use crate::python::{MAX_PY_FRAMES, PyFrames, RawStack};
use crate::sink::File;

/// Deepest stack kept, in frames.
pub(crate) const MAX_FRAMES: usize = 64;
const TABLE_SLOTS: usize = 1 << 14;

/// Set when the unwinder panicked: stacks stay off for the process.
static BROKEN: AtomicBool = AtomicBool::new(false);
/// Bumped in every fork child: the new file has no STACK or MODULE records yet.
static FILE_GENERATION: AtomicU32 = AtomicU32::new(0);
static FORK: ForkHandler = ForkHandler::new(after_fork_child);

/// A minimal spin lock that a fork child can force open.
struct SpinLock(AtomicBool);

struct SpinGuard<'a>(&'a SpinLock);

impl SpinLock {
    fn lock(&self) -> SpinGuard<'_> {
        let mut spins = 0u32;
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins.is_multiple_of(64) {
                // Safety: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            } else {
                core::hint::spin_loop();
            }
        }
        SpinGuard(self)
    }
}

impl Drop for SpinGuard<'_> {
    fn drop(&mut self) {
        self.0.0.store(false, Ordering::Release);
    }
}

static LOCK: SpinLock = SpinLock(AtomicBool::new(false));

struct State {
    unwinder: NativeUnwinder<Mapped, MustNotAllocateDuringUnwind>,
    cache: Box<NativeCache<MustNotAllocateDuringUnwind>>,
    modules: Vec<(LoadedModule, u32)>, // with the file generation its record was written in
    loader_counts: (u64, u64),
    own: core::ops::Range<u64>,
    /// Stack table: content hash and id per slot (0 = empty).
    hashes: Vec<u64>,
    ids: Vec<u32>,
    next_id: u32,
    /// File generation the table's ids were written in.
    table_generation: u32,
}

struct Shared(UnsafeCell<Option<State>>);
// Safety: only touched with LOCK held.
unsafe impl Sync for Shared {}
static STATE: Shared = Shared(UnsafeCell::new(None));

thread_local! {
    /// This thread's stack top (exclusive), 0 until known.
    static STACK_TOP: Cell<u64> = const { Cell::new(0) };
}

fn stack_top() -> u64 {
    STACK_TOP
        .try_with(|top| {
            if top.get() == 0 {
                top.set(query_stack_top());
            }
            top.get()
        })
        .unwrap_or(0)
}

fn query_stack_top() -> u64 {
    // Safety: a zeroed attr filled by pthread_getattr_np for the calling thread, then
    // destroyed; the out-pointers are valid.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return 0;
        }
        let mut addr: *mut libc::c_void = core::ptr::null_mut();
        let mut size: usize = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        if ok { addr as u64 + size as u64 } else { 0 }
    }
}

/// A 64-bit hash of a stack's frames, a word at a time (multiply and fold, as in
/// MurmurHash's finaliser): stacks are compared by this hash alone.
fn stack_hash(frames: &[u64]) -> u64 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15 ^ frames.len() as u64;
    for &f in frames {
        h = (h ^ f).wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 32;
    }
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    (h ^ (h >> 29)) | 1
}

/// Folds Python frames into a native stack's hash (unchanged when there are none).
fn py_hash(mut h: u64, py: &[PyFrame]) -> u64 {
    for f in py {
        for w in [(f.file as u64) << 32 | f.function as u64, f.line as u64] {
            h = (h ^ w).wrapping_mul(0xff51_afd7_ed55_8ccd);
            h ^= h >> 32;
        }
    }
    h | 1
}

impl State {
    /// An empty state; [`State::refresh`] fills the module list.
    fn new() -> State {
        State {
            unwinder: NativeUnwinder::new(),
            cache: Box::new(NativeCache::new_in()),
            modules: Vec::new(),
            loader_counts: (u64::MAX, u64::MAX),
            own: 0..0,
            hashes: vec![0; TABLE_SLOTS],
            ids: vec![0; TABLE_SLOTS],
            next_id: 1,
            table_generation: 0,
        }
    }

    /// Brings the module list, and the range of our own code, up to date with the loader.
    fn refresh(&mut self) {
        let counts = generation();
        if counts == self.loader_counts {
            return;
        }
        let now = scan();
        // Modules gone: remove from the unwinder before their memory is unmapped for good.
        let mut kept = Vec::with_capacity(now.len());
        for (m, written) in self.modules.drain(..) {
            if now.iter().any(|n| n.bias == m.bias && n.path == m.path) {
                kept.push((m, written));
            } else {
                self.unwinder.remove_module(m.code.start);
            }
        }
        for n in now {
            if !kept
                .iter()
                .any(|(m, _)| m.bias == n.bias && m.path == n.path)
            {
                self.unwinder.add_module(n.unwind_module());
                kept.push((n, u32::MAX));
            }
        }
        self.modules = kept;
        let own_addr = capture as *const () as usize as u64;
        if let Some((m, _)) = self
            .modules
            .iter()
            .find(|(m, _)| m.code.contains(&own_addr))
        {
            self.own = m.code.clone();
        }
        self.loader_counts = counts;
    }

    /// Writes the MODULE records this file does not have yet.
    fn write_modules(&mut self, file: File, file_generation: u32) {
        for (m, written) in &mut self.modules {
            if *written != file_generation {
                m.write_record(file);
                *written = file_generation;
            }
        }
    }

    /// The id of a stack (native frames and Python frames together), writing its STACK record
    /// (and any missing MODULE records) first, then its PY_STACK record if it has Python frames.
    fn intern(&mut self, file: File, frames: &[u64], py: &[PyFrame], file_generation: u32) -> u32 {
        if self.table_generation != file_generation {
            self.hashes.iter_mut().for_each(|h| *h = 0);
            self.ids.iter_mut().for_each(|i| *i = 0);
            self.table_generation = file_generation;
        }
        let h = py_hash(stack_hash(frames), py);
        let mut i = h as usize & (TABLE_SLOTS - 1);
        for _ in 0..64 {
            if self.hashes[i] == h {
                return self.ids[i];
            }
            if self.hashes[i] == 0 {
                self.write_modules(file, file_generation);
                let id = self.next_id;
                self.next_id += 1;
                let mut buf = [0u8; FRAME_HEADER_LEN + 4 + 8 * MAX_FRAMES];
                let mut e = Encoder::new(&mut buf);
                e.u32(id);
                for f in frames {
                    e.u64(*f);
                }
                file.write(e.finish(kind::STACK));
                if !py.is_empty() {
                    let mut buf = [0u8; FRAME_HEADER_LEN + 4 + PY_FRAME_LEN * MAX_PY_FRAMES];
                    let mut e = Encoder::new(&mut buf);
                    e.u32(id);
                    for f in py {
                        e.u32(f.file).u32(f.function).u32(f.line);
                    }
                    file.write(e.finish(kind::PY_STACK));
                }
                self.hashes[i] = h;
                self.ids[i] = id;
                return id;
            }
            i = (i + 1) & (TABLE_SLOTS - 1);
        }
        0
    }
}

/// Captures the calling thread's stack, native and Python (`src/python.rs`), and returns its
/// id in the STACK table (0 when both are off or unavailable).
#[inline(never)]
pub(crate) fn capture(file: File) -> u32 {
    let mut py = PyFrames::new();
    crate::python::capture(file, &mut py);
    let native = crate::config::stacks() && !BROKEN.load(Ordering::Relaxed);
    if !native && py.len == 0 {
        return 0;
    }
    #[cfg(target_arch = "x86_64")]
    let (ip, sp, bp): (u64, u64, u64);
    // Safety: reads three registers, touches nothing else.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    #[cfg(target_arch = "x86_64")]
    let regs = UnwindRegsX86_64::new(ip, sp, bp);
    #[cfg(target_arch = "aarch64")]
    let (ip, sp, regs) = {
        let (ip, sp, fp, lr): (u64, u64, u64, u64);
        // Safety: reads four registers, touches nothing else.
        unsafe {
            core::arch::asm!(
                "adr {ip}, .",
                "mov {sp}, sp",
                "mov {fp}, x29",
                "mov {lr}, x30",
                ip = out(reg) ip,
                sp = out(reg) sp,
                fp = out(reg) fp,
                lr = out(reg) lr,
                options(nomem, nostack, preserves_flags),
            );
        }
        // Return addresses signed by pointer authentication carry the signature above the
        // 48 address bits of Linux user space.
        let mask = PtrAuthMask(0x0000_ffff_ffff_ffff);
        (
            ip,
            sp,
            UnwindRegsAarch64::new_with_ptr_auth_mask(mask, lr, sp, fp),
        )
    };
    let top = stack_top();
    // Before the lock is first taken: a fork child must find it open.
    FORK.register();
    let file_generation = FILE_GENERATION.load(Ordering::Acquire);
    let r = std::panic::catch_unwind(|| {
        let _guard = LOCK.lock();
        // Safety: LOCK is held: this is the only reference to the state.
        let slot = unsafe { &mut *STATE.0.get() };
        let state = slot.get_or_insert_with(State::new);
        let mut frames = [0u64; MAX_FRAMES];
        let mut n = 0;
        if !native {
            return state.intern(file, &[], py.as_slice(), file_generation);
        }
        state.refresh();
        let mut read_stack = |addr: u64| {
            if addr >= sp
                && addr.checked_add(8).is_some_and(|end| end <= top)
                && addr.is_multiple_of(8)
            {
                // Safety: inside this thread's stack, between the captured sp and its top.
                Ok(unsafe { (addr as usize as *const u64).read() })
            } else {
                Err(())
            }
        };
        let mut iter = state
            .unwinder
            .iter_frames(ip, regs, &mut state.cache, &mut read_stack);
        let mut own_seen = false;
        while let Ok(Some(frame)) = iter.next() {
            let addr = frame.address();
            if state.own.contains(&addr) {
                // Keep only the innermost of our own frames.
                if own_seen {
                    continue;
                }
                own_seen = true;
            }
            frames[n] = addr;
            n += 1;
            if n == MAX_FRAMES {
                break;
            }
        }
        if n == 0 && py.len == 0 {
            return 0;
        }
        state.intern(file, &frames[..n], py.as_slice(), file_generation)
    });
    r.unwrap_or_else(|_| {
        BROKEN.store(true, Ordering::Relaxed);
        0
    })
}

/// The calling thread's Python frames alone, as a stack id (0 when it has none): for events
/// reported from Python (the tensor ABI) and PyTorch's allocator (native tensor capture),
/// whose native frames are only the interpreter's. A tensor's stack is mostly one seen before
/// (a decode step allocates from the same lines each time), so a key read from the frames
/// alone ([`crate::python::quick_key`]) is looked up in a per-thread memo first ([`MEMO`]): a
/// hit skips the walk that checks every code object, describing every frame, the lock and the
/// table (docs/performance.md, "Where the decode cost grows").
pub(crate) fn capture_python(file: File) -> u32 {
    let quick = crate::python::quick_key(file);
    if quick == 0 {
        return 0;
    }
    FORK.register();
    let file_generation = FILE_GENERATION.load(Ordering::Acquire);
    let key =
        quick ^ (u64::from(file_generation) << 48) ^ (u64::from(crate::intern::generation()) << 32);
    if let Some(id) = memo_get(key) {
        return id;
    }
    let _timer = crate::self_time::start(crate::self_time::Step::Miss);
    let mut raw = RawStack::new();
    let Some(ctx) = crate::python::capture_raw(file, &mut raw) else {
        return 0;
    };
    let mut py = PyFrames::new();
    crate::python::describe_raw(file, &ctx, &raw, &mut py);
    if py.len == 0 {
        return 0;
    }
    let id = std::panic::catch_unwind(|| {
        let _guard = LOCK.lock();
        // Safety: LOCK is held: this is the only reference to the state.
        let slot = unsafe { &mut *STATE.0.get() };
        let state = slot.get_or_insert_with(State::new);
        state.intern(file, &[], py.as_slice(), file_generation)
    })
    .unwrap_or(0);
    if id != 0 {
        memo_put(key, id);
    }
    id
}

/// Sets and ways of the per-thread memo from a Python stack's key to its stack id: 1,024
/// entries, four to a set, each set in order of last use. It was one entry per slot, and on
/// the H200's decode (some 300 stacks in turn) stacks sharing a slot evicted each other: 1-2%
/// of the lookups missed, each paying the whole walk, the description of every frame and the
/// table, where four ways miss 0.09% (the stacks of that trace replayed through both).
const MEMO_SETS: usize = 256;
const MEMO_WAYS: usize = 4;

struct Memo(UnsafeCell<[MemoSet; MEMO_SETS]>);

#[derive(Clone, Copy)]
struct MemoSet {
    keys: [u64; MEMO_WAYS],
    ids: [u32; MEMO_WAYS],
}

thread_local! {
    // `const` initialisation and no destructor: no allocation, no TLS destructor.
    static MEMO: Memo = const {
        Memo(UnsafeCell::new([MemoSet { keys: [0; MEMO_WAYS], ids: [0; MEMO_WAYS] }; MEMO_SETS]))
    };
}

impl MemoSet {
    /// The id kept for `key`, which becomes the set's most recently used.
    fn get(&mut self, key: u64) -> Option<u32> {
        let way = self.keys.iter().position(|&k| k == key)?;
        let id = self.ids[way];
        self.keys.copy_within(0..way, 1);
        self.ids.copy_within(0..way, 1);
        self.keys[0] = key;
        self.ids[0] = id;
        Some(id)
    }

    /// Keeps `key`'s id as the most recently used, the least recently used going.
    fn put(&mut self, key: u64, id: u32) {
        self.keys.copy_within(0..MEMO_WAYS - 1, 1);
        self.ids.copy_within(0..MEMO_WAYS - 1, 1);
        self.keys[0] = key;
        self.ids[0] = id;
    }
}

/// The set of `key`: bits from its middle (its lowest bit is always set, and a product's low
/// bits mix least).
fn memo_set(key: u64) -> usize {
    (key >> 24) as usize % MEMO_SETS
}

fn memo_get(key: u64) -> Option<u32> {
    MEMO.try_with(|m| {
        // Safety: this thread's own memo; no reference to it outlives this closure.
        unsafe { (*m.0.get())[memo_set(key)].get(key) }
    })
    .ok()
    .flatten()
}

fn memo_put(key: u64, id: u32) {
    let _ = MEMO.try_with(|m| {
        // Safety: as in `memo_get`.
        unsafe { (*m.0.get())[memo_set(key)].put(key, id) };
    });
}

/// In a fork child: open the lock (its holder is gone) and start a new file's tables.
extern "C" fn after_fork_child() {
    LOCK.0.store(false, Ordering::Release);
    FILE_GENERATION.fetch_add(1, Ordering::AcqRel);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four stacks sharing a set are all kept; a fifth evicts the least recently used, and a
    /// hit makes a stack the most recently used.
    #[test]
    fn a_memo_set_keeps_its_four_most_recently_used_stacks() {
        let mut set = MemoSet {
            keys: [0; MEMO_WAYS],
            ids: [0; MEMO_WAYS],
        };
        for k in 1..=4u64 {
            set.put(k, k as u32 * 10);
        }
        for k in 1..=4u64 {
            assert_eq!(set.get(k), Some(k as u32 * 10), "{k}");
        }
        // Used last: 4, 3, 2, 1 from least to most recent... then 1 again.
        assert_eq!(set.get(1), Some(10));
        set.put(5, 50);
        assert_eq!(set.get(2), None, "the least recently used went");
        for (k, id) in [(1, 10), (3, 30), (4, 40), (5, 50)] {
            assert_eq!(set.get(k), Some(id), "{k}");
        }
        assert_eq!(set.get(6), None);
    }
}
