//! The CLI on real traces recorded on the H200 (samples/h200): what was measured there stays
//! what the tool reads and concludes here.

mod common;

use common::*;
use std::process::Command;

fn sample(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/h200")
        .join(name)
}

fn json(args: &[&str]) -> serde_json::Value {
    let o = Command::new(vramtrace()).args(args).output().unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

const CONFIG: &str = QWEN_CONFIG;

#[test]
fn pytorch_caching_off_allocates_each_tensor_exactly() {
    let ev = events(&sample("torch-nocache"));
    let allocs: Vec<u64> = ev
        .iter()
        .filter(|e| e["kind"] == "alloc")
        .map(|e| e["size"].as_u64().unwrap())
        .collect();
    // The sizes torch_capture.py asked for, in order: one driver allocation per tensor.
    assert_eq!(allocs, [4096, 512000, 3145728, 52428800, 50724864, 1000]);
    let failed: Vec<_> = ev.iter().filter(|e| e["kind"] == "alloc_failed").collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["size"], 1u64 << 50);
    assert_eq!(failed[0]["total_bytes"], 150_109_880_320u64);
    assert_eq!(failed[0]["free_bytes"], 149_498_757_120u64);
    let s = json(&[
        "summary",
        "--json",
        sample("torch-nocache").to_str().unwrap(),
    ]);
    let d = &s["processes"][0]["devices"][0];
    assert_eq!(d["name"], "NVIDIA H200");
    assert_eq!(d["peak_bytes"], 4096 + 3145728 + 52428800);
    assert_eq!(d["failures"][0]["live_bytes"], 4096 + 3145728 + 50724864);
}

#[test]
fn fla_gdn_peak_is_attributed_byte_for_byte() {
    let v = json(&[
        "compare",
        sample("fla-gdn-t4128").to_str().unwrap(),
        "--model",
        CONFIG,
        "--variant",
        "fla-0.6.0",
        "--tokens",
        "4128",
        "--json",
    ]);
    let a = &v["attribution"];
    for r in a["rows"].as_array().unwrap() {
        assert_eq!(r["difference"], 0, "{r}");
    }
    assert_eq!(a["attributed_bytes"], 334_436_352u64);
    assert_eq!(a["unexplained_bytes"], 0);
    // Recorded before Python frames and without names on the kernel's tensors: every match
    // rests on size and order alone, and none is ambiguous (the inputs are named).
    for r in a["rows"].as_array().unwrap() {
        assert_eq!(r["evidence"]["kind"], "size_only", "{r}");
    }
    assert_eq!(a["evidence"]["size_only_bytes"], 334_436_352u64);
    assert_eq!(a["evidence"]["evidence_bytes"], 0);
    assert_eq!(a["evidence"]["ambiguous"], 0);
    assert!(v["named_fraction"].as_f64().unwrap() >= 0.99);
}

#[test]
fn torch_flash_attention_ignores_max_seqlen_k() {
    // Recorded with max_seqlen_k = 262144 for 4128 real tokens: softmax_lse is [H, total_q].
    let v = json(&[
        "compare",
        sample("torch-fa-t4128").to_str().unwrap(),
        "--model",
        CONFIG,
        "--variant",
        "pytorch",
        "--tokens",
        "4128",
        "--max-seqlen-k",
        "262144",
        "--json",
    ]);
    let rows = v["attribution"]["rows"].as_array().unwrap();
    let lse = rows.iter().find(|r| r["name"] == "softmax_lse").unwrap();
    assert_eq!(lse["observed_bytes"], 24 * 4128 * 4);
    assert_eq!(lse["difference"], 0);
    assert_eq!(v["attribution"]["unexplained_bytes"], 0);
}

#[test]
fn nvtx_ranges_and_spawned_workers() {
    let ev = events(&sample("nvtx-multiprocess"));
    let label = |size: u64| {
        ev.iter()
            .find(|e| e["kind"] == "alloc" && e["size"] == size)
            .unwrap()["label"]
            .clone()
    };
    assert_eq!(label(3 << 20), "fwd");
    assert_eq!(label(5 << 20), "fwd/attention");
    assert!(label(7 << 20).is_null());
    let s = json(&[
        "summary",
        "--json",
        sample("nvtx-multiprocess").to_str().unwrap(),
    ]);
    let procs = s["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 3);
    let parent = procs
        .iter()
        .find(|p| {
            p["command"][1]
                .as_str()
                .unwrap_or("")
                .ends_with("nvtx_mp.py")
        })
        .unwrap();
    let workers: Vec<_> = procs
        .iter()
        .filter(|p| p["ppid"] == parent["pid"])
        .collect();
    assert_eq!(workers.len(), 2, "both spawned workers link to the parent");
}

#[test]
fn pytorch_cuda_malloc_async_allocates_each_tensor_from_the_pool() {
    let ev = events(&sample("torch-async"));
    let allocs: Vec<(String, u64)> = ev
        .iter()
        .filter(|e| e["kind"] == "alloc")
        .map(|e| {
            (
                e["api"].as_str().unwrap().to_string(),
                e["size"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = [4096, 512000, 3145728, 52428800, 50724864, 1000]
        .iter()
        .map(|&s| ("cuMemAllocAsync".to_string(), s))
        .collect();
    assert_eq!(allocs, want);
    assert!(
        ev.iter()
            .any(|e| e["kind"] == "alloc_failed" && e["api"] == "cuMemAllocAsync")
    );
}

#[test]
fn real_prefill_oom_is_attributed_to_h() {
    // The reference workload's prefill on the H200 with real kernels, limited to 18 GiB by a
    // ballast: the driver refused h of layer 0's GDN call in chunk 2.
    let o = Command::new(vramtrace())
        .arg("compare")
        .arg(sample("prefill-18gib"))
        .args([
            "--model",
            CONFIG,
            "--variant",
            "fla-0.6.0",
            "--l2norm-in-kernel",
            "true",
            "--tokens",
            "4128",
        ])
        .args(["--at", "oom", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let a = &v["attribution"];
    let failed = a["failed_tensor"].as_u64().unwrap() as usize;
    assert_eq!(a["rows"][failed]["name"], "h");
    assert_eq!(a["rows"][failed]["predicted_bytes"], 102_236_160u64);
    assert_eq!(a["unexplained_bytes"], 0);
    let ev = events(&sample("prefill-18gib"));
    let f = ev.iter().find(|e| e["kind"] == "alloc_failed").unwrap();
    assert_eq!(
        f["label"],
        "prefill/chunk.2/layer.0/gdn/chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_h"
    );
    assert_eq!(f["free_bytes"], 73u64 * 1024 * 1024 + 128 * 1024);
}

/// The same PyTorch run recorded on the H200 by the version 2 recorder (a shared file mapping,
/// one block per thread, compact events): the same exact sizes and the driver's numbers at the
/// failure.
#[test]
fn version_2_pytorch_caching_off_reads_as_recorded() {
    let ev = events(&sample("v2-torch-nocache"));
    let allocs: Vec<u64> = ev
        .iter()
        .filter(|e| e["kind"] == "alloc")
        .map(|e| e["size"].as_u64().unwrap())
        .collect();
    assert_eq!(allocs, [4096, 512000, 3145728, 52428800, 50724864, 1000]);
    // Releases carry the device of what they release, although the recorder no longer asks.
    assert!(
        ev.iter()
            .filter(|e| e["kind"] == "free")
            .all(|e| e["device"] == 0)
    );
    let failed: Vec<_> = ev.iter().filter(|e| e["kind"] == "alloc_failed").collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["size"], 1u64 << 50);
    assert_eq!(failed[0]["total_bytes"], 150_109_880_320u64);
    assert_eq!(failed[0]["free_bytes"], 149_498_757_120u64);
    let ts: Vec<u64> = ev.iter().map(|e| e["t_ns"].as_u64().unwrap()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]));
}

/// `expandable_segments:True` on the H200: 20 MiB `cuMemCreate` chunks mapped into reserved
/// address space until the card is full. PyTorch's start-up probe, a 2 MiB `cuMemCreate` the
/// driver refuses with 800 (not permitted), is a failed call, not an out-of-memory.
#[test]
fn version_2_expandable_segments_count_only_real_out_of_memory() {
    let s = json(&[
        "summary",
        "--json",
        sample("v2-torch-expandable").to_str().unwrap(),
    ]);
    let d = &s["processes"][0]["devices"][0];
    assert_eq!(d["allocations"], 14260);
    assert_eq!(d["frees"], 14256);
    assert_eq!(d["peak_bytes"], 149_550_006_272u64);
    assert_eq!(d["failed_allocations"], 2);
    for f in d["failures"].as_array().unwrap() {
        assert_eq!(
            (f["api"].as_str(), f["size"].as_u64(), f["result"].as_i64()),
            (Some("cuMemCreate"), Some(20 << 20), Some(2))
        );
    }
    assert_eq!(d["failed_call_count"], 1);
    let call = &d["failed_calls"][0];
    assert_eq!(call["error"], "CUDA_ERROR_NOT_PERMITTED");
    assert_eq!(call["size"], 2u64 << 20);
}

fn compare_json(dir: &str, variant: &str, extra: &[&str]) -> serde_json::Value {
    let d = sample(dir);
    let mut args = vec![
        "compare",
        d.to_str().unwrap(),
        "--model",
        CONFIG,
        "--variant",
        variant,
        "--tokens",
        "4128",
        "--json",
    ];
    args.extend_from_slice(extra);
    json(&args)
}

/// Real fla 0.6.0 and PyTorch (H200, 2026-11-30 evening runs in docs/validation.md), with the
/// caching allocator on (the probe's tensors) and off (one driver allocation per tensor): every
/// fla tensor is matched and backed by a Python frame in the file the model cites.
#[test]
fn real_fla_tensors_are_matched_by_their_frames_in_both_caching_modes() {
    for dir in [
        "pytorch-gdn-cache",
        "pytorch-gdn-nocache",
        "pytorch-gdn-shapes",
    ] {
        let v = compare_json(dir, "fla-0.6.0", &[]);
        let a = &v["attribution"];
        for r in a["rows"].as_array().unwrap() {
            let file = r["source"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .nth(1)
                .unwrap()
                .split(':')
                .next()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_string();
            assert_eq!(r["evidence"]["kind"], "frame", "{dir}: {r}");
            assert!(
                r["evidence"]["frame"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("{file}:")),
                "{dir}: {r}"
            );
            assert_eq!(r["difference"], 0, "{dir}: {r}");
        }
        assert_eq!(a["evidence"]["evidence_bytes"], 334_436_352u64, "{dir}");
        assert_eq!(a["evidence"]["size_only_bytes"], 0, "{dir}");
    }
}

/// The same real fla 0.6.0 runs against vLLM 0.20.1's vendored copy of fla: the file names
/// are the same (`chunk_o.py`, `wy_fast.py`, ...), the module paths and lines are not, so no
/// frame backs vLLM's model, and each tensor's look-alike is said to be other code.
#[test]
fn real_fla_frames_do_not_back_vllms_vendored_copy() {
    for dir in [
        "pytorch-gdn-cache",
        "pytorch-gdn-nocache",
        "pytorch-gdn-shapes",
    ] {
        let v = compare_json(dir, "vllm-0.20.1", &[]);
        let a = &v["attribution"];
        for r in a["rows"].as_array().unwrap() {
            assert_ne!(r["evidence"]["kind"], "frame", "{dir}: {r}");
        }
        assert_eq!(a["evidence"]["evidence_bytes"], 0, "{dir}");
        assert!(
            a["evidence"]["other_implementation"]
                .as_str()
                .unwrap()
                .contains("chunk_o.py"),
            "{dir}: {}",
            a["evidence"]
        );
    }
}

/// The operator each fla 0.6.0 tensor's citation names (`torch.zeros(..)` for A, `k.new_empty`
/// for w and h, `k.new_zeros` for final_state, `torch.empty_like` for the rest) is the one
/// `--torch-shapes` recorded for that tensor on the H200: what shape evidence compares.
#[test]
fn the_operators_fla_citations_name_are_the_ones_the_h200_recorded() {
    let v = compare_json("pytorch-gdn-shapes", "fla-0.6.0", &[]);
    let a = &v["attribution"];
    let rows = a["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 8);
    for r in rows {
        let want = vramtrace_models::factory_operator(r["source"].as_str().unwrap())
            .unwrap_or_else(|| panic!("{r}"));
        let o = &a["observed"][r["observed"].as_u64().unwrap() as usize];
        assert_eq!(
            format!("aten::{}", o["op"]["op"].as_str().unwrap()),
            want,
            "{r}"
        );
        let shape: Vec<u64> = o["op"]["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(
            format!("{shape:?}").replace(' ', ""),
            r["shape"].as_str().unwrap().replace(' ', ""),
            "{r}"
        );
    }
}

/// PyTorch's FlashAttention allocates in C++: Python frames cannot back the match, but
/// `--torch-shapes` gives every output's operator, shape and dtype.
#[test]
fn flash_attention_outputs_are_backed_by_their_shapes_with_torch_shapes() {
    let seqk = ["--max-seqlen-k", "262144"];
    let v = compare_json("pytorch-fa-shapes", "pytorch", &seqk);
    let rows = v["attribution"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert_eq!(r["evidence"]["kind"], "shape", "{r}");
        assert!(
            r["evidence"]["op"]
                .as_str()
                .unwrap()
                .starts_with("_flash_attention_forward ["),
            "{r}"
        );
    }
    // Without shapes the same tensors rest on size and order alone, and are still matched
    // (rng_state and the philox offset are 512-byte blocks of the caching allocator).
    let v = compare_json("pytorch-fa-cache", "pytorch", &seqk);
    for r in v["attribution"]["rows"].as_array().unwrap() {
        assert_eq!(r["evidence"]["kind"], "size_only", "{r}");
        assert_eq!(r["difference"], 0, "{r}");
    }
}

/// A GDN layer written in plain PyTorch with fla's buffer shapes (scripts/validate/naive_gdn.py)
/// is not reported as fla, in either caching mode.
#[test]
fn a_gdn_layer_that_is_not_fla_gets_no_fla_tensor_matched() {
    for dir in ["naive-gdn-cache", "naive-gdn-nocache"] {
        let v = compare_json(dir, "fla-0.6.0", &[]);
        let a = &v["attribution"];
        assert_eq!(a["attributed_bytes"], 0, "{dir}");
        for r in a["rows"].as_array().unwrap() {
            assert!(r["observed"].is_null(), "{dir}: {r}");
            assert_eq!(r["evidence"]["kind"], "contradicted", "{dir}: {r}");
        }
        assert!(
            a["evidence"]["other_implementation"]
                .as_str()
                .unwrap()
                .contains("naive_gdn.py"),
            "{dir}"
        );
    }
}

/// PyTorch's own snapshot of the measured call (`_record_memory_history`), imported, holds the
/// same tensors as the probe's record of that run: the blocks live before its history began
/// were allocated earlier in ours, and the call's allocations (pointer and requested bytes) and
/// frees (pointer) appear in ours in the same order.
#[test]
fn pytorchs_own_snapshot_imported_is_the_same_tensor_set_as_ours() {
    for dir in ["pytorch-gdn-cache", "pytorch-fa-cache"] {
        let imported = scratch(&format!("imported-{dir}"));
        let o = Command::new(vramtrace())
            .arg("import")
            .arg(sample(dir).join("pytorch-snapshot.pickle"))
            .arg("-o")
            .arg(&imported)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", describe(&o));
        let tensors = |p: &std::path::Path| -> Vec<(u64, String, String, Option<u64>)> {
            events(p)
                .iter()
                .filter(|e| e["kind"] == "tensor_alloc" || e["kind"] == "tensor_free")
                .map(|e| {
                    let alloc = e["kind"] == "tensor_alloc";
                    (
                        e["t_ns"].as_u64().unwrap(),
                        e["kind"].as_str().unwrap().to_string(),
                        e["ptr"].as_str().unwrap().to_string(),
                        alloc.then(|| e["requested"].as_u64().unwrap()),
                    )
                })
                .collect()
        };
        let ours: Vec<_> = tensors(&sample(dir))
            .into_iter()
            .map(|t| (t.1, t.2, t.3))
            .collect();
        let theirs = tensors(&imported);
        let t0 = theirs.iter().map(|t| t.0).min().unwrap();
        let (before, call): (Vec<_>, Vec<_>) = theirs.into_iter().partition(|t| t.0 == t0);
        let call: Vec<_> = call.into_iter().map(|t| (t.1, t.2, t.3)).collect();
        assert!(!call.is_empty(), "{dir}");
        let at = (0..=ours.len() - call.len())
            .find(|&i| ours[i..i + call.len()] == call[..])
            .unwrap_or_else(|| panic!("{dir}: the call's {call:?} is not in ours {ours:?}"));
        for b in before {
            let b = (b.1, b.2, b.3);
            assert!(ours[..at].contains(&b), "{dir}: {b:?} not allocated before");
        }
        let _ = std::fs::remove_dir_all(&imported);
    }
}

/// NCCL under torchrun on two H200s: every release pairs with what the rank obtained (the one
/// release left unmatched was a `cuMemFree_v2(0)`, which frees nothing).
#[test]
fn nccl_ranks_leave_no_release_unmatched() {
    let ev = events(&sample("nccl-stages"));
    assert!(
        ev.iter()
            .any(|e| e["api"] == "cuMemImportFromShareableHandle")
    );
    let unmatched: Vec<_> = ev.iter().filter(|e| e["unmatched"] == true).collect();
    assert!(unmatched.is_empty(), "{unmatched:?}");
    assert!(
        ev.iter()
            .any(|e| e["api"] == "cuMemFree_v2" && e["ptr"] == "0x0"),
        "the null free is in the trace"
    );
}

/// `summary --json` carries what the memory holds, in the categoriser's rows, at the first
/// out-of-memory: torch-oom (a real allocator OOM under a 24 GiB cap) to the byte, every row
/// with what it rests on, and what no rule names by its Python line.
#[test]
fn summary_puts_every_byte_of_torch_oom_in_a_category() {
    let v = json(&["summary", "--json", sample("torch-oom").to_str().unwrap()]);
    let d = v["processes"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == 0)
        .unwrap()
        .clone();
    let c = &d["categories"];
    assert_eq!(c["at"], "failure");
    assert_eq!(c["total"], 25_229_590_528u64);
    let rows: Vec<(String, u64, u64)> = c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["category"].as_str().unwrap().to_string(),
                r["bytes"].as_u64().unwrap(),
                r["count"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64, u64)> = [
        ("weights", 11_168_645_120u64, 64u64),
        ("kv_cache", 6_919_421_952, 102),
        ("state", 38_862_848, 12),
        ("activations", 3_189_318_656, 8),
        ("allocator_reserve", 3_149_126_656, 0),
        ("context", 730_660_864, 5),
        ("unnamed", 33_554_432, 1),
    ]
    .iter()
    .map(|(k, b, n)| (k.to_string(), *b, *n))
    .collect();
    assert_eq!(rows, want);
    assert_eq!(
        c["rows"][0]["evidence"][0]["evidence"],
        serde_json::json!({"kind": "lifetime", "lifetime": {"kind": "persistent"}})
    );
    assert_eq!(
        c["rows"][6]["evidence"][0]["evidence"],
        serde_json::json!({"kind": "site", "site": "torch_prefill.py:55 prefill"})
    );
    // The reserve per segment, with its largest free block: PyTorch's 887.88 MiB block.
    assert_eq!(c["segments"][0]["largest_free_block"], 931_004_416u64);
    // And as text.
    let o = Command::new(vramtrace())
        .args(["summary", sample("torch-oom").to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    for line in [
        "    what the memory holds at the first out-of-memory:",
        "      KV cache              6.44 GiB  27.43% in 102",
        "          6.44 GiB in 102: lifetime: its line keeps tensors of 25 earlier steps (grows)",
        "          32.00 MiB in 1: no rule; at torch_prefill.py:55 prefill",
        "      total                23.50 GiB",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
}
