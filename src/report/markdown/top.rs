//! The first screen: what failed, where, why, what to change, and the section that says what to do.

use super::*;

/// The first screen.
pub(super) fn top(out: &mut String, r: &Report) {
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
                    rows_line(r).unwrap_or_else(|| categories_line(&p.live))
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
    match (rows_line(r), r.categories()) {
        (Some(rows), Some((_, _, c))) => {
            let _ = writeln!(
                out,
                "- **Why**: this process held **{}** in {} allocations; the device's used memory, {}, holds {rows} (see What the memory holds).",
                fmt_bytes(fl.live_bytes),
                fl.live_count,
                fmt_bytes(c.breakdown.total),
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "- **Why**: this process held **{}** in {} allocations: {}{untraced}.",
                fmt_bytes(fl.live_bytes),
                fl.live_count,
                categories_line(&f.live)
            );
        }
    }
    levers_brief(out, r);
    unreadable(out, r);
}

/// The first screen's line when the frames show that the program ran other code than the
/// model's variant.
pub(super) fn other_implementation_brief(out: &mut String, c: &Comparison) {
    if let Some(n) = &c.attribution.evidence.other_implementation {
        let _ = writeln!(out, "- **Model**: {n} (see the model table below).");
    }
}

pub(super) fn unreadable(out: &mut String, r: &Report) {
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
pub(super) fn levers_brief(out: &mut String, r: &Report) {
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
                "  - the cliff: a prefill chunk of **{c} tokens** or more does not fit ({} resident); the chunk modelled (`--tokens`) is {}: keep `--max-num-batched-tokens` at **{}** or below.",
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

pub(super) fn what_to_do(out: &mut String, r: &Report, images: &Images) {
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
                "| prefill chunk (`--max-num-batched-tokens`) | the cliff: **{c} tokens** (the first chunk whose kernel peak exceeds capacity − resident = {}) | a chunk of {} tokens fits; the chunk modelled (`--tokens`) is {} |",
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
