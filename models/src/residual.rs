//! The categories every byte of a step falls in, and the residual of each between what the
//! whole-step model predicts and what a trace observed, with its likely cause in words.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::units::ByteUnit;
use crate::{Category, ModelError, StepBreakdown};

/// One category's prediction against the trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartResidual {
    /// The category.
    pub category: Category,
    /// What the model put there; `None` when the model does not predict it and was not told.
    pub predicted: Option<u64>,
    /// What the trace observed.
    pub observed: u64,
    /// `predicted − observed` (an unpredicted part counts as 0 predicted).
    pub residual: i64,
    /// The likely cause of a non-zero residual, in words; "agrees" when it is zero.
    pub likely_cause: String,
}

/// Every category's residual, and the totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Residuals {
    /// One row per category that was predicted or observed, in [`Category::ALL`] order.
    pub parts: Vec<PartResidual>,
    /// The step's predicted peak ([`StepBreakdown::total`]).
    pub predicted_total: u64,
    /// The observed bytes of every category together.
    pub observed_total: u64,
    /// `predicted_total − observed_total`.
    pub total_residual: i64,
}

/// Sets the model's parts beside the bytes a trace observed per category (names as in
/// [`Category::key`]; the failed request belongs in `activations`, as the step needed it).
/// An unknown category name is refused with the list of known ones.
pub fn residuals(
    step: &StepBreakdown,
    observed: &BTreeMap<String, u64>,
) -> Result<Residuals, ModelError> {
    let mut seen: BTreeMap<Category, u64> = BTreeMap::new();
    for (name, &bytes) in observed {
        let c = Category::parse(name).ok_or_else(|| {
            let known: Vec<&str> = Category::ALL.iter().map(|c| c.key()).collect();
            ModelError::Invalid(format!(
                "{name:?} is not a category; use one of {}",
                known.join(", ")
            ))
        })?;
        *seen.entry(c).or_default() += bytes;
    }
    let mut parts = Vec::new();
    for c in Category::ALL {
        let predicted = step.part(c);
        let observed = seen.get(&c).copied();
        if predicted.is_none() && observed.is_none() {
            continue;
        }
        let observed = observed.unwrap_or(0);
        let residual = signed(predicted.unwrap_or(0), observed);
        parts.push(PartResidual {
            category: c,
            predicted,
            observed,
            residual,
            likely_cause: likely_cause(step, c, predicted, residual),
        });
    }
    let observed_total: u64 = seen.values().sum();
    Ok(Residuals {
        parts,
        predicted_total: step.total,
        observed_total,
        total_residual: signed(step.total, observed_total),
    })
}

fn signed(a: u64, b: u64) -> i64 {
    (i128::from(a) - i128::from(b)) as i64
}

/// The likely cause of one category's residual.
fn likely_cause(step: &StepBreakdown, c: Category, predicted: Option<u64>, r: i64) -> String {
    if r == 0 {
        return "agrees".into();
    }
    let over = r > 0;
    let mib = |b: i64| ByteUnit::MiB.format(b.unsigned_abs() as f64, 2);
    let by = if over {
        format!("the model is {} above the trace", mib(r))
    } else {
        format!("the model is {} below the trace", mib(r))
    };
    if predicted.is_none() && c != Category::Unnamed {
        return format!(
            "{by}: the model does not predict {c}; read it from the trace (or the engine's log) and give it as a known part"
        );
    }
    let why = match (c, over) {
        (Category::Weights, true) => {
            "the model counts weights the program did not load (an untied lm_head, layers or projections the program lacks), or the format's estimate is above the checkpoint".to_string()
        }
        (Category::Weights, false) => {
            "the checkpoint holds more than the estimate (layers kept unquantised, scales, a vision tower or MTP head the count leaves out)".to_string()
        }
        (Category::KvCache, true) => format!(
            "the failure came part-way through the step, before every attention layer had stored the chunk's K/V (the model counts all {} tokens in every layer), or the trace's cache is not rounded to blocks of {} tokens",
            step.shape.context_tokens, step.shape.block_size
        ),
        (Category::KvCache, false) => {
            "the cache holds more than K and V for the context: a pool preallocated for more tokens (vLLM sizes it from --gpu-memory-utilization), views that keep whole projections alive, or the allocator's rounding of each block".to_string()
        }
        (Category::State, _) => {
            "the state's dtype (mamba_ssm_cache_dtype), the number of sequences holding state, or the allocator's rounding of its small tensors differ".to_string()
        }
        (Category::Activations, true) => format!(
            "the failure came before the step's largest live set: the {} layer peaks at {} bytes, which the failing moment had not reached",
            step.activations.kind, step.activations.bytes
        ),
        (Category::Activations, false) => {
            "tensors outlive their layer in the program beyond what the model carries (names still bound, caches of index tensors), or the allocator hands out whole blocks above the tensors' bytes".to_string()
        }
        (Category::EngineBuffers | Category::CudaGraphs | Category::Communication | Category::Autotune, _) => {
            "the known value given to the model differs from this trace's; give the trace's".to_string()
        }
        (Category::AllocatorReserve, _) => {
            "the reserve given to the model is not the trace's at this moment (fragmentation changes with every free)".to_string()
        }
        (Category::Context, _) => {
            "the context given to the model is not the trace's untraced bytes at this moment (modules load lazily)".to_string()
        }
        (Category::OtherProcess, _) => {
            "other processes changed their usage; give the trace's figure".to_string()
        }
        (Category::Unnamed, _) => {
            "bytes no category rule covers; the model cannot place them, so read the named parts' residuals against them".to_string()
        }
    };
    format!("{by}: {why}")
}
