//! The named model variants and the one request they all answer: a [`Workload`].

use std::fmt;

use serde::Serialize;

use crate::gdn::check_seqlens;
use crate::{
    DType, FaShape, FfnShape, GdnShape, ModelConfig, ModelError, Tensor, fa_dao_2_5_9,
    fa_dao_2_8_3, fa_pytorch, ffn, gdn_fla_0_4_2, gdn_fla_0_6_0, gdn_vllm_0_10_2, gdn_vllm_0_20_1,
};

/// Which kernel a variant describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// Gated DeltaNet chunk forward (`chunk_gated_delta_rule`).
    Gdn,
    /// FlashAttention-2 varlen forward.
    Fa,
    /// The dense MLP of one chunk.
    Ffn,
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kernel::Gdn => "gdn",
            Kernel::Fa => "fa",
            Kernel::Ffn => "ffn",
        })
    }
}

/// A kernel as one upstream version implements it. Each is modelled on its own; none is a blend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Variant {
    /// [`gdn_fla_0_6_0`]: fused intra-chunk kernel, one `A` in the input dtype.
    GdnFla060,
    /// [`gdn_fla_0_4_2`]: fp32 `A`, then `Ai`; no grouped value heads.
    GdnFla042,
    /// [`gdn_vllm_0_10_2`]: vLLM's vendored copy with in-kernel l2norm and fp32 `Ad`.
    GdnVllm0102,
    /// [`gdn_vllm_0_20_1`]: vLLM's vendored copy, fp32 `A` freed after `solve_tril`.
    GdnVllm0201,
    /// [`fa_dao_2_5_9`]: padded `softmax_lse`.
    FaDao259,
    /// [`fa_dao_2_8_3`]: unpadded `softmax_lse` (FlashAttention ≥ 2.6).
    FaDao283,
    /// [`fa_pytorch`]: PyTorch's `_flash_attention_forward`.
    FaPytorch,
    /// [`ffn`]: vLLM 0.20.1's eager dense MLP.
    FfnVllm0201,
}

impl Variant {
    /// Every variant, in the order `--help` lists them.
    pub const ALL: [Variant; 8] = [
        Variant::GdnFla060,
        Variant::GdnFla042,
        Variant::GdnVllm0102,
        Variant::GdnVllm0201,
        Variant::FaDao283,
        Variant::FaDao259,
        Variant::FaPytorch,
        Variant::FfnVllm0201,
    ];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Variant::GdnFla060 => gdn_fla_0_6_0::NAME,
            Variant::GdnFla042 => gdn_fla_0_4_2::NAME,
            Variant::GdnVllm0102 => gdn_vllm_0_10_2::NAME,
            Variant::GdnVllm0201 => gdn_vllm_0_20_1::NAME,
            Variant::FaDao259 => fa_dao_2_5_9::NAME,
            Variant::FaDao283 => fa_dao_2_8_3::NAME,
            Variant::FaPytorch => fa_pytorch::NAME,
            Variant::FfnVllm0201 => ffn::NAME,
        }
    }

    /// The kernel it describes.
    pub fn kernel(self) -> Kernel {
        match self {
            Variant::GdnFla060
            | Variant::GdnFla042
            | Variant::GdnVllm0102
            | Variant::GdnVllm0201 => Kernel::Gdn,
            Variant::FaDao259 | Variant::FaDao283 | Variant::FaPytorch => Kernel::Fa,
            Variant::FfnVllm0201 => Kernel::Ffn,
        }
    }

    /// The upstream file and version the variant was read from, in one line.
    pub fn source(self) -> &'static str {
        match self {
            Variant::GdnFla060 => {
                "fla-core 0.6.0 wheel: fla/ops/gated_delta_rule/chunk.py, chunk_fwd.py (fused kkt+solve_tril), wy_fast.py, fla/ops/common/chunk_delta_h.py, chunk_o.py"
            }
            Variant::GdnFla042 => {
                "fla-org/flash-linear-attention v0.4.2 (ca910f88): fla/ops/gated_delta_rule/chunk.py with common/chunk_scaled_dot_kkt.py (fp32 A) and utils/solve_tril.py"
            }
            Variant::GdnVllm0102 => {
                "vllm 0.10.2 wheel: vllm/model_executor/layers/fla/ops/chunk.py as models/qwen3_next.py calls it (l2norm in kernel, solve_tril with fp32 Ad)"
            }
            Variant::GdnVllm0201 => {
                "vllm 0.20.1 wheel: vllm/model_executor/layers/fla/ops/chunk.py (fp32 A freed after solve_tril; o = torch.empty_like(v) at chunk_o.py:161), called from layers/mamba/gdn_linear_attn.py"
            }
            Variant::FaDao259 => {
                "Dao-AILab/flash-attention v2.5.9 (ce735035): csrc/flash_attn/flash_api.cpp mha_varlen_fwd, softmax_lse [B, H, max_seqlen_q]"
            }
            Variant::FaDao283 => {
                "Dao-AILab/flash-attention v2.8.3 (060c9188), same since v2.6.0: csrc/flash_attn/flash_api.cpp mha_varlen_fwd, softmax_lse [H, total_q]"
            }
            Variant::FaPytorch => {
                "pytorch/pytorch (03b7c19d): aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_varlen_fwd behind aten::_flash_attention_forward"
            }
            Variant::FfnVllm0201 => {
                "vllm 0.20.1 wheel: vllm/model_executor/models/qwen2_moe.py Qwen2MoeMLP.forward (the dense MLP of qwen3_5.py / qwen3_next.py), eager order"
            }
        }
    }

    /// Looks a variant up by its name.
    pub fn from_name(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name)
    }

    /// The variant `--kernel K` uses when no `--variant` is given.
    pub fn default_for(kernel: Kernel) -> Variant {
        match kernel {
            Kernel::Gdn => Variant::GdnVllm0201,
            Kernel::Fa => Variant::FaDao283,
            Kernel::Ffn => Variant::FfnVllm0201,
        }
    }

    /// The tensors the kernel allocates for `w`, in allocation order.
    pub fn tensors(self, w: &Workload) -> Result<Vec<Tensor>, ModelError> {
        match self {
            Variant::GdnFla060 => gdn_fla_0_6_0::tensors(&w.gdn),
            Variant::GdnFla042 => gdn_fla_0_4_2::tensors(&w.gdn),
            Variant::GdnVllm0102 => gdn_vllm_0_10_2::tensors(&w.gdn),
            Variant::GdnVllm0201 => gdn_vllm_0_20_1::tensors(&w.gdn),
            Variant::FaDao259 => fa_dao_2_5_9::tensors(&w.fa),
            Variant::FaDao283 => fa_dao_2_8_3::tensors(&w.fa),
            Variant::FaPytorch => fa_pytorch::tensors(&w.fa),
            Variant::FfnVllm0201 => ffn::tensors(&w.ffn),
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a workload is derived from a config: the request, the parallelism and the device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkloadOptions {
    /// Tokens of each sequence in the batch (one entry for a single prompt chunk).
    pub seqlens: Vec<u64>,
    /// Tensor-parallel degree: heads and the MLP width are divided by it.
    pub tp: u64,
    /// Activation dtype (the config's dtype unless overridden).
    pub dtype: DType,
    /// `max_seqlen_k` passed to FlashAttention (defaults to the longest sequence).
    pub max_seqlen_k: Option<u64>,
    /// Streaming multiprocessors (FlashAttention's split-KV heuristic).
    pub num_sms: u64,
    /// Override of `use_qk_l2norm_in_kernel` for the GDN variants.
    pub l2norm_in_kernel: Option<bool>,
}

/// One layer's call of each kernel, for one batch on one rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Workload {
    /// The GDN call of a linear-attention layer.
    pub gdn: GdnShape,
    /// The FlashAttention call of a full-attention layer.
    pub fa: FaShape,
    /// The MLP call on the whole batch.
    pub ffn: FfnShape,
}

impl Workload {
    /// Builds the per-kernel shapes; fails when TP cannot split a head count or the MLP.
    pub fn from_config(cfg: &ModelConfig, o: &WorkloadOptions) -> Result<Self, ModelError> {
        check_seqlens(&o.seqlens)?;
        let cap = |what: &str, v: u64, max: u64| {
            if v > max {
                Err(ModelError::TooLarge(format!(
                    "{what} {v} is past its cap of {max}; give a real value"
                )))
            } else {
                Ok(())
            }
        };
        cap("the TP degree", o.tp, crate::MAX_COUNT)?;
        cap("the SM count", o.num_sms, crate::MAX_COUNT)?;
        if let Some(k) = o.max_seqlen_k {
            cap("max_seqlen_k", k, crate::MAX_TOKENS)?;
        }
        let mut gdn = GdnShape::from_config(cfg, &o.seqlens, o.tp, o.dtype)?;
        gdn.l2norm_in_kernel = o.l2norm_in_kernel;
        let fa = FaShape::from_config(cfg, &o.seqlens, o.max_seqlen_k, o.tp, o.dtype, o.num_sms)?;
        let ffn = FfnShape::from_config(cfg, o.seqlens.iter().sum(), o.tp, o.dtype)?;
        Ok(Workload { gdn, fa, ffn })
    }
}
