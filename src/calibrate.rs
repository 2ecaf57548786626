//! Calibrating an engine's planner from a trace of the same program (`vramtrace model
//! --calibrate TRACE`): the trace's own forwards of transformers' `generate`, found as the report
//! finds its step ([`crate::report::step`]), each with the most bytes PyTorch had allocated to
//! tensors and the most the process held from the driver while it ran; set beside the planner's
//! steps of the same chunk under the same limit, the differences give two terms per forward
//! (bytes per chunk token, bytes per chunk token × context token) and the reserve the replay did
//! not leave ([`vramtrace_models::engine::transformers_5::Calibration`]). The terms then travel
//! to other chunks, limits and contexts; they are never checked on the run they came from.

use std::collections::HashMap;
use std::ops::ControlFlow;

use vramtrace_format::{EventKind, MemKind, TensorAction};
use vramtrace_models::ModelConfig;
use vramtrace_models::engine::PlannedRun;
use vramtrace_models::engine::transformers_5::Calibration;

use crate::categoriser;
use crate::report::step::{GenerateForward, embedding_tokens, generate_forward};
use crate::trace::{Item, Trace};

/// One prefill forward of `generate` as the trace shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedForward {
    /// Its index in the call, counting from 0.
    pub index: u64,
    /// Tokens of its chunk.
    pub chunk_tokens: u64,
    /// Tokens held at its end, its chunk included.
    pub context_tokens: u64,
    /// The most bytes allocated to tensors while it ran.
    pub peak_allocated: u64,
    /// The most bytes the process held from the driver while it ran.
    pub peak_reserved: u64,
}

/// The prefill forwards of the first `generate` call in a trace, those that completed (the one a
/// refusal ended is left out), and the per-process limit PyTorch's refusal names, if one did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedRun {
    /// The forwards.
    pub forwards: Vec<ObservedForward>,
    /// PyTorch's per-process limit, from its refusal.
    pub torch_limit: Option<u64>,
}

/// Reads the forwards of `generate` in `trace` (its first process with any), with `cfg`'s hidden
/// size × dtype giving each chunk's tokens. `None` when the trace shows no prefill of
/// `generate`, or no embedding output of the config's hidden size.
pub fn observe_generate(trace: &Trace, cfg: &ModelConfig) -> crate::Result<Option<ObservedRun>> {
    let per_token = cfg.hidden_size * cfg.dtype.size_bytes();
    if per_token == 0 {
        return Ok(None);
    }
    let mut kinds: HashMap<(usize, u32), Option<GenerateForward>> = HashMap::new();
    let mut tensors: HashMap<(usize, u64), u64> = HashMap::new();
    let mut driver: HashMap<(usize, u64), u64> = HashMap::new();
    let mut allocated: HashMap<usize, u64> = HashMap::new();
    let mut reserved: HashMap<usize, u64> = HashMap::new();
    let mut process: Option<usize> = None;
    let mut forwards: Vec<ObservedForward> = Vec::new();
    let mut torch_limit = None;
    let mut context = 0u64;
    let mut done = false;
    trace.for_each_item(|pi, it| {
        if process.is_some_and(|p| p != pi) {
            return ControlFlow::Continue(());
        }
        match &it {
            Item::Event(e) if e.mem == MemKind::Device => match e.kind {
                EventKind::Alloc => {
                    driver.insert((pi, e.ptr), e.size);
                    *reserved.entry(pi).or_default() += e.size;
                }
                EventKind::Free => {
                    if let Some(b) = driver.remove(&(pi, e.ptr)) {
                        let r = reserved.entry(pi).or_default();
                        *r = r.saturating_sub(b);
                    }
                }
                _ => {}
            },
            Item::Tensor(t) => match t.action {
                TensorAction::Alloc => {
                    let kind = *kinds.entry((pi, t.stack)).or_insert_with(|| {
                        generate_forward(&categoriser::py_frames(&trace.processes[pi], t.stack))
                    });
                    match kind {
                        Some(GenerateForward::Prefill) => {
                            if let Some(tokens) = embedding_tokens(t.size, per_token) {
                                process = Some(pi);
                                context += tokens;
                                forwards.push(ObservedForward {
                                    index: forwards.len() as u64,
                                    chunk_tokens: tokens,
                                    context_tokens: context,
                                    peak_allocated: 0,
                                    peak_reserved: 0,
                                });
                            }
                        }
                        // The first decode step ends the prefill.
                        Some(GenerateForward::Decode) if process == Some(pi) => {
                            done = true;
                            return ControlFlow::Break(());
                        }
                        _ => {}
                    }
                    tensors.insert((pi, t.ptr), t.size);
                    *allocated.entry(pi).or_default() += t.size;
                }
                TensorAction::Free => {
                    if let Some(b) = tensors.remove(&(pi, t.ptr)) {
                        let a = allocated.entry(pi).or_default();
                        *a = a.saturating_sub(b);
                    }
                }
                TensorAction::AllocFailed if process == Some(pi) => {
                    if t.limit > 0 {
                        torch_limit = Some(t.limit);
                    }
                    done = true;
                    return ControlFlow::Break(());
                }
                _ => {}
            },
            _ => {}
        }
        if process == Some(pi)
            && let Some(f) = forwards.last_mut()
        {
            f.peak_allocated = f
                .peak_allocated
                .max(allocated.get(&pi).copied().unwrap_or(0));
            f.peak_reserved = f.peak_reserved.max(reserved.get(&pi).copied().unwrap_or(0));
        }
        ControlFlow::Continue(())
    })?;
    // A forward a refusal ended did not complete; nor, without a decode step after it, is the
    // last one known to have.
    if done && torch_limit.is_some() {
        forwards.pop();
    }
    Ok((!forwards.is_empty()).then_some(ObservedRun {
        forwards,
        torch_limit,
    }))
}

/// The terms that make `planned` (the planner's run of the traced program, at the traced chunk
/// and limit) hold what `observed` held: a least-squares line through each forward's allocated
/// difference against its context (per chunk token, per chunk token × context token), and the
/// median of the reserve the trace held beyond the planner's. Forwards with no mask (the first)
/// and a partial last chunk are left out. `None` with fewer than two forwards to fit.
pub fn fit(observed: &ObservedRun, planned: &PlannedRun, from: &str) -> Option<Calibration> {
    let chunk = observed.forwards.first()?.chunk_tokens;
    let mut points: Vec<(f64, f64, f64)> = Vec::new();
    for o in &observed.forwards {
        if o.index == 0 || o.chunk_tokens != chunk {
            continue;
        }
        let Some(p) = planned.steps.iter().find(|s| s.index == o.index) else {
            continue;
        };
        let alloc = o.peak_allocated as f64 - p.peak_allocated as f64;
        let reserve = (o.peak_reserved as f64 - o.peak_allocated as f64)
            - (p.peak_reserved as f64 - p.peak_allocated as f64);
        points.push((o.context_tokens as f64, alloc, reserve));
    }
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let intercept = my - slope * mx;
    let mut reserves: Vec<f64> = points.iter().map(|p| p.2).collect();
    reserves.sort_by(f64::total_cmp);
    let median = reserves[reserves.len() / 2];
    let c = chunk as f64;
    Some(Calibration {
        per_chunk_token: (intercept / c).max(0.0),
        per_chunk_context_token: (slope / c).max(0.0),
        reserve_held_back: median.max(0.0) as u64,
        from: from.to_string(),
        forwards: points.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtrace_models::Limit;
    use vramtrace_models::engine::PlannedStep;

    #[test]
    fn the_fit_recovers_terms_planted_in_the_forwards() {
        // The trace holds 3 MiB + 100 B per context token more than the planner at every
        // forward, and 40 MiB more reserve; the first forward (no mask) is left out.
        let chunk = 1000u64;
        let steps: Vec<PlannedStep> = (0..6)
            .map(|i| PlannedStep {
                index: i,
                chunk_tokens: chunk,
                context_tokens: (i + 1) * chunk,
                peak_allocated: 5 << 30,
                peak_reserved: 6 << 30,
            })
            .collect();
        let planned = PlannedRun {
            engine: "test",
            limit: Limit::Card { capacity: 1 << 40 },
            limit_bytes: 1 << 40,
            steps: steps.clone(),
            failure: None,
            prompt_tokens: 6 * chunk,
            last_step_parts: Vec::new(),
        };
        let extra = |l: u64| (3 << 20) + 100 * l;
        let observed = ObservedRun {
            forwards: steps
                .iter()
                .map(|s| ObservedForward {
                    index: s.index,
                    chunk_tokens: chunk,
                    context_tokens: s.context_tokens,
                    peak_allocated: s.peak_allocated + extra(s.context_tokens),
                    peak_reserved: s.peak_reserved + extra(s.context_tokens) + (40 << 20),
                })
                .collect(),
            torch_limit: None,
        };
        let k = fit(&observed, &planned, "t").unwrap();
        assert_eq!(k.forwards, 5);
        assert!(
            (k.per_chunk_token * chunk as f64 - (3 << 20) as f64).abs() < 1.0,
            "{k:?}"
        );
        assert!(
            (k.per_chunk_context_token * chunk as f64 - 100.0).abs() < 1e-6,
            "{k:?}"
        );
        assert_eq!(k.reserve_held_back, 40 << 20);
        // One forward after the first is too few to fit a line.
        let short = ObservedRun {
            forwards: observed.forwards[..2].to_vec(),
            torch_limit: None,
        };
        assert_eq!(fit(&short, &planned, "t"), None);
    }
}
