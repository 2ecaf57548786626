//! The versions block of a bug report, gathered by `vramtrace run` before the program starts
//! and written as [`VERSIONS_FILE`] into the trace directory; `vramtrace report` reads it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The file `vramtrace run` writes into the trace directory at start: the versions a bug report
/// needs (`vramtrace report` shows it as its versions block).
pub const VERSIONS_FILE: &str = "versions.json";

/// The Python packages whose versions the report states, by distribution name.
const PACKAGES: [(&str, &str); 6] = [
    ("torch", "torch"),
    ("triton", "triton"),
    ("fla", "flash-linear-attention"),
    ("vllm", "vllm"),
    ("transformers", "transformers"),
    ("flash_attn", "flash-attn"),
];

/// How long the interpreter may take to list its packages before it is left out.
const VERSIONS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Gathers the versions block before the program starts and writes it as [`VERSIONS_FILE`]:
/// the command line, `PYTORCH_CUDA_ALLOC_CONF`, the NVIDIA driver (`/proc/driver/nvidia/version`),
/// and, when the program is a Python program (its interpreter named on the command line or in
/// its script's `#!` line), that interpreter's versions of torch (and the CUDA it was built
/// with), triton, fla, vLLM, transformers and flash-attn, read from the installed
/// distributions' metadata without importing them. A failure is a warning: the trace is what
/// matters.
pub fn write(out: &Path, command: &[OsString], env: &[(OsString, OsString)]) {
    let mut v = serde_json::Map::new();
    let cmdline: Vec<String> = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    v.insert("command".into(), cmdline.join(" ").into());
    let alloc_conf = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PYTORCH_CUDA_ALLOC_CONF")
        .map(|(_, v)| v.to_string_lossy().into_owned())
        .or_else(|| std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok());
    v.insert(
        "PYTORCH_CUDA_ALLOC_CONF".into(),
        alloc_conf.unwrap_or_else(|| "(unset)".into()).into(),
    );
    let driver = std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|t| {
            t.lines()
                .next()
                .and_then(|l| {
                    l.split_whitespace().find(|w| {
                        w.chars().filter(|c| *c == '.').count() >= 1
                            && w.chars().all(|c| c.is_ascii_digit() || c == '.')
                    })
                })
                .map(str::to_string)
        });
    v.insert(
        "driver".into(),
        driver.map_or(serde_json::Value::Null, Into::into),
    );
    if let Some(python) = python_of(command) {
        v.insert(
            "python".into(),
            python.to_string_lossy().into_owned().into(),
        );
        match python_versions(&python) {
            Ok(found) => v.extend(found),
            Err(e) => {
                eprintln!("vramtrace: warning: the Python packages' versions were not read: {e:#}")
            }
        }
    }
    let path = out.join(VERSIONS_FILE);
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(v)).unwrap_or_default();
    if let Err(e) = std::fs::write(&path, text + "\n") {
        eprintln!(
            "vramtrace: warning: cannot write {}: {e}; the report will have no versions block",
            path.display()
        );
    }
}

/// The Python interpreter a command runs: the command itself when it is one (`python3`,
/// `python3.12`), else the interpreter of its script's `#!` line (`vllm`, `transformers`).
fn python_of(command: &[OsString]) -> Option<PathBuf> {
    let first = Path::new(command.first()?);
    let is_python = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("python"))
    };
    if is_python(first) {
        return Some(first.to_path_buf());
    }
    let file = if first.components().count() > 1 {
        first.to_path_buf()
    } else {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|d| d.join(first))
            .find(|p| p.is_file())?
    };
    let mut head = [0u8; 256];
    let n = std::io::Read::read(&mut std::fs::File::open(&file).ok()?, &mut head).ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?.lines().next()?;
    let interp = line.strip_prefix("#!")?.trim();
    let mut words = interp.split_whitespace();
    let prog = Path::new(words.next()?);
    if is_python(prog) {
        Some(prog.to_path_buf())
    } else if prog.ends_with("env") {
        words.find(|w| is_python(Path::new(w))).map(PathBuf::from)
    } else {
        None
    }
}

/// The versions of [`PACKAGES`] in `python`'s environment and the CUDA torch was built with,
/// from the distributions' metadata (no package is imported, so CUDA is not initialised).
fn python_versions(python: &Path) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let names: Vec<String> = PACKAGES
        .iter()
        .map(|(k, d)| format!("({k:?}, {d:?})"))
        .collect();
    let script = format!(
        "import json, re, importlib.metadata as m\n\
         out = {{}}\n\
         for key, dist in [{}]:\n\
         \x20   try: out[key] = m.version(dist)\n\
         \x20   except Exception: out[key] = None\n\
         try:\n\
         \x20   t = m.distribution('torch').locate_file('torch/version.py').read_text()\n\
         \x20   c = re.search(r\"^cuda\\s*(?::[^=]*)?=\\s*'([^']*)'\", t, re.M)\n\
         \x20   out['cuda'] = c.group(1) if c else None\n\
         except Exception: out['cuda'] = None\n\
         print(json.dumps(out))\n",
        names.join(", ")
    );
    let mut child = std::process::Command::new(python)
        .args(["-I", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", python.display()))?;
    let start = std::time::Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if start.elapsed() > VERSIONS_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{} took more than {} s to list its packages",
                python.display(),
                VERSIONS_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut child
            .stdout
            .take()
            .context("no output from the interpreter")?,
        &mut text,
    )?;
    match serde_json::from_str(text.trim()) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        _ => bail!(
            "{} did not print the versions (its output: {:?})",
            python.display(),
            text.trim()
        ),
    }
}
