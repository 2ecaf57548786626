//! `vramtrace plot`: the timeline, breakdown and cliff plots as PNG or SVG.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::commands::model::KernelArgs;
use vramtrace::cliff;
use vramtrace::parse::{parse_at, parse_range};
use vramtrace::plots;
use vramtrace::trace::Trace;
use vramtrace_models::units::{fmt_bytes, parse_bytes};
use vramtrace_models::{Variant, Workload, peak};
use vramtrace_viewer::plot::{PlotFormat, plot_breakdown, plot_cliff, plot_timeline};

/// Arguments of `vramtrace plot`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace plot trace-dir --kind timeline -o timeline.png --capacity 24GiB\n  vramtrace plot trace-dir --kind breakdown --model config.json --variant fla-0.6.0 --tokens 4128 --at oom -o oom.svg\n  vramtrace plot trace-dir --kind cliff --model config.json --kernel gdn --tokens 4128 --at oom --capacity 24GiB -o cliff.png\n\nThe timeline is stacked by category: weights, KV cache (and recurrent state), activations,\nother (ballast, reservations), unnamed; see `vramtrace live --help`. The cliff's curve is the\nresident bytes plus the model's peak at each prompt length (`model --sweep`); --resident auto\ntakes the bytes live at --at that the model does not explain, without `other`, and the trace's\npoint is what was live then on the same terms, the failed request included."
)]
pub struct PlotArgs {
    /// A trace directory or file (optional for --kind cliff).
    pub trace: Option<PathBuf>,
    /// Which plot.
    /// (`lines`: the tensors at their peak by Python line, for a trace with PyTorch's tensors;
    /// `growth`: live bytes by category over the run with the steady state's rate, as
    /// `report`'s growth section finds it.)
    #[arg(long, value_parser = ["timeline", "breakdown", "cliff", "lines", "growth"])]
    pub kind: String,
    /// The file to write: `.png` or `.svg`.
    #[arg(long, short)]
    pub output: PathBuf,
    /// Draw a capacity line (timeline), or the capacity the cliff is measured against (cliff;
    /// required there), e.g. `24GiB`.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub capacity: Option<u64>,
    /// The model's config.json: the predicted peak (timeline), the predicted tensors
    /// (breakdown), the curve (cliff).
    #[arg(long = "model", value_name = "CONFIG")]
    pub config: Option<PathBuf>,
    /// Which kernel, variant and batch to predict.
    #[command(flatten)]
    pub select: KernelArgs,
    /// The moment: `peak`, `oom`, `oom:N` or `T0..T1`, as in `compare`.
    #[arg(long, default_value = "peak")]
    pub at: String,
    /// The process (default: the one with the largest device peak).
    #[arg(long)]
    pub pid: Option<u32>,
    /// The device (default: the one with the largest peak).
    #[arg(long)]
    pub device: Option<i32>,
    /// Compare sizes after rounding both up to this many bytes (as in `compare`).
    #[arg(long, default_value_t = 1)]
    pub align: u64,
    /// Cliff: bytes held besides the kernel, or `auto` (from the trace at --at; 0 without one).
    #[arg(long, default_value = "auto")]
    pub resident: String,
    /// Cliff: the prompt lengths to draw, T0..T1 (default: up to twice the cliff).
    #[arg(long, value_name = "T0..T1")]
    pub sweep: Option<String>,
    /// Timeline: leave a category out of the stack, by its name or key (e.g. `other_process`,
    /// a ballast; `other` still works); repeatable.
    #[arg(long, value_name = "CATEGORY")]
    pub hide: Vec<String>,
    /// The plot's title (default: what it shows).
    #[arg(long)]
    pub title: Option<String>,
}

fn trace_name(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// Runs `vramtrace plot`.
pub fn run(args: PlotArgs) -> anyhow::Result<i32> {
    PlotFormat::from_path(&args.output).map_err(|_| {
        anyhow::anyhow!(
            "cannot write {}: plots are .png or .svg files",
            args.output.display()
        )
    })?;
    let at = parse_at(&args.at)?;
    let needs_trace = || -> anyhow::Result<&PathBuf> {
        args.trace
            .as_ref()
            .with_context(|| format!("--kind {} needs a trace directory", args.kind))
    };
    let model = |what: &str| -> anyhow::Result<&PathBuf> {
        args.config.as_ref().with_context(|| {
            format!("--kind {what} needs the model's config.json: pass --model CONFIG")
        })
    };
    // Model and observed moment, when both are at hand.
    let candidates = |variants: Vec<Variant>| -> Vec<Variant> {
        cliff::candidates(&variants, args.select.variant.is_some())
    };
    match args.kind.as_str() {
        "timeline" => {
            let dir = needs_trace()?;
            let mut title = args
                .title
                .clone()
                .unwrap_or_else(|| format!("{}: live device bytes by category", trace_name(dir)));
            let (trace, predicted) = match &args.config {
                None => {
                    plots::check_hide(&args.hide)?;
                    (Trace::open(dir)?, None)
                }
                Some(config) => {
                    let (cfg, variants, opts) = args.select.resolve(config)?;
                    let workload = Workload::from_config(&cfg, &opts)?;
                    let trace = Trace::open(dir)?;
                    let m = plots::observe_at(&trace, args.pid, args.device, at)?;
                    let (v, tensors, a) =
                        cliff::best_variant(&candidates(variants), &workload, &m, args.align)?;
                    let p =
                        a.observed_bytes.saturating_sub(a.attributed_bytes) + peak(&tensors).bytes;
                    if args.title.is_none() {
                        title.push_str(&format!(
                            "; predicted: {} at {} ({} + what it does not explain)",
                            fmt_bytes(p),
                            m.description,
                            v.name()
                        ));
                    }
                    (trace, Some(p))
                }
            };
            let plot = plots::timeline(&trace, dir, &title, args.capacity, predicted, &args.hide)?;
            plot_timeline(&plot, &args.output)?;
        }
        "breakdown" => {
            let dir = needs_trace()?;
            let config = model("breakdown")?;
            let (cfg, variants, opts) = args.select.resolve(config)?;
            let workload = Workload::from_config(&cfg, &opts)?;
            let trace = Trace::open(dir)?;
            vramtrace::trace::warn_unreadable(&trace);
            let m = plots::observe_at(&trace, args.pid, args.device, at)?;
            let (v, _, a) = cliff::best_variant(&candidates(variants), &workload, &m, args.align)?;
            let mut plot = plots::breakdown(&cfg.display_name(), &args.at, v, &m, &a);
            if let Some(t) = &args.title {
                plot.title = t.clone();
            }
            plot_breakdown(&plot, &args.output)?;
        }
        "lines" => {
            let dir = needs_trace()?;
            let trace = Trace::open(dir)?;
            vramtrace::trace::warn_unreadable(&trace);
            let plot = plots::lines(&trace, args.title.as_deref(), 20)?;
            plot_breakdown(&plot, &args.output)?;
        }
        "growth" => {
            let dir = needs_trace()?;
            let trace = Trace::open(dir)?;
            vramtrace::trace::warn_unreadable(&trace);
            let g = vramtrace::growth::of_trace(&trace)?
                .context("the trace holds no allocation: nothing to plot growth of")?;
            let mut plot = plots::growth(&g, &trace_name(dir));
            if let Some(t) = &args.title {
                plot.title = t.clone();
            }
            vramtrace_viewer::plot::plot_growth(&plot, &args.output)?;
        }
        "cliff" => {
            let config = model("cliff")?;
            let Some(capacity) = args.capacity else {
                bail!("--kind cliff needs --capacity BYTES (the card the cliff is measured on)");
            };
            let (cfg, variants, opts) = args.select.resolve(config)?;
            let mut observed = Vec::new();
            let mut resident = match args.resident.as_str() {
                "auto" => 0,
                r => parse_bytes(r).context("--resident")?,
            };
            let tokens: u64 = opts.seqlens.iter().sum();
            if let Some(dir) = &args.trace {
                let workload = Workload::from_config(&cfg, &opts)?;
                let trace = Trace::open(dir)?;
                vramtrace::trace::warn_unreadable(&trace);
                let m = plots::observe_at(&trace, args.pid, args.device, at)?;
                let (_, _, a) =
                    cliff::best_variant(&candidates(variants.clone()), &workload, &m, args.align)?;
                let (r, total) = cliff::resident_and_observed(&a);
                if args.resident == "auto" {
                    resident = r;
                }
                observed.push((tokens, total));
            }
            let range = args.sweep.as_deref().map(parse_range).transpose()?;
            let names: Vec<&str> = variants.iter().map(|v| v.name()).collect();
            let title = args.title.clone().unwrap_or_else(|| {
                format!(
                    "{} ({}): resident {} + kernel peak vs {}",
                    cfg.display_name(),
                    names.join(" / "),
                    fmt_bytes(resident),
                    fmt_bytes(capacity)
                )
            });
            let curve = plots::cliff(
                &title, &cfg, &variants, &opts, range, capacity, resident, observed,
            )?;
            plot_cliff(&curve, &args.output)?;
        }
        k => bail!("unknown plot kind {k:?}"),
    }
    eprintln!("vramtrace: wrote {}", args.output.display());
    Ok(0)
}
