//! vLLM 0.20.1 as it plans memory at start-up and then runs a step: the budget it takes
//! (`⌈util × total⌉`), what it subtracts (the weights, the profile run's torch peak, the non-torch
//! increase, the CUDA-graph estimate), the pool it preallocates from the rest
//! ([`crate::engine::vllm_0_20_1_pool`]), and the step's real peak against the **physical card**,
//! which is what refuses a runtime allocation: vLLM never enforces `--gpu-memory-utilization`
//! after start-up.
//!
//! Every term is read from the wheel (`vllm==0.20.1`; file and line in
//! docs/vllm-0.20.1-planner-notes.md, cited here by section):
//!
//! - the budget: `requested = ⌈total × util⌉` (`v1/worker/utils.py:408-410`, notes §2.2), and the
//!   start-up `ValueError` when the free memory at the snapshot is below it (`:412-421`);
//! - what lies outside it: the CUDA context and anything held before `MemorySnapshot` (NCCL is
//!   initialised before it, `gpu_worker.py:259-282`, §1);
//! - the weights: net allocated bytes over `load_model` (§3), from the config and its
//!   `quantization_config` ([`crate::weight_bytes`]);
//! - the profile run's torch peak increase: `_dummy_run(max_num_batched_tokens)` with no attention
//!   metadata, so attention and GDN kernels do not run (§2.5, `engine/vllm_0_20_1.rs`'s profile
//!   layers), then the sampler on `min(max_num_batched_tokens, max_num_seqs)` rows;
//! - the non-torch increase (§2.7) and the CUDA-graph estimate (§2.8), which a config cannot
//!   give: a stated default or `given` bytes, each marked as such;
//! - `available = requested − weights − peak − non-torch − estimate` (`gpu_worker.py:421-425`,
//!   §2.9), and the pool made of it (§4, §5).
//!
//! The slack: what the card has beyond the context and the budget, `card − outside − requested`.
//! The pool fills the budget, so a step fits on the card when its real peak exceeds the profiled
//! peak by no more than the slack (plus what the pool's block rounding left). Lowering
//! `--gpu-memory-utilization` shrinks the pool and raises the slack; raising it does the opposite.

use serde::Serialize;

use super::vllm_0_20_1::{moe_workspace_bytes, profile_layers};
use super::vllm_0_20_1_pool::{self, DEFAULT_BLOCK_SIZE, GdnState, Pool, PoolShape};
use crate::step_layers::{LayerStep, StepLayer};
use crate::{
    DType, KnownParts, ModelConfig, ModelError, Runtime, ServingShape, StepModel, StepVariants,
    WeightFormat, weight_bytes,
};

/// The CUDA context and what else a process holds before vLLM's snapshot, when not given: the
/// CUDA context PyTorch made on the H200 (docs/validation.md, "The CUDA context: 610 MiB").
pub const DEFAULT_OUTSIDE_BUDGET: u64 = 610 << 20;

/// The non-torch increase over the profile run when not given (kernel modules loaded on first
/// use, cuBLAS/cuBLASLt handles): 0.35 GiB, the figure vLLM printed for Llama-3.1-8B on an RTX
/// 3090 (tests/data/vllm_startup_logs.json, `llama-3.1-8b-rtx3090-*`; those logs built this
/// default and do not check it).
pub const DEFAULT_NON_TORCH: u64 = 375_809_638;

/// The non-torch increase at TP > 1 when not given: 2.07 GiB, what vLLM 0.19.0 printed for
/// Llama-3.1-8B at TP 2 on NVLink-connected H100 80GB HBM3s (`non_torch_increase` of its
/// `MemoryProfilingResult`; tests/data/vllm_v1_debug_logs.json, `llmd_llama31_8b_h100_tp2`, which
/// built this default and does not check it): the communicators' buffers made at the profile
/// run's first collective, which the init snapshot cannot see (docs/validation.md, "vLLM's
/// start-up lines, the whole chain"). Another interconnect differs: give `--non-torch`.
pub const DEFAULT_NON_TORCH_TP: u64 = 2_222_634_394;

/// The floor vLLM gives each further graph's memory (`gpu_model_runner.py:6008-6010`:
/// `max(sample_1, 1 MiB)`).
const PER_GRAPH_FLOOR: u64 = 1 << 20;

/// GiB as vLLM's `GiB_bytes` (`utils/mem_constants.py:18`).
const GIB: u64 = 1 << 30;

/// How vLLM 0.20.1 is started: its flags, and the bytes a config cannot give.
#[derive(Clone, Debug, PartialEq)]
pub struct VllmFlags {
    /// The card's total memory as `torch.cuda.mem_get_info` reports it.
    pub card_bytes: u64,
    /// `--gpu-memory-utilization` (vLLM's default 0.92, `config/cache.py:66`).
    pub gpu_memory_utilization: f64,
    /// `--max-num-batched-tokens`; `None`: vLLM's default for `vllm serve`.
    pub max_num_batched_tokens: Option<u64>,
    /// `--max-num-seqs`; `None`: vLLM's default for `vllm serve`.
    pub max_num_seqs: Option<u64>,
    /// `--max-model-len`; `None`: the config's `max_position_embeddings`.
    pub max_model_len: Option<u64>,
    /// `--kv-cache-dtype` (`None`: auto, the model dtype).
    pub kv_cache_dtype: Option<DType>,
    /// `--tensor-parallel-size`.
    pub tp: u64,
    /// `--enforce-eager` (no CUDA graphs, so no estimate).
    pub enforce_eager: bool,
    /// `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` (default 1 in this wheel, `envs.py:1733-1738`).
    pub estimate_cudagraphs: bool,
    /// `--block-size`.
    pub block_size: Option<u64>,
    /// The weights' format; `None`: the config's `quantization_config`, else its dtype.
    pub weights: Option<WeightFormat>,
    /// Bytes held before the snapshot (context, NCCL, other processes); `None`:
    /// [`DEFAULT_OUTSIDE_BUDGET`].
    pub outside_budget: Option<u64>,
    /// The non-torch increase; `None`: [`DEFAULT_NON_TORCH`].
    pub non_torch_increase: Option<u64>,
    /// The CUDA-graph estimate; `None`: modelled (see [`VllmPlan::cudagraph`]).
    pub cudagraph_estimate: Option<u64>,
    /// Streaming multiprocessors (FlashAttention's split heuristic in the step).
    pub num_sms: u64,
    /// `--enable-prefix-caching` (a hybrid's mamba cache mode "align").
    pub enable_prefix_caching: bool,
    /// Speculative tokens per step (`num_speculative_tokens`; MTP's `n`).
    pub num_speculative_tokens: u64,
    /// `--mamba-ssm-cache-dtype` (`None`: auto, the config's `mamba_ssm_dtype` else the model's).
    pub mamba_ssm_cache_dtype: Option<DType>,
    /// The checkpoint's own bytes (`metadata.total_size` of its `model.safetensors.index.json`):
    /// the weights are then these over the ranks, not counted from the config.
    pub checkpoint_bytes: Option<u64>,
}

impl VllmFlags {
    /// `vllm serve` on a card of `card_bytes` with every flag at vLLM's default.
    pub fn serve(card_bytes: u64) -> Self {
        VllmFlags {
            card_bytes,
            gpu_memory_utilization: 0.92,
            max_num_batched_tokens: None,
            max_num_seqs: None,
            max_model_len: None,
            kv_cache_dtype: None,
            tp: 1,
            enforce_eager: false,
            estimate_cudagraphs: true,
            block_size: None,
            weights: None,
            outside_budget: None,
            non_torch_increase: None,
            cudagraph_estimate: None,
            num_sms: 132,
            enable_prefix_caching: false,
            num_speculative_tokens: 0,
            mamba_ssm_cache_dtype: None,
            checkpoint_bytes: None,
        }
    }
}

/// Where a term's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TermBasis {
    /// Computed from the config and the flags by vLLM's own formula.
    Code,
    /// A stated default, for what a config cannot give.
    Default,
    /// Given on the command line.
    Given,
    /// Not counted (vLLM skips it with these flags).
    Skipped,
}

/// One term of the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Term {
    /// Its bytes.
    pub bytes: u64,
    /// Where they come from.
    pub basis: TermBasis,
    /// What it is, in a sentence.
    pub why: String,
}

/// vLLM 0.20.1's start-up plan on one rank.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VllmPlan {
    /// The flags as vLLM resolves them.
    pub max_num_batched_tokens: u64,
    /// `max_num_seqs` as resolved.
    pub max_num_seqs: u64,
    /// `max_model_len` as resolved.
    pub max_model_len: u64,
    /// The card.
    pub card_bytes: u64,
    /// `⌈total × util⌉`.
    pub requested_bytes: u64,
    /// Held before the snapshot.
    pub outside_budget: Term,
    /// The weights on this rank.
    pub weights: Term,
    /// The weights' format.
    pub weight_format: WeightFormat,
    /// The profile run's torch peak increase.
    pub profiled_peak: Term,
    /// Which part of the profile run peaks.
    pub profiled_peak_layer: StepLayer,
    /// The non-torch increase.
    pub non_torch: Term,
    /// The CUDA-graph estimate subtracted.
    pub cudagraph: Term,
    /// An MoE model's fused-experts workspace, sized by the profile run and kept for every step
    /// (0 for dense models): part of the profiled peak, and held beside each step's own peak.
    pub moe_workspace_bytes: u64,
    /// Graphs vLLM would capture (PIECEWISE, FULL), 0 with `--enforce-eager`.
    pub cudagraph_counts: (u64, u64),
    /// What is left for the KV cache (may be negative).
    pub available_bytes: i64,
    /// The pool, or vLLM's start-up error.
    pub pool: Result<Pool, String>,
    /// `card − outside − requested`: what the card has for the step's excess over the profiled
    /// peak (negative: vLLM refuses to start, the budget is larger than the free memory).
    pub slack_bytes: i64,
}

impl VllmPlan {
    /// The start-up error vLLM raises, if any: the free memory below the budget
    /// (`v1/worker/utils.py:412-421`), then the pool's (`kv_cache_utils.py:689-723`).
    pub fn startup_error(&self) -> Option<String> {
        if self.slack_bytes < 0 {
            return Some(format!(
                "vLLM refuses to start: the free memory at start ({:.2} GiB of {:.2} GiB) is less than the desired GPU memory utilization ({:.2} GiB); lower --gpu-memory-utilization",
                (self.card_bytes - self.outside_budget.bytes.min(self.card_bytes)) as f64
                    / GIB as f64,
                self.card_bytes as f64 / GIB as f64,
                self.requested_bytes as f64 / GIB as f64
            ));
        }
        self.pool.as_ref().err().cloned()
    }

    /// `GPU KV cache size: … tokens`, when vLLM starts.
    pub fn kv_cache_tokens(&self) -> Option<u64> {
        self.pool.as_ref().ok().map(|p| p.kv_cache_tokens)
    }
}

/// One step after start-up, against the card.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VllmStep {
    /// New tokens in the step.
    pub chunk_tokens: u64,
    /// Tokens held at its end (the chunk's included).
    pub context_tokens: u64,
    /// The step's real activation peak (kernels included).
    pub peak_bytes: u64,
    /// Which layer kind peaks.
    pub peak_layer: StepLayer,
    /// `peak − profiled peak`: what the slack must hold.
    pub excess_bytes: i64,
    /// Everything on the card at the peak: outside + weights + non-torch + graphs + pool + the
    /// MoE workspace + peak.
    pub held_bytes: u64,
    /// `card − held`.
    pub margin_bytes: i64,
    /// Whether the pool and `max_model_len` admit the context at all.
    pub admitted: bool,
    /// Why not, when not.
    pub refused_because: Option<String>,
    /// The step fits on the card (and is admitted).
    pub fits: bool,
}

/// Plans vLLM 0.20.1's start-up for `cfg` with `f`.
pub fn plan(cfg: &ModelConfig, f: &VllmFlags) -> Result<VllmPlan, ModelError> {
    if !(f.gpu_memory_utilization > 0.0 && f.gpu_memory_utilization <= 1.0) {
        return Err(ModelError::Invalid(format!(
            "--gpu-memory-utilization must be in (0, 1] (vLLM's own bound, config/cache.py:66), not {}",
            f.gpu_memory_utilization
        )));
    }
    if f.tp == 0 || f.card_bytes == 0 {
        return Err(ModelError::Invalid(
            "the card's bytes and the TP degree must be at least 1".into(),
        ));
    }
    let max_model_len = f
        .max_model_len
        .or(cfg.max_position_embeddings)
        .ok_or_else(|| {
            ModelError::Invalid(
                "the config has no max_position_embeddings: give --max-model-len".into(),
            )
        })?;
    let (mnbt, mns) = batch_defaults(f, max_model_len);
    let requested = (f.card_bytes as f64 * f.gpu_memory_utilization).ceil() as u64;
    let outside = given_or(
        f.outside_budget,
        DEFAULT_OUTSIDE_BUDGET,
        "the CUDA context and what is held before vLLM's snapshot (NCCL is set up before it); outside the budget",
    );
    let (weights, weight_format) = weights(cfg, f)?;
    let (profiled, profiled_layer) = profile_peak(cfg, f, mnbt, mnbt.min(mns))?;
    let non_torch = if f.tp > 1 {
        given_or(
            f.non_torch_increase,
            DEFAULT_NON_TORCH_TP,
            "the non-torch increase over the profile run at TP > 1 (the communicators' buffers, kernel modules, library handles; measured on NVLink H100s)",
        )
    } else {
        given_or(
            f.non_torch_increase,
            DEFAULT_NON_TORCH,
            "the non-torch increase over the profile run (kernel modules, library handles)",
        )
    };
    let (cudagraph, counts) = cudagraph(cfg, f, mnbt, mns)?;
    let moe_workspace = on_rank(cfg, f, mnbt, moe_workspace_bytes)?;
    let available = i128::from(requested)
        - i128::from(weights.bytes)
        - i128::from(profiled)
        - i128::from(non_torch.bytes)
        - i128::from(cudagraph.bytes);
    let available_bytes = i64::try_from(available)
        .map_err(|_| ModelError::Invalid("the available bytes overflow".into()))?;
    let pool = vllm_0_20_1_pool::plan(&pool_shape(cfg, f, max_model_len)?, available)
        .map_err(|e| e.to_string());
    let slack = i128::from(f.card_bytes) - i128::from(outside.bytes) - i128::from(requested);
    Ok(VllmPlan {
        max_num_batched_tokens: mnbt,
        max_num_seqs: mns,
        max_model_len,
        card_bytes: f.card_bytes,
        requested_bytes: requested,
        outside_budget: outside,
        weights,
        weight_format,
        profiled_peak: Term {
            bytes: profiled,
            basis: TermBasis::Code,
            why: format!(
                "the profile run: {mnbt} tokens with no attention metadata (attention and GDN kernels skipped), then the sampler on {} rows",
                mnbt.min(mns)
            ),
        },
        profiled_peak_layer: profiled_layer,
        non_torch,
        cudagraph,
        moe_workspace_bytes: moe_workspace,
        cudagraph_counts: counts,
        available_bytes,
        pool,
        slack_bytes: slack as i64,
    })
}

/// The step of `chunk` new tokens with `context` held, run after `p`'s start-up, on the card.
pub fn step(
    cfg: &ModelConfig,
    f: &VllmFlags,
    p: &VllmPlan,
    chunk: u64,
    context: u64,
) -> Result<VllmStep, ModelError> {
    let mut shape = ServingShape::prefill(cfg, chunk, context);
    shape.tp = f.tp;
    shape.num_sms = f.num_sms;
    shape.kv_dtype = f.kv_cache_dtype.unwrap_or(cfg.dtype);
    let model = StepModel::new(
        cfg.clone(),
        StepVariants::for_runtime(Runtime::Vllm, cfg),
        KnownParts::default(),
    );
    let b = model.step(&shape)?;
    let peak = b.activations.bytes;
    let pool_bytes = p.pool.as_ref().map_or(0, |x| x.pool_bytes);
    let held = p.outside_budget.bytes
        + p.weights.bytes
        + p.non_torch.bytes
        + p.cudagraph.bytes
        + pool_bytes
        + p.moe_workspace_bytes
        + peak;
    let margin = i128::from(p.card_bytes) - i128::from(held);
    let refused_because = if let Some(e) = p.startup_error() {
        Some(e)
    } else if context > p.max_model_len {
        Some(format!(
            "the context ({context} tokens) is longer than --max-model-len {}: vLLM rejects the request",
            p.max_model_len
        ))
    } else if chunk > p.max_num_batched_tokens {
        Some(format!(
            "a step of {chunk} tokens is more than --max-num-batched-tokens {}: the scheduler never schedules it",
            p.max_num_batched_tokens
        ))
    } else {
        None
    };
    Ok(VllmStep {
        chunk_tokens: chunk,
        context_tokens: context,
        peak_bytes: peak,
        peak_layer: b.activations.kind,
        excess_bytes: peak as i64 - p.profiled_peak.bytes as i64,
        held_bytes: held,
        margin_bytes: margin as i64,
        admitted: refused_because.is_none(),
        fits: refused_because.is_none() && margin >= 0,
        refused_because,
    })
}

/// `max_num_batched_tokens` and `max_num_seqs` as `vllm serve` resolves them
/// (`engine/arg_utils.py:2208-2227, 2339-2411`): 8192 and 1024 on a card of 70 GiB or more (not
/// an A100), else 2048 and 256; a default batch is capped at `max_num_seqs × max_model_len`
/// (chunked prefill is on), a default `max_num_seqs` at the batch.
fn batch_defaults(f: &VllmFlags, max_model_len: u64) -> (u64, u64) {
    let big = f.card_bytes >= 70 * GIB;
    let (d_mnbt, d_mns) = if big { (8192, 1024) } else { (2048, 256) };
    let mns0 = f.max_num_seqs.unwrap_or(d_mns);
    let mnbt = f
        .max_num_batched_tokens
        .unwrap_or_else(|| d_mnbt.min(mns0.saturating_mul(max_model_len)));
    let mns = f.max_num_seqs.unwrap_or_else(|| mns0.min(mnbt));
    (mnbt, mns)
}

fn given_or(given: Option<u64>, default: u64, why: &str) -> Term {
    Term {
        bytes: given.unwrap_or(default),
        basis: if given.is_some() {
            TermBasis::Given
        } else {
            TermBasis::Default
        },
        why: why.to_string(),
    }
}

/// The weights on one rank: `--weights`, else the config's `quantization_config`, else the
/// config's dtype.
fn weights(cfg: &ModelConfig, f: &VllmFlags) -> Result<(Term, WeightFormat), ModelError> {
    let (format, from) = match (f.weights, &cfg.quantization) {
        (Some(w), _) => (w, "--weights".to_string()),
        (None, Some(q)) => match &q.format {
            Ok(w) => (
                *w,
                format!("the config's quantization_config ({})", q.method),
            ),
            Err(e) => {
                return Err(ModelError::Invalid(format!(
                    "the config's quantization_config ({}): {e}; give --weights",
                    q.method
                )));
            }
        },
        (None, None) => (WeightFormat::Bf16, "the config's dtype".to_string()),
    };
    if let Some(total) = f.checkpoint_bytes {
        return Ok((
            Term {
                bytes: total.div_ceil(f.tp),
                basis: TermBasis::Given,
                why: format!(
                    "the checkpoint's own tensors ({total} B in its safetensors index or GGUF header) over {} rank(s); vLLM keeps them as stored (a Marlin repack keeps the bytes), every tower included",
                    f.tp
                ),
            },
            format,
        ));
    }
    let w = weight_bytes(cfg, format, f.tp)?;
    Ok((
        Term {
            bytes: w.bytes,
            basis: TermBasis::Code,
            why: format!(
                "the text model's parameters on one rank of {} in {format:?}, from {from} (vision towers and MTP heads not counted)",
                f.tp
            ),
        },
        format,
    ))
}

/// The profile run's torch peak increase and the part that peaks.
fn profile_peak(
    cfg: &ModelConfig,
    f: &VllmFlags,
    tokens: u64,
    rows: u64,
) -> Result<(u64, StepLayer), ModelError> {
    let layers = profile(cfg, f, tokens, rows)?;
    let top = layers
        .iter()
        .max_by_key(|l| l.bytes)
        .ok_or_else(|| ModelError::Invalid("the model has no layers".into()))?;
    Ok((top.bytes, top.kind))
}

/// The profile run's layer kinds for a batch of `tokens` on one rank, the sampler on `rows`.
fn profile(
    cfg: &ModelConfig,
    f: &VllmFlags,
    tokens: u64,
    rows: u64,
) -> Result<Vec<crate::LayerPeak>, ModelError> {
    on_rank(cfg, f, tokens, |st| profile_layers(st, rows))
}

/// `run` on one sequence of `tokens` on one rank of `f`'s, vLLM's variants.
fn on_rank<R>(
    cfg: &ModelConfig,
    f: &VllmFlags,
    tokens: u64,
    run: impl FnOnce(&LayerStep) -> Result<R, ModelError>,
) -> Result<R, ModelError> {
    let mut shape = ServingShape::prefill(cfg, tokens, tokens);
    shape.tp = f.tp;
    shape.num_sms = f.num_sms;
    let v = StepVariants::for_runtime(Runtime::Vllm, cfg);
    run(&LayerStep::new(cfg, &v, &shape)?)
}

/// The CUDA-graph estimate (notes §2.8): 0 with `--enforce-eager`; otherwise vLLM captures the
/// two largest graphs of each mode into a scratch pool and counts the first whole and the second
/// for every further graph (at least 1 MiB each). A config cannot say what a capture takes: the
/// first capture is modelled as the profile run's forward peak at the largest capture size, and
/// each further graph at vLLM's floor of 1 MiB, unless `--known cuda_graphs=` gives the
/// estimate. Subtracted only while `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` is 1.
fn cudagraph(
    cfg: &ModelConfig,
    f: &VllmFlags,
    mnbt: u64,
    mns: u64,
) -> Result<(Term, (u64, u64)), ModelError> {
    if f.enforce_eager {
        return Ok((
            Term {
                bytes: 0,
                basis: TermBasis::Skipped,
                why: "--enforce-eager: no CUDA graphs".into(),
            },
            (0, 0),
        ));
    }
    let sizes = capture_sizes(mnbt, mns);
    let full = sizes.iter().filter(|&&s| s <= mns).count() as u64;
    let counts = (sizes.len() as u64, full);
    let largest = *sizes.last().unwrap_or(&1);
    let estimate = match f.cudagraph_estimate {
        Some(b) => b,
        None => {
            let forward = profile(cfg, f, largest, 1)?
                .iter()
                .filter(|l| l.kind != StepLayer::Logits)
                .map(|l| l.bytes)
                .max()
                .unwrap_or(0);
            forward
                + PER_GRAPH_FLOOR * counts.0.saturating_sub(1)
                + PER_GRAPH_FLOOR * counts.1.saturating_sub(1)
        }
    };
    let (bytes, basis, why) = if !f.estimate_cudagraphs {
        (
            0,
            TermBasis::Skipped,
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0: computed but not subtracted".to_string(),
        )
    } else if f.cudagraph_estimate.is_some() {
        (
            estimate,
            TermBasis::Given,
            "the CUDA-graph estimate, given".to_string(),
        )
    } else {
        (
            estimate,
            TermBasis::Default,
            format!(
                "the CUDA-graph estimate, modelled: the forward's peak at {largest} tokens for the first capture, 1 MiB for each of the other {} PIECEWISE and {} FULL graphs",
                counts.0.saturating_sub(1),
                counts.1.saturating_sub(1)
            ),
        )
    };
    Ok((Term { bytes, basis, why }, counts))
}

/// The capture sizes vLLM picks by default (`config/vllm.py:1476-1534`): up to
/// `min(2 × max_num_seqs, 512, max_num_batched_tokens)`, `[1, 2, 4]`, every 8 to 256, every 16
/// from 256, and the batch itself when it is within the largest.
fn capture_sizes(mnbt: u64, mns: u64) -> Vec<u64> {
    let max = (mns * 2).min(512).min(mnbt).max(1);
    let mut s: Vec<u64> = [1, 2, 4].into_iter().filter(|&i| i <= max).collect();
    if max >= 8 {
        s.extend((8..(max + 1).min(256)).step_by(8));
    }
    if max >= 256 {
        s.extend((256..=max).step_by(16));
    }
    if mnbt <= max {
        s.push(mnbt);
    }
    s.sort_unstable();
    s.dedup();
    s
}

/// The pool's shape for `cfg` on one rank (notes §4, §5, §6): KV heads replicated once fewer than
/// the ranks (`config/model.py:1219-1230`), the GDN state in the model dtype, its recurrent part
/// in the config's `mamba_ssm_dtype` when it declares one (Qwen3.5's `verify_and_update_config`,
/// `model_executor/models/config.py:606-630`), else the model dtype (`mamba_utils.py:83-116`).
fn pool_shape(
    cfg: &ModelConfig,
    f: &VllmFlags,
    max_model_len: u64,
) -> Result<PoolShape, ModelError> {
    let gdn = (cfg.num_linear_layers() > 0).then(|| GdnState {
        key_heads: cfg.linear_num_key_heads,
        value_heads: cfg.linear_num_value_heads,
        key_dim: cfg.linear_key_head_dim,
        value_dim: cfg.linear_value_head_dim,
        conv_kernel: cfg.linear_conv_kernel_dim,
        conv_bytes: cfg.dtype.size_bytes(),
        ssm_bytes: f
            .mamba_ssm_cache_dtype
            .or(cfg.mamba_ssm_dtype)
            .unwrap_or(cfg.dtype)
            .size_bytes(),
    });
    if let Some(b) = f.block_size
        && (b == 0 || b % DEFAULT_BLOCK_SIZE != 0)
    {
        return Err(ModelError::Invalid(format!(
            "--block-size {b} is not a multiple of {DEFAULT_BLOCK_SIZE} (FlashAttention's kernel block)"
        )));
    }
    Ok(PoolShape {
        attention_layers: cfg.num_attention_layers(),
        gdn_layers: cfg.num_linear_layers(),
        kv_heads_per_rank: (cfg.num_key_value_heads / f.tp).max(1),
        head_size: cfg.head_dim,
        kv_bytes: f.kv_cache_dtype.unwrap_or(cfg.dtype).size_bytes(),
        gdn,
        tp: f.tp,
        block_size: f.block_size,
        max_model_len,
        num_spec: f.num_speculative_tokens,
        prefix_caching: f.enable_prefix_caching,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rel: &str) -> ModelConfig {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
        ModelConfig::from_path(p).unwrap()
    }

    fn qwen36() -> ModelConfig {
        config("../samples/models/Qwen3.6-27B/config.json")
    }

    /// A 24 GB card as vLLM reads an RTX 3090 (`total_gpu_memory=23.58GiB` in its logs).
    const CARD_24: u64 = 25_318_832_209;

    /// The closing table's case: Qwen3.6-27B, int4, a 24 GB card, chunk 4128.
    fn flags(util: f64) -> VllmFlags {
        VllmFlags {
            gpu_memory_utilization: util,
            max_num_batched_tokens: Some(4128),
            max_model_len: Some(65_536),
            weights: Some(WeightFormat::Int4 { group: 128 }),
            ..VllmFlags::serve(CARD_24)
        }
    }

    #[test]
    fn the_budget_is_the_ceiling_of_total_times_util_less_each_term() {
        let c = qwen36();
        let p = plan(&c, &flags(0.92)).unwrap();
        assert_eq!(
            p.requested_bytes,
            (CARD_24 as f64 * 0.92).ceil() as u64,
            "v1/worker/utils.py:408-410"
        );
        let spent = p.weights.bytes + p.profiled_peak.bytes + p.non_torch.bytes + p.cudagraph.bytes;
        assert_eq!(p.available_bytes, p.requested_bytes as i64 - spent as i64);
        assert_eq!(
            p.slack_bytes,
            (CARD_24 - DEFAULT_OUTSIDE_BUDGET - p.requested_bytes) as i64
        );
        // The pool takes whole blocks of the available bytes, never more.
        let q = plan(&c, &flags(0.95)).unwrap();
        let pool = q.pool.as_ref().unwrap();
        assert!(pool.pool_bytes as i64 <= q.available_bytes);
        assert!(
            q.available_bytes - (pool.pool_bytes as i64)
                < (pool.page_bytes * pool.group_size) as i64
        );
    }

    #[test]
    fn lowering_util_never_lowers_the_slack_and_never_grows_the_pool() {
        for c in [
            qwen36(),
            config("../samples/models/Qwen3-Next-80B-A3B/config.json"),
            config("../samples/h200/hf-serve-cb/config.json"),
        ] {
            let mut last: Option<VllmPlan> = None;
            for u in (50..=100).rev().map(|u| u as f64 / 100.0) {
                let f = VllmFlags {
                    gpu_memory_utilization: u,
                    max_model_len: Some(4096),
                    ..VllmFlags::serve(80 << 30)
                };
                let p = plan(&c, &f).unwrap();
                if let Some(prev) = &last {
                    assert!(
                        p.slack_bytes >= prev.slack_bytes,
                        "{}: util {u}",
                        c.display_name()
                    );
                    let pool = |x: &VllmPlan| x.pool.as_ref().map_or(0, |p| p.pool_bytes);
                    assert!(pool(&p) <= pool(prev), "{}: util {u}", c.display_name());
                }
                last = Some(p);
            }
        }
    }

    #[test]
    fn vllm_serve_s_batch_defaults_depend_on_the_card() {
        // engine/arg_utils.py:2208-2227, 2339-2411.
        let f = |card: u64, mnbt: Option<u64>, mns: Option<u64>| VllmFlags {
            max_num_batched_tokens: mnbt,
            max_num_seqs: mns,
            ..VllmFlags::serve(card)
        };
        assert_eq!(
            batch_defaults(&f(80 << 30, None, None), 32_768),
            (8192, 1024)
        );
        assert_eq!(batch_defaults(&f(CARD_24, None, None), 32_768), (2048, 256));
        // A default batch is capped at max_num_seqs × max_model_len; a default max_num_seqs at
        // the batch.
        assert_eq!(batch_defaults(&f(CARD_24, None, Some(2)), 512), (1024, 2));
        assert_eq!(
            batch_defaults(&f(CARD_24, Some(100), None), 32_768),
            (100, 100)
        );
    }

    #[test]
    fn capture_sizes_are_vllm_s_default_list() {
        // config/vllm.py:1476-1534: [1, 2, 4], 8..248 by 8 (31), 256..512 by 16 (17).
        let s = capture_sizes(4128, 256);
        assert_eq!(s.len(), 51);
        assert_eq!((s[0], s[3], s[34], *s.last().unwrap()), (1, 8, 256, 512));
        assert_eq!(capture_sizes(4128, 2), vec![1, 2, 4]);
        assert_eq!(capture_sizes(3, 256), vec![1, 2, 3]);
        // Eager mode captures nothing and subtracts nothing.
        let c = qwen36();
        let p = plan(
            &c,
            &VllmFlags {
                enforce_eager: true,
                ..flags(0.92)
            },
        )
        .unwrap();
        assert_eq!((p.cudagraph.bytes, p.cudagraph_counts), (0, (0, 0)));
        let p = plan(
            &c,
            &VllmFlags {
                estimate_cudagraphs: false,
                ..flags(0.92)
            },
        )
        .unwrap();
        assert_eq!((p.cudagraph.bytes, p.cudagraph_counts), (0, (51, 35)));
    }

    #[test]
    fn the_profile_run_skips_the_kernels_so_a_step_can_exceed_it() {
        // With one sequence at a time the sampler is small, and the profile's peak is the
        // layers without their kernels: the real step's GDN kernel is over it.
        let c = qwen36();
        let f = VllmFlags {
            max_num_seqs: Some(1),
            ..flags(0.95)
        };
        let p = plan(&c, &f).unwrap();
        let s = step(&c, &f, &p, 4128, 60_000).unwrap();
        assert_eq!(s.peak_layer, StepLayer::Gdn);
        assert!(s.excess_bytes > 0, "{s:?}");
        // The excess is what the slack holds: the margin is the slack less the excess, plus the
        // pool's rounding.
        let rounding = p.available_bytes - p.pool.as_ref().unwrap().pool_bytes as i64;
        assert_eq!(s.margin_bytes, p.slack_bytes - s.excess_bytes + rounding);
        // 256 sequences: the sampler's warm-up (14 bytes per row per vocabulary entry) is the
        // profiled peak, over the step's.
        let p = plan(&c, &flags(0.95)).unwrap();
        assert_eq!(p.profiled_peak_layer, StepLayer::Logits);
        assert!(p.profiled_peak.bytes >= 256 * 248_320 * 14);
    }

    #[test]
    fn vllm_refuses_to_start_when_the_budget_is_more_than_the_free_memory() {
        let c = qwen36();
        let p = plan(&c, &flags(1.0)).unwrap();
        assert!(p.slack_bytes < 0);
        let e = p.startup_error().unwrap();
        assert!(
            e.contains("less than the desired GPU memory utilization"),
            "{e}"
        );
        let s = step(&c, &flags(1.0), &p, 4128, 8000).unwrap();
        assert!(!s.admitted && !s.fits);
        assert!(plan(&c, &flags(1.5)).is_err());
    }

    #[test]
    fn a_context_longer_than_max_model_len_is_refused_not_run() {
        let c = qwen36();
        let f = flags(0.95);
        let p = plan(&c, &f).unwrap();
        let s = step(&c, &f, &p, 4128, 70_000).unwrap();
        assert!(!s.admitted);
        assert!(s.refused_because.unwrap().contains("--max-model-len 65536"));
    }

    #[test]
    fn int4_weights_come_from_the_config_s_quantization_config() {
        let mut v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../samples/models/Qwen3.6-27B/config.json"),
            )
            .unwrap(),
        )
        .unwrap();
        let path = std::path::Path::new("config.json");
        let bf16 = plan(
            &ModelConfig::from_json(&v, path).unwrap(),
            &VllmFlags {
                weights: None,
                ..flags(0.92)
            },
        )
        .unwrap();
        v["quantization_config"] = serde_json::json!({"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": true});
        let c = ModelConfig::from_json(&v, path).unwrap();
        let int4 = plan(
            &c,
            &VllmFlags {
                weights: None,
                ..flags(0.92)
            },
        )
        .unwrap();
        assert_eq!(int4.weight_format, WeightFormat::Int4 { group: 128 });
        assert_eq!(
            int4.weights.bytes,
            plan(&c, &flags(0.92)).unwrap().weights.bytes
        );
        assert!(int4.weights.bytes * 2 < bf16.weights.bytes);
        v["quantization_config"] =
            serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
        let c = ModelConfig::from_json(&v, path).unwrap();
        let fp8 = plan(
            &c,
            &VllmFlags {
                weights: None,
                ..flags(0.92)
            },
        )
        .unwrap();
        assert_eq!(fp8.weight_format, WeightFormat::Fp8Block128);
        v["quantization_config"] = serde_json::json!({"quant_method": "bitsandbytes"});
        let c = ModelConfig::from_json(&v, path).unwrap();
        let e = plan(
            &c,
            &VllmFlags {
                weights: None,
                ..flags(0.92)
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("\"bitsandbytes\" is not counted") && e.contains("--weights"),
            "{e}"
        );
    }
}
