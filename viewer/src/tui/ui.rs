//! The whole screen: panels laid out, overlays on top.

use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Widget, Wrap};

use crate::tui::app::{App, Overlay, Table};
use crate::tui::{breakdown, chart, header, help, largest, nvml, stack, status, tables};

/// The smallest screen the panels are laid out on.
pub const MIN_WIDTH: u16 = 60;
/// See [`MIN_WIDTH`].
pub const MIN_HEIGHT: u16 = 20;

const NVML_WIDTH: u16 = 25;
const LARGEST_HEIGHT: u16 = 8;
const BREAKDOWN_HEIGHT: u16 = 4;
const MIN_BODY_HEIGHT: u16 = 6;

/// Header, timeline row, largest-live table, breakdown bar and status line,
/// top to bottom. Heights are computed here rather than by the constraint
/// solver: on a short screen the constraints conflict, and the solver's
/// choice between them is not stable from run to run.
fn split(area: Rect, header_height: u16) -> [Rect; 5] {
    let rest = area.height.saturating_sub(header_height + 1);
    let bar = if rest >= MIN_BODY_HEIGHT + LARGEST_HEIGHT + BREAKDOWN_HEIGHT {
        BREAKDOWN_HEIGHT
    } else {
        3
    };
    let table = rest
        .saturating_sub(bar + MIN_BODY_HEIGHT)
        .clamp(3, LARGEST_HEIGHT);
    let body = rest.saturating_sub(bar + table);
    Layout::vertical([
        Constraint::Length(header_height),
        Constraint::Length(body),
        Constraint::Length(table),
        Constraint::Length(bar),
        Constraint::Length(1),
    ])
    .areas(area)
}

impl Widget for &App {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
            let text = format!(
                "The terminal is {}×{}; the live view needs at least {MIN_WIDTH}×{MIN_HEIGHT}. Enlarge it, or press q to quit.",
                area.width, area.height
            );
            Paragraph::new(Line::from(text))
                .wrap(Wrap { trim: true })
                .alignment(Alignment::Center)
                .render(area, buf);
            return;
        }
        let [head, body, table, bar, foot] = split(area, header::height(self));
        // With a model, the forecast takes the bar's top line.
        let bar = if self.snapshot().is_some_and(|s| s.model.is_some()) && bar.height > 3 {
            let [line, rest] =
                Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(bar);
            tables::render_forecast(self, line, buf);
            rest
        } else {
            bar
        };
        let [timeline, nvml_area] =
            Layout::horizontal([Constraint::Min(30), Constraint::Length(NVML_WIDTH)]).areas(body);
        header::render(self, head, buf);
        chart::render(self, timeline, buf);
        nvml::render(self, nvml_area, buf);
        match self.table() {
            Table::Largest => largest::render(self, table, buf),
            Table::ByLine => tables::render_by_line(self, table, buf),
            Table::Model => tables::render_model(self, table, buf),
            Table::Tensors => tables::render_tensors(self, table, buf),
            Table::Growth => tables::render_growth(self, table, buf),
        }
        breakdown::render(self, bar, buf);
        status::render(self, foot, buf);
        match self.overlay() {
            Overlay::Help => help::render(area, buf),
            Overlay::Stack(allocation) => stack::render(allocation, area, buf),
            Overlay::None | Overlay::FilterInput => {}
        }
    }
}
