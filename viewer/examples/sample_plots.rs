//! Writes one plot of each kind, as PNG and SVG, into a directory:
//! `cargo run -p vramtrace-viewer --example sample_plots -- OUT_DIR`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;

use vramtrace_viewer::plot::{plot_breakdown, plot_cliff, plot_timeline};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: sample_plots OUT_DIR")?,
    );
    std::fs::create_dir_all(&dir)?;
    for ext in ["png", "svg"] {
        plot_timeline(
            &common::timeline_plot(),
            &dir.join(format!("timeline.{ext}")),
        )?;
        plot_breakdown(
            &common::breakdown_plot(),
            &dir.join(format!("breakdown.{ext}")),
        )?;
        plot_cliff(&common::cliff_curve(), &dir.join(format!("cliff.{ext}")))?;
    }
    println!(
        "wrote timeline, breakdown and cliff plots to {}",
        dir.display()
    );
    Ok(())
}
