//! Test harness: compiles small C programs with `cc`, runs them with the real preload under
//! `LD_PRELOAD` on the stand-in driver, and reads back what they recorded.
//!
//! The built libraries are found next to the test executable, which lives in
//! `<target>/<profile>/deps/`: `libvramtrace_preload.so` and the stand-in's `libcuda.so` are in
//! `<target>/<profile>/`. `cargo test` does not rebuild a cdylib-only package's library for its
//! integration tests, so the harness runs `cargo build` for the two packages once first (cargo
//! holds no lock while tests run); without that a stale preload would be tested silently. The
//! cudarc client example is built with them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use vramtrace_format::{Event, EventKind, MemKind, Record, TraceFile};

pub use vramtrace_testkit::profile_dir;

/// Builds the preload, the stand-in driver and the cudarc client example into this test's
/// target directory, once (see `vramtrace_testkit::build`).
fn build_libraries() {
    vramtrace_testkit::build(&[
        "-p",
        "vramtrace-preload",
        "-p",
        "vramtrace-fakecuda",
        "--lib",
        "--example",
        "cudarc_client",
    ]);
}

/// An example program of this package, built with the libraries.
pub fn example(name: &str) -> PathBuf {
    build_libraries();
    let exe = profile_dir().join("examples").join(name);
    assert!(exe.exists(), "{} is missing", exe.display());
    exe
}

/// The preload under test.
pub fn preload() -> PathBuf {
    build_libraries();
    let p = profile_dir().join("libvramtrace_preload.so");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p vramtrace-preload` (cargo test --workspace does)",
        p.display()
    );
    p
}

/// A directory holding the stand-in driver under its soname, `libcuda.so.1`, for
/// `LD_LIBRARY_PATH` and for linking with `-lcuda`. `VRAMTRACE_TEST_LIBCUDA` names another
/// driver library to use instead.
pub fn driver_dir() -> PathBuf {
    build_libraries();
    let built = std::env::var_os("VRAMTRACE_TEST_LIBCUDA")
        .map(PathBuf::from)
        .unwrap_or_else(|| profile_dir().join("libcuda.so"));
    assert!(
        built.exists(),
        "{} (the stand-in driver) is missing: build it with `cargo build -p vramtrace-fakecuda` \
         (cargo test --workspace does)",
        built.display()
    );
    let dir = profile_dir().join("preload-tests").join("driver");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(built.as_path()) {
            let _ = std::fs::remove_file(&link);
            // Another test may create it at the same moment; either link is the same.
            let _ = std::os::unix::fs::symlink(&built, &link);
        }
    }
    dir
}

/// A fresh, empty directory for one test, removed when dropped (kept on failure for a look).
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let path = profile_dir()
            .join("preload-tests")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch { path }
    }

    /// The trace directory inside it (not created: the preload creates it).
    pub fn trace_dir(&self) -> PathBuf {
        self.path.join("trace")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(name)
}

/// Compiles `tests/c/<name>.c` into the scratch directory; `link_cuda` links it with `-lcuda`.
pub fn compile(scratch: &Scratch, name: &str, link_cuda: bool) -> PathBuf {
    compile_with(scratch, name, link_cuda, &[])
}

/// [`compile`] with extra compiler flags.
pub fn compile_with(scratch: &Scratch, name: &str, link_cuda: bool, flags: &[&str]) -> PathBuf {
    let out = scratch.path.join(name);
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args(flags)
        .arg("-O1")
        .arg("-g")
        .arg("-Wall")
        .arg("-o")
        .arg(&out)
        .arg(source(&format!("{name}.c")))
        .arg("-I")
        .arg(source(""))
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("include"));
    if link_cuda {
        cc.arg("-L").arg(driver_dir()).arg("-lcuda");
    }
    cc.arg("-ldl").arg("-lpthread");
    let o = cc.output().expect("running cc");
    assert!(
        o.status.success(),
        "cc failed for {name}.c:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Compiles `tests/c/<name>.c` into a shared library linked with `-lcuda`.
pub fn compile_shared(scratch: &Scratch, name: &str) -> PathBuf {
    let out = scratch.path.join(format!("lib{name}.so"));
    compile_with(scratch, name, true, &["-shared", "-fPIC"]);
    std::fs::rename(scratch.path.join(name), &out).unwrap();
    out
}

/// A command for `exe` with the preload, the stand-in driver and `VRAMTRACE_DIR` set.
pub fn traced(exe: &Path, trace_dir: &Path) -> Command {
    let mut c = Command::new(exe);
    c.env("LD_PRELOAD", preload())
        .env("LD_LIBRARY_PATH", driver_dir())
        .env("VRAMTRACE_DIR", trace_dir)
        .env_remove("VRAMTRACE_DISABLE")
        .stdin(Stdio::null());
    c
}

/// Runs to completion and insists on success; returns stdout.
pub fn run_ok(mut cmd: Command) -> String {
    let o: Output = cmd.output().expect("running the test program");
    assert!(
        o.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.stderr.is_empty(),
        "the preload must not print anything on success; stderr:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Every trace file in `dir`, read, sorted by pid.
pub fn traces(dir: &Path) -> Vec<TraceFile> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<TraceFile> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "vtr"))
        .map(|p| TraceFile::read(&p).unwrap())
        .collect();
    out.sort_by_key(|t| t.header.pid);
    out
}

/// The one trace file in `dir`.
pub fn only_trace(dir: &Path) -> TraceFile {
    let mut t = traces(dir);
    assert_eq!(
        t.len(),
        1,
        "expected exactly one trace file in {}",
        dir.display()
    );
    let t = t.pop().unwrap();
    assert!(
        t.problems.is_empty(),
        "problems reading {}: {:?}",
        t.path.display(),
        t.problems
    );
    t
}

/// The events of a trace, in file order.
pub fn events(t: &TraceFile) -> Vec<Event> {
    t.records
        .iter()
        .filter_map(|r| match r {
            Record::Event(e) => Some(*e),
            _ => None,
        })
        .collect()
}

/// The text of an interned string id (STRING records); `None` for 0 or an unknown id.
pub fn string(t: &TraceFile, id: u32) -> Option<String> {
    t.records.iter().find_map(|r| match r {
        Record::String { id: i, text } if *i == id && id != 0 => Some(text.clone()),
        _ => None,
    })
}

/// Lines of the program's stdout that start with `word`, split on spaces (the word dropped).
pub fn lines<'a>(stdout: &'a str, word: &str) -> Vec<Vec<&'a str>> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut it = l.split(' ');
            (it.next() == Some(word)).then(|| it.collect())
        })
        .collect()
}

/// For a "resolved LABEL OWNER SYMBOL" line the program printed: (owner, symbol), where owner
/// is `preload` or `driver` (which object the looked-up pointer lives in).
pub fn resolved<'a>(stdout: &'a str, label: &str) -> (&'a str, &'a str) {
    lines(stdout, "resolved")
        .into_iter()
        .find(|l| l[0] == label)
        .map(|l| (l[1], l[2]))
        .unwrap_or_else(|| panic!("{label} not resolved:\n{stdout}"))
}

/// Parses a decimal number the C program printed.
pub fn num(s: &str) -> u64 {
    s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

/// The namespace a pointer lives in: a free names the release function's memory kind, and
/// `cuMemFree_v2` releases managed memory as well as device memory.
fn family(m: MemKind) -> u8 {
    match m {
        MemKind::Device | MemKind::Managed => 0,
        other => other as u8,
    }
}

/// Asserts that every successful allocation has exactly one later release of the same pointer
/// in the same family, and that nothing else is released.
pub fn assert_paired(evs: &[Event]) {
    let mut live: Vec<(u64, MemKind)> = Vec::new();
    for e in evs {
        match e.kind {
            EventKind::Alloc => live.push((e.ptr, e.mem)),
            EventKind::Free => {
                let at = live
                    .iter()
                    .position(|&(p, m)| p == e.ptr && family(m) == family(e.mem))
                    .unwrap_or_else(|| panic!("free of something not live: {e:?}"));
                live.remove(at);
                assert_eq!(e.size, 0, "frees carry size 0: {e:?}");
            }
            _ => {}
        }
    }
    assert!(live.is_empty(), "allocations never freed: {live:x?}");
}
