//! What every test suite of the workspace shares, in one place: building the libraries and
//! binaries a test runs (once per test process, failing loudly when the build fails), the
//! stand-in driver on a loader path, scratch directories, describing a finished command, and
//! saying that a test could not run.
//!
//! `cargo test` builds the binaries of the package under test, but not the cdylibs of other
//! packages, and does not relink a cdylib-only package's library for its own integration
//! tests; a stale preload or stand-in would then be tested silently. [`build`] runs
//! `cargo build` for what a test needs into the test's own target directory first (cargo holds
//! no lock while tests run, so this is safe).
//!
//! ```no_run
//! let dir = vramtrace_testkit::stand_in_dir();
//! let preload = vramtrace_testkit::built("vramtrace-preload", "libvramtrace_preload.so");
//! assert!(dir.join("libcuda.so.1").exists() && preload.exists());
//! ```

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

/// `<target>/<profile>/`: test executables live in its `deps/`, benches and examples beside.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's own path");
    let deps = exe
        .parent()
        .expect("the test executable lives in a directory");
    let dir = if deps
        .file_name()
        .is_some_and(|n| n == "deps" || n == "examples")
    {
        deps.parent().expect("<target>/<profile>")
    } else {
        deps
    };
    dir.to_path_buf()
}

/// Builds `args` (e.g. `["-p", "vramtrace-preload", "--lib"]`) with cargo into this test's
/// target directory and profile, once per distinct `args` in this process. Panics with cargo's
/// output when the build fails: a test must never run against a library it could not build.
pub fn build(args: &[&str]) {
    static DONE: OnceLock<Mutex<HashSet<Vec<String>>>> = OnceLock::new();
    let key: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    // Held across the build: concurrent tests wait for it instead of building twice.
    let mut done = DONE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if done.contains(&key) {
        return;
    }
    let profile = profile_dir();
    let target = profile.parent().expect("<target>");
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo
        .arg("build")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", target);
    if profile.file_name().is_some_and(|n| n == "release") {
        cargo.arg("--release");
    }
    let o = cargo
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo to build {args:?}: {e}"));
    assert!(
        o.status.success(),
        "cargo build {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
    done.insert(key);
}

/// `file` in the profile directory after building `package`'s library (e.g.
/// `built("vramtrace-preload", "libvramtrace_preload.so")`).
pub fn built(package: &str, file: &str) -> PathBuf {
    build(&["-p", package, "--lib"]);
    let path = profile_dir().join(file);
    assert!(
        path.is_file(),
        "{} is missing after building {package}",
        path.display()
    );
    path
}

/// The preload library, built.
pub fn preload() -> PathBuf {
    built("vramtrace-preload", "libvramtrace_preload.so")
}

/// A directory holding the stand-in driver (built) under `libcuda.so.1` and `libcuda.so`, for
/// `LD_LIBRARY_PATH` and for linking with `-lcuda`. `VRAMTRACE_TEST_LIBCUDA` names another
/// driver library to use instead.
pub fn stand_in_dir() -> PathBuf {
    let lib = match std::env::var_os("VRAMTRACE_TEST_LIBCUDA") {
        Some(p) => PathBuf::from(p),
        None => built("vramtrace-fakecuda", "libcuda.so"),
    };
    let dir = profile_dir().join("stand-in-driver");
    std::fs::create_dir_all(&dir).expect("create the stand-in's directory");
    for name in ["libcuda.so.1", "libcuda.so"] {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(lib.as_path()) {
            let _ = std::fs::remove_file(&link);
            // Another test process may make the same link at the same moment: either is right.
            let _ = std::os::unix::fs::symlink(&lib, &link);
        }
    }
    dir
}

/// A fresh, empty directory unique to this test process and `name`.
pub fn scratch(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("vramtrace-test-{}-{n}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// Status, stdout and stderr of a finished command, for an assertion message.
pub fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Says that a test cannot run here, and why, where a plain `cargo test` shows it (libtest
/// captures `println!`, not writes to the stderr handle). When the environment variable
/// `require` is `1` (CI sets every one it provides for), the test fails instead: a missing
/// prerequisite there is a broken set-up, never a silent pass.
pub fn skip(require: &str, why: &str) {
    assert!(
        std::env::var_os(require).is_none_or(|v| v != "1"),
        "{require}=1, but this test cannot run: {why}"
    );
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {why} (set {require}=1 to fail instead)"
    );
}

/// Whether `python3` runs here; when it does not, the test is skipped with [`skip`] under
/// `VRAMTRACE_TEST_REQUIRE_PYTHON` (which CI sets), and the caller returns.
pub fn python3_or_skip() -> bool {
    let runs = Command::new("python3")
        .args(["-c", "pass"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !runs {
        skip("VRAMTRACE_TEST_REQUIRE_PYTHON", "python3 does not run here");
    }
    runs
}

/// The peak resident memory, in bytes, that the `vramtrace` CLI says on stderr under
/// `VRAMTRACE_PEAK_RSS` (its own `VmHWM` since its exec; a spawned child's `ru_maxrss` would also
/// count the spawning process's memory, held until the exec); `None` when it said none.
pub fn said_peak_memory(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("vramtrace: peak resident memory: "))
        .and_then(|v| v.strip_suffix(" kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The `PYTHONPATH` under which `python3` imports the `duckdb` package (CI installs it into a
/// folder of its own named by `VRAMTRACE_TEST_PYTHONPATH`), or `None` after a visible [`skip`]
/// under `VRAMTRACE_REQUIRE_DUCKDB` naming `test`: the caller returns.
pub fn duckdb_or_skip(test: &str) -> Option<std::ffi::OsString> {
    let pythonpath = std::env::var_os("VRAMTRACE_TEST_PYTHONPATH").unwrap_or_default();
    let has_duckdb = Command::new("python3")
        .args(["-c", "import duckdb"])
        .env("PYTHONPATH", &pythonpath)
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_duckdb {
        skip(
            "VRAMTRACE_REQUIRE_DUCKDB",
            &format!("{test}: the duckdb Python package is not installed (pip install duckdb)"),
        );
        return None;
    }
    Some(pythonpath)
}

/// Whether a snapshot test should rewrite its expected file: `var` (`UPDATE_SNAPSHOTS`,
/// `VRAMTRACE_BLESS`) is set. Under CI (`CI` set to anything but `false` or `0`) a test never
/// rewrites what it checks against: it fails instead, so a set variable cannot make CI pass.
pub fn bless(var: &str) -> bool {
    match bless_in(
        std::env::var_os(var).is_some(),
        std::env::var("CI").ok().as_deref(),
    ) {
        Ok(b) => b,
        Err(why) => panic!("{var} is set, but {why}"),
    }
}

fn bless_in(set: bool, ci: Option<&str>) -> Result<bool, &'static str> {
    let in_ci = ci.is_some_and(|v| !matches!(v, "" | "false" | "0"));
    match (set, in_ci) {
        (true, true) => Err(
            "CI is set: expected files are rewritten only by hand (unset it, or run outside CI)",
        ),
        (set, _) => Ok(set),
    }
}

/// Runs `cmd` with an empty stdin, collecting its stdout and stderr, and kills it if it is
/// still running after `limit`: `None` then. A command that hangs fails its test instead of
/// hanging the suite.
pub fn output_within(mut cmd: Command, limit: std::time::Duration) -> Option<Output> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    // Drained on threads, so a command writing more than a pipe holds never blocks.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waiting for the command") {
            return Some(Output {
                status,
                stdout: out.join().unwrap_or_default(),
                stderr: err.join().unwrap_or_default(),
            });
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn blessing_is_refused_in_ci() {
        use super::bless_in;
        assert_eq!(bless_in(false, None), Ok(false));
        assert_eq!(bless_in(true, None), Ok(true));
        assert_eq!(bless_in(true, Some("false")), Ok(true));
        assert_eq!(bless_in(false, Some("true")), Ok(false));
        assert!(bless_in(true, Some("true")).is_err());
        assert!(bless_in(true, Some("1")).is_err());
    }
}
