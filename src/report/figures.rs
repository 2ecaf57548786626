//! The report's own plots, as view models (`vramtrace-view-model`) for the viewer: the
//! breakdown as one stacked capacity bar against the enforced limit (weights, KV, state,
//! activations, reserve, context, free) with the failing request overhanging it, and the
//! whole-step cliff in two panels (the context at the step's chunk, the chunk at the failing
//! context), the failure marked.

use vramtrace_models::{Limit, StepModel, StepVariants};
use vramtrace_view_model::{CapacityBar, CapacityPart, CliffPanel, CliffPanels};

use crate::categoriser::Category;
use crate::report::Report;

/// Points per cliff panel.
const CURVE_POINTS: u64 = 48;

fn limit_label(l: &Limit) -> &'static str {
    match l {
        Limit::Card { .. } => "card",
        Limit::GpuMemoryUtilization { .. } => "--gpu-memory-utilization",
        Limit::PerProcessFraction { .. } => "PyTorch's per-process limit",
    }
}

/// The capacity bar at the first failure; `None` without one.
pub fn capacity_bar(r: &Report) -> Option<CapacityBar> {
    let t = r.triage.as_ref()?;
    let f = r.first_failure()?;
    let limit = t.limit.as_ref()?;
    let b = t.breakdown.as_ref()?;
    let inside = t.inside_limit;
    let mut parts = Vec::new();
    for c in Category::ALL {
        let bytes = match (c, inside) {
            (Category::OtherProcess, Some(i)) => i.other_process,
            (Category::Context, Some(i)) => i.context,
            _ => b.bytes(c),
        };
        // What the limit does not count (PyTorch's counts its own segments only: not the
        // context, libraries' own allocations, other processes) is not drawn against it.
        // Unnamed bytes are drawn: in a PyTorch process they are tensors no rule names.
        let counted = c == Category::Unnamed || limit.limit.counts(c);
        if bytes == 0 || !counted {
            continue;
        }
        parts.push(CapacityPart {
            label: c.title().to_string(),
            bytes,
        });
    }
    let used: u64 = parts.iter().map(|p| p.bytes).sum();
    if limit.bytes > used {
        parts.push(CapacityPart {
            label: "free".into(),
            bytes: limit.bytes - used,
        });
    }
    Some(CapacityBar {
        title: format!(
            "{}: the first failure ({:.3} s), cuda:{}",
            r.title, f.failure.t_s, f.device
        ),
        limit_bytes: limit.bytes,
        limit_label: limit_label(&limit.limit).to_string(),
        parts,
        request: Some(CapacityPart {
            label: format!(
                "the refused request{}",
                t.tipping
                    .as_ref()
                    .and_then(|x| x.line.as_deref())
                    .map(|l| format!(" at {l}"))
                    .unwrap_or_default()
            ),
            bytes: f.failure.size,
        }),
    })
}

/// Evenly spaced points from `lo` to `hi` (both included).
fn spaced(lo: u64, hi: u64) -> Vec<u64> {
    let hi = hi.max(lo);
    let mut v: Vec<u64> = (0..=CURVE_POINTS)
        .map(|i| lo + (hi - lo) * i / CURVE_POINTS)
        .collect();
    v.dedup();
    v
}

/// The whole-step cliff; `None` without the whole-step model beside a failure or a peak.
pub fn cliff_panels(r: &Report) -> Option<crate::Result<CliffPanels>> {
    let t = r.triage.as_ref()?;
    let m = t.model.as_ref()?;
    let mi = r.model.as_ref()?;
    // Beside a failure, its enforced limit and the failing step marked; at a peak without one,
    // the limit the frontier was computed against and no mark.
    let (limit, limit_bytes, failing) = match (&t.limit, &m.peak_fit) {
        (Some(l), _) => (l.limit, l.bytes, true),
        (None, Some(fit)) => (fit.limit, fit.limit.bytes().ok()?, false),
        (None, None) => return None,
    };
    let model = StepModel::new(
        mi.cfg.clone(),
        StepVariants::for_runtime(m.runtime, &mi.cfg),
        m.known.clone(),
    );
    let chunk = m.shape.chunk_tokens;
    let context = m.shape.context_tokens;
    let go = || -> crate::Result<CliffPanels> {
        let frontier_ctx = m.context_frontier.largest_context;
        let hi_ctx = context.max(frontier_ctx.unwrap_or(0)).saturating_mul(5) / 4;
        let floor = m.chunk_frontier.floor.multiple.max(1);
        let chunks: Vec<u64> = spaced(1, chunk.saturating_mul(3) / 2)
            .into_iter()
            .map(|c| c.div_ceil(floor) * floor)
            .filter(|&c| c <= context)
            .collect::<std::collections::BTreeSet<u64>>()
            .into_iter()
            .collect();
        let (ctx_curve, chunk_curve, curve_label) = match m.engine {
            // The planner's own curves: what it holds at each step of its run, and the most it
            // holds over a run of each chunk to the failing context.
            Some(engine) => {
                let settings = m.planner.ok_or_else(|| {
                    crate::Error::Invalid("a planner's view carries its settings".into())
                })?;
                let (ctx, chk) = crate::report::engine_view::transformers_curves(
                    &mi.cfg, settings, chunk, context, hi_ctx, &limit, &chunks,
                )?;
                (ctx, chk, format!("the planner of {engine}"))
            }
            None => {
                let contexts = spaced(chunk, hi_ctx.max(chunk * 2));
                (
                    model.context_curve(&m.shape, &limit, &contexts)?,
                    model.chunk_curve(&m.shape, &limit, &chunks)?,
                    "whole-step model".to_string(),
                )
            }
        };
        Ok(CliffPanels {
            title: format!(
                "{} ({}): the step against the {} of {}",
                mi.cfg.display_name(),
                m.runtime.name(),
                limit_label(&limit),
                vramtrace_models::units::fmt_bytes(limit_bytes)
            ),
            limit_bytes,
            limit_label: limit_label(&limit).to_string(),
            curve_label,
            failure_label: match m.fits_basis {
                Some(crate::report::model_view::FitsBasis::TracedSegments) => {
                    "the failing step, with this run's segments at its start".to_string()
                }
                _ => "the failing step".to_string(),
            },
            panels: vec![
                CliffPanel {
                    x_desc: format!("context tokens at a chunk of {chunk}"),
                    curve: ctx_curve,
                    frontier: frontier_ctx,
                    failure: failing.then_some((context, m.counted)),
                },
                CliffPanel {
                    x_desc: format!("chunk tokens at a context of {context}"),
                    curve: chunk_curve,
                    frontier: m.chunk_frontier.largest_chunk,
                    failure: failing.then_some((chunk, m.counted)),
                },
            ],
        })
    };
    Some(go())
}
