//! Observed beside predicted bytes per tensor, as horizontal bars.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::ViewerError;
use crate::model::BreakdownPlot;
use crate::plot::style::{self, bold, byte_axis, byte_label, text};
use crate::plot::{DrawResult, Figure, write_plot};
use crate::units::format_bytes;

const ROW_HEIGHT: u32 = 44;

/// Writes the breakdown plot to `path` (`.png` or `.svg`).
pub fn plot_breakdown(plot: &BreakdownPlot, path: &Path) -> Result<(), ViewerError> {
    if plot.rows.is_empty() {
        return Err(ViewerError::EmptyPlot("the breakdown has no rows".into()));
    }
    write_plot(path, plot)
}

impl Figure for BreakdownPlot {
    fn size(&self) -> (u32, u32) {
        (1400, 200 + ROW_HEIGHT * self.rows.len() as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let n = self.rows.len();
        let max = self
            .rows
            .iter()
            .flat_map(|r| [r.predicted_bytes, r.observed_bytes])
            .flatten()
            .max()
            .unwrap_or(0);
        let (unit, top) = byte_axis(max);
        // Room on the right of the longest bar for its value.
        let right = top * 1.15;
        let x = |bytes: u64| bytes as f64 / unit.bytes();
        let longest = self
            .rows
            .iter()
            .map(|r| r.tensor.chars().count())
            .max()
            .unwrap_or(0);
        let name_width = (longest as u32 * 10 + 24).clamp(80, 420);

        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, bold(26.0))
            .margin(20)
            .x_label_area_size(56)
            .y_label_area_size(name_width)
            .build_cartesian_2d(0.0..right, 0.0..n as f64)?;
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

        // Row i is drawn from the top: its band is [n-i-1, n-i).
        let band = |i: usize| (n - i - 1) as f64;
        let bars = [
            ("predicted", style::PREDICTED, 0.52, 0.88),
            ("observed", style::OBSERVED, 0.12, 0.48),
        ];
        // Without any prediction (tensors by line, say) only the observed bars are drawn.
        let predicted = self.rows.iter().any(|r| r.predicted_bytes.is_some());
        for (k, (name, color, lo, hi)) in bars.into_iter().enumerate() {
            if k == 0 && !predicted {
                continue;
            }
            let value = |r: &crate::model::BreakdownRow| {
                if k == 0 {
                    r.predicted_bytes
                } else {
                    r.observed_bytes
                }
            };
            chart
                .draw_series(self.rows.iter().enumerate().filter_map(|(i, r)| {
                    let v = value(r)?;
                    Some(Rectangle::new(
                        [(0.0, band(i) + lo), (x(v), band(i) + hi)],
                        color.filled(),
                    ))
                }))?
                .label(name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 7), (x + 18, y + 7)], color.filled())
                });
            chart.draw_series(self.rows.iter().enumerate().map(|(i, r)| {
                let (at, label) = match value(r) {
                    Some(v) => (x(v), format_bytes(v)),
                    None => (0.0, format!("not {name}")),
                };
                EmptyElement::at((at, band(i) + (lo + hi) / 2.0))
                    + Text::new(
                        label,
                        (6, 0),
                        text(14.0).pos(Pos::new(HPos::Left, VPos::Center)),
                    )
            }))?;
        }

        // Tensor names right-aligned beside their rows, left of the axis.
        let names = text(16.0).pos(Pos::new(HPos::Right, VPos::Center));
        for (i, r) in self.rows.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(0.0, band(i) + 0.5));
            root.draw(&Text::new(r.tensor.as_str(), (px - 10, py), names.clone()))?;
        }

        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(style::BACKGROUND.mix(0.9))
            .border_style(style::GRID)
            .label_font(text(15.0))
            .draw()?;
        Ok(())
    }
}
