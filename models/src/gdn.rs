//! What every Gated DeltaNet chunk-forward variant shares: the shape of one call.

use serde::Serialize;

use crate::{DType, ModelConfig, ModelError, tp_split};

/// The chunk size `BT` of every GDN chunk kernel modelled here (`chunk_size=64`).
pub const CHUNK: u64 = 64;

/// The shape of one `chunk_gated_delta_rule` call on a packed (varlen) batch.
///
/// Inputs are laid out `[1, T, heads, dim]` with `cu_seqlens` marking the sequences, as vLLM
/// calls the kernel; a single sequence without `cu_seqlens` allocates the same bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GdnShape {
    /// Token count of each packed sequence (`T_i`).
    pub seqlens: Vec<u64>,
    /// Query/key heads on this rank (`Hk`, `linear_num_key_heads / tp`).
    pub num_k_heads: u64,
    /// Value heads on this rank (`HV`, `linear_num_value_heads / tp`).
    pub num_v_heads: u64,
    /// Key head dimension (`K`).
    pub head_k_dim: u64,
    /// Value head dimension (`V`).
    pub head_v_dim: u64,
    /// The dtype of q, k, v.
    pub dtype: DType,
    /// Whether the caller asks for the final recurrent state (vLLM always does).
    pub output_final_state: bool,
    /// Whether q and k are L2-normalised inside the kernel call (`use_qk_l2norm_in_kernel`);
    /// `None` takes what the variant's own Qwen3-Next layer passes.
    pub l2norm_in_kernel: Option<bool>,
}

impl GdnShape {
    /// The GDN call of one linear-attention layer of `cfg` on this rank.
    pub fn from_config(
        cfg: &ModelConfig,
        seqlens: &[u64],
        tp: u64,
        dtype: DType,
    ) -> Result<Self, ModelError> {
        Ok(GdnShape {
            seqlens: seqlens.to_vec(),
            num_k_heads: tp_split("linear_num_key_heads", cfg.linear_num_key_heads, tp)?,
            num_v_heads: tp_split("linear_num_value_heads", cfg.linear_num_value_heads, tp)?,
            head_k_dim: cfg.linear_key_head_dim,
            head_v_dim: cfg.linear_value_head_dim,
            dtype,
            output_final_state: true,
            l2norm_in_kernel: None,
        })
    }

    /// A shape with equal key and value heads, for direct use and tests.
    pub fn new(seqlens: &[u64], heads: u64, k: u64, v: u64, dtype: DType) -> Self {
        GdnShape {
            seqlens: seqlens.to_vec(),
            num_k_heads: heads,
            num_v_heads: heads,
            head_k_dim: k,
            head_v_dim: v,
            dtype,
            output_final_state: true,
            l2norm_in_kernel: None,
        }
    }

    /// Total tokens `T = Σ T_i`.
    pub fn total_tokens(&self) -> u64 {
        self.seqlens.iter().sum()
    }

    /// Number of sequences `N`.
    pub fn num_seqs(&self) -> u64 {
        self.seqlens.len() as u64
    }

    /// Number of chunks `NT = Σ ceil(T_i / 64)`: chunks never straddle two sequences.
    pub fn num_chunks(&self) -> u64 {
        self.seqlens.iter().map(|t| t.div_ceil(CHUNK)).sum()
    }

    pub(crate) fn check(&self) -> Result<(), ModelError> {
        check_seqlens(&self.seqlens)?;
        if self.num_k_heads == 0 || !self.num_v_heads.is_multiple_of(self.num_k_heads) {
            return Err(ModelError::Invalid(format!(
                "{} value heads are not a multiple of {} key heads",
                self.num_v_heads, self.num_k_heads
            )));
        }
        Ok(())
    }
}

/// Refuses a batch without sequences or with an empty one.
pub(crate) fn check_seqlens(seqlens: &[u64]) -> Result<(), ModelError> {
    if seqlens.is_empty() || seqlens.contains(&0) {
        return Err(ModelError::Invalid(
            "every sequence needs at least one token; give --tokens T or --seqlens a,b,c".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varlen_chunks_are_counted_per_sequence() {
        let s = GdnShape::new(&[100, 64, 1, 129], 4, 128, 128, DType::BF16);
        assert_eq!(s.total_tokens(), 294);
        // ceil(294/64) = 5 would be wrong: each sequence rounds up on its own.
        assert_eq!(s.num_chunks(), 2 + 1 + 1 + 3);
        assert_eq!(s.num_seqs(), 4);
        assert_eq!(
            GdnShape::new(&[4128], 48, 128, 128, DType::BF16).num_chunks(),
            65
        );
    }
}
