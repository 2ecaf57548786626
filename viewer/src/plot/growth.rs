//! The growth plot: live bytes by category over the run, stacked, the bytes held from the
//! driver over them, and the steady state's fitted rate as a dashed line.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::ViewerError;
use crate::model::GrowthPlot;
use crate::plot::style::{self, bold, byte_axis, byte_label, text};
use crate::plot::{DrawResult, Figure, write_plot};

/// Writes the growth plot to `path` (`.png` or `.svg`).
pub fn plot_growth(plot: &GrowthPlot, path: &Path) -> Result<(), ViewerError> {
    if plot.t_s.len() < 2 {
        return Err(ViewerError::EmptyPlot(
            "the growth analysis has fewer than two buckets".into(),
        ));
    }
    write_plot(path, plot)
}

impl Figure for GrowthPlot {
    fn size(&self) -> (u32, u32) {
        (1400, 800)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let n = self.t_s.len();
        let stacked: Vec<u64> = (0..n)
            .map(|i| self.categories.iter().map(|c| c.2[i]).sum())
            .collect();
        let max = stacked
            .iter()
            .chain(&self.held)
            .copied()
            .max()
            .unwrap_or(0)
            .max(1);
        let (unit, top) = byte_axis(max);
        let y = |b: f64| b / unit.bytes();
        let end = self.t_s[n - 1].max(self.t_s[0] + 1e-3);
        let body = root.margin(12, 0, 0, 0).titled(&self.title, bold(26.0))?;
        let body = body.titled(&self.subtitle, text(17.0))?;
        let mut chart = ChartBuilder::on(&body)
            .margin(20)
            .x_label_area_size(56)
            .y_label_area_size(96)
            .build_cartesian_2d(self.t_s[0]..end, 0.0..top)?;
        chart
            .configure_mesh()
            .light_line_style(style::GRID.mix(0.5))
            .bold_line_style(style::GRID)
            .axis_style(style::INK)
            .x_desc("seconds since the trace began")
            .y_desc("live device bytes")
            .x_label_formatter(&|v| {
                if end < 20.0 {
                    format!("{v:.1}")
                } else {
                    format!("{v:.0}")
                }
            })
            .y_label_formatter(&|v| byte_label(*v, unit))
            .label_style(text(15.0))
            .axis_desc_style(text(16.0))
            .draw()?;
        // Each category a band between the stack under it and its own top.
        let mut base = vec![0u64; n];
        for (name, fill, v) in &self.categories {
            let color = style::CATEGORY_FILLS[*fill % style::CATEGORY_FILLS.len()];
            let top_line: Vec<u64> = base.iter().zip(v).map(|(b, x)| b + x).collect();
            let mut band: Vec<(f64, f64)> = self
                .t_s
                .iter()
                .zip(&top_line)
                .map(|(t, b)| (*t, y(*b as f64)))
                .collect();
            band.extend(
                self.t_s
                    .iter()
                    .zip(&base)
                    .rev()
                    .map(|(t, b)| (*t, y(*b as f64))),
            );
            chart
                .draw_series(std::iter::once(Polygon::new(
                    band,
                    color.mix(0.85).filled(),
                )))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 18, y + 6)], color.filled())
                });
            base = top_line;
        }
        let held: Vec<(f64, f64)> = self
            .t_s
            .iter()
            .zip(&self.held)
            .map(|(t, b)| (*t, y(*b as f64)))
            .collect();
        chart
            .draw_series(LineSeries::new(held, style::INK.stroke_width(2)))?
            .label("held from the driver (low-water)")
            .legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], style::INK.stroke_width(2))
            });
        if let Some(((t0, b0), (t1, b1))) = self.steady {
            let line = DashedLineSeries::new(
                [(t0, y(b0)), (t1, y(b1))],
                12,
                6,
                style::CAPACITY.stroke_width(3),
            );
            chart
                .draw_series(line)?
                .label(self.steady_label.clone())
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], style::CAPACITY.stroke_width(3))
                });
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
