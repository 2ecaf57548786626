//! The NVML panel: what the driver says is used, beside what the trace saw.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Widget, Wrap};

use crate::model::NvmlPanel;
use crate::tui::app::App;
use crate::tui::theme;
use crate::units::format_bytes;

/// Draws the NVML panel of the selected device into `area`.
pub fn render(app: &App, area: Rect, buf: &mut Buffer) {
    let block = Block::bordered().title(Span::styled(" NVML ", theme::TITLE));
    let device = app.device();
    // NVML reads the present, so compare with the newest traced bytes, not the cursor's.
    let traced = device.and_then(|d| d.timeline.points().last().map(|p| p.live_bytes));
    let row = |name: &str, value: String, style| {
        Line::from(vec![
            Span::raw(format!("{name:<10}")),
            Span::styled(format!("{value:>11}"), style),
        ])
    };
    let traced_row = row(
        "traced",
        traced.map(format_bytes).unwrap_or_else(|| "–".into()),
        theme::LIVE,
    );
    let lines = match device.and_then(|d| d.nvml.as_ref()) {
        None => vec![Line::styled("no NVML reading yet", theme::DIM), traced_row],
        Some(NvmlPanel::Unavailable(reason)) => vec![
            Line::styled("NVML unavailable:", theme::FAILURE),
            Line::raw(reason.clone()),
            Line::styled("untraced memory unknown", theme::DIM),
            traced_row,
        ],
        Some(NvmlPanel::Available {
            used_bytes,
            total_bytes,
            processes,
        }) => {
            let mut lines = vec![
                row("used", format_bytes(*used_bytes), theme::TEXT),
                row("total", format_bytes(*total_bytes), theme::DIM),
                traced_row,
            ];
            // NVML reads the present: once the traced processes are gone it has no figure of
            // theirs, and used − traced would be negative.
            let listed = |pid: u32| processes.iter().any(|n| n.pid == pid);
            let in_nvml = match app.process() {
                Some(p) => listed(p.pid),
                None => app.processes().iter().any(|p| listed(p.pid)),
            };
            if app.all_exited() {
                lines.push(Line::styled(
                    "untraced: no figure, the traced process exited",
                    theme::DIM,
                ));
            } else if let Some(traced) = traced {
                let untraced = *used_bytes as i128 - traced as i128;
                let why = if !in_nvml && !app.processes().is_empty() {
                    Some("untraced: no figure, NVML does not list the traced process")
                } else if untraced < 0 {
                    Some("untraced: no figure, NVML's reading is older than the trace")
                } else {
                    None
                };
                match why {
                    None => lines.push(row("untraced", format_bytes(untraced as u64), theme::PEAK)),
                    Some(why) => lines.push(Line::styled(why, theme::DIM)),
                }
            }
            let selected = app.process().map(|p| p.pid);
            for p in processes {
                let style = if selected == Some(p.pid) {
                    theme::SELECTED
                } else {
                    theme::TEXT
                };
                lines.push(Line::styled(
                    format!(
                        "{:<10}{:>11}",
                        format!("pid {}", p.pid),
                        format_bytes(p.used_bytes)
                    ),
                    style,
                ));
            }
            lines
        }
    };
    Paragraph::new(lines)
        .wrap(Wrap { trim: true })
        .block(block)
        .render(area, buf);
}
