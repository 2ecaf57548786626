//! Replay: walks events in time order and keeps the live set of every process, device and kind
//! of memory, pairing each release with the allocation it releases.
//!
//! Pairing is by namespace: a `cuMemFree*` releases what a `cuMemAlloc*` returned, a
//! `cuMemRelease` a `cuMemCreate` handle, a `cuMemAddressFree` a reservation, a `cuMemFreeHost`
//! pinned host memory, a `cuArrayDestroy` an array, a `cuMemUnmap` a mapping (every mapping in
//! the range it unmaps: ggml maps its pool piece by piece and unmaps it whole). Pointers are only
//! meaningful inside their process, so every key includes the process.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::ControlFlow;
use std::sync::LazyLock;

use vramtrace_format::{API_NAMES, Annotation, Api, Event, EventKind, MemKind};

use crate::error::Error;
use crate::trace::{Item, Trace};

/// The accounting bucket of an allocation. Buckets are never summed together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    /// Physical device memory: `cuMemAlloc*`, async and pool allocations, `cuMemCreate`, arrays.
    Device,
    /// Unified memory (`cuMemAllocManaged`).
    Managed,
    /// Pinned host memory.
    Host,
    /// Reserved virtual address space (`cuMemAddressReserve`).
    Address,
    /// Physical memory mapped into reserved address space (`cuMemMap`); the same bytes are
    /// already counted under [`Pool::Device`] by their `cuMemCreate`.
    Mapped,
    /// Physical memory behind handles this process holds but did not allocate: imported from
    /// another process (`cuMemImportFromShareableHandle`, as NCCL does for its peers' buffers)
    /// or retained from an address whose `cuMemCreate` was not seen. Never this process's
    /// device bytes; sized by what the handle is first mapped as (the import does not say).
    Imported,
}

impl Pool {
    fn of(mem: MemKind) -> Pool {
        match mem {
            MemKind::Device | MemKind::Array => Pool::Device,
            MemKind::Managed => Pool::Managed,
            MemKind::Host => Pool::Host,
            MemKind::Address => Pool::Address,
            MemKind::Mapping => Pool::Mapped,
            MemKind::Imported => Pool::Imported,
        }
    }

    /// Lower-case name for output.
    pub fn name(self) -> &'static str {
        match self {
            Pool::Device => "device",
            Pool::Managed => "managed",
            Pool::Host => "host",
            Pool::Address => "address",
            Pool::Mapped => "mapped",
            Pool::Imported => "imported",
        }
    }
}

/// Which kind of identifier a driver call takes or returns; allocations and releases pair
/// within one namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Namespace {
    Pointer,
    Handle,
    AddressRange,
    HostPointer,
    Array,
    Mapping,
}

/// Whether a driver function obtains or releases, and in which namespace.
fn classify_name(name: &str) -> Option<(Namespace, bool)> {
    use Namespace::*;
    Some(match name {
        "cuMemAlloc_v2"
        | "cuMemAllocPitch_v2"
        | "cuMemAllocManaged"
        | "cuMemAllocAsync"
        | "cuMemAllocAsync_ptsz"
        | "cuMemAllocFromPoolAsync"
        | "cuMemAllocFromPoolAsync_ptsz" => (Pointer, true),
        "cuMemFree_v2" | "cuMemFreeAsync" | "cuMemFreeAsync_ptsz" => (Pointer, false),
        "cuMemCreate" | "cuMemImportFromShareableHandle" | "cuMemRetainAllocationHandle" => {
            (Handle, true)
        }
        "cuMemRelease" => (Handle, false),
        "cuMemAddressReserve" => (AddressRange, true),
        "cuMemAddressFree" => (AddressRange, false),
        "cuMemAllocHost_v2" | "cuMemHostAlloc" => (HostPointer, true),
        "cuMemFreeHost" => (HostPointer, false),
        "cuArrayCreate_v2" | "cuArray3DCreate_v2" => (Array, true),
        "cuArrayDestroy" => (Array, false),
        "cuMemMap" => (Mapping, true),
        "cuMemUnmap" => (Mapping, false),
        _ => return None,
    })
}

/// [`classify_name`] by api id, computed once: the replay asks for every event.
static CLASSES: LazyLock<Vec<Option<(Namespace, bool)>>> =
    LazyLock::new(|| API_NAMES.iter().map(|n| classify_name(n)).collect());

fn classify(api: Api) -> Option<(Namespace, bool)> {
    CLASSES.get(api.0 as usize).copied().flatten()
}

/// A multiply-and-rotate hasher for the replay's small integer keys: the default SipHash
/// costs more than the rest of an event's replay, and the keys come from the traced process,
/// not from an adversary.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(v.into());
    }

    fn write_i32(&mut self, v: i32) {
        self.write_u64(v as u32 as u64);
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(v.into());
    }

    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }

    fn write_isize(&mut self, v: isize) {
        self.write_u64(v as u64);
    }

    fn finish(&self) -> u64 {
        // Fold the high bits down: a product's low bits depend only on the inputs' low bits,
        // pointers' low bits are zero (aligned), and hashbrown takes its bucket from the low
        // bits.
        let h = (self.0 ^ (self.0 >> 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 29)
    }
}

/// A `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// An allocation that is live at some moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveAlloc {
    /// Index of the process in the [`crate::Trace`].
    pub process: usize,
    /// Index of the allocating event in the replayed order.
    pub seq: usize,
    /// The allocating event.
    pub event: Event,
    /// Its accounting bucket.
    pub pool: Pool,
    /// The name, dtype and shape given to it through the annotation ABI, if any.
    pub annotation: Option<Annotation>,
}

impl LiveAlloc {
    /// Bytes it holds.
    pub fn size(&self) -> u64 {
        self.event.size
    }
}

/// What one event did to the live set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Something was obtained; it is now live.
    Allocated {
        /// Its bucket.
        pool: Pool,
    },
    /// Something was released; carries the allocation it released (with its size), or `None`
    /// when no live allocation matched (released before recording began, or a bad pointer).
    Released {
        /// The released allocation.
        freed: Option<LiveAlloc>,
        /// Further mappings the same `cuMemUnmap` ended: it unmaps a range, which may hold
        /// several mappings made one by one (ggml's CUDA pool maps in pieces and unmaps the
        /// whole range at once). Empty for every other release.
        also: Vec<LiveAlloc>,
    },
    /// An allocation failed because the device was out of memory
    /// (`CUDA_ERROR_OUT_OF_MEMORY`); nothing changed.
    Failed,
    /// A call that changed nothing: a failed release, an unknown function, or an allocation
    /// refused for another reason than memory (`CUDA_ERROR_NOT_PERMITTED` from a `cuMemCreate`
    /// probe, an invalid value): such a refusal is a failed call, never an out-of-memory.
    Unchanged,
}

/// Live bytes of one process, device and bucket, with the running peak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Level {
    /// Bytes live now.
    pub live: u64,
    /// Highest `live` so far.
    pub peak: u64,
    /// Replay index of the event that set the peak.
    pub peak_seq: usize,
    /// Time of that event.
    pub peak_t_ns: u64,
    /// Allocations live now.
    pub count: usize,
}

/// Where an annotation landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Annotated {
    /// Bytes of the allocation named.
    pub size: u64,
    /// Its device.
    pub device: i32,
    /// Replay index of the allocating event.
    pub seq: usize,
}

/// The key of a live allocation: its pointer (or handle) within a process and namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LiveKey {
    ptr: u64,
    process: u32,
    ns: Namespace,
}

impl std::hash::Hash for LiveKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // One word: pointers differ in their middle bits, the process and namespace go above
        // any address a process hands out. Equal words of different keys only share a bucket.
        state.write_u64(self.ptr ^ (u64::from(self.process) << 52) ^ ((self.ns as u64) << 60));
    }
}

/// A live allocation as the replay holds it: what [`LiveAlloc`] reports, without the fields
/// a successful allocation never has (result, free and total bytes), and with its name boxed
/// (few allocations have one). 72 bytes against about 200 for a [`LiveAlloc`]: the live table
/// is the replay's working set, and every release is a lookup in it.
#[derive(Clone, Debug)]
struct Live {
    seq: usize,
    size: u64,
    t_ns: u64,
    stream: u64,
    aux: u64,
    annotation: Option<Box<Annotation>>,
    device: i32,
    tid: u32,
    stack: u32,
    label: u32,
    api: Api,
    kind: EventKind,
    mem: MemKind,
    pool: Pool,
    /// References to a handle beyond the first (`cuMemRetainAllocationHandle`): each needs its
    /// own `cuMemRelease` before the handle goes.
    retained: u32,
}

impl Live {
    fn new(seq: usize, e: &Event, pool: Pool) -> Live {
        Live {
            seq,
            size: e.size,
            t_ns: e.t_ns,
            stream: e.stream,
            aux: e.aux,
            annotation: None,
            device: e.device,
            tid: e.tid,
            stack: e.stack,
            label: e.label,
            api: e.api,
            kind: e.kind,
            mem: e.mem,
            pool,
            retained: 0,
        }
    }

    /// The allocation as reported; `annotation` is cloned only when `named`.
    fn to_alloc(&self, key: &LiveKey, named: bool) -> LiveAlloc {
        LiveAlloc {
            process: key.process as usize,
            seq: self.seq,
            event: self.event(key),
            pool: self.pool,
            annotation: if named {
                self.annotation.as_deref().cloned()
            } else {
                None
            },
        }
    }

    fn into_alloc(self, key: &LiveKey) -> LiveAlloc {
        LiveAlloc {
            process: key.process as usize,
            seq: self.seq,
            event: self.event(key),
            pool: self.pool,
            annotation: self.annotation.map(|a| *a),
        }
    }

    /// The allocating event (its result, free and total bytes were 0: it succeeded).
    fn event(&self, key: &LiveKey) -> Event {
        Event {
            t_ns: self.t_ns,
            tid: self.tid,
            device: self.device,
            kind: self.kind,
            mem: self.mem,
            api: self.api,
            result: 0,
            ptr: key.ptr,
            size: self.size,
            stream: self.stream,
            aux: self.aux,
            free_bytes: 0,
            total_bytes: 0,
            stack: self.stack,
            label: self.label,
        }
    }
}

/// The replay state machine. Feed it events in time order with [`Replayer::apply`].
///
/// It holds only what is live: an allocation is forgotten when it is released. To learn the
/// final name of an allocation captured at some moment, [`Replayer::follow`] it: the replay
/// then keeps the last annotation it is given while it lives.
#[derive(Debug, Default, Clone)]
pub struct Replayer {
    live: FastMap<LiveKey, Live>,
    levels: FastMap<(usize, i32, Pool), Level>,
    /// Followed allocations by replay index: their latest annotation and whether still live.
    followed: FastMap<usize, (Option<Annotation>, bool)>,
    followed_live: usize,
    /// The first total that went past 2^64 bytes, in words.
    overflow: Option<String>,
}

impl Replayer {
    /// An empty replay.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies the event at replay index `seq` of process `process`.
    pub fn apply(&mut self, process: usize, seq: usize, e: &Event) -> Step {
        let Some((ns, obtains)) = classify(e.api) else {
            return Step::Unchanged;
        };
        if e.kind == EventKind::AllocFailed {
            return if crate::cu_result::is_out_of_memory(e.result) {
                Step::Failed
            } else {
                Step::Unchanged
            };
        }
        if e.result != 0 {
            return Step::Unchanged;
        }
        if !obtains && e.ptr == 0 {
            // `cuMemFree(0)` and the like do nothing (the driver returns success): not a
            // release of anything (NCCL under torchrun makes one per rank).
            return Step::Unchanged;
        }
        let key = LiveKey {
            ptr: e.ptr,
            process: process as u32,
            ns,
        };
        if ns == Namespace::Handle {
            if obtains && e.api.name() == "cuMemRetainAllocationHandle" {
                // One more reference to a handle already live (its cuMemCreate or import was
                // seen): no new memory.
                if let Some(l) = self.live.get_mut(&key) {
                    l.retained = l.retained.saturating_add(1);
                    return Step::Unchanged;
                }
            } else if !obtains
                && let Some(l) = self.live.get_mut(&key)
                && l.retained > 0
            {
                // The release of a retained reference: the handle stays.
                l.retained -= 1;
                return Step::Unchanged;
            }
        }
        if ns == Namespace::Mapping && obtains {
            self.size_imported(process, seq, e);
        }
        if obtains {
            let pool = Pool::of(e.mem);
            // A pointer handed out again while we think it is live means a release we never
            // saw; the old one is gone.
            if let Some(old) = self.live.insert(key, Live::new(seq, e, pool)) {
                self.gone(process, &old);
            }
            let level = self.levels.entry((process, e.device, pool)).or_default();
            match level.live.checked_add(e.size) {
                Some(v) => level.live = v,
                None => {
                    // No device holds 2^64 bytes: the sizes are corrupt. Saturate rather than
                    // wrap, and say so once; readers of the replay turn it into an error.
                    level.live = u64::MAX;
                    self.overflow.get_or_insert_with(|| {
                        format!(
                            "the live {} bytes of process #{process} on device {} pass 2^64 at event {seq} ({} of {} bytes): the trace's sizes cannot be real",
                            pool.name(),
                            e.device,
                            e.api.name(),
                            e.size
                        )
                    });
                }
            }
            level.count += 1;
            if level.live > level.peak {
                level.peak = level.live;
                level.peak_seq = seq;
                level.peak_t_ns = e.t_ns;
            }
            Step::Allocated { pool }
        } else {
            let freed = self.live.remove(&key);
            let mut also = Vec::new();
            if let Some(f) = &freed {
                self.gone(process, f);
                if ns == Namespace::Mapping {
                    // The mappings after the first that the unmapped range covers, each
                    // starting where the one before it ends. The recorder writes the range's
                    // length in `aux` (a release's own size is 0, filled from the first
                    // mapping when read); a trace without it ends at the first mapping.
                    let range = if e.aux > 0 { e.aux } else { e.size };
                    let mut covered = f.size;
                    while covered > 0 && covered < range {
                        let next = LiveKey {
                            ptr: e.ptr.saturating_add(covered),
                            ..key
                        };
                        let Some(l) = self.live.remove(&next) else {
                            break;
                        };
                        self.gone(process, &l);
                        covered = covered.saturating_add(l.size);
                        also.push(l.into_alloc(&next));
                    }
                }
            }
            Step::Released {
                freed: freed.map(|f| f.into_alloc(&key)),
                also,
            }
        }
    }

    /// An imported handle's size is not known at the import: it is taken from the first
    /// `cuMemMap` of that handle (its physical handle is the map's `aux`).
    fn size_imported(&mut self, process: usize, seq: usize, e: &Event) {
        let key = LiveKey {
            ptr: e.aux,
            process: process as u32,
            ns: Namespace::Handle,
        };
        let Some(l) = self.live.get_mut(&key) else {
            return;
        };
        if l.pool != Pool::Imported || l.size != 0 {
            return;
        }
        l.size = e.size;
        let device = l.device;
        let level = self
            .levels
            .entry((process, device, Pool::Imported))
            .or_default();
        level.live = level.live.saturating_add(e.size);
        if level.live > level.peak {
            level.peak = level.live;
            level.peak_seq = seq;
            level.peak_t_ns = e.t_ns;
        }
    }

    /// The device and bucket of the live allocation that applying `e` would take out of the
    /// live set (a release, or a pointer handed out again), if any.
    pub fn would_remove(&self, process: usize, e: &Event) -> Option<(i32, Pool)> {
        let (ns, _) = classify(e.api)?;
        if e.kind == EventKind::AllocFailed || e.result != 0 {
            return None;
        }
        self.live
            .get(&LiveKey {
                ptr: e.ptr,
                process: process as u32,
                ns,
            })
            .map(|a| (a.device, a.pool))
    }

    /// Attaches a name to the live allocation at the annotation's pointer; `None` if nothing
    /// is live there.
    pub fn annotate(&mut self, process: usize, a: &Annotation) -> Option<Annotated> {
        let l = self.live.get_mut(&LiveKey {
            ptr: a.ptr,
            process: process as u32,
            ns: Namespace::Pointer,
        })?;
        match &mut l.annotation {
            Some(old) => (**old).clone_from(a),
            None => l.annotation = Some(Box::new(a.clone())),
        }
        let seq = l.seq;
        if let Some(f) = self.followed.get_mut(&seq) {
            f.0 = Some(a.clone());
        }
        Some(Annotated {
            size: l.size,
            device: l.device,
            seq,
        })
    }

    /// Keeps the final annotation of `a`, which must be live now: [`Replayer::annotation_of`]
    /// answers for it after it is released too.
    pub fn follow(&mut self, a: &LiveAlloc) {
        if let std::collections::hash_map::Entry::Vacant(v) = self.followed.entry(a.seq) {
            v.insert((a.annotation.clone(), true));
            self.followed_live += 1;
        }
    }

    /// Stops following `a` (a copy of a live set that a later one superseded): its annotation
    /// is forgotten, so following copy after copy holds only the copies kept.
    pub fn unfollow(&mut self, a: &LiveAlloc) {
        if let Some((_, true)) = self.followed.remove(&a.seq) {
            self.followed_live -= 1;
        }
    }

    /// Whether a followed allocation is still live (its annotation may still change).
    pub fn following_live(&self) -> bool {
        self.followed_live > 0
    }

    /// The latest annotation of a followed allocation, by the replay index that made it.
    pub fn annotation_of(&self, seq: usize) -> Option<&Annotation> {
        self.followed.get(&seq).and_then(|f| f.0.as_ref())
    }

    fn gone(&mut self, process: usize, a: &Live) {
        if let Some(l) = self.levels.get_mut(&(process, a.device, a.pool)) {
            l.live = l.live.saturating_sub(a.size);
            l.count = l.count.saturating_sub(1);
        }
        if self.followed_live > 0
            && let Some(f) = self.followed.get_mut(&a.seq)
            && f.1
        {
            f.1 = false;
            self.followed_live -= 1;
        }
    }

    /// Why a total of this replay is not exact: the first live total that passed 2^64 bytes
    /// (it was held at `u64::MAX` from then on). `None` for every real trace.
    pub fn overflow(&self) -> Option<&str> {
        self.overflow.as_deref()
    }

    /// [`Replayer::overflow`] as an error, for passes that report totals.
    pub fn check_overflow(&self) -> Result<(), Error> {
        match &self.overflow {
            Some(m) => Err(Error::Overflow(m.clone())),
            None => Ok(()),
        }
    }

    /// The level of one process, device and bucket.
    pub fn level(&self, process: usize, device: i32, pool: Pool) -> Level {
        self.levels
            .get(&(process, device, pool))
            .copied()
            .unwrap_or_default()
    }

    /// Every (process, device, bucket) seen so far with its level.
    pub fn levels(&self) -> impl Iterator<Item = ((usize, i32, Pool), Level)> + '_ {
        self.levels.iter().map(|(k, v)| (*k, *v))
    }

    /// How many allocations are live now, in every process and bucket (the cost of one
    /// [`Replayer::live_set`]).
    pub fn live_len(&self) -> usize {
        self.live.len()
    }

    /// The allocations live now in one process, device and bucket, largest first.
    pub fn live_set(&self, process: usize, device: i32, pool: Pool) -> Vec<LiveAlloc> {
        self.largest(process, device, pool, usize::MAX)
    }

    /// The `n` largest allocations live now in one process, device and bucket, largest first
    /// (ties: older first).
    pub fn largest(&self, process: usize, device: i32, pool: Pool, n: usize) -> Vec<LiveAlloc> {
        type Entry<'a> = (&'a LiveKey, &'a Live);
        let order = |a: &Entry, b: &Entry| b.1.size.cmp(&a.1.size).then(a.1.seq.cmp(&b.1.seq));
        let mut v: Vec<Entry> = self
            .live
            .iter()
            .filter(|(k, a)| k.process as usize == process && a.device == device && a.pool == pool)
            .collect();
        if n < v.len() {
            v.select_nth_unstable_by(n, order);
            v.truncate(n);
        }
        v.sort_by(order);
        v.into_iter().map(|(k, a)| a.to_alloc(k, true)).collect()
    }
}

/// A live set to take during a replay: the allocations of one process, device and bucket
/// right after the item at replay index `seq` is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capture {
    /// Replay index of the item after which to take it.
    pub seq: usize,
    /// Process index.
    pub process: usize,
    /// Device ordinal.
    pub device: i32,
    /// Bucket.
    pub pool: Pool,
    /// Keep only the largest this many.
    pub top: usize,
}

/// Replays `trace` from the start until every capture is taken and every captured
/// allocation's name is final (it is released, or the trace ends). Returns, per capture, its
/// allocations largest first, each carrying the last annotation it was given, and the
/// allocation count of the whole set.
pub fn capture(trace: &Trace, wants: &[Capture]) -> Result<Vec<(Vec<LiveAlloc>, usize)>, Error> {
    let mut out: Vec<(Vec<LiveAlloc>, usize)> = vec![(Vec::new(), 0); wants.len()];
    if wants.is_empty() {
        return Ok(out);
    }
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by_key(|&i| wants[i].seq);
    let mut next = 0;
    let mut r = Replayer::new();
    let mut seq = 0usize;
    trace.for_each_item(|pi, it| {
        match &it {
            Item::Event(e) => {
                r.apply(pi, seq, e);
            }
            Item::Annotate(a) => {
                r.annotate(pi, a);
            }
            _ => {}
        }
        while next < order.len() && wants[order[next]].seq == seq {
            let w = wants[order[next]];
            let all = r.level(w.process, w.device, w.pool).count;
            let set = r.largest(w.process, w.device, w.pool, w.top);
            for a in &set {
                r.follow(a);
            }
            out[order[next]] = (set, all);
            next += 1;
        }
        seq += 1;
        if next == order.len() && !r.following_live() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    for (set, _) in &mut out {
        for a in set {
            a.annotation = r.annotation_of(a.seq).cloned();
        }
    }
    Ok(out)
}
