//! The dynamic symbols of a shared object loaded in the target, read from its file (through
//! `/proc/PID/root`, so a process in another mount namespace is read as it sees itself).

use std::collections::HashMap;
use std::path::Path;

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::AttachError;

/// A loaded object's exported symbols, at their addresses in the target.
pub struct Symbols {
    by_name: HashMap<String, u64>,
}

impl Symbols {
    /// Reads the defined dynamic symbols of `file`, loaded with its file offset 0 at `base`.
    pub fn read(file: &Path, base: u64) -> Result<Symbols, AttachError> {
        let data = std::fs::read(file).map_err(|error| AttachError::ReadObject {
            path: file.to_path_buf(),
            error,
        })?;
        let elf = object::File::parse(&*data).map_err(|error| AttachError::NotElf {
            path: file.to_path_buf(),
            error,
        })?;
        // The bias: the object's first loadable segment (its lowest address) is at `base`.
        let first = elf
            .segments()
            .map(|s| s.address() & !0xfff)
            .min()
            .unwrap_or(0);
        let bias = base.wrapping_sub(first);
        let mut by_name = HashMap::new();
        for s in elf.dynamic_symbols() {
            if s.is_undefined() || s.address() == 0 {
                continue;
            }
            if let Ok(name) = s.name() {
                by_name
                    .entry(name.to_string())
                    .or_insert(s.address().wrapping_add(bias));
            }
        }
        Ok(Symbols { by_name })
    }

    /// The address of `name` in the target.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.by_name.get(name).copied()
    }

    /// Every name.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}
