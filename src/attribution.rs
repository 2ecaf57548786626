//! Attribution: which observed allocation is which predicted tensor.
//!
//! Given a model's tensor list (in the order the upstream code allocates) and the allocations a
//! trace shows at one moment (a peak, a failed allocation) or over a window, each predicted
//! tensor is matched to at most one observed allocation, in four passes:
//! 1. **label**: an allocation named through the annotation ABI, or made inside a range whose
//!    innermost name is the tensor's name, matches that tensor;
//! 2. **frame and size**: an allocation of the tensor's size with a Python frame in the file the
//!    model cites for it (`chunk_o.py` for fla's `o`);
//! 3. **order and size**: the remaining tensors, in allocation order, take the next remaining
//!    allocation (in time order) of the same size — a kernel allocates in program order;
//! 4. **size**: what is left pairs by equal size regardless of order.
//!
//! An allocation named through the annotation ABI is only ever matched by its name: one named
//! `input g` is not fla's `g (cumsum)`, even though both are fp32 `[T, H]`.
//!
//! Sizes compare after rounding both up to `align` bytes (1 for driver-level traces with
//! PyTorch's caching off; 512 to compare with PyTorch's block sizes). The result lists every
//! tensor with its predicted and observed bytes, and every observed allocation nothing explains.
//!
//! With PyTorch's caching allocator on, the driver sees segments, not tensors. When the chosen
//! process and device have TENSOR records ([`crate::tensors`]), [`observe`] takes the live
//! tensors instead of the driver's allocations: the peak is the peak of live tensor bytes, a
//! failure is the n-th of the allocator's refusals and the driver's failures together (as
//! `summary` numbers them), its request the refused tensor (or the driver's request), and each
//! tensor carries its Python frames, which [`crate::evidence`] weighs.

use serde::Serialize;

use std::ops::ControlFlow;

use vramtrace_format::Event;

use crate::replay::{Capture, FastMap, LiveAlloc, Pool, Replayer, Step, capture};
use crate::tensors::{LiveTensor, TensorReplay, TensorStep};
use crate::trace::{Item, Trace};
use vramtrace_format::{TensorAction, TensorEvent};
use vramtrace_models::Tensor;

/// One allocation seen in a trace, as attribution needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Observed {
    /// Bytes requested.
    pub size: u64,
    /// When it was made (ns, trace clock).
    pub t_ns: u64,
    /// Pointer, hex.
    pub ptr: String,
    /// The driver function.
    pub api: &'static str,
    /// Name given through the annotation ABI.
    pub name: Option<String>,
    /// Range label active when it was made.
    pub label: Option<String>,
    /// True for the request that failed (the moment attributed is its failure).
    pub failed: bool,
    /// Its Python frames, innermost first, as `file.py:LINE function` (the PyTorch probe's own
    /// frames skipped): what [`crate::evidence`] weighs a size match against.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
    /// The operator output it holds (`vramtrace run --torch-shapes`): a description, not a
    /// name, so the allocation is still matched by size and its shape is weighed as evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<OpOutput>,
}

/// An operator's output tensor as the PyTorch probe described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpOutput {
    /// The operator (`empty_like`).
    pub op: String,
    /// PyTorch's dtype name (`bfloat16`), empty if none was given.
    pub dtype: String,
    /// The shape, outermost first.
    pub shape: Vec<i64>,
}

impl OpOutput {
    /// `empty_like [1, 4128, 48, 128] bfloat16`.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(i64::to_string).collect();
        format!("{} [{}] {}", self.op, dims.join(", "), self.dtype)
            .trim_end()
            .to_string()
    }

    /// Whether it has the model tensor's shape and dtype.
    pub fn is_shaped_like(&self, t: &Tensor) -> bool {
        self.shape.len() == t.shape.len()
            && self
                .shape
                .iter()
                .zip(&t.shape)
                .all(|(a, b)| u64::try_from(*a).is_ok_and(|a| a == *b))
            && self.dtype.parse::<vramtrace_models::DType>().ok() == Some(t.dtype)
    }
}

/// What an annotation says of its allocation: a name someone gave it, or the operator output
/// it holds.
fn naming(
    p: &crate::trace::Process,
    a: Option<&vramtrace_format::Annotation>,
) -> (Option<String>, Option<OpOutput>) {
    match a {
        None => (None, None),
        Some(a) if a.op => (
            None,
            Some(OpOutput {
                op: p.string(a.name).unwrap_or("?").to_string(),
                dtype: p.string(a.dtype).unwrap_or("").to_string(),
                shape: a.shape.clone(),
            }),
        ),
        Some(a) => (p.string(a.name).map(str::to_string), None),
    }
}

/// How a tensor was matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchedBy {
    /// Annotation name or range label.
    Label,
    /// Equal size, and a Python frame in the file the model cites for the tensor.
    Frame,
    /// Allocation order and equal size.
    OrderAndSize,
    /// Equal size only.
    Size,
}

/// One predicted tensor beside what was observed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Index in the model's list.
    pub tensor: usize,
    /// Tensor name.
    pub name: String,
    /// Shape as PyTorch prints it.
    pub shape: String,
    /// Element type.
    pub dtype: String,
    /// Predicted bytes.
    pub predicted_bytes: u64,
    /// Whether the model has it live at the model's own peak.
    pub live_at_predicted_peak: bool,
    /// Index into the observed list of the allocation it matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<usize>,
    /// Observed bytes (0 if unmatched).
    pub observed_bytes: u64,
    /// Observed minus predicted (for matched tensors).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difference: Option<i64>,
    /// How it was matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched_by: Option<MatchedBy>,
    /// The upstream line the model cites.
    pub source: String,
    /// What the match rests on (see [`crate::evidence`]); for a tensor left unmatched because
    /// several live allocations look alike, or because the frames show other code, why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<crate::evidence::Evidence>,
}

/// The outcome of matching.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attribution {
    /// Every predicted tensor, in the model's order.
    pub rows: Vec<Row>,
    /// The observed allocations, in time order (the failed request included, if any).
    pub observed: Vec<Observed>,
    /// Indices of observed allocations that matched no tensor.
    pub unexplained: Vec<usize>,
    /// Bytes of live (not failed) observed allocations.
    pub observed_bytes: u64,
    /// Of those, bytes matched to a predicted tensor.
    pub attributed_bytes: u64,
    /// Of those, bytes not matched to the model but named through the annotation ABI.
    pub named_only_bytes: u64,
    /// Of those, bytes neither matched nor named.
    pub unexplained_bytes: u64,
    /// What was compared.
    pub moment: Moment,
    /// The tensor the failed request was for, if the moment is a failure and it matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_tensor: Option<usize>,
    /// Of `attributed_bytes`, what rests on evidence (a name, or a frame in the modelled file)
    /// and what on size and order alone; ambiguous and contradicted matches.
    pub evidence: crate::evidence::EvidenceSummary,
}

impl Attribution {
    /// Share of the observed live bytes that is matched to the model or named.
    pub fn named_fraction(&self) -> f64 {
        if self.observed_bytes == 0 {
            return 1.0;
        }
        (self.attributed_bytes + self.named_only_bytes) as f64 / self.observed_bytes as f64
    }
}

/// Letters and digits only, lower case: `g (cumsum)` and `g_cumsum` compare equal.
fn normalize(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The innermost component of a label or name path (`prefill/layer.3/gdn/o` → `o`).
fn innermost(s: &str) -> &str {
    s.rsplit(['/', ':']).next().unwrap_or(s)
}

fn names_match(tensor: &str, observed: &str) -> bool {
    let t = normalize(tensor);
    !t.is_empty() && (normalize(observed) == t || normalize(innermost(observed)) == t)
}

fn round_up(v: u64, align: u64) -> u64 {
    if align <= 1 {
        v
    } else {
        v.div_ceil(align) * align
    }
}

/// What the observed allocations are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Moment {
    /// The live set at a peak: compared with the tensors live at the model's peak.
    Peak,
    /// The live set at a failed allocation plus the failed request (marked `failed`): compared
    /// with the tensors live just before each tensor the request could be, keeping the best.
    Failure,
    /// Every allocation of a window, live or not: compared with the whole list, in order.
    Window,
}

type Matches = (Vec<Option<(usize, MatchedBy)>>, Vec<bool>);

/// Matches the tensors flagged in `candidates` against `observed`, in the four passes.
fn match_set(
    tensors: &[Tensor],
    candidates: &[bool],
    observed: &[Observed],
    align: u64,
) -> Matches {
    let mut taken: Vec<Option<(usize, MatchedBy)>> = vec![None; tensors.len()];
    let mut used = vec![false; observed.len()];
    let size_ok = |t: &Tensor, o: &Observed| round_up(t.bytes, align) == round_up(o.size, align);
    let open =
        |ti: usize, taken: &[Option<(usize, MatchedBy)>]| candidates[ti] && taken[ti].is_none();

    // 1. Labels: the annotation name first, then the innermost range name, in time order.
    for (oi, o) in observed.iter().enumerate() {
        let Some(label) = o.name.as_deref().or(o.label.as_deref()) else {
            continue;
        };
        if let Some(ti) =
            (0..tensors.len()).find(|&ti| open(ti, &taken) && names_match(&tensors[ti].name, label))
        {
            taken[ti] = Some((oi, MatchedBy::Label));
            used[oi] = true;
        }
    }
    // 2. Frame and size: an allocation made in the file the model cites for the tensor (fla's
    //    `w` and `o` have one size; `wy_fast.py` and `chunk_o.py` tell them apart).
    for ti in 0..tensors.len() {
        if !open(ti, &taken) {
            continue;
        }
        let Some(file) = crate::evidence::python_source_file(tensors[ti].source) else {
            continue;
        };
        if let Some(oi) = (0..observed.len()).find(|&oi| {
            let o = &observed[oi];
            !used[oi]
                && o.name.is_none()
                && size_ok(&tensors[ti], o)
                && o.frames
                    .iter()
                    .any(|f| crate::evidence::frame_file(f) == file)
        }) {
            taken[ti] = Some((oi, MatchedBy::Frame));
            used[oi] = true;
        }
    }
    // 3. Order and size.
    let mut cursor = 0;
    for ti in 0..tensors.len() {
        if !open(ti, &taken) {
            continue;
        }
        if let Some(oi) = (cursor..observed.len()).find(|&oi| {
            !used[oi] && observed[oi].name.is_none() && size_ok(&tensors[ti], &observed[oi])
        }) {
            taken[ti] = Some((oi, MatchedBy::OrderAndSize));
            used[oi] = true;
            cursor = oi + 1;
        }
    }
    // 4. Size alone.
    for ti in 0..tensors.len() {
        if !open(ti, &taken) {
            continue;
        }
        if let Some(oi) = (0..observed.len()).find(|&oi| {
            !used[oi] && observed[oi].name.is_none() && size_ok(&tensors[ti], &observed[oi])
        }) {
            taken[ti] = Some((oi, MatchedBy::Size));
            used[oi] = true;
        }
    }
    (taken, used)
}

fn matched_bytes(observed: &[Observed], used: &[bool]) -> u64 {
    observed
        .iter()
        .zip(used)
        .filter(|(o, u)| **u && !o.failed)
        .map(|(o, _)| o.size)
        .sum()
}

/// The `api` of observations that are blocks of PyTorch's caching allocator (TENSOR records).
pub const PYTORCH_BLOCK_API: &str = "pytorch";

/// PyTorch's caching allocator rounds every block up to this many bytes.
pub const PYTORCH_BLOCK: u64 = 512;

/// Matches `tensors` (model order) against `observed` (time order) at a [`Moment`]. Sizes
/// compare after rounding up to `align` bytes, and to at least [`PYTORCH_BLOCK`] when the
/// observations are PyTorch's blocks.
pub fn attribute(
    tensors: &[Tensor],
    observed: Vec<Observed>,
    align: u64,
    moment: Moment,
) -> Attribution {
    // PyTorch's caching allocator hands out blocks in multiples of 512 bytes: a 16-byte
    // `rng_state` is a 512-byte block.
    let align = if observed.iter().any(|o| o.api == PYTORCH_BLOCK_API) {
        align.max(PYTORCH_BLOCK)
    } else {
        align
    };
    let peak = vramtrace_models::peak(tensors);
    let all = vec![true; tensors.len()];
    let (taken, used) = match moment {
        Moment::Window => match_set(tensors, &all, &observed, align),
        Moment::Peak => {
            let mut c = vec![false; tensors.len()];
            for &i in &peak.live {
                c[i] = true;
            }
            match_set(tensors, &c, &observed, align)
        }
        Moment::Failure => {
            // The request is one of the tensors; the live set is what the model holds just
            // before that tensor is allocated. Try each tensor the request could be.
            let failed: Vec<usize> = (0..observed.len())
                .filter(|&oi| observed[oi].failed)
                .collect();
            let mut best: Option<(u64, Matches)> = None;
            for j in 0..tensors.len() {
                let t = &tensors[j];
                let fits = failed.iter().any(|&oi| {
                    let o = &observed[oi];
                    round_up(o.size, align) == round_up(t.bytes, align)
                        || o.label.as_deref().is_some_and(|l| names_match(&t.name, l))
                });
                if !fits {
                    continue;
                }
                let step = t.alloc_at;
                let mut c: Vec<bool> = tensors
                    .iter()
                    .map(|x| step > 0 && x.is_live_after(step - 1))
                    .collect();
                c[j] = true;
                let m = match_set(tensors, &c, &observed, align);
                let score = matched_bytes(&observed, &m.1)
                    + u64::from(m.0[j].is_some_and(|(oi, _)| observed[oi].failed));
                if best.as_ref().is_none_or(|(b, _)| score > *b) {
                    best = Some((score, m));
                }
            }
            best.map(|(_, m)| m)
                .unwrap_or_else(|| match_set(tensors, &all, &observed, align))
        }
    };

    let rows = tensors
        .iter()
        .enumerate()
        .map(|(ti, t)| {
            let m = taken[ti];
            let observed_bytes = m.map_or(0, |(oi, _)| observed[oi].size);
            Row {
                tensor: ti,
                name: t.name.clone(),
                shape: t.shape_string(),
                dtype: t.dtype.to_string(),
                predicted_bytes: t.bytes,
                live_at_predicted_peak: peak.live.contains(&ti),
                observed: m.map(|(oi, _)| oi),
                observed_bytes,
                difference: m.map(|_| observed_bytes as i64 - t.bytes as i64),
                matched_by: m.map(|(_, how)| how),
                source: t.source.to_string(),
                evidence: None,
            }
        })
        .collect();
    let failed_tensor = taken
        .iter()
        .position(|m| m.is_some_and(|(oi, _)| observed[oi].failed));
    let mut a = Attribution {
        rows,
        unexplained: (0..observed.len()).filter(|&oi| !used[oi]).collect(),
        observed_bytes: 0,
        attributed_bytes: 0,
        named_only_bytes: 0,
        unexplained_bytes: 0,
        failed_tensor,
        moment,
        observed: Vec::new(),
        evidence: Default::default(),
    };
    for (oi, o) in observed.iter().enumerate() {
        if o.failed {
            continue;
        }
        a.observed_bytes += o.size;
        if used[oi] {
            a.attributed_bytes += o.size;
        } else if o.name.is_some() {
            a.named_only_bytes += o.size;
        } else {
            a.unexplained_bytes += o.size;
        }
    }
    a.observed = observed;
    crate::evidence::weigh(&mut a, tensors, align);
    a
}

/// Which moment of a trace to attribute.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum At {
    /// The peak of live device bytes.
    Peak,
    /// The n-th failed allocation (0-based).
    Failure(usize),
    /// Every device allocation made between two times (seconds since the trace began).
    Window(f64, f64),
}

/// The observed side of a moment: the allocations, what they are, and a description.
#[derive(Debug, Clone)]
pub struct ObservedMoment {
    /// The allocations, in time order.
    pub observed: Vec<Observed>,
    /// How they compare with a model.
    pub moment: Moment,
    /// Process id.
    pub pid: u32,
    /// Device ordinal.
    pub device: i32,
    /// Seconds since the trace began.
    pub t_s: f64,
    /// What the moment is, in words.
    pub description: String,
}

/// The request a failed allocation made, as an observation.
fn failed_request(p: &crate::trace::Process, e: &Event) -> Observed {
    Observed {
        size: e.size,
        t_ns: e.t_ns,
        ptr: "(failed)".into(),
        api: e.api.name(),
        name: None,
        label: p.string(e.label).map(str::to_string),
        failed: true,
        frames: crate::tensors::python_frames(p, e.stack, 8),
        op: None,
    }
}

fn observed_of(trace: &Trace, a: &LiveAlloc) -> Observed {
    let p = &trace.processes[a.process];
    let (name, op) = naming(p, a.annotation.as_ref());
    Observed {
        size: a.event.size,
        t_ns: a.event.t_ns,
        ptr: format!("{:#x}", a.event.ptr),
        api: a.event.api.name(),
        name,
        label: p.string(a.event.label).map(str::to_string),
        failed: false,
        frames: crate::tensors::python_frames(p, a.event.stack, 8),
        op,
    }
}

/// A failure seen by `observe`'s first pass: the driver refused a call, or PyTorch's caching
/// allocator refused a tensor (an allocator-raised out-of-memory).
#[derive(Debug, Clone)]
enum Failed {
    Driver(Event),
    Torch(TensorEvent),
}

/// A live tensor as an observation (`note`: the annotation given to it since it was allocated).
fn observed_tensor(
    trace: &Trace,
    t: &LiveTensor,
    note: Option<&vramtrace_format::Annotation>,
) -> Observed {
    let p = &trace.processes[t.process];
    let (name, op) = naming(p, note);
    Observed {
        // What the program asked for: the block can be larger (512-byte granules, unsplit
        // large blocks). Traces recorded before the probe reported it give the block.
        size: if t.event.requested > 0 {
            t.event.requested
        } else {
            t.event.size
        },
        t_ns: t.event.t_ns,
        ptr: format!("{:#x}", t.event.ptr),
        api: PYTORCH_BLOCK_API,
        name,
        label: None,
        failed: false,
        frames: crate::tensors::python_frames(p, t.event.stack, 8),
        op,
    }
}

/// The tensor PyTorch's allocator refused, as an observation.
fn refused_tensor(p: &crate::trace::Process, t: &TensorEvent) -> Observed {
    Observed {
        size: t.size,
        t_ns: t.t_ns,
        ptr: "(failed)".into(),
        api: PYTORCH_BLOCK_API,
        name: None,
        label: None,
        failed: true,
        frames: crate::tensors::python_frames(p, t.stack, 8),
        op: None,
    }
}

/// Replays `trace` through replay index `seq` and returns the tensors of process `pi` and
/// device `dev` live then (time order), each with the annotation given to it since its
/// allocation.
fn tensors_live_at(
    trace: &Trace,
    pi: usize,
    dev: i32,
    seq: usize,
) -> Result<Vec<(LiveTensor, Option<vramtrace_format::Annotation>)>, String> {
    let mut t = TensorReplay::new();
    let mut names: FastMap<u64, vramtrace_format::Annotation> = FastMap::default();
    let mut i = 0usize;
    trace
        .for_each_item(|p, it| {
            if i > seq {
                // Past the moment, the names given to its tensors until the process's next
                // tensor event still count: `--torch-shapes` describes an operator's outputs
                // after the operator returns, so after its last allocation.
                return match &it {
                    Item::Tensor(_) if p == pi => ControlFlow::Break(()),
                    Item::Annotate(a) if p == pi => {
                        names.insert(a.ptr, a.clone());
                        ControlFlow::Continue(())
                    }
                    _ => ControlFlow::Continue(()),
                };
            }
            match &it {
                Item::Tensor(e) => {
                    if p == pi && e.action == TensorAction::Alloc {
                        names.remove(&e.ptr);
                    }
                    t.apply(p, i, e);
                }
                Item::Annotate(a) if p == pi => {
                    names.insert(a.ptr, a.clone());
                }
                _ => {}
            }
            i += 1;
            ControlFlow::Continue(())
        })
        .map_err(|e| e.to_string())?;
    let mut live = t.live_set(pi, dev);
    live.sort_by_key(|x| x.seq);
    Ok(live
        .into_iter()
        .map(|x| {
            let n = names.get(&x.event.ptr).cloned();
            (x, n)
        })
        .collect())
}

/// A candidate peak's live set during `observe`'s first pass.
///
/// A new peak makes the live set then the one to report, and it stays that set until the
/// first release from it (an allocation after it is a newer peak). The copy waits for that
/// release, and the copies together may scan at most as many live entries as the pass has
/// read items, so the pass costs at most twice a plain one; a peak past that budget is taken
/// by a second pass that stops there.
enum PeakCopy {
    /// The live set now is the set at the peak; not copied yet.
    Now,
    /// Copied (every allocation followed for its final name).
    Taken(Vec<LiveAlloc>),
    /// Too costly to copy in the pass.
    Later,
}

/// Extracts the allocations of one moment of one process and device. `pid` and `device` may be
/// left out when the trace has one process (or one with device activity) and one device.
///
/// A streaming pass for the levels, peaks and failures, which at the peak usually also copies
/// the peak's live set; when it could not, and for the other moments, a second pass that stops
/// once the moment's live set is taken and the names of its allocations are final.
pub fn observe(
    trace: &Trace,
    pid: Option<u32>,
    device: Option<i32>,
    at: At,
) -> Result<ObservedMoment, String> {
    let t0 = trace.start_ns();
    // First pass: levels, and the failures up to the one asked for, per process and device.
    let keep = match at {
        At::Failure(n) => n.saturating_add(1),
        _ => 0,
    };
    let mut replay = Replayer::new();
    // Per process and device: the first failures (replay index, request) and how many in all.
    type Failures = (Vec<(usize, Failed)>, usize);
    let mut tensors = TensorReplay::new();
    let mut failures: FastMap<(usize, i32), Failures> = FastMap::default();
    // At the peak, the same pass copies each candidate's live set at its peak when that is
    // cheap (see `PeakCopy`), so a second pass is seldom needed.
    let at_peak = matches!(at, At::Peak);
    let wanted = |pi: usize, d: i32| {
        pid.is_none_or(|p| trace.processes[pi].pid() == p) && device.is_none_or(|x| x == d)
    };
    let mut peaks: FastMap<(usize, i32), PeakCopy> = FastMap::default();
    let mut pending = 0usize; // keys in PeakCopy::Now
    let mut budget = 0usize;
    let mut seq = 0usize;
    trace
        .for_each_item(|pi, it| {
            budget += 1;
            match it {
                Item::Event(e) => {
                    if pending > 0
                        && let Some((dev, Pool::Device)) = replay.would_remove(pi, &e)
                        && let Some(p) = peaks.get_mut(&(pi, dev))
                        && matches!(p, PeakCopy::Now)
                    {
                        // The first change to the set since its peak: copy it now or never.
                        pending -= 1;
                        let cost = replay.live_len();
                        *p = if cost <= budget {
                            budget -= cost;
                            let set = replay.live_set(pi, dev, Pool::Device);
                            set.iter().for_each(|a| replay.follow(a));
                            PeakCopy::Taken(set)
                        } else {
                            PeakCopy::Later
                        };
                    }
                    match replay.apply(pi, seq, &e) {
                        Step::Failed => {
                            let f = failures.entry((pi, e.device)).or_default();
                            if f.0.len() < keep {
                                f.0.push((seq, Failed::Driver(e)));
                            }
                            f.1 += 1;
                        }
                        Step::Allocated { pool: Pool::Device }
                            if at_peak
                                && replay.level(pi, e.device, Pool::Device).peak_seq == seq
                                && wanted(pi, e.device) =>
                        {
                            let p = peaks.entry((pi, e.device)).or_insert(PeakCopy::Later);
                            match std::mem::replace(p, PeakCopy::Now) {
                                PeakCopy::Now => {}
                                PeakCopy::Taken(old) => {
                                    old.iter().for_each(|a| replay.unfollow(a));
                                    pending += 1;
                                }
                                PeakCopy::Later => pending += 1,
                            }
                        }
                        _ => {}
                    }
                }
                Item::Tensor(t) if tensors.apply(pi, seq, &t) == TensorStep::Refused => {
                    let f = failures.entry((pi, t.device)).or_default();
                    if f.0.len() < keep {
                        f.0.push((seq, Failed::Torch(t)));
                    }
                    f.1 += 1;
                }
                // Names given before a copy is taken travel with it; later ones are followed.
                Item::Annotate(a) if at_peak => {
                    replay.annotate(pi, &a);
                }
                _ => {}
            }
            seq += 1;
            ControlFlow::Continue(())
        })
        .map_err(|e| e.to_string())?;
    if let Some(m) = replay.overflow() {
        return Err(m.to_string());
    }
    // Choose the process and device: the highest driver-level peak, else tensor peak.
    let mut highest: FastMap<(usize, i32), (u64, u64)> = FastMap::default();
    for ((pi, d, pool), l) in replay.levels() {
        if pool == Pool::Device {
            highest.entry((pi, d)).or_default().0 = l.peak;
        }
    }
    for ((pi, d), l) in tensors.levels() {
        highest.entry((pi, d)).or_default().1 = l.peak;
    }
    let mut keys: Vec<(usize, i32, (u64, u64))> = highest
        .into_iter()
        .filter(|((pi, d), _)| {
            pid.is_none_or(|p| trace.processes[*pi].pid() == p) && device.is_none_or(|x| x == *d)
        })
        .map(|((pi, d), l)| (pi, d, l))
        .collect();
    keys.sort_by_key(|k| (std::cmp::Reverse(k.2), k.0, k.1));
    let Some(&(pi, dev, _)) = keys.first() else {
        return Err("no device allocation of the chosen process and device is in the trace".into());
    };
    // Blocks with no bytes are what the probe sees with the caching allocator off (the
    // allocator's counters do not move; each tensor is a driver allocation): the driver's
    // allocations are the tensors then.
    if let Some(level) = tensors
        .level_if_any(pi, dev)
        .filter(|l| l.peak > 0 || l.refused > 0)
    {
        return observe_tensors(trace, pi, dev, at, level, failures.remove(&(pi, dev)));
    }
    // The chosen peak's live set if the first pass has it, each allocation with its final
    // name, in time order.
    let copied = match peaks.remove(&(pi, dev)) {
        Some(PeakCopy::Taken(mut set)) => {
            for a in &mut set {
                a.annotation = replay.annotation_of(a.seq).cloned();
            }
            Some(set)
        }
        // Nothing of it was released after the peak: the set at the end is the set then.
        Some(PeakCopy::Now) => Some(replay.live_set(pi, dev, Pool::Device)),
        _ => None,
    }
    .map(|mut set| {
        set.sort_by_key(|a| a.seq);
        set
    });
    let p = &trace.processes[pi];
    // The whole live set of the chosen process and device after replay index `seq`, in time
    // order, each allocation with its final name.
    let live_at = |seq: usize| -> Result<Vec<LiveAlloc>, String> {
        let want = Capture {
            seq,
            process: pi,
            device: dev,
            pool: Pool::Device,
            top: usize::MAX,
        };
        let mut sets = capture(trace, &[want]).map_err(|e| e.to_string())?;
        let mut v = sets.pop().map(|(v, _)| v).unwrap_or_default();
        v.sort_by_key(|a| a.seq);
        Ok(v)
    };
    match at {
        At::Peak => {
            let level = replay.level(pi, dev, Pool::Device);
            let live = match copied {
                Some(set) => set,
                None => live_at(level.peak_seq)?,
            };
            Ok(ObservedMoment {
                observed: live.iter().map(|a| observed_of(trace, a)).collect(),
                moment: Moment::Peak,
                pid: p.pid(),
                device: dev,
                t_s: level.peak_t_ns.saturating_sub(t0) as f64 / 1e9,
                description: format!(
                    "the peak of process {} on device {dev}: {} live",
                    p.pid(),
                    vramtrace_models::units::fmt_bytes(level.peak)
                ),
            })
        }
        At::Failure(n) => {
            let (mine, count) = failures.remove(&(pi, dev)).unwrap_or_default();
            let Some((seq, Failed::Driver(e))) = mine.get(n).cloned() else {
                return Err(format!(
                    "process {} has {count} out-of-memory failure(s) on device {dev}; there is no failure #{n} (calls refused for other reasons, such as CUDA_ERROR_NOT_PERMITTED, are not out-of-memory: `vramtrace summary` lists them)",
                    p.pid(),
                ));
            };
            let mut obs: Vec<Observed> = live_at(seq)?
                .iter()
                .map(|a| observed_of(trace, a))
                .collect();
            obs.push(failed_request(p, &e));
            Ok(ObservedMoment {
                observed: obs,
                moment: Moment::Failure,
                pid: p.pid(),
                device: dev,
                t_s: e.t_ns.saturating_sub(t0) as f64 / 1e9,
                description: format!(
                    "failed allocation #{n} of process {} on device {dev}: {} of {} ({} free of {})",
                    p.pid(),
                    e.api.name(),
                    vramtrace_models::units::fmt_bytes(e.size),
                    vramtrace_models::units::fmt_bytes(e.free_bytes),
                    vramtrace_models::units::fmt_bytes(e.total_bytes)
                ),
            })
        }
        At::Window(from, to) => {
            // `as` saturates a float: a window past the end of time ends at the end of time.
            let ns = |s: f64| t0.saturating_add((s.max(0.0) * 1e9) as u64);
            let (lo, hi) = (ns(from), ns(to));
            // Allocations made in the window (the failed ones as their events), in time order.
            let mut made: Vec<Result<LiveAlloc, Event>> = Vec::new();
            let mut r = Replayer::new();
            let mut seq = 0usize;
            trace
                .for_each_item(|i, it| {
                    let e = match it {
                        Item::Event(e) => e,
                        Item::Annotate(a) => {
                            r.annotate(i, &a);
                            seq += 1;
                            return ControlFlow::Continue(());
                        }
                        other => {
                            seq += 1;
                            return if other.t_ns() > hi && !r.following_live() {
                                ControlFlow::Break(())
                            } else {
                                ControlFlow::Continue(())
                            };
                        }
                    };
                    let step = r.apply(i, seq, &e);
                    if i == pi && e.device == dev && e.t_ns >= lo && e.t_ns <= hi {
                        match step {
                            Step::Allocated { pool: Pool::Device } => {
                                let a = LiveAlloc {
                                    process: pi,
                                    seq,
                                    event: e,
                                    pool: Pool::Device,
                                    annotation: None,
                                };
                                r.follow(&a);
                                made.push(Ok(a));
                            }
                            Step::Failed => made.push(Err(e)),
                            _ => {}
                        }
                    }
                    seq += 1;
                    if e.t_ns > hi && !r.following_live() {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                })
                .map_err(|e| e.to_string())?;
            let obs = made
                .into_iter()
                .map(|m| match m {
                    Ok(mut a) => {
                        a.annotation = r.annotation_of(a.seq).cloned();
                        observed_of(trace, &a)
                    }
                    Err(e) => failed_request(p, &e),
                })
                .collect();
            Ok(ObservedMoment {
                observed: obs,
                moment: Moment::Window,
                pid: p.pid(),
                device: dev,
                t_s: from,
                description: format!(
                    "allocations of process {} on device {dev} from {from} s to {to} s",
                    p.pid()
                ),
            })
        }
    }
}

/// `observe` for a process and device with TENSOR records: the live tensors, not the segments.
fn observe_tensors(
    trace: &Trace,
    pi: usize,
    dev: i32,
    at: At,
    level: crate::tensors::TensorLevel,
    failures: Option<(Vec<(usize, Failed)>, usize)>,
) -> Result<ObservedMoment, String> {
    use vramtrace_models::units::fmt_bytes;
    let t0 = trace.start_ns();
    let p = &trace.processes[pi];
    let as_observed =
        |live: Vec<(LiveTensor, Option<vramtrace_format::Annotation>)>| -> Vec<Observed> {
            live.iter()
                .map(|(t, n)| observed_tensor(trace, t, n.as_ref()))
                .collect()
        };
    match at {
        At::Peak => {
            let observed = as_observed(tensors_live_at(trace, pi, dev, level.peak_seq)?);
            Ok(ObservedMoment {
                moment: Moment::Peak,
                pid: p.pid(),
                device: dev,
                t_s: level.peak_t_ns.saturating_sub(t0) as f64 / 1e9,
                description: format!(
                    "the tensor peak of process {} on device {dev}: {} in {} live tensors of PyTorch's caching allocator",
                    p.pid(),
                    fmt_bytes(level.peak),
                    observed.len()
                ),
                observed,
            })
        }
        At::Failure(n) => {
            let (mine, count) = failures.unwrap_or_default();
            let Some((seq, failed)) = mine.get(n).cloned() else {
                return Err(format!(
                    "process {} has {count} out-of-memory failure(s) on device {dev} (PyTorch's allocator's and the driver's together); there is no failure #{n}",
                    p.pid(),
                ));
            };
            let mut obs = as_observed(tensors_live_at(trace, pi, dev, seq)?);
            let (request, t_ns, description) = match &failed {
                Failed::Torch(t) => (
                    refused_tensor(p, t),
                    t.t_ns,
                    format!(
                        "failed allocation #{n} of process {} on device {dev}: PyTorch's allocator refused {} ({} allocated, {} reserved{}, {} free)",
                        p.pid(),
                        fmt_bytes(t.size),
                        fmt_bytes(t.allocated),
                        fmt_bytes(t.reserved),
                        if t.limit > 0 {
                            format!(", limit {}", fmt_bytes(t.limit))
                        } else {
                            String::new()
                        },
                        fmt_bytes(t.free)
                    ),
                ),
                Failed::Driver(e) => (
                    failed_request(p, e),
                    e.t_ns,
                    format!(
                        "failed allocation #{n} of process {} on device {dev}: {} of {} ({} free of {}), beside the live tensors",
                        p.pid(),
                        e.api.name(),
                        fmt_bytes(e.size),
                        fmt_bytes(e.free_bytes),
                        fmt_bytes(e.total_bytes)
                    ),
                ),
            };
            obs.push(request);
            Ok(ObservedMoment {
                observed: obs,
                moment: Moment::Failure,
                pid: p.pid(),
                device: dev,
                t_s: t_ns.saturating_sub(t0) as f64 / 1e9,
                description,
            })
        }
        At::Window(from, to) => {
            let ns = |s: f64| t0.saturating_add((s.max(0.0) * 1e9) as u64);
            let (lo, hi) = (ns(from), ns(to));
            // Tensors allocated in the window (by replay index) with their names, and refusals.
            let mut made: Vec<
                Result<(TensorEvent, Option<vramtrace_format::Annotation>), TensorEvent>,
            > = Vec::new();
            let mut open: FastMap<u64, usize> = FastMap::default();
            trace
                .for_each_item(|i, it| {
                    if i != pi {
                        return ControlFlow::Continue(());
                    }
                    match it {
                        Item::Tensor(t) if t.device == dev => {
                            let inside = t.t_ns >= lo && t.t_ns <= hi;
                            match t.action {
                                TensorAction::Alloc => {
                                    open.remove(&t.ptr);
                                    if inside {
                                        open.insert(t.ptr, made.len());
                                        made.push(Ok((t, None)));
                                    } else if t.t_ns > hi && open.is_empty() {
                                        return ControlFlow::Break(());
                                    }
                                }
                                TensorAction::Free => {
                                    open.remove(&t.ptr);
                                }
                                TensorAction::AllocFailed if inside => made.push(Err(t)),
                                TensorAction::AllocFailed => {}
                            }
                        }
                        Item::Annotate(a) => {
                            if let Some(&k) = open.get(&a.ptr)
                                && let Ok((_, n)) = &mut made[k]
                            {
                                *n = Some(a);
                            }
                        }
                        _ => {}
                    }
                    ControlFlow::Continue(())
                })
                .map_err(|e| e.to_string())?;
            let obs = made
                .into_iter()
                .enumerate()
                .map(|(k, m)| match m {
                    Ok((event, name)) => {
                        let t = LiveTensor {
                            process: pi,
                            seq: k,
                            event,
                        };
                        observed_tensor(trace, &t, name.as_ref())
                    }
                    Err(t) => refused_tensor(p, &t),
                })
                .collect();
            Ok(ObservedMoment {
                observed: obs,
                moment: Moment::Window,
                pid: p.pid(),
                device: dev,
                t_s: from,
                description: format!(
                    "tensors allocated by process {} on device {dev} from {from} s to {to} s",
                    p.pid()
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtrace_models::{DType, Timeline};

    fn obs(size: u64, t: u64, name: Option<&str>) -> Observed {
        Observed {
            size,
            t_ns: t,
            ptr: format!("{t:#x}"),
            api: "cuMemAlloc_v2",
            name: name.map(str::to_string),
            label: None,
            failed: false,
            frames: Vec::new(),
            op: None,
        }
    }

    fn model() -> Vec<Tensor> {
        let mut tl = Timeline::new();
        let a = tl.alloc("A (fp32)", &[100, 64], DType::F32, "test");
        let _ai = tl.alloc("Ai", &[100, 64], DType::BF16, "test");
        tl.free(a);
        let _w = tl.alloc("w", &[100, 128], DType::BF16, "test");
        let _u = tl.alloc("u", &[100, 128], DType::BF16, "test");
        tl.finish().unwrap()
    }

    #[test]
    fn order_and_size_then_labels() {
        // At the peak the fp32 A (also 25600 bytes) is gone: the two 25600-byte allocations are
        // w and u, in that order; an annotated allocation matches by name.
        let observed = vec![
            obs(12800, 1, Some("Ai")),
            obs(25600, 2, None),
            obs(25600, 3, None),
            obs(999, 4, None),
            obs(4096, 5, Some("input q")),
        ];
        let a = attribute(&model(), observed, 1, Moment::Peak);
        let by_name: Vec<(&str, Option<usize>, Option<MatchedBy>)> = a
            .rows
            .iter()
            .map(|r| (r.name.as_str(), r.observed, r.matched_by))
            .collect();
        assert_eq!(
            by_name,
            vec![
                ("A (fp32)", None, None),
                ("Ai", Some(0), Some(MatchedBy::Label)),
                ("w", Some(1), Some(MatchedBy::OrderAndSize)),
                ("u", Some(2), Some(MatchedBy::OrderAndSize)),
            ]
        );
        assert_eq!(a.unexplained, vec![3, 4]);
        assert_eq!(a.observed_bytes, 12800 + 25600 * 2 + 999 + 4096);
        assert_eq!(a.attributed_bytes, 12800 + 25600 * 2);
        assert_eq!(a.named_only_bytes, 4096);
        assert_eq!(a.unexplained_bytes, 999);
        // The fp32 A is freed before w and u exist: not live at the model's peak.
        assert!(!a.rows[0].live_at_predicted_peak);
        assert!(a.rows[3].live_at_predicted_peak);
    }

    #[test]
    fn failed_request_is_attributed_to_the_tensor_whose_predecessors_are_live() {
        // Live: Ai and w; the failed 25600-byte request is u (not A, not w: the model holds
        // exactly Ai and w just before u).
        let mut observed = vec![
            obs(12800, 2, None),
            obs(25600, 3, None),
            obs(25600, 4, None),
        ];
        observed[2].failed = true;
        let a = attribute(&model(), observed, 1, Moment::Failure);
        assert_eq!(a.failed_tensor, Some(3));
        assert_eq!(a.rows[1].observed, Some(0));
        assert_eq!(a.rows[2].observed, Some(1));
        assert_eq!(a.rows[0].observed, None);
        assert_eq!(a.observed_bytes, 12800 + 25600);
        assert_eq!(a.attributed_bytes, 12800 + 25600);
    }

    #[test]
    fn alignment_rounds_both_sides() {
        let observed = vec![
            obs(25600, 1, None),
            obs(12800, 2, None),
            obs(25600 - 100, 3, None),
        ];
        let exact = attribute(&model(), observed.clone(), 1, Moment::Window);
        assert_eq!(exact.rows[2].observed, None);
        let a = attribute(&model(), observed, 512, Moment::Window);
        assert_eq!(a.rows[2].observed, Some(2));
        assert_eq!(a.rows[2].difference, Some(-100));
    }

    #[test]
    fn a_named_allocation_is_never_taken_for_another_tensor_of_its_size() {
        // The caller's own g is fp32 [T, H] like fla's g cumsum; only the unnamed one is the
        // kernel's.
        let mut tl = Timeline::new();
        tl.alloc("g (cumsum)", &[100, 4], DType::F32, "test");
        let model = tl.finish().unwrap();
        let observed = vec![obs(1600, 1, Some("input g")), obs(1600, 2, None)];
        let a = attribute(&model, observed, 1, Moment::Window);
        assert_eq!(a.rows[0].observed, Some(1));
        assert_eq!(a.named_only_bytes, 1600);
        assert_eq!(a.unexplained_bytes, 0);
    }

    #[test]
    fn names_normalise() {
        assert!(names_match("g (cumsum)", "g_cumsum"));
        assert!(names_match("o", "prefill/layer.3/gdn/o"));
        assert!(!names_match("v", "v_new"));
    }
}
