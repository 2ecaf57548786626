//! The shared machinery of the whole-step layer models: each layer kind of a step as a tensor
//! timeline — what is carried in from earlier layers, the layer's own inputs, its kernel (spliced
//! in from the kernel variant's own tensor list) and what the layer frees. The step's activation
//! peak is the largest of these timelines' peaks.
//!
//! Each [`crate::Runtime`]'s layers are written in its own room of [`crate::engine`], from that
//! program's own source: `engine/workload.rs` (the reference workload's prefill),
//! `engine/torch_script.rs` (`scripts/validate/torch_prefill.py`), `engine/vllm_0_20_1.rs`
//! (vLLM 0.20.1) and `engine/transformers_5_layers.rs` (transformers 5.x); the whole-step model
//! ([`crate::StepModel`]) asks the step's runtime for them. What is carried in is the program's
//! own, and the steady state is modelled: a layer that follows the layers it follows in the
//! config's pattern, with every attention layer's K/V at the step's context.

use std::fmt;

use serde::Serialize;

use crate::{
    DType, FaShape, FfnShape, GdnShape, ModelConfig, ModelError, ServingShape, StepVariants,
    Tensor, TensorId, Timeline, Variant, events, fa_dao_2_5_9, fa_dao_2_8_3, fa_pytorch, ffn,
    gdn_fla_0_4_2, gdn_fla_0_6_0, gdn_vllm_0_10_2, gdn_vllm_0_20_1, peak, tp_split,
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
pub(crate) struct Dims {
    /// Tokens of the step (`chunk × batch`).
    pub(crate) t: u64,
    /// Sequences.
    pub(crate) n: u64,
    /// Context per sequence.
    pub(crate) l: u64,
    pub(crate) hidden: u64,
    /// MLP width on this rank.
    pub(crate) inter: u64,
    pub(crate) hk: u64,
    pub(crate) hv: u64,
    pub(crate) kd: u64,
    pub(crate) vd: u64,
    pub(crate) heads: u64,
    pub(crate) kv_heads: u64,
    pub(crate) head_dim: u64,
    pub(crate) vocab: u64,
    /// 2 when the attention output is gated (q_proj doubled), else 1.
    pub(crate) gate: u64,
    pub(crate) dt: DType,
}

impl Dims {
    pub(crate) fn new(cfg: &ModelConfig, s: &ServingShape) -> Result<Self, ModelError> {
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

/// One step as every layer model reads it: the config, the program's kernels, the serving shape
/// and its per-rank dimensions.
pub(crate) struct LayerStep<'a> {
    pub(crate) cfg: &'a ModelConfig,
    pub(crate) v: &'a StepVariants,
    pub(crate) s: &'a ServingShape,
    pub(crate) d: Dims,
}

impl<'a> LayerStep<'a> {
    pub(crate) fn new(
        cfg: &'a ModelConfig,
        v: &'a StepVariants,
        s: &'a ServingShape,
    ) -> Result<Self, ModelError> {
        Ok(LayerStep {
            cfg,
            v,
            s,
            d: Dims::new(cfg, s)?,
        })
    }

    /// The GDN kernel's shape for the step: one chunk per sequence, the runtime's l2norm, and q
    /// and k at the value heads when the program repeats them before the call (`repeat_qk`).
    pub(crate) fn gdn_shape(&self, repeat_qk: bool) -> Result<GdnShape, ModelError> {
        let s = self.s;
        let seqlens = vec![s.chunk_tokens; s.batch as usize];
        let mut g = GdnShape::from_config(self.cfg, &seqlens, s.tp, s.dtype)?;
        g.l2norm_in_kernel = self.v.l2norm_in_kernel;
        if repeat_qk {
            g.num_k_heads = g.num_v_heads;
        }
        Ok(g)
    }

    /// The FlashAttention varlen forward's shape for the step: one chunk of queries per
    /// sequence, keys up to `max_seqlen_k`.
    pub(crate) fn fa_shape(&self, max_seqlen_k: u64) -> Result<FaShape, ModelError> {
        let s = self.s;
        let seqlens = vec![s.chunk_tokens; s.batch as usize];
        FaShape::from_config(
            self.cfg,
            &seqlens,
            Some(max_seqlen_k),
            s.tp,
            s.dtype,
            s.num_sms,
        )
    }

    /// vLLM 0.20.1's eager dense MLP ([`crate::ffn`]) over the step's tokens.
    pub(crate) fn ffn_kernel(&self) -> Result<Vec<Tensor>, ModelError> {
        let f = FfnShape::from_config(self.cfg, self.d.t, self.s.tp, self.s.dtype)?;
        ffn::tensors(&f)
    }
}

/// A step's layer kinds as a room adds them, each taken to its peak.
#[derive(Default)]
pub(crate) struct LayerPeaks(Vec<LayerPeak>);

impl LayerPeaks {
    /// Adds a layer kind's timeline with its peak.
    pub(crate) fn push(&mut self, kind: StepLayer, tensors: Vec<Tensor>) {
        let p = peak(&tensors);
        self.0.push(LayerPeak {
            kind,
            bytes: p.bytes,
            tensors,
            live: p.live,
        });
    }

    /// Adds the mixers the config has, the GDN layer before the attention layer.
    pub(crate) fn mixers(
        &mut self,
        cfg: &ModelConfig,
        gdn: impl FnOnce() -> Result<Vec<Tensor>, ModelError>,
        attention: impl FnOnce() -> Result<Vec<Tensor>, ModelError>,
    ) -> Result<(), ModelError> {
        if cfg.num_linear_layers() > 0 {
            self.push(StepLayer::Gdn, gdn()?);
        }
        if cfg.num_attention_layers() > 0 {
            self.push(StepLayer::Attention, attention()?);
        }
        Ok(())
    }

    /// The layer kinds in the order they were added.
    pub(crate) fn into_vec(self) -> Vec<LayerPeak> {
        self.0
    }
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
pub(crate) fn splice_named(tl: &mut Timeline, tensors: &[Tensor]) -> Vec<(String, TensorId)> {
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

/// The tensor list of the GDN chunk forward `variant` for `s`.
pub(crate) fn gdn_kernel(variant: Variant, s: &GdnShape) -> Result<Vec<Tensor>, ModelError> {
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

/// The tensor list of the FlashAttention varlen forward `variant` for `s`.
pub(crate) fn fa_kernel(variant: Variant, s: &FaShape) -> Result<Vec<Tensor>, ModelError> {
    match variant {
        Variant::FaDao283 => fa_dao_2_8_3::tensors(s),
        Variant::FaDao259 => fa_dao_2_5_9::tensors(s),
        Variant::FaPytorch => fa_pytorch::tensors(s),
        other => Err(ModelError::Invalid(format!(
            "{other} is not a FlashAttention variant; give one of fa-2.8.3, fa-2.5.9, pytorch"
        ))),
    }
}

/// Frees every tensor in `ids`.
pub(crate) fn free_all(tl: &mut Timeline, ids: impl IntoIterator<Item = TensorId>) {
    for id in ids {
        tl.free(id);
    }
}

/// A layer that ends with a kernel: `kernel` spliced in after the layer's own tensors `ids`, then
/// those and the kernel's outputs freed; the layer's timeline.
pub(crate) fn kernel_layer(
    mut tl: Timeline,
    mut ids: Vec<TensorId>,
    kernel: &[Tensor],
) -> Result<Vec<Tensor>, ModelError> {
    ids.extend(splice(&mut tl, kernel));
    free_all(&mut tl, ids);
    tl.finish()
}
