//! A model-shaped chunked prefill: one long prompt through every layer of a
//! hybrid GDN + attention model, chunk by chunk, as vLLM schedules it with
//! `--max-num-batched-tokens`, on the workload's own kernels.
//!
//! [`run`] allocates, in this order and under these ranges (the labels the
//! preload records):
//! 1. persistent stand-ins: the `capacity ballast` (`prefill/capacity`, real
//!    GPUs only, see [`plan_capacity`]); the weights, one allocation per layer
//!    (`layer.{l}.weights`) plus `embed_tokens`, the final `norm` and an untied
//!    `lm_head` (`prefill/weights`); the conv and recurrent state of every GDN
//!    layer for one sequence (`prefill/gdn_state`); with
//!    [`KvCacheMode::Preallocate`], one KV block per attention layer
//!    (`prefill/kv_cache`). Their sizes come from `vramtrace_models`
//!    (`weight_bytes`, `gdn_state_per_seq`, `kv_cache_per_token`): they are
//!    stand-ins, and the weights an estimate.
//! 2. for each chunk `i`: with [`KvCacheMode::Grow`], the block holding the
//!    chunk's K and V in every attention layer (`layer.{l}.kv.chunk.{i}`, under
//!    `prefill/kv_cache`), as the scheduler allocates a step's slots before the
//!    step runs; then every layer `l` in order under `prefill/chunk.{i}/layer.{l}/`:
//!    `gdn/` ([`gdn`](crate::gdn)'s inputs and fla 0.6.0's forward, ranges included),
//!    `attention/` ([`fa`](crate::fa)'s inputs and `_flash_attention_forward`), then `mlp/`.
//!    Everything a layer allocates is freed before the next layer starts.
//!
//! The GDN and attention tensors are the kernels' own ([`gdn::forward`](crate::gdn::forward),
//! [`fa::forward`](crate::fa::forward)); only the persistent stand-ins and the MLP come from the
//! model. Not reproduced: the embedding lookup, the projections, norms, rotary
//! embedding and short convolution (their outputs are the kernels' inputs,
//! allocated by `allocate_inputs`), the residual stream between layers, the
//! sampler, and fla's `@tensor_cache`, which would keep one `chunk_indices` /
//! `chunk_offsets` per chunk across layers (here each layer frees its own:
//! bytes per chunk, not per token).
//!
//! One file per concept: [`PrefillPlan`] and its options (`plan.rs`), the
//! persistent stand-ins it sizes (`weights.rs`, `gdn_state.rs`), `--capacity`
//! (`capacity.rs`), running it (`run.rs`, one layer in `layers.rs`), what
//! happened ([`PrefillOutcome`], `outcome.rs`) and the report ([`PrefillReport`],
//! `report.rs`).

mod capacity;
#[cfg(test)]
mod fixtures;
mod gdn_state;
mod layers;
mod outcome;
mod plan;
mod report;
mod run;
mod weights;

pub use capacity::{BALLAST, CapacityPlan, plan_capacity};
pub use gdn_state::GdnStateSpec;
pub use outcome::{ChunkReport, Failure, Held, PrefillOutcome};
pub use plan::{ChunkSpan, DEFAULT_CHUNK, KvCacheMode, PrefillOptions, PrefillPlan};
pub use report::PrefillReport;
pub use run::run;
pub use weights::weight_format_name;
