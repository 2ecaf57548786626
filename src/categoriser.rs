//! The categoriser: every byte of a moment in one category, with the evidence it rests on.
//!
//! Pure: it takes plain facts about one allocation or tensor ([`Facts`]: bytes, Python frames
//! innermost first, native frames, a label, lifetime facts) and answers a [`Verdict`] (a
//! [`Category`] and the [`Evidence`] it rests on); [`categorise_moment`] takes the whole live set
//! at a moment (tensors, the driver's allocations, the device's free and total memory at a
//! failure, NVML when live) and answers rows that sum to the whole. Nothing here reads a trace.
//!
//! # The order of the rules (the first that holds decides)
//! 1. **Enclosing frames**, anywhere in the Python stack: allocations made while Triton
//!    benchmarks an autotuning candidate ([`Category::Autotune`]) or while a serving engine
//!    captures CUDA graphs ([`Category::CudaGraphs`]); what happens inside wins over where.
//! 2. **Site frames**, innermost Python frame first: the loaders and cache constructors of
//!    transformers, vLLM and SGLang, PyTorch's module constructors ([`FRAME_RULES`]).
//! 3. **Native frames**, innermost first: the library that called the driver (NCCL, cuBLAS) or
//!    llama.cpp's functions ([`NATIVE_RULES`]), when no Python site rule held.
//! 4. **A label** (NVTX range or annotation range) or annotated name, by word ([`LABEL_RULES`]);
//!    NCCL's own ranges (`nccl…`) are not read: NCCL leaves them open over the program's own
//!    allocations (seen on the H200 in `samples/h200/nccl-stages`).
//! 5. **Lifetime** ([`Lifetime`]): made before the first step and never freed → weights; its
//!    line keeps tensors of two or more earlier steps → KV cache (it grows); its line keeps the
//!    previous step's tensors, replaced each step → recurrent state; made in the current step →
//!    activations.
//! 6. **Kernels and forwards** ([`ACTIVATION_RULES`]): fla's and FlashAttention's Python entry
//!    points, `torch.nn.functional`, a module's forward (`torch/nn/modules/module.py`
//!    `_call_impl`) → activations.
//! 7. What no rule covers is [`Category::Unnamed`], grouped by its innermost Python line
//!    ([`site_of`]), never by a C++ allocator frame.
//!
//! Bytes no tensor holds are counted by arithmetic, never by rule: the caching allocator's
//! reserve (a segment's bytes minus its live tensors', with its largest free block), the context
//! and loaded modules (total − free − traced at a failure, or NVML's figure for the process minus
//! the traced bytes when live), other processes (other traced processes on the device, NVML's
//! other processes).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

mod moment;
pub use moment::{At, MomentKind, breakdown_at, categorise_stack, first_failure, moments, peak};

/// What a byte is for. The names ([`Category::key`]) are those of `report --json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// The model's parameters and buffers.
    Weights,
    /// Attention keys and values kept between steps.
    KvCache,
    /// Recurrent state kept between steps (GDN / mamba conv and SSM state).
    State,
    /// Tensors live only within a step.
    Activations,
    /// A serving engine's static input and output buffers.
    EngineBuffers,
    /// Memory held by CUDA graphs (their private pools).
    CudaGraphs,
    /// NCCL's buffers and communicators' workspaces.
    Communication,
    /// Autotuning scratch (Triton's benchmark cache flush, candidates' copies).
    Autotune,
    /// Reserved by the caching allocator, not allocated to any tensor.
    AllocatorReserve,
    /// The CUDA context, loaded modules and libraries' own state (cuBLAS workspaces).
    Context,
    /// Other processes on the device.
    OtherProcess,
    /// What no rule covers.
    Unnamed,
}

impl Category {
    /// Every category, in stacking order.
    pub const ALL: [Category; 12] = [
        Category::Weights,
        Category::KvCache,
        Category::State,
        Category::Activations,
        Category::EngineBuffers,
        Category::CudaGraphs,
        Category::Communication,
        Category::Autotune,
        Category::AllocatorReserve,
        Category::Context,
        Category::OtherProcess,
        Category::Unnamed,
    ];

    /// The name in `report --json` (`kv_cache`).
    pub fn key(self) -> &'static str {
        match self {
            Category::Weights => "weights",
            Category::KvCache => "kv_cache",
            Category::State => "state",
            Category::Activations => "activations",
            Category::EngineBuffers => "engine_buffers",
            Category::CudaGraphs => "cuda_graphs",
            Category::Communication => "communication",
            Category::Autotune => "autotune",
            Category::AllocatorReserve => "allocator_reserve",
            Category::Context => "context",
            Category::OtherProcess => "other_process",
            Category::Unnamed => "unnamed",
        }
    }

    /// The name a person reads (`KV cache`).
    pub fn title(self) -> &'static str {
        match self {
            Category::Weights => "weights",
            Category::KvCache => "KV cache",
            Category::State => "recurrent state",
            Category::Activations => "activations",
            Category::EngineBuffers => "engine buffers",
            Category::CudaGraphs => "CUDA graphs",
            Category::Communication => "communication",
            Category::Autotune => "autotuning",
            Category::AllocatorReserve => "allocator reserve",
            Category::Context => "context and modules",
            Category::OtherProcess => "other processes",
            Category::Unnamed => "unnamed",
        }
    }

    /// Its position in [`Category::ALL`] (the stacking order).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name shown ([`Category::title`]).
    pub fn name(self) -> &'static str {
        self.title()
    }

    /// The category of a `report --json` name or a title, if any.
    pub fn parse(s: &str) -> Option<Category> {
        Category::ALL
            .into_iter()
            .find(|c| c.key().eq_ignore_ascii_case(s) || c.title().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.title())
    }
}

/// One Python frame: `co_filename`, the function (a qualified name where recorded), the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyFrame<'a> {
    /// The file, a path.
    pub file: &'a str,
    /// The function.
    pub function: &'a str,
    /// The line (0 unknown).
    pub line: u32,
}

/// One native frame: the module's path or name, and the symbol where one was resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NativeFrame<'a> {
    /// The module (`libnccl.so.2`, a path, or a name with a note after it).
    pub module: &'a str,
    /// The symbol, demangled, if resolved.
    pub symbol: Option<&'a str>,
}

/// What the allocation's lifetime says, computed by [`Steps`] (or given by a caller that knows
/// the program's steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Lifetime {
    /// Nothing known.
    #[default]
    Unknown,
    /// Made before the first step (in an earlier phase of the program) and never freed since.
    Persistent,
    /// Made in an earlier phase that freed almost all it made (under a tenth of its allocations
    /// are live): what a warm-up or a one-off computation left behind, not the model's state
    /// (PyTorch's 32 MiB cuBLAS workspace after the warm-up matmul in `samples/h200/torch-oom`).
    Leftover,
    /// Its line keeps tensors made in `steps` (≥ 2) earlier steps: it grows step by step.
    Accumulating {
        /// Earlier steps its line still has tensors of.
        steps: u32,
    },
    /// Its line keeps `per_step` (≥ 2: one per layer) tensors of the previous step and replaces
    /// them each step.
    Carried {
        /// Tensors of the previous step its line keeps.
        per_step: u32,
    },
    /// Made in the previous step, the only one its line keeps: a local variable not yet dropped.
    Lingering,
    /// Made `steps_ago` (≥ 2) steps ago, the only step its line keeps tensors of.
    Kept {
        /// Steps since.
        steps_ago: u32,
    },
    /// Made in the current step.
    WithinStep,
}

/// Plain facts about one allocation or tensor.
#[derive(Debug, Clone, Default)]
pub struct Facts<'a> {
    /// Bytes.
    pub bytes: u64,
    /// Python frames, innermost first (the probe's own included or not: both are skipped).
    pub python: Vec<PyFrame<'a>>,
    /// Native frames, innermost first.
    pub native: Vec<NativeFrame<'a>>,
    /// The NVTX or annotation range it was made in.
    pub label: Option<&'a str>,
    /// Its annotated name (`vramtrace_annotate`), if any.
    pub name: Option<&'a str>,
    /// What its lifetime says.
    pub lifetime: Lifetime,
    /// Made inside a CUDA graph's private pool (known from a capture range).
    pub in_graph_pool: bool,
}

/// How a frame rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Anywhere in the stack, before any site rule.
    Enclosing,
    /// The innermost matching frame decides.
    Site,
}

/// Where a rule's file must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathMatch {
    /// The path ends with this (at a `/` boundary).
    Suffix(&'static str),
    /// The path has this folder (`a/b` matches `…/a/b/…`).
    Dir(&'static str),
    /// Any file.
    Any,
}

/// One rule over Python frames.
#[derive(Debug, Clone, Copy)]
pub struct FrameRule {
    path: PathMatch,
    /// Functions it covers (a plain name, or `Class.method` matched against a qualified name);
    /// empty: every function of the file.
    functions: &'static [&'static str],
    scope: Scope,
    /// The category.
    pub category: Category,
    /// The upstream code it was read from (`file:function`).
    pub source: &'static str,
}

const fn site(
    path: PathMatch,
    functions: &'static [&'static str],
    category: Category,
    source: &'static str,
) -> FrameRule {
    FrameRule {
        path,
        functions,
        scope: Scope::Site,
        category,
        source,
    }
}

const fn enclosing(
    path: PathMatch,
    functions: &'static [&'static str],
    category: Category,
    source: &'static str,
) -> FrameRule {
    FrameRule {
        path,
        functions,
        scope: Scope::Enclosing,
        category,
        source,
    }
}

use Category as C;
use PathMatch::{Any, Dir, Suffix};

/// The rules over Python frames, in the order they are tried at each frame; each cites the
/// upstream code it was read from.
pub const FRAME_RULES: &[FrameRule] = &[
    // Triton's autotuner benchmarks each candidate with do_bench, which first allocates a
    // 256 MiB buffer it zeroes between runs to flush L2
    // (triton/backends/nvidia/driver.py:get_empty_cache_for_benchmark, line 761 in triton 3.6
    // on the H200; triton/testing.py:do_bench; triton/runtime/autotuner.py:_bench).
    enclosing(
        Any,
        &["get_empty_cache_for_benchmark"],
        C::Autotune,
        "triton/backends/nvidia/driver.py:get_empty_cache_for_benchmark",
    ),
    enclosing(
        Suffix("triton/testing.py"),
        &["do_bench", "do_bench_cudagraph"],
        C::Autotune,
        "triton/testing.py:do_bench",
    ),
    enclosing(
        Suffix("triton/runtime/autotuner.py"),
        &["_bench", "benchmark"],
        C::Autotune,
        "triton/runtime/autotuner.py:_bench",
    ),
    enclosing(
        Suffix("torch/_inductor/runtime/benchmarking.py"),
        &[],
        C::Autotune,
        "torch/_inductor/runtime/benchmarking.py",
    ),
    // CUDA graph capture: what is allocated while capturing lands in the graph's private pool
    // and stays there (vllm/v1/worker/gpu_model_runner.py:capture_model → _capture_cudagraphs;
    // vllm/compilation/cuda_graph.py:CUDAGraphWrapper.__call__ captures inside
    // torch.cuda.graph; sglang/srt/model_executor/cuda_graph_runner.py:CudaGraphRunner.capture;
    // torch/cuda/graphs.py:graph.__enter__ and make_graphed_callables).
    enclosing(
        Suffix("vllm/v1/worker/gpu_model_runner.py"),
        &["capture_model", "_capture_cudagraphs"],
        C::CudaGraphs,
        "vllm/v1/worker/gpu_model_runner.py:capture_model",
    ),
    enclosing(
        Suffix("vllm/compilation/cuda_graph.py"),
        &[],
        C::CudaGraphs,
        "vllm/compilation/cuda_graph.py:CUDAGraphWrapper.__call__",
    ),
    enclosing(
        Suffix("sglang/srt/model_executor/cuda_graph_runner.py"),
        &["capture", "capture_one_batch_size"],
        C::CudaGraphs,
        "sglang/srt/model_executor/cuda_graph_runner.py:CudaGraphRunner.capture",
    ),
    enclosing(
        Suffix("torch/cuda/graphs.py"),
        &[],
        C::CudaGraphs,
        "torch/cuda/graphs.py:graph.__enter__",
    ),
    // transformers' continuous batching: the paged cache's key and value tensors, one pair per
    // layer of a group, made in the constructor (generation/continuous_batching/cache.py:
    // PagedAttentionCache.__init__, lines 251/252 in transformers 5.17 on the H200) ...
    site(
        Suffix("continuous_batching/cache.py"),
        &["__init__"],
        C::KvCache,
        "transformers/generation/continuous_batching/cache.py:PagedAttentionCache.__init__",
    ),
    // ... and the engine's static input/output tensors, sized for the largest batch once
    // (generation/continuous_batching/input_outputs.py:ContinuousBatchingIOs._setup_static_tensors).
    site(
        Suffix("continuous_batching/input_outputs.py"),
        &["_setup_static_tensors", "__init__"],
        C::EngineBuffers,
        "transformers/generation/continuous_batching/input_outputs.py:_setup_static_tensors",
    ),
    // transformers' caches (cache_utils.py): a linear-attention layer's conv and recurrent
    // states (LinearAttentionCacheLayerMixin.update_conv_state / update_recurrent_state);
    // everything else the file allocates is keys and values (DynamicLayer.update grows them
    // with torch.cat, StaticLayer.lazy_initialization preallocates them).
    site(
        Suffix("transformers/cache_utils.py"),
        &["update_conv_state", "update_recurrent_state"],
        C::State,
        "transformers/cache_utils.py:LinearAttentionCacheLayerMixin.update_recurrent_state",
    ),
    site(
        Suffix("transformers/cache_utils.py"),
        &[],
        C::KvCache,
        "transformers/cache_utils.py:DynamicLayer.update",
    ),
    // transformers' loading: the warm-up reserves the weights' bytes in the caching allocator
    // before loading (modeling_utils.py:caching_allocator_warmup); the loader and the
    // conversion of checkpoints (core_model_loading.py), and the model's own initialisation.
    site(
        Suffix("transformers/modeling_utils.py"),
        &[
            "caching_allocator_warmup",
            "from_pretrained",
            "_load_pretrained_model",
            "load_shard_file",
            "_load_state_dict_into_meta_model",
            "_load_parameter_into_model",
            "_move_missing_keys_from_meta_to_device",
            "_move_missing_keys_from_meta_to_cpu",
            "_initialize_missing_keys",
            "initialize_weights",
            "_init_weights",
            "smart_apply",
            "tie_weights",
            "post_init",
            "to",
            "cuda",
        ],
        C::Weights,
        "transformers/modeling_utils.py:PreTrainedModel.from_pretrained",
    ),
    site(
        Suffix("transformers/core_model_loading.py"),
        &[],
        C::Weights,
        "transformers/core_model_loading.py:convert_and_load_state_dict_in_model",
    ),
    site(
        Dir("transformers/quantizers"),
        &[],
        C::Weights,
        "transformers/quantizers",
    ),
    site(
        Suffix("accelerate/utils/modeling.py"),
        &["set_module_tensor_to_device"],
        C::Weights,
        "accelerate/utils/modeling.py:set_module_tensor_to_device",
    ),
    site(
        Suffix("safetensors/torch.py"),
        &[],
        C::Weights,
        "safetensors/torch.py:load_file",
    ),
    // vLLM (v1): the KV cache's raw tensors, then their views per layer (mamba layers' state
    // shares those tensors) (vllm/v1/worker/gpu_model_runner.py:_allocate_kv_cache_tensors,
    // _reshape_kv_cache_tensors, initialize_kv_cache); the runner's persistent buffers and the
    // input batch (gpu_model_runner.py:GPUModelRunner.__init__, _make_buffer;
    // vllm/v1/worker/gpu_input_batch.py:InputBatch.__init__; vllm/v1/utils.py:CpuGpuBuffer);
    // the weights (vllm/model_executor/model_loader/*, the layers' create_weights and
    // process_weights_after_loading, the models' constructors and load_weights).
    site(
        Suffix("vllm/v1/worker/gpu_model_runner.py"),
        &[
            "_allocate_kv_cache_tensors",
            "_reshape_kv_cache_tensors",
            "initialize_kv_cache_tensors",
            "initialize_kv_cache",
        ],
        C::KvCache,
        "vllm/v1/worker/gpu_model_runner.py:_allocate_kv_cache_tensors",
    ),
    site(
        Suffix("vllm/v1/worker/gpu_model_runner.py"),
        &["__init__", "_make_buffer"],
        C::EngineBuffers,
        "vllm/v1/worker/gpu_model_runner.py:GPUModelRunner.__init__",
    ),
    site(
        Suffix("vllm/v1/worker/gpu_input_batch.py"),
        &["__init__"],
        C::EngineBuffers,
        "vllm/v1/worker/gpu_input_batch.py:InputBatch.__init__",
    ),
    site(
        Suffix("vllm/v1/utils.py"),
        &["__init__"],
        C::EngineBuffers,
        "vllm/v1/utils.py:CpuGpuBuffer.__init__",
    ),
    site(
        Dir("vllm/model_executor/model_loader"),
        &[],
        C::Weights,
        "vllm/model_executor/model_loader/default_loader.py:load_weights",
    ),
    site(
        Dir("vllm/model_executor/layers"),
        &[
            "create_weights",
            "process_weights_after_loading",
            "weight_loader",
        ],
        C::Weights,
        "vllm/model_executor/layers/linear.py:create_weights",
    ),
    site(
        Dir("vllm/model_executor/models"),
        &["__init__", "load_weights"],
        C::Weights,
        "vllm/model_executor/models:__init__",
    ),
    site(
        Dir("vllm/distributed/device_communicators"),
        &[],
        C::Communication,
        "vllm/distributed/device_communicators",
    ),
    // SGLang (python/sglang/srt/mem_cache/memory_pool.py): the request-to-token table
    // (ReqToTokenPool.__init__), mamba states (MambaPool.__init__), and the token-to-KV pools'
    // buffers (MHATokenToKVPool._create_buffers, MLATokenToKVPool._create_buffers). A function
    // name without its class falls to the KV pools.
    site(
        Suffix("sglang/srt/mem_cache/memory_pool.py"),
        &["ReqToTokenPool.__init__"],
        C::EngineBuffers,
        "sglang/srt/mem_cache/memory_pool.py:ReqToTokenPool.__init__",
    ),
    site(
        Suffix("sglang/srt/mem_cache/memory_pool.py"),
        &["MambaPool.__init__"],
        C::State,
        "sglang/srt/mem_cache/memory_pool.py:MambaPool.__init__",
    ),
    site(
        Suffix("sglang/srt/mem_cache/memory_pool.py"),
        &[],
        C::KvCache,
        "sglang/srt/mem_cache/memory_pool.py:MHATokenToKVPool._create_buffers",
    ),
    // SGLang's graph runner keeps static input buffers for the largest captured batch
    // (sglang/srt/model_executor/cuda_graph_runner.py:CudaGraphRunner.__init__).
    site(
        Suffix("sglang/srt/model_executor/cuda_graph_runner.py"),
        &["__init__"],
        C::EngineBuffers,
        "sglang/srt/model_executor/cuda_graph_runner.py:CudaGraphRunner.__init__",
    ),
    site(
        Dir("sglang/srt/model_loader"),
        &[],
        C::Weights,
        "sglang/srt/model_loader/loader.py:load_model",
    ),
    site(
        Dir("sglang/srt/distributed/device_communicators"),
        &[],
        C::Communication,
        "sglang/srt/distributed/device_communicators",
    ),
    // PyTorch: a module's constructor creates its parameters (torch/nn/modules/linear.py:
    // Linear.__init__, reset_parameters), moving a model moves them (module.py:Module._apply
    // behind .to() and .cuda()), torch/nn/init.py fills them.
    site(
        Dir("torch/nn/modules"),
        &[
            "__init__",
            "reset_parameters",
            "_apply",
            "to",
            "cuda",
            "_load_from_state_dict",
        ],
        C::Weights,
        "torch/nn/modules/linear.py:Linear.__init__",
    ),
    site(
        Suffix("torch/nn/init.py"),
        &[],
        C::Weights,
        "torch/nn/init.py",
    ),
    site(
        Suffix("torch/nn/parameter.py"),
        &[],
        C::Weights,
        "torch/nn/parameter.py:Parameter.__new__",
    ),
];

/// The rules after lifetime, innermost frame first: kernels' intermediates and outputs, and
/// whatever a module's forward makes, are activations. After lifetime, because a kernel's
/// output can be kept: fla's `final_state` is the recurrent state a model carries
/// (fla/ops/common/chunk_delta_h.py:chunk_gated_delta_rule_fwd_h, line 723 in fla 0.6.0 on the
/// H200, `samples/h200/torch-oom`).
pub const ACTIVATION_RULES: &[FrameRule] = &[
    // fla's chunked kernels (fla/ops/gated_delta_rule/chunk.py:chunk_gated_delta_rule_fwd and
    // the ops it calls), its modules (fla/modules/l2norm.py), and vLLM's vendored copy
    // (vllm/model_executor/layers/fla/ops).
    site(
        Dir("fla/ops"),
        &[],
        C::Activations,
        "fla/ops/gated_delta_rule/chunk.py:chunk_gated_delta_rule_fwd",
    ),
    site(
        Dir("fla/modules"),
        &[],
        C::Activations,
        "fla/modules/l2norm.py:l2norm_fwd",
    ),
    // FlashAttention's Python entry points (flash_attn/flash_attn_interface.py:
    // _flash_attn_varlen_forward) allocate the output and softmax_lse.
    site(
        Dir("flash_attn"),
        &[],
        C::Activations,
        "flash_attn/flash_attn_interface.py:_flash_attn_varlen_forward",
    ),
    site(
        Suffix("torch/nn/functional.py"),
        &[],
        C::Activations,
        "torch/nn/functional.py",
    ),
    // Whatever a module's forward makes (torch/nn/modules/module.py:Module._call_impl).
    site(
        Suffix("torch/nn/modules/module.py"),
        &["_call_impl", "_wrapped_call_impl", "__call__"],
        C::Activations,
        "torch/nn/modules/module.py:Module._call_impl",
    ),
];

/// Where a native rule looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NativeMatch {
    /// The module's file name starts with this (`libnccl`).
    Module(&'static str),
    /// The symbol contains this.
    Symbol(&'static str),
}

/// One rule over native frames.
#[derive(Debug, Clone, Copy)]
pub struct NativeRule {
    what: NativeMatch,
    /// The category.
    pub category: Category,
    /// The upstream code it was read from.
    pub source: &'static str,
}

/// The rules over native frames, tried at each frame, innermost first.
pub const NATIVE_RULES: &[NativeRule] = &[
    // NCCL allocates its buffers and proxies itself (cuMemCreate / cuMemMap and
    // cuMemHostAlloc from libnccl.so.2 under ncclCommInitRankConfig on the H200,
    // samples/h200/nccl-stages).
    NativeRule {
        what: NativeMatch::Module("libnccl"),
        category: C::Communication,
        source: "nccl src/init.cc:ncclCommInitRankConfig",
    },
    // cuBLAS and cuDNN allocate their handles' workspaces themselves (cuMemAlloc_v2 of 64 MiB
    // from libcublas.so.13 at the first matmul on the H200, samples/h200/torch-oom).
    NativeRule {
        what: NativeMatch::Module("libcublas"),
        category: C::Context,
        source: "cuBLAS handle workspace",
    },
    NativeRule {
        what: NativeMatch::Module("libcudnn"),
        category: C::Context,
        source: "cuDNN handle workspace",
    },
    // llama.cpp: the per-operator scratch pools (ggml/src/ggml-cuda/ggml-cuda.cu:
    // ggml_cuda_pool_leg::alloc, ggml_cuda_pool_vmm::alloc); the KV cache and recurrent memory
    // constructors (src/llama-kv-cache.cpp:llama_kv_cache::llama_kv_cache,
    // src/llama-memory-recurrent.cpp:llama_memory_recurrent::llama_memory_recurrent); the
    // model's tensors (src/llama-model.cpp:llama_model::load_tensors); the compute buffers the
    // scheduler reserves (ggml/src/ggml-backend.cpp:ggml_backend_sched_reserve,
    // ggml/src/ggml-alloc.c:ggml_gallocr_reserve_n).
    NativeRule {
        what: NativeMatch::Symbol("ggml_cuda_pool_"),
        category: C::Activations,
        source: "ggml-cuda.cu:ggml_cuda_pool_vmm::alloc",
    },
    NativeRule {
        what: NativeMatch::Symbol("llama_kv_cache"),
        category: C::KvCache,
        source: "llama-kv-cache.cpp:llama_kv_cache::llama_kv_cache",
    },
    NativeRule {
        what: NativeMatch::Symbol("llama_memory_recurrent"),
        category: C::State,
        source: "llama-memory-recurrent.cpp:llama_memory_recurrent::llama_memory_recurrent",
    },
    NativeRule {
        what: NativeMatch::Symbol("load_tensors"),
        category: C::Weights,
        source: "llama-model.cpp:llama_model::load_tensors",
    },
    NativeRule {
        what: NativeMatch::Symbol("ggml_backend_sched_reserve"),
        category: C::Activations,
        source: "ggml-backend.cpp:ggml_backend_sched_reserve",
    },
    NativeRule {
        what: NativeMatch::Symbol("ggml_gallocr_reserve"),
        category: C::Activations,
        source: "ggml-alloc.c:ggml_gallocr_reserve_n",
    },
];

/// Words of a label or annotated name, lower-cased, by substring, in the order tried.
pub const LABEL_RULES: &[(&str, Category)] = &[
    ("weight", C::Weights),
    ("embed", C::Weights),
    ("lm_head", C::Weights),
    ("param", C::Weights),
    ("_state", C::State),
    ("recurrent", C::State),
    ("conv_state", C::State),
    ("kv", C::KvCache),
    ("cache", C::KvCache),
    ("graph", C::CudaGraphs),
    ("autotune", C::Autotune),
    // The workload's stand-in for memory someone else holds (a smaller card).
    ("ballast", C::OtherProcess),
    ("capacity", C::OtherProcess),
];

/// What a verdict rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Evidence {
    /// A rule over Python frames held at this frame.
    Frame {
        /// The frame's file (base name and the folders the rule names are enough to read it).
        file: String,
        /// Its function.
        function: String,
        /// Its line.
        line: u32,
        /// The upstream code the rule was read from.
        rule: &'static str,
    },
    /// A rule over native frames held at this frame.
    Native {
        /// The module.
        module: String,
        /// The symbol, if resolved.
        #[serde(skip_serializing_if = "Option::is_none")]
        symbol: Option<String>,
        /// The upstream code the rule was read from.
        rule: &'static str,
    },
    /// A word of the label or annotated name.
    Label {
        /// The label or name.
        text: String,
        /// The word found.
        word: &'static str,
    },
    /// The lifetime.
    Lifetime {
        /// What it was.
        lifetime: Lifetime,
    },
    /// Made inside a CUDA graph's private pool.
    GraphPool,
    /// Segment bytes minus the live tensors' bytes in them.
    SegmentArithmetic {
        /// Segments.
        segments: usize,
        /// Their bytes.
        segment_bytes: u64,
        /// Bytes of the live tensors inside them.
        tensor_bytes: u64,
        /// The largest free block of any of them.
        largest_free_block: u64,
    },
    /// Total − free − traced at a failure.
    Untraced {
        /// The device's memory.
        total: u64,
        /// Free, as the driver said.
        free: u64,
        /// Traced bytes on the device (every traced process).
        traced: u64,
    },
    /// NVML's figure for a process (minus what was traced of it).
    Nvml {
        /// The process.
        pid: u32,
        /// NVML's bytes for it.
        used: u64,
        /// Traced bytes of it.
        traced: u64,
    },
    /// Traced by another process.
    OtherTraced {
        /// The process.
        pid: u32,
    },
    /// No rule: its innermost Python line (or native frame).
    Site {
        /// `file.py:LINE function`, or a native frame.
        site: String,
    },
    /// An otherwise unnamed line whose bytes are what the config gives for the category
    /// (within [`CONFIG_TOLERANCE`]).
    ConfigSize {
        /// The line (`file.py:LINE function`).
        site: String,
        /// What the config gives.
        expected: u64,
        /// Its bytes.
        observed: u64,
    },
    /// The config's figure against the observed bytes (added to a row).
    Config {
        /// What the config gives.
        expected: u64,
        /// What was seen.
        observed: u64,
    },
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Evidence::Frame {
                file,
                function,
                line,
                rule,
            } => write!(f, "frame {}:{line} {function} (rule: {rule})", base(file)),
            Evidence::Native {
                module,
                symbol,
                rule,
            } => match symbol {
                Some(s) => write!(f, "native {s} in {} (rule: {rule})", base(module)),
                None => write!(f, "native frame in {} (rule: {rule})", base(module)),
            },
            Evidence::Label { text, word: "" } => write!(
                f,
                "label {text:?} (no word of a category: the program's own tensor)"
            ),
            Evidence::Label { text, word } => write!(f, "label {text:?} ({word:?})"),
            Evidence::Lifetime { lifetime } => match lifetime {
                Lifetime::Unknown => f.write_str("lifetime unknown"),
                Lifetime::Persistent => {
                    f.write_str("lifetime: made before the first step, never freed")
                }
                Lifetime::Leftover => {
                    f.write_str("lifetime: left by an earlier phase that freed almost all it made")
                }
                Lifetime::Accumulating { steps } => write!(
                    f,
                    "lifetime: its line keeps tensors of {steps} earlier steps (grows)"
                ),
                Lifetime::Carried { per_step } => write!(
                    f,
                    "lifetime: its line keeps {per_step} tensors of the previous step, replaced \
                     each step"
                ),
                Lifetime::Lingering => f.write_str(
                    "lifetime: made in the previous step, the only one its line keeps (a \
                     variable not yet dropped)",
                ),
                Lifetime::Kept { steps_ago } => write!(
                    f,
                    "lifetime: made {steps_ago} steps ago, the only one its line keeps"
                ),
                Lifetime::WithinStep => f.write_str("lifetime: made in the current step"),
            },
            Evidence::GraphPool => f.write_str("inside a CUDA graph's pool"),
            Evidence::SegmentArithmetic {
                segments,
                segment_bytes,
                tensor_bytes,
                largest_free_block,
            } => write!(
                f,
                "{segments} segments of {} − {} of live tensors; largest free block {}",
                fmt_bytes(*segment_bytes),
                fmt_bytes(*tensor_bytes),
                fmt_bytes(*largest_free_block)
            ),
            Evidence::Untraced {
                total,
                free,
                traced,
            } => write!(
                f,
                "untraced: total {} − free {} − traced {} (the driver's figures at the failure)",
                fmt_bytes(*total),
                fmt_bytes(*free),
                fmt_bytes(*traced)
            ),
            Evidence::Nvml { pid, used, traced } => write!(
                f,
                "NVML: process {pid} uses {}, {} traced",
                fmt_bytes(*used),
                fmt_bytes(*traced)
            ),
            Evidence::OtherTraced { pid } => write!(f, "traced in process {pid}"),
            Evidence::Site { site } if site == "no frames" => {
                f.write_str("no rule; no frames recorded")
            }
            Evidence::Site { site } => write!(f, "no rule; at {site}"),
            Evidence::ConfigSize {
                site,
                expected,
                observed,
            } => write!(
                f,
                "at {site}: {}, the config gives {} (size against the config)",
                fmt_bytes(*observed),
                fmt_bytes(*expected)
            ),
            Evidence::Config { expected, observed } => write!(
                f,
                "the config gives {}, {} seen",
                fmt_bytes(*expected),
                fmt_bytes(*observed)
            ),
        }
    }
}

use vramtrace_models::units::fmt_bytes;

fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A category and what it rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The category.
    pub category: Category,
    /// What it rests on.
    pub evidence: Evidence,
}

/// True when `file` is `path`'s file (suffix at a `/` boundary) or under its folder.
fn path_matches(m: PathMatch, file: &str) -> bool {
    match m {
        PathMatch::Any => true,
        PathMatch::Suffix(s) => {
            file == s
                || file
                    .strip_suffix(s)
                    .is_some_and(|head| head.ends_with('/') || head.ends_with('\\'))
        }
        PathMatch::Dir(d) => file.starts_with(&format!("{d}/")) || file.contains(&format!("/{d}/")),
    }
}

/// True when the recorded function (a plain `co_name` or a qualified `co_qualname`) is one of
/// `functions`: a plain pattern matches the name or the last part of a qualified name; a
/// `Class.method` pattern matches only a qualified name ending with it.
fn function_matches(functions: &[&str], function: &str) -> bool {
    if functions.is_empty() {
        return true;
    }
    let last = function.rsplit('.').next().unwrap_or(function);
    functions.iter().any(|p| {
        if p.contains('.') {
            function == *p || function.ends_with(&format!(".{p}"))
        } else {
            last == *p
        }
    })
}

impl FrameRule {
    fn holds(&self, f: &PyFrame<'_>) -> bool {
        path_matches(self.path, f.file) && function_matches(self.functions, f.function)
    }

    fn verdict(&self, f: &PyFrame<'_>) -> Verdict {
        Verdict {
            category: self.category,
            evidence: Evidence::Frame {
                file: f.file.to_string(),
                function: f.function.to_string(),
                line: f.line,
                rule: self.source,
            },
        }
    }
}

impl NativeRule {
    fn holds(&self, f: &NativeFrame<'_>) -> bool {
        match self.what {
            NativeMatch::Module(m) => base(f.module).starts_with(m),
            NativeMatch::Symbol(s) => f.symbol.is_some_and(|sym| sym.contains(s)),
        }
    }
}

/// True for a Python frame that never says where a program allocated: the probe's own
/// callbacks (`vramtrace_torch.py`) and PyTorch's dispatch of them (`torch/_utils.py`
/// `fire_callbacks`).
pub fn is_probe_frame(file: &str, function: &str) -> bool {
    base(file) == "vramtrace_torch.py"
        || (function == "fire_callbacks" && is_torch_file(file) && base(file) == "_utils.py")
}

/// The part of a path inside its installation: after the last `site-packages/` or
/// `dist-packages/`, else the whole path.
fn package_path(file: &str) -> &str {
    ["site-packages/", "dist-packages/"]
        .iter()
        .filter_map(|m| file.rfind(m).map(|i| &file[i + m.len()..]))
        .min_by_key(|s| s.len())
        .unwrap_or(file)
}

/// True for a file of the `torch` package. Only the path inside the installation counts: a
/// virtual environment at `/opt/torch/.venv` (the H200's) does not make Triton's or fla's files
/// PyTorch's.
pub fn is_torch_file(file: &str) -> bool {
    let p = package_path(file);
    if p.len() != file.len() {
        return p.starts_with("torch/");
    }
    p.starts_with("torch/") || p.contains("/torch/")
}

/// True for PyTorch's machinery (a file of the `torch` package outside `torch/nn`): operator
/// dispatch, `torch/_ops.py`, `torch/autograd/function.py`, `torch/_dynamo`; never the line
/// that allocated.
pub fn is_torch_machinery(file: &str) -> bool {
    is_torch_file(file) && !package_path(file).contains("torch/nn/")
}

/// True for a native frame of an allocator or runtime (PyTorch's caching allocator and empty
/// tensor factories, PyTorch's libraries where no symbol was resolved, the CUDA runtime and
/// driver, the Python interpreter, the C library): never what an unnamed allocation is grouped by.
pub fn is_allocator_frame(f: &NativeFrame<'_>) -> bool {
    let m = base(f.module);
    let sym = f.symbol.unwrap_or("");
    m.starts_with("libcudart")
        || m.starts_with("libcuda.")
        || m.starts_with("libc10")
        || (m.starts_with("libtorch") && f.symbol.is_none())
        || m.starts_with("libvramtrace")
        || m.starts_with("python")
        || m.starts_with("libpython")
        || m.starts_with("libc.so")
        || m.starts_with("ld-linux")
        || sym.contains("CUDACachingAllocator")
        || sym.contains("at::detail::empty")
        || sym.starts_with("at::empty")
        || sym.starts_with("at::native::empty")
        || sym.starts_with("c10::")
}

/// The line an unnamed allocation is grouped by: its innermost Python frame that is neither the
/// probe's nor PyTorch's machinery (`file.py:LINE function`); with only machinery, the
/// innermost Python frame; with no Python frame, the innermost native frame that is not an
/// allocator's ([`is_allocator_frame`]); with only those, `no Python frame (MODULE)` after the
/// outermost native frame's module; else `"no frames"`.
pub fn site_of(python: &[PyFrame<'_>], native: &[NativeFrame<'_>]) -> String {
    let own: Vec<&PyFrame<'_>> = python
        .iter()
        .filter(|f| !is_probe_frame(f.file, f.function))
        .collect();
    if let Some(f) = own
        .iter()
        .find(|f| !is_torch_machinery(f.file))
        .or(own.first())
    {
        return format!("{}:{} {}", base(f.file), f.line, f.function);
    }
    match native.iter().find(|f| !is_allocator_frame(f)) {
        Some(f) => match f.symbol {
            Some(s) => format!("{s} ({})", base(f.module)),
            None => base(f.module).to_string(),
        },
        None if native.is_empty() => "no frames".to_string(),
        None => format!(
            "no Python frame ({})",
            base(native[native.len() - 1].module)
        ),
    }
}

/// Categorises one allocation or tensor by the rules in the module's order.
pub fn categorise(facts: &Facts<'_>) -> Verdict {
    let python: Vec<&PyFrame<'_>> = facts
        .python
        .iter()
        .filter(|f| !is_probe_frame(f.file, f.function))
        .collect();
    // 1. Enclosing frames.
    for f in &python {
        if let Some(r) = FRAME_RULES
            .iter()
            .find(|r| r.scope == Scope::Enclosing && r.holds(f))
        {
            return r.verdict(f);
        }
    }
    if facts.in_graph_pool {
        return Verdict {
            category: C::CudaGraphs,
            evidence: Evidence::GraphPool,
        };
    }
    // 2. Site frames, innermost first.
    for f in &python {
        if let Some(r) = FRAME_RULES
            .iter()
            .find(|r| r.scope == Scope::Site && r.holds(f))
        {
            return r.verdict(f);
        }
    }
    // 3. Native frames, innermost first.
    for f in &facts.native {
        if let Some(r) = NATIVE_RULES.iter().find(|r| r.holds(f)) {
            return Verdict {
                category: r.category,
                evidence: Evidence::Native {
                    module: f.module.to_string(),
                    symbol: f.symbol.map(str::to_string),
                    rule: r.source,
                },
            };
        }
    }
    // 4. Label, then annotated name.
    for text in [facts.label, facts.name].into_iter().flatten() {
        let lower = text.to_ascii_lowercase();
        if lower.is_empty() || lower.starts_with("nccl") {
            continue;
        }
        if let Some((word, c)) = LABEL_RULES.iter().find(|(w, _)| lower.contains(w)) {
            return Verdict {
                category: *c,
                evidence: Evidence::Label {
                    text: text.to_string(),
                    word,
                },
            };
        }
    }
    // 5. Lifetime.
    let by_lifetime = match facts.lifetime {
        Lifetime::Persistent => Some(C::Weights),
        Lifetime::Accumulating { .. } => Some(C::KvCache),
        Lifetime::Carried { .. } => Some(C::State),
        Lifetime::Lingering => Some(C::Activations),
        Lifetime::WithinStep | Lifetime::Kept { .. } | Lifetime::Leftover | Lifetime::Unknown => {
            None
        }
    };
    if let Some(c) = by_lifetime {
        return Verdict {
            category: c,
            evidence: Evidence::Lifetime {
                lifetime: facts.lifetime,
            },
        };
    }
    // 6. A module's forward; made in the current step.
    for f in &python {
        if let Some(r) = ACTIVATION_RULES.iter().find(|r| r.holds(f)) {
            return r.verdict(f);
        }
    }
    if facts.lifetime == Lifetime::WithinStep {
        return Verdict {
            category: C::Activations,
            evidence: Evidence::Lifetime {
                lifetime: Lifetime::WithinStep,
            },
        };
    }
    // A label no word of which is known still says the program named it: an activation, as the
    // live view always said.
    if let Some(text) = [facts.label, facts.name]
        .into_iter()
        .flatten()
        .find(|t| !t.is_empty() && !t.to_ascii_lowercase().starts_with("nccl"))
    {
        return Verdict {
            category: C::Activations,
            evidence: Evidence::Label {
                text: text.to_string(),
                word: "",
            },
        };
    }
    Verdict {
        category: C::Unnamed,
        evidence: Evidence::Site {
            site: site_of(&facts.python, &facts.native),
        },
    }
}

/// Steps of a program, found from its Python frames, and the lifetime of what is live.
///
/// - A tensor's **phase** is its two outermost Python frames that are not PyTorch's machinery
///   (`<module>:115` → `main:108`): loading, a warm-up and the run are different phases; a
///   thread is its own phase.
/// - A phase's **steps**: a step begins each time the phase's first allocating line allocates
///   again (a prefill chunk's first tensor, a decode step's input).
/// - At a moment: a tensor of a phase that ended before the latest phase began is
///   [`Lifetime::Persistent`] when the latest phase steps (a loop) — [`Lifetime::Leftover`] when
///   under a tenth of that phase's allocations are live — else unknown; a tensor of a phase
///   without steps is unknown. Otherwise, by its line within its phase: a line that keeps
///   tensors of two or more earlier steps is [`Lifetime::Accumulating`] (its current step's
///   tensors are the newest entries); a line whose tensors are never freed within their own
///   step but in the next one (replaced), or that keeps two or more of the previous step before
///   any was freed, is [`Lifetime::Carried`] (a state per layer; the current step's are the
///   replacements); otherwise a line's only tensor of the previous step is
///   [`Lifetime::Lingering`] (a local variable the loop has not reassigned yet:
///   `samples/h200/torch-oom`'s `vc`), an older one [`Lifetime::Kept`], the current step's
///   [`Lifetime::WithinStep`].
#[derive(Debug, Clone, Default)]
pub struct Steps {
    phases: Vec<PhaseState>,
    latest: Option<usize>,
    seq: u64,
    live: BTreeMap<u64, LiveEntry>,
    /// Per phase and line: frees within the tensor's own step, frees in the step after.
    frees: BTreeMap<(usize, Arc<str>), (u32, u32)>,
    /// Phase index by phase key.
    phase_index: HashMap<String, usize>,
    /// Phase and line by the caller's key for a stack ([`Steps::alloc_keyed`]).
    by_stack: HashMap<u64, Option<(usize, Arc<str>)>>,
}

#[derive(Debug, Clone)]
struct PhaseState {
    /// Allocations made in it, and of those still live.
    made: u32,
    live: u32,
    first_site: String,
    step: u32,
    first_seq: u64,
    last_seq: u64,
}

#[derive(Debug, Clone)]
struct LiveEntry {
    phase: usize,
    step: u32,
    site: Arc<str>,
}

/// The phase key of a Python stack (innermost first): its two outermost frames that are not
/// the probe's or PyTorch's machinery, as `file:line`.
pub fn phase_of(python: &[PyFrame<'_>]) -> String {
    let own: Vec<&PyFrame<'_>> = python
        .iter()
        .filter(|f| !is_probe_frame(f.file, f.function) && !is_torch_machinery(f.file))
        .collect();
    own.iter()
        .rev()
        .take(2)
        .map(|f| format!("{}:{}", f.file, f.line))
        .collect::<Vec<_>>()
        .join(" > ")
}

impl Steps {
    /// Nothing seen.
    pub fn new() -> Steps {
        Steps::default()
    }

    /// A tensor (or allocation) `id` made with these Python frames (without any, it is not
    /// followed: its lifetime stays unknown).
    pub fn alloc(&mut self, id: u64, python: &[PyFrame<'_>]) {
        let found = self.place(python);
        self.record(id, found);
    }

    /// As [`Steps::alloc`], with the phase and line of `stack` (any key that names one Python
    /// stack, such as a process's stack id) worked out once: `python` is read only the first
    /// time a key is seen.
    pub fn alloc_keyed<'a>(
        &mut self,
        id: u64,
        stack: u64,
        python: impl FnOnce() -> Vec<PyFrame<'a>>,
    ) {
        let found = match self.by_stack.get(&stack) {
            Some(f) => f.clone(),
            None => {
                let f = self.place(&python());
                self.by_stack.insert(stack, f.clone());
                f
            }
        };
        self.record(id, found);
    }

    /// The phase (created if new) and the line of a stack; `None` without a Python frame.
    fn place(&mut self, python: &[PyFrame<'_>]) -> Option<(usize, Arc<str>)> {
        if python.iter().all(|f| is_probe_frame(f.file, f.function)) {
            return None;
        }
        let key = phase_of(python);
        let site: Arc<str> = site_of(python, &[]).into();
        let phase = match self.phase_index.get(&key) {
            Some(&i) => i,
            None => {
                self.phases.push(PhaseState {
                    made: 0,
                    live: 0,
                    first_site: site.to_string(),
                    step: 0,
                    first_seq: 0,
                    last_seq: 0,
                });
                let i = self.phases.len() - 1;
                self.phase_index.insert(key, i);
                i
            }
        };
        Some((phase, site))
    }

    fn record(&mut self, id: u64, found: Option<(usize, Arc<str>)>) {
        self.free(id);
        let Some((phase, site)) = found else {
            return;
        };
        self.seq += 1;
        let p = &mut self.phases[phase];
        if p.first_seq == 0 {
            p.first_seq = self.seq;
        } else if *p.first_site == *site {
            p.step += 1;
        }
        p.last_seq = self.seq;
        p.made += 1;
        p.live += 1;
        self.latest = Some(phase);
        let step = p.step;
        self.live.insert(id, LiveEntry { phase, step, site });
    }

    /// `id` freed.
    pub fn free(&mut self, id: u64) {
        if let Some(e) = self.live.remove(&id) {
            let ph = &mut self.phases[e.phase];
            ph.live = ph.live.saturating_sub(1);
            let now = ph.step;
            let f = self.frees.entry((e.phase, e.site)).or_default();
            if now == e.step {
                f.0 += 1;
            } else if now == e.step + 1 {
                f.1 += 1;
            }
        }
    }

    /// The current step of the latest phase (0 before any).
    pub fn step(&self) -> u32 {
        self.latest.map_or(0, |p| self.phases[p].step)
    }

    /// The lifetime of every live id, now.
    pub fn lifetimes(&self) -> BTreeMap<u64, Lifetime> {
        let Some(latest) = self.latest else {
            return BTreeMap::new();
        };
        // Before the first step means before a loop: only when the latest phase steps.
        let stepping = self.phases[latest].step > 0;
        let began = self.phases[latest].first_seq;
        // Per phase and line: the earlier steps it still holds tensors of, how many of the
        // previous step, and how many live in all.
        let mut held: BTreeMap<(usize, &str), (BTreeSet<u32>, u32, u32)> = BTreeMap::new();
        for e in self.live.values() {
            let now = self.phases[e.phase].step;
            let k = held.entry((e.phase, &*e.site)).or_default();
            k.2 += 1;
            if e.step < now {
                k.0.insert(e.step);
                if e.step + 1 == now {
                    k.1 += 1;
                }
            }
        }
        self.live
            .iter()
            .map(|(id, e)| {
                let p = &self.phases[e.phase];
                let l = if p.last_seq < began {
                    if !stepping {
                        Lifetime::Unknown
                    } else if u64::from(p.live) * 10 < u64::from(p.made) {
                        Lifetime::Leftover
                    } else {
                        Lifetime::Persistent
                    }
                } else if p.step == 0 {
                    // A phase without steps (straight-line code) says nothing.
                    Lifetime::Unknown
                } else {
                    let (steps, previous, live) = held
                        .get(&(e.phase, &*e.site))
                        .map_or((0, 0, 0), |(s, n, l)| (s.len() as u32, *n, *l));
                    let (within, next) = self
                        .frees
                        .get(&(e.phase, e.site.clone()))
                        .copied()
                        .unwrap_or_default();
                    // Replaced each step, never freed within one: a state per layer.
                    let carried = within == 0 && (next > 0 || previous >= 2) && steps <= 1;
                    match steps {
                        n if n >= 2 => Lifetime::Accumulating { steps: n },
                        _ if carried && (steps == 1 || next > 0) => {
                            Lifetime::Carried { per_step: live }
                        }
                        1 if previous == 1 && e.step + 1 == p.step => Lifetime::Lingering,
                        _ if e.step < p.step => Lifetime::Kept {
                            steps_ago: p.step - e.step,
                        },
                        _ => Lifetime::WithinStep,
                    }
                };
                (*id, l)
            })
            .collect()
    }
}

/// One tensor live at the moment (PyTorch's caching allocator), inside some allocation.
#[derive(Debug, Clone)]
pub struct LiveTensor<'a> {
    /// Its address.
    pub ptr: u64,
    /// The facts (`bytes` the block's).
    pub facts: Facts<'a>,
}

/// One driver allocation live at the moment, of the process the moment is about.
#[derive(Debug, Clone)]
pub struct LiveAllocation<'a> {
    /// Its address (a segment's base); for a physical handle not mapped, the handle.
    pub ptr: u64,
    /// A physical handle (`cuMemCreate`) not mapped anywhere: bytes, but no address a tensor
    /// could be at.
    pub handle: bool,
    /// The facts (`bytes` the allocation's).
    pub facts: Facts<'a>,
}

/// The device's memory at the moment, as the driver said at a failure (`cuMemGetInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Total bytes.
    pub total: u64,
    /// Free bytes.
    pub free: u64,
}

/// NVML's per-process figure (live).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlProcess {
    /// The process.
    pub pid: u32,
    /// Bytes NVML says it uses on the device.
    pub used: u64,
    /// Bytes traced of it on the device (0 if not traced).
    pub traced: u64,
}

/// Bytes expected from the model's config (`vramtrace-models`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expectations {
    /// The weights' bytes.
    pub weight_bytes: Option<u64>,
    /// KV bytes per token (every layer) and the tokens cached at the moment.
    pub kv: Option<(u64, u64)>,
    /// The recurrent state's bytes (every GDN layer, every sequence).
    pub state_bytes: Option<u64>,
}

impl Expectations {
    /// What `cfg` gives on one rank of `tp`: its weights in `format`
    /// (`vramtrace_models::weight_bytes`), its KV cache in `kv_dtype` for `tokens` cached tokens
    /// (`kv_cache_per_token`; none for 0 tokens), and its GDN state for `seqs` sequences with a bf16 conv state and
    /// an fp32 recurrent state (`gdn_state_per_seq`; fla's `final_state` is fp32).
    pub fn from_config(
        cfg: &vramtrace_models::ModelConfig,
        tp: u64,
        format: vramtrace_models::WeightFormat,
        kv_dtype: vramtrace_models::DType,
        tokens: u64,
        seqs: u64,
    ) -> Result<Expectations, vramtrace_models::ModelError> {
        use vramtrace_models::DType;
        let weights = vramtrace_models::weight_bytes(cfg, format, tp)?;
        let kv = vramtrace_models::kv_cache_per_token(cfg, tp, kv_dtype)?;
        let state = vramtrace_models::gdn_state_per_seq(cfg, tp, DType::BF16, DType::F32, 0)?;
        Ok(Expectations {
            weight_bytes: Some(weights.bytes),
            kv: (tokens > 0).then_some((kv.bytes_per_token, tokens)),
            state_bytes: (state.layers > 0).then(|| state.bytes_per_seq.saturating_mul(seqs)),
        })
    }
}

/// How close a group's bytes must be to the config's figure for the config to name it: 2 %
/// (the caching allocator's 512-byte rounding and a few buffers, not another component).
pub const CONFIG_TOLERANCE: f64 = 0.02;

fn near(observed: u64, expected: u64) -> bool {
    expected > 0 && (observed as f64 - expected as f64).abs() <= CONFIG_TOLERANCE * expected as f64
}

/// The live set at one moment, for one process and device.
#[derive(Debug, Clone, Default)]
pub struct MomentFacts<'a> {
    /// The process.
    pub pid: u32,
    /// Its live driver allocations on the device (segments and the rest).
    pub allocations: Vec<LiveAllocation<'a>>,
    /// Its live tensors (PyTorch's caching allocator); with none recorded, every allocation is
    /// categorised by its own facts.
    pub tensors: Vec<LiveTensor<'a>>,
    /// True when the process reported tensors at all (then an allocation holding none, made by
    /// PyTorch's allocator, is reserve, not something its frames name).
    pub tensors_recorded: bool,
    /// Other traced processes' live bytes on the device, by pid.
    pub other_traced: Vec<(u32, u64)>,
    /// The device's memory, at a failure.
    pub device: Option<DeviceMemory>,
    /// NVML's processes on the device, live (this one included).
    pub nvml: Vec<NvmlProcess>,
    /// What the config expects.
    pub expect: Expectations,
}

/// One line of evidence under a row: bytes and count resting on the same thing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EvidenceLine {
    /// What it rests on.
    pub evidence: Evidence,
    /// Bytes.
    pub bytes: u64,
    /// Allocations or tensors (0 for arithmetic).
    pub count: usize,
}

/// One category at a moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The category.
    pub category: Category,
    /// Its bytes.
    pub bytes: u64,
    /// Allocations or tensors in it (0 for arithmetic rows).
    pub count: usize,
    /// What it rests on, most bytes first ('unnamed': one line per Python line).
    pub evidence: Vec<EvidenceLine>,
}

/// The rows of a moment, summing to [`Breakdown::total`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    /// Rows with bytes, in [`Category::ALL`] order.
    pub rows: Vec<Row>,
    /// Their sum: the device's used memory (total − free) at a failure, else the traced bytes
    /// plus what NVML adds.
    pub total: u64,
    /// The process's segments (PyTorch's caching allocator), each with its reserve and largest
    /// free block, most reserve first.
    pub segments: Vec<SegmentReserve>,
}

impl Breakdown {
    /// The bytes of a category (0 when it has no row).
    pub fn bytes(&self, c: Category) -> u64 {
        self.rows
            .iter()
            .find(|r| r.category == c)
            .map_or(0, |r| r.bytes)
    }
}

/// One segment's reserve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentReserve {
    /// Base address.
    pub base: u64,
    /// Bytes.
    pub size: u64,
    /// Bytes of live tensors inside.
    pub tensor_bytes: u64,
    /// Reserved but unallocated.
    pub reserve: u64,
    /// Its largest gap between live tensors.
    pub largest_free_block: u64,
}

/// True for an allocation PyTorch's caching allocator made (a segment): a native frame in
/// `libc10_cuda`.
fn is_pytorch_segment(f: &Facts<'_>) -> bool {
    f.native
        .iter()
        .any(|n| base(n.module).starts_with("libc10_cuda"))
}

#[derive(Default)]
struct Acc {
    bytes: u64,
    count: usize,
    lines: Vec<EvidenceLine>,
}

impl Acc {
    fn add(&mut self, evidence: Evidence, bytes: u64, count: usize) {
        self.bytes += bytes;
        self.count += count;
        // Evidence lines group by what they rest on, the line of a frame aside (a rule over a
        // function holds at many lines of it) and the size of a config check.
        let key = group_key(&evidence);
        match self
            .lines
            .iter_mut()
            .find(|l| group_key(&l.evidence) == key)
        {
            Some(l) => {
                l.bytes += bytes;
                l.count += count;
            }
            None => self.lines.push(EvidenceLine {
                evidence,
                bytes,
                count,
            }),
        }
    }
}

fn group_key(e: &Evidence) -> String {
    match e {
        Evidence::Frame {
            file,
            function,
            line,
            ..
        } => format!("frame {file} {function} {line}"),
        Evidence::Native { module, symbol, .. } => {
            format!(
                "native {} {}",
                base(module),
                symbol.as_deref().unwrap_or("")
            )
        }
        Evidence::Label { text, .. } => format!("label {text}"),
        other => format!("{other:?}"),
    }
}

/// Every byte of the moment in a row. Tensors are placed in the allocations holding them
/// (the last allocation starting at or below the tensor's address, if the tensor starts inside
/// it); an allocation's bytes not in its tensors are [`Category::AllocatorReserve`] when it is a
/// PyTorch segment in a process that reported tensors; other allocations are categorised by
/// their own facts. At a failure, the device's used memory not traced is
/// [`Category::Context`] (NVML's processes split it, when known); other traced processes are
/// [`Category::OtherProcess`].
pub fn categorise_moment(m: &MomentFacts<'_>) -> Breakdown {
    let mut acc: BTreeMap<Category, Acc> = BTreeMap::new();
    let mut allocs: Vec<&LiveAllocation<'_>> = m.allocations.iter().filter(|a| !a.handle).collect();
    allocs.sort_by_key(|a| a.ptr);
    let mut inside: Vec<Vec<&LiveTensor<'_>>> = vec![Vec::new(); allocs.len()];
    let mut outside_tensors: Vec<&LiveTensor<'_>> = Vec::new();
    for t in &m.tensors {
        let i = allocs.partition_point(|a| a.ptr <= t.ptr);
        match i.checked_sub(1) {
            Some(i) if t.ptr < allocs[i].ptr.saturating_add(allocs[i].facts.bytes) => {
                inside[i].push(t)
            }
            _ => outside_tensors.push(t),
        }
    }
    // Tensors: every one by its own facts.
    for t in &m.tensors {
        let v = categorise(&t.facts);
        acc.entry(v.category)
            .or_default()
            .add(v.evidence, t.facts.bytes, 1);
    }
    // Allocations: a segment's reserve, or the allocation by its own facts.
    let mut segments = Vec::new();
    let mut traced = 0u64;
    for (a, ts) in allocs.iter().zip(inside.iter_mut()) {
        traced += a.facts.bytes;
        let segment = m.tensors_recorded && (!ts.is_empty() || is_pytorch_segment(&a.facts));
        if !segment {
            let v = categorise(&a.facts);
            acc.entry(v.category)
                .or_default()
                .add(v.evidence, a.facts.bytes, 1);
            continue;
        }
        ts.sort_by_key(|t| t.ptr);
        let end = a.ptr.saturating_add(a.facts.bytes);
        let mut cursor = a.ptr;
        let mut largest = 0u64;
        let mut tensor_bytes = 0u64;
        for t in ts.iter() {
            largest = largest.max(t.ptr.saturating_sub(cursor));
            let t_end = t.ptr.saturating_add(t.facts.bytes).min(end);
            tensor_bytes += t_end.saturating_sub(t.ptr);
            cursor = cursor.max(t_end);
        }
        largest = largest.max(end.saturating_sub(cursor));
        segments.push(SegmentReserve {
            base: a.ptr,
            size: a.facts.bytes,
            tensor_bytes,
            reserve: a.facts.bytes.saturating_sub(tensor_bytes),
            largest_free_block: largest,
        });
    }
    // Handles not mapped: bytes by their own facts.
    for a in m.allocations.iter().filter(|a| a.handle) {
        traced += a.facts.bytes;
        let v = categorise(&a.facts);
        acc.entry(v.category)
            .or_default()
            .add(v.evidence, a.facts.bytes, 1);
    }
    // Tensors in no live allocation were counted above but hold no traced driver bytes of
    // theirs (made before recording began): the traced total counts them.
    traced += outside_tensors.iter().map(|t| t.facts.bytes).sum::<u64>();
    let seg_bytes: u64 = segments.iter().map(|s| s.size).sum();
    let seg_tensor_bytes: u64 = segments.iter().map(|s| s.tensor_bytes).sum();
    let reserve: u64 = segments.iter().map(|s| s.reserve).sum();
    if reserve > 0 {
        acc.entry(C::AllocatorReserve).or_default().add(
            Evidence::SegmentArithmetic {
                segments: segments.len(),
                segment_bytes: seg_bytes,
                tensor_bytes: seg_tensor_bytes,
                largest_free_block: segments
                    .iter()
                    .map(|s| s.largest_free_block)
                    .max()
                    .unwrap_or(0),
            },
            reserve,
            0,
        );
    }
    // Other traced processes.
    let mut others = 0u64;
    for &(pid, bytes) in &m.other_traced {
        if bytes > 0 {
            others += bytes;
            acc.entry(C::OtherProcess)
                .or_default()
                .add(Evidence::OtherTraced { pid }, bytes, 0);
        }
    }
    let mut total = traced + others;
    // Untraced: the driver's figures at a failure, else NVML's per process.
    if let Some(d) = m.device {
        let used = d.total.saturating_sub(d.free);
        let untraced = used.saturating_sub(traced + others);
        if untraced > 0 {
            acc.entry(C::Context).or_default().add(
                Evidence::Untraced {
                    total: d.total,
                    free: d.free,
                    traced: traced + others,
                },
                untraced,
                0,
            );
        }
        total = total.max(used);
    } else {
        for p in &m.nvml {
            let extra = p.used.saturating_sub(p.traced);
            if extra == 0 {
                continue;
            }
            let c = if p.pid == m.pid || p.traced > 0 {
                C::Context
            } else {
                C::OtherProcess
            };
            acc.entry(c).or_default().add(
                Evidence::Nvml {
                    pid: p.pid,
                    used: p.used,
                    traced: p.traced,
                },
                extra,
                0,
            );
            total += extra;
        }
    }
    // The config names an unnamed line whose bytes are its weights', KV cache's or state's.
    if let Some(un) = acc.get_mut(&C::Unnamed) {
        let mut moved: Vec<(Category, EvidenceLine, u64)> = Vec::new();
        let targets = [
            (C::Weights, m.expect.weight_bytes),
            (C::KvCache, m.expect.kv.map(|(p, t)| p.saturating_mul(t))),
            (C::State, m.expect.state_bytes),
        ];
        un.lines.retain(|l| {
            let hit = targets
                .iter()
                .find(|(_, e)| e.is_some_and(|e| near(l.bytes, e)));
            match hit {
                Some(&(c, Some(expected))) => {
                    moved.push((
                        c,
                        EvidenceLine {
                            evidence: l.evidence.clone(),
                            bytes: l.bytes,
                            count: l.count,
                        },
                        expected,
                    ));
                    false
                }
                _ => true,
            }
        });
        for (c, line, expected) in moved {
            let un = acc.get_mut(&C::Unnamed).expect("moved from it");
            un.bytes -= line.bytes;
            un.count -= line.count;
            if un.bytes == 0 && un.lines.is_empty() {
                acc.remove(&C::Unnamed);
            }
            let site = match &line.evidence {
                Evidence::Site { site } => site.clone(),
                other => other.to_string(),
            };
            acc.entry(c).or_default().add(
                Evidence::ConfigSize {
                    site,
                    expected,
                    observed: line.bytes,
                },
                line.bytes,
                line.count,
            );
        }
    }
    // The config's figures beside the rows they check.
    if let Some(w) = m.expect.weight_bytes {
        let observed = acc.get(&C::Weights).map_or(0, |a| a.bytes);
        acc.entry(C::Weights).or_default().lines.push(EvidenceLine {
            evidence: Evidence::Config {
                expected: w,
                observed,
            },
            bytes: 0,
            count: 0,
        });
    }
    if let Some((per_token, tokens)) = m.expect.kv {
        let observed = acc.get(&C::KvCache).map_or(0, |a| a.bytes);
        acc.entry(C::KvCache).or_default().lines.push(EvidenceLine {
            evidence: Evidence::Config {
                expected: per_token.saturating_mul(tokens),
                observed,
            },
            bytes: 0,
            count: 0,
        });
    }
    if let Some(expected) = m.expect.state_bytes {
        let observed = acc.get(&C::State).map_or(0, |a| a.bytes);
        acc.entry(C::State).or_default().lines.push(EvidenceLine {
            evidence: Evidence::Config { expected, observed },
            bytes: 0,
            count: 0,
        });
    }
    segments.sort_by(|a, b| b.reserve.cmp(&a.reserve).then(a.base.cmp(&b.base)));
    let rows = Category::ALL
        .into_iter()
        .filter_map(|c| {
            let a = acc.remove(&c)?;
            let mut lines = a.lines;
            lines.sort_by_key(|l| std::cmp::Reverse(l.bytes));
            Some(Row {
                category: c,
                bytes: a.bytes,
                count: a.count,
                evidence: lines,
            })
        })
        .collect();
    Breakdown {
        rows,
        total,
        segments,
    }
}

/// Evidence lines shown under a row; the rest are summed in one line.
pub const SHOWN_EVIDENCE: usize = 6;

/// The rows as text, one per category with its bytes, share of the whole and count, and under
/// each what it rests on (at most [`SHOWN_EVIDENCE`] lines, the rest summed), every line
/// starting with `indent`.
pub fn render(b: &Breakdown, indent: &str) -> String {
    let mut out = String::new();
    let share = |x: u64| {
        if b.total == 0 {
            0.0
        } else {
            x as f64 * 100.0 / b.total as f64
        }
    };
    for r in &b.rows {
        let count = if r.count > 0 {
            format!(" in {}", r.count)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{indent}{:<18} {:>11} {:>6.2}%{count}\n",
            r.category.title(),
            fmt_bytes(r.bytes),
            share(r.bytes)
        ));
        let mut rest = (0u64, 0usize, 0usize);
        for (i, l) in r.evidence.iter().enumerate() {
            if i >= SHOWN_EVIDENCE {
                rest = (rest.0 + l.bytes, rest.1 + l.count, rest.2 + 1);
                continue;
            }
            let what = if l.bytes == 0 && l.count == 0 {
                String::new()
            } else if l.count > 0 {
                format!("{} in {}: ", fmt_bytes(l.bytes), l.count)
            } else {
                format!("{}: ", fmt_bytes(l.bytes))
            };
            out.push_str(&format!("{indent}    {what}{}\n", l.evidence));
        }
        if rest.2 > 0 {
            out.push_str(&format!(
                "{indent}    {} in {} under {} more lines\n",
                fmt_bytes(rest.0),
                rest.1,
                rest.2
            ));
        }
    }
    out.push_str(&format!(
        "{indent}{:<18} {:>11}\n",
        "total",
        fmt_bytes(b.total)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const VENV: &str = "/opt/torch/.venv/lib/python3.12/site-packages";

    fn py<'a>(file: &'a str, function: &'a str, line: u32) -> PyFrame<'a> {
        PyFrame {
            file,
            function,
            line,
        }
    }

    fn facts<'a>(bytes: u64, python: Vec<PyFrame<'a>>) -> Facts<'a> {
        Facts {
            bytes,
            python,
            ..Default::default()
        }
    }

    fn frame_evidence(v: &Verdict) -> (String, u32) {
        match &v.evidence {
            Evidence::Frame { file, line, .. } => (base(file).to_string(), *line),
            other => panic!("not a frame: {other:?}"),
        }
    }

    #[test]
    fn the_venv_under_opt_torch_is_not_pytorch() {
        let triton = format!("{VENV}/triton/backends/nvidia/driver.py");
        assert!(!is_torch_file(&triton));
        assert!(is_torch_file(&format!("{VENV}/torch/_ops.py")));
        assert!(is_torch_machinery(&format!("{VENV}/torch/_ops.py")));
        assert!(!is_torch_machinery(&format!(
            "{VENV}/torch/nn/modules/linear.py"
        )));
        assert!(is_torch_machinery("/work/pytorch/torch/_tensor.py"));
        assert!(!is_torch_machinery("/tmp/site/fla/ops/common/chunk_o.py"));
        assert!(is_probe_frame(
            &format!("{VENV}/torch/_utils.py"),
            "fire_callbacks"
        ));
        assert!(is_probe_frame(
            "/x/probes/python/vramtrace_torch.py",
            "on_alloc"
        ));
    }

    #[test]
    fn triton_benchmark_flush_is_autotune_whatever_called_it() {
        // The H200's stack of the 256 MiB flush buffer (samples/h200/torch-oom, stack 26).
        let driver = format!("{VENV}/triton/backends/nvidia/driver.py");
        let testing = format!("{VENV}/triton/testing.py");
        let tuner = format!("{VENV}/triton/runtime/autotuner.py");
        let module = format!("{VENV}/torch/nn/modules/module.py");
        let f = facts(
            256 * MIB,
            vec![
                py(&driver, "get_empty_cache_for_benchmark", 761),
                py(&testing, "do_bench", 152),
                py(&tuner, "_bench", 164),
                py("/tmp/site/fla/ops/utils/cache.py", "run", 378),
                py("/tmp/site/fla/modules/norm/l2norm.py", "l2norm_fwd", 136),
                py(&module, "_call_impl", 1775),
            ],
        );
        let v = categorise(&f);
        assert_eq!(v.category, Category::Autotune);
        assert_eq!(frame_evidence(&v), ("driver.py".to_string(), 761));
    }

    #[test]
    fn transformers_serve_frames() {
        let cb = "/venv/site-packages/transformers/generation/continuous_batching";
        let cache = format!("{cb}/cache.py");
        let io = format!("{cb}/input_outputs.py");
        let mu = "/venv/site-packages/transformers/modeling_utils.py";
        let kv = categorise(&facts(
            564 * MIB,
            vec![
                py(&cache, "__init__", 251),
                py(&format!("{cb}/continuous_api.py"), "_generation_step", 900),
            ],
        ));
        assert_eq!(kv.category, Category::KvCache);
        assert_eq!(frame_evidence(&kv), ("cache.py".to_string(), 251));
        let io_v = categorise(&facts(
            MIB,
            vec![
                py(&io, "_setup_static_tensors", 180),
                py(&io, "__init__", 120),
            ],
        ));
        assert_eq!(io_v.category, Category::EngineBuffers);
        let w = categorise(&facts(
            784 * MIB,
            vec![py(mu, "caching_allocator_warmup", 4800)],
        ));
        assert_eq!(w.category, Category::Weights);
        // The paged cache's update reads keys and values into new tensors: not the cache.
        let read = categorise(&facts(MIB, vec![py(&cache, "update", 400)]));
        assert_eq!(read.category, Category::Unnamed);
    }

    #[test]
    fn module_init_is_weights_and_forward_is_activations_below_caches() {
        let linear = format!("{VENV}/torch/nn/modules/linear.py");
        let module = format!("{VENV}/torch/nn/modules/module.py");
        let model = "/venv/site-packages/transformers/models/qwen3_5/modeling_qwen3_5.py";
        let w = categorise(&facts(
            50 * MIB,
            vec![
                py(&format!("{VENV}/torch/_ops.py"), "__call__", 10),
                py(&linear, "__init__", 106),
                py(model, "__init__", 300),
                py(
                    "/venv/site-packages/transformers/modeling_utils.py",
                    "from_pretrained",
                    4500,
                ),
            ],
        ));
        assert_eq!(w.category, Category::Weights);
        assert_eq!(frame_evidence(&w), ("linear.py".to_string(), 106));
        let cache_utils = "/venv/site-packages/transformers/cache_utils.py";
        let kv = categorise(&facts(
            MIB,
            vec![
                py(cache_utils, "update", 120),
                py(model, "forward", 500),
                py(&module, "_call_impl", 1775),
            ],
        ));
        assert_eq!(kv.category, Category::KvCache);
        let st = categorise(&facts(
            MIB,
            vec![
                py(cache_utils, "update_conv_state", 800),
                py(model, "forward", 600),
                py(&module, "_call_impl", 1775),
            ],
        ));
        assert_eq!(st.category, Category::State);
        let act = categorise(&facts(
            MIB,
            vec![py(model, "forward", 510), py(&module, "_call_impl", 1775)],
        ));
        assert_eq!(act.category, Category::Activations);
        // A recurrent state made by fla inside the forward, carried between steps: lifetime
        // decides before the forward rule.
        let mut carried = facts(
            3 * MIB,
            vec![
                py(
                    "/tmp/site/fla/ops/common/chunk_delta_h.py",
                    "chunk_gated_delta_rule_fwd_h",
                    722,
                ),
                py(model, "forward", 610),
                py(&module, "_call_impl", 1775),
            ],
        );
        carried.lifetime = Lifetime::Carried { per_step: 12 };
        assert_eq!(categorise(&carried).category, Category::State);
    }

    #[test]
    fn native_rules_nccl_cublas_llama_cpp() {
        let c10d = format!("{VENV}/torch/distributed/distributed_c10d.py");
        let nccl = Facts {
            bytes: 2 * MIB,
            python: vec![py(&c10d, "_new_process_group_helper", 2253)],
            native: vec![
                NativeFrame {
                    module: "libnccl.so.2 (not the traced file)",
                    symbol: None,
                },
                NativeFrame {
                    module: "libtorch_cuda.so",
                    symbol: None,
                },
            ],
            label: Some("ncclCommInitRankConfig"),
            ..Default::default()
        };
        let v = categorise(&nccl);
        assert_eq!(v.category, Category::Communication);
        // NCCL's range over the program's own tensor is not read (samples/h200/nccl-stages).
        let user = Facts {
            bytes: 1 << 30,
            python: vec![py("/work/nccl_stages.py", "main", 67)],
            label: Some("ncclCommInitRankConfig"),
            ..Default::default()
        };
        let v = categorise(&user);
        assert_eq!(v.category, Category::Unnamed);
        assert_eq!(
            v.evidence,
            Evidence::Site {
                site: "nccl_stages.py:67 main".to_string()
            }
        );
        let cublas = Facts {
            bytes: 64 * MIB,
            python: vec![py("/work/torch_prefill.py", "prefill", 55)],
            native: vec![
                NativeFrame {
                    module: "libcublas.so.13 (not the traced file)",
                    symbol: None,
                },
                NativeFrame {
                    module: "libtorch_cuda.so (not the traced file)",
                    symbol: None,
                },
            ],
            ..Default::default()
        };
        assert_eq!(categorise(&cublas).category, Category::Context);
        let llama = |sym: &'static str| Facts {
            bytes: MIB,
            native: vec![
                NativeFrame {
                    module: "libcudart.so.12",
                    symbol: Some("cudaMalloc"),
                },
                NativeFrame {
                    module: "libggml-cuda.so",
                    symbol: Some("ggml_backend_cuda_buffer_type_alloc_buffer"),
                },
                NativeFrame {
                    module: "libllama.so",
                    symbol: Some(sym),
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            categorise(&llama("llama_kv_cache::llama_kv_cache(llama_model const&)")).category,
            Category::KvCache
        );
        assert_eq!(
            categorise(&llama("llama_model::load_tensors(llama_model_loader&)")).category,
            Category::Weights
        );
        assert_eq!(
            categorise(&llama("llama_memory_recurrent::llama_memory_recurrent()")).category,
            Category::State
        );
        let unknown = categorise(&llama("my_own_function()"));
        assert_eq!(unknown.category, Category::Unnamed);
        // Grouped by the first frame that is not an allocator's.
        assert_eq!(
            unknown.evidence,
            Evidence::Site {
                site: "ggml_backend_cuda_buffer_type_alloc_buffer (libggml-cuda.so)".to_string()
            }
        );
    }

    #[test]
    fn labels_and_their_order() {
        let l = |label: &'static str| Facts {
            bytes: 1,
            label: Some(label),
            ..Default::default()
        };
        assert_eq!(
            categorise(&l("prefill/weights")).category,
            Category::Weights
        );
        assert_eq!(
            categorise(&l("prefill/kv_cache")).category,
            Category::KvCache
        );
        assert_eq!(
            categorise(&l("gdn/recurrent_state")).category,
            Category::State
        );
        assert_eq!(
            categorise(&l("prefill/capacity")).category,
            Category::OtherProcess
        );
        let other = categorise(&l("prefill/gdn"));
        assert_eq!(other.category, Category::Activations);
        assert_eq!(categorise(&Facts::default()).category, Category::Unnamed);
        // A site rule beats a label.
        let mut f = l("prefill/weights");
        f.python = vec![py(
            "/v/site-packages/transformers/cache_utils.py",
            "update",
            1,
        )];
        assert_eq!(categorise(&f).category, Category::KvCache);
    }

    #[test]
    fn qualified_functions_tell_sglang_pools_apart() {
        let pool = "/v/site-packages/sglang/srt/mem_cache/memory_pool.py";
        assert_eq!(
            categorise(&facts(1, vec![py(pool, "MambaPool.__init__", 10)])).category,
            Category::State
        );
        assert_eq!(
            categorise(&facts(1, vec![py(pool, "ReqToTokenPool.__init__", 10)])).category,
            Category::EngineBuffers
        );
        assert_eq!(
            categorise(&facts(1, vec![py(pool, "_create_buffers", 10)])).category,
            Category::KvCache
        );
        // A plain `__init__` cannot say which pool: the KV pools, the file's main business.
        assert_eq!(
            categorise(&facts(1, vec![py(pool, "__init__", 10)])).category,
            Category::KvCache
        );
    }

    #[test]
    fn unnamed_groups_by_the_python_line_not_the_allocator() {
        let utils = format!("{VENV}/torch/_utils.py");
        let ops = format!("{VENV}/torch/_ops.py");
        let f = Facts {
            bytes: 1,
            python: vec![
                py("/x/vramtrace_torch.py", "on_alloc", 40),
                py(&utils, "fire_callbacks", 900),
                py(&ops, "__call__", 10),
                py("/work/app.py", "step", 12),
            ],
            native: vec![NativeFrame {
                module: "libc10_cuda.so",
                symbol: Some("c10::cuda::CUDACachingAllocator::Native::malloc"),
            }],
            ..Default::default()
        };
        assert_eq!(
            categorise(&f).evidence,
            Evidence::Site {
                site: "app.py:12 step".to_string()
            }
        );
        let native_only = Facts {
            bytes: 1,
            native: vec![
                NativeFrame {
                    module: "libtorch_cuda.so",
                    symbol: Some("at::detail::empty_generic(...)"),
                },
                NativeFrame {
                    module: "libc10_cuda.so",
                    symbol: None,
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            categorise(&native_only).evidence,
            Evidence::Site {
                site: "no Python frame (libc10_cuda.so)".to_string()
            }
        );
    }

    /// The chunked prefill of scripts/validate/torch_prefill.py, in small: weights made in
    /// `main:103`, then chunks in `main:108`, each starting at line 53; a GDN state replaced
    /// each chunk; K/V kept by every chunk; activations freed.
    #[test]
    fn steps_give_lifetimes() {
        let s = "/w/torch_prefill.py";
        let run = |line: u32| {
            vec![
                py(s, "prefill", line),
                py(s, "main", 108),
                py(s, "<module>", 115),
            ]
        };
        let mut st = Steps::new();
        st.alloc(
            1,
            &[
                py(s, "w", 33),
                py(s, "make_layers", 37),
                py(s, "main", 103),
                py(s, "<module>", 115),
            ],
        );
        // Per chunk: x (the previous x dropped after), then per layer the K/V kept, the
        // layer's state replaced, an activation freed, and `vc` reassigned (the previous one
        // dropped after); chunk 0 also keeps one tensor of line 90 for good.
        // A warm-up (main:104) that frees all but one of what it makes.
        let warm = |line: u32| vec![py(s, "prefill", line), py(s, "main", 104)];
        for i in 0..20 {
            st.alloc(50 + i, &warm(55));
            if i > 0 {
                st.free(50 + i);
            }
        }
        let mut states = [None, None];
        let mut x = None;
        let mut vc = None;
        let mut id = 100;
        let mut next = || {
            id += 1;
            id
        };
        for chunk in 0..3 {
            let n = next();
            st.alloc(n, &run(53));
            if let Some(old) = x.replace(n) {
                st.free(old);
            }
            // x = x + ...: the chunk's first x is dropped within the chunk.
            let n = next();
            st.alloc(n, &run(79));
            st.free(x.replace(n).unwrap());
            for state in &mut states {
                st.alloc(next(), &run(55));
                let n = next();
                st.alloc(n, &run(64));
                if let Some(old) = state.replace(n) {
                    st.free(old);
                }
                let n = next();
                st.alloc(n, &run(80));
                st.free(n);
                let n = next();
                st.alloc(n, &run(73));
                if let Some(old) = vc.replace(n) {
                    st.free(old);
                }
            }
            if chunk == 0 {
                st.alloc(900, &run(90));
            }
        }
        assert_eq!(st.step(), 2);
        // The fourth chunk begins and layer 0 runs up to its activation, which is live.
        st.alloc(500, &run(53));
        st.free(x.unwrap());
        st.alloc(501, &run(55));
        st.alloc(502, &run(64));
        st.free(states[0].replace(502).unwrap());
        st.alloc(503, &run(80));
        let l = st.lifetimes();
        assert_eq!(l[&1], Lifetime::Persistent);
        assert_eq!(l[&50], Lifetime::Leftover);
        // K/V: 2 per chunk, 3 chunks done, and the current chunk's.
        let kv: Vec<u64> = l
            .iter()
            .filter(|(_, v)| **v == Lifetime::Accumulating { steps: 3 })
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(kv, [103, 107, 113, 117, 123, 127, 501]);
        // Layer 1's state of chunk 3 and layer 0's replacement: carried.
        assert_eq!(states, [Some(502), Some(128)]);
        assert_eq!(l[&128], Lifetime::Carried { per_step: 2 });
        assert_eq!(l[&502], Lifetime::Carried { per_step: 2 });
        // The last `vc` of chunk 3, not yet reassigned: lingering.
        assert_eq!(vc, Some(130));
        assert_eq!(l[&130], Lifetime::Lingering);
        assert_eq!(l[&900], Lifetime::Kept { steps_ago: 3 });
        assert_eq!(l[&500], Lifetime::WithinStep);
        assert_eq!(l[&503], Lifetime::WithinStep);
        assert_eq!(l.len(), 15);
    }

    fn tensor(ptr: u64, bytes: u64, python: Vec<PyFrame<'static>>) -> LiveTensor<'static> {
        LiveTensor {
            ptr,
            facts: Facts {
                bytes,
                python,
                ..Default::default()
            },
        }
    }

    fn segment(ptr: u64, bytes: u64) -> LiveAllocation<'static> {
        LiveAllocation {
            ptr,
            handle: false,
            facts: Facts {
                bytes,
                python: vec![py("/w/app.py", "main", 1)],
                native: vec![
                    NativeFrame {
                        module: "libcudart.so.13",
                        symbol: None,
                    },
                    NativeFrame {
                        module: "libc10_cuda.so",
                        symbol: None,
                    },
                ],
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_failure_moment_sums_to_the_device_used_memory() {
        let model = "/v/site-packages/transformers/models/m/modeling_m.py";
        let linear = "/v/site-packages/torch/nn/modules/linear.py";
        let module = "/v/site-packages/torch/nn/modules/module.py";
        let mut m = MomentFacts {
            pid: 7,
            tensors_recorded: true,
            allocations: vec![
                // A 20 MiB segment: weights 4 MiB at +0, an activation 2 MiB at +8 MiB.
                segment(0x1000_0000, 20 * MIB),
                // An empty 2 MiB segment.
                segment(0x2000_0000, 2 * MIB),
                // cuBLAS's workspace.
                LiveAllocation {
                    ptr: 0x3000_0000,
                    handle: false,
                    facts: Facts {
                        bytes: 64 * MIB,
                        native: vec![NativeFrame {
                            module: "libcublas.so.13",
                            symbol: None,
                        }],
                        ..Default::default()
                    },
                },
            ],
            tensors: vec![
                tensor(0x1000_0000, 4 * MIB, vec![py(linear, "__init__", 106)]),
                tensor(
                    0x1000_0000 + 8 * MIB,
                    2 * MIB,
                    vec![py(model, "forward", 10), py(module, "_call_impl", 1775)],
                ),
                tensor(
                    0x1000_0000 + 6 * MIB,
                    MIB,
                    vec![py("/w/app.py", "step", 40)],
                ),
            ],
            other_traced: vec![(8, 100 * MIB)],
            device: Some(DeviceMemory {
                total: 1 << 30,
                free: (1 << 30) - 500 * MIB,
            }),
            expect: Expectations {
                weight_bytes: Some(4 * MIB),
                kv: None,
                state_bytes: None,
            },
            ..Default::default()
        };
        let b = categorise_moment(&m);
        assert_eq!(b.total, 500 * MIB);
        assert_eq!(b.rows.iter().map(|r| r.bytes).sum::<u64>(), 500 * MIB);
        assert_eq!(b.bytes(Category::Weights), 4 * MIB);
        assert_eq!(b.bytes(Category::Activations), 2 * MIB);
        assert_eq!(b.bytes(Category::Unnamed), MIB);
        assert_eq!(
            b.bytes(Category::Context),
            64 * MIB + (500 - 100 - 86) * MIB
        );
        assert_eq!(b.bytes(Category::OtherProcess), 100 * MIB);
        // 22 MiB of segments − 7 MiB of tensors.
        assert_eq!(b.bytes(Category::AllocatorReserve), 15 * MIB);
        assert_eq!(
            b.segments[0],
            SegmentReserve {
                base: 0x1000_0000,
                size: 20 * MIB,
                tensor_bytes: 7 * MIB,
                reserve: 13 * MIB,
                largest_free_block: 10 * MIB,
            }
        );
        assert_eq!(b.segments[1].largest_free_block, 2 * MIB);
        let unnamed = b
            .rows
            .iter()
            .find(|r| r.category == Category::Unnamed)
            .unwrap();
        assert_eq!(
            unnamed.evidence[0].evidence,
            Evidence::Site {
                site: "app.py:40 step".to_string()
            }
        );
        let weights = b
            .rows
            .iter()
            .find(|r| r.category == Category::Weights)
            .unwrap();
        assert!(weights.evidence.contains(&EvidenceLine {
            evidence: Evidence::Config {
                expected: 4 * MIB,
                observed: 4 * MIB
            },
            bytes: 0,
            count: 0
        }));
        // Without tensor records, a segment is what its own frames say.
        m.tensors.clear();
        m.tensors_recorded = false;
        let b = categorise_moment(&m);
        assert_eq!(b.bytes(Category::AllocatorReserve), 0);
        assert_eq!(b.bytes(Category::Unnamed), 22 * MIB);
        assert_eq!(b.rows.iter().map(|r| r.bytes).sum::<u64>(), 500 * MIB);
    }

    #[test]
    fn the_config_names_an_unnamed_line_of_its_size() {
        let t = |ptr: u64, bytes: u64, line: u32| {
            tensor(ptr, bytes, vec![py("/w/loader.py", "load", line)])
        };
        let m = MomentFacts {
            tensors: vec![
                // 3 × 100 MiB at line 10: the weights are 300 MiB + 1 MiB by the config.
                t(0x1_0000_0000, 100 * MIB, 10),
                t(0x2_0000_0000, 100 * MIB, 10),
                t(0x3_0000_0000, 100 * MIB, 10),
                // 8 MiB at line 20: 4096 tokens × 2 KiB.
                t(0x4_0000_0000, 8 * MIB, 20),
                // 5 MiB at line 30: nothing the config gives.
                t(0x5_0000_0000, 5 * MIB, 30),
            ],
            expect: Expectations {
                weight_bytes: Some(301 * MIB),
                kv: Some((2048, 4096)),
                state_bytes: None,
            },
            ..Default::default()
        };
        let b = categorise_moment(&m);
        assert_eq!(b.bytes(Category::Weights), 300 * MIB);
        assert_eq!(b.bytes(Category::KvCache), 8 * MIB);
        assert_eq!(b.bytes(Category::Unnamed), 5 * MIB);
        let w = b
            .rows
            .iter()
            .find(|r| r.category == Category::Weights)
            .unwrap();
        assert_eq!(w.count, 3);
        assert_eq!(
            w.evidence[0].evidence,
            Evidence::ConfigSize {
                site: "loader.py:10 load".to_string(),
                expected: 301 * MIB,
                observed: 300 * MIB,
            }
        );
        assert_eq!(b.total, 313 * MIB);
        // 2 % off is the edge: 301 MiB × 0.98 = 294.98 MiB.
        assert!(near(295 * MIB, 301 * MIB) && !near(294 * MIB, 301 * MIB));
    }

    #[test]
    fn rows_render_with_their_evidence() {
        let m = MomentFacts {
            tensors: (0..8)
                .map(|i| {
                    tensor(
                        0x1_0000_0000 + i * 0x1000_0000,
                        MIB,
                        vec![py("/w/app.py", "step", 10 + i as u32)],
                    )
                })
                .collect(),
            ..Default::default()
        };
        let text = render(&categorise_moment(&m), "  ");
        assert_eq!(
            text,
            "  unnamed               8.00 MiB 100.00% in 8\n\
             \x20     1.00 MiB in 1: no rule; at app.py:10 step\n\
             \x20     1.00 MiB in 1: no rule; at app.py:11 step\n\
             \x20     1.00 MiB in 1: no rule; at app.py:12 step\n\
             \x20     1.00 MiB in 1: no rule; at app.py:13 step\n\
             \x20     1.00 MiB in 1: no rule; at app.py:14 step\n\
             \x20     1.00 MiB in 1: no rule; at app.py:15 step\n\
             \x20     2.00 MiB in 2 under 2 more lines\n\
             \x20 total                 8.00 MiB\n"
        );
    }

    #[test]
    fn nvml_splits_the_untraced_when_live() {
        let m = MomentFacts {
            pid: 7,
            allocations: vec![LiveAllocation {
                ptr: 0x1000,
                handle: false,
                facts: Facts {
                    bytes: 10 * MIB,
                    label: Some("kv"),
                    ..Default::default()
                },
            }],
            nvml: vec![
                NvmlProcess {
                    pid: 7,
                    used: 600 * MIB,
                    traced: 10 * MIB,
                },
                NvmlProcess {
                    pid: 9,
                    used: 300 * MIB,
                    traced: 0,
                },
            ],
            ..Default::default()
        };
        let b = categorise_moment(&m);
        assert_eq!(b.bytes(Category::KvCache), 10 * MIB);
        assert_eq!(b.bytes(Category::Context), 590 * MIB);
        assert_eq!(b.bytes(Category::OtherProcess), 300 * MIB);
        assert_eq!(b.total, 900 * MIB);
    }

    #[test]
    fn category_names_are_the_reports() {
        let keys: Vec<&str> = Category::ALL.iter().map(|c| c.key()).collect();
        assert_eq!(
            keys,
            [
                "weights",
                "kv_cache",
                "state",
                "activations",
                "engine_buffers",
                "cuda_graphs",
                "communication",
                "autotune",
                "allocator_reserve",
                "context",
                "other_process",
                "unnamed"
            ]
        );
        assert_eq!(Category::parse("KV cache"), Some(Category::KvCache));
        assert_eq!(Category::parse("kv_cache"), Some(Category::KvCache));
        assert_eq!(
            serde_json::to_string(&Category::AllocatorReserve).unwrap(),
            "\"allocator_reserve\""
        );
    }
}
