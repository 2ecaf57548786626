//! The whole-step cliff in two panels (context at the chunk, chunk at the context) and the
//! breakdown as one stacked capacity bar with the failing request overhanging it.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::ViewerError;
use crate::model::{CapacityBar, CliffPanel, CliffPanels};
use crate::plot::style::{self, bold, byte_axis, byte_label, text};
use crate::plot::{DrawResult, Figure, write_plot};
use crate::units::{format_bytes, format_count};

/// Writes the two-panel cliff to `path` (`.png` or `.svg`).
pub fn plot_cliff_panels(plot: &CliffPanels, path: &Path) -> Result<(), ViewerError> {
    if plot.panels.iter().all(|p| p.curve.is_empty()) {
        return Err(ViewerError::EmptyPlot(
            "the cliff has no model points in any panel".into(),
        ));
    }
    write_plot(path, plot)
}

/// Writes the capacity bar to `path` (`.png` or `.svg`).
pub fn plot_capacity_bar(plot: &CapacityBar, path: &Path) -> Result<(), ViewerError> {
    if plot.parts.iter().all(|p| p.bytes == 0) && plot.request.is_none() {
        return Err(ViewerError::EmptyPlot(
            "the capacity bar has no bytes".into(),
        ));
    }
    write_plot(path, plot)
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &CliffPanel,
    limit: u64,
    limit_label: &str,
    curve_label: &str,
    failure_label: &str,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let max_x = p
        .curve
        .iter()
        .map(|c| c.0)
        .chain(p.failure.map(|f| f.0))
        .max()
        .unwrap_or(1)
        .max(1);
    let max_y = p
        .curve
        .iter()
        .map(|c| c.1)
        .chain(p.failure.map(|f| f.1))
        .chain(std::iter::once(limit))
        .max()
        .unwrap_or(0);
    let min_y = p
        .curve
        .iter()
        .map(|c| c.1)
        .chain(std::iter::once(limit))
        .min()
        .unwrap_or(0);
    let (unit, _) = byte_axis(max_y);
    let y = |b: u64| b as f64 / unit.bytes();
    // Autoscaled to the points and the limit, not from zero, so the cliff shows.
    let span = (y(max_y) - y(min_y)).max(y(max_y) * 0.01);
    let top = y(max_y) + span * 0.12;
    let bottom = (y(min_y) - span * 0.08).max(0.0);
    let right = max_x as f64 * 1.04;
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(96)
        .build_cartesian_2d(0.0..right, bottom..top)?;
    chart
        .configure_mesh()
        .light_line_style(style::GRID.mix(0.5))
        .bold_line_style(style::GRID)
        .axis_style(style::INK)
        .x_desc(p.x_desc.as_str())
        .y_desc("counted against the limit")
        .x_label_formatter(&|v| format_count(v.round().max(0.0) as u64))
        .y_label_formatter(&|v| byte_label(*v, unit))
        .label_style(text(14.0))
        .axis_desc_style(text(15.0))
        .draw()?;
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, y(limit)), (right, y(limit))],
            12,
            6,
            style::CAPACITY.stroke_width(2),
        ))?
        .label(format!("{limit_label} {}", format_bytes(limit)))
        .legend(|(x, yy)| {
            PathElement::new(vec![(x, yy), (x + 18, yy)], style::CAPACITY.stroke_width(2))
        });
    chart
        .draw_series(LineSeries::new(
            p.curve.iter().map(|&(x, b)| (x as f64, y(b))),
            style::PREDICTED.stroke_width(3),
        ))?
        .label(curve_label)
        .legend(|(x, yy)| {
            PathElement::new(
                vec![(x, yy), (x + 18, yy)],
                style::PREDICTED.stroke_width(3),
            )
        });
    if let Some(fr) = p.frontier {
        let at = fr as f64;
        chart.draw_series(DashedLineSeries::new(
            [(at, bottom), (at, top)],
            8,
            6,
            style::PREDICTED.mix(0.8).stroke_width(2),
        ))?;
        let (dx, pos) = if at > right / 2.0 {
            (-8, Pos::new(HPos::Right, VPos::Bottom))
        } else {
            (8, Pos::new(HPos::Left, VPos::Bottom))
        };
        chart.draw_series(std::iter::once(
            EmptyElement::at((at, bottom))
                + Text::new(
                    format!("fits up to {}", format_count(fr)),
                    (dx, -10),
                    bold(16.0).color(&style::PREDICTED).pos(pos),
                ),
        ))?;
    }
    if let Some((x, b)) = p.failure {
        chart
            .draw_series(std::iter::once(Cross::new(
                (x as f64, y(b)),
                9,
                style::FAILURE.stroke_width(3),
            )))?
            .label(format!("{} ({})", failure_label, format_count(x)))
            .legend(|(x, yy)| Cross::new((x + 9, yy), 6, style::FAILURE.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(style::BACKGROUND.mix(0.9))
        .border_style(style::GRID)
        .label_font(text(14.0))
        .draw()?;
    Ok(())
}

impl Figure for CliffPanels {
    fn size(&self) -> (u32, u32) {
        (800 * self.panels.len().max(1) as u32, 760)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let root = root.titled(&self.title, bold(24.0))?;
        let areas = root.split_evenly((1, self.panels.len().max(1)));
        for (a, p) in areas.iter().zip(&self.panels) {
            panel(
                a,
                p,
                self.limit_bytes,
                &self.limit_label,
                &self.curve_label,
                &self.failure_label,
            )?;
        }
        Ok(())
    }
}

impl Figure for CapacityBar {
    fn size(&self) -> (u32, u32) {
        (1400, 300 + 26 * self.parts.len() as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let used: u64 = self.parts.iter().map(|p| p.bytes).sum();
        let end = used + self.request.as_ref().map_or(0, |r| r.bytes);
        let (unit, top) = byte_axis(end.max(self.limit_bytes));
        let x = |b: u64| b as f64 / unit.bytes();
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, bold(24.0))
            .margin(20)
            .x_label_area_size(56)
            .y_label_area_size(20)
            .build_cartesian_2d(0.0..top, 0.0..2.2)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .light_line_style(style::GRID.mix(0.5))
            .bold_line_style(style::GRID)
            .axis_style(style::INK)
            .x_desc("bytes")
            .x_label_formatter(&|v| byte_label(*v, unit))
            .label_style(text(15.0))
            .axis_desc_style(text(16.0))
            .draw()?;
        let mut at = 0u64;
        for (i, p) in self.parts.iter().enumerate() {
            let fill = if p.label == "free" {
                style::BACKGROUND
            } else {
                style::CATEGORY_FILLS[i % style::CATEGORY_FILLS.len()]
            };
            let (a, b) = (x(at), x(at + p.bytes));
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(a, 0.35), (b, 0.75)],
                    fill.filled(),
                )))?
                .label(format!("{} {}", p.label, format_bytes(p.bytes)))
                .legend(move |(x, y)| Rectangle::new([(x, y - 7), (x + 18, y + 7)], fill.filled()));
            chart.draw_series(std::iter::once(Rectangle::new(
                [(a, 0.35), (b, 0.75)],
                style::INK.stroke_width(1),
            )))?;
            at += p.bytes;
        }
        if let Some(r) = &self.request {
            // Drawn where the free space starts: what was used besides free, then the request.
            let start = used
                - self
                    .parts
                    .iter()
                    .filter(|p| p.label == "free")
                    .map(|p| p.bytes)
                    .sum::<u64>();
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x(start), 0.12), (x(start + r.bytes), 0.32)],
                    style::FAILURE.filled(),
                )))?
                .label(format!("{} {}", r.label, format_bytes(r.bytes)))
                .legend(|(x, y)| {
                    Rectangle::new([(x, y - 7), (x + 18, y + 7)], style::FAILURE.filled())
                });
        }
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x(self.limit_bytes), 0.0), (x(self.limit_bytes), 1.0)],
                style::CAPACITY.stroke_width(3),
            )))?
            .label(format!(
                "{} {}",
                self.limit_label,
                format_bytes(self.limit_bytes)
            ))
            .legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], style::CAPACITY.stroke_width(3))
            });
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(style::BACKGROUND.mix(0.9))
            .border_style(style::GRID)
            .label_font(text(14.0))
            .draw()?;
        Ok(())
    }
}
