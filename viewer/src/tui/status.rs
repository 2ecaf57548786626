//! The status bar: mode, cursor, step, filter, the newest notice, key hints.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

use crate::tui::app::{App, Mode, Overlay};
use crate::tui::theme;
use crate::units::format_seconds;

/// Draws the status line into `area`.
pub fn render(app: &App, area: Rect, buf: &mut Buffer) {
    let mut spans = match app.mode() {
        Mode::Follow => vec![Span::styled(" FOLLOW ", theme::FOLLOW)],
        Mode::Paused => vec![Span::styled(" PAUSED ", theme::PAUSED)],
    };
    spans.push(Span::raw(format!(
        " t={} step {} ",
        format_seconds(app.cursor_time()),
        format_seconds(app.step_s())
    )));
    if *app.overlay() == Overlay::FilterInput {
        spans.push(Span::styled(format!("/{}▏", app.filter()), theme::SELECTED));
        spans.push(Span::styled(" Enter keeps, Esc clears ", theme::DIM));
    } else if !app.filter().is_empty() {
        spans.push(Span::styled(
            format!("filter \"{}\" ", app.filter()),
            theme::PREDICTED,
        ));
    }
    spans.push(Span::styled(
        format!("t:{}  ? help  q quit ", app.table().name()),
        theme::DIM,
    ));
    if !app.options().title.is_empty() {
        spans.push(Span::raw(format!("│ {} ", app.options().title)));
    }
    if let Some(notice) = app.notice() {
        spans.push(Span::styled(format!("│ {notice}"), theme::PREDICTED));
    }
    Paragraph::new(Line::from(spans)).render(area, buf);
}
