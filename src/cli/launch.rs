//! Finding the preload library and running a program under it.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use anyhow::{Context, bail};
use vramtrace_models::units::fmt_bytes;

/// File name of the preload library.
pub const PRELOAD_FILE: &str = "libvramtrace_preload.so";

/// Recording options passed to the preload through its environment.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Capture native stacks.
    pub stacks: bool,
}

/// File name of the stand-in driver as cargo builds it (`testbed/fakecuda`).
pub const STAND_IN_FILE: &str = "libcuda.so";

/// Finds the preload: the explicit path if given, else next to the running binary (the same
/// `target/` directory after `cargo build`), `../lib/` beside it (an installed layout), or the
/// `vramtrace` package of the Python environment the binary was installed into from the wheel
/// (`../lib/pythonX.Y/site-packages/vramtrace/`). Whichever it is must be an ELF shared library
/// for this machine's architecture ([`check_elf`]): a preload the loader would skip records
/// nothing.
pub fn locate(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            check_elf(p)?;
            return std::path::absolute(p)
                .with_context(|| format!("cannot resolve {}", p.display()));
        }
        bail!(
            "the preload library {} does not exist (from --preload or VRAMTRACE_PRELOAD)",
            p.display()
        );
    }
    let found = match find_installed(PRELOAD_FILE) {
        Found::At(p) => p,
        Found::Damaged(missing) => bail!(
            "the vramtrace install is damaged: {} is missing (its Python package is there, the \
             preload is not). Reinstall it (`pip install --force-reinstall vramtrace`), or pass \
             --preload PATH or set VRAMTRACE_PRELOAD.",
            missing.display()
        ),
        Found::Nowhere(tried) => bail!(
            "cannot find {PRELOAD_FILE} (looked in {tried}). Build it with `cargo build --release --workspace` \
             (it lands next to the vramtrace binary), install the wheel (`pip install vramtrace`), \
             or pass --preload PATH or set VRAMTRACE_PRELOAD."
        ),
    };
    check_elf(&found)?;
    Ok(found)
}

/// Where [`find_installed`] found a file.
enum Found {
    At(PathBuf),
    /// The wheel's `vramtrace` package is installed but this file of it is missing.
    Damaged(PathBuf),
    /// Not found: the places looked in.
    Nowhere(String),
}

/// The preload as the wheel installs it: the `vramtrace` package beside the `vramtrace` script,
/// under `../lib*/python*/{site,dist}-packages/` of its `bin/` (a venv, a conda env, `--user`,
/// `--prefix`, a system prefix) or `../` (`pip install --target DIR` puts it in `DIR/bin/`),
/// after the cargo layouts ([`beside_binary`]).
fn find_installed(file: &str) -> Found {
    let tried = match beside_binary(file) {
        Ok(p) => return Found::At(p),
        Err(tried) => tried,
    };
    let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    else {
        return Found::Nowhere(tried);
    };
    let packages = wheel_package_dirs(&dir);
    for pkg in &packages {
        let cand = pkg.join(file);
        if cand.is_file() {
            return Found::At(cand.canonicalize().unwrap_or(cand));
        }
    }
    // The package is there (its __init__.py) but the library is not: name the file.
    if let Some(pkg) = packages.iter().find(|p| p.join("__init__.py").is_file()) {
        let pkg = pkg.canonicalize().unwrap_or_else(|_| pkg.clone());
        return Found::Damaged(pkg.join(file));
    }
    Found::Nowhere(format!(
        "{tried}, and no vramtrace Python package in {}/../lib*/python*/{{site,dist}}-packages",
        dir.display()
    ))
}

/// Candidate `vramtrace` package directories of a wheel install whose scripts are in `bin`.
fn wheel_package_dirs(bin: &Path) -> Vec<PathBuf> {
    let prefix = bin.join("..");
    let mut dirs = vec![prefix.join("vramtrace")];
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
            .map(|e| e.path())
            .collect();
        // Newest interpreter first when one prefix holds several.
        pythons.sort();
        pythons.reverse();
        for py in pythons {
            for site in ["site-packages", "dist-packages"] {
                dirs.push(py.join(site).join("vramtrace"));
            }
        }
    }
    dirs.retain(|d| d.is_dir());
    dirs
}

/// ELF `e_machine` of the architecture this binary was built for (the programs it runs are
/// expected to be the same), with its name.
const HOST_MACHINE: Option<(u16, &str)> = if cfg!(target_arch = "x86_64") {
    Some((62, "x86-64"))
} else if cfg!(target_arch = "aarch64") {
    Some((183, "aarch64"))
} else {
    None
};

/// Name of an ELF `e_machine` value, for messages.
fn machine_name(m: u16) -> String {
    match m {
        3 => "i386".into(),
        20 => "PowerPC".into(),
        21 => "PowerPC64".into(),
        40 => "32-bit ARM".into(),
        62 => "x86-64".into(),
        183 => "aarch64".into(),
        243 => "RISC-V".into(),
        m => format!("machine {m}"),
    }
}

/// Refuses a preload the dynamic loader would not load into this machine's programs: not an
/// ELF file, not a 64-bit little-endian shared object, or built for another architecture
/// (`e_machine`). The loader itself only prints a warning and runs the program unrecorded.
pub fn check_elf(path: &Path) -> anyhow::Result<()> {
    use std::io::Read;
    let mut head = [0u8; 20];
    let mut f = std::fs::File::open(path)
        .with_context(|| format!("cannot open the preload {}", path.display()))?;
    let n = f
        .read(&mut head)
        .with_context(|| format!("cannot read the preload {}", path.display()))?;
    let what = || format!("the preload {}", path.display());
    if n < head.len() || head[..4] != *b"\x7fELF" {
        bail!("{} is not an ELF shared library (no ELF header)", what());
    }
    if head[4] != 2 || head[5] != 1 {
        bail!(
            "{} is not a 64-bit little-endian ELF file (class {}, data {}): the loader cannot \
             preload it into 64-bit programs",
            what(),
            head[4],
            head[5]
        );
    }
    let e_type = u16::from_le_bytes([head[16], head[17]]);
    let machine = u16::from_le_bytes([head[18], head[19]]);
    if let Some((host, host_name)) = HOST_MACHINE
        && machine != host
    {
        bail!(
            "{} is built for {} (ELF e_machine {machine}), but this vramtrace runs {host_name} \
             programs (e_machine {host}): the loader would skip it and record nothing. Use the \
             preload built for {host_name}.",
            what(),
            machine_name(machine)
        );
    }
    if e_type != 3 {
        bail!(
            "{} is not a shared library (ELF type {e_type}, a shared object is 3)",
            what()
        );
    }
    Ok(())
}

/// A library shipped beside the `vramtrace` binary: in its directory (the `target/` directory
/// after `cargo build`), in `../lib/` (an installed layout) or one level up. The error lists
/// where it looked.
fn beside_binary(file: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("nowhere: no own path ({e})"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let mut tried = Vec::new();
    for cand in [
        dir.join(file),
        dir.join("../lib").join(file),
        dir.join("..").join(file),
    ] {
        if cand.is_file() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
        tried.push(cand.display().to_string());
    }
    Err(tried.join(", "))
}

/// Environment that makes a program load vramtrace's stand-in driver instead of a GPU's: a
/// `libcuda.so.1` that keeps host-side books and fails with real out-of-memory errors once
/// `capacity` bytes are in use (24 GiB when `None`). The link the loader follows is made in
/// `dir/.stand-in-driver`; an existing `LD_LIBRARY_PATH` stays searched after it.
pub fn stand_in_env(
    dir: &Path,
    capacity: Option<u64>,
) -> anyhow::Result<Vec<(OsString, OsString)>> {
    let lib = beside_binary(STAND_IN_FILE).map_err(|tried| {
        anyhow::anyhow!(
            "the stand-in driver {STAND_IN_FILE} is missing (looked in {tried}): build it with \
             `cargo build --release --workspace`"
        )
    })?;
    let lib_dir = dir.join(".stand-in-driver");
    std::fs::create_dir_all(&lib_dir)
        .with_context(|| format!("cannot create {}", lib_dir.display()))?;
    let link = lib_dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link)
        .with_context(|| format!("cannot link {} to {}", link.display(), lib.display()))?;
    let mut env = vec![(
        "LD_LIBRARY_PATH".into(),
        searched_first(&lib_dir, "LD_LIBRARY_PATH"),
    )];
    if let Some(bytes) = capacity {
        env.push(("VRAMTRACE_FAKE_CAPACITY".into(), bytes.to_string().into()));
        env.push((
            "VRAMTRACE_FAKE_NAME".into(),
            format!("stand-in {} card", fmt_bytes(bytes)).into(),
        ));
    }
    Ok(env)
}

/// The search path in the variable `var` with `dir` ahead of what it already holds.
pub fn searched_first(dir: &Path, var: &str) -> OsString {
    let mut path = dir.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        path.push(":");
        path.push(old);
    }
    path
}

/// `LD_PRELOAD` with the preload appended to whatever the caller already preloads.
pub fn ld_preload_value(existing: Option<&OsStr>, preload: &Path) -> OsString {
    let mut v = OsString::new();
    if let Some(e) = existing.filter(|e| !e.is_empty()) {
        v.push(e);
        v.push(":");
    }
    v.push(preload.as_os_str());
    v
}

/// `command` set up to run with the preload recording into `dir`, with extra environment `env`
/// (not started): the recorder appended to `LD_PRELOAD`, the trace directory, the stack option,
/// and the preload as NVTX's injection library unless the caller chose one.
pub fn traced_command(
    preload: &Path,
    dir: &Path,
    command: &[OsString],
    env: &[(OsString, OsString)],
    opts: Options,
) -> anyhow::Result<std::process::Command> {
    let Some((prog, args)) = command.split_first() else {
        bail!("no command given to run");
    };
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args);
    cmd.env(
        "LD_PRELOAD",
        ld_preload_value(std::env::var_os("LD_PRELOAD").as_deref(), preload),
    );
    cmd.env("VRAMTRACE_DIR", dir);
    cmd.env("VRAMTRACE_STACKS", if opts.stacks { "1" } else { "0" });
    if std::env::var_os("NVTX_INJECTION64_PATH").is_none() {
        cmd.env("NVTX_INJECTION64_PATH", preload);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    Ok(cmd)
}

/// Runs `command` with the preload recording into `dir` (see [`traced_command`]) and waits for
/// it. Interrupts (Ctrl-C) reach the program, not vramtrace, so the summary still prints after
/// it exits.
pub fn run_traced(
    preload: &Path,
    dir: &Path,
    command: &[OsString],
    env: &[(OsString, OsString)],
    opts: Options,
) -> anyhow::Result<ExitStatus> {
    let mut cmd = traced_command(preload, dir, command, env, opts)?;
    let prog = command[0].to_string_lossy();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {prog}"))?;
    let _guard = IgnoreInterrupts::start();
    child.wait().with_context(|| format!("waiting for {prog}"))
}

/// Ignores SIGINT and SIGQUIT while alive (as a shell does while it waits for a job), restoring
/// the previous dispositions on drop.
pub struct IgnoreInterrupts {
    old: [libc::sighandler_t; 2],
}

impl IgnoreInterrupts {
    /// Starts ignoring them.
    pub fn start() -> Self {
        // Safety: signal() with SIG_IGN is async-signal-safe and affects only this process; the
        // child was already spawned, so it keeps its default dispositions.
        let old = unsafe {
            [
                libc::signal(libc::SIGINT, libc::SIG_IGN),
                libc::signal(libc::SIGQUIT, libc::SIG_IGN),
            ]
        };
        IgnoreInterrupts { old }
    }
}

impl Drop for IgnoreInterrupts {
    fn drop(&mut self) {
        // Safety: restores the dispositions saved in new().
        unsafe {
            libc::signal(libc::SIGINT, self.old[0]);
            libc::signal(libc::SIGQUIT, self.old[1]);
        }
    }
}

/// The probe's `autostart` directory: `VRAMTRACE_PYTHON_PROBE`, else `python/autostart` beside
/// the preload (an install), else the source tree's `probes/python/autostart` (a build in
/// `target/<profile>/`).
pub fn torch_probe_dir(preload: &Path) -> Option<PathBuf> {
    let lib_dir = preload.parent()?;
    let candidates = [
        std::env::var_os("VRAMTRACE_PYTHON_PROBE").map(PathBuf::from),
        Some(lib_dir.join("python/autostart")),
        Some(lib_dir.join("../share/vramtrace/python/autostart")),
        Some(lib_dir.join("../../probes/python/autostart")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|d| d.join("sitecustomize.py").is_file())
        .and_then(|d| std::path::absolute(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF header: 64-bit little-endian, of type `e_type` for `machine`.
    fn elf_header(e_type: u16, machine: u16) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[6] = 1;
        h[16..18].copy_from_slice(&e_type.to_le_bytes());
        h[18..20].copy_from_slice(&machine.to_le_bytes());
        h
    }

    #[test]
    fn refuses_a_preload_of_another_architecture() {
        let dir = std::env::temp_dir().join(format!("vramtrace-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (host, _) = HOST_MACHINE.unwrap();
        let other = if host == 62 { 183 } else { 62 };
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let ok = write("ok.so", &elf_header(3, host));
        check_elf(&ok).unwrap();
        let foreign = write("foreign.so", &elf_header(3, other));
        let e = format!("{:#}", locate(Some(&foreign)).unwrap_err());
        assert!(e.contains(&format!("e_machine {other}")), "{e}");
        assert!(e.contains("is built for"), "{e}");
        let text = write("text.so", b"not a library at all, just some text");
        let e = format!("{:#}", check_elf(&text).unwrap_err());
        assert!(e.contains("not an ELF shared library"), "{e}");
        let exec = write("exec", &elf_header(2, host));
        let e = format!("{:#}", check_elf(&exec).unwrap_err());
        assert!(e.contains("not a shared library"), "{e}");
        let mut h32 = elf_header(3, host);
        h32[4] = 1;
        let e = format!("{:#}", check_elf(&write("32.so", &h32)).unwrap_err());
        assert!(e.contains("not a 64-bit"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn appends_to_existing_preload() {
        let p = Path::new("/x/libvramtrace_preload.so");
        assert_eq!(ld_preload_value(None, p), "/x/libvramtrace_preload.so");
        assert_eq!(
            ld_preload_value(Some("".as_ref()), p),
            "/x/libvramtrace_preload.so"
        );
        assert_eq!(
            ld_preload_value(Some("/a.so".as_ref()), p),
            "/a.so:/x/libvramtrace_preload.so"
        );
    }
}
