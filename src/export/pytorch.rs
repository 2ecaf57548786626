//! A PyTorch memory snapshot: the pickled dict `torch.cuda.memory._snapshot()` returns, so
//! PyTorch's own viewers open a vramtrace trace: the memory_viz web page
//! (pytorch.org/memory_viz: drop the file on it), `python -m torch.cuda._memory_viz
//! trace_plot FILE -o out.html` (and `segment_plot`, `stats`, `trace`, `memory`, `segments`).
//!
//! PyTorch's snapshot describes its caching allocator: segments obtained from the driver,
//! split into blocks handed to tensors. [`export_pytorch`] writes one of two pictures, chosen
//! per process:
//!
//! **The tensor level**, when the process has tensor records (the PyTorch probe's, or an
//! imported snapshot's; see [`crate::torch_replay`]): the allocator's own picture, as PyTorch's
//! `_snapshot()` of the same run shows it.
//!
//! - `segments`: the driver's segments live at the moment of the snapshot (each device
//!   allocation one segment; `cuMemMap` chunks of reserved address space that touch one
//!   expandable segment), each split into its blocks by address: the live tensors
//!   (`state: active_allocated`, `size` the block, `requested_size` the bytes asked for,
//!   `frames` the tensor's Python frames) and the gaps between them (`state: inactive`, one
//!   free block per gap: the allocator merges free neighbours; `requested_size` 0, where
//!   PyTorch keeps the request of a block that was there before). The segment's
//!   `allocated_size`, `active_size` and `requested_size` are its live blocks' sums. A live
//!   tensor in no live segment (allocated before the driver was recorded) is a segment of its
//!   own.
//! - `device_traces[d]`: in time order, `segment_alloc` (`segment_map`) for a driver
//!   allocation (mapping) with the frames of the request that needed it, `alloc` for a tensor
//!   (`size` the requested bytes, as PyTorch writes it), `free_requested` then
//!   `free_completed` for its free (the allocator's callback fires once the block is reusable,
//!   so the two are one moment here), `segment_free` (`segment_unmap`) for a release to the
//!   driver (`empty_cache`, or a retry after a failed `cudaMalloc`), and `oom` for a request
//!   the allocator refused, with `device_free`. A free whose tensor was allocated before the
//!   recording began is left out (its size is unknown), and so are failed driver calls: the
//!   allocator frees its cache and retries those; what it finally refuses is the `oom`.
//! - `frames` (innermost first, PyTorch's Python frames: `filename`, `line`, `name`): the
//!   Python frames recorded with the tensor, the probe's own callbacks left out. A tensor's
//!   free is recorded without a stack: `free_requested` has no frames, `free_completed`
//!   repeats the allocation's (so the viewers name what was freed).
//!
//! **The driver level** otherwise (no caching allocator seen, or PyTorch's caching off): each
//! driver allocation of device memory (`cuMemAlloc*`, stream-ordered and pool allocations) is
//! one segment holding one block of the same size, and each `cuMemMap` of reserved address
//! space a mapped piece of an expandable segment with one block; `segment_alloc` then `alloc`
//! for an allocation, `free_requested`, `free_completed` then `segment_free` for its release,
//! `oom` for a failed allocation; frames are the native stack, symbolised where the module
//! file here is the one the process loaded (`name` the function, `filename` the source file or
//! the module, `line` or 0).
//!
//! Both levels add frames of their own at the outer end (`filename: "vramtrace"`): `tensor
//! NAME` once a name was given (on releases and `segments`) and `label L`, the range active
//! at the allocation. [`crate::import`] reads them back, so `export` then `import` keeps the
//! names.
//!
//! Every entry has `action`, `addr`, `size`, `stream`, `time_us` (wall clock, µs since the
//! Unix epoch) and `frames`. A snapshot is one process's (a device pointer means something only
//! in its process): the one asked for, else the one with the highest device peak. With
//! [`SnapshotOptions::until_ns`] it is the state at that moment, as a `_snapshot()` taken then
//! would be, and the trace ends there.
//!
//! Like PyTorch's own history (`_record_memory_history(max_entries=...)`), each device trace
//! keeps only its newest [`SnapshotOptions::max_entries`] entries: the viewers replay
//! backwards from `segments`, so a trace cut at its old end still agrees with them, and an
//! allocation whose `alloc` was cut shows as allocated before the history began. Frames are
//! repeated on each entry (pickle has no sharing here), so the cap is also what bounds the
//! file.
//!
//! The dict is written as it is built (the pickle encoder emits each list item as it comes):
//! one pass over the trace finds the final state, then one pass over the chosen process per
//! device writes its trace; memory follows the live set and the stack table.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;

use serde::ser::{Error as _, SerializeSeq};
use serde::{Serialize, Serializer};
use vramtrace_format::{Event, EventKind, MemKind, TensorAction, TensorEvent};

use super::{ExportError, Progress};
use crate::replay::{LiveAlloc, Pool, Replayer, Step};
use crate::symbolize::StackSymbolizer;
use crate::torch_replay::{LiveTensor, TensorReplay, TensorStep, is_probe_frame};
use crate::trace::{Item, Process, Trace};

/// What [`export_pytorch`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// The process the snapshot is of.
    pub pid: u32,
    /// Other processes that allocated device memory (each can be exported on its own).
    pub others: Vec<u32>,
    /// Whether the snapshot is at the tensor level (blocks are PyTorch's tensors) rather than
    /// the driver level (one block per driver allocation).
    pub tensor_level: bool,
    /// Segments live at the end.
    pub segments: u64,
    /// Blocks handed out (`active_allocated`) at the end, every segment together.
    pub blocks: u64,
    /// Trace entries, all devices.
    pub entries: u64,
    /// `alloc` entries, all devices.
    pub allocs: u64,
    /// `oom` entries.
    pub ooms: u64,
}

/// Options of [`export_pytorch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// The process to snapshot; `None`: the one with the highest device peak.
    pub pid: Option<u32>,
    /// Keep only the newest this many entries of each device trace; `None`: all.
    pub max_entries: Option<u64>,
    /// The moment of the snapshot (`CLOCK_MONOTONIC` ns, the trace's clock): nothing after it
    /// is read; `None`: the end of the trace.
    pub until_ns: Option<u64>,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            pid: None,
            max_entries: Some(DEFAULT_MAX_ENTRIES),
            until_ns: None,
        }
    }
}

/// Entries kept per device by default: the memory_viz page stays responsive, and a deep-stack
/// trace stays a file of tens of megabytes rather than gigabytes.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;

/// Writes the snapshot pickle of one process to `out`.
pub fn export_pytorch(
    trace: &Trace,
    opts: &SnapshotOptions,
    out: &mut dyn Write,
    progress: &Progress,
) -> Result<SnapshotCounts, ExportError> {
    let pid = opts.pid;
    let until = opts.until_ns.unwrap_or(u64::MAX);
    // Pass 1: every process's device peak, and the state at the end.
    let mut replay = Replayer::new();
    let mut tensors = TensorReplay::new();
    let mut names = TensorNames::default();
    let mut max_device = -1;
    let mut failed: HashMap<usize, u64> = HashMap::new();
    let mut with_tensors: HashSet<usize> = HashSet::new();
    // Entries each process and device will have at each level, to know how many old ones to
    // leave out.
    let mut driver_entries: HashMap<(usize, i32), u64> = HashMap::new();
    let mut tensor_entries: HashMap<(usize, i32), u64> = HashMap::new();
    // Driver allocations that are not the caching allocator's (cuBLAS's or Triton's own
    // cudaMalloc, NCCL's buffers) are not in PyTorch's snapshot, so not in ours: those made
    // once the process was recording tensors and out of which no tensor was ever handed (the
    // allocator asks the driver for a segment for a request, so its segments hold a tensor at
    // once). Earlier ones stay: they may be segments emptied before the recording (an
    // imported snapshot's, an attach's). Live segments by (process, device, base): (size,
    // when).
    let mut live_segments: BTreeMap<(usize, i32, u64), (u64, u64)> = BTreeMap::new();
    let mut torch_segments: HashSet<SegmentId> = HashSet::new();
    let mut unproven: HashSet<SegmentId> = HashSet::new();
    // The tensor-level entries each segment gives (its segment_alloc, its segment_free).
    let mut segment_entries: HashMap<SegmentId, u64> = HashMap::new();
    for (seq, (pi, item)) in trace.items()?.enumerate() {
        if seq % 4096 == 0 {
            progress.inc(4096);
        }
        if item.t_ns() > until {
            break;
        }
        match item {
            Item::Event(e) => {
                if e.kind == EventKind::AllocFailed && e.mem == MemKind::Device {
                    *failed.entry(pi).or_default() += 1;
                }
                if role(&e).is_some() || e.kind == EventKind::AllocFailed {
                    max_device = max_device.max(e.device);
                }
                let step = replay.apply(pi, seq, &e);
                match &step {
                    Step::Allocated { .. } if role(&e) == Some(Role::Segment) => {
                        live_segments.insert((pi, e.device, e.ptr), (e.size, e.t_ns));
                        if with_tensors.contains(&pi) {
                            unproven.insert((pi, e.device, e.ptr, e.t_ns));
                        }
                        *segment_entries
                            .entry((pi, e.device, e.ptr, e.t_ns))
                            .or_default() += 1;
                    }
                    Step::Released { freed: Some(a), .. }
                        if role(&a.event) == Some(Role::Segment) =>
                    {
                        let a = &a.event;
                        live_segments.remove(&(pi, a.device, a.ptr));
                        *segment_entries
                            .entry((pi, a.device, a.ptr, a.t_ns))
                            .or_default() += 1;
                    }
                    _ => {}
                }
                let n = match step {
                    Step::Allocated { .. } if role(&e).is_some() => Some((e.device, 2, 1)),
                    Step::Released { freed: Some(a), .. } if role(&a.event).is_some() => {
                        Some((a.event.device, 3, 1))
                    }
                    Step::Failed
                        if e.kind == EventKind::AllocFailed && e.mem == MemKind::Device =>
                    {
                        Some((e.device, 1, 0))
                    }
                    _ => None,
                };
                if let Some((d, driver, tensor)) = n {
                    *driver_entries.entry((pi, d)).or_default() += driver;
                    *tensor_entries.entry((pi, d)).or_default() += tensor;
                }
            }
            Item::Annotate(a) => {
                replay.annotate(pi, &a);
                names.note(&trace.processes[pi], &tensors, pi, &a);
            }
            Item::Tensor(t) => {
                with_tensors.insert(pi);
                max_device = max_device.max(t.device);
                let n = match tensors.apply(pi, seq, &t) {
                    TensorStep::Allocated | TensorStep::Restated(true) => {
                        let holder = live_segments
                            .range(..=(pi, t.device, t.ptr))
                            .next_back()
                            .filter(|((p, d, base), (size, _))| {
                                *p == pi && *d == t.device && t.ptr < base + size
                            })
                            .map(|(&(_, d, base), &(_, t_ns))| (pi, d, base, t_ns));
                        torch_segments.extend(holder);
                        names.forget(pi, t.ptr);
                        Some((t.device, 1))
                    }
                    TensorStep::Restated(false) => None,
                    TensorStep::Released(Some(f)) => Some((f.event.device, 2)),
                    TensorStep::Refused => Some((t.device, 1)),
                    TensorStep::Released(None) => None,
                };
                if let Some((d, n)) = n {
                    *tensor_entries.entry((pi, d)).or_default() += n;
                }
            }
            _ => {}
        }
    }
    let foreign: HashSet<SegmentId> = unproven.difference(&torch_segments).copied().collect();
    // A driver allocation that is not the allocator's gives no tensor-level entry.
    for (id, n) in &segment_entries {
        if foreign.contains(id)
            && let Some(c) = tensor_entries.get_mut(&(id.0, id.1))
        {
            *c = c.saturating_sub(*n);
        }
    }
    let mut peaks: HashMap<usize, u64> = HashMap::new();
    for ((pi, _, pool), l) in replay.levels() {
        if matches!(pool, Pool::Device | Pool::Mapped) {
            let p = peaks.entry(pi).or_default();
            *p = (*p).max(l.peak);
        }
    }
    for pi in failed.keys().chain(with_tensors.iter()) {
        peaks.entry(*pi).or_default();
    }
    let pi = match pid {
        Some(pid) => trace
            .processes
            .iter()
            .position(|p| p.pid() == pid)
            .ok_or_else(|| {
                let pids: Vec<String> = trace
                    .processes
                    .iter()
                    .map(|p| p.pid().to_string())
                    .collect();
                ExportError::Nothing(format!(
                    "no process {pid} in the trace (it holds {})",
                    pids.join(", ")
                ))
            })?,
        None => {
            let best = peaks
                .iter()
                .max_by_key(|(pi, peak)| (**peak, std::cmp::Reverse(**pi)))
                .map(|(pi, _)| *pi);
            best.ok_or_else(|| {
                ExportError::Nothing(
                    "the trace has no device allocation: a PyTorch snapshot would be empty".into(),
                )
            })?
        }
    };
    let tensor_level = with_tensors.contains(&pi);
    let mut counts = SnapshotCounts {
        pid: trace.processes[pi].pid(),
        tensor_level,
        ..SnapshotCounts::default()
    };
    counts.others = peaks
        .keys()
        .filter(|&&o| o != pi)
        .map(|&o| trace.processes[o].pid())
        .collect();
    counts.others.sort_unstable();

    let p = &trace.processes[pi];
    let frames = Frames {
        process: p,
        sym: RefCell::new(StackSymbolizer::new(p)),
        native: RefCell::new(HashMap::new()),
        python: RefCell::new(HashMap::new()),
    };
    let mut finals: Vec<LiveAlloc> = Vec::new();
    for d in 0..=max_device {
        for pool in [Pool::Device, Pool::Mapped] {
            finals.extend(
                replay
                    .live_set(pi, d, pool)
                    .into_iter()
                    .filter(|a| role(&a.event).is_some()),
            );
        }
    }
    finals.sort_by_key(|a| (a.event.device, a.event.ptr));
    // This process's driver allocations that are not the allocator's: (device, base, when).
    let foreign: HashSet<(i32, u64, u64)> = foreign
        .into_iter()
        .filter(|id| id.0 == pi)
        .map(|(_, d, base, t_ns)| (d, base, t_ns))
        .collect();
    let segments: Vec<Segment> = if tensor_level {
        let live: Vec<LiveTensor> = (0..=max_device)
            .flat_map(|d| tensors.live_set(pi, d))
            .collect();
        finals.retain(|a| is_torch_segment(&foreign, &a.event));
        tensor_segments(&finals, &live, &names, &frames)
    } else {
        finals.iter().map(|a| segment(a, &frames)).collect()
    };
    counts.segments = segments.len() as u64;
    counts.blocks = segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == ACTIVE)
        .count() as u64;
    progress.pass("pytorch: device traces");
    let entries = if tensor_level {
        &tensor_entries
    } else {
        &driver_entries
    };
    let skip: Vec<u64> = (0..=max_device)
        .map(|d| {
            let n = entries.get(&(pi, d)).copied().unwrap_or(0);
            opts.max_entries.map_or(0, |m| n.saturating_sub(m))
        })
        .collect();
    let traces = DeviceTraces {
        process: p,
        devices: max_device + 1,
        tensor_level,
        foreign,
        until,
        skip,
        frames: &frames,
        progress,
        entries: Cell::new(0),
        allocs: Cell::new(0),
        ooms: Cell::new(0),
    };
    let snapshot = Snapshot {
        segments,
        device_traces: &traces,
    };
    serde_pickle::to_writer(&mut &mut *out, &snapshot, serde_pickle::SerOptions::new())?;
    out.flush()?;
    counts.entries = traces.entries.get();
    counts.allocs = traces.allocs.get();
    counts.ooms = traces.ooms.get();
    Ok(counts)
}

/// How an event shows in the snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A driver allocation (or its release): a segment.
    Segment,
    /// A mapping into reserved address space: a piece of an expandable segment.
    Mapped,
}

/// (process index, device, base, when allocated): one driver allocation.
type SegmentId = (usize, i32, u64, u64);

/// Whether a driver allocation belongs in the tensor-level snapshot: a mapped piece of an
/// expandable segment always does (a tensor may start in an earlier piece); a plain allocation
/// unless it is one of the `foreign` ones.
fn is_torch_segment(foreign: &HashSet<(i32, u64, u64)>, e: &Event) -> bool {
    role(e) == Some(Role::Mapped) || !foreign.contains(&(e.device, e.ptr, e.t_ns))
}

fn role(e: &Event) -> Option<Role> {
    match e.mem {
        // cuMemCreate and its cuMemRelease carry a handle, not an address: the address is
        // where it is mapped.
        MemKind::Device if !matches!(e.api.name(), "cuMemCreate" | "cuMemRelease") => {
            Some(Role::Segment)
        }
        MemKind::Mapping => Some(Role::Mapped),
        _ => None,
    }
}

#[derive(Serialize)]
struct Snapshot<'a> {
    segments: Vec<Segment>,
    device_traces: &'a DeviceTraces<'a>,
}

#[derive(Serialize, Clone, Debug)]
struct PyFrame {
    filename: String,
    line: u32,
    name: String,
}

const ACTIVE: &str = "active_allocated";
const INACTIVE: &str = "inactive";

#[derive(Serialize)]
struct Block {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Vec<PyFrame>,
}

#[derive(Serialize)]
struct Segment {
    device: i32,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: u64,
    segment_type: &'static str,
    segment_pool_id: (u64, u64),
    is_expandable: bool,
    frames: Vec<PyFrame>,
    blocks: Vec<Block>,
}

#[derive(Serialize)]
struct Entry<'f> {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: u64,
    frames: &'f [PyFrame],
    #[serde(skip_serializing_if = "Option::is_none")]
    device_free: Option<u64>,
}

/// PyTorch's small pool serves requests up to 1 MiB from 2 MiB segments.
const SMALL_SEGMENT: u64 = 2 << 20;

fn segment_type(size: u64) -> &'static str {
    if size <= SMALL_SEGMENT {
        "small"
    } else {
        "large"
    }
}

/// A driver-level segment: one driver allocation, one block.
fn segment(a: &LiveAlloc, frames: &Frames) -> Segment {
    let e = &a.event;
    let f = frames.native(e, a.annotation.as_ref());
    Segment {
        device: e.device,
        address: e.ptr,
        total_size: e.size,
        allocated_size: e.size,
        active_size: e.size,
        requested_size: e.size,
        stream: e.stream,
        segment_type: segment_type(e.size),
        segment_pool_id: (0, 0),
        is_expandable: role(e) == Some(Role::Mapped),
        frames: f.clone(),
        blocks: vec![Block {
            address: e.ptr,
            size: e.size,
            requested_size: e.size,
            state: ACTIVE,
            frames: f,
        }],
    }
}

/// One segment's range before it is split into blocks.
struct Range {
    device: i32,
    base: u64,
    size: u64,
    stream: u64,
    expandable: bool,
}

/// The tensor-level segments: the driver's live segments (touching mapped chunks joined) split
/// into the live tensors and the gaps between them.
fn tensor_segments(
    finals: &[LiveAlloc],
    live: &[LiveTensor],
    names: &TensorNames,
    frames: &Frames,
) -> Vec<Segment> {
    let mut ranges: Vec<Range> = Vec::new();
    for a in finals {
        let e = &a.event;
        let expandable = role(e) == Some(Role::Mapped);
        match ranges.last_mut() {
            Some(r)
                if expandable
                    && r.expandable
                    && r.device == e.device
                    && r.base + r.size == e.ptr =>
            {
                r.size += e.size;
            }
            _ => ranges.push(Range {
                device: e.device,
                base: e.ptr,
                size: e.size,
                stream: e.stream,
                expandable,
            }),
        }
    }
    let mut inside: Vec<Vec<&LiveTensor>> = (0..ranges.len()).map(|_| Vec::new()).collect();
    for t in live {
        let e = &t.event;
        let at = ranges.partition_point(|r| (r.device, r.base) <= (e.device, e.ptr));
        match at.checked_sub(1).map(|i| (i, &ranges[i])) {
            Some((i, r)) if r.device == e.device && e.ptr < r.base + r.size => inside[i].push(t),
            _ => {
                // Allocated inside a segment the driver gave before recording began.
                ranges.push(Range {
                    device: e.device,
                    base: e.ptr,
                    size: e.size,
                    stream: 0,
                    expandable: false,
                });
                inside.push(vec![t]);
            }
        }
    }
    let mut out: Vec<Segment> = ranges
        .iter()
        .zip(inside)
        .map(|(r, mut ts)| {
            ts.sort_by_key(|t| t.event.ptr);
            let end = r.base + r.size;
            let mut blocks = Vec::with_capacity(2 * ts.len() + 1);
            let mut cursor = r.base;
            for t in ts {
                let e = &t.event;
                if e.ptr > cursor {
                    blocks.push(free_block(cursor, e.ptr - cursor));
                }
                let size = e.size.min(end.saturating_sub(e.ptr));
                blocks.push(Block {
                    address: e.ptr,
                    size,
                    requested_size: requested(e),
                    state: ACTIVE,
                    frames: frames.python(e.stack, names.get(t.process, e.ptr)),
                });
                cursor = cursor.max(e.ptr + size);
            }
            if end > cursor {
                blocks.push(free_block(cursor, end - cursor));
            }
            let active = blocks.iter().filter(|b| b.state == ACTIVE);
            let allocated: u64 = active.clone().map(|b| b.size).sum();
            Segment {
                device: r.device,
                address: r.base,
                total_size: r.size,
                allocated_size: allocated,
                active_size: allocated,
                requested_size: active.map(|b| b.requested_size).sum(),
                stream: r.stream,
                segment_type: segment_type(r.size),
                segment_pool_id: (0, 0),
                is_expandable: r.expandable,
                frames: Vec::new(),
                blocks,
            }
        })
        .collect();
    out.sort_by_key(|s| (s.device, s.address));
    out
}

fn free_block(address: u64, size: u64) -> Block {
    Block {
        address,
        size,
        requested_size: 0,
        state: INACTIVE,
        frames: Vec::new(),
    }
}

/// The bytes a tensor asked for: the record's request, else its block (older traces).
fn requested(t: &TensorEvent) -> u64 {
    if t.requested != 0 {
        t.requested
    } else {
        t.size
    }
}

/// The name given to each live tensor (an annotation at its pointer after its allocation).
#[derive(Default)]
struct TensorNames(HashMap<(usize, u64), String>);

impl TensorNames {
    fn note(
        &mut self,
        p: &Process,
        tensors: &TensorReplay,
        pi: usize,
        a: &vramtrace_format::Annotation,
    ) {
        let probe = TensorEvent {
            action: TensorAction::Free,
            ptr: a.ptr,
            ..TensorEvent::default()
        };
        if tensors.would_remove(pi, &probe).is_some() {
            self.0.insert((pi, a.ptr), p.tensor_name(a));
        }
    }

    fn forget(&mut self, pi: usize, ptr: u64) {
        self.0.remove(&(pi, ptr));
    }

    fn get(&self, pi: usize, ptr: u64) -> Option<&str> {
        self.0.get(&(pi, ptr)).map(String::as_str)
    }
}

/// Frames of one process, by stack id: native (symbolised) and Python.
struct Frames<'p> {
    process: &'p Process,
    sym: RefCell<StackSymbolizer<'p>>,
    native: RefCell<HashMap<u32, Vec<PyFrame>>>,
    python: RefCell<HashMap<u32, Vec<PyFrame>>>,
}

impl Frames<'_> {
    /// The driver level's frames of an allocating event, innermost first, then the tensor name
    /// and label.
    fn native(&self, e: &Event, tensor: Option<&vramtrace_format::Annotation>) -> Vec<PyFrame> {
        let mut v = self
            .native
            .borrow_mut()
            .entry(e.stack)
            .or_insert_with(|| {
                self.sym
                    .borrow_mut()
                    .stack(e.stack)
                    .into_iter()
                    .map(|f| PyFrame {
                        filename: f.file.unwrap_or(f.module.clone()),
                        line: f.line.unwrap_or(0),
                        name: f
                            .function
                            .unwrap_or_else(|| format!("{} {}", f.module, f.addr)),
                    })
                    .collect()
            })
            .clone();
        if let Some(t) = tensor {
            v.push(own_frame(format!("tensor {}", self.process.tensor_name(t))));
        }
        if let Some(l) = self.process.string(e.label) {
            v.push(own_frame(format!("label {l}")));
        }
        v
    }

    /// The tensor level's frames of a stack: its Python frames, innermost first, the probe's
    /// own left out (PyTorch records Python frames only), then the tensor's name.
    fn python(&self, stack: u32, name: Option<&str>) -> Vec<PyFrame> {
        let p = self.process;
        let mut v = self
            .python
            .borrow_mut()
            .entry(stack)
            .or_insert_with(|| {
                p.py_stacks
                    .get(&stack)
                    .map(|fs| {
                        fs.iter()
                            .map(|f| PyFrame {
                                filename: p.string(f.file).unwrap_or("?").to_string(),
                                line: f.line,
                                name: p.string(f.function).unwrap_or("?").to_string(),
                            })
                            .filter(|f| !is_probe_frame(&f.filename, &f.name))
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .clone();
        if let Some(n) = name {
            v.push(own_frame(format!("tensor {n}")));
        }
        v
    }
}

fn own_frame(name: String) -> PyFrame {
    PyFrame {
        filename: "vramtrace".into(),
        line: 0,
        name,
    }
}

/// `device_traces`: a list with one list per device ordinal, each written by its own pass.
struct DeviceTraces<'a> {
    process: &'a Process,
    devices: i32,
    tensor_level: bool,
    /// At the tensor level, the driver allocations that are not the caching allocator's
    /// (device, base, when allocated).
    foreign: HashSet<(i32, u64, u64)>,
    until: u64,
    /// Per device: how many of its oldest entries to leave out.
    skip: Vec<u64>,
    frames: &'a Frames<'a>,
    progress: &'a Progress,
    entries: Cell<u64>,
    allocs: Cell<u64>,
    ooms: Cell<u64>,
}

struct DeviceTrace<'s, 'a> {
    of: &'s DeviceTraces<'a>,
    device: i32,
}

impl Serialize for DeviceTraces<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.devices.max(0) as usize))?;
        for device in 0..self.devices {
            seq.serialize_element(&DeviceTrace { of: self, device })?;
        }
        seq.end()
    }
}

/// Writes the entries of one device, leaving out the oldest `skip`.
struct Emitter<'s, 'a, S: SerializeSeq> {
    seq: S,
    skip: u64,
    of: &'s DeviceTraces<'a>,
}

impl<S: SerializeSeq> Emitter<'_, '_, S> {
    fn emit(&mut self, e: Entry) -> Result<(), S::Error> {
        if self.skip > 0 {
            self.skip -= 1;
            return Ok(());
        }
        let of = self.of;
        of.entries.set(of.entries.get() + 1);
        match e.action {
            "alloc" => of.allocs.set(of.allocs.get() + 1),
            "oom" => of.ooms.set(of.ooms.get() + 1),
            _ => {}
        }
        self.seq.serialize_element(&e)
    }
}

impl Serialize for DeviceTrace<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let of = self.of;
        let p = of.process;
        let h = &p.header;
        let wall_us = |t_ns: u64| {
            (h.start_unix_ns as i128 + t_ns as i128 - h.start_mono_ns as i128).max(0) as u64 / 1000
        };
        let mut out = Emitter {
            seq: s.serialize_seq(None)?,
            skip: of.skip.get(self.device as usize).copied().unwrap_or(0),
            of,
        };
        let mut replay = Replayer::new();
        let mut tensors = TensorReplay::new();
        let mut names = TensorNames::default();
        let items = p.items().map_err(S::Error::custom)?;
        for (i, item) in items.enumerate() {
            if i % 4096 == 0 {
                of.progress.inc(4096);
            }
            if item.t_ns() > of.until {
                break;
            }
            let time_us = wall_us(item.t_ns());
            match item {
                Item::Event(e) => {
                    let step = replay.apply(0, i, &e);
                    if of.tensor_level {
                        self.segment_entry(&mut out, step, &e, time_us)?;
                    } else {
                        self.driver_entry(&mut out, step, &e, time_us)?;
                    }
                }
                Item::Annotate(a) => {
                    replay.annotate(0, &a);
                    names.note(p, &tensors, 0, &a);
                }
                Item::Tensor(t) if of.tensor_level => {
                    let step = tensors.apply(0, i, &t);
                    if step == TensorStep::Allocated {
                        names.forget(0, t.ptr);
                    }
                    self.tensor_entry(&mut out, step, &t, &names, time_us)?;
                }
                _ => {}
            }
        }
        out.seq.end()
    }
}

impl DeviceTrace<'_, '_> {
    /// The driver level: an allocation is a segment and its one block.
    fn driver_entry<S: SerializeSeq>(
        &self,
        out: &mut Emitter<S>,
        step: Step,
        e: &Event,
        time_us: u64,
    ) -> Result<(), S::Error> {
        let frames = self.of.frames;
        match step {
            Step::Allocated { .. } if e.device == self.device => {
                let Some(r) = role(e) else { return Ok(()) };
                let frames = frames.native(e, None);
                let seg = if r == Role::Mapped {
                    "segment_map"
                } else {
                    "segment_alloc"
                };
                for action in [seg, "alloc"] {
                    out.emit(Entry {
                        action,
                        addr: e.ptr,
                        size: e.size,
                        stream: e.stream,
                        time_us,
                        frames: &frames,
                        device_free: None,
                    })?;
                }
            }
            Step::Released { freed: Some(a), .. } if a.event.device == self.device => {
                let Some(r) = role(&a.event) else {
                    return Ok(());
                };
                let frames = frames.native(&a.event, a.annotation.as_ref());
                let seg = if r == Role::Mapped {
                    "segment_unmap"
                } else {
                    "segment_free"
                };
                for action in ["free_requested", "free_completed", seg] {
                    out.emit(Entry {
                        action,
                        addr: a.event.ptr,
                        size: a.event.size,
                        stream: a.event.stream,
                        time_us,
                        frames: if action == "free_requested" {
                            &[]
                        } else {
                            &frames
                        },
                        device_free: None,
                    })?;
                }
            }
            Step::Failed
                if e.device == self.device
                    && e.kind == EventKind::AllocFailed
                    && e.mem == MemKind::Device =>
            {
                let frames = frames.native(e, None);
                out.emit(Entry {
                    action: "oom",
                    addr: 0,
                    size: e.size,
                    stream: e.stream,
                    time_us,
                    frames: &frames,
                    device_free: Some(e.free_bytes),
                })?;
            }
            _ => {}
        }
        Ok(())
    }

    /// The tensor level's driver events: segments obtained and given back.
    fn segment_entry<S: SerializeSeq>(
        &self,
        out: &mut Emitter<S>,
        step: Step,
        e: &Event,
        time_us: u64,
    ) -> Result<(), S::Error> {
        let (action, a) = match step {
            Step::Allocated { .. } if !is_torch_segment(&self.of.foreign, e) => {
                return Ok(());
            }
            Step::Released {
                freed: Some(ref a), ..
            } if !is_torch_segment(&self.of.foreign, &a.event) => {
                return Ok(());
            }
            Step::Allocated { .. } if e.device == self.device => match role(e) {
                Some(Role::Segment) => ("segment_alloc", e),
                Some(Role::Mapped) => ("segment_map", e),
                None => return Ok(()),
            },
            Step::Released {
                freed: Some(ref a), ..
            } if a.event.device == self.device => match role(&a.event) {
                Some(Role::Segment) => ("segment_free", &a.event),
                Some(Role::Mapped) => ("segment_unmap", &a.event),
                None => return Ok(()),
            },
            _ => return Ok(()),
        };
        // PyTorch gives a new segment the frames of the request that needed it; a release has
        // the frames of what released it (empty_cache), which no record holds.
        let frames = if action.ends_with("free") || action.ends_with("unmap") {
            Vec::new()
        } else {
            self.of.frames.python(a.stack, None)
        };
        out.emit(Entry {
            action,
            addr: a.ptr,
            size: a.size,
            stream: a.stream,
            time_us,
            frames: &frames,
            device_free: None,
        })
    }

    /// The tensor level: PyTorch's blocks handed out, given back and refused.
    fn tensor_entry<S: SerializeSeq>(
        &self,
        out: &mut Emitter<S>,
        step: TensorStep,
        t: &TensorEvent,
        names: &TensorNames,
        time_us: u64,
    ) -> Result<(), S::Error> {
        let frames = self.of.frames;
        match step {
            TensorStep::Allocated if t.device == self.device => {
                let frames = frames.python(t.stack, None);
                out.emit(Entry {
                    action: "alloc",
                    addr: t.ptr,
                    size: requested(t),
                    stream: 0,
                    time_us,
                    frames: &frames,
                    device_free: None,
                })?;
            }
            TensorStep::Released(Some(f)) if f.event.device == self.device => {
                let e = &f.event;
                let frames = frames.python(e.stack, names.get(0, e.ptr));
                for action in ["free_requested", "free_completed"] {
                    out.emit(Entry {
                        action,
                        addr: e.ptr,
                        size: requested(e),
                        stream: 0,
                        time_us,
                        frames: if action == "free_requested" {
                            &[]
                        } else {
                            &frames
                        },
                        device_free: None,
                    })?;
                }
            }
            TensorStep::Refused if t.device == self.device => {
                let frames = frames.python(t.stack, None);
                out.emit(Entry {
                    action: "oom",
                    addr: 0,
                    size: t.size,
                    stream: 0,
                    time_us,
                    frames: &frames,
                    device_free: Some(t.free),
                })?;
            }
            _ => {}
        }
        Ok(())
    }
}
