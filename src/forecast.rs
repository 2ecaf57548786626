//! The whole-step model in the live view, and the live forecast (issue 20 item 3).
//!
//! At a moment of the trace the observed bytes by category ([`crate::categories`]) are set
//! beside the whole-step model ([`vramtrace_models::StepModel`]) of the same step. The current
//! context is read from the trace: the KV cache category's bytes ÷ the model's K/V bytes per
//! token (with a preallocated KV pool, as `transformers serve --continuous-batching` and vLLM
//! make, that is the pool's room in tokens, not the tokens held). What the config cannot know
//! (engine buffers, CUDA graphs, NCCL, autotuning, the allocator's reserve, the context, other
//! processes) is taken from the trace as it stands and said to be.
//!
//! The forecast is the next prefill chunk's modelled step at the current context (context +
//! chunk tokens at its end) against the limit, and the largest context whose modelled step
//! still fits ([`StepModel::largest_context_at`]): the cliff, before it happens.
//!
//! The modelled step's tensors are set beside the live allocations at the cursor
//! (`forecast/tensors.rs`): `vramtrace compare` at the cursor.

mod tensors;

use vramtrace_models::{
    KnownParts, Limit, ModelConfig, Runtime, ServingShape, StepModel, StepVariants,
};
use vramtrace_view_model::{BreakdownEntry, Forecast, ModelAtCursor, ModelPart, ModelTensors};

use crate::attribution::Observed;
use crate::categories::{self, CATEGORIES, Category, N};

/// Why the live model gives no forecast or tensor table at the cursor (shown in the live view in
/// their place).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForecastError {
    /// Neither `--capacity` nor the trace gives a limit.
    #[error("no limit to forecast against: give --capacity (the trace names no device)")]
    NoLimit,
    /// The model refused the step (its error's message).
    #[error("not modelled: {0}")]
    NotModelled(String),
}

impl From<vramtrace_models::ModelError> for ForecastError {
    fn from(e: vramtrace_models::ModelError) -> Self {
        ForecastError::NotModelled(e.to_string())
    }
}

/// The longest context the cliff search looks at (tokens): beyond it the cliff is "beyond".
pub const MAX_CONTEXT: u64 = 1 << 24;

/// What an answer of [`LiveModel::at`] depends on: the observed bytes by category, the device's
/// total and the limit the trace shows enforced.
type Inputs = ([u64; N], Option<u64>, Option<u64>);

/// The model the live view compares with, and the serving shape of its steps.
#[derive(Debug, Clone)]
pub struct LiveModel {
    model: StepModel,
    shape: ServingShape,
    capacity: Option<u64>,
    kv_per_token: u64,
    /// The longest sequence the model takes (`max_position_embeddings`), if the config says.
    max_sequence: Option<u64>,
    title: String,
    /// The last answer and the observed bytes, device total and enforced limit it was made for.
    last: Option<(Inputs, ModelAtCursor)>,
    /// The last tensor table, the context and the live set's key it was made for.
    last_tensors: Option<(u64, u64, Result<ModelTensors, ForecastError>)>,
}

impl LiveModel {
    /// The model of `cfg` run by `runtime`, prefilling chunks of `chunk` tokens into a KV cache
    /// of `block_size`-token blocks, against `capacity` (else the device's total memory).
    pub fn new(
        cfg: ModelConfig,
        runtime: Runtime,
        chunk: u64,
        block_size: u64,
        capacity: Option<u64>,
    ) -> crate::Result<LiveModel> {
        let variants = StepVariants::for_runtime(runtime, &cfg);
        let title = format!(
            "{} ({}), chunk {chunk}, KV block {block_size}",
            cfg.display_name(),
            runtime.name()
        );
        let mut shape = ServingShape::prefill(&cfg, chunk, chunk);
        let max_sequence = cfg.max_position_embeddings;
        let model = StepModel::new(cfg, variants, KnownParts::default());
        // K/V bytes per token, whatever the runtime stores: the payload's growth by one token
        // without block rounding.
        shape.block_size = 1;
        let kv =
            |l: u64| -> crate::Result<u64> { Ok(model.step(&shape.with_context(l))?.kv_payload) };
        let kv_per_token = kv(chunk + 1)? - kv(chunk)?;
        shape.block_size = block_size;
        Ok(LiveModel {
            model,
            shape,
            capacity,
            kv_per_token,
            max_sequence,
            title,
            last: None,
            last_tensors: None,
        })
    }

    /// The model's K/V bytes per token.
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.kv_per_token
    }

    /// The model beside `observed` (a snapshot's breakdown: category titles, NVML's rows with
    /// ` (NVML)` after the title), against the capacity given, else `device_total`; and its
    /// tensors beside the live allocations at the cursor, which `live` reads (in time order)
    /// only when `live_key` (anything that changes when the live set may have) or the context
    /// changed since the last call: a steady live set costs nothing.
    pub fn at(
        &mut self,
        observed: &[BreakdownEntry],
        device_total: Option<u64>,
        enforced: Option<u64>,
        live_key: u64,
        live: impl FnOnce() -> Vec<Observed>,
    ) -> ModelAtCursor {
        let mut bytes = [0u64; N];
        for e in observed {
            let title = e.label.strip_suffix(" (NVML)").unwrap_or(&e.label);
            if let Some(c) = categories::parse(title) {
                bytes[c.index()] += e.bytes;
            }
        }
        let inputs = (bytes, device_total, enforced);
        let mut m = match &self.last {
            Some((i, m)) if *i == inputs => m.clone(),
            _ => {
                let m = self.compute(&bytes, device_total, enforced);
                self.last = Some((inputs, m.clone()));
                m
            }
        };
        m.tensors = self
            .tensors(self.context(&bytes), live_key, live)
            .map_err(|e| e.to_string());
        m
    }

    /// The current context: the KV cache's bytes ÷ the model's K/V bytes per token; 0 (unknown)
    /// when the KV cache is a preallocated pool ([`LiveModel::kv_pool`]).
    fn context(&self, bytes: &[u64; N]) -> u64 {
        if self.kv_pool(bytes).is_some() {
            return 0;
        }
        bytes[Category::KvCache.index()] / self.kv_per_token.max(1)
    }

    /// The KV cache's bytes when they are a pool the engine preallocated (transformers serve's
    /// paged cache, vLLM's blocks): more token slots than one sequence can hold
    /// (`max_position_embeddings`), so they say nothing of the context, and adding a chunk
    /// does not grow them.
    fn kv_pool(&self, bytes: &[u64; N]) -> Option<u64> {
        let kv = bytes[Category::KvCache.index()];
        let slots = kv / self.kv_per_token.max(1);
        self.max_sequence.filter(|&m| slots > m).map(|_| kv)
    }

    /// The step that holds `context` (at least one chunk).
    fn step_shape(&self, context: u64) -> ServingShape {
        self.shape
            .with_context(context.max(self.shape.chunk_tokens))
    }

    /// The tensor table at `context`, kept while the context and the live set stay.
    fn tensors(
        &mut self,
        context: u64,
        live_key: u64,
        live: impl FnOnce() -> Vec<Observed>,
    ) -> Result<ModelTensors, ForecastError> {
        if let Some((c, k, t)) = &self.last_tensors
            && *c == context
            && *k == live_key
        {
            return t.clone();
        }
        let shape = self.step_shape(context);
        let t = self
            .model
            .step(&shape)
            .map(|step| tensors::table(&step, shape.chunk_tokens, shape.context_tokens, live()))
            .map_err(ForecastError::from);
        self.last_tensors = Some((context, live_key, t.clone()));
        t
    }

    fn compute(
        &self,
        bytes: &[u64; N],
        device_total: Option<u64>,
        enforced: Option<u64>,
    ) -> ModelAtCursor {
        let pool = self.kv_pool(bytes);
        let given = |c: Category| Some(bytes[c.index()]).filter(|&b| b > 0);
        let known = KnownParts {
            engine_buffers: given(Category::EngineBuffers),
            cuda_graphs: given(Category::CudaGraphs),
            communication: given(Category::Communication),
            autotune: given(Category::Autotune),
            kv_pool: pool,
            allocator_reserve: given(Category::AllocatorReserve),
            context: given(Category::Context),
            other_process: given(Category::OtherProcess),
        };
        let model = StepModel {
            known,
            ..self.model.clone()
        };
        let context = self.context(bytes);
        let chunk = self.shape.chunk_tokens;
        let now = model.step(&self.step_shape(context));
        let parts = Category::ALL
            .iter()
            .map(|&c| {
                let modelled = now.as_ref().ok().and_then(|b| b.part(c));
                let rests_on = match c {
                    Category::Weights => "config: parameters and their format".to_string(),
                    Category::KvCache => match pool {
                        Some(pool) => format!(
                            "the trace: a preallocated pool of {} token slots (more than the {} \
                             tokens of one sequence), given as it stands",
                            pool / self.kv_per_token.max(1),
                            self.max_sequence.unwrap_or(0)
                        ),
                        None => format!("config: K/V of {context} tokens (read from this row)"),
                    },
                    Category::State => "config: GDN state of one sequence".to_string(),
                    Category::Activations => match &now {
                        Ok(b) => format!(
                            "config: the {} layer's peak at a chunk of {chunk}",
                            b.activations.kind
                        ),
                        Err(e) => format!("not modelled: {e}"),
                    },
                    Category::Unnamed => "never modelled".to_string(),
                    _ if modelled.is_some() => "the trace, given as it stands".to_string(),
                    _ => "not modelled, nothing observed".to_string(),
                };
                ModelPart {
                    category: CATEGORIES[c.index()].to_string(),
                    modelled_bytes: modelled,
                    observed_bytes: bytes[c.index()],
                    rests_on,
                }
            })
            .filter(|p| p.modelled_bytes.is_some() || p.observed_bytes > 0)
            .collect();
        let forecast = self
            .forecast(&model, context, pool, device_total, enforced)
            .map_err(|e| e.to_string());
        ModelAtCursor {
            title: self.title.clone(),
            parts,
            forecast,
            // Filled by `at`, which has the live set.
            tensors: Err("no live set read".into()),
        }
    }

    /// The next chunk at `context` against the limit, and the largest context that fits; with a
    /// preallocated KV pool (`pool`, bytes) the context is unknown: the chunk is set at its
    /// smallest step, and the largest context is where memory or the pool stops it.
    fn forecast(
        &self,
        model: &StepModel,
        context: u64,
        pool: Option<u64>,
        device_total: Option<u64>,
        enforced: Option<u64>,
    ) -> Result<Forecast, ForecastError> {
        let (capacity, label) = match (self.capacity, device_total) {
            (Some(c), _) => (c, "--capacity"),
            (None, Some(t)) if t > 0 => (t, "the card"),
            _ => return Err(ForecastError::NoLimit),
        };
        // The limit the trace shows enforced wins over the card: PyTorch's per-process fraction,
        // read from its refusal, counts only its own segments.
        let (limit, limit_bytes, label) = match enforced.filter(|&e| e > 0 && e < capacity) {
            Some(e) => (
                Limit::PerProcessFraction {
                    capacity,
                    fraction: e as f64 / capacity as f64,
                },
                e,
                "PyTorch's per-process limit, read from its refusal",
            ),
            None => (Limit::Card { capacity }, capacity, label),
        };
        let chunk = self.shape.chunk_tokens;
        let next = self.shape.with_context(context.saturating_add(chunk));
        let checked = model.check(&next, &limit)?;
        let counted = checked.limit.as_ref().map_or(checked.total, |l| l.counted);
        // No context past the longest sequence the model takes: a cliff beyond it is never met.
        let search_to = self.max_sequence.unwrap_or(MAX_CONTEXT);
        let frontier =
            model.largest_context_at(&self.shape, &limit, search_to.max(next.context_tokens))?;
        Ok(Forecast {
            context_tokens: context,
            kv_bytes_per_token: self.kv_per_token,
            chunk_tokens: chunk,
            next_step_bytes: counted,
            limit_bytes,
            limit_label: label.to_string(),
            largest_context: frontier.largest_context,
            capped: frontier.capped,
            kv_pool_tokens: pool.map(|p| p / self.kv_per_token.max(1)),
            limited_by_pool: frontier.limited_by_pool,
        })
    }
}
