//! The engine's planner beside a failure (`vramtrace_models::engine`): for a step read from the
//! engine's own loop ([`crate::report::step`]), the planner is run from the config and the limit
//! the trace shows enforced, to the failing context; whether it holds that step, the largest
//! context at the step's chunk and the largest chunk at its context, each part of the step with
//! its basis, and the residual of each category against the trace.

use std::collections::BTreeMap;

use vramtrace_models::engine::transformers_5::{
    AllocatorSeed, Attention, ContextFrontier as PlannedFrontier, GenerateChunked,
};
use vramtrace_models::engine::{Basis, Engine, Part, PlannedRun};
use vramtrace_models::{
    Category, ChunkFloor, ChunkFrontier, ContextFrontier, KnownParts, Limit, ModelConfig,
    ModelError, PartResidual, Residuals, Runtime, ServingShape,
};

use crate::categoriser::At;
use crate::report::model_view::{FitsBasis, Lever, ModelView, PlannerSettings};
use crate::report::step::StepPosition;
use std::ops::ControlFlow;

use vramtrace_format::{EventKind, MemKind, TensorAction};

use crate::trace::{Item, Trace};
use vramtrace_models::units::fmt_bytes;

/// The smallest chunk the chunk frontier tries, and its step: below it the planner's runs grow
/// long (one forward a chunk) for a lever no one turns.
const CHUNK_GRANULE: u64 = 256;

/// The attention the traced program ran: eager when any of its Python stacks is in transformers'
/// `eager_attention_forward`, else transformers' default, SDPA.
pub(crate) fn traced_attention(trace: &Trace) -> Attention {
    let eager = trace.processes.iter().any(|p| {
        p.py_stacks
            .values()
            .flatten()
            .any(|f| p.string(f.function) == Some("eager_attention_forward"))
    });
    if eager {
        Attention::Eager
    } else {
        Attention::Sdpa
    }
}

/// Whether the traced PyTorch allocator ran on expandable segments: a tensor's segment lies in
/// address space the process reserved (`cuMemAddressReserve`), which PyTorch does only for them
/// (its default segments are `cudaMalloc`s). This holds however the option was set, in the
/// environment or by the program itself before importing torch.
pub(crate) fn traced_expandable_segments(trace: &Trace) -> crate::Result<bool> {
    let mut reserved: Vec<(usize, u64, u64)> = Vec::new();
    let mut found = false;
    trace.for_each_item(|pi, it| {
        match &it {
            Item::Event(e)
                if e.kind == EventKind::Alloc && e.mem == MemKind::Address && e.result == 0 =>
            {
                reserved.push((pi, e.ptr, e.ptr.saturating_add(e.size)));
            }
            Item::Tensor(t)
                if t.action == TensorAction::Alloc
                    && t.segment != 0
                    && reserved
                        .iter()
                        .any(|&(p, lo, hi)| p == pi && (lo..hi).contains(&t.segment)) =>
            {
                found = true;
                return ControlFlow::Break(());
            }
            _ => {}
        }
        ControlFlow::Continue(())
    })?;
    Ok(found)
}

/// PyTorch's caching allocator in one process and device, followed through a trace: the
/// driver's allocations, those some tensor was placed in (its segments), and the blocks handed
/// out, by order of allocation.
#[derive(Default)]
struct TracedAllocator {
    driver: BTreeMap<u64, u64>,
    segments: BTreeMap<u64, u64>,
    live: BTreeMap<u64, (u64, u64)>,
    order_of: std::collections::HashMap<u64, u64>,
    next: u64,
}

impl TracedAllocator {
    /// Follows one item of the process, on `device`.
    fn apply(&mut self, it: &Item, device: i32) {
        match it {
            // A free names no device (the driver call takes only the pointer).
            Item::Event(e) if e.mem == MemKind::Device => match e.kind {
                EventKind::Alloc if e.result == 0 && e.size > 0 && e.device == device => {
                    self.driver.insert(e.ptr, e.size);
                }
                EventKind::Free => {
                    self.driver.remove(&e.ptr);
                    self.segments.remove(&e.ptr);
                }
                _ => {}
            },
            Item::Tensor(t) if t.device == device => match t.action {
                TensorAction::Alloc if t.size > 0 => {
                    let base = if t.segment != 0 {
                        Some(t.segment)
                    } else {
                        self.driver
                            .range(..=t.ptr)
                            .next_back()
                            .filter(|(b, s)| t.ptr < *b + *s)
                            .map(|(b, _)| *b)
                    };
                    if let Some((b, size)) = base.and_then(|b| Some((b, *self.driver.get(&b)?))) {
                        self.segments.insert(b, size);
                    }
                    if let Some(old) = self.order_of.insert(t.ptr, self.next) {
                        self.live.remove(&old);
                    }
                    self.live.insert(self.next, (t.ptr, t.size));
                    self.next += 1;
                }
                TensorAction::Free => {
                    if let Some(o) = self.order_of.remove(&t.ptr) {
                        self.live.remove(&o);
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }

    /// The state now, as forward `index`'s seed; `None` when a live block lies in no segment
    /// the trace saw (a trace begun mid-run).
    fn seed(&self, index: u64) -> Option<AllocatorSeed> {
        let inside = |&(ptr, size): &(u64, u64)| {
            self.segments
                .range(..=ptr)
                .next_back()
                .is_some_and(|(b, s)| ptr.saturating_add(size) <= b + s)
        };
        if self.segments.is_empty() || !self.live.values().all(inside) {
            return None;
        }
        Some(AllocatorSeed {
            index,
            segments: self.segments.iter().map(|(&b, &s)| (b, s)).collect(),
            blocks: self.live.values().copied().collect(),
        })
    }
}

/// The state of PyTorch's caching allocator in the trace just before each of `starts` (the
/// first allocation of a forward, with that forward's index; one process and device, in time
/// order), read in one pass: the segments it held (the driver's allocations some tensor was
/// placed in) and the blocks handed out, oldest first. `None` for a start where the trace
/// cannot give the whole state: the recorder dropped tensor events of that process, or a live
/// block lies in no segment it saw.
pub(crate) fn allocator_seeds(
    trace: &Trace,
    starts: &[(At, u64)],
) -> crate::Result<Vec<Option<AllocatorSeed>>> {
    let Some(&(first, _)) = starts.first() else {
        return Ok(Vec::new());
    };
    if !trace.processes[first.process].dropped.is_empty() {
        return Ok(vec![None; starts.len()]);
    }
    let mut state = TracedAllocator::default();
    let mut seeds = Vec::with_capacity(starts.len());
    let mut seq = 0usize;
    trace.for_each_item(|pi, it| {
        while let Some(&(at, index)) = starts.get(seeds.len()).filter(|(at, _)| at.seq <= seq) {
            seeds.push(state.seed(index).filter(|_| at.process == first.process));
        }
        if seeds.len() == starts.len() {
            return ControlFlow::Break(());
        }
        seq += 1;
        if pi == first.process {
            state.apply(&it, first.device);
        }
        ControlFlow::Continue(())
    })?;
    // Starts at the trace's end see all of it.
    for &(at, index) in &starts[seeds.len()..] {
        seeds.push(state.seed(index).filter(|_| at.process == first.process));
    }
    Ok(seeds)
}

/// The traced allocator's state at the start of the failing forward and of the one before it,
/// for a run on the default allocator whose step was read from `generate`'s loop.
#[derive(Clone, Debug, Default)]
pub(crate) struct StepSeeds {
    pub failing: Option<AllocatorSeed>,
    pub before: Option<AllocatorSeed>,
}

impl StepSeeds {
    /// Read from `trace` at `step`'s forwards; none with expandable segments.
    pub(crate) fn read(
        trace: &Trace,
        step: &StepPosition,
        expandable_segments: bool,
    ) -> crate::Result<StepSeeds> {
        if expandable_segments || !step.from_engine_loop {
            return Ok(StepSeeds::default());
        }
        // The forward before the failing one, then the failing one, in one pass.
        let i = step.chunk_index;
        let starts: Vec<(At, u64)> = (i.saturating_sub(1)..=i)
            .filter_map(|k| Some((*step.forward_starts.get(k as usize)?, k)))
            .collect();
        let mut seeds = allocator_seeds(trace, &starts)?.into_iter();
        let before = if i > 0 { seeds.next().flatten() } else { None };
        Ok(StepSeeds {
            failing: seeds.next().flatten(),
            before,
        })
    }
}

/// The planner of the traced program: the config and the settings the trace shows.
pub(crate) fn planner(
    cfg: &ModelConfig,
    s: PlannerSettings,
) -> Result<GenerateChunked, ModelError> {
    let mut p = GenerateChunked::new(cfg.clone(), 1)?;
    p.attention = s.attn_implementation;
    p.expandable_segments = s.expandable_segments;
    Ok(p)
}

fn plan(
    p: &GenerateChunked,
    chunk: u64,
    limit: &Limit,
    prompt: u64,
) -> Result<PlannedRun, ModelError> {
    let mut p = p.clone();
    p.chunk_tokens = chunk.max(1);
    p.plan(limit, prompt)
}

/// Whether a run of `chunk` holds `context` under `limit`.
fn holds(p: &GenerateChunked, chunk: u64, limit: &Limit, context: u64) -> Result<bool, ModelError> {
    Ok(plan(p, chunk, limit, context)?.failure.is_none())
}

/// The largest chunk (a multiple of [`CHUNK_GRANULE`], at most `context`) whose run holds
/// `context`, given whether the smallest one's run does (`floor_holds`); `None` when not even
/// the smallest does.
fn largest_chunk(
    p: &GenerateChunked,
    limit: &Limit,
    context: u64,
    floor_holds: bool,
) -> Result<Option<u64>, ModelError> {
    let top = (context / CHUNK_GRANULE).max(1);
    if !floor_holds {
        return Ok(None);
    }
    let (mut lo, mut hi) = (1u64, top);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if holds(p, (mid * CHUNK_GRANULE).min(context), limit, context)? {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(Some((lo * CHUNK_GRANULE).min(context)))
}

/// Each category's predicted bytes beside the observed ones. The refused request belongs to the
/// step's activations on both sides.
fn residuals(parts: &[Part], observed: &BTreeMap<Category, u64>) -> Residuals {
    let mut rows = Vec::new();
    for c in Category::ALL {
        let predicted = parts.iter().find(|p| p.category == c).map(|p| p.bytes);
        let seen = observed.get(&c).copied();
        if predicted.is_none() && seen.is_none() {
            continue;
        }
        let observed = seen.unwrap_or(0);
        let residual = (i128::from(predicted.unwrap_or(0)) - i128::from(observed)) as i64;
        let likely_cause = match (predicted, residual) {
            (_, 0) => "agrees".to_string(),
            (None, _) => "not predicted by the planner (outside the caching allocator, or not modelled: see engine/transformers_5.rs)".to_string(),
            (Some(_), r) if r > 0 => "the planner holds more here than the trace did at its failure".to_string(),
            _ => "the trace holds more here than the planner predicts".to_string(),
        };
        rows.push(PartResidual {
            category: c,
            predicted,
            observed,
            residual,
            likely_cause,
        });
    }
    let predicted_total: u64 = parts.iter().map(|p| p.bytes).sum();
    let observed_total: u64 = observed.values().sum();
    Residuals {
        parts: rows,
        predicted_total,
        observed_total,
        total_residual: (i128::from(predicted_total) - i128::from(observed_total)) as i64,
    }
}

/// The transformers planner beside a failing step of `generate`: `None` when the step is not
/// one the planner models (no chunk or context read from the engine's loop, or a limit
/// transformers does not meet).
pub(crate) fn transformers_view(
    cfg: &ModelConfig,
    settings: PlannerSettings,
    step: &StepPosition,
    limit: &Limit,
    observed: &BTreeMap<Category, u64>,
    seeds: &StepSeeds,
) -> Option<Result<ModelView, ModelError>> {
    if !step.from_engine_loop || matches!(limit, Limit::GpuMemoryUtilization { .. }) {
        return None;
    }
    let (chunk, context) = (step.chunk_tokens?, step.context_tokens?);
    Some(
        planner(cfg, settings)
            .and_then(|p| view(&p, settings, step, chunk, context, limit, observed, seeds)),
    )
}

#[allow(clippy::too_many_arguments)]
fn view(
    p: &GenerateChunked,
    settings: PlannerSettings,
    step: &StepPosition,
    chunk: u64,
    context: u64,
    limit: &Limit,
    observed: &BTreeMap<Category, u64>,
    seeds: &StepSeeds,
) -> Result<ModelView, ModelError> {
    let cfg = &p.config;
    let to_failure = plan(p, chunk, limit, context)?;
    let limit_bytes = to_failure.limit_bytes;
    let (mut counted, parts) = match &to_failure.failure {
        Some(f) => {
            let mut parts = f.parts.clone();
            match parts
                .iter_mut()
                .find(|p| p.category == Category::Activations)
            {
                Some(p) => p.bytes += f.request,
                None => parts.push(Part {
                    category: Category::Activations,
                    bytes: f.request,
                    basis: Basis::Predicted,
                }),
            }
            (f.reserved + f.segment, parts)
        }
        None => (
            to_failure.steps.last().map_or(0, |s| s.peak_reserved),
            to_failure.last_step_parts.clone(),
        ),
    };
    let config_fits = to_failure.failure.is_none();
    let mut failure_fits = config_fits;
    let mut before_fits = to_failure
        .failure
        .as_ref()
        .is_none_or(|f| f.index >= step.chunk_index);
    let mut fits_basis = FitsBasis::Config;
    // On the default allocator, the step met with the segments the run held at its start.
    let mut seeded = p.clone();
    seeded.chunk_tokens = chunk;
    if let Some(seed) = &seeds.failing {
        let run = seeded.plan_from(limit, seed)?;
        failure_fits = run.failure.is_none();
        counted = match &run.failure {
            Some(f) => f.reserved + f.segment,
            None => run.steps.last().map_or(0, |s| s.peak_reserved),
        };
        fits_basis = FitsBasis::TracedSegments;
        if let Some(b) = &seeds.before {
            before_fits = seeded.plan_from(limit, b)?.failure.is_none();
        }
    }
    // The frontier at this chunk: the run to the model's own maximum.
    let max = cfg.max_position_embeddings.unwrap_or(1 << 20).max(context);
    let whole = plan(p, chunk, limit, max)?;
    let front = PlannedFrontier::of(&whole, chunk, Basis::Predicted);
    let context_frontier = ContextFrontier {
        chunk_tokens: chunk,
        largest_context: front.context_at_chunk,
        capped: front.capped,
        limited_by_pool: false,
        limit_bytes,
    };
    let at_floor = plan(p, CHUNK_GRANULE.min(context), limit, context)?;
    let chunk_frontier = ChunkFrontier {
        context_tokens: context,
        largest_chunk: largest_chunk(p, limit, context, at_floor.failure.is_none())?,
        floor: ChunkFloor {
            min_tokens: CHUNK_GRANULE,
            multiple: CHUNK_GRANULE,
            why: format!(
                "searched in steps of {CHUNK_GRANULE} tokens (transformers takes any prefill_chunk_size)"
            ),
        },
        at_floor: at_floor.steps.last().map_or(0, |s| s.peak_reserved),
        limit_bytes,
    };
    Ok(ModelView {
        runtime: Runtime::Transformers,
        engine: Some(to_failure.engine),
        planner: Some(settings),
        shape: ServingShape::prefill(cfg, chunk, context),
        failure_fits: Some(failure_fits),
        before_fits: Some(before_fits),
        fits_basis: Some(fits_basis),
        failure_fits_config: (fits_basis != FitsBasis::Config).then_some(config_fits),
        headroom: (i128::from(limit_bytes) - i128::from(counted)) as i64,
        counted,
        known: KnownParts::default(),
        residuals: residuals(&parts, observed),
        copied_percent: 0.0,
        parts,
        chunk_frontier,
        context_frontier,
        peak_fit: None,
    })
}

/// The levers of a planner view, each predicted by the planner from the config: the chunk, the
/// prompt, the limit, and expandable segments (for a run on the default allocator whose refusal
/// left room free inside segments, or whose frontier they move).
pub(crate) fn transformers_levers(
    cfg: &ModelConfig,
    m: &ModelView,
    limit: &Limit,
    fragmented: Option<(u64, u64)>,
) -> Vec<Lever> {
    let Some(p) = m.planner.and_then(|s| planner(cfg, s).ok()) else {
        return Vec::new();
    };
    let (chunk, context) = (m.shape.chunk_tokens, m.shape.context_tokens);
    let mut out = Vec::new();
    match m.chunk_frontier.largest_chunk {
        Some(c) => out.push(Lever {
            change: format!("prefill_chunk_size={c}"),
            fits: Some(true),
            ceiling: format!(
                "the largest chunk (in steps of {CHUNK_GRANULE}) whose run holds {context} tokens"
            ),
            feasible: true,
        }),
        None => out.push(Lever {
            change: format!("a prefill_chunk_size of {CHUNK_GRANULE} or less"),
            fits: Some(false),
            ceiling: format!(
                "no chunk of {CHUNK_GRANULE} tokens or more holds {context} tokens under this limit"
            ),
            feasible: false,
        }),
    }
    out.push(Lever {
        change: match m.context_frontier.largest_context {
            Some(l) => format!("a prompt of at most {l} tokens"),
            None => "a prompt of less than one chunk".into(),
        },
        fits: Some(m.context_frontier.largest_context.is_some()),
        ceiling: format!(
            "the largest context whose chunks of {chunk} all complete{}",
            if m.context_frontier.capped {
                " (the model's max_position_embeddings)"
            } else {
                ""
            }
        ),
        feasible: m.context_frontier.largest_context.is_some(),
    });
    if let Some(l) = needed_limit(&p, chunk, limit, context) {
        out.push(l);
    }
    if let Some(l) = expandable_lever(&p, m, limit, fragmented) {
        out.push(l);
    }
    out
}

/// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` for a run on the default allocator: the
/// planner replayed with expandable segments at the step's chunk, whether it holds the step and
/// how far it gets. Shown when the refusal left room free inside segments or the frontier moves.
fn expandable_lever(
    p: &GenerateChunked,
    m: &ModelView,
    limit: &Limit,
    fragmented: Option<(u64, u64)>,
) -> Option<Lever> {
    if p.expandable_segments {
        return None;
    }
    let (chunk, context) = (m.shape.chunk_tokens, m.shape.context_tokens);
    let mut e = p.clone();
    e.expandable_segments = true;
    let max = p
        .config
        .max_position_embeddings
        .unwrap_or(1 << 20)
        .max(context);
    let run = plan(&e, chunk, limit, max).ok()?;
    let front = PlannedFrontier::of(&run, chunk, Basis::Predicted);
    let fits = holds(&e, chunk, limit, context).ok()?;
    if fragmented.is_none() && front.context_at_chunk <= m.context_frontier.largest_context {
        return None;
    }
    let reach = match front.context_at_chunk {
        Some(l) => format!("its chunks of {chunk} complete up to {l} tokens"),
        None => "not even the first chunk completes".into(),
    };
    let free = fragmented.map_or(String::new(), |(reserve, request)| {
        format!(
            "; the refusal left {} free inside segments beside the {} request",
            fmt_bytes(reserve),
            fmt_bytes(request)
        )
    });
    Some(Lever {
        change: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(),
        fits: Some(fits),
        ceiling: format!(
            "the planner replayed on expandable segments (pages mapped as needed, no slivers left at segment ends): {reach}{free}"
        ),
        feasible: true,
    })
}

/// The smallest limit (in steps of 64 MiB, up to the card) under which the run holds `context`.
fn needed_limit(p: &GenerateChunked, chunk: u64, limit: &Limit, context: u64) -> Option<Lever> {
    const STEP: u64 = 64 << 20;
    let capacity = match *limit {
        Limit::PerProcessFraction { capacity, .. } | Limit::Card { capacity } => capacity,
        Limit::GpuMemoryUtilization { .. } => return None,
    };
    let with = |bytes: u64| match *limit {
        Limit::PerProcessFraction { capacity, .. } => Limit::PerProcessFraction {
            capacity,
            fraction: bytes as f64 / capacity as f64,
        },
        _ => Limit::Card { capacity: bytes },
    };
    let ok = |bytes: u64| holds(p, chunk, &with(bytes), context).unwrap_or(false);
    let (mut lo, mut hi) = (0u64, capacity / STEP);
    if !ok(hi * STEP) {
        return Some(Lever {
            change: "a larger card".into(),
            fits: Some(false),
            ceiling: format!(
                "not even the whole card ({}) holds {context} tokens at a chunk of {chunk}",
                fmt_bytes(capacity)
            ),
            feasible: false,
        });
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid * STEP) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let bytes = hi * STEP;
    Some(Lever {
        change: match limit {
            Limit::PerProcessFraction { capacity, .. } => format!(
                "set_per_process_memory_fraction({:.3})",
                ((bytes as f64 / *capacity as f64) * 1000.0).ceil() / 1000.0
            ),
            _ => format!("a card of {} or more", fmt_bytes(bytes)),
        },
        fits: Some(true),
        ceiling: format!(
            "the smallest limit (in steps of 64 MiB) under which the run holds {context} tokens: {}",
            fmt_bytes(bytes)
        ),
        feasible: true,
    })
}

/// A curve of the cliff plot: `(x, bytes counted against the limit)`.
type Curve = Vec<(u64, u64)>;

/// The planner's curves for the cliff plot: the bytes it counts against `limit` at the end of
/// each step of a run at `chunk` up to `hi_context` (the refused step last, at what it would
/// have needed), and for each of `chunks` (those of [`CHUNK_GRANULE`] or more) the most it
/// counts over a run to `context`.
pub(crate) fn transformers_curves(
    cfg: &ModelConfig,
    settings: PlannerSettings,
    chunk: u64,
    context: u64,
    hi_context: u64,
    limit: &Limit,
    chunks: &[u64],
) -> Result<(Curve, Curve), ModelError> {
    let counted = |run: &PlannedRun| -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = run
            .steps
            .iter()
            .map(|s| (s.context_tokens, s.peak_reserved))
            .collect();
        if let Some(f) = &run.failure {
            v.push((f.context_tokens, f.reserved + f.segment));
        }
        v
    };
    let p = planner(cfg, settings)?;
    let max = cfg
        .max_position_embeddings
        .map_or(hi_context, |m| hi_context.min(m.max(context)));
    let ctx = counted(&plan(&p, chunk, limit, max.max(context))?);
    let mut chk = Vec::new();
    for &c in chunks.iter().filter(|&&c| c >= CHUNK_GRANULE.min(context)) {
        let run = plan(&p, c, limit, context)?;
        if let Some(most) = counted(&run).iter().map(|&(_, b)| b).max() {
            chk.push((c, most));
        }
    }
    Ok((ctx, chk))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{ev, tensor_alloc, trace_of};
    use vramtrace_format::{Record, TensorEvent};

    const MIB: u64 = 1 << 20;

    fn tensor(t: u64, ptr: u64, size: u64, segment: u64) -> Record {
        Record::Tensor(TensorEvent {
            segment,
            ..tensor_alloc(t, ptr, size)
        })
    }

    /// The allocator's state is read from the trace only when the trace holds all of it: the
    /// segments and the blocks inside them; a live block in no segment the trace saw (a
    /// recording begun mid-run) leaves the step to the config.
    #[test]
    fn the_allocator_state_is_read_only_when_the_trace_holds_all_of_it() {
        let seg = 0x7000_0000u64;
        let base = vec![
            Record::Event(ev(
                1,
                EventKind::Alloc,
                MemKind::Device,
                "cuMemAlloc_v2",
                seg,
                20 * MIB,
            )),
            tensor(2, seg, 2 * MIB, seg),
            tensor(3, seg + 4 * MIB, 2 * MIB, seg),
        ];
        let at = |n: usize| At {
            process: 0,
            device: 0,
            seq: n,
        };
        let whole = trace_of(1, base.clone());
        let s = allocator_seeds(&whole, &[(at(3), 5)]).unwrap()[0]
            .clone()
            .unwrap();
        assert_eq!(s.index, 5);
        assert_eq!(s.segments, vec![(seg, 20 * MIB)]);
        assert_eq!(s.blocks, vec![(seg, 2 * MIB), (seg + 4 * MIB, 2 * MIB)]);
        // A block allocated before recording began: in no segment the trace saw.
        let mut partial = base;
        partial.push(tensor(4, 0x9000_0000, 2 * MIB, 0));
        let t = trace_of(1, partial);
        assert_eq!(allocator_seeds(&t, &[(at(4), 5)]).unwrap(), vec![None]);
        // Read in one pass, each start has the state before it.
        let both = allocator_seeds(&whole, &[(at(2), 4), (at(3), 5)]).unwrap();
        assert_eq!(both[0].as_ref().unwrap().blocks, vec![(seg, 2 * MIB)]);
        assert_eq!(both[1], Some(s));
    }
}
