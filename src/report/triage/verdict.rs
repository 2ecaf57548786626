//! The verdict on a failure: its class, from the trace alone (other processes, CUDA graphs,
//! fragmentation, KV growth, the context, a limit, else the kernel's live set), and the lines of
//! evidence it rests on; the whole-step model adds lines and never flips the class.

use vramtrace_models::{KnownParts, Limit, StepModel, StepVariants};

use super::refusal::Refusal;
use super::{ModelView, TriageOptions, Verdict, VerdictClass, gib};
use crate::categoriser::{Breakdown, Category, Evidence};
use crate::report::model_view::FitsBasis;
use crate::report::step::StepPosition;

/// The verdict on the refusal `r`: `b` is the failure's breakdown, `step` the failing step and
/// `model` the whole-step model beside it.
pub(super) fn verdict(
    opts: &TriageOptions,
    b: &Breakdown,
    r: &Refusal<'_>,
    step: Option<&StepPosition>,
    model: Option<&ModelView>,
) -> Verdict {
    let fl = r.failure;
    let torch = fl.torch.as_ref();
    let limit = &r.limit.limit;
    let limit_bytes = r.limit.bytes;
    let (total, shortfall, reserve) = (r.total, r.shortfall, r.reserve);
    let (other_in, context_in) = (r.inside.other_process, r.inside.context);
    let largest_free = b
        .segments
        .iter()
        .map(|s| s.largest_free_block)
        .max()
        .unwrap_or(0);
    let kv = b.bytes(Category::KvCache);
    let graphs = b.bytes(Category::CudaGraphs);
    let kv_grows = b.rows.iter().any(|r| {
        r.category == Category::KvCache
            && r.evidence.iter().any(|l| {
                matches!(l.evidence, Evidence::Lifetime { .. })
                    || l.evidence.to_string().contains("kv_cache")
            })
    });
    let chunk_index = step.map(|s| s.chunk_index).unwrap_or(0);
    let mut ev = Vec::new();
    let without_fits = |part: KnownParts| -> Option<bool> {
        let m = model.filter(|m| m.engine.is_none())?;
        let mi = opts.model.as_ref()?;
        let sm = StepModel::new(
            mi.cfg.clone(),
            StepVariants::for_runtime(m.runtime, &mi.cfg),
            part,
        );
        sm.check(&m.shape, limit).ok()?.fits()
    };
    // Only what the limit counts can have made the request not fit under it (PyTorch's
    // per-process limit counts its own segments, not the context or other processes).
    let other_in = if limit.counts(vramtrace_models::Category::OtherProcess) {
        other_in
    } else {
        0
    };
    let context_in = if limit.counts(vramtrace_models::Category::Context) {
        context_in
    } else {
        0
    };
    // The class comes from the trace alone; the model adds lines of evidence and never flips it.
    let class = if other_in > 0 && other_in >= shortfall {
        ev.push(format!(
            "other processes held {} inside the limit, more than the {} the request lacked",
            gib(other_in),
            gib(shortfall)
        ));
        VerdictClass::OtherProcess
    } else if graphs >= shortfall {
        ev.push(format!(
            "CUDA graphs' pools held {} at the failure, more than the {} the request lacked",
            gib(graphs),
            gib(shortfall)
        ));
        VerdictClass::CudaGraphs
    } else if torch.is_some() && reserve >= fl.size && largest_free < fl.size {
        ev.push(format!(
            "{} was free inside PyTorch's segments (reserved {} − allocated {}), more than the {} request, but the largest free block was {}: no segment could serve it",
            gib(reserve),
            gib(torch.map_or(0, |x| x.reserved)),
            gib(torch.map_or(0, |x| x.allocated)),
            gib(fl.size),
            gib(largest_free)
        ));
        if let Some(fits) = without_fits(KnownParts {
            allocator_reserve: None,
            ..model.map(|m| m.known.clone()).unwrap_or_default()
        }) {
            ev.push(format!(
                "the whole-step model {} without that reserve",
                if fits {
                    "fits the same step"
                } else {
                    "still does not fit the step"
                }
            ));
        }
        VerdictClass::Fragmentation
    } else if kv > 0 && chunk_index > 0 && (kv_grows || step.is_some()) {
        ev.push(format!(
            "the KV cache held {} at chunk {chunk_index}{}",
            gib(kv),
            if chunk_index > 0 {
                format!(
                    ", about {} per chunk since the first",
                    gib(kv / (chunk_index + 1))
                )
            } else {
                String::new()
            }
        ));
        if let Some(m) = model {
            ev.push(format!(
                "the model fits a chunk of {} tokens up to a context of {} tokens; this step held {}",
                m.shape.chunk_tokens,
                m.context_frontier.largest_context.unwrap_or(0),
                m.shape.context_tokens
            ));
        }
        VerdictClass::KvGrowth
    } else if context_in > 0
        && context_in.saturating_mul(4) >= limit_bytes
        && context_in >= shortfall
    {
        ev.push(format!(
            "the context, modules and libraries' workspaces took {} of the {} limit",
            gib(context_in),
            gib(limit_bytes)
        ));
        VerdictClass::Context
    } else if limit_bytes < total && !matches!(limit, Limit::Card { .. }) {
        ev.push(format!(
            "the limit, {}, is below what the step needed; the card still had {} free",
            r.limit.source,
            gib(fl.free_bytes)
        ));
        if let Some(m) = model
            && m.context_frontier.largest_context.is_none()
        {
            ev.push(format!(
                "the whole-step model fits no context at a chunk of {} under it: what is resident (weights, state, the context) already takes it",
                m.shape.chunk_tokens
            ));
        }
        VerdictClass::Limit
    } else {
        if fl.size > limit_bytes {
            ev.push(format!(
                "the request alone, {}, is larger than the whole limit of {}: no cache or chunk setting makes it fit",
                gib(fl.size),
                gib(limit_bytes)
            ));
        } else {
            ev.push(format!(
                "the failing step's tensors: {} in activations when the {} request came",
                gib(b.bytes(Category::Activations)),
                gib(fl.size)
            ));
            if let Some(r) = b
                .rows
                .iter()
                .filter(|r| r.category != Category::Activations)
                .max_by_key(|r| r.bytes)
            {
                ev.push(format!(
                    "the largest other part: {} {}{}",
                    r.category.title(),
                    gib(r.bytes),
                    r.evidence
                        .first()
                        .map(|l| format!(" ({})", l.evidence))
                        .unwrap_or_default()
                ));
            }
        }
        VerdictClass::KernelLiveSet
    };
    if matches!(limit, Limit::PerProcessFraction { .. }) && class != VerdictClass::Limit {
        ev.push(format!("under an enforced limit: {}", r.limit.source));
    }
    if let Some(m) = model {
        ev.push(format!(
            "{}: the failing step {} ({} counted against {})",
            m.engine
                .map_or("the whole-step model".to_string(), |e| format!(
                    "the planner of {e} ({})",
                    m.fits_basis.unwrap_or(FitsBasis::Config).words()
                )),
            if m.failure_fits == Some(false) {
                "does not fit"
            } else {
                "fits — a residual the trace must explain"
            },
            gib(m.counted),
            gib(limit_bytes)
        ));
    }
    Verdict {
        class,
        evidence: ev,
    }
}
