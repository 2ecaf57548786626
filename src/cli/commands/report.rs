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
use vramtrace_viewer::plot::{plot_breakdown, plot_cliff, plot_timeline};

/// Arguments of `vramtrace report`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace report trace-dir -o report/\n  vramtrace report trace-dir --model config.json --tokens 4128 --capacity 24GiB -o report/\n  vramtrace report trace-dir --model config.json --capacity 24GiB --html -o report/\n\nWithout -o the Markdown goes to stdout, without plots. With -o OUT, OUT/report.md and its\nPNGs (timeline.png, breakdown.png, cliff.png with --model); with --html, one OUT/report.html\nwith the plots inline. The top of the report is one screen: what failed, where, why, what to\nchange; every section follows in full."
)]
pub struct ReportArgs {
    /// A trace directory or file.
    pub trace: PathBuf,
    /// The model's config.json: the model beside each failure, and the levers.
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
    let model = match &args.config {
        None => None,
        Some(config) => {
            let (cfg, variants, opts) = args.select.resolve(config)?;
            Some(ModelInput {
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
            write_out(&args, &title, &md)?;
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
        },
    )?;
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
    let capacity = r.capacity.map(|c| c.0).or(args.capacity);
    let title = format!("{}: live device bytes by category", r.title);
    match plots::timeline(trace, &args.trace, &title, capacity, None, &args.hide)
        .map_err(anyhow::Error::from)
        .and_then(|p| Ok(plot_timeline(&p, &dir.join("timeline.png"))?))
    {
        Ok(()) => images.timeline = Some("timeline.png".into()),
        Err(e) => warn("timeline", e),
    }
    match breakdown(r).and_then(|p| Ok(plot_breakdown(&p, &dir.join("breakdown.png"))?)) {
        Ok(()) => images.breakdown = Some("breakdown.png".into()),
        Err(e) => warn("breakdown", e),
    }
    if let (Some(m), Some(l)) = (&r.model, &r.levers) {
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
