//! `--dump DIR`: every input, intermediate and output of a run as raw
//! little-endian files plus `manifest.json`, so other programs (the fla / torch
//! comparison script) can load the identical bytes.

use std::fs;
use std::path::Path;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::tensor::Captured;
#[cfg(test)]
use crate::tensor::TensorSpec;

/// What a dumped tensor is to the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Made by the caller before the call.
    Input,
    /// Made and freed inside the call.
    Intermediate,
    /// Returned by the call.
    Output,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Input => "input",
            Role::Intermediate => "intermediate",
            Role::Output => "output",
        }
    }
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source: e,
    }
}

/// Write `captured` into `dir` (created if needed): `<name>.bin` per tensor and
/// `manifest.json` with the kernel, the config, and per tensor its name, role,
/// dtype, shape, bytes and file.
pub fn write(
    dir: &Path,
    kernel: &str,
    config: &Value,
    captured: &Captured,
    role: impl Fn(&str) -> Role,
) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let mut entries = Vec::new();
    for (name, (spec, bytes)) in captured {
        let file = format!("{name}.bin");
        let path = dir.join(&file);
        fs::write(&path, bytes).map_err(|e| io(&path, e))?;
        entries.push(json!({
            "name": name,
            "role": role(name).name(),
            "dtype": spec.dtype.name(),
            "shape": spec.shape,
            "bytes": bytes.len(),
            "file": file,
        }));
    }
    let manifest = json!({
        "kernel": kernel,
        "config": config,
        "byte_order": "little",
        "tensors": entries,
    });
    let path = dir.join("manifest.json");
    let text = serde_json::to_string_pretty(&manifest).unwrap_or_default();
    fs::write(&path, text + "\n").map_err(|e| io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn writes_files_and_manifest() {
        let dir = std::env::temp_dir().join(format!("vt-dump-test-{}", std::process::id()));
        let mut cap = Captured::new();
        cap.insert(
            "o".to_string(),
            (TensorSpec::new("o", DType::BF16, &[2, 1]), vec![1, 2, 3, 4]),
        );
        write(&dir, "gdn", &json!({"heads": 1}), &cap, |_| Role::Output).unwrap();
        assert_eq!(fs::read(dir.join("o.bin")).unwrap(), vec![1, 2, 3, 4]);
        let m: Value =
            serde_json::from_str(&fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(m["tensors"][0]["shape"], json!([2, 1]));
        assert_eq!(m["tensors"][0]["role"], "output");
        assert_eq!(m["config"]["heads"], 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
