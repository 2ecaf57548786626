//! `vramtrace compare`: a model's predicted tensors beside what a trace shows at a peak, a
//! failed allocation or over a window.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::attribution::{Attribution, attribute};
use crate::commands::model::KernelArgs;
use crate::names::pattern;
use crate::observe::{At, ObservedMoment, observe};
use crate::trace::Trace;
use vramtrace_models::units::fmt_bytes;
use vramtrace_models::{Variant, Workload};

/// Arguments of `vramtrace compare`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace compare trace-dir --model config.json --variant fla-0.6.0 --tokens 4128\n  vramtrace compare trace-dir --model config.json --kernel gdn --at oom --json\n\nEach predicted tensor is matched to at most one observed allocation: first by name (annotation\nor innermost range label), then by allocation order and equal size, then by size alone.\n\nWithout --variant, every variant of the kernels asked for (--kernel, all by default) is set\nbeside the moment and the one that explains the most observed bytes is shown; the report says\nwhich and among how many."
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

/// Parses `--at`: `peak`, `oom`, `oom:N` or a window `T0..T1` of seconds into the trace. A
/// window's ends must be finite, not negative and in order; anything else is an error that says
/// what to write.
pub fn parse_at(s: &str) -> anyhow::Result<At> {
    if s == "peak" {
        return Ok(At::Peak);
    }
    if s == "oom" {
        return Ok(At::Failure(0));
    }
    if let Some(n) = s.strip_prefix("oom:") {
        return Ok(At::Failure(
            n.parse()
                .with_context(|| format!("--at {s}: N must be a whole number"))?,
        ));
    }
    if let Some((a, b)) = s.split_once("..") {
        let secs = |x: &str| -> anyhow::Result<f64> {
            let v: f64 = x
                .trim()
                .parse()
                .with_context(|| format!("--at {s}: {x:?} is not a number of seconds"))?;
            if !v.is_finite() || !(0.0..=MAX_WINDOW_S).contains(&v) {
                bail!(
                    "--at {s}: {x:?} is not a time in the trace; write seconds from 0 to {MAX_WINDOW_S}, e.g. --at 1.5..2"
                );
            }
            Ok(v)
        };
        let (a, b) = (secs(a)?, secs(b)?);
        if b < a {
            bail!("--at {s}: the window ends before it starts");
        }
        return Ok(At::Window(a, b));
    }
    bail!("--at takes peak, oom, oom:N or T0..T1 (seconds), not {s:?}")
}

/// The latest second a window may name: about 292 years, the span of `u64` nanoseconds, so a
/// window's ends always convert to trace times exactly.
pub const MAX_WINDOW_S: f64 = 1.8e10;

/// Runs `vramtrace compare`.
pub fn run(args: CompareArgs) -> anyhow::Result<i32> {
    let at = parse_at(&args.at)?;
    let (cfg, variants, opts) = args.select.resolve(&args.config)?;
    let workload = Workload::from_config(&cfg, &opts)?;
    let trace = Trace::open(&args.trace)?;
    crate::trace::warn_unreadable(&trace);
    let m = observe(&trace, args.pid, args.device, at).map_err(anyhow::Error::msg)?;
    let align = args.align.max(1);
    // One variant named: that one. Otherwise every variant of the kernels asked for (all by
    // default) is set beside the moment, and the one that explains the most bytes is reported;
    // ties go to the order `--help` lists them in.
    let candidates: Vec<Variant> = if args.select.variant.is_some() {
        variants
    } else {
        Variant::ALL
            .into_iter()
            .filter(|v| variants.iter().any(|c| c.kernel() == v.kernel()))
            .collect()
    };
    let mut best: Option<(Variant, Attribution)> = None;
    let mut first_error = None;
    for v in &candidates {
        let tensors = match v.tensors(&workload) {
            Ok(t) => t,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        let a = attribute(&tensors, m.observed.clone(), align, m.moment);
        if best
            .as_ref()
            .is_none_or(|(_, b)| a.attributed_bytes > b.attributed_bytes)
        {
            best = Some((*v, a));
        }
    }
    let Some((variant, a)) = best else {
        return Err(match first_error {
            Some(e) => anyhow::Error::from(e),
            None => anyhow::anyhow!("no model variant to compare with"),
        });
    };
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
                    Some(crate::attribution::MatchedBy::Label) => "label",
                    Some(crate::attribution::MatchedBy::Frame) => "frame+size",
                    Some(crate::attribution::MatchedBy::OrderAndSize) => "order+size",
                    Some(crate::attribution::MatchedBy::Size) => "size",
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
                let why =
                    if m.moment == crate::attribution::Moment::Peak && !r.live_at_predicted_peak {
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
    if let Some(n) = &ev.other_implementation {
        let _ = writeln!(out, "  {n}");
    }
    if m.moment == crate::attribution::Moment::Failure {
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
