//! End-to-end: `vramtrace attach` on a running program that resolved the stand-in driver's
//! entry points through `cuGetProcAddress` before the attach, the real preload, the real CLI.
//! Every allocation made while attached is in the trace, exactly; none made before or after;
//! the driver's bytes are the same after detach; the program ends as it would have. And each
//! refusal changes nothing.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `attach_loop` and the lines it printed so far.
struct Target {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Target {
    fn start(iterations: u32, gap_ms: u32, two_threads: bool) -> Target {
        Target::start_mode(iterations, gap_ms, u8::from(two_threads))
    }

    /// `mode`: 0 one thread, 1 a second thread, 2 a child forked at iteration 40.
    fn start_mode(iterations: u32, gap_ms: u32, mode: u8) -> Target {
        let mut cmd = Command::new(c_program("attach_loop", false));
        cmd.args([iterations.to_string(), gap_ms.to_string(), mode.to_string()]);
        Target::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> Target {
        let mut child = cmd
            .env("LD_LIBRARY_PATH", fake_driver_dir())
            .env("VRAMTRACE_FAKE_CAPACITY", "24GiB")
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
        });
        let t = Target {
            child,
            lines,
            reader: Some(reader),
        };
        t.wait_for(|l| l.iter().filter(|x| x.starts_with("T0 ")).count() >= 10);
        t
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn wait_for(&self, what: impl Fn(&[String]) -> bool) {
        let start = Instant::now();
        while !what(&self.lines.lock().unwrap()) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the program stalled"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the program's end: its exit code and every line it printed.
    fn finish(mut self) -> (Option<i32>, Vec<String>) {
        let status = self.child.wait().unwrap();
        self.reader.take().unwrap().join().unwrap();
        (status.code(), self.lines.lock().unwrap().clone())
    }
}

/// `(ptr, size)` of each allocation thread `t` printed, in order.
fn printed(lines: &[String], t: u32) -> Vec<(u64, u64)> {
    let tag = format!("T{t} ");
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(&tag))
        .map(|l| {
            let f: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            (f[1], f[2])
        })
        .collect()
}

/// The stand-in driver's code as the target has it mapped: every executable mapping of it.
fn driver_code(pid: i32) -> Vec<u8> {
    code_of(pid, "libcuda.so")
}

/// The code of the library whose path contains `lib`, as the target has it mapped.
fn code_of(pid: i32, lib: &str) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut code = Vec::new();
    for l in maps
        .lines()
        .filter(|l| l.contains(lib) && l.contains(" r-xp "))
    {
        let range = l.split(' ').next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut buf = vec![0u8; (b - a) as usize];
        mem.read_exact_at(&mut buf, a).unwrap();
        code.extend_from_slice(&buf);
    }
    assert!(!code.is_empty(), "{lib}'s code is mapped");
    code
}

fn attach(pid: i32, out: &Path, duration: &str) -> std::process::Output {
    Command::new(vramtrace())
        .args(["attach", &pid.to_string(), "--duration", duration, "--out"])
        .arg(out)
        .arg("--preload")
        .arg(preload())
        .output()
        .unwrap()
}

/// The traced `(ptr, size)` of allocations and the pointers of frees of thread `tid`.
fn traced(ev: &[serde_json::Value], tid: u64) -> (Vec<(u64, u64)>, Vec<u64>) {
    let ptr = |e: &serde_json::Value| {
        u64::from_str_radix(e["ptr"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
    };
    let mine: Vec<_> = ev
        .iter()
        .filter(|e| e["tid"].as_u64() == Some(tid))
        .collect();
    let allocs = mine
        .iter()
        .filter(|e| e["kind"] == "alloc")
        .map(|e| {
            assert_eq!(e["api"], "cuMemAlloc_v2");
            (ptr(e), e["size"].as_u64().unwrap())
        })
        .collect();
    let frees = mine
        .iter()
        .filter(|e| e["kind"] == "free")
        .map(|e| {
            assert_eq!(e["api"], "cuMemFree_v2");
            ptr(e)
        })
        .collect();
    assert!(
        mine.iter()
            .all(|e| e["kind"] == "alloc" || e["kind"] == "free"),
        "only allocations and frees: {mine:?}"
    );
    (allocs, frees)
}

/// The allocations traced are exactly the printed ones from some iteration k on, for a run of
/// iterations that starts after the first and ends before the last; each free traced is of an
/// allocation made just before or while attached.
fn assert_window(program: &[(u64, u64)], allocs: &[(u64, u64)], frees: &[u64]) {
    assert!(
        allocs.len() >= 5,
        "a few allocations while attached: {allocs:?}"
    );
    let k = program
        .iter()
        .position(|p| *p == allocs[0])
        .expect("the first traced allocation is one the program made");
    assert!(k > 0, "allocations before the attach are not in the trace");
    assert_eq!(
        &program[k..k + allocs.len()],
        allocs,
        "every allocation made while attached, in order, exactly"
    );
    assert!(
        k + allocs.len() < program.len(),
        "allocations after the detach are not in the trace"
    );
    let ptrs: Vec<u64> = program.iter().map(|p| p.0).collect();
    let f = ptrs[k - 1..]
        .iter()
        .position(|p| *p == frees[0])
        .map(|i| i + k - 1)
        .expect("the first traced free is of an allocation just before or while attached");
    assert_eq!(
        &ptrs[f..f + frees.len()],
        frees,
        "every free while attached"
    );
    assert!(frees.len() + 1 >= allocs.len() && frees.len() <= allocs.len() + 1);
}

#[test]
fn attach_records_exactly_while_attached_and_detach_restores_every_byte() {
    let t = Target::start(150, 10, false);
    let pid = t.pid();
    let before = driver_code(pid);
    let out = scratch("attach-one").join("trace");
    let o = attach(pid, &out, "600ms");
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("attached to process {pid}")), "{err}");
    assert!(err.contains("detached"), "{err}");
    assert!(o.stdout.is_empty(), "attach prints nothing on stdout");
    assert_eq!(
        driver_code(pid),
        before,
        "every byte of the driver's code restored"
    );
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    assert_eq!(lines.last().map(String::as_str), Some("done"));
    assert_eq!(
        printed(&lines, 0).len(),
        150,
        "the program ran every iteration"
    );
    let ev = events(&out);
    let (allocs, frees) = traced(&ev, pid as u64);
    assert_window(&printed(&lines, 0), &allocs, &frees);
    assert!(
        ev.iter().all(|e| e["pid"].as_u64() == Some(pid as u64)),
        "one process"
    );
    // What the attach was, beside the trace, on the trace's clock.
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("attach.json")).unwrap()).unwrap();
    assert_eq!(record["pid"], pid);
    assert_eq!(record["threads"], 1);
    assert_eq!(record["python_probe"], false);
    assert_eq!(record["watchdog"], true);
    assert_eq!(record["exited_while_attached"], false);
    // No NVIDIA driver here: NVML says why it has no figure.
    assert!(
        record["nvml_at_attach"]["unavailable"].is_string()
            || record["nvml_at_attach"]["devices"].is_array(),
        "{record}"
    );
    assert!(record["main_thread_paused_ms"].as_f64().unwrap() > 0.0);
    let hooked: Vec<&str> = record["hooked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(hooked.contains(&"cuMemAlloc_v2") && hooked.contains(&"cuMemFree_v2"));
    let (from, to) = (
        record["attached_at_ns"].as_u64().unwrap(),
        record["detached_at_ns"].as_u64().unwrap(),
    );
    assert!(from < to);
    assert!(ev.iter().all(|e| e["t_ns"].as_u64().unwrap() < to));
}

#[test]
fn attach_records_every_thread_while_another_allocates() {
    let t = Target::start(150, 8, true);
    let pid = t.pid();
    t.wait_for(|l| l.iter().filter(|x| x.starts_with("T1 ")).count() >= 10);
    let before = driver_code(pid);
    let out = scratch("attach-two").join("trace");
    let o = attach(pid, &out, "600ms");
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("all 2 threads"));
    assert_eq!(driver_code(pid), before);
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    assert_eq!(lines.last().map(String::as_str), Some("done"));
    let ev = events(&out);
    let mut tids: Vec<u64> = ev.iter().map(|e| e["tid"].as_u64().unwrap()).collect();
    tids.sort();
    tids.dedup();
    assert_eq!(tids.len(), 2, "both threads traced");
    let other = *tids.iter().find(|&&t| t != pid as u64).unwrap();
    let (a0, f0) = traced(&ev, pid as u64);
    assert_window(&printed(&lines, 0), &a0, &f0);
    let (a1, f1) = traced(&ev, other);
    assert_window(&printed(&lines, 1), &a1, &f1);
}

/// Runs `vramtrace attach` expecting a refusal: exit code 2, the reason on stderr, no trace
/// directory left behind.
fn refused(pid: i32, uid: Option<u32>) -> String {
    let dir = scratch("attach-refused");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let out = dir.join("trace");
    let mut cmd = Command::new(vramtrace());
    cmd.args(["attach", &pid.to_string(), "--duration", "1s", "--out"])
        .arg(&out)
        .arg("--preload")
        .arg(preload());
    if let Some(uid) = uid {
        // Safety: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(!out.exists(), "a refusal leaves no trace directory");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn attach_refuses_a_dead_pid_and_a_process_without_cuda() {
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id() as i32;
    gone.wait().unwrap();
    assert!(refused(pid, None).contains("no process with that id is running"));

    let mut plain = Command::new("sleep").arg("30").spawn().unwrap();
    let err = refused(plain.id() as i32, None);
    assert!(err.contains("has not loaded the CUDA driver"), "{err}");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", plain.id())).unwrap();
    assert!(!maps.contains("vramtrace"), "nothing was loaded into it");
    plain.kill().unwrap();
    plain.wait().unwrap();
}

#[test]
fn attach_refuses_twice_again_after_detach_and_under_run() {
    let t = Target::start(400, 10, false);
    let pid = t.pid();
    let out = scratch("attach-first").join("trace");
    let first = Command::new(vramtrace())
        .args(["attach", &pid.to_string(), "--duration", "1500ms", "--out"])
        .arg(&out)
        .arg("--preload")
        .arg(preload())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the first one is in, a second is refused and changes nothing.
    let start = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .contains("libvramtrace_preload")
    {
        assert!(start.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    let code = driver_code(pid);
    let err = refused(pid, None);
    assert!(
        err.contains("vramtrace is attached to it already (by process"),
        "{err}"
    );
    assert_eq!(driver_code(pid), code, "the refusal changed nothing");
    let o = first.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let err = refused(pid, None);
    assert!(err.contains("attached to it before and detached"), "{err}");
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    assert_eq!(lines.last().map(String::as_str), Some("done"));

    // A program already recording under `vramtrace run`.
    let prog = c_program("attach_loop", false);
    let run_out = scratch("attach-under-run").join("trace");
    let mut run = Command::new(vramtrace())
        .args(["run", "--quiet", "--out"])
        .arg(&run_out)
        .arg("--preload")
        .arg(preload())
        .arg("--")
        .arg(prog)
        .args(["300", "10"])
        .env("LD_LIBRARY_PATH", fake_driver_dir())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(run.stdout.as_mut().unwrap())
        .read_line(&mut first_line)
        .unwrap();
    let pid: i32 = first_line
        .trim()
        .strip_prefix("ready ")
        .unwrap()
        .parse()
        .unwrap();
    let err = refused(pid, None);
    assert!(err.contains("runs under `vramtrace run`"), "{err}");
    run.kill().unwrap();
    run.wait().unwrap();
}

#[test]
fn attach_refuses_a_set_user_id_program_and_another_user() {
    let dir = scratch("attach-setuid");
    let copy = dir.join("sleep");
    std::fs::copy("/bin/sleep", &copy).unwrap();
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    let mut setuid = Command::new(&copy).arg("30").spawn().unwrap();
    let err = refused(setuid.id() as i32, None);
    assert!(err.contains("set-user-ID"), "{err}");
    setuid.kill().unwrap();
    setuid.wait().unwrap();

    // Safety: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vramtrace_testkit::skip(
            "VRAMTRACE_REQUIRE_ROOT",
            "the user-boundary refusal needs root to start processes as two other users",
        );
        return;
    }
    let mut nobody = Command::new("sleep");
    nobody.arg("30");
    // Safety: only async-signal-safe calls between fork and exec.
    unsafe {
        nobody.pre_exec(|| {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut nobody = nobody.spawn().unwrap();
    let err = refused(nobody.id() as i32, Some(65533));
    assert!(
        err.contains("runs as user 65534 and vramtrace as user 65533"),
        "{err}"
    );
    nobody.kill().unwrap();
    nobody.wait().unwrap();
}

/// `vramtrace attach` killed (SIGKILL) at `point` (a step of attaching or detaching, or
/// `attached`: while recording): its watchdog puts the target back, which runs to its normal
/// end with the driver's bytes as they were.
fn killed_at(point: &str) {
    let t = Target::start(250, 10, true);
    let pid = t.pid();
    let before = driver_code(pid);
    let out = scratch(&format!("attach-killed-{point}")).join("trace");
    let mut cmd = Command::new(vramtrace());
    let duration = if point == "attached" { "60s" } else { "400ms" };
    cmd.args(["attach", &pid.to_string(), "--duration", duration, "--out"])
        .arg(&out)
        .arg("--preload")
        .arg(preload())
        .stderr(Stdio::piped());
    if point != "attached" {
        cmd.env("VRAMTRACE_ATTACH_TEST_KILL", point);
    }
    let mut child = cmd.spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut text = String::new();
    if point == "attached" {
        err.read_line(&mut text).unwrap();
        assert!(text.contains("attached to process"), "{text}");
        child.kill().unwrap();
    }
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "vramtrace was killed at {point}"
    );
    // The watchdog holds the pipe until it is done.
    std::io::Read::read_to_string(&mut err, &mut text).unwrap();
    assert!(
        text.contains(&format!(
            "watchdog: vramtrace ended while attached to process {pid}; the process is restored and running"
        )),
        "{point}: {text}"
    );
    assert_eq!(
        driver_code(pid),
        before,
        "{point}: every byte of the driver restored"
    );
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0), "{point}");
    assert_eq!(lines.last().map(String::as_str), Some("done"), "{point}");
}

#[test]
fn the_watchdog_restores_a_target_whose_vramtrace_was_killed_at_each_step() {
    for point in ["loaded", "started", "patched", "attached", "detaching"] {
        killed_at(point);
    }
}

#[test]
fn attach_to_python_records_its_lines_and_starts_the_probe_in_the_interpreter() {
    if !vramtrace_testkit::python3_or_skip() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/attach_loop.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).args(["200", "10"]);
    let t = Target::spawn(cmd);
    let pid = t.pid();
    let out = scratch("attach-python").join("trace");
    let o = attach(pid, &out, "700ms");
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("the Python probe scheduled"),
        "{}",
        describe(&o)
    );
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    assert_eq!(lines.last().map(String::as_str), Some("done"));
    let ev = events(&out);
    let (allocs, frees) = traced(&ev, pid as u64);
    assert_window(&printed(&lines, 0), &allocs, &frees);
    // The probe ran inside the interpreter, under the GIL: its mark is in the trace.
    let file = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "vtr"))
        .unwrap();
    let process = vramtrace::trace::Process::open(&file).unwrap();
    let marks: Vec<String> = process
        .items()
        .unwrap()
        .filter_map(|i| match i {
            vramtrace::trace::Item::Mark { name, .. } => process.string(name).map(str::to_string),
            _ => None,
        })
        .collect();
    assert_eq!(
        marks,
        vec![
            "vramtrace attach: Python probe started; PyTorch has not initialised CUDA here, so only the driver's allocations are recorded"
                .to_string()
        ]
    );
    // And the allocations carry the Python line that made them.
    let summary = Command::new(vramtrace())
        .arg("summary")
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&summary.stdout);
    let line = std::fs::read_to_string(&script)
        .unwrap()
        .lines()
        .position(|l| l.contains("assert alloc(ctypes.byref(p), size)"))
        .unwrap()
        + 1;
    assert!(
        text.contains(&format!("attach_loop.py:{line} allocate_kv_block")),
        "{text}"
    );
}

#[test]
fn live_attach_shows_the_view_and_detaches_on_quit() {
    if Command::new("script").arg("--version").output().is_err() {
        vramtrace_testkit::skip(
            "VRAMTRACE_REQUIRE_SCRIPT",
            "no `script` (util-linux) to give the live view a terminal",
        );
        return;
    }
    let t = Target::start(300, 10, false);
    let pid = t.pid();
    let before = driver_code(pid);
    let out = scratch("attach-live").join("trace");
    let line = format!(
        "{} live --attach {pid} {} --no-nvml",
        vramtrace().display(),
        out.display()
    );
    // The view quits on `q`, typed once it is up.
    let mut view = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("VRAMTRACE_PRELOAD", preload())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    std::io::Write::write_all(view.stdin.as_mut().unwrap(), b"q").unwrap();
    let o = view.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert!(
        text.contains(&format!("attached to process {pid}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("detached from process {pid}")),
        "{text}"
    );
    assert_eq!(driver_code(pid), before);
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    let ev = events(&out);
    let (allocs, frees) = traced(&ev, pid as u64);
    assert_window(&printed(&lines, 0), &allocs, &frees);
}

#[test]
fn attach_to_python_seeds_pytorchs_state_at_attach_marked_before_attach() {
    if !vramtrace_testkit::python3_or_skip() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/attach_loop.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).args(["160", "10", "torch"]);
    let t = Target::spawn(cmd);
    let pid = t.pid();
    let out = scratch("attach-seed").join("trace");
    // Long enough to see the segments freed half-way through the loop.
    let o = attach(pid, &out, "1200ms");
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    let segments: Vec<(u64, u64)> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("S "))
        .map(|l| {
            let f: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            (f[0], f[1])
        })
        .collect();
    assert_eq!(segments.len(), 2);
    let ev = events(&out);
    let ptr = |e: &serde_json::Value| {
        u64::from_str_radix(e["ptr"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
    };
    // Each segment seeded once, labelled, without a stack (nothing of now made it), first.
    let seeded: Vec<(u64, u64)> = ev
        .iter()
        .filter(|e| e["label"] == "before attach")
        .map(|e| {
            assert_eq!(e["kind"], "alloc");
            assert!(e.get("stack").is_none(), "a seed has no stack: {e}");
            (ptr(e), e["size"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(seeded, segments);
    assert!(lines.iter().any(|l| l == "freed segments"));
    // Their frees half-way pair with them: neither is live at the end. (The loop's own block
    // may be: the detach can fall between its allocation and its free, which a loaded machine
    // made happen in CI.)
    let freed: Vec<u64> = ev
        .iter()
        .filter(|e| e["kind"] == "free")
        .map(&ptr)
        .collect();
    for (p, _) in &segments {
        assert!(
            freed.contains(p),
            "the seeded segment {p:#x} is never freed"
        );
    }
    let summary = Command::new(vramtrace())
        .arg("summary")
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&summary.stdout);
    let live = live_at_end(&text);
    assert!(
        live < segments.iter().map(|&(_, n)| n).min().unwrap(),
        "{live} bytes live at the end: a seeded segment among them\n{text}"
    );
    // The live blocks as tensors whose operator is `before attach`, with PyTorch's sizes.
    let file = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "vtr"))
        .unwrap();
    let process = vramtrace::trace::Process::open(&file).unwrap();
    let mut blocks = Vec::new();
    let mut marks = Vec::new();
    for item in process.items().unwrap() {
        match item {
            vramtrace::trace::Item::Tensor(t) => {
                assert_eq!(process.string(t.op), Some("before attach"));
                assert_eq!(t.stack, 0, "a seeded block has no Python line");
                blocks.push((t.ptr, t.size, t.requested, t.segment));
            }
            vramtrace::trace::Item::Mark { name, .. } => {
                marks.push(process.string(name).unwrap().to_string())
            }
            _ => {}
        }
    }
    let expect: Vec<_> = segments
        .iter()
        .map(|&(a, n)| (a, n / 2, n / 2 - 100, a))
        .collect();
    assert_eq!(blocks, expect);
    assert_eq!(
        marks,
        vec!["before attach: device 0: driver free 1000 of 2000 bytes; PyTorch 2 segments, 2 live blocks".to_string()]
    );
}

#[test]
fn a_target_that_exits_while_attached_ends_the_recording_cleanly() {
    let t = Target::start(60, 10, false);
    let pid = t.pid();
    let out = scratch("attach-exits").join("trace");
    let started = Instant::now();
    let o = attach(pid, &out, "60s");
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "attach ends with the process"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "process {pid} exited while attached; its trace is complete up to its exit"
        )),
        "{err}"
    );
    assert!(!err.contains("watchdog:"), "{err}");
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    let program = printed(&lines, 0);
    let (allocs, _) = traced(&events(&out), pid as u64);
    let k = program.iter().position(|p| *p == allocs[0]).unwrap();
    assert!(k > 0);
    assert_eq!(&program[k..], allocs, "every allocation up to the exit");
}

#[test]
fn a_child_forked_while_attached_is_recorded_and_detached_too() {
    let t = Target::start_mode(150, 10, 2);
    let pid = t.pid();
    let out = scratch("attach-fork").join("trace");
    // Attached from about iteration 10 to well after the fork at 40; the child runs 150.
    let o = attach(pid, &out, "800ms");
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    assert_eq!(lines.last().map(String::as_str), Some("done"));
    assert!(
        lines.iter().any(|l| l == "child 0"),
        "the child ended normally"
    );
    let ev = events(&out);
    let mut pids: Vec<u64> = ev.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 2, "the parent and the child, each its own file");
    let child = *pids.iter().find(|&&p| p != pid as u64).unwrap();
    assert!(
        err.contains(&format!("detached from process {child} too")),
        "{err}"
    );
    let (a0, f0) = traced(&ev, pid as u64);
    assert_window(&printed(&lines, 0), &a0, &f0);
    // The child is recorded from its first allocation until the detach, not after.
    let child_ev: Vec<_> = ev
        .iter()
        .filter(|e| e["pid"].as_u64() == Some(child))
        .cloned()
        .collect();
    let (a9, _) = traced(&child_ev, child);
    let program = printed(&lines, 9);
    assert!(
        a9.len() >= 5 && a9.len() < program.len(),
        "{} of {}",
        a9.len(),
        program.len()
    );
    assert_eq!(&program[..a9.len()], a9);
}

#[test]
fn a_step_that_fails_is_undone_and_the_program_runs_on() {
    let t = Target::start(150, 10, true);
    let pid = t.pid();
    let before = driver_code(pid);
    let maps_before = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    // Anonymous executable mappings: the trampoline page is one.
    let anon_code = |maps: &str| -> Vec<String> {
        maps.lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("r-xp"))
            .filter(|l| l.split_whitespace().nth(5).is_none())
            .map(str::to_string)
            .collect()
    };
    // A shared library that is not the recorder: loading it works, finding the recorder in it
    // does not.
    let not_the_recorder = fake_driver_dir().join("libcuda.so.1");
    let out = scratch("attach-undone").join("trace");
    let o = Command::new(vramtrace())
        .args(["attach", &pid.to_string(), "--duration", "1s", "--out"])
        .arg(&out)
        .arg("--preload")
        .arg(&not_the_recorder)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("failed at loading the recorder (dlopen)")
            && err.contains("everything done before was undone"),
        "{err}"
    );
    assert!(!out.exists(), "no trace directory left behind");
    assert_eq!(driver_code(pid), before, "the driver untouched");
    let maps_after = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert_eq!(
        anon_code(&maps_after),
        anon_code(&maps_before),
        "the trampoline page is gone again"
    );
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    assert_eq!(lines.last().map(String::as_str), Some("done"));
}

/// The rows of the first categories breakdown in `summary --json`: (category, bytes, count,
/// the evidence lines as shown).
fn category_rows(out: &Path) -> Vec<(String, u64, u64, Vec<String>)> {
    let o = Command::new(vramtrace())
        .args(["summary", "--json"])
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    fn find(v: &serde_json::Value) -> Option<&serde_json::Value> {
        match v {
            serde_json::Value::Object(m) => {
                if m.get("rows").is_some_and(serde_json::Value::is_array) {
                    return Some(v);
                }
                m.values().find_map(find)
            }
            serde_json::Value::Array(a) => a.iter().find_map(find),
            _ => None,
        }
    }
    let b = find(&v).expect("a categories breakdown in the summary");
    b["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["category"].as_str().unwrap().to_string(),
                r["bytes"].as_u64().unwrap(),
                r["count"].as_u64().unwrap(),
                r["evidence"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["evidence"].to_string())
                    .collect(),
            )
        })
        .collect()
}

/// Attaches to tests/c/attach_torch.py on the stand-in torch at `torch_dir`, detaches, and
/// checks: the probe recorded while attached (natively, or through its callbacks) and nothing
/// after the detach; its callbacks are gone; the state at attach is named from the objects
/// holding it, each category with its exact bytes.
fn attach_to_torch_and_check(torch_dir: &Path, name: &str, native: bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("python3");
    cmd.arg(root.join("tests/c/attach_torch.py"))
        .args(["300", "10"])
        .env("PYTHONPATH", torch_dir);
    let t = Target::spawn(cmd);
    let pid = t.pid();
    let out = scratch(name).join("trace");
    let hooked_lib = if native { "libc10.so" } else { "libcuda.so" };
    let code_before = code_of(pid, hooked_lib);
    let o = attach(pid, &out, "1200ms");
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert!(
        code_of(pid, hooked_lib) == code_before,
        "{hooked_lib} restored byte for byte"
    );
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("the Python probe is off"), "{said}");
    // Through the callbacks, PyTorch's gpu-trace hook stays on; natively, nothing stays.
    assert_eq!(said.contains("gpu-trace hook"), !native, "{said}");
    assert_eq!(
        said.contains("native tensor capture is off"),
        native,
        "{said}"
    );
    assert!(!said.contains("left alone"), "{said}");
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    assert_eq!(lines.last().map(String::as_str), Some("done"));
    assert!(
        lines.iter().any(|l| l == "capture off (detached)"),
        "{lines:?}"
    );
    // The probe's callbacks are gone from PyTorch's registries (or were never there).
    assert!(lines.iter().any(|l| l == "callbacks 0 0"), "{lines:?}");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("attach.json")).unwrap()).unwrap();
    let at_detach = &record["python_probe_at_detach"];
    assert_eq!(at_detach["state"], "deactivated", "{record}");
    assert_eq!(at_detach["gpu_trace_stays_on"], !native, "{record}");
    assert_eq!(at_detach["callbacks_removed"], !native, "{record}");
    assert_eq!(at_detach["native_capture_turned_off"], native, "{record}");
    let hooked_report = record["hooked"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h == vramtrace_attach::C10_REPORT);
    assert_eq!(hooked_report, native, "{record}");
    let detached_at = record["detached_at_ns"].as_u64().unwrap();

    // Each loop allocation: (ptr, probing before it, after it).
    let loop_allocs: Vec<(u64, u64, u64)> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("T0 "))
        .map(|l| {
            let f: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            (f[1], f[3], f[4])
        })
        .collect();
    let first_on = loop_allocs
        .iter()
        .position(|a| a.1 == 1)
        .expect("the probe started");
    let off: Vec<u64> = loop_allocs[first_on..]
        .iter()
        .filter(|a| a.1 == 0)
        .map(|a| a.0)
        .collect();
    assert!(
        off.len() >= 20,
        "the program ran on after the detach: {}",
        off.len()
    );
    // Tensor records other than the seeded blocks: only while the probe was on, none after
    // the detach.
    let file = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "vtr"))
        .unwrap();
    let process = vramtrace::trace::Process::open(&file).unwrap();
    let mut recorded = Vec::new();
    for item in process.items().unwrap() {
        if let vramtrace::trace::Item::Tensor(t) = item
            && process.string(t.op) != Some("before attach")
        {
            assert!(
                t.t_ns < detached_at,
                "a tensor record after the detach: {t:?}"
            );
            recorded.push(t.ptr);
        }
    }
    let while_on: Vec<u64> = loop_allocs
        .iter()
        .filter(|a| a.2 == 1)
        .map(|a| a.0)
        .collect();
    assert!(
        recorded.len() >= 10,
        "recorded while attached: {recorded:?}"
    );
    for ptr in &recorded {
        // The probe's own check tensor (native capture) is not one of the program's.
        if !native {
            assert!(
                while_on.contains(ptr),
                "{ptr:#x} recorded without the probe's callbacks"
            );
        }
        assert!(
            !off.contains(ptr),
            "{ptr:#x} allocated after the detach is in the trace"
        );
    }

    // The state at attach, named from the objects holding it, with the blocks' exact bytes.
    let held: Vec<(String, u64, u64)> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("H "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].to_string(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect();
    let bytes_of = |prefix: &str| -> u64 {
        held.iter()
            .filter(|h| h.0.starts_with(prefix))
            .map(|h| h.2)
            .sum()
    };
    let rows = category_rows(&out);
    let row = |c: &str| rows.iter().find(|r| r.0 == c).cloned();
    let weights = row("weights").expect("a weights row");
    assert_eq!(
        (weights.1, weights.2),
        (bytes_of("weights:"), 4),
        "{rows:?}"
    );
    assert_eq!(weights.1, 5 * (1 << 20) + 4096);
    assert!(
        weights.3.iter().any(|e| e.contains("weights: embed")),
        "{rows:?}"
    );
    let kv = row("kv_cache").expect("a KV cache row");
    assert_eq!((kv.1, kv.2), (bytes_of("kv:"), 4), "{rows:?}");
    assert_eq!(kv.1, 8 << 20);
    assert!(
        kv.3.iter()
            .any(|e| e.contains("PagedAttentionCache.key_cache[0]")),
        "{rows:?}"
    );
    let engine = row("engine_buffers").expect("an engine buffers row");
    assert_eq!((engine.1, engine.2), (64 * 1024 + 8192, 2), "{rows:?}");
    // The scratch tensor no object holds an attribute of: unnamed, and why; with it the loop's
    // tensor of the moment, when the attach came while the loop held one (a module global).
    let unnamed = row("unnamed").expect("an unnamed row");
    let loop_block = |i: u64| (1000 + 512 * i).div_ceil(512) * 512;
    let extra = unnamed.1 - 512 * 1024;
    assert!(
        (unnamed.2 == 1 && extra == 0)
            || (unnamed.2 == 2 && (0..first_on as u64 + 1).any(|i| loop_block(i) == extra)),
        "{rows:?}"
    );
    assert!(
        unnamed.3.iter().any(|e| e.contains("before_attach")),
        "{rows:?}"
    );
    assert!(row("activations").is_none(), "{rows:?}");
    let text = String::from_utf8_lossy(
        &Command::new(vramtrace())
            .arg("summary")
            .arg(&out)
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(
        text.contains("allocated before the attach; no Python object names it"),
        "{text}"
    );
}

#[test]
fn attach_to_torch_names_the_state_at_attach_and_detach_turns_the_probe_off() {
    if !vramtrace_testkit::python3_or_skip() {
        return;
    }
    // The stand-in torch without a libc10: the probe records through its callbacks.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("probes/python/tests/fake_torch");
    attach_to_torch_and_check(&dir, "attach-torch", false);
}

/// A copy of the stand-in torch package with a stand-in `torch/lib/libc10.so` and
/// `libc10_cuda.so` (probes/python/tests/fake_c10*.cpp, as tests/torch_probe_cli.rs builds
/// them); `None` (after saying why) without a C++ compiler.
fn fake_torch_with_c10(name: &str) -> Option<std::path::PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("probes/python/tests");
    let copy = scratch(name).join("fake_torch");
    let status = Command::new("cp")
        .arg("-r")
        .arg(python.join("fake_torch"))
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
            .arg(python.join(src))
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

#[test]
fn attach_to_torch_hooks_its_report_in_place_and_captures_natively() {
    if !vramtrace_testkit::python3_or_skip() {
        return;
    }
    let Some(dir) = fake_torch_with_c10("attach-torch-native-lib") else {
        return;
    };
    attach_to_torch_and_check(&dir, "attach-torch-native", true);
}

#[test]
fn detach_says_when_the_interpreter_does_not_run_the_probes_deactivation_in_time() {
    if !vramtrace_testkit::python3_or_skip() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("python3");
    cmd.arg(root.join("tests/c/attach_torch.py"))
        .args(["60", "10", "8"])
        .env("PYTHONPATH", root.join("probes/python/tests/fake_torch"));
    let t = Target::spawn(cmd);
    let pid = t.pid();
    let out = scratch("attach-blocked").join("trace");
    let started = Instant::now();
    let o = Command::new(vramtrace())
        .args(["attach", &pid.to_string(), "--duration", "800ms", "--out"])
        .arg(&out)
        .arg("--preload")
        .arg(preload())
        .env("VRAMTRACE_DETACH_PYTHON_WAIT_MS", "300")
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains("the Python probe did not deactivate within 0.3 s"),
        "{said}"
    );
    // It said so instead of waiting for the interpreter (asleep 8 s from the probe's start).
    assert!(took < Duration::from_secs(7), "detach waited {took:?}");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("attach.json")).unwrap()).unwrap();
    assert_eq!(record["python_probe_at_detach"]["state"], "not run in time");
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    assert!(lines.iter().any(|l| l == "blocked"), "{lines:?}");
    // Once the interpreter ran again, the deactivation still scheduled ran.
    assert!(lines.iter().any(|l| l == "callbacks 0 0"), "{lines:?}");
}

/// The bytes the summary says are live at the end of the trace's first device (as "1.02 MiB
/// live at end").
fn live_at_end(summary: &str) -> u64 {
    let head = summary
        .split(" live at end")
        .next()
        .filter(|h| h.len() < summary.len())
        .unwrap_or_else(|| panic!("no \"live at end\" in the summary:\n{summary}"));
    let mut words = head.rsplit([' ', ',']).filter(|w| !w.is_empty());
    let (unit, value) = (words.next().unwrap(), words.next().unwrap());
    let scale = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => panic!("unit {unit:?} in the summary:\n{summary}"),
    };
    (value.parse::<f64>().unwrap() * scale) as u64
}

/// ggml's VMM pool (llama.cpp's per-op scratch, `ggml_cuda_pool_vmm`) reserved and grown while
/// attached, then torn down with one `cuMemUnmap` of the whole mapped range before the program
/// exits, still attached: the trace has every piece and balances to 0 B mapped and no addresses
/// reserved. On the H200 the same teardown under attach, of a real `llama-completion`, ended
/// with 95 mappings, 95 unmaps and 0 B mapped (samples/h200/llama-attach-teardown;
/// docs/validation.md, "The 27B on an emulated 3090, and attach's teardown").
#[test]
fn attach_balances_ggml_s_vmm_pool_torn_down_while_attached() {
    let t = Target::start_mode(70, 10, 3);
    let pid = t.pid();
    let out = scratch("attach-vmm").join("trace");
    let o = attach(pid, &out, "60s");
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let (code, lines) = t.finish();
    assert_eq!(code, Some(0));
    let pieces: Vec<u64> = lines
        .iter()
        .filter(|l| l.starts_with("V ") && !l.starts_with("V end"))
        .map(|l| l.split(' ').nth(4).unwrap().parse().unwrap())
        .collect();
    assert!(pieces.len() >= 20, "{lines:?}");
    let mapped: u64 = pieces.iter().sum();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("V end ") && l.ends_with(&format!(" {mapped}"))),
        "{lines:?}"
    );
    let ev = events(&out);
    let api = |name: &str| ev.iter().filter(|e| e["api"] == name).count();
    assert_eq!(api("cuMemAddressReserve"), 1);
    assert_eq!(api("cuMemCreate"), pieces.len());
    assert_eq!(api("cuMemMap"), pieces.len());
    assert_eq!(api("cuMemUnmap"), 1);
    assert_eq!(api("cuMemAddressFree"), 1);
    let s = Command::new(vramtrace())
        .arg("summary")
        .arg(&out)
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
    let pools: Vec<&serde_json::Value> = v["processes"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| d["other_pools"].as_array().unwrap())
        .collect();
    let pool = |name: &str| *pools.iter().find(|p| p["pool"] == name).unwrap();
    assert_eq!(pool("address")["allocations"], 1);
    assert_eq!(pool("address")["frees"], 1);
    assert_eq!(pool("address")["live_at_end"], 0);
    assert_eq!(pool("mapped")["allocations"], pieces.len());
    assert_eq!(pool("mapped")["frees"], pieces.len());
    assert_eq!(pool("mapped")["peak_bytes"], mapped);
    assert_eq!(pool("mapped")["live_at_end"], 0);
}
