//! Analytical memory models: for a model's `config.json` and a batch, the tensors a kernel
//! allocates — in allocation order, with shape, dtype, bytes, lifetime and the upstream line they
//! come from — and the live set and peak that follow.
//!
//! Each kernel version is its own named [`Variant`], modelled from its upstream source and never
//! blended with another: the Gated DeltaNet chunk forward of fla 0.6.0, fla 0.4.2, vLLM 0.10.2 and
//! vLLM 0.20.1; FlashAttention-2's varlen forward in v2.5.9 (padded `softmax_lse`), v2.8.3
//! (unpadded, as since v2.6) and PyTorch's copy; vLLM's dense MLP. Beside them: KV-cache and GDN
//! state per token and per sequence, weight bytes by format, and PyTorch's caching allocator
//! (request → block → segment, and a simulation of the segments `cudaMalloc` sees).
//!
//! On top of the kernels, the whole-step model ([`StepModel`]): for a [`ServingShape`] (chunk,
//! context, batch, TP, KV dtype, block size) and the program that runs it ([`Runtime`],
//! [`StepVariants`]), weights + KV cache at the context + recurrent state + the largest
//! per-layer live set over GDN, attention, MLP and logits + the parts only a trace knows
//! ([`KnownParts`]: engine buffers, CUDA graphs, the allocator's reserve, the context), checked
//! against an enforced [`Limit`]; the cliff as a frontier ([`StepModel::largest_chunk_at`],
//! [`StepModel::largest_context_at`], with vLLM's [`ChunkFloor`]); and per-category
//! [`residuals`] against what a trace observed.
//!
//! ```
//! use vramtrace_models::{DType, GdnShape, Variant, Workload, peak, gdn_vllm_0_20_1};
//!
//! // One Qwen3.6-27B GDN layer (16 key heads, 48 value heads, K = V = 128) on a 4128-token chunk.
//! let mut shape = GdnShape::new(&[4128], 16, 128, 128, DType::BF16);
//! shape.num_v_heads = 48;
//! let tensors = gdn_vllm_0_20_1::tensors(&shape).unwrap();
//! let h = tensors.iter().find(|t| t.name == "h").unwrap();
//! assert_eq!(h.bytes, 102_236_160); // 97.5 MiB
//! let p = peak(&tensors);
//! assert_eq!(p.bytes, 334_436_352); // the fp32 A is freed before u exists
//! assert_eq!(Variant::from_name("vllm-0.20.1"), Some(Variant::GdnVllm0201));
//! # let _ = Workload::from_config;
//! ```
//!
//! The whole step of `samples/h200/prefill-18gib` (the workload on 18 GiB, chunk 2 of 4128):
//!
//! ```
//! use vramtrace_models::{KnownParts, Limit, ModelConfig, Runtime, ServingShape, StepModel,
//!     StepVariants};
//!
//! # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../samples/models/Qwen3.6-27B/config.json");
//! let cfg = ModelConfig::from_path(path).unwrap();
//! let variants = StepVariants::for_runtime(Runtime::Workload, &cfg);
//! let known = KnownParts { context: Some(257_618_896), ..KnownParts::default() };
//! let model = StepModel::new(cfg.clone(), variants, known);
//! let limit = Limit::Card { capacity: 18 << 30 };
//! let step = model.check(&ServingShape::prefill(&cfg, 4128, 3 * 4128), &limit).unwrap();
//! assert_eq!(step.fits(), Some(false));
//! assert_eq!(step.limit.unwrap().headroom, -145_928_144);
//! ```
//!
//! # Design constraints
//! * Byte sizes are exact for the shapes given; what is not modelled is said in each variant's
//!   documentation, not approximated.
//! * One function computes the peak ([`peak`]); variants only describe allocation order.
//! * Tensor lists carry enough (name, shape, bytes, order, lifetime, source line) to be matched
//!   against a trace later.
//! * A step's parts are never fitted to a trace: what a config cannot know is given as a known
//!   part and shown as given, and every difference from a trace is a residual with its cause.

pub mod caching_allocator;
mod category;
mod config;
mod dtype;
pub mod engine;
mod error;
pub mod fa_dao_2_5_9;
pub mod fa_dao_2_8_3;
pub mod fa_pytorch;
pub mod ffn;
mod flash_attn;
mod frontier;
mod gdn;
pub mod gdn_fla_0_4_2;
pub mod gdn_fla_0_6_0;
pub mod gdn_state;
pub mod gdn_vllm_0_10_2;
pub mod gdn_vllm_0_20_1;
pub mod gguf;
pub mod kv_cache;

mod peak;
mod residual;
mod serving;
mod step;
mod step_layers;
mod tensor;
pub mod units;
mod variant;
pub mod weights;

/// The largest size in bytes the models compute (2^62, 4 EiB): a tensor, a prediction's total
/// or a per-model figure past it is refused with [`ModelError::TooLarge`], so every size is
/// exact and every sum of them (and the allocator's rounding) stays within 64 bits.
pub const MAX_BYTES: u64 = 1 << 62;
/// The most tokens a batch may hold (2^40, about 10^12): far beyond any prefill, and small
/// enough that a token count times any config dimension fits in 64 bits.
pub const MAX_TOKENS: u64 = 1 << 40;
/// The largest count a `config.json` field (heads, dims, layers, vocabulary, experts) or a
/// TP degree may take (2^24): every real model is far below it.
pub const MAX_COUNT: u64 = 1 << 24;

pub use caching_allocator::{
    CachingAllocator, Oom, Pool, Rounding, SegmentEvent, SegmentReplay, replay, rounding,
};
pub use category::Category;
pub use config::{LayerKind, ModelConfig, MoeConfig, Quantization};
pub use dtype::DType;
pub use error::ModelError;
pub use ffn::FfnShape;
pub use flash_attn::{FaShape, num_splits_heuristic};
pub use frontier::{ChunkFloor, ChunkFrontier, ContextFrontier, vllm_hybrid_block_size};
pub use gdn::{
    CHUNK, GdnShape, GdnVariantSpec, IntraChunk, L2normSites, LastFrees, QkHeads, StateLayout,
    WuOrder,
};
pub use gdn_state::{GdnStatePerSeq, gdn_state_per_seq};
pub use kv_cache::{KvCachePerToken, kv_cache_per_token};
pub use peak::{Peak, live_at, naive_sum, peak};
pub use residual::{PartResidual, Residuals, residuals};
pub use serving::{KnownParts, Limit, Runtime, ServingShape, StepVariants};
pub use step::{CUBLAS_WORKSPACE_SM90, LimitCheck, StepBreakdown, StepModel, step_peak};
pub use step_layers::{LayerPeak, StepLayer};
pub use tensor::{Event, Tensor, TensorId, Timeline, events, factory_operator};
pub use variant::{Kernel, Variant, Workload, WorkloadOptions};
pub use weights::{WeightEstimate, WeightFormat, weight_bytes};

/// Divides a count by the tensor-parallel degree, or says why it cannot.
pub fn tp_split(what: &'static str, count: u64, tp: u64) -> Result<u64, ModelError> {
    if tp == 0 {
        return Err(ModelError::Invalid(
            "the TP degree must be at least 1".into(),
        ));
    }
    if !count.is_multiple_of(tp) {
        return Err(ModelError::TpNotDivisible { what, count, tp });
    }
    Ok(count / tp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tp_divides_heads_or_fails_with_a_sentence() {
        assert_eq!(tp_split("linear_num_value_heads", 48, 2).unwrap(), 24);
        let e = tp_split("num_key_value_heads", 4, 3).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the model has 4 num_key_value_heads, which tensor parallelism of 3 cannot split evenly; choose a TP degree that divides 4"
        );
    }
}
