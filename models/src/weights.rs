//! Weight bytes of a hybrid GDN + attention model by storage format.
//!
//! Parameter counts follow the layer layout of vLLM 0.20.1's `qwen3_next.py` / `qwen3_5.py`:
//! per GDN layer the input projections (q, k, v, z, b, a: `hidden * (2*key_dim + 2*value_dim +
//! 2*HV)`), the depthwise conv (`conv_dim * kernel`), `A_log` and `dt_bias` (`HV` each), the gated
//! norm (`head_v_dim`) and `out_proj` (`value_dim * hidden`); per attention layer q (doubled
//! when `attn_output_gate`), k, v, o and the q/k norms; a dense MLP `3 * hidden * I` or, for MoE,
//! `num_experts * 3 * hidden * moe_I` plus router and shared expert; two norms per layer; the
//! embedding and an untied `lm_head`. Vision towers and MTP heads are not counted.
//!
//! Quantised formats apply to the linear layers only (embedding, `lm_head`, norms, conv and
//! gates stay in bf16, as FP8 and GPTQ checkpoints commonly keep them):
//! * `fp8`: 1 byte per weight plus one fp32 scale per 128x128 block (the fine-grained FP8 of the
//!   Qwen FP8 model cards, block size 128);
//! * `int4:G`: GPTQ-style packing, 4 bits per weight, one fp16 scale and one 4-bit zero point per
//!   group of `G` input channels (`qweight`, `scales`, `qzeros`), i.e. `0.5 + 2.5 / G` bytes.

use std::str::FromStr;

use serde::Serialize;

use crate::{LayerKind, ModelConfig, ModelError};

/// How the linear-layer weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum WeightFormat {
    /// bfloat16 (or float16): 2 bytes per weight.
    Bf16,
    /// FP8 with one fp32 scale per 128x128 block.
    Fp8Block128,
    /// 4-bit integers with fp16 scales and 4-bit zeros per group of this many input channels.
    Int4 {
        /// Group size (128 is common).
        group: u64,
    },
}

impl FromStr for WeightFormat {
    type Err = String;

    /// `bf16`, `fp16`, `fp8`, `int4` (group 128) or `int4:G`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "bf16" | "bfloat16" | "fp16" | "float16" => Ok(WeightFormat::Bf16),
            "fp8" => Ok(WeightFormat::Fp8Block128),
            "int4" => Ok(WeightFormat::Int4 { group: 128 }),
            _ => match t.strip_prefix("int4:").map(str::parse::<u64>) {
                Some(Ok(g)) if g > 0 => Ok(WeightFormat::Int4 { group: g }),
                _ => Err(format!(
                    "{s:?} is not a weight format; use bf16, fp8, int4 or int4:GROUP"
                )),
            },
        }
    }
}

/// A linear layer `in -> out`, for block- and group-wise overheads.
#[derive(Clone, Copy, Debug)]
struct Linear {
    inp: u128,
    out: u128,
}

/// Parameters and bytes of a model's weights on one rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WeightEstimate {
    /// The format of the linear layers.
    pub format: WeightFormat,
    /// Parameters in linear layers (quantised by `format`), on this rank.
    pub linear_params: u64,
    /// Other parameters (embeddings, lm_head, norms, conv, gates), kept in bf16, on this rank.
    pub other_params: u64,
    /// Total bytes on this rank.
    pub bytes: u64,
}

/// Estimates the weight bytes of `cfg`'s text model on one rank of `tp`.
pub fn weight_bytes(
    cfg: &ModelConfig,
    format: WeightFormat,
    tp: u64,
) -> Result<WeightEstimate, ModelError> {
    if tp == 0 {
        return Err(ModelError::Invalid(
            "the TP degree must be at least 1".into(),
        ));
    }
    // In 128 bits: with every config count at most MAX_COUNT (2^24) nothing below can
    // overflow, and the results are checked against MAX_BYTES at the end.
    let w = u128::from;
    let h = w(cfg.hidden_size);
    let key_dim = w(cfg.linear_num_key_heads) * w(cfg.linear_key_head_dim);
    let value_dim = w(cfg.linear_num_value_heads) * w(cfg.linear_value_head_dim);
    let hv = w(cfg.linear_num_value_heads);
    let head_dim = w(cfg.head_dim);
    let q_out = w(cfg.num_attention_heads) * head_dim * if cfg.attn_output_gate { 2 } else { 1 };
    // With more ranks than KV heads, vLLM replicates them: one head a rank
    // (`model_executor/layers/linear.py:1029-1036`, `QKVParallelLinear`), so the total over the
    // ranks is `max(kv_heads, tp)` heads.
    let kv_out = w(cfg.num_key_value_heads.max(tp)) * head_dim;
    let mut linears: Vec<(Linear, u128)> = Vec::new();
    // `copies` identical `inp -> out` linears (gate and up, k and v, the experts).
    let mut linear =
        |inp: u128, out: u128, copies: u128| linears.push((Linear { inp, out }, copies));
    let mut other = 0u128;
    for kind in &cfg.layer_types {
        match kind {
            LayerKind::LinearAttention => {
                linear(h, 2 * key_dim + 2 * value_dim, 1);
                linear(value_dim, h, 1);
                // b and a projections are tiny; kept with the other (unquantised) parameters.
                other += h * 2 * hv;
                other += (2 * key_dim + value_dim) * w(cfg.linear_conv_kernel_dim);
                other += 2 * hv + w(cfg.linear_value_head_dim);
            }
            LayerKind::FullAttention => {
                linear(h, q_out, 1);
                linear(h, kv_out, 2);
                linear(w(cfg.num_attention_heads) * head_dim, h, 1);
                other += 2 * head_dim;
            }
        }
        match (&cfg.moe, cfg.intermediate_size) {
            (Some(m), _) => {
                let (mi, experts) = (w(m.moe_intermediate_size), w(m.num_experts));
                linear(h, mi, 2 * experts);
                linear(mi, h, experts);
                if m.shared_expert_intermediate_size > 0 {
                    let si = w(m.shared_expert_intermediate_size);
                    linear(h, si, 2);
                    linear(si, h, 1);
                    other += h; // shared_expert_gate
                }
                other += h * experts; // router
            }
            (None, Some(i)) => {
                linear(h, w(i), 2);
                linear(w(i), h, 1);
            }
            (None, None) => {}
        }
        other += 2 * h;
    }
    other += h; // final norm
    let embed = w(cfg.vocab_size) * h * if cfg.tie_word_embeddings { 1 } else { 2 };

    let linear_params: u128 = linears.iter().map(|(l, n)| l.inp * l.out * n).sum();
    let linear_bytes: u128 = linears
        .iter()
        .map(|(l, n)| {
            let p = l.inp * l.out;
            n * match format {
                WeightFormat::Bf16 => 2 * p,
                WeightFormat::Fp8Block128 => p + 4 * l.inp.div_ceil(128) * l.out.div_ceil(128),
                WeightFormat::Int4 { group } => {
                    let groups = l.inp.div_ceil(w(group));
                    p / 2 + groups * l.out * 2 + groups * l.out / 2
                }
            }
        })
        .sum();
    // Column/row-parallel linears and the vocab-parallel embedding split across ranks; norms,
    // conv and gates are replicated or too small to matter.
    let tp = w(tp);
    let linear_params = linear_params / tp;
    let other_params = other + embed / tp;
    use crate::error::{fit_bytes, fit_count};
    Ok(WeightEstimate {
        format,
        linear_params: fit_count("the linear parameters", linear_params)?,
        other_params: fit_count("the other parameters", other_params)?,
        bytes: fit_bytes("the weights", linear_bytes / tp + 2 * other_params)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_heads_are_replicated_past_their_count() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../samples/models/Qwen3.6-27B/config.json");
        let four = crate::ModelConfig::from_path(p).unwrap();
        let eight = crate::ModelConfig {
            num_key_value_heads: 8,
            ..four.clone()
        };
        let at =
            |c: &crate::ModelConfig, tp| weight_bytes(c, WeightFormat::Bf16, tp).unwrap().bytes;
        // At TP 8 four KV heads are replicated to one a rank: the ranks hold what eight would.
        assert_eq!(at(&four, 8), at(&eight, 8));
        // On one GPU the four heads are four: 16 layers × k and v × 4 × 256 × 5120 × 2 B less.
        assert_eq!(at(&eight, 1) - at(&four, 1), 16 * 2 * 4 * 256 * 5120 * 2);
    }

    #[test]
    fn formats_parse() {
        assert_eq!("fp8".parse(), Ok(WeightFormat::Fp8Block128));
        assert_eq!("int4:64".parse(), Ok(WeightFormat::Int4 { group: 64 }));
        assert!("int3".parse::<WeightFormat>().is_err());
    }
}
