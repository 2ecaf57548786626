//! A GGUF file's header: its metadata and its tensor list, read without the tensor data (what
//! llama.cpp's memory depends on is in the header: the architecture's sizes and every tensor's
//! type and shape). The layout is ggml's (`ggml/include/gguf.h`, llama.cpp as vendored in
//! llama-cpp-python 0.3.36): the magic `GGUF`, a version (2 or 3), the tensor and key-value
//! counts, the key-value pairs (a length-prefixed key, a type, the value; arrays with their
//! element type and count), then per tensor its name, its dimension count and dimensions (the
//! innermost first), its type and its data offset. Every integer is little-endian.
//!
//! A tensor's bytes follow ggml's type traits (`ggml/src/ggml.c` `type_traits`, line 632): rows
//! of `ne0` elements stored in blocks of `blck_size` elements of `type_size` bytes.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::ModelError;

/// Caps on what a header may declare, far above any model's: a corrupt count is refused
/// before it is allocated for.
const MAX_ITEMS: u64 = 1 << 24;
const MAX_STRING: u64 = 1 << 26;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Arrays longer than this keep their length only (a vocabulary's tokens and scores).
const KEPT_ARRAY: u64 = 4096;

/// A metadata value, as much of it as the models use.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// Any integer type.
    Int(i128),
    /// `float32` or `float64`.
    Float(f64),
    /// `bool`.
    Bool(bool),
    /// `string`.
    Str(String),
    /// An array: its length, and its items when it has at most 4,096.
    Array {
        /// The number of items.
        len: u64,
        /// The items, when kept.
        items: Option<Vec<GgufValue>>,
    },
}

/// One tensor of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its dimensions, the innermost (`ne0`) first.
    pub dims: Vec<u64>,
    /// Its ggml type id (`ggml_type`).
    pub ggml_type: u32,
    /// Its bytes, by ggml's type traits.
    pub bytes: u64,
}

/// The header of a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufHeader {
    /// The file it was read from.
    pub path: PathBuf,
    /// The format version.
    pub version: u32,
    /// The key-value metadata.
    pub metadata: BTreeMap<String, GgufValue>,
    /// The tensors, in file order.
    pub tensors: Vec<GgufTensor>,
}

/// ggml's type traits (`ggml/src/ggml.c` `type_traits`): (name, elements per block, bytes per
/// block) by type id; `None` for ids ggml removed or never had.
pub fn ggml_type(id: u32) -> Option<(&'static str, u64, u64)> {
    Some(match id {
        0 => ("f32", 1, 4),
        1 => ("f16", 1, 2),
        2 => ("q4_0", 32, 18),
        3 => ("q4_1", 32, 20),
        6 => ("q5_0", 32, 22),
        7 => ("q5_1", 32, 24),
        8 => ("q8_0", 32, 34),
        9 => ("q8_1", 32, 36),
        10 => ("q2_K", 256, 84),
        11 => ("q3_K", 256, 110),
        12 => ("q4_K", 256, 144),
        13 => ("q5_K", 256, 176),
        14 => ("q6_K", 256, 210),
        15 => ("q8_K", 256, 292),
        16 => ("iq2_xxs", 256, 66),
        17 => ("iq2_xs", 256, 74),
        18 => ("iq3_xxs", 256, 98),
        19 => ("iq1_s", 256, 50),
        20 => ("iq4_nl", 32, 18),
        21 => ("iq3_s", 256, 110),
        22 => ("iq2_s", 256, 82),
        23 => ("iq4_xs", 256, 136),
        24 => ("i8", 1, 1),
        25 => ("i16", 1, 2),
        26 => ("i32", 1, 4),
        27 => ("i64", 1, 8),
        28 => ("f64", 1, 8),
        29 => ("iq1_m", 256, 56),
        30 => ("bf16", 1, 2),
        34 => ("tq1_0", 256, 54),
        35 => ("tq2_0", 256, 66),
        39 => ("mxfp4", 32, 17),
        40 => ("nvfp4", 64, 36),
        41 => ("q1_0", 128, 18),
        42 => ("q2_0", 64, 18),
        _ => return None,
    })
}

/// The type id of a ggml type name (`f16`, `q4_0`, `q8_0`), as llama.cpp's `--cache-type-k`
/// takes it (case-insensitive).
pub fn ggml_type_by_name(name: &str) -> Option<u32> {
    (0..64).find(|&id| ggml_type(id).is_some_and(|(n, ..)| n.eq_ignore_ascii_case(name)))
}

/// `ggml_row_size`: the bytes of `n` elements of type `id` (a whole number of blocks).
pub fn row_size(id: u32, n: u64) -> Option<u64> {
    let (_, blck, size) = ggml_type(id)?;
    n.is_multiple_of(blck).then(|| n / blck * size)
}

struct Cursor<R: Read> {
    r: R,
    path: PathBuf,
}

impl<R: Read> Cursor<R> {
    fn bad(&self, why: impl Into<String>) -> ModelError {
        ModelError::Invalid(format!(
            "{} is not a GGUF file llama.cpp reads: {}",
            self.path.display(),
            why.into()
        ))
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], ModelError> {
        let mut b = [0u8; N];
        self.r
            .read_exact(&mut b)
            .map_err(|e| self.bad(format!("it ends inside its header ({e})")))?;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn count(&mut self, what: &str) -> Result<u64, ModelError> {
        let n = self.u64()?;
        if n > MAX_ITEMS {
            return Err(self.bad(format!("it declares {n} {what}")));
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, ModelError> {
        let n = self.u64()?;
        if n > MAX_STRING {
            return Err(self.bad(format!("a string of {n} bytes")));
        }
        let mut b = vec![0u8; n as usize];
        self.r
            .read_exact(&mut b)
            .map_err(|e| self.bad(format!("it ends inside a string ({e})")))?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    /// A value of `gguf_type` `t` (`ggml/include/gguf.h` `enum gguf_type`).
    fn value(&mut self, t: u32, depth: u32) -> Result<GgufValue, ModelError> {
        Ok(match t {
            0 => GgufValue::Int(i128::from(self.bytes::<1>()?[0])),
            1 => GgufValue::Int(i128::from(self.bytes::<1>()?[0] as i8)),
            2 => GgufValue::Int(i128::from(u16::from_le_bytes(self.bytes()?))),
            3 => GgufValue::Int(i128::from(i16::from_le_bytes(self.bytes()?))),
            4 => GgufValue::Int(i128::from(self.u32()?)),
            5 => GgufValue::Int(i128::from(i32::from_le_bytes(self.bytes()?))),
            6 => GgufValue::Float(f64::from(f32::from_le_bytes(self.bytes()?))),
            7 => GgufValue::Bool(self.bytes::<1>()?[0] != 0),
            8 => GgufValue::Str(self.string()?),
            9 if depth == 0 => {
                let item = self.u32()?;
                let len = self.count("array items")?;
                let mut items = Vec::new();
                for _ in 0..len {
                    items.push(self.value(item, depth + 1)?);
                }
                GgufValue::Array {
                    len,
                    items: (len <= KEPT_ARRAY).then_some(items),
                }
            }
            10 => GgufValue::Int(i128::from(self.u64()?)),
            11 => GgufValue::Int(i128::from(i64::from_le_bytes(self.bytes()?))),
            12 => GgufValue::Float(f64::from_le_bytes(self.bytes()?)),
            _ => return Err(self.bad(format!("a value of unknown type {t}"))),
        })
    }
}

impl GgufHeader {
    /// Reads the header of the GGUF file at `path` (only the header: a model of any size reads
    /// in the time its metadata takes).
    pub fn read(path: &Path) -> Result<GgufHeader, ModelError> {
        let f = std::fs::File::open(path).map_err(|source| ModelError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_reader(std::io::BufReader::new(f), path)
    }

    /// Reads a header from `r`, naming `path` in errors.
    pub fn from_reader(r: impl Read, path: &Path) -> Result<GgufHeader, ModelError> {
        let mut c = Cursor {
            r,
            path: path.to_path_buf(),
        };
        if &c.bytes::<4>()? != b"GGUF" {
            return Err(c.bad("it does not start with GGUF"));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(c.bad(format!("version {version} (2 and 3 are read)")));
        }
        let n_tensors = c.count("tensors")?;
        let n_kv = c.count("key-value pairs")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let t = c.u32()?;
            let v = c.value(t, 0)?;
            metadata.insert(key, v);
        }
        let mut tensors = Vec::new();
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.bad(format!("tensor {name} has {n_dims} dimensions")));
            }
            let mut dims = Vec::new();
            for _ in 0..n_dims {
                dims.push(c.u64()?);
            }
            let ggml_type = c.u32()?;
            let _offset = c.u64()?;
            let elements = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .filter(|&n| n <= crate::MAX_BYTES)
                .ok_or_else(|| c.bad(format!("tensor {name} has too many elements")))?;
            let bytes = row_size(ggml_type, dims[0])
                .map(|row| row.saturating_mul(elements / dims[0].max(1)))
                .ok_or_else(|| {
                    c.bad(format!(
                        "tensor {name} has type {ggml_type}, which ggml does not have, or rows of {} elements, not whole blocks",
                        dims[0]
                    ))
                })?;
            tensors.push(GgufTensor {
                name,
                dims,
                ggml_type,
                bytes,
            });
        }
        Ok(GgufHeader {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
        })
    }

    /// `general.architecture` (`llama`, `qwen3next`).
    pub fn architecture(&self) -> Option<&str> {
        match self.metadata.get("general.architecture") {
            Some(GgufValue::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// An integer of the architecture's keys (`{arch}.block_count`).
    pub fn arch_int(&self, key: &str) -> Option<u64> {
        let arch = self.architecture()?;
        match self.metadata.get(&format!("{arch}.{key}")) {
            Some(GgufValue::Int(v)) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    /// A required integer of the architecture's keys, or an error naming it.
    pub fn require(&self, key: &str) -> Result<u64, ModelError> {
        self.arch_int(key).ok_or_else(|| {
            ModelError::Invalid(format!(
                "{} has no `{}.{key}`: llama.cpp needs it for this architecture",
                self.path.display(),
                self.architecture().unwrap_or("?")
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    /// A header as ggml writes one: two keys, an array, two tensors.
    fn header() -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        string(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        string(&mut b, "llama");
        string(&mut b, "llama.block_count");
        b.extend(4u32.to_le_bytes());
        b.extend(16u32.to_le_bytes());
        string(&mut b, "tokenizer.ggml.scores");
        b.extend(9u32.to_le_bytes());
        b.extend(6u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(0.5f32.to_le_bytes());
        b.extend(1.5f32.to_le_bytes());
        for (name, dims, t) in [
            ("blk.0.attn_q.weight", [2048u64, 2048], 12u32),
            ("blk.0.ffn_down.weight", [8192, 2048], 14),
        ] {
            string(&mut b, name);
            b.extend(2u32.to_le_bytes());
            for d in dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.to_le_bytes());
            b.extend(0u64.to_le_bytes());
        }
        b
    }

    #[test]
    fn a_header_reads_its_keys_and_each_tensor_s_bytes() {
        let h = GgufHeader::from_reader(&header()[..], Path::new("t.gguf")).unwrap();
        assert_eq!(h.architecture(), Some("llama"));
        assert_eq!(h.arch_int("block_count"), Some(16));
        assert_eq!(
            h.metadata["tokenizer.ggml.scores"],
            GgufValue::Array {
                len: 2,
                items: Some(vec![GgufValue::Float(0.5), GgufValue::Float(1.5)])
            }
        );
        // Q4_K: 2048 × 2048 / 256 blocks of 144 B; Q6_K: rows of 8192 in 32 blocks of 210 B.
        assert_eq!(h.tensors[0].bytes, 2048 * 2048 / 256 * 144);
        assert_eq!(h.tensors[1].bytes, 2048 * 8192 / 256 * 210);
        assert_eq!(ggml_type_by_name("Q4_0"), Some(2));
        assert_eq!(row_size(2, 512), Some(288));
    }

    #[test]
    fn a_damaged_header_is_refused_with_the_reason() {
        let mut b = header();
        b.truncate(b.len() - 5);
        let e = GgufHeader::from_reader(&b[..], Path::new("t.gguf")).unwrap_err();
        assert!(e.to_string().contains("ends inside its header"), "{e}");
        let e = GgufHeader::from_reader(&b"GGML...."[..], Path::new("t.gguf")).unwrap_err();
        assert!(e.to_string().contains("does not start with GGUF"), "{e}");
        let mut huge = b"GGUF".to_vec();
        huge.extend(3u32.to_le_bytes());
        huge.extend(u64::MAX.to_le_bytes());
        let e = GgufHeader::from_reader(&huge[..], Path::new("t.gguf")).unwrap_err();
        assert!(e.to_string().contains("declares"), "{e}");
    }
}
