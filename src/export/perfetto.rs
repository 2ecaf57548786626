//! Chrome trace event JSON, for the Perfetto UI (ui.perfetto.dev: "Open trace file") and
//! `chrome://tracing`.
//!
//! [`export_perfetto`] writes the JSON object form of the Trace Event Format
//! (`{"traceEvents": [...], "displayTimeUnit": "ns"}`), `ts` and `dur` in microseconds since
//! the trace's start (the earliest process's start), with:
//!
//! - **Counters** (`"ph": "C"`): one track per process, device and bucket, named
//!   `live bytes: device 0` (`live bytes: host`, `live bytes: managed 0`, ...), whose `bytes`
//!   value is what is live after each change. Buckets are separate tracks: they are never summed.
//! - **Allocation lifetimes** (`"ph": "X"`): one slice per allocation, from its allocation to
//!   its release, named by its tensor name, else the label active when it was made, else the
//!   driver function; `args` hold `size`, `ptr`, `api`, `device`, `label`, `stream`,
//!   `stack_id`. Lifetimes overlap without nesting, so each process puts them on lanes (pseudo
//!   threads named `device 0 allocations`), a lane taken by at most one allocation at a time.
//!   What is still live when the trace ends closes there with `"live_at_end": true`.
//! - **Tensors** (when PyTorch's are recorded; see [`crate::torch_replay`]): a counter track per
//!   process and device, `tensor bytes: device 0`, whose args are the live tensor bytes of each
//!   category ([`super::CATEGORIES`] by [`super::category_of_stack`]: the allocation's frames,
//!   the range label open at it and the tensor's name; a name given later moves its bytes then), stacked in
//!   `chrome://tracing`, one track per category in Perfetto; and a slice per tensor, from its
//!   allocation to its free, on lanes of their own (`device 0 tensors`), named by the tensor's
//!   name, else its Python line (`chunk_o.py:565 chunk_fwd_o`), else `tensor`; `args` hold
//!   `size`, `requested`, `ptr`, `category`, `line`, `label`, `stack_id`. The segments are the
//!   driver's allocation slices and `live bytes` counters above: tensor bytes are inside them,
//!   never added to them.
//! - **Failures** (`"ph": "i"`, process scope): `alloc failed: 1.00 GiB` with the request, the
//!   free and total memory the driver reported, the driver function and result.
//! - **Ranges and marks** on the threads that pushed them (`"B"`/`"E"`, `"i"`).
//! - **Growth** ([`crate::growth`], a pass of its own after the others): a counter track per
//!   line of the growth analysis, `growth: <where> (device 0)`, whose `bytes` are the line's
//!   live bytes at each bucket's start (its low-water mark), with `bytes_per_hour` and the
//!   line's verdict in the first sample's args; and an instant `growth: leak` (or `plateau`,
//!   `none`) at the steady state's start with the run's rate and evidence.
//! - **Names** (`"ph": "M"`): `process_name` and `thread_name` metadata.
//!
//! Events are written as the trace streams, not sorted (the format does not ask for it);
//! memory follows the live set.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::Write;

use serde_json::{Value, json};
use vramtrace_format::EventKind;
use vramtrace_models::units::fmt_bytes;

use super::{ExportError, Progress, rel_us};
use crate::replay::{LiveAlloc, Pool, Replayer, Step};
use crate::trace::{Item, Trace};

/// What [`export_perfetto`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerfettoCounts {
    /// Counter samples.
    pub counters: u64,
    /// Allocation lifetime slices.
    pub slices: u64,
    /// Failed allocations.
    pub failures: u64,
    /// Tensor counter samples.
    pub tensor_counters: u64,
    /// Tensor lifetime slices.
    pub tensor_slices: u64,
    /// Growth counter samples (one per line of the growth analysis and bucket).
    pub growth_counters: u64,
}

/// A live tensor as the export follows it.
struct LiveTensor {
    t_ns: u64,
    size: u64,
    requested: u64,
    stack: u32,
    lane: i64,
    category: usize,
    label: Option<String>,
    name: Option<String>,
}

/// The live tensor bytes of one process and device, by category.
type ByCategory = [u64; super::CATEGORIES.len()];

fn category_index(
    p: &crate::trace::Process,
    stack: u32,
    size: u64,
    label: Option<&str>,
    name: Option<&str>,
) -> usize {
    let c = super::category_of_stack(p, stack, size, label, name);
    super::CATEGORIES
        .iter()
        .position(|x| *x == c)
        .unwrap_or(super::CATEGORIES.len() - 1)
}

/// First pseudo thread id of the allocation lanes: above any kernel thread id (Linux's
/// `pid_max` is at most 2^22).
const LANE_BASE: i64 = 1 << 30;

/// The lanes' bucket index of tensors (after the driver's buckets).
const TENSOR_LANES: i64 = 6;

fn pool_index(p: Pool) -> i64 {
    match p {
        Pool::Device => 0,
        Pool::Managed => 1,
        Pool::Host => 2,
        Pool::Address => 3,
        Pool::Mapped => 4,
        Pool::Imported => 5,
    }
}

fn track_name(pool: Pool, device: i32) -> String {
    if device < 0 {
        pool.name().to_string()
    } else {
        format!("{} {device}", pool.name())
    }
}

/// Lanes of one process, device and bucket: the lowest free one is taken first.
#[derive(Default)]
struct Lanes {
    free: BinaryHeap<Reverse<i64>>,
    next: i64,
}

struct Writer<'w> {
    out: &'w mut dyn Write,
    first: bool,
    buf: Vec<u8>,
}

impl Writer<'_> {
    fn event(&mut self, v: &Value) -> Result<(), ExportError> {
        self.buf.clear();
        if !self.first {
            self.buf.extend_from_slice(b",\n");
        }
        self.first = false;
        serde_json::to_writer(&mut self.buf, v).map_err(std::io::Error::from)?;
        self.out.write_all(&self.buf)?;
        Ok(())
    }
}

/// Writes `trace` as Chrome trace event JSON to `out`.
pub fn export_perfetto(
    trace: &Trace,
    out: &mut dyn Write,
    progress: &Progress,
) -> Result<PerfettoCounts, ExportError> {
    let start = trace.start_ns();
    let mut n = PerfettoCounts::default();
    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
    let mut w = Writer {
        out,
        first: true,
        buf: Vec::with_capacity(512),
    };
    for p in &trace.processes {
        let name = format!("{} {}", p.display_name(), p.header.cmdline.join(" "));
        w.event(
            &json!({"ph": "M", "name": "process_name", "pid": p.pid(), "tid": 0,
                        "args": {"name": name.trim_end()}}),
        )?;
    }
    let mut replay = Replayer::new();
    let mut lanes: HashMap<(usize, i32, Pool), Lanes> = HashMap::new();
    // The lane of every live allocation, by (process, replay index of its allocation).
    let mut lane_of: HashMap<(usize, usize), i64> = HashMap::new();
    let mut named_lanes: std::collections::HashSet<(usize, i64)> = Default::default();
    let mut tensor_lanes: HashMap<(usize, i32), Lanes> = HashMap::new();
    let mut tensors: HashMap<(usize, u64), (i32, LiveTensor)> = HashMap::new();
    let mut tensor_bytes: HashMap<(usize, i32), ByCategory> = HashMap::new();
    let mut ranges = super::RangePaths::default();
    let mut last_t = start;
    for (seq, (pi, item)) in trace.items()?.enumerate() {
        if seq % 4096 == 0 {
            progress.inc(4096);
        }
        let p = &trace.processes[pi];
        let pid = p.pid();
        last_t = last_t.max(item.t_ns());
        let ts = rel_us(start, item.t_ns());
        match item {
            Item::Event(e) => match replay.apply(pi, seq, &e) {
                Step::Allocated { pool } => {
                    let key = (pi, e.device, pool);
                    let l = lanes.entry(key).or_default();
                    let lane = match l.free.pop() {
                        Some(Reverse(x)) => x,
                        None => {
                            l.next += 1;
                            l.next - 1
                        }
                    };
                    let tid = LANE_BASE
                        + (pool_index(pool) * 1024 + i64::from(e.device + 1)) * 65_536
                        + lane;
                    if named_lanes.insert((pi, tid)) {
                        let name = format!("{} allocations", track_name(pool, e.device));
                        w.event(&json!({"ph": "M", "name": "thread_name", "pid": pid,
                                        "tid": tid, "args": {"name": name}}))?;
                        w.event(&json!({"ph": "M", "name": "thread_sort_index", "pid": pid,
                                        "tid": tid, "args": {"sort_index": tid}}))?;
                    }
                    lane_of.insert((pi, seq), tid);
                    counter(&mut w, &replay, pi, pid, e.device, pool, ts)?;
                    n.counters += 1;
                }
                Step::Released { freed: Some(a), .. } => {
                    if let Some(tid) = lane_of.remove(&(pi, a.seq)) {
                        slice(&mut w, trace, &a, tid, start, e.t_ns, false)?;
                        n.slices += 1;
                        free_lane(&mut lanes, &a, tid);
                    }
                    counter(&mut w, &replay, pi, pid, a.event.device, a.pool, ts)?;
                    n.counters += 1;
                }
                Step::Failed => {
                    let mut args = json!({"size": e.size, "free_bytes": e.free_bytes,
                        "total_bytes": e.total_bytes, "api": e.api.name(), "result": e.result,
                        "device": e.device});
                    if let Some(l) = p.string(e.label) {
                        args["label"] = l.into();
                    }
                    if e.stack != 0 {
                        args["stack_id"] = e.stack.into();
                    }
                    w.event(&json!({"ph": "i", "s": "p", "cat": "failure",
                        "name": format!("alloc failed: {}", fmt_bytes(e.size)),
                        "pid": pid, "tid": e.tid, "ts": ts, "args": args}))?;
                    n.failures += 1;
                }
                Step::Released { freed: None, .. } | Step::Unchanged => {
                    if e.kind == EventKind::FreeFailed {
                        w.event(&json!({"ph": "i", "s": "t", "cat": "failure",
                            "name": format!("{} failed", e.api.name()), "pid": pid,
                            "tid": e.tid, "ts": ts,
                            "args": {"ptr": format!("{:#x}", e.ptr), "result": e.result}}))?;
                    }
                }
            },
            Item::Annotate(a) => {
                replay.annotate(pi, &a);
                if let Some((device, t)) = tensors.get_mut(&(pi, a.ptr)) {
                    let name = p.tensor_name(&a);
                    let c = category_index(p, t.stack, t.size, t.label.as_deref(), Some(&name));
                    t.name = Some(name);
                    if c != t.category {
                        let by = tensor_bytes.entry((pi, *device)).or_default();
                        by[t.category] -= t.size;
                        by[c] += t.size;
                        t.category = c;
                        tensor_counter(&mut w, by, pid, *device, ts)?;
                        n.tensor_counters += 1;
                    }
                }
            }
            Item::RangePush { tid, name, .. } => {
                ranges.follow(trace, pi, &item);
                let name = p.string(name).unwrap_or("?");
                w.event(&json!({"ph": "B", "cat": "range", "name": name, "pid": pid,
                                "tid": tid, "ts": ts}))?;
            }
            Item::RangePop { tid, .. } => {
                ranges.follow(trace, pi, &item);
                w.event(&json!({"ph": "E", "cat": "range", "pid": pid, "tid": tid, "ts": ts}))?;
            }
            Item::Mark { tid, name, .. } => {
                let name = p.string(name).unwrap_or("?");
                w.event(&json!({"ph": "i", "s": "t", "cat": "mark", "name": name,
                                "pid": pid, "tid": tid, "ts": ts}))?;
            }
            // Tensors live inside segments the driver events already show; an allocator OOM
            // is a failure of its own.
            Item::Tensor(t) if t.action == vramtrace_format::TensorAction::AllocFailed => {
                w.event(&json!({"ph": "i", "s": "p", "cat": "failure",
                    "name": format!("PyTorch allocator OOM: {}", fmt_bytes(t.size)),
                    "pid": pid, "tid": t.tid, "ts": ts,
                    "args": {"size": t.size, "allocated": t.allocated, "reserved": t.reserved,
                             "limit": t.limit, "free_bytes": t.free, "device": t.device}}))?;
                n.failures += 1;
            }
            // A restatement of a tensor already live (a flight record at a failure, or the
            // ring's restatement of a dropped allocation) changes nothing; one not seen yet (its
            // allocation record was dropped) starts it here.
            Item::Tensor(t)
                if t.action == vramtrace_format::TensorAction::Live
                    && tensors.contains_key(&(pi, t.ptr)) => {}
            Item::Tensor(t)
                if matches!(
                    t.action,
                    vramtrace_format::TensorAction::Alloc | vramtrace_format::TensorAction::Live
                ) =>
            {
                let l = tensor_lanes.entry((pi, t.device)).or_default();
                let lane = l.take();
                let tid =
                    LANE_BASE + (TENSOR_LANES * 1024 + i64::from(t.device + 1)) * 65_536 + lane;
                if named_lanes.insert((pi, tid)) {
                    let name = format!("device {} tensors", t.device);
                    w.event(&json!({"ph": "M", "name": "thread_name", "pid": pid,
                                    "tid": tid, "args": {"name": name}}))?;
                    w.event(&json!({"ph": "M", "name": "thread_sort_index", "pid": pid,
                                    "tid": tid, "args": {"sort_index": tid}}))?;
                }
                let label = ranges.label(pi, t.tid);
                let category = category_index(p, t.stack, t.size, label.as_deref(), None);
                let live = LiveTensor {
                    t_ns: t.t_ns,
                    size: t.size,
                    requested: t.requested,
                    stack: t.stack,
                    lane: tid,
                    category,
                    label,
                    name: None,
                };
                let by = tensor_bytes.entry((pi, t.device)).or_default();
                by[category] += t.size;
                if let Some((d, old)) = tensors.insert((pi, t.ptr), (t.device, live)) {
                    // Handed out again: a free that was not recorded ends the old one here.
                    let by = tensor_bytes.entry((pi, d)).or_default();
                    by[old.category] -= old.size;
                    tensor_slice(&mut w, p, t.ptr, &old, start, t.t_ns, false)?;
                    n.tensor_slices += 1;
                    if let Some(l) = tensor_lanes.get_mut(&(pi, d)) {
                        l.give_back(old.lane);
                    }
                }
                let by = tensor_bytes.entry((pi, t.device)).or_default();
                tensor_counter(&mut w, by, pid, t.device, ts)?;
                n.tensor_counters += 1;
            }
            Item::Tensor(t) => {
                if let Some((d, old)) = tensors.remove(&(pi, t.ptr)) {
                    let by = tensor_bytes.entry((pi, d)).or_default();
                    by[old.category] -= old.size;
                    tensor_counter(&mut w, by, pid, d, ts)?;
                    n.tensor_counters += 1;
                    tensor_slice(&mut w, p, t.ptr, &old, start, t.t_ns, false)?;
                    n.tensor_slices += 1;
                    if let Some(l) = tensor_lanes.get_mut(&(pi, d)) {
                        l.give_back(old.lane);
                    }
                }
            }
        }
    }
    // Tensors still live close where the trace ends.
    let mut left: Vec<((usize, u64), (i32, LiveTensor))> = tensors.into_iter().collect();
    left.sort_by_key(|((pi, _), (_, t))| (*pi, t.t_ns, t.lane));
    for ((pi, ptr), (_, t)) in left {
        tensor_slice(&mut w, &trace.processes[pi], ptr, &t, start, last_t, true)?;
        n.tensor_slices += 1;
    }
    // What is still live closes where the trace ends.
    let mut keys: Vec<(usize, i32, Pool)> = replay.levels().map(|(k, _)| k).collect();
    keys.sort();
    for (pi, device, pool) in keys {
        let mut live = replay.live_set(pi, device, pool);
        live.sort_by_key(|a| a.seq);
        for a in live {
            if let Some(tid) = lane_of.get(&(pi, a.seq)) {
                slice(&mut w, trace, &a, *tid, start, last_t, true)?;
                n.slices += 1;
            }
        }
    }
    progress.pass("perfetto: growth");
    if let Some(g) = crate::growth::of_trace(trace)? {
        n.growth_counters = growth_counters(&mut w, &g)?;
    }
    w.out.write_all(b"\n]}\n")?;
    w.out.flush()?;
    Ok(n)
}

/// The growth analysis's lines as counter tracks and its verdict as an instant.
fn growth_counters(w: &mut Writer<'_>, g: &crate::growth::Growth) -> Result<u64, ExportError> {
    let mut n = 0;
    for l in &g.lines {
        let name = format!("growth: {} (device {})", l.place, l.device);
        for (i, (t_s, bytes)) in g.series.t_s.iter().zip(&l.live_series).enumerate() {
            let mut args = json!({"bytes": bytes});
            if i == 0 {
                args["bytes_per_hour"] = l.bytes_per_hour.into();
                args["verdict"] = serde_json::to_value(l.verdict).unwrap_or(Value::Null);
            }
            w.event(
                &json!({"ph": "C", "name": name, "pid": l.pid, "ts": t_s * 1e6,
                            "args": args}),
            )?;
            n += 1;
        }
    }
    if let Some(pid) = g.lines.first().map(|l| l.pid) {
        w.event(
            &json!({"ph": "i", "s": "p", "name": format!("growth: {}", g.verdict.key()),
                        "pid": pid, "tid": 0, "ts": g.steady_from_s * 1e6,
                        "args": {"rate_bytes_per_hour": g.rate_bytes_per_hour,
                                 "evidence": g.evidence}}),
        )?;
    }
    Ok(n)
}

impl Lanes {
    /// The lowest free lane.
    fn take(&mut self) -> i64 {
        match self.free.pop() {
            Some(Reverse(x)) => x,
            None => {
                self.next += 1;
                self.next - 1
            }
        }
    }

    /// Frees the lane of the pseudo thread `tid`.
    fn give_back(&mut self, tid: i64) {
        self.free.push(Reverse((tid - LANE_BASE) % 65_536));
    }
}

fn tensor_counter(
    w: &mut Writer<'_>,
    by: &ByCategory,
    pid: u32,
    device: i32,
    ts: f64,
) -> Result<(), ExportError> {
    let args: serde_json::Map<String, Value> = super::CATEGORIES
        .iter()
        .zip(by)
        .map(|(c, b)| (c.to_string(), (*b).into()))
        .collect();
    w.event(
        &json!({"ph": "C", "name": format!("tensor bytes: device {device}"),
                    "pid": pid, "ts": ts, "args": args}),
    )
}

fn tensor_slice(
    w: &mut Writer<'_>,
    p: &crate::trace::Process,
    ptr: u64,
    t: &LiveTensor,
    start: u64,
    end_ns: u64,
    live_at_end: bool,
) -> Result<(), ExportError> {
    let line = crate::torch_replay::python_locations(p, t.stack)
        .into_iter()
        .next()
        .map(|l| l.to_string());
    let name = t
        .name
        .clone()
        .or_else(|| line.clone())
        .unwrap_or_else(|| "tensor".into());
    let mut args = json!({"size": t.size, "ptr": format!("{ptr:#x}"),
                          "category": super::CATEGORIES[t.category]});
    if t.requested != 0 {
        args["requested"] = t.requested.into();
    }
    if let Some(l) = line {
        args["line"] = l.into();
    }
    if let Some(l) = &t.label {
        args["label"] = l.clone().into();
    }
    if t.stack != 0 {
        args["stack_id"] = t.stack.into();
    }
    if live_at_end {
        args["live_at_end"] = true.into();
    }
    let ts = rel_us(start, t.t_ns);
    let dur = end_ns.saturating_sub(t.t_ns) as f64 / 1000.0;
    w.event(
        &json!({"ph": "X", "cat": "tensor", "name": name, "pid": p.pid(),
                    "tid": t.lane, "ts": ts, "dur": dur, "args": args}),
    )
}

fn free_lane(lanes: &mut HashMap<(usize, i32, Pool), Lanes>, a: &LiveAlloc, tid: i64) {
    if let Some(l) = lanes.get_mut(&(a.process, a.event.device, a.pool)) {
        l.free.push(Reverse((tid - LANE_BASE) % 65_536));
    }
}

fn counter(
    w: &mut Writer<'_>,
    replay: &Replayer,
    pi: usize,
    pid: u32,
    device: i32,
    pool: Pool,
    ts: f64,
) -> Result<(), ExportError> {
    let live = replay.level(pi, device, pool).live;
    w.event(
        &json!({"ph": "C", "name": format!("live bytes: {}", track_name(pool, device)),
                    "pid": pid, "ts": ts, "args": {"bytes": live}}),
    )
}

fn slice(
    w: &mut Writer<'_>,
    trace: &Trace,
    a: &LiveAlloc,
    tid: i64,
    start: u64,
    end_ns: u64,
    live_at_end: bool,
) -> Result<(), ExportError> {
    let p = &trace.processes[a.process];
    let e = &a.event;
    let label = p.string(e.label);
    let name = match &a.annotation {
        Some(t) => p.tensor_name(t),
        None => label.unwrap_or(e.api.name()).to_string(),
    };
    let mut args = json!({"size": e.size, "ptr": format!("{:#x}", e.ptr), "api": e.api.name(),
                          "device": e.device});
    if let Some(l) = label {
        args["label"] = l.into();
    }
    if e.stream != 0 {
        args["stream"] = format!("{:#x}", e.stream).into();
    }
    if e.stack != 0 {
        args["stack_id"] = e.stack.into();
    }
    if live_at_end {
        args["live_at_end"] = true.into();
    }
    let ts = rel_us(start, e.t_ns);
    let dur = end_ns.saturating_sub(e.t_ns) as f64 / 1000.0;
    w.event(
        &json!({"ph": "X", "cat": a.pool.name(), "name": name, "pid": p.pid(),
                    "tid": tid, "ts": ts, "dur": dur, "args": args}),
    )
}
