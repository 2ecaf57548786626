//! `vramtrace compare`: a model's predicted tensors beside what a trace shows at a peak, a
//! failed allocation or over a window.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::commands::model::KernelArgs;
use vramtrace::attribution::Attribution;
use vramtrace::cliff;
use vramtrace::names::pattern;
use vramtrace::observe::{ObservedMoment, observe};
use vramtrace::parse::parse_at;
use vramtrace::trace::Trace;
use vramtrace_models::units::fmt_bytes;
use vramtrace_models::{Variant, Workload};

/// Arguments of `vramtrace compare`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace compare trace-dir --model config.json --variant fla-0.6.0 --tokens 4128\n  vramtrace compare trace-dir --model config.json --kernel gdn --at oom --json\n\nEach predicted tensor is matched to at most one observed allocation: first by name (annotation\nor innermost range label), then by a Python frame at the line the model cites and equal size,\nthen by allocation order and equal size, then by size alone.\n\nWithout --variant, every variant of the kernels asked for (--kernel, all by default) is set\nbeside the moment and the one whose matches rest on evidence (a name, a frame, an operator's\nshape) for the most bytes is shown, bytes matched by size alone breaking a tie; the report\nsays which and among how many."
)]
pub struct CompareArgs {
    /// A trace directory or file.
    pub trace: PathBuf,
    /// The model's config.json.
    #[arg(long = "model", value_name = "CONFIG")]
    pub config: PathBuf,
    /// Which kernel, variant and batch to predict.
    #[command(flatten)]
    pub select: KernelArgs,
    /// The moment to attribute: `peak`, `oom` (the first failed allocation), `oom:N` (the N-th,
    /// from 0), or `T0..T1` (every allocation made between T0 and T1 seconds into the trace).
    #[arg(long, default_value = "peak")]
    pub at: String,
    /// The process (default: the one with the largest device peak).
    #[arg(long)]
    pub pid: Option<u32>,
    /// The device (default: the one with the largest peak).
    #[arg(long)]
    pub device: Option<i32>,
    /// Compare sizes after rounding both up to this many bytes (512: PyTorch block sizes).
    #[arg(long, default_value_t = 1)]
    pub align: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `vramtrace compare`.
pub fn run(args: CompareArgs) -> anyhow::Result<i32> {
    let at = parse_at(&args.at)?;
    let (cfg, variants, opts) = args.select.resolve(&args.config)?;
    let workload = Workload::from_config(&cfg, &opts)?;
    let trace = Trace::open(&args.trace)?;
    vramtrace::trace::warn_unreadable(&trace);
    let m = observe(&trace, args.pid, args.device, at)?;
    let align = args.align.max(1);
    // One variant named: that one. Otherwise every variant of the kernels asked for (all by
    // default) is set beside the moment, and the one with the most evidence-backed bytes is
    // reported (Attribution::outranks); ties go to the order `--help` lists them in.
    let candidates = cliff::candidates(&variants, args.select.variant.is_some());
    let (variant, _, a) = cliff::best_variant(&candidates, &workload, &m, align)?;
    let variant = &variant;
    let choice = if candidates.len() > 1 {
        format!(
            "the best match of {} variants ({}); pass --variant to choose",
            candidates.len(),
            candidates
                .iter()
                .map(|v| v.name())
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        "chosen with --variant".to_string()
    };
    if args.json {
        let v = serde_json::json!({
            "trace": args.trace,
            "moment": m.description,
            "pid": m.pid,
            "device": m.device,
            "t_s": m.t_s,
            "variant": variant.name(),
            "variant_choice": choice,
            "source": variant.source(),
            "config": cfg.path,
            "seqlens": opts.seqlens,
            "tp": opts.tp,
            "attribution": a,
            "named_fraction": a.named_fraction(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!(
            "{}",
            render(&m, *variant, &cfg.display_name(), &opts.seqlens, &a)
        );
        if candidates.len() > 1 {
            println!("  model variant: {choice}");
        }
    }
    Ok(0)
}

/// The text report.
pub fn render(
    m: &ObservedMoment,
    variant: Variant,
    model: &str,
    seqlens: &[u64],
    a: &Attribution,
) -> String {
    let mut out = String::new();
    let tokens: u64 = seqlens.iter().sum();
    let _ = writeln!(out, "observed: {} (t = {:.3} s)", m.description, m.t_s);
    let _ = writeln!(
        out,
        "model:    {} on {model}, {} sequence(s), {tokens} tokens\n          {}",
        variant.name(),
        seqlens.len(),
        variant.source()
    );
    let _ = writeln!(
        out,
        "\n  {:<22} {:<22} {:<9} {:>12} {:>12} {:>10}  {:<10} allocation  [evidence]",
        "tensor", "shape", "dtype", "predicted", "observed", "diff", "matched by"
    );
    for r in &a.rows {
        let (obs, diff, how, alloc) = match r.observed {
            Some(oi) => {
                let o = &a.observed[oi];
                let how = match r.matched_by {
                    Some(vramtrace::attribution::MatchedBy::Label) => "label",
                    Some(vramtrace::attribution::MatchedBy::Frame) => "frame+size",
                    Some(vramtrace::attribution::MatchedBy::OrderAndSize) => "order+size",
                    Some(vramtrace::attribution::MatchedBy::Size) => "size",
                    None => "",
                };
                let what = if o.failed {
                    "THE FAILED REQUEST".to_string()
                } else {
                    format!("{} {}", o.api, o.ptr)
                };
                (
                    r.observed_bytes.to_string(),
                    r.difference.unwrap_or(0).to_string(),
                    how,
                    what,
                )
            }
            None => {
                let why = if m.moment == vramtrace::attribution::Moment::Peak
                    && !r.live_at_predicted_peak
                {
                    "(not live at the predicted peak)"
                } else if r.evidence.is_some() {
                    "(not matched)"
                } else {
                    "(not observed)"
                };
                ("-".to_string(), "-".to_string(), "", why.to_string())
            }
        };
        let evidence = r
            .evidence
            .as_ref()
            .map(|e| format!("  [{}]", e.describe()))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:<22} {:<22} {:<9} {:>12} {:>12} {:>10}  {:<10} {}{evidence}",
            r.name, r.shape, r.dtype, r.predicted_bytes, obs, diff, how, alloc
        );
    }
    if a.unexplained.len() > MAX_LISTED {
        render_groups(&mut out, a);
    } else if !a.unexplained.is_empty() {
        let _ = writeln!(out, "\n  observed, not in the model:");
        for &oi in &a.unexplained {
            let o = &a.observed[oi];
            let name = o
                .name
                .as_deref()
                .map(|n| format!("named {n}"))
                .unwrap_or_default();
            let label = o
                .label
                .as_deref()
                .map(|l| format!("[{l}]"))
                .or_else(|| o.op.as_ref().map(|op| format!("({})", op.describe())))
                .unwrap_or_default();
            let what = if o.failed {
                "THE FAILED REQUEST".to_string()
            } else {
                format!("{} {}", o.api, o.ptr)
            };
            let _ = writeln!(
                out,
                "    {:>12} ({})  {what} {name} {label}",
                o.size,
                fmt_bytes(o.size)
            );
        }
    }
    let pct = |b: u64| {
        if a.observed_bytes == 0 {
            0.0
        } else {
            100.0 * b as f64 / a.observed_bytes as f64
        }
    };
    let _ = writeln!(
        out,
        "\n  live bytes observed: {} — matched to the model {} ({:.2}%), named but not in the model {} ({:.2}%), unexplained {} ({:.2}%)",
        fmt_bytes(a.observed_bytes),
        fmt_bytes(a.attributed_bytes),
        pct(a.attributed_bytes),
        fmt_bytes(a.named_only_bytes),
        pct(a.named_only_bytes),
        fmt_bytes(a.unexplained_bytes),
        pct(a.unexplained_bytes),
    );
    let ev = &a.evidence;
    let _ = writeln!(
        out,
        "  of the matched: backed by a name or a frame in the modelled file {} ({:.2}%), by size and order alone {} ({:.2}%); {} tensor(s) ambiguous among look-alikes, {} contradicted by their frames",
        fmt_bytes(ev.evidence_bytes),
        pct(ev.evidence_bytes),
        fmt_bytes(ev.size_only_bytes),
        pct(ev.size_only_bytes),
        ev.ambiguous,
        ev.contradicted,
    );
    if ev.named_other_size_bytes > 0 {
        let _ = writeln!(
            out,
            "  named as their tensor but of another size (not evidence): {}",
            fmt_bytes(ev.named_other_size_bytes)
        );
    }
    if let Some(n) = &ev.other_implementation {
        let _ = writeln!(out, "  {n}");
    }
    if m.moment == vramtrace::attribution::Moment::Failure {
        match a.failed_tensor {
            Some(ti) => {
                let r = &a.rows[ti];
                let _ = writeln!(
                    out,
                    "  the failed request is {} {} {} ({} predicted), allocated at {}",
                    r.name,
                    r.dtype,
                    r.shape,
                    fmt_bytes(r.predicted_bytes),
                    r.source
                );
            }
            None => {
                let _ = writeln!(out, "  the failed request matches no tensor of this model");
            }
        }
    }
    let freed: Vec<&str> = a
        .rows
        .iter()
        .filter(|r| !r.live_at_predicted_peak)
        .map(|r| r.name.as_str())
        .collect();
    if !freed.is_empty() {
        let _ = writeln!(
            out,
            "  not live at the predicted peak (a naive sum over all tensors counts them anyway): {}",
            freed.join(", ")
        );
    }
    out
}

/// Observed allocations listed one by one; beyond this they are grouped.
const MAX_LISTED: usize = 16;

/// The allocations nothing in the model explains, grouped by name and label pattern, largest
/// groups first.
fn render_groups(out: &mut String, a: &Attribution) {
    let mut groups: Vec<(String, usize, u64)> = Vec::new();
    for &oi in &a.unexplained {
        let o = &a.observed[oi];
        let key = if o.failed {
            "THE FAILED REQUEST".to_string()
        } else {
            format!(
                "{} [{}]",
                o.name
                    .as_deref()
                    .map(pattern)
                    .or_else(|| o.op.as_ref().map(|op| format!("(unnamed, from {})", op.op)))
                    .unwrap_or_else(|| "(unnamed)".into()),
                o.label.as_deref().map(pattern).unwrap_or_default()
            )
        };
        match groups.iter_mut().find(|g| g.0 == key) {
            Some(g) => {
                g.1 += 1;
                g.2 = g.2.saturating_add(o.size);
            }
            None => groups.push((key, 1, o.size)),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.2));
    let _ = writeln!(
        out,
        "\n  observed, not in the model ({} allocations in {} groups; # stands for any number):",
        a.unexplained.len(),
        groups.len()
    );
    for (key, n, bytes) in groups.iter().take(MAX_LISTED) {
        let _ = writeln!(out, "    {:>12}  x{n:<5} {key}", fmt_bytes(*bytes));
    }
    if groups.len() > MAX_LISTED {
        let rest = groups[MAX_LISTED..]
            .iter()
            .fold(0u64, |acc, g| acc.saturating_add(g.2));
        let _ = writeln!(
            out,
            "    {:>12}  in {} more groups",
            fmt_bytes(rest),
            groups.len() - MAX_LISTED
        );
    }
}
