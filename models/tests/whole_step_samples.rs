//! The whole-step model against the failures the samples observed: for each, the observed
//! config and serving shape, the limit that was enforced and the parts a trace knows; the model
//! must say the failing step does not fit, the step before it (which the run completed) fits,
//! and every category's residual against the observed bytes is pinned as an exact number.
//!
//! The observed bytes per category were read from the samples' traces with `vramtrace events`
//! (each allocation live at the failure, grouped by its label, or by its Python line for the
//! PyTorch sample), and are written here with how they were grouped; the failed request is
//! counted in `activations`, as the step needed it.

use std::collections::BTreeMap;
use std::path::Path;

use vramtrace_models::{
    Category, ChunkFloor, KnownParts, Limit, ModelConfig, Residuals, Runtime, ServingShape,
    StepBreakdown, StepLayer, StepModel, StepVariants, residuals, vllm_hybrid_block_size,
};

const GIB: u64 = 1 << 30;
const CHUNK: u64 = 4128;

fn qwen36() -> ModelConfig {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../samples/models/Qwen3.6-27B/config.json");
    ModelConfig::from_path(p).unwrap()
}

fn workload(known: KnownParts) -> StepModel {
    let c = qwen36();
    StepModel::new(
        c.clone(),
        StepVariants::for_runtime(Runtime::Workload, &c),
        known,
    )
}

fn observed(parts: &[(&str, u64)]) -> BTreeMap<String, u64> {
    parts.iter().map(|&(c, b)| (c.to_string(), b)).collect()
}

/// Each category's residual, as `(name, residual)`.
fn residual_of(r: &Residuals) -> Vec<(&'static str, i64)> {
    r.parts
        .iter()
        .map(|p| (p.category.key(), p.residual))
        .collect()
}

fn cause(r: &Residuals, c: Category) -> &str {
    &r.parts
        .iter()
        .find(|p| p.category == c)
        .unwrap()
        .likely_cause
}

fn verdict(b: &StepBreakdown) -> (bool, i64) {
    let l = b.limit.as_ref().unwrap();
    (l.fits, l.headroom)
}

/// What the workload's weights, GDN state and per-chunk KV blocks take (labels
/// `prefill/weights`, `prefill/gdn_state`, `prefill/kv_cache` in every workload trace).
const WL_WEIGHTS: u64 = 17_776_688_128;
const WL_STATE: u64 = 153_944_064;
/// One chunk's K/V in the 16 attention layers: 4128 tokens x 16 x 4 KiB.
const WL_KV_PER_CHUNK: u64 = 270_532_608;
/// The failing GDN layer's live set when `h` was refused: its inputs (`gdn/inputs`, 88,876,048)
/// and fla's tensors so far (`gdn/chunk_gated_delta_rule`, 161,950,752), plus the refused `h`
/// (102,236,160).
const WL_ACT_AT_H: u64 = 88_876_048 + 161_950_752 + 102_236_160;

/// `samples/h200/prefill-18gib`: the workload on the H200 held to 18 GiB by a ballast, out of
/// memory on `h` in chunk 2 (context 12,384 tokens). At the failure the driver said 76,677,120
/// bytes free and the process held 18,993,056,816 bytes besides the ballast, so 257,618,896
/// bytes of the 18 GiB went to what the trace does not see (context growth after the ballast,
/// the driver's rounding of each allocation): the model is given that as the context.
#[test]
fn prefill_18gib_the_failing_step_does_not_fit_and_the_one_before_does() {
    let context = 19_327_352_832 - 18_993_056_816 - 76_677_120;
    assert_eq!(context, 257_618_896);
    let m = workload(KnownParts {
        context: Some(context),
        ..KnownParts::default()
    });
    let c = qwen36();
    let limit = Limit::Card { capacity: 18 * GIB };
    let failing = m
        .check(&ServingShape::prefill(&c, CHUNK, 3 * CHUNK), &limit)
        .unwrap();
    assert_eq!(failing.weights, WL_WEIGHTS);
    assert_eq!(failing.kv_cache, 3 * WL_KV_PER_CHUNK);
    assert_eq!(failing.state, WL_STATE);
    // The step's largest layer is the MLP (gate_up + act + down), above the GDN layer's
    // 457,658,416 (its inputs with fla's full live set).
    assert_eq!(failing.activations.kind, StepLayer::Mlp);
    assert_eq!(failing.activations.bytes, 473_432_064);
    let gdn = failing
        .layers
        .iter()
        .find(|l| l.kind == StepLayer::Gdn)
        .unwrap();
    assert_eq!(gdn.bytes, 457_658_416);
    assert_eq!(failing.total, 19_473_280_976);
    assert_eq!(verdict(&failing), (false, -145_928_144));
    // Chunk 1 (context 8,256) completed in the run; the model agrees it fits.
    let before = m
        .check(&ServingShape::prefill(&c, CHUNK, 2 * CHUNK), &limit)
        .unwrap();
    assert_eq!(verdict(&before), (true, 124_604_464));

    let obs = observed(&[
        ("weights", WL_WEIGHTS),
        ("kv_cache", 811_597_824),
        ("state", WL_STATE),
        ("activations", WL_ACT_AT_H),
        ("context", context),
    ]);
    let r = residuals(&failing, &obs).unwrap();
    assert_eq!(
        residual_of(&r),
        [
            ("weights", 0),
            ("kv_cache", 0),
            ("state", 0),
            ("activations", 120_369_104),
            ("context", 0),
        ]
    );
    assert_eq!(r.observed_total, 19_352_911_872);
    assert_eq!(r.total_residual, 120_369_104);
    let why = cause(&r, Category::Activations);
    assert!(
        why.contains("the mlp layer peaks at 473432064 bytes"),
        "{why}"
    );
    assert_eq!(cause(&r, Category::Weights), "agrees");

    // The frontier: at the failing context no chunk of 4128 fits; the largest that does, and
    // the largest context at 4128, lie below the failure.
    let at = m
        .largest_chunk_at(
            &ServingShape::prefill(&c, CHUNK, 3 * CHUNK),
            &limit,
            &ChunkFloor::none(),
        )
        .unwrap();
    assert_eq!(at.largest_chunk, Some(2_855));
    let ctx = m
        .largest_context_at(&ServingShape::prefill(&c, CHUNK, CHUNK), &limit, 262_144)
        .unwrap();
    assert_eq!(ctx.largest_context, Some(10_157));
    assert!(!ctx.capped);
    // The frontier lies between the context the run completed and the one it failed at.
    assert!((2 * CHUNK..3 * CHUNK).contains(&10_157));
    assert!(at.largest_chunk.unwrap() < CHUNK);
}

/// `vramtrace demo --simulate` (the stand-in 24 GiB card, no context): out of memory on `h` in
/// chunk 27 (context 115,584 tokens); the stand-in said 13,431,760 bytes free and the process
/// held 25,756,372,016 (weights, 28 chunks of KV 7,574,913,024, state, and the GDN layer's
/// 250,826,800 so far). Chunk 26 completed.
#[test]
fn demo_on_the_stand_in_the_failing_step_does_not_fit() {
    let m = workload(KnownParts {
        context: Some(0),
        ..KnownParts::default()
    });
    let c = qwen36();
    let limit = Limit::Card { capacity: 24 * GIB };
    let failing = m
        .check(&ServingShape::prefill(&c, CHUNK, 28 * CHUNK), &limit)
        .unwrap();
    assert_eq!(failing.kv_cache, 7_574_913_024);
    assert_eq!(verdict(&failing), (false, -209_173_504));
    let before = m
        .check(&ServingShape::prefill(&c, CHUNK, 27 * CHUNK), &limit)
        .unwrap();
    assert_eq!(verdict(&before), (true, 61_359_104));

    let obs = observed(&[
        ("weights", WL_WEIGHTS),
        ("kv_cache", 7_574_913_024),
        ("state", WL_STATE),
        ("activations", WL_ACT_AT_H),
    ]);
    let r = residuals(&failing, &obs).unwrap();
    assert_eq!(
        residual_of(&r),
        [
            ("weights", 0),
            ("kv_cache", 0),
            ("state", 0),
            ("activations", 120_369_104),
            ("context", 0),
        ]
    );
    assert_eq!(r.total_residual, 120_369_104);

    // vLLM's align-mode floor at the seed's 4128-token block makes the chunk lever infeasible
    // here: not even one block fits at the failing context.
    let at = m
        .largest_chunk_at(
            &ServingShape::prefill(&c, CHUNK, 28 * CHUNK),
            &limit,
            &ChunkFloor::vllm_mamba_align(4128),
        )
        .unwrap();
    assert_eq!(at.largest_chunk, None);
    assert_eq!(at.at_floor, 25_978_977_280);
}

/// `samples/h200/demo-gpu.txt`: the demo on the H200 held to 24 GiB by a ballast, out of memory
/// on `o` in chunk 23 (context 99,072). Only the printed figures are kept: held besides the
/// ballast 24,830,741,552 bytes (weights, 24 chunks of KV, state, and the GDN layer's
/// 406,933,552 = 388.08 MiB, its whole live set but `o`), free "17.12 MiB", i.e. at most
/// 17,956,782 bytes. The context is taken at its smallest, 921,498,658 bytes (most of it the
/// driver's rounding of the 384 KV blocks of 16.125 MiB to 2 MiB pages), so the verdict holds
/// for any free figure that prints as 17.12 MiB. Chunk 22 completed.
#[test]
fn demo_on_the_h200_the_failing_step_does_not_fit() {
    let held = WL_WEIGHTS + 24 * WL_KV_PER_CHUNK + WL_STATE + 406_933_552;
    assert_eq!(held, 24_830_348_336);
    let context = 24 * GIB - held - 17_956_782;
    let m = workload(KnownParts {
        context: Some(context),
        ..KnownParts::default()
    });
    let c = qwen36();
    let limit = Limit::Card { capacity: 24 * GIB };
    let failing = m
        .check(&ServingShape::prefill(&c, CHUNK, 24 * CHUNK), &limit)
        .unwrap();
    assert_eq!(verdict(&failing), (false, -48_541_730));
    let before = m
        .check(&ServingShape::prefill(&c, CHUNK, 23 * CHUNK), &limit)
        .unwrap();
    assert_eq!(verdict(&before), (true, 221_990_878));
    let obs = observed(&[
        ("weights", WL_WEIGHTS),
        ("kv_cache", 24 * WL_KV_PER_CHUNK),
        ("state", WL_STATE),
        ("activations", 406_933_552 + 50_724_864),
        ("context", context),
    ]);
    let r = residuals(&failing, &obs).unwrap();
    // `o` completes the GDN layer's live set (457,658,416); the MLP's is larger.
    assert_eq!(
        residual_of(&r),
        [
            ("weights", 0),
            ("kv_cache", 0),
            ("state", 0),
            ("activations", 15_773_648),
            ("context", 0),
        ]
    );
}

/// `samples/h200/torch-oom`: `scripts/validate/torch_prefill.py` (16 Qwen3.6-27B-shaped layers,
/// bf16) under `set_per_process_memory_fraction` of 24 GiB, refused a 1,319,108,608-byte `vc`
/// (line 73) in the first attention layer of chunk 25 (context 107,328 = 26 x 4128). PyTorch
/// said 21,349,803,008 allocated and 24,498,929,664 reserved: a reserve of 3,149,126,656 is given
/// to the model, with the 663,394,556 untraced bytes as context (outside the limit). The
/// tensors live then, by Python line: weights (line 33) 11,168,645,120; the attention
/// projections kept by the K/V views (line 55, 101 of them) 6,834,087,936; the GDN states
/// (chunk_delta_h.py:723, 12) 38,862,848; cuBLAS's 32 MiB workspace (line 55's first matmul);
/// everything else with the refused request 4,593,761,280; and 67,266,308 bytes of driver
/// allocations outside PyTorch's segments no rule names.
#[test]
fn torch_oom_the_failing_step_does_not_fit_and_the_reserve_tips_it() {
    let mut c = qwen36();
    c.num_hidden_layers = 16;
    c.layer_types.truncate(16);
    let known = KnownParts {
        allocator_reserve: Some(24_498_929_664 - 21_349_803_008),
        context: Some(663_394_556),
        ..KnownParts::default()
    };
    let total = 150_109_880_320u64;
    let limit = Limit::PerProcessFraction {
        capacity: total,
        fraction: 25_769_803_776.0 / total as f64,
    };
    assert_eq!(limit.bytes().unwrap(), 24 * GIB);
    let v = StepVariants::for_runtime(Runtime::TorchPrefillScript, &c);
    let m = StepModel::new(c.clone(), v.clone(), known.clone());
    let shape = ServingShape::prefill(&c, CHUNK, 26 * CHUNK);
    let failing = m.check(&shape, &limit).unwrap();
    assert_eq!(failing.weights, 11_168_645_120);
    assert_eq!(failing.activations.kind, StepLayer::Attention);
    assert_eq!(failing.activations.bytes, 4_643_306_496);
    assert_eq!(verdict(&failing), (false, -296_425_472));
    // The context is outside a per-process limit.
    assert_eq!(
        failing.limit.as_ref().unwrap().counted,
        failing.total - 663_394_556
    );
    // Without the reserve the same step fits: the allocator's fragmentation tipped it over.
    let no_reserve = StepModel::new(
        c.clone(),
        v,
        KnownParts {
            allocator_reserve: None,
            ..known
        },
    );
    assert_eq!(
        verdict(&no_reserve.check(&shape, &limit).unwrap()),
        (true, 2_852_701_184)
    );

    let obs = observed(&[
        ("weights", 11_168_645_120),
        ("kv_cache", 6_834_087_936),
        ("state", 38_862_848),
        ("engine_buffers", 33_554_432),
        ("activations", 4_593_761_280),
        ("allocator_reserve", 3_149_126_656),
        ("context", 663_394_556),
        ("unnamed", 67_266_308),
    ]);
    let r = residuals(&failing, &obs).unwrap();
    assert_eq!(
        residual_of(&r),
        [
            ("weights", 0),
            // Attention layers 7, 11 and 15 had not stored chunk 25's projection yet (3 x
            // 67,633,152), less the blocks PyTorch hands out above the tensors' bytes.
            ("kv_cache", 199_759_872),
            // The states' allocator blocks are larger than the tensors.
            ("state", -1_114_112),
            // The model's steady state (layer 7: the previous kc/vc at the full context) is
            // above layer 3's (the previous chunk's).
            ("activations", 49_545_216),
            ("engine_buffers", 0),
            ("allocator_reserve", 0),
            ("context", 0),
            ("unnamed", -67_266_308),
        ]
    );
    assert!(
        cause(&r, Category::Unnamed).contains("no category rule"),
        "{}",
        cause(&r, Category::Unnamed)
    );
}

/// vLLM's attention block for a hybrid model (the chunk floor in align mode) from the mamba page.
#[test]
fn vllm_block_size_from_the_mamba_page() {
    let c = qwen36();
    let bf16 = vramtrace_models::DType::BF16;
    let f32 = vramtrace_models::DType::F32;
    // One layer's state: conv 3 x 10240 bf16 (61,440) + recurrent 48 x 128 x 128; K+V per token
    // and layer 2 x 4 x 256 x 2 = 4096 bytes.
    assert_eq!(
        vllm_hybrid_block_size(&c, 1, 4096, bf16, bf16, 16).unwrap(),
        400
    );
    assert_eq!(
        vllm_hybrid_block_size(&c, 1, 4096, bf16, f32, 16).unwrap(),
        784
    );
    // An fp8 cache halves the page per token and doubles the block.
    assert_eq!(
        vllm_hybrid_block_size(&c, 1, 2048, bf16, f32, 16).unwrap(),
        1568
    );
    assert!(vllm_hybrid_block_size(&c, 1, 0, bf16, f32, 16).is_err());
}

#[test]
fn an_unknown_category_is_refused_with_the_list() {
    let c = qwen36();
    let b = workload(KnownParts::default())
        .step(&ServingShape::prefill(&c, CHUNK, CHUNK))
        .unwrap();
    let e = residuals(&b, &observed(&[("kv", 1)]))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("\"kv\" is not a category; use one of weights, kv_cache"),
        "{e}"
    );
    // An unpredicted part the trace shows says how to give it.
    let r = residuals(&b, &observed(&[("cuda_graphs", 1 << 20)])).unwrap();
    let row = r
        .parts
        .iter()
        .find(|p| p.category == Category::CudaGraphs)
        .unwrap();
    assert_eq!((row.predicted, row.residual), (None, -(1 << 20)));
    assert!(
        row.likely_cause.contains("give it as a known part"),
        "{}",
        row.likely_cause
    );
}

/// A dense model (no GDN layers) under transformers: attention, MLP and logits only, no state.
#[test]
fn a_dense_model_steps_without_gdn_layers() {
    let v = serde_json::json!({
        "model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096,
        "vocab_size": 151936, "intermediate_size": 12288, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "bfloat16"
    });
    let c = ModelConfig::from_json(&v, Path::new("dense/config.json")).unwrap();
    let m = StepModel::new(
        c.clone(),
        StepVariants::for_runtime(Runtime::Transformers, &c),
        KnownParts::default(),
    );
    let b = m.step(&ServingShape::prefill(&c, 2048, 8192)).unwrap();
    assert_eq!(b.state, 0);
    // 36 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes per token.
    assert_eq!(b.kv_cache, 8192 * 36 * 8 * 128 * 2 * 2);
    let kinds: Vec<StepLayer> = b.layers.iter().map(|l| l.kind).collect();
    assert_eq!(
        kinds,
        [StepLayer::Attention, StepLayer::Mlp, StepLayer::Logits]
    );
    // Logits for 2048 tokens x 151,936 in bf16, beside the hidden states and the embedding's
    // output.
    assert_eq!(b.activations.kind, StepLayer::Logits);
    assert_eq!(
        b.activations.bytes,
        2048 * 151_936 * 2 + 2 * 2048 * 4096 * 2
    );
}

/// `samples/h200/prefill-uncapped`: the same workload on the H200 without a limit, 4 chunks of
/// 4128. The traced live bytes peak at 19,486,194,688, in chunk 3's first MLP (label
/// `prefill/chunk.3/layer.0/mlp`): the model's last step (context 16,512), whose largest layer
/// is the MLP, predicts exactly that. The activations observed are the peak less the labelled
/// weights, KV blocks and state.
#[test]
fn prefill_uncapped_the_predicted_peak_is_the_traced_peak() {
    let m = workload(KnownParts::default());
    let c = qwen36();
    let b = m
        .step(&ServingShape::prefill(&c, CHUNK, 4 * CHUNK))
        .unwrap();
    assert_eq!(b.activations.kind, StepLayer::Mlp);
    assert_eq!(b.total, 19_486_194_688);
    let r = residuals(
        &b,
        &observed(&[
            ("weights", WL_WEIGHTS),
            ("kv_cache", 4 * WL_KV_PER_CHUNK),
            ("state", WL_STATE),
            ("activations", 473_432_064),
        ]),
    )
    .unwrap();
    assert_eq!(r.total_residual, 0);
    assert!(r.parts.iter().all(|p| p.likely_cause == "agrees"));
}
