//! The help overlay: every key of the live view.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Widget};

use crate::tui::theme;

/// The keys and what they do, as the overlay lists them.
pub const KEYS: [(&str, &str); 16] = [
    ("space", "pause / follow the newest data"),
    ("f, End", "follow"),
    ("← →", "scrub back / forward one step"),
    ("[ ]", "halve / double the step"),
    ("Home", "go to the start"),
    ("p", "jump to the peak of bytes in use"),
    ("n", "jump to the next failure"),
    ("d", "next device"),
    ("Tab", "next process (then all)"),
    ("↑ ↓, k j", "select an allocation"),
    ("Enter", "show its full stack"),
    ("t", "table: largest / lines / model / tensors / growth"),
    ("/", "filter by label (Esc clears)"),
    ("?, h", "this help"),
    ("Esc", "close / clear the filter"),
    ("q", "quit"),
];

/// Draws the help box centred in `area`.
pub fn render(area: Rect, buf: &mut Buffer) {
    let height = KEYS.len() as u16 + 2;
    let width = 54;
    let rect = area.centered(Constraint::Length(width), Constraint::Length(height));
    let lines: Vec<Line> = KEYS
        .iter()
        .map(|(key, what)| {
            Line::from(vec![
                Span::styled(format!(" {key:<10}"), theme::TITLE),
                Span::raw(*what),
            ])
        })
        .collect();
    Clear.render(rect, buf);
    Paragraph::new(lines)
        .block(Block::bordered().title(Span::styled(" Keys ", theme::TITLE)))
        .render(rect, buf);
}
