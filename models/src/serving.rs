//! What a whole-step prediction is asked about: the serving shape of one step, the program that
//! runs it, the parts of memory a trace knows but the config does not, and the limit enforced.

use serde::Serialize;

use crate::{DType, ModelConfig, ModelError, Variant, WeightFormat};

/// One forward step of a serving engine: `batch` identical sequences, each prefilling a chunk of
/// `chunk_tokens` new tokens on top of what it already holds, so that at the end of the step each
/// holds `context_tokens` tokens of K/V (the chunk's own included).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServingShape {
    /// New tokens of each sequence in this step (`T`, vLLM's `--max-num-batched-tokens` at most).
    pub chunk_tokens: u64,
    /// Tokens of each sequence whose K/V the attention layers hold at the end of the step (`L`,
    /// the chunk included, so at least `chunk_tokens`).
    pub context_tokens: u64,
    /// Sequences in the step; each holds its own GDN state and K/V.
    pub batch: u64,
    /// Tensor-parallel degree (the prediction is for one rank).
    pub tp: u64,
    /// Activation dtype (the config's unless overridden).
    pub dtype: DType,
    /// KV cache dtype (`--kv-cache-dtype`: the activation dtype, or fp8).
    pub kv_dtype: DType,
    /// KV cache block in tokens: each sequence's cache is rounded up to whole blocks (1: no
    /// rounding, as in a cache that grows by exactly the chunk).
    pub block_size: u64,
    /// Streaming multiprocessors of the GPU (FlashAttention's split heuristic; 132 on an H200).
    pub num_sms: u64,
}

impl ServingShape {
    /// One sequence prefilling `chunk_tokens` with `context_tokens` held at the end, at TP 1,
    /// in `cfg`'s dtype, no block rounding, on an H200's 132 SMs.
    pub fn prefill(cfg: &ModelConfig, chunk_tokens: u64, context_tokens: u64) -> Self {
        ServingShape {
            chunk_tokens,
            context_tokens,
            batch: 1,
            tp: 1,
            dtype: cfg.dtype,
            kv_dtype: cfg.dtype,
            block_size: 1,
            num_sms: 132,
        }
    }

    /// The same step with another chunk.
    pub fn with_chunk(&self, chunk_tokens: u64) -> Self {
        ServingShape {
            chunk_tokens,
            ..self.clone()
        }
    }

    /// The same step with another context.
    pub fn with_context(&self, context_tokens: u64) -> Self {
        ServingShape {
            context_tokens,
            ..self.clone()
        }
    }

    /// Refuses a shape no engine runs, with a sentence that says what to give instead.
    pub(crate) fn check(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Invalid(m));
        if self.chunk_tokens == 0 || self.batch == 0 || self.tp == 0 || self.block_size == 0 {
            return bad(format!(
                "the serving shape needs at least one chunk token, one sequence, a TP degree and a block size of 1 or more (got chunk {}, batch {}, tp {}, block size {})",
                self.chunk_tokens, self.batch, self.tp, self.block_size
            ));
        }
        if self.context_tokens < self.chunk_tokens {
            return bad(format!(
                "the context ({} tokens) must include the chunk ({} tokens): give the tokens held at the end of the step",
                self.context_tokens, self.chunk_tokens
            ));
        }
        let total = u128::from(self.context_tokens) * u128::from(self.batch);
        if total > u128::from(crate::MAX_TOKENS) {
            return Err(ModelError::TooLarge(format!(
                "{} sequences of {} tokens are past the {} tokens the models accept; give a real context",
                self.batch,
                self.context_tokens,
                crate::MAX_TOKENS
            )));
        }
        if self.tp > crate::MAX_COUNT || self.num_sms > crate::MAX_COUNT {
            return bad(format!(
                "TP {} or {} SMs is past the cap of {}; give real values",
                self.tp,
                self.num_sms,
                crate::MAX_COUNT
            ));
        }
        Ok(())
    }
}

/// The program that runs the step: which tensors a layer holds beside its kernel, how the K/V
/// is stored, and what outlives a layer. Each is described from its own source; none is a blend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    /// `vramtrace-workload prefill` (`testbed/workload/src/prefill/`; `vramtrace demo` and the
    /// `samples/h200/prefill-18gib` sample): the kernels' inputs and the kernels of each layer,
    /// all freed before the next layer; a cache that grows by exactly the chunk; no residual
    /// stream, projections or sampler.
    Workload,
    /// `scripts/validate/torch_prefill.py` (the `samples/h200/torch-oom` sample): plain PyTorch
    /// layers whose Python names keep tensors alive across layers, K/V kept as views of each
    /// chunk's fused qkv projection, and attention over K/V concatenated and repeated to the
    /// query heads.
    TorchPrefillScript,
    /// vLLM 0.20.1 serving a Qwen3-Next / Qwen3.5 model: a paged KV cache, the residual stream,
    /// the projections around each kernel, and logits for one row per sequence.
    Vllm,
    /// transformers 5.x `Qwen3_5ForCausalLM.forward` on one prefill chunk with fla, SDPA and a
    /// `DynamicCache`: K/V concatenated per layer and repeated to the query heads for SDPA,
    /// logits for every token of the chunk.
    Transformers,
}

impl Runtime {
    /// Every runtime, as `--runtime` lists them.
    pub const ALL: [Runtime; 4] = [
        Runtime::Workload,
        Runtime::TorchPrefillScript,
        Runtime::Vllm,
        Runtime::Transformers,
    ];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Workload => "workload",
            Runtime::TorchPrefillScript => "torch-prefill-script",
            Runtime::Vllm => "vllm-0.20.1",
            Runtime::Transformers => "transformers",
        }
    }

    /// Looks a runtime up by its name.
    pub fn from_name(name: &str) -> Option<Runtime> {
        Runtime::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Whether the runtime allocates through PyTorch's caching allocator (so that a per-process
    /// fraction limits it, and a cuBLAS workspace is part of it).
    pub fn uses_pytorch_allocator(self) -> bool {
        !matches!(self, Runtime::Workload)
    }
}

/// The kernels and storage formats a step runs with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepVariants {
    /// The program around the kernels.
    pub runtime: Runtime,
    /// The GDN chunk forward (a [`crate::Kernel::Gdn`] variant).
    pub gdn: Variant,
    /// `use_qk_l2norm_in_kernel`; `None` takes what the runtime passes.
    pub l2norm_in_kernel: Option<bool>,
    /// The FlashAttention varlen forward of the workload and vLLM (a [`crate::Kernel::Fa`]
    /// variant); the script and transformers use SDPA over repeated K/V instead.
    pub attention: Variant,
    /// How the linear-layer weights are stored.
    pub weights: WeightFormat,
    /// The conv state dtype.
    pub conv_dtype: DType,
    /// The recurrent (SSM) state dtype (`mamba_ssm_cache_dtype`).
    pub ssm_dtype: DType,
}

impl StepVariants {
    /// What `runtime` runs by default for `cfg`: the workload's fla 0.6.0 with in-kernel
    /// l2norm, PyTorch's FlashAttention and int4 weights (as `vramtrace demo`); the script's and
    /// transformers' fla 0.6.0 with in-kernel l2norm and bf16 weights; vLLM 0.20.1's vendored GDN
    /// (l2norm before the call), FlashAttention 2.8.3 and bf16 weights. The recurrent state is
    /// fp32 everywhere: fla returns it in fp32, and vLLM takes a Qwen3.5 checkpoint's
    /// `mamba_ssm_dtype` (float32) for `mamba_ssm_cache_dtype` auto; set `ssm_dtype` otherwise.
    pub fn for_runtime(runtime: Runtime, cfg: &ModelConfig) -> Self {
        match runtime {
            Runtime::Workload => StepVariants {
                runtime,
                gdn: Variant::GdnFla060,
                l2norm_in_kernel: Some(true),
                attention: Variant::FaPytorch,
                weights: WeightFormat::Int4 { group: 128 },
                conv_dtype: cfg.dtype,
                ssm_dtype: DType::F32,
            },
            Runtime::TorchPrefillScript | Runtime::Transformers => StepVariants {
                runtime,
                gdn: Variant::GdnFla060,
                l2norm_in_kernel: Some(true),
                attention: Variant::FaPytorch,
                weights: WeightFormat::Bf16,
                conv_dtype: cfg.dtype,
                ssm_dtype: DType::F32,
            },
            // vLLM's own FlashAttention fork (`_vllm_fa2_C.varlen_fwd` on compute capability
            // 8.x): its varlen forward allocates `softmax_lse` unpadded, `[H, total_q]` fp32
            // (vllm-project/flash-attention `csrc/flash_attn/flash_api.cpp:657, 693`, the
            // `csrc` tree of the commits whose `cute/` vLLM 0.20.1 ships), no split-KV buffers
            // for a prefill (`:704-711`: decode only) and nothing sized by `max_seqlen_k`;
            // Dao-AILab 2.8.3's layout, so that variant stands for it (docs/validation.md,
            // "vLLM's FlashAttention fork").
            Runtime::Vllm => StepVariants {
                runtime,
                gdn: Variant::GdnVllm0201,
                l2norm_in_kernel: None,
                attention: Variant::FaDao283,
                weights: WeightFormat::Bf16,
                conv_dtype: cfg.dtype,
                ssm_dtype: DType::F32,
            },
        }
    }
}

/// Parts of a step's memory that a config does not determine but a trace (or the engine's log)
/// can tell: given, they are added as they are and shown as given; absent, the part is not
/// predicted (and its residual says so).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KnownParts {
    /// The serving engine's static buffers (vLLM's persistent input batch, transformers serve's
    /// static tensors). For PyTorch runtimes the cuBLAS workspace is predicted and added to it.
    pub engine_buffers: Option<u64>,
    /// CUDA-graph memory pools.
    pub cuda_graphs: Option<u64>,
    /// NCCL buffers.
    pub communication: Option<u64>,
    /// Autotuning scratch (Triton's benchmark cache flush).
    pub autotune: Option<u64>,
    /// A KV pool the engine preallocates whatever the context (vLLM's "GPU KV cache size" times
    /// the bytes per token, transformers serve's paged cache): the KV part is then the pool, and
    /// a context whose K/V does not fit in it cannot be scheduled at all.
    pub kv_pool: Option<u64>,
    /// The caching allocator's reserve: reserved but unallocated bytes that the step cannot use.
    pub allocator_reserve: Option<u64>,
    /// The CUDA context and loaded modules that count against the limit.
    pub context: Option<u64>,
    /// Other processes on the device.
    pub other_process: Option<u64>,
}

/// The memory limit a step runs under.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Limit {
    /// A card (or a ballast that leaves this many bytes): the driver refuses past it, so
    /// everything on the device counts.
    Card {
        /// Bytes the step may use.
        capacity: u64,
    },
    /// vLLM's `--gpu-memory-utilization`: the engine budgets `capacity × fraction` for this
    /// process, its context included; other processes are outside the budget.
    GpuMemoryUtilization {
        /// The card's total memory.
        capacity: u64,
        /// The fraction (0 < f ≤ 1).
        fraction: f64,
    },
    /// PyTorch's `torch.cuda.set_per_process_memory_fraction`: the caching allocator refuses when
    /// its reserved bytes plus the new segment pass `fraction × total`; the context,
    /// communication buffers and other processes are outside it.
    PerProcessFraction {
        /// The card's total memory.
        capacity: u64,
        /// The fraction (0 < f ≤ 1).
        fraction: f64,
    },
}

impl Limit {
    /// The enforced limit in bytes. vLLM's budget is `total × gpu_memory_utilization`
    /// (`vllm/v1/worker/utils.py` `request_memory`), taken here rounded up; PyTorch's is
    /// `static_cast<size_t>(fraction * device_total)`, rounded down
    /// (`c10/cuda/CUDACachingAllocator.cpp` `setMemoryFraction`).
    pub fn bytes(&self) -> Result<u64, ModelError> {
        let frac = |capacity: u64, fraction: f64, up: bool| {
            if !(fraction > 0.0 && fraction <= 1.0) {
                return Err(ModelError::Invalid(format!(
                    "a memory fraction must be above 0 and at most 1, not {fraction}; give e.g. 0.9"
                )));
            }
            let v = capacity as f64 * fraction;
            Ok(if up { v.ceil() as u64 } else { v as u64 })
        };
        match *self {
            Limit::Card { capacity } => Ok(capacity),
            Limit::GpuMemoryUtilization { capacity, fraction } => frac(capacity, fraction, true),
            Limit::PerProcessFraction { capacity, fraction } => frac(capacity, fraction, false),
        }
    }

    /// Whether a part of the step counts against this limit.
    pub fn counts(&self, category: crate::Category) -> bool {
        use crate::Category as C;
        match self {
            Limit::Card { .. } => true,
            Limit::GpuMemoryUtilization { .. } => category != C::OtherProcess,
            Limit::PerProcessFraction { .. } => !matches!(
                category,
                C::Context | C::Communication | C::OtherProcess | C::Unnamed
            ),
        }
    }

    /// How the limit is said in a report.
    pub fn describe(&self) -> String {
        match self {
            Limit::Card { capacity } => format!("a card of {capacity} bytes"),
            Limit::GpuMemoryUtilization { capacity, fraction } => {
                format!("--gpu-memory-utilization {fraction} of {capacity} bytes")
            }
            Limit::PerProcessFraction { capacity, fraction } => {
                format!("set_per_process_memory_fraction({fraction}) of {capacity} bytes")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Category;

    #[test]
    fn limits_in_bytes_and_what_counts() {
        let card = Limit::Card { capacity: 1000 };
        assert_eq!(card.bytes().unwrap(), 1000);
        assert!(card.counts(Category::OtherProcess));
        // vLLM rounds its budget up, PyTorch its fraction down.
        let gmu = Limit::GpuMemoryUtilization {
            capacity: 1001,
            fraction: 0.5,
        };
        assert_eq!(gmu.bytes().unwrap(), 501);
        assert!(gmu.counts(Category::Context) && !gmu.counts(Category::OtherProcess));
        let frac = Limit::PerProcessFraction {
            capacity: 1001,
            fraction: 0.5,
        };
        assert_eq!(frac.bytes().unwrap(), 500);
        assert!(frac.counts(Category::AllocatorReserve) && frac.counts(Category::CudaGraphs));
        assert!(!frac.counts(Category::Context) && !frac.counts(Category::Communication));
        let e = Limit::PerProcessFraction {
            capacity: 1,
            fraction: 1.5,
        }
        .bytes()
        .unwrap_err();
        assert!(e.to_string().contains("at most 1"), "{e}");
    }

    #[test]
    fn a_shape_without_its_chunk_in_the_context_is_refused() {
        let s = ServingShape {
            chunk_tokens: 4128,
            context_tokens: 100,
            batch: 1,
            tp: 1,
            dtype: DType::BF16,
            kv_dtype: DType::BF16,
            block_size: 1,
            num_sms: 132,
        };
        let e = s.check().unwrap_err().to_string();
        assert_eq!(
            e,
            "the context (100 tokens) must include the chunk (4128 tokens): give the tokens held at the end of the step"
        );
        assert!(s.with_chunk(0).check().is_err());
        assert!(s.with_context(4128).check().is_ok());
        for r in Runtime::ALL {
            assert_eq!(Runtime::from_name(r.name()), Some(r));
        }
    }
}
