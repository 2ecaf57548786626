//! One layer on one chunk: GDN, attention, then the MLP stand-in; and the
//! host inputs a real run uploads for them.

use std::collections::HashMap;

use super::plan::PrefillPlan;
use crate::error::Result;
use crate::fa::{self, FaInputBytes};
use crate::gdn::{self, GdnConfig, GdnInputBytes, GdnOutputs};
use crate::tensor::{DeviceTensor, Session};

/// Encoded inputs, generated once per chunk length and uploaded for every
/// layer (real runs only: the kernels need finite inputs, not fresh ones).
pub(super) struct HostInputs {
    pub(super) seed: u64,
    pub(super) gdn: HashMap<usize, GdnInputBytes>,
    pub(super) fa: HashMap<usize, FaInputBytes>,
}

impl HostInputs {
    pub(super) fn gdn(
        &mut self,
        s: &Session<'_>,
        plan: &PrefillPlan,
        tokens: usize,
    ) -> Option<&GdnInputBytes> {
        if !s.executes_kernels() {
            return None;
        }
        let seed = self.seed;
        Some(self.gdn.entry(tokens).or_insert_with(|| {
            // No h0: the initial state comes from the layer's persistent state.
            let cfg = GdnConfig {
                initial_state: false,
                ..plan.gdn_config(tokens)
            };
            gdn::generate_inputs(&cfg, seed).encode(cfg.dtype)
        }))
    }

    pub(super) fn fa(
        &mut self,
        s: &Session<'_>,
        plan: &PrefillPlan,
        tokens: usize,
    ) -> Option<&FaInputBytes> {
        if !s.executes_kernels() {
            return None;
        }
        let seed = self.seed;
        Some(self.fa.entry(tokens).or_insert_with(|| {
            let cfg = plan.fa_config(tokens);
            fa::generate_inputs(&cfg, seed).encode(cfg.dtype)
        }))
    }
}

/// Where an attention layer writes its chunk's K and V.
pub(super) struct KvTarget<'t, 's, 'b> {
    pub(super) block: &'t DeviceTensor<'s, 'b>,
    /// Tokens the block holds (its K half, then its V half).
    pub(super) capacity: usize,
    /// The chunk's first token within the block.
    pub(super) start: usize,
}

/// One GDN layer on one chunk, as vLLM's `GatedDeltaNet._forward_core` drives
/// fla's `chunk_gated_delta_rule` for a prefill: the layer's recurrent state is
/// gathered into a fresh `initial_state` (`ssm_state[state_indices].contiguous()`,
/// allocated with the inputs), the call returns `o` and an fp32 `final_state`,
/// and `ssm_state[state_indices] = final_state.to(ssm_state.dtype)` scatters it
/// back: a copy with no temporary, the state being fp32 already. The copies
/// are `cuMemcpyDtoD_v2` (checked for bounds by the stand-in in `--simulate`).
pub(super) fn gdn_layer(
    s: &Session<'_>,
    plan: &PrefillPlan,
    tokens: usize,
    state: &DeviceTensor<'_, '_>,
    host: Option<&GdnInputBytes>,
) -> Result<()> {
    let _r = s.range("gdn");
    let cfg = plan.gdn_config(tokens);
    let inputs = gdn::allocate_inputs_encoded(s, &cfg, host)?;
    let initial = inputs
        .initial_state
        .as_ref()
        .expect("prefill passes an initial state");
    s.copy(initial, 0, state, 0, state.bytes())?;
    let out = gdn::forward(s, &cfg, &inputs)?;
    s.copy(state, 0, &out.final_state, 0, state.bytes())?;
    // final_state goes as soon as it is scattered back, before o.
    let GdnOutputs {
        o,
        final_state,
        chunk_indices,
        chunk_offsets,
    } = out;
    drop(final_state);
    drop(o);
    drop(chunk_offsets);
    drop(chunk_indices);
    inputs.free();
    Ok(())
}

/// One attention layer on one chunk: the chunk's K and V go into its KV block
/// (vLLM's `reshape_and_cache_flash`, here a `cuMemcpyDtoD_v2` of each half;
/// skipped with an fp8 cache, which needs a quantising kernel this workload
/// does not have), then FlashAttention runs the chunk's queries over the
/// chunk's own keys. Its outputs are sized by the chunk, not by the context.
pub(super) fn attention_layer(
    s: &Session<'_>,
    plan: &PrefillPlan,
    tokens: usize,
    kv: &KvTarget<'_, '_, '_>,
    host: Option<&FaInputBytes>,
) -> Result<()> {
    let _r = s.range("attention");
    let cfg = plan.fa_config(tokens);
    let inputs = fa::allocate_inputs_encoded(s, &cfg, host)?;
    if plan.options.kv_dtype == plan.dtype {
        let row = cfg.kv_heads * cfg.head_dim * plan.options.kv_dtype.size();
        let half = kv.capacity * row;
        s.copy(kv.block, kv.start * row, &inputs.k, 0, tokens * row)?;
        s.copy(kv.block, half + kv.start * row, &inputs.v, 0, tokens * row)?;
    }
    fa::forward(s, &cfg, &inputs)?.free();
    inputs.free();
    Ok(())
}

/// The MLP stand-in: what vLLM 0.20.1's dense MLP allocates for the chunk, in
/// its eager order (`gate_up`, the activation, `down`; the activation dies as
/// `down` rebinds it, `gate_up` when the method returns, `down` with the
/// layer). Allocation only: no GEMM is launched, so the real run computes
/// nothing here.
pub(super) fn mlp(s: &Session<'_>, plan: &PrefillPlan, tokens: usize) -> Result<()> {
    let _r = s.range("mlp");
    let [gate_up, act, down] = plan.mlp_specs(tokens);
    let gate_up = s.empty(gate_up)?;
    let act = s.empty(act)?;
    let down = s.empty(down)?;
    drop(act);
    drop(gate_up);
    drop(down);
    Ok(())
}
