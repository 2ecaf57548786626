//! `pytorch`: PyTorch's copy of FlashAttention-2 behind `aten::_flash_attention_forward`
//! (`aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp::mha_varlen_fwd`, read at
//! pytorch/pytorch commit `03b7c19d`; `attention.cu::_flash_attention_forward` passes no `out`).
//!
//! Allocation order: `out = at::empty_like(q)`, `softmax_lse = at::empty({num_heads, total_q},
//! float)`, on the decode path (or with a paged KV cache) the split-KV accumulators (kept until
//! return), then `rng_state = at::empty({2}, uint64)` and `_unused = at::empty({}, uint64)` (8
//! bytes: PyTorch's philox offset). `debug_attn_mask` is `at::empty({0})` and allocates nothing.

use crate::model::{DType, FaShape, ModelError, Tensor, Timeline};

/// The variant's name on the command line.
pub const NAME: &str = "pytorch";

/// The tensors one call allocates, in allocation order.
pub fn tensors(s: &FaShape) -> Result<Vec<Tensor>, ModelError> {
    s.check()?;
    let mut tl = Timeline::new();
    let swapped = s.ngroups_swapped();
    let (b, d) = (s.batch(), s.head_dim);
    let (heads, tq, msq) = if swapped {
        (
            s.num_heads_k,
            b * (s.num_heads / s.num_heads_k),
            s.num_heads / s.num_heads_k,
        )
    } else {
        (s.num_heads, s.total_q(), s.max_seqlen_q())
    };
    let out = tl.alloc(
        "out",
        &[tq, heads, d],
        s.dtype,
        "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_varlen_fwd: out = at::empty_like(q_padded)",
    );
    tl.alloc(
        "softmax_lse",
        &[heads, tq],
        DType::F32,
        "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_varlen_fwd: at::empty({num_heads, total_q}, float)",
    );
    let mut accum = Vec::new();
    if swapped {
        let splits = s.num_splits(heads, msq);
        if splits > 1 {
            accum.push(tl.alloc(
                "softmax_lse_accum",
                &[splits, b, heads, msq],
                DType::F32,
                "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp set_params_splitkv: at::empty({num_splits, B, H, max_seqlen_q}, float)",
            ));
            accum.push(tl.alloc(
                "out_accum",
                &[splits, b, heads, msq, s.head_size_rounded()],
                DType::F32,
                "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp set_params_splitkv: at::empty({num_splits, B, H, max_seqlen_q, d_rounded}, float)",
            ));
        }
    }
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
    if swapped && s.num_heads_k > 1 {
        tl.alloc(
            "out (transposed back)",
            &[b, s.num_heads, d],
            s.dtype,
            "pytorch@03b7c19d aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_varlen_fwd: out.reshape(size_before).transpose(1, 2).reshape(size_after)",
        );
        tl.free(out);
    }
    for id in accum.into_iter().rev() {
        tl.free(id);
    }
    Ok(tl.finish())
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
