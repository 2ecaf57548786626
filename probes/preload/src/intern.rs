//! Interned strings: each distinct text is written once as a STRING record and referred to by
//! its id afterwards (range names, labels, annotation names and dtypes).
//!
//! A fixed, lock-free open-addressing table keyed by a 64-bit FNV-1a hash of the text (two
//! different texts with the same 64-bit hash would share an id; at our volumes that is a
//! practical impossibility). The thread that claims a slot writes the STRING record, then
//! publishes the id; a thread that finds the slot claimed but the id not yet published waits
//! for it briefly. Nothing allocates. When the table has no room near a text's slot, the text
//! is written again under a fresh id instead of being deduplicated: a long run (a prefill
//! names hundreds of distinct ranges per chunk) costs some trace space but never loses a label.
//!
//! A fork child forgets every string (its file has none of them) and bumps [`generation`], so
//! that callers who cache ids know to intern their texts again.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use vramtrace_format::{Encoder, FRAME_HEADER_LEN, kind};

use crate::fork::ForkHandler;
use crate::sink::File;

const SLOTS: usize = 1 << 16;
const PROBES: usize = 64;
/// Longest text kept; longer ones are cut (on a UTF-8 boundary is not needed: the reader
/// decodes lossily).
pub(crate) const MAX_TEXT: usize = 2048;

static HASHES: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static IDS: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
static NEXT_ID: AtomicU32 = AtomicU32::new(1);
/// Bumped in every fork child: ids handed out before are not in the child's file.
static GENERATION: AtomicU32 = AtomicU32::new(0);
static FORK: ForkHandler = ForkHandler::new(after_fork_child);

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | 1 // 0 marks an empty slot
}

/// The id of `text`, writing its STRING record to `file` the first time it is seen.
pub(crate) fn intern(file: File, text: &[u8]) -> u32 {
    let text = &text[..text.len().min(MAX_TEXT)];
    let h = fnv1a(text);
    let mut i = h as usize & (SLOTS - 1);
    let mut probes = 0;
    while probes < PROBES {
        let cur = HASHES[i].load(Ordering::Acquire);
        if cur == h {
            return wait_for_id(i);
        }
        if cur == 0 {
            FORK.register();
            if HASHES[i]
                .compare_exchange(0, h, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let id = write_string(file, text);
                IDS[i].store(id, Ordering::Release);
                return id;
            }
            // Lost the race for this slot: look at it again (it may now hold our text).
            continue;
        }
        i = (i + 1) & (SLOTS - 1);
        probes += 1;
    }
    // No room to deduplicate: a fresh id for this occurrence.
    write_string(file, text)
}

/// Writes a STRING record for `text` under a new id and returns the id.
fn write_string(file: File, text: &[u8]) -> u32 {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut buf = [0u8; FRAME_HEADER_LEN + 4 + MAX_TEXT];
    let mut e = Encoder::new(&mut buf);
    e.u32(id).bytes(text);
    file.write(e.finish(kind::STRING));
    id
}

fn wait_for_id(slot: usize) -> u32 {
    for _ in 0..100_000 {
        let id = IDS[slot].load(Ordering::Acquire);
        if id != 0 {
            return id;
        }
        // Safety: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
    0
}

/// Changes whenever the ids handed out so far stop being valid (in a fork child).
pub(crate) fn generation() -> u32 {
    GENERATION.load(Ordering::Acquire)
}

/// In a fork child: forget every string, so that each is written again into the child's file.
extern "C" fn after_fork_child() {
    for (h, id) in HASHES.iter().zip(IDS.iter()) {
        h.store(0, Ordering::Relaxed);
        id.store(0, Ordering::Relaxed);
    }
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_texts_than_slots_all_keep_an_id() {
        // Safety: opening /dev/null write-only; the fd is closed below.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY) };
        assert!(fd >= 0);
        let file = File::from_raw_fd(fd);
        let first = intern(file, b"prefill/chunk.0/layer.0/gdn");
        assert_ne!(first, 0);
        assert_eq!(
            intern(file, b"prefill/chunk.0/layer.0/gdn"),
            first,
            "deduplicated"
        );
        for i in 0..(SLOTS + SLOTS / 2) {
            let text = format!("prefill/chunk.{}/layer.{}/gdn", i / 64, i % 64);
            assert_ne!(intern(file, text.as_bytes()), 0, "text {i} lost its id");
        }
        // Safety: fd was opened above.
        unsafe { libc::close(fd) };
    }
}
