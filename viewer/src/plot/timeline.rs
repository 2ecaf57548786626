//! Live bytes over time, one panel per device, stacked by category when the
//! points carry a split.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::Timeline;
use crate::error::ViewerError;
use crate::model::TimelinePlot;
use crate::plot::style::{self, bold, byte_axis, byte_label, text};
use crate::plot::{DrawResult, Figure, write_plot};
use crate::units::{format_bytes, format_seconds};

/// Failures labelled with their name and size (all are marked).
const LABELLED_FAILURES: usize = 3;

/// Writes the timeline plot to `path` (`.png` or `.svg`).
pub fn plot_timeline(plot: &TimelinePlot, path: &Path) -> Result<(), ViewerError> {
    if plot.devices.iter().all(|(_, t)| t.points().is_empty()) {
        return Err(ViewerError::EmptyPlot(
            "the timeline has no samples on any device".into(),
        ));
    }
    write_plot(path, plot)
}

impl Figure for TimelinePlot {
    fn size(&self) -> (u32, u32) {
        (1400, 120 + 520 * self.devices.len().max(1) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let body = root.margin(12, 0, 0, 0).titled(&self.title, bold(28.0))?;
        let panels = body.split_evenly((self.devices.len().max(1), 1));
        for (area, (device, timeline)) in panels.iter().zip(&self.devices) {
            let mut caption = format!("cuda:{}", device.ordinal);
            if !device.name.is_empty() {
                caption.push_str(&format!(" {}", device.name));
            }
            if device.total_bytes > 0 {
                caption.push_str(&format!(" ({} total)", format_bytes(device.total_bytes)));
            }
            draw_device(area, &caption, timeline)?;
        }
        Ok(())
    }
}

/// At most this many mark labels along the time axis.
const MAX_MARK_LABELS: usize = 12;

/// `(time, bytes)` pairs as a step function: bytes hold until the next point.
fn steps(points: impl Iterator<Item = (f64, f64)>) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (t, y) in points {
        if let Some(&(_, prev)) = out.last() {
            out.push((t, prev));
        }
        out.push((t, y));
    }
    out
}

fn draw_device<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    timeline: &Timeline,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let (start, end) = timeline.time_range().unwrap_or((0.0, 1.0));
    let end = if end > start { end } else { start + 1.0 };
    let peak = timeline.peak();
    let max = [
        peak.map(|p| p.bytes),
        timeline.capacity_bytes(),
        timeline.predicted_peak_bytes(),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(0);
    let (unit, top) = byte_axis(max);
    let y = |bytes: u64| bytes as f64 / unit.bytes();

    let mut chart = ChartBuilder::on(area)
        .caption(caption, bold(20.0))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(96)
        .build_cartesian_2d(start..end, 0.0..top)?;
    chart
        .configure_mesh()
        .light_line_style(style::GRID.mix(0.5))
        .bold_line_style(style::GRID)
        .axis_style(style::INK)
        .x_desc("seconds since the trace started")
        .y_desc("live bytes")
        .x_label_formatter(&|v| format!("{v:.1}"))
        .y_label_formatter(&|v| byte_label(*v, unit))
        .label_style(text(15.0))
        .axis_desc_style(text(16.0))
        .draw()?;

    // Stacked bands, bottom to top, when every point carries the split.
    let categories = timeline.categories();
    let stacked = !categories.is_empty()
        && timeline
            .points()
            .iter()
            .all(|p| p.by_category.len() == categories.len());
    if stacked {
        for (k, name) in categories.iter().enumerate() {
            let fill = style::CATEGORY_FILLS[k % style::CATEGORY_FILLS.len()];
            let below = |p: &crate::model::TimelinePoint| p.by_category[..k].iter().sum::<u64>();
            let upper = steps(
                timeline
                    .points()
                    .iter()
                    .map(|p| (p.time_s, y(below(p) + p.by_category[k]))),
            );
            let lower = steps(timeline.points().iter().map(|p| (p.time_s, y(below(p)))));
            let outline: Vec<(f64, f64)> =
                upper.into_iter().chain(lower.into_iter().rev()).collect();
            chart
                .draw_series(std::iter::once(Polygon::new(outline, fill.filled())))?
                .label(name.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 7), (x + 18, y + 7)], fill.filled()));
        }
    }

    let live = steps(
        timeline
            .points()
            .iter()
            .map(|p| (p.time_s, y(p.live_bytes))),
    );
    chart
        .draw_series(LineSeries::new(live, style::INK.stroke_width(2)))?
        .label("live bytes")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style::INK.stroke_width(2)));

    if let Some(capacity) = timeline.capacity_bytes() {
        let line = DashedLineSeries::new(
            [(start, y(capacity)), (end, y(capacity))],
            12,
            6,
            style::CAPACITY.stroke_width(2),
        );
        chart
            .draw_series(line)?
            .label(format!(
                "{} {}",
                timeline.capacity_label().unwrap_or("capacity"),
                format_bytes(capacity)
            ))
            .legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], style::CAPACITY.stroke_width(2))
            });
    }
    if let Some(predicted) = timeline.predicted_peak_bytes() {
        let line = DashedLineSeries::new(
            [(start, y(predicted)), (end, y(predicted))],
            6,
            6,
            style::PREDICTED.stroke_width(2),
        );
        chart
            .draw_series(line)?
            .label(format!("predicted peak {}", format_bytes(predicted)))
            .legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], style::PREDICTED.stroke_width(2))
            });
    }

    // The chunks the labels name, as a second axis along the bottom: a light line where each
    // begins, its name on every k-th so that labels do not overlap.
    let marks = timeline.marks();
    if !marks.is_empty() {
        chart.draw_series(
            marks
                .iter()
                .map(|(t, _)| PathElement::new(vec![(*t, 0.0), (*t, top)], style::GRID.mix(0.9))),
        )?;
        let every = marks.len().div_ceil(MAX_MARK_LABELS).max(1);
        chart.draw_series(marks.iter().step_by(every).map(|(t, name)| {
            EmptyElement::at((*t, 0.0))
                + Text::new(
                    name.clone(),
                    (3, -4),
                    text(13.0).pos(Pos::new(HPos::Left, VPos::Bottom)),
                )
        }))?;
    }

    let failures = timeline.failures();
    if !failures.is_empty() {
        let color = style::FAILURE;
        chart.draw_series(
            failures
                .iter()
                .map(|f| PathElement::new(vec![(f.time_s, 0.0), (f.time_s, top)], color.mix(0.35))),
        )?;
        chart
            .draw_series(failures.iter().map(|f| {
                let at = timeline.live_at(f.time_s).map_or(0.0, y);
                Cross::new((f.time_s, at), 8, color.stroke_width(3))
            }))?
            .label(format!("failed allocation ×{}", timeline.failures_total()))
            .legend(move |(x, y)| Cross::new((x + 9, y), 6, color.stroke_width(3)));
        let mid = (start + end) / 2.0;
        chart.draw_series(
            failures
                .iter()
                .take(LABELLED_FAILURES)
                .enumerate()
                .map(|(i, f)| {
                    let name = if f.label.is_empty() {
                        "unnamed"
                    } else {
                        &f.label
                    };
                    let label = format!("failed: {name} {}", format_bytes(f.request_bytes));
                    // Left of the line in the right half, so labels stay on the canvas.
                    let (dx, pos) = if f.time_s > mid {
                        (-6, Pos::new(HPos::Right, VPos::Top))
                    } else {
                        (6, Pos::new(HPos::Left, VPos::Top))
                    };
                    EmptyElement::at((f.time_s, top))
                        + Text::new(
                            label,
                            (dx, 6 + 20 * i as i32),
                            text(15.0).color(&color).pos(pos),
                        )
                }),
        )?;
    }

    if let Some(p) = peak {
        let label = format!(
            "peak {} at {}",
            format_bytes(p.bytes),
            format_seconds(p.time_s)
        );
        let pos = if p.time_s > (start + end) / 2.0 {
            (-10, Pos::new(HPos::Right, VPos::Bottom))
        } else {
            (10, Pos::new(HPos::Left, VPos::Bottom))
        };
        chart.draw_series(std::iter::once(
            EmptyElement::at((p.time_s, y(p.bytes)))
                + Circle::new((0, 0), 6, style::PEAK.filled())
                + Text::new(
                    label,
                    (pos.0, -8),
                    bold(16.0).color(&style::PEAK).pos(pos.1),
                ),
        ))?;
    }

    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(style::BACKGROUND.mix(0.9))
        .border_style(style::GRID)
        .label_font(text(15.0))
        .draw()?;
    Ok(())
}
