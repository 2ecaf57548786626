//! The timeline fold at the tensor level on real H200 samples with tensor records: tensors by
//! category, PyTorch's segments' unused bytes as the allocator reserve band, and the stack moving
//! while the driver sees nothing (segments cached).

use std::path::PathBuf;

use vramtrace::categories::Category;
use vramtrace::timeline::{fold, fold_with};
use vramtrace::trace::Trace;
use vramtrace_view_model::Update;

fn samples_of(name: &str) -> Vec<(f64, Vec<u64>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("samples/h200")
        .join(name);
    let trace = Trace::open(&dir).unwrap();
    fold(&trace)
        .unwrap()
        .into_iter()
        .filter_map(|u| match u {
            Update::Sample { device: 0, point } => Some((point.time_s, point.by_category)),
            _ => None,
        })
        .collect()
}

/// Counted on this sample: of its 71 samples, 66 move while the segments stand still (before
/// tensors were folded, none could: the stack was the segments).
const MOVED_WITH_SEGMENTS_CACHED: usize = 66;

const RESERVE: usize = Category::AllocatorReserve as usize;

fn in_use(cats: &[u64]) -> u64 {
    cats.iter().sum::<u64>() - cats[RESERVE]
}

/// fla's chunked GDN with caching on (`samples/h200/pytorch-gdn-cache`): 9 segments of 908 MiB
/// stay cached; `summary` gives the tensor peak as 659.70 MiB with 248.30 MiB reserved but
/// unallocated.
#[test]
fn fla_with_caching_on_is_stacked_by_tensor() {
    let s = samples_of("pytorch-gdn-cache");
    let peak = s.iter().max_by_key(|p| in_use(&p.1)).unwrap();
    assert_eq!(in_use(&peak.1), 691_747_840); // 659.70 MiB of tensors
    assert_eq!(peak.1[RESERVE], 260_359_168); // 248.30 MiB
    assert_eq!(peak.1.iter().sum::<u64>(), 952_107_008); // the segments, 908 MiB
    // The activations of the breakdown at the peak (400.70 MiB, `summary`): the script's own
    // inputs are activations by their lifetimes there, not unnamed as when they were made.
    assert_eq!(peak.1[Category::Activations as usize], 420_166_656);
    assert_eq!(peak.1[Category::Unnamed as usize], 0);
    assert_eq!(peak.1[Category::Autotune as usize], 268_435_456);
    // Every tensor freed at the end: the segments are all reserve.
    let last = s.last().unwrap();
    assert_eq!(last.1[RESERVE], 952_107_008);
    assert_eq!(in_use(&last.1), 0);
    // The view moves though the driver's bytes stand still: samples whose tensor level differs
    // from the previous sample's while the segments' total does not.
    let moved = s
        .windows(2)
        .filter(|w| {
            w[0].1.iter().sum::<u64>() == w[1].1.iter().sum::<u64>()
                && in_use(&w[0].1) != in_use(&w[1].1)
        })
        .count();
    assert_eq!(moved, MOVED_WITH_SEGMENTS_CACHED);
}

/// `transformers serve --continuous-batching` (`samples/h200/hf-serve-cb`): `summary` gives the
/// tensor peak as 120.95 GiB; the fold's highest point holds exactly those tensor bytes, plus
/// 64.15 MiB of driver allocations outside PyTorch's segments (context and modules).
#[test]
fn transformers_serve_is_stacked_by_tensor() {
    let s = samples_of("hf-serve-cb");
    let peak = s.iter().max_by_key(|p| in_use(&p.1)).unwrap();
    let context = peak.1[Category::Context as usize];
    assert_eq!(context, 67_266_308);
    assert_eq!(in_use(&peak.1) - context, 129_872_910_848);
    assert_eq!(peak.1[Category::KvCache as usize], 84_959_821_824);
    assert_eq!(peak.1[Category::Unnamed as usize], 0);
    assert!(peak.1[RESERVE] > 0);
}

/// The timeline plot's second axis and limit: the chunks the labels name
/// (`samples/h200/prefill-18gib`: the reference workload's `prefill/chunk.N/…` ranges) and the
/// limit PyTorch enforced (`samples/h200/torch-oom`: `set_per_process_memory_fraction` to
/// 24 GiB).
#[test]
fn chunks_and_the_enforced_limit() {
    let open = |name: &str| {
        Trace::open(
            &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("samples/h200")
                .join(name),
        )
        .unwrap()
    };
    let (marks, limit) = vramtrace::plots::marks_and_limit(&open("prefill-18gib")).unwrap();
    let names: Vec<&str> = marks.iter().map(|m| m.1.as_str()).collect();
    assert_eq!(names, ["chunk 0", "chunk 1", "chunk 2"]);
    assert!(marks.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(limit, None);
    let (marks, limit) = vramtrace::plots::marks_and_limit(&open("torch-oom")).unwrap();
    assert!(marks.is_empty());
    assert_eq!(limit, Some(24 << 30));
}

/// `plot --kind lines`: the tensors at their peak by Python line (`samples/h200/hf-serve-cb`:
/// 120.95 GiB of tensors at 5.012 s, `summary`).
#[test]
fn tensors_by_line_plot() {
    let trace =
        Trace::open(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/hf-serve-cb"))
            .unwrap();
    let p = vramtrace::plots::lines(&trace, None, 20).unwrap();
    assert_eq!(
        p.rows[0].tensor,
        "input_outputs.py:185 _setup_static_tensors ×1"
    );
    assert_eq!(p.rows[1].tensor, "cache.py:251 __init__ ×16");
    assert!(p.rows.iter().all(|r| r.predicted_bytes.is_none()));
    let total: u64 = p.rows.iter().filter_map(|r| r.observed_bytes).sum();
    assert_eq!(total, 129_872_910_848);
    // At most `top` lines, the rest in one row.
    let short = vramtrace::plots::lines(&trace, None, 3).unwrap();
    assert_eq!(short.rows.len(), 4);
    assert!(
        short.rows[3].tensor.ends_with("more lines"),
        "{:?}",
        short.rows[3]
    );
    assert_eq!(
        short
            .rows
            .iter()
            .filter_map(|r| r.observed_bytes)
            .sum::<u64>(),
        129_872_910_848
    );
    // A trace without tensor records says so.
    let none =
        Trace::open(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/prefill-18gib"))
            .unwrap();
    assert!(vramtrace::plots::lines(&none, None, 20).is_err());
}

/// The samples of device 0 in `updates`: time and bytes by category.
fn device0(updates: Vec<Update>) -> Vec<(f64, Vec<u64>)> {
    updates
        .into_iter()
        .filter_map(|u| match u {
            Update::Sample { device: 0, point } => Some((point.time_s, point.by_category)),
            _ => None,
        })
        .collect()
}

/// The failure of `samples/h200/torch-oom` (tensors of the script's own lines, which frames
/// alone leave unnamed): the timeline's bytes per category at the failure's time are the
/// report's breakdown there (which knows their lifetimes), and the unnamed band never holds
/// more than the breakdown's.
#[test]
fn torch_oom_timeline_agrees_with_the_breakdown() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/torch-oom");
    let trace = Trace::open(&dir).unwrap();
    let at = vramtrace::categoriser::first_failure(&trace)
        .unwrap()
        .unwrap();
    let b = vramtrace::categoriser::breakdown_at(
        &trace,
        at,
        vramtrace::categoriser::Expectations::default(),
    )
    .unwrap();
    let updates = fold(&trace).unwrap();
    let failed_at = updates
        .iter()
        .find_map(|u| match u {
            Update::Failure(f) => Some(f.time_s),
            _ => None,
        })
        .unwrap();
    let s = device0(updates);
    let at_failure = &s.iter().rfind(|p| p.0 == failed_at).unwrap().1;
    // The breakdown's rows (`summary`: weights 10.40 GiB, KV cache 6.44 GiB, recurrent state
    // 37.06 MiB, activations 2.97 GiB), byte for byte.
    let expected = [
        (Category::Weights, 11_168_645_120),
        (Category::KvCache, 6_919_421_952),
        (Category::State, 38_862_848),
        (Category::Activations, 3_189_318_656),
        (Category::AllocatorReserve, 3_149_126_656),
        (Category::Unnamed, 33_554_432),
    ];
    for (c, bytes) in expected {
        assert_eq!(b.bytes(c), bytes, "{c:?} in the breakdown");
        assert_eq!(at_failure[c as usize], bytes, "{c:?} in the timeline");
    }
    // Categorised as made, the same live set was nearly all unnamed.
    let made = device0(fold_with(&trace, Default::default()).unwrap());
    let made_at_failure = &made.iter().rfind(|p| p.0 == failed_at).unwrap().1;
    assert!(made_at_failure[Category::Unnamed as usize] > 10 << 30);
    assert_eq!(made_at_failure[Category::KvCache as usize], 0);
    // Stacks not live at the failure keep their category as made: counted on this sample, the
    // unnamed band is at most 638.58 MiB (categorised as made: 20.98 GiB).
    let unnamed_max =
        |s: &[(f64, Vec<u64>)]| s.iter().map(|p| p.1[Category::Unnamed as usize]).max();
    assert_eq!(unnamed_max(&s), Some(669_597_696));
    assert_eq!(unnamed_max(&made), Some(22_528_992_256));
}

/// The verdicts at the moment only move bytes between categories: every sample of
/// `samples/h200/hf-serve-cb` and `samples/h200/torch-oom` has the same time and total as when
/// categorised as made.
#[test]
fn the_moment_s_categories_keep_the_totals() {
    for name in ["hf-serve-cb", "torch-oom"] {
        let trace = Trace::open(
            &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("samples/h200")
                .join(name),
        )
        .unwrap();
        let total = |s: Vec<(f64, Vec<u64>)>| {
            s.into_iter()
                .map(|(t, c)| (t, c.iter().sum::<u64>(), c[RESERVE]))
                .collect::<Vec<_>>()
        };
        let now = total(device0(fold(&trace).unwrap()));
        let made = total(device0(fold_with(&trace, Default::default()).unwrap()));
        assert!(!now.is_empty());
        assert_eq!(now, made, "{name}");
    }
}
