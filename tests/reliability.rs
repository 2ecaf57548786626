//! The reliability defects of issue 13 on the CLI side, each through the real binary: broken
//! pipes, overflowing sizes, non-finite windows, non-regular files, partly bad trace directories,
//! unwritable `--out`, refused calls that are not out-of-memory, the host line of `summary`, and
//! `compare`'s default variant.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use vramtrace_format::{Api, Event, EventKind, Header, MemKind, Record};

fn config() -> &'static str {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/samples/models/Qwen3.6-27B/config.json"
    )
}

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/h200")
        .join(name)
}

/// Runs the CLI with `args`, killing it after `limit`; `None` when it ran past the limit.
fn run_within(args: &[&std::ffi::OsStr], limit: Duration) -> Option<Output> {
    let mut cmd = Command::new(vramtrace());
    cmd.args(args);
    vramtrace_testkit::output_within(cmd, limit)
}

fn cli(args: &[&str]) -> Output {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    run_within(&args, Duration::from_secs(60)).expect("the command did not finish in 60 s")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `vramtrace ARGS` with its stdout a pipe whose reading end is already closed (what a
/// `| head -1` that has read its line leaves): it must end quietly, never panic.
fn into_closed_pipe(args: &[&str]) -> Output {
    let mut child = Command::new(vramtrace())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

fn assert_quiet_on_broken_pipe(args: &[&str]) {
    use std::os::unix::process::ExitStatusExt;
    let o = into_closed_pipe(args);
    let err = stderr(&o);
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{args:?}: {}",
        describe(&o)
    );
    // Ended by SIGPIPE like other Unix tools, or a clean exit.
    assert!(
        o.status.signal() == Some(libc::SIGPIPE) || o.status.success(),
        "{args:?}: {}",
        describe(&o)
    );
}

#[test]
fn broken_pipe_ends_every_command_quietly() {
    let gdn = sample("workload-gdn-t4128");
    let gdn = gdn.to_str().unwrap();
    assert_quiet_on_broken_pipe(&["summary", gdn]);
    assert_quiet_on_broken_pipe(&["summary", gdn, "--json"]);
    assert_quiet_on_broken_pipe(&["events", gdn]);
    assert_quiet_on_broken_pipe(&[
        "compare",
        gdn,
        "--model",
        config(),
        "--variant",
        "fla-0.6.0",
        "--json",
    ]);
    assert_quiet_on_broken_pipe(&["model", config(), "--sweep", "1024..65536"]);
    assert_quiet_on_broken_pipe(&["model", config()]);
}

/// The demo's own output ends quietly, and so does its workload child (testbed/workload, a Rust
/// program whose runtime ignores SIGPIPE again until its `main` restores the default action).
#[test]
fn broken_pipe_ends_the_demo_quietly() {
    target_dir();
    let out = scratch("pipe-demo").join("trace");
    assert_quiet_on_broken_pipe(&["demo", "--simulate", "--out", out.to_str().unwrap()]);
}

// ---- sizes: exact or a clear error ------------------------------------------------------------

#[test]
fn a_sweep_to_an_absurd_token_count_is_refused_at_once() {
    let args: Vec<&std::ffi::OsStr> = [
        "model",
        config(),
        "--kernel",
        "gdn",
        "--sweep",
        "1..18446744073709551000",
    ]
    .into_iter()
    .map(std::ffi::OsStr::new)
    .collect();
    let o = run_within(&args, Duration::from_secs(20)).expect("the sweep hangs");
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(stderr(&o).contains("tokens"), "{}", describe(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", describe(&o));
}

#[test]
fn a_sweep_with_too_many_rows_is_refused() {
    let o = cli(&["model", config(), "--sweep", "1..1000000", "--step", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(stderr(&o).contains("rows"), "{}", describe(&o));
}

#[test]
fn token_counts_whose_tensors_overflow_are_a_clear_error() {
    for tokens in ["1000000000000000", "18446744073709551615"] {
        let o = cli(&["model", config(), "--kernel", "gdn", "--tokens", tokens]);
        assert_eq!(
            o.status.code(),
            Some(2),
            "--tokens {tokens}: {}",
            describe(&o)
        );
        let err = stderr(&o);
        assert!(
            err.contains("tokens") && !err.contains("panicked"),
            "--tokens {tokens}: {}",
            describe(&o)
        );
    }
    // Two sequences whose sum overflows.
    let o = cli(&[
        "model",
        config(),
        "--seqlens",
        "18446744073709551615,18446744073709551615",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", describe(&o));
}

#[test]
fn every_size_printed_for_a_large_count_is_exact() {
    // 2^30 tokens: h [1, 2^24, 48, 128, 128] bf16 is 2^24 * 48 * 2^15 bytes, exact.
    let o = cli(&[
        "model",
        config(),
        "--variant",
        "fla-0.6.0",
        "--tokens",
        "1073741824",
        "--json",
    ]);
    assert!(o.status.success(), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for t in v["tensors"].as_array().unwrap() {
        let numel: u128 = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| u128::from(d.as_u64().unwrap()))
            .product();
        let size: u128 = match t["dtype"].as_str().unwrap() {
            "float32" => 4,
            _ => 2,
        };
        assert_eq!(
            u128::from(t["bytes"].as_u64().unwrap()),
            numel * size,
            "{t}"
        );
    }
    let h = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "h")
        .unwrap();
    assert_eq!(h["bytes"].as_u64().unwrap(), (1u64 << 24) * 48 * (1 << 15));
}

// ---- time windows ------------------------------------------------------------------------------

#[test]
fn non_finite_or_negative_windows_are_refused() {
    let gdn = sample("workload-gdn-t4128");
    for at in [
        "nan..inf", "0..inf", "-1..2", "nan..1", "0..nan", "inf..inf", "2..1",
    ] {
        let o = cli(&[
            "compare",
            gdn.to_str().unwrap(),
            "--model",
            config(),
            "--variant",
            "fla-0.6.0",
            &format!("--at={at}"),
        ]);
        assert_eq!(o.status.code(), Some(2), "--at {at}: {}", describe(&o));
        assert!(stderr(&o).contains("--at"), "--at {at}: {}", describe(&o));
    }
}

// ---- trace files and directories ---------------------------------------------------------------

fn header(pid: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    Header {
        version: 1,
        pid,
        ppid: 1,
        cmdline: vec!["python3".into()],
        ..Header::default()
    }
    .encode(&mut bytes);
    bytes
}

fn push(bytes: &mut Vec<u8>, r: Record) {
    let mut buf = vec![0u8; 512];
    bytes.extend_from_slice(r.encode(&mut buf));
}

fn alloc(t_ns: u64, api: &str, mem: MemKind, device: i32, ptr: u64, size: u64) -> Record {
    Record::Event(Event {
        t_ns,
        tid: 1,
        device,
        kind: EventKind::Alloc,
        mem,
        api: Api::from_name(api).unwrap(),
        ptr,
        size,
        ..Event::default()
    })
}

fn failed(t_ns: u64, api: &str, size: u64, result: i32) -> Record {
    Record::Event(Event {
        t_ns,
        tid: 1,
        device: 0,
        kind: EventKind::AllocFailed,
        mem: MemKind::Device,
        api: Api::from_name(api).unwrap(),
        result,
        size,
        free_bytes: 1 << 20,
        total_bytes: 24 << 30,
        ..Event::default()
    })
}

/// A good trace of one process: two device allocations.
fn good_trace(dir: &Path, pid: u32) -> PathBuf {
    let mut b = header(pid);
    push(
        &mut b,
        alloc(1000, "cuMemAlloc_v2", MemKind::Device, 0, 0x7000_0000, 4096),
    );
    push(
        &mut b,
        alloc(2000, "cuMemAlloc_v2", MemKind::Device, 0, 0x7100_0000, 8192),
    );
    let p = dir.join(format!("{pid}.vtr"));
    std::fs::write(&p, b).unwrap();
    p
}

#[test]
fn a_fifo_or_a_device_is_refused_not_read() {
    let dir = scratch("fifo");
    let fifo = dir.join("9.vtr");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // Safety: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let limit = Duration::from_secs(20);
    let o = run_within(&["summary".as_ref(), fifo.as_os_str()], limit).expect("a FIFO hangs");
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(
        stderr(&o).contains("not a regular file"),
        "{}",
        describe(&o)
    );
    // In a directory with no good file: an error that names it.
    let o = run_within(&["summary".as_ref(), dir.as_os_str()], limit).expect("a FIFO hangs");
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(
        stderr(&o).contains("not a regular file"),
        "{}",
        describe(&o)
    );
    // Beside a good file: listed among the bad ones, the good one read.
    good_trace(&dir, 10);
    let o = run_within(&["summary".as_ref(), dir.as_os_str()], limit).expect("a FIFO hangs");
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert!(stdout(&o).contains("9.vtr"), "{}", describe(&o));
    let o = run_within(&["summary".as_ref(), "/dev/zero".as_ref()], limit).expect("/dev/zero");
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(
        stderr(&o).contains("not a regular file"),
        "{}",
        describe(&o)
    );
}

#[test]
fn a_directory_reads_its_good_files_and_lists_the_bad_ones() {
    let dir = scratch("partly-bad");
    good_trace(&dir, 21);
    std::fs::write(dir.join("22.vtr"), b"").unwrap(); // killed before the header
    std::fs::write(dir.join("23.vtr"), b"#!/bin/sh\necho not a trace\n").unwrap();
    let d = dir.to_str().unwrap();

    let o = cli(&["summary", d]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let out = stdout(&o);
    assert!(out.contains("process 21"), "{out}");
    assert!(out.contains("22.vtr") && out.contains("23.vtr"), "{out}");
    assert!(out.contains("skipped 2 unreadable trace file(s)"), "{out}");

    let o = cli(&["summary", d, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let bad = v["unreadable"].as_array().unwrap();
    assert_eq!(bad.len(), 2, "{v}");
    assert!(bad[0]["file"].as_str().unwrap().ends_with("22.vtr"), "{v}");
    assert!(bad[0]["reason"].as_str().unwrap().contains("empty"), "{v}");
    assert!(bad[1]["file"].as_str().unwrap().ends_with("23.vtr"), "{v}");

    // Other commands warn on stderr and carry on.
    let o = cli(&["events", d]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert_eq!(stdout(&o).lines().count(), 2, "{}", describe(&o));
    assert!(
        stderr(&o).contains("warning") && stderr(&o).contains("22.vtr"),
        "{}",
        describe(&o)
    );

    // Only bad files: an error naming each.
    let only_bad = scratch("only-bad");
    std::fs::write(only_bad.join("1.vtr"), b"").unwrap();
    let o = cli(&["summary", only_bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(stderr(&o).contains("1.vtr"), "{}", describe(&o));
}

// ---- run --out -----------------------------------------------------------------------------------

/// Whether `setpriv` can run a command as `nobody` here (it needs root).
fn can_drop_to_nobody() -> bool {
    Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "true",
        ])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn run_refuses_an_out_directory_it_cannot_write() {
    target_dir();
    let dir = scratch("unwritable");
    let out = dir.join("ro");
    std::fs::create_dir(&out).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o555)).unwrap();
    // Root writes anywhere: run the CLI as nobody then (every path above must be traversable).
    // Safety: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    if as_root && !can_drop_to_nobody() {
        vramtrace_testkit::skip(
            "VRAMTRACE_REQUIRE_SETPRIV",
            "running as root without setpriv: cannot make a directory unwritable",
        );
        return;
    }
    for p in [dir.as_path(), dir.parent().unwrap()] {
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | 0o755));
    }
    let mut cmd = if as_root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(vramtrace());
        c
    } else {
        Command::new(vramtrace())
    };
    let o = cmd
        .arg("run")
        .arg("--out")
        .arg(&out)
        .arg("--preload")
        .arg(preload())
        .args(["--", "true"])
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    let err = stderr(&o);
    assert!(err.contains("cannot write"), "{err}");
    assert!(!err.contains("trace written"), "{err}");
}

#[test]
fn run_never_claims_a_trace_it_did_not_write() {
    target_dir();
    let out = scratch("no-cuda").join("trace");
    let o = Command::new(vramtrace())
        .arg("run")
        .arg("--out")
        .arg(&out)
        .arg("--preload")
        .arg(preload())
        .args(["--", "sh", "-c", "exit 3"])
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    // A program that never touches CUDA keeps its exit code, and no trace is announced.
    assert_eq!(o.status.code(), Some(3), "{}", describe(&o));
    let err = stderr(&o);
    assert!(!err.contains("trace written"), "{err}");
    assert!(err.contains("no trace file was written"), "{err}");
}

/// The recorder was loaded and the program touched CUDA, but no file could be made (here a
/// symbolic link planted where the trace file goes): `run` says so and fails, instead of
/// treating it as a program that never touched CUDA. The preload's line comes back through the
/// status pipe (`VRAMTRACE_STATUS_FD`).
#[test]
fn run_fails_when_the_recorder_could_not_record() {
    let prog = c_program("security", true);
    let out = scratch("could-not-record").join("trace");
    let o = run_traced(&out, "24GiB", &[prog.as_os_str(), "plant".as_ref()]);
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    let err = stderr(&o);
    assert!(
        err.contains("the recorder was loaded but could not record"),
        "{err}"
    );
    assert!(err.contains("symbolic link"), "{err}");
    assert!(!err.contains("trace written"), "{err}");
    assert!(!err.contains("no trace file was written"), "{err}");
    // The program itself ran and printed its results.
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("freed 1"));
    // The directory run made is private.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

// ---- refused calls that are not out-of-memory ----------------------------------------------------

/// PyTorch's start-up with expandable segments: a 2 MiB `cuMemCreate` refused with 800, then
/// healthy allocations, then (optionally) a real out-of-memory.
fn refused_then_oom(dir: &Path, oom: bool) {
    let mut b = header(31);
    push(&mut b, failed(1000, "cuMemCreate", 2 << 20, 800));
    push(
        &mut b,
        alloc(
            2000,
            "cuMemAlloc_v2",
            MemKind::Device,
            0,
            0x7000_0000,
            50724864,
        ),
    );
    if oom {
        push(&mut b, failed(3000, "cuMemAlloc_v2", 102236160, 2));
    }
    std::fs::write(dir.join("31.vtr"), b).unwrap();
}

#[test]
fn a_refused_call_is_a_failed_call_not_an_oom() {
    let dir = scratch("refused");
    refused_then_oom(&dir, false);
    let d = dir.to_str().unwrap();
    let o = cli(&["summary", d]);
    assert!(o.status.success(), "{}", describe(&o));
    let out = stdout(&o);
    assert!(!out.contains("failed allocation"), "{out}");
    assert!(
        out.contains("1 failed call(s) that were not out-of-memory"),
        "{out}"
    );
    assert!(
        out.contains("cuMemCreate of 2.00 MiB: CUDA_ERROR_NOT_PERMITTED (800)"),
        "{out}"
    );
    let o = cli(&["summary", d, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let dev = &v["processes"][0]["devices"][0];
    assert_eq!(dev["failed_allocations"], 0, "{v}");
    assert_eq!(
        dev["failed_calls"][0]["error"], "CUDA_ERROR_NOT_PERMITTED",
        "{v}"
    );
    assert_eq!(dev["failed_calls"][0]["result"], 800, "{v}");
    // compare --at oom finds no out-of-memory.
    let o = cli(&[
        "compare",
        d,
        "--model",
        config(),
        "--variant",
        "fla-0.6.0",
        "--at",
        "oom",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(
        stderr(&o).contains("0 out-of-memory failure(s)"),
        "{}",
        describe(&o)
    );
}

#[test]
fn the_first_oom_is_the_first_out_of_memory_not_the_first_refusal() {
    let dir = scratch("refused-oom");
    refused_then_oom(&dir, true);
    let d = dir.to_str().unwrap();
    let o = cli(&[
        "compare",
        d,
        "--model",
        config(),
        "--variant",
        "fla-0.6.0",
        "--at",
        "oom",
        "--json",
    ]);
    assert!(o.status.success(), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["moment"]
            .as_str()
            .unwrap()
            .contains("cuMemAlloc_v2 of 97.50 MiB"),
        "{v}"
    );
    let o = cli(&["summary", d]);
    let out = stdout(&o);
    assert!(out.contains("1 failed allocation(s)"), "{out}");
    assert!(out.contains("CUDA_ERROR_OUT_OF_MEMORY (2)"), "{out}");
    assert!(
        out.contains("1 failed call(s) that were not out-of-memory"),
        "{out}"
    );
}

// ---- summary's host line -------------------------------------------------------------------------

#[test]
fn pinned_host_memory_is_one_consistent_line() {
    let dir = scratch("host");
    let mut b = header(41);
    push(
        &mut b,
        alloc(1000, "cuMemAllocHost_v2", MemKind::Host, -1, 0x1000, 4),
    );
    std::fs::write(dir.join("41.vtr"), b).unwrap();
    let o = cli(&["summary", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", describe(&o));
    let out = stdout(&o);
    let host: Vec<&str> = out.lines().filter(|l| l.contains("host")).collect();
    assert_eq!(
        host,
        vec!["  host (pinned memory): 1 allocations, 0 frees, peak 4 B, 4 B live at end"],
        "{out}"
    );
}

// ---- compare's default variant ---------------------------------------------------------------

#[test]
fn compare_without_kernel_or_variant_picks_the_best_matching_variant() {
    // The fla 0.6.0 sizes at T = 4128, H = 48, K = V = 128, bf16 (docs/architecture.md).
    let dir = scratch("compare-default");
    let mut b = header(51);
    let sizes = [
        792576u64, 25362432, 50724864, 50724864, 102236160, 3145728, 50724864, 50724864,
    ];
    for (i, s) in sizes.iter().enumerate() {
        push(
            &mut b,
            alloc(
                1000 + i as u64,
                "cuMemAlloc_v2",
                MemKind::Device,
                0,
                0x7000_0000_0000 + ((i as u64) << 28),
                *s,
            ),
        );
    }
    std::fs::write(dir.join("51.vtr"), b).unwrap();
    let o = cli(&[
        "compare",
        dir.to_str().unwrap(),
        "--model",
        config(),
        "--tokens",
        "4128",
        "--json",
    ]);
    assert!(o.status.success(), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["variant"], "fla-0.6.0", "{v}");
    assert_eq!(v["attribution"]["unexplained_bytes"], 0, "{v}");
}

#[test]
fn summary_reads_a_file_whose_header_has_a_flipped_byte_and_names_the_damage() {
    let dir = scratch("damaged-header");
    let mut bytes = std::fs::read(sample("v2-torch-nocache/589.vtr")).unwrap();
    bytes[50] ^= 0xff; // the first argument's length, inside the checksummed body
    std::fs::write(dir.join("589.vtr"), &bytes).unwrap();
    let o = cli(&["summary", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let out = stdout(&o);
    assert!(out.contains("process 589"), "{out}");
    assert!(out.contains("6 allocations, 6 frees"), "{out}");
    assert!(
        out.contains("damaged file header (checksum failed)"),
        "{out}"
    );
    assert!(!out.contains("unreadable trace file"), "{out}");
}
