//! llama.cpp (the tree vendored in llama-cpp-python 0.3.36): what it allocates on the GPU when a
//! context is made, with every layer offloaded (`-ngl 99`), from the GGUF's header and the
//! flags. Written from llama.cpp's code; checked against its own log lines on the H200
//! (docs/validation.md, "llama.cpp on the H200").
//!
//! - **The model buffer** (`load_tensors: CUDA0 model buffer size`): every tensor of the file
//!   except the input embedding, which llama.cpp keeps on the host ("there is very little
//!   benefit to offloading the input layer, so always keep it on the CPU",
//!   `src/llama-model.cpp:1603-1605`), each padded to the CUDA buffer type's alignment of 128
//!   bytes (`ggml/src/ggml-cuda/ggml-cuda.cu:897-898`).
//! - **The KV cache** (`llama_kv_cache: CUDA0 KV buffer size`): per layer, K and V of
//!   `n_embd_k_gqa` and `n_embd_v_gqa` values per cell in their cache types
//!   (`src/llama-kv-cache.cpp:209-233`, `ggml_new_tensor_3d(ctx, type_k, n_embd_k_gqa, kv_size,
//!   n_stream)`), over the context padded to 256 cells (`src/llama-context.cpp:290`). In the
//!   Qwen3.5/Qwen3-Next hybrids only the attention layers have one (see [`layer_kinds`]).
//! - **The recurrent state** of those hybrids' Gated DeltaNet layers (`llama_memory_recurrent:
//!   CUDA0 RS buffer size`): per such layer a conv state and an SSM state in f32, one row a
//!   sequence (see [`boot_buffers`]).
//!
//! - **The compute buffer** (`sched_reserve: CUDA0 compute buffer size`): the CUDA backend's
//!   share of the prompt graph reserved at start, sized by ggml's graph allocator (see
//!   [`compute_buffer`]).
//!
//! - **The VMM pool** (`ggml_cuda_pool_vmm`): the per-op scratch, mapped in 2 MiB pieces as an
//!   op needs more and never unmapped before the context goes (see [`pool_mapped`]); without
//!   flash attention it grows with the context actually filled, which sets the fill ceiling
//!   ([`fill_ceiling`]).

use crate::ModelError;
use crate::gguf::{GgufHeader, row_size};

/// The CUDA buffer type's alignment (`ggml-cuda.cu:897-898`).
const CUDA_ALIGNMENT: u64 = 128;
/// llama.cpp pads the context to whole 256-cell blocks (`llama-context.cpp:290`).
const CTX_PAD: u64 = 256;
/// The tensor kept on the host (`llama-model.cpp:1603-1605`: the input layer).
const HOST_TENSOR: &str = "token_embd.weight";

/// ggml's type ids of the unquantized cache types (`ggml/include/ggml.h`: f32 0, f16 1, bf16
/// 30); any other cache type is quantized.
const UNQUANTIZED: [u32; 3] = [0, 1, 30];

/// Whether ggml type `id` is quantized (any type but f32, f16 and bf16).
pub fn is_quantized(id: u32) -> bool {
    !UNQUANTIZED.contains(&id)
}

/// The architectures whose layers are Gated DeltaNet except every `full_attention_interval`-th
/// (`src/models/qwen35.cpp:15-24`, `qwen3next.cpp:17-22`, `qwen35moe.cpp:20-25`).
const HYBRIDS: [&str; 3] = ["qwen35", "qwen35moe", "qwen3next"];

/// Whether `header`'s model is one of llama.cpp's GDN hybrids (`qwen35`, `qwen35moe`, `qwen3next`).
pub fn is_hybrid(header: &GgufHeader) -> bool {
    header.architecture().is_some_and(|a| HYBRIDS.contains(&a))
}

/// A model's layers by what they keep between tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LayerKinds {
    /// Layers with a KV cache.
    pub attention: u64,
    /// Gated DeltaNet layers, with a recurrent state instead.
    pub recurrent: u64,
}

/// The layers run by the main graph, by kind. `block_count` counts the MTP layers too;
/// `n_layer()` leaves out `nextn_predict_layers` of them (`src/llama-hparams.cpp:349`). In the
/// hybrids layer `i` is recurrent unless `(i + 1) % full_attention_interval == 0` (default 4,
/// `src/models/qwen35.cpp:15-24`); a file listing its recurrent layers
/// (`attention.recurrent_layers`) is refused rather than guessed.
pub fn layer_kinds(header: &GgufHeader) -> Result<LayerKinds, ModelError> {
    let all = header.require("block_count")?;
    let n = all.saturating_sub(header.arch_int("nextn_predict_layers").unwrap_or(0));
    if !is_hybrid(header) {
        return Ok(LayerKinds {
            attention: n,
            recurrent: 0,
        });
    }
    let arch = header.architecture().unwrap_or("?");
    if header
        .metadata
        .contains_key(&format!("{arch}.attention.recurrent_layers"))
    {
        return Err(ModelError::Invalid(format!(
            "{} lists its recurrent layers (`{arch}.attention.recurrent_layers`); only the interval rule is modelled",
            header.path.display()
        )));
    }
    let interval = header
        .arch_int("full_attention_interval")
        .unwrap_or(4)
        .max(1);
    let attention = (0..n).filter(|i| (i + 1) % interval == 0).count() as u64;
    Ok(LayerKinds {
        attention,
        recurrent: n - attention,
    })
}

/// The recurrent state's row sizes in values (`src/llama-hparams.cpp:226-257`): the conv state
/// `(d_conv - 1) * (d_inner + 2 * n_group * d_state)` and the SSM state `d_state * d_inner`.
fn recurrent_rows(header: &GgufHeader) -> Result<(u64, u64), ModelError> {
    let d_conv = header.require("ssm.conv_kernel")?;
    let d_inner = header.require("ssm.inner_size")?;
    let d_state = header.require("ssm.state_size")?;
    let n_group = header.require("ssm.group_count")?;
    Ok((
        d_conv.saturating_sub(1) * (d_inner + 2 * n_group * d_state),
        d_state * d_inner,
    ))
}

/// A llama.cpp context as the flags make it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlamaCppContext {
    /// `-c`: the context in tokens (cells).
    pub n_ctx: u64,
    /// `--cache-type-k`, a ggml type id (f16 by default).
    pub type_k: u32,
    /// `--cache-type-v`, a ggml type id (f16 by default).
    pub type_v: u32,
}

/// What llama.cpp allocates on the GPU when it loads the model and makes the context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootBuffers {
    /// The model buffer on the GPU.
    pub model_buffer_bytes: u64,
    /// The model's bytes left on the host (the input embedding).
    pub host_model_bytes: u64,
    /// The KV cache buffer.
    pub kv_cache_bytes: u64,
    /// The cells the KV cache holds (the context, padded).
    pub kv_cells: u64,
    /// The hybrids' recurrent state buffer (0 for other models).
    pub rs_bytes: u64,
    /// The layers by kind.
    pub layers: LayerKinds,
}

/// The buffers of `header`'s model in `ctx`, all layers offloaded, one sequence. The recurrent
/// state of a hybrid is, per GDN layer, its conv and SSM rows in f32 (`src/llama-model.cpp:2669-
/// 2760`: `GGML_TYPE_F32` both, `max(1, n_seq_max)` rows, no rollback rows without speculative
/// decoding; `src/llama-memory-recurrent.cpp:77-106`), each tensor padded to 128 bytes.
pub fn boot_buffers(header: &GgufHeader, ctx: &LlamaCppContext) -> Result<BootBuffers, ModelError> {
    let (mut device, mut host) = (0u64, 0u64);
    for t in &header.tensors {
        if t.name == HOST_TENSOR {
            host += t.bytes;
        } else {
            device += t.bytes.next_multiple_of(CUDA_ALIGNMENT);
        }
    }
    let layers = layer_kinds(header)?;
    let embd = header.require("embedding_length")?;
    let heads = header.require("attention.head_count")?;
    let kv_heads = header.arch_int("attention.head_count_kv").unwrap_or(heads);
    if heads == 0 {
        return Err(ModelError::Invalid(format!(
            "{} declares 0 attention heads",
            header.path.display()
        )));
    }
    // `llama_hparams::n_embd_k_gqa`: the key length (default n_embd / n_head) × KV heads.
    let k_len = header
        .arch_int("attention.key_length")
        .unwrap_or(embd / heads);
    let v_len = header
        .arch_int("attention.value_length")
        .unwrap_or(embd / heads);
    let cells = ctx.n_ctx.max(1).next_multiple_of(CTX_PAD);
    let row = |t: u32, n: u64| {
        row_size(t, n).ok_or_else(|| {
            ModelError::Invalid(format!(
                "a KV cache row of {n} values is not whole blocks of cache type {t}"
            ))
        })
    };
    let per_cell = row(ctx.type_k, k_len * kv_heads)? + row(ctx.type_v, v_len * kv_heads)?;
    let kv = crate::error::fit_bytes(
        "the KV cache",
        u128::from(layers.attention) * u128::from(cells) * u128::from(per_cell),
    )?;
    let rs_bytes = if layers.recurrent > 0 {
        let (r, s) = recurrent_rows(header)?;
        layers.recurrent
            * ((4 * r).next_multiple_of(CUDA_ALIGNMENT) + (4 * s).next_multiple_of(CUDA_ALIGNMENT))
    } else {
        0
    };
    Ok(BootBuffers {
        model_buffer_bytes: device,
        host_model_bytes: host,
        kv_cache_bytes: kv,
        kv_cells: cells,
        rs_bytes,
        layers,
    })
}

/// How ggml-cuda multiplies by a weight (`ggml-cuda.cu:2300-2420`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A quantized type: MMQ.
    Quantized,
    /// f16 or bf16: cuBLAS, the activations converted in the pool.
    Half,
    /// f32: cuBLAS's SGEMM on the operands as they are.
    Float,
}

/// The graph's shape as the compute buffer and the pool see it.
#[derive(Clone, Debug)]
struct GraphShape {
    /// `n_embd`.
    e: u64,
    /// `n_ff`.
    f: u64,
    /// Query heads.
    h: u64,
    /// Head dim of the keys.
    d: u64,
    /// `n_embd_k_gqa`: KV heads × head dim.
    ekv: u64,
    /// The vocabulary (the output matrix's rows).
    v: u64,
    /// The layers' weight matmuls as (K, M, kind), each once: every two-dimensional
    /// `blk.*.weight` but the conv kernels (`ssm_conv1d`, an `ssm_conv` operand, not a matmul).
    /// Quantized weights go to MMQ, f16/bf16 ones to cuBLAS; f32 ones too, without scratch.
    mats: Vec<(u64, u64, Kind)>,
}

fn graph_shape(header: &GgufHeader) -> Result<GraphShape, ModelError> {
    let e = header.require("embedding_length")?;
    let h = header.require("attention.head_count")?.max(1);
    let d = header.arch_int("attention.key_length").unwrap_or(e / h);
    let kv_heads = header.arch_int("attention.head_count_kv").unwrap_or(h);
    let f = header.require("feed_forward_length")?;
    // The vocabulary: the output matrix's (else the tied embedding's) outer dimension.
    let v = ["output.weight", HOST_TENSOR]
        .iter()
        .find_map(|n| header.tensors.iter().find(|t| t.name == *n))
        .and_then(|t| t.dims.get(1).copied())
        .ok_or_else(|| {
            ModelError::Invalid(format!(
                "{} has neither output.weight nor token_embd.weight: no vocabulary",
                header.path.display()
            ))
        })?;
    let mut mats: Vec<(u64, u64, Kind)> = header
        .tensors
        .iter()
        .filter(|t| {
            t.name.starts_with("blk.")
                && t.name.ends_with(".weight")
                && !t.name.contains("ssm_conv1d")
                && t.dims.len() == 2
        })
        .map(|t| {
            let kind = if is_quantized(t.ggml_type) {
                Kind::Quantized
            } else if t.ggml_type == 0 {
                Kind::Float
            } else {
                Kind::Half
            };
            (t.dims[0], t.dims[1], kind)
        })
        .collect();
    mats.sort_unstable();
    mats.dedup();
    Ok(GraphShape {
        e,
        f,
        h,
        d,
        ekv: kv_heads * d,
        v,
        mats,
    })
}

/// The Hadamard rotations a quantized cache brings into the graph's inputs
/// (`src/llama-kv-cache.cpp:321-339, 1450-1480`): for a quantized K, `nrot²` f32 with `nrot` the
/// largest power of two from 64 dividing the head dim; for a quantized V, 64×64 f32; none when
/// the head dim is not a multiple of 64.
fn rotations(head_dim: u64, ctx: &LlamaCppContext) -> u64 {
    let a = |x: u64| x.next_multiple_of(CUDA_ALIGNMENT);
    if head_dim == 0 || !head_dim.is_multiple_of(64) {
        return 0;
    }
    let nrot = 1u64 << head_dim.trailing_zeros();
    let k = if is_quantized(ctx.type_k) {
        a(4 * nrot * nrot)
    } else {
        0
    };
    let v = if is_quantized(ctx.type_v) {
        a(4 * 64 * 64)
    } else {
        0
    };
    k + v
}

/// The CUDA compute buffer llama.cpp reserves when it makes the context (`sched_reserve:
/// CUDA0 compute buffer size`), for a dense llama-style model, every layer offloaded, one
/// sequence, one GPU.
///
/// Read from llama.cpp's code (the tree of llama-cpp-python 0.3.36):
/// - The reservation is the prompt graph (`src/llama-context.cpp:672-690`, again at :711-730
///   after the one-token graph at :694-708; the buffer only grows, ggml-alloc.c:915-921) for
///   `n_tokens = min(n_ctx, n_ubatch)` (:629) with every token an output
///   (`n_outputs_pp`, :670), over the whole padded cache (`init_full`, `n_kv = get_size()`,
///   `src/llama-kv-cache.cpp:2791`).
/// - ggml's graph allocator (`ggml/src/ggml-alloc.c:718`) walks the graph in order, best fit
///   over its free blocks (:202), each tensor padded to the CUDA buffer's 128 bytes
///   (`ggml-cuda.cu:898`), in place only for element-wise ops on a sole owned parent (:22,
///   :640), freeing a tensor after its last consumer; the buffer is the highest address reached
///   (holes included), not the peak of live bytes.
/// - The input embedding's rows are looked up on the host (`token_embd` stays there), so the
///   graph's inputs are copied into the CUDA buffer at the start of its split, before layer 0
///   (`ggml/src/ggml-backend.cpp:1376`, :1514-1600): the hidden states, positions, the K and V
///   cache indices (V's per value without flash attention, the V cache transposed,
///   `llama-kv-cache.cpp:1430`), the KQ mask `[n_kv, T]` (F16 with flash attention, F32
///   without; `src/llama-graph.cpp:29-46`; no padding in this tree), the output ids, and with a
///   quantized cache its Hadamard rotations (K: `nrot²` f32, `nrot` the largest power of two
///   from 64 dividing the head dim; V: 64×64; `llama-kv-cache.cpp:321-339, 1450-1480`).
/// - Layer 0 then peaks at one of: the FFN (gate, up and the SwiGLU result, three `[n_ff, T]`
///   F32: GLU is not in place, `llama-graph.cpp:1800-1865`); without flash attention the scores
///   `[n_kv, T, n_head]` F32 (`llama-graph.cpp:2688`, soft_max in place); with flash attention
///   and a quantized cache the kernel's output plus the f16 copies of K and V it reserves with it
///   (`ggml-cuda/fattn.cu:722`, `fattn-common.cuh:53`). The logits `[n_vocab, T]` F32 above the
///   final norm (both outputs, never freed) make the fourth candidate.
///
/// Checked against llama.cpp's own log lines on the H200 (docs/validation.md, "llama.cpp on the
/// H200"; the closed form was derived from the code and a step-by-step re-implementation of the
/// allocator, then set beside the four runs: equal to the byte), and on four held-out settings
/// predicted before the call that ran them: each llama.cpp's figure to its four decimals of MiB.
/// It assumes one sequence, one GPU, query heads × head dim = the hidden size, no sliding window,
/// and both caches of one kind (quantized or not).
pub fn compute_buffer(
    header: &GgufHeader,
    ctx: &LlamaCppContext,
    n_ubatch: u64,
    flash_attn: bool,
) -> Result<u64, ModelError> {
    if is_hybrid(header) {
        return hybrid_compute_buffer(header, ctx, n_ubatch, flash_attn);
    }
    let g = graph_shape(header)?;
    let a = |x: u64| x.next_multiple_of(CUDA_ALIGNMENT);
    let n = ctx.n_ctx.max(1).next_multiple_of(CTX_PAD);
    let t = n.min(n_ubatch.max(1));
    let quantized = is_quantized(ctx.type_k) || is_quantized(ctx.type_v);
    let mask_elem = if flash_attn { 2 } else { 4 };
    let inputs = a(4 * g.e * t)
        + a(4 * t)
        + rotations(g.d, ctx)
        + a(8 * t)
        + a(if flash_attn { 8 * t } else { 8 * t * g.ekv })
        + a(n * t * mask_elem)
        + a(4 * t);
    let hidden = a(4 * g.e * t);
    let heads_out = a(4 * g.h * g.d * t);
    let ffn = inputs + 2 * hidden + 3 * a(4 * g.f * t);
    let logits = hidden + a(4 * g.v * t);
    let mut peak = ffn.max(logits);
    if !flash_attn {
        peak = peak.max(inputs + 2 * hidden + heads_out + a(4 * n * t * g.h));
    } else if quantized {
        peak = peak.max(inputs + hidden + heads_out + a(heads_out + 4 * n * g.ekv));
    }
    Ok(peak)
}

/// The compute buffer of the `qwen35` graph (Qwen3.5/3.6: Gated DeltaNet layers, a full-attention
/// layer every fourth), one sequence, one GPU, every layer offloaded. Derived from the tree's
/// code by a step-by-step simulation of the graph and of ggml's allocator
/// (`scripts/validate/qwen35_compute_sim.py`; docs/validation.md, "The hybrid's compute buffer"),
/// reduced to this form:
/// - the reserved graph and the allocator are the dense one's ([`compute_buffer`]); the GDN step
///   is one fused `GATED_DELTA_NET` node a layer (`src/llama-context.cpp:233-235`,
///   `src/models/delta-net-base.cpp:402-420`);
/// - the inputs copied in at the CUDA split's start: the embedding rows, the recurrent state's
///   copy index, four positions a token (IMROPE), with a quantized cache the Hadamard rotations
///   (K: `nrot²` f32, `nrot` the largest power of two dividing the head dim; V: 64×64;
///   `src/llama-kv-cache.cpp:321-339`), the K and V indices (V's per value without flash
///   attention), the KQ mask (f16 with flash attention, f32 without), the output ids;
/// - the peak is the largest of: an attention layer's scores without flash attention
///   (`[n_kv, T, H]` f32 beside the query and its gate, `src/models/qwen35.cpp:248-330`); with
///   flash attention over a quantized cache, the kernel's node with its f16 K and V
///   (`ggml-cuda/fattn.cu:722-755`); layer 0's FFN; layer 0's conv (state and input
///   concatenated, `delta-net-base.cpp`); the logits `[V, T]` f32 above the never-freed
///   `h_nextn` and `result_norm` outputs.
///
/// Where the last term was reduced from the simulation, its placement rule holds for layer
/// counts that are multiples of 8; other counts, flash attention over an f16 cache, and mixed
/// cache types are refused (not modelled), as is any hybrid but `qwen35`.
fn hybrid_compute_buffer(
    header: &GgufHeader,
    ctx: &LlamaCppContext,
    n_ubatch: u64,
    flash_attn: bool,
) -> Result<u64, ModelError> {
    let arch = header.architecture().unwrap_or("?");
    let layers = layer_kinds(header)?;
    let n_layer = layers.attention + layers.recurrent;
    let quantized_k = is_quantized(ctx.type_k);
    let not_modelled = |why: &str| {
        Err(ModelError::Invalid(format!(
            "the compute buffer of {arch}'s hybrid graph is not modelled {why}; give llama.cpp's own figure (its `CUDA0 compute buffer size` line) as --compute-buffer BYTES"
        )))
    };
    if arch != "qwen35" {
        return not_modelled("(only qwen35's graph is)");
    }
    if n_layer < 8
        || n_layer % 8 != 0
        || header.arch_int("full_attention_interval").unwrap_or(4) != 4
    {
        return not_modelled(
            "for a layer count that is not a multiple of 8 (or an interval other than 4)",
        );
    }
    if quantized_k != is_quantized(ctx.type_v) {
        return not_modelled("for a K and a V cache of different kinds");
    }
    if flash_attn && !quantized_k {
        return not_modelled("with flash attention over an f16 cache");
    }
    let a = |x: u64| x.next_multiple_of(CUDA_ALIGNMENT);
    let g_shape = graph_shape(header)?;
    let (e, f, heads, d, v) = (g_shape.e, g_shape.f, g_shape.h, g_shape.d, g_shape.v);
    let kv_heads = g_shape.ekv / d.max(1);
    let d_conv = header.require("ssm.conv_kernel")?;
    let d_inner = header.require("ssm.inner_size")?;
    let d_state = header.require("ssm.state_size")?;
    let n_group = header.require("ssm.group_count")?;
    let channels = d_inner + 2 * n_group * d_state;
    let n = ctx.n_ctx.max(1).next_multiple_of(CTX_PAD);
    let t = n.min(n_ubatch.max(1));
    let h = a(4 * e * t);
    let g = a(4 * d * heads * t);
    let inputs = h
        + a(4)
        + a(16 * t)
        + rotations(d, ctx)
        + a(8 * t)
        + a(if flash_attn {
            8 * t
        } else {
            8 * t * kv_heads * d
        })
        + a(n * t * if flash_attn { 2 } else { 4 })
        + a(4 * t);
    let attention = if flash_attn {
        let kv16 = 2 * d * kv_heads * n;
        inputs + h + a(8 * d * heads * t) + 2 * g + a(a(g) + a(kv16) + kv16)
    } else {
        inputs + h + a(8 * d * heads * t) + g + a(4 * n * t * heads)
    };
    let ffn = inputs + h + 3 * a(4 * f * t);
    let conv = inputs
        + h
        + a(4 * (d_conv - 1) * channels)
        + a(4 * channels * t)
        + a(4 * channels * (t + d_conv - 1))
        + a(4 * channels * t);
    // Where the logits land: above the two outputs never freed, placed in what the freed inputs
    // left below (reduced from the simulation; multiples of 8 layers).
    let free = inputs - a(4 * t) - h;
    let rest = free.saturating_sub(h + g);
    let below = if free < h {
        inputs + h
    } else if free >= h + g && (h..h + g).contains(&rest) {
        3 * h + g
    } else {
        2 * h
    };
    let logits = below + a(4 * v * t);
    Ok(attention.max(ffn).max(conv).max(logits))
}

/// The VMM pool's mapping granularity on the H200 (`cuMemGetAllocationGranularity`,
/// `ggml-cuda.cu:286-292`; every piece recorded there is a multiple of it).
pub const VMM_GRANULARITY: u64 = 2 << 20;
/// ggml's own cuBLAS workspace, `cudaMalloc`ed at the first cuBLAS call on compute capability
/// 9.0 and above (`ggml/src/ggml-cuda/common.cuh:1532-1545`).
pub const CUBLAS_WORKSPACE: u64 = 32 << 20;

/// Where a prompt's fill runs: the flags that shape the per-op scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FillShape {
    /// `-ub`: tokens of one pass.
    pub n_ubatch: u64,
    /// `-fa on`.
    pub flash_attn: bool,
    /// Streaming multiprocessors (132 on an H200): MMQ's stream-k fixup.
    pub n_sm: u64,
}

/// The largest per-op scratch of one ubatch of `t` tokens with `n_kv` cells in view, rounded as
/// the pool rounds each request (128 bytes, `ggml-cuda.cu:565-567`). Read from ggml-cuda:
/// - the weight matmuls (each of the layers' weight shapes): f16/bf16 weights go to cuBLAS for
///   `t > 16`, which takes the f32 activations as f16 (`K·t·2`) and an f16 output (`M·t·2`) from the pool
///   (`ggml-cuda.cu:1437-1522`); quantized weights go to MMQ for `t > 8`, which takes a q8_1 copy
///   of the activations (`t·pad512(K)·1.125 + 128·144`, `mmq.cu:186-190`) and, when the tiles do
///   not fill the SMs evenly, a stream-k fixup of `n_sm·128·128·4` (`mmq.cuh:1446-1461`; counted
///   here whenever MMQ runs, an upper bound of 8.25 MiB);
/// - without flash attention, `KQ` runs in F32 (`llama-graph.cpp:2693`) with K converted to f32
///   (`4·D·n_kv·Hkv`), and `KQV` in f16 with the softmaxed scores converted (`2·n_kv·t·H`), its
///   f16 output (`2·D·t·H`) and the batched GEMM's pointer arrays (`16·H + 8·H`)
///   (`ggml-cuda.cu:1441-1575`);
/// - with flash attention, the kernel's own scratch (`fattn-common.cuh:1017-1216`) is below the
///   weight matmuls' and does not depend on `n_kv`; the f16 K/V of a quantized cache live in the
///   compute buffer ([`compute_buffer`]).
fn op_scratch(g: &GraphShape, s: &FillShape, t: u64, n_kv: u64) -> u64 {
    let a = |x: u64| x.next_multiple_of(128);
    let of = |kind: Kind| g.mats.iter().filter(move |m| m.2 == kind);
    let mmq = of(Kind::Quantized)
        .map(|&(k, _, _)| a((t * k.next_multiple_of(512) * 9).div_ceil(8) + 128 * 144))
        .max()
        .filter(|_| t > 8)
        .map_or(0, |x| x + a(s.n_sm * 128 * 128 * 4));
    let cublas = of(Kind::Half)
        .map(|&(k, m, _)| a(2 * k * t) + a(2 * m * t))
        .max()
        .filter(|_| t > 16)
        .unwrap_or(0);
    let weights = mmq.max(cublas);
    if s.flash_attn {
        return weights;
    }
    let kv_heads = g.ekv / g.d.max(1);
    let kq = a(4 * g.d * n_kv * kv_heads) + a(16 * g.h) + a(8 * g.h);
    let kqv = a(2 * n_kv * t * g.h) + a(2 * g.d * t * g.h) + a(16 * g.h) + a(8 * g.h);
    weights.max(kq).max(kqv)
}

/// The VMM pool's mapped bytes after a prompt of `filled` tokens (`ggml-cuda.cu:531-675`): a
/// bump allocator whose requests are freed with their op, so the mapping is the largest op's
/// scratch over the fill, rounded up to [`VMM_GRANULARITY`]; it never shrinks. The prompt runs
/// in ubatches of `-ub` tokens; after each, the cells in view are the used ones padded to 256
/// (at least 256, at most the cache; `llama-kv-cache.cpp:1260-1273`).
pub fn pool_mapped(
    header: &GgufHeader,
    ctx: &LlamaCppContext,
    s: &FillShape,
    filled: u64,
) -> Result<u64, ModelError> {
    pool_mapped_after(header, ctx, s, 0, filled)
}

/// [`pool_mapped`] for a prompt of `prompt` tokens decoded after `past` cells already filled
/// (a conversation's earlier turns, or the BOS an interactive `llama-completion` decodes on its
/// own before the first line): the ubatches then end at `past + k·ub`, which moves the cells in
/// view of each.
pub fn pool_mapped_after(
    header: &GgufHeader,
    ctx: &LlamaCppContext,
    s: &FillShape,
    past: u64,
    prompt: u64,
) -> Result<u64, ModelError> {
    Ok(pool_of(&graph_shape(header)?, ctx, s, past, prompt))
}

/// [`pool_mapped_after`] on a graph shape already read.
fn pool_of(g: &GraphShape, ctx: &LlamaCppContext, s: &FillShape, past: u64, prompt: u64) -> u64 {
    let cells = ctx.n_ctx.max(1).next_multiple_of(CTX_PAD);
    let ub = s.n_ubatch.max(1);
    let mut peak = 0u64;
    let mut done = past;
    let filled = past + prompt;
    while done < filled {
        let t = ub.min(filled - done);
        done += t;
        let n_kv = done.next_multiple_of(CTX_PAD).clamp(CTX_PAD, cells);
        peak = peak.max(op_scratch(g, s, t, n_kv));
    }
    peak.next_multiple_of(VMM_GRANULARITY)
}

/// Whether the fill calls cuBLAS, which then `cudaMalloc`s ggml's workspace: the attention's
/// matmuls without flash attention, or a weight in f16/bf16/f32 at more than 16 tokens a pass.
fn calls_cublas(g: &GraphShape, s: &FillShape) -> bool {
    !s.flash_attn || (s.n_ubatch > 16 && g.mats.iter().any(|m| m.2 != Kind::Quantized))
}

/// What can be filled on a card: the buffers made at start, the fixed extras, and the largest
/// prompt whose pool still fits.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FillCeiling {
    /// Model, KV cache, recurrent state and compute buffers.
    pub boot_bytes: u64,
    /// ggml's cuBLAS workspace when the fill calls cuBLAS (f16 weights, or no flash attention).
    pub cublas_workspace_bytes: u64,
    /// The bytes held outside llama.cpp's buffers (the CUDA context, cuBLAS's own handles).
    pub outside_bytes: u64,
    /// The pool at the largest prompt that fits (or after one ubatch when none does).
    pub pool_bytes: u64,
    /// The largest prompt that can be filled (0 when not even the first ubatch fits; the
    /// context's capacity, `pad256(-c) − 4`, when the pool never outgrows the card).
    pub fill_tokens: u64,
    /// The longest prompt llama.cpp takes at this `-c`.
    pub max_prompt_tokens: u64,
    /// The context fits at start.
    pub boots: bool,
}

/// The largest prompt `ctx` can fill on a card of `limit` bytes with `outside` held besides
/// llama.cpp's own buffers: the largest `N` with boot + workspace + outside + pool(N) ≤ limit
/// (the pool only grows with `N`, so a binary search over the prompt). `compute`: the compute
/// buffer when already known (predicted, or llama.cpp's own figure for a graph
/// [`compute_buffer`] does not place); `None` predicts it.
pub fn fill_ceiling(
    header: &GgufHeader,
    ctx: &LlamaCppContext,
    s: &FillShape,
    n_batch: u64,
    limit: u64,
    outside: u64,
    compute: Option<u64>,
) -> Result<FillCeiling, ModelError> {
    let boot = boot_buffers(header, ctx)?;
    let compute = match compute {
        Some(c) => c,
        None => compute_buffer(header, ctx, s.n_ubatch.min(n_batch.max(1)), s.flash_attn)?,
    };
    let boot_bytes = boot.model_buffer_bytes + boot.kv_cache_bytes + boot.rs_bytes + compute;
    let g = graph_shape(header)?;
    let cublas = if calls_cublas(&g, s) {
        CUBLAS_WORKSPACE
    } else {
        0
    };
    // `llama-completion` refuses a prompt longer than the context less 4 tokens.
    let max_prompt = boot.kv_cells.saturating_sub(4);
    let fixed = boot_bytes + cublas + outside;
    let fits = |n: u64| fixed + pool_of(&g, ctx, s, 0, n) <= limit;
    let boots = boot_bytes + outside <= limit;
    let (mut lo, mut hi) = (0u64, max_prompt);
    if boots && fits(max_prompt) {
        lo = max_prompt;
    } else if boots {
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
    }
    Ok(FillCeiling {
        boot_bytes,
        cublas_workspace_bytes: cublas,
        outside_bytes: outside,
        pool_bytes: pool_of(&g, ctx, s, 0, lo.max(s.n_ubatch.min(max_prompt))),
        fill_tokens: lo,
        max_prompt_tokens: max_prompt,
        boots,
    })
}
