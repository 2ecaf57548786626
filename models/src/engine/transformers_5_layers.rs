//! transformers 5.x, `Qwen3_5ForCausalLM.forward` on one prefill chunk with fla, SDPA and a
//! `DynamicCache`: one step's layers as the whole-step model ([`crate::StepModel`]) runs them for
//! [`crate::Runtime::Transformers`] — K/V concatenated per layer and repeated to the query heads
//! for SDPA, logits for every token of the chunk. The planner that runs transformers 5.17's
//! `generate` chunk by chunk through the caching allocator is [`super::transformers_5`].
//!
//! Read from transformers' own source (paths under `src/transformers/`, at commit `009e78d6`
//! where a citation says so) and checked against the tensors of transformers 5.17 traced with fla
//! 0.6.0 (`samples/h200/hf-prefill-qwen35`): `models/qwen3_5/modeling_qwen3_5.py`,
//! `cache_utils.py` and `integrations/sdpa_attention.py`.

use crate::step_layers::{
    Dims, LayerPeaks, LayerStep, StepLayer, free_all, gdn_kernel, kernel_layer,
};
use crate::{DType, LayerPeak, ModelError, Tensor, TensorId, Timeline, Variant};

/// transformers' layer kinds for the step: GDN and attention (those the config has), the MLP,
/// then the logits.
pub(crate) fn layers(st: &LayerStep) -> Result<Vec<LayerPeak>, ModelError> {
    let d = &st.d;
    let mut out = LayerPeaks::default();
    out.mixers(st.cfg, || gdn(st), || attention(d))?;
    out.push(StepLayer::Mlp, mlp(d)?);
    out.push(StepLayer::Logits, logits(d)?);
    Ok(out.into_vec())
}

const TF_RES: &str = "transformers src/transformers/models/qwen3_5/modeling_qwen3_5.py Qwen3_5DecoderLayer.forward: hidden_states, residual";
const TF_Z: &str = "transformers@009e78d6 src/transformers/models/qwen3_5/modeling_qwen3_5.py Qwen3_5GatedDeltaNet.forward: z = self.in_proj_z(hidden_states)";
const TF_BA: &str = "transformers@009e78d6 src/transformers/models/qwen3_5/modeling_qwen3_5.py Qwen3_5GatedDeltaNet.forward: b = self.in_proj_b(..); a = self.in_proj_a(..)";
const TF_CONV: &str = "transformers@009e78d6 src/transformers/models/qwen3_5/modeling_qwen3_5.py Qwen3_5GatedDeltaNet.forward: mixed_qkv = causal_conv1d_fn(..) (in_proj_qkv's output is released as the name is rebound)";
const TF_REP: &str = "transformers 5.17 src/transformers/models/qwen3_5/modeling_qwen3_5.py:621/622 Qwen3_5GatedDeltaNet.forward: query/key .repeat_interleave(..) to the value heads (traced with fla 0.6.0: samples/h200/hf-prefill-qwen35)";
const TF_CONTIG: &str = "fla 0.6.0 fla/utils/decorators.py:93 _contiguous_if_needed (from fla/ops/gated_delta_rule/chunk.py:571): a copy of each input that is a strided view of mixed_qkv";
const TF_EMB: &str = "transformers src/transformers/models/qwen3_5/modeling_qwen3_5.py Qwen3_5TextModel.forward: inputs_embeds = self.embed_tokens(input_ids), bound through every layer";
// The lines of beta and g are transformers 5.17's, as traced (samples/h200/hf-prefill-qwen35):
// cited by file alone, g's 2 MiB took the rotary embedding's same-size block at line 202 of the
// same file in the live view's tensor table.
const TF_BETA: &str = "transformers 5.17 src/transformers/models/qwen3_5/modeling_qwen3_5.py:617 Qwen3_5GatedDeltaNet.forward: beta = b.sigmoid() (line traced: samples/h200/hf-prefill-qwen35)";
const TF_G: &str = "transformers 5.17 src/transformers/models/qwen3_5/modeling_qwen3_5.py:619 Qwen3_5GatedDeltaNet.forward: g = -A_log.float().exp() * softplus(a.float() + dt_bias) (line traced: samples/h200/hf-prefill-qwen35)";
const TF_ATT: &str = "transformers src/transformers/models/qwen3_5/modeling_qwen3_5.py Qwen3_5Attention.forward: q_proj (with gate), k_proj, v_proj";
const TF_CACHE: &str = "transformers src/transformers/cache_utils.py DynamicLayer.update: torch.cat([keys, key_states])";
const TF_REPKV: &str = "transformers src/transformers/integrations/sdpa_attention.py repeat_kv (GQA not passed to SDPA)";
const TF_SDPA: &str = "transformers src/transformers/integrations/sdpa_attention.py: torch.nn.functional.scaled_dot_product_attention";
const TF_MLP: &str = "transformers src/transformers/models/qwen3_5/modeling_qwen3_5.py Qwen3_5MLP.forward: down_proj(act_fn(gate_proj(x)) * up_proj(x))";
const TF_LOGITS: &str = "transformers src/transformers/models/qwen3_5/modeling_qwen3_5.py Qwen3_5ForCausalLM.forward: logits = self.lm_head(hidden_states[:, slice_indices, :]) (logits_to_keep=0: every token)";

/// What every layer holds when it starts: the embedding's output (bound by the model's forward
/// through every layer) and the residual stream.
fn carried(tl: &mut Timeline, d: &Dims) -> [TensorId; 3] {
    [
        tl.alloc("inputs_embeds", &[1, d.t, d.hidden], d.dt, TF_EMB),
        tl.alloc("hidden_states", &[1, d.t, d.hidden], d.dt, TF_RES),
        tl.alloc("residual", &[1, d.t, d.hidden], d.dt, TF_RES),
    ]
}

/// One GDN layer of transformers' Qwen3.5 with fla (`Qwen3_5GatedDeltaNet.forward`, read at
/// transformers commit `009e78d6` and checked against the tensors of transformers 5.17 traced
/// with fla 0.6.0, `samples/h200/hf-prefill-qwen35`): the embedding's output (bound by the
/// model's forward through every layer) and the residual stream, `z`, `b`, `a`, the conv output
/// (the qkv projection is released when `mixed_qkv` is rebound), `beta` and the fp32 `g`, q and
/// k repeated to the value heads whenever there are fewer key heads (5.17 repeats with fla 0.6.0
/// too: its lines 621/622 allocate `[1, T, HV, K]` each, and fla's l2norm copies are at HV
/// heads), fla's contiguous copy of each input still a strided view of `mixed_qkv` (v; q and k
/// too when not repeated), then fla's kernel with in-kernel l2norm. Not modelled: the rotary
/// `cos`/`sin` (`[1, T, rotary dim]` each; the config's partial rotary factor is not read), the
/// conv state's concatenation in `update_conv_state`, the gated norm and `out_proj` after the
/// kernel.
fn gdn(st: &LayerStep) -> Result<Vec<Tensor>, ModelError> {
    let d = &st.d;
    let repeat = st.v.gdn == Variant::GdnFla042 || d.hv > d.hk;
    let g = st.gdn_shape(repeat)?;
    let (t, dt) = (d.t, d.dt);
    let key_dim = d.hk * d.kd;
    let value_dim = d.hv * d.vd;
    let mut tl = Timeline::new();
    let mut ids = carried(&mut tl, d).to_vec();
    ids.extend([
        tl.alloc("z", &[1, t, value_dim], dt, TF_Z),
        tl.alloc("b", &[1, t, d.hv], dt, TF_BA),
        tl.alloc("a", &[1, t, d.hv], dt, TF_BA),
        tl.alloc(
            "mixed_qkv (conv)",
            &[1, 2 * key_dim + value_dim, t],
            dt,
            TF_CONV,
        ),
        tl.alloc("beta", &[1, t, d.hv], dt, TF_BETA),
        tl.alloc("g", &[1, t, d.hv], DType::F32, TF_G),
    ]);
    if repeat {
        ids.push(tl.alloc("query (repeated)", &[1, t, d.hv, d.kd], dt, TF_REP));
        ids.push(tl.alloc("key (repeated)", &[1, t, d.hv, d.kd], dt, TF_REP));
    } else {
        ids.push(tl.alloc("query (contiguous)", &[1, t, d.hk, d.kd], dt, TF_CONTIG));
        ids.push(tl.alloc("key (contiguous)", &[1, t, d.hk, d.kd], dt, TF_CONTIG));
    }
    ids.push(tl.alloc("value (contiguous)", &[1, t, d.hv, d.vd], dt, TF_CONTIG));
    kernel_layer(tl, ids, &gdn_kernel(st.v.gdn, &g)?)
}

/// One attention layer of transformers with SDPA and a `DynamicCache`: the projections (q with
/// its gate), the cache's concatenation (the new `[L]` keys, then values, while the old `[L − T]`
/// are still held), K and V repeated to the query heads, and SDPA's output.
fn attention(d: &Dims) -> Result<Vec<Tensor>, ModelError> {
    let (t, dt, l) = (d.t, d.dt, d.l);
    let hd = d.head_dim;
    let mut tl = Timeline::new();
    let mut ids = carried(&mut tl, d).to_vec();
    ids.extend([
        tl.alloc(
            "q (with its gate when gated)",
            &[1, t, d.gate * d.heads * hd],
            dt,
            TF_ATT,
        ),
        tl.alloc("k", &[1, d.kv_heads, t, hd], dt, TF_ATT),
        tl.alloc("v", &[1, d.kv_heads, t, hd], dt, TF_ATT),
    ]);
    let old = l.saturating_sub(t);
    // The cache's new keys and values are the step's KV cache; the old ones are released as the
    // cache rebinds them, so during the concatenation they are an activation.
    if old > 0 {
        let k0 = tl.alloc(
            "keys (cache, before update)",
            &[1, d.kv_heads, old, hd],
            dt,
            TF_CACHE,
        );
        let v0 = tl.alloc(
            "values (cache, before update)",
            &[1, d.kv_heads, old, hd],
            dt,
            TF_CACHE,
        );
        tl.free(k0);
        tl.free(v0);
    }
    ids.push(tl.alloc("key (repeat_kv)", &[1, d.heads, l, hd], dt, TF_REPKV));
    ids.push(tl.alloc("value (repeat_kv)", &[1, d.heads, l, hd], dt, TF_REPKV));
    ids.push(tl.alloc("attn_output", &[1, d.heads, t, hd], dt, TF_SDPA));
    free_all(&mut tl, ids);
    tl.finish()
}

/// transformers' MLP: `gate_proj(x)`, `act_fn(..)`, `up_proj(x)`, the product and `down_proj`.
fn mlp(d: &Dims) -> Result<Vec<Tensor>, ModelError> {
    let (t, dt) = (d.t, d.dt);
    let mut tl = Timeline::new();
    let [emb, hs, res] = carried(&mut tl, d);
    let gate = tl.alloc("gate_proj(x)", &[1, t, d.inter], dt, TF_MLP);
    let act = tl.alloc("act_fn(gate)", &[1, t, d.inter], dt, TF_MLP);
    tl.free(gate);
    let up = tl.alloc("up_proj(x)", &[1, t, d.inter], dt, TF_MLP);
    let prod = tl.alloc("act * up", &[1, t, d.inter], dt, TF_MLP);
    free_all(&mut tl, [act, up]);
    let down = tl.alloc("down_proj", &[1, t, d.hidden], dt, TF_MLP);
    free_all(&mut tl, [prod, down, hs, res, emb]);
    tl.finish()
}

/// transformers' forward without `logits_to_keep` computes logits for every token of the chunk,
/// `[1, T, vocab]` in the model dtype, beside the final hidden states.
fn logits(d: &Dims) -> Result<Vec<Tensor>, ModelError> {
    let mut tl = Timeline::new();
    let emb = tl.alloc("inputs_embeds", &[1, d.t, d.hidden], d.dt, TF_EMB);
    let hs = tl.alloc("hidden_states", &[1, d.t, d.hidden], d.dt, TF_RES);
    let logits = tl.alloc("logits", &[1, d.t, d.vocab], d.dt, TF_LOGITS);
    free_all(&mut tl, [emb, hs, logits]);
    tl.finish()
}
