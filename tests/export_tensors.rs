//! The exports at the tensor level, on the kept H200 caching-on samples that hold both our
//! record of a run (the PyTorch probe's tensors) and PyTorch's own `_snapshot()` of its measured
//! call (`samples/h200/pytorch-{gdn,fa}-cache/pytorch-snapshot.pickle`):
//!
//! - `export --format pytorch --until` the moment PyTorch took its snapshot shows the same
//!   segments, blocks, sizes, requested sizes and frames, and PyTorch's device trace is one run
//!   of ours (`scripts/validate/snapshot_equal.py`, standard library only; the same check the
//!   lead runs on new H200 runs);
//! - `import` of PyTorch's snapshot then `export` gives PyTorch's snapshot back (every tensor);
//! - without Python: our export at that moment and the round trip of PyTorch's, read back
//!   with serde-pickle, have the same segments and blocks, with the counts known.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_pickle::{HashableValue as H, Value as V};

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/h200")
        .join(name)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/validate/snapshot_equal.py")
}

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(vramtrace()).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = cli(args);
    assert!(o.status.success(), "{args:?}: {}", describe(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn export(trace: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "export",
        trace.to_str().unwrap(),
        "--format",
        "pytorch",
        "--max-entries",
        "0",
        "--force",
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ok(&args);
}

fn equal(ours: &Path, theirs: &Path) -> String {
    let o = Command::new("python3")
        .arg(script())
        .arg(ours)
        .arg(theirs)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "our snapshot {} is not PyTorch's {}:\n{text}{}",
        ours.display(),
        theirs.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    text
}

fn get<'a>(d: &'a V, k: &str) -> &'a V {
    let V::Dict(d) = d else {
        panic!("not a dict: {d:?}")
    };
    d.get(&H::String(k.into()))
        .unwrap_or_else(|| panic!("no {k}"))
}

fn list(v: &V) -> &[V] {
    match v {
        V::List(l) => l,
        V::Tuple(l) => l,
        _ => panic!("not a list: {v:?}"),
    }
}

fn int(v: &V) -> i64 {
    match v {
        V::I64(i) => *i,
        _ => panic!("not an int: {v:?}"),
    }
}

fn text(v: &V) -> &str {
    match v {
        V::String(s) => s,
        _ => panic!("not text: {v:?}"),
    }
}

fn load(p: &Path) -> V {
    serde_pickle::value_from_slice(&std::fs::read(p).unwrap(), Default::default()).unwrap()
}

/// Per segment: (address, total, allocated, requested, [(block address, size, state)]); and
/// the device trace's (action, address, size) counted by action.
type Picture = (
    Vec<(i64, i64, i64, i64, Vec<(i64, i64, String)>)>,
    BTreeMap<String, usize>,
);

fn picture(v: &V) -> Picture {
    let segs = list(get(v, "segments"))
        .iter()
        .map(|s| {
            let blocks = list(get(s, "blocks"))
                .iter()
                .map(|b| {
                    (
                        int(get(b, "address")),
                        int(get(b, "size")),
                        text(get(b, "state")).to_string(),
                    )
                })
                .collect();
            (
                int(get(s, "address")),
                int(get(s, "total_size")),
                int(get(s, "allocated_size")),
                int(get(s, "requested_size")),
                blocks,
            )
        })
        .collect();
    let mut actions = BTreeMap::new();
    for t in list(get(v, "device_traces")) {
        for e in list(t) {
            *actions
                .entry(text(get(e, "action")).to_string())
                .or_default() += 1;
        }
    }
    (segs, actions)
}

/// The moment each sample's PyTorch snapshot was taken, as `--until` takes it: the wall-clock
/// time of our entry that ends PyTorch's trace (found by `snapshot_equal.py --locate`, which
/// the Python test below checks again).
const GDN_AT: &str = "@1796078880693674";
const FA_AT: &str = "@1796078885496373";
/// A transformers Qwen3.5 prefill (8 layers, fla, 2 chunks of 4128 tokens) recorded on the H200
/// on 2026-12-01 (`h200.sh exports_equal`, docs/validation.md): its process also holds driver
/// allocations no tensor came from (1 KiB, 128 KiB and 64 MiB), which PyTorch's snapshot does
/// not have and ours therefore leaves out.
const HF_AT: &str = "@1796145892380214";

/// PyTorch's snapshot imported, then exported: read back with serde-pickle (which cannot read
/// PyTorch's own pickle: its memo shares objects), checked against PyTorch's own by the Python
/// test below.
fn round_trip(dir: &Path, name: &str) -> PathBuf {
    let theirs = sample(name).join("pytorch-snapshot.pickle");
    let imported = dir.join(name);
    let _ = std::fs::remove_dir_all(&imported);
    ok(&[
        "import",
        theirs.to_str().unwrap(),
        "-o",
        imported.to_str().unwrap(),
    ]);
    let back = dir.join(format!("{name}-back.pickle"));
    export(&imported, &back, &[]);
    back
}

#[test]
fn our_snapshot_at_the_moment_pytorch_took_its_own_has_its_segments_and_blocks() {
    let dir = scratch("export-tensors-counts");
    for (name, at, segments, blocks, active, requested, allocs) in [
        // fla GDN: 9 segments; the inputs q, k, v, g, beta, initial_state, and final_state and
        // o allocated. PyTorch's history holds 8 allocations; 6 more were live before it.
        ("pytorch-gdn-cache", GDN_AT, 9, 19, 8, 142_746_624, 14),
        // FlashAttention: 4 segments, 8 allocated blocks, three of them 512-byte blocks for
        // requests of 8, 16 and 8 bytes.
        ("pytorch-fa-cache", FA_AT, 4, 12, 8, 118_754_336, 8),
        // transformers: 16 of the process's 19 driver allocations are PyTorch's segments; 130
        // tensors live between the chunks; PyTorch's history holds 1281 allocations, 112 more
        // were live before it began.
        (
            "hf-prefill-exports",
            HF_AT,
            16,
            151,
            130,
            1_466_639_360,
            1393,
        ),
    ] {
        let ours = dir.join(format!("{name}.pickle"));
        export(&sample(name), &ours, &["--until", at]);
        let (mine, _) = picture(&load(&ours));
        let (theirs, actions) = picture(&load(&round_trip(&dir, name)));
        assert_eq!(mine, theirs, "{name}: segments and blocks");
        assert_eq!(mine.len(), segments);
        let all: Vec<_> = mine.iter().flat_map(|s| &s.4).collect();
        assert_eq!(all.len(), blocks);
        assert_eq!(
            all.iter().filter(|b| b.2 == "active_allocated").count(),
            active
        );
        assert_eq!(mine.iter().map(|s| s.3).sum::<i64>(), requested);
        // Every tensor of PyTorch's snapshot survives the round trip.
        assert_eq!(actions.get("alloc"), Some(&allocs), "{name}");
    }
}

#[test]
fn the_whole_run_exports_every_tensor_and_segment() {
    let dir = scratch("export-tensors-whole");
    let ours = dir.join("gdn.pickle");
    let o = cli(&[
        "export",
        sample("pytorch-gdn-cache").to_str().unwrap(),
        "--format",
        "pytorch",
        "--max-entries",
        "0",
        "-o",
        ours.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", describe(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(
            "process 636, PyTorch's tensors: 9 segments holding 0 blocks, 219 trace entries \
             (70 alloc, 0 oom)"
        ),
        "{}",
        describe(&o)
    );
    let (segs, actions) = picture(&load(&ours));
    // Every tensor freed at the end: nine segments, each one free block.
    assert_eq!(segs.len(), 9);
    assert!(
        segs.iter()
            .all(|s| s.4.len() == 1 && s.4[0].2 == "inactive")
    );
    let want: BTreeMap<String, usize> = [
        ("alloc", 70),
        ("free_completed", 70),
        ("free_requested", 70),
        ("segment_alloc", 9),
    ]
    .into_iter()
    .map(|(a, n)| (a.to_string(), n))
    .collect();
    assert_eq!(actions, want);
}

/// The full comparison (frames too), with the script the lead runs on new H200 runs. Needs
/// python3 (standard library only; CI sets `VRAMTRACE_TEST_REQUIRE_PYTHON=1`).
#[test]
fn snapshot_equal_finds_the_same_picture_as_pytorchs_own() {
    if !vramtrace_testkit::python3_or_skip() {
        return;
    }
    let dir = scratch("export-tensors-python");
    for (name, at) in [
        ("pytorch-gdn-cache", GDN_AT),
        ("pytorch-fa-cache", FA_AT),
        ("hf-prefill-exports", HF_AT),
    ] {
        let theirs = sample(name).join("pytorch-snapshot.pickle");
        let whole = dir.join(format!("{name}-whole.pickle"));
        export(&sample(name), &whole, &[]);
        let o = Command::new("python3")
            .arg(script())
            .arg("--locate")
            .arg(&whole)
            .arg(&theirs)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", describe(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), at, "{name}");
        // The whole run is not the moment of PyTorch's snapshot: the check says so.
        let o = Command::new("python3")
            .arg(script())
            .arg(&whole)
            .arg(&theirs)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
        let ours = dir.join(format!("{name}.pickle"));
        export(&sample(name), &ours, &["--until", at]);
        let out = equal(&ours, &theirs);
        assert!(out.ends_with("same picture\n"), "{out}");
        // And PyTorch's snapshot imported, then exported.
        let out = equal(&round_trip(&dir, name), &theirs);
        assert!(out.ends_with("same picture\n"), "{out}");
    }
}

/// `tensors.parquet` of the fla run, read back with the parquet crate: every tensor event
/// (70 allocations, 70 frees), each in one of the nine segments, and the run's bytes grouped
/// by the Python line that allocated them.
#[test]
fn parquet_tensors_group_the_runs_bytes_by_python_line() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    let out = scratch("export-tensors-parquet").join("tables");
    let _ = std::fs::remove_dir_all(&out);
    let o = cli(&[
        "export",
        sample("pytorch-gdn-cache").to_str().unwrap(),
        "--format",
        "parquet",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", describe(&o));
    let r = SerializedFileReader::new(std::fs::File::open(out.join("tensors.parquet")).unwrap())
        .unwrap();
    let mut by_line: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut segments = std::collections::BTreeSet::new();
    let mut categories: BTreeMap<String, u64> = BTreeMap::new();
    for row in r.get_row_iter(None).unwrap() {
        let row = row.unwrap();
        let f: BTreeMap<String, Field> = row
            .get_column_iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let Field::Str(kind) = &f["kind"] else {
            panic!("{f:?}")
        };
        *kinds.entry(kind.clone()).or_default() += 1;
        let Field::Long(seg) = &f["segment"] else {
            panic!("every tensor of this run is in a segment: {f:?}")
        };
        segments.insert(*seg);
        if kind != "alloc" {
            continue;
        }
        let Field::Str(cat) = &f["category"] else {
            panic!("{f:?}")
        };
        *categories.entry(cat.clone()).or_default() += 1;
        let (Field::Str(line), Field::Long(size)) = (&f["line"], &f["size"]) else {
            panic!("{f:?}")
        };
        let e = by_line.entry(line.clone()).or_default();
        e.0 += 1;
        e.1 += size;
    }
    assert_eq!(kinds["alloc"], 70);
    assert_eq!(kinds["free"], 70);
    assert_eq!(segments.len(), 9);
    // Three calls of fla's chunk_gated_delta_rule (warm-up and measured): fla's lines, each
    // three times (fla 0.6.0: fla/ops/common/chunk_o.py:565, chunk_delta_h.py:722,
    // gated_delta_rule/wy_fast.py:273).
    for (line, n, bytes) in [
        ("chunk_o.py:565 chunk_fwd_o", 3, 3 * 50_724_864),
        (
            "chunk_delta_h.py:722 chunk_gated_delta_rule_fwd_h",
            3,
            3 * 102_236_160,
        ),
        ("wy_fast.py:273 recompute_w_u_fwd", 3, 3 * 50_724_864),
        ("model_vs_torch.py:137 gdn", 1, 3_145_728),
    ] {
        assert_eq!(by_line.get(line), Some(&(n, bytes)), "{line}: {by_line:?}");
    }
    assert_eq!(by_line.values().map(|v| v.0).sum::<u64>(), 70);
    // The categoriser reads each tensor's frames: Triton's autotuner flushing its cache (34 ×
    // 256 MiB under fla's `cache.py:378 run`), fla's kernels (activations), the final state
    // carried out of the layer, and what no rule covers.
    let expected: BTreeMap<String, u64> = [
        ("activations", 32),
        ("autotuning", 34),
        ("recurrent state", 1),
        ("unnamed", 3),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(categories.into_iter().collect::<BTreeMap<_, _>>(), expected);
}

/// The README's query, run by DuckDB as a user would. Needs the `duckdb` Python package (CI
/// installs it into `VRAMTRACE_TEST_PYTHONPATH` and sets `VRAMTRACE_REQUIRE_DUCKDB=1`).
#[test]
fn duckdb_groups_the_runs_bytes_by_python_line() {
    let Some(pythonpath) =
        vramtrace_testkit::duckdb_or_skip("duckdb_groups_the_runs_bytes_by_python_line")
    else {
        return;
    };
    let out = scratch("export-tensors-duckdb").join("tables");
    let _ = std::fs::remove_dir_all(&out);
    ok(&[
        "export",
        sample("pytorch-gdn-cache").to_str().unwrap(),
        "--format",
        "parquet",
        "-o",
        out.to_str().unwrap(),
    ]);
    let query = format!(
        "import duckdb; print(duckdb.sql(\"SELECT line, count(*) AS tensors, sum(size) AS bytes \
         FROM '{}' WHERE kind = 'alloc' GROUP BY line ORDER BY bytes DESC, line LIMIT 3\").fetchall())",
        out.join("tensors.parquet").display()
    );
    let q = Command::new("python3")
        .args(["-c", &query])
        .env("PYTHONPATH", &pythonpath)
        .output()
        .unwrap();
    assert!(q.status.success(), "{}", describe(&q));
    assert_eq!(
        String::from_utf8_lossy(&q.stdout).trim(),
        "[('driver.py:761 get_empty_cache_for_benchmark', 34, 9126805504), \
         ('chunk_delta_h.py:722 chunk_gated_delta_rule_fwd_h', 3, 306708480), \
         ('chunk_delta_h.py:725 chunk_gated_delta_rule_fwd_h', 3, 152174592)]"
    );
}

/// Perfetto at the tensor level: a slice per tensor (named by its name, else its Python line)
/// and a counter per device whose categories add up to the live tensor bytes, peaking at the
/// summary's tensor peak of the run (659.70 MiB).
#[test]
fn perfetto_has_a_slice_per_tensor_and_counters_by_category() {
    let out = scratch("export-tensors-perfetto").join("trace.json");
    let o = cli(&[
        "export",
        sample("pytorch-gdn-cache").to_str().unwrap(),
        "--format",
        "perfetto",
        "--force",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let slices: Vec<&serde_json::Value> = events.iter().filter(|e| e["cat"] == "tensor").collect();
    assert_eq!(slices.len(), 70);
    let o_line = slices
        .iter()
        .filter(|s| s["name"] == "chunk_o.py:565 chunk_fwd_o")
        .collect::<Vec<_>>();
    assert_eq!(o_line.len(), 3);
    assert!(o_line.iter().all(|s| s["args"]["size"] == 50_724_864));
    let q = slices
        .iter()
        .find(|s| s["name"] == "input q bfloat16[1, 4128, 16, 128]")
        .expect("the named input q");
    assert_eq!(q["args"]["category"], "activations");
    assert_eq!(q["args"]["line"], "model_vs_torch.py:132 gdn");
    let counters: Vec<u64> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "tensor bytes: device 0")
        .map(|e| {
            let args = e["args"].as_object().unwrap();
            assert_eq!(args.len(), 12, "one value per category: {args:?}");
            args.values().map(|b| b.as_u64().unwrap()).sum()
        })
        .collect();
    // An allocation, a free, and six names given later (each moves its bytes).
    assert_eq!(counters.len(), 146);
    assert_eq!(counters.iter().max(), Some(&691_747_840));
    assert_eq!(counters.last(), Some(&0));
}

/// A synthetic caching-allocator trace whose every value is known, through the library: an
/// expandable segment mapped as two touching 20 MiB chunks holding one 30 MiB block, a 2 MiB
/// segment with a 512-byte block for an 8-byte request, a tensor in no recorded segment, an
/// allocator OOM, and the small block freed and its segment given back.
mod synthetic {
    use super::*;
    use vramtrace::Trace;
    use vramtrace::export::{Progress, SnapshotOptions, export_pytorch};
    use vramtrace_format::{
        Api, Event, EventKind, Header, MemKind, Record, TensorAction, TensorEvent,
    };

    const MIB: u64 = 1 << 20;
    const S: u64 = 0x7f00_0000_0000;
    const D: u64 = 0x7f10_0000_0000;
    const X: u64 = 0x7f20_0000_0000;

    fn trace(name: &str) -> Trace {
        let dir = scratch(name);
        let mut bytes = Vec::new();
        Header {
            version: 1,
            pid: 5,
            ppid: 1,
            start_unix_ns: 1_700_000_000_000_000_000,
            start_mono_ns: 500,
            hostname: "h".into(),
            cmdline: vec!["python3".into()],
        }
        .encode(&mut bytes);
        let mut buf = vec![0u8; 512];
        let mut push = |r: Record| bytes.extend_from_slice(r.encode(&mut buf));
        let ev = |t_ns, kind, mem, name: &str, ptr, size| {
            Record::Event(Event {
                t_ns,
                tid: 5,
                device: 0,
                kind,
                mem,
                api: Api::from_name(name).unwrap(),
                ptr,
                size,
                ..Event::default()
            })
        };
        let tensor = |t_ns, action, ptr, size, requested| {
            Record::Tensor(TensorEvent {
                t_ns,
                tid: 5,
                device: 0,
                action,
                ptr,
                size,
                requested,
                free: if action == TensorAction::AllocFailed {
                    123
                } else {
                    0
                },
                ..TensorEvent::default()
            })
        };
        let (a, f) = (EventKind::Alloc, EventKind::Free);
        push(ev(1000, a, MemKind::Mapping, "cuMemMap", S, 20 * MIB));
        push(ev(
            1100,
            a,
            MemKind::Mapping,
            "cuMemMap",
            S + 20 * MIB,
            20 * MIB,
        ));
        push(tensor(
            1200,
            TensorAction::Alloc,
            S,
            30 * MIB,
            30 * MIB - 100,
        ));
        push(ev(1300, a, MemKind::Device, "cuMemAlloc_v2", D, 2 * MIB));
        push(tensor(1310, TensorAction::Alloc, D, 512, 8));
        push(tensor(1400, TensorAction::Alloc, X, 4096, 4000));
        push(tensor(1500, TensorAction::AllocFailed, 0, 1 << 30, 0));
        push(tensor(1600, TensorAction::Free, D, 0, 0));
        push(ev(1700, f, MemKind::Device, "cuMemFree_v2", D, 0));
        std::fs::write(dir.join("5.vtr"), bytes).unwrap();
        Trace::open(&dir).unwrap()
    }

    fn snapshot(name: &str, until_ns: Option<u64>) -> (vramtrace::export::SnapshotCounts, V) {
        let opts = SnapshotOptions {
            until_ns,
            ..SnapshotOptions::default()
        };
        let mut out = Vec::new();
        let n = export_pytorch(&trace(name), &opts, &mut out, &Progress::hidden()).unwrap();
        (
            n,
            serde_pickle::value_from_slice(&out, Default::default()).unwrap(),
        )
    }

    fn entries(v: &V) -> Vec<(String, i64, i64)> {
        list(&list(get(v, "device_traces"))[0])
            .iter()
            .map(|e| {
                (
                    text(get(e, "action")).to_string(),
                    int(get(e, "addr")),
                    int(get(e, "size")),
                )
            })
            .collect()
    }

    #[test]
    fn blocks_segments_and_the_allocators_trace() {
        let (n, v) = snapshot("export-tensors-synthetic", None);
        assert!(n.tensor_level);
        assert_eq!(
            (n.segments, n.blocks, n.entries, n.allocs, n.ooms),
            (2, 2, 10, 3, 1)
        );
        let (s, d, x) = (S as i64, D as i64, X as i64);
        let mib = MIB as i64;
        let want: Vec<(String, i64, i64)> = [
            ("segment_map", s, 20 * mib),
            ("segment_map", s + 20 * mib, 20 * mib),
            ("alloc", s, 30 * mib - 100),
            ("segment_alloc", d, 2 * mib),
            ("alloc", d, 8),
            ("alloc", x, 4000),
            ("oom", 0, 1 << 30),
            ("free_requested", d, 8),
            ("free_completed", d, 8),
            ("segment_free", d, 2 * mib),
        ]
        .into_iter()
        .map(|(a, p, z)| (a.to_string(), p, z))
        .collect();
        assert_eq!(entries(&v), want);
        let oom = &list(&list(get(&v, "device_traces"))[0])[6];
        assert_eq!(int(get(oom, "device_free")), 123);
        let (segs, _) = picture(&v);
        assert_eq!(
            segs,
            vec![
                // The two chunks are one expandable segment: the block, then the rest free.
                (
                    s,
                    40 * mib,
                    30 * mib,
                    30 * mib - 100,
                    vec![
                        (s, 30 * mib, "active_allocated".to_string()),
                        (s + 30 * mib, 10 * mib, "inactive".to_string()),
                    ]
                ),
                // A tensor in no recorded segment is a segment of its own.
                (
                    x,
                    4096,
                    4096,
                    4000,
                    vec![(x, 4096, "active_allocated".to_string())]
                ),
            ]
        );
        let first = &list(get(&v, "segments"))[0];
        assert_eq!(get(first, "is_expandable"), &V::Bool(true));
        assert_eq!(text(get(first, "segment_type")), "large");
    }

    #[test]
    fn until_is_the_state_at_that_moment() {
        // Just after the small block was handed out (t = 1310 ns).
        let (n, v) = snapshot("export-tensors-synthetic-until", Some(1350));
        assert_eq!((n.segments, n.blocks, n.entries), (2, 2, 5));
        let (segs, _) = picture(&v);
        let (s, d) = (S as i64, D as i64);
        assert_eq!(segs[0].0, s);
        assert_eq!(
            segs[1],
            (
                d,
                2 * MIB as i64,
                512,
                8,
                vec![
                    (d, 512, "active_allocated".to_string()),
                    (d + 512, 2 * MIB as i64 - 512, "inactive".to_string()),
                ]
            )
        );
        assert_eq!(
            text(get(&list(get(&v, "segments"))[1], "segment_type")),
            "small"
        );
    }
}
