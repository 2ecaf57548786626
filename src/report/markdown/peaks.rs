//! Every peak, with its live set and the headroom over time.

use super::*;

pub(super) fn peaks(out: &mut String, r: &Report, images: &Images) {
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

pub(super) fn peak(out: &mut String, r: &Report, p: &PeakReport) {
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

pub(super) fn headroom(out: &mut String, r: &Report, p: &PeakReport) {
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
