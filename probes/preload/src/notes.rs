//! Notes from the probes: `vramtrace_note`, through which the PyTorch probe
//! (`probes/python/vramtrace_torch.py`) says in the trace whether it started in this process
//! and, if not, why. A NOTE record carries the text; the readers show it per process
//! (`vramtrace summary`).

use core::ffi::c_char;

use vramtrace_format::{Encoder, FRAME_HEADER_LEN, kind};

use crate::labels::c_str;
use crate::sink::{mono_ns, set_standing_note, with_file};

/// Longest note kept, in bytes (a longer one is cut).
const MAX_NOTE: usize = 256;

/// `flags` bit of [`vramtrace_note`]: a standing note, written into every trace file this
/// process (or a fork child of it) creates, and none created for it.
pub const NOTE_STANDING: u32 = 1;

/// `void vramtrace_note(const char *text, uint32_t flags)`: a NOTE record with `text` (cut at
/// 256 bytes). With [`NOTE_STANDING`] the note stands for the whole process: it goes into the
/// trace file when there is one, or when the process creates it (its first recorded event), and
/// into a fork child's own file; a process that never records anything still writes no file.
/// Without it the note is written at once, creating the file if needed.
///
/// # Safety
/// `text` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_note(text: *const c_char, flags: u32) {
    // Safety: the caller's string, valid for the call.
    let Some(text) = (unsafe { c_str(text) }) else {
        return;
    };
    let text = &text[..text.len().min(MAX_NOTE)];
    if flags & NOTE_STANDING != 0 {
        if crate::sink::active() {
            crate::sink::guarded(|| set_standing_note(text));
        }
        return;
    }
    with_file(|file| {
        let mut buf = [0u8; FRAME_HEADER_LEN + 8 + MAX_NOTE];
        let mut e = Encoder::new(&mut buf);
        e.u64(mono_ns()).bytes(text);
        file.write(e.finish(kind::NOTE));
    });
}
