//! The observed side of an attribution: the allocations live at one moment of a trace (a peak,
//! the n-th failed allocation) or made over a window, each with its name, range label, Python
//! frames and operator description, in time order ([`observe`]).
//!
//! With PyTorch's caching allocator on, the driver sees segments, not tensors. When the chosen
//! process and device have TENSOR records ([`crate::torch_replay`]) holding bytes, [`observe`] takes
//! the live tensors instead of the driver's allocations: the peak is the peak of live tensor
//! bytes, a failure is the n-th of the allocator's refusals and the driver's failures together
//! (as `summary` numbers them), its request the refused tensor (or the driver's request), and
//! each tensor carries its Python frames, which [`crate::attribution::weigh`] weighs.

use crate::Error;
use std::ops::ControlFlow;

use vramtrace_format::{Event, TensorAction, TensorEvent};

use crate::attribution::{Moment, Observed, OpOutput, PYTORCH_BLOCK_API};
use crate::replay::{Capture, FastMap, LiveAlloc, Pool, Replayer, Step, capture};
use crate::torch_replay::{LiveTensor, TensorReplay, TensorStep};
use crate::trace::{Item, Trace};

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

/// The innermost Python frames of a stack (at most 8, the probe's own skipped) as
/// `file.py:LINE function`, and the path of each: what an observation carries for
/// [`crate::attribution::weigh`] to weigh against the model's citation.
pub(crate) fn python_frames(p: &crate::trace::Process, stack: u32) -> (Vec<String>, Vec<String>) {
    crate::torch_replay::python_locations(p, stack)
        .into_iter()
        .take(8)
        .map(|l| (l.to_string(), l.file))
        .unzip()
}

/// The request a failed allocation made, as an observation.
fn failed_request(p: &crate::trace::Process, e: &Event) -> Observed {
    let (frames, frame_files) = python_frames(p, e.stack);
    Observed {
        size: e.size,
        t_ns: e.t_ns,
        ptr: "(failed)".into(),
        api: e.api.name(),
        name: None,
        label: p.string(e.label).map(str::to_string),
        failed: true,
        frames,
        frame_files,
        op: None,
    }
}

fn observed_of(trace: &Trace, a: &LiveAlloc) -> Observed {
    observed_alloc(&trace.processes[a.process], a)
}

/// A live driver allocation of process `p` as an observation (also the live view's tensor
/// table, [`crate::forecast`]).
pub(crate) fn observed_alloc(p: &crate::trace::Process, a: &LiveAlloc) -> Observed {
    let (name, op) = naming(p, a.annotation.as_ref());
    let (frames, frame_files) = python_frames(p, a.event.stack);
    Observed {
        size: a.event.size,
        t_ns: a.event.t_ns,
        ptr: format!("{:#x}", a.event.ptr),
        api: a.event.api.name(),
        name,
        label: p.string(a.event.label).map(str::to_string),
        failed: false,
        frames,
        frame_files,
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
    let (frames, frame_files) = python_frames(p, t.event.stack);
    live_tensor(p, &t.event, note, frames, frame_files)
}

/// A live tensor of process `p` as an observation, with its Python frames and their paths
/// (read once per stack by the caller; also the live view's tensor table, [`crate::forecast`]).
pub(crate) fn live_tensor(
    p: &crate::trace::Process,
    t: &TensorEvent,
    note: Option<&vramtrace_format::Annotation>,
    frames: Vec<String>,
    frame_files: Vec<String>,
) -> Observed {
    let (name, op) = naming(p, note);
    Observed {
        // What the program asked for: the block can be larger (512-byte granules, unsplit
        // large blocks). Traces recorded before the probe reported it give the block.
        size: if t.requested > 0 { t.requested } else { t.size },
        t_ns: t.t_ns,
        ptr: format!("{:#x}", t.ptr),
        api: PYTORCH_BLOCK_API,
        name,
        label: None,
        failed: false,
        frames,
        frame_files,
        op,
    }
}

/// The tensor PyTorch's allocator refused, as an observation.
fn refused_tensor(p: &crate::trace::Process, t: &TensorEvent) -> Observed {
    let (frames, frame_files) = python_frames(p, t.stack);
    Observed {
        size: t.size,
        t_ns: t.t_ns,
        ptr: "(failed)".into(),
        api: PYTORCH_BLOCK_API,
        name: None,
        label: None,
        failed: true,
        frames,
        frame_files,
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
) -> Result<Vec<(LiveTensor, Option<vramtrace_format::Annotation>)>, Error> {
    let mut t = TensorReplay::new();
    let mut names: FastMap<u64, vramtrace_format::Annotation> = FastMap::default();
    let mut i = 0usize;
    trace.for_each_item(|p, it| {
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
    })?;
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
) -> Result<ObservedMoment, Error> {
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
    trace.for_each_item(|pi, it| {
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
    })?;
    replay.check_overflow()?;
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
        return Err(Error::NoDeviceAllocation);
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
    let live_at = |seq: usize| -> Result<Vec<LiveAlloc>, Error> {
        let want = Capture {
            seq,
            process: pi,
            device: dev,
            pool: Pool::Device,
            top: usize::MAX,
        };
        let mut sets = capture(trace, &[want])?;
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
                return Err(Error::NoSuchFailure {
                    pid: p.pid(),
                    device: dev,
                    index: n,
                    count,
                    with_tensors: false,
                });
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
            trace.for_each_item(|i, it| {
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
            })?;
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
    level: crate::torch_replay::TensorLevel,
    failures: Option<(Vec<(usize, Failed)>, usize)>,
) -> Result<ObservedMoment, Error> {
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
                return Err(Error::NoSuchFailure {
                    pid: p.pid(),
                    device: dev,
                    index: n,
                    count,
                    with_tensors: true,
                });
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
            trace.for_each_item(|i, it| {
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
                            TensorAction::AllocFailed | TensorAction::Live => {}
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
            })?;
            let obs = made
                .into_iter()
                .enumerate()
                .map(|(k, m)| match m {
                    Ok((event, name)) => {
                        let t = LiveTensor {
                            process: pi,
                            seq: k,
                            event,
                            restated: false,
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
