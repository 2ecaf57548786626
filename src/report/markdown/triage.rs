//! The first screen for a failure (the verdict, the limit enforced and the shortfall, the
//! request that tipped it over, the step, where the bytes were, what to change) and the sections
//! the triage adds below: every category with its evidence, the whole-step model's residuals
//! and frontier, PyTorch's message rebuilt verbatim, the versions block.

use super::*;
use crate::report::model_view::FitsBasis;
use crate::report::triage::VerdictClass;

fn yes_no(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "yes",
        Some(false) => "no",
        None => "—",
    }
}

/// The first screen when an allocation failed; `false` when there is nothing to say this way
/// (no failure, or no triage).
pub(super) fn triage_top(out: &mut String, r: &Report) -> bool {
    if let (Some(t), None) = (&r.triage, r.first_failure())
        && t.peak.is_some()
    {
        peak_top(out, r, t);
        return true;
    }
    let (Some(t), Some(f)) = (&r.triage, r.first_failure()) else {
        return false;
    };
    if t.verdict.class == VerdictClass::None {
        return false;
    }
    let fl = &f.failure;
    let shortfall = t.shortfall.unwrap_or(0);
    let limit = t.limit.as_ref();
    let at = t
        .tipping
        .as_ref()
        .and_then(|x| x.line.as_deref().or(x.label.as_deref()))
        .map(|l| format!(" at {}", code(&cell(l))))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "**Verdict: {}** — {} on {} ran out of memory at {}: a request of **{}**{at} was refused, **short by {}** against {}.\n",
        t.verdict.class.title(),
        who(r, f.process),
        device_words(r, f.process, f.device),
        fmt_secs(fl.t_s),
        fmt_bytes(fl.size),
        fmt_bytes(shortfall),
        limit.map_or("the card".to_string(), |l| l.source.clone()),
    );
    for e in &t.verdict.evidence {
        let _ = writeln!(out, "- {e}");
    }
    if let Some(c) = &f.comparison {
        if let Some(what) = failed_tensor(c) {
            let _ = writeln!(out, "- the refused tensor, by the kernel model: {what}");
        }
        other_implementation_brief(out, c);
    }
    if r.failures.len() > 1 {
        let _ = writeln!(
            out,
            "- the first of {} failed allocations (all in [Failed allocations](#failed-allocations))",
            r.failures.len()
        );
    }
    let _ = writeln!(out, "\n| | |\n| --- | --- |");
    if let Some(l) = limit {
        let _ = writeln!(
            out,
            "| limit enforced | {} — {} |",
            both(l.bytes),
            cell(&l.source)
        );
    }
    let _ = writeln!(out, "| short by | **{}** |", both(shortfall));
    if let Some(v) = &t.vllm {
        let slack = if v.slack_bytes < 0 {
            format!("−{}", fmt_bytes(v.slack_bytes.unsigned_abs()))
        } else {
            fmt_bytes(v.slack_bytes as u64)
        };
        let _ = writeln!(
            out,
            "| vLLM's slack | card {} − outside the budget {} (context, other processes) − ⌈{} × total⌉ {} = **{slack}**: what a step may add over the peak vLLM profiled at start; lower `--gpu-memory-utilization` to widen it |",
            fmt_bytes(v.card_bytes),
            fmt_bytes(v.outside_bytes),
            v.utilization,
            fmt_bytes(v.budget_bytes),
        );
        let _ = writeln!(out, "| in vLLM's terms | {} |", cell(&v.why));
    }
    if let Some(x) = &t.tipping {
        let _ = writeln!(
            out,
            "| tipped over by | {}{}{} |",
            both(x.bytes),
            x.line
                .as_deref()
                .map(|l| format!(" at {}", code(&cell(l))))
                .unwrap_or_default(),
            x.label
                .as_deref()
                .map(|l| format!(" in {}", code(&cell(l))))
                .unwrap_or_default()
        );
    }
    match &t.step {
        Some(s) => {
            let _ = writeln!(
                out,
                "| step | chunk {} (counting from 0){}{} — {} |",
                s.chunk_index,
                s.chunk_tokens
                    .map(|c| format!(" of **{c} tokens**"))
                    .unwrap_or_default(),
                s.context_tokens
                    .map(|c| format!(", **{} tokens** held at its end", exact(c)))
                    .unwrap_or_default(),
                cell(&s.source)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "| step | the trace does not say which chunk failed (no chunk label, no loop in the tensors' Python lines) |"
            );
        }
    }
    match (&t.model, &t.model_error, &r.model) {
        (Some(m), _, _) => {
            let _ = writeln!(
                out,
                "| {} | the failing step **{}**: {} counted against {} ({}); the step before it {} |",
                m.engine.map_or("whole-step model".to_string(), |e| format!(
                    "{e}, {}",
                    m.fits_basis.unwrap_or(FitsBasis::Config).words()
                )),
                if m.failure_fits == Some(false) {
                    "does not fit"
                } else {
                    "fits (see the residuals: the trace holds what the model does not)"
                },
                fmt_bytes(m.counted),
                fmt_bytes(limit.map_or(0, |l| l.bytes)),
                if m.headroom < 0 {
                    format!("short by {}", fmt_bytes(m.headroom.unsigned_abs()))
                } else {
                    format!("{} to spare", fmt_bytes(m.headroom as u64))
                },
                match m.before_fits {
                    Some(true) => "fits",
                    Some(false) => "does not fit either",
                    None => "is not modelled",
                }
            );
            if let Some(w) = &t.model_warning {
                let _ = writeln!(
                    out,
                    "| **the config contradicts the trace** | {} |",
                    cell(w)
                );
            }
        }
        (None, Some(e), _) => {
            let _ = writeln!(out, "| whole-step model | not set beside it: {} |", cell(e));
        }
        (None, None, None) => {
            let _ = writeln!(
                out,
                "| whole-step model | pass `--model config.json` for the model's verdict, its frontier and the levers' ceilings |"
            );
        }
        _ => {}
    }
    let _ = writeln!(out);
    let inside = t.inside_limit;
    let in_limit = |c: &crate::report::triage::CategoryRow| match (c.category, inside) {
        ("other_process", Some(i)) => i.other_process,
        ("context", Some(i)) => i.context,
        _ => c.bytes,
    };
    // What the enforced limit counts (PyTorch's counts its own segments only). Unnamed bytes
    // are counted: in a PyTorch process they are tensors no rule names (torch-oom's cuBLAS
    // workspace is a block of PyTorch's reserve).
    let counts = |c: &crate::report::triage::CategoryRow| match (
        limit,
        vramtrace_models::Category::parse(c.category),
    ) {
        (Some(l), Some(m)) => m == vramtrace_models::Category::Unnamed || l.limit.counts(m),
        _ => true,
    };
    let title = |c: &crate::report::triage::CategoryRow| {
        crate::categoriser::Category::parse(c.category).map_or(c.category, |x| x.title())
    };
    let (counted, uncounted): (Vec<_>, Vec<_>) = t
        .categories
        .iter()
        .filter(|c| in_limit(c) > 0)
        .partition(|c| counts(c));
    if !counted.is_empty() {
        let total: u64 = counted.iter().map(|c| in_limit(c)).sum();
        let parts: Vec<String> = counted
            .iter()
            .map(|c| format!("{} {}", title(c), fmt_bytes(in_limit(c))))
            .collect();
        let mut besides: Vec<String> = uncounted
            .iter()
            .map(|c| format!("{} {}", title(c), fmt_bytes(in_limit(c))))
            .collect();
        let outside = inside.map_or(0, |i| i.outside);
        if outside > 0 {
            besides.push(format!(
                "the device's {} past the limit (a ballast, other tenants, the context before them)",
                fmt_bytes(outside)
            ));
        }
        let _ = writeln!(
            out,
            "**Where the {} the limit counts were** at {}: {}{}.\n",
            fmt_bytes(total),
            t.moment,
            parts.join(" · "),
            if besides.is_empty() {
                String::new()
            } else {
                format!("; not counted by it: {}", besides.join(", "))
            }
        );
    }
    if !t.levers.is_empty() {
        let _ = writeln!(
            out,
            "**What to change**{}:\n",
            match (&t.model, &r.model) {
                (Some(m), Some(mi)) => match m.engine {
                    Some(e) if m.fits_basis == Some(FitsBasis::TracedSegments) => format!(
                        " (each predicted from {}'s config by the planner of {e}, its allocator replayed from an empty cache: a run of its own places segments elsewhere, which on the default allocator moves a ceiling by a few chunks either way; the step above was judged with this run's segments)",
                        mi.cfg.display_name()
                    ),
                    Some(e) => format!(
                        " (each predicted from {}'s config by the planner of {e})",
                        mi.cfg.display_name()
                    ),
                    None => format!(
                        " (each predicted by the whole-step model of {} as run by {})",
                        mi.cfg.display_name(),
                        m.runtime.name()
                    ),
                },
                _ => String::new(),
            }
        );
        let _ = writeln!(
            out,
            "| change | the failing step fits | new ceiling |\n| --- | --- | --- |"
        );
        for l in &t.levers {
            let _ = writeln!(
                out,
                "| {}{} | {} | {} |",
                if l.change.starts_with("a ") || l.change.starts_with("contexts ") {
                    cell(&l.change)
                } else {
                    code(&cell(&l.change))
                },
                if l.feasible { "" } else { " (infeasible)" },
                yes_no(l.fits),
                cell(&l.ceiling)
            );
        }
        let _ = writeln!(out);
    }
    unreadable(out, r);
    true
}

/// The first screen when nothing failed: the peak, where its bytes were by category, and with
/// a model the whole-step model's peak beside the observed one, part by part, with the
/// frontier.
fn peak_top(out: &mut String, r: &Report, t: &crate::report::triage::Triage) {
    let Some(p) = &t.peak else { return };
    let process = r
        .summary
        .processes
        .iter()
        .position(|x| x.pid == p.pid)
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "**No allocation failed.** The highest peak: {} on {}, **{}** at {}{}; **{:.2}%** of it is in a named category{}.\n",
        who(r, process),
        device_words(r, process, p.device),
        both(p.bytes),
        fmt_secs(p.t_s),
        if p.tensor_bytes > 0 {
            format!(
                " (its moment with the most live PyTorch tensors, {})",
                fmt_bytes(p.tensor_bytes)
            )
        } else {
            String::new()
        },
        // A few unnamed bytes never read as 100.00%.
        if p.named_bytes < p.bytes {
            p.named_percent.min(99.99)
        } else {
            p.named_percent
        },
        if p.named_bytes < p.bytes {
            format!(", {} unnamed", fmt_bytes(p.bytes - p.named_bytes))
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "| where the peak's bytes were | bytes | share | what it rests on (largest first) |\n| --- | ---: | ---: | --- |"
    );
    let mut rows: Vec<_> = t.categories.iter().filter(|c| c.bytes > 0).collect();
    rows.sort_by_key(|c| std::cmp::Reverse(c.bytes));
    for c in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2}% | {}{} |",
            c.category,
            both(c.bytes),
            if p.bytes == 0 {
                0.0
            } else {
                100.0 * c.bytes as f64 / p.bytes as f64
            },
            cell(c.evidence.first().map_or("", String::as_str)),
            if c.evidence.len() > 1 {
                format!(" (and {} more)", c.evidence.len() - 1)
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(out);
    let (m, fit) = match (&t.model, &r.model) {
        (Some(m), _) => match &m.peak_fit {
            Some(fit) => (m, fit),
            None => return,
        },
        (None, Some(_)) => {
            if let Some(e) = &t.model_error {
                let _ = writeln!(
                    out,
                    "The whole-step model is not set beside the peak: {e}.\n"
                );
            }
            return;
        }
        (None, None) => {
            // Some byte of the moment was named from a frame in llama.cpp's library.
            let llama_cpp = t
                .categories
                .iter()
                .any(|c| c.evidence.iter().any(|e| e.contains(" in libllama")));
            let _ = writeln!(
                out,
                "{}\n",
                if llama_cpp {
                    "A llama.cpp run: its buffers are named above from llama.cpp's own frames. A model of llama.cpp's plan is not yet set beside the peak (a config.json does not describe a GGUF model)."
                } else {
                    "Pass `--model config.json` for the whole-step model's prediction of this peak, part by part, and the frontier."
                }
            );
            return;
        }
    };
    let name = r
        .model
        .as_ref()
        .map_or(String::new(), |mi| mi.cfg.display_name());
    let _ = writeln!(
        out,
        "**The whole-step model** of {name} as {} runs it predicts **{}** for this peak against **{}** observed: **{:+.2}%**{}. The step: {} tokens in one forward, TP {}{}.\n",
        m.runtime.name(),
        both(fit.predicted),
        both(fit.observed),
        fit.difference_percent,
        if fit.within_tolerance {
            format!(
                " (within {}%)",
                crate::report::triage::PEAK_TOLERANCE_PERCENT
            )
        } else {
            format!(
                " — more than {}% off; the parts that differ are below",
                crate::report::triage::PEAK_TOLERANCE_PERCENT
            )
        },
        m.shape.chunk_tokens,
        m.shape.tp,
        t.step
            .as_ref()
            .map(|s| format!(" ({})", s.source))
            .unwrap_or_default()
    );
    if let Some(w) = &t.model_warning {
        let _ = writeln!(out, "**The config contradicts the trace**: {w}.\n");
    }
    let _ = writeln!(
        out,
        "{:.1}% of the predicted bytes were copied from this trace (the parts marked given), and agree with it by construction; over the parts predicted from the config alone the model is **{}**.\n",
        m.copied_percent,
        fit.predicted_parts_difference_percent.map_or(
            "not comparable (every part was given)".to_string(),
            |d| format!("{d:+.2}%")
        )
    );
    let _ = writeln!(
        out,
        "| part | predicted | observed | predicted − observed | likely cause |\n| --- | ---: | ---: | ---: | --- |"
    );
    for p in &m.residuals.parts {
        let given = matches!(p.category, vramtrace_models::Category::KvCache)
            && m.known.kv_pool.is_some()
            || match p.category {
                vramtrace_models::Category::EngineBuffers => m.known.engine_buffers.is_some(),
                vramtrace_models::Category::CudaGraphs => m.known.cuda_graphs.is_some(),
                vramtrace_models::Category::Communication => m.known.communication.is_some(),
                vramtrace_models::Category::Autotune => m.known.autotune.is_some(),
                vramtrace_models::Category::AllocatorReserve => m.known.allocator_reserve.is_some(),
                vramtrace_models::Category::Context => m.known.context.is_some(),
                vramtrace_models::Category::OtherProcess => m.known.other_process.is_some(),
                _ => false,
            };
        let _ = writeln!(
            out,
            "| {}{} | {} | {} | {} | {} |",
            p.category.key(),
            if given { " (given from the trace)" } else { "" },
            p.predicted.map(both).unwrap_or_else(|| "—".into()),
            both(p.observed),
            signed(i128::from(p.residual)),
            cell(&p.likely_cause)
        );
    }
    let _ = writeln!(
        out,
        "| **total** | **{}** | **{}** | **{}** ({:+.2}%) | |\n",
        both(fit.predicted),
        both(fit.observed),
        signed(i128::from(m.residuals.total_residual)),
        fit.difference_percent
    );
    for n in &fit.notes {
        let _ = writeln!(out, "- {n}");
    }
    for d in &fit.differs {
        let _ = writeln!(out, "- differs: {d}");
    }
    let cf = &m.context_frontier;
    let kf = &m.chunk_frontier;
    let _ = writeln!(
        out,
        "- the frontier (the largest context, or chunk, whose step still fits) on {} ({}): at a chunk of {} tokens, {}{}{}.\n",
        fmt_bytes(cf.limit_bytes),
        match r.capacity {
            Some((_, true)) => "given with --capacity",
            _ => "the device's total; pass --capacity for another card",
        },
        cf.chunk_tokens,
        match cf.largest_context {
            Some(l) => format!(
                "contexts up to **{}** tokens fit{}",
                exact(l),
                if cf.capped { " (the search's cap)" } else { "" }
            ),
            None => "**no context fits**: the weights and the parts given from the trace (the engine's pool and buffers, the reserve, the context) already take more than that".to_string(),
        },
        match kf.largest_chunk {
            Some(c) if c >= kf.context_tokens => String::new(),
            Some(c) => format!(
                "; at the step's context of {} tokens, chunks up to **{}** tokens",
                exact(kf.context_tokens),
                exact(c)
            ),
            None => format!(
                "; at the step's context of {} tokens, no chunk fits",
                exact(kf.context_tokens)
            ),
        },
        if cf.limited_by_pool {
            "; the context is bounded by the KV pool"
        } else {
            ""
        }
    );
    unreadable(out, r);
}

/// The sections the triage adds below the first screen.
pub(super) fn triage_sections(out: &mut String, r: &Report) {
    let Some(t) = &r.triage else {
        if let Some(e) = &r.triage_error {
            let _ = writeln!(out, "## Categories\n\nNot computed: {}\n", cell(e));
        }
        return;
    };
    if !t.categories.is_empty() {
        let _ = writeln!(
            out,
            "## Every byte in a category, at {}\n\n| category | bytes | what it rests on |\n| --- | ---: | --- |",
            t.moment
        );
        for c in &t.categories {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                c.category,
                both(c.bytes),
                cell(&c.evidence.join("; "))
            );
        }
        let _ = writeln!(out);
        if let Some(b) = &t.breakdown
            && !b.segments.is_empty()
        {
            let s = &b.segments[0];
            let _ = writeln!(
                out,
                "The caching allocator's reserve: {} in {} segments; the segment with the most, {} at {:#x}, holds {} of tensors, its largest free block {}.\n",
                both(b.bytes(crate::categoriser::Category::AllocatorReserve)),
                b.segments.len(),
                fmt_bytes(s.size),
                s.base,
                fmt_bytes(s.tensor_bytes),
                fmt_bytes(s.largest_free_block)
            );
        }
    }
    if let Some(m) = &t.model
        && m.peak_fit.is_none()
    {
        match m.engine {
            Some(e) => {
                let _ = writeln!(
                    out,
                    "## The engine's planner beside the failing step\n\nA step of {} new tokens with {} tokens held, as {e} runs it{}: every tensor of every chunk's forward replayed through PyTorch's caching allocator under the limit, from the config alone (every part predicted, none copied from this trace).\n",
                    m.shape.chunk_tokens,
                    exact(m.shape.context_tokens),
                    m.planner.map_or(String::new(), |s| format!(
                        " with {} attention and {} (as the trace shows the program ran)",
                        s.attn_implementation.name(),
                        if s.expandable_segments {
                            "expandable segments"
                        } else {
                            "the default allocator"
                        }
                    )),
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "## The whole-step model beside the failing step\n\nA step of {} new tokens with {} tokens held, batch {}, TP {}, modelled as {} runs it; the parts a config cannot give were given from the trace: {} ({:.1}% of the predicted bytes copied from this trace).\n",
                    m.shape.chunk_tokens,
                    exact(m.shape.context_tokens),
                    m.shape.batch,
                    m.shape.tp,
                    m.runtime.name(),
                    known_words(&m.known),
                    m.copied_percent
                );
            }
        }
        let _ = writeln!(
            out,
            "| category | predicted | observed | predicted − observed | likely cause |\n| --- | ---: | ---: | ---: | --- |"
        );
        for p in &m.residuals.parts {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                p.category.key(),
                p.predicted.map(both).unwrap_or_else(|| "—".into()),
                both(p.observed),
                signed(i128::from(p.residual)),
                cell(&p.likely_cause)
            );
        }
        let _ = writeln!(
            out,
            "| total | {} | {} | {} | the failed request is counted in the observed activations |\n",
            both(m.residuals.predicted_total),
            both(m.residuals.observed_total),
            signed(i128::from(m.residuals.total_residual))
        );
        let cf = &m.context_frontier;
        let kf = &m.chunk_frontier;
        let _ = writeln!(
            out,
            "The frontier (the largest context, or chunk, whose step still fits) against {}: at a chunk of {} tokens, contexts up to **{}** fit{}; at the failing context of {} tokens, {} ({}).\n",
            fmt_bytes(cf.limit_bytes),
            cf.chunk_tokens,
            cf.largest_context
                .map(exact)
                .unwrap_or_else(|| "none".into()),
            if cf.capped { " (the search's cap)" } else { "" },
            exact(kf.context_tokens),
            match kf.largest_chunk {
                Some(c) => format!("the largest chunk that fits is **{c}** tokens"),
                None => format!("no chunk fits: the floor counts {}", fmt_bytes(kf.at_floor)),
            },
            kf.floor.why
        );
    }
    if let Some(msg) = &t.pytorch_message {
        let _ = writeln!(
            out,
            "## PyTorch's message, rebuilt from the trace\n\nWhat PyTorch printed, rebuilt from the numbers its allocator reported at the refusal (\"this process has\" is total − free − the other traced processes; PyTorch reads NVML):\n\n```text\ntorch.OutOfMemoryError: {msg}\n```\n"
        );
    }
}

fn known_words(k: &vramtrace_models::KnownParts) -> String {
    let mut v = Vec::new();
    for (name, b) in [
        ("engine buffers", k.engine_buffers),
        ("CUDA graphs", k.cuda_graphs),
        ("communication", k.communication),
        ("autotuning", k.autotune),
        ("KV pool", k.kv_pool),
        ("allocator reserve", k.allocator_reserve),
        ("context", k.context),
        ("other processes", k.other_process),
    ] {
        if let Some(b) = b {
            v.push(format!("{name} {}", fmt_bytes(b)));
        }
    }
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// The versions `vramtrace run` gathered at start.
pub(super) fn versions(out: &mut String, r: &Report) {
    let _ = writeln!(out, "## Versions\n");
    if r.versions.is_empty() {
        let _ = writeln!(
            out,
            "Not recorded: the trace has no `versions.json` (`vramtrace run` writes it at start: torch, triton, fla, vLLM, transformers, the driver, CUDA, `PYTORCH_CUDA_ALLOC_CONF`, the command line).\n"
        );
        return;
    }
    let _ = writeln!(out, "```text");
    for (k, v) in &r.versions {
        let _ = writeln!(out, "{k}: {v}");
    }
    let _ = writeln!(out, "```\n");
}
