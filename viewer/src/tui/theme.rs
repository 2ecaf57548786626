//! The live view's one set of styles.

use ratatui::style::{Color, Modifier, Style};

/// Panel titles and labels.
pub const TITLE: Style = Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD);
/// Plain text.
pub const TEXT: Style = Style::new();
/// Secondary text: units, hints.
pub const DIM: Style = Style::new().fg(Color::DarkGray);
/// The selected device, process or row.
pub const SELECTED: Style = Style::new().fg(Color::Black).bg(Color::Cyan);
/// The live-bytes curve.
pub const LIVE: Style = Style::new().fg(Color::Green);
/// Bytes in use (live less the allocator's reserve).
pub const IN_USE: Style = Style::new().fg(Color::Blue);
/// The peak marker and value.
pub const PEAK: Style = Style::new().fg(Color::Magenta).add_modifier(Modifier::BOLD);
/// Failed allocations.
pub const FAILURE: Style = Style::new().fg(Color::Red).add_modifier(Modifier::BOLD);
/// A failure that just arrived.
pub const FLASH: Style = Style::new()
    .fg(Color::White)
    .bg(Color::Red)
    .add_modifier(Modifier::BOLD);
/// The capacity line.
pub const CAPACITY: Style = Style::new().fg(Color::Red);
/// The predicted peak line.
pub const PREDICTED: Style = Style::new().fg(Color::Yellow);
/// The time cursor.
pub const CURSOR: Style = Style::new().fg(Color::White);
/// Paused-mode indicator.
pub const PAUSED: Style = Style::new()
    .fg(Color::Black)
    .bg(Color::Yellow)
    .add_modifier(Modifier::BOLD);
/// Follow-mode indicator.
pub const FOLLOW: Style = Style::new()
    .fg(Color::Black)
    .bg(Color::Green)
    .add_modifier(Modifier::BOLD);

/// Colours of breakdown segments, in order.
pub const SEGMENT_COLORS: [Color; 6] = [
    Color::Blue,
    Color::Magenta,
    Color::Green,
    Color::Yellow,
    Color::Cyan,
    Color::Gray,
];

/// Glyphs of breakdown segments, in order, so the bar reads without colour too.
pub const SEGMENT_GLYPHS: [&str; 4] = ["█", "▓", "▒", "░"];
