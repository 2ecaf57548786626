//! The whole-step memory model: for a config, a serving shape and the program that runs it, the
//! bytes of one forward step at its peak, part by part — weights, the KV cache at the step's
//! context, the recurrent state, the largest per-layer live set over the layer kinds (GDN,
//! attention, MLP, logits), the engine's buffers, CUDA graphs, the allocator's reserve and the
//! context — and whether that fits a limit.
//!
//! Layers run one after another, so the step's activation peak is the largest of the layer
//! kinds' peaks (the runtime's room of [`crate::engine`] builds each as a tensor timeline with
//! the machinery of `step_layers.rs`, and [`crate::peak`] takes its peak), on top of what
//! persists through the step. The parts a config cannot know
//! (engine buffers, graph pools, reserve, context) come from [`KnownParts`].

use serde::Serialize;

use crate::engine::{torch_script, transformers_5_layers, vllm_0_20_1, workload};
use crate::error::fit_bytes;
use crate::step_layers::{LayerPeak, LayerStep};
use crate::{
    Category, KnownParts, Limit, ModelConfig, ModelError, Runtime, ServingShape, StepVariants,
    gdn_state_per_seq, kv_cache_per_token, weight_bytes,
};

/// The step checked against a limit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LimitCheck {
    /// The limit.
    pub limit: Limit,
    /// Its bytes ([`Limit::bytes`]).
    pub limit_bytes: u64,
    /// The parts of the step that count against it ([`Limit::counts`]).
    pub counted: u64,
    /// Whether `counted <= limit_bytes`.
    pub fits: bool,
    /// `limit_bytes − counted`: negative is the shortfall.
    pub headroom: i64,
}

/// One step's predicted peak, part by part.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepBreakdown {
    /// The step.
    pub shape: ServingShape,
    /// The program and kernels.
    pub variants: StepVariants,
    /// Weights on this rank.
    pub weights: u64,
    /// The KV cache: the preallocated pool when one is known, else [`Self::kv_payload`].
    pub kv_cache: u64,
    /// K/V of `batch` sequences of `context_tokens` tokens, rounded to blocks: what the context
    /// needs, whether or not a pool holds it.
    pub kv_payload: u64,
    /// Whether the payload fits in the known pool (`None` without a pool).
    pub kv_fits_pool: Option<bool>,
    /// Recurrent (and conv) state of `batch` sequences.
    pub state: u64,
    /// The largest layer peak: the step's activations.
    pub activations: LayerPeak,
    /// Every layer kind's peak, in the order GDN, attention, MLP, logits (those the model has).
    pub layers: Vec<LayerPeak>,
    /// Engine buffers: the known value, else the library workspace a PyTorch runtime allocates
    /// (cuBLAS), else `None`.
    pub engine_buffers: Option<u64>,
    /// CUDA-graph pools, when known.
    pub cuda_graphs: Option<u64>,
    /// NCCL buffers, when known.
    pub communication: Option<u64>,
    /// Autotuning scratch, when known.
    pub autotune: Option<u64>,
    /// The allocator's reserve, when known.
    pub allocator_reserve: Option<u64>,
    /// The context counting against the limit, when known.
    pub context: Option<u64>,
    /// Other processes, when known.
    pub other_process: Option<u64>,
    /// The sum of every part: the step's predicted peak on the device.
    pub total: u64,
    /// The verdict against a limit, when one was given.
    pub limit: Option<LimitCheck>,
}

impl StepBreakdown {
    /// The predicted bytes of one category (`None` where the model neither predicts nor was
    /// told it; `unnamed` is never predicted).
    pub fn part(&self, c: Category) -> Option<u64> {
        match c {
            Category::Weights => Some(self.weights),
            Category::KvCache => Some(self.kv_cache),
            Category::State => Some(self.state),
            Category::Activations => Some(self.activations.bytes),
            Category::EngineBuffers => self.engine_buffers,
            Category::CudaGraphs => self.cuda_graphs,
            Category::Communication => self.communication,
            Category::Autotune => self.autotune,
            Category::AllocatorReserve => self.allocator_reserve,
            Category::Context => self.context,
            Category::OtherProcess => self.other_process,
            Category::Unnamed => None,
        }
    }

    /// Whether the step fits the limit it was checked against (`None` without one).
    pub fn fits(&self) -> Option<bool> {
        self.limit.as_ref().map(|l| l.fits)
    }

    /// The bytes of the parts that count against `limit`.
    pub fn counted_against(&self, limit: &Limit) -> u64 {
        Category::ALL
            .iter()
            .filter(|&&c| limit.counts(c))
            .filter_map(|&c| self.part(c))
            .sum()
    }
}

/// A config and the program that runs it, ready to predict steps of any shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepModel {
    /// The model.
    pub config: ModelConfig,
    /// The program and kernels.
    pub variants: StepVariants,
    /// What the trace tells beyond the config.
    pub known: KnownParts,
}

/// cuBLAS's workspace in PyTorch on Hopper: `CUBLAS_WORKSPACE_CONFIG`'s default `:4096:8`,
/// 8 × 4096 KiB, allocated through the caching allocator at the first matmul
/// (pytorch `aten/src/ATen/cuda/CublasHandlePool.cpp` `getChosenWorkspaceSize`).
pub const CUBLAS_WORKSPACE_SM90: u64 = 8 * 4096 * 1024;

impl StepModel {
    /// A model of `config` run by `variants`, with `known` parts from a trace.
    pub fn new(config: ModelConfig, variants: StepVariants, known: KnownParts) -> Self {
        StepModel {
            config,
            variants,
            known,
        }
    }

    /// The step's predicted peak, part by part.
    pub fn step(&self, shape: &ServingShape) -> Result<StepBreakdown, ModelError> {
        shape.check()?;
        let cfg = &self.config;
        let v = &self.variants;
        let w = u128::from;
        let weights = match v.runtime {
            Runtime::TorchPrefillScript => torch_script::weight_bytes(cfg, shape)?,
            _ => weight_bytes(cfg, v.weights, shape.tp)?.bytes,
        };
        let per_seq_tokens = shape.context_tokens.div_ceil(shape.block_size) * shape.block_size;
        let kv_per_token = match v.runtime {
            Runtime::TorchPrefillScript => torch_script::kv_bytes_per_token(cfg, shape)?,
            _ => kv_cache_per_token(cfg, shape.tp, shape.kv_dtype)?.bytes_per_token,
        };
        let kv_payload = fit_bytes(
            "the KV cache",
            w(per_seq_tokens) * w(kv_per_token) * w(shape.batch),
        )?;
        let kv_cache = self.known.kv_pool.unwrap_or(kv_payload);
        let kv_fits_pool = self.known.kv_pool.map(|pool| kv_payload <= pool);
        let state_per_seq = match v.runtime {
            Runtime::TorchPrefillScript => torch_script::state_bytes_per_seq(cfg, shape)?,
            _ => gdn_state_per_seq(cfg, shape.tp, v.conv_dtype, v.ssm_dtype, 0)?.bytes_per_seq,
        };
        let state = fit_bytes("the GDN state", w(state_per_seq) * w(shape.batch))?;

        let layers = layer_peaks(cfg, v, shape)?;
        let activations = layers
            .iter()
            .max_by_key(|l| l.bytes)
            .cloned()
            .ok_or_else(|| ModelError::Invalid("the model has no layers".into()))?;

        let engine_buffers = self
            .known
            .engine_buffers
            .or(if v.runtime.uses_pytorch_allocator() {
                Some(CUBLAS_WORKSPACE_SM90)
            } else {
                None
            });
        let k = &self.known;
        let mut b = StepBreakdown {
            shape: shape.clone(),
            variants: v.clone(),
            weights,
            kv_cache,
            kv_payload,
            kv_fits_pool,
            state,
            activations,
            layers,
            engine_buffers,
            cuda_graphs: k.cuda_graphs,
            communication: k.communication,
            autotune: k.autotune,
            allocator_reserve: k.allocator_reserve,
            context: k.context,
            other_process: k.other_process,
            total: 0,
            limit: None,
        };
        let total: u128 = Category::ALL
            .iter()
            .filter_map(|&c| b.part(c))
            .map(u128::from)
            .sum();
        b.total = fit_bytes("the step's peak", total)?;
        Ok(b)
    }

    /// The step's predicted peak checked against `limit`.
    pub fn check(&self, shape: &ServingShape, limit: &Limit) -> Result<StepBreakdown, ModelError> {
        let mut b = self.step(shape)?;
        let limit_bytes = limit.bytes()?;
        let counted = b.counted_against(limit);
        b.limit = Some(LimitCheck {
            limit: *limit,
            limit_bytes,
            counted,
            fits: counted <= limit_bytes,
            headroom: (i128::from(limit_bytes) - i128::from(counted)) as i64,
        });
        Ok(b)
    }
}

/// Every layer kind's peak for the step, in the order GDN, attention, MLP, logits (those the
/// config and the runtime have), from the runtime's own room.
fn layer_peaks(
    cfg: &ModelConfig,
    v: &StepVariants,
    s: &ServingShape,
) -> Result<Vec<LayerPeak>, ModelError> {
    let st = LayerStep::new(cfg, v, s)?;
    match v.runtime {
        Runtime::Workload => workload::layers(&st),
        Runtime::TorchPrefillScript => torch_script::layers(&st),
        Runtime::Vllm => vllm_0_20_1::layers(&st),
        Runtime::Transformers => transformers_5_layers::layers(&st),
    }
}

/// [`StepModel::check`] in one call: the step's peak for `shape` run by `variants`, with the
/// `known` parts, against `limit` when given.
pub fn step_peak(
    config: &ModelConfig,
    shape: &ServingShape,
    variants: &StepVariants,
    known: &KnownParts,
    limit: Option<&Limit>,
) -> Result<StepBreakdown, ModelError> {
    let m = StepModel::new(config.clone(), variants.clone(), known.clone());
    match limit {
        Some(l) => m.check(shape, l),
        None => m.step(shape),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StepLayer;

    fn qwen36() -> ModelConfig {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../samples/models/Qwen3.6-27B/config.json");
        ModelConfig::from_path(p).unwrap()
    }

    #[test]
    fn vllm_rounds_the_cache_to_blocks_and_samples_one_row_per_sequence() {
        let c = qwen36();
        let m = StepModel::new(
            c.clone(),
            StepVariants::for_runtime(Runtime::Vllm, &c),
            KnownParts::default(),
        );
        let mut s = ServingShape::prefill(&c, 4128, 12384);
        s.block_size = 400;
        let b = m.step(&s).unwrap();
        // 12,384 tokens in blocks of 400: 31 blocks, 12,400 tokens x 64 KiB.
        assert_eq!(b.kv_cache, 12_400 * 65_536);
        // 48 layers x (bf16 conv 61,440 + fp32 recurrent 3,145,728).
        assert_eq!(b.state, 153_944_064);
        let logits = b
            .layers
            .iter()
            .find(|l| l.kind == StepLayer::Logits)
            .unwrap();
        // hidden [4128, 5120] + one row [1, 5120] + logits [1, 248320] bf16 + its fp32 copy.
        assert_eq!(logits.bytes, 42_270_720 + 10_240 + 496_640 + 993_280);
        assert_eq!(b.engine_buffers, Some(CUBLAS_WORKSPACE_SM90));
        assert_eq!(b.context, None);
    }

    #[test]
    fn transformers_logits_for_every_token_dominate_a_prefill_chunk() {
        let c = qwen36();
        let m = StepModel::new(
            c.clone(),
            StepVariants::for_runtime(Runtime::Transformers, &c),
            KnownParts::default(),
        );
        let b = m.step(&ServingShape::prefill(&c, 4128, 4128)).unwrap();
        assert_eq!(b.activations.kind, StepLayer::Logits);
        // [1, 4128, 248320] bf16 beside the final hidden states and the embedding's output.
        assert_eq!(b.activations.bytes, 2_050_129_920 + 2 * 42_270_720);
        let gdn = b.layers.iter().find(|l| l.kind == StepLayer::Gdn).unwrap();
        // transformers 5.17 repeats q and k to the 48 value heads even for fla 0.6.0 (as traced
        // in samples/h200/hf-prefill-qwen35), and fla copies the strided v.
        let bytes = |n: &str| gdn.tensors.iter().find(|t| t.name == n).unwrap().bytes;
        assert_eq!(bytes("query (repeated)"), 4128 * 48 * 128 * 2);
        assert_eq!(bytes("key (repeated)"), 4128 * 48 * 128 * 2);
        assert_eq!(bytes("value (contiguous)"), 4128 * 48 * 128 * 2);
        // The parts add up to the total.
        let sum: u64 = Category::ALL.iter().filter_map(|&c| b.part(c)).sum();
        assert_eq!(b.total, sum);
    }

    #[test]
    fn a_preallocated_pool_is_the_kv_part_and_bounds_the_context() {
        let c = qwen36();
        let pool = 100_000 * 65_536;
        let m = StepModel::new(
            c.clone(),
            StepVariants::for_runtime(Runtime::Vllm, &c),
            KnownParts {
                kv_pool: Some(pool),
                ..KnownParts::default()
            },
        );
        let s = ServingShape::prefill(&c, 4128, 8256);
        let b = m.step(&s).unwrap();
        assert_eq!((b.kv_cache, b.kv_payload), (pool, 8256 * 65_536));
        assert_eq!(b.kv_fits_pool, Some(true));
        let limit = Limit::Card { capacity: 1 << 40 };
        let f = m.largest_context_at(&s, &limit, 262_144).unwrap();
        assert_eq!(f.largest_context, Some(100_000));
        assert!(f.limited_by_pool && !f.capped);
    }

    #[test]
    fn a_known_part_is_added_as_given_and_counted_by_the_limit() {
        let c = qwen36();
        let v = StepVariants::for_runtime(Runtime::Workload, &c);
        let s = ServingShape::prefill(&c, 4128, 4128);
        let bare = step_peak(&c, &s, &v, &KnownParts::default(), None).unwrap();
        assert_eq!(bare.engine_buffers, None);
        let known = KnownParts {
            cuda_graphs: Some(1 << 30),
            other_process: Some(2 << 30),
            ..KnownParts::default()
        };
        let limit = Limit::GpuMemoryUtilization {
            capacity: 40 << 30,
            fraction: 0.5,
        };
        let b = step_peak(&c, &s, &v, &known, Some(&limit)).unwrap();
        assert_eq!(b.total, bare.total + (3 << 30));
        // vLLM's budget leaves other processes out.
        assert_eq!(b.limit.unwrap().counted, bare.total + (1 << 30));
    }
}
