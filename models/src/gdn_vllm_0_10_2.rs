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

use crate::{DType, GdnShape, ModelError, Tensor, Timeline, gdn::CHUNK};

/// The variant's name on the command line.
pub const NAME: &str = "vllm-0.10.2";

/// What `models/qwen3_next.py` passes as `use_qk_l2norm_in_kernel` in this version.
pub const DEFAULT_L2NORM_IN_KERNEL: bool = true;

/// The tensors one call allocates, in allocation order.
pub fn tensors(s: &GdnShape) -> Result<Vec<Tensor>, ModelError> {
    s.check()?;
    let (t, hk, hv, k, v) = (
        s.total_tokens(),
        s.num_k_heads,
        s.num_v_heads,
        s.head_k_dim,
        s.head_v_dim,
    );
    let (nt, n, dt) = (s.num_chunks(), s.num_seqs(), s.dtype);
    let mut tl = Timeline::new();

    let mut normed = Vec::new();
    if s.l2norm_in_kernel.unwrap_or(DEFAULT_L2NORM_IN_KERNEL) {
        for name in ["q", "k"] {
            normed.push(tl.alloc(
                &format!("{name} (l2norm)"),
                &[1, t, hk, k],
                dt,
                "vllm-0.10.2 vllm/model_executor/layers/fla/ops/l2norm.py:95 torch.empty_like(x)",
            ));
        }
    }
    let g = tl.alloc(
        "g (cumsum)",
        &[1, t, hv],
        DType::F32,
        "vllm-0.10.2 vllm/model_executor/layers/fla/ops/cumsum.py:144 torch.empty_like(g, dtype=float32)",
    );
    let a32 = tl.alloc(
        "A (fp32, kkt)",
        &[1, t, hv, CHUNK],
        DType::F32,
        "vllm-0.10.2 vllm/model_executor/layers/fla/ops/chunk_scaled_dot_kkt.py:126 torch.empty(B, T, H, BT, dtype=float32)",
    );
    let ad = tl.alloc(
        "Ad (fp32, 16x16 inverses)",
        &[1, t, hv, 16],
        DType::F32,
        "vllm-0.10.2 vllm/model_executor/layers/fla/ops/solve_tril.py:328 torch.empty(B, T, H, 16, dtype=float32)",
    );
    let ai = tl.alloc(
        "Ai",
        &[1, t, hv, CHUNK],
        dt,
        "vllm-0.10.2 vllm/model_executor/layers/fla/ops/solve_tril.py:350 torch.empty(B, T, H, BT, dtype=k.dtype)",
    );
    tl.free(ad);
    tl.free(a32);
    let u = tl.alloc(
        "u",
        &[1, t, hv, v],
        dt,
        "vllm-0.10.2 vllm/model_executor/layers/fla/ops/wy_fast.py:93 torch.empty_like(v)",
    );
    let w = tl.alloc(
        "w",
        &[1, t, hv, k],
        dt,
        "vllm-0.10.2 vllm/model_executor/layers/fla/ops/wy_fast.py:94 k.new_empty(B, T, H, K)",
    );
    let h = tl.alloc(
        "h",
        &[1, nt, hv, k, v],
        dt,
        "vllm-0.10.2 vllm/model_executor/layers/fla/ops/chunk_delta_h.py:264 k.new_empty(B, NT, H, K, V)",
    );
    if s.output_final_state {
        tl.alloc(
            "final_state",
            &[n, hv, k, v],
            DType::F32,
            "vllm-0.10.2 vllm/model_executor/layers/fla/ops/chunk_delta_h.py:265 k.new_empty(N, H, K, V, dtype=float32)",
        );
    }
    let v_new = tl.alloc(
        "v_new",
        &[1, t, hv, v],
        dt,
        "vllm-0.10.2 vllm/model_executor/layers/fla/ops/chunk_delta_h.py:268 torch.empty_like(u)",
    );
    tl.alloc(
        "o",
        &[1, t, hv, v],
        dt,
        "vllm-0.10.2 vllm/model_executor/layers/fla/ops/chunk_o.py:155 torch.empty_like(v)",
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
    use crate::{naive_sum, peak};

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
