//! The levers the field notes' users turn against a prefill OOM, each computed from the model
//! and the trace: the prefill chunk (vLLM's `--max-num-batched-tokens`), the card's cliff, the
//! tensor-parallel degree, the KV cache dtype and the weight format.

use vramtrace_models::{DType, Variant, WeightFormat, kv_cache_per_token, weight_bytes};

use crate::cliff::{cliff_tokens, largest_peak_at, resident_and_observed};
use crate::report::{Comparison, FailureReport, LiveSet, ModelInput};

/// The KV cache dtype lever.
#[derive(Debug, Clone, PartialEq)]
pub struct KvLever {
    /// The dtype the cache is assumed to be in (the config's).
    pub dtype: DType,
    /// Bytes per token in that dtype, all attention layers, one rank.
    pub per_token: u64,
    /// Bytes per token in fp8.
    pub per_token_fp8: u64,
    /// KV cache bytes live at the moment (KV-category allocations other than recurrent state).
    pub observed_bytes: u64,
    /// Whole tokens those bytes hold at `per_token`.
    pub tokens_held: u64,
    /// Bytes fp8 would free at those tokens.
    pub freed_by_fp8: u64,
}

/// The weight format lever.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightsLever {
    /// Weight bytes live at the moment.
    pub observed: u64,
    /// The model's estimate per format (`bf16`, `fp8`, `int4`), on one rank.
    pub formats: Vec<(&'static str, u64)>,
    /// Index in `formats` of the estimate closest to what was observed.
    pub closest: usize,
}

/// Everything "What to do" states.
#[derive(Debug, Clone, PartialEq)]
pub struct Levers {
    /// The model's name.
    pub model_name: String,
    /// The kernel variant the peaks are of.
    pub variant: Variant,
    /// Tokens of the prefill chunk modelled (one sequence).
    pub tokens: u64,
    /// The card.
    pub capacity: u64,
    /// Bytes live at the moment that the model does not explain, without `other` (ballast,
    /// reservations): what stays when the kernel runs.
    pub resident: u64,
    /// Capacity − resident, when positive.
    pub budget: Option<u64>,
    /// The first chunk size whose kernel peak no longer fits the budget.
    pub cliff_tokens: Option<u64>,
    /// The kernel's peak at `tokens`.
    pub kernel_peak: u64,
    /// Half the chunk.
    pub half_tokens: u64,
    /// The kernel's peak at half the chunk.
    pub kernel_peak_half: u64,
    /// The TP degree modelled.
    pub tp: u64,
    /// The kernel's peak per card at twice the TP degree (`None` when the heads do not split).
    pub kernel_peak_tp2: Option<u64>,
    /// The KV cache dtype lever (`None` when the cache is already one byte or none is seen).
    pub kv: Option<KvLever>,
    /// The weight format lever (`None` when no weights are seen).
    pub weights: Option<WeightsLever>,
    /// Request − free at the failure, when the levers are at one.
    pub shortfall: Option<u64>,
}

impl Levers {
    /// Bytes halving the chunk takes off the kernel's peak.
    pub fn halving_frees(&self) -> u64 {
        self.kernel_peak.saturating_sub(self.kernel_peak_half)
    }
}

/// Computes the levers at a moment (a failure, or the peak when `failure` is `None`).
pub fn compute(
    m: &ModelInput,
    c: &Comparison,
    live: &LiveSet,
    failure: Option<&FailureReport>,
    capacity: u64,
) -> crate::Result<Levers> {
    let tokens: u64 = m.opts.seqlens.iter().sum::<u64>().max(1);
    let v = [c.variant];
    let peak =
        |opts: &vramtrace_models::WorkloadOptions, t: u64| largest_peak_at(&m.cfg, &v, opts, t);
    let (resident, _) = resident_and_observed(&c.attribution);
    let budget = capacity.checked_sub(resident);
    let cliff = match budget {
        Some(b) => cliff_tokens(&m.cfg, &v, &m.opts, b)?,
        None => None,
    };
    let half_tokens = (tokens / 2).max(1);
    let tp2 = vramtrace_models::WorkloadOptions {
        tp: m.opts.tp.saturating_mul(2),
        ..m.opts.clone()
    };
    let kv = match (
        kv_cache_per_token(&m.cfg, m.opts.tp, m.cfg.dtype),
        kv_cache_per_token(&m.cfg, m.opts.tp, DType::F8),
    ) {
        (Ok(a), Ok(b)) if a.bytes_per_token > b.bytes_per_token && live.kv_cache_bytes > 0 => {
            let held = live.kv_cache_bytes / a.bytes_per_token;
            Some(KvLever {
                dtype: m.cfg.dtype,
                per_token: a.bytes_per_token,
                per_token_fp8: b.bytes_per_token,
                observed_bytes: live.kv_cache_bytes,
                tokens_held: held,
                freed_by_fp8: held.saturating_mul(a.bytes_per_token - b.bytes_per_token),
            })
        }
        _ => None,
    };
    let observed_weights = live.category_bytes("weights");
    let weights = if observed_weights == 0 {
        None
    } else {
        let mut formats = Vec::new();
        for (name, f) in [
            ("bf16", WeightFormat::Bf16),
            ("fp8", WeightFormat::Fp8Block128),
            ("int4", WeightFormat::Int4 { group: 128 }),
        ] {
            if let Ok(e) = weight_bytes(&m.cfg, f, m.opts.tp) {
                formats.push((name, e.bytes));
            }
        }
        let closest = (0..formats.len())
            .min_by_key(|&i| formats[i].1.abs_diff(observed_weights))
            .unwrap_or(0);
        (!formats.is_empty()).then_some(WeightsLever {
            observed: observed_weights,
            formats,
            closest,
        })
    };
    Ok(Levers {
        model_name: m.cfg.display_name(),
        variant: c.variant,
        tokens,
        capacity,
        resident,
        budget,
        cliff_tokens: cliff,
        kernel_peak: peak(&m.opts, tokens)?,
        half_tokens,
        kernel_peak_half: peak(&m.opts, half_tokens)?,
        tp: m.opts.tp,
        kernel_peak_tp2: peak(&tp2, tokens).ok(),
        kv,
        weights,
        shortfall: failure.map(|f| f.shortfall()),
    })
}
