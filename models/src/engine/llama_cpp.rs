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
//! Not yet modelled: the compute buffer the scheduler reserves for the worst-case graph
//! (`sched_reserve`), the VMM pool's per-op scratch, and the fill ceiling they set.

use crate::ModelError;
use crate::gguf::{GgufHeader, row_size};

/// The CUDA buffer type's alignment (`ggml-cuda.cu:897-898`).
const CUDA_ALIGNMENT: u64 = 128;
/// llama.cpp pads the context to whole 256-cell blocks (`llama-context.cpp:290`).
const CTX_PAD: u64 = 256;
/// The tensor kept on the host (`llama-model.cpp:1603-1605`: the input layer).
const HOST_TENSOR: &str = "token_embd.weight";

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
