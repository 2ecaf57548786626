//! Flamegraphs of device memory by native stack: an SVG drawn by `inferno`, or the folded
//! stacks behind it (`frame;frame;... bytes`, one line per distinct stack) for `inferno`,
//! `flamegraph.pl` or speedscope.
//!
//! [`export_flamegraph`] weighs each stack by bytes, as [`Weight`] chooses:
//!
//! - [`Weight::Peak`] (the default): the bytes live at each process's and device's peak of
//!   physical device memory, by the stack that allocated them. What fills memory when it is
//!   fullest.
//! - [`Weight::Oom`]: the bytes live when the first allocation failed, on each process and
//!   device that saw a failure. What filled memory when it ran out.
//! - [`Weight::Allocated`]: every byte ever allocated on a device, whether or not it was
//!   released, by stack. Where allocation traffic comes from.
//!
//! Each folded stack starts with the process (`python3[1234]`) and the device (`device 0`;
//! for `oom` also the failed request), then the native frames outermost first (symbolised
//! where the module file on this machine is the one the process loaded, else `module 0xaddr`),
//! and ends with the tensor name or the `[label]` when the allocation had one. Allocations
//! recorded without a stack sit under `<no stack>`.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use vramtrace_format::EventKind;
use vramtrace_models::units::fmt_bytes;

use super::{ExportError, Progress};
use crate::replay::{Capture, LiveAlloc, Pool, Replayer, Step, capture};
use crate::symbolize::StackSymbolizer;
use crate::trace::{Item, Trace};

/// How stacks are weighed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Weight {
    /// Bytes live at each process's and device's peak.
    #[default]
    Peak,
    /// Bytes live at each process's and device's first failed allocation.
    Oom,
    /// Every byte allocated on a device over the whole trace.
    Allocated,
}

/// Options of [`export_flamegraph`].
#[derive(Debug, Clone, Default)]
pub struct FlamegraphOptions {
    /// How stacks are weighed.
    pub weight: Weight,
    /// Write the folded stacks as text instead of an SVG.
    pub folded: bool,
    /// The SVG's title; a default names the weighting.
    pub title: Option<String>,
}

/// Writes the flamegraph (or its folded stacks) of `trace` to `out`; returns the bytes
/// weighed. Fails when nothing is there to weigh (no device allocation; no failure for `oom`).
pub fn export_flamegraph(
    trace: &Trace,
    opts: &FlamegraphOptions,
    out: &mut dyn Write,
    progress: &Progress,
) -> Result<u64, ExportError> {
    let folded = fold(trace, opts.weight, progress)?;
    let total: u64 = folded.values().sum();
    if folded.is_empty() {
        return Err(ExportError::Nothing(match opts.weight {
            Weight::Oom => "the trace has no failed device allocation: nothing to weigh with \
                            --weight oom (try --weight peak)"
                .into(),
            _ => "the trace has no device allocation to weigh".into(),
        }));
    }
    let lines: Vec<String> = folded.iter().map(|(s, b)| format!("{s} {b}")).collect();
    if opts.folded {
        for l in &lines {
            writeln!(out, "{l}")?;
        }
    } else {
        let mut o = inferno::flamegraph::Options::default();
        o.title = opts.title.clone().unwrap_or_else(|| {
            match opts.weight {
                Weight::Peak => "Device memory live at the peak, by allocating stack",
                Weight::Oom => "Device memory live at the first failed allocation",
                Weight::Allocated => "Device memory allocated over the trace, by stack",
            }
            .to_string()
        });
        o.subtitle = Some(format!("{} in all", fmt_bytes(total)));
        o.count_name = "bytes".into();
        inferno::flamegraph::from_lines(&mut o, lines.iter().map(String::as_str), &mut *out)?;
    }
    out.flush()?;
    Ok(total)
}

/// Folded stack → bytes.
fn fold(
    trace: &Trace,
    weight: Weight,
    progress: &Progress,
) -> Result<BTreeMap<String, u64>, ExportError> {
    let mut syms: Vec<StackSymbolizer> = trace.processes.iter().map(StackSymbolizer::new).collect();
    let mut frames: HashMap<(usize, u32), String> = HashMap::new();
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    let mut add = |prefix: &str, a: &LiveAlloc, syms: &mut Vec<StackSymbolizer>| {
        let p = &trace.processes[a.process];
        let stack = frames
            .entry((a.process, a.event.stack))
            .or_insert_with(|| stack_text(&mut syms[a.process], a.event.stack));
        let mut line = format!("{prefix};{stack}");
        if let Some(t) = &a.annotation {
            line.push(';');
            line.push_str(&clean(&p.tensor_name(t)));
        } else if let Some(l) = p.string(a.event.label) {
            line.push_str(&format!(";[{}]", clean(l)));
        }
        *out.entry(line).or_default() += a.size();
    };
    let root = |pi: usize, device: i32| {
        format!(
            "{};device {device}",
            clean(&trace.processes[pi].display_name())
        )
    };
    match weight {
        Weight::Allocated => {
            let mut replay = Replayer::new();
            for (seq, (pi, item)) in trace.items()?.enumerate() {
                if seq % 4096 == 0 {
                    progress.inc(4096);
                }
                if let Item::Event(e) = item
                    && let Step::Allocated { pool: Pool::Device } = replay.apply(pi, seq, &e)
                {
                    let a = LiveAlloc {
                        process: pi,
                        seq,
                        event: e,
                        pool: Pool::Device,
                        annotation: None,
                    };
                    add(&root(pi, e.device), &a, &mut syms);
                }
            }
        }
        Weight::Peak | Weight::Oom => {
            // First pass: where each moment is; second: the live sets there, named.
            let mut wants: Vec<(Capture, String)> = Vec::new();
            let mut replay = Replayer::new();
            for (seq, (pi, item)) in trace.items()?.enumerate() {
                if seq % 4096 == 0 {
                    progress.inc(4096);
                }
                let Item::Event(e) = item else { continue };
                let step = replay.apply(pi, seq, &e);
                if weight == Weight::Oom
                    && step == Step::Failed
                    && e.kind == EventKind::AllocFailed
                    && !wants
                        .iter()
                        .any(|(c, _)| c.process == pi && c.device == e.device)
                {
                    let what = format!(
                        "{};failed {} ({} free)",
                        root(pi, e.device),
                        fmt_bytes(e.size),
                        fmt_bytes(e.free_bytes)
                    );
                    wants.push((cap(seq, pi, e.device), what));
                }
            }
            if weight == Weight::Peak {
                let mut levels: Vec<_> = replay
                    .levels()
                    .filter(|((_, _, pool), l)| *pool == Pool::Device && l.peak > 0)
                    .collect();
                levels.sort_by_key(|(k, _)| *k);
                for ((pi, device, _), l) in levels {
                    wants.push((cap(l.peak_seq, pi, device), root(pi, device)));
                }
            }
            progress.pass("flamegraph: live sets");
            let caps: Vec<Capture> = wants.iter().map(|(c, _)| *c).collect();
            for ((set, _), (_, prefix)) in capture(trace, &caps)?.iter().zip(&wants) {
                for a in set {
                    add(prefix, a, &mut syms);
                }
            }
        }
    }
    Ok(out)
}

fn cap(seq: usize, process: usize, device: i32) -> Capture {
    Capture {
        seq,
        process,
        device,
        pool: Pool::Device,
        top: usize::MAX,
    }
}

/// The frames of a stack outermost first, `;`-joined.
fn stack_text(sym: &mut StackSymbolizer, id: u32) -> String {
    let frames = sym.stack(id);
    if frames.is_empty() {
        return "<no stack>".into();
    }
    let names: Vec<String> = frames
        .iter()
        .rev()
        .map(|f| match &f.function {
            Some(func) => clean(func),
            None => clean(&format!("{} {}", f.module, f.addr)),
        })
        .collect();
    names.join(";")
}

/// A frame name safe in a folded line: `;` separates frames, and a line's last space starts
/// its count; newlines would end it.
fn clean(s: &str) -> String {
    s.replace(';', ":").replace(['\n', '\r'], " ")
}
