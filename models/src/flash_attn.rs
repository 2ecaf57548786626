//! FlashAttention-2 varlen forward (`mha_varlen_fwd`): the shape of one call, and the split-KV
//! heuristic every modelled version shares.
//!
//! The variants differ in `softmax_lse`'s layout and in how long the split-KV accumulators live:
//! [`crate::fa_dao_2_5_9`] (padded `[B, H, max_seqlen_q]`),
//! [`crate::fa_dao_2_8_3`] (unpadded `[H, total_q]`, as since v2.6.0) and
//! [`crate::fa_pytorch`] (PyTorch's copy behind `aten::_flash_attention_forward`).
//! In none of them does `max_seqlen_k` size `softmax_lse`: it only enters the split-KV
//! heuristic of the decode path.

use serde::Serialize;

use crate::{DType, ModelConfig, ModelError, TensorId, Timeline, tp_split};

/// The shape of one varlen forward call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FaShape {
    /// Query tokens of each sequence (`cu_seqlens_q` differences).
    pub seqlens_q: Vec<u64>,
    /// `max_seqlen_k` as the caller passes it (vLLM passes the longest context; during graph
    /// capture the model length). Only the split-KV heuristic reads it.
    pub max_seqlen_k: u64,
    /// Query heads on this rank.
    pub num_heads: u64,
    /// Key/value heads on this rank.
    pub num_heads_k: u64,
    /// Head dimension.
    pub head_dim: u64,
    /// q/k/v dtype.
    pub dtype: DType,
    /// Streaming multiprocessors of the GPU (132 on an H200, 82 on an RTX 3090).
    pub num_sms: u64,
}

impl FaShape {
    /// One full-attention layer of `cfg` on this rank, for prefill of `seqlens` with no prefix.
    pub fn from_config(
        cfg: &ModelConfig,
        seqlens: &[u64],
        max_seqlen_k: Option<u64>,
        tp: u64,
        dtype: DType,
        num_sms: u64,
    ) -> Result<Self, ModelError> {
        Ok(FaShape {
            seqlens_q: seqlens.to_vec(),
            max_seqlen_k: max_seqlen_k
                .unwrap_or_else(|| seqlens.iter().copied().max().unwrap_or(0)),
            num_heads: tp_split("num_attention_heads", cfg.num_attention_heads, tp)?,
            num_heads_k: tp_split("num_key_value_heads", cfg.num_key_value_heads, tp)?,
            head_dim: cfg.head_dim,
            dtype,
            num_sms,
        })
    }

    /// `batch_size = cu_seqlens_q.numel() - 1`.
    pub fn batch(&self) -> u64 {
        self.seqlens_q.len() as u64
    }

    /// `total_q`.
    pub fn total_q(&self) -> u64 {
        self.seqlens_q.iter().sum()
    }

    /// `max_seqlen_q`.
    pub fn max_seqlen_q(&self) -> u64 {
        self.seqlens_q.iter().copied().max().unwrap_or(0)
    }

    /// Whether the decode fast path applies (`seqlenq_ngroups_swapped`): one query token per
    /// sequence and grouped-query attention (no window, no dropout, no ALiBi assumed).
    pub fn ngroups_swapped(&self) -> bool {
        self.max_seqlen_q() == 1
            && self.num_heads > self.num_heads_k
            && self.head_dim.is_multiple_of(8)
    }

    /// The sizes the kernel sees: on the decode path (`seqlenq_ngroups_swapped`) the query groups
    /// of each KV head are swapped into the sequence dimension; otherwise the call's own.
    pub(crate) fn kernel_dims(&self) -> KernelDims {
        if self.ngroups_swapped() {
            let ngroups = self.num_heads / self.num_heads_k;
            KernelDims {
                heads: self.num_heads_k,
                total_q: self.batch() * ngroups,
                max_seqlen_q: ngroups,
            }
        } else {
            KernelDims {
                heads: self.num_heads,
                total_q: self.total_q(),
                max_seqlen_q: self.max_seqlen_q(),
            }
        }
    }

    /// `round_multiple(head_size, head_size <= 128 ? 32 : 64)`.
    pub fn head_size_rounded(&self) -> u64 {
        let m = if self.head_dim <= 128 { 32 } else { 64 };
        self.head_dim.div_ceil(m) * m
    }

    /// The number of KV splits `set_params_splitkv` picks (1 = no split, no accumulators), for the
    /// heads and query length the kernel sees after the decode swap.
    pub fn num_splits(&self, heads: u64, max_seqlen_q: u64) -> u64 {
        let block_n = if self.head_dim <= 64 {
            256
        } else if self.head_dim <= 128 {
            128
        } else {
            64
        };
        let num_n_blocks = self.max_seqlen_k.div_ceil(block_n);
        let num_m_blocks = max_seqlen_q.div_ceil(64);
        num_splits_heuristic(
            // Only compared with the SM count: saturating keeps "far more than the SMs".
            self.batch()
                .saturating_mul(heads)
                .saturating_mul(num_m_blocks),
            self.num_sms * 2,
            num_n_blocks,
            128,
        )
    }

    pub(crate) fn check(&self) -> Result<(), ModelError> {
        if self.seqlens_q.is_empty() || self.seqlens_q.contains(&0) {
            return Err(ModelError::Invalid(
                "every sequence needs at least one query token".into(),
            ));
        }
        if self.num_heads_k == 0 || !self.num_heads.is_multiple_of(self.num_heads_k) {
            return Err(ModelError::Invalid(format!(
                "{} query heads are not a multiple of {} KV heads",
                self.num_heads, self.num_heads_k
            )));
        }
        if self.head_dim > 256 {
            return Err(ModelError::Invalid(format!(
                "FlashAttention-2 supports head dimensions up to 256, not {}",
                self.head_dim
            )));
        }
        Ok(())
    }
}

/// The shape of `q` as the kernel sees it ([`FaShape::kernel_dims`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KernelDims {
    /// Query heads (`num_heads_k` after the decode swap).
    pub(crate) heads: u64,
    /// Query rows (`batch * ngroups` after the decode swap).
    pub(crate) total_q: u64,
    /// The longest query (`ngroups` after the decode swap).
    pub(crate) max_seqlen_q: u64,
}

/// The split-KV accumulators `set_params_splitkv` allocates on the decode path when the
/// heuristic splits: `softmax_lse_accum`, then `out_accum`, both fp32; none otherwise. The
/// versions differ in when they are freed, so the caller frees them. `sources` cite the two
/// allocations in the caller's upstream file.
pub(crate) fn alloc_split_kv_accumulators(
    tl: &mut Timeline,
    s: &FaShape,
    q: &KernelDims,
    sources: [&'static str; 2],
) -> Vec<TensorId> {
    if !s.ngroups_swapped() {
        return Vec::new();
    }
    let splits = s.num_splits(q.heads, q.max_seqlen_q);
    if splits <= 1 {
        return Vec::new();
    }
    let (b, heads, msq) = (s.batch(), q.heads, q.max_seqlen_q);
    let [lse_source, out_source] = sources;
    let lse = tl.alloc(
        "softmax_lse_accum",
        &[splits, b, heads, msq],
        DType::F32,
        lse_source,
    );
    let acc = tl.alloc(
        "out_accum",
        &[splits, b, heads, msq, s.head_size_rounded()],
        DType::F32,
        out_source,
    );
    vec![lse, acc]
}

/// On the decode path with more than one KV head, the copying `reshape` that transposes the
/// output back to `[batch, num_heads, head_dim]`, after which the kernel's `out` is released.
pub(crate) fn transpose_out_back(
    tl: &mut Timeline,
    s: &FaShape,
    out: TensorId,
    source: &'static str,
) {
    if s.ngroups_swapped() && s.num_heads_k > 1 {
        tl.alloc(
            "out (transposed back)",
            &[s.batch(), s.num_heads, s.head_dim],
            s.dtype,
            source,
        );
        tl.free(out);
    }
}

/// `num_splits_heuristic` of `csrc/flash_attn/flash_api.cpp` (identical in v2.5.9, v2.8.3 and
/// PyTorch's copy): the smallest split count within 85% of the best wave efficiency.
pub fn num_splits_heuristic(
    batch_nheads_mblocks: u64,
    num_sms: u64,
    num_n_blocks: u64,
    max_splits: u64,
) -> u64 {
    if batch_nheads_mblocks as f32 >= 0.8f32 * num_sms as f32 {
        return 1;
    }
    let max_splits = max_splits.min(num_sms).min(num_n_blocks);
    let eligible = |s: u64| s == 1 || num_n_blocks.div_ceil(s) != num_n_blocks.div_ceil(s - 1);
    let mut eff = Vec::with_capacity(max_splits as usize);
    let mut max_eff = 0f32;
    for s in 1..=max_splits {
        if eligible(s) {
            let waves = batch_nheads_mblocks.saturating_mul(s) as f32 / num_sms as f32;
            let e = waves / waves.ceil();
            max_eff = max_eff.max(e);
            eff.push(e);
        } else {
            eff.push(0.0);
        }
    }
    for s in 1..=max_splits {
        if eligible(s) && f64::from(eff[(s - 1) as usize]) >= 0.85 * f64::from(max_eff) {
            return s;
        }
    }
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heuristic_matches_the_comment_in_flash_api() {
        // "if we have batch * n_heads = 48 and we have 108 SMs, having 2 splits (efficiency =
        // 0.89) is better than having 3 splits (efficiency = 0.67)".
        assert_eq!(num_splits_heuristic(48, 108, 64, 128), 2);
        // Enough blocks to fill the GPU: no split.
        assert_eq!(num_splits_heuristic(400, 264, 1000, 128), 1);
    }
}
