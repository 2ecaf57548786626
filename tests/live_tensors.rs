//! The live source at the tensor level on real H200 samples: tensors in the largest-live
//! table with their Python line, the tensors grouped by line, the exited process, and the
//! whole-step model with its forecast (`--model`).

use std::path::PathBuf;
use std::time::Duration;

use vramtrace::categories::Category;
use vramtrace::forecast::LiveModel;
use vramtrace::live::{DirSource, LiveOptions};
use vramtrace_models::{ModelConfig, Runtime};
use vramtrace_view_model::{LiveSnapshot, LiveSource, SnapshotQuery, Update};

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
    // Serving's paged path allocates none of the tensors of the modelled prefill step: at the
    // live edge (the server idle, its KV pool and static buffers live) nothing is forced.
    // The KV cache is a preallocated pool (2,592,768 token slots, more than one sequence's
    // 32,768): the step is the chunk at its smallest context, whose largest layer peak is the
    // logits'.
    let t = m.tensors.as_ref().expect("the step is modelled");
    assert_eq!(t.title, "logits layer's peak, chunk 4,128 at context 4,128");
    assert!(!t.rows.is_empty());
    assert!(
        t.rows
            .iter()
            .all(|r| r.observed_bytes.is_none() && r.basis.starts_with("unmatched")),
        "{t:#?}"
    );
    assert_eq!(t.matched_observed_bytes(), 0);
    let kv = m.parts.iter().find(|p| p.category == "KV cache").unwrap();
    assert_eq!(kv.observed_bytes, 84_959_821_824);
    let f = m.forecast.expect("the device's total is the limit");
    assert_eq!(f.context_tokens, 0);
    assert_eq!(f.kv_pool_tokens, Some(84_959_821_824 / per_token));
    assert_eq!(f.limit_bytes, 150_109_880_320); // the H200 total recorded in the trace
    // No context past the longest sequence the model takes (32,768) is searched: the pool's
    // 2.6 M slots are room for many sequences, not one context, and this card holds the longest.
    assert_eq!((f.largest_context, f.capped), (Some(32_768), true), "{f:?}");
    // The forecast agrees with itself: the next chunk fits exactly when the cliff lies past it.
    let fits = f.headroom_bytes() >= 0;
    assert_eq!(
        fits,
        f.largest_context
            .is_some_and(|l| l >= f.context_tokens + f.chunk_tokens),
        "{f:?}"
    );
}

/// `samples/h200/hf-generate-oom`: PyTorch refused under a 6 GiB per-process fraction. The
/// live view's forecast is against that limit, read from the refusal, not the 139.80 GiB card.
#[test]
fn the_forecast_is_against_the_limit_the_refusal_names() {
    let cfg = ModelConfig::from_path(sample("hf-generate-oom").join("config.json")).unwrap();
    let model = LiveModel::new(cfg, Runtime::Transformers, 4096, 1, None).unwrap();
    let mut s = source("hf-generate-oom").with_model(model);
    let updates = drain(&mut s);
    assert!(updates.iter().any(|u| matches!(u, Update::Failure(_))));
    let snap = s
        .snapshot(&SnapshotQuery {
            device: 0,
            pid: None,
            time_s: s.latest_s(),
        })
        .unwrap();
    let f = snap.model.unwrap().forecast.unwrap();
    assert_eq!(f.limit_bytes, 6 << 30, "{f:?}");
    assert_eq!(
        f.limit_label,
        "PyTorch's per-process limit, read from its refusal"
    );
}

/// `samples/h200/hf-prefill-qwen35` (transformers 5.17, fla 0.6.0, 16,384 tokens in one
/// forward) with its config: `p` puts the cursor on the peak, and there the table sets the
/// modelled GDN layer's peak beside the live tensors, as `compare` would.
#[test]
fn transformers_prefill_tensors_at_the_peak() {
    use vramtrace_viewer::tui::{App, ViewOptions};
    let cfg = ModelConfig::from_path(sample("hf-prefill-qwen35").join("config.json")).unwrap();
    let model = LiveModel::new(cfg, Runtime::Transformers, 16_384, 1, None).unwrap();
    let mut s = source("hf-prefill-qwen35").with_model(model);
    let mut app = App::new(ViewOptions::default());
    app.apply(drain(&mut s));
    // Where `p` puts the cursor: the peak of the bytes in use (the key itself is the viewer's
    // test). PyTorch's segments hold the live bytes flat at 4,020,397,828 B from before this
    // moment; the tensors in them peak here.
    let timeline = &app.device().unwrap().timeline;
    assert_eq!(timeline.peak().unwrap().bytes, 4_020_397_828);
    let peak = timeline.in_use_peak().unwrap();
    assert_eq!(peak.bytes, 4_020_397_828 - 323_403_776);
    let snap = s
        .snapshot(&SnapshotQuery {
            device: 0,
            pid: None,
            time_s: peak.time_s,
        })
        .unwrap();
    let total: u64 = snap.breakdown.iter().map(|e| e.bytes).sum();
    assert_eq!(total, 4_020_397_828); // the device's peak, as `summary` gives it
    let m = snap.model.expect("a model was given");
    let t = m.tensors.expect("the step is modelled");
    // The context read from the KV cache (44,433,408 B ÷ 4,096 B a token = 10,848) is less
    // than a chunk: the step that holds it is the first chunk, 16,384 tokens.
    assert_eq!(t.title, "gdn layer's peak, chunk 16,384 at context 16,384");
    // PyTorch's 153 live tensors, by the bytes the program asked for (their blocks, 7,680 B
    // more in 512-byte granules, are 3,629,727,744 B: PyTorch's printed peak).
    assert_eq!((t.live_count, t.live_bytes), (153, 3_629_720_064));
    let rows: Vec<(&str, u64, Option<u64>, &str, &str)> = t
        .rows
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.modelled_bytes,
                r.observed_bytes,
                r.line.as_str(),
                r.basis.as_str(),
            )
        })
        .collect();
    const MB64: u64 = 64 * MIB;
    const MB128: u64 = 128 * MIB;
    let file = "frame in its file";
    let line = "frame at its line";
    assert_eq!(
        rows,
        [
            // transformers' own tensors: the model cites modeling_qwen3_5.py without a line,
            // so a frame in that file among the allocation's innermost eight (under torch's
            // embedding, linear and silu; the line shown is that frame) and the size back
            // them; the three 64 MiB hidden-state tensors pair in time order.
            (
                "inputs_embeds",
                MB64,
                Some(MB64),
                "modeling_qwen3_5.py:1254 forward",
                file
            ),
            (
                "hidden_states",
                MB64,
                Some(MB64),
                "modeling_qwen3_5.py:912 forward",
                file
            ),
            (
                "residual",
                MB64,
                Some(MB64),
                "modeling_qwen3_5.py:855 forward",
                file
            ),
            (
                "z",
                MB128,
                Some(MB128),
                "modeling_qwen3_5.py:568 forward",
                file
            ),
            ("b", MIB, Some(MIB), "modeling_qwen3_5.py:571 forward", file),
            ("a", MIB, Some(MIB), "modeling_qwen3_5.py:572 forward", file),
            // The causal conv's torch fallback, defined in the same file.
            (
                "mixed_qkv (conv)",
                2 * MB128,
                Some(2 * MB128),
                "modeling_qwen3_5.py:288 causal_conv1d_fn",
                file
            ),
            // The lines transformers 5.17 allocates them at.
            (
                "beta",
                MIB,
                Some(MIB),
                "modeling_qwen3_5.py:617 forward",
                line
            ),
            (
                "g",
                2 * MIB,
                Some(2 * MIB),
                "modeling_qwen3_5.py:619 forward",
                line
            ),
            // Cited as `:621/622`: either of the two lines backs either tensor.
            (
                "query (repeated)",
                MB128,
                Some(MB128),
                "modeling_qwen3_5.py:621 forward",
                line
            ),
            (
                "key (repeated)",
                MB128,
                Some(MB128),
                "modeling_qwen3_5.py:622 forward",
                line
            ),
            // fla 0.6.0's kernels, each at the line the model cites.
            (
                "value (contiguous)",
                MB128,
                Some(MB128),
                "decorators.py:93 _contiguous_if_needed",
                line
            ),
            (
                "q (l2norm)",
                MB128,
                Some(MB128),
                "l2norm.py:117 l2norm_fwd",
                line
            ),
            (
                "q_rstd",
                2 * MIB,
                Some(2 * MIB),
                "l2norm.py:128 l2norm_fwd",
                line
            ),
            (
                "k (l2norm)",
                MB128,
                Some(MB128),
                "l2norm.py:117 l2norm_fwd",
                line
            ),
            (
                "k_rstd",
                2 * MIB,
                Some(2 * MIB),
                "l2norm.py:128 l2norm_fwd",
                line
            ),
            (
                "g (cumsum)",
                2 * MIB,
                Some(2 * MIB),
                "cumsum.py:278 chunk_local_cumsum_scalar",
                line
            ),
            (
                "A",
                MB64,
                Some(MB64),
                "chunk_fwd.py:385 chunk_gated_delta_rule_fwd_intra",
                line
            ),
            (
                "w",
                MB128,
                Some(MB128),
                "wy_fast.py:273 recompute_w_u_fwd",
                line
            ),
            (
                "u",
                MB128,
                Some(MB128),
                "wy_fast.py:274 recompute_w_u_fwd",
                line
            ),
            (
                "h",
                2 * MB128,
                Some(2 * MB128),
                "chunk_delta_h.py:722 chunk_gated_delta_rule_fwd_h",
                line
            ),
            (
                "final_state",
                2 * MIB,
                Some(2 * MIB),
                "chunk_delta_h.py:723 chunk_gated_delta_rule_fwd_h",
                line
            ),
            (
                "v_new",
                MB128,
                Some(MB128),
                "chunk_delta_h.py:725 chunk_gated_delta_rule_fwd_h",
                line
            ),
            ("o", MB128, Some(MB128), "chunk_o.py:565 chunk_fwd_o", line),
        ]
    );
    // Every modelled tensor of the layer's peak is live, to the byte: 2,161,115,136 B, the
    // model's activations at this step (the figure `report` sets beside the trace).
    assert_eq!(t.modelled_bytes(), 2_161_115_136);
    assert_eq!(t.matched_modelled_bytes(), t.modelled_bytes());
    assert_eq!(t.matched_observed_bytes(), t.modelled_bytes());
}

/// The table is made once per live set: asked again with the same key and context, the live
/// set is not read; a new key reads it.
#[test]
fn the_tensor_table_is_kept_while_the_live_set_stays() {
    use vramtrace::attribution::Observed;
    use vramtrace_view_model::BreakdownEntry;
    let cfg = ModelConfig::from_path(sample("hf-prefill-qwen35").join("config.json")).unwrap();
    let mut model = LiveModel::new(cfg, Runtime::Transformers, 16_384, 1, None).unwrap();
    let breakdown = [BreakdownEntry {
        label: "activations".into(),
        bytes: 128 * MIB,
    }];
    // fla 0.6.0's `o`, made where the model cites it.
    let o = || Observed {
        size: 128 * MIB,
        t_ns: 1,
        ptr: "0x7f0000000000".into(),
        api: vramtrace::attribution::PYTORCH_BLOCK_API,
        name: None,
        label: None,
        failed: false,
        frames: vec!["chunk_o.py:565 chunk_fwd_o".into()],
        frame_files: vec!["/site/fla/ops/common/chunk_o.py".into()],
        op: None,
    };
    let first = model.at(&breakdown, None, None, 1, || vec![o()]);
    let t = first.tensors.as_ref().unwrap();
    let row = t.rows.iter().find(|r| r.name == "o").unwrap();
    assert_eq!(row.observed_bytes, Some(128 * MIB));
    assert_eq!(row.basis, "frame at its line");
    assert_eq!(t.matched_observed_bytes(), 128 * MIB);
    let again = model.at(&breakdown, None, None, 1, || {
        panic!("the live set was read again")
    });
    assert_eq!(again, first);
    let empty = model.at(&breakdown, None, None, 2, Vec::new);
    assert_eq!(empty.tensors.unwrap().matched_observed_bytes(), 0);
}

/// transformers serve's paged cache (`samples/h200/hf-serve-cb`'s model, the bytes the live view
/// showed on the H200 on 2026-12-01): 84,959,821,824 B of KV cache are 2,592,768 token slots of
/// 32,768 B, more than the 32,768 tokens one sequence can hold, so they are a preallocated pool,
/// not a context. The forecast sets a chunk at its smallest step beside the pool and the other
/// parts as they stand, where it once read a context of 2,592,768 tokens and a cliff.
#[test]
fn a_preallocated_kv_pool_is_not_a_context() {
    use vramtrace_view_model::BreakdownEntry;
    use vramtrace_viewer::tui::forecast_text;
    let cfg = ModelConfig::from_path(sample("hf-serve-cb").join("config.json")).unwrap();
    let mut model = LiveModel::new(cfg, Runtime::Transformers, 1500, 256, None).unwrap();
    let row = |label: &str, bytes: u64| BreakdownEntry {
        label: label.into(),
        bytes,
    };
    let breakdown = [
        row("weights", 1_812_091_904),
        row("KV cache", 84_959_821_824),
        row("engine buffers", 42_627_040_768),
        row("activations", 32 * MIB),
    ];
    let card = 150_113_001_472; // the H200's 139.80 GiB
    let m = model.at(&breakdown, Some(card), None, 1, Vec::new);
    let f = m.forecast.unwrap();
    assert_eq!(f.kv_pool_tokens, Some(2_592_768));
    assert_eq!(f.context_tokens, 0);
    let kv = m.parts.iter().find(|p| p.category == "KV cache").unwrap();
    assert_eq!(kv.modelled_bytes, Some(84_959_821_824));
    assert!(
        kv.rests_on
            .contains("preallocated pool of 2592768 token slots"),
        "{kv:?}"
    );
    // The chunk's step: the parts as they stand and a chunk's activations, well inside the card.
    assert!(f.headroom_bytes() > 0, "{f:?}");
    assert!(
        forecast_text(&f).starts_with("KV pool 2,592,768 tok preallocated · a chunk (1,500 tok) "),
        "{}",
        forecast_text(&f)
    );
    // Without the pool's rule (a config with no max_position_embeddings) the same bytes read
    // as a context of 2,592,768 tokens.
    let mut raw: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(sample("hf-serve-cb").join("config.json")).unwrap(),
    )
    .unwrap();
    raw.as_object_mut()
        .unwrap()
        .remove("max_position_embeddings");
    let cfg = ModelConfig::from_json(&raw, std::path::Path::new("config.json")).unwrap();
    let mut model = LiveModel::new(cfg, Runtime::Transformers, 1500, 256, None).unwrap();
    let f = model
        .at(&breakdown, Some(card), None, 1, Vec::new)
        .forecast
        .unwrap();
    assert_eq!((f.kv_pool_tokens, f.context_tokens), (None, 2_592_768));
}

/// `VRAMTRACE_LIVE_LOG` (here given as a file): a line per read of the files, with the timed
/// items read and the trace time reached, and a line per snapshot at the live edge.
#[test]
fn the_poll_log_says_what_each_read_brought_and_how_far_it_reached() {
    let dir = vramtrace_testkit::scratch("live-poll-log");
    let path = dir.join("polls.log");
    let mut s = source("hf-serve-cb").with_poll_log(std::fs::File::create(&path).unwrap());
    drain(&mut s);
    let latest = s.latest_s();
    s.snapshot(&SnapshotQuery {
        device: 0,
        pid: None,
        time_s: latest,
    })
    .unwrap();
    let log = std::fs::read_to_string(&path).unwrap();
    let reads: Vec<(usize, f64)> = log
        .lines()
        .filter(|l| l.contains(" items "))
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            (w[2].parse().unwrap(), w[8].parse().unwrap())
        })
        .collect();
    assert!(!reads.is_empty(), "{log}");
    assert!(reads.iter().map(|r| r.0).sum::<usize>() > 1000, "{log}");
    let reached = reads.last().unwrap().1;
    assert!((reached - latest).abs() < 1e-3, "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains(" snapshot_ms ") && l.contains(&format!("at_s {latest:.3}"))),
        "{log}"
    );
}
