//! The report as GitHub-flavoured Markdown: one screen at the top (what failed, where, why,
//! what to change), then every section in full, stacks folded in `<details>` blocks. One file
//! per section; this one holds `render` and the helpers the sections share.

use std::fmt::Write as _;

use vramtrace_models::units::{fmt_bytes, fmt_secs};

use crate::attribution::{Attribution, MatchedBy, Moment};
use crate::categories::CATEGORIES;
use crate::evidence::Evidence;
use crate::report::{
    Comparison, FailureReport, LiveSet, MAX_COMPARED_FAILURES, MAX_GROUPS, PeakReport, Report,
    rank_of,
};
use crate::summary::ProcessSummary;

mod comparison;
mod environment;
mod failures;
mod growth;
mod peaks;
mod pytorch;
mod top;
mod triage;

use comparison::*;
use environment::*;
use failures::*;
use growth::growth;
use peaks::*;
use pytorch::*;
use top::*;
use triage::*;

/// Where the plots are: a file name beside the report, or a data URI; `None` when not drawn.
#[derive(Debug, Clone, Default)]
pub struct Images {
    /// The timeline of every device.
    pub timeline: Option<String>,
    /// The breakdown at the first failure (or the peak).
    pub breakdown: Option<String>,
    /// The cliff of the model on the capacity.
    pub cliff: Option<String>,
}

/// `102236160` → `102,236,160`.
pub fn exact(b: u64) -> String {
    let s = b.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `97.50 MiB (102,236,160 B)`.
fn both(b: u64) -> String {
    if b < 1024 {
        format!("{b} B")
    } else {
        format!("{} ({} B)", fmt_bytes(b), exact(b))
    }
}

fn signed(b: i128) -> String {
    if b < 0 {
        format!(
            "−{}",
            fmt_bytes(b.unsigned_abs().min(u64::MAX as u128) as u64)
        )
    } else {
        fmt_bytes(b.min(u64::MAX as i128) as u64)
    }
}

/// A table cell: pipes escaped, newlines flattened.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Inline code that survives backticks in the text.
fn code(s: &str) -> String {
    if s.contains('`') {
        format!("`` {s} ``")
    } else {
        format!("`{s}`")
    }
}

fn program(p: &ProcessSummary) -> String {
    p.command
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_else(|| "?".into())
}

fn who(r: &Report, process: usize) -> String {
    let p = &r.summary.processes[process];
    let rank = rank_of(&p.command)
        .map(|x| format!(", {x}"))
        .unwrap_or_default();
    format!(
        "{} pid {} (parent {}{rank})",
        code(&program(p)),
        p.pid,
        p.ppid
    )
}

fn device_words(r: &Report, process: usize, device: i32) -> String {
    match r.device(process, device) {
        Some(d) => match (&d.name, d.total_bytes) {
            (Some(n), Some(t)) => format!("cuda:{device} ({n}, {})", fmt_bytes(t)),
            (Some(n), None) => format!("cuda:{device} ({n})"),
            _ => format!("cuda:{device}"),
        },
        None => format!("cuda:{device}"),
    }
}

/// The categoriser's rows of the report's moment in one line, largest first (see "What the
/// memory holds").
fn rows_line(r: &Report) -> Option<String> {
    let (_, _, c) = r.categories()?;
    let mut rows: Vec<&crate::categoriser::Row> = c.breakdown.rows.iter().collect();
    rows.sort_by_key(|x| std::cmp::Reverse(x.bytes));
    Some(
        rows.iter()
            .map(|x| format!("{} {}", x.category.title(), fmt_bytes(x.bytes)))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

fn categories_line(live: &LiveSet) -> String {
    let mut parts: Vec<(u64, String)> = live
        .by_category
        .iter()
        .enumerate()
        .filter(|(_, (b, _))| *b > 0)
        .map(|(i, (b, _))| (*b, format!("{} {}", CATEGORIES[i], fmt_bytes(*b))))
        .collect();
    parts.sort_by_key(|p| std::cmp::Reverse(p.0));
    parts
        .into_iter()
        .map(|p| p.1)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The failed request's tensor, when the model names it.
fn failed_tensor(c: &Comparison) -> Option<String> {
    let a = &c.attribution;
    let r = &a.rows[a.failed_tensor?];
    Some(format!(
        "{} {} {} of {} ({} predicted), {}",
        code(&r.name),
        r.dtype,
        r.shape,
        c.variant.name(),
        fmt_bytes(r.predicted_bytes),
        code(&r.source)
    ))
}

/// Renders the whole report.
pub fn render(r: &Report, images: &Images) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Memory report: {}\n", r.title);
    let triaged = triage_top(&mut out, r);
    if !triaged {
        top(&mut out, r);
    }
    let _ = writeln!(out, "\n---\n");
    if triaged {
        if let Some(c) = &images.cliff {
            let _ = writeln!(out, "![the cliff: the step against the limit]({c})\n");
        }
    } else if r.model.is_some() || !r.failures.is_empty() {
        what_to_do(&mut out, r, images);
    }
    triage_sections(&mut out, r);
    llama_cpp(&mut out, r);
    failures(&mut out, r, images);
    failed_calls(&mut out, r);
    peaks(&mut out, r, images);
    growth(&mut out, r);
    versions(&mut out, r);
    environment(&mut out, r);
    how_to_read(&mut out, r);
    out
}

/// `--model MODEL.gguf`: llama.cpp's buffers predicted beside the trace.
fn llama_cpp(out: &mut String, r: &Report) {
    let Some(v) = &r.llama_cpp else {
        return;
    };
    let _ = writeln!(out, "## llama.cpp's buffers, predicted from the GGUF\n");
    let v = match v {
        Ok(v) => v,
        Err(e) => {
            let _ = writeln!(out, "Not set beside the trace: {e}.\n");
            return;
        }
    };
    let f = &v.flags;
    let _ = writeln!(
        out,
        "From `{}` and pid {}'s command line: `-c {} -ub {} -b {} -fa {} -ctk {} -ctv {}` (models/src/engine/llama_cpp.rs).\n",
        v.gguf,
        v.pid,
        f.n_ctx,
        f.n_ubatch,
        f.n_batch,
        if f.flash_attn { "on" } else { "off" },
        f.cache_types.0,
        f.cache_types.1
    );
    let _ = writeln!(
        out,
        "| buffer | predicted | in the trace | what the prediction rests on |\n| --- | ---: | ---: | --- |"
    );
    for row in &v.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            row.part,
            row.predicted.map_or("not modelled".to_string(), fmt_bytes),
            row.observed.map_or("—".to_string(), fmt_bytes),
            row.basis
        );
    }
    let _ = writeln!(out);
    if let Some(s) = &v.before_attach {
        let _ = writeln!(out, "{s}\n");
    }
}

fn dtype_name(d: vramtrace_models::DType) -> String {
    serde_json::to_value(d)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{d:?}"))
}

fn live_tables(out: &mut String, live: &LiveSet, total: u64) {
    let _ = writeln!(
        out,
        "| category | bytes | allocations | share |\n| --- | ---: | ---: | ---: |"
    );
    for (i, (b, n)) in live.by_category.iter().enumerate() {
        if *n == 0 {
            continue;
        }
        let share = if total == 0 {
            0.0
        } else {
            100.0 * *b as f64 / total as f64
        };
        let _ = writeln!(
            out,
            "| {} | {} | {n} | {share:.2}% |",
            CATEGORIES[i],
            both(*b)
        );
    }
    group_table(out, live);
}

/// The live set's groups by name and label (numbers collapsed), with the live view's label
/// category of each.
fn group_table(out: &mut String, live: &LiveSet) {
    let _ = writeln!(
        out,
        "\n| group (`#` = any number) | label category | allocations | bytes |\n| --- | --- | ---: | ---: |"
    );
    for g in live.groups.iter().take(MAX_GROUPS) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            code(&cell(&g.key)),
            CATEGORIES[g.category],
            g.count,
            both(g.bytes)
        );
    }
    if live.groups.len() > MAX_GROUPS {
        let rest = &live.groups[MAX_GROUPS..];
        let _ = writeln!(
            out,
            "| {} more groups | | {} | {} |",
            rest.len(),
            rest.iter().map(|g| g.count).sum::<usize>(),
            both(rest.iter().fold(0u64, |a, g| a.saturating_add(g.bytes)))
        );
    }
    let _ = writeln!(out);
}

fn stack_block(out: &mut String, summary: &str, frames: &[String]) {
    let _ = writeln!(out, "<details><summary>{summary}</summary>\n");
    if frames.is_empty() {
        let _ = writeln!(out, "(no stack recorded)\n");
    } else {
        let _ = writeln!(out, "```text");
        for f in frames {
            let _ = writeln!(out, "at {f}");
        }
        let _ = writeln!(out, "```\n");
    }
    let _ = writeln!(out, "</details>\n");
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}
