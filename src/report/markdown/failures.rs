//! The failed allocations in full, PyTorch's out-of-memory message and the failed calls.

use super::*;

pub(super) fn failures(out: &mut String, r: &Report, images: &Images) {
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

pub(super) fn failure(out: &mut String, r: &Report, i: usize, f: &FailureReport) {
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

pub(super) fn failed_calls(out: &mut String, r: &Report) {
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
