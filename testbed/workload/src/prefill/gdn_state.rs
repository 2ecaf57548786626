//! The persistent state of the GDN layers for one sequence: short-convolution
//! and recurrent state, sized by `vramtrace_models::gdn_state_per_seq`.

use vramtrace_models::{self as model, LayerKind, ModelConfig};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::TensorSpec;

/// The persistent state of one GDN layer for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct GdnStateSpec {
    /// The layer.
    pub layer: usize,
    /// Short-convolution state `[1, kernel - 1, conv_dim]` in the model dtype.
    pub conv: TensorSpec,
    /// Recurrent state `[1, HV, K, V]`, fp32: fla's `initial_state` /
    /// `final_state` layout and dtype (vLLM's `--mamba-ssm-cache-dtype float32`;
    /// vLLM stores it as (HV, V, K), the same bytes).
    pub ssm: TensorSpec,
}

/// The state of every GDN layer, in layer order, checked against the models'
/// bytes per layer.
pub(super) fn gdn_states(cfg: &ModelConfig, dtype: DType) -> Result<Vec<GdnStateSpec>> {
    let state = model::gdn_state_per_seq(cfg, 1, cfg.dtype, model::DType::F32, 0)?;
    let conv: Vec<usize> = state.conv_shape.iter().map(|&d| d as usize).collect();
    let (hv, k, v) = (
        cfg.linear_num_value_heads as usize,
        cfg.linear_key_head_dim as usize,
        cfg.linear_value_head_dim as usize,
    );
    let states: Vec<GdnStateSpec> = cfg
        .layer_types
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == LayerKind::LinearAttention)
        .map(|(l, _)| GdnStateSpec {
            layer: l,
            conv: TensorSpec::new(
                format!("layer.{l}.conv_state"),
                dtype,
                &[1, conv[0], conv[1]],
            ),
            ssm: TensorSpec::new(format!("layer.{l}.ssm_state"), DType::F32, &[1, hv, k, v]),
        })
        .collect();
    if let Some(s) = states.first()
        && (s.conv.bytes() + s.ssm.bytes()) as u64 != state.bytes_per_layer
    {
        return Err(Error::Model(format!(
            "the GDN state stand-ins take {} bytes a layer, not gdn_state_per_seq's {}",
            s.conv.bytes() + s.ssm.bytes(),
            state.bytes_per_layer
        )));
    }
    Ok(states)
}
