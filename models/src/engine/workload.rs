//! The project's reference workload, `vramtrace-workload prefill` (`testbed/workload/src/prefill/`;
//! `vramtrace demo` and the `samples/h200/prefill-18gib` sample), one chunk's layers as the
//! whole-step model ([`crate::StepModel`]) runs them for [`crate::Runtime::Workload`].
//!
//! Read from `testbed/workload/src/prefill/layers.rs` (`gdn_layer`, `attention_layer`, `mlp`) and
//! the kernels' input allocations in `testbed/workload/src/gdn.rs` and
//! `testbed/workload/src/fa.rs`: the workload frees everything a layer allocates before the next
//! starts, so nothing is carried in from earlier layers; there is no residual stream, no
//! projection and no sampler.

use crate::step_layers::{LayerPeaks, LayerStep, StepLayer, fa_kernel, gdn_kernel, kernel_layer};
use crate::{DType, LayerPeak, ModelError, Tensor, Timeline};

/// The workload's layer kinds for the step: GDN and attention (those the config has), then the
/// MLP.
pub(crate) fn layers(st: &LayerStep) -> Result<Vec<LayerPeak>, ModelError> {
    let mut out = LayerPeaks::default();
    out.mixers(st.cfg, || gdn(st), || attention(st))?;
    out.push(StepLayer::Mlp, mlp(st)?);
    Ok(out.into_vec())
}

const WL_GDN: &str = "testbed/workload/src/gdn.rs allocate_inputs_encoded";
const WL_GDN_IDX: &str = "testbed/workload/src/gdn.rs prepare_chunk_indices / chunk_delta_h (chunk_indices, chunk_offsets)";
const WL_FA: &str = "testbed/workload/src/fa.rs allocate_inputs_encoded";

/// `gdn_layer` (`testbed/workload/src/prefill/layers.rs`): the kernel's inputs (q, k with the
/// key heads, v, fp32 g, beta, the fp32 initial state gathered from the layer's state,
/// `cu_seqlens`), then fla's forward with its two varlen index tensors, all freed by the end of
/// the layer. The index tensors are allocated with the inputs here; fla allocates them inside
/// the call (after the l2norm copies, before `h`) and both live through its peak, so the peak is
/// the same.
fn gdn(st: &LayerStep) -> Result<Vec<Tensor>, ModelError> {
    let g = st.gdn_shape(false)?;
    let d = &st.d;
    let (t, n, dt) = (d.t, d.n, d.dt);
    let mut tl = Timeline::new();
    let ids = vec![
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
    kernel_layer(tl, ids, &gdn_kernel(st.v.gdn, &g)?)
}

/// `attention_layer`: q, k, v of the chunk and the two `cu_seqlens`, then FlashAttention over
/// the chunk's own keys (the workload's outputs are sized by the chunk, not the context).
fn attention(st: &LayerStep) -> Result<Vec<Tensor>, ModelError> {
    let fa = st.fa_shape(st.s.chunk_tokens)?;
    let d = &st.d;
    let (t, n, dt) = (d.t, d.n, d.dt);
    let mut tl = Timeline::new();
    let ids = vec![
        tl.alloc("q", &[t, d.heads, d.head_dim], dt, WL_FA),
        tl.alloc("k", &[t, d.kv_heads, d.head_dim], dt, WL_FA),
        tl.alloc("v", &[t, d.kv_heads, d.head_dim], dt, WL_FA),
        tl.alloc("cu_seqlens_q", &[n + 1], DType::I32, WL_FA),
        tl.alloc("cu_seqlens_k", &[n + 1], DType::I32, WL_FA),
    ];
    kernel_layer(tl, ids, &fa_kernel(st.v.attention, &fa)?)
}

/// `mlp`: vLLM 0.20.1's eager dense MLP allocations ([`crate::ffn`]), nothing else.
fn mlp(st: &LayerStep) -> Result<Vec<Tensor>, ModelError> {
    kernel_layer(Timeline::new(), Vec::new(), &st.ffn_kernel()?)
}
