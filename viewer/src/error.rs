//! The one error type of the crate.

use std::path::PathBuf;

/// Why the viewer could not show or write something.
#[derive(Debug, thiserror::Error)]
pub enum ViewerError {
    /// The terminal could not be set up, read or restored.
    #[error("the terminal could not be used for the live view: {0}")]
    Terminal(#[source] std::io::Error),
    /// A frame could not be drawn.
    #[error("the live view could not draw a frame: {0}")]
    Draw(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The plot's output path names no format the viewer writes.
    #[error(
        "cannot tell the plot format from {}: name the output file with .png or .svg",
        path.display()
    )]
    UnsupportedPlotFormat {
        /// The output path given.
        path: PathBuf,
    },
    /// The plot has nothing to draw.
    #[error("nothing to plot: {0}")]
    EmptyPlot(String),
    /// Drawing or writing the plot failed.
    #[error("writing the plot to {} failed: {message}", path.display())]
    Plot {
        /// The output path.
        path: PathBuf,
        /// What went wrong, from the drawing library.
        message: String,
    },
}
