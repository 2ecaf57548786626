//! The stack overlay: the full symbolised stack of one allocation.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Widget};

use crate::model::LiveAllocation;
use crate::tui::theme;
use crate::units::{format_bytes, format_seconds};

/// Draws the stack of `allocation` in a box over most of `area`.
pub fn render(allocation: &LiveAllocation, area: Rect, buf: &mut Buffer) {
    let rect = area.centered(Constraint::Percentage(90), Constraint::Percentage(80));
    let name = if allocation.name.is_empty() {
        "unnamed"
    } else {
        &allocation.name
    };
    let title = format!(
        " {name}: {} by {}, live {} ",
        format_bytes(allocation.size_bytes),
        allocation.driver_function,
        format_seconds(allocation.age_s)
    );
    let mut lines: Vec<Line> = allocation
        .stack
        .iter()
        .enumerate()
        .map(|(i, frame)| {
            Line::from(vec![
                Span::styled(format!("#{i:<3}"), theme::DIM),
                Span::raw(frame.as_str()),
            ])
        })
        .collect();
    if lines.is_empty() {
        lines.push(Line::styled(
            "no stack was recorded for this allocation",
            theme::DIM,
        ));
    }
    Clear.render(rect, buf);
    Paragraph::new(lines)
        .block(
            Block::bordered()
                .title(Span::styled(title, theme::TITLE))
                .title_bottom(Span::styled(" Esc closes ", theme::DIM)),
        )
        .render(rect, buf);
}
