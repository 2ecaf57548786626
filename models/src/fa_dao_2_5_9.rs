//! `fa-2.5.9`: Dao-AILab/flash-attention v2.5.9 (commit `ce735035`), the last release before
//! the unpadded `softmax_lse`: `csrc/flash_attn/flash_api.cpp::mha_varlen_fwd` allocates
//! `softmax_lse = torch::empty({batch_size, num_heads, max_seqlen_q}, float)` — padded on the
//! **query** side to the longest query of the batch, never by `max_seqlen_k`.
//!
//! On the decode path its `set_params_splitkv` allocates `softmax_lse_accum` and `out_accum` as
//! locals of that helper, so they are released when it returns, before the kernel runs (v2.6
//! onwards returns them to keep them alive). Then `rng_state [2]` int64.

use crate::flash_attn::{alloc_split_kv_accumulators, transpose_out_back};
use crate::{DType, FaShape, ModelError, Tensor, Timeline};

/// The variant's name on the command line.
pub const NAME: &str = "fa-2.5.9";

/// The tensors one call allocates, in allocation order.
pub fn tensors(s: &FaShape) -> Result<Vec<Tensor>, ModelError> {
    s.check()?;
    let mut tl = Timeline::new();
    let q = s.kernel_dims();
    let out = tl.alloc(
        "out",
        &[q.total_q, q.heads, s.head_dim],
        s.dtype,
        "fa-2.5.9 csrc/flash_attn/flash_api.cpp mha_varlen_fwd: out = torch::empty_like(q_padded)",
    );
    tl.alloc(
        "softmax_lse",
        &[s.batch(), q.heads, q.max_seqlen_q],
        DType::F32,
        "fa-2.5.9 csrc/flash_attn/flash_api.cpp mha_varlen_fwd: torch::empty({batch_size, num_heads, max_seqlen_q}, float)",
    );
    let accum = alloc_split_kv_accumulators(
        &mut tl,
        s,
        &q,
        [
            "fa-2.5.9 csrc/flash_attn/flash_api.cpp set_params_splitkv: torch::empty({num_splits, B, H, max_seqlen_q}, float)",
            "fa-2.5.9 csrc/flash_attn/flash_api.cpp set_params_splitkv: torch::empty({num_splits, B, H, max_seqlen_q, d_rounded}, float)",
        ],
    );
    // Locals of set_params_splitkv: gone when it returns, before the kernel launch.
    for id in accum.into_iter().rev() {
        tl.free(id);
    }
    tl.alloc(
        "rng_state",
        &[2],
        DType::I64,
        "fa-2.5.9 csrc/flash_attn/flash_api.cpp mha_varlen_fwd: torch::empty({2}, int64)",
    );
    transpose_out_back(
        &mut tl,
        s,
        out,
        "fa-2.5.9 csrc/flash_attn/flash_api.cpp mha_varlen_fwd: out.reshape(size_before).transpose(1, 2).reshape(size_after)",
    );
    tl.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_lse_is_by_query_length() {
        let s = FaShape {
            seqlens_q: vec![4000, 128],
            max_seqlen_k: 200_000,
            num_heads: 24,
            num_heads_k: 4,
            head_dim: 256,
            dtype: DType::BF16,
            num_sms: 82,
        };
        let t = tensors(&s).unwrap();
        let lse = t.iter().find(|t| t.name == "softmax_lse").unwrap();
        assert_eq!(lse.shape, vec![2, 24, 4000]);
        assert_eq!(lse.bytes, 768_000);
        // The unpadded layout of v2.6+ holds total_q = 4128 columns instead of 2 x 4000.
        let new = crate::fa_dao_2_8_3::tensors(&s).unwrap();
        assert_eq!(new[1].bytes, 24 * 4128 * 4);
    }
}
