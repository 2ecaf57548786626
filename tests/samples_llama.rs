//! llama.cpp on the H200 (`samples/h200/llama-bench`, issue 33): `llama-bench` with a
//! random-weight llama GGUF (Llama-3.2-1B's shapes, f16 and Q4_K_M) under `vramtrace run`,
//! flash attention on and off, at several `-p`/`-ub` and cache types (docs/validation.md,
//! "llama.cpp on the H200"). Read here without the machine's libraries: the books, not the
//! symbols (the reports made there, with them, are kept beside each trace).

use std::path::PathBuf;
use std::process::Command;

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("samples/h200/llama-bench")
        .join(name)
}

/// `vramtrace ARGS…`, its JSON (the command must succeed).
fn vramtrace_json<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `vramtrace COMMAND SAMPLE --json`, parsed.
fn cli_json(command: &str, name: &str) -> serde_json::Value {
    vramtrace_json([
        command.as_ref(),
        sample(name).as_os_str(),
        "--json".as_ref(),
    ])
}

fn summary(name: &str) -> serde_json::Value {
    cli_json("summary", name)
}

/// `vramtrace summary TRACE --json` of a trace anywhere under samples/.
fn summary_at(trace: &std::path::Path) -> serde_json::Value {
    vramtrace_json(["summary".as_ref(), trace.as_os_str(), "--json".as_ref()])
}

/// The MiB a line of run `name`'s log gives for `key` (`… size =    512.00 MiB`).
fn logged_mib(name: &str, key: &str) -> f64 {
    let log = std::fs::read_to_string(sample(name).join("log-excerpt.txt")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains(key))
        .unwrap_or_else(|| panic!("{name}: no {key:?}"));
    line.split('=')
        .nth(1)
        .unwrap()
        .trim()
        .trim_end_matches("MiB")
        .trim()
        .parse()
        .unwrap()
}

/// A pool by name across the process's devices.
fn pool<'a>(s: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    s["processes"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| d["other_pools"].as_array().unwrap())
        .find(|p| p["pool"] == name)
        .unwrap_or_else(|| panic!("no {name} pool in {s}"))
}

/// The first failed allocation in a summary's first process is ggml's pool growing by `size`
/// (`cuMemCreate`) with `free` bytes free.
fn assert_pool_growth_refused(s: &serde_json::Value, size: u64, free: u64) {
    let failure = s["processes"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|d| d["failures"].as_array().and_then(|f| f.first()))
        .unwrap_or_else(|| panic!("no failure in {s}"));
    assert_eq!(failure["api"], "cuMemCreate", "{failure}");
    assert_eq!(failure["size"], size, "{failure}");
    assert_eq!(failure["free_bytes"], free, "{failure}");
}

/// A context of `n_ctx` cells over an f16 cache, filled in ubatches of `n_ubatch` without flash
/// attention (the pool then grows with the fill), on the H200's 132 SMs.
fn f16_without_fa(
    n_ctx: u64,
    n_ubatch: u64,
) -> (
    vramtrace_models::engine::llama_cpp::LlamaCppContext,
    vramtrace_models::engine::llama_cpp::FillShape,
) {
    let f16 = vramtrace_models::gguf::ggml_type_by_name("f16").unwrap();
    (
        vramtrace_models::engine::llama_cpp::LlamaCppContext {
            n_ctx,
            type_k: f16,
            type_v: f16,
        },
        vramtrace_models::engine::llama_cpp::FillShape {
            n_ubatch,
            flash_attn: false,
            n_sm: 132,
        },
    )
}

/// The model's fill ceiling for a case of a kept `fill.json`, on the card it had (its free and
/// outside bytes, its `-ub` as `-b`); `compute`: the compute buffer when given.
fn case_fill_ceiling(
    c: &serde_json::Value,
    header: &vramtrace_models::gguf::GgufHeader,
    ctx: &vramtrace_models::engine::llama_cpp::LlamaCppContext,
    shape: &vramtrace_models::engine::llama_cpp::FillShape,
    compute: Option<u64>,
) -> vramtrace_models::engine::llama_cpp::FillCeiling {
    vramtrace_models::engine::llama_cpp::fill_ceiling(
        header,
        ctx,
        shape,
        c["ubatch"].as_u64().unwrap(),
        c["free_bytes"].as_u64().unwrap(),
        c["outside_bytes"].as_u64().unwrap(),
        compute,
    )
    .unwrap()
}

/// ggml's VMM pool maps its 32 GiB reservation in pieces and tears it down with one
/// `cuMemUnmap` of the whole mapped range: every mapping ends there, and the books balance
/// (0 B mapped at the end) on every run, as the driver's own do.
#[test]
fn ggml_s_vmm_pool_balances_on_every_run() {
    for (name, peak_mapped) in [
        ("f16-p16k-fa1-ub512", 10u64 << 20),
        ("f16-p16k-fa0-ub512", 516 << 20),
        ("f16-p64k-fa1-ub2048", 40 << 20),
        ("q4km-p32k-fa1-q40", 14 << 20),
    ] {
        let s = summary(name);
        let mapped = pool(&s, "mapped");
        assert_eq!(mapped["allocations"], mapped["frees"], "{name}: {mapped}");
        assert_eq!(mapped["live_at_end"], 0, "{name}: {mapped}");
        assert_eq!(mapped["peak_bytes"], peak_mapped, "{name}: {mapped}");
        let address = pool(&s, "address");
        assert_eq!(address["peak_bytes"], 32u64 << 30, "{name}: {address}");
        assert_eq!(address["live_at_end"], 0, "{name}");
    }
}

/// The buffers llama.cpp logs at start are the allocations the trace shows, to the byte: the
/// model buffer (`load_tensors: CUDA0 model buffer size`), the KV cache and the compute buffer
/// (`sched_reserve`), each one `cudaMalloc` of that size live at the device's peak.
#[test]
fn the_logged_buffers_are_the_traced_allocations() {
    for name in [
        "f16-p16k-fa1-ub512",
        "f16-p16k-fa0-ub512",
        "f16-p64k-fa1-ub2048",
        "q4km-p32k-fa1-q40",
    ] {
        let s = summary(name);
        let dev = s["processes"][0]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["peak_live"].as_array().is_some_and(|l| !l.is_empty()))
            .unwrap();
        let sizes: Vec<u64> = dev["peak_live"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["size"].as_u64().unwrap())
            .collect();
        for key in [
            "CUDA0 model buffer size",
            "CUDA0 KV buffer size",
            "CUDA0 compute buffer size =",
        ] {
            let logged = (logged_mib(name, key) * 1048576.0).round() as u64;
            // The log prints two decimals of MiB: within 0.005 MiB.
            assert!(
                sizes.iter().any(|&b| b.abs_diff(logged) <= 5243),
                "{name}: {key} {logged} B not among {sizes:?}"
            );
        }
    }
}

/// Read on a machine without llama.cpp's libraries, the report names every byte of each peak
/// from the frames stored with the trace (`<pid>.symbols.json`, written by `vramtrace run` on the
/// H200): the model buffer (`load_tensors`), the KV cache, the compute buffer the scheduler
/// reserved, ggml's pool (its per-op scratch, apart from the compute buffer) and the cuBLAS
/// workspaces; nothing unnamed.
#[test]
fn the_report_names_llama_cpp_s_buffers_from_the_stored_frames() {
    for (name, weights, kv, compute) in [
        (
            "f16-p16k-fa1-ub512",
            2_077_499_392u64,
            512u64 << 20,
            79_704_064u64,
        ),
        (
            "f16-p16k-fa0-ub512",
            2_077_499_392,
            512 << 20,
            1_126_178_816,
        ),
        (
            "f16-p64k-fa1-ub2048",
            2_077_499_392,
            2048 << 20,
            520_142_848,
        ),
        ("q4km-p32k-fa1-q40", 638_152_704, 288 << 20, 117_485_568),
    ] {
        let r = cli_json("report", name);
        let cats = r["categories"].as_array().unwrap();
        let bytes = |c: &str| {
            cats.iter()
                .find(|x| x["category"] == c)
                .map_or(0, |x| x["bytes"].as_u64().unwrap())
        };
        assert_eq!(bytes("weights"), weights, "{name}: {cats:?}");
        assert_eq!(bytes("kv_cache"), kv, "{name}");
        assert_eq!(bytes("activations"), compute, "{name}: {cats:?}");
        assert_eq!(bytes("unnamed"), 0, "{name}: {cats:?}");
        let pool = cats
            .iter()
            .find(|x| x["category"] == "allocator_reserve")
            .unwrap_or_else(|| panic!("{name}: no pool in {cats:?}"));
        assert!(
            pool["evidence"][0]
                .as_str()
                .unwrap()
                .contains("ggml_cuda_pool_vmm::alloc"),
            "{pool}"
        );
    }
}

/// llama.cpp's buffers at start, from the model's GGUF header alone (`llama-*.header.gguf`: the
/// H200 models' metadata and tensor lists, `scripts/validate/gguf_header_only.py`), set beside
/// the lines llama.cpp logged: the model buffer and the KV cache, to the byte of the log's two
/// decimals of MiB.
#[test]
fn llama_cpp_s_start_buffers_are_predicted_from_the_gguf_header() {
    use vramtrace_models::engine::llama_cpp::{LlamaCppContext, boot_buffers};
    use vramtrace_models::gguf::{GgufHeader, ggml_type_by_name};
    let f16 = ggml_type_by_name("f16").unwrap();
    let q4_0 = ggml_type_by_name("q4_0").unwrap();
    for (model, run, n_ctx, cache) in [
        (
            "llama-f16.header.gguf",
            "f16-p16k-fa1-ub512",
            16_384u64,
            f16,
        ),
        ("llama-f16.header.gguf", "f16-p64k-fa1-ub2048", 65_536, f16),
        ("llama-q4km.header.gguf", "q4km-p32k-fa1-q40", 32_768, q4_0),
    ] {
        let header = GgufHeader::read(&sample(model)).unwrap();
        assert_eq!(header.architecture(), Some("llama"));
        let b = boot_buffers(
            &header,
            &LlamaCppContext {
                n_ctx,
                type_k: cache,
                type_v: cache,
            },
        )
        .unwrap();
        let logged = |key: &str| logged_mib(run, key);
        let mib = |b: u64| b as f64 / 1_048_576.0;
        assert!(
            (mib(b.model_buffer_bytes) - logged("CUDA0 model buffer size")).abs() < 0.005,
            "{run}: {b:?}"
        );
        assert!(
            (mib(b.kv_cache_bytes) - logged("CUDA0 KV buffer size")).abs() < 0.005,
            "{run}: {b:?}"
        );
        assert_eq!(b.kv_cells, n_ctx);
    }
}

/// The report on a llama.cpp run does not ask for a config.json, which a GGUF model has not.
#[test]
fn the_report_on_a_llama_cpp_run_does_not_ask_for_a_config_json() {
    let o = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("report")
        .arg(sample("f16-p16k-fa1-ub512"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(md.contains("A llama.cpp run"), "{md}");
    assert!(!md.contains("Pass `--model config.json`"), "{md}");
}

/// `vramtrace model` on the sample GGUF `model` with `args`, its JSON.
fn model_json(model: &str, args: &[&str]) -> serde_json::Value {
    let path = sample(model);
    let mut a: Vec<&std::ffi::OsStr> = vec!["model".as_ref(), path.as_os_str(), "--json".as_ref()];
    a.extend(args.iter().map(std::ffi::OsStr::new));
    vramtrace_json(a)
}

/// The CUDA0 compute buffer llama.cpp's destructor logs in `log` (four decimals of MiB).
/// The largest `KEY = X MiB` a log excerpt prints for `key` (llama.cpp prints each buffer once
/// for the projection and once for the context); 0 when absent.
fn logged_max_mib(log: &str, key: &str) -> f64 {
    log.lines()
        .filter(|l| l.contains(key))
        .filter_map(|l| l.split('=').nth(1))
        .map(|x| x.trim().trim_end_matches("MiB").trim().parse().unwrap())
        .fold(0.0, f64::max)
}

fn logged_compute_mib(log: &std::path::Path) -> f64 {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .find_map(|l| l.split("CUDA0 compute buffer size is ").nth(1))
        .and_then(|r| r.split(" MiB").next())
        .and_then(|x| x.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}: no compute buffer line", log.display()))
}

/// `vramtrace model MODEL.gguf --runtime llama.cpp -c N -ub U ... --json`, in llama.cpp's own
/// spellings (`-ub` included), prints the buffers the H200 runs logged.
#[test]
fn model_takes_the_gguf_and_llama_cpp_s_flags() {
    for (model, run, args) in [
        (
            "llama-f16.header.gguf",
            "f16-p16k-fa1-ub512",
            &["-c", "16384", "-ub", "512", "--flash-attn"][..],
        ),
        (
            "llama-q4km.header.gguf",
            "q4km-p32k-fa1-q40",
            &[
                "-c",
                "32768",
                "-ub",
                "512",
                "--flash-attn",
                "--cache-type-k",
                "q4_0",
                "--cache-type-v",
                "q4_0",
            ][..],
        ),
    ] {
        let v = model_json(model, &[&["--runtime", "llama.cpp"], args].concat());
        let mib = |k: &str| v[k].as_u64().unwrap() as f64 / 1_048_576.0;
        assert!((mib("weights_bytes") - logged_mib(run, "CUDA0 model buffer size")).abs() < 0.005);
        assert!((mib("kv_cache_bytes") - logged_mib(run, "CUDA0 KV buffer size")).abs() < 0.005);
        assert_eq!(v["n_ubatch"], 512);
    }
    // Without -c it says what is missing.
    let o = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("model")
        .arg(sample("llama-f16.header.gguf"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs -c N"));
}

/// The compute buffer `vramtrace model` predicts from the GGUF's header and the flags (the
/// prompt graph as ggml's allocator places it, `models/src/engine/llama_cpp.rs`), beside the
/// size llama.cpp's destructor logs with four decimals of MiB, on every H200 run: flash
/// attention on and off, -ub 512 and 2048, an f16 and a q4_0 cache.
#[test]
fn the_compute_buffer_is_predicted_from_the_graph() {
    for (model, run, args) in [
        (
            "llama-f16.header.gguf",
            "f16-p16k-fa1-ub512",
            "-c 16384 -ub 512 --flash-attn",
        ),
        (
            "llama-f16.header.gguf",
            "f16-p16k-fa0-ub512",
            "-c 16384 -ub 512",
        ),
        (
            "llama-f16.header.gguf",
            "f16-p64k-fa1-ub2048",
            "-c 65536 -ub 2048 --flash-attn",
        ),
        (
            "llama-q4km.header.gguf",
            "q4km-p32k-fa1-q40",
            "-c 32768 -ub 512 --flash-attn --cache-type-k q4_0 --cache-type-v q4_0",
        ),
    ] {
        let v = model_json(model, &args.split(' ').collect::<Vec<_>>());
        let predicted = v["compute_buffer_bytes"].as_u64().unwrap() as f64 / 1_048_576.0;
        let logged = logged_compute_mib(&sample(run).join("log-excerpt.txt"));
        assert!(
            (predicted - logged).abs() < 0.00006,
            "{run}: predicted {predicted} MiB, llama.cpp {logged} MiB"
        );
    }
}

/// Held out: four settings no term was checked on, predicted and committed before the H200 call
/// that ran them (docs/validation.md, "held-out predictions of the compute buffer"); their log
/// lines are kept under samples/h200/llama-heldout/.
#[test]
fn the_compute_buffer_held_out_runs_are_as_predicted() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-heldout");
    for (run, args, predicted) in [
        (
            "p8k-ub256-fa1",
            "-c 8192 -ub 256 --flash-attn",
            35_657_728u64,
        ),
        ("p24k-ub1024-fa0", "-c 24576 -ub 1024", 3_359_653_888),
        (
            "p20000-ub384-fa1-q80",
            "-c 20000 -ub 384 --flash-attn --cache-type-k q8_0 --cache-type-v q8_0",
            69_575_680,
        ),
        (
            "p12k-ub128-fa1-q40",
            "-c 12288 -ub 128 --flash-attn --cache-type-k q4_0 --cache-type-v q4_0",
            32_541_696,
        ),
    ] {
        let v = model_json(
            "llama-f16.header.gguf",
            &args.split(' ').collect::<Vec<_>>(),
        );
        assert_eq!(
            v["compute_buffer_bytes"], predicted,
            "{run}: the committed prediction"
        );
        let logged = logged_compute_mib(&dir.join(format!("{run}.log-excerpt.txt")));
        assert!(
            (predicted as f64 / 1_048_576.0 - logged).abs() < 0.00006,
            "{run}: predicted {predicted} B, llama.cpp {logged} MiB"
        );
    }
}

/// The VMM pool's mapping, from ggml-cuda's per-op scratch (`pool_mapped` in
/// `models/src/engine/llama_cpp.rs`, read from the code after these four runs were recorded:
/// they built it and are its first check): the peak mapped bytes of each H200 run, to the
/// 2 MiB piece. Without flash attention it is the f16 copy of the softmaxed scores over the
/// filled context; with it, the weight matmuls' scratch (cuBLAS for f16 weights, MMQ for Q4_K_M).
#[test]
fn the_vmm_pool_s_mapping_follows_the_filled_context() {
    use vramtrace_models::engine::llama_cpp::{FillShape, LlamaCppContext, pool_mapped};
    use vramtrace_models::gguf::{GgufHeader, ggml_type_by_name};
    let f16 = ggml_type_by_name("f16").unwrap();
    let q4_0 = ggml_type_by_name("q4_0").unwrap();
    for (model, run, n_ctx, ub, fa, cache) in [
        (
            "llama-f16.header.gguf",
            "f16-p16k-fa0-ub512",
            16_384u64,
            512u64,
            false,
            f16,
        ),
        (
            "llama-f16.header.gguf",
            "f16-p16k-fa1-ub512",
            16_384,
            512,
            true,
            f16,
        ),
        (
            "llama-f16.header.gguf",
            "f16-p64k-fa1-ub2048",
            65_536,
            2048,
            true,
            f16,
        ),
        (
            "llama-q4km.header.gguf",
            "q4km-p32k-fa1-q40",
            32_768,
            512,
            true,
            q4_0,
        ),
    ] {
        let header = GgufHeader::read(&sample(model)).unwrap();
        let ctx = LlamaCppContext {
            n_ctx,
            type_k: cache,
            type_v: cache,
        };
        let shape = FillShape {
            n_ubatch: ub,
            flash_attn: fa,
            n_sm: 132,
        };
        // llama-bench -p N -n 0: the prompt is the context.
        let predicted = pool_mapped(&header, &ctx, &shape, n_ctx).unwrap();
        let observed = pool(&summary(run), "mapped")["peak_bytes"]
            .as_u64()
            .unwrap();
        assert_eq!(predicted, observed, "{run}");
        // Without flash attention the pool grows with the fill: half the prompt, about half
        // the scores.
        let half = pool_mapped(&header, &ctx, &shape, n_ctx / 2).unwrap();
        if fa {
            assert_eq!(half, predicted, "{run}");
        } else {
            assert_eq!(half, 260 << 20, "{run}");
        }
    }
}

/// The header a fill case ran, by its GGUF's name on the GPU machine.
fn fill_header(gguf: &str) -> PathBuf {
    let name = std::path::Path::new(gguf)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    match name {
        "llama-f16.gguf" => sample("llama-f16.header.gguf"),
        "llama-q4km.gguf" => sample("llama-q4km.header.gguf"),
        "llama-b.gguf" => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("samples/h200/llama-fill/llama-b.header.gguf"),
        other => panic!("no header for {other}"),
    }
}

/// llama.cpp's fill ceiling on the H200 (docs/validation.md, "llama.cpp's fill ceiling"), two
/// calls, the model frozen before the first: for each case the ceiling predicted on the card for
/// the free bytes the ballast left (recomputed here from the headers, so a change to the model
/// shows), and the rungs: the longest prompt stops at the first ubatch the prediction says does
/// not fit, a prompt of 95% of the prediction fills, one of 105% does not; with flash attention
/// the whole context fills. One case sat on the cliff (call 1, flash attention over q4_0: the
/// ballast left 0.5 MiB less than the first full ubatch needs): 409 tokens predicted, none
/// filled.
#[test]
fn the_fill_ceiling_is_where_llama_cpp_stopped() {
    use vramtrace_models::engine::llama_cpp::{FillShape, LlamaCppContext};
    use vramtrace_models::gguf::{GgufHeader, ggml_type_by_name};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-fill");
    let mut checked = 0;
    for call in ["fill-call1.json", "fill-call2.json"] {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(call)).unwrap()).unwrap();
        for c in v["cases"].as_array().unwrap() {
            let name = c["name"].as_str().unwrap();
            let ub = c["ubatch"].as_u64().unwrap();
            let cache = c["cache"]
                .as_str()
                .map_or(ggml_type_by_name("f16").unwrap(), |t| {
                    ggml_type_by_name(t).unwrap()
                });
            let header = GgufHeader::read(&fill_header(c["gguf"].as_str().unwrap())).unwrap();
            let ctx = LlamaCppContext {
                n_ctx: c["ctx"].as_u64().unwrap(),
                type_k: cache,
                type_v: cache,
            };
            let shape = FillShape {
                n_ubatch: ub,
                flash_attn: c["fa"] == "on",
                n_sm: 132,
            };
            let f = case_fill_ceiling(c, &header, &ctx, &shape, None);
            let pred = c["prediction"]["frontier"]["fill_tokens"].as_u64().unwrap();
            assert_eq!(
                f.fill_tokens, pred,
                "{call} {name}: the model's prediction moved"
            );
            let rung = |r: &str| &c["rungs"][r];
            let longest = rung("longest");
            if longest["filled"] == true {
                assert_eq!(pred, f.max_prompt_tokens, "{call} {name}");
                assert_eq!(rung("95pct")["filled"], true, "{call} {name}");
                checked += 1;
                continue;
            }
            // The longest prompt passed `n_past` tokens, whole ubatches, and died in the next.
            let passed = longest["n_past"].as_u64().unwrap();
            if passed == 0 && pred < ub {
                assert_eq!((call, name), ("fill-call1.json", "a-f16-c64k-ub512-fa-q40"));
                continue;
            }
            let (lo, hi) = (passed, passed + ub - 1);
            assert!(
                pred * 100 >= lo * 95 && pred * 100 <= hi * 105,
                "{call} {name}: predicted {pred}, observed {lo}..={hi}"
            );
            assert_eq!(rung("95pct")["filled"], true, "{call} {name}");
            assert_eq!(rung("105pct")["filled"], false, "{call} {name}");
            checked += 1;
        }
    }
    assert_eq!(checked, 10);
}

/// A second architecture no model term was read from (24 layers, 12 heads of 128, 2 KV heads):
/// its buffers at start, predicted from its header, are llama.cpp's own log lines.
#[test]
fn a_second_architecture_s_buffers_are_its_log_lines() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-fill");
    let gguf = dir.join("llama-b.header.gguf");
    for (excerpt, args) in [
        (
            "call2-b-f16-c64k-ub512-fa-longest",
            "-c 65536 -ub 512 -b 512 --flash-attn",
        ),
        ("call1-b-f16-c64k-ub512-longest", "-c 65536 -ub 512 -b 512"),
        ("call1-b-f16-c64k-ub256-longest", "-c 65536 -ub 256 -b 256"),
    ] {
        let v = vramtrace_json(
            ["model", gguf.to_str().unwrap(), "--json"]
                .into_iter()
                .chain(args.split(' ')),
        );
        let log = std::fs::read_to_string(dir.join(format!("{excerpt}.log-excerpt.txt"))).unwrap();
        let logged = |key: &str| logged_max_mib(&log, key);
        let mib = |k: &str| v[k].as_u64().unwrap() as f64 / 1_048_576.0;
        assert!(
            (mib("weights_bytes") - logged("CUDA0 model buffer size")).abs() < 0.005,
            "{excerpt}"
        );
        assert!(
            (mib("kv_cache_bytes") - logged("CUDA0 KV buffer size")).abs() < 0.005,
            "{excerpt}"
        );
        assert!(
            (mib("compute_buffer_bytes") - logged("CUDA0 compute buffer size")).abs() < 0.005,
            "{excerpt}"
        );
    }
}

/// `report --model MODEL.gguf` on the llama-bench runs: the four parts predicted from the header
/// and the flags on the traced command line, each equal to what the trace holds (the pool: its
/// highest mapping).
#[test]
fn the_report_sets_llama_cpp_s_predicted_buffers_beside_the_trace() {
    for (run, model) in [
        ("f16-p16k-fa1-ub512", "llama-f16.header.gguf"),
        ("f16-p16k-fa0-ub512", "llama-f16.header.gguf"),
        ("f16-p64k-fa1-ub2048", "llama-f16.header.gguf"),
        ("q4km-p32k-fa1-q40", "llama-q4km.header.gguf"),
    ] {
        let v = vramtrace_json([
            "report".as_ref(),
            sample(run).as_os_str(),
            "--json".as_ref(),
            "--model".as_ref(),
            sample(model).as_os_str(),
        ]);
        let rows = v["llama_cpp"]["rows"]
            .as_array()
            .unwrap_or_else(|| panic!("{run}: {v}"));
        assert_eq!(rows.len(), 4);
        for r in rows {
            assert_eq!(r["predicted"], r["observed"], "{run}: {r}");
        }
    }
    // A model the process did not run is refused in words, not a panic.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args([
            "report",
            sample("f16-p16k-fa1-ub512").to_str().unwrap(),
            "--model",
        ])
        .arg(sample("llama-bench/../log-excerpt.txt"))
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// llama.cpp's levers on the card the first fill case had (6,701,580,288 B free, the f16 model at
/// `-c 32768 -ub 512` without flash attention, which fills 17,919 tokens): a smaller `-ub` fills
/// the context (256 is the largest that does), a larger one cannot even make it (its compute
/// buffer), and flash attention fills it whatever the cache type.
#[test]
fn the_levers_say_which_flags_fill_the_context() {
    let v = model_json(
        "llama-f16.header.gguf",
        &[
            "-c",
            "32768",
            "-ub",
            "512",
            "-b",
            "512",
            "--limit",
            "6701580288",
        ],
    );
    assert_eq!(v["frontier"]["fill_tokens"], 17_919);
    assert_eq!(v["best_ubatch"], 256);
    let lever = |name: &str| {
        v["levers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lever"] == name)
            .unwrap_or_else(|| panic!("no lever {name}: {v}"))
            .clone()
    };
    assert_eq!(lever("-ub 256 -b 512")["fill_tokens"], 32_764);
    assert_eq!(lever("-ub 1024 -b 1024")["boots"], false);
    for l in ["-fa on", "-fa on -ctk q4_0 -ctv q4_0"] {
        assert_eq!(lever(l)["fill_tokens"], 32_764, "{l}");
    }
    assert_eq!(lever("-c 16384")["fill_tokens"], 16_380);
}

/// The `h8` runs' start-up settings (log excerpt, GGUF, `vramtrace model` flags).
const H8_BOOTS: [(&str, &str, &str); 3] = [
    ("boot-f16-c16k-ub512-fa0", "f16", "-c 16384 -ub 512"),
    (
        "boot-f16-c64k-ub256-fa1-q80",
        "f16",
        "-c 65536 -ub 256 --flash-attn --cache-type-k q8_0 --cache-type-v q8_0",
    ),
    (
        "boot-q4km-c32k-ub512-fa1-q40",
        "q4km",
        "-c 32768 -ub 512 --flash-attn --cache-type-k q4_0 --cache-type-v q4_0",
    ),
];

/// A hybrid GGUF (llama.cpp's `qwen35`: Qwen3.6-27B's shapes, its first 8 layers, 2 of them full
/// attention; `samples/h200/llama-hybrid`, docs/validation.md "A hybrid GGUF"): the model
/// buffer, the KV cache of the two attention layers and the recurrent state of the six GDN
/// layers, predicted from the header, are llama.cpp's own log lines at three settings; a compute
/// buffer given with `--compute-buffer` is taken as given. A setting whose compute buffer the
/// model does not place (flash attention over an f16 cache) is refused unless given.
#[test]
fn a_hybrid_s_buffers_are_its_log_lines() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-hybrid");
    for (excerpt, model, args) in H8_BOOTS {
        let gguf = dir.join(format!("qwen35-h8-{model}.header.gguf"));
        let log = std::fs::read_to_string(dir.join(format!("{excerpt}.log-excerpt.txt"))).unwrap();
        let logged = |key: &str| logged_max_mib(&log, key);
        let compute = (logged("CUDA0 compute buffer size") * 1_048_576.0).round() as u64;
        let v = vramtrace_json(
            ["model", gguf.to_str().unwrap(), "--json"]
                .into_iter()
                .chain(args.split(' '))
                .chain(["--compute-buffer", &compute.to_string()]),
        );
        assert_eq!(v["layers"]["attention"], 2, "{excerpt}");
        assert_eq!(v["layers"]["recurrent"], 6, "{excerpt}");
        let mib = |k: &str| v[k].as_u64().unwrap() as f64 / 1_048_576.0;
        for (k, line) in [
            ("weights_bytes", "CUDA0 model buffer size"),
            ("kv_cache_bytes", "CUDA0 KV buffer size"),
            ("recurrent_state_bytes", "CUDA0 RS buffer size"),
        ] {
            assert!(
                (mib(k) - logged(line)).abs() < 0.005,
                "{excerpt}: {k} {} MiB, llama.cpp {} MiB",
                mib(k),
                logged(line)
            );
        }
        assert_eq!(v["compute_buffer_basis"], "given");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(["model"])
        .arg(dir.join("qwen35-h8-f16.header.gguf"))
        .args(["-c", "16384", "--flash-attn"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--compute-buffer"));
    // Without flash attention it is placed, and so are its levers but the one that turns flash
    // attention on over the f16 cache: that one is left out with the reason, not dropped.
    let gguf = dir.join("qwen35-h8-f16.header.gguf");
    let v = vramtrace_json([
        "model",
        gguf.to_str().unwrap(),
        "--json",
        "-c",
        "16384",
        "--limit",
        "24GiB",
    ]);
    let names: Vec<&str> = v["levers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lever"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"-fa on -ctk q4_0 -ctv q4_0"), "{names:?}");
    assert!(!names.contains(&"-fa on"), "{names:?}");
    let left_out = v["levers_left_out"].as_array().unwrap();
    assert_eq!(left_out.len(), 1, "{left_out:?}");
    assert_eq!(left_out[0]["lever"], "-fa on");
    assert!(
        left_out[0]["why"]
            .as_str()
            .unwrap()
            .contains("flash attention over an f16 cache"),
        "{left_out:?}"
    );
}

/// The hybrid's fill ceiling without flash attention, predicted before the rungs on the card the
/// ballast left (llama.cpp's compute buffer given, read from a short run at the case's flags):
/// both contexts stopped in the first ubatch past 17,408 tokens, and 95% of the prediction
/// filled. The predictions were 2.8–5.8% and 2.9–5.3% long: at the failure the pool held what
/// the model gives between the last whole ubatch and the failing one, and the driver refused the
/// next piece with more than its size free (6 MiB with 7.56 MiB free; 2 MiB with 3.56 MiB).
#[test]
fn the_hybrid_fill_ceiling_is_where_llama_cpp_stopped() {
    use vramtrace_models::engine::llama_cpp::pool_mapped;
    use vramtrace_models::gguf::GgufHeader;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-hybrid");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("fill.json")).unwrap()).unwrap();
    let mut checked = 0;
    for (c, mapped_at_failure) in v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .zip([420u64 << 20, 208 << 20])
    {
        let name = c["name"].as_str().unwrap();
        let gguf = c["gguf"].as_str().unwrap().replace(".gguf", ".header.gguf");
        let header = GgufHeader::read(&dir.join(gguf)).unwrap();
        let ub = c["ubatch"].as_u64().unwrap();
        let (ctx, shape) = f16_without_fa(c["ctx"].as_u64().unwrap(), ub);
        let compute = c["prediction"]["compute_buffer_bytes"].as_u64().unwrap();
        let f = case_fill_ceiling(c, &header, &ctx, &shape, Some(compute));
        let pred = c["prediction"]["frontier"]["fill_tokens"].as_u64().unwrap();
        assert_eq!(f.fill_tokens, pred, "{name}: the model's prediction moved");
        let longest = &c["rungs"]["longest"];
        let passed = longest["n_past"].as_u64().unwrap();
        assert_eq!(longest["filled"], false, "{name}");
        assert_eq!(passed, 17_408, "{name}");
        let (lo, hi) = (passed, passed + ub - 1);
        assert!(
            pred * 100 >= lo * 95 && pred * 100 <= hi * 105,
            "{name}: predicted {pred}, observed {lo}..={hi}"
        );
        assert_eq!(c["rungs"]["95pct"]["filled"], true, "{name}");
        assert_eq!(c["rungs"]["105pct"]["filled"], false, "{name}");
        let before = pool_mapped(&header, &ctx, &shape, passed).unwrap();
        let after = pool_mapped(&header, &ctx, &shape, passed + ub).unwrap();
        assert!(
            before <= mapped_at_failure && mapped_at_failure < after,
            "{name}: the pool {before} after {passed} tokens, {after} after the next ubatch"
        );
        checked += 1;
    }
    assert_eq!(checked, 2);
    // The trace kept of the first case: 420 MiB mapped (the scores' f16 copy of the ubatch to
    // 17,920: 2·17,920·512·24 B), then its 6 MiB output refused with 7.56 MiB free.
    let s = summary_at(&dir.join("trace-h8-f16-c32k-ub512"));
    assert_eq!(pool(&s, "mapped")["peak_bytes"], 2u64 * 17_920 * 512 * 24);
    assert_pool_growth_refused(&s, 6u64 << 20, 7_929_856);
}

/// `vramtrace attach` on a running `llama-completion` (samples/h200/llama-attach, and the second
/// attach, llama-attach-teardown): attached while it waited for its first line, it recorded the
/// VMM pool reserved (32 GiB of addresses) and mapped piece by piece as the 16,000-token prompt
/// filled, to the mapping the model gives for that fill, with the native frames named; the
/// buffers made before the attach are not in it.
#[test]
fn attach_follows_llama_cpp_s_pool_as_a_prompt_fills() {
    use vramtrace_models::engine::llama_cpp::pool_mapped_after;
    use vramtrace_models::gguf::GgufHeader;
    let header = GgufHeader::read(&sample("llama-f16.header.gguf")).unwrap();
    let (ctx, shape) = f16_without_fa(32_768, 512);
    for run in ["llama-attach", "llama-attach-teardown"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("samples/h200")
            .join(run);
        let s = summary_at(&dir.join("trace"));
        assert_eq!(pool(&s, "address")["peak_bytes"], 32u64 << 30, "{run}");
        // The BOS decoded on its own before the interactive prompt, then "hello" and 15,999
        // " hello" in ubatches of 512 from there (the log's last whole one ends at 15,873).
        let log = std::fs::read_to_string(dir.join("llama.log-excerpt.txt")).unwrap();
        let filled: u64 = log
            .lines()
            .filter_map(|l| l.split("n_past = ").nth(1))
            .map(|x| x.trim().parse::<u64>().unwrap())
            .max()
            .unwrap();
        assert_eq!(filled, 15_873, "{run}");
        assert_eq!(
            pool(&s, "mapped")["peak_bytes"].as_u64().unwrap(),
            pool_mapped_after(&header, &ctx, &shape, 1, 16_000).unwrap(),
            "{run}"
        );
    }
}

/// Qwen3.6-27B's exact architecture in Q4_K_M as the tree's own `llama-quantize` wrote it on the
/// H200 (`samples/h200/llama-27b`: its header, rebuilt from the tensor list printed there): what
/// the model reads from the header (the CUDA model buffer and the input embedding kept on the
/// host) is llama-quantize's own "quant size" line to its two decimals of MiB.
#[test]
fn the_27b_q4_k_m_header_is_llama_quantize_s_size() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-27b");
    let gguf = dir.join("qwen36-27b-q4km.header.gguf");
    let v = vramtrace_json(
        [
            "model",
            gguf.to_str().unwrap(),
            "-c",
            "262144",
            "--flash-attn",
        ]
        .into_iter()
        .chain(["--cache-type-k", "q4_0", "--cache-type-v", "q4_0"])
        .chain(["--compute-buffer", "0", "--json"]),
    );
    let log = std::fs::read_to_string(dir.join("quantize.log-excerpt.txt")).unwrap();
    let quant: f64 = log
        .lines()
        .find_map(|l| l.split("quant size  =").nth(1))
        .and_then(|x| x.split("MiB").next())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mib = (v["weights_bytes"].as_u64().unwrap() + v["host_weights_bytes"].as_u64().unwrap())
        as f64
        / 1_048_576.0;
    assert!((mib - quant).abs() < 0.005, "{mib} MiB against {quant}");
    assert_eq!(v["layers"]["attention"], 16);
    assert_eq!(v["layers"]["recurrent"], 48);
    // 16 attention layers of q4_0 K and V (4 heads of 256) over 262,144 cells.
    assert_eq!(v["kv_cache_bytes"], 16u64 * 262_144 * 2 * 1024 * 18 / 32);
}

/// The hybrid's compute buffer from its graph (`hybrid_compute_buffer`, derived from the tree's
/// code by a simulation of the graph and of ggml's allocator that read no measurement): equal,
/// to llama.cpp's four decimals of MiB, to every compute buffer the `h8` runs logged, at seven
/// settings (flash attention on and off, f16/q8_0/q4_0 caches, -ub 256 and 512, -c 4,096 to
/// 65,536; the boot runs, the fill cases' short runs and their calibrations).
#[test]
fn the_hybrid_compute_buffer_is_predicted_from_the_graph() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-hybrid");
    let fills = [
        ("h8-f16-c32k-ub512-boot", "f16", "-c 32768 -ub 512 -b 512"),
        ("h8-q4km-c32k-ub256-boot", "q4km", "-c 32768 -ub 256 -b 256"),
        ("calib-0", "f16", "-c 4096 -ub 512 -b 512"),
        ("calib-1", "q4km", "-c 4096 -ub 256 -b 256"),
    ];
    for (excerpt, model, args) in H8_BOOTS.into_iter().chain(fills) {
        let gguf = dir.join(format!("qwen35-h8-{model}.header.gguf"));
        let v = vramtrace_json(
            ["model", gguf.to_str().unwrap(), "--json"]
                .into_iter()
                .chain(args.split(' ')),
        );
        assert_eq!(v["compute_buffer_basis"], "predicted", "{excerpt}");
        let logged = logged_compute_mib(&dir.join(format!("{excerpt}.log-excerpt.txt")));
        let mib = v["compute_buffer_bytes"].as_u64().unwrap() as f64 / 1_048_576.0;
        assert!(
            (mib - logged).abs() < 0.00005,
            "{excerpt}: predicted {mib:.4} MiB, llama.cpp {logged:.4}"
        );
    }
}

/// `report --model` on the hybrid's trace (the f16 fill case, which died at its pool): the model
/// buffer, the KV cache, the GDN state and the compute buffer predicted from the header and the
/// traced command line are each what the trace holds; the pool's row is the whole context's,
/// beside what was mapped when the run stopped.
#[test]
fn the_report_sets_the_hybrid_s_buffers_beside_its_trace() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-hybrid");
    let v = vramtrace_json([
        "report".as_ref(),
        dir.join("trace-h8-f16-c32k-ub512").as_os_str(),
        "--json".as_ref(),
        "--model".as_ref(),
        dir.join("qwen35-h8-f16.header.gguf").as_os_str(),
    ]);
    let rows = v["llama_cpp"]["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"));
    let parts: Vec<&str> = rows.iter().map(|r| r["part"].as_str().unwrap()).collect();
    assert_eq!(
        parts,
        [
            "model buffer",
            "KV cache",
            "recurrent state",
            "compute buffer",
            "VMM pool (highest mapping)"
        ]
    );
    for r in &rows[..4] {
        assert_eq!(r["predicted"], r["observed"], "{r}");
    }
    assert_eq!(rows[4]["observed"], 420u64 << 20);
}

/// A kept 27B run (`samples/h200/llama-27b/RUN`): its case from `fill.json`, and `vramtrace
/// model` on the 27B's header with `flags` on the card the case had (its free and outside
/// bytes). The compute buffer is predicted, never given, and the frontier is the one printed
/// before the call.
fn the_27b_case(run: &std::path::Path, flags: &str) -> (serde_json::Value, serde_json::Value) {
    let fill: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("fill.json")).unwrap()).unwrap();
    let c = fill["cases"][0].clone();
    let gguf = run.parent().unwrap().join("qwen36-27b-q4km.header.gguf");
    let limit = c["free_bytes"].as_u64().unwrap().to_string();
    let known = format!("context={}", c["outside_bytes"].as_u64().unwrap());
    let v = vramtrace_json(
        [
            "model",
            gguf.to_str().unwrap(),
            "--json",
            "--limit",
            &limit,
            "--known",
            &known,
        ]
        .into_iter()
        .chain(flags.split(' ')),
    );
    let name = run.display();
    assert_eq!(v["compute_buffer_basis"], "predicted", "{name}");
    assert_eq!(
        v["frontier"], c["prediction"]["frontier"],
        "{name}: the model moved"
    );
    (c, v)
}

/// The seed's llama.cpp ladder on an emulated 24 GB card (`samples/h200/llama-27b/c262144`,
/// `c200000`; docs/validation.md, "The 27B on an emulated 3090"): Qwen3.6-27B's architecture in
/// Q4_K_M, a q4_0 cache, `-ub 512`, flash attention, 25,438,126,080 B free when llama.cpp
/// started. Every buffer was predicted from the header before the call (the compute buffer
/// from the graph, never given), and each is llama.cpp's own line: the model buffer, the KV
/// cache and the GDN state to two decimals of MiB, the compute buffer to its destructor's four.
/// Both contexts fill (the model: to the end, the pool flat at 18 MiB), both did; the lowest
/// free memory seen during the fill is the model's remainder within 4 MiB; the pool's books
/// balance; nothing at the peak is unnamed.
#[test]
fn the_27b_fills_both_contexts_on_an_emulated_3090_as_predicted() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-27b");
    for ctx in [262_144u64, 200_000] {
        let run = dir.join(format!("c{ctx}"));
        let (c, v) = the_27b_case(
            &run,
            &format!(
                "-c {ctx} -ub 512 -b 512 --flash-attn --cache-type-k q4_0 --cache-type-v q4_0"
            ),
        );
        let (free, outside) = (
            c["free_bytes"].as_u64().unwrap(),
            c["outside_bytes"].as_u64().unwrap(),
        );
        assert_eq!(free, 25_438_126_080 - 589_824, "{ctx}: the ballast's card");
        assert_eq!(v["frontier"]["fills_the_context"], true, "{ctx}");
        let log = std::fs::read_to_string(run.join("longest.log-excerpt.txt")).unwrap();
        let mib = |k: &str| v[k].as_u64().unwrap() as f64 / 1_048_576.0;
        for (k, line) in [
            ("weights_bytes", "CUDA0 model buffer size"),
            ("kv_cache_bytes", "CUDA0 KV buffer size"),
            ("recurrent_state_bytes", "CUDA0 RS buffer size"),
        ] {
            let logged = logged_max_mib(&log, line);
            assert!(
                (mib(k) - logged).abs() < 0.005,
                "{ctx}: {k} {} MiB, llama.cpp {logged}",
                mib(k)
            );
        }
        let logged = logged_compute_mib(&run.join("longest.log-excerpt.txt"));
        assert!(
            (mib("compute_buffer_bytes") - logged).abs() < 0.00005,
            "{ctx}: compute {} MiB, llama.cpp {logged}",
            mib("compute_buffer_bytes")
        );
        let rung = &c["rungs"]["longest"];
        assert_eq!(rung["filled"], true, "{ctx}");
        assert_eq!(rung["prompt"], v["frontier"]["max_prompt_tokens"], "{ctx}");
        // What the model leaves free at the end of the fill, against the lowest free figure a
        // 10 ms poll saw while llama.cpp ran.
        let left = free
            - v["boot_bytes"].as_u64().unwrap()
            - outside
            - v["frontier"]["pool_bytes"].as_u64().unwrap();
        let seen = rung["lowest_free"].as_u64().unwrap();
        assert!(
            left.abs_diff(seen) < 4 << 20,
            "{ctx}: model {left}, seen {seen}"
        );
        let s = summary_at(&run.join("trace"));
        let mapped = pool(&s, "mapped");
        assert_eq!(mapped["peak_bytes"], v["frontier"]["pool_bytes"], "{ctx}");
        assert_eq!(mapped["allocations"], mapped["frees"], "{ctx}");
        assert_eq!(mapped["live_at_end"], 0, "{ctx}");
        let r = vramtrace_json([
            "report".as_ref(),
            run.join("trace").as_os_str(),
            "--json".as_ref(),
        ]);
        let unnamed = r["categories"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["category"] == "unnamed")
            .map_or(0, |x| x["bytes"].as_u64().unwrap());
        assert_eq!(unnamed, 0, "{ctx}");
    }
}

/// The 27B without flash attention (`samples/h200/llama-27b/c32k-fa0`: `-c 32768 -ub 512`, an
/// f16 cache, the card the ballast left): the fill ceiling predicted before the rungs is 18,420
/// tokens; 95% of it filled, 105% and the whole context did not. Both failing prompts died in
/// the ubatch from 17,920 to 18,432: a whole ubatch there needs the scores' f16 copy for 18,432
/// cells (2·18,432·512·24 B, 432 MiB and more), and the trace shows the pool at the 428 MiB the
/// model gives after 17,920 tokens and its next 4 MiB refused with 3.56 MiB free. The
/// prediction's own last ubatch is 500 tokens, whose scratch fits in those 428 MiB: the
/// ceiling lies between 17,920 and 18,431 and the prediction inside it.
#[test]
fn the_27b_fill_ceiling_without_flash_attention_is_where_llama_cpp_stopped() {
    use vramtrace_models::engine::llama_cpp::pool_mapped;
    use vramtrace_models::gguf::GgufHeader;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-27b");
    let run = dir.join("c32k-fa0");
    let (c, v) = the_27b_case(&run, "-c 32768 -ub 512 -b 512");
    let gguf = dir.join("qwen36-27b-q4km.header.gguf");
    let pred = v["frontier"]["fill_tokens"].as_u64().unwrap();
    assert_eq!(pred, 18_420);
    let logged = logged_compute_mib(&run.join("95pct.log-excerpt.txt"));
    let mib = v["compute_buffer_bytes"].as_u64().unwrap() as f64 / 1_048_576.0;
    assert!(
        (mib - logged).abs() < 0.00005,
        "compute {mib} MiB, llama.cpp {logged}"
    );
    let rungs = &c["rungs"];
    assert_eq!(rungs["95pct"]["filled"], true);
    for r in ["105pct", "longest"] {
        assert_eq!(rungs[r]["filled"], false, "{r}");
        assert_eq!(rungs[r]["n_past"], 17_920, "{r}");
    }
    let (lo, hi) = (17_920u64, 17_920 + 511);
    assert!(
        (lo..=hi).contains(&pred),
        "predicted {pred}, observed {lo}..={hi}"
    );
    let header = GgufHeader::read(&gguf).unwrap();
    let (ctx, shape) = f16_without_fa(32_768, 512);
    let s = summary_at(&run.join("trace"));
    assert_eq!(pool(&s, "mapped")["peak_bytes"], 428u64 << 20);
    assert_eq!(
        pool_mapped(&header, &ctx, &shape, 17_920).unwrap(),
        428 << 20
    );
    assert_eq!(pool_mapped(&header, &ctx, &shape, pred).unwrap(), 428 << 20);
    assert!(pool_mapped(&header, &ctx, &shape, 18_432).unwrap() > (428 << 20) + 3_735_552);
    assert_pool_growth_refused(&s, 4u64 << 20, 3_735_552);
}

/// `vramtrace attach` on a `llama-completion` that then tore its pool down and exited while
/// attached (`samples/h200/llama-attach-teardown`, the second attach on the H200): every
/// mapping of ggml's pool ends at the one `cuMemUnmap` of the whole range, and the reservation
/// at `cuMemAddressFree`: 0 B mapped and no addresses at the end. `report --model` says the
/// buffers made at start are absent because they came before the attach, beside what NVML saw
/// the process hold then.
#[test]
fn attach_balances_llama_cpp_s_pool_torn_down_while_attached() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-attach-teardown");
    let attach = std::fs::read_to_string(dir.join("attach.log")).unwrap();
    assert!(attach.contains("exited while attached"), "{attach}");
    let s = summary_at(&dir.join("trace"));
    let mapped = pool(&s, "mapped");
    assert_eq!(mapped["allocations"], 95);
    assert_eq!(mapped["allocations"], mapped["frees"]);
    assert_eq!(mapped["live_at_end"], 0);
    assert_eq!(pool(&s, "address")["live_at_end"], 0);
    let r = vramtrace_json([
        "report".as_ref(),
        dir.join("trace").as_os_str(),
        "--json".as_ref(),
        "--model".as_ref(),
        sample("llama-f16.header.gguf").as_os_str(),
    ]);
    let view = &r["llama_cpp"];
    for row in view["rows"].as_array().unwrap() {
        let before = row["basis"].as_str().unwrap().contains("before the attach");
        assert_eq!(before, row["part"] != "VMM pool (highest mapping)", "{row}");
        assert_eq!(row["observed"].is_null(), before, "{row}");
    }
    let note = view["before_attach"].as_str().unwrap();
    assert!(
        note.contains("pid 4725") && note.contains("5.53 GiB"),
        "{note}"
    );
}

/// An `attach.json` that is not JSON (a copy cut short) does not stop the report: it is said on
/// stderr, and the trace is read as one `vramtrace run` made, its buffers as the trace holds them.
#[test]
fn a_torn_attach_record_is_said_and_the_report_still_made() {
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200/llama-attach-teardown/trace");
    let dir = vramtrace_testkit::scratch("torn-attach");
    std::fs::copy(src.join("4725.vtr"), dir.join("4725.vtr")).unwrap();
    std::fs::write(dir.join("attach.json"), "{\"pid\": 47").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("report")
        .arg(&dir)
        .args(["--json", "--model"])
        .arg(sample("llama-f16.header.gguf"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", vramtrace_testkit::describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("attach.json is not JSON"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["llama_cpp"]["before_attach"].is_null(), "{v}");
    assert_eq!(v["llama_cpp"]["rows"][0]["observed"], 0);
    let _ = std::fs::remove_dir_all(&dir);
}
