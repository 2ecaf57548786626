//! The breakdown bar: live bytes at the cursor by label or category.

use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Widget, Wrap};

use crate::model::BreakdownEntry;
use crate::tui::app::App;
use crate::tui::theme;
use crate::units::{format_bytes, format_seconds};

/// Draws the bar and its legend into `area`.
pub fn render(app: &App, area: Rect, buf: &mut Buffer) {
    let title = format!(" Live by label at {} ", format_seconds(app.cursor_time()));
    let block = Block::bordered().title(Span::styled(title, theme::TITLE));
    let entries: Vec<&BreakdownEntry> = app
        .snapshot()
        .iter()
        .flat_map(|s| &s.breakdown)
        .filter(|e| e.bytes > 0 && app.matches_filter(&e.label))
        .collect();
    let total: u64 = entries.iter().map(|e| e.bytes).sum();
    let inner = block.inner(area);
    if total == 0 || inner.width == 0 {
        Paragraph::new(Line::styled("nothing to break down yet", theme::DIM))
            .alignment(Alignment::Center)
            .block(block)
            .render(area, buf);
        return;
    }
    let widths = segment_widths(&entries, total, inner.width as usize);
    let style = |i: usize| {
        ratatui::style::Style::new().fg(theme::SEGMENT_COLORS[i % theme::SEGMENT_COLORS.len()])
    };
    let glyph = |i: usize| theme::SEGMENT_GLYPHS[i % theme::SEGMENT_GLYPHS.len()];
    let bar = Line::from(
        widths
            .iter()
            .enumerate()
            .map(|(i, &w)| Span::styled(glyph(i).repeat(w), style(i)))
            .collect::<Vec<_>>(),
    );
    let mut legend = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            legend.push(Span::raw("  "));
        }
        legend.push(Span::styled(glyph(i), style(i)));
        legend.push(Span::raw(format!(
            " {} {} {:.0}%",
            e.label,
            format_bytes(e.bytes),
            e.bytes as f64 * 100.0 / total as f64
        )));
    }
    Paragraph::new(vec![bar, Line::from(legend)])
        .wrap(Wrap { trim: false })
        .block(block)
        .render(area, buf);
}

/// Cell widths proportional to the entries' bytes, summing to `width`
/// (largest remainders get the leftover cells).
fn segment_widths(entries: &[&BreakdownEntry], total: u64, width: usize) -> Vec<usize> {
    let exact: Vec<f64> = entries
        .iter()
        .map(|e| e.bytes as f64 * width as f64 / total as f64)
        .collect();
    let mut widths: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    let left = width - widths.iter().sum::<usize>();
    for &i in order.iter().take(left) {
        widths[i] += 1;
    }
    widths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_fill_the_bar_in_proportion() {
        let e = |bytes| BreakdownEntry {
            label: String::new(),
            bytes,
        };
        let entries = [e(50), e(30), e(20)];
        let refs: Vec<&BreakdownEntry> = entries.iter().collect();
        assert_eq!(segment_widths(&refs, 100, 10), [5, 3, 2]);
        assert_eq!(segment_widths(&refs, 100, 7), [4, 2, 1]);
        assert_eq!(segment_widths(&refs, 100, 7).iter().sum::<usize>(), 7);
    }
}
