//! The report as GitHub-flavoured Markdown: one screen at the top (what failed, where, why,
//! what to change), then every section in full, stacks folded in `<details>` blocks.

use std::fmt::Write as _;

use vramtrace_models::units::{fmt_bytes, fmt_secs};

use crate::attribution::{Attribution, MatchedBy, Moment};
use crate::evidence::Evidence;
use crate::live::CATEGORIES;
use crate::report::{
    Comparison, FailureReport, LiveSet, MAX_COMPARED_FAILURES, MAX_GROUPS, PeakReport, Report,
    rank_of,
};
use crate::summary::ProcessSummary;

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
    top(&mut out, r);
    let _ = writeln!(out, "\n---\n");
    if r.model.is_some() || !r.failures.is_empty() {
        what_to_do(&mut out, r, images);
    }
    failures(&mut out, r, images);
    failed_calls(&mut out, r);
    peaks(&mut out, r, images);
    environment(&mut out, r);
    how_to_read(&mut out, r);
    out
}

/// The first screen.
fn top(out: &mut String, r: &Report) {
    if r.summary.processes.is_empty() {
        let _ = writeln!(
            out,
            "**The trace holds no process.** Nothing was recorded: was the program run under `vramtrace run`, and did it reach the GPU?"
        );
        unreadable(out, r);
        return;
    }
    let n_fail = r.failures.len();
    let Some(f) = r.first_failure() else {
        match r.highest_peak() {
            Some(p) => {
                let d = r.device(p.process, p.device).expect("a peak has a device");
                let _ = writeln!(
                    out,
                    "**No allocation failed.** The highest peak: {} on {}, **{}** at {} in {} allocations: {}.",
                    who(r, p.process),
                    device_words(r, p.process, p.device),
                    both(d.peak_bytes),
                    fmt_secs(d.peak_t_s),
                    d.peak_live_count,
                    categories_line(&p.live)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "**No device allocation was recorded** by the {} traced process(es).",
                    r.summary.processes.len()
                );
            }
        }
        let calls = r
            .summary
            .processes
            .iter()
            .flat_map(|p| &p.devices)
            .map(|d| d.failed_call_count)
            .sum::<u64>();
        if calls > 0 {
            let _ = writeln!(
                out,
                "\n{calls} failed call(s) that are not out of memory: see [Failed calls](#failed-calls-that-are-not-out-of-memory)."
            );
        }
        if let Some(c) = &r.peak_comparison {
            other_implementation_brief(out, c);
        }
        levers_brief(out, r);
        unreadable(out, r);
        return;
    };
    let fl = &f.failure;
    let oom = fl.result == 2;
    let _ = writeln!(
        out,
        "**{} on {}** in {} at {}{}.\n",
        if oom {
            "Out of memory"
        } else {
            "Allocation failed"
        },
        device_words(r, f.process, f.device),
        who(r, f.process),
        fmt_secs(fl.t_s),
        if n_fail > 1 {
            format!(" (the first of {n_fail} failed allocations)")
        } else {
            String::new()
        }
    );
    let short = f.shortfall();
    let _ = writeln!(
        out,
        "- **Request**: {} of **{}** failed with {}; the driver said **{}** free of {}{}.",
        code(fl.api),
        both(fl.size),
        fl.error,
        both(fl.free_bytes),
        fmt_bytes(fl.total_bytes),
        if short > 0 {
            format!(", **{} short**", fmt_bytes(short))
        } else {
            String::new()
        }
    );
    let mut whr = Vec::new();
    if let Some(l) = &fl.label {
        whr.push(code(l));
    }
    if !f.named_frames.is_empty() {
        whr.push(
            f.named_frames
                .iter()
                .take(3)
                .map(|x| code(x))
                .collect::<Vec<_>>()
                .join(" ← "),
        );
    }
    if !whr.is_empty() {
        let _ = writeln!(out, "- **Where**: {}.", whr.join(", at "));
    }
    if let Some(t) = f.comparison.as_ref().and_then(failed_tensor) {
        let _ = writeln!(out, "- **What**: {t}.");
    }
    if let Some(c) = &f.comparison {
        other_implementation_brief(out, c);
    }
    let untraced = f
        .untraced()
        .map(|u| {
            format!(
                "; untraced on the device (contexts, modules, other processes): {}",
                signed(u)
            )
        })
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "- **Why**: this process held **{}** in {} allocations: {}{untraced}.",
        fmt_bytes(fl.live_bytes),
        fl.live_count,
        categories_line(&f.live)
    );
    levers_brief(out, r);
    unreadable(out, r);
}

/// The first screen's line when the frames show that the program ran other code than the
/// model's variant.
fn other_implementation_brief(out: &mut String, c: &Comparison) {
    if let Some(n) = &c.attribution.evidence.other_implementation {
        let _ = writeln!(out, "- **Model**: {n} (see the model table below).");
    }
}

fn unreadable(out: &mut String, r: &Report) {
    if !r.summary.unreadable.is_empty() {
        let _ = writeln!(
            out,
            "\n**{} file(s) of the trace could not be read** and are left out: {}.",
            r.summary.unreadable.len(),
            r.summary
                .unreadable
                .iter()
                .map(|u| format!("{} ({})", code(&u.file.display().to_string()), u.reason))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
}

/// The levers in four lines, for the first screen.
fn levers_brief(out: &mut String, r: &Report) {
    let Some(l) = &r.levers else {
        if r.model.is_none() {
            let _ = writeln!(
                out,
                "- **What to change**: pass `--model config.json --tokens N --capacity BYTES` to compute the cliff, the effect of halving the prefill chunk, and what fp8 KV cache or another weight format would free."
            );
        } else if let Some(e) = &r.levers_error {
            let _ = writeln!(out, "- **What to change**: not computed: {e}.");
        }
        return;
    };
    let _ = writeln!(
        out,
        "- **What to change** ({}, {}, on {}):",
        l.model_name,
        l.variant.name(),
        fmt_bytes(l.capacity)
    );
    match (l.cliff_tokens, l.budget) {
        (Some(c), _) => {
            let _ = writeln!(
                out,
                "  - the cliff: a prefill chunk of **{c} tokens** or more does not fit ({} resident); this one was {}: keep `--max-num-batched-tokens` at **{}** or below.",
                fmt_bytes(l.resident),
                l.tokens,
                c - 1
            );
        }
        (None, Some(_)) => {
            let _ = writeln!(out, "  - no cliff below 2^40 tokens on this capacity.");
        }
        (None, None) => {
            let _ = writeln!(
                out,
                "  - the resident bytes ({}) alone exceed the capacity: no chunk fits.",
                fmt_bytes(l.resident)
            );
        }
    }
    let enough = |b: u64| match l.shortfall {
        Some(s) if s > 0 && b >= s => " — more than the shortfall",
        Some(s) if s > 0 => " — less than the shortfall",
        _ => "",
    };
    let _ = writeln!(
        out,
        "  - halving the chunk to {} tokens takes **{}** off the kernel's peak ({} → {}){}.",
        l.half_tokens,
        fmt_bytes(l.halving_frees()),
        fmt_bytes(l.kernel_peak),
        fmt_bytes(l.kernel_peak_half),
        enough(l.halving_frees())
    );
    if let Some(kv) = &l.kv {
        let _ = writeln!(
            out,
            "  - fp8 KV cache frees **{}** at the {} tokens the cache held{}.",
            fmt_bytes(kv.freed_by_fp8),
            kv.tokens_held,
            enough(kv.freed_by_fp8)
        );
    }
    if let Some(w) = &l.weights {
        let (name, est) = w.formats[w.closest];
        let smaller: Vec<String> = w
            .formats
            .iter()
            .filter(|(_, b)| *b < est)
            .map(|(n, b)| format!("{n} frees {}", fmt_bytes(est - b)))
            .collect();
        let _ = writeln!(
            out,
            "  - weights: {} live, closest to {name} ({}); {}.",
            fmt_bytes(w.observed),
            fmt_bytes(est),
            if smaller.is_empty() {
                "no smaller format is modelled".to_string()
            } else {
                smaller.join(", ")
            }
        );
    }
}

fn what_to_do(out: &mut String, r: &Report, images: &Images) {
    let _ = writeln!(out, "## What to do\n");
    let Some(l) = &r.levers else {
        match (&r.model, &r.levers_error) {
            (None, _) => {
                let _ = writeln!(
                    out,
                    "Computed only with a model: `vramtrace report DIR --model config.json --tokens N [--tp N] [--capacity BYTES]` adds the cliff for the card (the largest prefill chunk that fits), what halving the chunk (vLLM's `--max-num-batched-tokens`) takes off the kernel's peak, and what an fp8 KV cache (`--kv-cache-dtype fp8`) or another weight format would free, each in bytes from the model and the trace.\n"
                );
            }
            (Some(_), Some(e)) => {
                let _ = writeln!(out, "The levers could not be computed: {e}.\n");
            }
            _ => {}
        }
        return;
    };
    let at = if l.shortfall.is_some() {
        "at the first failure"
    } else {
        "at the highest peak"
    };
    let given = match r.capacity {
        Some((_, true)) => "given with --capacity",
        _ => "the failing device's total; pass --capacity for another card",
    };
    let _ = writeln!(
        out,
        "Computed from {} ({}, tensor-parallel {}) for a card of **{}** ({given}). Resident: **{}** live {at} that the model does not explain, without `other` (ballast, reservations).\n",
        l.model_name,
        l.variant.name(),
        l.tp,
        both(l.capacity),
        both(l.resident)
    );
    let _ = writeln!(out, "| lever | computed | effect |\n| --- | --- | --- |");
    match (l.cliff_tokens, l.budget) {
        (Some(c), Some(b)) => {
            let _ = writeln!(
                out,
                "| prefill chunk (`--max-num-batched-tokens`) | the cliff: **{c} tokens** (the first chunk whose kernel peak exceeds capacity − resident = {}) | a chunk of {} tokens fits; this one was {} |",
                fmt_bytes(b),
                c - 1,
                l.tokens
            );
        }
        (None, Some(b)) => {
            let _ = writeln!(
                out,
                "| prefill chunk | no cliff below 2^40 tokens | the kernel fits in {} at any chunk |",
                fmt_bytes(b)
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "| prefill chunk | resident {} exceeds the capacity | nothing fits; free resident memory first |",
                fmt_bytes(l.resident)
            );
        }
    }
    let _ = writeln!(
        out,
        "| halve the chunk: {} → {} tokens | kernel peak {} → {} | frees **{}**{} |",
        l.tokens,
        l.half_tokens,
        both(l.kernel_peak),
        both(l.kernel_peak_half),
        both(l.halving_frees()),
        match l.shortfall {
            Some(s) if s > 0 => format!(" against a shortfall of {}", both(s)),
            _ => String::new(),
        }
    );
    if let Some(p) = l.kernel_peak_tp2 {
        let _ = writeln!(
            out,
            "| tensor-parallel {} → {} | kernel peak per card {} → {} | frees {} per card, and the weights and KV cache are split too |",
            l.tp,
            l.tp * 2,
            fmt_bytes(l.kernel_peak),
            fmt_bytes(p),
            fmt_bytes(l.kernel_peak.saturating_sub(p))
        );
    }
    match &l.kv {
        Some(kv) => {
            let _ = writeln!(
                out,
                "| KV cache {} → fp8 (`--kv-cache-dtype fp8`) | {} → {} per token; {} live in the KV cache = {} tokens at {} | frees **{}** at those tokens (or holds twice the tokens in the same pool) |",
                dtype_name(kv.dtype),
                both(kv.per_token),
                both(kv.per_token_fp8),
                both(kv.observed_bytes),
                kv.tokens_held,
                dtype_name(kv.dtype),
                both(kv.freed_by_fp8)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "| KV cache dtype | no KV cache live (no allocation named or labelled `kv`/`cache`), or it is one byte already | — |"
            );
        }
    }
    if let Some(w) = &l.weights {
        let est = w.formats[w.closest].1;
        let list = w
            .formats
            .iter()
            .map(|(n, b)| format!("{n} {}", fmt_bytes(*b)))
            .collect::<Vec<_>>()
            .join(", ");
        let frees = w
            .formats
            .iter()
            .filter(|(_, b)| *b < est)
            .map(|(n, b)| format!("{n}: {}", both(est - b)))
            .collect::<Vec<_>>();
        let _ = writeln!(
            out,
            "| weight format | {} live; the model: {list}; closest: **{}** | {} |",
            both(w.observed),
            w.formats[w.closest].0,
            if frees.is_empty() {
                "no smaller format is modelled".to_string()
            } else {
                format!("frees {}", frees.join("; "))
            }
        );
    }
    let _ = writeln!(
        out,
        "\nThe chunk, cliff and TP rows are the model's kernel peak for one sequence of that many tokens (`vramtrace model --sweep`); the KV row assumes the cache is in the config's dtype; the weight estimates are the model's (`vramtrace model --weights`), not read from the checkpoint.\n"
    );
    if let Some(c) = &images.cliff {
        let _ = writeln!(out, "![cliff]({c})\n");
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
    let _ = writeln!(
        out,
        "\n| group (`#` = any number) | category | allocations | bytes |\n| --- | --- | ---: | ---: |"
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

fn failures(out: &mut String, r: &Report, images: &Images) {
    if r.failures.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Failed allocations\n");
    let total: u64 = r
        .summary
        .processes
        .iter()
        .flat_map(|p| &p.devices)
        .map(|d| d.failed_allocations)
        .sum();
    if total as usize > r.failures.len() {
        let _ = writeln!(
            out,
            "{total} allocations failed; the first {} of each process and device are detailed.\n",
            crate::summary::MAX_DETAILED_FAILURES
        );
    }
    for (i, f) in r.failures.iter().enumerate() {
        failure(out, r, i, f);
        if i == 0
            && let Some(b) = &images.breakdown
        {
            let _ = writeln!(out, "![breakdown at the failure]({b})\n");
        }
    }
}

fn failure(out: &mut String, r: &Report, i: usize, f: &FailureReport) {
    let fl = &f.failure;
    let _ = writeln!(
        out,
        "### {}. {} of {} at {} — {}, {}\n",
        i + 1,
        fl.api,
        fmt_bytes(fl.size),
        fmt_secs(fl.t_s),
        who(r, f.process),
        device_words(r, f.process, f.device)
    );
    let _ = writeln!(out, "| | |\n| --- | --- |");
    let _ = writeln!(out, "| request | {} of {} |", code(fl.api), both(fl.size));
    let _ = writeln!(out, "| result | {} |", cell(&fl.error));
    if let Some(l) = &fl.label {
        let _ = writeln!(out, "| label | {} |", code(&cell(l)));
    }
    let _ = writeln!(
        out,
        "| the driver then | {} free of {} |",
        both(fl.free_bytes),
        both(fl.total_bytes)
    );
    let _ = writeln!(
        out,
        "| live in this process | {} in {} allocations |",
        both(fl.live_bytes),
        fl.live_count
    );
    for (pid, b) in &f.traced_by_process {
        if *pid != r.summary.processes[f.process].pid {
            let _ = writeln!(out, "| live in traced pid {pid} | {} |", both(*b));
        }
    }
    if let Some(u) = f.untraced() {
        let _ = writeln!(
            out,
            "| untraced (total − free − traced live) | {} |",
            if u < 0 {
                format!(
                    "{} (the driver's free counts past the trace's live: allocations before recording began, or another device under the same ordinal)",
                    signed(u)
                )
            } else {
                both(u as u64)
            }
        );
    }
    let _ = writeln!(out, "| short by | {} |\n", both(f.shortfall()));
    stack_block(out, "stack of the failed request", &f.frames);
    pytorch_message(out, r, f);
    let _ = writeln!(out, "Live at that moment:\n");
    live_tables(out, &f.live, fl.live_bytes);
    match &f.comparison {
        Some(c) => comparison(out, r, c),
        None if r.model.is_some() && i >= MAX_COMPARED_FAILURES => {
            let _ = writeln!(
                out,
                "(not set beside the model: only the first {MAX_COMPARED_FAILURES} failures are; `vramtrace compare --at oom:N` does any)\n"
            );
        }
        None => {}
    }
}

fn pytorch_message(out: &mut String, r: &Report, f: &FailureReport) {
    let fl = &f.failure;
    if let Some(tm) = &fl.tensors {
        return pytorch_message_tensors(out, r, f, tm);
    }
    let named = f.live.named_bytes;
    let _ = writeln!(
        out,
        "PyTorch's out-of-memory message, number by number, as far as this driver-level trace can tell:\n"
    );
    let _ = writeln!(out, "| PyTorch says | this trace shows |\n| --- | --- |");
    let _ = writeln!(
        out,
        "| Tried to allocate *X* | the driver was asked for {}; PyTorch's *X* is the tensor's size, the same or up to 2 MiB less when its caching allocator rounded the request up to a segment |",
        both(fl.size)
    );
    let _ = writeln!(
        out,
        "| GPU has a total capacity of *T* of which *F* is free | *T* = {}, *F* = {} (the driver's numbers at the failure) |",
        both(fl.total_bytes),
        both(fl.free_bytes)
    );
    let u = f.untraced();
    let _ = writeln!(
        out,
        "| this process has *P* memory in use (including non-PyTorch memory) | at least {} of driver allocations{} |",
        both(fl.live_bytes),
        match u {
            Some(u) if u > 0 => format!(
                ", plus its part of the {} the trace did not see (its CUDA context and modules; the trace cannot split that between processes)",
                fmt_bytes(u as u64)
            ),
            _ => String::new(),
        }
    );
    let _ = writeln!(
        out,
        "| *A* is allocated by PyTorch | {} |",
        if named > 0 {
            format!(
                "{} in named tensors (names given through the annotation ABI); unnamed allocations are not counted",
                both(named)
            )
        } else {
            "cannot tell: no live allocation is named; run the program with the Python probe (`probes/python/vramtrace_probe.py`) to name tensors".to_string()
        }
    );
    let _ = writeln!(
        out,
        "| *R* is reserved by PyTorch but unallocated | at most {}: the process's driver allocations minus the named tensors. The driver-level trace sees the caching allocator's segments, not the free blocks inside them; which segment holds the largest free block needs the PyTorch tensor-level probe, which does not exist yet |",
        both(fl.live_bytes.saturating_sub(named))
    );
    let _ = writeln!(
        out,
        "| *G* allocated in private pools (CUDA Graphs) | cannot tell yet: graph pools are ordinary segments at the driver level |"
    );
    let others: u64 = f
        .traced_by_process
        .iter()
        .filter(|(pid, _)| *pid != r.summary.processes[f.process].pid)
        .map(|(_, b)| *b)
        .sum();
    let _ = writeln!(
        out,
        "| non-PyTorch memory | untraced {} (contexts, loaded modules, memory of processes not traced){} |\n",
        u.map(signed)
            .unwrap_or_else(|| "unknown (the driver's numbers are missing)".into()),
        if others > 0 {
            format!("; other traced processes on this device: {}", both(others))
        } else {
            String::new()
        }
    );
}

/// PyTorch's message from the tensor records (the PyTorch probe or an imported snapshot): the
/// live tensors, the free space inside the segments and what lies outside them.
fn pytorch_message_tensors(
    out: &mut String,
    r: &Report,
    f: &FailureReport,
    tm: &crate::tensors::TensorMoment,
) {
    let fl = &f.failure;
    let torch = fl.torch.as_ref();
    let total = if fl.total_bytes > 0 {
        fl.total_bytes
    } else {
        r.device(f.process, f.device)
            .and_then(|d| d.total_bytes)
            .unwrap_or(0)
    };
    let free = fl.free_bytes;
    let traced = f.traced_all().max(fl.live_bytes);
    let untraced =
        (total > 0 && free > 0).then(|| i128::from(total) - i128::from(free) - i128::from(traced));
    let _ = writeln!(
        out,
        "PyTorch's out-of-memory message, number by number, from the tensors its caching allocator reported:\n"
    );
    let _ = writeln!(out, "| PyTorch says | this trace shows |\n| --- | --- |");
    let _ = writeln!(
        out,
        "| Tried to allocate *X* | {} |",
        match torch {
            Some(t) => format!(
                "{}: the tensor PyTorch's allocator refused (the driver was not asked)",
                both(t.requested)
            ),
            None => format!(
                "the driver was asked for {} (a new segment for the request)",
                both(fl.size)
            ),
        }
    );
    let _ = writeln!(
        out,
        "| GPU has a total capacity of *T* of which *F* is free | *T* = {}, *F* = {} |",
        if total > 0 {
            both(total)
        } else {
            "unknown".into()
        },
        both(free)
    );
    let mut largest = String::new();
    for t in tm.tensors.iter().take(5) {
        let what = t
            .tensor
            .as_deref()
            .map(|n| format!(" {}", code(&cell(n))))
            .unwrap_or_default();
        let at = t.line.as_deref().unwrap_or("no Python line");
        let _ = write!(
            largest,
            "{}{}{what} at {}",
            if largest.is_empty() { "" } else { "; " },
            fmt_bytes(t.size),
            code(&cell(at))
        );
    }
    let _ = writeln!(
        out,
        "| *A* is allocated by PyTorch | {} in {} live tensors{}{} |",
        both(tm.tensor_bytes),
        tm.tensor_count,
        match torch {
            Some(t) if t.allocated != tm.tensor_bytes => format!(
                " (PyTorch counted {}: the difference is blocks the records did not see)",
                both(t.allocated)
            ),
            Some(_) => " (PyTorch's own count is the same)".into(),
            None => String::new(),
        },
        if largest.is_empty() {
            String::new()
        } else {
            format!("; the largest: {largest}")
        }
    );
    let request = torch.map_or(fl.size, |t| t.requested);
    let verdict = if tm.largest_free_block >= request {
        format!(
            "the largest free block, {}, holds the request: a segment could have served it by size (the allocator's pools and rounding aside), so free space inside the cache was not what was missing",
            fmt_bytes(tm.largest_free_block)
        )
    } else if tm.unallocated_bytes >= request {
        format!(
            "fragmentation: {} is free inside the segments in all, more than the request, but the largest free block is {}, so no segment could serve it",
            fmt_bytes(tm.unallocated_bytes),
            fmt_bytes(tm.largest_free_block)
        )
    } else {
        format!(
            "not fragmentation: all the free space inside the segments together, {}, is less than the request (the largest free block {})",
            fmt_bytes(tm.unallocated_bytes),
            fmt_bytes(tm.largest_free_block)
        )
    };
    if tm.segment_bytes == 0 {
        let _ = writeln!(
            out,
            "| *R* is reserved by PyTorch but unallocated | {}; the trace saw none of the segments (allocated before recording began, or not through a traced driver), so the largest free block against the request is unknown |",
            match torch {
                Some(t) => format!(
                    "{} by PyTorch's own numbers (reserved {} − allocated {})",
                    both(t.reserved.saturating_sub(t.allocated)),
                    fmt_bytes(t.reserved),
                    fmt_bytes(t.allocated)
                ),
                None => "unknown".into(),
            }
        );
    } else {
        let _ = writeln!(
            out,
            "| *R* is reserved by PyTorch but unallocated | {} = segment bytes {} − tensor bytes inside them{}; {verdict} |",
            both(tm.unallocated_bytes),
            both(tm.segment_bytes),
            match torch {
                Some(t) if t.reserved != tm.segment_bytes =>
                    format!(" (PyTorch counted {} reserved)", both(t.reserved)),
                _ => String::new(),
            }
        );
    }
    if let Some(t) = torch.filter(|t| t.limit > 0) {
        let _ = writeln!(
            out,
            "| (the per-process limit) | {} (`set_per_process_memory_fraction`): {} |",
            both(t.limit),
            if t.reserved.max(t.allocated).saturating_add(t.requested) > t.limit {
                format!(
                    "reserved {} + the request exceed it, so the allocator refused before asking the driver",
                    fmt_bytes(t.reserved.max(t.allocated))
                )
            } else {
                "the request fits under it".to_string()
            }
        );
    }
    let _ = writeln!(
        out,
        "| *G* allocated in private pools (CUDA Graphs) | unknown: the records do not say which pool a block is in |"
    );
    let outside = match torch {
        Some(t) => format!(
            "driver allocations outside PyTorch's reserved segments {}",
            both(fl.live_bytes.saturating_sub(t.reserved))
        ),
        None => format!(
            "driver allocations of this process {} in all; which of them are not the caching allocator's segments is unknown without PyTorch's reserved number",
            both(fl.live_bytes)
        ),
    };
    let _ = writeln!(
        out,
        "| non-PyTorch memory | {outside}; untraced (total − free − traced) {}{} |\n",
        untraced
            .map(signed)
            .unwrap_or_else(|| "unknown (the driver's numbers are missing)".into()),
        if tm.outside_segments_bytes > 0 {
            format!(
                "; {} of live tensors lie in no segment the trace saw (allocated before recording began)",
                both(tm.outside_segments_bytes)
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "Still unknown: what the untraced bytes are (the CUDA context, loaded modules, processes not traced), and the CUDA Graphs pools.\n"
    );
}

/// What a row's match rests on, or why a tensor of the same size was not matched (the words of
/// `vramtrace compare`'s evidence column).
fn evidence_words(e: &Evidence) -> String {
    match e {
        Evidence::Label => "named as the tensor".into(),
        Evidence::Frame { frame } => format!("frame {} in the modelled file", code(&cell(frame))),
        Evidence::SizeOnly { same_size } => format!("size and order only ({same_size} alike)"),
        Evidence::Ambiguous { candidates } => {
            format!("**ambiguous**: {candidates} live allocations of this size")
        }
        Evidence::Contradicted { frame, expected } => format!(
            "**other code**: allocated at {}, not in {}",
            code(&cell(frame)),
            code(&cell(expected))
        ),
        Evidence::Shape { op } => format!("shape and dtype of {}", code(&cell(op))),
    }
}

/// Where a matched allocation came from: what the trace says it holds (dtype and shape) and its
/// innermost Python frame.
fn allocation_words(c: &Comparison, oi: usize) -> String {
    let o = &c.attribution.observed[oi];
    let what = match c.held.get(oi).and_then(Option::as_deref) {
        _ if o.failed => "the request".to_string(),
        Some(h) => code(&cell(h)),
        None if o.op.is_some() => code(&cell(&o.op.as_ref().expect("checked").describe())),
        None if o.api == "pytorch" => "a PyTorch tensor".to_string(),
        None => code(o.api),
    };
    match o.frames.first() {
        Some(f) => format!("{what} at {}", code(&cell(f))),
        None => format!("{what}, no Python frame recorded"),
    }
}

/// The model set beside one moment: every tensor with what its match rests on and where the
/// allocation was made, then the headline.
fn comparison(out: &mut String, r: &Report, c: &Comparison) {
    let a = &c.attribution;
    let failure = a.moment == Moment::Failure;
    let (tokens, name) = match &r.model {
        Some(m) => (m.opts.seqlens.iter().sum::<u64>(), m.cfg.display_name()),
        None => (0, String::new()),
    };
    let _ = writeln!(
        out,
        "The model at {}: **{}** on {name}, {tokens} tokens ({}); {}.\n",
        if failure { "that moment" } else { "the peak" },
        c.variant.name(),
        c.choice,
        c.variant.source()
    );
    let _ = writeln!(
        out,
        "| tensor | shape | dtype | predicted | observed | difference | matched by | evidence | allocation |\n| --- | --- | --- | ---: | ---: | ---: | --- | --- | --- |"
    );
    for row in &a.rows {
        let failed = a.failed_tensor == Some(row.tensor);
        let (obs, diff) = match row.observed {
            Some(_) if failed => ("**the failed request**".to_string(), "—".to_string()),
            Some(_) => (
                exact(row.observed_bytes),
                row.difference.unwrap_or(0).to_string(),
            ),
            None => (
                match &row.evidence {
                    Some(_) => "not matched",
                    None if failure => "not live",
                    None if !row.live_at_predicted_peak => "not live at the model's peak",
                    None => "not observed",
                }
                .to_string(),
                "—".to_string(),
            ),
        };
        let how = match row.matched_by {
            Some(MatchedBy::Label) => "name",
            Some(MatchedBy::Frame) => "frame and size",
            Some(MatchedBy::OrderAndSize) => "order and size",
            Some(MatchedBy::Size) => "size",
            None => "",
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {obs} | {diff} | {how} | {} | {} |",
            code(&cell(&row.name)),
            cell(&row.shape),
            row.dtype,
            exact(row.predicted_bytes),
            row.evidence
                .as_ref()
                .map(evidence_words)
                .unwrap_or_default(),
            row.observed
                .map(|oi| allocation_words(c, oi))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "\nOf {} live: matched to the model {}, named but not in the model {}, neither {}.",
        both(a.observed_bytes),
        both(a.attributed_bytes),
        both(a.named_only_bytes),
        both(a.unexplained_bytes)
    );
    evidence_headline(out, a);
    if !failure {
        let _ = writeln!(out);
        return;
    }
    match a.failed_tensor {
        Some(ti) => {
            let row = &a.rows[ti];
            let _ = writeln!(
                out,
                "The failed request is {} {} {} ({} predicted), allocated at {}.\n",
                code(&row.name),
                row.dtype,
                row.shape,
                both(row.predicted_bytes),
                code(&row.source)
            );
        }
        None => {
            let _ = writeln!(out, "The failed request matches no tensor of this model.\n");
        }
    }
}

/// What the matched bytes rest on, the tensors left unmatched among look-alikes or by their
/// frames, and the sentence that says the program ran another implementation.
fn evidence_headline(out: &mut String, a: &Attribution) {
    let ev = &a.evidence;
    let _ = writeln!(
        out,
        "Of the matched: backed by a name or a frame in the modelled file {}, by size and order alone {}; {} tensor(s) ambiguous among look-alikes, {} contradicted by their frames.",
        both(ev.evidence_bytes),
        both(ev.size_only_bytes),
        ev.ambiguous,
        ev.contradicted
    );
    if ev.size_only_bytes > 0 && ev.evidence_bytes == 0 {
        let _ = writeln!(
            out,
            "Size and order alone do not show that these allocations are the model's tensors: record with the Python probe (its frames) or name the tensors to confirm it."
        );
    }
    if let Some(n) = &ev.other_implementation {
        let _ = writeln!(out, "**{}.**", upper_first(n));
    }
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

fn failed_calls(out: &mut String, r: &Report) {
    let rows: Vec<(usize, &crate::summary::DeviceSummary)> = r
        .summary
        .processes
        .iter()
        .enumerate()
        .flat_map(|(pi, p)| p.devices.iter().map(move |d| (pi, d)))
        .filter(|(_, d)| d.failed_call_count > 0)
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Failed calls that are not out of memory\n\nThese failed with another error than out of memory; they are not counted as OOMs.\n"
    );
    let _ = writeln!(
        out,
        "| process | device | time | call | bytes | error | label |\n| --- | --- | ---: | --- | ---: | --- | --- |"
    );
    for (pi, d) in rows {
        for c in &d.failed_calls {
            let _ = writeln!(
                out,
                "| pid {} | cuda:{} | {} | {} | {} | {} | {} |",
                r.summary.processes[pi].pid,
                d.device,
                fmt_secs(c.t_s),
                code(c.api),
                both(c.size),
                cell(&c.error),
                c.label
                    .as_deref()
                    .map(|l| code(&cell(l)))
                    .unwrap_or_default()
            );
        }
        if d.failed_call_count as usize > d.failed_calls.len() {
            let _ = writeln!(
                out,
                "| … {} more | | | | | | |",
                d.failed_call_count as usize - d.failed_calls.len()
            );
        }
    }
    let _ = writeln!(out);
}

fn peaks(out: &mut String, r: &Report, images: &Images) {
    let _ = writeln!(out, "## Peaks per process and device\n");
    if let Some(t) = &images.timeline {
        let _ = writeln!(out, "![timeline]({t})\n");
    }
    if r.peaks.is_empty() {
        let _ = writeln!(out, "No device allocation was recorded.\n");
    }
    for p in &r.peaks {
        peak(out, r, p);
    }
}

fn peak(out: &mut String, r: &Report, p: &PeakReport) {
    let d = r.device(p.process, p.device).expect("a peak has a device");
    let _ = writeln!(
        out,
        "### {} on {}: peak {} at {}\n",
        who(r, p.process),
        device_words(r, p.process, p.device),
        fmt_bytes(d.peak_bytes),
        fmt_secs(d.peak_t_s)
    );
    let _ = writeln!(
        out,
        "{} allocations, {} frees, {} failed allocations, {} failed calls; {} live at the end. At the peak, {} in {} allocations:\n",
        d.allocations,
        d.frees,
        d.failed_allocations,
        d.failed_call_count,
        fmt_bytes(d.live_at_end),
        both(d.peak_bytes),
        d.peak_live_count
    );
    live_tables(out, &p.live, d.peak_bytes);
    headroom(out, r, p);
    let highest = r
        .highest_peak()
        .is_some_and(|h| (h.process, h.device) == (p.process, p.device));
    if highest {
        match (&r.peak_comparison, &r.peak_comparison_error) {
            (Some(c), _) => comparison(out, r, c),
            (None, Some(e)) => {
                let _ = writeln!(out, "(not set beside the model: {e})\n");
            }
            (None, None) => {}
        }
    }
    if !p.top.is_empty() {
        let _ = writeln!(out, "The largest allocations live at the peak:\n");
    }
    for (a, frames) in &p.top {
        let what = match (&a.tensor, &a.label) {
            (Some(t), Some(l)) => format!("<code>{}</code> [{}]", html_escape(t), html_escape(l)),
            (Some(t), None) => format!("<code>{}</code>", html_escape(t)),
            (None, Some(l)) => format!("[{}]", html_escape(l)),
            (None, None) => "(unnamed)".into(),
        };
        stack_block(
            out,
            &format!(
                "{} {what}, {} at {}",
                fmt_bytes(a.size),
                a.api,
                fmt_secs(a.t_s)
            ),
            frames,
        );
    }
    for pool in &d.other_pools {
        let _ = writeln!(
            out,
            "Also {}: peak {}, {} allocations, {} freed, {} live at the end (never summed with device memory).\n",
            pool.pool.name(),
            fmt_bytes(pool.peak_bytes),
            pool.allocations,
            pool.frees,
            fmt_bytes(pool.live_at_end)
        );
    }
}

fn headroom(out: &mut String, r: &Report, p: &PeakReport) {
    let d = r.device(p.process, p.device).expect("a peak has a device");
    let Some(f) = r
        .failures
        .iter()
        .find(|f| f.process == p.process && f.device == p.device)
    else {
        match d.total_bytes {
            Some(t) => {
                let _ = writeln!(
                    out,
                    "Headroom: total {} − peak {} = at most {}; the driver reports what it uses outside the trace only at a failure, and none happened here.\n",
                    fmt_bytes(t),
                    fmt_bytes(d.peak_bytes),
                    signed(i128::from(t) - i128::from(d.peak_bytes))
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "Headroom: the trace does not say how large the device is.\n"
                );
            }
        }
        return;
    };
    let fl = &f.failure;
    if let Some(u) = f.untraced() {
        let _ = writeln!(
            out,
            "Headroom at the failure ({}): total {} − traced live {} − untraced {} = {} free, against a request of {}.\n",
            fmt_secs(fl.t_s),
            fmt_bytes(fl.total_bytes),
            fmt_bytes(f.traced_all()),
            signed(u),
            fmt_bytes(fl.free_bytes),
            fmt_bytes(fl.size)
        );
    }
}

fn environment(out: &mut String, r: &Report) {
    let _ = writeln!(out, "## Environment\n");
    let procs = &r.summary.processes;
    let hosts: Vec<&str> = {
        let mut h: Vec<&str> = r
            .host_names
            .iter()
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .collect();
        h.dedup();
        h
    };
    if !hosts.is_empty() {
        let _ = writeln!(out, "- Host: {}", hosts.join(", "));
    }
    if let Some(s) = &r.started {
        let _ = writeln!(out, "- Recorded: {s}");
    }
    let mut versions: Vec<i32> = procs.iter().filter_map(|p| p.driver_version).collect();
    versions.sort_unstable();
    versions.dedup();
    if versions.is_empty() {
        let _ = writeln!(out, "- Driver: no process reported its driver version");
    } else {
        let _ = writeln!(
            out,
            "- Driver: CUDA {} (what `cuDriverGetVersion` reported); the NVIDIA driver's release number is not in the trace",
            versions
                .iter()
                .map(|v| format!("{}.{} ({v})", v / 1000, (v % 1000) / 10))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut gpus: Vec<(i32, String, Option<u64>, Vec<u32>)> = Vec::new();
    for p in procs {
        for d in &p.devices {
            let name = d.name.clone().unwrap_or_else(|| "?".into());
            match gpus
                .iter_mut()
                .find(|g| g.0 == d.device && g.1 == name && g.2 == d.total_bytes)
            {
                Some(g) => g.3.push(p.pid),
                None => gpus.push((d.device, name, d.total_bytes, vec![p.pid])),
            }
        }
    }
    gpus.sort_by_key(|g| g.0);
    if !gpus.is_empty() {
        let _ = writeln!(
            out,
            "\n| GPU | name | total | used by pids |\n| --- | --- | ---: | --- |"
        );
        for (o, n, t, pids) in &gpus {
            let _ = writeln!(
                out,
                "| cuda:{o} | {} | {} | {} |",
                cell(n),
                t.map(both).unwrap_or_else(|| "?".into()),
                pids.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let _ = writeln!(
            out,
            "\nOrdinals are as each process saw them (after `CUDA_VISIBLE_DEVICES`); processes that list the same ordinal are taken to share the device."
        );
    }
    if !procs.is_empty() {
        let _ = writeln!(
            out,
            "\n| pid | parent | rank / worker | program | trace file |\n| ---: | ---: | --- | --- | --- |"
        );
        for p in procs {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                p.pid,
                p.ppid,
                rank_of(&p.command).unwrap_or_default(),
                code(&cell(&program(p))),
                code(&cell(
                    std::path::Path::new(&p.file)
                        .file_name()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default()
                        .as_str()
                ))
            );
        }
        let _ = writeln!(out, "\nCommand lines:\n\n```text");
        for p in procs {
            let _ = writeln!(out, "{}: {}", p.pid, p.command.join(" "));
        }
        let _ = writeln!(out, "```\n");
    }
    let problems: Vec<(u32, &String)> = procs
        .iter()
        .flat_map(|p| p.problems.iter().map(move |x| (p.pid, x)))
        .collect();
    if !problems.is_empty() {
        let _ = writeln!(out, "Trace problems (the rest of each file was read):\n");
        for (pid, x) in problems {
            let _ = writeln!(out, "- pid {pid}: {x}");
        }
        let _ = writeln!(out);
    }
    tensor_capture_lines(out, procs);
}

/// Per process: whether PyTorch's tensors were recorded, the recorder's notes, and the time
/// ranges whose tensor detail the size budget dropped.
fn tensor_capture_lines(out: &mut String, procs: &[crate::summary::ProcessSummary]) {
    let mut lines = Vec::new();
    for p in procs {
        if let Some(c) = &p.tensor_capture {
            lines.push(format!("- pid {}: tensors {}", p.pid, c.status));
        }
        for l in &p.tensor_detail_lost {
            lines.push(format!(
                "- pid {}: tensor detail lost to the size budget from {} to {} ({} blocks dropped; driver events, failures and the live set kept)",
                p.pid,
                fmt_secs(l.from_s),
                fmt_secs(l.to_s),
                l.blocks
            ));
        }
        for n in &p.notes {
            lines.push(format!("- pid {}: note: {}", p.pid, n));
        }
    }
    if !lines.is_empty() {
        let _ = writeln!(out, "Tensor capture and the recorder's notes:\n");
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
        let _ = writeln!(out);
    }
}

fn how_to_read(out: &mut String, r: &Report) {
    let _ = writeln!(
        out,
        "## How to read this report\n\n- Bytes are what the CUDA driver was asked for (`cuMemAlloc*`, `cuMemCreate`, ...), recorded by vramtrace's preload; PyTorch's caching allocator asks for segments, so one allocation may hold many tensors.\n- Categories, as in `vramtrace live`: a name or label with `weight`, `embed`, `lm_head` or `param` is weights; `kv` or `cache` (or a label with `_state`, the recurrent state kept between chunks) is KV cache; `ballast`, `capacity` or `reserve` is other; any other name is activations; no name and no label is unnamed. Groups collapse the numbers that index layers and chunks to `#`.\n- Untraced = device total − the driver's free − the live bytes of every traced process on that device: CUDA contexts, loaded modules, and processes that were not traced.\n- Generated by `vramtrace report`."
    );
    if r.unsymbolised {
        let _ = writeln!(
            out,
            "- Some frames are addresses only: the files the traced processes loaded are not on the machine this report was made on (or their build ids differ). Run `vramtrace report` where the program ran to name them."
        );
    }
}
