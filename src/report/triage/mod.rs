//! The top of a report, for the person who triages the bug: the verdict class with its
//! evidence, the limit that was actually enforced and the shortfall against it, the request that
//! tipped it over with its Python line, the chunk and context read from the trace, every byte of
//! the moment in a category ([`crate::categoriser`]), the whole-step model's verdict on the
//! failing step with its residuals and frontier, and the levers with their predicted ceilings.
//!
//! [`triage`] computes it from a trace and a built [`Report`]; `report --json` serialises it and
//! the Markdown's first screen renders it.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use serde::Serialize;
use vramtrace_models::engine::{Basis, Part};
use vramtrace_models::{
    ChunkFloor, DType, KnownParts, LayerKind, Limit, Residuals, Runtime, ServingShape, StepModel,
    StepVariants, residuals,
};

use crate::categoriser::{self, At, Breakdown, Category, Evidence, Expectations, breakdown_at};
use crate::report::engine_view;
pub use crate::report::model_view::{
    Lever, ModelView, ModelViewError, PEAK_TOLERANCE_PERCENT, PeakFit, PlannerSettings,
};
use crate::report::step::{
    StepPosition, batch_step_at, embedding_outputs_match, step_at_peak, step_from_generate,
    step_from_labels, step_from_tensors,
};
use crate::report::{ModelInput, Report};
use crate::torch_replay::TensorReplay;
use crate::trace::{Item, Trace};

mod runtime;
mod torch_oom;

use runtime::first_user_frame;
pub use runtime::{detect_runtime, user_stack};
pub use torch_oom::{pytorch_message, torch_format_size, torch_segment_size};

/// The longest context the context frontier searches (tokens per sequence).
const MAX_SEARCHED_CONTEXT: u64 = 1 << 20;

/// What ran out, in one of the classes a maintainer asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictClass {
    /// One kernel's (or layer's) live tensors do not fit even with nothing accumulated.
    KernelLiveSet,
    /// The KV cache grew with the context until a step no longer fit.
    KvGrowth,
    /// Enough was free inside the caching allocator's segments, but not in one block.
    Fragmentation,
    /// CUDA graphs' private pools took what the step needed.
    CudaGraphs,
    /// Another process held what the step needed.
    OtherProcess,
    /// The CUDA context, loaded modules and libraries' workspaces took what the step needed.
    Context,
    /// A limit below the card (a fraction, `--gpu-memory-utilization`) refused the request.
    Limit,
    /// Nothing failed.
    None,
}

impl VerdictClass {
    /// The name in `report --json` (`kv_growth`).
    pub fn key(self) -> &'static str {
        match self {
            VerdictClass::KernelLiveSet => "kernel_live_set",
            VerdictClass::KvGrowth => "kv_growth",
            VerdictClass::Fragmentation => "fragmentation",
            VerdictClass::CudaGraphs => "cuda_graphs",
            VerdictClass::OtherProcess => "other_process",
            VerdictClass::Context => "context",
            VerdictClass::Limit => "limit",
            VerdictClass::None => "none",
        }
    }

    /// The name a person reads.
    pub fn title(self) -> &'static str {
        match self {
            VerdictClass::KernelLiveSet => "the kernel's live set",
            VerdictClass::KvGrowth => "KV-cache growth",
            VerdictClass::Fragmentation => "fragmentation",
            VerdictClass::CudaGraphs => "CUDA graphs",
            VerdictClass::OtherProcess => "another process",
            VerdictClass::Context => "context and modules",
            VerdictClass::Limit => "an enforced limit",
            VerdictClass::None => "no failure",
        }
    }
}

/// The verdict and what it rests on.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The class.
    pub class: VerdictClass,
    /// The facts it rests on, each a sentence with its numbers.
    pub evidence: Vec<String>,
}

/// The limit that was enforced when the request was refused.
#[derive(Debug, Clone, Serialize)]
pub struct EnforcedLimit {
    /// The limit (for the whole-step model).
    pub limit: Limit,
    /// Its bytes.
    pub bytes: u64,
    /// Where it was read from, in words.
    pub source: String,
}

/// The request that did not fit.
#[derive(Debug, Clone, Serialize)]
pub struct Tipping {
    /// Bytes requested.
    pub bytes: u64,
    /// The first user or library frame (`file.py:LINE function`), when the stack has one.
    pub line: Option<String>,
    /// The label active then (an NVTX range or annotation).
    pub label: Option<String>,
    /// The category the step needed it for.
    pub category: &'static str,
}

/// One category of the moment, as `report --json` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct CategoryRow {
    /// `weights`, `kv_cache`, … ([`Category::key`]).
    pub category: &'static str,
    /// Bytes.
    pub bytes: u64,
    /// What they rest on, one sentence per line of evidence, with its bytes.
    pub evidence: Vec<String>,
}

/// The highest peak of a run where nothing failed: the moment its categories are of.
#[derive(Debug, Clone, Serialize)]
pub struct PeakView {
    /// The process.
    pub pid: u32,
    /// The device.
    pub device: i32,
    /// Seconds from the trace's start.
    pub t_s: f64,
    /// The device bytes of the process at the moment (the sum of the categories).
    pub bytes: u64,
    /// PyTorch's live tensors then (0 when the process reported none).
    pub tensor_bytes: u64,
    /// Bytes in a category other than `unnamed`.
    pub named_bytes: u64,
    /// `named_bytes / bytes` in percent.
    pub named_percent: f64,
    /// How the moment was chosen, in words.
    pub moment: String,
}

/// Everything the first screen and `report --json` say beyond the summary.
#[derive(Debug, Clone, Serialize)]
pub struct Triage {
    /// The verdict.
    pub verdict: Verdict,
    /// Which moment the categories are of (`the first failure`, `the highest peak`).
    pub moment: String,
    /// The limit enforced at the failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<EnforcedLimit>,
    /// Bytes the request lacked against that limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shortfall: Option<u64>,
    /// The request that tipped it over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tipping: Option<Tipping>,
    /// The failing step's chunk and context (without a failure: the step at the peak).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<StepPosition>,
    /// Without a failure: the highest peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak: Option<PeakView>,
    /// Every byte of the moment in a category.
    pub categories: Vec<CategoryRow>,
    /// The categoriser's breakdown (segments included), for the tables and plots.
    #[serde(skip)]
    pub breakdown: Option<Breakdown>,
    /// The whole-step model, with `--model`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelView>,
    /// Why the whole-step model could not be set beside the failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_error: Option<String>,
    /// Why the model's figures are not to be trusted for this trace (its config contradicts
    /// what the trace holds); its levers are then not shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_warning: Option<String>,
    /// The levers, most useful first.
    pub levers: Vec<Lever>,
    /// PyTorch's out-of-memory message rebuilt from the trace, when PyTorch refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pytorch_message: Option<String>,
    /// Of `other_process` and `context`, the bytes inside the enforced limit (under a card
    /// smaller than the device, what lies past the card is a ballast or another tenant).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inside_limit: Option<InsideLimit>,
}

/// The bytes of the categories a card smaller than the device splits.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct InsideLimit {
    /// Other processes' bytes inside the limit.
    pub other_process: u64,
    /// The context's bytes inside the limit.
    pub context: u64,
    /// The device's bytes past the limit (`total − limit` under a smaller card, else 0).
    pub outside: u64,
}

/// What the triage needs besides the trace and the report.
#[derive(Debug, Clone, Default)]
pub struct TriageOptions {
    /// The model (config with `--layers` applied, TP).
    pub model: Option<ModelInput>,
    /// The program to model the step as; detected from the trace when `None`.
    pub runtime: Option<Runtime>,
    /// vLLM's attention block in tokens (the chunk floor in align mode); the step's chunk when
    /// `None` and the runtime is vLLM-like on a hybrid model.
    pub block_size: Option<u64>,
    /// `--capacity`: a card of this size (a ballast leaves it).
    pub capacity: Option<u64>,
    /// vLLM's `--gpu-memory-utilization` the run was given: the budget of this process, a
    /// fraction of the card (`--capacity`, else the device's total).
    pub gpu_memory_utilization: Option<f64>,
    /// Whether the run's allocator had `expandable_segments:True` (`PYTORCH_CUDA_ALLOC_CONF` as
    /// `vramtrace run` recorded it).
    pub expandable_segments: bool,
}

fn rows_of(b: &Breakdown) -> Vec<CategoryRow> {
    b.rows
        .iter()
        .map(|r| CategoryRow {
            category: r.category.key(),
            bytes: r.bytes,
            evidence: r
                .evidence
                .iter()
                .map(|l| format!("{} ({} B, {} allocations)", l.evidence, l.bytes, l.count))
                .collect(),
        })
        .collect()
}

fn gib(b: u64) -> String {
    vramtrace_models::units::fmt_bytes(b)
}

/// The bytes of `other_process` and `context` inside the limit: under a card smaller than the
/// device (`--capacity` with a ballast), the device's bytes past the card are other processes'
/// first (the ballast), then the context's.
fn inside_limit(b: &Breakdown, device_total: u64, limit: &Limit) -> (u64, u64) {
    let other = b.bytes(Category::OtherProcess);
    let context = b.bytes(Category::Context);
    match limit {
        Limit::Card { capacity } | Limit::GpuMemoryUtilization { capacity, .. }
            if *capacity < device_total =>
        {
            let outside = device_total - capacity;
            let other_out = other.min(outside);
            let context_out = context.min(outside - other_out);
            (other - other_out, context - context_out)
        }
        _ => (other, context),
    }
}

/// Computes the triage of `report` (built from `trace`).
pub fn triage(trace: &Trace, report: &Report, opts: &TriageOptions) -> crate::Result<Triage> {
    let failure = report.first_failure();
    let mut on_peak: Option<(u64, u64)> = None;
    let at = match failure {
        Some(_) => categoriser::first_failure(trace)?,
        None => match report.highest_peak() {
            Some(p) => match peak_moment(trace, p.process, p.device)? {
                Some((at, t_ns, tensors)) => {
                    on_peak = Some((t_ns, tensors));
                    Some(at)
                }
                None => None,
            },
            None => None,
        },
    };
    let breakdown = match at {
        Some(at) => Some(breakdown_at(trace, at, Expectations::default())?),
        None => None,
    };
    let categories = breakdown.as_ref().map(rows_of).unwrap_or_default();
    let moment = match failure {
        Some(f) => format!("the first failure ({:.3} s)", f.failure.t_s),
        None => match on_peak {
            Some((t_ns, tensors)) => format!(
                "the highest peak ({:.3} s{})",
                t_ns.saturating_sub(trace.start_ns()) as f64 / 1e9,
                if tensors > 0 {
                    ", where PyTorch's live tensors were highest on it"
                } else {
                    ""
                }
            ),
            None => "the highest peak".to_string(),
        },
    };
    let mut t = Triage {
        verdict: Verdict {
            class: VerdictClass::None,
            evidence: Vec::new(),
        },
        moment,
        limit: None,
        shortfall: None,
        tipping: None,
        step: None,
        peak: None,
        categories,
        breakdown: breakdown.clone(),
        model: None,
        model_error: None,
        model_warning: None,
        levers: Vec::new(),
        pytorch_message: None,
        inside_limit: None,
    };
    if let (None, Some(at), Some(b), Some((t_ns, tensors))) = (failure, at, &breakdown, on_peak) {
        no_failure(trace, opts, &mut t, at, b, t_ns, tensors)?;
        return Ok(t);
    }
    let (Some(f), Some(at), Some(b)) = (failure, at, breakdown) else {
        t.verdict.evidence.push(match report.highest_peak() {
            Some(_) => "no allocation failed; the categories are those of the highest peak".into(),
            None => "no device allocation was recorded".into(),
        });
        return Ok(t);
    };
    let fl = &f.failure;
    let total = report
        .device(f.process, f.device)
        .and_then(|d| d.total_bytes)
        .filter(|&t| t > 0)
        .unwrap_or(fl.total_bytes);
    let torch = fl.torch.as_ref();

    // The limit enforced, and the shortfall against it.
    let (limit, source) = match (torch.filter(|t| t.limit > 0), opts.capacity) {
        (None, c) if opts.gpu_memory_utilization.is_some() => {
            let fraction = opts.gpu_memory_utilization.unwrap_or(1.0);
            let capacity = c.unwrap_or(total);
            (
                Limit::GpuMemoryUtilization { capacity, fraction },
                format!(
                    "vLLM's --gpu-memory-utilization {fraction} of {} (given): this process's budget, its context included",
                    gib(capacity)
                ),
            )
        }
        (Some(tl), _) => (
            Limit::PerProcessFraction {
                capacity: total,
                fraction: tl.limit as f64 / total as f64,
            },
            format!(
                "PyTorch's per-process limit of {} (`set_per_process_memory_fraction`), read from its refusal",
                gib(tl.limit)
            ),
        ),
        (None, Some(c)) => (
            Limit::Card { capacity: c },
            format!("a card of {} (given with --capacity)", gib(c)),
        ),
        (None, None) => (
            Limit::Card { capacity: total },
            format!("the card: {} total", gib(total)),
        ),
    };
    let limit_bytes = match torch.filter(|t| t.limit > 0) {
        Some(tl) => tl.limit,
        None => limit.bytes().unwrap_or(total),
    };
    let segment = torch.map(|tl| torch_segment_size(tl.requested));
    let shortfall = match torch {
        Some(tl) if tl.limit > 0 => (tl.reserved + segment.unwrap_or(tl.requested))
            .saturating_sub(tl.limit)
            .max(1),
        Some(tl) => segment
            .unwrap_or(tl.requested)
            .saturating_sub(tl.free)
            .max(1),
        None => match limit {
            // The budget counts this process, its context included; other processes are
            // outside it.
            Limit::GpuMemoryUtilization { capacity, .. } => {
                let (other_in, _) = inside_limit(&b, total, &limit);
                let outside = total.saturating_sub(capacity);
                let used = total
                    .saturating_sub(fl.free_bytes)
                    .saturating_sub(outside)
                    .saturating_sub(other_in);
                (used + fl.size)
                    .saturating_sub(limit_bytes)
                    .max(fl.size.saturating_sub(fl.free_bytes))
                    .max(1)
            }
            _ => fl.size.saturating_sub(fl.free_bytes).max(1),
        },
    };
    t.limit = Some(EnforcedLimit {
        limit,
        bytes: limit_bytes,
        source,
    });
    t.shortfall = Some(shortfall);
    t.tipping = Some(Tipping {
        bytes: fl.size,
        line: first_user_frame(&f.frames),
        label: fl.label.clone(),
        category: "activations",
    });
    if let Some(tl) = torch {
        let others: u64 = f
            .traced_by_process
            .iter()
            .filter(|(pid, _)| *pid != report.summary.processes[f.process].pid)
            .map(|(_, b)| *b)
            .sum();
        let in_use = total.saturating_sub(tl.free).saturating_sub(others);
        t.pytorch_message = Some(pytorch_message(f.device, tl, total, in_use));
    }

    // Where in the run: labels, else the tensors' lines.
    let cfg = opts.model.as_ref().map(|m| &m.cfg);
    t.step = match step_from_labels(f) {
        Some(s) => Some(s),
        None => match step_from_generate(trace, at, cfg)? {
            Some(s) => Some(s),
            None => step_from_tensors(trace, at, cfg)?,
        },
    };

    // The whole-step model.
    let (other_in, context_in) = inside_limit(&b, total, &limit);
    t.inside_limit = Some(InsideLimit {
        other_process: other_in,
        context: context_in,
        outside: match limit {
            Limit::Card { capacity } | Limit::GpuMemoryUtilization { capacity, .. } => {
                total.saturating_sub(capacity)
            }
            _ => 0,
        },
    });
    let reserve = match torch {
        Some(tl) => tl.reserved.saturating_sub(tl.allocated),
        None => b.bytes(Category::AllocatorReserve),
    };
    let largest_free = b
        .segments
        .iter()
        .map(|s| s.largest_free_block)
        .max()
        .unwrap_or(0);
    let model = match &opts.model {
        None => None,
        Some(m) => match whole_step(
            trace, opts, m, &t, &b, &limit, reserve, other_in, context_in,
        ) {
            Ok(v) => Some(v),
            Err(e) => {
                t.model_error = Some(e.to_string());
                None
            }
        },
    };

    // The verdict.
    let kv = b.bytes(Category::KvCache);
    let graphs = b.bytes(Category::CudaGraphs);
    let kv_grows = b.rows.iter().any(|r| {
        r.category == Category::KvCache
            && r.evidence.iter().any(|l| {
                matches!(l.evidence, Evidence::Lifetime { .. })
                    || l.evidence.to_string().contains("kv_cache")
            })
    });
    let chunk_index = t.step.as_ref().map(|s| s.chunk_index).unwrap_or(0);
    let mut ev = Vec::new();
    let without_fits = |part: KnownParts| -> Option<bool> {
        let m = model.as_ref().filter(|m| m.engine.is_none())?;
        let mi = opts.model.as_ref()?;
        let sm = StepModel::new(
            mi.cfg.clone(),
            StepVariants::for_runtime(m.runtime, &mi.cfg),
            part,
        );
        sm.check(&m.shape, &limit).ok()?.fits()
    };
    // Only what the limit counts can have made the request not fit under it (PyTorch's
    // per-process limit counts its own segments, not the context or other processes).
    let other_in = if limit.counts(vramtrace_models::Category::OtherProcess) {
        other_in
    } else {
        0
    };
    let context_in = if limit.counts(vramtrace_models::Category::Context) {
        context_in
    } else {
        0
    };
    // The class comes from the trace alone; the model adds lines of evidence and never flips it.
    let class = if other_in > 0 && other_in >= shortfall {
        ev.push(format!(
            "other processes held {} inside the limit, more than the {} the request lacked",
            gib(other_in),
            gib(shortfall)
        ));
        VerdictClass::OtherProcess
    } else if graphs >= shortfall {
        ev.push(format!(
            "CUDA graphs' pools held {} at the failure, more than the {} the request lacked",
            gib(graphs),
            gib(shortfall)
        ));
        VerdictClass::CudaGraphs
    } else if torch.is_some() && reserve >= fl.size && largest_free < fl.size {
        ev.push(format!(
            "{} was free inside PyTorch's segments (reserved {} − allocated {}), more than the {} request, but the largest free block was {}: no segment could serve it",
            gib(reserve),
            gib(torch.map_or(0, |x| x.reserved)),
            gib(torch.map_or(0, |x| x.allocated)),
            gib(fl.size),
            gib(largest_free)
        ));
        if let Some(fits) = without_fits(KnownParts {
            allocator_reserve: None,
            ..model.as_ref().map(|m| m.known.clone()).unwrap_or_default()
        }) {
            ev.push(format!(
                "the whole-step model {} without that reserve",
                if fits {
                    "fits the same step"
                } else {
                    "still does not fit the step"
                }
            ));
        }
        VerdictClass::Fragmentation
    } else if kv > 0 && chunk_index > 0 && (kv_grows || t.step.is_some()) {
        ev.push(format!(
            "the KV cache held {} at chunk {chunk_index}{}",
            gib(kv),
            if chunk_index > 0 {
                format!(
                    ", about {} per chunk since the first",
                    gib(kv / (chunk_index + 1))
                )
            } else {
                String::new()
            }
        ));
        if let Some(m) = &model {
            ev.push(format!(
                "the model fits a chunk of {} tokens up to a context of {} tokens; this step held {}",
                m.shape.chunk_tokens,
                m.context_frontier.largest_context.unwrap_or(0),
                m.shape.context_tokens
            ));
        }
        VerdictClass::KvGrowth
    } else if context_in > 0
        && context_in.saturating_mul(4) >= limit_bytes
        && context_in >= shortfall
    {
        ev.push(format!(
            "the context, modules and libraries' workspaces took {} of the {} limit",
            gib(context_in),
            gib(limit_bytes)
        ));
        VerdictClass::Context
    } else if limit_bytes < total && !matches!(limit, Limit::Card { .. }) {
        ev.push(format!(
            "the limit, {}, is below what the step needed; the card still had {} free",
            t.limit.as_ref().map_or(String::new(), |l| l.source.clone()),
            gib(fl.free_bytes)
        ));
        if let Some(m) = &model
            && m.context_frontier.largest_context.is_none()
        {
            ev.push(format!(
                "the whole-step model fits no context at a chunk of {} under it: what is resident (weights, state, the context) already takes it",
                m.shape.chunk_tokens
            ));
        }
        VerdictClass::Limit
    } else {
        if fl.size > limit_bytes {
            ev.push(format!(
                "the request alone, {}, is larger than the whole limit of {}: no cache or chunk setting makes it fit",
                gib(fl.size),
                gib(limit_bytes)
            ));
        } else {
            ev.push(format!(
                "the failing step's tensors: {} in activations when the {} request came",
                gib(b.bytes(Category::Activations)),
                gib(fl.size)
            ));
            if let Some(r) = b
                .rows
                .iter()
                .filter(|r| r.category != Category::Activations)
                .max_by_key(|r| r.bytes)
            {
                ev.push(format!(
                    "the largest other part: {} {}{}",
                    r.category.title(),
                    gib(r.bytes),
                    r.evidence
                        .first()
                        .map(|l| format!(" ({})", l.evidence))
                        .unwrap_or_default()
                ));
            }
        }
        VerdictClass::KernelLiveSet
    };
    if matches!(limit, Limit::PerProcessFraction { .. }) && class != VerdictClass::Limit {
        ev.push(format!(
            "under an enforced limit: {}",
            t.limit.as_ref().map_or(String::new(), |l| l.source.clone())
        ));
    }
    if let Some(m) = &model {
        ev.push(format!(
            "{}: the failing step {} ({} counted against {})",
            m.engine
                .map_or("the whole-step model".to_string(), |e| format!(
                    "the planner of {e} (from the config)"
                )),
            if m.failure_fits == Some(false) {
                "does not fit"
            } else {
                "fits — a residual the trace must explain"
            },
            gib(m.counted),
            gib(limit_bytes)
        ));
    }
    t.verdict = Verdict {
        class,
        evidence: ev,
    };
    t.model_warning = match (&model, &opts.model) {
        (Some(m), Some(mi)) => config_contradiction(trace, f.process, &b, m, &mi.cfg)?,
        _ => None,
    };
    let trusted = model.as_ref().filter(|_| t.model_warning.is_none());
    t.levers = levers(opts, &t, trusted, &limit, class, reserve, fl.size);
    t.model = model;
    Ok(t)
}

/// How far a config's weights may be from the trace's before the report says the config is not
/// the traced model's: 5%.
const WEIGHTS_TOLERANCE_PERCENT: f64 = 5.0;

/// Whether the model's config contradicts the trace: its predicted weights more than
/// [`WEIGHTS_TOLERANCE_PERCENT`] from the bytes the categoriser named weights. `None` when they
/// agree, or when the trace names no weights (a run that loaded none, or an unnamed one).
fn config_contradiction(
    trace: &Trace,
    process: usize,
    b: &Breakdown,
    m: &ModelView,
    cfg: &vramtrace_models::ModelConfig,
) -> crate::Result<Option<String>> {
    let observed = b.bytes(Category::Weights);
    let predicted = m
        .parts
        .iter()
        .find(|p| p.category == Category::Weights)
        .map(|p| p.bytes);
    if let Some(predicted) = predicted.filter(|_| observed > 0) {
        let off = (predicted as f64 - observed as f64) * 100.0 / observed as f64;
        if off.abs() > WEIGHTS_TOLERANCE_PERCENT {
            return Ok(Some(format!(
                "the config's weights ({}) are {off:+.1}% from the {} the trace holds as weights: is `--model` the traced model's config? Its figures are shown, its levers are not",
                gib(predicted),
                gib(observed)
            )));
        }
    }
    let per_token = cfg.hidden_size * cfg.dtype.size_bytes();
    Ok(match embedding_outputs_match(trace, process, per_token)? {
        Some(false) => Some(format!(
            "no embedding output of the run is a whole number of tokens of the config's hidden size ({} × {} B): is `--model` the traced model's config? Its figures are shown, its levers are not",
            cfg.hidden_size,
            cfg.dtype.size_bytes()
        )),
        _ => None,
    })
}

/// The moment of the highest peak of one process and device: its highest device bytes and,
/// among the moments at that level (a peak is a plateau under a caching allocator), the one
/// where PyTorch's live tensors were highest — the step's own peak. The moment, its time and
/// the live tensor bytes then.
fn peak_moment(
    trace: &Trace,
    process: usize,
    device: i32,
) -> crate::Result<Option<(At, u64, u64)>> {
    let mut r = crate::replay::Replayer::new();
    // PyTorch's live tensors (a restatement counts as the allocation the ring dropped).
    let mut tensors = TensorReplay::new();
    let mut best: Option<(u64, u64, usize, u64)> = None;
    let mut i = 0usize;
    trace.for_each_item(|pi, it| {
        let mine = pi == process;
        match &it {
            Item::Event(e) => {
                r.apply(pi, i, e);
            }
            Item::Tensor(t) if mine && t.device == device => {
                tensors.apply(pi, i, t);
            }
            _ => {}
        }
        if mine {
            let level = r.level(process, device, crate::replay::Pool::Device).live;
            let live = tensors.level(process, device).live;
            if level > 0 && best.is_none_or(|(l, tb, _, _)| (level, live) > (l, tb)) {
                best = Some((level, live, i, it.t_ns()));
            }
        }
        i += 1;
        ControlFlow::Continue(())
    })?;
    Ok(best.map(|(_, tb, seq, t_ns)| {
        (
            At {
                process,
                device,
                seq,
            },
            t_ns,
            tb,
        )
    }))
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

/// The triage of a run where nothing failed: the peak, its categories, and with a model the
/// whole-step model's peak beside the observed one, part by part, and its frontier.
#[allow(clippy::too_many_arguments)]
fn no_failure(
    trace: &Trace,
    opts: &TriageOptions,
    t: &mut Triage,
    at: At,
    b: &Breakdown,
    t_ns: u64,
    tensors: u64,
) -> crate::Result<()> {
    let p = &trace.processes[at.process];
    let unnamed = b.bytes(Category::Unnamed);
    let named = b.total.saturating_sub(unnamed);
    let percent = |x: u64| {
        if b.total == 0 {
            0.0
        } else {
            100.0 * x as f64 / b.total as f64
        }
    };
    t.peak = Some(PeakView {
        pid: p.pid(),
        device: at.device,
        t_s: t_ns.saturating_sub(trace.start_ns()) as f64 / 1e9,
        bytes: b.total,
        tensor_bytes: tensors,
        named_bytes: named,
        named_percent: percent(named),
        moment: "the process's highest device bytes; of the moments at that level, the one with the most live PyTorch tensors (the step's own peak)".into(),
    });
    t.verdict.evidence.push(format!(
        "no allocation failed; the highest peak, {}, has {:.2}% of its bytes in a named category",
        gib(b.total),
        percent(named)
    ));
    let Some(m) = &opts.model else {
        return Ok(());
    };
    t.step = match batch_step_at(trace, at, Some(&m.cfg))? {
        Some(s) => Some(s),
        None => step_at_peak(trace, at, &m.cfg)?,
    };
    match peak_model(trace, opts, m, t, b) {
        Ok(v) => {
            t.model_warning = config_contradiction(trace, at.process, b, &v, &m.cfg)?;
            t.model = Some(v);
        }
        Err(e) => t.model_error = Some(e.to_string()),
    }
    Ok(())
}

/// The whole-step model at a peak without a failure: the step read from the trace, the parts a
/// config cannot give (the engine's KV pool and static buffers, the allocator's reserve, the
/// context, graphs, NCCL, autotuning) taken from the moment's categories, the rest predicted.
fn peak_model(
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
    let limit = match opts.gpu_memory_utilization {
        Some(fraction) => Limit::GpuMemoryUtilization { capacity, fraction },
        None => Limit::Card { capacity },
    };
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

#[allow(clippy::too_many_arguments)]
fn whole_step(
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
            expandable_segments: opts.expandable_segments,
        };
        if let Some(v) = engine_view::transformers_view(cfg, settings, step, limit, &seen) {
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
fn what_if(
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

fn ceiling(largest: Option<u64>, chunk: u64) -> String {
    match largest {
        Some(l) => format!("contexts up to {l} tokens at a chunk of {chunk}"),
        None => format!("no context fits at a chunk of {chunk}"),
    }
}

fn levers(
    opts: &TriageOptions,
    t: &Triage,
    model: Option<&ModelView>,
    limit: &Limit,
    class: VerdictClass,
    reserve: u64,
    request: u64,
) -> Vec<Lever> {
    let mut out = Vec::new();
    let frag = class == VerdictClass::Fragmentation;
    if let (Some(m), Some(mi)) = (model.filter(|m| m.engine.is_some()), opts.model.as_ref()) {
        return engine_view::transformers_levers(
            &mi.cfg,
            m,
            limit,
            frag.then_some((reserve, request)),
        );
    }
    let Some(m) = model else {
        if frag {
            out.push(Lever {
                change: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(),
                fits: None,
                ceiling: format!(
                    "the {} free inside segments becomes one mappable range, more than the {} request (give --model for the new ceiling)",
                    gib(reserve),
                    gib(request)
                ),
                feasible: true,
            });
        }
        // What the limit would have to be for this request, from the trace alone: everything
        // the limit counted then, the request's share included.
        if let (Some(limit_bytes), Some(short)) = (t.limit.as_ref().map(|l| l.bytes), t.shortfall) {
            let needed = limit_bytes + short;
            let (change, feasible) = match limit {
                Limit::PerProcessFraction { capacity, .. } => {
                    let f = needed as f64 / *capacity as f64;
                    (
                        format!(
                            "set_per_process_memory_fraction({:.3})",
                            (f * 1000.0).ceil() / 1000.0
                        ),
                        f <= 1.0,
                    )
                }
                Limit::GpuMemoryUtilization { capacity, .. } => {
                    let f = needed as f64 / *capacity as f64;
                    (
                        format!(
                            "--gpu-memory-utilization {:.3}",
                            (f * 1000.0).ceil() / 1000.0
                        ),
                        f <= 1.0,
                    )
                }
                Limit::Card { .. } => (
                    format!("a card (or a budget) of {} or more", gib(needed)),
                    true,
                ),
            };
            out.push(Lever {
                change,
                fits: None,
                ceiling: format!(
                    "this request fits with {} more; the rest of the step is not known without --model",
                    gib(short)
                ),
                feasible,
            });
        }
        return out;
    };
    let chunk = m.shape.chunk_tokens;
    let context = m.shape.context_tokens;
    // vLLM's flags for the programs that take them (the workload stands in for vLLM's
    // chunked prefill); plain words for the others.
    let vllm_flags = matches!(m.runtime, Runtime::Vllm | Runtime::Workload);
    if frag {
        let known = KnownParts {
            allocator_reserve: None,
            ..m.known.clone()
        };
        if let Some((fits, ctx)) = what_if(opts, m, known, &m.shape, limit) {
            out.push(Lever {
                change: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(),
                fits: Some(fits),
                ceiling: format!(
                    "{} (the {} reserve usable)",
                    ceiling(ctx, chunk),
                    gib(reserve)
                ),
                feasible: true,
            });
        }
    }
    if let Some(graphs) = m.known.cuda_graphs {
        let known = KnownParts {
            cuda_graphs: None,
            ..m.known.clone()
        };
        if let Some((fits, ctx)) = what_if(opts, m, known, &m.shape, limit) {
            out.push(Lever {
                change: "--enforce-eager (or fewer --cuda-graph-sizes)".into(),
                fits: Some(fits),
                ceiling: format!(
                    "{} (frees {} of graph pools)",
                    ceiling(ctx, chunk),
                    gib(graphs)
                ),
                feasible: true,
            });
        }
    }
    let f = &m.chunk_frontier;
    out.push(match f.largest_chunk {
        Some(c) => Lever {
            change: if vllm_flags {
                format!("--max-num-batched-tokens {c}")
            } else {
                format!("a prefill chunk of {c} tokens")
            },
            fits: Some(c >= 1),
            ceiling: format!(
                "the largest chunk that fits at this context ({context} tokens) is {c}{}",
                if f.floor.multiple > 1 {
                    format!(
                        " (a multiple of {} tokens, the smallest chunk the engine schedules)",
                        f.floor.multiple
                    )
                } else {
                    String::new()
                }
            ),
            feasible: true,
        },
        None => Lever {
            change: if vllm_flags {
                "--max-num-batched-tokens (smaller chunk)".into()
            } else {
                "a smaller prefill chunk".into()
            },
            fits: Some(false),
            ceiling: format!(
                "no chunk fits at this context ({context} tokens): even the floor of {} tokens counts {} against {}",
                f.floor.min_tokens.max(f.floor.multiple).max(1),
                gib(f.at_floor),
                gib(f.limit_bytes)
            ),
            feasible: false,
        },
    });
    let cf = &m.context_frontier;
    out.push(Lever {
        change: match cf.largest_context {
            Some(l) if vllm_flags => format!("--max-model-len {l}"),
            Some(l) => format!("contexts of at most {l} tokens"),
            None if vllm_flags => "--max-model-len".into(),
            None => "a shorter context".into(),
        },
        // It refuses this request's context up front instead of fitting it.
        fits: cf.largest_context.filter(|&l| l >= context).map(|_| true),
        ceiling: ceiling(cf.largest_context, chunk),
        feasible: cf.largest_context.is_some(),
    });
    // The limit needed for this step.
    let needed = m.counted;
    let (change, feasible) = match limit {
        Limit::GpuMemoryUtilization { capacity, .. }
        | Limit::PerProcessFraction { capacity, .. } => {
            let frac = needed as f64 / *capacity as f64;
            (
                if matches!(limit, Limit::GpuMemoryUtilization { .. }) {
                    format!(
                        "--gpu-memory-utilization {:.3}",
                        (frac * 1000.0).ceil() / 1000.0
                    )
                } else {
                    format!(
                        "set_per_process_memory_fraction({:.3})",
                        (frac * 1000.0).ceil() / 1000.0
                    )
                },
                frac <= 1.0,
            )
        }
        Limit::Card { .. } => (
            format!(
                "a card (or a --gpu-memory-utilization budget) of {} or more",
                gib(needed)
            ),
            true,
        ),
    };
    out.push(Lever {
        change,
        fits: Some(feasible),
        ceiling: format!("this step counts {} against the limit", gib(needed)),
        feasible,
    });
    let mut fp8 = m.shape.clone();
    if fp8.kv_dtype.size_bytes() > 1 {
        fp8.kv_dtype = DType::F8;
        if let Some((fits, ctx)) = what_if(opts, m, m.known.clone(), &fp8, limit) {
            let same = ctx == m.context_frontier.largest_context;
            out.push(Lever {
                change: "--kv-cache-dtype fp8".into(),
                fits: Some(fits),
                ceiling: if same {
                    format!(
                        "{} (unchanged: the {} runtime's model keeps K/V in the activation dtype)",
                        ceiling(ctx, chunk),
                        m.runtime.name()
                    )
                } else {
                    ceiling(ctx, chunk)
                },
                feasible: !same,
            });
        }
    }
    let mut tp2 = m.shape.clone();
    tp2.tp = m.shape.tp * 2;
    if let Some((fits, ctx)) = what_if(opts, m, m.known.clone(), &tp2, limit) {
        out.push(Lever {
            change: if vllm_flags {
                format!("--tensor-parallel-size {}", tp2.tp)
            } else {
                format!("a tensor-parallel degree of {}", tp2.tp)
            },
            fits: Some(fits),
            ceiling: format!("{} per rank", ceiling(ctx, chunk)),
            feasible: true,
        });
    }
    let _ = t;
    // Most useful first: those that fit the failing step, then those that cap it, then those
    // that do not help; infeasible last.
    out.sort_by_key(|l| {
        (
            !l.feasible,
            match l.fits {
                Some(true) => 0,
                None => 1,
                Some(false) => 2,
            },
        )
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str) -> Trace {
        Trace::open(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("samples/h200")
                .join(name),
        )
        .unwrap()
    }

    /// transformers' chunked generate of the `hybrid12` model (hidden size 2048, bf16): its
    /// embedding outputs are whole numbers of 4,096-byte tokens, not of a 2,176-wide model's
    /// (whose 4,352-byte tokens a 512-byte block rounding would let pass); a run without
    /// PyTorch's embedding in its stacks cannot tell.
    #[test]
    fn a_config_whose_hidden_size_no_embedding_output_has_is_told_apart() {
        let t = sample("hf-generate-oom");
        assert_eq!(embedding_outputs_match(&t, 0, 4096).unwrap(), Some(true));
        assert_eq!(embedding_outputs_match(&t, 0, 4352).unwrap(), Some(false));
        let native = sample("torch-nocache");
        assert_eq!(embedding_outputs_match(&native, 0, 4096).unwrap(), None);
    }
}
