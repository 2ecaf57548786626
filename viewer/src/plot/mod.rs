//! Plot files: the timeline, the breakdown and the cliff, as PNG or SVG.
//!
//! The format follows the output path's extension (`.png` or `.svg`, any
//! case); anything else is refused with [`ViewerError::UnsupportedPlotFormat`].
//! Text is laid out with DejaVu Sans compiled into the binary, so no system
//! font library is needed (or linked); SVG files name the family
//! `sans-serif` and keep their labels as text.

mod breakdown;
mod cliff;
mod growth;
mod panels;
mod style;
mod timeline;

use std::error::Error;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::{BitMapBackend, DrawingArea, DrawingBackend, IntoDrawingArea, SVGBackend};

pub use breakdown::plot_breakdown;
pub use cliff::plot_cliff;
pub use growth::plot_growth;
pub use panels::{plot_capacity_bar, plot_cliff_panels};
pub use timeline::plot_timeline;
/// The timeline plot's view model, from `vramtrace-view-model` (viewer/model/).
pub use vramtrace_view_model::TimelinePlot;

use crate::error::ViewerError;

/// The file formats plots are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotFormat {
    /// A raster image.
    Png,
    /// A vector image with text kept as text.
    Svg,
}

impl PlotFormat {
    /// The format named by `path`'s extension.
    pub fn from_path(path: &Path) -> Result<Self, ViewerError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("png") => Ok(Self::Png),
            Some("svg") => Ok(Self::Svg),
            _ => Err(ViewerError::UnsupportedPlotFormat {
                path: path.to_path_buf(),
            }),
        }
    }
}

/// What every plot's drawing function returns: plotters' errors boxed.
type DrawResult = Result<(), Box<dyn Error>>;

/// One kind of plot: its canvas size and how to draw it on any backend.
trait Figure {
    /// Canvas size in pixels.
    fn size(&self) -> (u32, u32);

    /// Draws the figure onto `root` (already filled with the background).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static;
}

/// Draws `figure` in the format `path` names and writes it there.
fn write_plot(path: &Path, figure: &impl Figure) -> Result<(), ViewerError> {
    let format = PlotFormat::from_path(path)?;
    let fail = |message: String| ViewerError::Plot {
        path: path.to_path_buf(),
        message,
    };
    style::register_fonts().map_err(fail)?;
    let size = figure.size();
    match format {
        PlotFormat::Png => finish(BitMapBackend::new(path, size).into_drawing_area(), figure),
        PlotFormat::Svg => finish(SVGBackend::new(path, size).into_drawing_area(), figure),
    }
    .map_err(|e| fail(e.to_string()))
}

fn finish<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, figure: &impl Figure) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&style::BACKGROUND)?;
    figure.draw(&root)?;
    root.present()?;
    Ok(())
}
