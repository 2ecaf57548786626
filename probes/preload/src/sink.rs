//! The sink: one trace file per process (format version 2), filled through a shared file
//! mapping with no system call per record, and the clock and thread id every record carries.
//!
//! The interface is narrow on purpose, so that the way records reach the disk can change
//! behind it: [`with_file`] (or [`file()`] inside [`guarded`]) hands out the open trace file,
//! [`File::write`] appends one encoded record (a `vramtrace_format::Encoder` frame),
//! [`File::write_event`] appends an event, [`mono_ns`] and [`tid`] are the clock and the
//! thread, [`active`] says whether recording is on, [`disable`] stops it. Everything above
//! encodes its records itself (`vramtrace_format`) and only ever hands them to the sink.
//!
//! # Layout and the hot path
//! The file is the header, then blocks of [`BLOCK_SIZE`] bytes (`vramtrace_format::BlockHeader`).
//! Each thread owns one block at a time through a thread-local cursor and appends records to
//! it with plain stores: length and payload first, the record's tag last with release
//! ordering. A record is on the page cache the moment it is stored, so a `SIGKILL` loses
//! nothing that was stored, and a record cut by the kill has a zero tag and is never read.
//! Taking a block is one `fetch_add` on the block counter ([`NEXT_BLOCK`]), about once per five
//! thousand events.
//!
//! # Space
//! Disk space is reserved ahead with `posix_fallocate` ([`RESERVED`] blocks, in steps that
//! double from 256 KiB to 64 MiB) before a block is handed out: a store into a page of a
//! shared mapping with no disk behind it would raise `SIGBUS` and kill the host. When the
//! reservation fails (disk full) recording stops with a note; the program carries on. The file
//! is mapped chunk by chunk ([`CHUNK_BYTES`]) into a fixed table ([`CHUNKS`]). Reserving and
//! mapping happen under one spin lock ([`GROW`]), taken only when a block lies past the
//! reservation or in a chunk not mapped yet, never while the driver runs.
//!
//! # State and fork
//! State machine ([`STATE`]): `IDLE` (nothing written yet) → `OPENING` (one thread creates the
//! file and writes the header, then the driver version) → `RECORDING`; `FAILED` when anything
//! went wrong (recording stops, one warning on stderr, the host carries on). Threads that meet
//! `OPENING` yield until it is over.
//!
//! After `fork` the child handler ([`after_fork_child`]) unmaps the parent's chunks, closes the
//! inherited descriptor, bumps [`EPOCH`] (so the forking thread's cursor, copied into the child,
//! is stale and never used) and goes back to `IDLE`: the child creates its own file, with its
//! own pid and ppid, on its first record, and never stores into the parent's.
//!
//! A standing note ([`set_standing_note`], from `vramtrace_note`) is written into each file
//! right after its header records, the parent's and every fork child's.

use core::cell::Cell;
use core::ffi::{c_char, c_int};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering,
};

use vramtrace_format::{
    BLOCK_DROPPABLE, BLOCK_HEADER_LEN, BLOCK_SIGNAL, BlockHeader, DEFAULT_BLOCK_SIZE, Deltas,
    Encoder, Event, FRAME_HEADER_LEN, Header, MAX_EVENT_RECORD_LEN, encode_event, kind,
    payload_time, trace_file_name,
};

use crate::fork::ForkHandler;

const IDLE: u8 = 0;
const OPENING: u8 = 1;
const RECORDING: u8 = 2;
const FAILED: u8 = 3;

/// Bytes per block.
pub(crate) const BLOCK_SIZE: usize = DEFAULT_BLOCK_SIZE as usize;
/// Blocks per mapped chunk.
const BLOCKS_PER_CHUNK: u64 = 256;
/// Bytes per mapped chunk (16 MiB).
const CHUNK_BYTES: usize = BLOCK_SIZE * BLOCKS_PER_CHUNK as usize;
/// Chunks a trace file can have: 64 GiB, some five billion events.
const MAX_CHUNKS: usize = 4096;
/// First reservation, and the largest step the reservation grows by.
const FIRST_RESERVE_BLOCKS: u64 = 4;
const MAX_RESERVE_STEP_BLOCKS: u64 = 1024;

static STATE: AtomicU8 = AtomicU8::new(IDLE);
static FD: AtomicI32 = AtomicI32::new(-1);
static WARNED: AtomicBool = AtomicBool::new(false);
static FORK: ForkHandler = ForkHandler::new(after_fork_child);
/// File offset of block 0.
static DATA_OFFSET: AtomicU64 = AtomicU64::new(0);
/// Index of the next block to hand out.
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(0);
/// Blocks with disk space reserved behind them.
static RESERVED: AtomicU64 = AtomicU64::new(0);
/// Mapped chunks (null: not mapped yet).
static CHUNKS: [AtomicPtr<u8>; MAX_CHUNKS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_CHUNKS];
/// The slow path's lock: reserving space and mapping chunks.
static GROW: AtomicBool = AtomicBool::new(false);
/// Changes whenever cursors taken before must not be used again (a new file, a fork child).
static EPOCH: AtomicU32 = AtomicU32::new(1);

/// A thread's place in its block.
#[derive(Clone, Copy)]
struct Cursor {
    /// [`EPOCH`] when the block was taken; 0 for no block.
    epoch: u32,
    block: *mut u8,
    /// Next free byte inside the block.
    pos: usize,
    deltas: Deltas,
}

const NO_CURSOR: Cursor = Cursor {
    epoch: 0,
    block: core::ptr::null_mut(),
    pos: BLOCK_SIZE,
    deltas: Deltas { t_ns: 0, ptr: 0 },
};

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
    static CURSOR: Cell<Cursor> = const { Cell::new(NO_CURSOR) };
    /// The thread's droppable block: tensor-level records, in the ring under a size budget.
    static DCURSOR: Cell<Cursor> = const { Cell::new(NO_CURSOR) };
    /// The droppable block's index in the file and the time of its last record (kept apart from
    /// the cursor, so that the hot path's cursor stays as small as it was).
    static DMETA: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    /// The block a signal handler writes into on this thread ([`File::for_signal`]): never the
    /// interrupted code's own, which may be half-way through a record.
    static SCURSOR: Cell<Cursor> = const { Cell::new(NO_CURSOR) };
    /// Inside [`grow`] on this thread (holding its lock): a signal handler must not write.
    static IN_GROW: Cell<bool> = const { Cell::new(false) };
}

/// The open trace file, as [`with_file`] and [`file()`] hand it out: the only way to write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct File {
    /// In unit tests: frames go to this descriptor with `write(2)` instead.
    #[cfg(test)]
    raw_fd: Option<c_int>,
    /// Written from a signal handler: into the thread's signal stream ([`SCURSOR`]).
    signal: bool,
}

impl File {
    const MAPPED: File = File {
        #[cfg(test)]
        raw_fd: None,
        signal: false,
    };

    /// The same file, for a signal handler: its records go to a block of their own on this
    /// thread (a stream flagged `BLOCK_SIGNAL`), so that they never mix with a record the
    /// interrupted code was writing. Nothing on the hot path checks for a signal.
    pub(crate) fn for_signal(mut self) -> File {
        self.signal = true;
        self
    }

    /// Appends one encoded record (a frame from `vramtrace_format::Encoder`): its kind and
    /// payload go into this thread's block.
    pub(crate) fn write(self, frame: &[u8]) {
        #[cfg(test)]
        if let Some(fd) = self.raw_fd {
            write_all(fd, frame);
            return;
        }
        if frame.len() < FRAME_HEADER_LEN {
            return;
        }
        let (tag, payload) = (frame[1], &frame[FRAME_HEADER_LEN..]);
        let mut len = [0u8; 10];
        let n = put_varint(&mut len, payload.len() as u64);
        let total = 1 + n + payload.len();
        if tag == 0 || total > BLOCK_SIZE - BLOCK_HEADER_LEN {
            return;
        }
        // A block's base time must not follow any time in it. An untimed record (a string, a
        // stack) is often written between reading the clock for an event and writing the
        // event, so it takes the thread's last clock reading, not a fresh one.
        let t = payload_time(tag, payload).unwrap_or_else(crate::clock::last_ns);
        let which = if self.signal { &SCURSOR } else { &CURSOR };
        let flags = if self.signal { BLOCK_SIGNAL } else { 0 };
        append_in(which, None, flags, total, t, |dst, _| {
            // Safety: `append` hands out `total` writable bytes of this thread's block.
            unsafe {
                core::ptr::copy_nonoverlapping(len.as_ptr(), dst.add(1), n);
                core::ptr::copy_nonoverlapping(payload.as_ptr(), dst.add(1 + n), payload.len());
            }
            tag
        });
    }

    /// The finished frame of the record `e` holds, as `kind`, for [`File::write`] or
    /// [`File::write_droppable`]: without the frame checksum, which a version 2 block drops
    /// (computing it was 15% of a native capture's samples, docs/performance.md).
    pub(crate) fn frame<'a>(self, e: &'a mut vramtrace_format::Encoder<'_>, kind: u8) -> &'a [u8] {
        #[cfg(test)]
        if self.raw_fd.is_some() {
            return e.finish(kind);
        }
        e.finish_without_checksum(kind)
    }

    /// Appends one tensor-level record (a frame, as [`File::write`]) to this thread's
    /// droppable block: under a size budget, the oldest droppable blocks are reused once the
    /// file would pass it ([`take_droppable`]). Returns the block's index in the file, and the
    /// index of a block reused to make room (its records gone, a DROPPED record written), if
    /// one was; `None` when nothing was written.
    pub(crate) fn write_droppable(self, frame: &[u8]) -> Option<(u64, Option<u64>)> {
        #[cfg(test)]
        if self.raw_fd.is_some() {
            self.write(frame);
            return Some((0, None));
        }
        if frame.len() < FRAME_HEADER_LEN {
            return None;
        }
        let (tag, payload) = (frame[1], &frame[FRAME_HEADER_LEN..]);
        let mut len = [0u8; 10];
        let n = put_varint(&mut len, payload.len() as u64);
        let total = 1 + n + payload.len();
        if tag == 0 || total > BLOCK_SIZE - BLOCK_HEADER_LEN {
            return None;
        }
        let t = payload_time(tag, payload).unwrap_or_else(crate::clock::last_ns);
        let mut reused = None;
        let index = append_in(
            &DCURSOR,
            Some(&mut reused),
            BLOCK_DROPPABLE,
            total,
            t,
            |dst, _| {
                // Safety: `append_in` hands out `total` writable bytes of this thread's block.
                unsafe {
                    core::ptr::copy_nonoverlapping(len.as_ptr(), dst.add(1), n);
                    core::ptr::copy_nonoverlapping(payload.as_ptr(), dst.add(1 + n), payload.len());
                }
                tag
            },
        )?;
        Some((index, reused))
    }

    /// Appends one event (its thread is the block's; its time and pointer are encoded as
    /// deltas from the thread's previous event).
    #[inline]
    pub(crate) fn write_event(self, ev: &Event) {
        #[cfg(test)]
        if let Some(fd) = self.raw_fd {
            let mut rec = [0u8; vramtrace_format::EVENT_RECORD_LEN];
            ev.encode(&mut rec);
            write_all(fd, &rec);
            return;
        }
        append(MAX_EVENT_RECORD_LEN, ev.t_ns, |dst, deltas| {
            let mut rec = [0u8; MAX_EVENT_RECORD_LEN];
            let n = encode_event(ev, deltas, &mut rec);
            // The whole buffer, not `n` bytes: a copy of constant length is a few vector
            // stores, where one of `n` bytes was a call to memcpy (4% of a traced alloc/free
            // loop). The bytes past `n` are the buffer's zeros over the block's zeros, so the
            // block still ends at the first zero tag.
            // Safety: `append` hands out MAX_EVENT_RECORD_LEN writable bytes.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    rec.as_ptr().add(1),
                    dst.add(1),
                    MAX_EVENT_RECORD_LEN - 1,
                )
            };
            (rec[0], n)
        });
    }

    /// A file on a descriptor the test opened itself (version 1 frames, one `write(2)` each).
    #[cfg(test)]
    pub(crate) fn from_raw_fd(fd: c_int) -> File {
        File {
            raw_fd: Some(fd),
            signal: false,
        }
    }
}

/// What a record writer returns: its tag, and its length when only known after encoding.
trait Written {
    fn parts(self, room: usize) -> (u8, usize);
}
impl Written for u8 {
    fn parts(self, room: usize) -> (u8, usize) {
        (self, room)
    }
}
impl Written for (u8, usize) {
    fn parts(self, _: usize) -> (u8, usize) {
        self
    }
}

/// Appends one record of at most `room` bytes to this thread's block (taking a new block,
/// based at `t_ns`, when it has not that much room left): `fill` writes every byte but the
/// first (the tag) and returns the tag; the tag is stored last, with release ordering.
#[inline(always)]
fn append<W: Written>(room: usize, t_ns: u64, fill: impl FnOnce(*mut u8, &mut Deltas) -> W) {
    append_in(&CURSOR, None, 0, room, t_ns, fill);
}

/// [`append`] into the block of `which` cursor: [`CURSOR`], [`SCURSOR`] (flags `BLOCK_SIGNAL`),
/// or [`DCURSOR`] with `reused` (which then receives the index of a block reused to make room).
/// Returns the block's index.
#[inline(always)]
fn append_in<W: Written>(
    which: &'static std::thread::LocalKey<Cell<Cursor>>,
    reused: Option<&mut Option<u64>>,
    flags: u32,
    room: usize,
    t_ns: u64,
    fill: impl FnOnce(*mut u8, &mut Deltas) -> W,
) -> Option<u64> {
    let epoch = EPOCH.load(Ordering::Acquire);
    let mut cur = which.try_with(Cell::get).ok()?; // none at thread exit
    let droppable = reused.is_some();
    if cur.epoch != epoch || cur.pos + room > BLOCK_SIZE {
        cur = match reused {
            Some(reused) => {
                let (c, index, r) = take_droppable(epoch, t_ns, cur)?;
                *reused = r;
                let _ = DMETA.try_with(|m| m.set((index, t_ns)));
                c
            }
            None => take_block(epoch, t_ns, flags)?.0,
        };
    }
    // Safety: the cursor's block is this thread's alone, mapped and reserved, and
    // `pos + room <= BLOCK_SIZE`.
    let dst = unsafe { cur.block.add(cur.pos) };
    let (tag, len) = fill(dst, &mut cur.deltas).parts(room);
    // Safety: `dst` is in the mapping and suitably aligned for a byte; nobody else stores here.
    unsafe { AtomicU8::from_ptr(dst) }.store(tag, Ordering::Release);
    cur.pos += len;
    let _ = which.try_with(|c| c.set(cur));
    if droppable {
        return DMETA
            .try_with(|m| {
                let (index, last) = m.get();
                m.set((index, last.max(t_ns)));
                index
            })
            .ok();
    }
    Some(0)
}

/// Whether a signal handler on this thread may write (through [`File::for_signal`]): not while
/// the interrupted code holds the lock that grows the file.
pub(crate) fn signal_may_write() -> bool {
    !IN_GROW.try_with(Cell::get).unwrap_or(true)
}

/// Hands this thread a fresh block, its header written. `None` when recording stops.
#[cold]
fn take_block(epoch: u32, t_ns: u64, flags: u32) -> Option<(Cursor, u64)> {
    if STATE.load(Ordering::Acquire) != RECORDING {
        return None;
    }
    let index = NEXT_BLOCK.fetch_add(1, Ordering::AcqRel);
    let seq = NEXT_SEQ.fetch_add(1, Ordering::AcqRel);
    let chunk = (index / BLOCKS_PER_CHUNK) as usize;
    if chunk >= MAX_CHUNKS {
        disable("the trace file reached its size limit (64 GiB)");
        return None;
    }
    if RESERVED.load(Ordering::Acquire) <= index || CHUNKS[chunk].load(Ordering::Acquire).is_null()
    {
        grow(index)?;
    }
    // Recheck: a fork child or a failure may have happened while growing.
    if EPOCH.load(Ordering::Acquire) != epoch || STATE.load(Ordering::Acquire) != RECORDING {
        return None;
    }
    let block = block_at(index);
    Some((start_block(epoch, block, seq, t_ns, flags), index))
}

/// The mapped address of block `index` (its chunk mapped).
fn block_at(index: u64) -> *mut u8 {
    let base = CHUNKS[(index / BLOCKS_PER_CHUNK) as usize].load(Ordering::Acquire);
    // Safety: the chunk is mapped and CHUNK_BYTES long; the block lies inside it.
    unsafe { base.add((index % BLOCKS_PER_CHUNK) as usize * BLOCK_SIZE) }
}

/// Writes the header of the (zeroed) block at `block` and returns this thread's cursor in it.
fn start_block(epoch: u32, block: *mut u8, seq: u64, t_ns: u64, flags: u32) -> Cursor {
    let header = BlockHeader {
        tid: tid(),
        seq,
        base_t_ns: t_ns,
        flags,
    };
    let bytes = header.encode();
    // Safety: the block is this thread's alone and reserved; the magic (bytes 0..4, aligned:
    // blocks are page aligned) is stored last so that a reader never sees a half header.
    unsafe {
        core::ptr::copy_nonoverlapping(bytes.as_ptr().add(4), block.add(4), BLOCK_HEADER_LEN - 4);
        AtomicU32::from_ptr(block as *mut u32).store(
            u32::from_ne_bytes(bytes[..4].try_into().unwrap()),
            Ordering::Release,
        );
    }
    Cursor {
        epoch,
        block,
        pos: BLOCK_HEADER_LEN,
        deltas: Deltas::at_block_start(&header),
    }
}

// ---- the ring: tensor-level blocks under a size budget ---------------------------------------

/// Most finished droppable blocks the ring keeps track of: 64 GiB of them, the most a trace
/// file can hold. The queue is one anonymous mapping (32 MiB of address space, made when the
/// first block is queued, touched only as far as blocks are).
const MAX_RING: usize = MAX_CHUNKS * BLOCKS_PER_CHUNK as usize;

/// A finished droppable block: where it is, whose it was and the times it covers.
#[derive(Clone, Copy)]
struct RingEntry {
    index: u64,
    tid: u32,
    from_t: u64,
    to_t: u64,
}

/// The queue of finished droppable blocks, oldest first; guarded by [`RING_LOCK`].
struct Ring {
    /// `MAX_RING` entries once mapped; null before (and if the mapping failed: nothing is
    /// queued, so nothing is reused and the file grows past its budget).
    entries: *mut RingEntry,
    head: usize,
    len: usize,
}

impl Ring {
    fn entry(&mut self, i: usize) -> &mut RingEntry {
        // Safety: `entries` maps MAX_RING entries and callers pass `i < MAX_RING`.
        unsafe { &mut *self.entries.add(i) }
    }

    /// Maps the queue on first use; false if it cannot be.
    fn ready(&mut self) -> bool {
        if self.entries.is_null() {
            // Safety: an anonymous private mapping, committed only where touched.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    MAX_RING * core::mem::size_of::<RingEntry>(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                self.entries = p as *mut RingEntry;
            }
        }
        !self.entries.is_null()
    }
}

struct RingCell(core::cell::UnsafeCell<Ring>);
// Safety: only reached under RING_LOCK.
unsafe impl Sync for RingCell {}

static RING: RingCell = RingCell(core::cell::UnsafeCell::new(Ring {
    entries: core::ptr::null_mut(),
    head: 0,
    len: 0,
}));
static RING_LOCK: AtomicBool = AtomicBool::new(false);
/// The budget in blocks (0: none), set when the file is created.
static BUDGET_BLOCKS: AtomicU64 = AtomicU64::new(0);
/// The sequence number of the next block taken or reused.
static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);

/// Runs `f` on the ring under its lock; `None` if the lock stays taken (a thread stopped
/// inside it, which only a fork at that moment can do).
fn with_ring<R>(f: impl FnOnce(&mut Ring) -> R) -> Option<R> {
    let mut spins = 0u32;
    while RING_LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins > 1_000_000 {
            return None;
        }
        // Safety: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
    // Safety: RING is only reached here, under RING_LOCK.
    let r = f(unsafe { &mut *RING.0.get() });
    RING_LOCK.store(false, Ordering::Release);
    Some(r)
}

/// The size budget in blocks (0: none).
pub(crate) fn budget_blocks() -> u64 {
    BUDGET_BLOCKS.load(Ordering::Relaxed)
}

/// Hands this thread a droppable block, `old` being its previous one (which joins the ring's
/// queue): a fresh block while the file is within its budget (or there is none), else the
/// oldest finished droppable block, reused: its records are dropped, a DROPPED record says
/// which time range of whose they covered, and its index is returned beside the cursor so that
/// the caller can restate what they held that still matters (the live tensors).
#[cold]
fn take_droppable(epoch: u32, t_ns: u64, old: Cursor) -> Option<(Cursor, u64, Option<u64>)> {
    let budget = BUDGET_BLOCKS.load(Ordering::Relaxed);
    if old.epoch == epoch && !old.block.is_null() && budget > 0 {
        let (old_index, old_last) = DMETA.try_with(Cell::get).unwrap_or((0, 0));
        let entry = RingEntry {
            index: old_index,
            tid: tid(),
            // Safety: the old block is mapped; its base time is bytes 16..24 of its header.
            from_t: u64::from_le_bytes(unsafe { *(old.block.add(16) as *const [u8; 8]) }),
            to_t: old_last,
        };
        with_ring(|r| {
            if r.len < MAX_RING && r.ready() {
                let at = (r.head + r.len) % MAX_RING;
                *r.entry(at) = entry;
                r.len += 1;
            }
        });
    }
    if budget == 0 || NEXT_BLOCK.load(Ordering::Acquire) < budget {
        return take_block(epoch, t_ns, BLOCK_DROPPABLE).map(|(c, i)| (c, i, None));
    }
    let Some(Some(e)) = with_ring(|r| {
        (r.len > 0).then(|| {
            let e = *r.entry(r.head);
            r.head = (r.head + 1) % MAX_RING;
            r.len -= 1;
            e
        })
    }) else {
        // Nothing finished to reuse (every droppable block is some thread's current one):
        // the file grows past the budget rather than lose a record.
        return take_block(epoch, t_ns, BLOCK_DROPPABLE).map(|(c, i)| (c, i, None));
    };
    if EPOCH.load(Ordering::Acquire) != epoch || STATE.load(Ordering::Acquire) != RECORDING {
        return None;
    }
    let block = block_at(e.index);
    // Safety: a finished block of this file, mapped; no thread owns it any more (it left the
    // queue under the lock). Its magic goes first, so a reader sees no half-cleared block.
    unsafe {
        AtomicU32::from_ptr(block as *mut u32).store(0, Ordering::Release);
        core::ptr::write_bytes(block.add(4), 0, BLOCK_SIZE - 4);
    }
    let seq = NEXT_SEQ.fetch_add(1, Ordering::AcqRel);
    let cursor = start_block(epoch, block, seq, t_ns, BLOCK_DROPPABLE);
    // After the new header: a follower that reads this record finds the block restarted.
    let mut buf = [0u8; FRAME_HEADER_LEN + 36];
    let mut enc = Encoder::new(&mut buf);
    enc.u64(t_ns)
        .u32(e.tid)
        .u64(e.from_t)
        .u64(e.to_t)
        .u64(e.index);
    File::MAPPED.write(enc.finish(kind::DROPPED));
    Some((cursor, e.index, Some(e.index)))
}

/// The slow path: reserves space up to block `index` and maps its chunk. `None` (recording
/// stopped) if either fails.
#[cold]
fn grow(index: u64) -> Option<()> {
    let mut spins = 0u32;
    while GROW
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins > 1_000_000 || STATE.load(Ordering::Acquire) != RECORDING {
            return None;
        }
        // Safety: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
    let _ = IN_GROW.try_with(|g| g.set(true));
    let result = grow_locked(index);
    GROW.store(false, Ordering::Release);
    let _ = IN_GROW.try_with(|g| g.set(false));
    if let Err(why) = &result {
        stop_with_note(why);
    }
    result.ok()
}

fn grow_locked(index: u64) -> Result<(), String> {
    let fd = FD.load(Ordering::Acquire);
    let data = DATA_OFFSET.load(Ordering::Acquire);
    let reserved = RESERVED.load(Ordering::Acquire);
    if reserved <= index {
        let step = reserved.clamp(FIRST_RESERVE_BLOCKS, MAX_RESERVE_STEP_BLOCKS);
        let mut upto = (index + 1).max(reserved + step);
        let budget = BUDGET_BLOCKS.load(Ordering::Relaxed);
        if budget > 0 {
            // Under a budget the reservation stops at it (the file is as long as it reserves).
            upto = upto.min(budget.max(index + 1));
        }
        let from = data + reserved * BLOCK_SIZE as u64;
        let len = (upto - reserved) * BLOCK_SIZE as u64;
        // Safety: an open descriptor and a range; posix_fallocate returns an error number.
        let r = unsafe { libc::posix_fallocate(fd, from as libc::off_t, len as libc::off_t) };
        if r != 0 {
            return Err(format!(
                "cannot reserve space for the trace ({} more bytes): {}",
                len,
                std::io::Error::from_raw_os_error(r)
            ));
        }
        RESERVED.store(upto, Ordering::Release);
    }
    let chunk = (index / BLOCKS_PER_CHUNK) as usize;
    if CHUNKS[chunk].load(Ordering::Acquire).is_null() {
        // Safety: a fresh shared mapping of the file; its pages past the reservation are never
        // touched (blocks are handed out only below RESERVED).
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                CHUNK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                (data + chunk as u64 * CHUNK_BYTES as u64) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "cannot map the trace file: {}",
                std::io::Error::last_os_error()
            ));
        }
        CHUNKS[chunk].store(p as *mut u8, Ordering::Release);
    }
    Ok(())
}

/// Stops recording after a failure to grow the file or an internal error, leaving a NOTE
/// ("recording stopped: why") in the calling thread's block if it still has room.
fn stop_with_note(why: &str) {
    let note = format!("recording stopped: {why}");
    let text = note.as_bytes();
    let mut buf = [0u8; FRAME_HEADER_LEN + 8 + 256];
    let mut e = Encoder::new(&mut buf);
    e.u64(mono_ns()).bytes(&text[..text.len().min(256)]);
    let frame = e.finish(kind::NOTE);
    let epoch = EPOCH.load(Ordering::Acquire);
    if let Ok(cur) = CURSOR.try_with(Cell::get)
        && cur.epoch == epoch
        && cur.pos + frame.len() <= BLOCK_SIZE
    {
        File::MAPPED.write(frame);
    }
    disable(why);
}

/// Longest standing note kept, in bytes.
const MAX_STANDING: usize = 256;
/// The standing note ([`set_standing_note`]): its bytes, its length (0: none) and the spin lock
/// that guards both.
static STANDING: [AtomicU8; MAX_STANDING] = [const { AtomicU8::new(0) }; MAX_STANDING];
static STANDING_LEN: AtomicU32 = AtomicU32::new(0);
static STANDING_LOCK: AtomicBool = AtomicBool::new(false);

/// Keeps `text` as this process's standing note: a NOTE written into every trace file the
/// process creates from now on (its own, created on its first record, and a fork child's),
/// and into the open file at once if there is one. A process that never records anything
/// still writes no file. The PyTorch probe says with it whether it started, so that a reader
/// can tell "no tensor recorded" from "no tensor made".
pub(crate) fn set_standing_note(text: &[u8]) {
    let text = &text[..text.len().min(MAX_STANDING)];
    if !lock_standing() {
        return;
    }
    for (slot, &b) in STANDING.iter().zip(text) {
        slot.store(b, Ordering::Relaxed);
    }
    STANDING_LEN.store(text.len() as u32, Ordering::Relaxed);
    STANDING_LOCK.store(false, Ordering::Release);
    // Against the opener's read in `file()`: at worst both write it (two equal notes).
    std::sync::atomic::fence(Ordering::SeqCst);
    if STATE.load(Ordering::Acquire) == RECORDING {
        with_file(write_standing_note);
    }
}

/// Takes the standing note's lock; false if it stays taken (a thread stopped inside it, which
/// only a bug or a fork at that moment can do): the note is then left out, never waited for.
fn lock_standing() -> bool {
    for _ in 0..100_000 {
        if STANDING_LOCK
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return true;
        }
        core::hint::spin_loop();
    }
    false
}

/// Writes the standing note, if there is one, into `file`.
fn write_standing_note(file: File) {
    std::sync::atomic::fence(Ordering::SeqCst);
    if STANDING_LEN.load(Ordering::Relaxed) == 0 || !lock_standing() {
        return;
    }
    let mut text = [0u8; MAX_STANDING];
    let len = (STANDING_LEN.load(Ordering::Relaxed) as usize).min(MAX_STANDING);
    for (b, slot) in text.iter_mut().zip(&STANDING).take(len) {
        *b = slot.load(Ordering::Relaxed);
    }
    STANDING_LOCK.store(false, Ordering::Release);
    let mut buf = [0u8; FRAME_HEADER_LEN + 8 + MAX_STANDING];
    let mut e = Encoder::new(&mut buf);
    e.u64(mono_ns()).bytes(&text[..len]);
    file.write(e.finish(kind::NOTE));
}

/// Writes LEB128 `v` into `out`; returns its length.
fn put_varint(out: &mut [u8; 10], mut v: u64) -> usize {
    let mut n = 0;
    while v >= 0x80 {
        out[n] = v as u8 | 0x80;
        n += 1;
        v >>= 7;
    }
    out[n] = v as u8;
    n + 1
}

/// True when recording is configured on and has not failed.
#[inline]
pub(crate) fn active() -> bool {
    crate::config::enabled() && STATE.load(Ordering::Relaxed) != FAILED
}

/// Runs `f` with the trace file (creating it first if needed), with panics caught and errno
/// preserved. Does nothing when recording is off or has failed.
pub(crate) fn with_file(f: impl FnOnce(File)) {
    if !active() {
        return;
    }
    guarded(|| {
        if let Some(file) = file() {
            f(file)
        }
    });
}

/// Runs recorder code with panics caught and errno preserved: a bug here disables recording
/// and never unwinds into the host or changes what it sees.
pub(crate) fn guarded(f: impl FnOnce()) {
    let saved = errno();
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        // Said in the trace too, so that a reader after the fact knows it ends early, and why.
        let what = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("no message");
        stop_with_note(&format!(
            "internal error in the recorder ({what}); please report it"
        ));
    }
    set_errno(saved);
}

fn errno() -> c_int {
    // Safety: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn set_errno(v: c_int) {
    // Safety: as above.
    unsafe { *libc::__errno_location() = v }
}

/// `CLOCK_MONOTONIC` in nanoseconds, never below this thread's previous reading (remembered
/// per thread for the base times of blocks); from the TSC where that is safe (`src/clock.rs`).
#[inline]
pub(crate) fn mono_ns() -> u64 {
    crate::clock::now_ns()
}

/// The kernel thread id, cached per thread (reset in a fork child).
pub(crate) fn tid() -> u32 {
    TID.try_with(|c| {
        let t = c.get();
        if t != 0 {
            return t;
        }
        let t = gettid();
        c.set(t);
        t
    })
    // Thread-local storage already torn down.
    .unwrap_or_else(|_| gettid())
}

/// The kernel thread id, by the system call: glibc's `gettid` wrapper exists only since 2.30,
/// and a reference to it would keep the preload from loading on an older glibc (the wheel's
/// floor is 2.17; scripts/check_glibc_floor.sh).
fn gettid() -> u32 {
    // Safety: gettid has no arguments and no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// The trace file, creating it (header and driver record first) on the first call. `None`
/// when recording is off or failed. Call it inside [`guarded`] (as [`with_file`] does).
pub(crate) fn file() -> Option<File> {
    let mut spins = 0u32;
    loop {
        match STATE.load(Ordering::Acquire) {
            RECORDING => return Some(File::MAPPED),
            IDLE => {
                if STATE
                    .compare_exchange(IDLE, OPENING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return match open_trace() {
                        Ok(fd) => {
                            FD.store(fd, Ordering::Release);
                            EPOCH.fetch_add(1, Ordering::AcqRel);
                            STATE.store(RECORDING, Ordering::Release);
                            if let Some(v) = crate::driver::driver_version() {
                                let mut buf = [0u8; FRAME_HEADER_LEN + 4];
                                let mut e = Encoder::new(&mut buf);
                                e.i32(v);
                                File::MAPPED.write(e.finish(kind::DRIVER));
                            }
                            write_standing_note(File::MAPPED);
                            Some(File::MAPPED)
                        }
                        Err(why) => {
                            disable(&why);
                            None
                        }
                    };
                }
            }
            OPENING => {
                // Another thread is creating the file: a few system calls. Give up on this
                // record rather than wait forever if something is badly wrong.
                spins += 1;
                if spins > 100_000 {
                    return None;
                }
                // Safety: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
            _ => return None,
        }
    }
}

/// Creates `<dir>/<pid>[-n].vtr` exclusively and writes the header; resets the block state.
///
/// The directory is created 0700 (with any missing parents) and opened with `O_NOFOLLOW |
/// O_DIRECTORY`; the file is created 0600 inside it with `O_CREAT | O_EXCL | O_NOFOLLOW |
/// O_CLOEXEC`, so nothing existing is ever followed, opened or replaced. A name that is taken
/// by a regular file (a pid reused) moves on to the next name; one taken by a symbolic link is
/// refused and stops recording: someone planted it where our file goes.
fn open_trace() -> Result<c_int, String> {
    FORK.register();
    let dir = crate::config::dir().ok_or("no trace directory")?;
    let shown = || String::from_utf8_lossy(dir).into_owned();
    // Like `mkdir -p`, mode 0700. EEXIST (the usual case) and other errors are ignored here:
    // the open below reports what matters.
    let mut prefix = Vec::with_capacity(dir.len() + 1);
    for (i, &b) in dir.iter().enumerate() {
        if b == b'/' && i > 0 || i + 1 == dir.len() {
            prefix.clear();
            prefix.extend_from_slice(&dir[..if b == b'/' { i } else { i + 1 }]);
            prefix.push(0);
            // Safety: a valid C string.
            unsafe { libc::mkdir(prefix.as_ptr() as *const c_char, 0o700) };
        }
    }
    let mut dir_c = dir.to_vec();
    dir_c.push(0);
    // Safety: a valid C string, plain flags.
    let dir_fd = unsafe {
        libc::open(
            dir_c.as_ptr() as *const c_char,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if dir_fd < 0 {
        let e = std::io::Error::last_os_error();
        let mut target = [0u8; 1];
        // Safety: a valid C string and a buffer of the length given.
        let is_link = unsafe {
            libc::readlink(
                dir_c.as_ptr() as *const c_char,
                target.as_mut_ptr() as *mut c_char,
                target.len(),
            )
        } >= 0;
        return Err(match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR) if is_link => format!(
                "the trace directory {} is a symbolic link; refusing to follow it",
                shown()
            ),
            _ => format!("cannot create a trace file in {}: {e}", shown()),
        });
    }
    let result = create_in(dir_fd, &shown);
    // Safety: the descriptor opened above, not used after this.
    unsafe { libc::close(dir_fd) };
    let fd = result?;
    // Safety: no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let header = Header {
        version: vramtrace_format::VERSION,
        pid,
        // Safety: no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        start_unix_ns: crate::clock::clock_ns(libc::CLOCK_REALTIME),
        start_mono_ns: mono_ns(),
        hostname: hostname(),
        cmdline: cmdline(),
    };
    let mut bytes = Vec::with_capacity(4096);
    let data_offset = header.encode_blocks(BLOCK_SIZE as u32, &mut bytes);
    // The gap up to block 0 is written as zeros: no hole anywhere in the file.
    bytes.resize(data_offset as usize, 0);
    if !write_all(fd, &bytes) {
        return Err(format!(
            "cannot write the trace header: {}",
            std::io::Error::last_os_error()
        ));
    }
    DATA_OFFSET.store(data_offset, Ordering::Release);
    NEXT_BLOCK.store(0, Ordering::Release);
    NEXT_SEQ.store(0, Ordering::Release);
    let budget = crate::config::max_size();
    BUDGET_BLOCKS.store(
        if budget == 0 {
            0
        } else {
            // At least a few blocks: the ring needs room beside the driver's own blocks.
            (budget.saturating_sub(data_offset) / BLOCK_SIZE as u64).max(4)
        },
        Ordering::Relaxed,
    );
    RESERVED.store(0, Ordering::Release);
    Ok(fd)
}

/// Creates the first free `<pid>[-n].vtr` in the directory `dir_fd`, 0600, never following or
/// replacing anything.
fn create_in(dir_fd: c_int, shown: &dyn Fn() -> String) -> Result<c_int, String> {
    // Safety: no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    for attempt in 0..10_000 {
        let mut name = trace_file_name(pid, attempt).into_bytes();
        name.push(0);
        // Safety: a directory descriptor, a valid C string, plain flags.
        let fd = unsafe {
            libc::openat(
                dir_fd,
                name.as_ptr() as *const c_char,
                libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_RDWR | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd >= 0 {
            return Ok(fd);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(format!("cannot create a trace file in {}: {e}", shown()));
        }
        let mut target = [0u8; 1];
        // Safety: a directory descriptor, a valid C string and a buffer of the length given.
        let link = unsafe {
            libc::readlinkat(
                dir_fd,
                name.as_ptr() as *const c_char,
                target.as_mut_ptr() as *mut c_char,
                target.len(),
            )
        };
        if link >= 0 {
            name.pop();
            return Err(format!(
                "{}/{} is a symbolic link where the trace file goes; refusing to follow or replace it",
                shown(),
                String::from_utf8_lossy(&name)
            ));
        }
    }
    Err(format!(
        "cannot create a trace file in {}: every name for this process is taken",
        shown()
    ))
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // Safety: buffer and its length.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut c_char, buf.len()) } != 0 {
        return String::new();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn cmdline() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `bytes` completely (retrying on EINTR and short writes). False on error.
fn write_all(fd: c_int, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // Safety: valid buffer and length.
        let n = unsafe { libc::write(fd, bytes.as_ptr() as *const libc::c_void, bytes.len()) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// Stops recording for good in this process and says why on stderr, once.
///
/// The same line goes to the status pipe of `vramtrace run` when there is one
/// ([`crate::config::report_status`]), so that `run` can tell a recorder that could not record
/// from a program that never touched CUDA.
pub(crate) fn disable(why: &str) {
    STATE.store(FAILED, Ordering::Release);
    if !WARNED.swap(true, Ordering::AcqRel) {
        let msg = format!("vramtrace: recording stopped: {why}\n");
        // Safety: writing a valid buffer to stderr; the result is deliberately ignored.
        unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
        // Safety: no preconditions.
        let pid = unsafe { libc::getpid() };
        crate::config::report_status(format!("{pid} {why}\n").as_bytes());
    }
}

/// In the child after `fork`: forget the parent's file so the child writes its own, and the
/// parent's thread id. The parent's chunks are unmapped, so nothing in the child can store
/// into the parent's file.
extern "C" fn after_fork_child() {
    EPOCH.fetch_add(1, Ordering::AcqRel);
    let fd = FD.swap(-1, Ordering::AcqRel);
    let state = STATE.load(Ordering::Acquire);
    for chunk in &CHUNKS {
        let p = chunk.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // Safety: a chunk this module mapped, CHUNK_BYTES long; the child has one thread,
            // and its cursor is stale (EPOCH moved), so nothing uses the mapping any more.
            unsafe { libc::munmap(p as *mut libc::c_void, CHUNK_BYTES) };
        }
    }
    NEXT_BLOCK.store(0, Ordering::Release);
    RESERVED.store(0, Ordering::Release);
    GROW.store(false, Ordering::Release);
    STANDING_LOCK.store(false, Ordering::Release);
    RING_LOCK.store(false, Ordering::Release);
    // Safety: the child has one thread, and the lock is free.
    unsafe {
        (*RING.0.get()).len = 0;
        (*RING.0.get()).head = 0;
    }
    if state == RECORDING || state == OPENING {
        if fd >= 0 {
            // Safety: the child's copy of the parent's descriptor; the child is single-threaded
            // now, so nobody else is using it.
            unsafe { libc::close(fd) };
        }
        STATE.store(IDLE, Ordering::Release);
    }
    let _ = TID.try_with(|c| c.set(0));
    let _ = CURSOR.try_with(|c| c.set(NO_CURSOR));
    let _ = DCURSOR.try_with(|c| c.set(NO_CURSOR));
    let _ = DMETA.try_with(|m| m.set((0, 0)));
    let _ = SCURSOR.try_with(|c| c.set(NO_CURSOR));
    let _ = IN_GROW.try_with(|g| g.set(false));
}
