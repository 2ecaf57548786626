//! The preload is transparent: what the program sees (results, pointers, handles, error codes,
//! output, exit code) is exactly what it sees without it, and it coexists with another library
//! that interposes `dlsym` and with an NVTX injection someone else set.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;
use vramtrace_format::EventKind;

/// A command for `exe` on the stand-in driver without the preload.
fn bare(exe: &Path) -> Command {
    let mut c = Command::new(exe);
    c.env("LD_LIBRARY_PATH", driver_dir())
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMTRACE_DIR")
        .env_remove("VRAMTRACE_DISABLE")
        .stdin(Stdio::null());
    c
}

fn output(mut cmd: Command) -> Output {
    cmd.output().expect("running the test program")
}

/// Compiles `tests/c/<name>.c` into a shared library that is not linked with the driver.
fn compile_plain_shared(s: &Scratch, name: &str) -> std::path::PathBuf {
    let out = s.path.join(format!("lib{name}.so"));
    compile_with(s, name, false, &["-shared", "-fPIC"]);
    std::fs::rename(s.path.join(name), &out).unwrap();
    out
}

#[test]
fn results_pointers_and_errors_are_the_drivers() {
    let s = Scratch::new("transparency-results");
    let exe = compile(&s, "transparency", true);
    let first = run_ok(bare(&exe));
    let second = run_ok(bare(&exe));
    assert_eq!(first, second, "the stand-in is not deterministic");
    // The sequence covers failures as well as successes.
    for want in [
        "free bad 1\n",
        "free twice 1\n",
        "alloc huge 2 ",
        "release again 1\n",
    ] {
        assert!(first.contains(want), "{want:?} missing from:\n{first}");
    }

    let recorded = run_ok(traced(&exe, &s.trace_dir()));
    assert_eq!(recorded, first, "recording changed what the program saw");
    let t = only_trace(&s.trace_dir());
    let evs = events(&t);
    assert!(evs.iter().any(|e| e.kind == EventKind::Alloc));

    let off_dir = s.path.join("off");
    let mut off = traced(&exe, &off_dir);
    off.env("VRAMTRACE_DISABLE", "1");
    assert_eq!(
        run_ok(off),
        first,
        "the disabled preload changed what it saw"
    );
    assert!(!off_dir.exists(), "VRAMTRACE_DISABLE=1 wrote a trace");
}

#[test]
fn a_program_without_cuda_runs_unchanged() {
    let s = Scratch::new("transparency-nocuda");
    let exe = compile(&s, "no_cuda_io", false);
    let args = ["one", "two words"];
    let mut b = bare(&exe);
    b.args(args);
    let want = output(b);
    assert_eq!(want.status.code(), Some(3));
    let mut t = traced(&exe, &s.trace_dir());
    t.args(args);
    let got = output(t);
    assert_eq!(got.status.code(), want.status.code());
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        String::from_utf8_lossy(&want.stdout)
    );
    assert_eq!(
        String::from_utf8_lossy(&got.stderr),
        String::from_utf8_lossy(&want.stderr)
    );
    assert!(
        traces(&s.trace_dir()).is_empty(),
        "a program that never touched CUDA left a trace"
    );
}

/// The program's stdout with the host pointer `cuMemHostAlloc` returned (a malloc address,
/// which differs from run to run) left out.
fn without_host_pointer(out: &str) -> String {
    out.lines()
        .filter(|l| !l.starts_with("cuMemHostAlloc "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// What a trace's events say about the calls (kind, memory kind, API, result, pointer, size),
/// without times and thread ids.
fn calls(t: &vramtrace_format::TraceFile) -> Vec<String> {
    events(t)
        .iter()
        .filter(|e| e.mem != vramtrace_format::MemKind::Host)
        .map(|e| {
            format!(
                "{:?} {:?} {:?} {} {:#x} {}",
                e.kind, e.mem, e.api, e.result, e.ptr, e.size
            )
        })
        .collect()
}

/// Runs `exe` with `LD_PRELOAD` set to `libs` (in that order) and the trace in `dir`.
fn with_preloads(exe: &Path, dir: &Path, libs: &[&Path], counts: &Path) -> String {
    let list: Vec<String> = libs.iter().map(|l| l.display().to_string()).collect();
    let mut cmd = traced(exe, dir);
    cmd.env("LD_PRELOAD", list.join(":"))
        .env("OTHER_DLSYM_OUT", counts);
    run_ok(cmd)
}

/// Another `LD_PRELOAD` library exporting `dlsym`, before and after ours: a program linked with
/// the driver, and one that looks the driver up with `dlsym`, see the same results and their
/// allocations are recorded in both orders.
#[test]
fn coexists_with_another_dlsym_interposer() {
    let s = Scratch::new("transparency-dlsym");
    let other = compile_plain_shared(&s, "other_dlsym");
    let ours = preload();
    let linked = compile(&s, "transparency", true);
    let looked_up = compile(&s, "dlopen_dlsym", false);
    let counts = s.path.join("counts");

    for (exe, label) in [(&linked, "linked"), (&looked_up, "dlsym")] {
        let alone_dir = s.path.join(format!("{label}-alone"));
        let alone = run_ok(traced(exe, &alone_dir));
        let alone_events = calls(&only_trace(&alone_dir));
        assert!(alone_events.len() >= 4, "{label}: {alone_events:?}");
        let orders: [(&str, [&Path; 2]); 2] = [
            ("other-first", [&other, &ours]),
            ("ours-first", [&ours, &other]),
        ];
        for (order, libs) in &orders {
            let dir = s.path.join(format!("{label}-{order}"));
            let out = with_preloads(exe, &dir, libs, &counts);
            assert_eq!(
                without_host_pointer(&out),
                without_host_pointer(&alone),
                "{label} {order}: the program's output changed"
            );
            let evs = calls(&only_trace(&dir));
            assert_eq!(
                evs, alone_events,
                "{label} {order}: different events recorded"
            );
        }
    }
    // The other library was loaded and ran (its destructor wrote a count) in every run. Only
    // the `dlsym` program with the other library first calls its `dlsym`: the program's eight
    // lookups (the preload's own lookups go straight to glibc's).
    let runs = std::fs::read_to_string(&counts).unwrap();
    let calls: Vec<&str> = runs.lines().collect();
    assert_eq!(
        calls,
        ["0", "0", "8", "0"].map(|n| format!("other_dlsym calls {n}")),
        "linked other-first, ours-first; dlsym other-first, ours-first"
    );
}

/// With another `dlsym` interposer *before* ours that forwards with
/// `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")` (HAMi-core and other shims do), glibc's versioned
/// lookup skips our unversioned `dlsym` export; our `dlvsym` export answers that lookup with our
/// `dlsym`, so the entry points the program looks up are our wrappers and are recorded.
#[test]
fn dlsym_lookups_with_another_interposer_first() {
    let s = Scratch::new("transparency-dlsym-first");
    let other = compile_plain_shared(&s, "other_dlsym");
    let exe = compile(&s, "dlopen_dlsym", false);
    let out = with_preloads(
        &exe,
        &s.trace_dir(),
        &[&other, &preload()],
        &s.path.join("c"),
    );
    assert_eq!(resolved(&out, "cuMemAlloc_v2").0, "preload", "{out}");
    assert_eq!(events(&only_trace(&s.trace_dir())).len(), 6);
}

#[test]
fn leaves_someone_elses_nvtx_injection_alone() {
    let s = Scratch::new("transparency-nvtx");
    let other = compile_plain_shared(&s, "other_nvtx");
    let exe = compile(&s, "nvtx_loader", true);
    let marker = s.path.join("nvtx.out");
    let mut cmd = traced(&exe, &s.trace_dir());
    cmd.env("NVTX_INJECTION64_PATH", &other)
        .env("OTHER_NVTX_OUT", &marker);
    let out = run_ok(cmd);
    assert!(out.contains("init from libother_nvtx.so\n"), "{out}");
    assert!(out.contains("injection 1\n"), "{out}");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "other_nvtx init 1\n",
        "the other injection was not initialised exactly once"
    );
    let t = only_trace(&s.trace_dir());
    let evs = events(&t);
    for name in ["a", "b"] {
        let ptr = num(lines(&out, name)[0][0]);
        assert!(
            evs.iter()
                .any(|e| e.kind == EventKind::Alloc && e.ptr == ptr),
            "allocation {name} not recorded"
        );
    }
    assert_paired(&evs);
}

/// Compiles `tests/c/dlvsym_lib.c` as `lib<who>.so` with `vt_who` and `vt_report` under the
/// version `VT_1`.
fn compile_versioned_lib(s: &Scratch, who: &str) -> std::path::PathBuf {
    let script = s.path.join("vt.map");
    std::fs::write(&script, "VT_1 { global: vt_who; vt_report; local: *; };\n").unwrap();
    let define = format!("-DWHO={who}");
    let version_script = format!("-Wl,--version-script={}", script.display());
    compile_with(
        s,
        "dlvsym_lib",
        false,
        &["-shared", "-fPIC", &define, &version_script],
    );
    let out = s.path.join(format!("lib{who}.so"));
    std::fs::rename(s.path.join("dlvsym_lib"), &out).unwrap();
    out
}

/// `dlvsym` resolves as it does without the preload, relative to whoever calls it: the
/// program and two preloaded libraries each defining `vt_who@@VT_1` ask for what comes next
/// after them (with `dlvsym`, with the `dlsym` that `dlvsym(RTLD_NEXT, "dlsym", ...)` returns,
/// with `dlsym`), for `puts` and `malloc` by version, on pseudo-handles and a real handle, and
/// for versions that do not exist. Ours goes first, between and last: a `dlvsym` that asked
/// glibc from inside the preload would answer with what follows the preload instead.
#[test]
fn dlvsym_answers_relative_to_its_caller() {
    let s = Scratch::new("transparency-dlvsym");
    let a = compile_versioned_lib(&s, "a");
    let b = compile_versioned_lib(&s, "b");
    let exe = compile(&s, "dlvsym_next", false);
    let ours = preload();
    let run = |libs: &[&Path]| {
        let list: Vec<String> = libs.iter().map(|l| l.display().to_string()).collect();
        let mut cmd = bare(&exe);
        cmd.env("LD_PRELOAD", list.join(":")).args([&a, &b]);
        run_ok(cmd)
    };
    let want = run(&[&a, &b]);
    let expected = "\
main dlvsym-next a
main dlvsym-next-puts same
main dlvsym-default-puts same
main dlvsym-handle-malloc same
main dlvsym-bad-version null
main dlvsym-missing null
main dlerror set
main dlsym-via-dlvsym-next a
main dlsym-via-dlvsym-next-malloc same
main dlsym-via-dlvsym-default a
main dlsym-via-dlvsym-on-handle-malloc same
a dlvsym-next b
a dlsym-via-dlvsym-next b
a dlsym-next b
a dlvsym-default a
b dlvsym-next none
b dlsym-via-dlvsym-next none
b dlsym-next none
b dlvsym-default a
";
    assert_eq!(want, expected, "without the preload");
    let orders: [(&str, [&Path; 3]); 3] = [
        ("ours-first", [&ours, &a, &b]),
        ("between", [&a, &ours, &b]),
        ("ours-last", [&a, &b, &ours]),
    ];
    for (order, libs) in orders {
        assert_eq!(run(&libs), want, "{order}");
    }
}
