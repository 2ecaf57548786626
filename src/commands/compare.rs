//! `vramtrace compare`: a model's predicted tensors beside what a trace shows at a peak, a
//! failed allocation or over a window.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::attribution::{At, Attribution, ObservedMoment, attribute, observe};
use crate::commands::model::KernelArgs;
use crate::trace::Trace;
use vramtrace_models::units::fmt_bytes;
use vramtrace_models::{Variant, Workload};

/// Arguments of `vramtrace compare`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace compare trace-dir --model config.json --variant fla-0.6.0 --tokens 4128\n  vramtrace compare trace-dir --model config.json --kernel gdn --at oom --json\n\nEach predicted tensor is matched to at most one observed allocation: first by name (annotation\nor innermost range label), then by allocation order and equal size, then by size alone."
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

fn parse_at(s: &str) -> anyhow::Result<At> {
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
        let a: f64 = a
            .parse()
            .with_context(|| format!("--at {s}: {a:?} is not a number of seconds"))?;
        let b: f64 = b
            .parse()
            .with_context(|| format!("--at {s}: {b:?} is not a number of seconds"))?;
        if b < a {
            bail!("--at {s}: the window ends before it starts");
        }
        return Ok(At::Window(a, b));
    }
    bail!("--at takes peak, oom, oom:N or T0..T1 (seconds), not {s:?}")
}

/// Runs `vramtrace compare`.
pub fn run(args: CompareArgs) -> anyhow::Result<i32> {
    let at = parse_at(&args.at)?;
    let (cfg, variants, opts) = args.select.resolve(&args.config)?;
    let [variant] = variants.as_slice() else {
        bail!("compare one kernel at a time: pass --kernel gdn|fa|ffn or --variant NAME");
    };
    let workload = Workload::from_config(&cfg, &opts)?;
    let tensors = variant.tensors(&workload)?;
    let trace = Trace::open(&args.trace)?;
    let m = observe(&trace, args.pid, args.device, at).map_err(anyhow::Error::msg)?;
    let a = attribute(&tensors, m.observed.clone(), args.align.max(1), m.moment);
    if args.json {
        let v = serde_json::json!({
            "trace": args.trace,
            "moment": m.description,
            "pid": m.pid,
            "device": m.device,
            "t_s": m.t_s,
            "variant": variant.name(),
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
        "\n  {:<22} {:<22} {:<9} {:>12} {:>12} {:>10}  {:<10} allocation",
        "tensor", "shape", "dtype", "predicted", "observed", "diff", "matched by"
    );
    for r in &a.rows {
        let (obs, diff, how, alloc) = match r.observed {
            Some(oi) => {
                let o = &a.observed[oi];
                let how = match r.matched_by {
                    Some(crate::attribution::MatchedBy::Label) => "label",
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
                    } else {
                        "(not observed)"
                    };
                ("-".to_string(), "-".to_string(), "", why.to_string())
            }
        };
        let _ = writeln!(
            out,
            "  {:<22} {:<22} {:<9} {:>12} {:>12} {:>10}  {:<10} {}",
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

/// `layer.12.kv.chunk.3` → `layer.#.kv.chunk.#`: allocations that differ only in their
/// numbers (one per layer, per chunk) are one group.
fn pattern(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_digits = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

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
                    .unwrap_or_else(|| "(unnamed)".into()),
                o.label.as_deref().map(pattern).unwrap_or_default()
            )
        };
        match groups.iter_mut().find(|g| g.0 == key) {
            Some(g) => {
                g.1 += 1;
                g.2 += o.size;
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
        let rest: u64 = groups[MAX_LISTED..].iter().map(|g| g.2).sum();
        let _ = writeln!(
            out,
            "    {:>12}  in {} more groups",
            fmt_bytes(rest),
            groups.len() - MAX_LISTED
        );
    }
}

#[cfg(test)]
mod tests {
    use super::pattern;

    #[test]
    fn numbers_become_one_placeholder() {
        assert_eq!(pattern("layer.12.kv.chunk.3"), "layer.#.kv.chunk.#");
        assert_eq!(
            pattern("prefill/chunk.27/layer.0/gdn/inputs"),
            "prefill/chunk.#/layer.#/gdn/inputs"
        );
        assert_eq!(pattern("lm_head"), "lm_head");
    }
}
