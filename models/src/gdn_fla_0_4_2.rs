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

use crate::{DType, GdnShape, ModelError, Tensor, Timeline, gdn::CHUNK};

/// The variant's name on the command line.
pub const NAME: &str = "fla-0.4.2";

/// `use_qk_l2norm_in_kernel` when the caller does not say: the function's own default.
pub const DEFAULT_L2NORM_IN_KERNEL: bool = false;

/// The tensors one call allocates, in allocation order.
pub fn tensors(s: &GdnShape) -> Result<Vec<Tensor>, ModelError> {
    s.check()?;
    // No GVA in this version: every tensor has HV heads.
    let (t, h_, k, v) = (s.total_tokens(), s.num_v_heads, s.head_k_dim, s.head_v_dim);
    let (nt, n, dt) = (s.num_chunks(), s.num_seqs(), s.dtype);
    let mut tl = Timeline::new();

    let mut normed = Vec::new();
    if s.l2norm_in_kernel.unwrap_or(DEFAULT_L2NORM_IN_KERNEL) {
        for name in ["q", "k"] {
            normed.push(tl.alloc(
                &format!("{name} (l2norm)"),
                &[1, t, h_, k],
                dt,
                "fla-0.4.2 fla/modules/l2norm.py:141 y = torch.empty_like(x)",
            ));
            normed.push(tl.alloc(
                &format!("{name}_rstd"),
                &[1, t, h_],
                DType::F32,
                "fla-0.4.2 fla/modules/l2norm.py:152 rstd = torch.empty((T,), float32)",
            ));
        }
    }
    let g = tl.alloc(
        "g (cumsum)",
        &[1, t, h_],
        DType::F32,
        "fla-0.4.2 fla/ops/utils/cumsum.py:266 torch.empty_like(g, dtype=float32)",
    );
    let a32 = tl.alloc(
        "A (fp32, kkt)",
        &[1, t, h_, CHUNK],
        DType::F32,
        "fla-0.4.2 fla/ops/common/chunk_scaled_dot_kkt.py:113 torch.empty(B, T, H, BT, dtype=float32)",
    );
    let ai = tl.alloc(
        "Ai",
        &[1, t, h_, CHUNK],
        dt,
        "fla-0.4.2 fla/ops/utils/solve_tril.py:374 torch.zeros_like(A, dtype=k.dtype)",
    );
    tl.free(a32);
    let w = tl.alloc(
        "w",
        &[1, t, h_, k],
        dt,
        "fla-0.4.2 fla/ops/gated_delta_rule/wy_fast.py:260 torch.empty_like(k)",
    );
    let u = tl.alloc(
        "u",
        &[1, t, h_, v],
        dt,
        "fla-0.4.2 fla/ops/gated_delta_rule/wy_fast.py:261 torch.empty_like(v)",
    );
    let h = tl.alloc(
        "h",
        &[1, nt, h_, k, v],
        dt,
        "fla-0.4.2 fla/ops/common/chunk_delta_h.py:687 k.new_empty(B, NT, H, K, V)",
    );
    if s.output_final_state {
        tl.alloc(
            "final_state",
            &[n, h_, k, v],
            DType::F32,
            "fla-0.4.2 fla/ops/common/chunk_delta_h.py:688 k.new_zeros(N, H, K, V, dtype=float32)",
        );
    }
    let v_new = tl.alloc(
        "v_new",
        &[1, t, h_, v],
        dt,
        "fla-0.4.2 fla/ops/common/chunk_delta_h.py:690 torch.empty_like(u)",
    );
    tl.alloc(
        "o",
        &[1, t, h_, v],
        dt,
        "fla-0.4.2 fla/ops/common/chunk_o.py:519 torch.empty_like(v)",
    );
    for id in [w, u, h, v_new] {
        tl.free(id);
    }
    for id in normed {
        tl.free(id);
    }
    tl.free(g);
    tl.free(ai);
    Ok(tl.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peak;

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
