//! The weight stand-ins: one allocation per layer plus the embedding, the
//! final norm and an untied `lm_head`, sized by `vramtrace_models::weight_bytes`.

use vramtrace_models::{self as model, LayerKind, ModelConfig, WeightFormat};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::TensorSpec;

/// The name of a weight format as `--weights` takes it.
pub fn weight_format_name(f: WeightFormat) -> String {
    match f {
        WeightFormat::Bf16 => "bf16".into(),
        WeightFormat::Fp8Block128 => "fp8".into(),
        WeightFormat::Int4 { group } => format!("int4:{group}"),
    }
}

/// The weight stand-ins: `embed_tokens`, `layer.{l}.weights` for every layer,
/// the final `norm`, and `lm_head` unless tied. `weight_bytes` sums over layers,
/// so each layer's share is the estimate of a one-layer model less that of a
/// model with no layers; the pieces add up to the whole estimate exactly.
pub(super) fn weight_specs(cfg: &ModelConfig, format: WeightFormat) -> Result<Vec<TensorSpec>> {
    let estimate = |layers: Vec<LayerKind>| -> Result<u64> {
        let mut c = cfg.clone();
        c.num_hidden_layers = layers.len() as u64;
        c.layer_types = layers;
        Ok(model::weight_bytes(&c, format, 1)?.bytes)
    };
    let base = estimate(Vec::new())?;
    let gdn_layer = estimate(vec![LayerKind::LinearAttention])? - base;
    let attention_layer = estimate(vec![LayerKind::FullAttention])? - base;
    let (vocab, hidden) = (cfg.vocab_size as usize, cfg.hidden_size as usize);
    let table = vocab * hidden * 2;
    let lm_head = if cfg.tie_word_embeddings { 0 } else { table };
    let norm = (base as usize)
        .checked_sub(table + lm_head)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            Error::Model(format!(
                "the weight estimate without layers ({base} bytes) is not the embedding, \
                 lm_head and final norm this workload splits it into"
            ))
        })?;
    let mut specs = vec![TensorSpec::new(
        "embed_tokens",
        DType::BF16,
        &[vocab, hidden],
    )];
    for (l, kind) in cfg.layer_types.iter().enumerate() {
        specs.push(TensorSpec::new(
            format!("layer.{l}.weights"),
            DType::U8,
            &[match kind {
                LayerKind::LinearAttention => gdn_layer,
                LayerKind::FullAttention => attention_layer,
            } as usize],
        ));
    }
    specs.push(if norm == 2 * hidden {
        TensorSpec::new("norm", DType::BF16, &[hidden])
    } else {
        TensorSpec::new("norm", DType::U8, &[norm])
    });
    if lm_head > 0 {
        specs.push(TensorSpec::new("lm_head", DType::BF16, &[vocab, hidden]));
    }
    let total: usize = specs.iter().map(TensorSpec::bytes).sum();
    let whole = model::weight_bytes(cfg, format, 1)?.bytes;
    if total as u64 != whole {
        return Err(Error::Model(format!(
            "the weight stand-ins add up to {total} bytes, not the estimate's {whole}"
        )));
    }
    Ok(specs)
}
