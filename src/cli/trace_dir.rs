//! Trace directories of the commands that record (`run`, `demo`, `attach`): one given with
//! `--out`, created empty or refused, or a fresh one named after the program and the time.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// Uses `dir` as the trace directory: created if absent, refused if it holds anything.
pub fn prepare_out_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    if dir.exists() {
        if !dir.is_dir() {
            bail!("{} exists and is not a directory", dir.display());
        }
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty; vramtrace never overwrites a trace. Choose another --out or remove it.",
                dir.display()
            );
        }
    } else {
        // 0700, as the recorder makes it: traces hold command lines, paths and stacks.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::path::absolute(dir).with_context(|| format!("cannot resolve {}", dir.display()))
}

/// Creates a fresh directory named after the program and the time; never reuses one.
pub fn new_out_dir(cmd: &std::ffi::OsStr) -> anyhow::Result<PathBuf> {
    let prog: String = Path::new(cmd)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "program".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let stamp = utc_stamp(std::time::SystemTime::now());
    for n in 0..1000 {
        let name = if n == 0 {
            format!("vramtrace-{prog}-{stamp}")
        } else {
            format!("vramtrace-{prog}-{stamp}-{n}")
        };
        let p = PathBuf::from(&name);
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => {
                return std::path::absolute(&p).with_context(|| format!("cannot resolve {name}"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot create {name} in the current directory"));
            }
        }
    }
    bail!("could not find a free directory name for the trace; pass --out")
}

/// `YYYYmmdd-HHMMSS` in UTC (the epoch for a clock set before it).
fn utc_stamp(t: std::time::SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .strftime("%Y%m%d-%H%M%S")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_941_234);
        assert_eq!(utc_stamp(t), "20261129-083354");
        assert_eq!(utc_stamp(std::time::UNIX_EPOCH), "19700101-000000");
    }
}
