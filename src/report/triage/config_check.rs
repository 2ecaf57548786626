//! Whether the `--model` config is the traced model's: its weights against the bytes the trace
//! holds as weights, its hidden size against the run's embedding outputs. When it contradicts
//! the trace, the report shows the model's figures with a warning and not its levers.

use super::{ModelView, gib};
use crate::categoriser::{Breakdown, Category};
use crate::report::step::embedding_outputs_match;
use crate::trace::Trace;

/// How far a config's weights may be from the trace's before the report says the config is not
/// the traced model's: 5%.
const WEIGHTS_TOLERANCE_PERCENT: f64 = 5.0;

/// Whether the model's config contradicts the trace: its predicted weights more than
/// [`WEIGHTS_TOLERANCE_PERCENT`] from the bytes the categoriser named weights. `None` when they
/// agree, or when the trace names no weights (a run that loaded none, or an unnamed one).
pub(super) fn config_contradiction(
    trace: &Trace,
    process: usize,
    b: &Breakdown,
    m: &ModelView,
    cfg: &vramtrace_models::ModelConfig,
) -> crate::Result<Option<String>> {
    let observed = b.bytes(Category::Weights);
    let predicted = m
        .parts
        .iter()
        .find(|p| p.category == Category::Weights)
        .map(|p| p.bytes);
    if let Some(predicted) = predicted.filter(|_| observed > 0) {
        let off = (predicted as f64 - observed as f64) * 100.0 / observed as f64;
        if off.abs() > WEIGHTS_TOLERANCE_PERCENT {
            return Ok(Some(format!(
                "the config's weights ({}) are {off:+.1}% from the {} the trace holds as weights: is `--model` the traced model's config? Its figures are shown, its levers are not",
                gib(predicted),
                gib(observed)
            )));
        }
    }
    let per_token = cfg.hidden_size * cfg.dtype.size_bytes();
    Ok(match embedding_outputs_match(trace, process, per_token)? {
        Some(false) => Some(format!(
            "no embedding output of the run is a whole number of tokens of the config's hidden size ({} × {} B): is `--model` the traced model's config? Its figures are shown, its levers are not",
            cfg.hidden_size,
            cfg.dtype.size_bytes()
        )),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str) -> Trace {
        Trace::open(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("samples/h200")
                .join(name),
        )
        .unwrap()
    }

    /// transformers' chunked generate of the `hybrid12` model (hidden size 2048, bf16): its
    /// embedding outputs are whole numbers of 4,096-byte tokens, not of a 2,176-wide model's
    /// (whose 4,352-byte tokens a 512-byte block rounding would let pass); a run without
    /// PyTorch's embedding in its stacks cannot tell.
    #[test]
    fn a_config_whose_hidden_size_no_embedding_output_has_is_told_apart() {
        let t = sample("hf-generate-oom");
        assert_eq!(embedding_outputs_match(&t, 0, 4096).unwrap(), Some(true));
        assert_eq!(embedding_outputs_match(&t, 0, 4352).unwrap(), Some(false));
        let native = sample("torch-nocache");
        assert_eq!(embedding_outputs_match(&native, 0, 4096).unwrap(), None);
    }
}
