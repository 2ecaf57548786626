//! Per-process, per-device summary of a trace: allocation counts, the peak of live device bytes
//! and what was live then, and every failed allocation with the free memory at that moment and
//! the live set it met.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::ControlFlow;
use std::path::Path;

use serde::Serialize;
use vramtrace_format::{Event, EventKind};

use crate::error::Error;
use crate::growth::{Growth, GrowthFold};
use crate::replay::{Capture, FastMap, LiveAlloc, Pool, Replayer, Step, capture};
use crate::symbolize::StackSymbolizer;
use crate::torch_replay::{
    LiveTensor, Names, Segment, TensorMoment, TensorReplay, TensorStep, TorchOom,
};
use crate::trace::{Item, Process, Trace};
use vramtrace_format::TensorEvent;
use vramtrace_models::units::{fmt_bytes, fmt_secs};

/// How many allocations to list at a peak or a failure.
pub const DEFAULT_TOP: usize = 10;
/// Failures whose live set is captured in full (and refused calls listed); later ones keep
/// counts only.
pub const MAX_DETAILED_FAILURES: usize = 64;

/// One allocation as shown in a summary.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AllocItem {
    /// Pointer or handle, hex.
    pub ptr: String,
    /// Bytes.
    pub size: u64,
    /// Driver function that made it.
    pub api: &'static str,
    /// Seconds since the trace began.
    pub t_s: f64,
    /// Thread.
    pub tid: u32,
    /// Label (annotation or range stack) active when it was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The tensor it holds, as named through the annotation ABI (`name dtype[shape]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor: Option<String>,
    /// Stack id in its process (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub stack: u32,
    /// The outermost-but-relevant frames: the first [`SummaryOptions::frames`] frames of the
    /// symbolised stack, innermost first, the recorder's own frames dropped.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// A failed allocation.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Failure {
    /// Seconds since the trace began.
    pub t_s: f64,
    /// Driver function.
    pub api: &'static str,
    /// Bytes requested.
    pub size: u64,
    /// The driver's result code.
    pub result: i32,
    /// Its name (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub error: String,
    /// Free device memory the driver reported at that moment.
    pub free_bytes: u64,
    /// Total device memory the driver reported.
    pub total_bytes: u64,
    /// Label active when it was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Device bytes this process held at that moment.
    pub live_bytes: u64,
    /// Number of live allocations at that moment.
    pub live_count: usize,
    /// The largest of them.
    pub live: Vec<AllocItem>,
    /// Stack id (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub stack: u32,
    /// Symbolised frames of the failed request, innermost first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
    /// PyTorch's numbers when its caching allocator raised the out-of-memory (the driver was
    /// not asked: `api` is `pytorch`, `size` the request).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch: Option<TorchOom>,
    /// The tensors live then, inside their segments (traces with tensor records).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensors: Option<TensorMoment>,
}

/// PyTorch's caching allocator on one device of one process, from tensor records: blocks
/// inside the segments the driver events show (their bytes are never added to them).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TensorSummary {
    /// Tensors allocated.
    pub allocations: u64,
    /// Tensors freed (paired with an allocation).
    pub frees: u64,
    /// Highest bytes in live tensors ("allocated by PyTorch").
    pub peak_bytes: u64,
    /// When (seconds since the trace began).
    pub peak_t_s: f64,
    /// Bytes in live tensors at the end.
    pub live_at_end: u64,
    /// The tensors live at that peak, inside the segments live then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_peak: Option<TensorMoment>,
}

/// An allocation call the driver refused for another reason than memory (a `cuMemCreate`
/// probe answered `CUDA_ERROR_NOT_PERMITTED`, an invalid value): a failed call, not an OOM.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailedCall {
    /// Seconds since the trace began.
    pub t_s: f64,
    /// Driver function.
    pub api: &'static str,
    /// Bytes requested.
    pub size: u64,
    /// The driver's result code.
    pub result: i32,
    /// Its name (`CUDA_ERROR_NOT_PERMITTED`), or `CUresult N` for a value not in the table.
    pub error: String,
    /// Label active when it was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// Peak bytes of a non-device bucket.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PoolPeak {
    /// The bucket.
    pub pool: Pool,
    /// Successful allocations in it.
    pub allocations: u64,
    /// Releases paired with one of them.
    pub frees: u64,
    /// Its highest live bytes.
    pub peak_bytes: u64,
    /// Live at the end of the trace.
    pub live_at_end: u64,
}

/// One device as seen by one process.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceSummary {
    /// Device ordinal (-1: host-only memory).
    pub device: i32,
    /// Device name, if the process reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Device memory in total, if reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<u64>,
    /// Successful device allocations (`cuMemAlloc*`, `cuMemCreate`, arrays).
    pub allocations: u64,
    /// Device releases paired with an allocation.
    pub frees: u64,
    /// Highest live device bytes.
    pub peak_bytes: u64,
    /// When the peak was reached (seconds since the trace began).
    pub peak_t_s: f64,
    /// Number of allocations live at the peak.
    pub peak_live_count: usize,
    /// The largest allocations live at the peak.
    pub peak_live: Vec<AllocItem>,
    /// Live device bytes when the trace ends.
    pub live_at_end: u64,
    /// Failed allocations, in time order.
    pub failures: Vec<Failure>,
    /// Failed allocations in all (beyond those detailed): out-of-memory failures only.
    pub failed_allocations: u64,
    /// Allocation calls refused for another reason than memory, in time order (the first
    /// [`MAX_DETAILED_FAILURES`]).
    pub failed_calls: Vec<FailedCall>,
    /// Such calls in all.
    pub failed_call_count: u64,
    /// Other buckets (host, managed, address space, mapped).
    pub other_pools: Vec<PoolPeak>,
    /// Tensor-level view (traces with tensor records).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensors: Option<TensorSummary>,
    /// Every byte in a category ([`crate::categoriser`]) at its first out-of-memory, else at
    /// its peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub categories: Option<DeviceCategories>,
}

/// What the memory of a device holds at one moment.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceCategories {
    /// Which moment.
    pub at: crate::categoriser::MomentKind,
    /// The rows.
    #[serde(flatten)]
    pub breakdown: crate::categoriser::Breakdown,
}

/// One process.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessSummary {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Command line.
    pub command: Vec<String>,
    /// Trace file.
    pub file: String,
    /// Driver version, if reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<i32>,
    /// Per device.
    pub devices: Vec<DeviceSummary>,
    /// What the reader stepped over (torn tail after a crash).
    pub problems: Vec<String>,
    /// The recorder's and the probes' notes, in record order (NOTE records).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Whether PyTorch's tensors were recorded in this process, and if not, why. Absent for a
    /// process that shows no sign of torch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor_capture: Option<TensorCapture>,
    /// Time ranges whose tensor-level records were dropped to keep the trace within its size
    /// budget (`vramtrace run --max-size`), merged; driver events, failures and the live set
    /// were kept.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tensor_detail_lost: Vec<LostRange>,
}

/// A time range whose tensor-level records the recorder dropped ([`ProcessSummary`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LostRange {
    /// Start, seconds since the trace began.
    pub from_s: f64,
    /// End, seconds since the trace began.
    pub to_s: f64,
    /// Blocks of records dropped in it.
    pub blocks: u64,
}

/// The dropped blocks' time ranges as [`LostRange`]s: one thread's dropped blocks are the
/// start of its chain (the ring drops in the order blocks were taken), so they make one range
/// per thread; ranges of different threads are merged where they overlap.
fn lost_ranges(dropped: &[(u32, u64, u64)], t0: u64) -> Vec<LostRange> {
    let mut per_thread: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    for &(tid, from, to) in dropped {
        let r = per_thread.entry(tid).or_insert((from, to, 0));
        r.0 = r.0.min(from);
        r.1 = r.1.max(to);
        r.2 += 1;
    }
    let mut d: Vec<(u64, u64, u64)> = per_thread.into_values().collect();
    d.sort_unstable();
    let mut merged: Vec<(u64, u64, u64)> = Vec::new();
    for (from, to, blocks) in d {
        match merged.last_mut() {
            Some(m) if from <= m.1 => {
                m.1 = m.1.max(to);
                m.2 += blocks;
            }
            _ => merged.push((from, to, blocks)),
        }
    }
    merged
        .into_iter()
        .map(|(from, to, blocks)| LostRange {
            from_s: rel(from, t0),
            to_s: rel(to, t0),
            blocks,
        })
        .collect()
}

/// Whether a process's tensors were recorded ([`ProcessSummary::tensor_capture`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TensorCapture {
    /// Tensor records of the process: blocks handed out, taken back, requests refused.
    pub events: u64,
    /// What the PyTorch probe said of itself in this process: `Some(true)` started,
    /// `Some(false)` could not start (the reason is in `status`), `None` said nothing.
    pub probe_started: Option<bool>,
    /// One sentence: what was recorded, or why nothing was.
    pub status: String,
}

/// The prefix of the PyTorch probe's notes (probes/python/vramtrace_torch.py).
const PROBE_NOTE: &str = "torch probe: ";

/// Libraries that only a process running PyTorch with CUDA loads.
const TORCH_LIBRARIES: [&str; 2] = ["libc10_cuda.so", "libtorch_cuda.so"];

/// Whether `p`'s tensors were recorded, from its tensor records, the probe's note and the
/// modules it had loaded; `None` when nothing says the process ran torch.
pub fn tensor_capture(p: &crate::trace::Process, events: u64) -> Option<TensorCapture> {
    let probe = p
        .notes
        .iter()
        .rev()
        .find_map(|(_, text)| text.strip_prefix(PROBE_NOTE));
    let started = probe.map(|t| t.starts_with("active"));
    let torch_library = p.modules.iter().find_map(|m| {
        let name = Path::new(&m.path).file_name()?.to_str()?;
        TORCH_LIBRARIES
            .iter()
            .any(|l| name.starts_with(l))
            .then(|| name.to_string())
    });
    let status = match (events, probe, torch_library) {
        (1.., _, _) => format!("recorded: {events} tensor events"),
        (0, Some(text), _) if started == Some(false) => format!("not recorded: {text}"),
        (0, Some(_), _) => "none: Python with torch and the probe started, but no tensor events \
             (PyTorch's caching allocator handed out no block while recording; with \
             PYTORCH_NO_CUDA_MEMORY_CACHING=1 each tensor is a driver allocation above)"
            .to_string(),
        (0, None, Some(lib)) => format!(
            "not recorded: torch is loaded ({lib}) but the PyTorch probe never started in \
             this process (run without --no-torch-probe, and keep the PYTHONPATH entry that \
             vramtrace run adds in the environment of the processes it starts)"
        ),
        (0, None, None) => return None,
    };
    Some(TensorCapture {
        events,
        probe_started: started,
        status,
    })
}

/// The summary of a whole trace.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// Per process, in start order.
    pub processes: Vec<ProcessSummary>,
    /// Files of the trace directory that could not be read, and why.
    pub unreadable: Vec<crate::trace::Unreadable>,
    /// What grows over the run ([`crate::growth`]); `None` when nothing was recorded.
    pub growth: Option<Growth>,
}

/// Options for [`summarize`].
#[derive(Debug, Clone, Copy)]
pub struct SummaryOptions {
    /// Allocations listed at a peak or failure.
    pub top: usize,
    /// Frames of each listed allocation's stack to symbolise and show (0: none).
    pub frames: usize,
}

impl Default for SummaryOptions {
    fn default() -> Self {
        SummaryOptions {
            top: DEFAULT_TOP,
            frames: 0,
        }
    }
}

/// A failed allocation as the pass met it: the request, the live bytes and count then, and the
/// largest live allocations.
struct FailureAt {
    event: Event,
    live_bytes: u64,
    live_count: usize,
    live: Vec<LiveAlloc>,
    /// An allocator-raised OOM: PyTorch's numbers.
    torch: Option<TorchOom>,
    /// The live tensors and segments then.
    tensors: Option<(Vec<LiveTensor>, Vec<Segment>)>,
}

/// The tensors live at a tensor peak, found as [`PeakSet`] finds the driver's.
enum TensorPeak {
    Now,
    Taken(Vec<LiveTensor>, Vec<Segment>),
    Later,
}

/// Counts of one process and device.
#[derive(Default)]
struct Acc {
    allocations: u64,
    frees: u64,
    failed: u64,
    failures: Vec<FailureAt>,
    refused: u64,
    refusals: Vec<Event>,
    /// Allocations and paired releases of the other buckets, by [`pool_index`].
    other: [(u64, u64); 6],
}

fn pool_index(p: Pool) -> usize {
    match p {
        Pool::Device => 0,
        Pool::Managed => 1,
        Pool::Host => 2,
        Pool::Address => 3,
        Pool::Mapped => 4,
        Pool::Imported => 5,
    }
}

/// The live set at a device peak, found in the same pass when it is cheap.
///
/// Every new peak makes the current live set the one to report, but copying it at every peak
/// costs the live set's size per allocation when the trace only grows. So the copy waits until
/// the first release that would change it (a later allocation is a newer peak and supersedes
/// it), and the copies together may scan at most as many live entries as the pass has read
/// items: past that budget the key is left for a second pass that stops at its peak.
enum PeakSet {
    /// The live set now is the set at the peak; not copied yet.
    Now,
    /// Copied: the largest allocations and the count.
    Taken(Vec<LiveAlloc>, usize),
    /// Too costly to copy in the pass: taken by a second pass.
    Later,
}

/// The tensors and segments live at each tensor peak, by process and device.
type TensorSets = FastMap<(usize, i32), (Vec<LiveTensor>, Vec<Segment>)>;

/// The first pass's state: counts per process and device, the peaks' live sets as they are
/// found, the driver and tensor replays.
struct Pass {
    top: usize,
    acc: FastMap<(usize, i32), Acc>,
    peaks: FastMap<(usize, i32), PeakSet>,
    /// Keys in [`PeakSet::Now`].
    pending: usize,
    budget: usize,
    replay: Replayer,
    tensors: TensorReplay,
    tpeaks: FastMap<(usize, i32), TensorPeak>,
    names: Names,
    seq: usize,
    /// Tensor records per process.
    tensor_events: Vec<u64>,
    /// What grows over the run.
    growth: GrowthFold,
}

impl Pass {
    fn new(top: usize, processes: usize, t0: u64) -> Pass {
        Pass {
            growth: GrowthFold::new(t0),
            top,
            acc: FastMap::default(),
            peaks: FastMap::default(),
            pending: 0,
            budget: 0,
            replay: Replayer::new(),
            tensors: TensorReplay::new(),
            tpeaks: FastMap::default(),
            names: Names::default(),
            seq: 0,
            tensor_events: vec![0; processes],
        }
    }

    /// Folds one item of process `pi`.
    fn item(&mut self, trace: &Trace, pi: usize, it: Item) {
        self.budget += 1;
        if self.growth.tick(it.t_ns()) {
            self.sample_reserves(trace);
        }
        match it {
            Item::Event(e) => self.event(&trace.processes[pi], pi, e),
            Item::Annotate(a) => {
                self.replay.annotate(pi, &a);
                self.names.note(trace, pi, &a);
                self.seq += 1;
            }
            Item::Tensor(t) => {
                self.tensor(&trace.processes[pi], pi, &t);
                self.seq += 1;
            }
            _ => self.seq += 1,
        }
    }

    /// At a new bucket of the growth grid: the largest free block of each PyTorch reserve,
    /// within the pass's budget.
    fn sample_reserves(&mut self, trace: &Trace) {
        crate::growth::sample_reserves(
            &mut self.growth,
            trace,
            &self.replay,
            &self.tensors,
            &self.names.0,
            &mut self.budget,
        );
    }

    /// A PyTorch tensor record: the tensor peaks and the allocator's refusals.
    fn tensor(&mut self, p: &Process, pi: usize, t: &TensorEvent) {
        if let Some(n) = self.tensor_events.get_mut(pi) {
            *n += 1;
        }
        if let Some(dev) = self.tensors.would_remove(pi, t)
            && let Some(p) = self.tpeaks.get_mut(&(pi, dev))
            && matches!(p, TensorPeak::Now)
        {
            let cost = self.tensors.live_len() + self.replay.live_len();
            *p = if cost <= self.budget {
                self.budget -= cost;
                TensorPeak::Taken(
                    self.tensors.live_set(pi, dev),
                    crate::torch_replay::segments_of(&self.replay, pi, dev),
                )
            } else {
                TensorPeak::Later
            };
        }
        let a = self.acc.entry((pi, t.device)).or_default();
        let step = self.tensors.apply(pi, self.seq, t);
        self.growth.tensor_step(p, pi, t, &step);
        match step {
            TensorStep::Allocated | TensorStep::Restated(true) => {
                if self.tensors.level(pi, t.device).peak_seq == self.seq {
                    self.tpeaks.insert((pi, t.device), TensorPeak::Now);
                }
            }
            TensorStep::Refused => {
                a.failed += 1;
                if a.failures.len() < MAX_DETAILED_FAILURES {
                    let live = self.replay.largest(pi, t.device, Pool::Device, self.top);
                    live.iter().for_each(|x| self.replay.follow(x));
                    let level = self.replay.level(pi, t.device, Pool::Device);
                    a.failures.push(FailureAt {
                        event: Event {
                            t_ns: t.t_ns,
                            tid: t.tid,
                            device: t.device,
                            kind: EventKind::AllocFailed,
                            size: t.size,
                            free_bytes: t.free,
                            stack: t.stack,
                            ..Event::default()
                        },
                        live_bytes: level.live,
                        live_count: level.count,
                        live,
                        torch: Some(TorchOom::of(t)),
                        tensors: Some((
                            self.tensors.live_set(pi, t.device),
                            crate::torch_replay::segments_of(&self.replay, pi, t.device),
                        )),
                    });
                }
            }
            TensorStep::Released(_) | TensorStep::Restated(false) => {}
        }
    }

    /// A driver event: counts, the device peaks and the failures.
    fn event(&mut self, p: &Process, pi: usize, e: Event) {
        if self.pending > 0
            && let Some((dev, Pool::Device)) = self.replay.would_remove(pi, &e)
            && let Some(p) = self.peaks.get_mut(&(pi, dev))
            && matches!(p, PeakSet::Now)
        {
            self.pending -= 1;
            let cost = self.replay.live_len();
            *p = if cost <= self.budget {
                self.budget -= cost;
                let set = self.replay.largest(pi, dev, Pool::Device, self.top);
                set.iter().for_each(|a| self.replay.follow(a));
                PeakSet::Taken(set, self.replay.level(pi, dev, Pool::Device).count)
            } else {
                PeakSet::Later
            };
        }
        let step = self.replay.apply(pi, self.seq, &e);
        self.growth.driver_step(p, pi, &e, &step);
        match step {
            Step::Allocated { pool: Pool::Device } => {
                self.acc.entry((pi, e.device)).or_default().allocations += 1;
                if self.replay.level(pi, e.device, Pool::Device).peak_seq == self.seq {
                    let p = self.peaks.entry((pi, e.device)).or_insert(PeakSet::Later);
                    if !matches!(p, PeakSet::Now) {
                        self.pending += 1;
                    }
                    *p = PeakSet::Now;
                }
            }
            Step::Allocated { pool } => {
                self.acc.entry((pi, e.device)).or_default().other[pool_index(pool)].0 += 1;
            }
            Step::Released { freed: Some(f), .. } if f.pool == Pool::Device => {
                self.acc.entry((pi, f.event.device)).or_default().frees += 1
            }
            Step::Released {
                freed: Some(f),
                also,
            } => {
                self.acc.entry((pi, f.event.device)).or_default().other[pool_index(f.pool)].1 +=
                    1 + also.len() as u64
            }
            Step::Unchanged if e.kind == EventKind::AllocFailed => {
                let a = self.acc.entry((pi, e.device)).or_default();
                a.refused += 1;
                if a.refusals.len() < MAX_DETAILED_FAILURES {
                    a.refusals.push(e);
                }
            }
            Step::Failed if e.kind == EventKind::AllocFailed => {
                let a = self.acc.entry((pi, e.device)).or_default();
                a.failed += 1;
                if a.failures.len() < MAX_DETAILED_FAILURES {
                    let live = self.replay.largest(pi, e.device, Pool::Device, self.top);
                    live.iter().for_each(|x| self.replay.follow(x));
                    let level = self.replay.level(pi, e.device, Pool::Device);
                    let at = self.tensors.any().then(|| {
                        (
                            self.tensors.live_set(pi, e.device),
                            crate::torch_replay::segments_of(&self.replay, pi, e.device),
                        )
                    });
                    a.failures.push(FailureAt {
                        event: e,
                        live_bytes: level.live,
                        live_count: level.count,
                        live,
                        torch: None,
                        tensors: at,
                    });
                }
            }
            _ => {}
        }
        self.seq += 1;
    }

    /// After the pass: the peaks never released are the live sets at the end, the live
    /// allocations get their names, and a second pass takes the peaks too costly to copy.
    fn settle_peaks(&mut self, trace: &Trace) -> Result<(), Error> {
        // Peaks with no release after them: the live set at the end is the set at the peak.
        for ((pi, dev), p) in self.peaks.iter_mut() {
            if matches!(p, PeakSet::Now) {
                let set = self.replay.largest(*pi, *dev, Pool::Device, self.top);
                *p = PeakSet::Taken(set, self.replay.level(*pi, *dev, Pool::Device).count);
            }
        }
        let name = |a: &mut LiveAlloc| {
            if let Some(n) = self.replay.annotation_of(a.seq) {
                a.annotation = Some(n.clone());
            }
        };
        for p in self.peaks.values_mut() {
            if let PeakSet::Taken(set, _) = p {
                set.iter_mut().for_each(name);
            }
        }
        for a in self.acc.values_mut() {
            for f in &mut a.failures {
                f.live.iter_mut().for_each(name);
            }
        }
        // Second pass for the self.peaks that were too costly to copy in the first.
        let later: Vec<(usize, i32)> = self
            .peaks
            .iter()
            .filter(|(_, p)| matches!(p, PeakSet::Later))
            .map(|(k, _)| *k)
            .collect();
        let wants: Vec<Capture> = later
            .iter()
            .map(|&(pi, dev)| Capture {
                seq: self.replay.level(pi, dev, Pool::Device).peak_seq,
                process: pi,
                device: dev,
                pool: Pool::Device,
                top: self.top,
            })
            .collect();
        for (k, (set, count)) in later.into_iter().zip(capture(trace, &wants)?) {
            self.peaks.insert(k, PeakSet::Taken(set, count));
        }
        Ok(())
    }

    /// The tensors and segments live at each tensor peak: still the live set at the end, or
    /// taken by a pass of their own.
    fn tensor_sets(&mut self, trace: &Trace) -> Result<TensorSets, Error> {
        let mut tensor_sets = TensorSets::default();
        for ((pi, dev), p) in std::mem::take(&mut self.tpeaks) {
            let set = match p {
                TensorPeak::Now => (
                    self.tensors.live_set(pi, dev),
                    crate::torch_replay::segments_of(&self.replay, pi, dev),
                ),
                TensorPeak::Taken(t, s) => (t, s),
                TensorPeak::Later => {
                    let (t, s, _) = crate::torch_replay::live_at(
                        trace,
                        pi,
                        dev,
                        self.tensors.level(pi, dev).peak_seq,
                    )?;
                    (t, s)
                }
            };
            tensor_sets.insert((pi, dev), set);
        }
        Ok(tensor_sets)
    }
}

/// What the summary shows of the live sets and failures the pass found: allocations with
/// their names and frames, failures with PyTorch's numbers, tensor moments.
struct Shown<'t> {
    trace: &'t Trace,
    t0: u64,
    opts: SummaryOptions,
    names: &'t Names,
    syms: Vec<RefCell<StackSymbolizer<'t>>>,
}

impl<'t> Shown<'t> {
    fn new(trace: &'t Trace, opts: SummaryOptions, names: &'t Names) -> Shown<'t> {
        Shown {
            trace,
            t0: trace.start_ns(),
            opts,
            names,
            syms: trace
                .processes
                .iter()
                .map(|p| RefCell::new(StackSymbolizer::new(p)))
                .collect(),
        }
    }

    /// The tensors and segments of a tensor moment, as shown.
    fn moment(&self, (t, s): &(Vec<LiveTensor>, Vec<Segment>)) -> TensorMoment {
        crate::torch_replay::moment(
            self.trace,
            t,
            s,
            self.opts.top,
            self.opts.frames,
            &self.names.0,
        )
    }

    /// The first frames of a stack, symbolised (none when frames are not asked for).
    fn frames_of(&self, pi: usize, stack: u32) -> Vec<String> {
        if self.opts.frames == 0 || stack == 0 {
            return Vec::new();
        }
        self.syms[pi]
            .borrow_mut()
            .stack(stack)
            .iter()
            .take(self.opts.frames)
            .map(|f| f.to_string())
            .collect()
    }

    /// One live allocation as shown.
    fn item(&self, a: &LiveAlloc) -> AllocItem {
        let p = &self.trace.processes[a.process];
        AllocItem {
            ptr: format!("{:#x}", a.event.ptr),
            size: a.event.size,
            api: a.event.api.name(),
            t_s: rel(a.event.t_ns, self.t0),
            tid: a.event.tid,
            label: p.string(a.event.label).map(str::to_owned),
            tensor: a.annotation.as_ref().map(|n| p.tensor_name(n)),
            stack: a.event.stack,
            frames: self.frames_of(a.process, a.event.stack),
        }
    }

    /// One failed allocation of process `pi` as shown.
    fn failure(&self, pi: usize, f: &FailureAt) -> Failure {
        let e = &f.event;
        if let Some(torch) = f.torch {
            // The allocator refused: the request and PyTorch's numbers, the driver's total.
            let p = &self.trace.processes[pi];
            return Failure {
                t_s: rel(e.t_ns, self.t0),
                api: "pytorch",
                size: e.size,
                result: 0,
                error: "PyTorch OutOfMemoryError (raised by the caching allocator)".into(),
                free_bytes: torch.free,
                total_bytes: p
                    .devices
                    .iter()
                    .find(|d| d.ordinal == e.device)
                    .map_or(0, |d| d.total_bytes),
                label: None,
                live_bytes: f.live_bytes,
                live_count: f.live_count,
                live: f.live.iter().map(|a| self.item(a)).collect(),
                stack: e.stack,
                frames: crate::torch_replay::python_frames(p, e.stack, self.opts.frames.max(1)),
                torch: Some(torch),
                tensors: f.tensors.as_ref().map(|m| self.moment(m)),
            };
        }
        Failure {
            t_s: rel(e.t_ns, self.t0),
            api: e.api.name(),
            size: e.size,
            result: e.result,
            error: crate::cu_result::describe(e.result),
            free_bytes: e.free_bytes,
            total_bytes: e.total_bytes,
            label: self.trace.processes[pi].string(e.label).map(str::to_owned),
            live_bytes: f.live_bytes,
            live_count: f.live_count,
            live: f.live.iter().map(|a| self.item(a)).collect(),
            stack: e.stack,
            frames: self.frames_of(pi, e.stack),
            torch: None,
            tensors: f.tensors.as_ref().map(|m| self.moment(m)),
        }
    }
}

/// Computes the summary of a trace in one streaming pass (two when a peak's live set was too
/// costly to copy in the first).
pub fn summarize(trace: &Trace, opts: SummaryOptions) -> Result<Summary, Error> {
    let t0 = trace.start_ns();
    let mut pass = Pass::new(opts.top, trace.processes.len(), t0);
    trace.for_each_item(|pi, it| {
        pass.item(trace, pi, it);
        ControlFlow::Continue(())
    })?;
    pass.replay.check_overflow()?;
    pass.settle_peaks(trace)?;
    let tensor_sets = pass.tensor_sets(trace)?;
    let Pass {
        acc,
        mut peaks,
        replay,
        tensors,
        names,
        tensor_events,
        growth,
        ..
    } = pass;
    let mut growth_syms: Vec<StackSymbolizer> =
        trace.processes.iter().map(StackSymbolizer::new).collect();
    let growth = growth.finish(trace, &replay, &tensors, &mut growth_syms);
    let shown = Shown::new(trace, opts, &names);
    let moment = |m: &(Vec<LiveTensor>, Vec<Segment>)| shown.moment(m);
    let item = |a: &LiveAlloc| shown.item(a);
    let failure = |pi: usize, f: &FailureAt| shown.failure(pi, f);

    let acc: BTreeMap<(usize, i32), Acc> = acc.into_iter().collect();
    let mut categories: BTreeMap<(usize, i32), DeviceCategories> = BTreeMap::new();
    for (at, kind) in crate::categoriser::moments(trace)? {
        let breakdown = crate::categoriser::breakdown_at(
            trace,
            at,
            crate::categoriser::Expectations::default(),
        )?;
        categories.insert(
            (at.process, at.device),
            DeviceCategories {
                at: kind,
                breakdown,
            },
        );
    }
    let mut processes = Vec::new();
    for (pi, p) in trace.processes.iter().enumerate() {
        let mut devices = Vec::new();
        for ((_, dev), a) in acc.range((pi, i32::MIN)..=(pi, i32::MAX)) {
            let level = replay.level(pi, *dev, Pool::Device);
            let (set, count) = match peaks.remove(&(pi, *dev)) {
                Some(PeakSet::Taken(set, count)) if level.peak > 0 => (set, count),
                _ => (Vec::new(), 0),
            };
            let info = p.devices.iter().find(|d| d.ordinal == *dev);
            let other_pools = [
                Pool::Managed,
                Pool::Host,
                Pool::Address,
                Pool::Mapped,
                Pool::Imported,
            ]
            .into_iter()
            .filter_map(|pool| {
                let l = replay.level(pi, *dev, pool);
                let (allocations, frees) = a.other[pool_index(pool)];
                (l.peak > 0).then_some(PoolPeak {
                    pool,
                    allocations,
                    frees,
                    peak_bytes: l.peak,
                    live_at_end: l.live,
                })
            })
            .collect();
            devices.push(DeviceSummary {
                device: *dev,
                name: info.map(|d| d.name.clone()),
                total_bytes: info.map(|d| d.total_bytes),
                allocations: a.allocations,
                frees: a.frees,
                peak_bytes: level.peak,
                peak_t_s: if level.peak > 0 {
                    rel(level.peak_t_ns, t0)
                } else {
                    0.0
                },
                peak_live_count: count,
                peak_live: set.iter().map(item).collect(),
                live_at_end: level.live,
                failures: a.failures.iter().map(|f| failure(pi, f)).collect(),
                failed_allocations: a.failed,
                failed_calls: a
                    .refusals
                    .iter()
                    .map(|e| FailedCall {
                        t_s: rel(e.t_ns, t0),
                        api: e.api.name(),
                        size: e.size,
                        result: e.result,
                        error: crate::cu_result::name(e.result)
                            .map_or_else(|| format!("CUresult {}", e.result), str::to_owned),
                        label: p.string(e.label).map(str::to_owned),
                    })
                    .collect(),
                failed_call_count: a.refused,
                other_pools,
                tensors: tensors.level_if_any(pi, *dev).map(|l| TensorSummary {
                    allocations: l.allocations,
                    frees: l.frees,
                    peak_bytes: l.peak,
                    peak_t_s: if l.peak > 0 {
                        rel(l.peak_t_ns, t0)
                    } else {
                        0.0
                    },
                    live_at_end: l.live,
                    at_peak: tensor_sets
                        .get(&(pi, *dev))
                        .filter(|_| l.peak > 0)
                        .map(moment),
                }),
                categories: categories.remove(&(pi, *dev)),
            });
        }
        processes.push(ProcessSummary {
            pid: p.header.pid,
            ppid: p.header.ppid,
            command: p.header.cmdline.clone(),
            file: p.path.display().to_string(),
            driver_version: p.driver_version,
            devices,
            problems: p.problems.iter().map(|x| x.to_string()).collect(),
            notes: p.notes.iter().map(|(_, text)| text.clone()).collect(),
            tensor_capture: tensor_capture(p, tensor_events.get(pi).copied().unwrap_or(0)),
            tensor_detail_lost: lost_ranges(&p.dropped, t0),
        });
    }
    Ok(Summary {
        processes,
        unreadable: trace.unreadable.clone(),
        growth,
    })
}

fn rel(t_ns: u64, t0: u64) -> f64 {
    t_ns.saturating_sub(t0) as f64 / 1e9
}

/// Renders the summary as text. `detail` adds the live sets at peaks and failures.
pub fn render(s: &Summary, detail: bool) -> String {
    let mut out = String::new();
    if s.processes.is_empty() {
        out.push_str("no traced process recorded anything\n");
    }
    if !s.unreadable.is_empty() {
        let _ = writeln!(
            out,
            "warning: skipped {} unreadable trace file(s):",
            s.unreadable.len()
        );
        for u in &s.unreadable {
            let _ = writeln!(out, "  {}: {}", u.file.display(), u.reason);
        }
    }
    for p in &s.processes {
        let cmd = p.command.join(" ");
        let _ = writeln!(
            out,
            "process {} (parent {}): {}",
            p.pid,
            p.ppid,
            shorten(&cmd, 100)
        );
        for prob in &p.problems {
            let _ = writeln!(out, "  warning: {prob}");
        }
        for note in &p.notes {
            let _ = writeln!(out, "  note: {note}");
        }
        if let Some(c) = &p.tensor_capture {
            let _ = writeln!(out, "  tensors: {}", c.status);
        }
        for l in &p.tensor_detail_lost {
            let _ = writeln!(
                out,
                "  tensor detail lost to the size budget from {} to {} ({} blocks dropped; \
                 driver events, failures and the live set kept)",
                fmt_secs(l.from_s),
                fmt_secs(l.to_s),
                l.blocks
            );
        }
        if p.devices.is_empty() {
            let _ = writeln!(out, "  no device memory activity recorded");
        }
        for d in &p.devices {
            let name = match (&d.name, d.total_bytes) {
                (Some(n), Some(t)) => format!(" ({n}, {})", fmt_bytes(t)),
                (Some(n), None) => format!(" ({n})"),
                _ => String::new(),
            };
            // Ordinal -1 holds what belongs to no device: pinned host memory (and anything
            // else recorded without a device). Its line is about that memory, not about a
            // device pool it never had; a bucket shown on the first line is not repeated.
            let (dev, first, others) = match d.other_pools.as_slice() {
                [only, rest @ ..] if d.device < 0 && d.allocations == 0 && d.peak_bytes == 0 => {
                    let what = match only.pool {
                        Pool::Host => "pinned memory".to_string(),
                        p => format!("{} memory", p.name()),
                    };
                    let line = format!(
                        "{} allocations, {} frees, peak {}, {} live at end",
                        only.allocations,
                        only.frees,
                        fmt_bytes(only.peak_bytes),
                        fmt_bytes(only.live_at_end)
                    );
                    (format!("host ({what})"), line, rest)
                }
                all => {
                    let dev = if d.device < 0 {
                        "host".to_string()
                    } else {
                        format!("device {}", d.device)
                    };
                    let line = format!(
                        "{} allocations, {} frees, peak {} at {}, {} live at end",
                        d.allocations,
                        d.frees,
                        fmt_bytes(d.peak_bytes),
                        fmt_secs(d.peak_t_s),
                        fmt_bytes(d.live_at_end)
                    );
                    (dev, line, all)
                }
            };
            let _ = writeln!(out, "  {dev}{name}: {first}");
            for o in others {
                let _ = writeln!(
                    out,
                    "    {}: {} allocations, {} frees, peak {}, {} live at end",
                    o.pool.name(),
                    o.allocations,
                    o.frees,
                    fmt_bytes(o.peak_bytes),
                    fmt_bytes(o.live_at_end)
                );
            }
            if let Some(t) = &d.tensors {
                let _ = writeln!(
                    out,
                    "    tensors (PyTorch's caching allocator, inside the segments above): {} allocations, {} frees, peak {} at {}, {} live at end",
                    t.allocations,
                    t.frees,
                    fmt_bytes(t.peak_bytes),
                    fmt_secs(t.peak_t_s),
                    fmt_bytes(t.live_at_end)
                );
                if detail && let Some(m) = &t.at_peak {
                    let _ = writeln!(out, "    at the tensor peak:");
                    render_tensor_moment(&mut out, m, None);
                }
            }
            if let Some(c) = &d.categories {
                let at = match c.at {
                    crate::categoriser::MomentKind::Failure => "at the first out-of-memory",
                    crate::categoriser::MomentKind::Peak => "at the peak",
                };
                let _ = writeln!(out, "    what the memory holds {at}:");
                out.push_str(&crate::categoriser::render(&c.breakdown, "      "));
                if let Some(s) = c.breakdown.segments.first().filter(|s| s.reserve > 0) {
                    let _ = writeln!(
                        out,
                        "      the allocator's reserve lies in {} segments; the largest free block, {}, in the segment at {:#x} of {}",
                        c.breakdown.segments.len(),
                        fmt_bytes(
                            c.breakdown
                                .segments
                                .iter()
                                .map(|s| s.largest_free_block)
                                .max()
                                .unwrap_or(0)
                        ),
                        s.base,
                        fmt_bytes(s.size),
                    );
                }
            }
            if detail && !d.peak_live.is_empty() {
                let _ = writeln!(
                    out,
                    "    largest of the {} allocations live at the peak:",
                    d.peak_live_count
                );
                render_items(&mut out, &d.peak_live);
            }
            if d.failed_allocations > 0 {
                let _ = writeln!(out, "    {} failed allocation(s):", d.failed_allocations);
            }
            for f in &d.failures {
                let label = f
                    .label
                    .as_deref()
                    .map(|l| format!(" in {l}"))
                    .unwrap_or_default();
                if let Some(t) = &f.torch {
                    let limit = if t.limit > 0 {
                        format!(", limit {}", fmt_bytes(t.limit))
                    } else {
                        String::new()
                    };
                    let _ = writeln!(
                        out,
                        "      at {}: PyTorch's caching allocator refused {} (allocated {}, reserved {}{limit}; driver said {} free); this process held {} from the driver in {} allocations",
                        fmt_secs(f.t_s),
                        fmt_bytes(t.requested),
                        fmt_bytes(t.allocated),
                        fmt_bytes(t.reserved),
                        fmt_bytes(t.free),
                        fmt_bytes(f.live_bytes),
                        f.live_count,
                    );
                    render_frames(&mut out, &f.frames, "        ");
                    if let Some(m) = &f.tensors {
                        render_tensor_moment(&mut out, m, Some(t.requested));
                    }
                    continue;
                }
                let _ = writeln!(
                    out,
                    "      at {}: {} of {} failed with {}{label}; driver said {} free of {}; this process held {} in {} allocations",
                    fmt_secs(f.t_s),
                    f.api,
                    fmt_bytes(f.size),
                    f.error,
                    fmt_bytes(f.free_bytes),
                    fmt_bytes(f.total_bytes),
                    fmt_bytes(f.live_bytes),
                    f.live_count,
                );
                render_frames(&mut out, &f.frames, "        ");
                if let Some(m) = &f.tensors {
                    render_tensor_moment(&mut out, m, Some(f.size));
                }
                if detail && !f.live.is_empty() {
                    let _ = writeln!(out, "      largest allocations live then:");
                    render_items(&mut out, &f.live);
                }
            }
            if d.failures.len() < d.failed_allocations as usize {
                let _ = writeln!(
                    out,
                    "      ... {} more not shown",
                    d.failed_allocations as usize - d.failures.len()
                );
            }
            if d.failed_call_count > 0 {
                let _ = writeln!(
                    out,
                    "    {} failed call(s) that were not out-of-memory:",
                    d.failed_call_count
                );
            }
            for c in &d.failed_calls {
                let label = c
                    .label
                    .as_deref()
                    .map(|l| format!(" in {l}"))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "      at {}: {} of {}: {} ({}){label}",
                    fmt_secs(c.t_s),
                    c.api,
                    fmt_bytes(c.size),
                    c.error,
                    c.result
                );
            }
            if (d.failed_calls.len() as u64) < d.failed_call_count {
                let _ = writeln!(
                    out,
                    "      ... {} more not shown",
                    d.failed_call_count - d.failed_calls.len() as u64
                );
            }
        }
    }
    if let Some(g) = &s.growth {
        let _ = writeln!(out, "growth: {}", g.headline());
    }
    out
}

/// The tensors live at a moment, in their segments; `request`: the failed request's bytes,
/// set against the largest free block.
fn render_tensor_moment(out: &mut String, m: &TensorMoment, request: Option<u64>) {
    let outside = if m.outside_segments_bytes > 0 {
        format!(
            ", {} of them in no recorded segment",
            fmt_bytes(m.outside_segments_bytes)
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "        {} tensors live, {}{outside}; segments {}, of which reserved but unallocated {}; largest free block {}",
        m.tensor_count,
        fmt_bytes(m.tensor_bytes),
        fmt_bytes(m.segment_bytes),
        fmt_bytes(m.unallocated_bytes),
        fmt_bytes(m.largest_free_block),
    );
    if let Some(r) = request {
        let verdict = if m.segment_bytes == 0 {
            "no segment recorded"
        } else if m.largest_free_block >= r {
            "a free block could hold it"
        } else {
            "no free block holds it: a new segment was needed"
        };
        let _ = writeln!(
            out,
            "        the request {} against the largest free block {}: {verdict}",
            fmt_bytes(r),
            fmt_bytes(m.largest_free_block)
        );
    }
    for t in &m.tensors {
        let seg = t
            .segment
            .as_deref()
            .map(|s| format!(" in segment {s}"))
            .unwrap_or_default();
        let name = t
            .tensor
            .as_deref()
            .map(|n| format!(" {n}"))
            .unwrap_or_default();
        let line = t
            .line
            .as_deref()
            .map(|l| format!(" @ {l}"))
            .unwrap_or_default();
        // A restated tensor's time is its restatement's: its allocation was dropped, earlier.
        let when = if t.restated {
            format!(
                "t≤{} (restated: its allocation record was dropped)",
                fmt_secs(t.t_s)
            )
        } else {
            format!("t={}", fmt_secs(t.t_s))
        };
        let _ = writeln!(
            out,
            "        {:>12}  tensor {}{seg} {when}{name}{line}",
            fmt_bytes(t.size),
            t.ptr,
        );
        for f in t.frames.iter().skip(1) {
            let _ = writeln!(out, "            at {f}");
        }
    }
    for sgm in m.segments.iter().filter(|s| s.unallocated_bytes > 0) {
        let _ = writeln!(
            out,
            "        segment {} of {}: {} tensors, {} unallocated, largest free block {}",
            sgm.base,
            fmt_bytes(sgm.size),
            sgm.tensors,
            fmt_bytes(sgm.unallocated_bytes),
            fmt_bytes(sgm.largest_free_block)
        );
    }
}

fn render_items(out: &mut String, items: &[AllocItem]) {
    for i in items {
        let label = match (&i.tensor, &i.label) {
            (Some(t), Some(l)) => format!("{t}  [{l}]"),
            (Some(t), None) => t.clone(),
            (None, Some(l)) => format!("[{l}]"),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "        {:>12}  {:<24} {:<16} t={} {label}",
            fmt_bytes(i.size),
            i.api,
            i.ptr,
            fmt_secs(i.t_s)
        );
        render_frames(out, &i.frames, "            ");
    }
}

fn render_frames(out: &mut String, frames: &[String], indent: &str) {
    for f in frames {
        let _ = writeln!(out, "{indent}at {f}");
    }
}

fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(3)).collect();
        t.push_str("...");
        t
    }
}

#[cfg(test)]
mod capture_tests {
    use super::*;
    use vramtrace_format::{ModuleInfo, Record, TraceFile};

    fn process(records: Vec<Record>) -> crate::trace::Process {
        crate::trace::Process::from_file(TraceFile {
            path: "1.vtr".into(),
            header: Default::default(),
            driver_version: None,
            devices: Vec::new(),
            records,
            problems: Vec::new(),
        })
    }

    fn module(path: &str) -> Record {
        Record::Module(ModuleInfo {
            start: 0x1000,
            end: 0x2000,
            bias: 0,
            path: path.into(),
            build_id: Vec::new(),
        })
    }

    fn note(text: &str) -> Record {
        Record::Note {
            t_ns: 5,
            text: text.into(),
        }
    }

    /// Whether tensors were recorded, from the tensor count, the probe's own note, and the
    /// libraries loaded: every case says one sentence, and a process with no sign of torch
    /// says nothing.
    #[test]
    fn each_process_says_whether_its_tensors_were_recorded() {
        let status = |records, events| tensor_capture(&process(records), events).map(|c| c.status);
        assert_eq!(
            status(
                vec![note(
                    "torch probe: active (torch 2.11.0, caching allocator)"
                )],
                4
            ),
            Some("recorded: 4 tensor events".into())
        );
        assert_eq!(
            status(
                vec![note(
                    "torch probe: not active: this torch (2.11.0+cpu) is built without CUDA; tensors are not recorded"
                )],
                0
            ),
            Some("not recorded: not active: this torch (2.11.0+cpu) is built without CUDA; tensors are not recorded".into())
        );
        assert!(
            status(
                vec![note(
                    "torch probe: active (torch 2.11.0, caching allocator)"
                )],
                0
            )
            .unwrap()
            .starts_with("none: Python with torch and the probe started, but no tensor events")
        );
        assert_eq!(
            status(
                vec![module("/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so")],
                0
            ),
            Some("not recorded: torch is loaded (libc10_cuda.so) but the PyTorch probe never started in this process (run without --no-torch-probe, and keep the PYTHONPATH entry that vramtrace run adds in the environment of the processes it starts)".into())
        );
        assert_eq!(status(vec![module("/usr/lib/libcudart.so.12")], 0), None);
        assert_eq!(status(vec![], 0), None);
        let c = tensor_capture(&process(vec![note("torch probe: active (x)")]), 0).unwrap();
        assert_eq!((c.events, c.probe_started), (0, Some(true)));
    }

    /// One thread's dropped blocks make one range; another thread's overlapping range merges,
    /// a later one stays apart.
    #[test]
    fn lost_ranges_merge_per_thread_then_by_overlap() {
        let r = lost_ranges(
            &[
                (7, 1_000_000_000, 1_500_000_000),
                (7, 1_500_000_100, 2_000_000_000),
                (8, 1_900_000_000, 2_500_000_000),
                (9, 4_000_000_000, 4_500_000_000),
            ],
            0,
        );
        assert_eq!(
            r,
            vec![
                LostRange {
                    from_s: 1.0,
                    to_s: 2.5,
                    blocks: 3
                },
                LostRange {
                    from_s: 4.0,
                    to_s: 4.5,
                    blocks: 1
                }
            ]
        );
    }
}
