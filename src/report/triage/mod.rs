//! The top of a report, for the person who triages the bug: the verdict class with its
//! evidence, the limit that was actually enforced and the shortfall against it, the request that
//! tipped it over with its Python line, the chunk and context read from the trace, every byte of
//! the moment in a category ([`crate::categoriser`]), the whole-step model's verdict on the
//! failing step with its residuals and frontier, and the levers with their predicted ceilings.
//!
//! [`triage`] computes it from a trace and a built [`Report`]; `report --json` serialises it and
//! the Markdown's first screen renders it.
//!
//! This module holds the types and [`triage`] with its phases; each job has a module of its own:
//! the refusal at a failure (`refusal.rs`: the enforced limit, the shortfall, the bytes inside
//! the limit, the allocator's reserve), the verdict (`verdict.rs`), the whole-step model beside
//! the failing step or the peak (`whole_step.rs`), the levers (`levers.rs`), a run where nothing
//! failed (`peak.rs`), whether `--model` is the traced model's (`config_check.rs`), PyTorch's
//! message and sizes (`torch_oom.rs`) and the runtime and user frames (`runtime.rs`).

use serde::Serialize;
use vramtrace_models::{Limit, Runtime};

use crate::categoriser::{self, At, Breakdown, Expectations, breakdown_at};
pub use crate::report::model_view::{
    Lever, ModelView, ModelViewError, PEAK_TOLERANCE_PERCENT, PeakFit, PlannerSettings,
};
use crate::report::step::{StepPosition, step_from_generate, step_from_labels, step_from_tensors};
use crate::report::{FailureReport, ModelInput, Report};
use crate::trace::Trace;

mod config_check;
mod levers;
mod peak;
mod refusal;
mod runtime;
mod torch_oom;
mod verdict;
mod whole_step;

pub use crate::symbolize::{first_user_frame, user_stack};
use config_check::config_contradiction;
use levers::levers;
use peak::{no_failure, peak_moment};
use refusal::refusal;
pub use runtime::detect_runtime;
use torch_oom::message_at;
pub use torch_oom::{pytorch_message, torch_format_size, torch_segment_size};
use verdict::verdict;
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
    /// `weights`, `kv_cache`, … ([`Category::key`](crate::categoriser::Category::key)).
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
    /// vLLM's slack, when the run was given `--gpu-memory-utilization`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vllm: Option<VllmSlack>,
}

/// vLLM's arithmetic at a runtime refusal (docs/vllm-0.20.1-planner-notes.md, section 2): at
/// start it filled `⌈U × total⌉` with the weights, its profiled peak, the non-torch and graph
/// terms and the KV pool; at run time only the card refuses, so a step may exceed its profiled
/// peak by the card less what was held outside the budget and the budget itself.
#[derive(Debug, Clone, Serialize)]
pub struct VllmSlack {
    /// `--gpu-memory-utilization`.
    pub utilization: f64,
    /// The card vLLM measured (`--capacity`, else the device's total).
    pub card_bytes: u64,
    /// `⌈U × total⌉`.
    pub budget_bytes: u64,
    /// Held outside the budget at the refusal: the context and other processes on the card.
    pub outside_bytes: u64,
    /// `card − outside − budget`.
    pub slack_bytes: i64,
    /// The failure in vLLM's terms (`budget_over_free`, `another_process`, `cuda_graphs`,
    /// `step_over_profiled`).
    pub class: &'static str,
    /// Why, in a sentence with its numbers.
    pub why: String,
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
    /// vLLM's `--gpu-memory-utilization` the run was given: the budget vLLM filled at start (its
    /// KV pool takes what the rest leaves), not a limit at run time, where the card refuses.
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

/// Computes the triage of `report` (built from `trace`).
pub fn triage(trace: &Trace, report: &Report, opts: &TriageOptions) -> crate::Result<Triage> {
    let failure = report.first_failure();
    let (at, on_peak) = moment_of(trace, report)?;
    let breakdown = match at {
        Some(at) => Some(breakdown_at(trace, at, Expectations::default())?),
        None => None,
    };
    let mut t = Triage::at(moment_words(trace, failure, on_peak), breakdown.clone());
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
    at_failure(trace, report, opts, &mut t, f, at, &b)?;
    Ok(t)
}

/// The time of a peak's moment (ns) and the bytes of PyTorch's live tensors then.
type PeakTime = (u64, u64);

/// The moment the categories are of: the first failure, else the highest peak's (with its time
/// and the bytes of PyTorch's live tensors then); `None` when nothing was allocated.
fn moment_of(trace: &Trace, report: &Report) -> crate::Result<(Option<At>, Option<PeakTime>)> {
    if report.first_failure().is_some() {
        return Ok((categoriser::first_failure(trace)?, None));
    }
    let Some(p) = report.highest_peak() else {
        return Ok((None, None));
    };
    Ok(match peak_moment(trace, p.process, p.device)? {
        Some((at, t_ns, tensors)) => (Some(at), Some((t_ns, tensors))),
        None => (None, None),
    })
}

/// Which moment the categories are of, in words.
fn moment_words(
    trace: &Trace,
    failure: Option<&FailureReport>,
    on_peak: Option<PeakTime>,
) -> String {
    match failure {
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
    }
}

impl Triage {
    /// The triage of a moment before anything is weighed: its categories, no verdict yet.
    fn at(moment: String, breakdown: Option<Breakdown>) -> Triage {
        Triage {
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
            categories: breakdown.as_ref().map(rows_of).unwrap_or_default(),
            breakdown,
            model: None,
            model_error: None,
            model_warning: None,
            levers: Vec::new(),
            pytorch_message: None,
            inside_limit: None,
            vllm: None,
        }
    }
}

/// The triage of a failure: the limit enforced and the shortfall against it, the request that
/// tipped it over, PyTorch's message, the failing step, the whole-step model beside it, the
/// verdict, the config check and the levers.
fn at_failure(
    trace: &Trace,
    report: &Report,
    opts: &TriageOptions,
    t: &mut Triage,
    f: &FailureReport,
    at: At,
    b: &Breakdown,
) -> crate::Result<()> {
    let r = refusal(report, opts, f, b);
    let fl = r.failure;
    t.limit = Some(r.limit.clone());
    t.shortfall = Some(r.shortfall);
    t.tipping = Some(Tipping {
        bytes: fl.size,
        line: first_user_frame(&f.frames),
        label: fl.label.clone(),
        category: "activations",
    });
    t.pytorch_message = message_at(report, f, r.total);
    t.step = failing_step(trace, opts, f, at)?;
    t.inside_limit = Some(r.inside);
    t.vllm = opts
        .gpu_memory_utilization
        .map(|u| vllm_slack(u, &r.limit.limit, r.total, &r.inside, r.shortfall, b));
    let limit = &r.limit.limit;
    let model = match &opts.model {
        None => None,
        Some(m) => match whole_step(
            trace,
            opts,
            m,
            t,
            b,
            limit,
            r.reserve,
            r.inside.other_process,
            r.inside.context,
        ) {
            Ok(v) => Some(v),
            Err(e) => {
                t.model_error = Some(e.to_string());
                None
            }
        },
    };
    t.verdict = verdict(opts, b, &r, t.step.as_ref(), model.as_ref());
    t.model_warning = match (&model, &opts.model) {
        (Some(m), Some(mi)) => config_contradiction(trace, f.process, b, m, &mi.cfg)?,
        _ => None,
    };
    let trusted = model.as_ref().filter(|_| t.model_warning.is_none());
    t.levers = levers(opts, t, trusted, limit, t.verdict.class, r.reserve, fl.size);
    t.model = model;
    Ok(())
}

/// vLLM's slack at a runtime refusal and the failure in vLLM's terms: a budget over what was
/// free at start (vLLM would not have started: the run was not vLLM's, or something took memory
/// after its start); another process on the card holding more than the request lacked; CUDA
/// graphs holding more than it lacked (captured after the pool was sized, beyond their
/// estimate); else the step went over the peak vLLM profiled by more than the slack.
fn vllm_slack(
    u: f64,
    limit: &Limit,
    total: u64,
    inside: &InsideLimit,
    shortfall: u64,
    b: &Breakdown,
) -> VllmSlack {
    let card = match *limit {
        Limit::Card { capacity } => capacity,
        _ => total,
    };
    let budget = (card as f64 * u).ceil() as u64;
    let outside = inside.context + inside.other_process;
    let slack = card as i64 - outside as i64 - budget as i64;
    let graphs = b.bytes(vramtrace_models::Category::CudaGraphs);
    let (class, why) = if slack < 0 {
        (
            "budget_over_free",
            format!(
                "the budget (⌈{u} × total⌉ = {}) is more than the card less what was held outside it ({}): vLLM refuses to start so; lower --gpu-memory-utilization",
                gib(budget),
                gib(card.saturating_sub(outside))
            ),
        )
    } else if inside.other_process > shortfall {
        (
            "another_process",
            format!(
                "another process holds {} on the card, more than the {} the request lacked",
                gib(inside.other_process),
                gib(shortfall)
            ),
        )
    } else if graphs > shortfall {
        (
            "cuda_graphs",
            format!(
                "CUDA graphs hold {}, more than the {} the request lacked: captured after the pool was sized, beyond what vLLM estimated",
                gib(graphs),
                gib(shortfall)
            ),
        )
    } else {
        (
            "step_over_profiled",
            format!(
                "the step went over the peak vLLM profiled at start by more than the slack of {} (its profile run skips the attention and GDN kernels): lower --gpu-memory-utilization by at least {} of the card, or lower --max-num-batched-tokens",
                gib(slack as u64),
                gib(shortfall)
            ),
        )
    };
    VllmSlack {
        utilization: u,
        card_bytes: card,
        budget_bytes: budget,
        outside_bytes: outside,
        slack_bytes: slack,
        class,
        why,
    }
}

/// Where in the run the failing step was: its labels, else transformers' generate loop, else
/// the tensors' lines.
fn failing_step(
    trace: &Trace,
    opts: &TriageOptions,
    f: &FailureReport,
    at: At,
) -> crate::Result<Option<StepPosition>> {
    let cfg = opts.model.as_ref().map(|m| &m.cfg);
    Ok(match step_from_labels(f) {
        Some(s) => Some(s),
        None => match step_from_generate(trace, at, cfg)? {
            Some(s) => Some(s),
            None => step_from_tensors(trace, at, cfg)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::categoriser::Row;
    use vramtrace_models::Category;

    const GIB: u64 = 1 << 30;

    fn breakdown(graphs: u64) -> Breakdown {
        Breakdown {
            rows: vec![Row {
                category: Category::CudaGraphs,
                bytes: graphs,
                count: 1,
                evidence: Vec::new(),
            }],
            total: graphs,
            segments: Vec::new(),
        }
    }

    fn inside(context: u64, other_process: u64) -> InsideLimit {
        InsideLimit {
            other_process,
            context,
            outside: 0,
        }
    }

    #[test]
    fn a_vllm_refusal_is_classed_in_vllm_s_terms() {
        let card = Limit::Card { capacity: 24 * GIB };
        let s = |u, ctx, other, short, graphs| {
            vllm_slack(
                u,
                &card,
                24 * GIB,
                &inside(ctx, other),
                short,
                &breakdown(graphs),
            )
        };
        // 0.9 of 24 GiB is 21.6 GiB; with 0.5 GiB outside it, 1.9 GiB of slack.
        let v = s(0.9, GIB / 2, 0, 100 << 20, 0);
        assert_eq!(
            v.slack_bytes,
            (24 * GIB - GIB / 2) as i64 - (24.0 * 0.9 * GIB as f64).ceil() as i64
        );
        assert_eq!(v.class, "step_over_profiled");
        assert_eq!(s(0.99, GIB / 2, 0, 1 << 20, 0).class, "budget_over_free");
        assert_eq!(s(0.9, GIB / 2, GIB, 100 << 20, 0).class, "another_process");
        assert_eq!(
            s(0.9, GIB / 2, 0, 100 << 20, 200 << 20).class,
            "cuda_graphs"
        );
        // Lowering the utilisation never lowers the slack.
        let mut last = i64::MIN;
        for u in (50..=99).rev() {
            let v = s(u as f64 / 100.0, GIB / 2, 0, 1, 0);
            assert!(v.slack_bytes >= last);
            last = v.slack_bytes;
        }
    }
}
