//! The recorder's security promises (issue 13, item 5): what it creates and how, what it never
//! opens, which environment values it accepts, and which programs it leaves alone.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use common::*;

/// `cmd` with umask 0 in the child, so that the modes seen are the ones the recorder asked for.
fn with_umask_0(mut cmd: Command) -> Command {
    // Safety: umask is async-signal-safe and has no preconditions.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    cmd
}

fn vtr_files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "vtr"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_directory_is_created_0700_and_the_file_0600() {
    let s = Scratch::new("sec-modes");
    let exe = compile(&s, "security", true);
    let dir = s.path.join("a/b/trace");
    let out = run_ok(with_umask_0(traced(&exe, &dir)));
    assert!(out.starts_with("freed 1"), "{out}");
    for d in [s.path.join("a"), s.path.join("a/b"), dir.clone()] {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{} is {mode:o}", d.display());
    }
    let files = vtr_files(&dir);
    assert_eq!(files.len(), 1);
    let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600, "{} is {mode:o}", files[0].display());
}

#[test]
fn a_planted_symlink_is_refused_and_the_program_runs_on() {
    let s = Scratch::new("sec-symlink");
    let exe = compile(&s, "security", true);
    let dir = s.trace_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = traced(&exe, &dir);
    cmd.arg("plant");
    let o = cmd.output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}\n{err}", o.status);
    assert!(
        out.starts_with("freed 1"),
        "the program's own output: {out}"
    );
    // Nothing was written through the link, and no other trace file was made instead.
    assert!(
        !dir.join("victim").exists(),
        "the recorder followed the link"
    );
    for f in vtr_files(&dir) {
        assert!(
            std::fs::symlink_metadata(&f)
                .unwrap()
                .file_type()
                .is_symlink(),
            "a trace file was created beside the planted link: {}",
            f.display()
        );
    }
    assert_eq!(err.lines().count(), 1, "one line on stderr: {err}");
    assert!(
        err.starts_with("vramtrace: recording stopped:") && err.contains("symbolic link"),
        "{err}"
    );
}

#[test]
fn a_trace_directory_that_is_a_symlink_is_refused() {
    let s = Scratch::new("sec-dirlink");
    let exe = compile(&s, "security", true);
    let real = s.path.join("elsewhere");
    std::fs::create_dir_all(&real).unwrap();
    let link = s.path.join("trace");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let o = traced(&exe, &link).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(vtr_files(&real).is_empty(), "wrote through the link");
    assert!(err.contains("symbolic link"), "{err}");
}

#[test]
fn no_socket_is_ever_opened() {
    // The preload has no networking at all: no socket, bind or listen anywhere in its source,
    // and a traced process holds no socket descriptor after recording.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&p).unwrap();
            for call in [
                "libc::socket",
                "libc::bind",
                "libc::listen",
                "libc::accept",
                "std::net",
            ] {
                assert!(!text.contains(call), "{} uses {call}", p.display());
            }
        }
    }
    let s = Scratch::new("sec-sockets");
    let exe = compile(&s, "security", true);
    let out = run_ok(traced(&exe, &s.trace_dir()));
    assert!(out.contains("sockets=0"), "{out}");
    assert_eq!(vtr_files(&s.trace_dir()).len(), 1);
}

#[test]
fn an_undocumented_switch_value_is_one_warning_and_the_default() {
    let s = Scratch::new("sec-env");
    let exe = compile(&s, "security", true);
    let mut cmd = traced(&exe, &s.trace_dir());
    cmd.env("VRAMTRACE_STACKS", "maybe\x1b[31m")
        .env("VRAMTRACE_FREE_STACKS", "2");
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "one line per bad value: {err}");
    assert!(
        lines.iter().any(
            |l| l.starts_with("vramtrace: ignoring VRAMTRACE_STACKS=maybe?[31m")
                && l.ends_with("using the default, on")
        ),
        "{err}"
    );
    assert!(
        lines.iter().any(
            |l| l.starts_with("vramtrace: ignoring VRAMTRACE_FREE_STACKS=2")
                && l.ends_with("using the default, off")
        ),
        "{err}"
    );
    // The defaults held: the allocation has a native stack, the release none.
    let t = only_trace(&s.trace_dir());
    let ev = events(&t);
    assert_eq!(ev.len(), 2);
    assert_ne!(ev[0].stack, 0, "stacks stay on by default");
    assert_eq!(ev[1].stack, 0, "release stacks stay off by default");
}

#[test]
fn a_setuid_program_is_not_traced() {
    // Safety: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vramtrace_testkit::skip(
            "VRAMTRACE_TEST_REQUIRE_ROOT",
            "a set-user-ID program owned by another user needs root",
        );
        return;
    }
    let s = Scratch::new("sec-setuid");
    // Linked with the preload itself (LD_PRELOAD is ignored for secure programs), found through
    // an absolute run path, which the dynamic linker honours in secure mode.
    let lib = profile_dir();
    let mut rpath = std::ffi::OsString::from("-Wl,-rpath,");
    rpath.push(lib.as_os_str());
    rpath.push(":");
    rpath.push(driver_dir().as_os_str());
    let exe = s.path.join("security_suid");
    let o = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-O1")
        .arg("-o")
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/security.c"))
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c"))
        .arg("-L")
        .arg(&lib)
        .arg("-l:libvramtrace_preload.so")
        .arg("-L")
        .arg(driver_dir())
        .arg("-lcuda")
        .arg(&rpath)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = s.path.join("trace");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let run = || {
        let mut c = Command::new(&exe);
        c.env("VRAMTRACE_DIR", &dir).env_remove("LD_PRELOAD");
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).starts_with("freed 1"));
        o
    };
    // The same program without the bit is recorded: the linking works.
    run();
    let files = vtr_files(&dir);
    assert_eq!(files.len(), 1, "the plain program is recorded");
    std::fs::remove_file(&files[0]).unwrap();
    // Owned by nobody, set-user-ID: run by root it runs as nobody, in secure mode.
    let nobody = 65534;
    std::os::unix::fs::chown(&exe, Some(nobody), Some(nobody)).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(std::fs::metadata(&exe).unwrap().mode() & 0o4000, 0o4000);
    let o = run();
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        vtr_files(&dir).is_empty(),
        "a set-user-ID program was traced"
    );
}
