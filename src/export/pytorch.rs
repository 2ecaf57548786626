//! A PyTorch memory snapshot: the pickled dict `torch.cuda.memory._snapshot()` returns, so
//! PyTorch's own viewers open a vramtrace trace: the memory_viz web page
//! (pytorch.org/memory_viz: drop the file on it), `python -m torch.cuda._memory_viz
//! trace_plot FILE -o out.html` (and `segment_plot`, `stats`, `trace`, `memory`, `segments`).
//!
//! PyTorch's snapshot describes its caching allocator: segments obtained from the driver,
//! split into blocks handed to tensors. vramtrace sees the driver, so [`export_pytorch`] maps
//! each driver allocation of device memory (`cuMemAlloc*`, stream-ordered and pool
//! allocations) to one segment holding one block of the same size, and each `cuMemMap` of
//! reserved address space to a mapped piece of an expandable segment with one block:
//!
//! - `device_traces[d]`: every such event of device `d`, in time order: `segment_alloc` then
//!   `alloc` for an allocation (`segment_map` then `alloc` for a mapping); `free_requested`,
//!   `free_completed` then `segment_free` (`segment_unmap`) for its release; `oom` for a failed
//!   allocation, with `device_free` the free memory the driver reported then. Each entry has
//!   `action`, `addr`, `size`, `stream`, `time_us` (wall clock, µs since the Unix epoch) and
//!   `frames`.
//! - `segments`: what is still allocated when the trace ends, each with `device`, `address`,
//!   `total_size`, `allocated_size`, `active_size`, `requested_size`, `stream`,
//!   `segment_type`, `segment_pool_id`, `is_expandable`, `frames` and its one block (`address`,
//!   `size`, `requested_size`, `state: active_allocated`, `frames`). The viewers replay
//!   `device_traces` backwards from this state, so the two agree.
//! - `frames` (innermost first, as PyTorch records them): the native stack, symbolised where
//!   the module file here is the one the process loaded (`name` the function, `filename` the
//!   source file or the module, `line` or 0), then a frame naming the tensor (on releases and
//!   `segments`, once a name was given) and the label active at the allocation
//!   (`filename: "vramtrace"`).
//!
//! A snapshot is one process's (a device pointer means something only in its process): the
//! one asked for, else the one with the highest device peak.
//!
//! Like PyTorch's own history (`_record_memory_history(max_entries=...)`), each device trace
//! keeps only its newest [`SnapshotOptions::max_entries`] entries: the viewers replay
//! backwards from `segments`, so a trace cut at its old end still agrees with them, and an
//! allocation whose `alloc` was cut shows as allocated before the history began. Frames are
//! repeated on each entry (pickle has no sharing here), so the cap is also what bounds the
//! file: `free_requested` entries carry no frames, the entry after them repeats them.
//!
//! The dict is written as it is built (the pickle encoder emits each list item as it comes):
//! one pass over the trace finds the final state, then one pass over the chosen process per
//! device writes its trace; memory follows the live set and the stack table.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::Write;

use serde::ser::{Error as _, SerializeSeq};
use serde::{Serialize, Serializer};
use vramtrace_format::{Event, EventKind, MemKind};

use super::{ExportError, Progress};
use crate::replay::{LiveAlloc, Pool, Replayer, Step};
use crate::symbolize::StackSymbolizer;
use crate::trace::{Item, Process, Trace};

/// What [`export_pytorch`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// The process the snapshot is of.
    pub pid: u32,
    /// Other processes that allocated device memory (each can be exported on its own).
    pub others: Vec<u32>,
    /// Segments live at the end.
    pub segments: u64,
    /// Trace entries, all devices.
    pub entries: u64,
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
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            pid: None,
            max_entries: Some(DEFAULT_MAX_ENTRIES),
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
    // Pass 1: every process's device peak, and the state at the end.
    let mut replay = Replayer::new();
    let mut max_device = -1;
    let mut failed: HashMap<usize, u64> = HashMap::new();
    // Entries each process and device will have, to know how many old ones to leave out.
    let mut entries: HashMap<(usize, i32), u64> = HashMap::new();
    for (seq, (pi, item)) in trace.items()?.enumerate() {
        if seq % 4096 == 0 {
            progress.inc(4096);
        }
        if let Item::Event(e) = item {
            if e.kind == EventKind::AllocFailed && e.mem == MemKind::Device {
                *failed.entry(pi).or_default() += 1;
            }
            if role(&e).is_some() || e.kind == EventKind::AllocFailed {
                max_device = max_device.max(e.device);
            }
            let n = match replay.apply(pi, seq, &e) {
                Step::Allocated { .. } if role(&e).is_some() => Some((e.device, 2)),
                Step::Released { freed: Some(a) } if role(&a.event).is_some() => {
                    Some((a.event.device, 3))
                }
                Step::Failed if e.kind == EventKind::AllocFailed && e.mem == MemKind::Device => {
                    Some((e.device, 1))
                }
                _ => None,
            };
            if let Some((d, n)) = n {
                *entries.entry((pi, d)).or_default() += n;
            }
        } else if let Item::Annotate(a) = item {
            replay.annotate(pi, &a);
        }
    }
    let mut peaks: HashMap<usize, u64> = HashMap::new();
    for ((pi, _, pool), l) in replay.levels() {
        if matches!(pool, Pool::Device | Pool::Mapped) {
            let p = peaks.entry(pi).or_default();
            *p = (*p).max(l.peak);
        }
    }
    for pi in failed.keys() {
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
    let mut counts = SnapshotCounts {
        pid: trace.processes[pi].pid(),
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
        cache: RefCell::new(HashMap::new()),
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
    let segments: Vec<Segment> = finals.iter().map(|a| segment(a, &frames)).collect();
    counts.segments = segments.len() as u64;
    progress.pass("pytorch: device traces");
    let skip: Vec<u64> = (0..=max_device)
        .map(|d| {
            let n = entries.get(&(pi, d)).copied().unwrap_or(0);
            opts.max_entries.map_or(0, |m| n.saturating_sub(m))
        })
        .collect();
    let traces = DeviceTraces {
        process: p,
        devices: max_device + 1,
        skip,
        frames: &frames,
        progress,
        entries: Cell::new(0),
        ooms: Cell::new(0),
    };
    let snapshot = Snapshot {
        segments,
        device_traces: &traces,
    };
    serde_pickle::to_writer(&mut &mut *out, &snapshot, serde_pickle::SerOptions::new())?;
    out.flush()?;
    counts.entries = traces.entries.get();
    counts.ooms = traces.ooms.get();
    Ok(counts)
}

/// How an event shows in the snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A driver allocation (or its release): a segment with one block.
    Segment,
    /// A mapping into reserved address space: a piece of an expandable segment.
    Mapped,
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

fn segment(a: &LiveAlloc, frames: &Frames) -> Segment {
    let e = &a.event;
    let f = frames.of(e, a.annotation.as_ref());
    Segment {
        device: e.device,
        address: e.ptr,
        total_size: e.size,
        allocated_size: e.size,
        active_size: e.size,
        requested_size: e.size,
        stream: e.stream,
        segment_type: if e.size <= SMALL_SEGMENT {
            "small"
        } else {
            "large"
        },
        segment_pool_id: (0, 0),
        is_expandable: role(e) == Some(Role::Mapped),
        frames: f.clone(),
        blocks: vec![Block {
            address: e.ptr,
            size: e.size,
            requested_size: e.size,
            state: "active_allocated",
            frames: f,
        }],
    }
}

/// Symbolised frames of one process, by stack id.
struct Frames<'p> {
    process: &'p Process,
    sym: RefCell<StackSymbolizer<'p>>,
    cache: RefCell<HashMap<u32, Vec<PyFrame>>>,
}

impl Frames<'_> {
    /// The frames of an allocating event, innermost first, then the tensor name and label.
    fn of(&self, e: &Event, tensor: Option<&vramtrace_format::Annotation>) -> Vec<PyFrame> {
        let mut v = self
            .cache
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
            v.push(PyFrame {
                filename: "vramtrace".into(),
                line: 0,
                name: format!("tensor {}", self.process.tensor_name(t)),
            });
        }
        if let Some(l) = self.process.string(e.label) {
            v.push(PyFrame {
                filename: "vramtrace".into(),
                line: 0,
                name: format!("label {l}"),
            });
        }
        v
    }
}

/// `device_traces`: a list with one list per device ordinal, each written by its own pass.
struct DeviceTraces<'a> {
    process: &'a Process,
    devices: i32,
    /// Per device: how many of its oldest entries to leave out.
    skip: Vec<u64>,
    frames: &'a Frames<'a>,
    progress: &'a Progress,
    entries: Cell<u64>,
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

impl Serialize for DeviceTrace<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let of = self.of;
        let p = of.process;
        let h = &p.header;
        let wall_us = |t_ns: u64| {
            (h.start_unix_ns as i128 + t_ns as i128 - h.start_mono_ns as i128).max(0) as u64 / 1000
        };
        let mut seq = s.serialize_seq(None)?;
        let mut skip = of.skip.get(self.device as usize).copied().unwrap_or(0);
        let mut emit = |seq: &mut S::SerializeSeq, e: Entry| {
            if skip > 0 {
                skip -= 1;
                return Ok(());
            }
            of.entries.set(of.entries.get() + 1);
            seq.serialize_element(&e)
        };
        let mut replay = Replayer::new();
        let items = p.items().map_err(S::Error::custom)?;
        for (i, item) in items.enumerate() {
            if i % 4096 == 0 {
                of.progress.inc(4096);
            }
            let e = match item {
                Item::Event(e) => e,
                Item::Annotate(a) => {
                    replay.annotate(0, &a);
                    continue;
                }
                _ => continue,
            };
            let step = replay.apply(0, i, &e);
            let time_us = wall_us(e.t_ns);
            match step {
                Step::Allocated { .. } if e.device == self.device => {
                    let Some(r) = role(&e) else { continue };
                    let frames = of.frames.of(&e, None);
                    let seg = if r == Role::Mapped {
                        "segment_map"
                    } else {
                        "segment_alloc"
                    };
                    for action in [seg, "alloc"] {
                        let entry = Entry {
                            action,
                            addr: e.ptr,
                            size: e.size,
                            stream: e.stream,
                            time_us,
                            frames: &frames,
                            device_free: None,
                        };
                        emit(&mut seq, entry)?;
                    }
                }
                Step::Released { freed: Some(a) } if a.event.device == self.device => {
                    let Some(r) = role(&a.event) else { continue };
                    let frames = of.frames.of(&a.event, a.annotation.as_ref());
                    let seg = if r == Role::Mapped {
                        "segment_unmap"
                    } else {
                        "segment_free"
                    };
                    for action in ["free_requested", "free_completed", seg] {
                        let entry = Entry {
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
                        };
                        emit(&mut seq, entry)?;
                    }
                }
                Step::Failed
                    if e.device == self.device
                        && e.kind == EventKind::AllocFailed
                        && e.mem == MemKind::Device =>
                {
                    of.ooms.set(of.ooms.get() + 1);
                    let frames = of.frames.of(&e, None);
                    let entry = Entry {
                        action: "oom",
                        addr: 0,
                        size: e.size,
                        stream: e.stream,
                        time_us,
                        frames: &frames,
                        device_free: Some(e.free_bytes),
                    };
                    emit(&mut seq, entry)?;
                }
                _ => {}
            }
        }
        seq.end()
    }
}
