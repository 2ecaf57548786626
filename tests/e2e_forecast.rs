//! The live forecast against a real out-of-memory: the reference workload's chunked prefill of
//! Qwen3.6-27B on the stand-in driver's 24 GiB card runs out of memory in one chunk; the live
//! view with `--model` reads the context from the KV cache's bytes, and its cliff (the largest
//! context whose modelled step fits) falls inside the chunk that failed.

mod common;

use std::time::Duration;

use common::*;
use vramtrace::forecast::LiveModel;
use vramtrace::live::{DirSource, LiveOptions};
use vramtrace_models::{ModelConfig, Runtime};
use vramtrace_view_model::{LiveSource, SnapshotQuery, Update};

const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/samples/models/Qwen3.6-27B/config.json"
);
const CHUNK: u64 = 4128;

#[test]
fn the_live_cliff_falls_in_the_chunk_that_failed() {
    let out = scratch("e2e-forecast").join("trace");
    let wl = target_dir().join("vramtrace-workload");
    let args =
        format!("prefill --config {CONFIG} --prompt-tokens 131072 --chunk {CHUNK} --simulate");
    let mut prog = vec![wl.as_os_str()];
    prog.extend(args.split_whitespace().map(std::ffi::OsStr::new));
    let o = run_traced(&out, "24GiB", &prog);
    assert_ne!(
        o.status.code(),
        Some(0),
        "it should run out of memory: {}",
        describe(&o)
    );

    let cfg = ModelConfig::from_path(CONFIG).unwrap();
    let model = LiveModel::new(cfg, Runtime::Workload, CHUNK, 1, Some(24 << 30)).unwrap();
    let mut s = DirSource::new(
        &out,
        LiveOptions {
            nvml: false,
            rescan: Duration::ZERO,
            poll_budget: Duration::from_secs(3600),
            ..LiveOptions::default()
        },
    )
    .with_model(model);
    let mut updates = Vec::new();
    for _ in 0..3 {
        updates.extend(s.poll());
    }
    let failure = updates
        .iter()
        .find_map(|u| match u {
            Update::Failure(f) => Some(f.clone()),
            _ => None,
        })
        .expect("a failed allocation");
    // The workload names its ranges by chunk: the one that failed.
    let failed_chunk: u64 = failure
        .label
        .split("chunk.")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|n| n.parse().ok())
        .expect("the failure's label names its chunk");
    let snap = s
        .snapshot(&SnapshotQuery {
            device: 0,
            pid: None,
            time_s: failure.time_s,
        })
        .unwrap();
    let m = snap.model.unwrap();
    // The model's tensors at the failure: the workload names every allocation, so the GDN
    // layer's tensors made before the request that failed match by name, each of the model's
    // bytes; the request (fla's `h`) and what comes after it were never allocated.
    let t = m.tensors.as_ref().expect("the step is modelled");
    assert_eq!(
        t.title,
        format!(
            "gdn layer's peak, chunk 4,128 at context {}",
            vramtrace_view_model::format_count((failed_chunk + 1) * CHUNK)
        )
    );
    assert!(
        failure.label.ends_with("chunk_gated_delta_rule_fwd_h"),
        "{}",
        failure.label
    );
    let (made, not_yet) = t.rows.split_at(t.rows.len() - 4);
    assert_eq!(made.len(), 17);
    for r in made {
        assert_eq!(r.basis, "name", "{r:?}");
        assert_eq!(r.observed_bytes, Some(r.modelled_bytes), "{r:?}");
        assert!(
            r.line
                .starts_with(&format!("prefill/chunk.{failed_chunk}/layer.0/gdn/")),
            "{r:?}"
        );
    }
    let names: Vec<(&str, &str)> = not_yet
        .iter()
        .map(|r| (r.name.as_str(), r.basis.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("h", "unmatched"),
            ("final_state", "unmatched"),
            ("v_new", "unmatched"),
            ("o", "unmatched"),
        ]
    );
    assert_eq!(t.matched_observed_bytes(), t.matched_modelled_bytes());
    let f = m.forecast.unwrap();
    // At the failure the failing chunk's K/V is already allocated: the context read holds it.
    assert_eq!(f.context_tokens, (failed_chunk + 1) * CHUNK);
    assert!(f.headroom_bytes() < 0, "{f:?}");
    // The cliff lies past the last chunk that ran and before the end of the one that failed.
    let cliff = f.largest_context.expect("earlier chunks fit");
    assert!(
        failed_chunk * CHUNK <= cliff && cliff < (failed_chunk + 1) * CHUNK,
        "cliff {cliff} against chunk {failed_chunk}: {f:?}"
    );
}
