//! The largest live allocations at the cursor's time.

use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, StatefulWidget, Table, TableState, Widget};

use crate::tui::app::App;
use crate::tui::header::shorten;
use crate::tui::theme;
use crate::units::{format_bytes, format_seconds};

/// Draws the table into `area`.
pub fn render(app: &App, area: Rect, buf: &mut Buffer) {
    let scope = match app.process() {
        Some(p) => format!("pid {}", p.pid),
        None => "all processes".to_string(),
    };
    let device = app
        .device()
        .map_or(String::new(), |d| format!("cuda:{}, ", d.info.ordinal));
    let title = format!(
        " Largest live at {} ({device}{scope}) ",
        format_seconds(app.cursor_time())
    );
    let block = Block::bordered().title(Span::styled(title, theme::TITLE));
    let rows = app.visible_largest();
    if rows.is_empty() {
        let text = match app.snapshot() {
            None => "no snapshot from the trace yet".to_string(),
            Some(_) if !app.filter().is_empty() => {
                format!("nothing live matches the filter \"{}\"", app.filter())
            }
            Some(_) => "nothing live".to_string(),
        };
        Paragraph::new(Line::styled(text, theme::DIM))
            .alignment(Alignment::Center)
            .block(block)
            .render(area, buf);
        return;
    }
    let header = Row::new(["Size", "Name", "Function", "Age", "Top frame"]).style(theme::TITLE);
    // Tensors say their category beside the word (`tensor, engine buffers`).
    let function_width = rows
        .iter()
        .map(|a| a.driver_function.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(18, 24) as u16;
    let table_rows = rows.iter().map(|a| {
        let name = if a.name.is_empty() {
            "unnamed"
        } else {
            &a.name
        };
        Row::new([
            Cell::from(Line::from(format_bytes(a.size_bytes)).alignment(Alignment::Right)),
            Cell::from(shorten(name, 40)),
            Cell::from(a.driver_function.as_str()),
            Cell::from(Line::from(format_seconds(a.age_s)).alignment(Alignment::Right)),
            Cell::from(a.top_frame.as_str()),
        ])
    });
    let widths = [
        Constraint::Length(10),
        Constraint::Fill(1),
        Constraint::Length(function_width),
        Constraint::Length(9),
        Constraint::Fill(2),
    ];
    let table = Table::new(table_rows, widths)
        .header(header)
        .block(block)
        .row_highlight_style(theme::SELECTED)
        .highlight_symbol("▶ ");
    let mut state = TableState::default().with_selected(Some(app.selected_row()));
    StatefulWidget::render(table, area, buf, &mut state);
}
