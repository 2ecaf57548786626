//! Per-sequence GDN state: the short-convolution state and the recurrent (SSM) state.
//!
//! Shapes from vLLM 0.20.1 `vllm/model_executor/layers/mamba/mamba_utils.py`
//! (`MambaStateShapeCalculator.gated_delta_net_state_shape`): conv state
//! `(conv_kernel_size - 1 + num_spec, conv_dim / tp)` with
//! `conv_dim = head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads`, and temporal state
//! `(num_v_heads / tp, head_v_dim, head_k_dim)`. Dtypes from `gated_delta_net_state_dtype`:
//! the conv state takes the cache dtype (the model dtype by default), the temporal state
//! `mamba_ssm_cache_dtype` (the same unless set, e.g. float32).

use serde::Serialize;

use crate::{DType, ModelConfig, ModelError, tp_split};

/// The state one sequence holds in every GDN layer, on one rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GdnStatePerSeq {
    /// Conv state shape of one layer.
    pub conv_shape: Vec<u64>,
    /// Conv state dtype.
    pub conv_dtype: DType,
    /// Recurrent state shape of one layer.
    pub ssm_shape: Vec<u64>,
    /// Recurrent state dtype.
    pub ssm_dtype: DType,
    /// Bytes of one layer (conv + recurrent).
    pub bytes_per_layer: u64,
    /// GDN layers.
    pub layers: u64,
    /// Bytes of one sequence across all GDN layers.
    pub bytes_per_seq: u64,
}

/// The GDN state per sequence for `cfg` on one rank; `num_spec` speculative tokens widen the
/// conv state as in vLLM.
pub fn gdn_state_per_seq(
    cfg: &ModelConfig,
    tp: u64,
    conv_dtype: DType,
    ssm_dtype: DType,
    num_spec: u64,
) -> Result<GdnStatePerSeq, ModelError> {
    let w = u128::from;
    let layers = cfg.num_linear_layers();
    if layers == 0 {
        // A dense model keeps no recurrent state.
        return Ok(GdnStatePerSeq {
            conv_shape: vec![0, 0],
            conv_dtype,
            ssm_shape: vec![0, 0, 0],
            ssm_dtype,
            bytes_per_layer: 0,
            layers: 0,
            bytes_per_seq: 0,
        });
    }
    let conv_dim = crate::error::fit_count(
        "the GDN conv channels",
        w(cfg.linear_key_head_dim) * w(cfg.linear_num_key_heads) * 2
            + w(cfg.linear_value_head_dim) * w(cfg.linear_num_value_heads),
    )?;
    let conv_dim = tp_split("GDN conv channels", conv_dim, tp)?;
    let hv = tp_split("linear_num_value_heads", cfg.linear_num_value_heads, tp)?;
    let conv_rows = crate::error::fit_count(
        "the GDN conv state's rows",
        w(cfg.linear_conv_kernel_dim) - 1 + w(num_spec),
    )?;
    let conv_shape = vec![conv_rows, conv_dim];
    let ssm_shape = vec![hv, cfg.linear_value_head_dim, cfg.linear_key_head_dim];
    let per_layer = w(conv_rows) * w(conv_dim) * w(conv_dtype.size_bytes())
        + w(hv)
            * w(cfg.linear_value_head_dim)
            * w(cfg.linear_key_head_dim)
            * w(ssm_dtype.size_bytes());
    let bytes_per_layer = crate::error::fit_bytes("the GDN state per layer", per_layer)?;
    Ok(GdnStatePerSeq {
        conv_shape,
        conv_dtype,
        ssm_shape,
        ssm_dtype,
        bytes_per_layer,
        layers,
        bytes_per_seq: crate::error::fit_bytes(
            "the GDN state per sequence",
            per_layer * w(layers),
        )?,
    })
}
