//! vLLM 0.20.1 serving a Qwen3-Next / Qwen3.5 model: one step's layers as the whole-step model
//! ([`crate::StepModel`]) runs them for [`crate::Runtime::Vllm`] — the residual stream, the
//! projections around each kernel, FlashAttention over a paged KV cache and logits for one row
//! per sequence.
//!
//! Read from vLLM 0.20.1's own source (paths under `vllm/`, each tensor citing its function):
//! `model_executor/models/qwen3_next.py`, `model_executor/layers/mamba/gdn_linear_attn.py`,
//! `model_executor/layers/logits_processor.py`, `v1/worker/gpu_model_runner.py` and
//! `v1/sample/sampler.py`; its GDN kernel is [`crate::gdn_vllm_0_20_1`].

use crate::step_layers::{
    Dims, LayerPeaks, LayerStep, StepLayer, fa_kernel, free_all, gdn_kernel, kernel_layer,
};
use crate::{DType, LayerPeak, ModelError, Tensor, TensorId, Timeline};

/// vLLM's layer kinds for the step: GDN and attention (those the config has), the MLP, then the
/// logits.
pub(crate) fn layers(st: &LayerStep) -> Result<Vec<LayerPeak>, ModelError> {
    let mut out = LayerPeaks::default();
    out.mixers(st.cfg, || gdn(st), || attention(st))?;
    out.push(StepLayer::Mlp, mlp(st)?);
    out.push(StepLayer::Logits, logits(&st.d)?);
    Ok(out.into_vec())
}

const VL_RES: &str = "vllm-0.20.1 vllm/model_executor/models/qwen3_next.py Qwen3NextDecoderLayer.forward: hidden_states, residual";
const VL_QKVZ: &str = "vllm-0.20.1 vllm/model_executor/layers/mamba/gdn_linear_attn.py forward: projected_states_qkvz = self.in_proj_qkvz(hidden_states)";
const VL_BA: &str = "vllm-0.20.1 vllm/model_executor/layers/mamba/gdn_linear_attn.py forward: projected_states_ba = self.in_proj_ba(hidden_states)";
const VL_B_A: &str = "vllm vllm/model_executor/layers/mamba/gdn_linear_attn.py forward: b, a = ba.chunk(2, dim=-1); b = b.contiguous(); a = a.contiguous()";
const VL_CORE: &str = "vllm-0.20.1 vllm/model_executor/layers/mamba/gdn_linear_attn.py forward: core_attn_out = torch.zeros((num_tokens, num_v_heads / tp, head_v_dim))";
const VL_CONV: &str = "vllm-0.20.1 vllm/model_executor/layers/mamba/gdn_linear_attn.py _forward_core: mixed_qkv after causal_conv1d_fn";
const VL_GATE: &str = "vllm-0.20.1 vllm/model_executor/layers/mamba/gdn_linear_attn.py _forward_core: g, beta = fused_gdn_gating(..) (fp32)";
const VL_QKVN: &str = "vllm-0.20.1 vllm/model_executor/layers/mamba/gdn_linear_attn.py _forward_core: fused_post_conv_prep (normalised q, k; contiguous v)";
const VL_ATT_QKV: &str = "vllm-0.20.1 vllm/model_executor/models/qwen3_next.py Qwen3NextAttention.forward: qkv, _ = self.qkv_proj(hidden_states) (q doubled by the output gate)";
const VL_LOGIT_H: &str = "vllm-0.20.1 vllm/v1/worker/gpu_model_runner.py execute_model: sample_hidden_states = hidden_states[logits_indices]";
const VL_LOGITS: &str =
    "vllm-0.20.1 vllm/model_executor/layers/logits_processor.py: logits = lm_head(hidden_states)";
const VL_GATHER: &str = "vllm-0.20.1 vllm/distributed/device_communicators/base_device_communicator.py all_gather: output_tensor = torch.empty(..); output_tensor.movedim(0, dim).reshape(..)";
const VL_MOE_WORKSPACE: &str = "vllm-0.20.1 vllm/model_executor/layers/fused_moe/modular_kernel.py _allocate_buffers: current_workspace_manager().get_simultaneous(workspace13, workspace2)";
const VL_LOGITS32: &str =
    "vllm-0.20.1 vllm/v1/sample/sampler.py Sampler.forward: logits = logits.to(torch.float32)";

/// The residual stream every layer holds: `hidden_states` and `residual`.
fn residual_stream(tl: &mut Timeline, d: &Dims) -> Vec<TensorId> {
    vec![
        tl.alloc("hidden_states", &[d.t, d.hidden], d.dt, VL_RES),
        tl.alloc("residual", &[d.t, d.hidden], d.dt, VL_RES),
    ]
}

/// One GDN layer of vLLM 0.20.1 on the Triton prefill path, as far as modelled: the residual
/// stream (`hidden_states` and `residual`), the `in_proj_qkvz` and `in_proj_ba` outputs with
/// contiguous copies of `b` and `a`, the output buffer `core_attn_out`, the conv output, fp32 `g`
/// and `beta`, the normalised q/k and contiguous v handed to the kernel (`fused_post_conv_prep`),
/// then the kernel. Not modelled:
/// the gated norm's and `out_proj`'s outputs after the kernel (below its peak), the metadata
/// tensors, and FlashInfer's GDN prefill (vLLM's default on SM90, a different kernel).
fn gdn(st: &LayerStep) -> Result<Vec<Tensor>, ModelError> {
    let g = st.gdn_shape(false)?;
    let d = &st.d;
    let (t, dt) = (d.t, d.dt);
    let key_dim = d.hk * d.kd;
    let value_dim = d.hv * d.vd;
    let mut tl = Timeline::new();
    let mut ids = gdn_inputs(&mut tl, d);
    ids.extend([
        tl.alloc(
            "mixed_qkv (conv)",
            &[t, 2 * key_dim + value_dim],
            dt,
            VL_CONV,
        ),
        tl.alloc("g", &[1, t, d.hv], DType::F32, VL_GATE),
        tl.alloc("beta", &[1, t, d.hv], DType::F32, VL_GATE),
        tl.alloc("q (normalised)", &[1, t, d.hk, d.kd], dt, VL_QKVN),
        tl.alloc("k (normalised)", &[1, t, d.hk, d.kd], dt, VL_QKVN),
        tl.alloc("v", &[1, t, d.hv, d.vd], dt, VL_QKVN),
    ]);
    kernel_layer(tl, ids, &gdn_kernel(st.v.gdn, &g)?)
}

/// A GDN layer's tensors up to its output buffer: the residual stream, the `in_proj_qkvz` and
/// `in_proj_ba` outputs, contiguous `b` and `a`, and `core_attn_out` (`gdn_linear_attn.py:530-575`).
fn gdn_inputs(tl: &mut Timeline, d: &Dims) -> Vec<TensorId> {
    let (t, dt) = (d.t, d.dt);
    let (key_dim, value_dim) = (d.hk * d.kd, d.hv * d.vd);
    let mut ids = residual_stream(tl, d);
    ids.extend([
        tl.alloc(
            "projected_states_qkvz",
            &[t, 2 * key_dim + 2 * value_dim],
            dt,
            VL_QKVZ,
        ),
        tl.alloc("projected_states_ba", &[t, 2 * d.hv], dt, VL_BA),
        tl.alloc("b (contiguous)", &[t, d.hv], dt, VL_B_A),
        tl.alloc("a (contiguous)", &[t, d.hv], dt, VL_B_A),
        tl.alloc("core_attn_out", &[t, d.hv, d.vd], dt, VL_CORE),
    ]);
    ids
}

/// One attention layer of vLLM 0.20.1: the residual stream, the fused qkv projection (q doubled
/// by the output gate), then FlashAttention's varlen forward over the paged cache (its outputs
/// are sized by the queries; the K/V are written into the cache in place).
fn attention(st: &LayerStep) -> Result<Vec<Tensor>, ModelError> {
    let fa = st.fa_shape(st.s.context_tokens)?;
    let d = &st.d;
    let width = (d.gate * d.heads + 2 * d.kv_heads) * d.head_dim;
    let mut tl = Timeline::new();
    let mut ids = residual_stream(&mut tl, d);
    ids.push(tl.alloc("qkv", &[d.t, width], d.dt, VL_ATT_QKV));
    kernel_layer(tl, ids, &fa_kernel(st.v.attention, &fa)?)
}

/// vLLM's dense MLP ([`crate::ffn`]) beside the residual stream.
fn mlp(st: &LayerStep) -> Result<Vec<Tensor>, ModelError> {
    let mut tl = Timeline::new();
    let ids = residual_stream(&mut tl, &st.d);
    kernel_layer(tl, ids, &st.ffn_kernel()?)
}

/// vLLM computes logits for one row per sequence (`logits_indices`, the last scheduled token),
/// in the model dtype, then the sampler's fp32 copy: `[N, vocab]` twice, beside the final hidden
/// states.
fn logits(d: &Dims) -> Result<Vec<Tensor>, ModelError> {
    let mut tl = Timeline::new();
    let hs = tl.alloc("hidden_states", &[d.t, d.hidden], d.dt, VL_RES);
    let rows = tl.alloc("sample_hidden_states", &[d.n, d.hidden], d.dt, VL_LOGIT_H);
    let logits = tl.alloc("logits", &[d.n, d.vocab], d.dt, VL_LOGITS);
    let l32 = tl.alloc("logits (fp32)", &[d.n, d.vocab], DType::F32, VL_LOGITS32);
    free_all(&mut tl, [hs, rows, logits, l32]);
    tl.finish()
}

const VL_PROFILE_OUT: &str = "vllm-0.20.1 vllm/model_executor/layers/attention/attention.py:493-498 Attention.forward: output = torch.empty(num_tokens, num_heads * head_size_v), filled with 0 when attn_metadata is None (v1/attention/backends/flash_attn.py:718-720)";
const VL_SAMPLE_RAND: &str = "vllm-0.20.1 vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run: hidden_states = torch.rand_like(hidden_states)";
const VL_PROBS: &str = "vllm-0.20.1 vllm/v1/sample/ops/topk_topp_sampler.py forward_native: probs = logits.softmax(dim=-1, dtype=torch.float32)";
const VL_Q: &str = "vllm-0.20.1 vllm/v1/sample/ops/topk_topp_sampler.py random_sample: q = torch.empty_like(probs)";

/// The layer kinds of vLLM 0.20.1's profile run (`GPUModelRunner.profile_run`,
/// `v1/worker/gpu_model_runner.py:5788-5861`): `_dummy_run(max_num_batched_tokens)` with
/// `attn_metadata = None`, so the attention backends return a zeroed output without running
/// their kernel and the GDN layer returns before its conv and chunked delta rule
/// (`gdn_linear_attn.py:752-766`; its one-time warm-up on 64 tokens is not modelled); the MLP runs
/// in full; then `_dummy_sampler_run` on `rows` rows (`min(max_num_batched_tokens,
/// max_num_seqs)`, `:5615-5619`). The same scope as [`layers`], kernels left out: the step's
/// excess over the profiled peak is what those kernels add. `st`'s shape is one sequence of
/// `max_num_batched_tokens` tokens. An MoE model's fused-experts workspace outlives its layer
/// ([`moe_workspace`]), so the sampler runs beside it.
pub(crate) fn profile_layers(st: &LayerStep, rows: u64) -> Result<Vec<LayerPeak>, ModelError> {
    let mut out = LayerPeaks::default();
    out.mixers(st.cfg, || profile_gdn(st), || profile_attention(st))?;
    out.push(StepLayer::Mlp, mlp(st)?);
    let workspace = moe_workspace(st)?;
    out.push(
        StepLayer::Logits,
        sampler(&st.d, st.cfg.vocab_size, rows, &workspace)?,
    );
    Ok(out.into_vec())
}

/// The fused-MoE workspace of a `t`-token forward on this rank: the Triton experts' two buffers
/// (`fused_moe/fused_moe.py:1968-1983`: `(M, topk, max(N/2, K))`, which also holds the output,
/// and `(M, topk, max(N, K))`, with `N` the gate-and-up width on this rank and `K` the hidden
/// size), in the activations' dtype, taken from one buffer the `WorkspaceManager` keeps and only
/// grows (`fused_moe/modular_kernel.py:1093-1099`, `v1/worker/workspace.py:92-140`): it outlives
/// the layer and the forward. None for dense models. Other expert kernels (Marlin's int4,
/// DeepGEMM) size theirs otherwise; not modelled.
fn moe_workspace(st: &LayerStep) -> Result<Vec<[u64; 3]>, ModelError> {
    let Some(moe) = &st.cfg.moe else {
        return Ok(Vec::new());
    };
    let n = 2 * crate::tp_split("moe_intermediate_size", moe.moe_intermediate_size, st.s.tp)?;
    let k = st.cfg.hidden_size;
    let (m, topk) = (st.d.t, moe.num_experts_per_tok);
    Ok(vec![[m, topk, (n / 2).max(k)], [m, topk, n.max(k)]])
}

/// [`moe_workspace`]'s bytes: what stays allocated after the profile run for every later step.
pub(crate) fn moe_workspace_bytes(st: &LayerStep) -> Result<u64, ModelError> {
    Ok(moe_workspace(st)?
        .iter()
        .map(|s| s.iter().product::<u64>() * st.d.dt.size_bytes())
        .sum())
}

/// [`gdn`]'s tensors up to `core_attn_out` (`gdn_linear_attn.py:530-575`, zeros at `:571-575`);
/// the core op returns before the conv and the kernel.
fn profile_gdn(st: &LayerStep) -> Result<Vec<Tensor>, ModelError> {
    let mut tl = Timeline::new();
    let ids = gdn_inputs(&mut tl, &st.d);
    free_all(&mut tl, ids);
    tl.finish()
}

/// [`attention`]'s tensors with the backend's zeroed output in place of FlashAttention.
fn profile_attention(st: &LayerStep) -> Result<Vec<Tensor>, ModelError> {
    let d = &st.d;
    let width = (d.gate * d.heads + 2 * d.kv_heads) * d.head_dim;
    let mut tl = Timeline::new();
    let mut ids = residual_stream(&mut tl, d);
    ids.push(tl.alloc("qkv", &[d.t, width], d.dt, VL_ATT_QKV));
    ids.push(tl.alloc(
        "attention output (zeros)",
        &[d.t, d.heads * d.head_dim],
        d.dt,
        VL_PROFILE_OUT,
    ));
    free_all(&mut tl, ids);
    tl.finish()
}

/// `_dummy_sampler_run` (`gpu_model_runner.py:5622-5699`) on `rows` rows: the random hidden rows,
/// the logits, the sampler's fp32 copy (`sampler.py:91`), and with the dummy top-k/top-p the
/// native path's probabilities and exponential draws (`topk_topp_sampler.py:112, 334`), beside
/// the forward's hidden states. Under tensor parallelism every rank samples over the whole
/// vocabulary (`vocab`): the lm_head's shard of `d.vocab` columns is all-gathered
/// (`logits_processor.py:75-87`, all-gather on every CUDA platform, `platforms/interface.py:
/// 787-791`) into a `[tp·rows, d.vocab]` buffer, then copied to `[rows, vocab]` by the reshape
/// after `movedim` (`device_communicators/base_device_communicator.py:184-207`).
fn sampler(
    d: &Dims,
    vocab: u64,
    rows: u64,
    moe_workspace: &[[u64; 3]],
) -> Result<Vec<Tensor>, ModelError> {
    let mut tl = Timeline::new();
    let mut ids: Vec<TensorId> = moe_workspace
        .iter()
        .map(|shape| tl.alloc("fused-MoE workspace", shape, d.dt, VL_MOE_WORKSPACE))
        .collect();
    ids.extend([
        tl.alloc("hidden_states", &[d.t, d.hidden], d.dt, VL_RES),
        tl.alloc("sample_hidden_states", &[rows, d.hidden], d.dt, VL_LOGIT_H),
        tl.alloc(
            "rand_like(hidden_states)",
            &[rows, d.hidden],
            d.dt,
            VL_SAMPLE_RAND,
        ),
    ]);
    if d.vocab < vocab {
        let shard = tl.alloc(
            "logits (this rank's shard)",
            &[rows, d.vocab],
            d.dt,
            VL_LOGITS,
        );
        let gathered = tl.alloc("all_gather buffer", &[rows, vocab], d.dt, VL_GATHER);
        ids.push(tl.alloc("logits", &[rows, vocab], d.dt, VL_GATHER));
        tl.free(gathered);
        tl.free(shard);
    } else {
        ids.push(tl.alloc("logits", &[rows, vocab], d.dt, VL_LOGITS));
    }
    ids.push(tl.alloc("logits (fp32)", &[rows, vocab], DType::F32, VL_LOGITS32));
    ids.push(tl.alloc("probs", &[rows, vocab], DType::F32, VL_PROBS));
    ids.push(tl.alloc("q (exponential)", &[rows, vocab], DType::F32, VL_Q));
    free_all(&mut tl, ids);
    tl.finish()
}
