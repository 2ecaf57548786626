//! The timeline: live bytes of the selected device, with the peak, the
//! failures, the capacity and predicted lines and the cursor marked.

use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Rect};
use ratatui::style::Style;
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph, Widget};

use crate::tui::app::{App, Mode};
use crate::tui::theme;
use crate::units::{ByteUnit, format_bytes, format_seconds, nice_ceil};
use vramtrace_view_model::RESERVE_CATEGORY as RESERVE;

/// Draws the selected device's timeline into `area`.
pub fn render(app: &App, area: Rect, buf: &mut Buffer) {
    let title = match app.device() {
        Some(d) => format!(" Live bytes, cuda:{} ", d.info.ordinal),
        None => " Live bytes ".to_string(),
    };
    let block = Block::bordered().title(Span::styled(title, theme::TITLE));
    let Some((device, (start, end))) = app
        .device()
        .and_then(|d| Some((d, d.timeline.time_range()?)))
    else {
        Paragraph::new(Line::styled("no samples yet", theme::DIM))
            .alignment(Alignment::Center)
            .block(block)
            .render(area, buf);
        return;
    };
    let timeline = &device.timeline;
    let end = if end > start { end } else { start + 1.0 };
    let peak = timeline.peak();
    let top = [
        peak.map(|p| p.bytes),
        timeline.capacity_bytes(),
        timeline.predicted_peak_bytes(),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(0)
    .max(1) as f64
        * 1.05;
    let unit = ByteUnit::for_bytes(top);
    let y = |bytes: u64| bytes as f64 / unit.bytes();
    // Round the axis up so its three labels are round numbers.
    let y_top = 2.0 * nice_ceil(top / unit.bytes() / 2.0);

    let live: Vec<(f64, f64)> = timeline
        .points()
        .iter()
        .map(|p| (p.time_s, y(p.live_bytes)))
        .collect();
    // The allocator's reserve as its own band: the bytes in use drawn under the live line
    // (segments cached by PyTorch hold their bytes while the tensors in them come and go).
    let reserve = timeline.categories().iter().position(|c| c == RESERVE);
    let in_use: Vec<(f64, f64)> = match reserve {
        Some(r)
            if timeline
                .points()
                .iter()
                .any(|p| p.by_category.get(r).is_some_and(|b| *b > 0)) =>
        {
            timeline
                .points()
                .iter()
                .map(|p| {
                    let held = p.by_category.get(r).copied().unwrap_or(0);
                    (p.time_s, y(p.live_bytes.saturating_sub(held)))
                })
                .collect()
        }
        _ => Vec::new(),
    };
    let hline = |bytes: u64| vec![(start, y(bytes)), (end, y(bytes))];
    let capacity = timeline.capacity_bytes().map(hline);
    let predicted = timeline.predicted_peak_bytes().map(hline);
    let peak_point: Vec<(f64, f64)> = peak.iter().map(|p| (p.time_s, y(p.bytes))).collect();
    let failures: Vec<(f64, f64)> = app
        .visible_failures()
        .map(|f| (f.time_s, timeline.live_at(f.time_s).map_or(0.0, y)))
        .collect();
    let cursor = app.cursor_time();
    let cursor_line = vec![(cursor, 0.0), (cursor, y_top)];

    let line = |data, style| {
        Dataset::default()
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(style)
            .data(data)
    };
    let mut datasets = vec![line(&live, theme::LIVE)];
    let mut items = vec![("━", theme::LIVE, "live".to_string())];
    if !in_use.is_empty() {
        datasets.push(line(&in_use, theme::IN_USE));
        items.push(("━", theme::IN_USE, "in use (reserve between)".to_string()));
    }
    if let (Some(data), Some(bytes)) = (&capacity, timeline.capacity_bytes()) {
        datasets.push(line(data, theme::CAPACITY));
        items.push((
            "━",
            theme::CAPACITY,
            format!("capacity {}", format_bytes(bytes)),
        ));
    }
    if let (Some(data), Some(bytes)) = (&predicted, timeline.predicted_peak_bytes()) {
        datasets.push(line(data, theme::PREDICTED));
        items.push((
            "━",
            theme::PREDICTED,
            format!("predicted {}", format_bytes(bytes)),
        ));
    }
    if app.mode() == Mode::Paused {
        // The status bar says the cursor's time; the legend has no room to spare.
        datasets.push(line(&cursor_line, theme::CURSOR));
    }
    if let Some(p) = peak {
        datasets.push(
            Dataset::default()
                .marker(Marker::Dot)
                .graph_type(GraphType::Scatter)
                .style(theme::PEAK)
                .data(&peak_point),
        );
        items.push(("•", theme::PEAK, format!("peak {}", format_bytes(p.bytes))));
    }
    if !failures.is_empty() {
        datasets.push(
            Dataset::default()
                .marker(Marker::Block)
                .graph_type(GraphType::Scatter)
                .style(theme::FAILURE)
                .data(&failures),
        );
        items.push(("█", theme::FAILURE, format!("failed ×{}", failures.len())));
    }

    let x_labels = vec![
        Span::raw(format_seconds(start)),
        Span::raw(format_seconds((start + end) / 2.0)),
        Span::raw(format_seconds(end)),
    ];
    let label = |v: f64| Span::raw(format!("{} {}", trim_number(v), unit.symbol()));
    let y_labels = vec![Span::raw("0"), label(y_top / 2.0), label(y_top)];
    Chart::new(datasets)
        .block(block.title_bottom(legend(&items)))
        .x_axis(
            Axis::default()
                .bounds([start, end])
                .labels(x_labels)
                .style(theme::DIM),
        )
        .y_axis(
            Axis::default()
                .bounds([0.0, y_top])
                .labels(y_labels)
                .style(theme::DIM),
        )
        .legend_position(None)
        .render(area, buf);
}

/// The legend as a line of marks in the datasets' colours, for the block's
/// bottom edge (ratatui's legend box would cover the curve in a small panel).
fn legend(items: &[(&'static str, Style, String)]) -> Line<'static> {
    let mut spans = vec![Span::raw(" ")];
    for (mark, style, text) in items {
        spans.push(Span::styled(*mark, *style));
        spans.push(Span::raw(format!(" {text}  ")));
    }
    Line::from(spans)
}

/// `v` with at most one decimal and no trailing `.0`.
fn trim_number(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}
