//! `vllm-0.20.1`: vLLM 0.20.1's vendored copy of flash-linear-attention,
//! `vllm/model_executor/layers/fla/ops/chunk.py::chunk_gated_delta_rule` (read from the
//! vllm 0.20.1 wheel), as `layers/mamba/gdn_linear_attn.py` calls it for Qwen3-Next / Qwen3.5 /
//! Qwen3.6 prefill on the Triton path (`forward_native`; on SM90 vLLM picks FlashInfer's GDN
//! prefill by default, which this variant does not describe).
//!
//! What differs from fla 0.6.0: `chunk_scaled_dot_kkt.py:144` writes `A` in **fp32**;
//! `solve_tril.py:539` writes `Ai` in the input dtype and the fp32 `A` dies when the name is
//! rebound, before `u` exists; q and k keep the key heads `Hk` while everything else has `HV`;
//! `wy_fast.py:137-138` allocates `u` before `w`; `h` is laid out `[B, NT, H, V, K]`
//! (`chunk_delta_h.py:332`) and `final_state` is `new_empty` (`:334`); `o` is
//! `torch.empty_like(v)` at `chunk_o.py:161`. The layer normalises q and k in
//! `fused_post_conv_prep` before the call and passes `use_qk_l2norm_in_kernel=False`, and passes
//! precomputed `chunk_indices`/`chunk_offsets`, so the call itself allocates no index tensors.

use crate::gdn::{
    GdnVariantSpec, IntraChunk, L2normSites, LastFrees, QkHeads, StateLayout, WuOrder,
};
use crate::{GdnShape, ModelError, Tensor};

/// What sets vLLM 0.20.1 apart: the fp32 `A` freed after `solve_tril`, `u` before `w`, and `h`
/// and `final_state` laid out `[.., V, K]`.
pub const SPEC: GdnVariantSpec = GdnVariantSpec {
    name: "vllm-0.20.1",
    default_l2norm_in_kernel: false,
    qk_heads: QkHeads::Key,
    l2norm: L2normSites {
        y: "vllm-0.20.1 vllm/model_executor/layers/fla/ops/l2norm.py:102 torch.empty_like(x)",
        rstd: None,
    },
    g_cumsum: "vllm-0.20.1 vllm/model_executor/layers/fla/ops/cumsum.py:180 torch.empty_like(g, dtype=float32)",
    intra_chunk: IntraChunk::Fp32ThenSolveTril {
        a_fp32: "vllm-0.20.1 vllm/model_executor/layers/fla/ops/chunk_scaled_dot_kkt.py:144 torch.empty(B, T, H, BT, dtype=float32)",
        ad_fp32: None,
        ai: "vllm-0.20.1 vllm/model_executor/layers/fla/ops/solve_tril.py:539 torch.zeros_like(A, dtype=k.dtype)",
    },
    wu_order: WuOrder::UThenW,
    w: "vllm-0.20.1 vllm/model_executor/layers/fla/ops/wy_fast.py:138 k.new_empty(B, T, H, K)",
    u: "vllm-0.20.1 vllm/model_executor/layers/fla/ops/wy_fast.py:137 torch.empty_like(v)",
    state_layout: StateLayout::ValueKey,
    h: "vllm-0.20.1 vllm/model_executor/layers/fla/ops/chunk_delta_h.py:332 k.new_empty(B, NT, H, V, K)",
    final_state: "vllm-0.20.1 vllm/model_executor/layers/fla/ops/chunk_delta_h.py:334 k.new_empty(N, H, V, K, dtype=float32)",
    v_new: "vllm-0.20.1 vllm/model_executor/layers/fla/ops/chunk_delta_h.py:337 torch.empty_like(u)",
    o: "vllm-0.20.1 vllm/model_executor/layers/fla/ops/chunk_o.py:161 torch.empty_like(v)",
    last_frees: LastFrees::GThenA,
};

/// The variant's name on the command line.
pub const NAME: &str = SPEC.name;

/// What `gdn_linear_attn.py` passes as `use_qk_l2norm_in_kernel` on the prefill path.
pub const DEFAULT_L2NORM_IN_KERNEL: bool = SPEC.default_l2norm_in_kernel;

/// The tensors one call allocates, in allocation order.
pub fn tensors(s: &GdnShape) -> Result<Vec<Tensor>, ModelError> {
    SPEC.tensors(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, naive_sum, peak};

    /// Issue 4: 48.4 MiB per [T, H, 128] tensor and 97.5 MiB for h at T=4128, H=48, K=V=128.
    #[test]
    fn pins_the_issue_values() {
        let mut s = GdnShape::new(&[4128], 16, 128, 128, DType::BF16);
        s.num_v_heads = 48;
        let t = tensors(&s).unwrap();
        let got: Vec<(&str, u64)> = t.iter().map(|t| (t.name.as_str(), t.bytes)).collect();
        assert_eq!(
            got,
            [
                ("g (cumsum)", 792_576),
                ("A (fp32, kkt)", 50_724_864),
                ("Ai", 25_362_432),
                ("u", 50_724_864),
                ("w", 50_724_864),
                ("h", 102_236_160),
                ("final_state", 3_145_728),
                ("v_new", 50_724_864),
                ("o", 50_724_864),
            ]
        );
        assert_eq!(50_724_864.0 / 1048576.0, 48.375); // "48.4 MiB"
        assert_eq!(102_236_160.0 / 1048576.0, 97.5);
        // The fp32 A is freed before u is allocated ...
        assert!(t[1].freed_at.unwrap() < t[3].alloc_at);
        let p = peak(&t);
        assert_eq!(p.bytes, 334_436_352);
        assert!(!p.live.contains(&1));
        // ... so the naive sum over-counts by exactly its 48.4 MiB.
        assert_eq!(naive_sum(&t) - p.bytes, 50_724_864);
    }

    #[test]
    fn tp2_halves_every_head_sized_tensor() {
        let mut s = GdnShape::new(&[4128], 8, 128, 128, DType::BF16);
        s.num_v_heads = 24;
        let t = tensors(&s).unwrap();
        assert_eq!(t.iter().find(|t| t.name == "h").unwrap().bytes, 51_118_080);
        assert_eq!(peak(&t).bytes, 334_436_352 / 2);
    }
}
