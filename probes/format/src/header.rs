//! The file header: who wrote the trace, when, where.
//!
//! Layout: `MAGIC (8) | version u16 | flags u16 | body length u32 | body | crc32(body) u32`.
//! The body is little-endian fields in this order: pid u32, ppid u32, start_unix_ns u64,
//! start_mono_ns u64, hostname (u32 length + UTF-8), argument count u32 and each argument
//! (u32 length + bytes), then optional trailing fields that newer writers may add.
//!
//! Version 1 ([`STREAM_VERSION`]): framed records follow the header directly, one after another.
//! Version 2 ([`BLOCKS_VERSION`]): the body ends with the block size (u32) and the file offset of
//! the first block (u64, a multiple of 4096); fixed-size blocks follow from there (see
//! [`crate::BlockHeader`]).
//!
//! Driver version and devices are not known when a process starts (the driver is not loaded
//! yet), so they arrive as `DRIVER` and `DEVICE` records; [`crate::TraceFile`] folds them into
//! its view of the header.

use crate::crc::crc32;
use crate::record::Cursor;

/// First bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"VRAMTRC\0";
/// Newest format version: the one the preload writes. Readers accept this and older versions.
pub const VERSION: u16 = BLOCKS_VERSION;
/// Version 1: framed records appended one after another ([`Header::encode`], [`crate::Record::encode`]).
pub const STREAM_VERSION: u16 = 1;
/// Version 2: fixed-size blocks, each owned by one writing thread ([`Header::encode_blocks`]).
pub const BLOCKS_VERSION: u16 = 2;
/// Alignment of the first block in a version 2 file (a page, so blocks can be mapped).
pub const BLOCK_ALIGN: u64 = 4096;
/// Smallest and largest block sizes a reader accepts.
pub const BLOCK_SIZES: std::ops::RangeInclusive<u32> = 4096..=(16 << 20);

/// Where the records of a file are, after its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Version 1: framed records from this offset to the end.
    Stream {
        /// File offset of the first record.
        start: u64,
    },
    /// Version 2: blocks of `block_size` bytes from `data_offset` to the end.
    Blocks {
        /// File offset of block 0.
        data_offset: u64,
        /// Bytes per block (a power of two in [`BLOCK_SIZES`]).
        block_size: u32,
    },
}

impl Layout {
    /// File offset of the first record or block.
    pub fn start(self) -> u64 {
        match self {
            Layout::Stream { start } => start,
            Layout::Blocks { data_offset, .. } => data_offset,
        }
    }
}
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
    /// Encodes a version 1 header into `out` (cleared first): the start of a file of framed
    /// records ([`crate::Record::encode`]) appended one after another. Tools and tests use it;
    /// the preload writes [`Header::encode_blocks`].
    pub fn encode(&self, out: &mut Vec<u8>) {
        let body = self.body();
        Self::frame(STREAM_VERSION, &body, out);
    }

    /// Encodes a version 2 header for blocks of `block_size` bytes into `out` (cleared first)
    /// and returns the offset of block 0 (the header's length rounded up to [`BLOCK_ALIGN`]); the
    /// bytes between are zero. Allocates; the preload calls it once per file.
    pub fn encode_blocks(&self, block_size: u32, out: &mut Vec<u8>) -> u64 {
        let mut body = self.body();
        body.extend_from_slice(&block_size.to_le_bytes());
        let len = 16 + body.len() as u64 + 8 + 4;
        let data_offset = len.div_ceil(BLOCK_ALIGN) * BLOCK_ALIGN;
        body.extend_from_slice(&data_offset.to_le_bytes());
        Self::frame(BLOCKS_VERSION, &body, out);
        data_offset
    }

    fn frame(version: u16, body: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(body);
        out.extend_from_slice(&crc32(body).to_le_bytes());
    }

    fn body(&self) -> Vec<u8> {
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
        body
    }

    /// Decodes a header from the start of `bytes`; returns it and the offset of the first record
    /// (version 1) or block (version 2).
    pub fn decode(bytes: &[u8]) -> Result<(Header, usize), HeaderError> {
        let (h, layout) = Self::decode_layout(bytes)?;
        Ok((h, layout.start() as usize))
    }

    /// Decodes a header from the start of `bytes`; returns it and where the records are.
    pub fn decode_layout(bytes: &[u8]) -> Result<(Header, Layout), HeaderError> {
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
        if version == STREAM_VERSION {
            return Ok((h, Layout::Stream { start: end as u64 }));
        }
        let block_size = c.u32().map_err(|_| HeaderError::Corrupt)?;
        let data_offset = c.u64().map_err(|_| HeaderError::Corrupt)?;
        if !BLOCK_SIZES.contains(&block_size)
            || !block_size.is_power_of_two()
            || data_offset % BLOCK_ALIGN != 0
            || data_offset < end as u64
        {
            return Err(HeaderError::Corrupt);
        }
        Ok((
            h,
            Layout::Blocks {
                data_offset,
                block_size,
            },
        ))
    }
}

fn put_str32(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}
