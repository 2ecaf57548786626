//! The growth section: the verdict over the run, the lines ranked by rate, PyTorch's reserve.

use std::fmt::Write as _;

use vramtrace_models::units::fmt_bytes;

use super::{cell, code};
use crate::growth::{Growth, LineVerdict};
use crate::report::Report;

/// `± 1.00 MiB`, or `—` where one cannot be had (too few buckets).
fn plus_minus(b: f64) -> String {
    if b.is_finite() {
        fmt_bytes(b.abs().round() as u64)
    } else {
        "—".into()
    }
}

fn rate(b: f64) -> String {
    let sign = if b <= -0.5 { "−" } else { "+" };
    format!("{sign}{}/h", fmt_bytes(b.abs().round() as u64))
}

fn signed_bytes(b: f64) -> String {
    let sign = if b <= -0.5 { "−" } else { "+" };
    format!("{sign}{}", fmt_bytes(b.abs().round() as u64))
}

fn verdict_word(v: LineVerdict) -> &'static str {
    match v {
        LineVerdict::Leak => "**leak**",
        LineVerdict::Plateau => "plateau",
        LineVerdict::Steady => "steady",
    }
}

/// `## Growth over the run`, when the trace was long enough to have one.
pub(super) fn growth(out: &mut String, r: &Report) {
    let Some(g) = &r.summary.growth else { return };
    section(out, g);
}

fn section(out: &mut String, g: &Growth) {
    let _ = writeln!(out, "## Growth over the run\n");
    if g.series.t_s.len() < crate::growth::MIN_BUCKETS {
        for e in &g.evidence {
            let mut c = e.chars();
            let first = c.next().map(|f| f.to_uppercase().collect::<String>());
            let _ = writeln!(out, "{}{}.\n", first.unwrap_or_default(), c.as_str());
        }
        return;
    }
    let _ = writeln!(
        out,
        "**Verdict: {}.** Over {:.1} s: start-up to {:.1} s, warm-up to {:.1} s (found by a two-line fit), then the steady state; buckets of {:.3} s. The bytes the processes hold from the driver grow {} ± {} over the steady state.\n",
        g.verdict.key(),
        g.duration_s,
        g.startup_end_s,
        g.steady_from_s,
        g.bucket_s,
        rate(g.rate_bytes_per_hour),
        plus_minus(g.rate_uncertainty_bytes_per_hour)
    );
    if let Some(per_step) = g.rate_bytes_per_step {
        let _ = writeln!(
            out,
            "The engine's loop shows its steps ({} forwards over the steady state): the bytes held grow {} a step.\n",
            g.steady_steps,
            signed_bytes(per_step)
        );
    }
    for e in &g.evidence {
        let _ = writeln!(out, "- {e}");
    }
    let _ = writeln!(out, "\nRests on: {}.\n", g.rests_on);
    if !g.lines.is_empty() {
        let steps = g.rate_bytes_per_step.is_some();
        let _ = writeln!(
            out,
            "| where | pid | device | level | category | rate | ± |{} live at end | allocations | oldest held | verdict |",
            if steps { " per step |" } else { "" }
        );
        let _ = writeln!(
            out,
            "|---|---:|---:|---|---|---:|---:|{}---:|---:|---:|---|",
            if steps { "---:|" } else { "" }
        );
        for l in &g.lines {
            let oldest = l
                .oldest
                .first()
                .map(|o| {
                    format!(
                        "{}{:.1} s ({})",
                        if o.restated { "≤" } else { "" },
                        o.t_s,
                        fmt_bytes(o.bytes)
                    )
                })
                .unwrap_or_else(|| "—".into());
            let per_step = match (steps, l.bytes_per_step) {
                (false, _) => String::new(),
                (true, Some(b)) => format!(" {} |", signed_bytes(b)),
                (true, None) => " — |".to_string(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |{per_step} {} | {} | {} | {} |",
                cell(&code(&l.place)),
                l.pid,
                l.device,
                l.level,
                l.category,
                rate(l.bytes_per_hour),
                plus_minus(l.uncertainty_bytes_per_hour),
                fmt_bytes(l.live_bytes),
                l.live_allocations,
                oldest,
                verdict_word(l.verdict)
            );
        }
        let _ = writeln!(out);
    }
    if !g.reserve.is_empty() {
        let _ = writeln!(
            out,
            "PyTorch's reserve (segments held from the driver), told apart from its tensors:\n"
        );
        let _ = writeln!(
            out,
            "| pid | device | segments | rate | tensors' rate | unallocated | largest free block | verdict |"
        );
        let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---|");
        for x in &g.reserve {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                x.pid,
                x.device,
                fmt_bytes(x.segment_bytes),
                rate(x.bytes_per_hour),
                rate(x.tensor_bytes_per_hour),
                fmt_bytes(x.unallocated_bytes),
                fmt_bytes(x.largest_free_block),
                x.verdict
            );
        }
        let _ = writeln!(out);
    }
}
