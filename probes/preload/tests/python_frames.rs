//! Python frames through the real preload: a CPython program allocating through the stand-in
//! driver with ctypes, from nested functions, with the GIL released (PyTorch's case) and held,
//! from a second thread and from a generator. Every allocation's stack carries the Python
//! frames, innermost first, naming the file, the function and the exact line of the call.
//!
//! Interpreters: `python3`, and those named in `VRAMTRACE_TEST_PYTHONS` (space-separated, e.g.
//! one per supported minor version); one that does not run is reported as skipped.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::*;
use vramtrace_format::{EventKind, PyFrame, Record, TraceFile};

fn interpreters() -> Vec<String> {
    let mut out = vec!["python3".to_string()];
    if let Ok(more) = std::env::var("VRAMTRACE_TEST_PYTHONS") {
        out.extend(more.split_whitespace().map(str::to_string));
    }
    out
}

fn runs(python: &str) -> bool {
    Command::new(python)
        .arg("-c")
        .arg("pass")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

/// (file, function, line) of each Python frame of `stack`, innermost first.
fn py_frames(t: &TraceFile, stack: u32) -> Vec<(String, String, u32)> {
    let strings: HashMap<u32, &str> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::String { id, text } => Some((*id, text.as_str())),
            _ => None,
        })
        .collect();
    let frames: &[PyFrame] = t
        .records
        .iter()
        .find_map(|r| match r {
            Record::PyStack { stack: s, frames } if *s == stack => Some(frames.as_slice()),
            _ => None,
        })
        .unwrap_or(&[]);
    frames
        .iter()
        .map(|f| {
            (
                strings.get(&f.file).unwrap_or(&"?").to_string(),
                strings.get(&f.function).unwrap_or(&"?").to_string(),
                f.line,
            )
        })
        .collect()
}

#[test]
fn allocations_carry_their_python_frames_with_and_without_the_gil() {
    let py = script("py_frames.py");
    for python in interpreters() {
        if !runs(&python) {
            vramtrace_testkit::skip(
                "VRAMTRACE_TEST_REQUIRE_PYTHON",
                &format!("{python} does not run here"),
            );
            continue;
        }
        let s = Scratch::new("py-frames");
        let mut cmd = traced(Path::new(&python), &s.trace_dir());
        cmd.arg(&py);
        let out = run_ok(cmd);
        let version = lines(&out, "version")[0][0].to_string();
        let t = only_trace(&s.trace_dir());
        let evs = events(&t);
        let allocs = lines(&out, "alloc");
        assert_eq!(allocs.len(), 5, "{python}: {out}");
        for a in allocs {
            let (ptr, line) = (num(a[0]), num(a[1]) as u32);
            let e = evs
                .iter()
                .find(|e| e.kind == EventKind::Alloc && e.ptr == ptr)
                .unwrap_or_else(|| panic!("{python}: no event for {ptr:#x}"));
            let frames = py_frames(&t, e.stack);
            let functions: Vec<&str> = frames.iter().map(|f| f.1.as_str()).collect();
            assert_eq!(
                functions,
                a[2..].to_vec(),
                "Python {version} ({python}): frames {frames:?}"
            );
            assert_eq!(
                frames[0].0,
                py.to_str().unwrap(),
                "Python {version}: the file"
            );
            assert_eq!(
                frames[0].2, line,
                "Python {version}: the exact line of the call"
            );
            assert!(frames.iter().all(|f| f.2 > 0), "{frames:?}");
        }
        assert!(
            !t.records.iter().any(|r| matches!(r, Record::Note { .. })),
            "Python {version} is supported: no note"
        );
    }
}

#[test]
fn python_frames_off_by_variable_and_absent_outside_python() {
    let s = Scratch::new("py-frames-off");
    let mut cmd = traced(Path::new("python3"), &s.trace_dir());
    cmd.arg(script("py_frames.py")).env("VRAMTRACE_PYTHON", "0");
    run_ok(cmd);
    let t = only_trace(&s.trace_dir());
    assert!(
        !t.records
            .iter()
            .any(|r| matches!(r, Record::PyStack { .. })),
        "VRAMTRACE_PYTHON=0"
    );
    // Native stacks off, Python frames on: the stacks hold Python frames only.
    let s = Scratch::new("py-frames-native-off");
    let mut cmd = traced(Path::new("python3"), &s.trace_dir());
    cmd.arg(script("py_frames.py")).env("VRAMTRACE_STACKS", "0");
    run_ok(cmd);
    let t = only_trace(&s.trace_dir());
    let e = events(&t)
        .into_iter()
        .find(|e| e.kind == EventKind::Alloc)
        .unwrap();
    assert_eq!(py_frames(&t, e.stack)[0].1, "empty_cuda_released");
    assert!(t.records.iter().any(|r| matches!(
        r,
        Record::Stack { id, frames } if *id == e.stack && frames.is_empty()
    )));
}

/// Cost per event of the Python walk: the same allocation loop, 20 frames deep, with
/// `VRAMTRACE_PYTHON` on and off (native stacks off, so the difference is the walk). Reported,
/// not asserted: this machine is shared.
#[test]
fn cost_per_event() {
    let loop_py = r#"
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cuda.cuCtxSetCurrent(ctx)
alloc, free = cuda.cuMemAlloc_v2, cuda.cuMemFree_v2
ptr = ctypes.c_uint64(); ref = ctypes.byref(ptr); size = ctypes.c_size_t(4096)
def deep(n):
    if n:
        return deep(n - 1)
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(20000):
            alloc(ref, size); free(ptr)
        best = min(best, (time.perf_counter() - t) / 20000)
    print(f"ns {best * 1e9:.0f}")
deep(20)
"#;
    let s = Scratch::new("py-cost");
    let mut ns = Vec::new();
    for python in ["0", "1"] {
        let mut cmd = traced(Path::new("python3"), &s.trace_dir());
        cmd.arg("-c")
            .arg(loop_py)
            .env("VRAMTRACE_STACKS", "0")
            .env("VRAMTRACE_PYTHON", python);
        let start = Instant::now();
        let out = run_ok(cmd);
        let _ = start.elapsed();
        ns.push(num(lines(&out, "ns")[0][0]));
        let _ = std::fs::remove_dir_all(s.trace_dir());
    }
    eprintln!(
        "python frames: alloc+free pair {} ns without, {} ns with 22 Python frames: {} ns per allocation",
        ns[0],
        ns[1],
        ns[1] as i64 - ns[0] as i64
    );
}
