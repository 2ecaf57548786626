//! The header: processes, devices, the peak so far and the failures so far.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

use crate::model::FailedAllocation;
use crate::tui::app::App;
use crate::tui::theme;
use crate::units::{format_bytes, format_seconds};

/// Failures listed under the header (the newest).
const LISTED_FAILURES: usize = 3;

/// Lines the header needs: three, plus the listed failures and a line
/// counting earlier ones when there are more.
pub fn height(app: &App) -> u16 {
    let total = app.failures_total() as usize;
    let extra = if total > LISTED_FAILURES { 1 } else { 0 };
    (3 + total.min(LISTED_FAILURES) + extra) as u16
}

/// Draws the header into `area`.
pub fn render(app: &App, area: Rect, buf: &mut Buffer) {
    let mut lines = vec![processes_line(app), devices_line(app), peak_line(app)];
    let mut failures: Vec<&FailedAllocation> = app.all_failures().collect();
    failures.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
    let total = app.failures_total() as usize;
    if total > LISTED_FAILURES {
        lines.push(Line::styled(
            format!("  … {} earlier failures", total - LISTED_FAILURES),
            theme::DIM,
        ));
    }
    let start = failures.len().saturating_sub(LISTED_FAILURES);
    for (i, f) in failures[start..].iter().enumerate() {
        let newest = start + i + 1 == failures.len();
        let style = if newest && app.flashing() {
            theme::FLASH
        } else {
            theme::FAILURE
        };
        lines.push(Line::from(vec![
            Span::raw("  "),
            Span::styled(failure_text(f), style),
        ]));
    }
    Paragraph::new(lines).render(area, buf);
}

fn failure_text(f: &FailedAllocation) -> String {
    let free = f
        .free_bytes
        .map(|b| format!(", {} free", format_bytes(b)))
        .unwrap_or_default();
    let label = if f.label.is_empty() {
        "unnamed"
    } else {
        &f.label
    };
    format!(
        "✗ {} cuda:{} pid {} {}: {} requested{}, {}",
        format_seconds(f.time_s),
        f.device,
        f.pid,
        label,
        format_bytes(f.request_bytes),
        free,
        f.error
    )
}

fn label(text: &str) -> Span<'static> {
    Span::styled(format!("{text:<11}"), theme::TITLE)
}

fn processes_line(app: &App) -> Line<'static> {
    let mut spans = vec![label("Processes")];
    if app.processes().is_empty() {
        spans.push(Span::styled("none yet", theme::DIM));
        return Line::from(spans);
    }
    let selected = app.process().map(|p| p.pid);
    let all_style = if selected.is_none() {
        theme::SELECTED
    } else {
        theme::TEXT
    };
    spans.push(Span::styled("all", all_style));
    for p in app.processes() {
        spans.push(Span::styled(" · ", theme::DIM));
        let style = if selected == Some(p.pid) {
            theme::SELECTED
        } else {
            theme::TEXT
        };
        spans.push(Span::styled(
            format!("{} {}", p.pid, shorten(&p.command, 40)),
            style,
        ));
        if app.exited(p.pid) {
            spans.push(Span::styled(" (exited)", theme::DIM));
        }
    }
    Line::from(spans)
}

fn devices_line(app: &App) -> Line<'static> {
    let mut spans = vec![label("Devices")];
    if app.devices().is_empty() {
        spans.push(Span::styled(
            "none yet: waiting for the first trace",
            theme::DIM,
        ));
        return Line::from(spans);
    }
    let selected = app.device().map(|d| d.info.ordinal);
    for (i, d) in app.devices().iter().enumerate() {
        if i > 0 {
            spans.push(Span::styled(" · ", theme::DIM));
        }
        let mut text = format!("cuda:{}", d.info.ordinal);
        if !d.info.name.is_empty() {
            text.push(' ');
            text.push_str(&d.info.name);
        }
        if d.info.total_bytes > 0 {
            text.push_str(&format!(" ({})", format_bytes(d.info.total_bytes)));
        }
        let style = if selected == Some(d.info.ordinal) {
            theme::SELECTED
        } else {
            theme::TEXT
        };
        spans.push(Span::styled(text, style));
    }
    Line::from(spans)
}

fn peak_line(app: &App) -> Line<'static> {
    let mut spans = vec![label("Peak")];
    match app
        .device()
        .and_then(|d| Some((d.info.ordinal, d.timeline.peak()?)))
    {
        Some((ordinal, peak)) => {
            spans.push(Span::styled(format_bytes(peak.bytes), theme::PEAK));
            spans.push(Span::raw(format!(
                " at {} on cuda:{ordinal}",
                format_seconds(peak.time_s)
            )));
        }
        None => spans.push(Span::styled("no samples yet", theme::DIM)),
    }
    spans.push(Span::styled("   Failures ", theme::TITLE));
    let total = app.failures_total();
    let style = match (total, app.flashing()) {
        (0, _) => theme::TEXT,
        (_, true) => theme::FLASH,
        (_, false) => theme::FAILURE,
    };
    spans.push(Span::styled(total.to_string(), style));
    Line::from(spans)
}

/// `text` cut to `max` characters with an ellipsis.
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}
