//! What every Gated DeltaNet chunk-forward variant shares: the shape of one call, and the one
//! builder that turns a variant's table of differences ([`GdnVariantSpec`]) into its tensor list.

use serde::Serialize;

use crate::{DType, ModelConfig, ModelError, Tensor, Timeline, tp_split};

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
        if self.num_k_heads == 0 && self.num_v_heads == 0 {
            return Err(ModelError::Invalid(
                "the model has no GDN layers (a dense config); model its attention or MLP kernel instead".into(),
            ));
        }
        if self.num_k_heads == 0 || !self.num_v_heads.is_multiple_of(self.num_k_heads) {
            return Err(ModelError::Invalid(format!(
                "{} value heads are not a multiple of {} key heads",
                self.num_v_heads, self.num_k_heads
            )));
        }
        Ok(())
    }
}

/// Which head count q and k (and their normalised copies) carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QkHeads {
    /// Grouped value attention: q and k keep the key heads `Hk`, everything else has `HV`.
    Key,
    /// No grouped value attention: the caller repeats q and k to the value heads `HV`.
    Value,
}

/// Where `l2norm_fwd` allocates, when q and k are normalised inside the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct L2normSites {
    /// `y = torch.empty_like(x)`: the normalised copy of q, then of k.
    pub y: &'static str,
    /// The fp32 reciprocal norms `[T, H]` kept beside each copy; `None` where the version
    /// allocates none.
    pub rstd: Option<&'static str>,
}

/// How the intra-chunk matrix `A = (I + tril(beta K K^T))^-1` is produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum IntraChunk {
    /// One fused kkt + solve_tril kernel writes `A` `[B, T, HV, 64]` in the input dtype; there is
    /// no fp32 `A`.
    Fused {
        /// Where `A` is allocated.
        a: &'static str,
    },
    /// `chunk_scaled_dot_kkt_fwd` writes `A` in fp32, then `solve_tril` writes its inverse `Ai`
    /// in the input dtype; the fp32 `A` is freed when `A = solve_tril(...)` rebinds the name,
    /// before `w` and `u` exist.
    Fp32ThenSolveTril {
        /// Where the fp32 `A` is allocated.
        a_fp32: &'static str,
        /// Where `solve_tril` first allocates `Ad`, the fp32 inverses of the 16x16 diagonal
        /// blocks `[B, T, HV, 16]`, freed when `solve_tril` returns; `None` where it has none.
        ad_fp32: Option<&'static str>,
        /// Where `Ai` is allocated.
        ai: &'static str,
    },
}

/// Which of `w` and `u` `recompute_w_u_fwd` allocates first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WuOrder {
    /// `w` then `u`.
    WThenU,
    /// `u` then `w`.
    UThenW,
}

/// The order of the last two dimensions of `h` and `final_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateLayout {
    /// `[.., K, V]`.
    KeyValue,
    /// `[.., V, K]`.
    ValueKey,
}

/// The order in which the tensors that outlive `chunk_gated_delta_rule_fwd` but not the
/// autograd function's `forward` (the intra-chunk matrix and `g`) are released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LastFrees {
    /// The intra-chunk matrix (`A` or `Ai`), then `g`.
    AThenG,
    /// `g`, then the intra-chunk matrix.
    GThenA,
}

/// One upstream version of `chunk_gated_delta_rule`, written as what sets it apart from the
/// others; [`GdnVariantSpec::tensors`] is the one builder all of them share.
///
/// The call allocates, in order: the l2norm copies of q and k (when normalised in the kernel),
/// `g (cumsum)`, the intra-chunk matrix ([`IntraChunk`]), `w` and `u` ([`WuOrder`]), `h`,
/// `final_state` (when asked for), `v_new` and `o`. `chunk_gated_delta_rule_fwd` returns
/// `(g, o, A, final_state, ...)`, so its other locals `w`, `u`, `h`, `v_new` die with its frame,
/// in the order CPython clears them (order of first assignment); the autograd function saves
/// nothing for backward, so its `forward` then releases the normalised q and k, and the
/// intra-chunk matrix and `g` in [`LastFrees`] order. `o` and `final_state` are returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GdnVariantSpec {
    /// The variant's name on the command line.
    pub name: &'static str,
    /// `use_qk_l2norm_in_kernel` when the caller does not say: the function's own default, or
    /// what the version's own Qwen3-Next layer passes.
    pub default_l2norm_in_kernel: bool,
    /// The heads of q and k.
    pub qk_heads: QkHeads,
    /// Where the l2norm outputs are allocated.
    pub l2norm: L2normSites,
    /// `g (cumsum)`, fp32 `[B, T, HV]`.
    pub g_cumsum: &'static str,
    /// How the intra-chunk matrix is produced.
    pub intra_chunk: IntraChunk,
    /// The allocation order of `w` and `u`.
    pub wu_order: WuOrder,
    /// `w` `[B, T, HV, K]`.
    pub w: &'static str,
    /// `u` `[B, T, HV, V]`.
    pub u: &'static str,
    /// The layout of `h` and `final_state`.
    pub state_layout: StateLayout,
    /// `h` `[B, NT, HV, ..]`, one state per chunk, in the input dtype.
    pub h: &'static str,
    /// `final_state` `[N, HV, ..]` in fp32.
    pub final_state: &'static str,
    /// `v_new` `[B, T, HV, V]`.
    pub v_new: &'static str,
    /// `o` `[B, T, HV, V]`.
    pub o: &'static str,
    /// The release order of the intra-chunk matrix and `g`.
    pub last_frees: LastFrees,
}

impl GdnVariantSpec {
    /// The tensors one call allocates, in allocation order.
    pub fn tensors(&self, s: &GdnShape) -> Result<Vec<Tensor>, ModelError> {
        s.check()?;
        let (t, hv, k, v) = (s.total_tokens(), s.num_v_heads, s.head_k_dim, s.head_v_dim);
        let (nt, n, dt) = (s.num_chunks(), s.num_seqs(), s.dtype);
        let hq = match self.qk_heads {
            QkHeads::Key => s.num_k_heads,
            QkHeads::Value => hv,
        };
        let [s1, s2] = match self.state_layout {
            StateLayout::KeyValue => [k, v],
            StateLayout::ValueKey => [v, k],
        };
        let mut tl = Timeline::new();

        let mut normed = Vec::new();
        if s.l2norm_in_kernel.unwrap_or(self.default_l2norm_in_kernel) {
            for name in ["q", "k"] {
                let y = &format!("{name} (l2norm)");
                normed.push(tl.alloc(y, &[1, t, hq, k], dt, self.l2norm.y));
                if let Some(rstd) = self.l2norm.rstd {
                    let r = &format!("{name}_rstd");
                    normed.push(tl.alloc(r, &[1, t, hq], DType::F32, rstd));
                }
            }
        }
        let g = tl.alloc("g (cumsum)", &[1, t, hv], DType::F32, self.g_cumsum);
        let a = match self.intra_chunk {
            IntraChunk::Fused { a } => tl.alloc("A", &[1, t, hv, CHUNK], dt, a),
            IntraChunk::Fp32ThenSolveTril {
                a_fp32,
                ad_fp32,
                ai,
            } => {
                let a32 = tl.alloc("A (fp32, kkt)", &[1, t, hv, CHUNK], DType::F32, a_fp32);
                let ad = ad_fp32.map(|src| {
                    let name = "Ad (fp32, 16x16 inverses)";
                    tl.alloc(name, &[1, t, hv, 16], DType::F32, src)
                });
                let ai = tl.alloc("Ai", &[1, t, hv, CHUNK], dt, ai);
                if let Some(ad) = ad {
                    tl.free(ad);
                }
                tl.free(a32);
                ai
            }
        };
        let (w, u) = match self.wu_order {
            WuOrder::WThenU => {
                let w = tl.alloc("w", &[1, t, hv, k], dt, self.w);
                (w, tl.alloc("u", &[1, t, hv, v], dt, self.u))
            }
            WuOrder::UThenW => {
                let u = tl.alloc("u", &[1, t, hv, v], dt, self.u);
                (tl.alloc("w", &[1, t, hv, k], dt, self.w), u)
            }
        };
        let h = tl.alloc("h", &[1, nt, hv, s1, s2], dt, self.h);
        if s.output_final_state {
            tl.alloc(
                "final_state",
                &[n, hv, s1, s2],
                DType::F32,
                self.final_state,
            );
        }
        let v_new = tl.alloc("v_new", &[1, t, hv, v], dt, self.v_new);
        tl.alloc("o", &[1, t, hv, v], dt, self.o);
        for id in [w, u, h, v_new] {
            tl.free(id);
        }
        for id in normed {
            tl.free(id);
        }
        let last = match self.last_frees {
            LastFrees::AThenG => [a, g],
            LastFrees::GThenA => [g, a],
        };
        for id in last {
            tl.free(id);
        }
        tl.finish()
    }
}

/// Refuses a batch without sequences, with an empty one, or with more than
/// [`crate::MAX_TOKENS`] tokens in all (the sum is checked, never wrapped).
pub(crate) fn check_seqlens(seqlens: &[u64]) -> Result<(), ModelError> {
    if seqlens.is_empty() || seqlens.contains(&0) {
        return Err(ModelError::Invalid(
            "every sequence needs at least one token; give --tokens T or --seqlens a,b,c".into(),
        ));
    }
    let total = seqlens
        .iter()
        .try_fold(0u64, |acc, &t| acc.checked_add(t))
        .filter(|&t| t <= crate::MAX_TOKENS);
    if total.is_none() {
        return Err(ModelError::TooLarge(format!(
            "the batch holds {} tokens, more than the {} (2^40) tokens the models accept; give a real token count",
            seqlens.iter().map(|&t| u128::from(t)).sum::<u128>(),
            crate::MAX_TOKENS
        )));
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
