//! Bounded traces (`vramtrace run --max-size`): tensor-level records in a ring of droppable
//! blocks, against the stand-in torch (probes/python/tests/fake_torch) and
//! probes/python/tests/ring_prog.py. The trace stays within its budget while failures, the live
//! tensors and the notes survive, `summary` says which time range lost tensor detail, and a
//! flight record of the live set is written at a refusal, on SIGUSR2 and on `vramtrace
//! snapshot PID`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use vramtrace_format::{Record, TensorAction, TraceFile};

const MIB: u64 = 1 << 20;
/// The three blocks ring_prog.py keeps: 4 MiB, 3 MiB and a 1,000-byte request (a 1 KiB block).
const KEPT_BYTES: u64 = 4 * MIB + 3 * MIB + 1024;

fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("probes/python/tests")
}

/// Runs ring_prog.py MODE N under `vramtrace run` with `extra` options; the trace directory
/// and the program's stdout.
fn run_ring(name: &str, mode: &str, n: u32, extra: &[&str]) -> (PathBuf, String) {
    let out = scratch(name).join("trace");
    let o = Command::new(vramtrace())
        .args(["run", "-q", "--out"])
        .arg(&out)
        .args(extra)
        .arg("--")
        .arg("python3")
        .arg(python_dir().join("ring_prog.py"))
        .arg(mode)
        .arg(n.to_string())
        .env("PYTHONPATH", python_dir().join("fake_torch"))
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .env("VRAMTRACE_BIN", vramtrace())
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{mode}: {}", describe(&o));
    (out, String::from_utf8(o.stdout).unwrap())
}

fn trace_file(out: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "vtr"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// `(ptr, size)` of the blocks the program printed as `keep PTR SIZE` (the size asked for).
fn kept(stdout: &str) -> Vec<(u64, u64)> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("keep "))
        .map(|l| {
            let mut w = l.split(' ').map(|x| x.parse::<u64>().unwrap());
            (w.next().unwrap(), w.next().unwrap().div_ceil(512) * 512)
        })
        .collect()
}

fn summary_json(out: &Path) -> serde_json::Value {
    let o = Command::new(vramtrace())
        .args(["summary", "--json"])
        .arg(out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The flight record's Live records (ptr, size), in the order written after its NOTE.
fn flight_record(t: &TraceFile, why: &str) -> (String, Vec<(u64, u64)>) {
    let at = t
        .records
        .iter()
        .position(|r| matches!(r, Record::Note { text, .. } if text.starts_with(&format!("flight record: {why}"))))
        .unwrap_or_else(|| panic!("no flight record for {why}"));
    let Record::Note { t_ns, text } = &t.records[at] else {
        unreachable!()
    };
    let live = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Tensor(e) if e.action == TensorAction::Live && e.t_ns == *t_ns => {
                Some((e.ptr, e.size))
            }
            _ => None,
        })
        .collect();
    (text.clone(), live)
}

/// 20,000 blocks allocated and freed (some 1.6 MB of tensor records) under a 512 KiB budget,
/// then the allocator refuses a request: the file stays within 512 KiB, the refusal is there
/// with PyTorch's numbers, the live set at the refusal is exactly the three blocks allocated
/// first (whose own records were the first dropped), and `summary` says which time range lost
/// tensor detail. The same program without a budget keeps every record and passes 512 KiB.
#[test]
fn the_ring_keeps_failures_and_the_live_set_within_the_budget() {
    let budget = 512 << 10;
    let (out, stdout) = run_ring("ring-oom", "oom", 20_000, &["--max-size", "512KiB"]);
    let file = trace_file(&out);
    let len = std::fs::metadata(&file).unwrap().len();
    assert!(len <= budget, "{len} bytes over the {budget}-byte budget");
    let t = TraceFile::read(&file).unwrap();
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let keep = kept(&stdout);
    let dropped = t
        .records
        .iter()
        .filter(|r| matches!(r, Record::Dropped { .. }))
        .count();
    assert!(dropped > 0, "no block was dropped");
    // The kept blocks' allocation records were the oldest: dropped, and restated.
    let allocs: Vec<u64> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Tensor(e) if e.action == TensorAction::Alloc => Some(e.ptr),
            _ => None,
        })
        .collect();
    assert!(keep.iter().all(|(p, _)| !allocs.contains(p)), "not dropped");
    assert!(allocs.len() < 20_000, "{} allocations kept", allocs.len());
    let (note, live) = flight_record(&t, "PyTorch's allocator refused a request");
    assert_eq!(
        note,
        format!(
            "flight record: PyTorch's allocator refused a request: 3 live tensors, {KEPT_BYTES} bytes"
        )
    );
    assert_eq!(live, keep);

    let v = summary_json(&out);
    let p = &v["processes"][0];
    let f = &p["devices"][0]["failures"][0];
    assert_eq!(f["api"], "pytorch");
    assert_eq!(f["torch"]["requested"], 20u64 << 30);
    assert_eq!(f["torch"]["allocated"], KEPT_BYTES);
    assert_eq!(f["tensors"]["tensor_count"], 3);
    assert_eq!(f["tensors"]["tensor_bytes"], KEPT_BYTES);
    let mut at_failure: Vec<(u64, u64)> = f["tensors"]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let ptr = x["ptr"].as_str().unwrap().trim_start_matches("0x");
            (
                u64::from_str_radix(ptr, 16).unwrap(),
                x["size"].as_u64().unwrap(),
            )
        })
        .collect();
    at_failure.sort();
    assert_eq!(at_failure, keep, "{f}");
    let lost = p["tensor_detail_lost"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "one thread: one range: {lost:?}");
    assert_eq!(lost[0]["blocks"], dropped as u64);
    let (from, to) = (
        lost[0]["from_s"].as_f64().unwrap(),
        lost[0]["to_s"].as_f64().unwrap(),
    );
    assert!(from < to, "{lost:?}");
    let o = Command::new(vramtrace())
        .arg("summary")
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!(
            "tensor detail lost to the size budget from {} to {} ({dropped} blocks dropped;",
            vramtrace_models::units::fmt_secs(from),
            vramtrace_models::units::fmt_secs(to)
        )),
        "{text}"
    );

    // A follower (the live view's reader) reads the reused blocks once each: the same tensor
    // records as the whole-file reader, no more.
    let mut follower = vramtrace_format::Follower::open(&file).unwrap();
    let mut followed = Vec::new();
    for _ in 0..3 {
        let (records, problems) = follower.poll().unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        followed.extend(records.into_iter().filter_map(|r| match r {
            Record::Tensor(e) => Some((e.t_ns, e.ptr, e.action as u8)),
            _ => None,
        }));
    }
    let mut whole: Vec<(u64, u64, u8)> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Tensor(e) => Some((e.t_ns, e.ptr, e.action as u8)),
            _ => None,
        })
        .collect();
    followed.sort_unstable();
    whole.sort_unstable();
    assert_eq!(followed.len(), whole.len());
    assert!(followed == whole, "the follower read other tensor records");

    // The other readers say it too: the report, and `events` on stderr.
    let o = Command::new(vramtrace())
        .arg("report")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(
        md.contains("blocks dropped; driver events, failures and the live set kept)")
            && md.contains(&format!("({dropped} blocks dropped;")),
        "{md}"
    );
    let o = Command::new(vramtrace())
        .arg("events")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!(
            "were dropped to keep the trace within its size budget ({dropped} blocks;"
        )),
        "{}",
        describe(&o)
    );

    // No budget: every record kept, and the file is past what the budget held it to.
    let (out, _) = run_ring("ring-unbounded", "oom", 20_000, &["--max-size", "0"]);
    let file = trace_file(&out);
    assert!(std::fs::metadata(&file).unwrap().len() > budget);
    let t = TraceFile::read(&file).unwrap();
    let events = t
        .records
        .iter()
        .filter(|r| matches!(r, Record::Tensor(e) if e.action != TensorAction::Live))
        .count();
    assert_eq!(events, 3 + 2 * 20_000 + 1);
    assert!(
        !t.records
            .iter()
            .any(|r| matches!(r, Record::Dropped { .. }))
    );
    assert!(summary_json(&out)["processes"][0]["tensor_detail_lost"].is_null());
}

/// A live set larger than the budget: 20,000 more tensors kept beside the three, and 20,000
/// allocated and freed, under 512 KiB. Each tensor that outlives its record is restated once
/// into never-dropped blocks, and its release follows it there, so the replayed live set stays
/// exact (before, releases dropped with their block left tensors live for good); the file
/// passes the budget by those statements and the refusal's flight record, and no more.
#[test]
fn a_live_set_larger_than_the_budget_stays_exact() {
    let budget = 512 << 10;
    let k = 20_000u64;
    let out = scratch("ring-many-live-k").join("trace");
    let o = Command::new(vramtrace())
        .args(["run", "-q", "--max-size", "512KiB", "--out"])
        .arg(&out)
        .arg("--")
        .arg("python3")
        .arg(python_dir().join("ring_prog.py"))
        .args(["oom", "20000", &k.to_string()])
        .env("PYTHONPATH", python_dir().join("fake_torch"))
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let len = std::fs::metadata(trace_file(&out)).unwrap().len();
    // Each kept tensor is stated twice beside the ring: restated once, and in the refusal's
    // flight record (about 30 bytes each time).
    assert!(
        len > budget && len <= budget + k * 2 * 32 + (128 << 10),
        "{len} bytes: past the budget by more than the live tensors' statements"
    );
    let v = summary_json(&out);
    let d = &v["processes"][0]["devices"][0];
    let live = KEPT_BYTES + k * 4096;
    assert_eq!(d["tensors"]["live_at_end"], live, "{}", d["tensors"]);
    let f = &d["failures"][0];
    assert_eq!(f["tensors"]["tensor_count"], 3 + k);
    assert_eq!(f["tensors"]["tensor_bytes"], live);
}

/// A failed driver allocation gets the same flight record, just before it: the summary's
/// failure lists the tensors live then, whose own records the ring had dropped.
#[test]
fn a_failed_driver_allocation_keeps_the_live_tensors() {
    let (out, stdout) = run_ring(
        "ring-driver-oom",
        "driver_oom",
        20_000,
        &["--max-size", "512KiB"],
    );
    assert!(stdout.contains("driver oom"), "{stdout}");
    let t = TraceFile::read(&trace_file(&out)).unwrap();
    let (note, live) = flight_record(&t, "a failed driver allocation");
    assert_eq!(
        note,
        format!("flight record: a failed driver allocation: 3 live tensors, {KEPT_BYTES} bytes")
    );
    assert_eq!(live, kept(&stdout));
    let v = summary_json(&out);
    let f = &v["processes"][0]["devices"][0]["failures"][0];
    assert_eq!(f["size"], 1u64 << 40, "{f}");
    assert_eq!(f["tensors"]["tensor_bytes"], KEPT_BYTES, "{f}");
}

/// A flight record on request: on SIGUSR2, and through `vramtrace snapshot PID` (which the
/// program runs on itself), the live set with its stacks goes into the trace beside the ring.
#[test]
fn snapshot_on_sigusr2_and_on_vramtrace_snapshot() {
    for mode in ["signal", "snapshot"] {
        let (out, stdout) = run_ring(
            &format!("ring-{mode}"),
            mode,
            20_000,
            &["--max-size", "512KiB"],
        );
        let t = TraceFile::read(&trace_file(&out)).unwrap();
        let (note, live) = flight_record(&t, "SIGUSR2 (vramtrace snapshot)");
        assert_eq!(
            note,
            format!(
                "flight record: SIGUSR2 (vramtrace snapshot): 3 live tensors, {KEPT_BYTES} bytes"
            ),
            "{mode}"
        );
        assert_eq!(live, kept(&stdout), "{mode}");
        // Each with the Python line that allocated it.
        let stack = t
            .records
            .iter()
            .find_map(|r| match r {
                Record::Tensor(e) if e.action == TensorAction::Live => Some(e.stack),
                _ => None,
            })
            .unwrap();
        assert_ne!(
            stack, 0,
            "{mode}: a flight record keeps the allocation's stack"
        );
        assert!(
            t.records
                .iter()
                .any(|r| matches!(r, Record::PyStack { stack: s, .. } if *s == stack)),
            "{mode}"
        );
    }
}

/// `vramtrace snapshot` never sends SIGUSR2 to a process that does not catch it (the default
/// action would kill it): it says why and leaves the process alone.
#[test]
fn snapshot_refuses_a_process_that_does_not_catch_sigusr2() {
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let o = Command::new(vramtrace())
        .args(["snapshot", &child.id().to_string()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("does not catch SIGUSR2"),
        "{}",
        describe(&o)
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "the process must still run"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Following the file while the ring reuses its blocks (the live view's reader): every tensor
/// record the finished file holds was followed, none twice (a reused block is read again from
/// its new start, once).
#[test]
fn a_follower_keeps_up_with_reused_blocks() {
    let out = scratch("ring-follow").join("trace");
    let mut child = Command::new(vramtrace())
        .args(["run", "-q", "--max-size", "512KiB", "--out"])
        .arg(&out)
        .arg("--")
        .arg("python3")
        .arg(python_dir().join("ring_prog.py"))
        .args(["oom", "60000"])
        .env("PYTHONPATH", python_dir().join("fake_torch"))
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .env_remove("LD_PRELOAD")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let key = |r: Record| match r {
        Record::Tensor(e) => Some((e.t_ns, e.ptr, e.action as u8)),
        _ => None,
    };
    let mut follower = None;
    let mut followed = Vec::new();
    let mut polls = 0;
    loop {
        let done = child.try_wait().unwrap().is_some();
        if follower.is_none()
            && let Some(f) = std::fs::read_dir(&out).ok().and_then(|d| {
                d.map(|e| e.unwrap().path())
                    .find(|p| p.extension().is_some_and(|x| x == "vtr"))
            })
        {
            follower = Some(vramtrace_format::Follower::open(&f).unwrap());
        }
        if let Some(f) = &mut follower {
            let (records, _) = f.poll().unwrap();
            followed.extend(records.into_iter().filter_map(key));
            polls += 1;
        }
        if done {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(child.wait().unwrap().success());
    let f = follower.as_mut().expect("a trace file");
    for _ in 0..2 {
        followed.extend(f.poll().unwrap().0.into_iter().filter_map(key));
    }
    let t = TraceFile::read(&trace_file(&out)).unwrap();
    assert!(
        t.records
            .iter()
            .any(|r| matches!(r, Record::Dropped { .. }))
    );
    let mut seen = std::collections::HashSet::new();
    for k in &followed {
        assert!(seen.insert(*k), "read twice: {k:?} ({polls} polls)");
    }
    let missed = t
        .records
        .into_iter()
        .filter_map(key)
        .filter(|k| !seen.contains(k))
        .count();
    assert_eq!(missed, 0, "tensor records never followed ({polls} polls)");
}

/// An operator's output description (`--torch-shapes`' `vramtrace_annotate_op`) is tensor-level
/// detail: it goes with the tensor records, after the allocation it describes (the timed reader
/// gives it in order), and under a budget it is dropped with them, not kept for good.
#[test]
fn operator_outputs_are_droppable_tensor_detail() {
    let prog = "import ctypes, torch\n\
                lib = ctypes.CDLL(None)\n\
                lib.vramtrace_annotate_op.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_uint32]\n\
                shape = (ctypes.c_int64 * 2)(4, 1024)\n\
                first = None\n\
                for i in range(int(__import__('sys').argv[1])):\n\
                \x20   p = torch.cuda.fake_alloc(8192)\n\
                \x20   lib.vramtrace_annotate_op(p, b'empty_like', b'bfloat16', shape, 2)\n\
                \x20   first = first or p\n\
                \x20   torch.cuda.fake_free(p, 8192)\n\
                print(first)\n";
    let go = |name: &str, n: &str, max: &str| {
        let out = scratch(name).join("trace");
        let o = Command::new(vramtrace())
            .args(["run", "-q", "--max-size", max, "--out"])
            .arg(&out)
            .args(["--", "python3", "-c", prog, n])
            .env("PYTHONPATH", python_dir().join("fake_torch"))
            .env("LD_LIBRARY_PATH", fake_driver_dir())
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        let first: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
        (out, first)
    };
    // Unbounded: each description right after its allocation, in time order.
    let (out, first) = go("ring-op-outputs", "3", "0");
    let t = TraceFile::read(&trace_file(&out)).unwrap();
    let order: Vec<(&str, u64)> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Tensor(e) if e.action == TensorAction::Alloc => Some(("alloc", e.ptr)),
            Record::Tensor(e) if e.action == TensorAction::Free => Some(("free", e.ptr)),
            Record::Annotate(a) if a.op => Some(("op", a.ptr)),
            _ => None,
        })
        .collect();
    assert_eq!(
        &order[..3],
        &[("alloc", first), ("op", first), ("free", first)]
    );
    assert_eq!(order.len(), 9);
    // Under a 512 KiB budget, 20,000 of them: the first ones are dropped with their tensors.
    let (out, first) = go("ring-op-outputs-budget", "20000", "512KiB");
    let t = TraceFile::read(&trace_file(&out)).unwrap();
    let ops = t
        .records
        .iter()
        .filter(|r| matches!(r, Record::Annotate(a) if a.op))
        .count();
    assert!(ops > 0 && ops < 20_000, "{ops} descriptions kept");
    assert!(
        !t.records
            .iter()
            .any(|r| matches!(r, Record::Annotate(a) if a.op && a.ptr == first)),
        "the first description must have been dropped"
    );
    assert!(std::fs::metadata(trace_file(&out)).unwrap().len() <= 512 << 10);
}

/// The flight record at a refusal restates every live tensor (TensorAction::Live): the
/// Perfetto export takes a restatement of a tensor it has live as nothing (it once took it for
/// a free, ending the three kept tensors' slices at the refusal and dropping their bytes from
/// the counters), so each kept tensor is one slice to the end of the trace and the last counter
/// still holds their bytes.
#[test]
fn perfetto_takes_a_flight_records_restatements_as_no_change() {
    let (out, stdout) = run_ring("ring-perfetto", "oom", 200, &[]);
    let t = TraceFile::read(&trace_file(&out)).unwrap();
    let (_, live) = flight_record(&t, "PyTorch's allocator refused a request");
    assert_eq!(live.len(), 3);
    let json = out.with_extension("perfetto.json");
    let o = Command::new(vramtrace())
        .args(["export"])
        .arg(&out)
        .args(["--format", "perfetto", "--force", "-o"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().expect("a traceEvents array");
    for (ptr, _) in kept(&stdout) {
        let slices: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| e["cat"] == "tensor" && e["args"]["ptr"] == format!("{ptr:#x}"))
            .collect();
        assert_eq!(slices.len(), 1, "{ptr:#x}: {slices:?}");
        assert_eq!(slices[0]["args"]["live_at_end"], true, "{ptr:#x}");
    }
    let last = events
        .iter()
        .rev()
        .find(|e| e["ph"] == "C" && e["name"] == "tensor bytes: device 0")
        .expect("a tensor counter");
    let total: u64 = last["args"]
        .as_object()
        .unwrap()
        .values()
        .map(|b| b.as_u64().unwrap())
        .sum();
    assert_eq!(total, KEPT_BYTES);
}
