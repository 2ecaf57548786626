//! Element types of the tensors the workload allocates, and the host-side
//! conversions that let the CPU references round exactly where the kernels do.

use std::fmt;
use std::str::FromStr;

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
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::F8E4M3 => 1,
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 | DType::U64 => 8,
        }
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
            DType::BF16 => bf16_to_f32(f32_to_bf16(x)),
            DType::F16 => f16_to_f32(f32_to_f16(x)),
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
                .for_each(|&x| out.extend_from_slice(&f32_to_bf16(x).to_le_bytes())),
            DType::F16 => values
                .iter()
                .for_each(|&x| out.extend_from_slice(&f32_to_f16(x).to_le_bytes())),
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
                .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
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

/// `f32` → bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 0x40) as u16;
    }
    let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1));
    (rounded >> 16) as u16
}

/// bfloat16 bits → `f32` (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `f32` → IEEE half bits, round to nearest even, with subnormals, overflow to
/// infinity and quiet NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Subnormal half (or zero): the value is m * 2^(exp-150) with the
        // implicit bit, and the half subnormal unit is 2^-24.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let mut r = m >> shift;
        let rem = m & ((1u32 << shift) - 1);
        if rem > half || (rem == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && (r & 1) == 1) {
        // A carry into the exponent is the correct rounding (up to infinity).
        r += 1;
    }
    sign | r as u16
}

/// IEEE half bits → `f32` (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    if exp == 0 {
        let v = man as f32 * f32::powi(2.0, -24);
        if sign != 0 { -v } else { v }
    } else if exp == 0x1f {
        f32::from_bits(sign | 0x7f80_0000 | (man << 13))
    } else {
        f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
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

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.0.
        assert_eq!(f32_to_bf16(1.0 + f32::powi(2.0, -8)), 0x3f80);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6: goes up.
        assert_eq!(f32_to_bf16(1.0 + 3.0 * f32::powi(2.0, -8)), 0x3f82);
        assert_eq!(bf16_to_f32(0xc000), -2.0);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
    }

    #[test]
    fn f16_round_trips_every_finite_value() {
        for h in 0u16..=0xffff {
            let exp = (h >> 10) & 0x1f;
            if exp == 0x1f {
                continue;
            }
            let x = f16_to_f32(h);
            let back = f32_to_f16(x);
            // -0 and +0 keep their sign bits.
            assert_eq!(back, h, "half bits {h:#06x} -> {x} -> {back:#06x}");
        }
    }

    #[test]
    fn f16_known_values() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds to infinity
        assert_eq!(f32_to_f16(f32::powi(2.0, -24)), 0x0001);
        assert_eq!(f32_to_f16(f32::powi(2.0, -25)), 0x0000); // tie to even 0
        assert_eq!(f32_to_f16(1.5 * f32::powi(2.0, -24)), 0x0002); // tie to even 2
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
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
