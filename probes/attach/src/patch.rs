//! In-place hooks for x86-64: what goes at a driver entry point, in its pad and in its
//! trampoline. Pure: bytes in, bytes out, so it is tested without a process.
//!
//! At an entry point `E` five bytes become `jmp rel32` to the entry's pad `P` in a page the
//! CLI maps near the driver; `P` is `jmp [rip+0]` followed by the absolute address of the
//! preload's wrapper of the same name. The instructions the five bytes cut into are decoded
//! (iced-x86) and re-encoded at the entry's trampoline `T`, RIP-relative operands and branches
//! relocated, followed by `jmp E+n`: the wrapper calls the driver through `T`.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock,
};

use crate::TrampolineError;

/// Bytes of the `jmp rel32` written at an entry point.
pub const JUMP_LEN: usize = 5;
/// Bytes each entry gets in the trampoline page: its pad, then its trampoline.
pub const SLOT: u64 = 128;
/// Offset of the trampoline inside a slot.
pub const TRAMPOLINE_AT: u64 = 16;
/// Bytes read at an entry point to decode its first instructions.
pub const PROLOGUE_READ: usize = 32;

/// The `jmp rel32` from `from` to `to`; [`TrampolineError::OutOfReach`] when `to` is farther
/// than a `rel32` reaches.
pub fn jump(from: u64, to: u64) -> Result<[u8; JUMP_LEN], TrampolineError> {
    let rel = (to as i64).wrapping_sub(from as i64 + JUMP_LEN as i64);
    let rel = i32::try_from(rel).map_err(|_| TrampolineError::OutOfReach)?;
    let mut out = [0xe9, 0, 0, 0, 0];
    out[1..].copy_from_slice(&rel.to_le_bytes());
    Ok(out)
}

/// The pad: `jmp [rip+0]` and the absolute address it jumps to.
pub fn pad(to: u64) -> [u8; 14] {
    let mut out = [0xff, 0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    out[6..].copy_from_slice(&to.to_le_bytes());
    out
}

/// A trampoline: the relocated first instructions of the entry and the jump back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trampoline {
    /// The code, to be placed at the address it was built for.
    pub code: Vec<u8>,
    /// How many bytes of the entry point the relocated instructions cover (at least
    /// [`JUMP_LEN`]): no thread may be stopped strictly inside `E..E+covered` while patching.
    pub covered: usize,
}

/// Builds the trampoline of the entry point at `entry`, whose first bytes are `prologue`, for
/// the address `at`.
pub fn trampoline(prologue: &[u8], entry: u64, at: u64) -> Result<Trampoline, TrampolineError> {
    let mut decoder = Decoder::with_ip(64, prologue, entry, DecoderOptions::NONE);
    let mut moved = Vec::new();
    let mut covered = 0usize;
    while covered < JUMP_LEN {
        if !decoder.can_decode() {
            return Err(TrampolineError::Undecodable);
        }
        let ins = decoder.decode();
        if ins.is_invalid() {
            return Err(TrampolineError::Invalid {
                bytes: prologue[..prologue.len().min(8)].to_vec(),
            });
        }
        covered += ins.len();
        let ends = matches!(
            ins.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        );
        if ends && covered < JUMP_LEN {
            return Err(TrampolineError::TooShort { len: covered });
        }
        if ins.code() == Code::Int3 {
            return Err(TrampolineError::Breakpoint);
        }
        moved.push(ins);
    }
    let back = entry + covered as u64;
    moved.push(
        Instruction::with_branch(Code::Jmp_rel32_64, back).map_err(TrampolineError::JumpBack)?,
    );
    let block = InstructionBlock::new(&moved, at);
    let encoded = BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
        .map_err(TrampolineError::Unmovable)?;
    let room = (SLOT - TRAMPOLINE_AT) as usize;
    if encoded.code_buffer.len() > room {
        return Err(TrampolineError::TooLong {
            len: encoded.code_buffer.len(),
            room,
        });
    }
    Ok(Trampoline {
        code: encoded.code_buffer,
        covered,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_and_pads_are_exact() {
        assert_eq!(jump(0x1000, 0x1005).unwrap(), [0xe9, 0, 0, 0, 0]);
        assert_eq!(
            jump(0x1000, 0x1000).unwrap(),
            [0xe9, 0xfb, 0xff, 0xff, 0xff]
        );
        assert!(matches!(
            jump(0x1000, 0x1_0000_1000),
            Err(TrampolineError::OutOfReach)
        ));
        assert_eq!(
            pad(0x1122334455667788),
            [
                0xff, 0x25, 0, 0, 0, 0, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11
            ]
        );
    }

    #[test]
    fn a_plain_prologue_moves_as_is() {
        // sub rsp,0x18 ; mov [rsp+8],rdi ; ...
        let code = [
            0x48, 0x83, 0xec, 0x18, 0x48, 0x89, 0x7c, 0x24, 0x08, 0x90, 0x90,
        ];
        let t = trampoline(&code, 0x52ec0, 0x60000).unwrap();
        assert_eq!(t.covered, 9);
        assert_eq!(&t.code[..9], &code[..9]);
        // jmp rel32 back to 0x52ec9 from the end of the trampoline.
        let end = 0x60000 + t.code.len() as u64;
        assert_eq!(t.code[9], 0xe9);
        let rel = i32::from_le_bytes(t.code[10..14].try_into().unwrap()) as i64;
        assert_eq!((end as i64 + rel) as u64, 0x52ec9);
    }

    #[test]
    fn rip_relative_operands_are_relocated() {
        // lea rdi,[rip-0x429dc] at 0x52ece: the target is 0x104f9.
        let code = [0x48, 0x8d, 0x3d, 0x24, 0xd6, 0xfb, 0xff, 0x90];
        let t = trampoline(&code, 0x52ece, 0x80000).unwrap();
        assert_eq!(t.covered, 7);
        let mut d = Decoder::with_ip(64, &t.code, 0x80000, DecoderOptions::NONE);
        let lea = d.decode();
        assert_eq!(lea.ip_rel_memory_address(), 0x104f9);
    }

    #[test]
    fn a_thunk_still_jumps_where_it_jumped() {
        // jmp rel32 at 0x1000 to 0x9000.
        let rel = (0x9000i64 - 0x1005) as i32;
        let mut code = vec![0xe9];
        code.extend_from_slice(&rel.to_le_bytes());
        code.extend_from_slice(&[0xcc; 8]);
        let t = trampoline(&code, 0x1000, 0x40000).unwrap();
        assert_eq!(t.covered, 5);
        let mut d = Decoder::with_ip(64, &t.code, 0x40000, DecoderOptions::NONE);
        assert_eq!(d.decode().near_branch_target(), 0x9000);
    }

    #[test]
    fn too_short_functions_are_refused() {
        let err = trampoline(&[0xc3, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc], 0x1000, 0x2000).unwrap_err();
        assert!(matches!(err, TrampolineError::TooShort { len: 1 }), "{err}");
        assert!(err.to_string().contains("shorter"), "{err}");
        let err = trampoline(&[0xcc, 0x90, 0x90, 0x90, 0x90, 0x90], 0x1000, 0x2000).unwrap_err();
        assert!(matches!(err, TrampolineError::Breakpoint), "{err}");
        assert!(err.to_string().contains("breakpoint"), "{err}");
    }

    #[test]
    fn undecodable_and_invalid_prologues_are_refused() {
        // Two one-byte instructions, then nothing more to decode.
        let err = trampoline(&[0x90, 0x90], 0x1000, 0x2000).unwrap_err();
        assert!(matches!(err, TrampolineError::Undecodable), "{err}");
        // The first two bytes of a five-byte instruction.
        let err = trampoline(&[0xe9, 0x00], 0x1000, 0x2000).unwrap_err();
        assert!(matches!(err, TrampolineError::Invalid { .. }), "{err}");
        // 0x06 (push es) is not an instruction in 64-bit mode.
        let err = trampoline(&[0x06, 0x90, 0x90, 0x90, 0x90, 0x90], 0x1000, 0x2000).unwrap_err();
        assert!(
            matches!(&err, TrampolineError::Invalid { bytes } if bytes[0] == 0x06),
            "{err}"
        );
    }
}
