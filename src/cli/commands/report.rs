//! `vramtrace report`: a Markdown report to paste into a bug report, with its plots beside it,
//! or one self-contained HTML file.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::commands::model::KernelArgs;
use vramtrace::attribution::Moment;
use vramtrace::observe::ObservedMoment;
use vramtrace::plots;
use vramtrace::report::markdown::Images;
use vramtrace::report::{self, ModelInput, Report, ReportOptions};
use vramtrace::trace::Trace;
use vramtrace_models::units::{fmt_bytes, parse_bytes};
use vramtrace_viewer::model::{BreakdownPlot, BreakdownRow};
use vramtrace_viewer::plot::{
    plot_breakdown, plot_capacity_bar, plot_cliff, plot_cliff_panels, plot_timeline,
};

/// Arguments of `vramtrace report`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace report trace-dir -o report/\n  vramtrace report trace-dir --model config.json --tokens 4128 --capacity 24GiB -o report/\n  vramtrace report trace-dir --model config.json --capacity 24GiB --html -o report/\n\nWithout -o the Markdown goes to stdout, without plots. With -o OUT, OUT/report.md and its\nPNGs (timeline.png, breakdown.png, cliff.png with --model); with --html, one OUT/report.html\nwith the plots inline. The top of the report is one screen: what failed, where, why, what to\nchange; every section follows in full."
)]
pub struct ReportArgs {
    /// A trace directory or file.
    pub trace: PathBuf,
    /// The model's config.json: the model beside each failure, and the levers. For a llama.cpp
    /// run, its GGUF: the buffers and the VMM pool predicted from the header and the flags on
    /// the traced process's command line, beside what the trace holds.
    #[arg(long = "model", value_name = "CONFIG")]
    pub config: Option<PathBuf>,
    /// Which kernel, variant and batch to predict (as in `compare`).
    #[command(flatten)]
    pub select: KernelArgs,
    /// The card the levers and the cliff are computed for, e.g. `24GiB` (default: the failing
    /// device's total).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub capacity: Option<u64>,
    /// The directory to write report.md and its plots into (created if missing).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Write one self-contained OUT/report.html instead, plots inline.
    #[arg(long, requires = "output")]
    pub html: bool,
    /// Timeline: leave a category out of the stack (e.g. `other`, a ballast); repeatable.
    #[arg(long, value_name = "CATEGORY")]
    pub hide: Vec<String>,
    /// The program that ran the step, for the whole-step model: workload,
    /// torch-prefill-script, vllm-0.20.1 or transformers (default: read from the trace's labels and
    /// Python frames).
    #[arg(long, value_name = "RUNTIME", value_parser = parse_runtime)]
    pub runtime: Option<vramtrace_models::Runtime>,
    /// Keep the config's first N layers (a shortened model built from the config, as
    /// `scripts/validate/torch_prefill.py --layers N` runs it).
    #[arg(long, value_name = "N")]
    pub layers: Option<usize>,
    /// vLLM's `--gpu-memory-utilization` the run was given. vLLM spends it at start (its KV pool
    /// fills that fraction of the card, `--capacity` else the device's total); at run time the
    /// card refuses. The report shows vLLM's slack (card − held outside the budget − the budget)
    /// and the utilisation that would have left the refused request room.
    #[arg(long, value_name = "F", value_parser = parse_fraction)]
    pub gpu_memory_utilization: Option<f64>,
    /// vLLM's attention block in tokens: the chunk floor in mamba align mode (default: the
    /// failing step's chunk on a hybrid model).
    #[arg(long, value_name = "TOKENS")]
    pub block_size: Option<u64>,
    /// Print the report as one JSON object (the verdict, the limit, the categories, the
    /// whole-step model and the levers); with -o, write OUT/report.json beside report.md.
    #[arg(long)]
    pub json: bool,
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!(
            "{s:?} is not a fraction above 0 and at most 1; give e.g. 0.9"
        )),
    }
}

fn parse_runtime(s: &str) -> Result<vramtrace_models::Runtime, String> {
    vramtrace_models::Runtime::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = vramtrace_models::Runtime::ALL
            .iter()
            .map(|r| r.name())
            .collect();
        format!("{s:?} is not a runtime; use one of {}", names.join(", "))
    })
}

/// The directory a trace's side files (`versions.json`, `attach.json`) sit in: the trace itself,
/// or the directory of a single trace file.
fn trace_dir(trace: &Path) -> PathBuf {
    if trace.is_dir() {
        trace.to_path_buf()
    } else {
        trace.parent().map(Path::to_path_buf).unwrap_or_default()
    }
}

/// What `vramtrace run` gathered at start (`versions.json` in the trace directory), in its
/// order; empty when the trace has none.
fn read_versions(trace: &Path) -> Vec<(String, String)> {
    let dir = trace_dir(trace);
    let Ok(text) = std::fs::read_to_string(dir.join(crate::commands::versions::VERSIONS_FILE))
    else {
        return Vec::new();
    };
    // The order a maintainer reads them in; keys not listed follow in name order.
    const ORDER: [&str; 11] = [
        "command",
        "PYTORCH_CUDA_ALLOC_CONF",
        "driver",
        "cuda",
        "python",
        "torch",
        "triton",
        "fla",
        "flash_attn",
        "vllm",
        "transformers",
    ];
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(m)) => {
            let mut v: Vec<(String, String)> = m
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        serde_json::Value::String(s) => s,
                        serde_json::Value::Null => "(not found)".to_string(),
                        other => other.to_string(),
                    };
                    (k, v)
                })
                .collect();
            v.sort_by_key(|(k, _)| {
                (
                    ORDER.iter().position(|o| o == k).unwrap_or(ORDER.len()),
                    k.clone(),
                )
            });
            v
        }
        _ => {
            eprintln!(
                "vramtrace: warning: {} is not a JSON object; the versions block is left out",
                dir.join(crate::commands::versions::VERSIONS_FILE).display()
            );
            Vec::new()
        }
    }
}

/// What `vramtrace attach` wrote of the process it attached to (`attach.json` in the trace
/// directory); `None` for a trace it did not make, or one whose record cannot be read (said).
fn read_attached(trace: &Path) -> Option<report::Attached> {
    let path = trace_dir(trace).join(crate::commands::attach::ATTACH_RECORD);
    let text = std::fs::read_to_string(&path).ok()?;
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!(
                "vramtrace: warning: {} is not JSON ({e}); read as a trace made by `vramtrace run`",
                path.display()
            );
            return None;
        }
    };
    let pid = v["pid"].as_u64().and_then(|p| u32::try_from(p).ok())?;
    let process_bytes = v["nvml_at_attach"]["devices"]
        .as_array()
        .map(|d| d.iter().filter_map(|d| d["process_bytes"].as_u64()).sum());
    Some(report::Attached { pid, process_bytes })
}

fn trace_name(p: &Path) -> String {
    let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    p.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// Runs `vramtrace report`.
pub fn run(args: ReportArgs) -> anyhow::Result<i32> {
    let title = trace_name(&args.trace);
    let gguf = match &args.config {
        Some(c)
            if c.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf")) =>
        {
            Some((
                c.clone(),
                vramtrace_models::gguf::GgufHeader::read(c)
                    .with_context(|| format!("--model {}", c.display()))?,
            ))
        }
        _ => None,
    };
    let model = match &args.config {
        None => None,
        Some(_) if gguf.is_some() => None,
        Some(config) => {
            let (mut cfg, variants, opts) = args.select.resolve(config)?;
            if let Some(n) = args.layers {
                if n == 0 || n > cfg.layer_types.len() {
                    anyhow::bail!(
                        "--layers must be 1 to {} (the config's layers), not {n}",
                        cfg.layer_types.len()
                    );
                }
                cfg.layer_types.truncate(n);
                cfg.num_hidden_layers = n as u64;
            }
            Some(ModelInput {
                tokens_given: args.select.tokens.is_some() || args.select.seqlens.is_some(),
                cfg,
                variants,
                variant_given: args.select.variant.is_some(),
                opts,
            })
        }
    };
    if let Some(out) = &args.output {
        std::fs::create_dir_all(out)
            .with_context(|| format!("cannot create the report directory {}", out.display()))?;
    }
    let trace = match Trace::open(&args.trace) {
        Ok(t) => t,
        Err(e) => {
            // A report that says what is missing, not a bare error: the user pastes it anyway.
            let md = format!(
                "# Memory report: {title}\n\n**No report: the trace could not be read.** {e}\n"
            );
            if args.json && args.output.is_none() {
                // One JSON object on stdout, as a tool reading it expects.
                println!(
                    "{}",
                    serde_json::json!({ "title": title, "error": format!("the trace could not be read: {e}") })
                );
            } else {
                write_out(&args, &title, &md)?;
            }
            eprintln!("vramtrace: error: {e}");
            return Ok(1);
        }
    };
    vramtrace::trace::warn_unreadable(&trace);
    let r = report::build(
        &trace,
        &ReportOptions {
            title: title.clone(),
            model,
            capacity: args.capacity,
            runtime: args.runtime,
            block_size: args.block_size,
            gpu_memory_utilization: args.gpu_memory_utilization,
            versions: read_versions(&args.trace),
            gguf,
            attached: read_attached(&args.trace),
        },
    )?;
    if args.json {
        let json = report::json::render(&r);
        let text = serde_json::to_string_pretty(&json)?;
        match &args.output {
            None => {
                println!("{text}");
                return Ok(0);
            }
            Some(out) => {
                let path = out.join("report.json");
                std::fs::write(&path, format!("{text}\n"))
                    .with_context(|| format!("cannot write {}", path.display()))?;
                eprintln!("vramtrace: wrote {}", path.display());
            }
        }
    }
    let images = match &args.output {
        None => Images::default(),
        Some(out) => {
            let dir = if args.html {
                let tmp =
                    std::env::temp_dir().join(format!("vramtrace-report-{}", std::process::id()));
                std::fs::create_dir_all(&tmp)?;
                tmp
            } else {
                out.clone()
            };
            let names = draw(&args, &trace, &r, &dir);
            if args.html {
                let inline = |n: Option<String>| {
                    n.and_then(|n| std::fs::read(dir.join(&n)).ok())
                        .map(|png| report::html::png_data_uri(&png))
                };
                let images = Images {
                    timeline: inline(names.timeline),
                    breakdown: inline(names.breakdown),
                    cliff: inline(names.cliff),
                };
                let _ = std::fs::remove_dir_all(&dir);
                images
            } else {
                names
            }
        }
    };
    let md = report::markdown::render(&r, &images);
    write_out(&args, &title, &md)?;
    Ok(0)
}

fn write_out(args: &ReportArgs, title: &str, md: &str) -> anyhow::Result<()> {
    match &args.output {
        None => print!("{md}"),
        Some(out) => {
            let (path, text) = if args.html {
                (
                    out.join("report.html"),
                    report::html::render(&format!("Memory report: {title}"), md),
                )
            } else {
                (out.join("report.md"), md.to_string())
            };
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("vramtrace: wrote {}", path.display());
        }
    }
    Ok(())
}

/// Draws the plots into `dir`; a plot that cannot be drawn is left out with a warning.
fn draw(args: &ReportArgs, trace: &Trace, r: &Report, dir: &Path) -> Images {
    let mut images = Images::default();
    let warn =
        |what: &str, e: anyhow::Error| eprintln!("vramtrace: warning: no {what} plot: {e:#}");
    // The timeline's line is the limit that was enforced, when the triage knows it.
    let capacity = r
        .triage
        .as_ref()
        .and_then(|t| t.limit.as_ref())
        .map(|l| l.bytes)
        .or(r.capacity.map(|c| c.0))
        .or(args.capacity);
    let title = format!("{}: live device bytes by category", r.title);
    match plots::timeline(trace, &args.trace, &title, capacity, None, &args.hide)
        .map_err(anyhow::Error::from)
        .and_then(|p| Ok(plot_timeline(&p, &dir.join("timeline.png"))?))
    {
        Ok(()) => images.timeline = Some("timeline.png".into()),
        Err(e) => warn("timeline", e),
    }
    let drawn = match report::figures::capacity_bar(r) {
        Some(bar) => {
            plot_capacity_bar(&bar, &dir.join("breakdown.png")).map_err(anyhow::Error::from)
        }
        None => breakdown(r).and_then(|p| Ok(plot_breakdown(&p, &dir.join("breakdown.png"))?)),
    };
    match drawn {
        Ok(()) => images.breakdown = Some("breakdown.png".into()),
        Err(e) => warn("breakdown", e),
    }
    if let Some(panels) = report::figures::cliff_panels(r) {
        match panels
            .map_err(anyhow::Error::from)
            .and_then(|p| Ok(plot_cliff_panels(&p, &dir.join("cliff.png"))?))
        {
            Ok(()) => images.cliff = Some("cliff.png".into()),
            Err(e) => warn("cliff", e),
        }
    } else if let (Some(m), Some(l)) = (&r.model, &r.levers) {
        let c = r
            .first_failure()
            .and_then(|f| f.comparison.as_ref())
            .map(|c| vramtrace::cliff::resident_and_observed(&c.attribution).1);
        let observed = c.map(|total| vec![(l.tokens, total)]).unwrap_or_default();
        let title = format!(
            "{} ({}): resident {} + kernel peak vs {}",
            l.model_name,
            l.variant.name(),
            fmt_bytes(l.resident),
            fmt_bytes(l.capacity)
        );
        match plots::cliff(
            &title,
            &m.cfg,
            &[l.variant],
            &m.opts,
            None,
            l.capacity,
            l.resident,
            observed,
        )
        .map_err(anyhow::Error::from)
        .and_then(|c| Ok(plot_cliff(&c, &dir.join("cliff.png"))?))
        {
            Ok(()) => images.cliff = Some("cliff.png".into()),
            Err(e) => warn("cliff", e),
        }
    }
    images
}

/// The breakdown at the first failure: the model's tensors beside what was observed, or
/// without a model the largest groups of the live set.
fn breakdown(r: &Report) -> anyhow::Result<BreakdownPlot> {
    let f = r.first_failure();
    if let (Some(f), Some(m)) = (f, &r.model)
        && let Some(c) = &f.comparison
    {
        let pid = r.summary.processes[f.process].pid;
        let moment = ObservedMoment {
            observed: c.attribution.observed.clone(),
            moment: Moment::Failure,
            pid,
            device: f.device,
            t_s: f.failure.t_s,
            description: String::new(),
        };
        return Ok(plots::breakdown(
            &m.cfg.display_name(),
            "the first failure",
            c.variant,
            &moment,
            &c.attribution,
        ));
    }
    let (live, what, pid, device) = match f {
        Some(f) => (
            &f.live,
            format!("the first failure ({:.3} s)", f.failure.t_s),
            r.summary.processes[f.process].pid,
            f.device,
        ),
        None => {
            let p = r
                .highest_peak()
                .ok_or_else(|| anyhow::anyhow!("the trace has no device allocation"))?;
            let d = r.device(p.process, p.device).expect("a peak has a device");
            (
                &p.live,
                format!("the peak ({:.3} s)", d.peak_t_s),
                r.summary.processes[p.process].pid,
                p.device,
            )
        }
    };
    Ok(BreakdownPlot {
        title: format!("live at {what}, pid {pid}, cuda:{device}, by group"),
        rows: live
            .groups
            .iter()
            .take(report::MAX_GROUPS)
            .map(|g| BreakdownRow {
                tensor: g.key.clone(),
                predicted_bytes: None,
                observed_bytes: Some(g.bytes),
            })
            .collect(),
    })
}
