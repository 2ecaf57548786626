//! Element types of the tensors the models predict.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// The element type of a predicted tensor.
///
/// Only whole-byte types appear here: sub-byte weight formats (int4) are described by
/// [`crate::WeightFormat`], whose packing is not a per-element size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum DType {
    /// IEEE single precision, 4 bytes.
    #[serde(rename = "float32")]
    F32,
    /// IEEE half precision, 2 bytes.
    #[serde(rename = "float16")]
    F16,
    /// bfloat16, 2 bytes.
    #[serde(rename = "bfloat16")]
    BF16,
    /// 8-bit float (e4m3 or e5m2), 1 byte.
    #[serde(rename = "float8")]
    F8,
    /// 64-bit signed integer (index tensors), 8 bytes.
    #[serde(rename = "int64")]
    I64,
    /// 32-bit signed integer, 4 bytes.
    #[serde(rename = "int32")]
    I32,
    /// 64-bit unsigned integer (FlashAttention's RNG state), 8 bytes.
    #[serde(rename = "uint64")]
    U64,
    /// A boolean (masks), 1 byte.
    #[serde(rename = "bool")]
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8 | DType::Bool => 1,
            DType::I64 | DType::U64 => 8,
        }
    }

    /// The name PyTorch prints for this type (`torch.bfloat16` without the prefix).
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F8 => "float8",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::U64 => "uint64",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}

impl FromStr for DType {
    type Err = String;

    /// Accepts the spellings found in `config.json` files and on command lines.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().trim_start_matches("torch.").to_ascii_lowercase();
        Ok(match t.as_str() {
            "float32" | "fp32" | "f32" | "float" => DType::F32,
            "float16" | "fp16" | "f16" | "half" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "float8" | "fp8" | "f8" | "float8_e4m3fn" | "fp8_e4m3" | "float8_e5m2" | "fp8_e5m2" => {
                DType::F8
            }
            "int64" | "i64" | "long" => DType::I64,
            "int32" | "i32" | "int" => DType::I32,
            "uint64" | "u64" => DType::U64,
            "bool" => DType::Bool,
            _ => {
                return Err(format!(
                    "{s:?} is not a dtype this tool knows; use bfloat16, float16, float32 or fp8"
                ));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        assert_eq!(DType::BF16.size_bytes(), 2);
        assert_eq!(DType::F32.size_bytes(), 4);
        assert_eq!(DType::F8.size_bytes(), 1);
        assert_eq!("torch.bfloat16".parse::<DType>(), Ok(DType::BF16));
        assert_eq!("fp8_e5m2".parse::<DType>(), Ok(DType::F8));
        assert!("int3".parse::<DType>().is_err());
    }
}
