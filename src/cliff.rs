//! What the models predict for a trace, in one place: which variant to set beside a moment
//! (the candidate filter and the best-variant choice), the peak of each variant at a token
//! count, and the cliff (the first token count whose peak passes a budget).
//!
//! `compare`, `plot`, `model` and the report's levers all go through here, so the three of
//! them choose the same variant and find the same cliff.
//!
//! This cliff is one kernel's: its peak against what is resident. A failure is judged by the
//! whole step instead (weights, the KV cache at the context, state, the largest layer, the
//! parts a trace gives): `vramtrace_models::StepModel`'s frontier (`largest_chunk_at`,
//! `largest_context_at`), which the report's first screen, its cliff plot and
//! `vramtrace model --context` use (`crate::report::triage`, `crate::report::figures`). The
//! kernel cliff stays for `model --capacity --resident`, `plot --kind cliff` and a report
//! without a failure.

use vramtrace_models::{ModelConfig, Tensor, Variant, Workload, WorkloadOptions, peak};

use crate::attribution::{Attribution, attribute};
use crate::categories::{Category, category};
use crate::error::{Error, Result};
use crate::observe::ObservedMoment;

/// The variants to set beside a moment: `variants` themselves when one was named
/// (`variant_given`), otherwise every variant of the kernels they cover, in the order
/// [`Variant::ALL`] lists them (the order `--help` lists them in, which breaks ties).
pub fn candidates(variants: &[Variant], variant_given: bool) -> Vec<Variant> {
    if variant_given {
        variants.to_vec()
    } else {
        Variant::ALL
            .into_iter()
            .filter(|v| variants.iter().any(|c| c.kernel() == v.kernel()))
            .collect()
    }
}

/// Among `candidates`, the variant whose tensors explain the most observed bytes with evidence
/// ([`Attribution::outranks`]; ties: the first), with its tensors and its attribution: what
/// `compare` chooses without `--variant`.
/// Sizes are compared after rounding up to `align` bytes (at least 1).
pub fn best_variant(
    candidates: &[Variant],
    workload: &Workload,
    m: &ObservedMoment,
    align: u64,
) -> Result<(Variant, Vec<Tensor>, Attribution)> {
    let mut best: Option<(Variant, Vec<Tensor>, Attribution)> = None;
    let mut first_error = None;
    for v in candidates {
        let tensors = match v.tensors(workload) {
            Ok(t) => t,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        let a = attribute(&tensors, m.observed.clone(), align.max(1), m.moment);
        if best.as_ref().is_none_or(|(_, _, b)| a.outranks(b)) {
            best = Some((*v, tensors, a));
        }
    }
    best.ok_or_else(|| match first_error {
        Some(e) => Error::Model(e),
        None => Error::NoVariant,
    })
}

/// Bytes live at a moment that the model does not explain, without the `other` category
/// (ballast and reservations that stand in for memory the card does not have), and the
/// observed total of the moment on the same terms (the failed request included).
pub fn resident_and_observed(a: &Attribution) -> (u64, u64) {
    let mut resident = 0u64;
    let mut total = 0u64;
    for (i, o) in a.observed.iter().enumerate() {
        if category(o.label.as_deref(), o.name.as_deref()) == Category::OtherProcess {
            continue;
        }
        total = total.saturating_add(o.size);
        if !o.failed && a.unexplained.contains(&i) {
            resident = resident.saturating_add(o.size);
        }
    }
    (resident, total)
}

/// The peak of each variant for one sequence of `tokens`.
pub fn peaks_at(
    cfg: &ModelConfig,
    variants: &[Variant],
    opts: &WorkloadOptions,
    tokens: u64,
) -> Result<Vec<u64>> {
    let o = WorkloadOptions {
        seqlens: vec![tokens],
        ..opts.clone()
    };
    let w = Workload::from_config(cfg, &o)?;
    variants
        .iter()
        .map(|v| Ok(peak(&v.tensors(&w)?).bytes))
        .collect()
}

/// The largest of the variants' peaks for one sequence of `tokens` (0 without a variant).
pub fn largest_peak_at(
    cfg: &ModelConfig,
    variants: &[Variant],
    opts: &WorkloadOptions,
    tokens: u64,
) -> Result<u64> {
    Ok(peaks_at(cfg, variants, opts, tokens)?
        .into_iter()
        .max()
        .unwrap_or(0))
}

/// The step `model --sweep` uses between T0 and T1 when none is given: a multiple of 64
/// giving about 32 rows.
pub fn default_step(t0: u64, t1: u64) -> u64 {
    ((t1 - t0) / 32).div_ceil(64).max(1) * 64
}

/// The first token count (one sequence) whose largest variant peak exceeds `budget` bytes, or
/// `None` below 2^40 tokens: what `model --capacity --resident` reports.
pub fn cliff_tokens(
    cfg: &ModelConfig,
    variants: &[Variant],
    opts: &WorkloadOptions,
    budget: u64,
) -> Result<Option<u64>> {
    let peak_of = |t: u64| largest_peak_at(cfg, variants, opts, t);
    // Every modelled peak grows with the token count, so the first failing count is found by
    // doubling, then bisecting.
    let mut cliff = None;
    if peak_of(1)? > budget {
        cliff = Some(1);
    } else {
        let (mut lo, mut hi) = (1u64, 2u64);
        while peak_of(hi)? <= budget {
            lo = hi;
            hi = hi.saturating_mul(2);
            if hi > 1 << 40 {
                break;
            }
        }
        if hi <= 1 << 40 {
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if peak_of(mid)? > budget {
                    hi = mid
                } else {
                    lo = mid
                }
            }
            cliff = Some(hi);
        }
    }
    Ok(cliff)
}
