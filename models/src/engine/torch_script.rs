//! The project's validation script `scripts/validate/torch_prefill.py` (the `samples/h200/torch-oom`
//! sample): plain PyTorch layers prefilling one sequence chunk by chunk, as the whole-step model
//! ([`crate::StepModel`]) runs them for [`crate::Runtime::TorchPrefillScript`]: the script's
//! weights, its K/V per token, its recurrent state and each layer kind's tensors.
//!
//! Read from the script itself (each tensor cites its line): its Python names keep a layer's
//! outputs alive until the same name is rebound in a later layer, its K/V are kept as views of
//! each chunk's fused qkv projection, and attention runs over K/V concatenated and repeated to the
//! query heads (fla 0.6.0 for the GDN layers).

use crate::error::fit_bytes;
use crate::step_layers::{
    Dims, LayerPeaks, LayerStep, StepLayer, free_all, gdn_kernel, splice_named,
};
use crate::{
    DType, LayerPeak, ModelConfig, ModelError, ServingShape, Tensor, TensorId, Timeline, tp_split,
};

/// The script's layer kinds for the step: GDN and attention (those the config has), then the
/// MLP; the script prefills one sequence, so a batch of more is refused.
pub(crate) fn layers(st: &LayerStep) -> Result<Vec<LayerPeak>, ModelError> {
    if st.s.batch != 1 {
        return Err(ModelError::Invalid(format!(
            "torch_prefill.py prefills one sequence, not {}; give a batch of 1",
            st.s.batch
        )));
    }
    let attn_layers = st.cfg.num_attention_layers();
    let has_gdn = st.cfg.num_linear_layers() > 0;
    let mut out = LayerPeaks::default();
    out.mixers(
        st.cfg,
        || gdn(st, attn_layers),
        || attention(&st.d, attn_layers),
    )?;
    out.push(StepLayer::Mlp, mlp(&st.d, attn_layers, has_gdn)?);
    Ok(out.into_vec())
}

const SC_X: &str = "scripts/validate/torch_prefill.py:82 x = x + (silu(gate) * upv) @ down";
const SC_H: &str = "scripts/validate/torch_prefill.py:80 h = x @ up";
const SC_QKV: &str = "scripts/validate/torch_prefill.py:55 qkv = x @ qkv_w";
const SC_Q: &str = "scripts/validate/torch_prefill.py:59 q = q.view(..).repeat_interleave(3, 2)";
const SC_K: &str = "scripts/validate/torch_prefill.py:60 k = k.view(..).repeat_interleave(3, 2)";
const SC_GF: &str = "scripts/validate/torch_prefill.py:62 g.float()";
const SC_G: &str = "scripts/validate/torch_prefill.py:62 g = logsigmoid(g.float())";
const SC_BETA: &str = "scripts/validate/torch_prefill.py:63 beta = b.sigmoid()";
const SC_O_GDN: &str = "fla-0.6.0 fla/ops/common/chunk_o.py:565 torch.empty_like(v), bound to o at scripts/validate/torch_prefill.py:64";
const SC_CAT_K: &str = "scripts/validate/torch_prefill.py:72 torch.cat(K views)";
const SC_KC: &str = "scripts/validate/torch_prefill.py:72 kc = cat(..).repeat_interleave(6, 1)";
const SC_CAT_V: &str = "scripts/validate/torch_prefill.py:73 torch.cat(V views)";
const SC_VC: &str = "scripts/validate/torch_prefill.py:73 vc = cat(..).repeat_interleave(6, 1)";
const SC_SDPA: &str =
    "scripts/validate/torch_prefill.py:74 scaled_dot_product_attention (flash: out)";
const SC_LSE: &str =
    "scripts/validate/torch_prefill.py:74 scaled_dot_product_attention (flash: logsumexp)";
const SC_O_ATTN: &str =
    "scripts/validate/torch_prefill.py:78 o.squeeze(0).transpose(0, 1).reshape(n, -1)";
const SC_MM_O: &str = "scripts/validate/torch_prefill.py:79 o @ o_w";
const SC_X79: &str = "scripts/validate/torch_prefill.py:79 x = x + o @ o_w";
const SC_SILU: &str = "scripts/validate/torch_prefill.py:82 silu(gate)";
const SC_PROD: &str = "scripts/validate/torch_prefill.py:82 silu(gate) * upv";
const SC_DOWN: &str = "scripts/validate/torch_prefill.py:82 (..) @ down";

/// The script's fused GDN projection width: q and k with the key heads, v, g and b
/// (`torch_prefill.py:42`); no output gate `z`.
fn gdn_width(d: &Dims) -> u64 {
    2 * d.hk * d.kd + d.hv * d.vd + 2 * d.hv
}

/// The script's fused attention projection width: q, k, v (`torch_prefill.py:39`).
fn attn_width(d: &Dims) -> u64 {
    (d.heads + 2 * d.kv_heads) * d.head_dim
}

/// The script's weights (`make_layers`, `torch_prefill.py:31-44`), in the activation dtype: per
/// layer the MLP's `up [hidden, 2I]` and `down [I, hidden]`, and the mixer's fused projection and
/// output; no embedding, norms or `lm_head`.
pub(crate) fn weight_bytes(cfg: &ModelConfig, s: &ServingShape) -> Result<u64, ModelError> {
    let d = Dims::new(cfg, s)?;
    let w = u128::from;
    let mlp = w(d.hidden) * w(2 * d.inter) + w(d.inter) * w(d.hidden);
    let gdn = w(d.hidden) * w(gdn_width(&d)) + w(d.hv * d.vd) * w(d.hidden);
    let attn = w(d.hidden) * w(attn_width(&d)) + w(d.heads * d.head_dim) * w(d.hidden);
    let params = w(cfg.num_hidden_layers) * mlp
        + w(cfg.num_linear_layers()) * gdn
        + w(cfg.num_attention_layers()) * attn;
    fit_bytes("the script's weights", params * w(d.dt.size_bytes()))
}

/// The script keeps each chunk's K and V as views of its fused qkv projection
/// (`torch_prefill.py:71`), so every attention layer holds the whole projection per token.
pub(crate) fn kv_bytes_per_token(cfg: &ModelConfig, s: &ServingShape) -> Result<u64, ModelError> {
    let d = Dims::new(cfg, s)?;
    fit_bytes(
        "the script's K/V per token",
        u128::from(cfg.num_attention_layers())
            * u128::from(attn_width(&d))
            * u128::from(d.dt.size_bytes()),
    )
}

/// The script's recurrent state per sequence: `state[i]` is the fp32 final state fla returns
/// (`torch_prefill.py:64`), one per GDN layer; the script keeps no conv state.
pub(crate) fn state_bytes_per_seq(cfg: &ModelConfig, s: &ServingShape) -> Result<u64, ModelError> {
    let w = u128::from;
    let hv = tp_split("linear_num_value_heads", cfg.linear_num_value_heads, s.tp)?;
    fit_bytes(
        "the GDN state",
        w(cfg.num_linear_layers())
            * w(hv)
            * w(cfg.linear_key_head_dim)
            * w(cfg.linear_value_head_dim)
            * w(DType::F32.size_bytes()),
    )
}

/// The repeated K and V of the last attention layer (`kc`, `vc` stay bound until the next
/// attention layer rebinds them): at the step's context once two attention layers ran in it;
/// with one attention layer, the previous chunk's.
fn old_kv_tokens(d: &Dims, attn_layers: u64) -> u64 {
    if attn_layers >= 2 { d.l } else { d.l - d.t }
}

/// What a GDN layer of the script leaves bound when the next layer starts: `qkv` (kept by the
/// view `b`), `g`, `beta`, the repeated `q` and `k`, and `o`.
fn gdn_leftovers(tl: &mut Timeline, d: &Dims) -> [TensorId; 6] {
    let (t, dt) = (d.t, d.dt);
    [
        tl.alloc("qkv (gdn, held by b)", &[t, gdn_width(d)], dt, SC_QKV),
        tl.alloc("g", &[1, t, d.hv], DType::F32, SC_G),
        tl.alloc("beta", &[1, t, d.hv], dt, SC_BETA),
        tl.alloc("q (repeated)", &[1, t, d.hv, d.kd], dt, SC_Q),
        tl.alloc("k (repeated)", &[1, t, d.hv, d.kd], dt, SC_K),
        tl.alloc("o (gdn)", &[1, t, d.hv, d.vd], dt, SC_O_GDN),
    ]
}

/// The last attention layer's `kc` and `vc` at the step's context, still bound while a later GDN
/// layer or MLP runs (none in a model without attention layers).
fn held_kv(tl: &mut Timeline, d: &Dims, attn_layers: u64) -> Vec<TensorId> {
    if attn_layers == 0 {
        return Vec::new();
    }
    vec![
        tl.alloc("kc", &[d.l, d.heads, d.head_dim], d.dt, SC_KC),
        tl.alloc("vc", &[d.l, d.heads, d.head_dim], d.dt, SC_VC),
    ]
}

/// `x = x + mm @ w` at line 79: the product, the new `x`, then the product and the old `x` go.
fn residual_add(tl: &mut Timeline, d: &Dims, x: TensorId) -> TensorId {
    let mm = tl.alloc("o @ o_w", &[d.t, d.hidden], d.dt, SC_MM_O);
    let x2 = tl.alloc("x", &[d.t, d.hidden], d.dt, SC_X79);
    tl.free(mm);
    tl.free(x);
    x2
}

/// A GDN layer of the script after another GDN layer, with the last attention layer's `kc`,
/// `vc` still bound: the new projection, the split releasing the previous layer's leftovers,
/// the repeated q and k (fla gets them with the value heads), g and beta, fla's forward with
/// in-kernel l2norm, then `o` and the state rebound and the residual add.
fn gdn(st: &LayerStep, attn_layers: u64) -> Result<Vec<Tensor>, ModelError> {
    let d = &st.d;
    let (t, dt) = (d.t, d.dt);
    let mut tl = Timeline::new();
    let x = tl.alloc("x", &[t, d.hidden], dt, SC_X);
    let h = tl.alloc("h", &[t, 2 * d.inter], dt, SC_H);
    let mut kept = vec![h];
    kept.extend(held_kv(&mut tl, d, attn_layers));
    let [qkv0, g0, beta0, q0, k0, o0] = gdn_leftovers(&mut tl, d);
    let qkv = tl.alloc("qkv (gdn)", &[t, gdn_width(d)], dt, SC_QKV);
    free_all(&mut tl, [qkv0, g0, q0, k0]);
    let q = tl.alloc("q (repeated)", &[1, t, d.hv, d.kd], dt, SC_Q);
    let k = tl.alloc("k (repeated)", &[1, t, d.hv, d.kd], dt, SC_K);
    let gf = tl.alloc("g.float()", &[t, d.hv], DType::F32, SC_GF);
    let g = tl.alloc("g", &[1, t, d.hv], DType::F32, SC_G);
    tl.free(gf);
    let beta = tl.alloc("beta", &[1, t, d.hv], dt, SC_BETA);
    tl.free(beta0);
    let outs = splice_named(&mut tl, &gdn_kernel(st.v.gdn, &st.gdn_shape(true)?)?);
    tl.free(o0);
    // `o, state[i] = ...`: the previous `o` goes; the old state goes and the new one is the
    // layer's state, which the step counts once, so the kernel's final_state is released here.
    let mut o = Vec::new();
    for (name, id) in outs {
        if name == "o" {
            o.push(id);
        } else {
            tl.free(id);
        }
    }
    let x2 = residual_add(&mut tl, d, x);
    free_all(&mut tl, kept);
    free_all(&mut tl, [x2, qkv, q, k, g, beta]);
    free_all(&mut tl, o);
    tl.finish()
}

/// An attention layer of the script after a GDN layer: the split releases the repeated q and k,
/// `kc` and `vc` are rebuilt by concatenating every chunk's K (then V) views and repeating them
/// to the query heads while the previous layer's are still bound, then SDPA (flash: the output
/// and its fp32 logsumexp), the transposed copy of `o` and the residual add. The projection
/// itself is the K/V cache (its views are kept), so it is not an activation here.
fn attention(d: &Dims, attn_layers: u64) -> Result<Vec<Tensor>, ModelError> {
    let (t, dt, l) = (d.t, d.dt, d.l);
    let old = old_kv_tokens(d, attn_layers);
    let mut tl = Timeline::new();
    let x = tl.alloc("x", &[t, d.hidden], dt, SC_X);
    let h = tl.alloc("h", &[t, 2 * d.inter], dt, SC_H);
    let old_kv = (old > 0).then(|| {
        (
            tl.alloc(
                "kc (previous layer)",
                &[old, d.heads, d.head_dim],
                dt,
                SC_KC,
            ),
            tl.alloc(
                "vc (previous layer)",
                &[old, d.heads, d.head_dim],
                dt,
                SC_VC,
            ),
        )
    });
    let [qkv_gdn, g, beta, q, k, o_gdn] = gdn_leftovers(&mut tl, d);
    free_all(&mut tl, [q, k]);
    let cat_k = tl.alloc("cat(K)", &[l, d.kv_heads, d.head_dim], dt, SC_CAT_K);
    let kc = tl.alloc("kc", &[l, d.heads, d.head_dim], dt, SC_KC);
    if let Some((kc0, _)) = old_kv {
        tl.free(kc0);
    }
    tl.free(cat_k);
    let cat_v = tl.alloc("cat(V)", &[l, d.kv_heads, d.head_dim], dt, SC_CAT_V);
    let vc = tl.alloc("vc", &[l, d.heads, d.head_dim], dt, SC_VC);
    if let Some((_, vc0)) = old_kv {
        tl.free(vc0);
    }
    tl.free(cat_v);
    let out = tl.alloc("sdpa out", &[1, d.heads, t, d.head_dim], dt, SC_SDPA);
    let lse = tl.alloc("logsumexp", &[1, d.heads, t], DType::F32, SC_LSE);
    tl.free(lse);
    tl.free(o_gdn);
    let o = tl.alloc("o (attention)", &[t, d.heads * d.head_dim], dt, SC_O_ATTN);
    tl.free(out);
    let x2 = residual_add(&mut tl, d, x);
    free_all(&mut tl, [h, kc, vc, qkv_gdn, g, beta, o, x2]);
    tl.finish()
}

/// The MLP of the script after a GDN layer (its leftovers and the repeated q and k still bound,
/// `kc` and `vc` too): the new `h` while the previous is bound, `silu(gate)`, the product, the
/// down projection and the residual add.
fn mlp(d: &Dims, attn_layers: u64, has_gdn: bool) -> Result<Vec<Tensor>, ModelError> {
    let (t, dt) = (d.t, d.dt);
    let mut tl = Timeline::new();
    let x = tl.alloc("x", &[t, d.hidden], dt, SC_X79);
    let h0 = tl.alloc("h (previous layer)", &[t, 2 * d.inter], dt, SC_H);
    let mut kept = held_kv(&mut tl, d, attn_layers);
    if has_gdn {
        kept.extend(gdn_leftovers(&mut tl, d));
    }
    let h = tl.alloc("h", &[t, 2 * d.inter], dt, SC_H);
    tl.free(h0);
    let silu = tl.alloc("silu(gate)", &[t, d.inter], dt, SC_SILU);
    let prod = tl.alloc("silu(gate) * upv", &[t, d.inter], dt, SC_PROD);
    tl.free(silu);
    let down = tl.alloc("@ down", &[t, d.hidden], dt, SC_DOWN);
    tl.free(prod);
    let x2 = tl.alloc("x", &[t, d.hidden], dt, SC_X);
    tl.free(down);
    tl.free(x);
    free_all(&mut tl, kept);
    free_all(&mut tl, [h, x2]);
    tl.finish()
}
