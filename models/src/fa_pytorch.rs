//! `pytorch`: PyTorch's copy of FlashAttention-2 behind `aten::_flash_attention_forward`
//! (`aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp::mha_varlen_fwd`, read at
//! pytorch/pytorch commit `03b7c19d`; `attention.cu::_flash_attention_forward` passes no `out`).
//!
//! Allocation order: `out = at::empty_like(q)`, `softmax_lse = at::empty({num_heads, total_q},
//! float)`, on the decode path (or with a paged KV cache) the split-KV accumulators (kept until
//! return), then `rng_state = at::empty({2}, uint64)` and `_unused = at::empty({}, uint64)` (8
//! bytes: PyTorch's philox offset). `debug_attn_mask` is `at::empty({0})` and allocates nothing.

use crate::flash_attn::{alloc_split_kv_accumulators, transpose_out_back};
use crate::{DType, FaShape, ModelError, Tensor, Timeline};

/// The variant's name on the command line.
pub const NAME: &str = "pytorch";

/// The tensors one call allocates, in allocation order.
pub fn tensors(s: &FaShape) -> Result<Vec<Tensor>, ModelError> {
    s.check()?;
    let mut tl = Timeline::new();
    let q = s.kernel_dims();
    let out = tl.alloc(
        "out",
        &[q.total_q, q.heads, s.head_dim],
        s.dtype,
        "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_varlen_fwd: out = at::empty_like(q_padded)",
    );
    tl.alloc(
        "softmax_lse",
        &[q.heads, q.total_q],
        DType::F32,
        "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_varlen_fwd: at::empty({num_heads, total_q}, float)",
    );
    let accum = alloc_split_kv_accumulators(
        &mut tl,
        s,
        &q,
        [
            "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp set_params_splitkv: at::empty({num_splits, B, H, max_seqlen_q}, float)",
            "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp set_params_splitkv: at::empty({num_splits, B, H, max_seqlen_q, d_rounded}, float)",
        ],
    );
    tl.alloc(
        "rng_state",
        &[2],
        DType::U64,
        "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_varlen_fwd: at::empty({2}, uint64)",
    );
    tl.alloc(
        "_unused (philox offset)",
        &[],
        DType::U64,
        "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_varlen_fwd: at::empty({}, uint64)",
    );
    transpose_out_back(
        &mut tl,
        s,
        out,
        "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_varlen_fwd: out.reshape(size_before).transpose(1, 2).reshape(size_after)",
    );
    // All of it happens below the one operator Python sees (`--torch-shapes` on the H200 named
    // `_flash_attention_forward` as the operator of out, softmax_lse, rng_state and the offset).
    tl.inside_operator("aten::_flash_attention_forward");
    // Kept until return; locals die in reverse order of declaration.
    for id in accum.into_iter().rev() {
        tl.free(id);
    }
    tl.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_allocations() {
        let s = FaShape {
            seqlens_q: vec![1000, 3128],
            max_seqlen_k: 1_000_000,
            num_heads: 24,
            num_heads_k: 4,
            head_dim: 256,
            dtype: DType::BF16,
            num_sms: 132,
        };
        let t = tensors(&s).unwrap();
        let got: Vec<(&str, u64)> = t.iter().map(|t| (t.name.as_str(), t.bytes)).collect();
        assert_eq!(
            got,
            [
                ("out", 50_724_864),
                ("softmax_lse", 396_288),
                ("rng_state", 16),
                ("_unused (philox offset)", 8)
            ]
        );
    }
}
