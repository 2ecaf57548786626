//! The vramtrace trace format, shared by the writer (the preload, inside the traced process) and
//! every reader (the CLI, the live view).
//!
//! A trace directory holds one file per traced process, `<pid>.vtr` (or `<pid>-<n>.vtr` if a pid
//! was reused). Each file is a [`Header`] followed by its records ([`Record`]), in one of two
//! layouts:
//! - **version 2** (what the preload writes): fixed-size blocks, each filled by one thread
//!   through a shared file mapping, records compact (events about 10–18 bytes; see
//!   [`BlockHeader`] and [`encode_event`]);
//! - **version 1** (older traces, and tools and tests): framed, checksummed records appended
//!   one after another ([`Record::encode`]).
//!
//! [`FileReader`] streams either; [`TraceFile`] reads either whole; [`Follower`] tails either
//! while it grows.
//!
//! ```
//! use vramtrace_format::{Event, EventKind, Header, Record, TraceFile, EVENT_RECORD_LEN, Api};
//! let mut bytes = Vec::new();
//! Header { pid: 42, ..Header::default() }.encode(&mut bytes);
//! let ev = Event { kind: EventKind::Alloc, api: Api::from_name("cuMemAlloc_v2").unwrap(),
//!                  ptr: 0x7000_0000, size: 1 << 20, ..Event::default() };
//! let mut rec = [0u8; EVENT_RECORD_LEN];
//! ev.encode(&mut rec);
//! bytes.extend_from_slice(&rec);
//! let t = TraceFile::from_bytes("mem".as_ref(), &bytes).unwrap();
//! assert_eq!(t.header.pid, 42);
//! assert_eq!(t.records, vec![Record::Event(ev)]);
//! assert!(t.problems.is_empty());
//! ```
//!
//! # Design constraints
//! - **Survives any death.** The page cache keeps what was stored into a shared file mapping
//!   (or written) when the process is killed. In version 2 a record's tag is stored last, so a
//!   record cut short reads as "nothing here"; in version 1 it is detected by its length and
//!   CRC. Either way it is reported as [`Problem::TornTail`], never decoded.
//! - **Readable while growing.** [`Follower`] holds back an unfinished record until it is
//!   complete.
//! - **Compatible.** Records are length-framed, so readers skip kinds they do not know; ids in
//!   [`API_NAMES`] are append-only.
//! - **std only**, and the encoding side never allocates, so the preload can use it in hooks.

mod api;
mod block;
mod crc;
mod file_reader;
mod header;
mod reader;
mod record;

pub use api::{API_NAMES, Api};
pub use block::{
    BLOCK_DROPPABLE, BLOCK_HEADER_LEN, BLOCK_MAGIC, BLOCK_SIGNAL, BlockFileWriter, BlockHeader,
    DEFAULT_BLOCK_SIZE, Deltas, MAX_EVENT_RECORD_LEN, encode_event, frame_record, payload_time,
};
pub use crc::{Crc32, crc32};
pub use file_reader::{FileReader, Records, Timed, time_of};
pub use header::{
    BLOCK_ALIGN, BLOCK_SIZES, BLOCKS_VERSION, FILE_EXTENSION, Header, HeaderError, Layout, MAGIC,
    STREAM_VERSION, VERSION,
};
pub use reader::{Follower, Problem, ReadError, Scan, TraceFile, scan_records};
pub use record::{
    Annotation, DeviceInfo, EVENT_PAYLOAD_LEN, EVENT_RECORD_LEN, Encoder, Event, EventKind,
    FRAME_HEADER_LEN, FRAME_MAGIC, MAX_PAYLOAD, MAX_TENSOR_RANK, MemKind, ModuleInfo, PY_FRAME_LEN,
    PyFrame, Record, TENSOR_COMPACT_MAX_LEN, TENSOR_RECORD_MAX_LEN, TensorAction, TensorEvent,
    kind,
};

/// File name of the trace of process `pid`; `attempt` > 0 when that name was already taken.
pub fn trace_file_name(pid: u32, attempt: u32) -> String {
    if attempt == 0 {
        format!("{pid}.{FILE_EXTENSION}")
    } else {
        format!("{pid}-{attempt}.{FILE_EXTENSION}")
    }
}

#[cfg(test)]
mod tests;
