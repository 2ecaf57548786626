//! The cliff: the model's peak against prompt length, with the capacity, the
//! first prompt length past it, and the peaks traces observed.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::ViewerError;
use crate::model::CliffCurve;
use crate::plot::style::{self, bold, byte_axis, byte_label, text};
use crate::plot::{DrawResult, Figure, write_plot};
use crate::units::{format_bytes, format_count};

/// Writes the cliff plot to `path` (`.png` or `.svg`).
pub fn plot_cliff(curve: &CliffCurve, path: &Path) -> Result<(), ViewerError> {
    if curve.model.is_empty() && curve.observed.is_empty() {
        return Err(ViewerError::EmptyPlot(
            "the cliff curve has neither model points nor observed peaks".into(),
        ));
    }
    write_plot(path, curve)
}

impl Figure for CliffCurve {
    fn size(&self) -> (u32, u32) {
        (1400, 800)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let all = self.model.iter().chain(&self.observed);
        let max_tokens = all
            .clone()
            .map(|p| p.0)
            .chain(self.cliff_tokens)
            .max()
            .unwrap_or(1);
        let max_bytes = all
            .map(|p| p.1)
            .chain(self.capacity_bytes)
            .max()
            .unwrap_or(0);
        let (unit, top) = byte_axis(max_bytes);
        let right = max_tokens as f64 * 1.05;
        let y = |bytes: u64| bytes as f64 / unit.bytes();

        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, bold(26.0))
            .margin(20)
            .x_label_area_size(56)
            .y_label_area_size(96)
            .build_cartesian_2d(0.0..right, 0.0..top)?;
        chart
            .configure_mesh()
            .light_line_style(style::GRID.mix(0.5))
            .bold_line_style(style::GRID)
            .axis_style(style::INK)
            .x_desc("prompt tokens")
            .y_desc("peak device memory")
            .x_label_formatter(&|v| format_count(v.round() as u64))
            .y_label_formatter(&|v| byte_label(*v, unit))
            .label_style(text(15.0))
            .axis_desc_style(text(16.0))
            .draw()?;

        if let Some(capacity) = self.capacity_bytes {
            let line = DashedLineSeries::new(
                [(0.0, y(capacity)), (right, y(capacity))],
                12,
                6,
                style::CAPACITY.stroke_width(2),
            );
            chart
                .draw_series(line)?
                .label(format!("capacity {}", format_bytes(capacity)))
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], style::CAPACITY.stroke_width(2))
                });
        }
        if !self.model.is_empty() {
            let points = self.model.iter().map(|&(t, b)| (t as f64, y(b)));
            chart
                .draw_series(LineSeries::new(points, style::PREDICTED.stroke_width(3)))?
                .label("model peak")
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], style::PREDICTED.stroke_width(3))
                });
        }
        if !self.observed.is_empty() {
            chart
                .draw_series(
                    self.observed
                        .iter()
                        .map(|&(t, b)| Circle::new((t as f64, y(b)), 6, style::OBSERVED.filled())),
                )?
                .label("observed peak")
                .legend(|(x, y)| Circle::new((x + 9, y), 6, style::OBSERVED.filled()));
        }
        if let Some(cliff) = self.cliff_tokens {
            let at = cliff as f64;
            chart.draw_series(DashedLineSeries::new(
                [(at, 0.0), (at, top)],
                8,
                6,
                style::CAPACITY.mix(0.8).stroke_width(2),
            ))?;
            // Left of the line when it sits in the right half of the plot.
            let (dx, pos) = if at > right / 2.0 {
                (-8, Pos::new(HPos::Right, VPos::Top))
            } else {
                (8, Pos::new(HPos::Left, VPos::Top))
            };
            chart.draw_series(std::iter::once(
                EmptyElement::at((at, top))
                    + Text::new(
                        format!("cliff at {} tokens", format_count(cliff)),
                        (dx, 10),
                        bold(18.0).color(&style::CAPACITY).pos(pos),
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
}
