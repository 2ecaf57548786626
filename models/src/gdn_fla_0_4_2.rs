//! `fla-0.4.2`: flash-linear-attention v0.4.2 (git tag `v0.4.2`, commit `ca910f88`),
//! `fla/ops/gated_delta_rule/chunk.py::chunk_gated_delta_rule`, the unfused generation.
//!
//! Before the fused intra-chunk kernel: `chunk_scaled_dot_kkt_fwd` writes `A` in **fp32**
//! (`common/chunk_scaled_dot_kkt.py:113`), `utils/solve_tril.py:374` writes its inverse `Ai`
//! in the input dtype, and the fp32 `A` is released when `A = solve_tril(...)` rebinds the name,
//! before `w` and `u` exist. No grouped value attention: q, k and v share one head count, so a
//! caller with `Hk < HV` repeats q and k to `HV` heads before calling (modelled here as `HV`).
//! Other files read: `gated_delta_rule/wy_fast.py::recompute_w_u_fwd` (w before u),
//! `common/chunk_delta_h.py`, `common/chunk_o.py`, `utils/cumsum.py`, `modules/l2norm.py`.

use crate::gdn::{
    GdnVariantSpec, IntraChunk, L2normSites, LastFrees, QkHeads, StateLayout, WuOrder,
};
use crate::{GdnShape, ModelError, Tensor};

/// What sets fla 0.4.2 apart: no grouped value attention, the fp32 `A` of
/// `chunk_scaled_dot_kkt` freed once `solve_tril` has written `Ai`, l2norm with `rstd`.
pub const SPEC: GdnVariantSpec = GdnVariantSpec {
    name: "fla-0.4.2",
    default_l2norm_in_kernel: false,
    qk_heads: QkHeads::Value,
    l2norm: L2normSites {
        y: "fla-0.4.2 fla/modules/l2norm.py:141 y = torch.empty_like(x)",
        rstd: Some("fla-0.4.2 fla/modules/l2norm.py:152 rstd = torch.empty((T,), float32)"),
    },
    g_cumsum: "fla-0.4.2 fla/ops/utils/cumsum.py:266 torch.empty_like(g, dtype=float32)",
    intra_chunk: IntraChunk::Fp32ThenSolveTril {
        a_fp32: "fla-0.4.2 fla/ops/common/chunk_scaled_dot_kkt.py:113 torch.empty(B, T, H, BT, dtype=float32)",
        ad_fp32: None,
        ai: "fla-0.4.2 fla/ops/utils/solve_tril.py:374 torch.zeros_like(A, dtype=k.dtype)",
    },
    wu_order: WuOrder::WThenU,
    w: "fla-0.4.2 fla/ops/gated_delta_rule/wy_fast.py:260 torch.empty_like(k)",
    u: "fla-0.4.2 fla/ops/gated_delta_rule/wy_fast.py:261 torch.empty_like(v)",
    state_layout: StateLayout::KeyValue,
    h: "fla-0.4.2 fla/ops/common/chunk_delta_h.py:687 k.new_empty(B, NT, H, K, V)",
    final_state: "fla-0.4.2 fla/ops/common/chunk_delta_h.py:688 k.new_zeros(N, H, K, V, dtype=float32)",
    v_new: "fla-0.4.2 fla/ops/common/chunk_delta_h.py:690 torch.empty_like(u)",
    o: "fla-0.4.2 fla/ops/common/chunk_o.py:519 torch.empty_like(v)",
    last_frees: LastFrees::GThenA,
};

/// The variant's name on the command line.
pub const NAME: &str = SPEC.name;

/// `use_qk_l2norm_in_kernel` when the caller does not say: the function's own default.
pub const DEFAULT_L2NORM_IN_KERNEL: bool = SPEC.default_l2norm_in_kernel;

/// The tensors one call allocates, in allocation order.
pub fn tensors(s: &GdnShape) -> Result<Vec<Tensor>, ModelError> {
    SPEC.tensors(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, peak};

    #[test]
    fn fp32_a_is_gone_before_w_and_u() {
        let s = GdnShape::new(&[4128], 48, 128, 128, DType::BF16);
        let t = tensors(&s).unwrap();
        let bytes: Vec<(&str, u64)> = t.iter().map(|t| (t.name.as_str(), t.bytes)).collect();
        assert_eq!(
            bytes,
            [
                ("g (cumsum)", 792_576),
                ("A (fp32, kkt)", 50_724_864),
                ("Ai", 25_362_432),
                ("w", 50_724_864),
                ("u", 50_724_864),
                ("h", 102_236_160),
                ("final_state", 3_145_728),
                ("v_new", 50_724_864),
                ("o", 50_724_864),
            ]
        );
        assert_eq!(t[1].freed_at, Some(3));
        assert_eq!(t[3].alloc_at, 4);
        // Same peak as 0.6.0: the fp32 A never meets u.
        assert_eq!(peak(&t).bytes, 334_436_352);
    }
}
