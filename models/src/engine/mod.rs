//! One room per engine and version: what the engine allocates, in its own order, step by step,
//! from the config and the flags alone, run through the allocator the engine uses under the limit
//! the engine actually enforces. Each room is written from the engine's code (file and line in
//! its documentation) and checked on runs recorded after it was written (docs/validation.md,
//! "Engines: which runs built each term and which check it").
//!
//! Rooms:
//! - [`transformers_5`]: transformers 5.17 `generate(..., prefill_chunk_size=C)` with a
//!   `DynamicCache` (Qwen3.5 hybrid and dense attention models), on PyTorch's caching allocator.
//! - [`transformers_cb`]: transformers 5.17's continuous batching, its paged pool and batch.
//! - [`vllm_0_20_1_pool`]: vLLM 0.20.1's KV-cache pool from the bytes left for it (pages,
//!   hybrid block alignment, groups, blocks, concurrency, the logged token count, the start-up
//!   check).
//! - [`vllm_0_20_1_plan`]: vLLM 0.20.1's start-up budget (the weights, the profile run's peak,
//!   the non-torch and CUDA-graph terms), the pool it makes, the slack the card keeps beyond the
//!   budget, and a step's real peak against the card.
//! - [`llama_cpp`]: llama.cpp's buffers at start (the model buffer and the KV cache), from a
//!   GGUF's header; its compute buffer and pool are not modelled yet.
//!
//! The whole-step model's layers ([`crate::StepModel`]: one step's layer kinds as tensor
//! timelines, with the machinery they share in `step_layers.rs`) have a room per
//! [`crate::Runtime`] here too, each read from its program's own source:
//! - `workload.rs`: the reference workload's prefill (`testbed/workload/`);
//! - `torch_script.rs`: `scripts/validate/torch_prefill.py`, with its weights, K/V per token and
//!   recurrent state;
//! - `vllm_0_20_1.rs`: vLLM 0.20.1 serving a Qwen3-Next / Qwen3.5 model;
//! - `transformers_5_layers.rs`: transformers 5.x `Qwen3_5ForCausalLM.forward` on one chunk.

pub mod llama_cpp;
pub(crate) mod torch_script;
pub mod transformers_5;
pub(crate) mod transformers_5_layers;
pub mod transformers_cb;
pub(crate) mod vllm_0_20_1;
pub mod vllm_0_20_1_plan;
pub mod vllm_0_20_1_pool;
pub(crate) mod workload;

use serde::Serialize;

use crate::{Category, Limit, ModelError};

/// Where a figure comes from: what a reader may trust it for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// From the config and the flags alone.
    Predicted,
    /// From terms fitted to another run of the same program.
    Calibrated,
    /// Copied from the trace it is set beside (so it agrees by construction).
    Copied,
}

impl Basis {
    /// The word used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Basis::Predicted => "predicted",
            Basis::Calibrated => "calibrated",
            Basis::Copied => "copied",
        }
    }
}

/// One category's bytes at a moment, with where the figure comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Part {
    /// The category.
    pub category: Category,
    /// Bytes.
    pub bytes: u64,
    /// Where the figure comes from.
    pub basis: Basis,
}

/// One step of a planned run that completed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedStep {
    /// The step's index, counting from 0 (for a chunked prefill, the chunk's).
    pub index: u64,
    /// New tokens of the step.
    pub chunk_tokens: u64,
    /// Tokens held at the end of the step, its chunk included.
    pub context_tokens: u64,
    /// The most bytes handed out in blocks during the step (`max_memory_allocated`).
    pub peak_allocated: u64,
    /// The most bytes held in segments during the step (`max_memory_reserved`).
    pub peak_reserved: u64,
}

/// The first request the planned run could not satisfy under its limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedFailure {
    /// The failing step's index, counting from 0.
    pub index: u64,
    /// New tokens of the failing step.
    pub chunk_tokens: u64,
    /// Tokens held at the end of the failing step, its chunk included.
    pub context_tokens: u64,
    /// The tensor whose allocation failed.
    pub tensor: String,
    /// The engine's line that allocates it.
    pub source: String,
    /// Its bytes.
    pub request: u64,
    /// The segment the allocator asked the driver for.
    pub segment: u64,
    /// Bytes held in segments when it failed (after releasing the cached ones).
    pub reserved: u64,
    /// Bytes handed out in blocks when it failed.
    pub allocated: u64,
    /// What was allocated at that moment, by category.
    pub parts: Vec<Part>,
}

/// A run planned step by step under a limit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlannedRun {
    /// The engine, its version and the program.
    pub engine: &'static str,
    /// The limit enforced, as the engine meets it.
    pub limit: Limit,
    /// Its bytes.
    pub limit_bytes: u64,
    /// The steps that completed, in order.
    pub steps: Vec<PlannedStep>,
    /// The step that did not, if one did not.
    pub failure: Option<PlannedFailure>,
    /// The most tokens the run was asked to hold (the prompt).
    pub prompt_tokens: u64,
    /// What was allocated, by category, at the most allocated moment of the last step that
    /// completed (empty when none did).
    pub last_step_parts: Vec<Part>,
}

/// What an engine's planner answers from the config and the flags alone.
pub trait Engine {
    /// The engine, its version and the program (`transformers 5.17 generate(prefill_chunk_size)`).
    fn name(&self) -> &'static str;
    /// The limit the engine's allocations actually meet, in bytes the allocator may hold.
    fn enforced_bytes(&self, limit: &Limit) -> Result<u64, ModelError>;
    /// The most context the engine itself accepts (the model's `max_position_embeddings`), if
    /// it says.
    fn max_context(&self) -> Option<u64>;
    /// Runs the program step by step under `limit` until it fails or holds `prompt_tokens`.
    fn plan(&self, limit: &Limit, prompt_tokens: u64) -> Result<PlannedRun, ModelError>;
}
