//! `fla-0.6.0`: flash-linear-attention 0.6.0 (the `fla-core==0.6.0` wheel),
//! `fla/ops/gated_delta_rule/chunk.py::chunk_gated_delta_rule` on the Triton path.
//!
//! Read from the wheel's sources: `chunk.py` (`ChunkGatedDeltaRuleFunction.forward`,
//! `chunk_gated_delta_rule_fwd`), `chunk_fwd.py::chunk_gated_delta_rule_fwd_intra` (the fused
//! kkt + solve_tril kernel for `chunk_size == 64`: one `A` in the input dtype, no fp32 `A`),
//! `wy_fast.py::recompute_w_u_fwd`, `common/chunk_delta_h.py::chunk_gated_delta_rule_fwd_h`,
//! `common/chunk_o.py::chunk_fwd_o`, `utils/cumsum.py::chunk_local_cumsum_scalar`,
//! `modules/norm/l2norm.py::l2norm_fwd`.
//!
//! Grouped value attention: q and k carry `Hk` heads, v and everything derived from it `HV`.
//! Not modelled: the optional FlashQLA / TileLang / intra-card-CP backends (absent unless their
//! packages or `FLA_INTRACARD_CP=1` are present), the index tensors of `prepare_chunk_indices`
//! and `prepare_chunk_offsets` (cached per `cu_seqlens` object by `tensor_cache`), and Triton
//! autotuning buffers of a first call.

use crate::gdn::{
    GdnVariantSpec, IntraChunk, L2normSites, LastFrees, QkHeads, StateLayout, WuOrder,
};
use crate::{GdnShape, ModelError, Tensor};

/// What sets fla 0.6.0 apart: the fused intra-chunk kernel (no fp32 `A`), l2norm with `rstd`,
/// and `A` released before `g` (measured on the H200, torch 2.11, fla-core 0.6.0, caching off;
/// see docs/validation.md).
pub const SPEC: GdnVariantSpec = GdnVariantSpec {
    name: "fla-0.6.0",
    default_l2norm_in_kernel: false,
    qk_heads: QkHeads::Key,
    l2norm: L2normSites {
        y: "fla-0.6.0 fla/modules/norm/l2norm.py:117 y = torch.empty_like(x)",
        rstd: Some("fla-0.6.0 fla/modules/norm/l2norm.py:128 rstd = torch.empty((T,), float32)"),
    },
    g_cumsum: "fla-0.6.0 fla/ops/utils/cumsum.py:278 torch.empty_like(g, dtype=float32)",
    intra_chunk: IntraChunk::Fused {
        a: "fla-0.6.0 fla/ops/gated_delta_rule/chunk_fwd.py:385 torch.zeros(B, T, HV, BT, dtype=k.dtype)",
    },
    wu_order: WuOrder::WThenU,
    w: "fla-0.6.0 fla/ops/gated_delta_rule/wy_fast.py:273 k.new_empty(B, T, HV, K)",
    u: "fla-0.6.0 fla/ops/gated_delta_rule/wy_fast.py:274 torch.empty_like(v)",
    state_layout: StateLayout::KeyValue,
    h: "fla-0.6.0 fla/ops/common/chunk_delta_h.py:722 k.new_empty(B, NT, HV, K, V)",
    final_state: "fla-0.6.0 fla/ops/common/chunk_delta_h.py:723 k.new_zeros(N, HV, K, V, dtype=float32)",
    v_new: "fla-0.6.0 fla/ops/common/chunk_delta_h.py:725 torch.empty_like(u)",
    o: "fla-0.6.0 fla/ops/common/chunk_o.py:565 torch.empty_like(v)",
    last_frees: LastFrees::AThenG,
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

    /// The measured ground truth (docs/architecture.md): T=4128, H=48, K=V=128, bf16.
    #[test]
    fn pins_the_measured_sizes_and_order() {
        let s = GdnShape::new(&[4128], 48, 128, 128, DType::BF16);
        let t = tensors(&s).unwrap();
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "g (cumsum)",
                "A",
                "w",
                "u",
                "h",
                "final_state",
                "v_new",
                "o"
            ]
        );
        let bytes: Vec<u64> = t.iter().map(|t| t.bytes).collect();
        assert_eq!(
            bytes,
            [
                792_576,
                25_362_432,
                50_724_864,
                50_724_864,
                102_236_160,
                3_145_728,
                50_724_864,
                50_724_864
            ]
        );
        let p = peak(&t);
        assert_eq!(p.bytes, 334_436_352); // 318.94 MiB above the inputs
        assert_eq!(p.live.len(), 8);
        // o and final_state are returned; everything else is freed by the end of the call.
        assert_eq!(t[7].freed_at, None);
        assert_eq!(t[5].freed_at, None);
        assert!(t.iter().filter(|t| t.freed_at.is_some()).count() == 6);
        // Free order measured on the H200: w, u, h, v_new, then A, then g.
        let mut freed: Vec<(usize, &str)> = t
            .iter()
            .filter_map(|x| Some((x.freed_at?, x.name.as_str())))
            .collect();
        freed.sort();
        let order: Vec<&str> = freed.into_iter().map(|(_, n)| n).collect();
        assert_eq!(order, ["w", "u", "h", "v_new", "A", "g (cumsum)"]);
    }

    #[test]
    fn grouped_value_heads_and_l2norm() {
        let mut s = GdnShape::new(&[4128], 16, 128, 128, DType::BF16);
        s.num_v_heads = 48;
        s.l2norm_in_kernel = Some(true);
        let t = tensors(&s).unwrap();
        assert_eq!(t[0].name, "q (l2norm)");
        assert_eq!(t[0].bytes, 4128 * 16 * 128 * 2);
        assert_eq!(t[1].bytes, 4128 * 16 * 4);
        assert_eq!(t[4].name, "g (cumsum)");
        assert_eq!(t[4].bytes, 792_576);
        assert_eq!(t.iter().find(|t| t.name == "h").unwrap().bytes, 102_236_160);
    }

    #[test]
    fn varlen_sizes_h_by_chunks_and_state_by_sequences() {
        let s = GdnShape::new(&[1000, 3000, 128], 48, 128, 128, DType::BF16);
        let t = tensors(&s).unwrap();
        let h = t.iter().find(|t| t.name == "h").unwrap();
        assert_eq!(h.shape, vec![1, 16 + 47 + 2, 48, 128, 128]);
        let fs = t.iter().find(|t| t.name == "final_state").unwrap();
        assert_eq!(fs.shape, vec![3, 48, 128, 128]);
        assert_eq!(fs.bytes, 3 * 3_145_728);
    }
}
