//! A model-shaped chunked prefill: one long prompt through every layer of a
//! hybrid GDN + attention model, chunk by chunk, as vLLM schedules it with
//! `--max-num-batched-tokens`, on the workload's own kernels.
//!
//! [`run`] allocates, in this order and under these ranges (the labels the
//! preload records):
//! 1. persistent stand-ins: the `capacity ballast` (`prefill/capacity`, real
//!    GPUs only, see [`plan_capacity`]); the weights, one allocation per layer
//!    (`layer.{l}.weights`) plus `embed_tokens`, the final `norm` and an untied
//!    `lm_head` (`prefill/weights`); the conv and recurrent state of every GDN
//!    layer for one sequence (`prefill/gdn_state`); with
//!    [`KvCacheMode::Preallocate`], one KV block per attention layer
//!    (`prefill/kv_cache`). Their sizes come from `vramtrace_models`
//!    (`weight_bytes`, `gdn_state_per_seq`, `kv_cache_per_token`): they are
//!    stand-ins, and the weights an estimate.
//! 2. for each chunk `i`: with [`KvCacheMode::Grow`], the block holding the
//!    chunk's K and V in every attention layer (`layer.{l}.kv.chunk.{i}`, under
//!    `prefill/kv_cache`), as the scheduler allocates a step's slots before the
//!    step runs; then every layer `l` in order under `prefill/chunk.{i}/layer.{l}/`:
//!    `gdn/` ([`gdn`]'s inputs and fla 0.6.0's forward, ranges included),
//!    `attention/` ([`fa`]'s inputs and `_flash_attention_forward`), then `mlp/`.
//!    Everything a layer allocates is freed before the next layer starts.
//!
//! The GDN and attention tensors are the kernels' own ([`gdn::forward`],
//! [`fa::forward`]); only the persistent stand-ins and the MLP come from the
//! model. Not reproduced: the embedding lookup, the projections, norms, rotary
//! embedding and short convolution (their outputs are the kernels' inputs,
//! allocated by `allocate_inputs`), the residual stream between layers, the
//! sampler, and fla's `@tensor_cache`, which would keep one `chunk_indices` /
//! `chunk_offsets` per chunk across layers (here each layer frees its own:
//! bytes per chunk, not per token).

use std::collections::HashMap;
use std::time::Instant;

use vramtrace_models::{self as model, LayerKind, ModelConfig, WeightFormat};

use crate::dtype::DType;
use crate::error::{AllocFailure, Error, Result};
use crate::fa::{self, FaConfig, FaInputBytes};
use crate::gdn::{self, GdnConfig, GdnInputBytes, GdnOutputs};
use crate::tensor::{DeviceTensor, PeakMark, Session, TensorSpec};

/// vLLM's chunk on a 24 GiB card (`--max-num-batched-tokens 4128`).
pub const DEFAULT_CHUNK: usize = 4128;

/// The name of the allocation that shrinks a real GPU to `--capacity`.
pub const BALLAST: &str = "capacity ballast";

/// How the KV cache gets its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCacheMode {
    /// For each chunk and attention layer, one block holding that chunk's K
    /// and V, allocated as the context grows (a paged allocator on demand), so
    /// memory fills with the prompt: this is what makes a prompt-length cliff.
    Grow,
    /// One block per attention layer for this many tokens, before the first chunk.
    Preallocate {
        /// Tokens the cache holds.
        tokens: usize,
    },
}

/// What to prefill, besides the model.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillOptions {
    /// Tokens of the one prompt.
    pub prompt_tokens: usize,
    /// Tokens per chunk (the last chunk may be shorter).
    pub chunk: usize,
    /// Storage format of the weight stand-ins.
    pub weights: WeightFormat,
    /// How the KV cache is allocated.
    pub kv_cache: KvCacheMode,
    /// KV cache element type: [`DType::BF16`] for the activation dtype (the
    /// plan takes the model's 16-bit type), or [`DType::F8E4M3`].
    pub kv_dtype: DType,
    /// Seed of the inputs of a real run.
    pub seed: u64,
}

/// The persistent state of one GDN layer for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct GdnStateSpec {
    /// The layer.
    pub layer: usize,
    /// Short-convolution state `[1, kernel - 1, conv_dim]` in the model dtype.
    pub conv: TensorSpec,
    /// Recurrent state `[1, HV, K, V]`, fp32: fla's `initial_state` /
    /// `final_state` layout and dtype (vLLM's `--mamba-ssm-cache-dtype float32`;
    /// vLLM stores it as (HV, V, K), the same bytes).
    pub ssm: TensorSpec,
}

/// One chunk of the prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSpan {
    /// Its index (`chunk.{index}` in the labels).
    pub index: usize,
    /// Its first token.
    pub start: usize,
    /// Its tokens.
    pub tokens: usize,
}

/// Everything a prefill allocates that does not depend on the chunk, and the
/// layer shapes the kernels run with.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillPlan {
    /// The model's short name (its config's folder).
    pub model: String,
    /// The options it was planned with.
    pub options: PrefillOptions,
    /// Layer kinds, in order.
    pub layers: Vec<LayerKind>,
    /// Activation dtype (the model's `torch_dtype`).
    pub dtype: DType,
    /// Weight stand-ins in allocation order.
    pub weights: Vec<TensorSpec>,
    /// GDN state per GDN layer, in layer order.
    pub states: Vec<GdnStateSpec>,
    /// A GDN layer's call, for one token (see [`PrefillPlan::gdn_config`]).
    pub gdn: GdnConfig,
    /// An attention layer's call, for one token (see [`PrefillPlan::fa_config`]).
    pub attention: FaConfig,
    /// `hidden_size`.
    pub hidden: usize,
    /// The MLP's intermediate size (the shared expert's for MoE models).
    pub intermediate: usize,
    /// KV bytes per token of one attention layer (`kv_cache_per_token`).
    pub kv_bytes_per_token: usize,
}

fn model_err(e: model::ModelError) -> Error {
    Error::Model(e.to_string())
}

/// The name of a weight format as `--weights` takes it.
pub fn weight_format_name(f: WeightFormat) -> String {
    match f {
        WeightFormat::Bf16 => "bf16".into(),
        WeightFormat::Fp8Block128 => "fp8".into(),
        WeightFormat::Int4 { group } => format!("int4:{group}"),
    }
}

/// The weight stand-ins: `embed_tokens`, `layer.{l}.weights` for every layer,
/// the final `norm`, and `lm_head` unless tied. `weight_bytes` sums over layers,
/// so each layer's share is the estimate of a one-layer model less that of a
/// model with no layers; the pieces add up to the whole estimate exactly.
fn weight_specs(cfg: &ModelConfig, format: WeightFormat) -> Result<Vec<TensorSpec>> {
    let estimate = |layers: Vec<LayerKind>| -> Result<u64> {
        let mut c = cfg.clone();
        c.num_hidden_layers = layers.len() as u64;
        c.layer_types = layers;
        Ok(model::weight_bytes(&c, format, 1).map_err(model_err)?.bytes)
    };
    let base = estimate(Vec::new())?;
    let gdn_layer = estimate(vec![LayerKind::LinearAttention])? - base;
    let attention_layer = estimate(vec![LayerKind::FullAttention])? - base;
    let (vocab, hidden) = (cfg.vocab_size as usize, cfg.hidden_size as usize);
    let table = vocab * hidden * 2;
    let lm_head = if cfg.tie_word_embeddings { 0 } else { table };
    let norm = (base as usize)
        .checked_sub(table + lm_head)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            Error::Model(format!(
                "the weight estimate without layers ({base} bytes) is not the embedding, \
                 lm_head and final norm this workload splits it into"
            ))
        })?;
    let mut specs = vec![TensorSpec::new(
        "embed_tokens",
        DType::BF16,
        &[vocab, hidden],
    )];
    for (l, kind) in cfg.layer_types.iter().enumerate() {
        specs.push(TensorSpec::new(
            format!("layer.{l}.weights"),
            DType::U8,
            &[match kind {
                LayerKind::LinearAttention => gdn_layer,
                LayerKind::FullAttention => attention_layer,
            } as usize],
        ));
    }
    specs.push(if norm == 2 * hidden {
        TensorSpec::new("norm", DType::BF16, &[hidden])
    } else {
        TensorSpec::new("norm", DType::U8, &[norm])
    });
    if lm_head > 0 {
        specs.push(TensorSpec::new("lm_head", DType::BF16, &[vocab, hidden]));
    }
    let total: usize = specs.iter().map(TensorSpec::bytes).sum();
    let whole = model::weight_bytes(cfg, format, 1)
        .map_err(model_err)?
        .bytes;
    if total as u64 != whole {
        return Err(Error::Model(format!(
            "the weight stand-ins add up to {total} bytes, not the estimate's {whole}"
        )));
    }
    Ok(specs)
}

impl PrefillPlan {
    /// Plan a prefill of `cfg` (one rank, no tensor parallelism).
    pub fn new(cfg: &ModelConfig, mut options: PrefillOptions) -> Result<Self> {
        let bad = |m: String| Err(Error::InvalidShape(m));
        if options.prompt_tokens == 0 {
            return bad("--prompt-tokens must be at least 1".into());
        }
        if options.chunk == 0 {
            return bad("--chunk must be at least 1".into());
        }
        let dtype = DType::from(cfg.dtype);
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(Error::Model(format!(
                "the model's dtype is {}; prefill runs FlashAttention, which takes bfloat16 or \
                 float16 only",
                cfg.dtype
            )));
        }
        options.kv_dtype = match options.kv_dtype {
            DType::BF16 | DType::F16 => dtype,
            DType::F8E4M3 => DType::F8E4M3,
            other => return bad(format!("--kv-dtype {other} is not bf16 or fp8")),
        };
        if let KvCacheMode::Preallocate { tokens } = options.kv_cache
            && tokens < options.prompt_tokens
        {
            return bad(format!(
                "--kv-tokens {tokens} cannot hold the {} prompt tokens (vLLM refuses a prompt \
                 longer than its KV cache); give at least {}",
                options.prompt_tokens, options.prompt_tokens
            ));
        }
        let weights = weight_specs(cfg, options.weights)?;

        let state =
            model::gdn_state_per_seq(cfg, 1, cfg.dtype, model::DType::F32, 0).map_err(model_err)?;
        let conv: Vec<usize> = state.conv_shape.iter().map(|&d| d as usize).collect();
        let (hv, k, v) = (
            cfg.linear_num_value_heads as usize,
            cfg.linear_key_head_dim as usize,
            cfg.linear_value_head_dim as usize,
        );
        let states: Vec<GdnStateSpec> = cfg
            .layer_types
            .iter()
            .enumerate()
            .filter(|(_, k)| **k == LayerKind::LinearAttention)
            .map(|(l, _)| GdnStateSpec {
                layer: l,
                conv: TensorSpec::new(
                    format!("layer.{l}.conv_state"),
                    dtype,
                    &[1, conv[0], conv[1]],
                ),
                ssm: TensorSpec::new(format!("layer.{l}.ssm_state"), DType::F32, &[1, hv, k, v]),
            })
            .collect();
        if let Some(s) = states.first()
            && (s.conv.bytes() + s.ssm.bytes()) as u64 != state.bytes_per_layer
        {
            return Err(Error::Model(format!(
                "the GDN state stand-ins take {} bytes a layer, not gdn_state_per_seq's {}",
                s.conv.bytes() + s.ssm.bytes(),
                state.bytes_per_layer
            )));
        }

        let kv_dtype = model::DType::try_from(options.kv_dtype).map_err(Error::Model)?;
        let kv = model::kv_cache_per_token(cfg, 1, kv_dtype).map_err(model_err)?;
        let ffn = model::FfnShape::from_config(cfg, options.chunk as u64, 1, cfg.dtype)
            .map_err(model_err)?;
        let plan = PrefillPlan {
            model: cfg.display_name(),
            options,
            layers: cfg.layer_types.clone(),
            dtype,
            weights,
            states,
            gdn: GdnConfig {
                seqlens: vec![1],
                // vLLM passes cu_seqlens, l2-normalises q and k inside the call and
                // always hands over (and takes back) the recurrent state.
                varlen: true,
                heads: hv,
                key_heads: cfg.linear_num_key_heads as usize,
                key_dim: k,
                value_dim: v,
                dtype,
                scale: None,
                qk_l2norm: true,
                initial_state: true,
            },
            attention: FaConfig::new(
                &[1],
                cfg.num_attention_heads as usize,
                cfg.num_key_value_heads as usize,
                cfg.head_dim as usize,
                dtype,
            ),
            hidden: cfg.hidden_size as usize,
            intermediate: ffn.intermediate as usize,
            kv_bytes_per_token: kv.bytes_per_layer as usize,
        };
        let block = plan.kv_block(0, Some(0), 1);
        if block.bytes() != plan.kv_bytes_per_token {
            return Err(Error::Model(format!(
                "a KV block takes {} bytes a token, not kv_cache_per_token's {}",
                block.bytes(),
                plan.kv_bytes_per_token
            )));
        }
        let mut lengths: Vec<usize> = plan.chunks().iter().map(|c| c.tokens).collect();
        lengths.dedup();
        for t in lengths {
            plan.gdn_config(t).validate()?;
            plan.fa_config(t)
                .validate()
                .map_err(|e| Error::InvalidShape(format!("a chunk of {t} tokens: {e}")))?;
        }
        Ok(plan)
    }

    /// The chunks of the prompt, in order.
    pub fn chunks(&self) -> Vec<ChunkSpan> {
        let (n, c) = (self.options.prompt_tokens, self.options.chunk);
        (0..n.div_ceil(c))
            .map(|i| ChunkSpan {
                index: i,
                start: i * c,
                tokens: c.min(n - i * c),
            })
            .collect()
    }

    /// The GDN call of a chunk of `tokens`.
    pub fn gdn_config(&self, tokens: usize) -> GdnConfig {
        GdnConfig {
            seqlens: vec![tokens],
            ..self.gdn.clone()
        }
    }

    /// The attention call of a chunk of `tokens`: its queries over its own
    /// keys. FlashAttention's outputs (`out`, `softmax_lse`) are sized by the
    /// chunk's tokens, not by the context, so only the KV cache grows with it.
    pub fn fa_config(&self, tokens: usize) -> FaConfig {
        self.attention.clone().with_seqlens(&[tokens])
    }

    /// The KV block of attention layer `layer`: K and V for `tokens` tokens,
    /// `[2, tokens, kv_heads, head_dim]`; named for its chunk when the cache
    /// grows, for the layer when it is preallocated.
    pub fn kv_block(&self, layer: usize, chunk: Option<usize>, tokens: usize) -> TensorSpec {
        let name = match chunk {
            Some(i) => format!("layer.{layer}.kv.chunk.{i}"),
            None => format!("layer.{layer}.kv"),
        };
        TensorSpec::new(
            name,
            self.options.kv_dtype,
            &[2, tokens, self.attention.kv_heads, self.attention.head_dim],
        )
    }

    /// The three tensors of the MLP stand-in for a chunk of `tokens`, in
    /// allocation order (vLLM 0.20.1 `Qwen2MoeMLP.forward`, eager: see
    /// `vramtrace_models::ffn`).
    pub fn mlp_specs(&self, tokens: usize) -> [TensorSpec; 3] {
        [
            TensorSpec::new("gate_up", self.dtype, &[tokens, 2 * self.intermediate]),
            TensorSpec::new(
                "act (silu_and_mul)",
                self.dtype,
                &[tokens, self.intermediate],
            ),
            TensorSpec::new("down", self.dtype, &[tokens, self.hidden]),
        ]
    }

    /// Bytes of the weight stand-ins.
    pub fn weight_bytes(&self) -> usize {
        self.weights.iter().map(TensorSpec::bytes).sum()
    }

    /// Bytes of the GDN states.
    pub fn state_bytes(&self) -> usize {
        self.states
            .iter()
            .map(|s| s.conv.bytes() + s.ssm.bytes())
            .sum()
    }

    /// Attention layers.
    pub fn attention_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|k| **k == LayerKind::FullAttention)
            .count()
    }
}

/// How `--capacity` is enforced on this device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityPlan {
    /// `--capacity`, when given.
    pub requested: Option<usize>,
    /// Total device memory, when the device says.
    pub device_total: Option<usize>,
    /// Free device memory before the run, when the device says.
    pub device_free: Option<usize>,
    /// Bytes of the ballast to allocate first (0: none).
    pub ballast: usize,
    /// Something the user should know about how the capacity applies.
    pub note: Option<String>,
}

/// Decide how to hold the run to `requested` bytes, given the device's
/// `(free, total)` memory right after context creation. On a real GPU
/// (`ballast_allowed`) a ballast of `free - requested` leaves the run exactly
/// `requested` bytes, so the driver itself refuses the allocation that does
/// not fit; on the stand-in driver its own capacity (`VRAMTRACE_FAKE_CAPACITY`)
/// limits, and this only reports it. A capacity larger than the card is refused.
pub fn plan_capacity(
    requested: Option<usize>,
    ballast_allowed: bool,
    mem: Option<(usize, usize)>,
) -> Result<CapacityPlan> {
    let mut plan = CapacityPlan {
        requested,
        device_total: mem.map(|m| m.1),
        device_free: mem.map(|m| m.0),
        ballast: 0,
        note: None,
    };
    let Some(req) = requested else {
        return Ok(plan);
    };
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    if let Some((_, total)) = mem
        && req > total
    {
        return Err(Error::InvalidShape(format!(
            "--capacity {req} bytes ({:.2} GiB) is larger than the card ({total} bytes, {:.2} GiB); \
             give at most {total}",
            gib(req),
            gib(total)
        )));
    }
    match (ballast_allowed, mem) {
        (true, None) => {
            return Err(Error::Driver {
                call: "cuMemGetInfo_v2".into(),
                message: "the driver did not report free memory, which --capacity needs to size \
                          its ballast; run without --capacity"
                    .into(),
            });
        }
        (true, Some((free, _))) if free > req => plan.ballast = free - req,
        (true, Some((free, _))) => {
            plan.note = Some(format!(
                "the card has only {free} bytes ({:.2} GiB) free, not more than --capacity: no \
                 ballast, the card's own free memory limits",
                gib(free)
            ));
        }
        (false, Some((_, total))) if total != req => {
            plan.note = Some(format!(
                "on the stand-in driver its own capacity limits ({total} bytes, {:.2} GiB): set \
                 VRAMTRACE_FAKE_CAPACITY={req} to simulate a {:.2} GiB card",
                gib(total),
                gib(req)
            ));
        }
        (false, _) => {}
    }
    Ok(plan)
}

/// Bytes held by each kind of tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The capacity ballast.
    pub ballast: usize,
    /// Weight stand-ins.
    pub weights: usize,
    /// KV cache blocks.
    pub kv_cache: usize,
    /// GDN conv and recurrent states.
    pub gdn_state: usize,
    /// Everything else: the live layer's inputs, intermediates and outputs.
    pub activations: usize,
}

impl Held {
    /// All of it.
    pub fn total(&self) -> usize {
        self.ballast + self.weights + self.kv_cache + self.gdn_state + self.activations
    }

    fn persistent(&self) -> usize {
        self.ballast + self.weights + self.kv_cache + self.gdn_state
    }
}

/// What one completed chunk left behind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkReport {
    /// Which chunk.
    pub span: ChunkSpan,
    /// Prompt tokens prefilled once it finished.
    pub tokens_done: usize,
    /// KV cache bytes held then.
    pub kv_cache_bytes: usize,
    /// Bytes held then (the persistent tensors).
    pub live_bytes: usize,
    /// The most bytes held at once during the chunk.
    pub peak_bytes: usize,
    /// Wall time of the chunk, in seconds.
    pub seconds: f64,
}

/// Where a prefill was when an allocation failed.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The tensor that could not be allocated.
    pub name: String,
    /// Its dtype name.
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Bytes requested.
    pub bytes: usize,
    /// The range path of the request, the label the preload records with it.
    pub label: String,
    /// The chunk being prefilled (none while allocating persistent tensors).
    pub chunk: Option<ChunkSpan>,
    /// The layer running (none outside the layers).
    pub layer: Option<usize>,
    /// Its kind.
    pub layer_kind: Option<LayerKind>,
    /// The stage: the label below `layer.{l}/`, or below `prefill/` outside layers.
    pub stage: String,
    /// Prompt tokens prefilled by the chunks before.
    pub tokens_prefilled: usize,
    /// Bytes held when the request failed.
    pub held: Held,
    /// Free device memory then, when the device says.
    pub device_free: Option<usize>,
    /// The driver's error.
    pub message: String,
}

/// What a prefill did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefillOutcome {
    /// The chunks that completed.
    pub chunks: Vec<ChunkReport>,
    /// The persistent bytes at the end (or at the failure).
    pub persistent: Held,
    /// The most bytes held at once.
    pub peak: Option<PeakMark>,
    /// The allocation that did not fit, if one did not.
    pub failure: Option<Failure>,
}

/// Where the run is, for the failure report.
#[derive(Default)]
struct Position {
    chunk: Option<ChunkSpan>,
    layer: Option<usize>,
}

/// Run the prefill of `plan`, allocating a `ballast` of that many bytes first
/// when it is not 0, and calling `progress` after each chunk. An allocation
/// the device refuses for lack of memory ends the run cleanly: the outcome
/// says where ([`PrefillOutcome::failure`]) and every tensor is freed. Other
/// errors are returned.
pub fn run(
    s: &Session<'_>,
    plan: &PrefillPlan,
    ballast: usize,
    progress: &mut dyn FnMut(&ChunkReport),
) -> Result<PrefillOutcome> {
    let mut out = PrefillOutcome::default();
    let mut at = Position::default();
    let result = {
        let _r = s.range("prefill");
        body(s, plan, ballast, progress, &mut out, &mut at)
    };
    out.peak = s.peak();
    match result {
        Ok(()) => Ok(out),
        Err(Error::Alloc(a)) if a.out_of_memory => {
            let AllocFailure {
                name,
                dtype,
                shape,
                bytes,
                message,
                stage: label,
                live_bytes,
                device_free,
                ..
            } = *a;
            let mut held = out.persistent;
            held.activations = live_bytes.saturating_sub(held.persistent());
            let in_layer = match (at.chunk, at.layer) {
                (Some(c), Some(l)) => format!("prefill/chunk.{}/layer.{l}/", c.index),
                _ => "prefill/".into(),
            };
            let stage = label
                .strip_prefix(&in_layer)
                .or_else(|| label.strip_prefix("prefill/"))
                .unwrap_or(&label)
                .to_string();
            out.failure = Some(Failure {
                name,
                dtype,
                shape,
                bytes,
                label,
                chunk: at.chunk,
                layer: at.layer,
                layer_kind: at.layer.map(|l| plan.layers[l]),
                stage,
                tokens_prefilled: at.chunk.map_or(0, |c| c.start),
                held,
                device_free,
                message,
            });
            Ok(out)
        }
        Err(e) => Err(e),
    }
}

/// Encoded inputs, generated once per chunk length and uploaded for every
/// layer (real runs only: the kernels need finite inputs, not fresh ones).
struct HostInputs {
    seed: u64,
    gdn: HashMap<usize, GdnInputBytes>,
    fa: HashMap<usize, FaInputBytes>,
}

impl HostInputs {
    fn gdn(
        &mut self,
        s: &Session<'_>,
        plan: &PrefillPlan,
        tokens: usize,
    ) -> Option<&GdnInputBytes> {
        if !s.executes_kernels() {
            return None;
        }
        let seed = self.seed;
        Some(self.gdn.entry(tokens).or_insert_with(|| {
            // No h0: the initial state comes from the layer's persistent state.
            let cfg = GdnConfig {
                initial_state: false,
                ..plan.gdn_config(tokens)
            };
            gdn::generate_inputs(&cfg, seed).encode(cfg.dtype)
        }))
    }

    fn fa(&mut self, s: &Session<'_>, plan: &PrefillPlan, tokens: usize) -> Option<&FaInputBytes> {
        if !s.executes_kernels() {
            return None;
        }
        let seed = self.seed;
        Some(self.fa.entry(tokens).or_insert_with(|| {
            let cfg = plan.fa_config(tokens);
            fa::generate_inputs(&cfg, seed).encode(cfg.dtype)
        }))
    }
}

/// Where an attention layer writes its chunk's K and V.
struct KvTarget<'t, 's, 'b> {
    block: &'t DeviceTensor<'s, 'b>,
    /// Tokens the block holds (its K half, then its V half).
    capacity: usize,
    /// The chunk's first token within the block.
    start: usize,
}

fn body<'s, 'b>(
    s: &'s Session<'b>,
    plan: &PrefillPlan,
    ballast: usize,
    progress: &mut dyn FnMut(&ChunkReport),
    out: &mut PrefillOutcome,
    at: &mut Position,
) -> Result<()> {
    // Every persistent tensor, in allocation order; freed newest first at the end.
    let mut persistent: Vec<DeviceTensor<'s, 'b>> = Vec::new();
    let layers = plan.layers.len();
    if ballast > 0 {
        let _r = s.range("capacity");
        persistent.push(s.empty(TensorSpec::new(BALLAST, DType::U8, &[ballast]))?);
        out.persistent.ballast += ballast;
    }
    {
        let _r = s.range("weights");
        for spec in &plan.weights {
            persistent.push(s.empty(spec.clone())?);
            out.persistent.weights += spec.bytes();
        }
    }
    // Zeroed: a sequence's first chunk starts from no state (vLLM zeroes the
    // gathered state of sequences without one: `initial_state[~has_initial_state] = 0`).
    let mut ssm: Vec<Option<usize>> = vec![None; layers];
    {
        let _r = s.range("gdn_state");
        for st in &plan.states {
            persistent.push(s.zeros(st.conv.clone())?);
            persistent.push(s.zeros(st.ssm.clone())?);
            ssm[st.layer] = Some(persistent.len() - 1);
            out.persistent.gdn_state += st.conv.bytes() + st.ssm.bytes();
        }
    }
    // Each attention layer's KV block: one for the run when preallocated, the
    // current chunk's when the cache grows.
    let mut kv_block: Vec<Option<usize>> = vec![None; layers];
    if let KvCacheMode::Preallocate { tokens } = plan.options.kv_cache {
        let _r = s.range("kv_cache");
        for (l, kind) in plan.layers.iter().enumerate() {
            if *kind == LayerKind::FullAttention {
                at.layer = Some(l);
                let spec = plan.kv_block(l, None, tokens);
                let bytes = spec.bytes();
                // Counted once allocated, as the grow path does: a block that fails to
                // allocate is not held.
                persistent.push(s.empty(spec)?);
                out.persistent.kv_cache += bytes;
                kv_block[l] = Some(persistent.len() - 1);
            }
        }
        at.layer = None;
    }

    let mut hosts = HostInputs {
        seed: plan.options.seed,
        gdn: HashMap::new(),
        fa: HashMap::new(),
    };
    s.take_window_peak();
    for span in plan.chunks() {
        let started = Instant::now();
        at.chunk = Some(span);
        if plan.options.kv_cache == KvCacheMode::Grow {
            let _r = s.range("kv_cache");
            for (l, kind) in plan.layers.iter().enumerate() {
                if *kind == LayerKind::FullAttention {
                    at.layer = Some(l);
                    let spec = plan.kv_block(l, Some(span.index), span.tokens);
                    let bytes = spec.bytes();
                    persistent.push(s.empty(spec)?);
                    out.persistent.kv_cache += bytes;
                    kv_block[l] = Some(persistent.len() - 1);
                }
            }
            at.layer = None;
        }
        {
            let _c = s.range(&format!("chunk.{}", span.index));
            for (l, kind) in plan.layers.iter().enumerate() {
                at.layer = Some(l);
                let _l = s.range(&format!("layer.{l}"));
                match kind {
                    LayerKind::LinearAttention => {
                        let state = &persistent[ssm[l].expect("every GDN layer has a state")];
                        let host = hosts.gdn(s, plan, span.tokens);
                        gdn_layer(s, plan, span.tokens, state, host)?;
                    }
                    LayerKind::FullAttention => {
                        let block =
                            &persistent[kv_block[l].expect("every attention layer has a KV block")];
                        let target = match plan.options.kv_cache {
                            KvCacheMode::Grow => KvTarget {
                                block,
                                capacity: span.tokens,
                                start: 0,
                            },
                            KvCacheMode::Preallocate { tokens } => KvTarget {
                                block,
                                capacity: tokens,
                                start: span.start,
                            },
                        };
                        let host = hosts.fa(s, plan, span.tokens);
                        attention_layer(s, plan, span.tokens, &target, host)?;
                    }
                }
                mlp(s, plan, span.tokens)?;
            }
            at.layer = None;
        }
        let report = ChunkReport {
            span,
            tokens_done: span.start + span.tokens,
            kv_cache_bytes: out.persistent.kv_cache,
            live_bytes: s.live_bytes(),
            peak_bytes: s.take_window_peak(),
            seconds: started.elapsed().as_secs_f64(),
        };
        progress(&report);
        out.chunks.push(report);
    }
    at.chunk = None;
    // With --check-style capture (the emulator tests): the carried recurrent
    // states and the KV cache as written.
    if s.is_capturing() {
        for t in &persistent {
            let name = &t.spec().name;
            if name.ends_with(".ssm_state") || name.contains(".kv") {
                s.capture(t)?;
            }
        }
    }
    while let Some(t) = persistent.pop() {
        drop(t);
    }
    Ok(())
}

/// One GDN layer on one chunk, as vLLM's `GatedDeltaNet._forward_core` drives
/// fla's `chunk_gated_delta_rule` for a prefill: the layer's recurrent state is
/// gathered into a fresh `initial_state` (`ssm_state[state_indices].contiguous()`,
/// allocated with the inputs), the call returns `o` and an fp32 `final_state`,
/// and `ssm_state[state_indices] = final_state.to(ssm_state.dtype)` scatters it
/// back: a copy with no temporary, the state being fp32 already. The copies
/// are `cuMemcpyDtoD_v2` (checked for bounds by the stand-in in `--simulate`).
fn gdn_layer(
    s: &Session<'_>,
    plan: &PrefillPlan,
    tokens: usize,
    state: &DeviceTensor<'_, '_>,
    host: Option<&GdnInputBytes>,
) -> Result<()> {
    let _r = s.range("gdn");
    let cfg = plan.gdn_config(tokens);
    let inputs = gdn::allocate_inputs_encoded(s, &cfg, host)?;
    let initial = inputs
        .initial_state
        .as_ref()
        .expect("prefill passes an initial state");
    s.copy(initial, 0, state, 0, state.bytes())?;
    let out = gdn::forward(s, &cfg, &inputs)?;
    s.copy(state, 0, &out.final_state, 0, state.bytes())?;
    // final_state goes as soon as it is scattered back, before o.
    let GdnOutputs {
        o,
        final_state,
        chunk_indices,
        chunk_offsets,
    } = out;
    drop(final_state);
    drop(o);
    drop(chunk_offsets);
    drop(chunk_indices);
    inputs.free();
    Ok(())
}

/// One attention layer on one chunk: the chunk's K and V go into its KV block
/// (vLLM's `reshape_and_cache_flash`, here a `cuMemcpyDtoD_v2` of each half;
/// skipped with an fp8 cache, which needs a quantising kernel this workload
/// does not have), then FlashAttention runs the chunk's queries over the
/// chunk's own keys. Its outputs are sized by the chunk, not by the context.
fn attention_layer(
    s: &Session<'_>,
    plan: &PrefillPlan,
    tokens: usize,
    kv: &KvTarget<'_, '_, '_>,
    host: Option<&FaInputBytes>,
) -> Result<()> {
    let _r = s.range("attention");
    let cfg = plan.fa_config(tokens);
    let inputs = fa::allocate_inputs_encoded(s, &cfg, host)?;
    if plan.options.kv_dtype == plan.dtype {
        let row = cfg.kv_heads * cfg.head_dim * plan.options.kv_dtype.size();
        let half = kv.capacity * row;
        s.copy(kv.block, kv.start * row, &inputs.k, 0, tokens * row)?;
        s.copy(kv.block, half + kv.start * row, &inputs.v, 0, tokens * row)?;
    }
    fa::forward(s, &cfg, &inputs)?.free();
    inputs.free();
    Ok(())
}

/// The MLP stand-in: what vLLM 0.20.1's dense MLP allocates for the chunk, in
/// its eager order (`gate_up`, the activation, `down`; the activation dies as
/// `down` rebinds it, `gate_up` when the method returns, `down` with the
/// layer). Allocation only: no GEMM is launched, so the real run computes
/// nothing here.
fn mlp(s: &Session<'_>, plan: &PrefillPlan, tokens: usize) -> Result<()> {
    let _r = s.range("mlp");
    let [gate_up, act, down] = plan.mlp_specs(tokens);
    let gate_up = s.empty(gate_up)?;
    let act = s.empty(act)?;
    let down = s.empty(down)?;
    drop(act);
    drop(gate_up);
    drop(down);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Recorded, RecordingBackend};
    use crate::tensor::LedgerEvent;

    fn qwen36() -> ModelConfig {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../samples/models/Qwen3.6-27B/config.json"
        );
        ModelConfig::from_path(path).unwrap()
    }

    /// Two GDN layers then one attention layer, twice; small enough to read.
    fn tiny() -> ModelConfig {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tiny/config.json");
        ModelConfig::from_path(path).unwrap()
    }

    fn options(prompt: usize, chunk: usize) -> PrefillOptions {
        PrefillOptions {
            prompt_tokens: prompt,
            chunk,
            weights: WeightFormat::Bf16,
            kv_cache: KvCacheMode::Grow,
            kv_dtype: DType::BF16,
            seed: 0,
        }
    }

    #[test]
    fn qwen36_plan_matches_the_models() {
        let cfg = qwen36();
        let mut o = options(262_144, DEFAULT_CHUNK);
        o.weights = WeightFormat::Int4 { group: 128 };
        let p = PrefillPlan::new(&cfg, o).unwrap();
        assert_eq!(p.weights.len(), 64 + 3);
        assert_eq!(
            p.weight_bytes() as u64,
            model::weight_bytes(&cfg, WeightFormat::Int4 { group: 128 }, 1)
                .unwrap()
                .bytes
        );
        assert_eq!(
            p.state_bytes() as u64,
            model::gdn_state_per_seq(&cfg, 1, model::DType::BF16, model::DType::F32, 0)
                .unwrap()
                .bytes_per_seq
        );
        // 4 KV heads x 256 x K and V x bf16.
        assert_eq!(p.kv_bytes_per_token, 4096);
        assert_eq!(p.attention_layers(), 16);
        let chunks = p.chunks();
        assert_eq!(chunks.len(), 64);
        assert_eq!(chunks[63].start, 63 * 4128);
        assert_eq!(chunks[63].tokens, 262_144 - 63 * 4128);
        let [gate_up, act, down] = p.mlp_specs(4128);
        // vramtrace_models::ffn's numbers for a 4128-token chunk.
        assert_eq!(
            [gate_up.bytes(), act.bytes(), down.bytes()],
            [287_440_896, 143_720_448, 42_270_720]
        );
    }

    #[test]
    fn one_chunk_layer_by_layer() {
        let cfg = tiny();
        let p = PrefillPlan::new(&cfg, options(40, 32)).unwrap();
        let rec = RecordingBackend::new();
        let s = Session::new(&rec, false);
        let out = run(&s, &p, 0, &mut |_| {}).unwrap();
        assert!(out.failure.is_none());
        assert_eq!(out.chunks.len(), 2);
        assert_eq!(rec.live_bytes(), 0);
        // Chunk 1's attention layer 1 writes K then V behind chunk 1's KV block.
        let ledger = s.ledger();
        let block = ledger
            .iter()
            .find_map(|e| match e {
                LedgerEvent::Alloc { spec, ptr, .. } if spec.name == "layer.1.kv.chunk.1" => {
                    Some(*ptr)
                }
                _ => None,
            })
            .unwrap();
        let copies: Vec<(u64, usize)> = rec
            .log()
            .iter()
            .filter_map(|r| match r {
                // The block is [2, 8, 2, 32] bf16: 2048 bytes.
                Recorded::Copy { dst, bytes, .. } if *dst >= block && *dst < block + 2048 => {
                    Some((*dst - block, *bytes))
                }
                _ => None,
            })
            .collect();
        // 8 tokens x 2 KV heads x 32 x bf16 = 1024 bytes per half.
        assert_eq!(copies, vec![(0, 1024), (1024, 1024)]);
    }

    #[test]
    fn out_of_memory_is_an_outcome_not_an_error() {
        let cfg = tiny();
        let p = PrefillPlan::new(&cfg, options(40, 32)).unwrap();
        let persistent = p.weight_bytes() + p.state_bytes();
        // Room for the persistent tensors and chunk 0's KV blocks, and a little more.
        let rec = RecordingBackend::with_capacity(persistent + 2 * 32 * 256 + 1000);
        let s = Session::new(&rec, false);
        let out = run(&s, &p, 0, &mut |_| {}).unwrap();
        let f = out.failure.expect("it does not fit");
        assert_eq!(f.chunk.map(|c| c.index), Some(0));
        assert_eq!(f.layer, Some(0));
        assert_eq!(f.layer_kind, Some(LayerKind::LinearAttention));
        assert!(
            f.label.starts_with("prefill/chunk.0/layer.0/gdn/"),
            "{}",
            f.label
        );
        assert_eq!(f.label, format!("prefill/chunk.0/layer.0/{}", f.stage));
        assert_eq!(f.tokens_prefilled, 0);
        assert_eq!(f.held.weights, p.weight_bytes());
        assert_eq!(f.held.kv_cache, 2 * 32 * 256);
        let capacity = persistent + 2 * 32 * 256 + 1000;
        assert_eq!(f.device_free, Some(capacity - f.held.total()));
        assert!(f.held.total() + f.bytes > capacity);
        assert_eq!(f.stage, "gdn/inputs");
        assert_eq!(f.name, "q");
        assert_eq!(rec.live_bytes(), 0, "everything is freed");
    }

    #[test]
    fn capacity_is_enforced_by_a_ballast_on_a_real_card_only() {
        let gib = 1usize << 30;
        let real = plan_capacity(Some(24 * gib), true, Some((139 * gib, 140 * gib))).unwrap();
        assert_eq!(real.ballast, 115 * gib);
        let sim = plan_capacity(Some(24 * gib), false, Some((24 * gib, 24 * gib))).unwrap();
        assert_eq!((sim.ballast, sim.note), (0, None));
        let other = plan_capacity(Some(16 * gib), false, Some((24 * gib, 24 * gib))).unwrap();
        assert!(other.note.unwrap().contains("VRAMTRACE_FAKE_CAPACITY="));
        let e = plan_capacity(Some(200 * gib), true, Some((139 * gib, 140 * gib))).unwrap_err();
        assert!(e.to_string().contains("larger than the card"), "{e}");
        let tight = plan_capacity(Some(24 * gib), true, Some((20 * gib, 140 * gib))).unwrap();
        assert_eq!(tight.ballast, 0);
        assert!(tight.note.is_some());
    }

    #[test]
    fn refuses_what_cannot_run() {
        let cfg = tiny();
        let mut o = options(40, 32);
        o.kv_cache = KvCacheMode::Preallocate { tokens: 39 };
        assert!(
            PrefillPlan::new(&cfg, o)
                .unwrap_err()
                .to_string()
                .contains("--kv-tokens 39")
        );
        // A one-token last chunk with grouped heads is FlashAttention's decode path.
        let e = PrefillPlan::new(&cfg, options(33, 32)).unwrap_err();
        assert!(e.to_string().contains("a chunk of 1 tokens"), "{e}");
        assert!(PrefillPlan::new(&cfg, options(0, 32)).is_err());
    }
}
