//! Element types of the tensors the workload allocates, and the host-side
//! conversions (the `half` crate's, round to nearest even) that let the CPU
//! references round exactly where the kernels do.
//!
//! The sizes and the bridge to `vramtrace_models::DType` live here too: the
//! models' type has no `u8` and one fp8 for both e4m3 and e5m2, so the
//! workload keeps its own enum for what it stores and converts at the one
//! place it meets the models (`prefill`'s plan).

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use vramtrace_models::DType as ModelDType;

/// The element type of a device tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// bfloat16: 8-bit exponent, 7-bit mantissa.
    BF16,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
    /// 32-bit signed integer (FlashAttention's `cu_seqlens`).
    I32,
    /// 64-bit signed integer (fla's `cu_seqlens`, `chunk_indices`, `chunk_offsets`).
    I64,
    /// 64-bit unsigned integer (PyTorch's FlashAttention `rng_state`).
    U64,
    /// Bytes with no element type (`prefill`'s packed weight stand-ins, the
    /// capacity ballast).
    U8,
    /// 8-bit float e4m3 (vLLM's `--kv-cache-dtype fp8`); storage only, no
    /// kernel computes in it.
    F8E4M3,
}

impl DType {
    /// Bytes per element: the models' size of the same type, 1 for `U8`.
    pub fn size(self) -> usize {
        ModelDType::try_from(self).map_or(1, |m| m.size_bytes() as usize)
    }

    /// The short name used in tables, JSON, annotations and dump manifests.
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::U8 => "u8",
            DType::F8E4M3 => "fp8_e4m3",
        }
    }

    /// Whether this is a floating-point type the kernels can compute in.
    pub fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }

    /// Round an `f32` to the nearest value representable in this type (ties to
    /// even), returned as `f32`. Identity for `F32`; integer types are not
    /// rounded here.
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::BF16 => bf16::from_f32(x).to_f32(),
            DType::F16 => f16::from_f32(x).to_f32(),
            _ => x,
        }
    }

    /// Encode values (already representable, see [`DType::round`]) as the
    /// little-endian bytes the device expects.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(values.len() * self.size());
        match self {
            DType::BF16 => values
                .iter()
                .for_each(|&x| out.extend_from_slice(&bf16::from_f32(x).to_le_bytes())),
            DType::F16 => values
                .iter()
                .for_each(|&x| out.extend_from_slice(&f16::from_f32(x).to_le_bytes())),
            DType::F32 => values
                .iter()
                .for_each(|&x| out.extend_from_slice(&x.to_le_bytes())),
            DType::I32 | DType::I64 | DType::U64 | DType::U8 | DType::F8E4M3 => {
                unreachable!("integer and fp8 tensors are not encoded from f32 values")
            }
        }
        out
    }

    /// Decode little-endian device bytes of a float type into `f32`.
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            DType::BF16 => bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::I32 | DType::I64 | DType::U64 | DType::U8 | DType::F8E4M3 => {
                unreachable!("integer and fp8 tensors are not decoded as floats")
            }
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(DType::BF16),
            "f16" | "fp16" | "float16" | "half" => Ok(DType::F16),
            "f32" | "fp32" | "float32" | "float" => Ok(DType::F32),
            other => Err(format!(
                "unknown dtype `{other}`: expected bf16, f16 or f32"
            )),
        }
    }
}

/// Little-endian bytes of 32-bit integers.
pub fn encode_i32(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian bytes of 64-bit integers.
pub fn encode_i64(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The models' fp8 is read as e4m3, the only fp8 the workload stores; every
/// other models type has a namesake here.
impl From<ModelDType> for DType {
    fn from(d: ModelDType) -> Self {
        match d {
            ModelDType::F32 => DType::F32,
            ModelDType::F16 => DType::F16,
            ModelDType::BF16 => DType::BF16,
            ModelDType::F8 => DType::F8E4M3,
            ModelDType::I64 => DType::I64,
            ModelDType::I32 => DType::I32,
            ModelDType::U64 => DType::U64,
            // A bool tensor is one byte an element, as PyTorch stores it.
            ModelDType::Bool => DType::U8,
        }
    }
}

/// Fails for `U8` only, which the models do not have.
impl TryFrom<DType> for ModelDType {
    type Error = String;
    fn try_from(d: DType) -> Result<Self, Self::Error> {
        Ok(match d {
            DType::F32 => ModelDType::F32,
            DType::F16 => ModelDType::F16,
            DType::BF16 => ModelDType::BF16,
            DType::F8E4M3 => ModelDType::F8,
            DType::I64 => ModelDType::I64,
            DType::I32 => ModelDType::I32,
            DType::U64 => ModelDType::U64,
            DType::U8 => return Err("the models have no u8 type".into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_exact() {
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::F16.size(), 2);
        assert_eq!(DType::F32.size(), 4);
        assert_eq!(DType::I32.size(), 4);
        assert_eq!(DType::I64.size(), 8);
        assert_eq!(DType::U64.size(), 8);
        assert_eq!(DType::U8.size(), 1);
        assert_eq!(DType::F8E4M3.size(), 1);
    }

    /// The bits `DType::encode` writes for one value.
    fn bits(dt: DType, x: f32) -> u16 {
        let b = dt.encode(&[x]);
        u16::from_le_bytes([b[0], b[1]])
    }

    /// The value `DType::decode` reads from one element's bits.
    fn value(dt: DType, h: u16) -> f32 {
        dt.decode(&h.to_le_bytes())[0]
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        let bf = DType::BF16;
        assert_eq!(bits(bf, 1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.0.
        assert_eq!(bits(bf, 1.0 + f32::powi(2.0, -8)), 0x3f80);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6: goes up.
        assert_eq!(bits(bf, 1.0 + 3.0 * f32::powi(2.0, -8)), 0x3f82);
        assert_eq!(value(bf, 0xc000), -2.0);
        assert!(bf.round(f32::NAN).is_nan());
        assert_eq!(bits(bf, f32::INFINITY), 0x7f80);
        assert_eq!(
            bf.round(1.0 + 3.0 * f32::powi(2.0, -8)),
            1.0 + f32::powi(2.0, -6)
        );
    }

    #[test]
    fn f16_round_trips_every_finite_value() {
        for h in 0u16..=0xffff {
            let exp = (h >> 10) & 0x1f;
            if exp == 0x1f {
                continue;
            }
            let x = value(DType::F16, h);
            let back = bits(DType::F16, x);
            // -0 and +0 keep their sign bits.
            assert_eq!(back, h, "half bits {h:#06x} -> {x} -> {back:#06x}");
        }
    }

    #[test]
    fn f16_known_values() {
        let f = |x| bits(DType::F16, x);
        assert_eq!(f(1.0), 0x3c00);
        assert_eq!(f(65504.0), 0x7bff);
        assert_eq!(f(65520.0), 0x7c00); // rounds to infinity
        assert_eq!(f(f32::powi(2.0, -24)), 0x0001);
        assert_eq!(f(f32::powi(2.0, -25)), 0x0000); // tie to even 0
        assert_eq!(f(1.5 * f32::powi(2.0, -24)), 0x0002); // tie to even 2
        assert_eq!(f(-2.0), 0xc000);
        assert!(DType::F16.round(f32::NAN).is_nan());
    }

    #[test]
    fn the_models_types_map_both_ways() {
        for d in [
            DType::BF16,
            DType::F16,
            DType::F32,
            DType::I32,
            DType::I64,
            DType::U64,
            DType::F8E4M3,
        ] {
            let m = ModelDType::try_from(d).unwrap();
            assert_eq!(DType::from(m), d);
            assert_eq!(m.size_bytes() as usize, d.size());
        }
        assert!(ModelDType::try_from(DType::U8).is_err());
    }

    #[test]
    fn encode_decode_round_trip() {
        let vals = [0.5f32, -1.25, 3.0, 1e-3];
        for dt in [DType::BF16, DType::F16, DType::F32] {
            let rounded: Vec<f32> = vals.iter().map(|&x| dt.round(x)).collect();
            let bytes = dt.encode(&rounded);
            assert_eq!(bytes.len(), vals.len() * dt.size());
            assert_eq!(dt.decode(&bytes), rounded);
        }
    }
}
