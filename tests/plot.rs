//! `vramtrace plot` end to end on the H200 samples: PNG and SVG files, their labels, and the
//! errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vramtrace-plot-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn plot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .current_dir(root())
        .arg("plot")
        .args(args)
        .output()
        .unwrap()
}

fn ok(o: Output) {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn failed_with(o: Output, words: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "should fail: {err}");
    assert!(err.contains(words), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Width and height of a PNG, read from its IHDR chunk after checking the signature.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(
        &b[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    assert_eq!(&b[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    assert!(
        b.len() > 10_000,
        "a plot has more in it than {} bytes",
        b.len()
    );
    (be(16), be(20))
}

const PREFILL: &str = "samples/h200/prefill-18gib";
const QWEN: &str = "samples/models/Qwen3.6-27B/config.json";

#[test]
fn timeline_png_and_svg() {
    let d = out_dir("timeline");
    let svg = d.join("t.svg");
    ok(plot(&[
        PREFILL,
        "--kind",
        "timeline",
        "--capacity",
        "18GiB",
        "-o",
        svg.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(&svg).unwrap();
    for label in [
        "weights",
        "KV cache",
        "activations",
        "other",
        "capacity 18.00 GiB",
        "NVIDIA H200",
        "peak 138.97 GiB",
    ] {
        assert!(text.contains(label), "no {label:?} in the SVG");
    }
    let png = d.join("t.png");
    ok(plot(&[
        PREFILL,
        "--kind",
        "timeline",
        "--hide",
        "other",
        "-o",
        png.to_str().unwrap(),
    ]));
    let (w, h) = png_size(&png);
    assert!(w >= 800 && h >= 400, "{w}x{h}");
}

#[test]
fn breakdown_at_the_oom() {
    let d = out_dir("breakdown");
    for ext in ["svg", "png"] {
        let f = d.join(format!("b.{ext}"));
        ok(plot(&[
            PREFILL,
            "--kind",
            "breakdown",
            "--model",
            QWEN,
            "--variant",
            "fla-0.6.0",
            "--tokens",
            "4128",
            "--at",
            "oom",
            "-o",
            f.to_str().unwrap(),
        ]));
    }
    let text = std::fs::read_to_string(d.join("b.svg")).unwrap();
    for label in [
        "h (failed request)",
        "fla-0.6.0 on Qwen3.6-27B at oom",
        "not observed",
        "97.5 MiB",
        "predicted",
        "observed",
    ] {
        assert!(text.contains(label), "no {label:?} in the SVG");
    }
    png_size(&d.join("b.png"));
}

#[test]
fn cliff_with_the_observed_peak() {
    let d = out_dir("cliff");
    let f = d.join("c.svg");
    ok(plot(&[
        PREFILL,
        "--kind",
        "cliff",
        "--model",
        QWEN,
        "--variant",
        "fla-0.6.0",
        "--tokens",
        "4128",
        "--at",
        "oom",
        "--capacity",
        "24GiB",
        "-o",
        f.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(&f).unwrap();
    for label in [
        "cliff at",
        "tokens",
        "capacity 24.00 GiB",
        "observed",
        "Qwen3.6-27B",
    ] {
        assert!(text.contains(label), "no {label:?} in the SVG");
    }
    // Without a trace: the model alone, resident 0.
    let png = d.join("c.png");
    ok(plot(&[
        "--kind",
        "cliff",
        "--model",
        QWEN,
        "--kernel",
        "gdn",
        "--capacity",
        "2GiB",
        "-o",
        png.to_str().unwrap(),
    ]));
    png_size(&png);
}

#[test]
fn clear_errors() {
    let d = out_dir("errors");
    failed_with(
        plot(&[
            PREFILL,
            "--kind",
            "timeline",
            "-o",
            d.join("t.jpg").to_str().unwrap(),
        ]),
        "plots are .png or .svg files",
    );
    let empty = d.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    failed_with(
        plot(&[
            empty.to_str().unwrap(),
            "--kind",
            "timeline",
            "-o",
            d.join("t.png").to_str().unwrap(),
        ]),
        "no trace",
    );
    failed_with(
        plot(&[
            PREFILL,
            "--kind",
            "cliff",
            "--capacity",
            "24GiB",
            "-o",
            d.join("c.png").to_str().unwrap(),
        ]),
        "needs the model's config.json",
    );
    failed_with(
        plot(&[
            "--kind",
            "cliff",
            "--model",
            QWEN,
            "-o",
            d.join("c.png").to_str().unwrap(),
        ]),
        "needs --capacity",
    );
    failed_with(
        plot(&[
            "--kind",
            "timeline",
            "-o",
            d.join("t.png").to_str().unwrap(),
        ]),
        "needs a trace directory",
    );
    failed_with(
        plot(&[
            PREFILL,
            "--kind",
            "timeline",
            "--hide",
            "nonsense",
            "-o",
            d.join("t.png").to_str().unwrap(),
        ]),
        "the categories are",
    );
    assert!(!d.join("t.png").exists() && !d.join("c.png").exists());
}
