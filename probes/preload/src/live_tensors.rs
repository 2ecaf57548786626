//! The live tensors under a size budget, and the flight recorder.
//!
//! Under a size budget (`VRAMTRACE_MAX_SIZE`, `src/sink.rs`) tensor-level records go to
//! droppable blocks, the oldest of which are reused once the file would pass the budget. A
//! reader that lost a tensor's allocation record would lose the tensor from the live set, so
//! this table keeps every live tensor (pointer, sizes, stack id, device, thread) with the block
//! its last statement is in. When a block is reused, each tensor still live whose statement
//! was in it is restated (a tensor record with action `Live`, into the thread's never-dropped
//! blocks, once per tensor): the live set a reader replays stays whole outside the dropped time
//! range.
//!
//! The flight recorder writes the whole table, as `Live` records after a NOTE that says why,
//! into never-dropped blocks: at every refusal of PyTorch's allocator and every failed driver
//! allocation, and on `SIGUSR2` (`vramtrace snapshot PID`), so the evidence of an OOM survives
//! any budget.
//!
//! Allocation-free: the table is one anonymous mapping made on first use (1 Mi entries and a
//! hash index of twice that, touched only as far as used). One spin lock guards it; the only
//! writers are the tensor reports, which PyTorch's allocator makes under its own lock anyway.
//! The `SIGUSR2` handler writes into a block of its own on the interrupted thread (a stream
//! flagged `BLOCK_SIGNAL`, so that nothing the interrupted code was writing is disturbed and no
//! hook pays for a check), when the table's lock is free and the thread is not growing the file;
//! otherwise the snapshot waits for the next tensor report.

use core::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use vramtrace_format::{
    Encoder, FRAME_HEADER_LEN, TENSOR_RECORD_MAX_LEN, TensorAction, TensorEvent, kind,
};

use crate::sink::{File, mono_ns};

/// Most live tensors tracked; past that, the table stops and says so in the trace.
const CAPACITY: usize = 1 << 20;
/// Slots of the hash index at most (a power of two, twice the capacity).
const SLOTS: usize = CAPACITY * 2;
/// Slots the index starts with. It doubles (every entry placed again) whenever it would be more
/// than half full, so that a server's few thousand live tensors use a few pages of it, in the
/// cache, not a few of each of its 2,048 pages (docs/performance.md: the table was the
/// preload's largest cost per tensor under a budget).
const FIRST_SLOTS: usize = 1 << 12;

/// A slot of the hash index: the pointer and its place among the entries (place + 1; 0: empty).
/// The pointer is kept here too, so that following a probe chain, and the backward shift of a
/// removal, read the index alone: between a model's allocations its own work pushes the table
/// out of the caches, and each entry read only to compare its pointer was a cache miss of its
/// own (docs/performance.md, "Cold caches").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
struct Slot {
    ptr: u64,
    at: u32,
    _pad: u32,
}

impl Slot {
    const EMPTY: Slot = Slot {
        ptr: 0,
        at: 0,
        _pad: 0,
    };

    fn new(ptr: u64, place: usize) -> Slot {
        Slot {
            ptr,
            at: place as u32 + 1,
            _pad: 0,
        }
    }
}

/// One live tensor.
#[derive(Clone, Copy)]
#[repr(C)]
struct Entry {
    ptr: u64,
    size: u64,
    requested: u64,
    stack: u32,
    device: i32,
    tid: u32,
    /// Index of the droppable block holding its last statement.
    block: u32,
}

struct Table {
    /// `CAPACITY` entries, the first `len` live.
    dense: *mut Entry,
    /// `mask + 1` slots in use of `SLOTS`. Linear probing.
    index: *mut Slot,
    len: usize,
    /// Slots in use, less one (0 before the mapping).
    mask: usize,
    /// The table overflowed once: restatement and flight records are incomplete from then on.
    full: bool,
}

struct TableCell(UnsafeCell<Table>);
// Safety: only reached under LOCK.
unsafe impl Sync for TableCell {}

static TABLE: TableCell = TableCell(UnsafeCell::new(Table {
    dense: core::ptr::null_mut(),
    index: core::ptr::null_mut(),
    len: 0,
    mask: 0,
    full: false,
}));
static LOCK: AtomicBool = AtomicBool::new(false);
/// 0: not mapped yet, 1: mapped, 2: mapping failed (the table is off).
static MAPPED: AtomicU8 = AtomicU8::new(0);
/// A snapshot was asked for (SIGUSR2) and not written yet.
static PENDING: AtomicBool = AtomicBool::new(false);
static FORK: crate::fork::ForkHandler = crate::fork::ForkHandler::new(after_fork_child);

/// The home slot of `ptr` in an index of `mask + 1` slots (the hash's high bits).
fn slot_of(ptr: u64, mask: usize) -> usize {
    ((ptr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - (mask + 1).trailing_zeros())) as usize
}

impl Table {
    fn entries(&mut self) -> &mut [Entry] {
        // Safety: `dense` is a mapping of CAPACITY entries, the first `len` written.
        unsafe { core::slice::from_raw_parts_mut(self.dense, self.len) }
    }

    fn slot(&self, i: usize) -> Slot {
        // Safety: `i <= mask < SLOTS`, inside the index mapping.
        unsafe { *self.index.add(i) }
    }

    fn set_slot(&mut self, i: usize, v: Slot) {
        // Safety: as above.
        unsafe { *self.index.add(i) = v }
    }

    /// The index slot holding `ptr`, or the empty slot where it would go.
    fn find(&self, ptr: u64) -> (usize, bool) {
        let mut i = slot_of(ptr, self.mask);
        loop {
            let v = self.slot(i);
            if v.at == 0 {
                return (i, false);
            }
            if v.ptr == ptr {
                return (i, true);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Doubles the index and places every entry again.
    fn grow(&mut self) {
        self.mask = self.mask * 2 + 1;
        // Safety: mask < SLOTS: the first mask + 1 slots are inside the index mapping.
        unsafe { core::ptr::write_bytes(self.index, 0, self.mask + 1) };
        for at in 0..self.len {
            // Safety: at < len.
            let ptr = unsafe { (*self.dense.add(at)).ptr };
            let (i, _) = self.find(ptr);
            self.set_slot(i, Slot::new(ptr, at));
        }
    }

    fn insert(&mut self, e: Entry) {
        let (i, found) = self.find(e.ptr);
        if found {
            let at = self.slot(i).at as usize - 1;
            self.entries()[at] = e;
            return;
        }
        if self.len >= CAPACITY {
            self.full = true;
            return;
        }
        if (self.len + 1) * 2 > self.mask + 1 && self.mask + 1 < SLOTS {
            self.grow();
            return self.insert(e);
        }
        // Safety: len < CAPACITY.
        unsafe { self.dense.add(self.len).write(e) };
        self.set_slot(i, Slot::new(e.ptr, self.len));
        self.len += 1;
    }

    /// Takes `ptr`'s entry out, returning it (`None`: it was not there).
    fn remove(&mut self, ptr: u64) -> Option<Entry> {
        let (mut hole, found) = self.find(ptr);
        if !found {
            return None;
        }
        let at = self.slot(hole).at as usize - 1;
        let removed = self.entries()[at];
        // The last entry moves into the freed place; its slot follows it. Its slot is found
        // before the move: after it, the freed place holds its pointer too, and a probe chain
        // that passes the hole first would find the hole (whose slot is then cleared) and
        // leave its own slot naming a place past the end.
        let last = self.len - 1;
        if at != last {
            let moved = self.entries()[last];
            let (j, _) = self.find(moved.ptr);
            self.entries()[at] = moved;
            self.set_slot(j, Slot::new(moved.ptr, at));
        }
        self.len -= 1;
        // Backward-shift deletion keeps every probe chain unbroken.
        self.set_slot(hole, Slot::EMPTY);
        let mask = self.mask;
        let mut i = (hole + 1) & mask;
        loop {
            let v = self.slot(i);
            if v.at == 0 {
                break;
            }
            let home = slot_of(v.ptr, mask);
            // Moves back when its home is not in (hole, i] (cyclically).
            let dist_i = (i.wrapping_sub(home)) & mask;
            let dist_hole = (hole.wrapping_sub(home)) & mask;
            if dist_hole < dist_i {
                self.set_slot(hole, v);
                self.set_slot(i, Slot::EMPTY);
                hole = i;
            }
            i = (i + 1) & mask;
        }
        Some(removed)
    }
}

/// Runs `f` on the table under its lock, mapping it on first use; `None` when there is no
/// budget (the trace then keeps every record and needs no table), the mapping failed, or the
/// lock stays taken. `wait`: spin for the lock (tensor reports) or give up at once (a signal
/// handler).
fn with_table<R>(wait: bool, f: impl FnOnce(&mut Table) -> R) -> Option<R> {
    if crate::sink::budget_blocks() == 0 || MAPPED.load(Ordering::Acquire) == 2 {
        return None;
    }
    let mut spins = 0u32;
    while LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if !wait || spins > 1_000_000 {
            return None;
        }
        core::hint::spin_loop();
        if spins.is_multiple_of(64) {
            // Safety: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }
    // Safety: TABLE is only reached here, under LOCK.
    let t = unsafe { &mut *TABLE.0.get() };
    let r = if MAPPED.load(Ordering::Acquire) == 1 || map(t) {
        Some(f(t))
    } else {
        None
    };
    LOCK.store(false, Ordering::Release);
    r
}

#[cold]
fn map(t: &mut Table) -> bool {
    FORK.register();
    let bytes = CAPACITY * core::mem::size_of::<Entry>() + SLOTS * core::mem::size_of::<Slot>();
    // Safety: an anonymous private mapping; pages are committed only when touched.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        MAPPED.store(2, Ordering::Release);
        note(b"the live-tensor table could not be mapped: under the size budget, tensors whose allocation is dropped are not restated");
        return false;
    }
    t.dense = p as *mut Entry;
    // Safety: the index follows the entries inside the mapping.
    t.index = unsafe { (p as *mut u8).add(CAPACITY * core::mem::size_of::<Entry>()) } as *mut Slot;
    t.len = 0;
    t.mask = FIRST_SLOTS - 1;
    MAPPED.store(1, Ordering::Release);
    install_sigusr2();
    true
}

/// Encodes `e` as a TENSOR record with action `Live` at `t_ns`.
fn live_record<'a>(buf: &'a mut [u8; TENSOR_RECORD_MAX_LEN], e: &Entry, t_ns: u64) -> &'a [u8] {
    let t = TensorEvent {
        t_ns,
        tid: e.tid,
        device: e.device,
        action: TensorAction::Live,
        ptr: e.ptr,
        size: e.size,
        requested: e.requested,
        stack: e.stack,
        ..TensorEvent::default()
    };
    let mut enc = Encoder::new(&mut buf[..]);
    t.encode_compact_payload(&mut enc);
    let len = enc.finish(kind::TENSOR_COMPACT).len();
    &buf[..len]
}

/// The `block` of an entry restated into a never-dropped block: it matches no droppable one.
const KEPT: u32 = u32::MAX;

/// Restates every live tensor whose statement was in block `reused` (just reused, its records
/// gone) into this thread's never-dropped blocks, once: a tensor that outlives one turn of the
/// ring is likely to live long (weights, caches), and is never restated again. The file may
/// pass its budget by these statements (about 30 bytes per such tensor), never by a cascade:
/// a never-dropped write reuses no block.
fn restate(t: &mut Table, file: File, reused: u64) {
    let now = mono_ns();
    let block = reused as u32;
    let mut buf = [0u8; TENSOR_RECORD_MAX_LEN];
    for e in t.entries().iter_mut().filter(|e| e.block == block) {
        file.write(live_record(&mut buf, e, now));
        e.block = KEPT;
    }
}

/// What the table knew of a released tensor ([`on_release`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// No table (no budget, or it failed or overflowed): whether it was recorded is not known.
    Untracked,
    /// Not in the table: its allocation was never recorded (capture was paused, or off).
    Unrecorded,
    /// Live, its statement in a droppable block.
    Live,
    /// Live, its statement in a never-dropped block (it was restated): its release must go
    /// there too, since a dropped release would leave it live for a reader for good.
    Kept,
}

/// Takes a released tensor out of the table before its release is written.
pub(crate) fn on_release(ptr: u64) -> Released {
    with_table(true, |table| match table.remove(ptr) {
        Some(e) if e.block == KEPT => Released::Kept,
        Some(_) => Released::Live,
        None if table.full => Released::Untracked,
        None => Released::Unrecorded,
    })
    .unwrap_or(Released::Untracked)
}

/// Keeps the table in step with one tensor report written into droppable block `block` (an
/// allocation is added; a release was taken out by [`on_release`]), and restates what block
/// `reused` held, if the write reused one.
pub(crate) fn on_report(file: File, t: &TensorEvent, block: u64, reused: Option<u64>) {
    // A release that reused no block has nothing to do here: the table's lock (an atomic
    // exchange, the largest part of this function's cost) is not taken for it.
    let alloc = t.action == TensorAction::Alloc;
    if !alloc && reused.is_none() {
        serve_pending(file);
        return;
    }
    with_table(true, |table| {
        if alloc {
            table.insert(Entry {
                ptr: t.ptr,
                size: t.size,
                requested: t.requested,
                stack: t.stack,
                device: t.device,
                tid: t.tid,
                block: block as u32,
            });
        }
        if let Some(r) = reused {
            restate(table, file, r);
        }
    });
    serve_pending(file);
}

/// Restates what block `reused` held, after a write that reused it (an operator's output
/// description, which changes nothing in the table).
pub(crate) fn restate_reused(file: File, reused: u64) {
    with_table(true, |table| restate(table, file, reused));
}

/// Writes the flight record a `SIGUSR2` asked for, if one is waiting.
pub(crate) fn serve_pending(file: File) {
    if PENDING.load(Ordering::Relaxed) {
        flight_record(file, b"SIGUSR2 (vramtrace snapshot)", true, mono_ns());
    }
}

/// Writes the whole live set as a flight record into never-dropped blocks: a NOTE `flight
/// record: <why>: N live tensors, B bytes`, then one `Live` record per tensor, all at `now`
/// (a failure's own time, the failure's record written after them: a reader has the live set
/// when it meets the failure). `wait`: whether to wait for the table's lock (a signal handler
/// does not).
pub(crate) fn flight_record(file: File, why: &[u8], wait: bool, now: u64) {
    with_table(wait, |t| {
        PENDING.store(false, Ordering::Relaxed);
        let bytes: u64 = t.entries().iter().map(|e| e.size).sum();
        let mut text = [0u8; 200];
        let mut n = 0;
        let mut put = |b: &[u8]| {
            let k = b.len().min(text.len() - n);
            text[n..n + k].copy_from_slice(&b[..k]);
            n += k;
        };
        let mut num = [0u8; 20];
        put(b"flight record: ");
        put(why);
        put(b": ");
        put(decimal(&mut num, t.len as u64));
        put(b" live tensors, ");
        put(decimal(&mut num, bytes));
        put(if t.full {
            b" bytes (table full: incomplete)"
        } else {
            b" bytes"
        });
        let mut buf = [0u8; FRAME_HEADER_LEN + 8 + 200];
        let mut enc = Encoder::new(&mut buf);
        enc.u64(now).bytes(&text[..n]);
        file.write(enc.finish(kind::NOTE));
        let mut rec = [0u8; TENSOR_RECORD_MAX_LEN];
        for e in t.entries().iter() {
            file.write(live_record(&mut rec, e, now));
        }
    });
}

/// A NOTE record with `text`.
fn note(text: &[u8]) {
    crate::sink::with_file(|file| {
        let mut buf = [0u8; FRAME_HEADER_LEN + 8 + 160];
        let mut enc = Encoder::new(&mut buf);
        enc.u64(mono_ns()).bytes(&text[..text.len().min(160)]);
        file.write(enc.finish(kind::NOTE));
    });
}

fn decimal(out: &mut [u8; 20], mut v: u64) -> &[u8] {
    let mut i = out.len();
    loop {
        i -= 1;
        out[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &out[i..]
}

/// Installs the `SIGUSR2` handler unless the program has one (or ignores the signal).
fn install_sigusr2() {
    // Safety: reading and setting a signal disposition with valid structures.
    unsafe {
        let mut old: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(libc::SIGUSR2, core::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            note(b"SIGUSR2 is the program's own: vramtrace snapshot cannot ask this process for a flight record");
            return;
        }
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_sigusr2 as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR2, &sa, core::ptr::null_mut());
    }
}

/// `SIGUSR2`: a flight record now, into the thread's signal stream, if the table is free and
/// the thread is not growing the file; else at the next tensor report.
extern "C" fn on_sigusr2(_: libc::c_int) {
    PENDING.store(true, Ordering::Relaxed);
    if !crate::sink::signal_may_write() {
        return;
    }
    crate::sink::with_file(|file| {
        flight_record(
            file.for_signal(),
            b"SIGUSR2 (vramtrace snapshot)",
            false,
            mono_ns(),
        )
    });
}

/// In a fork child: the parent's tensors are not the child's. The table is unmapped and made
/// afresh on first use.
extern "C" fn after_fork_child() {
    LOCK.store(false, Ordering::Release);
    PENDING.store(false, Ordering::Release);
    // Safety: the child has one thread and the lock is free; the mapping is ours.
    unsafe {
        let t = &mut *TABLE.0.get();
        if !t.dense.is_null() {
            let bytes =
                CAPACITY * core::mem::size_of::<Entry>() + SLOTS * core::mem::size_of::<Slot>();
            libc::munmap(t.dense as *mut libc::c_void, bytes);
        }
        t.dense = core::ptr::null_mut();
        t.index = core::ptr::null_mut();
        t.len = 0;
        t.mask = 0;
        t.full = false;
    }
    MAPPED.store(0, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ptr: u64) -> Entry {
        Entry {
            ptr,
            size: ptr & 0xffff,
            requested: 0,
            stack: 0,
            device: 0,
            tid: 0,
            block: (ptr >> 9) as u32,
        }
    }

    /// Inserts and removes in a mixed order past several doublings of the index, checking
    /// every live entry is found with its own fields and every removed one is gone.
    #[test]
    fn the_table_finds_every_live_entry_as_its_index_grows() {
        let n = 40_000usize;
        let mut dense = vec![entry(0); n];
        let mut index = vec![Slot::EMPTY; SLOTS];
        let mut t = Table {
            dense: dense.as_mut_ptr(),
            index: index.as_mut_ptr(),
            len: 0,
            mask: FIRST_SLOTS - 1,
            full: false,
        };
        let mut live = std::collections::BTreeSet::new();
        // Addresses as an allocator hands them out: 512-byte steps, some clustered.
        let ptr = |i: u64| 0x7f00_0000_0000 + (i * 7919 % 65_536) * 512 + (i / 65_536) * (1 << 30);
        for i in 0..n as u64 {
            t.insert(entry(ptr(i)));
            live.insert(ptr(i));
            if i % 3 == 2 {
                let gone = ptr(i - 1);
                t.remove(gone);
                live.remove(&gone);
            }
        }
        assert!(t.mask + 1 > FIRST_SLOTS, "the index grew");
        assert_eq!(t.len, live.len());
        assert!(t.len * 2 <= t.mask + 1, "at most half full");
        for i in 0..n as u64 {
            let (at, found) = t.find(ptr(i));
            assert_eq!(found, live.contains(&ptr(i)), "{i}");
            if found {
                let slot = t.slot(at).at as usize;
                let e = t.entries()[slot - 1];
                assert_eq!((e.ptr, e.size), (ptr(i), ptr(i) & 0xffff));
            }
        }
        for &p in &live {
            t.remove(p);
        }
        assert_eq!(t.len, 0);
        let used = t.mask + 1;
        assert!(index[..used].iter().all(|&v| v == Slot::EMPTY));
    }

    fn small_table(dense: &mut Vec<Entry>, index: &mut Vec<Slot>) -> Table {
        Table {
            dense: dense.as_mut_ptr(),
            index: index.as_mut_ptr(),
            len: 0,
            mask: FIRST_SLOTS - 1,
            full: false,
        }
    }

    /// Every live pointer is found, through a slot naming a place before `len` that holds it.
    fn check(t: &Table, live: &std::collections::BTreeSet<u64>) {
        assert_eq!(t.len, live.len());
        for &p in live {
            let (at, found) = t.find(p);
            assert!(found, "{p:#x} lost");
            let v = t.slot(at).at as usize;
            assert!(
                v >= 1 && v <= t.len,
                "{p:#x}: its slot names place {v} of {}",
                t.len
            );
            // Safety: v - 1 < len.
            let e = unsafe { *t.dense.add(v - 1) };
            assert_eq!(e.ptr, p, "{p:#x}: its slot names another's place");
        }
        for i in 0..=t.mask {
            let v = t.slot(i);
            assert!(
                v.at as usize <= t.len,
                "slot {i} names place {} of {}",
                v.at,
                t.len
            );
            if v.at != 0 {
                // Safety: at - 1 < len.
                let e = unsafe { *t.dense.add(v.at as usize - 1) };
                assert_eq!(e.ptr, v.ptr, "slot {i}'s pointer is not its entry's");
            }
        }
    }

    /// Two pointers with one home slot, the first removed while the second is the last entry:
    /// the second's probe chain passes the first's slot. Before the fix its slot was left
    /// naming a place past the end, and the next lookup of it indexed out of bounds (a panic
    /// that stopped recording on the H200 after some 300,000 tensors, docs/validation.md).
    #[test]
    fn removing_an_entry_keeps_the_slot_of_the_one_moved_into_its_place() {
        let mut dense = vec![entry(0); 16];
        let mut index = vec![Slot::EMPTY; SLOTS];
        let mut t = small_table(&mut dense, &mut index);
        let a = 0x7f00_0000_0000u64;
        let home = slot_of(a, t.mask);
        let b = (1..1_000_000u64)
            .map(|i| a + i * 512)
            .find(|&p| slot_of(p, t.mask) == home)
            .expect("a pointer with the same home slot");
        t.insert(entry(a));
        t.insert(entry(b));
        t.remove(a);
        check(&t, &[b].into_iter().collect());
        t.insert(entry(a));
        t.remove(b);
        check(&t, &[a].into_iter().collect());
    }

    /// A caching allocator's churn: a small pool of addresses handed out and taken back in a
    /// shuffled order, a million times, with every invariant checked after each of the first
    /// 20,000 and then now and then.
    #[test]
    fn the_table_survives_an_allocators_churn() {
        let mut dense = vec![entry(0); 4096];
        let mut index = vec![Slot::EMPTY; SLOTS];
        let mut t = small_table(&mut dense, &mut index);
        let mut live = std::collections::BTreeSet::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..1_000_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p = 0x7f00_0000_0000 + (x % 3800) * 512;
            if live.remove(&p) {
                t.remove(p);
            } else {
                t.insert(entry(p));
                live.insert(p);
            }
            if step < 20_000 || step % 4096 == 0 {
                check(&t, &live);
            }
        }
        check(&t, &live);
    }
}
