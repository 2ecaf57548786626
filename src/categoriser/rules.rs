//! The rule tables: frames of the code that allocated (Python and native) and label words,
//! each rule citing the upstream code it was read from.

use super::{Category, Evidence, NativeFrame, PyFrame, Verdict, base};

/// How a frame rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
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
    pub(super) scope: Scope,
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
    // llama.cpp's CUDA backend allocates cuBLAS's workspace itself, when a stream's handle is
    // first made (ggml/src/ggml-cuda/common.cuh:1531-1545, ggml_backend_cuda_context::
    // cublas_handle(): 32 MiB from Hopper on, 4 MiB before), beside the one under libcublas.
    NativeRule {
        what: NativeMatch::Symbol("cublas_handle"),
        category: C::Context,
        source: "ggml-cuda common.cuh:cublas_handle (cuBLAS workspace)",
    },
    // ggml's CUDA pool is a caching pool: per-op scratch (flash attention's partial results,
    // the f16 copies of cuBLAS's operands) carved from memory it maps (the VMM pool) or
    // allocates (the legacy pool) and keeps between ops, so it is counted with the allocators'
    // reserves, apart from the compute buffer the scheduler reserved for the graph
    // (samples/h200/llama-bench: 10 MiB with flash attention, 516 MiB without, at -p 16384).
    NativeRule {
        what: NativeMatch::Symbol("ggml_cuda_pool_"),
        category: C::AllocatorReserve,
        source: "ggml-cuda.cu:ggml_cuda_pool_vmm::alloc (the pool's per-op scratch, kept between ops)",
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
    // A multimodal projector's weights (`--mmproj`): mtmd loads them in its own loader
    // (tools/mtmd/clip.cpp: clip_model_loader::load_tensors, ggml_backend_alloc_ctx_tensors_from_
    // buft), apart from the language model's; named so before the rule below would take them.
    NativeRule {
        what: NativeMatch::Symbol("clip_model_loader"),
        category: C::Weights,
        source: "mtmd clip.cpp:clip_model_loader::load_tensors (the mmproj)",
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
    // Names given at an attach from the Python objects holding the blocks (the probe's
    // `_name_before_attach`): transformers' continuous-batching engine's static tensors
    // (generation/continuous_batching/input_outputs.py: ContinuousBatchingIOs.
    // _setup_static_tensors: `_bulk_input_tensor`, `output_ids`, `attention_mask`, `block_table`,
    // `write_index_storage`, `read_index_storage`), before any word of their attributes' names;
    // its paged cache's keys and values (continuous_batching/cache.py: PagedAttentionCache
    // `key_cache`/`value_cache`); a module's parameters and buffers (`weights: NAME`).
    ("continuousbatchingios.", C::EngineBuffers),
    ("pagedattentioncache.", C::KvCache),
    ("key_cache", C::KvCache),
    ("value_cache", C::KvCache),
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
    pub(super) fn holds(&self, f: &PyFrame<'_>) -> bool {
        path_matches(self.path, f.file) && function_matches(self.functions, f.function)
    }

    pub(super) fn verdict(&self, f: &PyFrame<'_>) -> Verdict {
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
    pub(super) fn holds(&self, f: &NativeFrame<'_>) -> bool {
        match self.what {
            NativeMatch::Module(m) => base(f.module).starts_with(m),
            NativeMatch::Symbol(s) => f.symbol.is_some_and(|sym| sym.contains(s)),
        }
    }
}
