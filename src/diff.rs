//! Peak and live-set differences between two traces (two vLLM versions, two chunk sizes): per
//! device ordinal, each trace's peak (the process with the highest peak on that ordinal), the
//! live sets at the two peaks grouped by category (the categoriser's, by frames, labels and
//! names), by name and label pattern and by their top symbolised frames, each group with A bytes, B bytes and the difference, largest differences first; and
//! the failed allocations of each. With tensor records, the tensors live at each trace's tensor
//! peak by Python line and by tensor (operator, shape pattern, dtype and line).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::error::Error;
use crate::names::pattern;
use crate::summary::{AllocItem, SummaryOptions, summarize};
use crate::symbolize::StackSymbolizer;
use crate::trace::Trace;
use vramtrace_models::units::{fmt_bytes, fmt_secs};

/// Frames of a stack that make its group by default.
pub const DEFAULT_FRAMES: usize = 4;

/// One trace's peak on a device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    /// The process with the highest peak on this ordinal.
    pub pid: u32,
    /// Its program (the command line's first word, without the directory).
    pub program: String,
    /// The device's name, as that process reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// Peak live device bytes.
    pub peak_bytes: u64,
    /// When, in seconds since that trace began.
    pub peak_t_s: f64,
    /// Allocations live at the peak.
    pub peak_live_count: usize,
    /// Failed allocations of every process on this ordinal.
    pub failures: Vec<FailureLine>,
    /// Failed calls that are not out of memory, of every process on this ordinal.
    pub failed_calls: u64,
}

/// A failed allocation, in one line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailureLine {
    /// Process.
    pub pid: u32,
    /// Seconds since the trace began.
    pub t_s: f64,
    /// Driver function.
    pub api: &'static str,
    /// Bytes asked for.
    pub size: u64,
    /// Free bytes the driver reported.
    pub free_bytes: u64,
    /// Label then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// One group's bytes in both traces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The group: `name [label]` with numbers collapsed, or the top frames.
    pub key: String,
    /// Bytes at A's peak.
    pub a_bytes: u64,
    /// Allocations at A's peak.
    pub a_count: usize,
    /// Bytes at B's peak.
    pub b_bytes: u64,
    /// Allocations at B's peak.
    pub b_count: usize,
    /// B − A.
    pub difference: i128,
}

/// The difference on one device ordinal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceDiff {
    /// Ordinal.
    pub device: i32,
    /// A's peak (`None`: A allocated nothing on this ordinal).
    pub a: Option<Side>,
    /// B's peak.
    pub b: Option<Side>,
    /// B's peak − A's peak.
    pub peak_difference: i128,
    /// By category: the categoriser's rows at each peak ([`crate::categoriser::breakdown_at`]:
    /// tensors by frames, labels and lifetimes, the allocator's reserve), largest differences
    /// first.
    pub by_category: Vec<Row>,
    /// By name and label pattern, largest differences first.
    pub by_label: Vec<Row>,
    /// By the top frames of the stack, largest differences first.
    pub by_stack: Vec<Row>,
    /// The tensors live at each trace's tensor peak (PyTorch's caching allocator, traces with
    /// tensor records) by their Python line, largest differences first; empty without tensors.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_line: Vec<Row>,
    /// The same tensors by operator, shape pattern and dtype (`empty [#, #] bf16`, numbers
    /// collapsed to #) and their Python line.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_tensor: Vec<Row>,
}

/// The whole difference.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diff {
    /// Per ordinal, in order.
    pub devices: Vec<DeviceDiff>,
}

/// Options of [`diff`].
#[derive(Debug, Clone, Copy)]
pub struct DiffOptions {
    /// Frames of each stack that make its group.
    pub frames: usize,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            frames: DEFAULT_FRAMES,
        }
    }
}

/// The key of an allocation by name and label.
pub fn label_key(a: &AllocItem) -> String {
    let name = a.tensor.as_deref().map(crate::report::tensor_name);
    match (name, a.label.as_deref()) {
        (Some(n), Some(l)) => format!("{} [{}]", pattern(n), pattern(l)),
        (Some(n), None) => pattern(n),
        (None, Some(l)) => format!("(unnamed) [{}]", pattern(l)),
        (None, None) => "(unnamed, no label)".into(),
    }
}

struct Peak {
    side: Side,
    by_category: BTreeMap<String, (u64, usize)>,
    by_label: BTreeMap<String, (u64, usize)>,
    by_stack: BTreeMap<String, (u64, usize)>,
    by_line: BTreeMap<String, (u64, usize)>,
    by_tensor: BTreeMap<String, (u64, usize)>,
}

/// The line of a tensor as grouped: its Python line, or a placeholder.
fn line_key(t: &crate::torch_replay::TensorItem) -> String {
    t.line.clone().unwrap_or_else(|| "(no Python frame)".into())
}

fn peaks(trace: &Trace, opts: DiffOptions) -> Result<BTreeMap<i32, Peak>, Error> {
    let s = summarize(
        trace,
        SummaryOptions {
            top: usize::MAX,
            frames: 0,
        },
    )?;
    let mut best: BTreeMap<i32, (usize, usize)> = BTreeMap::new();
    let mut failures: BTreeMap<i32, (Vec<FailureLine>, u64)> = BTreeMap::new();
    for (pi, p) in s.processes.iter().enumerate() {
        for (di, d) in p.devices.iter().enumerate() {
            let f = failures.entry(d.device).or_default();
            f.0.extend(d.failures.iter().map(|x| FailureLine {
                pid: p.pid,
                t_s: x.t_s,
                api: x.api,
                size: x.size,
                free_bytes: x.free_bytes,
                label: x.label.clone(),
            }));
            f.1 += d.failed_call_count;
            if d.peak_bytes == 0 && d.failures.is_empty() {
                continue;
            }
            let e = best.entry(d.device).or_insert((pi, di));
            if d.peak_bytes > s.processes[e.0].devices[e.1].peak_bytes {
                *e = (pi, di);
            }
        }
    }
    let mut out = BTreeMap::new();
    for (dev, (pi, di)) in best {
        let p = &s.processes[pi];
        let d = &p.devices[di];
        let mut sym = StackSymbolizer::new(&trace.processes[pi]);
        let mut by_category: BTreeMap<String, (u64, usize)> = BTreeMap::new();
        let mut by_label: BTreeMap<String, (u64, usize)> = BTreeMap::new();
        let mut by_stack: BTreeMap<String, (u64, usize)> = BTreeMap::new();
        let mut stacks: BTreeMap<u32, String> = BTreeMap::new();
        for a in &d.peak_live {
            let e = by_label.entry(label_key(a)).or_default();
            e.0 = e.0.saturating_add(a.size);
            e.1 += 1;
            let key = stacks
                .entry(a.stack)
                .or_insert_with(|| {
                    if a.stack == 0 {
                        return "(no stack)".into();
                    }
                    // Addresses differ between runs: only named frames can match across traces.
                    let frames: Vec<String> = sym
                        .stack(a.stack)
                        .iter()
                        .filter(|f| f.function.is_some())
                        .take(opts.frames)
                        .map(|f| f.to_string())
                        .collect();
                    if frames.is_empty() {
                        "(not symbolised on this machine)".into()
                    } else {
                        frames.join(" ← ")
                    }
                })
                .clone();
            let e = by_stack.entry(key).or_default();
            e.0 = e.0.saturating_add(a.size);
            e.1 += 1;
        }
        // Every byte of the peak in the categoriser's rows (tensors, lifetimes, reserve).
        if let Some(at) = crate::categoriser::peak(trace, pi, dev)? {
            let b = crate::categoriser::breakdown_at(
                trace,
                at,
                crate::categoriser::Expectations::default(),
            )?;
            for r in b.rows {
                by_category.insert(r.category.title().to_string(), (r.bytes, r.count));
            }
        }
        // The tensors at the tensor peak, by line and by tensor.
        let mut by_line: BTreeMap<String, (u64, usize)> = BTreeMap::new();
        let mut by_tensor: BTreeMap<String, (u64, usize)> = BTreeMap::new();
        if let Some(m) = d.tensors.as_ref().and_then(|t| t.at_peak.as_ref()) {
            for t in &m.tensors {
                let line = line_key(t);
                let what = t.tensor.as_deref().map_or("tensor".into(), pattern);
                for (map, key) in [
                    (&mut by_line, line.clone()),
                    (&mut by_tensor, format!("{what} @ {line}")),
                ] {
                    let e = map.entry(key).or_default();
                    e.0 = e.0.saturating_add(t.size);
                    e.1 += 1;
                }
            }
        }
        let (mut fl, calls) = failures.remove(&dev).unwrap_or_default();
        fl.sort_by(|a, b| a.t_s.total_cmp(&b.t_s).then(a.pid.cmp(&b.pid)));
        out.insert(
            dev,
            Peak {
                side: Side {
                    pid: p.pid,
                    program: p
                        .command
                        .first()
                        .map(|c| c.rsplit('/').next().unwrap_or(c).to_string())
                        .unwrap_or_else(|| "?".into()),
                    device_name: d.name.clone(),
                    peak_bytes: d.peak_bytes,
                    peak_t_s: d.peak_t_s,
                    peak_live_count: d.peak_live_count,
                    failures: fl,
                    failed_calls: calls,
                },
                by_category,
                by_label,
                by_stack,
                by_line,
                by_tensor,
            },
        );
    }
    Ok(out)
}

fn rows(
    a: Option<&BTreeMap<String, (u64, usize)>>,
    b: Option<&BTreeMap<String, (u64, usize)>>,
) -> Vec<Row> {
    let empty = BTreeMap::new();
    let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out: Vec<Row> = keys
        .into_iter()
        .map(|k| {
            let (ab, ac) = a.get(k).copied().unwrap_or((0, 0));
            let (bb, bc) = b.get(k).copied().unwrap_or((0, 0));
            Row {
                key: k.clone(),
                a_bytes: ab,
                a_count: ac,
                b_bytes: bb,
                b_count: bc,
                difference: i128::from(bb) - i128::from(ab),
            }
        })
        .collect();
    out.sort_by(|x, y| {
        y.difference
            .unsigned_abs()
            .cmp(&x.difference.unsigned_abs())
            .then(y.a_bytes.max(y.b_bytes).cmp(&x.a_bytes.max(x.b_bytes)))
            .then(x.key.cmp(&y.key))
    });
    out
}

/// The difference between trace `a` and trace `b`.
pub fn diff(a: &Trace, b: &Trace, opts: DiffOptions) -> Result<Diff, Error> {
    let mut pa = peaks(a, opts)?;
    let mut pb = peaks(b, opts)?;
    let mut devs: Vec<i32> = pa.keys().chain(pb.keys()).copied().collect();
    devs.sort_unstable();
    devs.dedup();
    let devices = devs
        .into_iter()
        .map(|dev| {
            let (x, y) = (pa.remove(&dev), pb.remove(&dev));
            let peak = |p: &Option<Peak>| p.as_ref().map_or(0, |p| p.side.peak_bytes);
            DeviceDiff {
                device: dev,
                peak_difference: i128::from(peak(&y)) - i128::from(peak(&x)),
                by_category: rows(
                    x.as_ref().map(|p| &p.by_category),
                    y.as_ref().map(|p| &p.by_category),
                ),
                by_label: rows(
                    x.as_ref().map(|p| &p.by_label),
                    y.as_ref().map(|p| &p.by_label),
                ),
                by_stack: rows(
                    x.as_ref().map(|p| &p.by_stack),
                    y.as_ref().map(|p| &p.by_stack),
                ),
                by_line: rows(
                    x.as_ref().map(|p| &p.by_line),
                    y.as_ref().map(|p| &p.by_line),
                ),
                by_tensor: rows(
                    x.as_ref().map(|p| &p.by_tensor),
                    y.as_ref().map(|p| &p.by_tensor),
                ),
                a: x.map(|p| p.side),
                b: y.map(|p| p.side),
            }
        })
        .collect();
    Ok(Diff { devices })
}

fn signed(d: i128) -> String {
    let mag = fmt_bytes(d.unsigned_abs().min(u128::from(u64::MAX)) as u64);
    match d.signum() {
        1 => format!("+{mag}"),
        -1 => format!("-{mag}"),
        _ => "0 B".into(),
    }
}

fn side_line(name: &str, s: &Option<Side>) -> String {
    match s {
        None => format!("  {name}: nothing allocated on this device\n"),
        Some(s) => {
            let mut l = format!(
                "  {name}: pid {} {}, peak {} ({} B) at {} in {} allocations",
                s.pid,
                s.program,
                fmt_bytes(s.peak_bytes),
                s.peak_bytes,
                fmt_secs(s.peak_t_s),
                s.peak_live_count
            );
            if !s.failures.is_empty() {
                let _ = write!(l, "; {} failed allocation(s)", s.failures.len());
            }
            if s.failed_calls > 0 {
                let _ = write!(l, "; {} failed call(s) not out of memory", s.failed_calls);
            }
            l.push('\n');
            for f in &s.failures {
                let _ = writeln!(
                    l,
                    "     failed: pid {} at {}: {} of {} ({} B), {} free{}",
                    f.pid,
                    fmt_secs(f.t_s),
                    f.api,
                    fmt_bytes(f.size),
                    f.size,
                    fmt_bytes(f.free_bytes),
                    f.label
                        .as_deref()
                        .map(|x| format!(", in {x}"))
                        .unwrap_or_default()
                );
            }
            l
        }
    }
}

fn table(out: &mut String, title: &str, rows: &[Row], top: usize) {
    let _ = writeln!(out, "  {:>16} {:>16} {:>13}  {title}", "A", "B", "B - A");
    for r in rows.iter().take(top) {
        let _ = writeln!(
            out,
            "  {:>16} {:>16} {:>13}  {}",
            format!("{} x{}", fmt_bytes(r.a_bytes), r.a_count),
            format!("{} x{}", fmt_bytes(r.b_bytes), r.b_count),
            signed(r.difference),
            r.key
        );
    }
    if rows.len() > top {
        let rest = &rows[top..];
        let d: i128 = rest.iter().map(|r| r.difference).sum();
        let _ = writeln!(
            out,
            "  {:>16} {:>16} {:>13}  ({} more groups)",
            "",
            "",
            signed(d),
            rest.len()
        );
    }
}

/// The difference as text: per device, the two peaks, then the `top` largest differences by
/// label and by stack.
pub fn render(d: &Diff, a_name: &str, b_name: &str, top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A: {a_name}\nB: {b_name}");
    if d.devices.is_empty() {
        let _ = writeln!(out, "\nNeither trace allocated device memory.");
    }
    for dev in &d.devices {
        let name = dev
            .a
            .as_ref()
            .and_then(|s| s.device_name.clone())
            .or_else(|| dev.b.as_ref().and_then(|s| s.device_name.clone()))
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        let _ = writeln!(out, "\ncuda:{}{name}", dev.device);
        out.push_str(&side_line("A", &dev.a));
        out.push_str(&side_line("B", &dev.b));
        let _ = writeln!(
            out,
            "  peak B - A: {} ({} B)\n",
            signed(dev.peak_difference),
            dev.peak_difference
        );
        table(
            &mut out,
            "at the peak, by category (the categoriser's rows)",
            &dev.by_category,
            top,
        );
        let _ = writeln!(out);
        table(
            &mut out,
            "live at the peak, by name [label] (# = any number)",
            &dev.by_label,
            top,
        );
        let _ = writeln!(out);
        table(
            &mut out,
            "live at the peak, by stack (top frames)",
            &dev.by_stack,
            top,
        );
        if !dev.by_line.is_empty() {
            let _ = writeln!(out);
            table(
                &mut out,
                "tensors at the tensor peak, by Python line",
                &dev.by_line,
                top,
            );
            let _ = writeln!(out);
            table(
                &mut out,
                "tensors at the tensor peak, by tensor (# = any number) @ line",
                &dev.by_tensor,
                top,
            );
        }
    }
    out
}
