//! The top of a report, for the person who triages the bug: the verdict class with its
//! evidence, the limit that was actually enforced and the shortfall against it, the request that
//! tipped it over with its Python line, the chunk and context read from the trace, every byte of
//! the moment in a category ([`crate::categoriser`]), the whole-step model's verdict on the
//! failing step with its residuals and frontier, and the levers with their predicted ceilings.
//!
//! [`triage`] computes it from a trace and a built [`Report`]; `report --json` serialises it and
//! the Markdown's first screen renders it.

use serde::Serialize;
use vramtrace_models::{KnownParts, Limit, Runtime, StepModel, StepVariants};

use crate::categoriser::{self, Breakdown, Category, Evidence, Expectations, breakdown_at};
pub use crate::report::model_view::{
    Lever, ModelView, ModelViewError, PEAK_TOLERANCE_PERCENT, PeakFit, PlannerSettings,
};
use crate::report::step::{StepPosition, step_from_generate, step_from_labels, step_from_tensors};
use crate::report::{ModelInput, Report};
use crate::trace::Trace;

mod config_check;
mod levers;
mod peak;
mod runtime;
mod torch_oom;
mod whole_step;

use config_check::config_contradiction;
use levers::levers;
use peak::{no_failure, peak_moment};
use runtime::first_user_frame;
pub use runtime::{detect_runtime, user_stack};
pub use torch_oom::{pytorch_message, torch_format_size, torch_segment_size};
use whole_step::whole_step;

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
