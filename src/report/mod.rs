//! `vramtrace report`: one Markdown document a user pastes into a bug report, built from the
//! same passes as `summary`, `compare` and `model`.
//!
//! [`build`] gathers everything ([`Report`]); [`markdown::render`] writes it, short at the top
//! (what failed, where, why, what to change) and complete below; [`html::render`] turns that
//! Markdown into one self-contained HTML file with the plots inline.
//!
//! Live allocations are put in the categoriser's categories ([`crate::categoriser`], by their
//! stacks, labels and names); the report's "What the memory holds" section shows every byte of
//! the first failure (else the highest peak) in a category with what it rests on. Within a category they are grouped by name and label with
//! the numbers that index layers and chunks collapsed ([`crate::names::pattern`]).

pub mod engine_view;
pub mod figures;
pub mod html;
pub mod json;
pub mod levers;
pub mod llama_view;
pub mod markdown;
pub mod model_view;
pub mod step;
pub mod triage;

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use vramtrace_format::{EventKind, TensorAction};
use vramtrace_models::{ModelConfig, Variant, Workload, WorkloadOptions};

use crate::attribution::Attribution;
use crate::categories::{CATEGORIES, category};
use crate::error::Error;
use crate::names::pattern;
use crate::observe::{At, observe};
use crate::replay::{Pool, Replayer, Step};
use crate::summary::{AllocItem, Failure, Summary, SummaryOptions, summarize};
use crate::symbolize::StackSymbolizer;
use crate::torch_replay::TensorMoment;
use crate::trace::{Item, Trace};

pub use levers::Levers;

/// Allocations whose stacks are shown at a peak or a failure.
pub const TOP_STACKS: usize = 5;
/// Frames of each stack shown.
pub const STACK_FRAMES: usize = 12;
/// Groups listed per live set; the rest are summed in one line.
pub const MAX_GROUPS: usize = 12;
/// Failures set beside the model (each is one more pass over the trace).
pub const MAX_COMPARED_FAILURES: usize = 8;
/// Live allocations kept per peak or failure for grouping: all of them in any real trace.
const LIVE_CAP: usize = 1 << 20;

/// The model a report compares with: the config, the variants to choose from, the batch.
#[derive(Debug, Clone)]
pub struct ModelInput {
    /// The config.
    pub cfg: ModelConfig,
    /// The variants to choose from (one when `--variant` was given).
    pub variants: Vec<Variant>,
    /// Whether `--variant` named the one to use.
    pub variant_given: bool,
    /// The batch (the prefill chunk: `--tokens` / `--seqlens`, `--tp`, dtype).
    pub opts: WorkloadOptions,
    /// Whether `--tokens` or `--seqlens` named the chunk; otherwise the chunk read from the
    /// trace (the failing step's) is the kernel model's batch.
    pub tokens_given: bool,
}

/// What the report is built from besides the trace.
#[derive(Debug, Clone, Default)]
pub struct ReportOptions {
    /// A name for the trace (its directory's name).
    pub title: String,
    /// The model, when `--model` was given.
    pub model: Option<ModelInput>,
    /// The card the levers are computed for (default: the failing device's total).
    pub capacity: Option<u64>,
    /// The program to model the step as (`--runtime`); detected from the trace when `None`.
    pub runtime: Option<vramtrace_models::Runtime>,
    /// vLLM's attention block in tokens (`--block-size`, the chunk floor in align mode).
    pub block_size: Option<u64>,
    /// vLLM's `--gpu-memory-utilization` the run was given (the enforced budget).
    pub gpu_memory_utilization: Option<f64>,
    /// What `vramtrace run` gathered at start (`versions.json` in the trace directory), as
    /// name and value.
    pub versions: Vec<(String, String)>,
    /// `--model MODEL.gguf`: a llama.cpp model's header, with its path.
    pub gguf: Option<(std::path::PathBuf, vramtrace_models::gguf::GgufHeader)>,
    /// When the trace was made by `vramtrace attach` (its `attach.json`): the process attached
    /// to, and what it held then.
    pub attached: Option<Attached>,
}

/// What `vramtrace attach` wrote of the process it attached to (`attach.json`): what was made
/// before the attach is not in the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// The process attached to.
    pub pid: u32,
    /// The bytes NVML said it held on its devices just before the attach, when NVML answered.
    pub process_bytes: Option<u64>,
}

/// One group of live allocations: same category, same name and label pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Index in [`CATEGORIES`].
    pub category: usize,
    /// `name [label]` with numbers collapsed to `#`.
    pub key: String,
    /// Allocations.
    pub count: usize,
    /// Bytes.
    pub bytes: u64,
}

/// A live set summed by category and by group.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LiveSet {
    /// Bytes and counts per category, in [`CATEGORIES`] order.
    pub by_category: Vec<(u64, usize)>,
    /// Groups, largest first.
    pub groups: Vec<Group>,
    /// Bytes of the KV cache proper: KV-category allocations that are not recurrent state.
    pub kv_cache_bytes: u64,
    /// Bytes of allocations named through the annotation ABI.
    pub named_bytes: u64,
}

/// The plain tensor name of a summary item's `name dtype[shape]` (`h bf16[1, 65]` → `h`).
pub fn tensor_name(t: &str) -> &str {
    let Some(open) = t.rfind('[').filter(|_| t.ends_with(']')) else {
        return t;
    };
    let prefix = &t[..open];
    match prefix.strip_suffix(' ') {
        Some(name) => name,
        None => prefix.rsplit_once(' ').map_or(prefix, |(n, _)| n),
    }
}

impl LiveSet {
    /// Sums `items` by category and group; with the process they belong to, each is
    /// categorised by its stack as well as its label and name
    /// ([`crate::categoriser::categorise_stack`]).
    pub fn of(items: &[AllocItem], process: Option<&crate::trace::Process>) -> LiveSet {
        let mut s = LiveSet {
            by_category: vec![(0, 0); CATEGORIES.len()],
            ..LiveSet::default()
        };
        let mut groups: BTreeMap<(usize, String), (usize, u64)> = BTreeMap::new();
        for a in items {
            let name = a.tensor.as_deref().map(tensor_name);
            let c = match process {
                Some(p) => crate::categoriser::categorise_stack(
                    p,
                    a.stack,
                    a.size,
                    a.label.as_deref(),
                    name,
                )
                .category
                .index(),
                None => category(a.label.as_deref(), name).index(),
            };
            let e = &mut s.by_category[c];
            e.0 = e.0.saturating_add(a.size);
            e.1 += 1;
            if name.is_some() {
                s.named_bytes = s.named_bytes.saturating_add(a.size);
            }
            let is_state = |x: Option<&str>| x.is_some_and(|x| x.contains("state"));
            if CATEGORIES[c] == "KV cache" && !is_state(name) && !is_state(a.label.as_deref()) {
                s.kv_cache_bytes = s.kv_cache_bytes.saturating_add(a.size);
            }
            let key = match (name, a.label.as_deref()) {
                (Some(n), Some(l)) => format!("{} [{}]", pattern(n), pattern(l)),
                (Some(n), None) => pattern(n),
                (None, Some(l)) => format!("(unnamed) [{}]", pattern(l)),
                (None, None) => format!("(unnamed) {}", a.api),
            };
            let g = groups.entry((c, key)).or_default();
            g.0 += 1;
            g.1 = g.1.saturating_add(a.size);
        }
        s.groups = groups
            .into_iter()
            .map(|((category, key), (count, bytes))| Group {
                category,
                key,
                count,
                bytes,
            })
            .collect();
        s.groups
            .sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.key.cmp(&b.key)));
        s
    }

    /// Bytes of one category by name.
    pub fn category_bytes(&self, name: &str) -> u64 {
        CATEGORIES
            .iter()
            .position(|c| *c == name)
            .map_or(0, |i| self.by_category[i].0)
    }
}

/// A model set beside a failure or a peak.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The variant shown.
    pub variant: Variant,
    /// How it was chosen, in words.
    pub choice: String,
    /// Predicted beside observed.
    pub attribution: Attribution,
    /// Per observed allocation (the indices of `attribution.observed`): what the trace says it
    /// holds, dtype and shape included, when it says (`o bf16[1, 4128, 48, 128]` from an
    /// annotation, `empty_like [1, 4128] bf16` from a tensor record).
    pub held: Vec<Option<String>>,
}

impl Comparison {
    /// Fills [`Comparison::held`] from the summary's view of the same moment: the driver
    /// allocations live then and, with tensor records, the live tensors, joined by pointer and
    /// size.
    fn describe_held(&mut self, live: &[AllocItem], tensors: Option<&TensorMoment>) {
        let mut by: BTreeMap<(&str, u64), &str> = BTreeMap::new();
        for a in live {
            if let Some(t) = &a.tensor {
                by.insert((a.ptr.as_str(), a.size), t);
            }
        }
        let mut by_tensor: BTreeMap<(&str, u64), &str> = BTreeMap::new();
        for t in tensors.map_or(&[][..], |m| &m.tensors) {
            if let Some(d) = &t.tensor {
                by_tensor.insert((t.ptr.as_str(), t.size), d);
            }
        }
        self.held = self
            .attribution
            .observed
            .iter()
            .map(|o| {
                let from = if o.api == "pytorch" { &by_tensor } else { &by };
                from.get(&(o.ptr.as_str(), o.size)).map(|s| s.to_string())
            })
            .collect();
    }
}

/// Every failed allocation of one process and device, with what the report adds.
#[derive(Debug, Clone)]
pub struct FailureReport {
    /// Index of the process in the trace.
    pub process: usize,
    /// Device ordinal.
    pub device: i32,
    /// The n-th failure of this process and device (0-based).
    pub index: usize,
    /// The failure as `summary` sees it (live set in full).
    pub failure: Failure,
    /// The live set grouped.
    pub live: LiveSet,
    /// Traced live device bytes of every process on this ordinal at that moment, by pid.
    pub traced_by_process: Vec<(u32, u64)>,
    /// Symbolised frames of the failed request.
    pub frames: Vec<String>,
    /// Of those, the frames with a function name (what the first screen shows).
    pub named_frames: Vec<String>,
    /// The model beside it (`--model`; the first [`MAX_COMPARED_FAILURES`]).
    pub comparison: Option<Comparison>,
}

impl FailureReport {
    /// Traced live bytes of every process on this device then.
    pub fn traced_all(&self) -> u64 {
        self.traced_by_process
            .iter()
            .fold(0u64, |a, (_, b)| a.saturating_add(*b))
    }

    /// What the driver counted as used but the trace did not see: total − free − traced live
    /// across the processes (the CUDA contexts, loaded modules, processes not traced). `None`
    /// when the driver's numbers are missing.
    pub fn untraced(&self) -> Option<i128> {
        let f = &self.failure;
        (f.total_bytes > 0).then(|| {
            i128::from(f.total_bytes) - i128::from(f.free_bytes) - i128::from(self.traced_all())
        })
    }

    /// Bytes the request lacked: request − free (0 when the driver said enough was free).
    pub fn shortfall(&self) -> u64 {
        self.failure.size.saturating_sub(self.failure.free_bytes)
    }
}

/// A device peak of one process, with what the report adds.
#[derive(Debug, Clone)]
pub struct PeakReport {
    /// Index of the process in the trace.
    pub process: usize,
    /// Device ordinal.
    pub device: i32,
    /// The live set at the peak grouped.
    pub live: LiveSet,
    /// The largest allocations live at the peak, with their symbolised frames.
    pub top: Vec<(AllocItem, Vec<String>)>,
    /// Every byte of the peak in a category ([`crate::categoriser`]), with its evidence.
    pub categories: Option<crate::categoriser::Breakdown>,
}

/// Everything a report shows.
#[derive(Debug, Clone)]
pub struct Report {
    /// The trace's name.
    pub title: String,
    /// The summary, live sets in full.
    pub summary: Summary,
    /// Per process and device, in the summary's order.
    pub peaks: Vec<PeakReport>,
    /// Every failed allocation detailed, in time order.
    pub failures: Vec<FailureReport>,
    /// The model, when given.
    pub model: Option<ModelInput>,
    /// The model at the highest peak ([`Report::highest_peak`]), with a model.
    pub peak_comparison: Option<Comparison>,
    /// Why the model could not be set beside the highest peak.
    pub peak_comparison_error: Option<String>,
    /// The levers, with a model.
    pub levers: Option<Levers>,
    /// Why the levers could not be computed with the model given.
    pub levers_error: Option<String>,
    /// The capacity the levers were computed for, and whether it was given.
    pub capacity: Option<(u64, bool)>,
    /// Whether some frame shown could not be symbolised (the traced files are not here).
    pub unsymbolised: bool,
    /// Host names of the processes, in order.
    pub host_names: Vec<String>,
    /// When the first process started (UTC), when known.
    pub started: Option<String>,
    /// The verdict, the limit, the categories, the whole-step model and the levers.
    pub triage: Option<triage::Triage>,
    /// Why the triage could not be computed.
    pub triage_error: Option<String>,
    /// What `vramtrace run` gathered at start, as name and value.
    pub versions: Vec<(String, String)>,
    /// With `--model MODEL.gguf`: llama.cpp's buffers predicted beside the trace, or why not.
    pub llama_cpp: Option<Result<llama_view::LlamaCppView, String>>,
    /// Per process: whether it ran PyTorch (loaded `libc10_cuda` or recorded tensors).
    pub pytorch: Vec<bool>,
}

impl Report {
    /// The failure the top of the report is about: the first in time.
    pub fn first_failure(&self) -> Option<&FailureReport> {
        self.failures.first()
    }

    /// The process, device and live set at the highest peak of the trace.
    pub fn highest_peak(&self) -> Option<&PeakReport> {
        self.peaks.iter().max_by(|a, b| {
            self.device(a.process, a.device)
                .map(|d| d.peak_bytes)
                .cmp(&self.device(b.process, b.device).map(|d| d.peak_bytes))
                .then(b.process.cmp(&a.process))
        })
    }

    /// The summary of one process and device.
    /// Every byte in a category at the first failure, else at the highest peak: the process
    /// and device, and the categoriser's rows ([`crate::categoriser`]).
    pub fn categories(&self) -> Option<(usize, i32, &crate::summary::DeviceCategories)> {
        let (process, device) = match self.first_failure() {
            Some(f) => (f.process, f.device),
            None => {
                let p = self.highest_peak()?;
                (p.process, p.device)
            }
        };
        let c = self.device(process, device)?.categories.as_ref()?;
        Some((process, device, c))
    }

    /// The process, device and its summary.
    pub fn device(&self, process: usize, device: i32) -> Option<&crate::summary::DeviceSummary> {
        self.summary
            .processes
            .get(process)?
            .devices
            .iter()
            .find(|d| d.device == device)
    }
}

/// Builds the report of `trace`.
pub fn build(trace: &Trace, opts: &ReportOptions) -> crate::Result<Report> {
    let summary = summarize(
        trace,
        SummaryOptions {
            top: LIVE_CAP,
            frames: 0,
        },
    )?;
    let mut syms: Vec<StackSymbolizer> = trace.processes.iter().map(StackSymbolizer::new).collect();
    let mut unsymbolised = false;
    let mut frames_of = |pi: usize, stack: u32| -> (Vec<String>, Vec<String>) {
        if stack == 0 {
            return (Vec::new(), Vec::new());
        }
        let mut frames: Vec<_> = syms[pi].stack(stack);
        // STACK_FRAMES from the first user or library frame on, the machinery above it kept
        // for the reader who wants it.
        let texts: Vec<String> = frames.iter().map(|f| f.to_string()).collect();
        let (machinery, _) = triage::user_stack(&texts);
        frames.truncate(machinery + STACK_FRAMES);
        unsymbolised |= frames.iter().any(|f| f.function.is_none());
        (
            frames.iter().map(|f| f.to_string()).collect(),
            frames
                .iter()
                .filter(|f| f.function.is_some())
                .map(|f| f.to_string())
                .collect(),
        )
    };
    let mut peaks = Vec::new();
    let mut failures = Vec::new();
    let across = traced_at_failures(trace)?;
    for (pi, p) in summary.processes.iter().enumerate() {
        for d in &p.devices {
            if d.peak_bytes > 0 {
                peaks.push(PeakReport {
                    process: pi,
                    device: d.device,
                    live: LiveSet::of(&d.peak_live, Some(&trace.processes[pi])),
                    top: d
                        .peak_live
                        .iter()
                        .take(TOP_STACKS)
                        .map(|a| (a.clone(), frames_of(pi, a.stack).0))
                        .collect(),
                    categories: None,
                });
            }
            for (n, f) in d.failures.iter().enumerate() {
                let (frames, named_frames) = frames_of(pi, f.stack);
                failures.push(FailureReport {
                    process: pi,
                    device: d.device,
                    index: n,
                    failure: f.clone(),
                    live: LiveSet::of(&f.live, Some(&trace.processes[pi])),
                    traced_by_process: across.get(&(pi, d.device, n)).cloned().unwrap_or_default(),
                    frames,
                    named_frames,
                    comparison: None,
                });
            }
        }
    }
    failures.sort_by(|a, b| {
        a.failure
            .t_s
            .total_cmp(&b.failure.t_s)
            .then(a.process.cmp(&b.process))
    });
    let mut report = Report {
        unsymbolised,
        title: opts.title.clone(),
        summary,
        peaks,
        failures,
        model: opts.model.clone(),
        peak_comparison: None,
        peak_comparison_error: None,
        levers: None,
        levers_error: None,
        capacity: None,
        host_names: trace
            .processes
            .iter()
            .map(|p| p.header.hostname.clone())
            .collect(),
        started: trace
            .processes
            .iter()
            .map(|p| p.header.start_unix_ns)
            .filter(|t| *t > 0)
            .min()
            .and_then(|t| jiff::Timestamp::from_nanosecond(i128::from(t)).ok())
            .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()),
        triage: None,
        triage_error: None,
        versions: opts.versions.clone(),
        llama_cpp: None,
        pytorch: trace
            .processes
            .iter()
            .map(|p| {
                p.modules
                    .iter()
                    .any(|m| m.path.contains("libc10_cuda") || m.path.contains("libtorch_cuda"))
            })
            .collect(),
    };
    report.llama_cpp = opts
        .gguf
        .as_ref()
        .map(|(path, header)| llama_view::view(&report, path, header, opts.attached.as_ref()));
    let topts = triage::TriageOptions {
        model: opts.model.clone(),
        runtime: opts.runtime,
        block_size: opts.block_size,
        capacity: opts.capacity,
        gpu_memory_utilization: opts.gpu_memory_utilization,
        expandable_segments: opts
            .versions
            .iter()
            .any(|(k, v)| k == "PYTORCH_CUDA_ALLOC_CONF" && expandable_in(v)),
    };
    match triage::triage(trace, &report, &topts) {
        Ok(t) => report.triage = Some(t),
        Err(e) => report.triage_error = Some(crate::error::with_causes(&e)),
    }
    for p in &mut report.peaks {
        let at = crate::categoriser::peak(trace, p.process, p.device)?;
        if let Some(at) = at {
            p.categories = Some(crate::categoriser::breakdown_at(
                trace,
                at,
                crate::categoriser::Expectations::default(),
            )?);
        }
    }
    // The kernel model's chunk: the one the trace shows failing, unless one was given.
    let model = opts.model.clone().map(|mut m| {
        if !m.tokens_given
            && let Some(t) = report
                .triage
                .as_ref()
                .and_then(|t| t.step.as_ref())
                .and_then(|s| s.chunk_tokens)
        {
            m.opts.seqlens = vec![t];
        }
        m
    });
    report.model = model.clone();
    if let Some(m) = &model {
        let workload = Workload::from_config(&m.cfg, &m.opts)?;
        for f in report.failures.iter_mut().take(MAX_COMPARED_FAILURES) {
            let pid = trace.processes[f.process].header.pid;
            let moment = observe(trace, Some(pid), Some(f.device), At::Failure(f.index))?;
            let mut c = compare(m, &workload, &moment)?;
            c.describe_held(&f.failure.live, f.failure.tensors.as_ref());
            f.comparison = Some(c);
        }
        match peak_comparison(trace, &report, m, &workload) {
            Ok(c) => report.peak_comparison = c,
            Err(e) => report.peak_comparison_error = Some(crate::error::with_causes(&e)),
        }
        let capacity = opts.capacity.map(|c| (c, true)).or_else(|| {
            let (pi, dev) = report
                .first_failure()
                .map(|f| (f.process, f.device))
                .or_else(|| report.highest_peak().map(|p| (p.process, p.device)))?;
            report
                .device(pi, dev)
                .and_then(|d| d.total_bytes)
                .map(|t| (t, false))
        });
        report.capacity = capacity;
        match capacity {
            None => {
                report.levers_error =
                    Some("the trace does not say how large the device is; pass --capacity".into())
            }
            Some((cap, _)) => match levers_for(&report, m, cap) {
                Ok(l) => report.levers = Some(l),
                Err(e) => report.levers_error = Some(format!("{e:#}")),
            },
        }
    }
    Ok(report)
}

/// The model beside the highest peak; `None` when the trace has no device allocation.
fn peak_comparison(
    trace: &Trace,
    report: &Report,
    m: &ModelInput,
    workload: &Workload,
) -> crate::Result<Option<Comparison>> {
    let Some(p) = report.highest_peak() else {
        return Ok(None);
    };
    let pid = trace.processes[p.process].header.pid;
    let moment = observe(trace, Some(pid), Some(p.device), At::Peak)?;
    let mut c = compare(m, workload, &moment)?;
    if let Some(d) = report.device(p.process, p.device) {
        let tensors = d.tensors.as_ref().and_then(|t| t.at_peak.as_ref());
        c.describe_held(&d.peak_live, tensors);
    }
    Ok(Some(c))
}

/// The levers at the first failure, or at the highest peak without one.
fn levers_for(report: &Report, m: &ModelInput, capacity: u64) -> crate::Result<Levers> {
    let (comparison, live, failure) = match report.first_failure() {
        Some(f) => (
            f.comparison
                .as_ref()
                .expect("the first failure is compared"),
            &f.live,
            Some(f),
        ),
        None => {
            let p = report
                .highest_peak()
                .ok_or_else(|| Error::Unanswerable("the trace has no device allocation".into()))?;
            let c = match (&report.peak_comparison, &report.peak_comparison_error) {
                (Some(c), _) => c,
                (None, Some(e)) => return Err(Error::Unanswerable(e.to_string())),
                (None, None) => {
                    return Err(Error::Unanswerable(
                        "the trace has no device allocation".into(),
                    ));
                }
            };
            (c, &p.live, None)
        }
    };
    // The KV cache and the weights as the categoriser counts them (frames and lifetimes), not
    // only what a label names.
    let mut live = live.clone();
    if let Some(t) = &report.triage {
        let bytes = |k: &str| {
            t.categories
                .iter()
                .find(|c| c.category == k)
                .map_or(0, |c| c.bytes)
        };
        live.kv_cache_bytes = live.kv_cache_bytes.max(bytes("kv_cache"));
        if let Some(i) = CATEGORIES.iter().position(|c| *c == "weights") {
            live.by_category[i].0 = live.by_category[i].0.max(bytes("weights"));
        }
    }
    let live = &live;
    levers::compute(m, comparison, live, failure, capacity)
}

/// The variant that explains the most bytes of a moment with evidence (or the one named).
fn compare(
    m: &ModelInput,
    workload: &Workload,
    moment: &crate::observe::ObservedMoment,
) -> crate::Result<Comparison> {
    let candidates = crate::cliff::candidates(&m.variants, m.variant_given);
    let (variant, _, attribution) = crate::cliff::best_variant(&candidates, workload, moment, 1)?;
    let choice = if m.variant_given {
        "chosen with --variant".to_string()
    } else {
        format!(
            "the best match of {} variants; pass --variant to choose",
            candidates.len()
        )
    };
    Ok(Comparison {
        held: vec![None; attribution.observed.len()],
        variant,
        choice,
        attribution,
    })
}

/// Per failed allocation (process index, device, n-th failure of that process and device): the
/// traced live device bytes of every process on the same ordinal at that moment.
type Across = BTreeMap<(usize, i32, usize), Vec<(u32, u64)>>;

fn traced_at_failures(trace: &Trace) -> crate::Result<Across> {
    let mut replay = Replayer::new();
    let mut counts: BTreeMap<(usize, i32), usize> = BTreeMap::new();
    let mut out = Across::new();
    let mut seq = 0usize;
    trace.for_each_item(|pi, it| {
        // The failures as summary numbers them per process and device: the driver's
        // out-of-memory failures and PyTorch's allocator refusals, in time order.
        let failed_on = match &it {
            Item::Event(e) => (replay.apply(pi, seq, e) == Step::Failed
                && e.kind == EventKind::AllocFailed)
                .then_some(e.device),
            Item::Tensor(t) => (t.action == TensorAction::AllocFailed).then_some(t.device),
            _ => None,
        };
        if let Some(device) = failed_on {
            let n = counts.entry((pi, device)).or_default();
            if *n < crate::summary::MAX_DETAILED_FAILURES {
                let mut by: BTreeMap<u32, u64> = BTreeMap::new();
                for ((q, dev, pool), level) in replay.levels() {
                    if dev == device && pool == Pool::Device && level.live > 0 {
                        let pid = trace.processes[q].header.pid;
                        let b = by.entry(pid).or_default();
                        *b = b.saturating_add(level.live);
                    }
                }
                out.insert((pi, device, *n), by.into_iter().collect());
            }
            *n += 1;
        }
        seq += 1;
        ControlFlow::Continue(())
    })?;
    Ok(out)
}

/// A rank or worker the command line names: `--rank N`, `--local-rank=N`, `RANK=N`,
/// `Worker_TP0`, `EngineCore`; `None` when it names none.
pub fn rank_of(cmdline: &[String]) -> Option<String> {
    let mut found = Vec::new();
    let mut it = cmdline.iter().peekable();
    while let Some(a) = it.next() {
        let lower = a.to_ascii_lowercase();
        let key = lower.trim_start_matches('-');
        let (k, v) = match key.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (key.to_string(), None),
        };
        let k = k.replace('_', "-");
        if matches!(
            k.as_str(),
            "rank" | "local-rank" | "node-rank" | "tp-rank" | "pp-rank" | "dp-rank"
        ) {
            let v = v.or_else(|| it.peek().map(|s| s.to_string()));
            if let Some(v) = v.filter(|v| v.parse::<u64>().is_ok()) {
                found.push(format!("{k} {v}"));
            }
        }
        for word in a.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            if word.starts_with("Worker_")
                || word == "EngineCore"
                || word.starts_with("EngineCore_")
            {
                found.push(word.to_string());
            }
        }
    }
    found.dedup();
    (!found.is_empty()).then(|| found.join(", "))
}

/// Whether a `PYTORCH_CUDA_ALLOC_CONF` value turns expandable segments on (PyTorch reads
/// `expandable_segments:True`, comma-separated from other options; `False` or absent is off).
fn expandable_in(conf: &str) -> bool {
    conf.split(',').any(|o| {
        o.split_once(':').is_some_and(|(k, v)| {
            k.trim() == "expandable_segments" && v.trim().eq_ignore_ascii_case("true")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expandable_segments_are_read_from_the_alloc_conf() {
        assert!(expandable_in("expandable_segments:True"));
        assert!(expandable_in(
            "max_split_size_mb:128, expandable_segments: true"
        ));
        assert!(!expandable_in("expandable_segments:False"));
        assert!(!expandable_in("(unset)"));
        assert!(!expandable_in(""));
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn ranks_from_command_lines() {
        assert_eq!(
            rank_of(&s(&["python", "train.py", "--local_rank=1"])).as_deref(),
            Some("local-rank 1")
        );
        assert_eq!(
            rank_of(&s(&["torchrun", "--rank", "3", "x.py"])).as_deref(),
            Some("rank 3")
        );
        assert_eq!(
            rank_of(&s(&["VLLM::Worker_TP1"])).as_deref(),
            Some("Worker_TP1")
        );
        assert_eq!(rank_of(&s(&["python", "-m", "vllm", "serve"])), None);
        assert_eq!(rank_of(&s(&["x", "--rank", "all"])), None);
    }

    #[test]
    fn tensor_names_drop_dtype_and_shape() {
        assert_eq!(
            tensor_name("capacity ballast u8[130230124544]"),
            "capacity ballast"
        );
        assert_eq!(tensor_name("h bf16[1, 65, 48, 128, 128]"), "h");
        assert_eq!(tensor_name("o"), "o");
    }
}
