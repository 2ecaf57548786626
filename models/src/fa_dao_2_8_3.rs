//! `fa-2.8.3`: Dao-AILab/flash-attention v2.8.3 (commit `060c9188`),
//! `csrc/flash_attn/flash_api.cpp::mha_varlen_fwd`. The same allocations since v2.6.0 (commit
//! `da11d1b8`), which made `softmax_lse` unpadded: `[num_heads, total_q]` fp32.
//!
//! Allocation order: `out = torch::empty_like(q)` (unless an `out` is passed),
//! `softmax_lse = torch::empty({num_heads, total_q}, float)`, then on the decode path
//! (`seqlenq_ngroups_swapped`: one query token, GQA) the split-KV accumulators
//! `softmax_lse_accum [splits, B, Hk, ngroups]` and `out_accum [splits, B, Hk, ngroups, d_rounded]`
//! in fp32 (kept alive until the function returns), then `rng_state [2]` int64. On the decode
//! path the output is transposed back with a copying `reshape`. `p` is `torch::empty({0})` and
//! allocates nothing. `max_seqlen_k` appears only in the split heuristic.

use crate::flash_attn::{alloc_split_kv_accumulators, transpose_out_back};
use crate::{DType, FaShape, ModelError, Tensor, Timeline};

/// The variant's name on the command line.
pub const NAME: &str = "fa-2.8.3";

/// The tensors one call allocates, in allocation order.
pub fn tensors(s: &FaShape) -> Result<Vec<Tensor>, ModelError> {
    s.check()?;
    let mut tl = Timeline::new();
    let q = s.kernel_dims();
    let out = tl.alloc(
        "out",
        &[q.total_q, q.heads, s.head_dim],
        s.dtype,
        "fa-2.8.3 csrc/flash_attn/flash_api.cpp:643 out = torch::empty_like(q)",
    );
    tl.alloc(
        "softmax_lse",
        &[q.heads, q.total_q],
        DType::F32,
        "fa-2.8.3 csrc/flash_attn/flash_api.cpp:652 torch::empty({num_heads, total_q}, float)",
    );
    let accum = alloc_split_kv_accumulators(
        &mut tl,
        s,
        &q,
        [
            "fa-2.8.3 csrc/flash_attn/flash_api.cpp:320 torch::empty({num_splits, B, H, max_seqlen_q}, float)",
            "fa-2.8.3 csrc/flash_attn/flash_api.cpp:321 torch::empty({num_splits, B, H, max_seqlen_q, d_rounded}, float)",
        ],
    );
    tl.alloc(
        "rng_state",
        &[2],
        DType::I64,
        "fa-2.8.3 csrc/flash_attn/flash_api.cpp:723 torch::empty({2}, int64)",
    );
    transpose_out_back(
        &mut tl,
        s,
        out,
        "fa-2.8.3 csrc/flash_attn/flash_api.cpp:749 out.reshape(size_before).transpose(1, 2).reshape(size_after)",
    );
    // Locals die in reverse order of declaration: out_accum, then softmax_lse_accum.
    for id in accum.into_iter().rev() {
        tl.free(id);
    }
    tl.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peak;

    fn prefill(max_k: u64) -> FaShape {
        FaShape {
            seqlens_q: vec![4128],
            max_seqlen_k: max_k,
            num_heads: 24,
            num_heads_k: 4,
            head_dim: 256,
            dtype: DType::BF16,
            num_sms: 82,
        }
    }

    #[test]
    fn softmax_lse_is_unpadded_and_ignores_max_seqlen_k() {
        let t = tensors(&prefill(4128)).unwrap();
        let got: Vec<(&str, u64)> = t.iter().map(|t| (t.name.as_str(), t.bytes)).collect();
        assert_eq!(
            got,
            [
                ("out", 50_724_864),
                ("softmax_lse", 396_288),
                ("rng_state", 16)
            ]
        );
        assert_eq!(t, tensors(&prefill(196_608)).unwrap());
        assert_eq!(peak(&t).bytes, 51_121_168);
    }

    #[test]
    fn decode_with_gqa_splits_kv() {
        let s = FaShape {
            seqlens_q: vec![1, 1],
            max_seqlen_k: 65536,
            num_heads: 24,
            num_heads_k: 4,
            head_dim: 256,
            dtype: DType::BF16,
            num_sms: 132,
        };
        // 2 sequences x 4 KV heads x 1 m-block = 8 blocks on 264 slots: split.
        let splits = s.num_splits(4, 6);
        assert!(splits > 1);
        let t = tensors(&s).unwrap();
        let acc = t.iter().find(|t| t.name == "out_accum").unwrap();
        assert_eq!(acc.shape, vec![splits, 2, 4, 6, 256]);
        assert_eq!(
            t.iter().find(|t| t.name == "softmax_lse").unwrap().shape,
            vec![4, 12]
        );
    }
}
