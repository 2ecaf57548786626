//! The timeline: live bytes of the selected device, with the peak, the
//! failures, the capacity and predicted lines and the cursor marked.

use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Constraint, Rect};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, LegendPosition, Paragraph, Widget};

use crate::tui::app::{App, Mode};
use crate::tui::theme;
use crate::units::{ByteUnit, format_bytes, format_seconds};

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
        * 1.1;
    let unit = ByteUnit::for_bytes(top);
    let y = |bytes: u64| bytes as f64 / unit.bytes();
    let y_top = top / unit.bytes();

    let live: Vec<(f64, f64)> = timeline
        .points()
        .iter()
        .map(|p| (p.time_s, y(p.live_bytes)))
        .collect();
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

    let mut datasets = vec![
        Dataset::default()
            .name("live")
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(theme::LIVE)
            .data(&live),
    ];
    if let (Some(line), Some(bytes)) = (&capacity, timeline.capacity_bytes()) {
        datasets.push(
            Dataset::default()
                .name(format!("capacity {}", format_bytes(bytes)))
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(theme::CAPACITY)
                .data(line),
        );
    }
    if let (Some(line), Some(bytes)) = (&predicted, timeline.predicted_peak_bytes()) {
        datasets.push(
            Dataset::default()
                .name(format!("predicted {}", format_bytes(bytes)))
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(theme::PREDICTED)
                .data(line),
        );
    }
    if app.mode() == Mode::Paused {
        datasets.push(
            Dataset::default()
                .name(format!("cursor {}", format_seconds(cursor)))
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(theme::CURSOR)
                .data(&cursor_line),
        );
    }
    if let Some(p) = peak {
        datasets.push(
            Dataset::default()
                .name(format!("peak {}", format_bytes(p.bytes)))
                .marker(Marker::Dot)
                .graph_type(GraphType::Scatter)
                .style(theme::PEAK)
                .data(&peak_point),
        );
    }
    if !failures.is_empty() {
        datasets.push(
            Dataset::default()
                .name(format!("failed ×{}", failures.len()))
                .marker(Marker::Block)
                .graph_type(GraphType::Scatter)
                .style(theme::FAILURE)
                .data(&failures),
        );
    }

    let x_labels = vec![
        Span::raw(format_seconds(start)),
        Span::raw(format_seconds((start + end) / 2.0)),
        Span::raw(format_seconds(end)),
    ];
    let y_labels = vec![
        Span::raw("0"),
        Span::raw(unit.format(top / 2.0, 1)),
        Span::raw(unit.format(top, 1)),
    ];
    Chart::new(datasets)
        .block(block)
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
        .legend_position(Some(LegendPosition::TopLeft))
        .hidden_legend_constraints((Constraint::Percentage(60), Constraint::Percentage(70)))
        .render(area, buf);
}
