//! The whole-step model set beside the trace: beside the failing step ([`whole_step`]: the parts
//! a config cannot give taken from the failure's categories, the rest predicted, with its
//! residuals and frontiers), beside the highest peak of a run where nothing failed
//! ([`peak_model`]: part by part, with the likely cause of each residual), the basis of each part
//! ([`parts_of`]), and the same model with other parts or another shape ([`what_if`], for the
//! levers).

use std::collections::BTreeMap;

use vramtrace_models::engine::{Basis, Part};
use vramtrace_models::{
    ChunkFloor, KnownParts, LayerKind, Limit, Residuals, Runtime, ServingShape, StepModel,
    StepVariants, residuals,
};

use super::runtime::detect_runtime;
use super::{Triage, TriageOptions, gib};
use crate::categoriser::{Breakdown, Category};
use crate::report::ModelInput;
use crate::report::engine_view;
use crate::report::model_view::{
    ModelView, ModelViewError, PEAK_TOLERANCE_PERCENT, PeakFit, PlannerSettings,
};
use crate::trace::Trace;

/// The longest context the context frontier searches (tokens per sequence).
const MAX_SEARCHED_CONTEXT: u64 = 1 << 20;

/// The whole-step model beside the failing step: the step read from the trace, the parts a
/// config cannot give (graphs, NCCL, autotuning, the allocator's reserve, the context and other
/// processes inside the limit) taken from the failure's categories, the rest predicted; under
/// transformers' generate, its engine's planner instead.
#[allow(clippy::too_many_arguments)]
pub(super) fn whole_step(
    trace: &Trace,
    opts: &TriageOptions,
    m: &ModelInput,
    t: &Triage,
    b: &Breakdown,
    limit: &Limit,
    reserve: u64,
    other_in: u64,
    context_in: u64,
) -> Result<ModelView, ModelViewError> {
    let runtime = opts
        .runtime
        .or_else(|| detect_runtime(trace))
        .ok_or(ModelViewError::NoRuntime)?;
    let step = t.step.as_ref().ok_or(ModelViewError::NoFailingStep)?;
    let (chunk, context) = match (step.chunk_tokens, step.context_tokens) {
        (Some(c), Some(l)) => (c, l),
        _ => {
            return Err(ModelViewError::NoChunkTokens {
                source_of_step: step.source.clone(),
            });
        }
    };
    let nz = |c: Category| Some(b.bytes(c)).filter(|&x| x > 0);
    let known = KnownParts {
        cuda_graphs: nz(Category::CudaGraphs),
        communication: nz(Category::Communication),
        autotune: nz(Category::Autotune),
        allocator_reserve: (runtime.uses_pytorch_allocator() && reserve > 0).then_some(reserve),
        context: Some(context_in),
        other_process: Some(other_in).filter(|&x| x > 0),
        ..KnownParts::default()
    };
    let cfg = &m.cfg;
    let mut observed: BTreeMap<String, u64> = BTreeMap::new();
    for r in &b.rows {
        let bytes = match r.category {
            Category::OtherProcess => other_in,
            Category::Context => context_in,
            _ => r.bytes,
        };
        if bytes > 0 {
            *observed.entry(r.category.key().to_string()).or_default() += bytes;
        }
    }
    // The refused request belongs to the step's activations.
    *observed.entry("activations".to_string()).or_default() +=
        t.tipping.as_ref().map_or(0, |x| x.bytes);
    // transformers' generate, its step read from its own loop: the engine's planner, from the
    // config and the limit alone.
    if runtime == Runtime::Transformers && m.opts.tp <= 1 {
        let seen: BTreeMap<Category, u64> = observed
            .iter()
            .filter_map(|(k, &v)| Some((Category::parse(k)?, v)))
            .collect();
        let settings = PlannerSettings {
            attn_implementation: engine_view::traced_attention(trace),
            expandable_segments: opts.expandable_segments
                || engine_view::traced_expandable_segments(trace)?,
        };
        let seeds = engine_view::StepSeeds::read(trace, step, settings.expandable_segments)?;
        if let Some(v) = engine_view::transformers_view(cfg, settings, step, limit, &seen, &seeds) {
            return v.map_err(ModelViewError::from);
        }
    }
    let model = StepModel::new(
        cfg.clone(),
        StepVariants::for_runtime(runtime, cfg),
        known.clone(),
    );
    let mut shape = ServingShape::prefill(cfg, chunk, context);
    shape.tp = m.opts.tp.max(1);
    let failing = model.check(&shape, limit)?;
    let before = (context > chunk)
        .then(|| {
            model
                .check(&shape.with_context(context - chunk), limit)
                .ok()
        })
        .flatten()
        .and_then(|s| s.fits());
    let lc = failing.limit.clone().ok_or_else(|| {
        vramtrace_models::ModelError::Invalid("the model was not checked against the limit".into())
    })?;
    let res = residuals(&failing, &observed)?;
    let hybrid = cfg.layer_types.contains(&LayerKind::LinearAttention);
    let floor = if hybrid && matches!(runtime, Runtime::Vllm | Runtime::Workload) {
        ChunkFloor::vllm_mamba_align(opts.block_size.unwrap_or(chunk))
    } else {
        ChunkFloor::none()
    };
    let chunk_frontier = model.largest_chunk_at(&shape, limit, &floor)?;
    // The engine stops at the model's own maximum context: so does the frontier.
    let max_ctx = match cfg.max_position_embeddings {
        Some(m) => m.max(context),
        None => MAX_SEARCHED_CONTEXT.max(context.saturating_mul(4)),
    };
    let context_frontier = model.largest_context_at(&shape.with_context(chunk), limit, max_ctx)?;
    let (parts, copied_percent) = parts_of(&failing, &known);
    Ok(ModelView {
        runtime,
        engine: None,
        planner: None,
        parts,
        copied_percent,
        shape,
        failure_fits: Some(lc.fits),
        before_fits: before,
        fits_basis: None,
        failure_fits_config: None,
        headroom: lc.headroom,
        counted: lc.counted,
        known,
        residuals: res,
        chunk_frontier,
        context_frontier,
        peak_fit: None,
    })
}

/// The parts of a whole-step prediction with their basis: a part given from the trace
/// ([`KnownParts`]) is copied, every other one predicted from the config; and the copied share
/// of their bytes in percent.
fn parts_of(step: &vramtrace_models::StepBreakdown, known: &KnownParts) -> (Vec<Part>, f64) {
    let given = |c: Category| match c {
        Category::EngineBuffers => known.engine_buffers.is_some(),
        Category::CudaGraphs => known.cuda_graphs.is_some(),
        Category::Communication => known.communication.is_some(),
        Category::Autotune => known.autotune.is_some(),
        Category::KvCache => known.kv_pool.is_some(),
        Category::AllocatorReserve => known.allocator_reserve.is_some(),
        Category::Context => known.context.is_some(),
        Category::OtherProcess => known.other_process.is_some(),
        _ => false,
    };
    let parts: Vec<Part> = Category::ALL
        .iter()
        .filter_map(|&c| {
            step.part(c).filter(|&b| b > 0).map(|bytes| Part {
                category: c,
                bytes,
                basis: if given(c) {
                    Basis::Copied
                } else {
                    Basis::Predicted
                },
            })
        })
        .collect();
    let total: u64 = parts.iter().map(|p| p.bytes).sum();
    let copied: u64 = parts
        .iter()
        .filter(|p| p.basis == Basis::Copied)
        .map(|p| p.bytes)
        .sum();
    let pct = if total > 0 {
        copied as f64 * 100.0 / total as f64
    } else {
        0.0
    };
    (parts, pct)
}

/// The model with other parts or another shape, checked against the limit: (fits, largest
/// context at the chunk).
pub(super) fn what_if(
    opts: &TriageOptions,
    m: &ModelView,
    known: KnownParts,
    shape: &ServingShape,
    limit: &Limit,
) -> Option<(bool, Option<u64>)> {
    let mi = opts.model.as_ref()?;
    let sm = StepModel::new(
        mi.cfg.clone(),
        StepVariants::for_runtime(m.runtime, &mi.cfg),
        known,
    );
    let fits = sm.check(shape, limit).ok()?.fits()?;
    let ctx = sm
        .largest_context_at(
            &shape.with_context(shape.chunk_tokens),
            limit,
            MAX_SEARCHED_CONTEXT.max(shape.context_tokens.saturating_mul(4)),
        )
        .ok()?;
    Some((fits, ctx.largest_context))
}

/// The whole-step model at a peak without a failure: the step read from the trace, the parts a
/// config cannot give (the engine's KV pool and static buffers, the allocator's reserve, the
/// context, graphs, NCCL, autotuning) taken from the moment's categories, the rest predicted.
pub(super) fn peak_model(
    trace: &Trace,
    opts: &TriageOptions,
    m: &ModelInput,
    t: &Triage,
    b: &Breakdown,
) -> Result<ModelView, ModelViewError> {
    let runtime = opts
        .runtime
        .or_else(|| detect_runtime(trace))
        .ok_or(ModelViewError::NoRuntime)?;
    let tokens = t
        .step
        .as_ref()
        .and_then(|s| s.chunk_tokens)
        .ok_or(ModelViewError::NoPeakTokens)?;
    let nz = |c: Category| Some(b.bytes(c)).filter(|&x| x > 0);
    let pool = kv_pool_of(b);
    let cfg = &m.cfg;
    let mut notes = Vec::new();
    let known = KnownParts {
        engine_buffers: nz(Category::EngineBuffers),
        cuda_graphs: nz(Category::CudaGraphs),
        communication: nz(Category::Communication),
        autotune: nz(Category::Autotune),
        kv_pool: pool.as_ref().map(|(bytes, _)| *bytes),
        allocator_reserve: runtime
            .uses_pytorch_allocator()
            .then(|| b.bytes(Category::AllocatorReserve)),
        context: Some(b.bytes(Category::Context)),
        other_process: nz(Category::OtherProcess),
    };
    let mut shape = ServingShape::prefill(cfg, tokens, tokens);
    shape.tp = m.opts.tp.max(1);
    if let Some((bytes, why)) = &pool {
        notes.push(format!(
            "the KV pool ({}) is the engine's decision (sized from its memory heuristics, not from the context), so it is taken from the trace ({why}), not predicted",
            gib(*bytes)
        ));
        let per = vramtrace_models::kv_cache_per_token(cfg, shape.tp, shape.kv_dtype)?;
        let transformers_cb = why.contains("continuous_batching");
        if let Some(slots) = bytes.checked_div(per.bytes_per_token) {
            let rest = bytes - slots * per.bytes_per_token;
            notes.push(if rest == 0 {
                format!(
                    "the pool holds exactly {slots} token slots × {} B per token (the config's K and V over {} attention layers, {} B per layer){}",
                    per.bytes_per_token,
                    per.layers,
                    per.bytes_per_layer,
                    if transformers_cb {
                        // transformers/generation/continuous_batching/cache.py: block_size
                        // defaults to 32 (generation_config.block_size).
                        format!(
                            "; at transformers' default block of 32 tokens, {} blocks{}",
                            slots / 32,
                            if slots % 32 == 0 { "" } else { " and a partial one" }
                        )
                    } else {
                        String::new()
                    }
                )
            } else {
                format!(
                    "the pool is not a whole number of tokens at {} B per token ({slots} slots and {rest} B more): the cache's dtype or heads differ from the config",
                    per.bytes_per_token
                )
            });
        }
    }
    if pool
        .as_ref()
        .is_some_and(|(_, why)| why.contains("continuous_batching"))
    {
        notes.push("the step's activations are modelled as transformers' eager forward (SDPA over K/V repeated to the query heads), not the paged attention kernel continuous batching runs: read the activations row as an estimate".into());
    }
    if let Some(e) = known.engine_buffers {
        notes.push(format!(
            "the engine's static buffers ({}) are its decision too (sized for its largest batch), so they are taken from the trace",
            gib(e)
        ));
    }
    notes.push(format!(
        "the allocator's reserve ({}) and the context ({}) are taken from the trace at the moment",
        gib(b.bytes(Category::AllocatorReserve)),
        gib(b.bytes(Category::Context))
    ));
    let model = StepModel::new(
        cfg.clone(),
        StepVariants::for_runtime(runtime, cfg),
        known.clone(),
    );
    let device_total = trace
        .processes
        .iter()
        .flat_map(|p| p.devices.iter())
        .find(|d| d.ordinal == b_device(t))
        .map(|d| d.total_bytes)
        .unwrap_or(0);
    let capacity = opts.capacity.unwrap_or(device_total);
    // vLLM's --gpu-memory-utilization is spent at start; at run time the card refuses.
    let limit = Limit::Card { capacity };
    let step = model.check(&shape, &limit)?;
    let lc = step.limit.clone().ok_or_else(|| {
        vramtrace_models::ModelError::Invalid("the model was not checked against the limit".into())
    })?;
    let mut observed: BTreeMap<String, u64> = BTreeMap::new();
    for r in &b.rows {
        if r.bytes > 0 {
            *observed.entry(r.category.key().to_string()).or_default() += r.bytes;
        }
    }
    let mut res = residuals(&step, &observed)?;
    peak_causes(&mut res, &step, &known);
    let diff = if res.observed_total == 0 {
        0.0
    } else {
        100.0 * res.total_residual as f64 / res.observed_total as f64
    };
    let within = diff.abs() <= PEAK_TOLERANCE_PERCENT;
    let mut parts: Vec<_> = res.parts.iter().filter(|p| p.residual != 0).collect();
    parts.sort_by_key(|p| std::cmp::Reverse(p.residual.unsigned_abs()));
    let differs = parts
        .iter()
        .take(if within { 0 } else { 3 })
        .map(|p| {
            format!(
                "{}: predicted {}, observed {} ({}): {}",
                p.category.key(),
                p.predicted.map_or("—".into(), gib),
                gib(p.observed),
                signed_bytes(p.residual),
                p.likely_cause
            )
        })
        .collect();
    let hybrid = cfg.layer_types.contains(&LayerKind::LinearAttention);
    let floor = if hybrid && matches!(runtime, Runtime::Vllm | Runtime::Workload) {
        ChunkFloor::vllm_mamba_align(opts.block_size.unwrap_or(tokens))
    } else {
        ChunkFloor::none()
    };
    // With a pool, the context is bounded by it: search past it.
    let pool_slots = known.kv_pool.map_or(0, |p| {
        vramtrace_models::kv_cache_per_token(cfg, shape.tp, shape.kv_dtype)
            .map_or(0, |k| p / k.bytes_per_token.max(1))
    });
    // A peak has no failing context to stay near: search far enough to reach the card.
    let max_ctx = match m.cfg.max_position_embeddings {
        Some(mp) => mp.max(tokens),
        None => (1u64 << 28)
            .max(tokens.saturating_mul(4))
            .max(pool_slots.saturating_add(1)),
    };
    let context_frontier = model.largest_context_at(&shape, &limit, max_ctx)?;
    // The largest chunk at the step's own context (for one forward, chunk = context: the
    // largest prompt in one forward is computed below).
    let chunk_frontier = model.largest_chunk_at(&shape, &limit, &floor)?;
    let one_forward = largest_single_forward(&model, &shape, &limit, max_ctx);
    if let Some(n) = one_forward {
        notes.push(format!(
            "the largest prompt that fits in one forward (chunk = context) on {}: **{n}** tokens{}{}",
            gib(limit.bytes().unwrap_or(0)),
            if n >= max_ctx {
                " (the search's cap)"
            } else {
                ""
            },
            if runtime == Runtime::Transformers {
                " (the model computes logits for every token, as `logits_to_keep=0` does; a program that keeps fewer fits more)"
            } else {
                ""
            }
        ));
    }
    let (parts, copied_percent) = parts_of(&step, &known);
    let predicted_parts_difference_percent = {
        let own: Vec<&vramtrace_models::PartResidual> = res
            .parts
            .iter()
            .filter(|r| {
                parts
                    .iter()
                    .any(|p| p.category == r.category && p.basis == Basis::Predicted)
            })
            .collect();
        let pred: u64 = own.iter().filter_map(|r| r.predicted).sum();
        let obs: u64 = own.iter().map(|r| r.observed).sum();
        (obs > 0).then(|| (pred as f64 - obs as f64) * 100.0 / obs as f64)
    };
    Ok(ModelView {
        runtime,
        engine: None,
        planner: None,
        parts,
        copied_percent,
        shape,
        failure_fits: None,
        before_fits: None,
        fits_basis: None,
        failure_fits_config: None,
        headroom: lc.headroom,
        counted: lc.counted,
        known,
        residuals: res.clone(),
        chunk_frontier,
        context_frontier,
        peak_fit: Some(PeakFit {
            predicted_parts_difference_percent,
            predicted: res.predicted_total,
            observed: res.observed_total,
            difference_percent: diff,
            within_tolerance: within,
            differs,
            notes,
            limit,
        }),
    })
}

/// Whether the KV cache row is a pool an engine preallocates (transformers' continuous-batching
/// `PagedAttentionCache`, vLLM's KV cache tensors), not a cache that grows with the context.
fn kv_pool_of(b: &Breakdown) -> Option<(u64, String)> {
    let row = b.rows.iter().find(|r| r.category == Category::KvCache)?;
    let pooled = row.evidence.iter().any(|l| {
        let e = l.evidence.to_string();
        e.contains("continuous_batching") || e.contains("PagedAttentionCache") || e.contains("vllm")
    });
    pooled.then(|| {
        (
            row.bytes,
            row.evidence
                .first()
                .map(|l| l.evidence.to_string())
                .unwrap_or_default(),
        )
    })
}

/// The largest `T` whose step of `T` new tokens with `T` held fits `limit` (one forward of a
/// whole prompt), up to `max`; `None` when not even one token fits.
fn largest_single_forward(
    model: &StepModel,
    shape: &ServingShape,
    limit: &Limit,
    max: u64,
) -> Option<u64> {
    let fits = |n: u64| {
        model
            .check(&shape.with_chunk(n).with_context(n), limit)
            .ok()
            .and_then(|s| s.fits())
            .unwrap_or(false)
    };
    if !fits(1) {
        return None;
    }
    let (mut lo, mut hi) = (1u64, max);
    if fits(hi) {
        return Some(hi);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

/// The likely causes of a peak's residuals where the generic ones (written for a failure) do
/// not say what the trace shows: the step's KV counted whole although the peak came in an
/// earlier layer, GDN states that transformers keeps in its cache (and the categoriser counts
/// there), and cuBLAS's workspace, which PyTorch allocates at the first matmul and the
/// categoriser names by that matmul's line.
fn peak_causes(res: &mut Residuals, step: &vramtrace_models::StepBreakdown, known: &KnownParts) {
    use vramtrace_models::Category as M;
    let get = |res: &Residuals, c: M| res.parts.iter().find(|p| p.category == c).cloned();
    let state = get(res, M::State);
    let kv = get(res, M::KvCache);
    let engine = get(res, M::EngineBuffers);
    let state_in_kv = state
        .as_ref()
        .is_some_and(|s| s.observed == 0 && s.predicted.unwrap_or(0) > 0)
        && kv.as_ref().is_some_and(|k| k.observed > 0);
    let cublas = known.engine_buffers.is_none()
        && engine.as_ref().is_some_and(|e| {
            e.observed == 0 && e.predicted == Some(vramtrace_models::CUBLAS_WORKSPACE_SM90)
        });
    let mib = |b: i64| vramtrace_models::units::ByteUnit::MiB.format(b.unsigned_abs() as f64, 2);
    for p in &mut res.parts {
        let by = if p.residual > 0 {
            format!("the model is {} above the trace", mib(p.residual))
        } else {
            format!("the model is {} below the trace", mib(p.residual))
        };
        match p.category {
            M::KvCache if known.kv_pool.is_none() && p.residual != 0 => {
                p.likely_cause = format!(
                    "{by}: the model counts every attention layer's K/V for the step's {} tokens; the peak came in the {} layer, before the later attention layers had stored theirs{}",
                    step.shape.context_tokens,
                    step.activations.kind,
                    if state_in_kv {
                        "; and the categoriser counts the GDN layers' recurrent and conv states here (transformers keeps them in the same cache: cache_utils.py lazy_initialization), so read this row with the state row"
                    } else {
                        ""
                    }
                );
            }
            M::State if state_in_kv => {
                p.likely_cause = format!(
                    "{by}: the categoriser counts these states under kv_cache (transformers keeps them in its cache, cache_utils.py lazy_initialization / update_recurrent_state); read this row with the kv_cache row"
                );
            }
            M::EngineBuffers if cublas => {
                p.likely_cause = format!(
                    "{by}: the model predicts cuBLAS's {} workspace, which PyTorch allocates through its caching allocator at the first matmul; no category rule names it, so the trace counts it by that matmul's Python line (under activations)",
                    mib(vramtrace_models::CUBLAS_WORKSPACE_SM90 as i64)
                );
            }
            M::Activations if cublas && p.residual < 0 => {
                p.likely_cause = format!(
                    "{by}: of that, {} is likely cuBLAS's workspace (the model counts it under engine_buffers); the rest: tensors the model does not carry (the rotary cos/sin, small projections) or the allocator's rounding",
                    mib(vramtrace_models::CUBLAS_WORKSPACE_SM90 as i64)
                );
            }
            _ => {}
        }
    }
}

fn b_device(t: &Triage) -> i32 {
    t.peak.as_ref().map_or(0, |p| p.device)
}

/// `−1.50 GiB` / `+32.00 MiB`.
fn signed_bytes(r: i64) -> String {
    format!("{}{}", if r < 0 { "−" } else { "+" }, gib(r.unsigned_abs()))
}
