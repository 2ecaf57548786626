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
//!   n_stream)`), over the context padded to 256 cells (`src/llama-context.cpp:290`).
//!
//! - **The compute buffer** (`sched_reserve: CUDA0 compute buffer size`): the CUDA backend's
//!   share of the prompt graph reserved at start, sized by ggml's graph allocator (see
//!   [`compute_buffer`]).
//!
//! Not yet modelled: the VMM pool's per-op scratch (cuBLAS's conversions, without flash
//! attention), and the fill ceiling it and the buffers set.

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
}

/// The buffers of `header`'s model in `ctx`, all layers offloaded.
pub fn boot_buffers(header: &GgufHeader, ctx: &LlamaCppContext) -> Result<BootBuffers, ModelError> {
    let (mut device, mut host) = (0u64, 0u64);
    for t in &header.tensors {
        if t.name == HOST_TENSOR {
            host += t.bytes;
        } else {
            device += t.bytes.next_multiple_of(CUDA_ALIGNMENT);
        }
    }
    let layers = header.require("block_count")?;
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
        u128::from(layers) * u128::from(cells) * u128::from(per_cell),
    )?;
    Ok(BootBuffers {
        model_buffer_bytes: device,
        host_model_bytes: host,
        kv_cache_bytes: kv,
        kv_cells: cells,
    })
}

/// The graph's shape as the compute buffer sees it.
#[derive(Clone, Copy, Debug)]
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
    Ok(GraphShape {
        e,
        f,
        h,
        d,
        ekv: kv_heads * d,
        v,
    })
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
///   quantized cache two 64×64 F32 rotations (`llama-kv-cache.cpp:300-341`).
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
    let g = graph_shape(header)?;
    let a = |x: u64| x.next_multiple_of(CUDA_ALIGNMENT);
    let n = ctx.n_ctx.max(1).next_multiple_of(CTX_PAD);
    let t = n.min(n_ubatch.max(1));
    let quantized = !UNQUANTIZED.contains(&ctx.type_k) || !UNQUANTIZED.contains(&ctx.type_v);
    let mask_elem = if flash_attn { 2 } else { 4 };
    let inputs = a(4 * g.e * t)
        + a(4 * t)
        + if quantized { 2 * a(4 * 64 * 64) } else { 0 }
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
