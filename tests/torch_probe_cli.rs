//! The PyTorch probe through `vramtrace run`, against a stand-in `torch` package (no CUDA
//! here: probes/python/tests/fake_torch mimics the allocator callbacks the probe uses): a
//! program that never mentions vramtrace gets a TENSOR record per block handed out, with its
//! size and Python line, one per block taken back, and the allocator's refusal with PyTorch's
//! numbers; `--no-torch-probe` records none.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use vramtrace_format::{Record, TensorAction, TensorEvent, TraceFile};

fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("probes/python/tests")
}

fn run(out: &Path, extra: &[&str]) -> String {
    let o = Command::new(vramtrace())
        .arg("run")
        .arg("-q")
        .arg("--out")
        .arg(out)
        .args(extra)
        .arg("--")
        .arg("python3")
        .arg(python_dir().join("tensors_prog.py"))
        .env("PYTHONPATH", python_dir().join("fake_torch"))
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !stderr.contains("Error in sitecustomize") && !stderr.contains("Traceback"),
        "our sitecustomize must not fail: {stderr}"
    );
    String::from_utf8(o.stdout).unwrap()
}

fn trace(out: &Path) -> TraceFile {
    let f = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "vtr"))
        .expect("a trace file");
    TraceFile::read(&f).unwrap()
}

fn tensors(t: &TraceFile) -> Vec<TensorEvent> {
    t.records
        .iter()
        .filter_map(|r| match r {
            Record::Tensor(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

/// (function, line) of the user's frames of a stack: the probe's and torch's own skipped.
fn user_frames(t: &TraceFile, stack: u32) -> Vec<(String, u32)> {
    let strings: HashMap<u32, &str> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::String { id, text } => Some((*id, text.as_str())),
            _ => None,
        })
        .collect();
    t.records
        .iter()
        .find_map(|r| match r {
            Record::PyStack { stack: s, frames } if *s == stack => Some(frames.clone()),
            _ => None,
        })
        .unwrap_or_default()
        .iter()
        .filter(|f| strings[&f.file].ends_with("tensors_prog.py"))
        .map(|f| (strings[&f.function].to_string(), f.line))
        .collect()
}

#[test]
fn tensors_and_allocator_ooms_recorded_without_changing_the_program() {
    let out = scratch("torch-probe").join("trace");
    let stdout = run(&out, &[]);
    let t = trace(&out);
    let ev = tensors(&t);
    let allocs: Vec<&TensorEvent> = ev
        .iter()
        .filter(|e| e.action == TensorAction::Alloc)
        .collect();
    let printed: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| l.starts_with("tensor "))
        .map(|l| l.split(' ').skip(1).collect())
        .collect();
    assert_eq!(allocs.len(), 3, "{ev:?}");
    for (e, p) in allocs.iter().zip(&printed) {
        assert_eq!(e.ptr, p[0].parse::<u64>().unwrap());
        let requested = p[1].parse::<u64>().unwrap();
        assert_eq!(e.requested, requested, "the bytes asked for");
        assert_eq!(e.size, requested.div_ceil(512) * 512, "the block's size");
        let frames = user_frames(&t, e.stack);
        assert_eq!(
            frames[0],
            ("chunk_fwd_o".to_string(), p[2].parse().unwrap()),
            "the allocating line: {frames:?}"
        );
        assert_eq!(frames[1].0, "forward");
    }
    let frees: Vec<&TensorEvent> = ev
        .iter()
        .filter(|e| e.action == TensorAction::Free)
        .collect();
    assert_eq!(frees.len(), 1);
    assert_eq!(frees[0].ptr, allocs[0].ptr);
    let oom = ev
        .iter()
        .find(|e| e.action == TensorAction::AllocFailed)
        .expect("the allocator's refusal");
    assert_eq!(oom.size, 20 << 30);
    assert_eq!(oom.allocated, 50724864 + 3145728);
    assert_eq!(oom.reserved, 102236160 + 50724864);
    assert_eq!(oom.limit, 12 << 30, "half of the stand-in's 24 GiB");
    assert_eq!(oom.free, 1 << 30);
    let oom_line: u32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("oom "))
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        user_frames(&t, oom.stack)[0],
        ("forward".to_string(), oom_line)
    );

    // The CLI reads them: the tensor peak with each tensor's line, the refusal as a failure
    // with PyTorch's numbers (no driver segment in the stand-in: no segment bytes).
    let o = Command::new(vramtrace())
        .args(["summary", "--json", "--frames", "4"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &v["processes"][0]["devices"][0];
    assert_eq!(d["tensors"]["peak_bytes"], 102236160u64 + 50724864);
    assert_eq!(d["tensors"]["live_at_end"], 50724864u64 + 3145728);
    let peak = &d["tensors"]["at_peak"]["tensors"];
    assert_eq!(peak[0]["size"], 102236160u64);
    let line = format!("tensors_prog.py:{} chunk_fwd_o", printed[0][2]);
    assert!(
        peak[0]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str() == Some(line.as_str())),
        "{peak}"
    );
    assert!(!o.stdout.windows(18).any(|w| w == b"vramtrace_torch.py"));
    let f = &d["failures"][0];
    assert_eq!(f["api"], "pytorch");
    assert_eq!(f["torch"]["requested"], 20u64 << 30);
    assert_eq!(f["torch"]["limit"], 12u64 << 30);
    assert_eq!(f["tensors"]["tensor_bytes"], 50724864u64 + 3145728);
    assert_eq!(d["failed_allocations"], 1);

    // The report explains PyTorch's message from the same records.
    let o = Command::new(vramtrace())
        .arg("report")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let md = String::from_utf8_lossy(&o.stdout);
    let start = md
        .find("PyTorch's out-of-memory message")
        .expect("the section");
    let section = &md[start..start + md[start..].find("Still unknown").unwrap()];
    assert!(
        section.contains("from the tensors its caching allocator reported"),
        "{section}"
    );
    assert!(
        section.contains("(53,870,592 B) in 2 live tensors (PyTorch's own count is the same)"),
        "{section}"
    );
    assert!(section.contains("48.38 MiB at `"), "{section}");
    assert!(
        section.contains("(152,961,024 B) − allocated")
            || section.contains("reserved 145.88 MiB − allocated"),
        "no segment seen: PyTorch's own reserved − allocated: {section}"
    );
    assert!(
        section.contains("(12,884,901,888 B) (`set_per_process_memory_fraction`)"),
        "{section}"
    );

    let out = scratch("torch-probe-off").join("trace");
    run(&out, &["--no-torch-probe"]);
    assert!(
        !out.read_dir()
            .unwrap()
            .any(|e| e.unwrap().path().extension().is_some_and(|x| x == "vtr"))
            || tensors(&trace(&out)).is_empty(),
        "--no-torch-probe: no tensor records"
    );
}

/// The environment's own sitecustomize, which ours shadows on PYTHONPATH, still runs (once, as
/// the module named sitecustomize), the probe still starts after `import torch`, and neither
/// prints an error; one that raises is reported by site as it would be without us.
#[test]
fn the_environments_own_sitecustomize_still_runs() {
    let env_dir = scratch("torch-probe-env-sitecustomize");
    std::fs::write(
        env_dir.join("sitecustomize.py"),
        "import sys\nsys.stderr.write('env sitecustomize ran\\n')\nMARK = 7\n",
    )
    .unwrap();
    let prog = "import sys, torch\n\
                print('mark', getattr(sys.modules.get('sitecustomize'), 'MARK', None))\n\
                print('probe', 'vramtrace_torch' in sys.modules)\n";
    let go = |pythonpath: std::ffi::OsString| {
        let out = scratch("torch-probe-env-sitecustomize-run").join("trace");
        Command::new(vramtrace())
            .arg("run")
            .arg("-q")
            .arg("--out")
            .arg(&out)
            .args(["--", "python3", "-c", prog])
            .env("PYTHONPATH", pythonpath)
            .env("LD_LIBRARY_PATH", fake_driver_dir())
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap()
    };
    let path = std::env::join_paths([env_dir.clone(), python_dir().join("fake_torch")]).unwrap();
    let o = go(path.clone());
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stdout.contains("mark 7"), "{}", describe(&o));
    assert!(stdout.contains("probe True"), "{}", describe(&o));
    assert_eq!(
        stderr.matches("env sitecustomize ran").count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("Error in sitecustomize"), "{stderr}");

    // Without an own sitecustomize: nothing on stderr from ours.
    let o = go(python_dir().join("fake_torch").into_os_string());
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("Error in sitecustomize"),
        "{}",
        describe(&o)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("probe True"));

    // One that raises: site's own report, and the program still runs.
    std::fs::write(
        env_dir.join("sitecustomize.py"),
        "raise ValueError('boom')\n",
    )
    .unwrap();
    let o = go(path);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("ValueError: boom"), "{stderr}");
    assert!(!stderr.contains("KeyError"), "{stderr}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("probe True"));
}

/// A copy of the stand-in torch package with a stand-in `torch/lib/libc10_cuda.so` built from
/// probes/python/tests/fake_c10_cuda.cpp, linked to a stand-in `torch/lib/libc10.so`
/// (fake_c10.cpp); `None` (after saying why) without a C++ compiler.
fn fake_torch_with_c10(name: &str) -> Option<PathBuf> {
    let dir = scratch(name);
    let copy = dir.join("fake_torch");
    let status = Command::new("cp")
        .arg("-r")
        .arg(python_dir().join("fake_torch"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let lib = copy.join("torch/lib");
    std::fs::create_dir_all(&lib).unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let build = |out: &str, src: &str, link: &[&str]| {
        Command::new(&cxx)
            .args(["-shared", "-fPIC", "-O1", "-std=c++17", "-o"])
            .arg(lib.join(out))
            .arg(python_dir().join(src))
            .args(link)
            .output()
    };
    let libdir = format!("-L{}", lib.display());
    for built in [
        build("libc10.so", "fake_c10.cpp", &[]),
        build(
            "libc10_cuda.so",
            "fake_c10_cuda.cpp",
            &[&libdir, "-lc10", "-Wl,-rpath,$ORIGIN"],
        ),
    ] {
        match built {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!("building the stand-in libc10: {}", describe(&o)),
            Err(e) => {
                vramtrace_testkit::skip(
                    "VRAMTRACE_REQUIRE_CXX",
                    &format!("no C++ compiler to build the stand-in libc10_cuda.so ({e})"),
                );
                return None;
            }
        }
    }
    Some(copy)
}

/// `vramtrace run` of `script` (probes/python/tests) with the stand-in torch at `torch_dir`,
/// the probe's statistics on and `env` added; the output, after checking it exited 0.
fn run_with_c10(
    out: &Path,
    torch_dir: &Path,
    script: &str,
    env: &[(&str, &str)],
) -> std::process::Output {
    run_with_c10_args(out, torch_dir, &[], script, env)
}

/// [`run_with_c10`] with `vramtrace run` options.
fn run_with_c10_args(
    out: &Path,
    torch_dir: &Path,
    run_args: &[&str],
    script: &str,
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut c = Command::new(vramtrace());
    c.args(["run", "-q", "--out"])
        .arg(out)
        .args(run_args)
        .arg("--")
        .arg("python3")
        .arg(python_dir().join(script))
        .env("PYTHONPATH", torch_dir)
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .env("VRAMTRACE_TORCH_PROBE_STATS", "1")
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMTRACE_TORCH_SIZES")
        .env_remove("VRAMTRACE_TORCH_CAPTURE")
        .env_remove("FAKE_C10_LAYOUT")
        .env_remove("FAKE_C10_DAWDLE")
        .env_remove("FAKE_C10_ALLOCATOR")
        .env_remove("FAKE_C10_NO_REPORT")
        .env_remove("FAKE_C10_SKEW");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    o
}

/// The stand-in allocator's block for a request (fake_c10_cuda.cpp, `block_of`): rounded up to
/// 512 bytes, and above 1 MiB to whole MiB.
fn stand_in_block(requested: u64) -> u64 {
    if requested > 1 << 20 {
        requested.div_ceil(1 << 20) << 20
    } else {
        requested.div_ceil(512) * 512
    }
}

/// (function, line) of the frames of `stack` in a file whose name ends with `file`.
fn frames_in(t: &TraceFile, stack: u32, file: &str) -> Vec<(String, u32)> {
    let strings: HashMap<u32, &str> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::String { id, text } => Some((*id, text.as_str())),
            _ => None,
        })
        .collect();
    t.records
        .iter()
        .find_map(|r| match r {
            Record::PyStack { stack: s, frames } if *s == stack => Some(frames.clone()),
            _ => None,
        })
        .unwrap_or_default()
        .iter()
        .filter(|f| strings[&f.file].ends_with(file))
        .map(|f| (strings[&f.function].to_string(), f.line))
        .collect()
}

/// Native capture (issue 19): two threads allocate at once, on two devices whose allocator
/// locks are their own, so each thread's trace entry and report interleave with the other's.
/// Every block is recorded with its exact size (not computable from the request: the stand-in
/// rounds large blocks to whole MiB), the bytes asked for, its device, stream and segment (from
/// the allocator's SEGMENT_ALLOC entries) and the allocating line of its own thread; every free once; each report is passed on to libc10's
/// own function; no Python callback is registered.
#[test]
fn native_capture_records_exact_blocks_from_two_threads_at_once() {
    let Some(torch_dir) = fake_torch_with_c10("torch-native-threads") else {
        return;
    };
    let out = scratch("torch-native-threads-run").join("trace");
    // Each allocation sleeps between its trace entry and its report (a recorder that kept
    // the entry in one slot for the whole process completed 251 of 600 blocks so).
    let o = run_with_c10(
        &out,
        &torch_dir,
        "two_threads.py",
        &[("FAKE_C10_DAWDLE", "1")],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("capture=native"), "{stderr}");
    assert!(
        stderr.contains("alloc=0 free=0"),
        "no callback ran: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let printed: Vec<(u64, u64, i32, u32, u64)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("tensor "))
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            (
                w[0].parse().unwrap(),
                w[1].parse().unwrap(),
                w[2].parse().unwrap(),
                w[3].parse().unwrap(),
                w[4].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(printed.len(), 600);
    let t = trace(&out);
    let ev = tensors(&t);
    let allocs: HashMap<u64, &TensorEvent> = ev
        .iter()
        .filter(|e| e.action == TensorAction::Alloc)
        .map(|e| (e.ptr, e))
        .collect();
    assert_eq!(
        allocs.len(),
        600,
        "one record per block, the check's own not among them"
    );
    let mut tids = std::collections::HashSet::new();
    let mut segments = std::collections::HashSet::new();
    for &(ptr, requested, device, line, segment) in &printed {
        let e = allocs[&ptr];
        assert_eq!(
            (e.size, e.requested, e.device, e.stream, e.segment),
            (
                stand_in_block(requested),
                requested,
                device,
                0x5150,
                segment
            ),
            "block {ptr:#x}"
        );
        segments.insert(segment);
        let worker = if device == 0 { "worker_a" } else { "worker_b" };
        assert_eq!(
            frames_in(&t, e.stack, "two_threads.py").first(),
            Some(&(worker.to_string(), line)),
            "the allocating line of its own thread"
        );
        tids.insert((device, e.tid));
    }
    assert_eq!(
        tids.len(),
        2,
        "each device's blocks from one thread: {tids:?}"
    );
    assert!(
        segments.len() > 10 && !segments.contains(&0),
        "{segments:?}"
    );
    let frees: Vec<u64> = ev
        .iter()
        .filter(|e| e.action == TensorAction::Free)
        .map(|e| e.ptr)
        .collect();
    assert_eq!(frees.len(), 300);
    let freed: Vec<u64> = printed
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 300 % 2 == 1)
        .map(|(_, p)| p.0)
        .collect();
    let mut a = frees.clone();
    a.sort_unstable();
    let mut b = freed;
    b.sort_unstable();
    assert_eq!(a, b);
    // 600 blocks, 300 frees and the probe's check (one block and its free).
    assert!(stdout.contains("reports 902"), "{stdout}");
}

/// Behind the allocator pointer an allocator of another class (as with
/// `backend:cudaMallocAsync`): the preload attaches nothing (its vtable is not the native
/// allocator's), says why, and the callbacks record the tensors.
#[test]
fn native_capture_is_not_attached_to_another_allocator() {
    let Some(torch_dir) = fake_torch_with_c10("torch-native-other") else {
        return;
    };
    let out = scratch("torch-native-other-run").join("trace");
    let o = run_with_c10(
        &out,
        &torch_dir,
        "many_tensors.py",
        &[("FAKE_C10_ALLOCATOR", "other")],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    let said = "native tensor capture off (the allocator in use is not PyTorch's native caching \
                allocator)";
    assert!(stderr.contains(said), "{stderr}");
    let t = trace(&out);
    assert!(
        t.records
            .iter()
            .any(|r| matches!(r, Record::Note { text, .. } if text.contains(said)))
    );
    let allocs = tensors(&t)
        .into_iter()
        .filter(|e| e.action == TensorAction::Alloc)
        .count();
    assert_eq!(allocs, 20, "through the callbacks");
}

/// A libc10_cuda whose TraceEntry is laid out otherwise (stream and size swapped), or one that
/// no longer reports its blocks to libc10, fails the probe's check: native capture is turned
/// off, which stderr and the trace say, and the tensors are recorded through the callbacks as
/// before, with their exact sizes.
#[test]
fn native_capture_falls_back_to_the_callbacks_when_the_layout_differs() {
    let Some(torch_dir) = fake_torch_with_c10("torch-native-skew") else {
        return;
    };
    for (env, said) in [
        (
            ("FAKE_C10_LAYOUT", "skew"),
            "native tensor capture off (layout check: the tracker's ALLOC entry",
        ),
        (
            ("FAKE_C10_NO_REPORT", "1"),
            "native tensor capture off (layout check: the allocator's report (pointer, block \
             bytes, device) is (0, 0, -1)",
        ),
    ] {
        let out = scratch(&format!("torch-native-skew-{}", env.0)).join("trace");
        let o = run_with_c10(&out, &torch_dir, "many_tensors.py", &[env]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(said), "{env:?}: {stderr}");
        assert!(
            stderr.contains("capture=callbacks (layout check"),
            "{stderr}"
        );
        let t = trace(&out);
        assert!(
            t.records
                .iter()
                .any(|r| matches!(r, Record::Note { text, .. } if text.contains(said))),
            "the trace says it too"
        );
        let printed: Vec<(u64, u64)> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("tensor "))
            .map(|l| {
                let mut w = l.split(' ').map(|x| x.parse::<u64>().unwrap());
                (w.next().unwrap(), w.next().unwrap())
            })
            .collect();
        let allocs: Vec<(u64, u64, u64)> = tensors(&t)
            .into_iter()
            .filter(|e| e.action == TensorAction::Alloc)
            .map(|e| (e.ptr, e.size, e.requested))
            .collect();
        let want: Vec<(u64, u64, u64)> = printed
            .iter()
            .map(|&(p, s)| (p, stand_in_block(s), s))
            .collect();
        assert_eq!(allocs, want, "{env:?}");
    }
}

/// The callback path's cheap size source (`VRAMTRACE_TORCH_CAPTURE=callbacks`): the caching
/// allocator's own statistics, read through the two symbols libc10_cuda.so exports, once eight
/// readings have equalled the statistics dictionary's; a library whose numbers differ is never
/// used. Sizes are exact either way.
#[test]
fn sizes_come_from_the_allocators_own_statistics_once_checked() {
    let Some(torch_dir) = fake_torch_with_c10("torch-probe-native") else {
        return;
    };
    for (skew, want) in [
        (
            "0",
            if cfg!(target_arch = "x86_64") {
                "sizes=native"
            } else {
                "sizes=dict (native statistics are read on x86-64 only)"
            },
        ),
        ("1", "sizes=dict (native statistics"),
    ] {
        let out = scratch(&format!("torch-probe-native-{skew}")).join("trace");
        // The callbacks, not native capture, whose sizes need no statistics.
        let o = run_with_c10(
            &out,
            &torch_dir,
            "many_tensors.py",
            &[
                ("FAKE_C10_SKEW", skew),
                ("VRAMTRACE_TORCH_CAPTURE", "callbacks"),
            ],
        );
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(want), "skew {skew}: {stderr}");
        let printed: Vec<(u64, u64)> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("tensor "))
            .map(|l| {
                let mut w = l.split(' ').map(|x| x.parse::<u64>().unwrap());
                (w.next().unwrap(), w.next().unwrap())
            })
            .collect();
        assert_eq!(printed.len(), 20);
        let allocs: Vec<(u64, u64, u64)> = tensors(&trace(&out))
            .into_iter()
            .filter(|e| e.action == TensorAction::Alloc)
            .map(|e| (e.ptr, e.size, e.requested))
            .collect();
        let want: Vec<(u64, u64, u64)> = printed
            .iter()
            .map(|&(p, s)| (p, s.div_ceil(512) * 512, s))
            .collect();
        assert_eq!(allocs, want, "skew {skew}");
    }
}

/// Runs probes/python/tests/activation_prog.py MODE under `vramtrace run` with the stand-in
/// torch; returns the trace directory, stdout and stderr.
fn run_activation(name: &str, mode: &str, env: &[(&str, &str)]) -> (PathBuf, String, String) {
    let out = scratch(name).join("trace");
    let mut cmd = Command::new(vramtrace());
    cmd.args(["run", "-q", "--out"])
        .arg(&out)
        .arg("--")
        .arg("python3")
        .arg(python_dir().join("activation_prog.py"))
        .arg(mode)
        .env("PYTHONPATH", python_dir().join("fake_torch"))
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .env_remove("LD_PRELOAD")
        .env_remove("FAKE_TORCH_NO_CUDA");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{mode}: {}", describe(&o));
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !stderr.contains("Error in sitecustomize") && !stderr.contains("Traceback"),
        "{mode}: {stderr}"
    );
    (out, String::from_utf8(o.stdout).unwrap(), stderr)
}

/// Every trace file of a directory by the pid in its header.
fn traces_by_pid(out: &Path) -> HashMap<u32, TraceFile> {
    std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "vtr"))
        .map(|p| {
            let t = TraceFile::read(&p).unwrap();
            (t.header.pid, t)
        })
        .collect()
}

/// The blocks each process printed (`tensor PID PTR SIZE`) are exactly the TENSOR allocations in
/// that process's trace file, with their sizes; returns the pids that allocated.
fn assert_every_block_recorded(mode: &str, out: &Path, stdout: &str) -> Vec<u32> {
    let mut printed: HashMap<u32, Vec<(u64, u64, u64)>> = HashMap::new();
    for l in stdout.lines().filter_map(|l| l.strip_prefix("tensor ")) {
        let w: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
        printed
            .entry(w[0] as u32)
            .or_default()
            .push((w[1], w[2], w[2]));
    }
    assert!(!printed.is_empty(), "{mode}: no block allocated: {stdout}");
    let traces = traces_by_pid(out);
    for (pid, want) in &printed {
        let t = traces
            .get(pid)
            .unwrap_or_else(|| panic!("{mode}: no trace file for process {pid}"));
        let got: Vec<(u64, u64, u64)> = tensors(t)
            .into_iter()
            .filter(|e| e.action == TensorAction::Alloc)
            .map(|e| (e.ptr, e.size, e.requested))
            .collect();
        assert_eq!(&got, want, "{mode}: process {pid}");
    }
    let mut pids: Vec<u32> = printed.into_keys().collect();
    pids.sort();
    pids
}

/// `vramtrace summary --json` of a trace: per pid, its `tensor_capture` status.
fn capture_status(out: &Path) -> HashMap<u64, String> {
    let o = Command::new(vramtrace())
        .args(["summary", "--json"])
        .arg(out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pid"].as_u64().unwrap(),
                p["tensor_capture"]["status"]
                    .as_str()
                    .unwrap_or("(none)")
                    .to_string(),
            )
        })
        .collect()
}

/// The probe starts however the program comes to torch: after `find_spec("torch")` (the spec
/// it returned used to be thrown away with the probe's only hook), after a transformers-like
/// package that checks with `find_spec` and imports torch later, with the blocks allocated on a
/// second thread, in a multiprocessing spawn worker and a fork worker, and in the children of a
/// torchrun-like launcher. Each process that allocated has every block, and `summary` says per
/// process that its tensors were recorded.
#[test]
fn the_probe_starts_however_torch_is_reached() {
    for (mode, processes) in [
        ("find_spec", 1),
        ("transformers", 1),
        ("thread", 1),
        ("spawn", 1),
        ("fork", 2),
        ("torchrun", 2),
    ] {
        let (out, stdout, _) = run_activation(&format!("torch-probe-activation-{mode}"), mode, &[]);
        let pids = assert_every_block_recorded(mode, &out, &stdout);
        assert_eq!(pids.len(), processes, "{mode}: {stdout}");
        let status = capture_status(&out);
        for pid in pids {
            let blocks = stdout
                .lines()
                .filter(|l| l.starts_with(&format!("tensor {pid} ")))
                .count();
            assert_eq!(
                status[&(pid as u64)],
                format!("recorded: {blocks} tensor events"),
                "{mode}: process {pid}"
            );
        }
    }
}

/// The probe starts when torch was imported before vramtrace's sitecustomize ran (a `.pth`
/// file of the user site directory imports it), and when a finder the program put ahead of
/// the probe's found torch (the next module imported starts it).
#[test]
fn the_probe_starts_when_torch_came_before_it_or_past_it() {
    let base = scratch("torch-probe-user-base");
    let site = Command::new("python3")
        .args(["-c", "import site; print(site.getusersitepackages())"])
        .env("PYTHONUSERBASE", &base)
        .output()
        .unwrap();
    let site = PathBuf::from(String::from_utf8(site.stdout).unwrap().trim());
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("vramtrace_test_torch.pth"), "import torch\n").unwrap();
    for (mode, env) in [
        ("pth", vec![("PYTHONUSERBASE", base.to_str().unwrap())]),
        ("finder_ahead", vec![]),
    ] {
        let (out, stdout, _) =
            run_activation(&format!("torch-probe-activation-{mode}"), mode, &env);
        let pids = assert_every_block_recorded(mode, &out, &stdout);
        assert_eq!(pids.len(), 1, "{mode}");
        assert_eq!(
            capture_status(&out)[&(pids[0] as u64)],
            "recorded: 5 tensor events",
            "{mode}"
        );
    }
}

/// A process that imports torch and never allocates a block has its trace say so; one whose
/// torch has no CUDA says why nothing is recorded, once on stderr and in the trace.
#[test]
fn summary_says_why_a_process_has_no_tensors() {
    let (out, _, stderr) = run_activation("torch-probe-activation-none", "none", &[]);
    assert!(!stderr.contains("torch probe"), "{stderr}");
    let status: Vec<String> = capture_status(&out).into_values().collect();
    assert_eq!(status.len(), 1);
    assert!(
        status[0]
            .starts_with("none: Python with torch and the probe started, but no tensor events"),
        "{status:?}"
    );

    let (out, _, stderr) = run_activation(
        "torch-probe-activation-no-cuda",
        "none",
        &[("FAKE_TORCH_NO_CUDA", "1")],
    );
    let why =
        "not active: this torch (0.0+stand-in) is built without CUDA; tensors are not recorded";
    assert_eq!(
        stderr
            .matches(&format!("vramtrace: torch probe: {why}\n"))
            .count(),
        1,
        "{stderr}"
    );
    let status: Vec<String> = capture_status(&out).into_values().collect();
    assert_eq!(status, vec![format!("not recorded: {why}")]);

    // A process that kept vramtrace's PYTHONPATH but lost the preload (LD_PRELOAD cleared):
    // there is no trace to write to, so stderr says it, once.
    let path = std::env::join_paths([
        Path::new(env!("CARGO_MANIFEST_DIR")).join("probes/python/autostart"),
        python_dir().join("fake_torch"),
    ])
    .unwrap();
    let o = Command::new("python3")
        .args([
            "-c",
            "import torch, importlib.util; importlib.util.find_spec('torch')",
        ])
        .env("PYTHONPATH", path)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "vramtrace: torch probe: not active: the vramtrace preload is not loaded in this process \
         (LD_PRELOAD lost its libvramtrace_preload.so, or the process was started without it); \
         tensors are not recorded\n"
    );
    let o = Command::new(vramtrace())
        .arg("summary")
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("  note: torch probe: {why}\n"))
            && text.contains(&format!("  tensors: not recorded: {why}\n")),
        "{text}"
    );
}

/// Native capture keeps, per thread, the stack id of the raw Python frames it saw before (the
/// code objects and instruction offsets of every frame): the four stacks here (two lines of one
/// function, each reached from two callers) alternate for 200 tensors, and each tensor still
/// has its own innermost line and caller.
#[test]
fn native_capture_tells_apart_stacks_that_differ_in_any_frame() {
    let Some(torch_dir) = fake_torch_with_c10("torch-native-memo") else {
        return;
    };
    let out = scratch("torch-native-memo-run").join("trace");
    let o = run_with_c10(&out, &torch_dir, "memo_paths.py", &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("capture=native"), "{stderr}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let printed: Vec<(u64, u32, u32)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("tensor "))
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            (
                w[0].parse().unwrap(),
                w[1].parse().unwrap(),
                w[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(printed.len(), 200);
    let t = trace(&out);
    let ev = tensors(&t);
    let mut stacks = std::collections::HashSet::new();
    let mut seen = 0;
    for (i, &(ptr, inner, outer)) in printed.iter().enumerate() {
        // Blocks are reused: the i-th allocation record of this address.
        let e = ev
            .iter()
            .filter(|e| e.action == TensorAction::Alloc && e.ptr == ptr)
            .nth(printed[..i].iter().filter(|p| p.0 == ptr).count())
            .unwrap_or_else(|| panic!("tensor {i} at {ptr:#x} not recorded"));
        let f = frames_in(&t, e.stack, "memo_paths.py");
        let caller = if outer == printed[0].2 {
            "first"
        } else {
            "second"
        };
        assert_eq!(
            f.iter().take(2).cloned().collect::<Vec<_>>(),
            vec![
                ("alloc_here".to_string(), inner),
                (caller.to_string(), outer)
            ],
            "tensor {i}"
        );
        stacks.insert(e.stack);
        seen += 1;
    }
    assert_eq!(seen, 200);
    assert_eq!(stacks.len(), 4, "two lines × two callers");
}

/// The attach's naming walk (`probes/python/tests/naming_walk.py`): it names the blocks that
/// a module's parameters, an attribute, a list attribute and a dict attribute hold, and never
/// reads the references of a frame, a generator or a coroutine, which another thread may be
/// executing (reading them crashed a server on the H200: docs/validation.md).
#[test]
fn the_naming_walk_names_attributes_and_never_reads_a_running_frame() {
    let o = Command::new("python3")
        .arg(python_dir().join("naming_walk.py"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert_eq!(stdout.lines().last(), Some("ok"), "{stdout}");
}

/// `VRAMTRACE_SELF_TIME=1`: native capture times its own steps and the probe's stats line says
/// them, one count per tracker call, per report and per allocation's frames, with the memo's
/// misses (one per distinct stack); off, the line has no such part.
#[test]
fn native_capture_says_what_its_own_steps_cost_when_asked() {
    let Some(torch_dir) = fake_torch_with_c10("torch-native-self-time") else {
        return;
    };
    let out = scratch("torch-native-self-time-run").join("trace");
    let o = run_with_c10(
        &out,
        &torch_dir,
        "memo_paths.py",
        &[("VRAMTRACE_SELF_TIME", "1")],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("capture=native"))
        .unwrap_or_else(|| panic!("{stderr}"));
    let part = line
        .split(" self_ns ")
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"));
    let counts: std::collections::HashMap<&str, u64> = part
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            let (_, n) = v.split_once('x').unwrap();
            (k, n.parse().unwrap())
        })
        .collect();
    // memo_paths.py allocates 200 tensors; the probe's own check adds a few.
    let frames = counts["frames"];
    assert!((200..220).contains(&frames), "{line}");
    assert!(counts["report"] >= 2 * frames, "{line}");
    assert!(counts["tracker"] >= 2 * frames, "{line}");
    assert!(counts["write"] >= 2 * frames, "{line}");
    // memo_paths.py allocates from four stacks in turn: the memo describes each once (and the
    // probe's own check's), and every other allocation is a hit.
    let misses = counts.get("miss").copied().unwrap_or(0);
    assert!((4..=12).contains(&misses), "{line}");

    let out = scratch("torch-native-self-time-off").join("trace");
    let o = run_with_c10(&out, &torch_dir, "memo_paths.py", &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("capture=native") && !stderr.contains("self_ns"),
        "{stderr}"
    );
}

/// `vramtrace_torch.pause()` and `resume()`, natively and through the callbacks, with and
/// without a size budget: a block handed out while paused is not recorded, nor is its release
/// (during the pause or after it) when the live-tensor table can tell; a block recorded before
/// the pause is followed to its release, during the pause too; the trace says when capture paused
/// and resumed, once each.
#[test]
fn paused_capture_records_no_new_block_and_loses_no_release() {
    let Some(torch_dir) = fake_torch_with_c10("torch-pause") else {
        return;
    };
    for (name, run_args, env, how) in [
        ("native", &[][..], &[][..], "capture=native"),
        (
            "callbacks",
            &[][..],
            &[("VRAMTRACE_TORCH_CAPTURE", "callbacks")][..],
            "capture=callbacks",
        ),
        (
            "native-nobudget",
            &["--max-size", "0"][..],
            &[][..],
            "capture=native",
        ),
    ] {
        let out = scratch(&format!("torch-pause-{name}")).join("trace");
        let o = run_with_c10_args(&out, &torch_dir, run_args, "pause_prog.py", env);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(how), "{name}: {stderr}");
        let blocks: Vec<(String, u64)> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| {
                let (what, ptr) = l.split_once(' ').unwrap();
                (what.to_string(), ptr.parse().unwrap())
            })
            .collect();
        assert_eq!(blocks.len(), 5, "{name}: {blocks:?}");
        let t = trace(&out);
        let ev = tensors(&t);
        let count = |action: TensorAction, ptr: u64| {
            ev.iter()
                .filter(|e| e.action == action && e.ptr == ptr)
                .count()
        };
        for (what, ptr) in &blocks {
            let recorded = what == "recorded";
            assert_eq!(
                count(TensorAction::Alloc, *ptr),
                usize::from(recorded),
                "{name}: the allocation of {what} block {ptr:#x}"
            );
            let frees = count(TensorAction::Free, *ptr);
            if recorded || name != "native-nobudget" {
                assert_eq!(
                    frees,
                    usize::from(recorded),
                    "{name}: the release of {what} block {ptr:#x}"
                );
            } else {
                // Without a table no release can be told apart: each is recorded, and a reader
                // ignores the release of a block it never saw handed out.
                assert_eq!(frees, 1, "{name}: the release of {what} block {ptr:#x}");
            }
        }
        let notes: Vec<&str> = t
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Note { text, .. } if text.starts_with("tensor capture") => {
                    Some(text.as_str())
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            notes,
            [
                "tensor capture paused: tensor detail is missing until it resumes (a warm-up)",
                "tensor capture resumed",
            ],
            "{name}"
        );
    }
}
