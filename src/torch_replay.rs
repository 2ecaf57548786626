//! Tensors inside segments: the tensor-level live set that TENSOR records give (PyTorch's
//! caching allocator, reported by `probes/python/vramtrace_torch.py` or imported from a memory
//! snapshot), beside the driver-level live set of [`crate::replay`].
//!
//! With the caching allocator on, the driver sees segments (`cuMemAlloc` of 2 MiB, 20 MiB or a
//! rounded large request; `cuMemMap` chunks with expandable segments) and the allocator hands
//! out blocks inside them. A tensor's segment is the live driver allocation whose address range
//! holds the tensor's pointer (mapped chunks that touch count as one segment: expandable
//! segments grow by mapping the next chunk at the end). A tensor in no known segment (one
//! allocated before recording began, or a trace with no driver events) is counted apart.
//!
//! What is free inside a segment is computed from what is recorded, nothing else: the segment's
//! bytes minus the bytes of the live tensors inside it are "reserved but unallocated"; the
//! largest free block of a segment is its largest gap between live tensors (from the segment's
//! start, between consecutive tensors by address, and up to its end). PyTorch splits a segment
//! into adjacent blocks and merges free neighbours, and a recorded tensor's size is its block's
//! size (the allocator's `allocated_bytes` growth, already rounded to 512 bytes), so a gap is one
//! free block. A request fits the cache without a new segment only if some segment's largest
//! free block holds it (the allocator's pools by size and its rounding aside).
//!
//! Tensor bytes are inside segment bytes: no total ever adds the two.

use std::collections::BTreeMap;

use serde::Serialize;
use vramtrace_format::{TensorAction, TensorEvent};

use crate::replay::{FastMap, LiveAlloc, Pool, Replayer};
use crate::trace::{Item, Process, Trace};

/// The Python file of the probe's own callbacks: its frames are never the allocating line.
pub const PROBE_FILE: &str = "vramtrace_torch.py";

/// True for a Python frame of the probe itself (its allocation, free and OOM callbacks), or of
/// PyTorch's dispatch of those callbacks (`fire_callbacks` in `torch/_utils.py`, seen on the
/// H200 as the innermost frame of every tensor): never the allocating line.
pub fn is_probe_frame(file: &str, function: &str) -> bool {
    file.rsplit('/').next() == Some(PROBE_FILE)
        || (function == "fire_callbacks" && file.ends_with("torch/_utils.py"))
}

/// PyTorch's own machinery, as the categoriser defines it (a file of an installation's `torch`
/// package outside `torch/nn`): operator calls and dispatch modes run through such frames
/// (`torch/_ops.py` `__call__`, `torch/_compile.py` `inner` on the H200); they never say where
/// the program allocated.
pub use crate::categoriser::is_torch_machinery;

/// The Python frames of a stack id, innermost first, as `file.py:LINE function` (base name),
/// the probe's own frames skipped; at most `n`.
pub fn python_frames(p: &Process, stack: u32, n: usize) -> Vec<String> {
    python_locations(p, stack)
        .into_iter()
        .take(n)
        .map(|l| l.to_string())
        .collect()
}

/// One Python frame, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PyLocation {
    /// `co_filename` as recorded (a path).
    pub file: String,
    /// The function.
    pub function: String,
    /// The line (0: unknown).
    pub line: u32,
}

impl PyLocation {
    /// The file's base name.
    pub fn base(&self) -> &str {
        self.file.rsplit('/').next().unwrap_or(&self.file)
    }
}

impl std::fmt::Display for PyLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} {}", self.base(), self.line, self.function)
    }
}

/// The Python frames of a stack id, innermost first, the probe's own skipped, and PyTorch's
/// machinery ([`is_torch_machinery`]) skipped where the program's own frames follow it.
pub fn python_locations(p: &Process, stack: u32) -> Vec<PyLocation> {
    if stack == 0 {
        return Vec::new();
    }
    let Some(frames) = p.py_stacks.get(&stack) else {
        return Vec::new();
    };
    let mut all = frames
        .iter()
        .map(|f| PyLocation {
            file: p.string(f.file).unwrap_or("?").to_string(),
            function: p.string(f.function).unwrap_or("?").to_string(),
            line: f.line,
        })
        .filter(|l| !is_probe_frame(&l.file, &l.function))
        .collect::<Vec<_>>();
    // PyTorch's machinery innermost is dropped when the program's own frames follow it.
    let own = all
        .iter()
        .position(|l| !is_torch_machinery(&l.file))
        .unwrap_or(0);
    all.split_off(own)
}

/// A tensor live at some moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveTensor {
    /// Index of the process in the trace.
    pub process: usize,
    /// Replay index of the allocating item.
    pub seq: usize,
    /// The allocating record (its `size` the block's bytes).
    pub event: TensorEvent,
    /// Known only from a restatement: a size budget dropped its allocation record, and
    /// `event.t_ns` is when the ring restated it (or a flight record stated it), not when it was
    /// allocated.
    pub restated: bool,
}

/// Live tensor bytes of one process and device, with the running peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TensorLevel {
    /// Bytes in live tensors now.
    pub live: u64,
    /// Highest `live` so far.
    pub peak: u64,
    /// Replay index of the item that set the peak.
    pub peak_seq: usize,
    /// Its time.
    pub peak_t_ns: u64,
    /// Live tensors now.
    pub count: usize,
    /// Allocations seen.
    pub allocations: u64,
    /// Frees paired with an allocation.
    pub frees: u64,
    /// Requests the allocator refused.
    pub refused: u64,
}

/// What one tensor record did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorStep {
    /// A block handed out.
    Allocated,
    /// A block taken back: what it was (with its size), `None` when nothing live matched.
    Released(Option<LiveTensor>),
    /// The allocator refused a request (an allocator-raised out-of-memory).
    Refused,
    /// A block stated live (a restatement after the ring dropped its allocation, or a flight
    /// record): `true` when it was not live here yet and now is.
    Restated(bool),
}

/// The tensor-level live set of every process and device.
#[derive(Debug, Clone, Default)]
pub struct TensorReplay {
    live: FastMap<(usize, u64), LiveTensor>,
    levels: FastMap<(usize, i32), TensorLevel>,
}

impl TensorReplay {
    /// Empty.
    pub fn new() -> TensorReplay {
        TensorReplay::default()
    }

    /// Applies the tensor record at replay index `seq` of process `process`.
    pub fn apply(&mut self, process: usize, seq: usize, t: &TensorEvent) -> TensorStep {
        match t.action {
            TensorAction::Alloc => {
                let now = LiveTensor {
                    process,
                    seq,
                    event: t.clone(),
                    restated: false,
                };
                if let Some(old) = self.live.insert((process, t.ptr), now) {
                    // Handed out again: a free we never saw.
                    self.gone(process, &old.event);
                }
                let l = self.levels.entry((process, t.device)).or_default();
                l.live = l.live.saturating_add(t.size);
                l.count += 1;
                l.allocations += 1;
                if l.live > l.peak {
                    l.peak = l.live;
                    l.peak_seq = seq;
                    l.peak_t_ns = t.t_ns;
                }
                TensorStep::Allocated
            }
            TensorAction::Free => {
                let freed = self.live.remove(&(process, t.ptr));
                if let Some(old) = &freed {
                    self.gone(process, &old.event);
                    if let Some(l) = self.levels.get_mut(&(process, old.event.device)) {
                        l.frees += 1;
                    }
                }
                TensorStep::Released(freed)
            }
            TensorAction::AllocFailed => {
                self.levels.entry((process, t.device)).or_default().refused += 1;
                TensorStep::Refused
            }
            TensorAction::Live => {
                if self.live.contains_key(&(process, t.ptr)) {
                    return TensorStep::Restated(false);
                }
                // Its allocation was dropped: live from here on, as allocated (not counted
                // among the allocations, which the reader never saw).
                let mut alloc = t.clone();
                alloc.action = TensorAction::Alloc;
                let now = LiveTensor {
                    process,
                    seq,
                    event: alloc,
                    restated: true,
                };
                self.live.insert((process, t.ptr), now);
                let l = self.levels.entry((process, t.device)).or_default();
                l.live = l.live.saturating_add(t.size);
                l.count += 1;
                if l.live > l.peak {
                    l.peak = l.live;
                    l.peak_seq = seq;
                    l.peak_t_ns = t.t_ns;
                }
                TensorStep::Restated(true)
            }
        }
    }

    fn gone(&mut self, process: usize, t: &TensorEvent) {
        if let Some(l) = self.levels.get_mut(&(process, t.device)) {
            l.live = l.live.saturating_sub(t.size);
            l.count = l.count.saturating_sub(1);
        }
    }

    /// Whether a free of `t` would take a live tensor of this process out (its device).
    pub fn would_remove(&self, process: usize, t: &TensorEvent) -> Option<i32> {
        if t.action != TensorAction::Free {
            return None;
        }
        self.live.get(&(process, t.ptr)).map(|l| l.event.device)
    }

    /// The level of one process and device.
    pub fn level(&self, process: usize, device: i32) -> TensorLevel {
        self.levels
            .get(&(process, device))
            .copied()
            .unwrap_or_default()
    }

    /// The level of one process and device, `None` if it has no tensor record.
    pub fn level_if_any(&self, process: usize, device: i32) -> Option<TensorLevel> {
        self.levels.get(&(process, device)).copied()
    }

    /// Every (process, device) with tensor records, and its level.
    pub fn levels(&self) -> impl Iterator<Item = ((usize, i32), TensorLevel)> + '_ {
        self.levels.iter().map(|(k, v)| (*k, *v))
    }

    /// True once any tensor record was applied.
    pub fn any(&self) -> bool {
        !self.levels.is_empty()
    }

    /// How many tensors are live now, every process and device together.
    pub fn live_len(&self) -> usize {
        self.live.len()
    }

    /// The tensors live now in one process and device, by address.
    pub fn live_set(&self, process: usize, device: i32) -> Vec<LiveTensor> {
        let mut v: Vec<LiveTensor> = self
            .live
            .iter()
            .filter(|((p, _), l)| *p == process && l.event.device == device)
            .map(|(_, l)| l.clone())
            .collect();
        v.sort_by_key(|t| (t.event.ptr, t.seq));
        v
    }
}

/// A segment: a range of device memory the allocator holds from the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First byte.
    pub base: u64,
    /// Bytes.
    pub size: u64,
}

/// The segments of one process and device from the driver's live set: device allocations
/// (`cuMemAlloc*`) and mapped chunks (`cuMemMap`), touching chunks joined into one.
pub fn segments_of(replay: &Replayer, process: usize, device: i32) -> Vec<Segment> {
    let mut v: Vec<Segment> = replay
        .live_set(process, device, Pool::Device)
        .iter()
        .filter(|a| a.event.mem != vramtrace_format::MemKind::Array && a.event.ptr != 0)
        .filter(|a| !is_handle(a))
        .map(|a| Segment {
            base: a.event.ptr,
            size: a.event.size,
        })
        .collect();
    let mut mapped: Vec<Segment> = replay
        .live_set(process, device, Pool::Mapped)
        .iter()
        .map(|a| Segment {
            base: a.event.ptr,
            size: a.event.size,
        })
        .collect();
    mapped.sort_by_key(|s| s.base);
    let mut joined: Vec<Segment> = Vec::new();
    for m in mapped {
        match joined.last_mut() {
            Some(last) if last.base + last.size == m.base => last.size += m.size,
            _ => joined.push(m),
        }
    }
    v.extend(joined);
    v.sort_by_key(|s| s.base);
    v
}

/// A `cuMemCreate` handle is not an address: its bytes are mapped elsewhere.
fn is_handle(a: &LiveAlloc) -> bool {
    a.event.api.name() == "cuMemCreate"
}

/// One segment with the tensors inside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentUse {
    /// Base address, hex.
    pub base: String,
    /// Segment bytes.
    pub size: u64,
    /// Live tensors inside it.
    pub tensors: usize,
    /// Their bytes.
    pub tensor_bytes: u64,
    /// Reserved but unallocated: `size - tensor_bytes`.
    pub unallocated_bytes: u64,
    /// The largest gap between live tensors (see the module's documentation).
    pub largest_free_block: u64,
}

/// One live tensor as shown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorItem {
    /// Data pointer, hex.
    pub ptr: String,
    /// Block bytes.
    pub size: u64,
    /// Seconds since the trace began.
    pub t_s: f64,
    /// Known only from a restatement (a size budget dropped its allocation): `t_s` is when it
    /// was restated, and it was allocated before.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub restated: bool,
    /// The segment holding it, hex; `None` if no live driver allocation holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
    /// The operator that produced it, dtype and shape (`empty_like [1, 4128] bf16`), from the
    /// record or a `--torch-shapes` annotation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor: Option<String>,
    /// Its Python line: the innermost frame that is not the probe's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<String>,
    /// Python frames, innermost first (the probe's skipped), up to the summary's `--frames`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
}

/// The tensors live at one moment, placed in the segments live then.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorMoment {
    /// Live tensors.
    pub tensor_count: usize,
    /// Their bytes ("allocated by PyTorch").
    pub tensor_bytes: u64,
    /// Bytes of the live segments (the driver's live device bytes that are segments).
    pub segment_bytes: u64,
    /// Segment bytes holding no live tensor ("reserved but unallocated").
    pub unallocated_bytes: u64,
    /// The largest free block of any segment.
    pub largest_free_block: u64,
    /// Bytes of live tensors in no known segment (not in `unallocated_bytes`' arithmetic).
    pub outside_segments_bytes: u64,
    /// The largest tensors, largest first.
    pub tensors: Vec<TensorItem>,
    /// The segments, most unallocated bytes first (at most as many as `tensors`).
    pub segments: Vec<SegmentUse>,
}

/// Places `tensors` (one process and device) in `segments` and describes the moment, listing
/// the `top` largest tensors with `frames` Python frames each.
pub fn moment(
    trace: &Trace,
    tensors: &[LiveTensor],
    segments: &[Segment],
    top: usize,
    frames: usize,
    names: &FastMap<(usize, u64), String>,
) -> TensorMoment {
    let t0 = trace.start_ns();
    let by_base: BTreeMap<u64, usize> = segments
        .iter()
        .enumerate()
        .map(|(i, s)| (s.base, i))
        .collect();
    let seg_of = |ptr: u64| -> Option<usize> {
        let (_, &i) = by_base.range(..=ptr).next_back()?;
        let s = segments[i];
        (ptr < s.base + s.size).then_some(i)
    };
    let mut inside: Vec<Vec<&LiveTensor>> = vec![Vec::new(); segments.len()];
    let mut outside = 0u64;
    for t in tensors {
        match seg_of(t.event.ptr) {
            Some(i) => inside[i].push(t),
            None => outside += t.event.size,
        }
    }
    let mut uses: Vec<SegmentUse> = segments
        .iter()
        .zip(&mut inside)
        .map(|(s, ts)| {
            ts.sort_by_key(|t| t.event.ptr);
            let tensor_bytes: u64 = ts.iter().map(|t| t.event.size).sum();
            let end = s.base + s.size;
            let mut cursor = s.base;
            let mut largest = 0u64;
            for t in ts.iter() {
                largest = largest.max(t.event.ptr.saturating_sub(cursor));
                cursor = cursor.max(t.event.ptr.saturating_add(t.event.size).min(end));
            }
            largest = largest.max(end.saturating_sub(cursor));
            SegmentUse {
                base: format!("{:#x}", s.base),
                size: s.size,
                tensors: ts.len(),
                tensor_bytes,
                unallocated_bytes: s.size.saturating_sub(tensor_bytes),
                largest_free_block: largest,
            }
        })
        .collect();
    let segment_bytes: u64 = segments.iter().map(|s| s.size).sum();
    let in_segments: u64 = uses.iter().map(|u| u.tensor_bytes).sum();
    let largest_free_block = uses.iter().map(|u| u.largest_free_block).max().unwrap_or(0);
    uses.sort_by(|a, b| {
        b.unallocated_bytes
            .cmp(&a.unallocated_bytes)
            .then(b.size.cmp(&a.size))
    });
    uses.truncate(top);
    let mut largest: Vec<&LiveTensor> = tensors.iter().collect();
    largest.sort_by(|a, b| b.event.size.cmp(&a.event.size).then(a.seq.cmp(&b.seq)));
    largest.truncate(top);
    let items = largest
        .into_iter()
        .map(|t| {
            let p = &trace.processes[t.process];
            let locs = python_locations(p, t.event.stack);
            TensorItem {
                ptr: format!("{:#x}", t.event.ptr),
                size: t.event.size,
                t_s: t.event.t_ns.saturating_sub(t0) as f64 / 1e9,
                restated: t.restated,
                segment: seg_of(t.event.ptr).map(|i| format!("{:#x}", segments[i].base)),
                tensor: names
                    .get(&(t.process, t.event.ptr))
                    .cloned()
                    .or_else(|| describe(p, &t.event)),
                line: locs.first().map(|l| l.to_string()),
                frames: locs.iter().take(frames).map(|l| l.to_string()).collect(),
            }
        })
        .collect();
    TensorMoment {
        tensor_count: tensors.len(),
        tensor_bytes: tensors.iter().map(|t| t.event.size).sum(),
        segment_bytes,
        unallocated_bytes: segment_bytes.saturating_sub(in_segments),
        largest_free_block,
        outside_segments_bytes: outside,
        tensors: items,
        segments: uses,
    }
}

/// `op [d0, d1] dtype` from a tensor record's own fields, if it has any.
pub fn describe(p: &Process, t: &TensorEvent) -> Option<String> {
    let op = p.string(t.op);
    let dtype = p.string(t.dtype);
    if op.is_none() && dtype.is_none() && t.shape.is_empty() {
        return None;
    }
    let mut s = op.unwrap_or("tensor").to_string();
    if !t.shape.is_empty() {
        let dims: Vec<String> = t.shape.iter().map(i64::to_string).collect();
        s.push_str(&format!(" [{}]", dims.join(", ")));
    }
    if let Some(d) = dtype {
        s.push(' ');
        s.push_str(d);
    }
    Some(s)
}

/// PyTorch's numbers at an allocator-raised out-of-memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TorchOom {
    /// Bytes requested.
    pub requested: u64,
    /// Bytes allocated to tensors ("allocated by PyTorch").
    pub allocated: u64,
    /// Bytes reserved from the driver.
    pub reserved: u64,
    /// The per-process limit (`set_per_process_memory_fraction`), 0 for none.
    pub limit: u64,
    /// Free device memory the driver reported.
    pub free: u64,
}

impl TorchOom {
    /// From a refused tensor record.
    pub fn of(t: &TensorEvent) -> TorchOom {
        TorchOom {
            requested: t.size,
            allocated: t.allocated,
            reserved: t.reserved,
            limit: t.limit,
            free: t.free,
        }
    }
}

/// The live tensors, the segments and the tensors' names at one moment.
pub type LiveAt = (Vec<LiveTensor>, Vec<Segment>, FastMap<(usize, u64), String>);

/// Replays `trace` until replay index `seq` and returns the live tensors of one process and
/// device then, the segments, and the `--torch-shapes` names of the tensors.
pub fn live_at(
    trace: &Trace,
    process: usize,
    device: i32,
    seq: usize,
) -> Result<LiveAt, crate::Error> {
    let mut r = Replayer::new();
    let mut t = TensorReplay::new();
    let mut names = Names::default();
    let mut i = 0usize;
    trace.for_each_item(|pi, it| {
        match &it {
            Item::Event(e) => {
                r.apply(pi, i, e);
            }
            Item::Tensor(e) => {
                t.apply(pi, i, e);
            }
            Item::Annotate(a) => {
                r.annotate(pi, a);
                names.note(trace, pi, a);
            }
            _ => {}
        }
        i += 1;
        if i > seq {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    })?;
    Ok((
        t.live_set(process, device),
        segments_of(&r, process, device),
        names.0,
    ))
}

/// The latest annotation name of each pointer (the `--torch-shapes` names of tensors).
#[derive(Debug, Default, Clone)]
pub struct Names(pub FastMap<(usize, u64), String>);

impl Names {
    /// Notes an annotation.
    pub fn note(&mut self, trace: &Trace, pi: usize, a: &vramtrace_format::Annotation) {
        self.0
            .insert((pi, a.ptr), trace.processes[pi].tensor_name(a));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(ptr: u64, size: u64) -> TensorEvent {
        TensorEvent {
            action: TensorAction::Alloc,
            ptr,
            size,
            ..Default::default()
        }
    }

    #[test]
    fn live_set_levels_and_gaps() {
        let mut r = TensorReplay::new();
        r.apply(0, 0, &alloc(0x1000, 0x100));
        r.apply(0, 1, &alloc(0x1200, 0x100));
        r.apply(0, 2, &alloc(0x1100, 0x100));
        let free = TensorEvent {
            action: TensorAction::Free,
            ptr: 0x1100,
            ..Default::default()
        };
        assert_eq!(r.would_remove(0, &free), Some(0));
        let TensorStep::Released(Some(f)) = r.apply(0, 3, &free) else {
            panic!("the free pairs")
        };
        assert_eq!(f.event.size, 0x100);
        let l = r.level(0, 0);
        assert_eq!((l.live, l.peak, l.peak_seq, l.count), (0x200, 0x300, 2, 2));
        let trace = Trace::default();
        let m = moment(
            &trace_with_one_process(&trace),
            &r.live_set(0, 0),
            &[
                Segment {
                    base: 0x1000,
                    size: 0x1000,
                },
                Segment {
                    base: 0x8000,
                    size: 0x400,
                },
            ],
            10,
            0,
            &FastMap::default(),
        );
        assert_eq!(m.tensor_bytes, 0x200);
        assert_eq!(m.segment_bytes, 0x1400);
        assert_eq!(m.unallocated_bytes, 0x1200);
        // Segment 1: a 0x100 hole between the two, 0xd00 after the last; segment 2 empty.
        assert_eq!(m.largest_free_block, 0xd00);
        assert_eq!(m.segments[0].largest_free_block, 0xd00);
        assert_eq!(m.segments[1].largest_free_block, 0x400);
        assert_eq!(m.outside_segments_bytes, 0);
    }

    fn trace_with_one_process(_: &Trace) -> Trace {
        let f = vramtrace_format::TraceFile {
            path: "t".into(),
            header: Default::default(),
            driver_version: None,
            devices: Vec::new(),
            records: Vec::new(),
            problems: Vec::new(),
        };
        Trace::from_files(vec![f])
    }

    #[test]
    fn probe_frames_are_skipped() {
        assert!(is_probe_frame(
            "/x/probes/python/vramtrace_torch.py",
            "on_alloc"
        ));
        assert!(is_probe_frame(
            "/venv/site-packages/torch/_utils.py",
            "fire_callbacks"
        ));
        assert!(!is_probe_frame(
            "/venv/site-packages/torch/_utils.py",
            "_rebuild_tensor"
        ));
        assert!(!is_probe_frame("/x/chunk_o.py", "chunk_fwd_o"));
        assert!(is_torch_machinery(
            "/usr/local/lib/python3.12/dist-packages/torch/_ops.py"
        ));
        assert!(!is_torch_machinery(
            "/usr/local/lib/python3.12/dist-packages/torch/nn/modules/linear.py"
        ));
        assert!(!is_torch_machinery("/work/fla/ops/common/chunk_o.py"));
        // The H200's venv lives under /opt/torch: its other packages are the program's.
        assert!(is_torch_machinery(
            "/opt/torch/.venv/lib/python3.12/site-packages/torch/_ops.py"
        ));
        assert!(!is_torch_machinery(
            "/opt/torch/.venv/lib/python3.12/site-packages/transformers/generation/continuous_batching/input_outputs.py"
        ));
        assert!(!is_torch_machinery(
            "/opt/torch/.venv/lib/python3.12/site-packages/triton/runtime/driver.py"
        ));
        assert!(is_torch_machinery("/src/pytorch/torch/_ops.py"));
        assert!(!is_torch_machinery(
            "/src/pytorch/torch/nn/modules/linear.py"
        ));
    }
}
