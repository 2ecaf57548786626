//! The live source at the tensor level on real H200 samples: tensors in the largest-live
//! table with their Python line, the tensors grouped by line, the exited process, and the
//! whole-step model with its forecast (`--model`).

use std::path::PathBuf;
use std::time::Duration;

use vramtrace::categories::Category;
use vramtrace::forecast::LiveModel;
use vramtrace::live::{DirSource, LiveOptions};
use vramtrace_models::{ModelConfig, Runtime};
use vramtrace_viewer::model::{LiveSnapshot, SnapshotQuery, Update};
use vramtrace_viewer::tui::LiveSource;

const MIB: u64 = 1 << 20;

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("samples/h200")
        .join(name)
}

fn source(name: &str) -> DirSource {
    DirSource::new(
        &sample(name),
        LiveOptions {
            nvml: false,
            rescan: Duration::ZERO,
            poll_budget: Duration::from_secs(3600),
            exit_quiet: Duration::ZERO,
            ..LiveOptions::default()
        },
    )
}

/// Polls until nothing more comes; returns every update.
fn drain(s: &mut DirSource) -> Vec<Update> {
    let mut all = Vec::new();
    for _ in 0..4 {
        all.extend(s.poll());
    }
    all
}

fn lines(s: &LiveSnapshot) -> Vec<(&str, usize, u64)> {
    s.by_line
        .iter()
        .map(|g| (g.line.as_str(), g.count, g.bytes))
        .collect()
}

/// fla with caching on: at the tensor peak (659.70 MiB in 15 tensors, `summary`) the table
/// lists tensors by their Python line, never the `cuMemAlloc_v2` segments.
#[test]
fn fla_at_its_tensor_peak() {
    let mut s = source("pytorch-gdn-cache");
    let updates = drain(&mut s);
    // A trace from another host whose file stands still: its process is gone.
    assert!(
        updates.contains(&Update::Exited { pid: 636 }),
        "{updates:?}"
    );
    let reserve = Category::AllocatorReserve as usize;
    let peak = updates
        .iter()
        .filter_map(|u| match u {
            Update::Sample { point, .. } => Some(point),
            _ => None,
        })
        .max_by_key(|p| p.live_bytes - p.by_category[reserve])
        .unwrap();
    let snap = s
        .snapshot(&SnapshotQuery {
            device: 0,
            pid: None,
            time_s: peak.time_s,
        })
        .unwrap();
    let tensor_bytes: u64 = snap.by_line.iter().map(|g| g.bytes).sum();
    let tensors: usize = snap.by_line.iter().map(|g| g.count).sum();
    assert_eq!((tensors, tensor_bytes), (15, 691_747_840));
    assert_eq!(
        lines(&snap)[0],
        ("driver.py:761 get_empty_cache_for_benchmark", 1, 256 * MIB)
    );
    assert!(
        snap.largest
            .iter()
            .all(|a| a.driver_function.starts_with("tensor, ")),
        "{:?}",
        snap.largest
    );
    let first = &snap.largest[0];
    assert_eq!(first.size_bytes, 256 * MIB);
    assert_eq!(first.driver_function, "tensor, autotuning");
    assert_eq!(
        first.top_frame,
        "driver.py:761 get_empty_cache_for_benchmark"
    );
    let reserve_row = snap
        .breakdown
        .iter()
        .find(|e| e.label == "allocator reserve")
        .unwrap();
    assert_eq!(reserve_row.bytes, 260_359_168);
}

/// `transformers serve --continuous-batching`: at the live edge the tensors by line, and the
/// model of its config with the context read from the KV cache's bytes.
#[test]
fn transformers_serve_with_its_model() {
    let cfg = ModelConfig::from_path(sample("hf-serve-cb").join("config.json")).unwrap();
    let per_token = vramtrace_models::kv_cache_per_token(&cfg, 1, cfg.dtype)
        .unwrap()
        .bytes_per_token;
    let model = LiveModel::new(cfg, Runtime::Transformers, 4128, 1, None).unwrap();
    assert_eq!(model.kv_bytes_per_token(), per_token);
    let mut s = source("hf-serve-cb").with_model(model);
    let updates = drain(&mut s);
    assert!(updates.contains(&Update::Exited { pid: 780 }));
    let snap = s
        .snapshot(&SnapshotQuery {
            device: 0,
            pid: None,
            time_s: s.latest_s(),
        })
        .unwrap();
    let l = lines(&snap);
    assert_eq!(l[0].0, "input_outputs.py:185 _setup_static_tensors");
    assert_eq!(l[0].1, 1);
    assert_eq!(l[1].0, "cache.py:251 __init__");
    assert_eq!(l[1].1, 16);
    let m = snap.model.expect("a model was given");
    let kv = m.parts.iter().find(|p| p.category == "KV cache").unwrap();
    assert_eq!(kv.observed_bytes, 84_959_821_824);
    let f = m.forecast.expect("the device's total is the limit");
    assert_eq!(f.context_tokens, 84_959_821_824 / per_token);
    assert_eq!(f.limit_bytes, 150_109_880_320); // the H200 total recorded in the trace
    // The forecast agrees with itself: the next chunk fits exactly when the cliff lies past it.
    let fits = f.headroom_bytes() >= 0;
    assert_eq!(
        fits,
        f.largest_context
            .is_some_and(|l| l >= f.context_tokens + f.chunk_tokens),
        "{f:?}"
    );
}
