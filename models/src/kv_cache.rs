//! KV cache bytes per token of the full-attention layers.
//!
//! Each full-attention layer stores a key and a value of `num_key_value_heads / tp * head_dim`
//! elements per token. GDN layers keep no per-token cache (see [`crate::gdn_state`]).
//! vLLM's page-size alignment between attention and Mamba-style layers of hybrid models is not
//! modelled: this is the payload, not the pool's rounding.

use serde::Serialize;

use crate::{DType, ModelConfig, ModelError, tp_split};

/// KV cache payload per token, on one rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KvCachePerToken {
    /// KV element type (`--kv-cache-dtype`: bf16 or fp8).
    pub dtype: DType,
    /// Full-attention layers holding a cache.
    pub layers: u64,
    /// Bytes of one layer's K plus V for one token.
    pub bytes_per_layer: u64,
    /// Bytes for one token across all attention layers.
    pub bytes_per_token: u64,
}

/// The KV cache payload per token for `cfg` on one rank of `tp`.
pub fn kv_cache_per_token(
    cfg: &ModelConfig,
    tp: u64,
    dtype: DType,
) -> Result<KvCachePerToken, ModelError> {
    // vLLM replicates KV heads when tp > num_key_value_heads; the model refuses that case rather
    // than guess the replication.
    let kv_heads = tp_split("num_key_value_heads", cfg.num_key_value_heads, tp)?;
    let w = u128::from;
    let per_layer = 2 * w(kv_heads) * w(cfg.head_dim) * w(dtype.size_bytes());
    let layers = cfg.num_attention_layers();
    Ok(KvCachePerToken {
        dtype,
        layers,
        bytes_per_layer: crate::error::fit_bytes("the KV cache per token and layer", per_layer)?,
        bytes_per_token: crate::error::fit_bytes("the KV cache per token", per_layer * w(layers))?,
    })
}
