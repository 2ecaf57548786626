//! The categoriser on the real H200 samples: every byte of a moment in a category, with the
//! evidence it rests on, pinned to the byte.

use std::path::PathBuf;

use vramtrace::Trace;
use vramtrace::categoriser::{
    At, Breakdown, Category, Evidence, Expectations, Lifetime, breakdown_at, first_failure, peak,
};

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("samples/h200")
        .join(name)
}

fn at_failure(name: &str) -> (Trace, At) {
    let trace = Trace::open(&sample(name)).unwrap();
    let at = first_failure(&trace)
        .unwrap()
        .expect("the sample ran out of memory");
    (trace, at)
}

/// (category, bytes, count) of every row, in order.
fn rows(b: &Breakdown) -> Vec<(Category, u64, usize)> {
    b.rows
        .iter()
        .map(|r| (r.category, r.bytes, r.count))
        .collect()
}

fn evidence(b: &Breakdown, c: Category) -> Vec<(String, u64, usize)> {
    b.rows
        .iter()
        .find(|r| r.category == c)
        .map(|r| {
            r.evidence
                .iter()
                .map(|l| (l.evidence.to_string(), l.bytes, l.count))
                .collect()
        })
        .unwrap_or_default()
}

fn sums_to_total(b: &Breakdown) {
    assert_eq!(b.rows.iter().map(|r| r.bytes).sum::<u64>(), b.total);
}

/// A real allocator OOM under a 24 GiB cap (scripts/validate/torch_prefill.py, 16 layers, the
/// 26th chunk failing in attention layer 3): weights made before the first chunk, the K/V kept
/// by every chunk (one line, 102 buffers), the GDN states replaced each chunk, the chunk's
/// activations and the previous chunk's `vc` not yet reassigned, the caching allocator's
/// reserve as PyTorch's message says it (2.93 GiB), cuBLAS's and cuDNN's own allocations and
/// the untraced context; 32 MiB unnamed.
#[test]
fn torch_oom_at_the_failure() {
    let (trace, at) = at_failure("torch-oom");
    let b = breakdown_at(&trace, at, Expectations::default()).unwrap();
    assert_eq!(
        rows(&b),
        [
            (Category::Weights, 11_168_645_120, 64),
            (Category::KvCache, 6_919_421_952, 102),
            (Category::State, 38_862_848, 12),
            (Category::Activations, 3_189_318_656, 8),
            (Category::AllocatorReserve, 3_149_126_656, 0),
            (Category::Context, 730_660_864, 5),
            (Category::Unnamed, 33_554_432, 1),
        ]
    );
    // The weights: 12 GDN and 4 attention layers of Qwen3.6-27B's shapes in bf16, 64 tensors
    // of line 33, made before the first chunk.
    assert_eq!(
        evidence(&b, Category::Weights),
        [(
            "lifetime: made before the first step, never freed".to_string(),
            11_168_645_120,
            64
        )]
    );
    // PyTorch's cuBLAS workspace (32 MiB, through the caching allocator), left by the warm-up's
    // first matmul: no rule names it, and the lifetime does not make it weights.
    assert_eq!(
        evidence(&b, Category::Unnamed),
        [(
            "no rule; at torch_prefill.py:55 prefill".to_string(),
            33_554_432,
            1
        )]
    );
    sums_to_total(&b);
    // The device's used memory at the failure: total − free as the driver said.
    assert_eq!(b.total, 150_109_880_320 - 124_880_289_792);
    // Reserved but unallocated: PyTorch's 22.82 GiB reserved − 19.88 GiB allocated, not the
    // driver's 22.88 GiB (cuBLAS's 64 MiB workspace is not a segment).
    assert_eq!(b.bytes(Category::AllocatorReserve), 3_149_126_656);
    let largest = &b.segments[0];
    assert_eq!(
        (largest.size, largest.reserve, largest.largest_free_block),
        (1_218_445_312, 931_004_416, 931_004_416)
    );
    assert_eq!(b.segments.len(), 60);
    assert_eq!(
        evidence(&b, Category::KvCache),
        [(
            "lifetime: its line keeps tensors of 25 earlier steps (grows)".to_string(),
            6_919_421_952,
            102
        )]
    );
    assert_eq!(
        evidence(&b, Category::Context),
        [
            (
                "untraced: total 139.80 GiB − free 116.30 GiB − traced 22.88 GiB (the driver's \
                 figures at the failure)"
                    .to_string(),
                663_394_556,
                0
            ),
            (
                "native frame in libcublas.so.13 (not the traced file) (rule: cuBLAS handle \
                 workspace)"
                    .to_string(),
                67_240_960,
                3
            ),
            (
                "native frame in libcudnn_graph.so.9 (not the traced file) (rule: cuDNN handle \
                 workspace)"
                    .to_string(),
                25_348,
                2
            ),
        ]
    );
    let act = &b.rows[3];
    assert!(act.evidence.iter().any(|l| l.evidence
        == Evidence::Lifetime {
            lifetime: Lifetime::Lingering
        }
        && l.bytes == 1_268_776_960));
}

/// The workload's prefill under an 18 GiB card (a 121.29 GiB ballast): NVTX labels name
/// weights, K/V and GDN state; the chunk's kernel ranges are activations; 772.5 MiB untraced.
#[test]
fn prefill_18gib_at_the_failure() {
    let (trace, at) = at_failure("prefill-18gib");
    let b = breakdown_at(&trace, at, Expectations::default()).unwrap();
    assert_eq!(
        rows(&b),
        [
            (Category::Weights, 17_776_688_128, 67),
            (Category::KvCache, 811_597_824, 48),
            (Category::State, 157_089_792, 97),
            (Category::Activations, 247_681_072, 16),
            (Category::Context, 810_021_840, 0),
            (Category::OtherProcess, 130_230_124_544, 1),
        ]
    );
    sums_to_total(&b);
    assert_eq!(b.total, 150_109_880_320 - 76_677_120);
}

/// Two NCCL ranks: NCCL's own buffers (libnccl.so.2 frames) are communication; the 1 GiB tensor
/// the program made at line 67 is not, although NCCL's range is still open over it.
#[test]
fn nccl_ranks_at_their_peaks() {
    let trace = Trace::open(&sample("nccl-stages")).unwrap();
    for pi in 0..trace.processes.len() {
        let device = trace.processes[pi].devices[0].ordinal;
        let at = peak(&trace, pi, device).unwrap().unwrap();
        let b = breakdown_at(&trace, at, Expectations::default()).unwrap();
        assert_eq!(
            rows(&b),
            [
                (Category::Communication, 809_500_672, 16),
                (Category::AllocatorReserve, 270_532_096, 0),
                (Category::Unnamed, 1_073_742_336, 2),
            ],
            "process {pi}"
        );
        assert_eq!(
            evidence(&b, Category::Unnamed),
            [
                ("no rule; at nccl_stages.py:67 main".to_string(), 1 << 30, 1),
                ("no rule; at nccl_stages.py:65 main".to_string(), 512, 1),
            ]
        );
        sums_to_total(&b);
    }
}

/// Expandable segments filling the card: 7,130 physical handles, counted where they are (not
/// mapped), and the context the driver's figures leave.
#[test]
fn expandable_segments_handles_at_the_failure() {
    let (trace, at) = at_failure("v2-torch-expandable");
    let b = breakdown_at(&trace, at, Expectations::default()).unwrap();
    assert_eq!(
        rows(&b),
        [
            (Category::Context, 552_402_944, 0),
            (Category::Unnamed, 149_550_006_272, 7130),
        ]
    );
    assert_eq!(
        evidence(&b, Category::Unnamed)[0],
        (
            "no rule; at torch_capture.py:44 main".to_string(),
            149_484_994_560,
            7128
        )
    );
    sums_to_total(&b);
}

/// Triton's autotuning flush buffer lands in its own 256 MiB segments, left as reserve; fla's
/// intermediates are activations by their frames.
#[test]
fn fla_gdn_peak_tensors_by_frames() {
    let trace = Trace::open(&sample("pytorch-gdn-cache")).unwrap();
    let at = peak(&trace, 0, 0).unwrap().unwrap();
    let b = breakdown_at(&trace, at, Expectations::default()).unwrap();
    assert_eq!(
        rows(&b),
        [
            (Category::State, 3_145_728, 1),
            (Category::Activations, 420_166_656, 13),
            (Category::AllocatorReserve, 528_794_624, 0),
        ]
    );
    assert!(
        evidence(&b, Category::Activations).contains(&(
            "frame chunk_delta_h.py:722 chunk_gated_delta_rule_fwd_h (rule: \
         fla/ops/gated_delta_rule/chunk.py:chunk_gated_delta_rule_fwd)"
                .to_string(),
            102_236_160,
            1
        ))
    );
    sums_to_total(&b);
}

/// The config's figures beside the rows they check: the workload's weights are what
/// `vramtrace-models` computes for Qwen3.6-27B (bf16, one rank), and its GDN state one
/// sequence's state for every GDN layer.
#[test]
fn prefill_18gib_against_its_config() {
    use vramtrace_models::{DType, ModelConfig, WeightFormat};
    let cfg = ModelConfig::from_path(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/models/Qwen3.6-27B/config.json"),
    )
    .unwrap();
    let expect = Expectations::from_config(&cfg, 1, WeightFormat::Bf16, DType::BF16, 0, 1).unwrap();
    assert_eq!(
        (expect.weight_bytes, expect.kv, expect.state_bytes),
        (Some(53_791_996_928), None, Some(153_944_064))
    );
    let (trace, at) = at_failure("prefill-18gib");
    let b = breakdown_at(&trace, at, expect).unwrap();
    // The workload loads fewer layers than the config has: the check says so, in numbers.
    assert!(evidence(&b, Category::Weights).contains(&(
        "the config gives 50.10 GiB, 16.56 GiB seen".to_string(),
        0,
        0
    )));
    // The GDN state labelled is exactly one sequence's; fla's 3 MiB initial_state is beside it.
    assert!(evidence(&b, Category::State).contains(&(
        "the config gives 146.81 MiB, 149.81 MiB seen".to_string(),
        0,
        0
    )));
    assert_eq!(b.bytes(Category::Weights), 17_776_688_128);
    sums_to_total(&b);
}

/// One moment per process and device: the first out-of-memory, else the peak.
#[test]
fn moments_of_every_device() {
    use vramtrace::categoriser::{MomentKind, moments};
    let trace = Trace::open(&sample("torch-oom")).unwrap();
    let m = moments(&trace).unwrap();
    assert_eq!(
        m,
        [(first_failure(&trace).unwrap().unwrap(), MomentKind::Failure)]
    );
    let trace = Trace::open(&sample("nccl-stages")).unwrap();
    let m = moments(&trace).unwrap();
    assert_eq!(m.len(), 2);
    for (at, kind) in m {
        assert_eq!(kind, MomentKind::Peak);
        assert_eq!(Some(at), peak(&trace, at.process, at.device).unwrap());
    }
}

/// `transformers serve --continuous-batching` on the H200 (`samples/h200/hf-serve-cb`, recorded
/// on main at 656eb47, committed beside this test): the paged KV cache
/// by `PagedAttentionCache.__init__`'s two lines, the engine's static buffers by
/// `_setup_static_tensors`, the weights by `caching_allocator_warmup`, and nothing unnamed. The
/// numbers are the driver-level reading (a reader that knows the native tensor records may move
/// a little of each line into the allocator's reserve: within 0.1 %).
#[test]
fn transformers_serve_is_every_byte_named() {
    let dir = sample("hf-serve-cb");
    let trace = Trace::open(&dir).unwrap();
    let at = peak(&trace, 0, 0).unwrap().unwrap();
    let b = breakdown_at(&trace, at, Expectations::default()).unwrap();
    sums_to_total(&b);
    assert!(
        b.bytes(Category::Unnamed) * 100 < b.total * 5,
        "{} of {} unnamed",
        b.bytes(Category::Unnamed),
        b.total
    );
    let near = |x: u64, want: u64| x.abs_diff(want) * 1000 <= want;
    let kv = b
        .rows
        .iter()
        .find(|r| r.category == Category::KvCache)
        .unwrap();
    for line in [251, 252] {
        let l = kv
            .evidence
            .iter()
            .find(|l| {
                matches!(&l.evidence, Evidence::Frame { file, function, line: n, .. }
                    if file.ends_with("continuous_batching/cache.py") && function == "__init__" && *n == line)
            })
            .unwrap_or_else(|| panic!("no KV line cache.py:{line} in {kv:?}"));
        assert_eq!(l.count, 16);
        assert!(near(l.bytes, 42_479_910_912), "{}", l.bytes);
    }
    assert!(near(b.bytes(Category::EngineBuffers), 42_626_711_552));
    assert!(b.bytes(Category::Weights) >= 1_811_939_328);
}
