//! transformers 5.17, `model.generate(input_ids, prefill_chunk_size=C)` with a `DynamicCache`, on
//! PyTorch's caching allocator under `torch.cuda.set_per_process_memory_fraction` (or a card):
//! every tensor of every chunk's forward in the engine's own order, replayed through
//! [`CachingAllocator`], until a request is refused. The allocator's reserve is not a constant
//! here: it is what the replay leaves cached and split between the steps.
//!
//! Read from the transformers 5.17.0 wheel (paths under `transformers/`):
//! - `generation/utils.py:4111-4150` `_prefill`: `torch.split(input_ids, C)`, one forward per
//!   chunk, the 2-D mask and `position_ids` sliced (views), the previous chunk's `outputs` held
//!   until the next forward returns. Before the loop, `[1, N]` int64 `attention_mask`
//!   (`:918`) and `position_ids` (`:892`) for the whole prompt; per chunk `input_ids.clone()`
//!   (`:682`) and `logits_to_keep=1` (`:2749-2750`).
//! - `models/qwen3_5/modeling_qwen3_5.py:1283-1286` one causal mask per forward, shared by the
//!   full-attention layers; `masking_utils.py:236-279` `_ignore_causal_mask_sdpa` skips it for
//!   the first chunk (no past, `q_length == kv_length`); from the second chunk on
//!   `masking_utils.py:517` materialises a bool `[1, 1, C, L]` (built as two, `and_masks`).
//! - `integrations/sdpa_attention.py:97-102`: with a mask, `use_gqa_in_sdpa` is false, so K and
//!   V are repeated to the query heads (`repeat_kv`, `[1, H, L, D]` each); without one,
//!   `enable_gqa=True`. `:158` calls SDPA, which turns a bool mask into an additive one in the
//!   query dtype (PyTorch `aten/src/ATen/native/transformers/attention.cpp`
//!   `convert_boolean_attn_mask`: `at::where`, `[1, 1, C, L]`, 2 bytes a position in bf16).
//! - `cache_utils.py:146/147` `DynamicLayer.update`: `torch.cat` of K, then of V, the old
//!   `[1, G, L - C, D]` freed as the name is rebound; `cache_utils.py:1017-1105`
//!   `LinearAttentionLayer`: conv state `[1, conv_dim, Kc]`, fp32 recurrent state
//!   `[1, Hv, Dk, Dv]` (`zeros_like` fla's final state, then `copy_`), and from the second chunk
//!   `update_conv_state`'s `torch.cat` `[1, conv_dim, Kc + C]` (`:1078`).
//! - `models/qwen3_5/modeling_qwen3_5.py`: `Qwen3_5Attention.forward` (`:749-821`: q with its
//!   gate, the gate's `reshape` copy, q/k RMSNorm in fp32, partial rotary with `cat`, the cache
//!   update, SDPA, `* sigmoid(gate)`, `o_proj`); `Qwen3_5GatedDeltaNet.forward` (`:560-663`:
//!   the projections, the torch `causal_conv1d_fn` (`:270-289`: `F.conv1d` with `Kc - 1` of
//!   padding, then SiLU), `beta`, fp32 `g`, q and k `repeat_interleave`d to the value heads at
//!   `:621/622`, fla's `chunk_gated_delta_rule` (modelled by [`crate::gdn_fla_0_6_0`]), the
//!   gated RMSNorm in fp32, `out_proj`); `Qwen3_5MLP` (`:824-837`); `Qwen3_5RMSNorm`
//!   (`:841-855`: `x.float()`, its normalisation and weight in fp32, cast back);
//!   `Qwen3_5ForCausalLM.forward` (`:1729-1730`: `lm_head` on the last `logits_to_keep`
//!   positions, bf16).
//!
//! Not modelled (each below a few MiB at the shapes this planner is used for, or unknown from
//! the config): the CUDA context and cuBLAS/cuDNN workspaces outside the caching allocator
//! (outside a per-process fraction; given for a card), the small pool's packing of tensors
//! under 1 MiB (each small tensor is counted at its block), SDPA's `logsumexp` and kernel
//! scratch, Triton's autotuning buffers, and the weights' own loading order (one block of the
//! weights' bytes, as `caching_allocator_warmup` reserves them).

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use super::{Basis, Engine, Part, PlannedFailure, PlannedRun, PlannedStep};
use crate::caching_allocator::{BlockId, CachingAllocator};
use crate::{
    Category, DType, Event, GdnShape, LayerKind, Limit, ModelConfig, ModelError, WeightFormat,
    events, gdn_fla_0_6_0, weight_bytes,
};

const NAME: &str = "transformers 5.17 generate(prefill_chunk_size) with a DynamicCache";

const GEN_BUFFERS: &str =
    "transformers 5.17 generation/utils.py:892/918 attention_mask, position_ids [1, N] int64";
const GEN_INPUT: &str = "transformers 5.17 generation/utils.py:682 input_ids.clone()";
const EMBED: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:1254 inputs_embeds = self.embed_tokens(input_ids)";
const MASK_BOOL: &str = "transformers 5.17 masking_utils.py:825 attention_mask.to(bool) [1, L]";
const MASK_ARANGE: &str =
    "transformers 5.17 masking_utils.py:510/511 q_arange, kv_arange = arange(n) + offset (int64)";
const MASK_CAUSAL: &str = "transformers 5.17 masking_utils.py:81 causal_mask_function: kv_idx <= q_idx, bool [1, 1, C, L]";
const MASK: &str =
    "transformers 5.17 masking_utils.py:57 and_mask: result & mask(...), bool [1, 1, C, L]";
const MASK_PADDING: &str = "transformers 5.17 masking_utils.py:178 inner_mask: padding_mask[batch_idx, kv_idx] (the int64 index broadcast, then bool [1, 1, 1, L])";
const ROTARY: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:186-202 rotary cos, sin";
const MROPE: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:192-198 position_ids.float(), freqs [3, 1, C, rot/2] fp32, cos()/sin() * attention_scaling";
const MROPE_CAT: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:213 recomposition_frequencies: torch.cat((freqs_thw, freqs_thw), -1) fp32";
const MROPE_CAST: &str =
    "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:202 cos.to(x.dtype), sin.to(x.dtype)";
const NORM: &str =
    "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:841-855 Qwen3_5RMSNorm (fp32 inside)";
const RESIDUAL: &str =
    "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py Qwen3_5DecoderLayer: residual + x";
const Q_PROJ: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:787-790 q_proj (query and gate), gate.reshape";
const KV_PROJ: &str =
    "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py Qwen3_5Attention: k_proj, v_proj";
const ROPE: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:703/704 (q_rot * cos) + (rotate_half(q_rot) * sin)";
const ROTATE_HALF: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:670 rotate_half: torch.cat((-x2, x1), -1)";
const ROPE_CAT: &str =
    "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:707/708 torch.cat([q_embed, q_pass], -1)";
const CACHE_CAT: &str = "transformers 5.17 cache_utils.py:146/147 DynamicLayer.update torch.cat";
const REPEAT_KV: &str = "transformers 5.17 integrations/sdpa_attention.py:22 repeat_kv";
const SDPA: &str =
    "transformers 5.17 integrations/sdpa_attention.py:158 scaled_dot_product_attention";
const SDPA_CONTIGUOUS: &str =
    "transformers 5.17 integrations/sdpa_attention.py:168 attn_output.transpose(1, 2).contiguous()";
const EAGER_MASK: &str = "transformers 5.17 masking_utils.py:594/604 eager_mask: never skipped, torch.where(mask, 0, min) [1, 1, C, L] in the model dtype";
const EAGER_REPEAT_KV: &str =
    "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:734/735 repeat_kv";
const EAGER_SCORES: &str =
    "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:737 matmul(q, k^T) * scaling";
const EAGER_MASKED: &str =
    "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:739 attn_weights + attention_mask";
const EAGER_SOFTMAX: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:741 softmax(dtype=float32).to(query.dtype)";
const SOFTMAX_CONVERT: &str = "PyTorch aten/src/ATen/native/SoftMax.cpp softmax(input, dim, dtype): input.toType(dtype) unless a CUDA fp16 input";
const EAGER_OUT: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:743/744 matmul(attn_weights, v).transpose(1, 2).contiguous()";
const SDPA_MASK: &str = "transformers 5.17 integrations/sdpa_attention.py:158 (aten convert_boolean_attn_mask: the mask in the query dtype)";
const GATE_OUT: &str =
    "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:818 attn_output * torch.sigmoid(gate)";
const O_PROJ: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py o_proj / out_proj";
const GDN_PROJ: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:565-572 in_proj_qkv, in_proj_z, in_proj_b, in_proj_a";
const CONV_CAT: &str =
    "transformers 5.17 cache_utils.py:1078 update_conv_state torch.cat([conv_state, x])";
const CONV: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:278-288 causal_conv1d_fn (F.conv1d, silu)";
const GATES: &str =
    "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:617/619 beta = b.sigmoid(), g (fp32)";
const REPEAT_QK: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:621/622 repeat_interleave to the value heads";
const FLA_COPY: &str = "fla 0.6.0 fla/utils/decorators.py:93 contiguous copy of a strided input";
const STATE: &str =
    "transformers 5.17 cache_utils.py:1033/1045 LinearAttentionLayer conv and recurrent states";
const GATED_NORM: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:218-234 Qwen3_5RMSNormGated (fp32 inside)";
const MLP: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:824-837 down_proj(act_fn(gate_proj(x)) * up_proj(x))";
const LOGITS: &str = "transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:1729-1730 lm_head(hidden_states[:, -1:, :])";
const WEIGHTS: &str = "transformers 5.17 modeling_utils.py caching_allocator_warmup: the weights";
const CALIBRATED: &str = "calibrated: bytes a forward of the traced run held beyond the planner's";

/// Terms fitted to a trace of the same program (`vramtrace model --calibrate TRACE`), added to
/// what the planner predicts: bytes held through each forward, per token of the chunk and per
/// chunk token × context token, and reserve the allocator could not use beyond the replay's,
/// held back from the limit. Never fitted to a run it is then checked against.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Calibration {
    /// Bytes per token of the chunk, held through a forward (0 when the fit was negative).
    pub per_chunk_token: f64,
    /// Bytes per chunk token × context token, held through a forward (0 when negative).
    pub per_chunk_context_token: f64,
    /// Bytes of reserve beyond the replay's, taken off the limit.
    pub reserve_held_back: u64,
    /// The trace the terms were fitted to, and how many forwards of it.
    pub from: String,
    /// Forwards of the trace the fit used.
    pub forwards: usize,
}

impl Calibration {
    /// The bytes held through a forward of `c` tokens ending at context `l`.
    fn held(&self, c: u64, l: u64) -> u64 {
        let b = self.per_chunk_token * c as f64
            + self.per_chunk_context_token * (c as f64) * (l as f64);
        if b.is_finite() && b > 0.0 {
            b as u64
        } else {
            0
        }
    }
}

/// The caching allocator's state at the start of one forward of a traced run (default mode, read
/// from the trace): its segments and the blocks handed out in them. A step planned from it
/// ([`GenerateChunked::plan_from`]) meets the holes the run had left there, which no config
/// gives (the driver placed each segment; docs/validation.md, "Why the default allocator's runs
/// spread"), while every tensor the step allocates stays the planner's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocatorSeed {
    /// The forward it was read at the start of, counting from 0.
    pub index: u64,
    /// The segments PyTorch held from the driver: base, bytes.
    pub segments: Vec<(u64, u64)>,
    /// The blocks handed out at that moment, in the order they were allocated: base, bytes.
    pub blocks: Vec<(u64, u64)>,
}

/// The attention the model was loaded with (`attn_implementation`): what the mask and the
/// attention function materialise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// `sdpa`, transformers' default with PyTorch's `scaled_dot_product_attention`: no mask for
    /// a first chunk without past (SDPA is causal), from the second chunk a bool `[1, 1, C, L]`
    /// that SDPA copies into the query dtype, and K/V repeated to the query heads.
    #[default]
    Sdpa,
    /// `eager`: a mask in the model dtype for every chunk (`eager_mask` never skips it), K/V
    /// repeated, and the scores `[1, H, C, L]` materialised in the model dtype and in fp32
    /// (`eager_attention_forward`).
    Eager,
}

impl Attention {
    /// transformers' name for it (`attn_implementation`).
    pub fn name(self) -> &'static str {
        match self {
            Attention::Sdpa => "sdpa",
            Attention::Eager => "eager",
        }
    }
}

impl std::str::FromStr for Attention {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, ModelError> {
        match s {
            "sdpa" => Ok(Attention::Sdpa),
            "eager" => Ok(Attention::Eager),
            other => Err(ModelError::Invalid(format!(
                "attn_implementation `{other}` is not modelled; the planner knows `sdpa` (transformers' default) and `eager`"
            ))),
        }
    }
}

/// The planner for `generate(prefill_chunk_size=C)` of one sequence.
#[derive(Clone, Debug)]
pub struct GenerateChunked {
    /// The model.
    pub config: ModelConfig,
    /// `prefill_chunk_size`.
    pub chunk_tokens: u64,
    /// The attention it was loaded with.
    pub attention: Attention,
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
    pub expandable_segments: bool,
    /// Terms fitted to another run of the same program, if any.
    pub calibration: Option<Calibration>,
}

impl GenerateChunked {
    /// A planner for `config` prefilled in chunks of `chunk_tokens`.
    pub fn new(config: ModelConfig, chunk_tokens: u64) -> Result<Self, ModelError> {
        if chunk_tokens == 0 {
            return Err(ModelError::Invalid(
                "prefill_chunk_size must be at least 1 token".into(),
            ));
        }
        if config.moe.is_some() {
            return Err(ModelError::Invalid(
                "the transformers planner models dense MLPs; this config's experts are not modelled yet".into(),
            ));
        }
        Ok(GenerateChunked {
            config,
            chunk_tokens,
            attention: Attention::Sdpa,
            expandable_segments: false,
            calibration: None,
        })
    }
}

/// Where a planned run stands when its limit is met or its prompt is held.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContextFrontier {
    /// The chunk (`prefill_chunk_size`).
    pub chunk_tokens: u64,
    /// The largest context, the chunk included, at the end of a step that completed: the
    /// frontier at this chunk. `None` when not even the first chunk completes.
    pub context_at_chunk: Option<u64>,
    /// The context at the end of the step that failed (`None` when none failed).
    pub failing_context: Option<u64>,
    /// Whether the run held the whole prompt without failing (the frontier is then at least
    /// the prompt, which is capped by the model's `max_position_embeddings`).
    pub capped: bool,
    /// Where the figures come from.
    pub basis: Basis,
}

impl ContextFrontier {
    /// The frontier of a planned run.
    pub fn of(run: &PlannedRun, chunk_tokens: u64, basis: Basis) -> Self {
        ContextFrontier {
            chunk_tokens,
            context_at_chunk: run.steps.last().map(|s| s.context_tokens),
            failing_context: run.failure.as_ref().map(|f| f.context_tokens),
            capped: run.failure.is_none(),
            basis,
        }
    }
}

/// The allocator as the run meets it: every live block with its category, the per-step peaks.
struct Sim {
    alloc: CachingAllocator,
    live: Vec<Option<(BlockId, u64, Category)>>,
    by_category: [u64; Category::ALL.len()],
    step_peak_allocated: u64,
    step_peak_reserved: u64,
    /// Bytes by category and the reserve at `step_peak_allocated`: copied on the allocation
    /// path, made into parts once the step ends ([`Sim::parts_of`]).
    step_peak: Snapshot,
    /// The basis of the parts it reports.
    basis: Basis,
}

/// Bytes by category ([`Category::ALL`] order) and the allocator's reserve at one moment.
type Snapshot = ([u64; Category::ALL.len()], u64);

/// A handle to a live tensor of the simulation.
#[derive(Clone, Copy, Debug)]
struct H(usize);

/// A refused request, before the step it belongs to is known.
struct Refused {
    tensor: String,
    source: &'static str,
    request: u64,
    segment: u64,
    reserved: u64,
    allocated: u64,
    parts: Vec<Part>,
}

impl Sim {
    fn new(capacity: Option<u64>, expandable: bool) -> Self {
        let alloc = CachingAllocator::new(capacity);
        Sim {
            alloc: if expandable {
                alloc.expandable()
            } else {
                alloc
            },
            live: Vec::new(),
            by_category: [0; Category::ALL.len()],
            step_peak_allocated: 0,
            step_peak_reserved: 0,
            step_peak: ([0; Category::ALL.len()], 0),
            basis: Basis::Predicted,
        }
    }

    /// Bytes by category and the reserve now.
    fn snapshot(&self) -> Snapshot {
        (
            self.by_category,
            self.alloc.reserved() - self.alloc.allocated(),
        )
    }

    /// The parts of a snapshot, those with bytes, the reserve last.
    fn parts_of(&self, (by_category, reserve): Snapshot) -> Vec<Part> {
        let mut parts: Vec<Part> = Category::ALL
            .iter()
            .zip(by_category)
            .filter(|(_, b)| *b > 0)
            .map(|(&category, bytes)| Part {
                category,
                bytes,
                basis: self.basis,
            })
            .collect();
        if reserve > 0 {
            parts.push(Part {
                category: Category::AllocatorReserve,
                bytes: reserve,
                basis: self.basis,
            });
        }
        parts
    }

    fn parts(&self) -> Vec<Part> {
        self.parts_of(self.snapshot())
    }

    /// A tensor's bytes, capped at [`crate::MAX_BYTES`]: a request past it is refused by any
    /// limit, and the allocator's rounding of it stays within 64 bits.
    fn bytes(shape: &[u64], dtype: DType) -> u64 {
        shape
            .iter()
            .fold(dtype.size_bytes(), |b, &d| b.saturating_mul(d))
            .min(crate::MAX_BYTES)
    }

    fn alloc(
        &mut self,
        name: &str,
        shape: &[u64],
        dtype: DType,
        source: &'static str,
        category: Category,
    ) -> Result<H, Box<Refused>> {
        let bytes = Self::bytes(shape, dtype);
        self.alloc_bytes(name, bytes, source, category)
    }

    fn alloc_bytes(
        &mut self,
        name: &str,
        bytes: u64,
        source: &'static str,
        category: Category,
    ) -> Result<H, Box<Refused>> {
        match self.alloc.malloc(bytes.max(1)) {
            Ok(id) => {
                let block = self.alloc.block_size(id);
                self.by_category[category.index()] += block;
                self.live.push(Some((id, block, category)));
                if self.alloc.allocated() > self.step_peak_allocated {
                    self.step_peak_allocated = self.alloc.allocated();
                    self.step_peak = self.snapshot();
                }
                self.step_peak_reserved = self.step_peak_reserved.max(self.alloc.reserved());
                Ok(H(self.live.len() - 1))
            }
            Err(oom) => Err(Box::new(Refused {
                tensor: name.to_string(),
                source,
                request: bytes,
                segment: oom.segment,
                reserved: oom.reserved,
                allocated: oom.allocated,
                parts: self.parts(),
            })),
        }
    }

    fn free(&mut self, h: H) {
        if let Some((id, block, category)) = self.live[h.0].take() {
            self.alloc.free(id);
            self.by_category[category.index()] -= block;
        }
    }

    fn free_all(&mut self, hs: impl IntoIterator<Item = H>) {
        for h in hs {
            self.free(h);
        }
    }

    /// `Qwen3_5RMSNorm` over `[rows, width]`: `x.float()`, the squares (reduced, then freed),
    /// the normalised fp32 copy, times the weight in fp32, cast back.
    fn rms_norm(&mut self, rows: u64, width: u64, dt: DType) -> Result<H, Box<Refused>> {
        let x = self.alloc(
            "x.float()",
            &[rows, width],
            DType::F32,
            NORM,
            Category::Activations,
        )?;
        let sq = self.alloc(
            "x.pow(2)",
            &[rows, width],
            DType::F32,
            NORM,
            Category::Activations,
        )?;
        self.free(sq);
        let n = self.alloc(
            "x * rsqrt",
            &[rows, width],
            DType::F32,
            NORM,
            Category::Activations,
        )?;
        self.free(x);
        let w = self.alloc(
            "* (1 + weight)",
            &[rows, width],
            DType::F32,
            NORM,
            Category::Activations,
        )?;
        self.free(n);
        let out = self.alloc("normed", &[rows, width], dt, NORM, Category::Activations)?;
        self.free(w);
        Ok(out)
    }

    /// Replaces the allocator with the traced state `seed` under `capacity`: each live tensor of
    /// the planner takes the oldest traced block of its bytes not yet taken (the weights, the
    /// caches, the states and the inputs the trace holds too); one with no such block leaves the
    /// books (the traced blocks hold its bytes, or the trace had none), and the traced blocks no
    /// tensor took stay handed out to the end.
    fn reseed(&mut self, seed: &AllocatorSeed, capacity: u64) {
        let (alloc, ids) =
            CachingAllocator::from_state(Some(capacity), &seed.segments, &seed.blocks);
        let mut by_size: HashMap<u64, VecDeque<BlockId>> = HashMap::new();
        for (&(_, bytes), id) in seed.blocks.iter().zip(ids) {
            if let Some(id) = id {
                by_size.entry(bytes).or_default().push_back(id);
            }
        }
        for slot in &mut self.live {
            let Some((id, block, category)) = slot else {
                continue;
            };
            match by_size.get_mut(block).and_then(VecDeque::pop_front) {
                Some(traced) => *id = traced,
                None => {
                    self.by_category[category.index()] -= *block;
                    *slot = None;
                }
            }
        }
        self.alloc = alloc;
        self.begin_step();
    }

    fn begin_step(&mut self) {
        self.step_peak_allocated = self.alloc.allocated();
        self.step_peak_reserved = self.alloc.reserved();
        self.step_peak = self.snapshot();
    }
}

/// The attention cache of one full-attention layer, or the state of one GDN layer.
enum LayerCache {
    Attention {
        k: Option<H>,
        v: Option<H>,
    },
    Gdn {
        conv: Option<H>,
        recurrent: Option<H>,
    },
}

impl GenerateChunked {
    fn rotary_dim(&self) -> u64 {
        // Qwen3.5's config defaults `partial_rotary_factor` to 0.25
        // (models/qwen3_5/configuration_qwen3_5.py); other models rotate the whole head.
        match self.config.model_type.as_deref() {
            Some(t) if t.starts_with("qwen3_5") || t.starts_with("qwen3_next") => {
                self.config.head_dim / 4
            }
            _ => self.config.head_dim,
        }
    }

    /// The mask `create_causal_mask` builds for a chunk of `c` on a context of `l`
    /// (`masking_utils.py` `sdpa_mask`, the non-vmap path, with the padding mask `generate`
    /// passes): the int64 aranges, then `and_masks(causal, padding)` — the causal comparison,
    /// its `&` with the all-true start, the padding index and its `&`, each `&` a new
    /// `[1, 1, C, L]` bool freeing the one before — and the aranges freed at the end.
    fn causal_mask(&self, sim: &mut Sim, c: u64, l: u64) -> Result<H, Box<Refused>> {
        let act = Category::Activations;
        let bool_mask = sim.alloc(
            "attention_mask.to(bool)",
            &[1, l],
            DType::Bool,
            MASK_BOOL,
            act,
        )?;
        let q0 = sim.alloc("arange(q_length)", &[c], DType::I64, MASK_ARANGE, act)?;
        let q = sim.alloc("q_arange", &[c], DType::I64, MASK_ARANGE, act)?;
        sim.free(q0);
        let kv0 = sim.alloc("arange(kv_length)", &[l], DType::I64, MASK_ARANGE, act)?;
        let kv = sim.alloc("kv_arange", &[l], DType::I64, MASK_ARANGE, act)?;
        sim.free(kv0);
        let causal = sim.alloc(
            "kv_idx <= q_idx",
            &[1, 1, c, l],
            DType::Bool,
            MASK_CAUSAL,
            act,
        )?;
        let with_causal = sim.alloc("result & causal", &[1, 1, c, l], DType::Bool, MASK, act)?;
        sim.free(causal);
        let index = sim.alloc(
            "padding index",
            &[1, 1, 1, l],
            DType::I64,
            MASK_PADDING,
            act,
        )?;
        let padding = sim.alloc(
            "padding_mask[b, kv_idx]",
            &[1, 1, 1, l],
            DType::Bool,
            MASK_PADDING,
            act,
        )?;
        sim.free(index);
        let mask = sim.alloc("result & padding", &[1, 1, c, l], DType::Bool, MASK, act)?;
        sim.free_all([padding, with_causal, q, kv, bool_mask]);
        Ok(mask)
    }

    /// The rotary embedding's `cos` and `sin` for a chunk of `c`, in the model dtype. Qwen3.5's
    /// multimodal rotary (`Qwen3_5TextRotaryEmbedding.forward`): the fp32 frequencies over its
    /// three position grids, their `cos()` and `sin()` times `attention_scaling` (each a new
    /// tensor, the unscaled one freed), recomposed into `[1, C, rot]` fp32 by a `cat` (freeing
    /// the grids' copy), cast to the model dtype; the fp32 tensors freed on return. Other
    /// models: one grid, `cat((freqs, freqs))`, `cos()`, `sin()` cast.
    fn rotary(&self, sim: &mut Sim, c: u64) -> Result<(H, H), Box<Refused>> {
        let (dt, act) = (self.config.dtype, Category::Activations);
        let rot = self.rotary_dim();
        let mrope =
            matches!(self.config.model_type.as_deref(), Some(t) if t.starts_with("qwen3_5"));
        if !mrope {
            let freqs = sim.alloc("freqs", &[1, c, rot], DType::F32, ROTARY, act)?;
            let cos32 = sim.alloc("emb.cos()", &[1, c, rot], DType::F32, ROTARY, act)?;
            let cos = sim.alloc("cos", &[1, c, rot], dt, ROTARY, act)?;
            sim.free(cos32);
            let sin32 = sim.alloc("emb.sin()", &[1, c, rot], DType::F32, ROTARY, act)?;
            let sin = sim.alloc("sin", &[1, c, rot], dt, ROTARY, act)?;
            sim.free_all([sin32, freqs]);
            return Ok((cos, sin));
        }
        let grid = [3, 1, c, rot / 2];
        let pos = sim.alloc(
            "position_ids.float()",
            &[3, 1, 1, c],
            DType::F32,
            MROPE,
            act,
        )?;
        let freqs = sim.alloc("freqs", &grid, DType::F32, MROPE, act)?;
        let mut scaled = Vec::with_capacity(2);
        for name in ["freqs.cos()", "freqs.sin()"] {
            let raw = sim.alloc(name, &grid, DType::F32, MROPE, act)?;
            scaled.push(sim.alloc("* attention_scaling", &grid, DType::F32, MROPE, act)?);
            sim.free(raw);
        }
        let (cos_g, sin_g) = (scaled[0], scaled[1]);
        let sin32 = sim.alloc("sin (recomposed)", &[1, c, rot], DType::F32, MROPE_CAT, act)?;
        sim.free(sin_g);
        let cos32 = sim.alloc("cos (recomposed)", &[1, c, rot], DType::F32, MROPE_CAT, act)?;
        sim.free(cos_g);
        let cos = sim.alloc("cos", &[1, c, rot], dt, MROPE_CAST, act)?;
        let sin = sim.alloc("sin", &[1, c, rot], dt, MROPE_CAST, act)?;
        sim.free_all([pos, freqs, cos32, sin32]);
        Ok((cos, sin))
    }

    /// One chunk's forward of `c` tokens on top of `past`.
    fn forward(
        &self,
        sim: &mut Sim,
        caches: &mut [LayerCache],
        kernel: &[crate::Tensor],
        c: u64,
        past: u64,
        seed: Option<(&AllocatorSeed, u64)>,
    ) -> Result<H, Box<Refused>> {
        let cfg = &self.config;
        let dt = cfg.dtype;
        let act = Category::Activations;
        let l = past + c;
        let h = cfg.hidden_size;
        let ids = sim.alloc("input_ids (chunk)", &[1, c], DType::I64, GEN_INPUT, act)?;
        // A traced state is read just before the forward's embedding output: its chunk's ids
        // are among its blocks.
        if let Some((seed, capacity)) = seed {
            sim.reseed(seed, capacity);
        }
        let emb = sim.alloc("inputs_embeds", &[1, c, h], dt, EMBED, act)?;
        let held = match self.calibration.as_ref().map(|k| k.held(c, l)) {
            Some(b) if b > 0 => Some(sim.alloc_bytes("calibrated", b, CALIBRATED, act)?),
            _ => None,
        };
        // SDPA's first chunk needs no mask (`_ignore_causal_mask_sdpa`): SDPA is causal. Eager's
        // mask is the bool one turned into the model dtype, for every chunk.
        let mask = if past > 0 || self.attention == Attention::Eager {
            let m = self.causal_mask(sim, c, l)?;
            if self.attention == Attention::Eager {
                let f = sim.alloc(
                    "torch.where(mask, 0, min)",
                    &[1, 1, c, l],
                    dt,
                    EAGER_MASK,
                    act,
                )?;
                sim.free(m);
                Some(f)
            } else {
                Some(m)
            }
        } else {
            None
        };
        let (cos, sin) = self.rotary(sim, c)?;
        // `hidden_states` starts as `inputs_embeds` itself; a later rebinding frees the old one
        // unless it is still the embedding (held by the model's forward throughout).
        let mut hidden: Option<H> = None;
        for (i, kind) in cfg.layer_types.iter().enumerate() {
            let normed = sim.rms_norm(c, h, dt)?;
            let out = match (kind, &mut caches[i]) {
                (LayerKind::FullAttention, LayerCache::Attention { k, v }) => {
                    self.attention(sim, k, v, mask, c, past)?
                }
                (LayerKind::LinearAttention, LayerCache::Gdn { conv, recurrent }) => {
                    self.gdn(sim, kernel, conv, recurrent, c, past)?
                }
                _ => unreachable!("caches follow layer_types"),
            };
            sim.free(normed);
            let mid = sim.alloc("residual + attn", &[1, c, h], dt, RESIDUAL, act)?;
            sim.free(out);
            let normed = sim.rms_norm(c, h, dt)?;
            let out = self.mlp(sim, c)?;
            sim.free(normed);
            let r = sim.alloc("residual + mlp", &[1, c, h], dt, RESIDUAL, act)?;
            sim.free(out);
            // The layer's return frees its `residual` (the sum after attention); the model's
            // loop rebinding `hidden_states` then frees the layer's input.
            sim.free(mid);
            if let Some(old) = hidden.replace(r) {
                sim.free(old);
            }
        }
        let normed = sim.rms_norm(c, h, dt)?;
        let logits = sim.alloc("logits", &[1, 1, cfg.vocab_size], dt, LOGITS, act)?;
        sim.free(normed);
        sim.free_all(hidden);
        sim.free_all(mask);
        sim.free_all(held);
        sim.free_all([cos, sin, emb, ids]);
        Ok(logits)
    }

    fn attention(
        &self,
        sim: &mut Sim,
        k_cache: &mut Option<H>,
        v_cache: &mut Option<H>,
        mask: Option<H>,
        c: u64,
        past: u64,
    ) -> Result<H, Box<Refused>> {
        let cfg = &self.config;
        let dt = cfg.dtype;
        let act = Category::Activations;
        let (heads, kvh, d, l) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            past + c,
        );
        let gated = cfg.attn_output_gate;
        let qp = sim.alloc(
            "q_proj(x)",
            &[1, c, heads * d * if gated { 2 } else { 1 }],
            dt,
            Q_PROJ,
            act,
        )?;
        let gate = if gated {
            Some(sim.alloc("gate (reshape copy)", &[1, c, heads * d], dt, Q_PROJ, act)?)
        } else {
            None
        };
        let q = sim.rms_norm(c * heads, d, dt)?;
        sim.free(qp);
        let kp = sim.alloc("k_proj(x)", &[1, c, kvh * d], dt, KV_PROJ, act)?;
        let k = sim.rms_norm(c * kvh, d, dt)?;
        sim.free(kp);
        let v = sim.alloc("v_proj(x)", &[1, c, kvh * d], dt, KV_PROJ, act)?;
        // `apply_rotary_pos_emb` (partial rotary): `q_rot * cos`, `rotate_half` (the negated
        // half, then the cat of both halves), `* sin`, the sum, for q and then k; then the cat
        // of each with its pass-through part; q and k rebound, freeing the normed ones.
        let rot = self.rotary_dim();
        let rotated = |sim: &mut Sim, nh: u64| -> Result<H, Box<Refused>> {
            let a = sim.alloc("q_rot * cos", &[1, nh, c, rot], dt, ROPE, act)?;
            let neg = sim.alloc("-x2", &[1, nh, c, rot / 2], dt, ROTATE_HALF, act)?;
            let r = sim.alloc("rotate_half", &[1, nh, c, rot], dt, ROTATE_HALF, act)?;
            sim.free(neg);
            let b = sim.alloc("rotate_half * sin", &[1, nh, c, rot], dt, ROPE, act)?;
            sim.free(r);
            let s = sim.alloc("sum", &[1, nh, c, rot], dt, ROPE, act)?;
            sim.free_all([a, b]);
            Ok(s)
        };
        let qs = rotated(sim, heads)?;
        let ks = rotated(sim, kvh)?;
        let q_embed = sim.alloc("cat(q_embed, q_pass)", &[1, heads, c, d], dt, ROPE_CAT, act)?;
        sim.free(qs);
        let k_embed = sim.alloc("cat(k_embed, k_pass)", &[1, kvh, c, d], dt, ROPE_CAT, act)?;
        sim.free(ks);
        sim.free_all([q, k]);
        let (q, k) = (q_embed, k_embed);
        // DynamicLayer.update: the new K, then the new V, each freeing the old as it is rebound.
        let kv = Category::KvCache;
        let nk = sim.alloc("keys (torch.cat)", &[1, kvh, l, d], dt, CACHE_CAT, kv)?;
        if let Some(old) = k_cache.replace(nk) {
            sim.free(old);
        }
        let nv = sim.alloc("values (torch.cat)", &[1, kvh, l, d], dt, CACHE_CAT, kv)?;
        if let Some(old) = v_cache.replace(nv) {
            sim.free(old);
        }
        sim.free_all([k, v]);
        let (out, weights) = match self.attention {
            Attention::Sdpa => (self.sdpa(sim, mask.is_some(), c, l)?, None),
            Attention::Eager => {
                let (out, w) = self.eager(sim, c, l)?;
                (out, Some(w))
            }
        };
        let out = match gate {
            Some(_) => {
                let s = sim.alloc("sigmoid(gate)", &[1, c, heads * d], dt, GATE_OUT, act)?;
                let p = sim.alloc(
                    "attn_output * sigmoid",
                    &[1, c, heads * d],
                    dt,
                    GATE_OUT,
                    act,
                )?;
                sim.free_all([s, out]);
                p
            }
            None => out,
        };
        let o = sim.alloc("o_proj", &[1, c, cfg.hidden_size], dt, O_PROJ, act)?;
        sim.free(out);
        // The attention's return frees its locals: the rotated query and the gate.
        sim.free(q);
        sim.free_all(gate);
        // Eager's attention weights are returned with the output and dropped by the decoder
        // layer (`hidden_states, _ = self.self_attn(...)`).
        sim.free_all(weights);
        Ok(o)
    }

    /// SDPA over a context of `l` (the query and the cache are live in the caller): with a mask,
    /// K and V repeated to the query heads and the mask copied into the query dtype; the
    /// kernel's output `[1, H, C, D]` (the mask freed once it returns), its
    /// `transpose(1, 2).contiguous()` copy, then the kernel's output and the repeated K and V
    /// freed on return.
    fn sdpa(&self, sim: &mut Sim, masked: bool, c: u64, l: u64) -> Result<H, Box<Refused>> {
        let cfg = &self.config;
        let (dt, act) = (cfg.dtype, Category::Activations);
        let (heads, d) = (cfg.num_attention_heads, cfg.head_dim);
        let mut repeated = Vec::new();
        let mut mask = None;
        if masked {
            repeated = self.repeat_kv(sim, l, REPEAT_KV)?;
            mask = Some(sim.alloc("attn_mask (query dtype)", &[1, 1, c, l], dt, SDPA_MASK, act)?);
        }
        let out = sim.alloc("attn_output", &[1, heads, c, d], dt, SDPA, act)?;
        sim.free_all(mask);
        let contiguous = sim.alloc(
            "attn_output.transpose(1, 2).contiguous()",
            &[1, c, heads, d],
            dt,
            SDPA_CONTIGUOUS,
            act,
        )?;
        sim.free(out);
        sim.free_all(repeated);
        Ok(contiguous)
    }

    /// `repeat_kv`: K and V `[1, H, L, D]`, copied to the query heads (none when there are as many
    /// KV heads: it returns its input).
    fn repeat_kv(
        &self,
        sim: &mut Sim,
        l: u64,
        source: &'static str,
    ) -> Result<Vec<H>, Box<Refused>> {
        let cfg = &self.config;
        let (heads, d) = (cfg.num_attention_heads, cfg.head_dim);
        if heads <= cfg.num_key_value_heads {
            return Ok(Vec::new());
        }
        let act = Category::Activations;
        let k = sim.alloc("key (repeat_kv)", &[1, heads, l, d], cfg.dtype, source, act)?;
        let v = sim.alloc(
            "value (repeat_kv)",
            &[1, heads, l, d],
            cfg.dtype,
            source,
            act,
        )?;
        Ok(vec![k, v])
    }

    /// `eager_attention_forward` over a context of `l`: K and V repeated, the scores and their
    /// scaled copy, the mask added, the fp32 copy ATen makes of a bf16 input, the softmax in fp32
    /// and its copy in the model dtype (the attention weights, returned to the caller), the
    /// output and its transposed copy.
    fn eager(&self, sim: &mut Sim, c: u64, l: u64) -> Result<(H, H), Box<Refused>> {
        let cfg = &self.config;
        let (dt, act) = (cfg.dtype, Category::Activations);
        let (heads, d) = (cfg.num_attention_heads, cfg.head_dim);
        let repeated = self.repeat_kv(sim, l, EAGER_REPEAT_KV)?;
        let scores = [1, heads, c, l];
        let s = sim.alloc("q @ k^T", &scores, dt, EAGER_SCORES, act)?;
        let w = sim.alloc("* scaling", &scores, dt, EAGER_SCORES, act)?;
        sim.free(s);
        let m = sim.alloc("+ attention_mask", &scores, dt, EAGER_MASKED, act)?;
        sim.free(w);
        // ATen's `softmax(input, dim, dtype)` fuses the conversion only for a CUDA fp16 input;
        // any other input is first copied into the dtype, then soft-maxed into a new tensor.
        let converted = if dt == DType::F16 {
            None
        } else {
            Some(sim.alloc(
                "input.toType(float32)",
                &scores,
                DType::F32,
                SOFTMAX_CONVERT,
                act,
            )?)
        };
        let p32 = sim.alloc("softmax (fp32)", &scores, DType::F32, EAGER_SOFTMAX, act)?;
        sim.free_all(converted);
        let p = sim.alloc("softmax .to(dtype)", &scores, dt, EAGER_SOFTMAX, act)?;
        sim.free_all([p32, m]);
        let o = sim.alloc("attn_weights @ v", &[1, heads, c, d], dt, EAGER_OUT, act)?;
        let out = sim.alloc(
            "transpose(1, 2).contiguous()",
            &[1, c, heads, d],
            dt,
            EAGER_OUT,
            act,
        )?;
        sim.free(o);
        sim.free_all(repeated);
        Ok((out, p))
    }

    /// fla's kernel for a chunk of `c` tokens, in its own order (q and k at the value heads when
    /// transformers repeats them).
    fn gdn_kernel(&self, c: u64) -> Result<Vec<crate::Tensor>, ModelError> {
        let cfg = &self.config;
        let (hk, hv) = (cfg.linear_num_key_heads, cfg.linear_num_value_heads);
        let heads = if hv > hk { hv } else { hk };
        let mut shape = GdnShape::new(
            &[c],
            heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
            cfg.dtype,
        );
        shape.num_v_heads = hv;
        shape.output_final_state = true;
        shape.l2norm_in_kernel = Some(true);
        gdn_fla_0_6_0::tensors(&shape)
    }

    #[allow(clippy::too_many_arguments)]
    fn gdn(
        &self,
        sim: &mut Sim,
        kernel: &[crate::Tensor],
        conv_state: &mut Option<H>,
        recurrent: &mut Option<H>,
        c: u64,
        past: u64,
    ) -> Result<H, Box<Refused>> {
        let cfg = &self.config;
        let dt = cfg.dtype;
        let act = Category::Activations;
        let (hk, hv, dk, dv, kc) = (
            cfg.linear_num_key_heads,
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
            cfg.linear_conv_kernel_dim,
        );
        let conv_dim = 2 * hk * dk + hv * dv;
        let qkv = sim.alloc("in_proj_qkv(x)", &[1, c, conv_dim], dt, GDN_PROJ, act)?;
        let z = sim.alloc("z", &[1, c, hv * dv], dt, GDN_PROJ, act)?;
        let b = sim.alloc("b", &[1, c, hv], dt, GDN_PROJ, act)?;
        let a = sim.alloc("a", &[1, c, hv], dt, GDN_PROJ, act)?;
        if conv_state.is_none() {
            let s = sim.alloc(
                "conv_states",
                &[1, conv_dim, kc],
                dt,
                STATE,
                Category::State,
            )?;
            *conv_state = Some(s);
        }
        // From the second chunk on, the conv sees the cached state before the chunk.
        let (conv_in, width) = if past > 0 {
            let cat = sim.alloc(
                "torch.cat(conv_state, x)",
                &[1, conv_dim, kc + c],
                dt,
                CONV_CAT,
                act,
            )?;
            sim.free(qkv);
            (cat, kc + c)
        } else {
            (qkv, c)
        };
        let conv = sim.alloc("F.conv1d", &[1, conv_dim, width + kc - 1], dt, CONV, act)?;
        let mixed = sim.alloc("silu(conv)", &[1, conv_dim, width], dt, CONV, act)?;
        sim.free_all([conv, conv_in]);
        let beta = sim.alloc("beta", &[1, c, hv], dt, GATES, act)?;
        let af = sim.alloc("a.float() + dt_bias", &[1, c, hv], DType::F32, GATES, act)?;
        let sp = sim.alloc("softplus", &[1, c, hv], DType::F32, GATES, act)?;
        let g = sim.alloc("g", &[1, c, hv], DType::F32, GATES, act)?;
        sim.free_all([af, sp]);
        // Held to the layer's end: the conv output (query, key and value are views of it) and
        // the gates; the repeated query and key.
        let gates = [beta, g, b, a];
        let mut repeated = Vec::new();
        let repeat = hv > hk;
        // Inside fla's call: its contiguous copies, freed when the call returns.
        let mut copies = Vec::new();
        if repeat {
            repeated.push(sim.alloc(
                "query (repeat_interleave)",
                &[1, c, hv, dk],
                dt,
                REPEAT_QK,
                act,
            )?);
            repeated.push(sim.alloc(
                "key (repeat_interleave)",
                &[1, c, hv, dk],
                dt,
                REPEAT_QK,
                act,
            )?);
        } else {
            copies.push(sim.alloc("query (contiguous)", &[1, c, hk, dk], dt, FLA_COPY, act)?);
            copies.push(sim.alloc("key (contiguous)", &[1, c, hk, dk], dt, FLA_COPY, act)?);
        }
        copies.push(sim.alloc("value (contiguous)", &[1, c, hv, dv], dt, FLA_COPY, act)?);
        // fla's kernel, in its own order; its outputs are o and the fp32 final state. The
        // l2-normalised q and k (and their rstd) are the autograd function's locals: freed with
        // the contiguous copies when it returns, after the kernel's own frees.
        let in_call = |name: &str| {
            name.starts_with("q (l2norm)")
                || name.starts_with("k (l2norm)")
                || name.ends_with("rstd")
        };
        let mut ids: Vec<Option<H>> = vec![None; kernel.len()];
        let mut l2: Vec<H> = Vec::new();
        let mut final_state: Option<H> = None;
        for e in events(kernel) {
            match e {
                Event::Alloc { tensor } => {
                    let t = &kernel[tensor];
                    let h = sim.alloc_bytes(&t.name, t.bytes, t.source, act)?;
                    if in_call(&t.name) {
                        l2.push(h);
                    } else if t.name == "final_state" {
                        final_state = Some(h);
                    } else {
                        ids[tensor] = Some(h);
                    }
                }
                Event::Free { tensor } => {
                    if let Some(h) = ids[tensor].take() {
                        sim.free(h);
                    }
                }
            }
        }
        sim.free_all(copies);
        sim.free_all(l2);
        let outputs: Vec<H> = ids.into_iter().flatten().collect();
        let state_bytes = hv * dk * dv * DType::F32.size_bytes();
        if recurrent.is_none() {
            let s = sim.alloc_bytes("recurrent_states", state_bytes, STATE, Category::State)?;
            *recurrent = Some(s);
        }
        // `Qwen3_5RMSNormGated` over [C·Hv, Dv] (its lines 225-234): the input in fp32, its
        // squares (reduced, then freed), the product with rsqrt, cast back and times the
        // weight, the gate in fp32, its silu, the product in fp32, cast back.
        let rows = c * hv;
        let x32 = sim.alloc(
            "hidden_states.to(float32)",
            &[rows, dv],
            DType::F32,
            GATED_NORM,
            act,
        )?;
        let sq = sim.alloc("pow(2)", &[rows, dv], DType::F32, GATED_NORM, act)?;
        sim.free(sq);
        let n32 = sim.alloc(
            "* rsqrt(variance)",
            &[rows, dv],
            DType::F32,
            GATED_NORM,
            act,
        )?;
        sim.free(x32);
        let nb = sim.alloc("to(input_dtype)", &[rows, dv], dt, GATED_NORM, act)?;
        let w = sim.alloc("weight *", &[rows, dv], dt, GATED_NORM, act)?;
        sim.free_all([nb, n32]);
        let z32 = sim.alloc("gate.to(float32)", &[rows, dv], DType::F32, GATED_NORM, act)?;
        let sz = sim.alloc("silu(gate)", &[rows, dv], DType::F32, GATED_NORM, act)?;
        sim.free(z32);
        let y32 = sim.alloc("* silu(gate)", &[rows, dv], DType::F32, GATED_NORM, act)?;
        sim.free_all([sz, w]);
        let y = sim.alloc("gated norm", &[rows, dv], dt, GATED_NORM, act)?;
        sim.free(y32);
        // `core_attn_out` rebound to the norm's output frees o; the final state is a local of
        // the layer (the cache copies it into its own, `update_recurrent_state`).
        sim.free_all(outputs);
        let o = sim.alloc("out_proj", &[1, c, cfg.hidden_size], dt, O_PROJ, act)?;
        // The layer's return frees its locals.
        sim.free(z);
        sim.free_all(repeated);
        sim.free(mixed);
        sim.free(y);
        sim.free_all(final_state);
        sim.free_all(gates);
        Ok(o)
    }

    fn mlp(&self, sim: &mut Sim, c: u64) -> Result<H, Box<Refused>> {
        let cfg = &self.config;
        let dt = cfg.dtype;
        let act = Category::Activations;
        let inter = cfg.intermediate_size.unwrap_or(0);
        let gate = sim.alloc("gate_proj(x)", &[1, c, inter], dt, MLP, act)?;
        let a = sim.alloc("act_fn(gate)", &[1, c, inter], dt, MLP, act)?;
        sim.free(gate);
        let up = sim.alloc("up_proj(x)", &[1, c, inter], dt, MLP, act)?;
        let p = sim.alloc("act * up", &[1, c, inter], dt, MLP, act)?;
        sim.free_all([a, up]);
        let down = sim.alloc("down_proj", &[1, c, cfg.hidden_size], dt, MLP, act)?;
        sim.free(p);
        Ok(down)
    }
}

impl Engine for GenerateChunked {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Under a per-process fraction the caching allocator refuses once its segments would pass
    /// `fraction × total` (`c10/cuda/CUDACachingAllocator.cpp`: `allowed_memory_maximum`); on a
    /// card the driver refuses once everything on it would pass the card, so the context and the
    /// other processes (given as known parts by the caller, else none) come off it. vLLM's
    /// utilisation is not a limit transformers meets.
    fn enforced_bytes(&self, limit: &Limit) -> Result<u64, ModelError> {
        match limit {
            Limit::PerProcessFraction { .. } | Limit::Card { .. } => limit.bytes(),
            Limit::GpuMemoryUtilization { .. } => Err(ModelError::Invalid(
                "--gpu-memory-utilization is vLLM's; transformers meets a per-process fraction (--memory-fraction) or the card".into(),
            )),
        }
    }

    fn max_context(&self) -> Option<u64> {
        self.config.max_position_embeddings
    }

    fn plan(&self, limit: &Limit, prompt_tokens: u64) -> Result<PlannedRun, ModelError> {
        self.run(limit, prompt_tokens, None)
    }
}

impl GenerateChunked {
    /// The forward `seed.index` planned from the allocator's state a trace shows at its start
    /// ([`AllocatorSeed`]), with the forwards before it planned without a limit (only the
    /// tensors they leave live matter, each taking a traced block). The run's steps hold that
    /// forward alone; its failure, if any, is that forward's. Default allocator only: an
    /// expandable segment's state is not seeded.
    pub fn plan_from(&self, limit: &Limit, seed: &AllocatorSeed) -> Result<PlannedRun, ModelError> {
        if self.expandable_segments {
            return Err(ModelError::Invalid(
                "a traced allocator state is read for the default allocator only, not expandable segments".into(),
            ));
        }
        let prompt = (seed.index + 1).saturating_mul(self.chunk_tokens);
        self.run(limit, prompt, Some(seed))
    }

    fn run(
        &self,
        limit: &Limit,
        prompt_tokens: u64,
        seed: Option<&AllocatorSeed>,
    ) -> Result<PlannedRun, ModelError> {
        let limit_bytes = self.enforced_bytes(limit)?;
        let usable = limit_bytes
            .saturating_sub(self.calibration.as_ref().map_or(0, |k| k.reserve_held_back));
        if prompt_tokens == 0 || prompt_tokens > crate::MAX_TOKENS {
            return Err(ModelError::Invalid(format!(
                "the prompt must hold 1 to {} tokens, not {prompt_tokens}",
                crate::MAX_TOKENS
            )));
        }
        let cfg = &self.config;
        let weights = weight_bytes(cfg, WeightFormat::Bf16, 1)?.bytes;
        let mut sim = Sim::new(seed.is_none().then_some(usable), self.expandable_segments);
        if self.calibration.is_some() {
            sim.basis = Basis::Calibrated;
        }
        let mut run = PlannedRun {
            engine: NAME,
            limit: *limit,
            limit_bytes,
            steps: Vec::new(),
            failure: None,
            prompt_tokens,
            last_step_parts: Vec::new(),
        };
        let fail = |run: &mut PlannedRun, r: Box<Refused>, index, chunk, context| {
            run.failure = Some(PlannedFailure {
                index,
                chunk_tokens: chunk,
                context_tokens: context,
                tensor: r.tensor,
                source: r.source.to_string(),
                request: r.request,
                segment: r.segment,
                reserved: r.reserved,
                allocated: r.allocated,
                parts: r.parts,
            });
        };
        // Before the first chunk: the weights, the user's input_ids and generate's two [1, N]
        // buffers (int64).
        let setup = (|| -> Result<(), Box<Refused>> {
            sim.alloc_bytes("weights", weights, WEIGHTS, Category::Weights)?;
            for name in ["input_ids", "attention_mask", "position_ids"] {
                sim.alloc(
                    name,
                    &[1, prompt_tokens],
                    DType::I64,
                    GEN_BUFFERS,
                    Category::Activations,
                )?;
            }
            Ok(())
        })();
        if let Err(r) = setup {
            fail(&mut run, r, 0, self.chunk_tokens.min(prompt_tokens), 0);
            return Ok(run);
        }
        let mut caches: Vec<LayerCache> = cfg
            .layer_types
            .iter()
            .map(|k| match k {
                LayerKind::FullAttention => LayerCache::Attention { k: None, v: None },
                LayerKind::LinearAttention => LayerCache::Gdn {
                    conv: None,
                    recurrent: None,
                },
            })
            .collect();
        let mut past = 0;
        let mut kernel: Option<(u64, Vec<crate::Tensor>)> = None;
        let mut previous_logits: Option<H> = None;
        let mut index = 0;
        while past < prompt_tokens {
            let c = self.chunk_tokens.min(prompt_tokens - past);
            if cfg.num_linear_layers() > 0 && kernel.as_ref().is_none_or(|(n, _)| *n != c) {
                kernel = Some((c, self.gdn_kernel(c)?));
            }
            let k = kernel
                .as_ref()
                .map(|(_, k)| k.as_slice())
                .unwrap_or_default();
            sim.begin_step();
            let seeded = seed.filter(|s| s.index == index).map(|s| (s, usable));
            match self.forward(&mut sim, &mut caches, k, c, past, seeded) {
                Ok(logits) => {
                    // `outputs` is rebound after the forward returns.
                    if let Some(old) = previous_logits.replace(logits) {
                        sim.free(old);
                    }
                }
                Err(r) => {
                    fail(&mut run, r, index, c, past + c);
                    return Ok(run);
                }
            }
            past += c;
            if seed.is_some_and(|s| index < s.index) {
                index += 1;
                continue;
            }
            run.steps.push(PlannedStep {
                index,
                chunk_tokens: c,
                context_tokens: past,
                peak_allocated: sim.step_peak_allocated,
                peak_reserved: sim.step_peak_reserved,
            });
            run.last_step_parts = sim.parts_of(sim.step_peak);
            index += 1;
        }
        Ok(run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid() -> ModelConfig {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../samples/h200/hf-prefill-qwen35/config.json");
        ModelConfig::from_path(p).unwrap()
    }

    #[test]
    fn a_run_stops_at_the_first_refusal_and_names_it() {
        let p = GenerateChunked::new(hybrid(), 4096).unwrap();
        let limit = Limit::PerProcessFraction {
            capacity: 150_000_000_000,
            fraction: 0.04,
        };
        let run = p.plan(&limit, 1 << 20).unwrap();
        let f = run
            .failure
            .as_ref()
            .expect("6 GB cannot hold a million tokens");
        // Steps count from 0 and each adds one chunk.
        assert_eq!(run.steps.len() as u64, f.index);
        assert_eq!(f.context_tokens, (f.index + 1) * 4096);
        for (i, s) in run.steps.iter().enumerate() {
            assert_eq!(s.context_tokens, (i as u64 + 1) * 4096);
            assert!(s.peak_reserved <= run.limit_bytes);
        }
        // The refusal is what a long context makes large, past the limit with what is held.
        assert!(f.request > 64 << 20, "{f:?}");
        assert!(f.reserved + f.segment > run.limit_bytes);
        // The parts add up to what was reserved when it failed.
        let sum: u64 = f.parts.iter().map(|p| p.bytes).sum();
        assert_eq!(sum, f.reserved);
        assert!(f.parts.iter().all(|p| p.basis == Basis::Predicted));
        let front = ContextFrontier::of(&run, 4096, Basis::Predicted);
        assert_eq!(front.context_at_chunk, Some(f.context_tokens - 4096));
        assert!(!front.capped);
    }

    #[test]
    fn a_larger_limit_or_a_smaller_chunk_reaches_further() {
        let run = |chunk, fraction| {
            let p = GenerateChunked::new(hybrid(), chunk).unwrap();
            let limit = Limit::PerProcessFraction {
                capacity: 150_000_000_000,
                fraction,
            };
            p.plan(&limit, 1 << 21)
                .unwrap()
                .failure
                .unwrap()
                .context_tokens
        };
        assert!(run(4096, 0.06) > run(4096, 0.04));
        assert!(run(2048, 0.04) > run(8192, 0.04));
    }

    /// Eager attention materialises the scores, `[1, H, C, L]` in the model dtype and in fp32,
    /// and a mask from the first chunk on: it fails far earlier than SDPA, on a scores tensor.
    #[test]
    fn eager_attention_is_refused_on_its_scores_long_before_sdpa() {
        let limit = Limit::PerProcessFraction {
            capacity: 150_000_000_000,
            fraction: 0.05,
        };
        let mut p = GenerateChunked::new(hybrid(), 2048).unwrap();
        let sdpa = p.plan(&limit, 1 << 20).unwrap().failure.unwrap();
        p.attention = "eager".parse().unwrap();
        let eager = p.plan(&limit, 1 << 20).unwrap().failure.unwrap();
        assert!(
            eager.context_tokens * 4 < sdpa.context_tokens,
            "{eager:?} {sdpa:?}"
        );
        let cfg = hybrid();
        let scores = cfg.num_attention_heads * 2048 * eager.context_tokens;
        assert!(
            [2, 4].iter().any(|b| eager.request == scores * b),
            "{eager:?}"
        );
        assert!(eager.source.contains("modeling_qwen3_5.py:7"), "{eager:?}");
        let e = "flash_attention_2".parse::<Attention>().unwrap_err();
        assert!(e.to_string().contains("sdpa"), "{e}");
    }

    /// Expandable segments leave no slivers at the ends of per-tensor segments: the same run
    /// reaches at least as far, and its reserve stays in whole 20 MiB pages.
    #[test]
    fn expandable_segments_reach_at_least_as_far() {
        let limit = Limit::PerProcessFraction {
            capacity: 150_000_000_000,
            fraction: 0.05,
        };
        let mut p = GenerateChunked::new(hybrid(), 4096).unwrap();
        let plain = p.plan(&limit, 1 << 20).unwrap();
        p.expandable_segments = true;
        let exp = p.plan(&limit, 1 << 20).unwrap();
        let (a, b) = (plain.failure.unwrap(), exp.failure.clone().unwrap());
        assert!(b.context_tokens >= a.context_tokens, "{a:?} {b:?}");
        assert!(exp.steps.iter().all(|s| s.peak_reserved <= exp.limit_bytes));
    }

    #[test]
    fn a_prompt_that_fits_is_held_whole() {
        let p = GenerateChunked::new(hybrid(), 1000).unwrap();
        let limit = Limit::Card { capacity: 80 << 30 };
        let run = p.plan(&limit, 2500).unwrap();
        assert!(run.failure.is_none());
        let ctx: Vec<u64> = run.steps.iter().map(|s| s.context_tokens).collect();
        assert_eq!(ctx, [1000, 2000, 2500]);
        let front = ContextFrontier::of(&run, 1000, Basis::Predicted);
        assert!(front.capped && front.context_at_chunk == Some(2500));
    }

    #[test]
    fn a_dense_model_is_planned_without_gdn_layers() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../samples/h200/hf-serve-cb/config.json");
        let dense = ModelConfig::from_path(p).unwrap();
        let p = GenerateChunked::new(dense, 4096).unwrap();
        let limit = Limit::PerProcessFraction {
            capacity: 150_109_880_320,
            fraction: 0.05,
        };
        let run = p.plan(&limit, 32_768).unwrap();
        assert!(!run.steps.is_empty());
        assert!(run.steps.iter().all(|s| s.peak_reserved <= run.limit_bytes));
        // No GDN state: every part is weights, KV cache, activations or reserve.
        assert!(
            run.last_step_parts
                .iter()
                .all(|p| p.category != Category::State)
        );
    }

    #[test]
    fn vllm_utilisation_is_not_a_transformers_limit() {
        let p = GenerateChunked::new(hybrid(), 1000).unwrap();
        let e = p
            .plan(
                &Limit::GpuMemoryUtilization {
                    capacity: 1 << 34,
                    fraction: 0.9,
                },
                100,
            )
            .unwrap_err();
        assert!(e.to_string().contains("per-process fraction"), "{e}");
    }
}
