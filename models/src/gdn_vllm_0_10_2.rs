//! `vllm-0.10.2`: vLLM 0.10.2's vendored copy of flash-linear-attention (the first release with
//! Qwen3-Next), `vllm/model_executor/layers/fla/ops/chunk.py::chunk_gated_delta_rule` (read from
//! the vllm 0.10.2 wheel), as `models/qwen3_next.py:563` calls it: `use_qk_l2norm_in_kernel=True`,
//! `output_final_state=True`, `cu_seqlens` given.
//!
//! What differs from vllm-0.20.1: `l2norm.py:95` allocates normalised copies of q and k (key heads
//! `Hk`, input dtype, no rstd); `solve_tril.py:328` first allocates `Ad`, the inverted 16x16
//! diagonal blocks, `[B, T, H, 16]` in **fp32**, then `Ai` (`:350`); `Ad` dies when `solve_tril`
//! returns and the fp32 `A` (`chunk_scaled_dot_kkt.py:126`) right after; `h` is `[B, NT, H, K, V]`
//! (`chunk_delta_h.py:264`); `o` is `torch.empty_like(v)` at `chunk_o.py:155`. Index tensors
//! (`prepare_chunk_indices`, `prepare_chunk_offsets`, recomputed inside each function of this
//! version) are a few bytes per chunk and are not modelled.

use crate::gdn::{
    GdnVariantSpec, IntraChunk, L2normSites, LastFrees, QkHeads, StateLayout, WuOrder,
};
use crate::{GdnShape, ModelError, Tensor};

/// What sets vLLM 0.10.2 apart: l2norm in the kernel by default (no `rstd`), `solve_tril`'s
/// fp32 `Ad` beside the fp32 `A`, `u` before `w`.
pub const SPEC: GdnVariantSpec = GdnVariantSpec {
    name: "vllm-0.10.2",
    default_l2norm_in_kernel: true,
    qk_heads: QkHeads::Key,
    l2norm: L2normSites {
        y: "vllm-0.10.2 vllm/model_executor/layers/fla/ops/l2norm.py:95 torch.empty_like(x)",
        rstd: None,
    },
    g_cumsum: "vllm-0.10.2 vllm/model_executor/layers/fla/ops/cumsum.py:144 torch.empty_like(g, dtype=float32)",
    intra_chunk: IntraChunk::Fp32ThenSolveTril {
        a_fp32: "vllm-0.10.2 vllm/model_executor/layers/fla/ops/chunk_scaled_dot_kkt.py:126 torch.empty(B, T, H, BT, dtype=float32)",
        ad_fp32: Some(
            "vllm-0.10.2 vllm/model_executor/layers/fla/ops/solve_tril.py:328 torch.empty(B, T, H, 16, dtype=float32)",
        ),
        ai: "vllm-0.10.2 vllm/model_executor/layers/fla/ops/solve_tril.py:350 torch.empty(B, T, H, BT, dtype=k.dtype)",
    },
    wu_order: WuOrder::UThenW,
    w: "vllm-0.10.2 vllm/model_executor/layers/fla/ops/wy_fast.py:94 k.new_empty(B, T, H, K)",
    u: "vllm-0.10.2 vllm/model_executor/layers/fla/ops/wy_fast.py:93 torch.empty_like(v)",
    state_layout: StateLayout::KeyValue,
    h: "vllm-0.10.2 vllm/model_executor/layers/fla/ops/chunk_delta_h.py:264 k.new_empty(B, NT, H, K, V)",
    final_state: "vllm-0.10.2 vllm/model_executor/layers/fla/ops/chunk_delta_h.py:265 k.new_empty(N, H, K, V, dtype=float32)",
    v_new: "vllm-0.10.2 vllm/model_executor/layers/fla/ops/chunk_delta_h.py:268 torch.empty_like(u)",
    o: "vllm-0.10.2 vllm/model_executor/layers/fla/ops/chunk_o.py:155 torch.empty_like(v)",
    last_frees: LastFrees::GThenA,
};

/// The variant's name on the command line.
pub const NAME: &str = SPEC.name;

/// What `models/qwen3_next.py` passes as `use_qk_l2norm_in_kernel` in this version.
pub const DEFAULT_L2NORM_IN_KERNEL: bool = SPEC.default_l2norm_in_kernel;

/// The tensors one call allocates, in allocation order.
pub fn tensors(s: &GdnShape) -> Result<Vec<Tensor>, ModelError> {
    SPEC.tensors(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, naive_sum, peak};

    #[test]
    fn qwen3_next_layer_at_4128_tokens() {
        let mut s = GdnShape::new(&[4128], 16, 128, 128, DType::BF16);
        s.num_v_heads = 48;
        let t = tensors(&s).unwrap();
        let got: Vec<(&str, u64)> = t.iter().map(|t| (t.name.as_str(), t.bytes)).collect();
        assert_eq!(
            got,
            [
                ("q (l2norm)", 16_908_288),
                ("k (l2norm)", 16_908_288),
                ("g (cumsum)", 792_576),
                ("A (fp32, kkt)", 50_724_864),
                ("Ad (fp32, 16x16 inverses)", 12_681_216),
                ("Ai", 25_362_432),
                ("u", 50_724_864),
                ("w", 50_724_864),
                ("h", 102_236_160),
                ("final_state", 3_145_728),
                ("v_new", 50_724_864),
                ("o", 50_724_864),
            ]
        );
        let p = peak(&t);
        assert_eq!(p.bytes, 334_436_352 + 2 * 16_908_288);
        assert_eq!(naive_sum(&t) - p.bytes, 50_724_864 + 12_681_216);
    }
}
