//! Each layer kind of a step as a tensor timeline: what is carried in from earlier layers, the
//! layer's own inputs, its kernel (spliced in from the kernel variant's own tensor list) and what
//! the layer frees, for each [`Runtime`]. The step's activation peak is the largest of these
//! timelines' peaks.
//!
//! What is carried in is the program's own: the workload frees everything a layer allocates
//! before the next starts (`testbed/workload/src/prefill/layers.rs`); the script's Python names
//! keep a layer's outputs alive until the same name is rebound in a later layer
//! (`scripts/validate/torch_prefill.py`). The steady state is modelled: a layer that follows
//! the layers it follows in the config's pattern, with every attention layer's K/V at the step's
//! context.

use std::fmt;

use serde::Serialize;

use crate::{
    DType, FaShape, FfnShape, GdnShape, ModelConfig, ModelError, Runtime, ServingShape,
    StepVariants, Tensor, TensorId, Timeline, Variant, events, fa_dao_2_5_9, fa_dao_2_8_3,
    fa_pytorch, ffn, gdn_fla_0_4_2, gdn_fla_0_6_0, gdn_vllm_0_10_2, gdn_vllm_0_20_1, peak,
    tp_split,
};

/// The peak of one layer kind within the step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayerPeak {
    /// Which layer kind.
    pub kind: StepLayer,
    /// Bytes live at its peak (the tensors of `tensors` live at `live`).
    pub bytes: u64,
    /// The layer's tensors in allocation order, those carried in from earlier layers first.
    pub tensors: Vec<Tensor>,
    /// Indices into `tensors` of those live at the peak.
    pub live: Vec<usize>,
}

impl LayerPeak {
    /// The tensors live at the peak.
    pub fn live_tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.live.iter().map(|&i| &self.tensors[i])
    }
}

/// A layer kind of a step, as the activation peak names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepLayer {
    /// A Gated DeltaNet (linear attention) layer's mixer.
    Gdn,
    /// A full-attention layer's mixer.
    Attention,
    /// The MLP after a mixer.
    Mlp,
    /// The final norm, `lm_head` and the sampler's fp32 copy.
    Logits,
}

impl fmt::Display for StepLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StepLayer::Gdn => "gdn",
            StepLayer::Attention => "attention",
            StepLayer::Mlp => "mlp",
            StepLayer::Logits => "logits",
        })
    }
}

/// The per-rank dimensions every layer model reads.
struct Dims {
    /// Tokens of the step (`chunk × batch`).
    t: u64,
    /// Sequences.
    n: u64,
    /// Context per sequence.
    l: u64,
    hidden: u64,
    /// MLP width on this rank.
    inter: u64,
    hk: u64,
    hv: u64,
    kd: u64,
    vd: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    vocab: u64,
    /// 2 when the attention output is gated (q_proj doubled), else 1.
    gate: u64,
    dt: DType,
}

impl Dims {
    fn new(cfg: &ModelConfig, s: &ServingShape) -> Result<Self, ModelError> {
        let inter = FfnShape::from_config(cfg, 1, s.tp, s.dtype)?.intermediate;
        Ok(Dims {
            t: s.chunk_tokens * s.batch,
            n: s.batch,
            l: s.context_tokens,
            hidden: cfg.hidden_size,
            inter,
            hk: tp_split("linear_num_key_heads", cfg.linear_num_key_heads, s.tp)?,
            hv: tp_split("linear_num_value_heads", cfg.linear_num_value_heads, s.tp)?,
            kd: cfg.linear_key_head_dim,
            vd: cfg.linear_value_head_dim,
            heads: tp_split("num_attention_heads", cfg.num_attention_heads, s.tp)?,
            kv_heads: tp_split("num_key_value_heads", cfg.num_key_value_heads, s.tp)?,
            head_dim: cfg.head_dim,
            vocab: tp_split("vocab_size", cfg.vocab_size, s.tp).unwrap_or(cfg.vocab_size),
            gate: if cfg.attn_output_gate { 2 } else { 1 },
            dt: s.dtype,
        })
    }
}

/// Every layer kind's peak for the step, in the order GDN, attention, MLP, logits (those the
/// config and the runtime have).
pub(crate) fn layer_peaks(
    cfg: &ModelConfig,
    v: &StepVariants,
    s: &ServingShape,
) -> Result<Vec<LayerPeak>, ModelError> {
    let d = Dims::new(cfg, s)?;
    let mut out = Vec::new();
    let mut push = |kind, tensors: Vec<Tensor>| {
        let p = peak(&tensors);
        out.push(LayerPeak {
            kind,
            bytes: p.bytes,
            tensors,
            live: p.live,
        });
    };
    let has_gdn = cfg.num_linear_layers() > 0;
    let has_attn = cfg.num_attention_layers() > 0;
    match v.runtime {
        Runtime::Workload => {
            if has_gdn {
                push(StepLayer::Gdn, workload_gdn(cfg, v, s, &d)?);
            }
            if has_attn {
                push(StepLayer::Attention, workload_attention(cfg, v, s, &d)?);
            }
            push(StepLayer::Mlp, workload_mlp(cfg, s, &d)?);
        }
        Runtime::TorchPrefillScript => {
            if s.batch != 1 {
                return Err(ModelError::Invalid(format!(
                    "torch_prefill.py prefills one sequence, not {}; give a batch of 1",
                    s.batch
                )));
            }
            let attn_layers = cfg.num_attention_layers();
            if has_gdn {
                push(StepLayer::Gdn, script_gdn(cfg, v, s, &d, attn_layers)?);
            }
            if has_attn {
                push(StepLayer::Attention, script_attention(&d, attn_layers)?);
            }
            push(StepLayer::Mlp, script_mlp(&d, attn_layers, has_gdn)?);
        }
        Runtime::Vllm => {
            if has_gdn {
                push(StepLayer::Gdn, vllm_gdn(cfg, v, s, &d)?);
            }
            if has_attn {
                push(StepLayer::Attention, vllm_attention(cfg, v, s, &d)?);
            }
            push(StepLayer::Mlp, vllm_mlp(cfg, s, &d)?);
            push(StepLayer::Logits, vllm_logits(&d)?);
        }
        Runtime::Transformers => {
            if has_gdn {
                push(StepLayer::Gdn, transformers_gdn(cfg, v, s, &d)?);
            }
            if has_attn {
                push(StepLayer::Attention, transformers_attention(&d)?);
            }
            push(StepLayer::Mlp, transformers_mlp(&d)?);
            push(StepLayer::Logits, transformers_logits(&d)?);
        }
    }
    Ok(out)
}

/// Replays a kernel's tensor list into `tl` in its own order; returns the tensors it does not
/// free (its outputs), in allocation order.
fn splice(tl: &mut Timeline, tensors: &[Tensor]) -> Vec<TensorId> {
    splice_named(tl, tensors)
        .into_iter()
        .map(|(_, id)| id)
        .collect()
}

/// [`splice`], with each output's name.
fn splice_named(tl: &mut Timeline, tensors: &[Tensor]) -> Vec<(String, TensorId)> {
    let mut ids: Vec<Option<TensorId>> = vec![None; tensors.len()];
    for e in events(tensors) {
        match e {
            crate::Event::Alloc { tensor } => {
                let t = &tensors[tensor];
                ids[tensor] = Some(tl.alloc(&t.name, &t.shape, t.dtype, t.source));
            }
            crate::Event::Free { tensor } => {
                if let Some(id) = ids[tensor] {
                    tl.free(id);
                }
            }
        }
    }
    tensors
        .iter()
        .zip(ids)
        .filter(|(t, _)| t.freed_at.is_none())
        .filter_map(|(t, id)| Some((t.name.clone(), id?)))
        .collect()
}

fn gdn_kernel(variant: Variant, s: &GdnShape) -> Result<Vec<Tensor>, ModelError> {
    match variant {
        Variant::GdnFla060 => gdn_fla_0_6_0::tensors(s),
        Variant::GdnFla042 => gdn_fla_0_4_2::tensors(s),
        Variant::GdnVllm0102 => gdn_vllm_0_10_2::tensors(s),
        Variant::GdnVllm0201 => gdn_vllm_0_20_1::tensors(s),
        other => Err(ModelError::Invalid(format!(
            "{other} is not a GDN variant; give one of fla-0.6.0, fla-0.4.2, vllm-0.10.2, vllm-0.20.1"
        ))),
    }
}

fn fa_kernel(variant: Variant, s: &FaShape) -> Result<Vec<Tensor>, ModelError> {
    match variant {
        Variant::FaDao283 => fa_dao_2_8_3::tensors(s),
        Variant::FaDao259 => fa_dao_2_5_9::tensors(s),
        Variant::FaPytorch => fa_pytorch::tensors(s),
        other => Err(ModelError::Invalid(format!(
            "{other} is not a FlashAttention variant; give one of fa-2.8.3, fa-2.5.9, pytorch"
        ))),
    }
}

fn gdn_shape(
    cfg: &ModelConfig,
    v: &StepVariants,
    s: &ServingShape,
    repeat_qk: bool,
) -> Result<GdnShape, ModelError> {
    let seqlens = vec![s.chunk_tokens; s.batch as usize];
    let mut g = GdnShape::from_config(cfg, &seqlens, s.tp, s.dtype)?;
    g.l2norm_in_kernel = v.l2norm_in_kernel;
    if repeat_qk {
        g.num_k_heads = g.num_v_heads;
    }
    Ok(g)
}

/// Frees every tensor in `ids`.
fn free_all(tl: &mut Timeline, ids: impl IntoIterator<Item = TensorId>) {
    for id in ids {
        tl.free(id);
    }
}

// ---- vramtrace-workload prefill ------------------------------------------------------------

const WL_GDN: &str = "testbed/workload/src/gdn.rs allocate_inputs_encoded";
const WL_GDN_IDX: &str = "testbed/workload/src/gdn.rs prepare_chunk_indices / chunk_delta_h (chunk_indices, chunk_offsets)";
const WL_FA: &str = "testbed/workload/src/fa.rs allocate_inputs_encoded";

/// `gdn_layer` (`testbed/workload/src/prefill/layers.rs`): the kernel's inputs (q, k with the
/// key heads, v, fp32 g, beta, the fp32 initial state gathered from the layer's state,
/// `cu_seqlens`), then fla's forward with its two varlen index tensors, all freed by the end of
/// the layer. The index tensors are allocated with the inputs here; fla allocates them inside
/// the call (after the l2norm copies, before `h`) and both live through its peak, so the peak is
/// the same.
fn workload_gdn(
    cfg: &ModelConfig,
    v: &StepVariants,
    s: &ServingShape,
    d: &Dims,
) -> Result<Vec<Tensor>, ModelError> {
    let g = gdn_shape(cfg, v, s, false)?;
    let (t, n, dt) = (d.t, d.n, d.dt);
    let mut tl = Timeline::new();
    let mut ids = vec![
        tl.alloc("q", &[1, t, d.hk, d.kd], dt, WL_GDN),
        tl.alloc("k", &[1, t, d.hk, d.kd], dt, WL_GDN),
        tl.alloc("v", &[1, t, d.hv, d.vd], dt, WL_GDN),
        tl.alloc("g", &[1, t, d.hv], DType::F32, WL_GDN),
        tl.alloc("beta", &[1, t, d.hv], dt, WL_GDN),
        tl.alloc("initial_state", &[n, d.hv, d.kd, d.vd], DType::F32, WL_GDN),
        tl.alloc("cu_seqlens", &[n + 1], DType::I64, WL_GDN),
        tl.alloc(
            "chunk_indices",
            &[g.num_chunks(), 2],
            DType::I64,
            WL_GDN_IDX,
        ),
        tl.alloc("chunk_offsets", &[n + 1], DType::I64, WL_GDN_IDX),
    ];
    ids.extend(splice(&mut tl, &gdn_kernel(v.gdn, &g)?));
    free_all(&mut tl, ids);
    tl.finish()
}

/// `attention_layer`: q, k, v of the chunk and the two `cu_seqlens`, then FlashAttention over
/// the chunk's own keys (the workload's outputs are sized by the chunk, not the context).
fn workload_attention(
    cfg: &ModelConfig,
    v: &StepVariants,
    s: &ServingShape,
    d: &Dims,
) -> Result<Vec<Tensor>, ModelError> {
    let seqlens = vec![s.chunk_tokens; s.batch as usize];
    let fa = FaShape::from_config(
        cfg,
        &seqlens,
        Some(s.chunk_tokens),
        s.tp,
        s.dtype,
        s.num_sms,
    )?;
    let (t, n, dt) = (d.t, d.n, d.dt);
    let mut tl = Timeline::new();
    let mut ids = vec![
        tl.alloc("q", &[t, d.heads, d.head_dim], dt, WL_FA),
        tl.alloc("k", &[t, d.kv_heads, d.head_dim], dt, WL_FA),
        tl.alloc("v", &[t, d.kv_heads, d.head_dim], dt, WL_FA),
        tl.alloc("cu_seqlens_q", &[n + 1], DType::I32, WL_FA),
        tl.alloc("cu_seqlens_k", &[n + 1], DType::I32, WL_FA),
    ];
    ids.extend(splice(&mut tl, &fa_kernel(v.attention, &fa)?));
    free_all(&mut tl, ids);
    tl.finish()
}

/// `mlp`: vLLM 0.20.1's eager dense MLP allocations ([`crate::ffn`]), nothing else.
fn workload_mlp(cfg: &ModelConfig, s: &ServingShape, d: &Dims) -> Result<Vec<Tensor>, ModelError> {
    let f = FfnShape::from_config(cfg, d.t, s.tp, s.dtype)?;
    let mut tl = Timeline::new();
    let ids = splice(&mut tl, &ffn::tensors(&f)?);
    free_all(&mut tl, ids);
    tl.finish()
}

// ---- scripts/validate/torch_prefill.py -----------------------------------------------------

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
fn script_gdn_width(d: &Dims) -> u64 {
    2 * d.hk * d.kd + d.hv * d.vd + 2 * d.hv
}

/// The script's fused attention projection width: q, k, v (`torch_prefill.py:39`).
fn script_attn_width(d: &Dims) -> u64 {
    (d.heads + 2 * d.kv_heads) * d.head_dim
}

/// The script's weights (`make_layers`, `torch_prefill.py:31-44`), in the activation dtype: per
/// layer the MLP's `up [hidden, 2I]` and `down [I, hidden]`, and the mixer's fused projection and
/// output; no embedding, norms or `lm_head`.
pub(crate) fn script_weight_bytes(cfg: &ModelConfig, s: &ServingShape) -> Result<u64, ModelError> {
    let d = Dims::new(cfg, s)?;
    let w = u128::from;
    let mlp = w(d.hidden) * w(2 * d.inter) + w(d.inter) * w(d.hidden);
    let gdn = w(d.hidden) * w(script_gdn_width(&d)) + w(d.hv * d.vd) * w(d.hidden);
    let attn = w(d.hidden) * w(script_attn_width(&d)) + w(d.heads * d.head_dim) * w(d.hidden);
    let params = w(cfg.num_hidden_layers) * mlp
        + w(cfg.num_linear_layers()) * gdn
        + w(cfg.num_attention_layers()) * attn;
    crate::error::fit_bytes("the script's weights", params * w(d.dt.size_bytes()))
}

/// The script keeps each chunk's K and V as views of its fused qkv projection
/// (`torch_prefill.py:71`), so every attention layer holds the whole projection per token.
pub(crate) fn script_kv_bytes_per_token(
    cfg: &ModelConfig,
    s: &ServingShape,
) -> Result<u64, ModelError> {
    let d = Dims::new(cfg, s)?;
    crate::error::fit_bytes(
        "the script's K/V per token",
        u128::from(cfg.num_attention_layers())
            * u128::from(script_attn_width(&d))
            * u128::from(d.dt.size_bytes()),
    )
}

/// The repeated K and V of the last attention layer (`kc`, `vc` stay bound until the next
/// attention layer rebinds them): at the step's context once two attention layers ran in it;
/// with one attention layer, the previous chunk's.
fn script_old_kv_tokens(d: &Dims, attn_layers: u64) -> u64 {
    if attn_layers >= 2 { d.l } else { d.l - d.t }
}

/// What a GDN layer of the script leaves bound when the next layer starts: `qkv` (kept by the
/// view `b`), `g`, `beta`, the repeated `q` and `k`, and `o`.
fn script_gdn_leftovers(tl: &mut Timeline, d: &Dims) -> [TensorId; 6] {
    let (t, dt) = (d.t, d.dt);
    [
        tl.alloc(
            "qkv (gdn, held by b)",
            &[t, script_gdn_width(d)],
            dt,
            SC_QKV,
        ),
        tl.alloc("g", &[1, t, d.hv], DType::F32, SC_G),
        tl.alloc("beta", &[1, t, d.hv], dt, SC_BETA),
        tl.alloc("q (repeated)", &[1, t, d.hv, d.kd], dt, SC_Q),
        tl.alloc("k (repeated)", &[1, t, d.hv, d.kd], dt, SC_K),
        tl.alloc("o (gdn)", &[1, t, d.hv, d.vd], dt, SC_O_GDN),
    ]
}

/// `x = x + mm @ w` at line 79: the product, the new `x`, then the product and the old `x` go.
fn script_residual_add(tl: &mut Timeline, d: &Dims, x: TensorId) -> TensorId {
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
fn script_gdn(
    cfg: &ModelConfig,
    v: &StepVariants,
    s: &ServingShape,
    d: &Dims,
    attn_layers: u64,
) -> Result<Vec<Tensor>, ModelError> {
    let (t, dt) = (d.t, d.dt);
    let mut tl = Timeline::new();
    let x = tl.alloc("x", &[t, d.hidden], dt, SC_X);
    let h = tl.alloc("h", &[t, 2 * d.inter], dt, SC_H);
    let mut kept = vec![h];
    if attn_layers > 0 {
        kept.push(tl.alloc("kc", &[d.l, d.heads, d.head_dim], dt, SC_KC));
        kept.push(tl.alloc("vc", &[d.l, d.heads, d.head_dim], dt, SC_VC));
    }
    let [qkv0, g0, beta0, q0, k0, o0] = script_gdn_leftovers(&mut tl, d);
    let qkv = tl.alloc("qkv (gdn)", &[t, script_gdn_width(d)], dt, SC_QKV);
    free_all(&mut tl, [qkv0, g0, q0, k0]);
    let q = tl.alloc("q (repeated)", &[1, t, d.hv, d.kd], dt, SC_Q);
    let k = tl.alloc("k (repeated)", &[1, t, d.hv, d.kd], dt, SC_K);
    let gf = tl.alloc("g.float()", &[t, d.hv], DType::F32, SC_GF);
    let g = tl.alloc("g", &[1, t, d.hv], DType::F32, SC_G);
    tl.free(gf);
    let beta = tl.alloc("beta", &[1, t, d.hv], dt, SC_BETA);
    tl.free(beta0);
    let outs = splice_named(&mut tl, &gdn_kernel(v.gdn, &gdn_shape(cfg, v, s, true)?)?);
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
    let x2 = script_residual_add(&mut tl, d, x);
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
fn script_attention(d: &Dims, attn_layers: u64) -> Result<Vec<Tensor>, ModelError> {
    let (t, dt, l) = (d.t, d.dt, d.l);
    let old = script_old_kv_tokens(d, attn_layers);
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
    let [qkv_gdn, g, beta, q, k, o_gdn] = script_gdn_leftovers(&mut tl, d);
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
    let x2 = script_residual_add(&mut tl, d, x);
    free_all(&mut tl, [h, kc, vc, qkv_gdn, g, beta, o, x2]);
    tl.finish()
}

/// The MLP of the script after a GDN layer (its leftovers and the repeated q and k still bound,
/// `kc` and `vc` too): the new `h` while the previous is bound, `silu(gate)`, the product, the
/// down projection and the residual add.
fn script_mlp(d: &Dims, attn_layers: u64, has_gdn: bool) -> Result<Vec<Tensor>, ModelError> {
    let (t, dt) = (d.t, d.dt);
    let mut tl = Timeline::new();
    let x = tl.alloc("x", &[t, d.hidden], dt, SC_X79);
    let h0 = tl.alloc("h (previous layer)", &[t, 2 * d.inter], dt, SC_H);
    let mut kept = Vec::new();
    if attn_layers > 0 {
        kept.push(tl.alloc("kc", &[d.l, d.heads, d.head_dim], dt, SC_KC));
        kept.push(tl.alloc("vc", &[d.l, d.heads, d.head_dim], dt, SC_VC));
    }
    if has_gdn {
        kept.extend(script_gdn_leftovers(&mut tl, d));
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

// ---- vLLM 0.20.1 ---------------------------------------------------------------------------

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
const VL_LOGITS32: &str =
    "vllm-0.20.1 vllm/v1/sample/sampler.py Sampler.forward: logits = logits.to(torch.float32)";

/// One GDN layer of vLLM 0.20.1 on the Triton prefill path, as far as modelled: the residual
/// stream (`hidden_states` and `residual`), the `in_proj_qkvz` and `in_proj_ba` outputs with
/// contiguous copies of `b` and `a`, the output buffer `core_attn_out`, the conv output, fp32 `g` and `beta`, the normalised q/k and
/// contiguous v handed to the kernel (`fused_post_conv_prep`), then the kernel. Not modelled:
/// the gated norm's and `out_proj`'s outputs after the kernel (below its peak), the metadata
/// tensors, and FlashInfer's GDN prefill (vLLM's default on SM90, a different kernel).
fn vllm_gdn(
    cfg: &ModelConfig,
    v: &StepVariants,
    s: &ServingShape,
    d: &Dims,
) -> Result<Vec<Tensor>, ModelError> {
    let g = gdn_shape(cfg, v, s, false)?;
    let (t, dt) = (d.t, d.dt);
    let key_dim = d.hk * d.kd;
    let value_dim = d.hv * d.vd;
    let mut tl = Timeline::new();
    let mut ids = vec![
        tl.alloc("hidden_states", &[t, d.hidden], dt, VL_RES),
        tl.alloc("residual", &[t, d.hidden], dt, VL_RES),
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
    ];
    ids.extend(splice(&mut tl, &gdn_kernel(v.gdn, &g)?));
    free_all(&mut tl, ids);
    tl.finish()
}

/// One attention layer of vLLM 0.20.1: the residual stream, the fused qkv projection (q doubled
/// by the output gate), then FlashAttention's varlen forward over the paged cache (its outputs
/// are sized by the queries; the K/V are written into the cache in place).
fn vllm_attention(
    cfg: &ModelConfig,
    v: &StepVariants,
    s: &ServingShape,
    d: &Dims,
) -> Result<Vec<Tensor>, ModelError> {
    let seqlens = vec![s.chunk_tokens; s.batch as usize];
    let fa = FaShape::from_config(
        cfg,
        &seqlens,
        Some(s.context_tokens),
        s.tp,
        s.dtype,
        s.num_sms,
    )?;
    let (t, dt) = (d.t, d.dt);
    let width = (d.gate * d.heads + 2 * d.kv_heads) * d.head_dim;
    let mut tl = Timeline::new();
    let mut ids = vec![
        tl.alloc("hidden_states", &[t, d.hidden], dt, VL_RES),
        tl.alloc("residual", &[t, d.hidden], dt, VL_RES),
        tl.alloc("qkv", &[t, width], dt, VL_ATT_QKV),
    ];
    ids.extend(splice(&mut tl, &fa_kernel(v.attention, &fa)?));
    free_all(&mut tl, ids);
    tl.finish()
}

/// vLLM's dense MLP ([`crate::ffn`]) beside the residual stream.
fn vllm_mlp(cfg: &ModelConfig, s: &ServingShape, d: &Dims) -> Result<Vec<Tensor>, ModelError> {
    let f = FfnShape::from_config(cfg, d.t, s.tp, s.dtype)?;
    let mut tl = Timeline::new();
    let mut ids = vec![
        tl.alloc("hidden_states", &[d.t, d.hidden], d.dt, VL_RES),
        tl.alloc("residual", &[d.t, d.hidden], d.dt, VL_RES),
    ];
    ids.extend(splice(&mut tl, &ffn::tensors(&f)?));
    free_all(&mut tl, ids);
    tl.finish()
}

/// vLLM computes logits for one row per sequence (`logits_indices`, the last scheduled token),
/// in the model dtype, then the sampler's fp32 copy: `[N, vocab]` twice, beside the final hidden
/// states.
fn vllm_logits(d: &Dims) -> Result<Vec<Tensor>, ModelError> {
    let mut tl = Timeline::new();
    let hs = tl.alloc("hidden_states", &[d.t, d.hidden], d.dt, VL_RES);
    let rows = tl.alloc("sample_hidden_states", &[d.n, d.hidden], d.dt, VL_LOGIT_H);
    let logits = tl.alloc("logits", &[d.n, d.vocab], d.dt, VL_LOGITS);
    let l32 = tl.alloc("logits (fp32)", &[d.n, d.vocab], DType::F32, VL_LOGITS32);
    free_all(&mut tl, [hs, rows, logits, l32]);
    tl.finish()
}

// ---- transformers 5.x Qwen3.5 --------------------------------------------------------------

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
fn transformers_gdn(
    cfg: &ModelConfig,
    v: &StepVariants,
    s: &ServingShape,
    d: &Dims,
) -> Result<Vec<Tensor>, ModelError> {
    let repeat = v.gdn == Variant::GdnFla042 || d.hv > d.hk;
    let g = gdn_shape(cfg, v, s, repeat)?;
    let (t, dt) = (d.t, d.dt);
    let key_dim = d.hk * d.kd;
    let value_dim = d.hv * d.vd;
    let mut tl = Timeline::new();
    let mut ids = vec![
        tl.alloc("inputs_embeds", &[1, t, d.hidden], dt, TF_EMB),
        tl.alloc("hidden_states", &[1, t, d.hidden], dt, TF_RES),
        tl.alloc("residual", &[1, t, d.hidden], dt, TF_RES),
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
    ];
    if repeat {
        ids.push(tl.alloc("query (repeated)", &[1, t, d.hv, d.kd], dt, TF_REP));
        ids.push(tl.alloc("key (repeated)", &[1, t, d.hv, d.kd], dt, TF_REP));
    } else {
        ids.push(tl.alloc("query (contiguous)", &[1, t, d.hk, d.kd], dt, TF_CONTIG));
        ids.push(tl.alloc("key (contiguous)", &[1, t, d.hk, d.kd], dt, TF_CONTIG));
    }
    ids.push(tl.alloc("value (contiguous)", &[1, t, d.hv, d.vd], dt, TF_CONTIG));
    ids.extend(splice(&mut tl, &gdn_kernel(v.gdn, &g)?));
    free_all(&mut tl, ids);
    tl.finish()
}

/// One attention layer of transformers with SDPA and a `DynamicCache`: the projections (q with
/// its gate), the cache's concatenation (the new `[L]` keys, then values, while the old `[L − T]`
/// are still held), K and V repeated to the query heads, and SDPA's output.
fn transformers_attention(d: &Dims) -> Result<Vec<Tensor>, ModelError> {
    let (t, dt, l) = (d.t, d.dt, d.l);
    let hd = d.head_dim;
    let mut tl = Timeline::new();
    let mut ids = vec![
        tl.alloc("inputs_embeds", &[1, t, d.hidden], dt, TF_EMB),
        tl.alloc("hidden_states", &[1, t, d.hidden], dt, TF_RES),
        tl.alloc("residual", &[1, t, d.hidden], dt, TF_RES),
        tl.alloc(
            "q (with its gate when gated)",
            &[1, t, d.gate * d.heads * hd],
            dt,
            TF_ATT,
        ),
        tl.alloc("k", &[1, d.kv_heads, t, hd], dt, TF_ATT),
        tl.alloc("v", &[1, d.kv_heads, t, hd], dt, TF_ATT),
    ];
    let old = l - t;
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
fn transformers_mlp(d: &Dims) -> Result<Vec<Tensor>, ModelError> {
    let (t, dt) = (d.t, d.dt);
    let mut tl = Timeline::new();
    let emb = tl.alloc("inputs_embeds", &[1, t, d.hidden], dt, TF_EMB);
    let hs = tl.alloc("hidden_states", &[1, t, d.hidden], dt, TF_RES);
    let res = tl.alloc("residual", &[1, t, d.hidden], dt, TF_RES);
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
fn transformers_logits(d: &Dims) -> Result<Vec<Tensor>, ModelError> {
    let mut tl = Timeline::new();
    let emb = tl.alloc("inputs_embeds", &[1, d.t, d.hidden], d.dt, TF_EMB);
    let hs = tl.alloc("hidden_states", &[1, d.t, d.hidden], d.dt, TF_RES);
    let logits = tl.alloc("logits", &[1, d.t, d.vocab], d.dt, TF_LOGITS);
    free_all(&mut tl, [emb, hs, logits]);
    tl.finish()
}
