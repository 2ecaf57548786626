//! Shared test harness: finds (and first rebuilds) the stand-in library, puts
//! it on a loader path, and runs scenarios in child processes.
//!
//! The configuration is read once per process and the driver state is
//! process-wide, so every scenario that initialises the driver runs in its own
//! child: the test re-executes its own binary, filtered to itself, with
//! `FAKECUDA_TEST_CHILD` set, and the scenario body runs there.

#![allow(dead_code)]

use std::ffi::{CString, c_void};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Set in the environment of a child that should run the scenario body.
const CHILD_VAR: &str = "FAKECUDA_TEST_CHILD";

/// The built stand-in, `<target>/<profile>/libcuda.so`, rebuilt once per test process (see
/// `vramtrace_testkit::build`): a stale library would be tested silently.
pub fn library() -> PathBuf {
    vramtrace_testkit::built("vramtrace-fakecuda", "libcuda.so")
}

/// A fresh directory holding `libcuda.so.1` and `libcuda.so` links to the
/// stand-in, for `LD_LIBRARY_PATH`. Removed when dropped.
pub fn loader_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    let lib = library();
    for name in ["libcuda.so.1", "libcuda.so"] {
        std::os::unix::fs::symlink(&lib, dir.path().join(name)).expect("symlink");
    }
    dir
}

/// Whether this process is a scenario child.
pub fn is_child() -> bool {
    std::env::var_os(CHILD_VAR).is_some()
}

/// Runs the test `name` of this binary again in a child process with `env`
/// added, and returns what it did. The child sees `is_child() == true`.
pub fn run_child(name: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(std::env::current_exe().expect("test executable path"));
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, "1")
        // The child's own configuration comes only from `env`.
        .env_remove("VRAMTRACE_FAKE_DEVICES")
        .env_remove("VRAMTRACE_FAKE_CAPACITY")
        .env_remove("VRAMTRACE_FAKE_NAME");
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd.output().expect("run the test binary as a child")
}

/// As `run_child`, and fails unless the child passed.
pub fn run_child_ok(name: &str, env: &[(&str, &str)]) -> Output {
    let output = run_child(name, env);
    assert!(
        output.status.success(),
        "child `{name}` failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("1 passed"),
        "child `{name}` ran no test: is the name right?"
    );
    output
}

/// A `dlopen`ed library; closed on drop.
pub struct Library(*mut c_void);

impl Library {
    /// Opens `path` with `RTLD_NOW | RTLD_LOCAL`, as cudart and cudarc do.
    pub fn open(path: &Path) -> Library {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // Safety: a valid NUL-terminated path; dlopen has no other precondition.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(
            !handle.is_null(),
            "dlopen {}: {}",
            path.display(),
            dl_error()
        );
        Library(handle)
    }

    /// The raw handle.
    pub fn handle(&self) -> *mut c_void {
        self.0
    }

    /// `dlsym(handle, name)`: null when absent.
    pub fn address(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).unwrap();
        // Safety: a live handle and a NUL-terminated name.
        unsafe { libc::dlsym(self.0, c.as_ptr()) }
    }

    /// The exported function `name` as `F` (a function pointer type).
    ///
    /// # Safety
    /// `F` must be the C signature of `name`.
    pub unsafe fn function<F: Copy>(&self, name: &str) -> F {
        let address = self.address(name);
        assert!(!address.is_null(), "{name} is not exported");
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        // Safety: a non-null function address, and `F` is its signature per the caller.
        unsafe { std::mem::transmute_copy(&address) }
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // Safety: the handle came from dlopen and is closed once.
        unsafe { libc::dlclose(self.0) };
    }
}

/// The last `dlerror()` message.
pub fn dl_error() -> String {
    // Safety: dlerror returns null or a NUL-terminated string.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        return "no error".into();
    }
    // Safety: non-null and NUL-terminated.
    unsafe { std::ffi::CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned()
}
