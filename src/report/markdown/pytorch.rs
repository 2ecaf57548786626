//! PyTorch's out-of-memory message, rebuilt from the trace.

use super::*;

pub(super) fn pytorch_message(out: &mut String, r: &Report, f: &FailureReport) {
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
pub(super) fn pytorch_message_tensors(
    out: &mut String,
    r: &Report,
    f: &FailureReport,
    tm: &crate::torch_replay::TensorMoment,
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
