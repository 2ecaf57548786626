//! The file header: who wrote the trace, when, where.
//!
//! Layout: `MAGIC (8) | version u16 | flags u16 | body length u32 | body | crc32(body) u32`.
//! The body is little-endian fields in this order: pid u32, ppid u32, start_unix_ns u64,
//! start_mono_ns u64, hostname (u32 length + UTF-8), argument count u32 and each argument
//! (u32 length + bytes), then optional trailing fields that newer writers may add.
//!
//! Driver version and devices are not known when a process starts (the driver is not loaded
//! yet), so they arrive as `DRIVER` and `DEVICE` records; [`crate::TraceFile`] folds them into
//! its view of the header.

use crate::crc::crc32;
use crate::record::Cursor;

/// First bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"VRAMTRC\0";
/// Format version written by this crate. Readers accept this and older versions.
pub const VERSION: u16 = 1;
/// Extension of trace files inside a trace directory.
pub const FILE_EXTENSION: &str = "vtr";

/// The static facts about the traced process, written once at the start of its file.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Header {
    /// Format version the file was written with.
    pub version: u16,
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Wall clock at the start of recording, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// `CLOCK_MONOTONIC` at the same instant, to relate event times to the wall clock.
    pub start_mono_ns: u64,
    /// Host name.
    pub hostname: String,
    /// Command line (`/proc/self/cmdline`), `argv[0]` first.
    pub cmdline: Vec<String>,
}

/// Why a header could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// The file does not start with [`MAGIC`]: not a vramtrace trace.
    NotATrace,
    /// Written by a newer vramtrace.
    UnsupportedVersion(u16),
    /// The file ends inside the header (the process died while starting to record, or the
    /// file is still being written).
    Truncated,
    /// The header's checksum does not match.
    Corrupt,
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::NotATrace => write!(f, "not a vramtrace trace file (bad magic)"),
            HeaderError::UnsupportedVersion(v) => write!(
                f,
                "trace format version {v} is newer than this vramtrace understands ({VERSION}); upgrade vramtrace"
            ),
            HeaderError::Truncated => write!(f, "the file ends inside its header"),
            HeaderError::Corrupt => write!(f, "the header's checksum does not match"),
        }
    }
}

impl std::error::Error for HeaderError {}

impl Header {
    /// Encodes the header into `out` (cleared first). Allocates; the preload calls it once per
    /// process, outside any hook's hot path.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut body = Vec::with_capacity(256);
        body.extend_from_slice(&self.pid.to_le_bytes());
        body.extend_from_slice(&self.ppid.to_le_bytes());
        body.extend_from_slice(&self.start_unix_ns.to_le_bytes());
        body.extend_from_slice(&self.start_mono_ns.to_le_bytes());
        put_str32(&mut body, self.hostname.as_bytes());
        body.extend_from_slice(&(self.cmdline.len() as u32).to_le_bytes());
        for a in &self.cmdline {
            put_str32(&mut body, a.as_bytes());
        }
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_le_bytes());
    }

    /// Decodes a header from the start of `bytes`; returns it and the offset of the first record.
    pub fn decode(bytes: &[u8]) -> Result<(Header, usize), HeaderError> {
        if bytes.len() < MAGIC.len() {
            return Err(if MAGIC.starts_with(bytes) {
                HeaderError::Truncated
            } else {
                HeaderError::NotATrace
            });
        }
        if bytes[..8] != MAGIC {
            return Err(HeaderError::NotATrace);
        }
        if bytes.len() < 16 {
            return Err(HeaderError::Truncated);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version > VERSION || version == 0 {
            return Err(HeaderError::UnsupportedVersion(version));
        }
        let body_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        let end = 16 + body_len + 4;
        if bytes.len() < end {
            return Err(HeaderError::Truncated);
        }
        let body = &bytes[16..16 + body_len];
        let crc = u32::from_le_bytes(bytes[16 + body_len..end].try_into().unwrap());
        if crc32(body) != crc {
            return Err(HeaderError::Corrupt);
        }
        let mut c = Cursor::new(body);
        let parse = |c: &mut Cursor| -> Option<Header> {
            let pid = c.u32().ok()?;
            let ppid = c.u32().ok()?;
            let start_unix_ns = c.u64().ok()?;
            let start_mono_ns = c.u64().ok()?;
            let hostname = c.str32().ok()?;
            let argc = c.u32().ok()? as usize;
            let mut cmdline = Vec::with_capacity(argc.min(1024));
            for _ in 0..argc {
                cmdline.push(c.str32().ok()?);
            }
            Some(Header {
                version,
                pid,
                ppid,
                start_unix_ns,
                start_mono_ns,
                hostname,
                cmdline,
            })
        };
        let h = parse(&mut c).ok_or(HeaderError::Corrupt)?;
        Ok((h, end))
    }
}

fn put_str32(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}
