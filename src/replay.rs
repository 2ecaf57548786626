//! Replay: walks events in time order and keeps the live set of every process, device and kind
//! of memory, pairing each release with the allocation it releases.
//!
//! Pairing is by namespace: a `cuMemFree*` releases what a `cuMemAlloc*` returned, a
//! `cuMemRelease` a `cuMemCreate` handle, a `cuMemAddressFree` a reservation, a `cuMemFreeHost`
//! pinned host memory, a `cuArrayDestroy` an array, a `cuMemUnmap` a mapping. Pointers are only
//! meaningful inside their process, so every key includes the process.

use std::collections::HashMap;

use vramtrace_format::{Annotation, Api, Event, EventKind, MemKind};

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
}

impl Pool {
    fn of(mem: MemKind) -> Pool {
        match mem {
            MemKind::Device | MemKind::Array => Pool::Device,
            MemKind::Managed => Pool::Managed,
            MemKind::Host => Pool::Host,
            MemKind::Address => Pool::Address,
            MemKind::Mapping => Pool::Mapped,
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
fn classify(api: Api) -> Option<(Namespace, bool)> {
    use Namespace::*;
    Some(match api.name() {
        "cuMemAlloc_v2"
        | "cuMemAllocPitch_v2"
        | "cuMemAllocManaged"
        | "cuMemAllocAsync"
        | "cuMemAllocAsync_ptsz"
        | "cuMemAllocFromPoolAsync"
        | "cuMemAllocFromPoolAsync_ptsz" => (Pointer, true),
        "cuMemFree_v2" | "cuMemFreeAsync" | "cuMemFreeAsync_ptsz" => (Pointer, false),
        "cuMemCreate" => (Handle, true),
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
    },
    /// An allocation failed; nothing changed.
    Failed,
    /// A call that changed nothing (a failed release, an unknown function).
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
}

/// The replay state machine. Feed it events in time order with [`Replayer::apply`].
#[derive(Debug, Default, Clone)]
pub struct Replayer {
    live: HashMap<(usize, Namespace, u64), LiveAlloc>,
    levels: HashMap<(usize, i32, Pool), Level>,
    names: HashMap<usize, Annotation>,
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
            return Step::Failed;
        }
        if e.result != 0 {
            return Step::Unchanged;
        }
        if obtains {
            let pool = Pool::of(e.mem);
            let alloc = LiveAlloc {
                process,
                seq,
                event: *e,
                pool,
                annotation: None,
            };
            // A pointer handed out again while we think it is live means a release we never
            // saw; the old one is gone.
            if let Some(old) = self.live.insert((process, ns, e.ptr), alloc) {
                self.sub(&old);
            }
            let level = self.levels.entry((process, e.device, pool)).or_default();
            level.live += e.size;
            if level.live > level.peak {
                level.peak = level.live;
                level.peak_seq = seq;
                level.peak_t_ns = e.t_ns;
            }
            Step::Allocated { pool }
        } else {
            let freed = self.live.remove(&(process, ns, e.ptr));
            if let Some(f) = &freed {
                self.sub(f);
            }
            Step::Released { freed }
        }
    }

    /// Attaches a name to the live allocation at the annotation's pointer; returns its size and
    /// device, or `None` if nothing is live there.
    pub fn annotate(&mut self, process: usize, a: &Annotation) -> Option<(u64, i32)> {
        let l = self.live.get_mut(&(process, Namespace::Pointer, a.ptr))?;
        l.annotation = Some(a.clone());
        self.names.insert(l.seq, a.clone());
        Some((l.event.size, l.event.device))
    }

    /// The annotation given at any time so far to the allocation made at replay index `seq`
    /// (also after the moment a live set was captured, or after it was freed).
    pub fn annotation_of(&self, seq: usize) -> Option<&Annotation> {
        self.names.get(&seq)
    }

    fn sub(&mut self, a: &LiveAlloc) {
        if let Some(l) = self.levels.get_mut(&(a.process, a.event.device, a.pool)) {
            l.live = l.live.saturating_sub(a.event.size);
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

    /// The allocations live now in one process, device and bucket, largest first.
    pub fn live_set(&self, process: usize, device: i32, pool: Pool) -> Vec<LiveAlloc> {
        let mut v: Vec<LiveAlloc> = self
            .live
            .values()
            .filter(|a| a.process == process && a.event.device == device && a.pool == pool)
            .cloned()
            .collect();
        v.sort_by(|a, b| b.size().cmp(&a.size()).then(a.seq.cmp(&b.seq)));
        v
    }
}
