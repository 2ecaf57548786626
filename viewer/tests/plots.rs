//! Each plot kind written as PNG and SVG: the PNG decodes to the canvas size
//! and is not blank; the SVG carries the labels as text.

mod common;

use std::path::Path;

use vramtrace_viewer::ViewerError;
use vramtrace_viewer::model::BreakdownPlot;
use vramtrace_viewer::plot::TimelinePlot;
use vramtrace_viewer::plot::{PlotFormat, plot_breakdown, plot_cliff, plot_timeline};

fn check_png(path: &Path, width: u32, height: u32) {
    let image = image::open(path)
        .unwrap_or_else(|e| panic!("{} does not decode: {e}", path.display()))
        .to_rgb8();
    assert_eq!(image.dimensions(), (width, height));
    let dark = image
        .pixels()
        .filter(|p| p.0.iter().all(|&c| c < 100))
        .count();
    let coloured = image.pixels().filter(|p| p.0 != [255, 255, 255]).count();
    // Text and axes are dark; bands and lines colour a good part of the canvas.
    assert!(
        dark > 5_000,
        "only {dark} dark pixels in {}",
        path.display()
    );
    assert!(
        coloured > 50_000,
        "only {coloured} non-white pixels in {}",
        path.display()
    );
}

fn svg(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.starts_with("<svg"), "{} is not an SVG", path.display());
    text
}

fn assert_contains_all(text: &str, labels: &[&str]) {
    for label in labels {
        assert!(text.contains(label), "the SVG lacks {label:?}");
    }
}

#[test]
fn timeline_png_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let plot = common::timeline_plot();
    plot_timeline(&plot, &dir.path().join("t.png")).unwrap();
    check_png(&dir.path().join("t.png"), 1400, 120 + 2 * 520);
    plot_timeline(&plot, &dir.path().join("t.SVG")).unwrap();
    let text = svg(&dir.path().join("t.SVG"));
    assert_contains_all(
        &text,
        &[
            "Prefill of 4128 tokens under --capacity 24GiB",
            "cuda:0 NVIDIA H200 (140.40 GiB total)",
            "cuda:1 NVIDIA H200",
            "capacity 24.00 GiB",
            "predicted peak 22.29 GiB",
            "failed allocation ×1",
            "failed: gdn.h 6.00 GiB",
            "peak 23.75 GiB at 8.90 s",
            "peak 21.17 GiB at 8.90 s",
            "weights",
            "KV cache",
            "activations",
            "unnamed",
            "live bytes",
            "20 GiB",
            "seconds since the trace started",
            "font-family=\"sans-serif\"",
        ],
    );
}

#[test]
fn breakdown_png_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let plot = common::breakdown_plot();
    plot_breakdown(&plot, &dir.path().join("b.png")).unwrap();
    check_png(&dir.path().join("b.png"), 1400, 200 + 44 * 9);
    plot_breakdown(&plot, &dir.path().join("b.svg")).unwrap();
    let text = svg(&dir.path().join("b.svg"));
    assert_contains_all(
        &text,
        &[
            "At the failure (8.95 s, cuda:0): observed beside predicted",
            "final_state",
            "softmax_lse",
            "97.5 MiB",
            "98.0 MiB",
            "not observed",
            "not predicted",
            "predicted",
            "observed",
            "100 MiB",
        ],
    );
}

#[test]
fn cliff_png_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let curve = common::cliff_curve();
    assert_eq!(curve.cliff_tokens, Some(5048));
    plot_cliff(&curve, &dir.path().join("c.png")).unwrap();
    check_png(&dir.path().join("c.png"), 1400, 800);
    plot_cliff(&curve, &dir.path().join("c.svg")).unwrap();
    let text = svg(&dir.path().join("c.svg"));
    assert_contains_all(
        &text,
        &[
            "Qwen3.6-27B prefill peak against prompt length",
            "cliff at 5,048 tokens",
            "capacity 24.00 GiB",
            "model peak",
            "observed peak",
            "prompt tokens",
            "peak device memory",
        ],
    );
}

#[test]
fn other_extensions_and_empty_inputs_are_refused_plainly() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["t.jpg", "t", "t.png.txt"] {
        let path = dir.path().join(name);
        let err = plot_timeline(&common::timeline_plot(), &path).unwrap_err();
        assert!(
            matches!(err, ViewerError::UnsupportedPlotFormat { .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("name the output file with .png or .svg")
        );
        assert!(!path.exists());
    }
    assert_eq!(
        PlotFormat::from_path(Path::new("a.Png")).unwrap(),
        PlotFormat::Png
    );
    let empty = TimelinePlot {
        title: String::new(),
        devices: Vec::new(),
    };
    let err = plot_timeline(&empty, &dir.path().join("e.svg")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "nothing to plot: the timeline has no samples on any device"
    );
    let err = plot_breakdown(
        &BreakdownPlot {
            title: String::new(),
            rows: Vec::new(),
        },
        &dir.path().join("e.png"),
    )
    .unwrap_err();
    assert!(matches!(err, ViewerError::EmptyPlot(_)));
    let missing = dir.path().join("no/such/dir/t.png");
    let err = plot_timeline(&common::timeline_plot(), &missing).unwrap_err();
    assert!(err.to_string().starts_with("writing the plot to "), "{err}");
}

#[test]
fn no_system_font_library_is_linked() {
    // This test binary draws text; the font must come from inside it.
    let exe = std::env::current_exe().unwrap();
    let Ok(out) = std::process::Command::new("ldd").arg(&exe).output() else {
        // Visible, and a failure where CI says ldd is there (VRAMTRACE_REQUIRE_LDD=1).
        vramtrace_testkit::skip(
            "VRAMTRACE_REQUIRE_LDD",
            "ldd is not available: the link check",
        );
        return;
    };
    assert!(
        out.status.success(),
        "ldd {}: {}",
        exe.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let libs = String::from_utf8_lossy(&out.stdout).to_lowercase();
    for lib in ["fontconfig", "freetype", "expat"] {
        assert!(!libs.contains(lib), "{lib} is linked:\n{libs}");
    }
}
