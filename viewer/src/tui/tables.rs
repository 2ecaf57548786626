//! The other tables under the timeline (the `t` key): the live tensors grouped by Python line,
//! the whole-step model's parts beside the observed categories, and the modelled step's tensors
//! beside the live allocations they match; plus the forecast line.

use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, StatefulWidget, Table, TableState, Widget};

use crate::model::{Forecast, ModelTensors};
use crate::tui::app::App;
use crate::tui::theme;
use crate::units::{format_bytes, format_count, format_seconds, format_signed_bytes};

fn right(text: String) -> Cell<'static> {
    Cell::from(Line::from(text).alignment(Alignment::Right))
}

fn empty(block: Block<'_>, text: &str, area: Rect, buf: &mut Buffer) {
    Paragraph::new(Line::styled(text.to_string(), theme::DIM))
        .alignment(Alignment::Center)
        .block(block)
        .render(area, buf);
}

/// The live tensors grouped by Python line at the cursor.
pub fn render_by_line(app: &App, area: Rect, buf: &mut Buffer) {
    let title = format!(
        " Live tensors by Python line at {} ",
        format_seconds(app.cursor_time())
    );
    let block = Block::bordered().title(Span::styled(title, theme::TITLE));
    let groups: Vec<_> = app
        .snapshot()
        .map(|s| {
            s.by_line
                .iter()
                .filter(|g| app.matches_filter(&g.line))
                .collect()
        })
        .unwrap_or_default();
    if groups.is_empty() {
        let text = match app.snapshot() {
            None => "no snapshot from the trace yet",
            Some(s) if s.by_line.is_empty() => {
                "no tensor records: the trace has only the driver's allocations"
            }
            Some(_) => "no line matches the filter",
        };
        return empty(block, text, area, buf);
    }
    let header = Row::new(["Bytes", "Tensors", "Python line"]).style(theme::TITLE);
    let rows = groups.iter().map(|g| {
        Row::new([
            right(format_bytes(g.bytes)),
            right(format_count(g.count as u64)),
            Cell::from(g.line.clone()),
        ])
    });
    let widths = [
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Fill(1),
    ];
    let table = Table::new(rows, widths)
        .header(header)
        .block(block)
        .row_highlight_style(theme::SELECTED);
    let mut state = TableState::default().with_selected(Some(app.selected_row()));
    StatefulWidget::render(table, area, buf, &mut state);
}

/// A rate as the growth table writes it: `+8.00 MiB/h`.
fn rate(bytes_per_hour: f64) -> String {
    let sign = if bytes_per_hour < 0.0 { "−" } else { "+" };
    format!(
        "{sign}{}/h",
        format_bytes(bytes_per_hour.abs().round() as u64)
    )
}

/// What grows over the run so far: the verdict as it stands, then the lines by rate.
pub fn render_growth(app: &App, area: Rect, buf: &mut Buffer) {
    let Some(g) = app.snapshot().and_then(|s| s.growth.as_ref()) else {
        let block = Block::bordered().title(Span::styled(" Growth ", theme::TITLE));
        let text = match app.snapshot() {
            None => "no snapshot from the trace yet",
            Some(_) => "no growth yet: at the latest moment only, once something was allocated",
        };
        return empty(block, text, area, buf);
    };
    let title = format!(" Growth so far: {} ", g.headline);
    let style = if g.verdict == "leak" {
        theme::FAILURE
    } else {
        theme::TITLE
    };
    let block = Block::bordered().title(Span::styled(title, style));
    let rows = g
        .lines
        .iter()
        .filter(|l| app.matches_filter(&l.place))
        .map(|l| {
            Row::new([
                right(rate(l.bytes_per_hour)),
                right(format!(
                    "± {}",
                    format_bytes(l.uncertainty_bytes_per_hour.abs().round() as u64)
                )),
                right(format_bytes(l.live_bytes)),
                Cell::from(l.verdict.clone()),
                Cell::from(l.place.clone()),
            ])
        });
    let header = Row::new(["Rate", "±", "Live", "Verdict", "Where"]).style(theme::TITLE);
    let widths = [
        Constraint::Length(14),
        Constraint::Length(13),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Fill(1),
    ];
    let table = Table::new(rows, widths)
        .header(header)
        .block(block)
        .row_highlight_style(theme::SELECTED);
    let mut state = TableState::default().with_selected(Some(app.selected_row()));
    StatefulWidget::render(table, area, buf, &mut state);
}

/// The whole-step model's parts beside the observed categories at the cursor.
pub fn render_model(app: &App, area: Rect, buf: &mut Buffer) {
    let Some(m) = app.snapshot().and_then(|s| s.model.as_ref()) else {
        let block = Block::bordered().title(Span::styled(" Model ", theme::TITLE));
        return empty(block, "no model: give --model CONFIG", area, buf);
    };
    let title = format!(" {} at {} ", m.title, format_seconds(app.cursor_time()));
    let block = Block::bordered().title(Span::styled(title, theme::TITLE));
    let header =
        Row::new(["Category", "Modelled", "Observed", "Differs", "Rests on"]).style(theme::TITLE);
    let rows = m.parts.iter().map(|p| {
        let (modelled, diff) = match p.modelled_bytes {
            Some(b) => (
                format_bytes(b),
                match i128::from(p.observed_bytes) - i128::from(b) {
                    d if d > 0 => format!("+{}", format_bytes(d as u64)),
                    d => format_signed_bytes(d),
                },
            ),
            None => ("–".into(), "–".into()),
        };
        Row::new([
            Cell::from(p.category.clone()),
            right(modelled),
            right(format_bytes(p.observed_bytes)),
            right(diff),
            Cell::from(p.rests_on.clone()),
        ])
    });
    let widths = [
        Constraint::Length(20),
        Constraint::Length(11),
        Constraint::Length(11),
        Constraint::Length(11),
        Constraint::Fill(1),
    ];
    let table = Table::new(rows, widths).header(header).block(block);
    Widget::render(table, area, buf);
}

/// The modelled step's tensors beside the live allocations at the cursor they match, with
/// what each match rests on (`vramtrace compare` at the cursor).
pub fn render_tensors(app: &App, area: Rect, buf: &mut Buffer) {
    let Some(m) = app.snapshot().and_then(|s| s.model.as_ref()) else {
        let block = Block::bordered().title(Span::styled(" Model tensors ", theme::TITLE));
        return empty(block, "no model: give --model CONFIG", area, buf);
    };
    let t = match &m.tensors {
        Ok(t) => t,
        Err(why) => {
            let block = Block::bordered().title(Span::styled(" Model tensors ", theme::TITLE));
            return empty(block, why, area, buf);
        }
    };
    let title = format!(
        " Model tensors: {} at {} ",
        t.title,
        format_seconds(app.cursor_time())
    );
    let block = Block::bordered().title(Span::styled(title, theme::TITLE));
    if t.rows.is_empty() {
        return empty(block, "the modelled step names no tensors", area, buf);
    }
    let header =
        Row::new(["Tensor", "Modelled", "Observed", "Line", "Matched by"]).style(theme::TITLE);
    let rows = t.rows.iter().map(|r| {
        let style = if r.observed_bytes.is_some() {
            theme::TEXT
        } else {
            theme::DIM
        };
        Row::new([
            Cell::from(r.name.clone()),
            right(format_bytes(r.modelled_bytes)),
            right(r.observed_bytes.map_or("–".into(), format_bytes)),
            Cell::from(r.line.clone()),
            Cell::from(r.basis.clone()),
        ])
        .style(style)
    });
    let widths = [
        Constraint::Length(20),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Fill(1),
        Constraint::Length(19),
    ];
    // The footer spans the table's width: its own line under the rows, inside the border.
    let inner = block.inner(area);
    block.render(area, buf);
    let [rows_area, footer] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(inner);
    let table = Table::new(rows, widths)
        .header(header)
        .row_highlight_style(theme::SELECTED);
    let mut state = TableState::default().with_selected(Some(app.selected_row()));
    StatefulWidget::render(table, rows_area, buf, &mut state);
    Paragraph::new(Line::styled(tensors_footer(t), theme::DIM)).render(footer, buf);
}

/// `matched 1.88 GiB of 2.01 GiB modelled (22 of 24 tensors) · live 153 tensors, 3.38 GiB`.
pub fn tensors_footer(t: &ModelTensors) -> String {
    let matched = t.rows.iter().filter(|r| r.observed_bytes.is_some()).count();
    format!(
        "matched {} of {} modelled ({matched} of {} tensors) · live {} allocations, {}",
        format_bytes(t.matched_modelled_bytes()),
        format_bytes(t.modelled_bytes()),
        t.rows.len(),
        format_count(t.live_count as u64),
        format_bytes(t.live_bytes),
    )
}

/// The forecast as one line: the context, the next chunk's modelled peak against the limit,
/// and the tokens left before the cliff.
pub fn forecast_text(f: &Forecast) -> String {
    let head = match f.kv_pool_tokens {
        Some(slots) => format!(
            "KV pool {} tok preallocated · a chunk ({} tok) {} of {} {}",
            format_count(slots),
            format_count(f.chunk_tokens),
            format_bytes(f.next_step_bytes),
            format_bytes(f.limit_bytes),
            f.limit_label,
        ),
        None => format!(
            "context {} tok · next chunk ({} tok) {} of {} {}",
            format_count(f.context_tokens),
            format_count(f.chunk_tokens),
            format_bytes(f.next_step_bytes),
            format_bytes(f.limit_bytes),
            f.limit_label,
        ),
    };
    let headroom = f.headroom_bytes();
    if headroom < 0 {
        return format!(
            "{head} · short by {}: the next chunk is modelled not to fit",
            format_bytes(headroom.unsigned_abs() as u64)
        );
    }
    let cliff = match f.largest_context {
        Some(l) if f.kv_pool_tokens.is_some() && f.limited_by_pool => {
            format!("context bounded by the pool ({} tok)", format_count(l))
        }
        Some(l) if f.kv_pool_tokens.is_some() && !f.capped => {
            format!("memory holds a context up to {} tok", format_count(l))
        }
        Some(l) if f.capped => format!("no cliff up to {} tok", format_count(l)),
        Some(l) => format!(
            "cliff in {} tok (at {})",
            format_count(f.tokens_left()),
            format_count(l)
        ),
        None => "cliff now".into(),
    };
    format!(
        "{head} · headroom {} · {cliff}",
        format_bytes(headroom as u64)
    )
}

/// Draws the forecast line (only called with a model at the cursor).
pub fn render_forecast(app: &App, area: Rect, buf: &mut Buffer) {
    let Some(m) = app.snapshot().and_then(|s| s.model.as_ref()) else {
        return;
    };
    let line = match &m.forecast {
        Ok(f) => {
            let style = if f.headroom_bytes() < 0 {
                theme::FAILURE
            } else {
                theme::PREDICTED
            };
            Line::from(vec![
                Span::styled(" Forecast ", theme::TITLE),
                Span::styled(forecast_text(f), style),
            ])
        }
        Err(why) => Line::from(vec![
            Span::styled(" Forecast ", theme::TITLE),
            Span::styled(why.clone(), theme::DIM),
        ]),
    };
    Paragraph::new(line).render(area, buf);
}
