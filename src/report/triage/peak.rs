//! The triage of a run where nothing failed: the moment of the highest peak ([`peak_moment`]),
//! its view, and with a model the whole-step model's peak beside it ([`no_failure`]).

use std::ops::ControlFlow;

use super::config_check::config_contradiction;
use super::whole_step::peak_model;
use super::{PeakView, Triage, TriageOptions, gib};
use crate::categoriser::{At, Breakdown, Category};
use crate::report::step::{batch_step_at, step_at_peak};
use crate::torch_replay::TensorReplay;
use crate::trace::{Item, Trace};

/// The moment of the highest peak of one process and device: its highest device bytes and,
/// among the moments at that level (a peak is a plateau under a caching allocator), the one
/// where PyTorch's live tensors were highest — the step's own peak. The moment, its time and
/// the live tensor bytes then.
pub(super) fn peak_moment(
    trace: &Trace,
    process: usize,
    device: i32,
) -> crate::Result<Option<(At, u64, u64)>> {
    let mut r = crate::replay::Replayer::new();
    // PyTorch's live tensors (a restatement counts as the allocation the ring dropped).
    let mut tensors = TensorReplay::new();
    let mut best: Option<(u64, u64, usize, u64)> = None;
    let mut i = 0usize;
    trace.for_each_item(|pi, it| {
        let mine = pi == process;
        match &it {
            Item::Event(e) => {
                r.apply(pi, i, e);
            }
            Item::Tensor(t) if mine && t.device == device => {
                tensors.apply(pi, i, t);
            }
            _ => {}
        }
        if mine {
            let level = r.level(process, device, crate::replay::Pool::Device).live;
            let live = tensors.level(process, device).live;
            if level > 0 && best.is_none_or(|(l, tb, _, _)| (level, live) > (l, tb)) {
                best = Some((level, live, i, it.t_ns()));
            }
        }
        i += 1;
        ControlFlow::Continue(())
    })?;
    Ok(best.map(|(_, tb, seq, t_ns)| {
        (
            At {
                process,
                device,
                seq,
            },
            t_ns,
            tb,
        )
    }))
}

/// The triage of a run where nothing failed: the peak, its categories, and with a model the
/// whole-step model's peak beside the observed one, part by part, and its frontier.
#[allow(clippy::too_many_arguments)]
pub(super) fn no_failure(
    trace: &Trace,
    opts: &TriageOptions,
    t: &mut Triage,
    at: At,
    b: &Breakdown,
    t_ns: u64,
    tensors: u64,
) -> crate::Result<()> {
    let p = &trace.processes[at.process];
    let unnamed = b.bytes(Category::Unnamed);
    let named = b.total.saturating_sub(unnamed);
    let percent = |x: u64| {
        if b.total == 0 {
            0.0
        } else {
            100.0 * x as f64 / b.total as f64
        }
    };
    t.peak = Some(PeakView {
        pid: p.pid(),
        device: at.device,
        t_s: t_ns.saturating_sub(trace.start_ns()) as f64 / 1e9,
        bytes: b.total,
        tensor_bytes: tensors,
        named_bytes: named,
        named_percent: percent(named),
        moment: "the process's highest device bytes; of the moments at that level, the one with the most live PyTorch tensors (the step's own peak)".into(),
    });
    t.verdict.evidence.push(format!(
        "no allocation failed; the highest peak, {}, has {:.2}% of its bytes in a named category",
        gib(b.total),
        percent(named)
    ));
    let Some(m) = &opts.model else {
        return Ok(());
    };
    t.step = match batch_step_at(trace, at, Some(&m.cfg))? {
        Some(s) => Some(s),
        None => step_at_peak(trace, at, &m.cfg)?,
    };
    match peak_model(trace, opts, m, t, b) {
        Ok(v) => {
            t.model_warning = config_contradiction(trace, at.process, b, &v, &m.cfg)?;
            t.model = Some(v);
        }
        Err(e) => t.model_error = Some(e.to_string()),
    }
    Ok(())
}
