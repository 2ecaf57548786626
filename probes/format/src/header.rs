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

use crate::block::{BLOCK_HEADER_LEN, BlockHeader, DEFAULT_BLOCK_SIZE};
use crate::crc::crc32;
use crate::record::{Cursor, FRAME_HEADER_LEN, FrameCheck, Record, frame_at};

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
    /// The header's checksum does not match and, for version 2, no block could be found
    /// past it either ([`Header::decode_lenient`]; [`Header::decode_layout`] refuses any
    /// header whose checksum does not match).
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
            HeaderError::Corrupt => write!(
                f,
                "the header's checksum does not match and no block could be found after it"
            ),
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

/// What a damaged header still told: see [`Header::decode_lenient`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovered {
    /// The fields that could be read (the others default); they may be wrong.
    pub header: Header,
    /// Where the records are.
    pub layout: Layout,
    /// What was wrong with the header, when something was ([`crate::Problem::DamagedHeader`]).
    pub damage: Option<crate::Problem>,
}

/// Header fields in body order, as [`crate::Problem::DamagedHeader`] names them.
const FIELDS: [&str; 5] = ["pid", "ppid", "start time", "host", "command line"];

impl Header {
    /// Decodes a header like [`Header::decode_layout`], but degrades instead of refusing a
    /// header whose checksum fails (or whose fields do not parse): the fields that parse are
    /// kept (each string length-checked against the bytes there are), the damage is reported as
    /// [`crate::Problem::DamagedHeader`], and the records are still found. For version 2, when
    /// the layout fields are implausible (or do not point at a block), blocks are found by
    /// scanning for block magics from the first page boundary; `read_at(offset, buf)` reads
    /// `buf.len()` bytes of the file at `offset` (false when it cannot) and `file_len` is the
    /// file's length. Only an unrecognisable magic or version, a file that ends inside an
    /// intact-looking header, or a version 2 file where no block can be found are refused.
    pub fn decode_lenient(
        bytes: &[u8],
        file_len: u64,
        read_at: &mut dyn FnMut(u64, &mut [u8]) -> bool,
    ) -> Result<Recovered, HeaderError> {
        let err = match Self::decode_layout(bytes) {
            Ok((header, layout)) => {
                return Ok(Recovered {
                    header,
                    layout,
                    damage: None,
                });
            }
            Err(e @ (HeaderError::NotATrace | HeaderError::UnsupportedVersion(_))) => {
                return Err(e);
            }
            Err(e) => e,
        };
        if bytes.len() < 16 {
            return Err(HeaderError::Truncated);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        let body_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as u64;
        let stated_end = 16 + body_len + 4;
        // Parse what parses, bounded by the bytes there are.
        // Parse what parses, strings length-checked against the stated body; if that stops
        // short, against the bytes there are (the body length itself may be the damaged field),
        // kept only when what follows is where records start.
        let limit = bytes.len().min(16 + MAX_LENIENT_BODY);
        let stated = (stated_end - 4 <= limit as u64)
            .then(|| parse_fields(&bytes[16..(stated_end - 4) as usize], version));
        let wide = parse_fields(&bytes[16..limit], version);
        let complete = |p: &Parsed| {
            p.read == FIELDS.len() && (version == STREAM_VERSION || p.layout.is_some())
        };
        let mut wide_fits = || {
            let at = 16 + wide.end + 4;
            match wide.layout {
                Some((bs, off)) => plausible(bs, off, at, file_len, read_at),
                None => {
                    at == file_len
                        || bytes.get(at as usize..).is_some_and(|rest| {
                            // A checksum-valid record that decodes starts right after it.
                            match frame_at(rest, 0) {
                                FrameCheck::Ok { kind, total } => {
                                    Record::decode(kind, &rest[FRAME_HEADER_LEN..total]).is_some()
                                }
                                _ => false,
                            }
                        })
                }
            }
        };
        let parsed = match stated {
            Some(p) if complete(&p) => p,
            Some(p) if !(complete(&wide) && wide_fits()) => p,
            _ => wide,
        };
        let (h, read, layout_fields) = (parsed.header, parsed.read, parsed.layout);
        let fields_ok = read == FIELDS.len();
        let parsed_end = 16 + parsed.end;
        // An intact-looking header that the file ends inside of is a truncated one, as before.
        if err == HeaderError::Truncated && fields_ok && parsed_end <= 16 + body_len {
            let consistent = match layout_fields {
                Some((_, off)) => stated_end <= off,
                None => version == STREAM_VERSION && file_len < parsed_end + 4,
            };
            if consistent && file_len < stated_end {
                return Err(HeaderError::Truncated);
            }
        }
        let truncated = file_len < stated_end && stated_end <= MAX_LENIENT_BODY as u64;
        if !fields_ok && version == STREAM_VERSION && truncated {
            return Err(HeaderError::Truncated);
        }
        let mut scanned = false;
        let layout = if version == STREAM_VERSION {
            let start = if fields_ok {
                parsed_end + 4
            } else if stated_end <= file_len {
                stated_end
            } else {
                16
            };
            Layout::Stream {
                start: start.min(file_len),
            }
        } else {
            let hint = layout_fields
                .map(|(bs, _)| bs)
                .filter(|bs| BLOCK_SIZES.contains(bs) && bs.is_power_of_two());
            let stated = layout_fields.filter(|&(bs, off)| {
                hint == Some(bs) && plausible(bs, off, parsed_end + 4, file_len, read_at)
            });
            match stated {
                Some((block_size, data_offset)) => Layout::Blocks {
                    data_offset,
                    block_size,
                },
                None => {
                    scanned = true;
                    let from = BLOCK_ALIGN;
                    scan_blocks(from, file_len, hint, read_at).ok_or(if truncated {
                        HeaderError::Truncated
                    } else {
                        HeaderError::Corrupt
                    })?
                }
            }
        };
        Ok(Recovered {
            header: h,
            layout,
            damage: Some(crate::Problem::DamagedHeader {
                unread: FIELDS[read..].to_vec(),
                scanned,
            }),
        })
    }
}

/// The fields of a header body, as far as they parse.
struct Parsed {
    header: Header,
    /// How many of [`FIELDS`] were read.
    read: usize,
    /// Version 2: block size and data offset.
    layout: Option<(u32, u64)>,
    /// Body bytes parsed.
    end: u64,
}

fn parse_fields(body: &[u8], version: u16) -> Parsed {
    let mut c = Cursor::new(body);
    let mut h = Header {
        version,
        ..Header::default()
    };
    let mut read = 0usize;
    let mut parse = || -> Option<()> {
        h.pid = c.u32().ok()?;
        read = 1;
        h.ppid = c.u32().ok()?;
        read = 2;
        let unix = c.u64().ok()?;
        let mono = c.u64().ok()?;
        (h.start_unix_ns, h.start_mono_ns) = (unix, mono);
        read = 3;
        h.hostname = c.str32().ok()?;
        read = 4;
        let argc = c.u32().ok()? as usize;
        let mut cmdline = Vec::with_capacity(argc.min(1024));
        for _ in 0..argc {
            cmdline.push(c.str32().ok()?);
        }
        h.cmdline = cmdline;
        read = 5;
        Some(())
    };
    let ok = parse().is_some();
    let layout = if ok && version == BLOCKS_VERSION {
        match (c.u32(), c.u64()) {
            (Ok(bs), Ok(off)) => Some((bs, off)),
            _ => None,
        }
    } else {
        None
    };
    Parsed {
        header: h,
        read,
        layout,
        end: c.pos() as u64,
    }
}

/// Are these layout fields of a header ending at `header_end` believable: a block size the
/// reader accepts, a page-aligned offset after the header and inside the file, and a block
/// there (unless the file ends there)?
fn plausible(
    block_size: u32,
    data_offset: u64,
    header_end: u64,
    file_len: u64,
    read_at: &mut dyn FnMut(u64, &mut [u8]) -> bool,
) -> bool {
    BLOCK_SIZES.contains(&block_size)
        && block_size.is_power_of_two()
        && data_offset.is_multiple_of(BLOCK_ALIGN)
        && data_offset >= header_end
        && data_offset <= file_len
        && (data_offset == file_len || block_at(data_offset, file_len, read_at))
}

/// Most header bytes a damaged header is parsed from.
const MAX_LENIENT_BODY: usize = 1 << 20;

/// Is there a valid block header at `offset`?
fn block_at(offset: u64, file_len: u64, read_at: &mut dyn FnMut(u64, &mut [u8]) -> bool) -> bool {
    let mut b = [0u8; BLOCK_HEADER_LEN];
    offset + BLOCK_HEADER_LEN as u64 <= file_len
        && read_at(offset, &mut b)
        && matches!(BlockHeader::decode(&b), Ok(Some(_)))
}

/// Finds the blocks of a version 2 file whose header cannot say where they are: the first
/// valid block header at a page boundary from `from` is block 0; the block size is `hint`, or
/// else the largest power of two (in [`BLOCK_SIZES`]) dividing every distance between valid
/// block headers, or else [`DEFAULT_BLOCK_SIZE`].
fn scan_blocks(
    from: u64,
    file_len: u64,
    hint: Option<u32>,
    read_at: &mut dyn FnMut(u64, &mut [u8]) -> bool,
) -> Option<Layout> {
    let mut first = None;
    let mut gcd = 0u64;
    let mut at = from;
    while at + BLOCK_HEADER_LEN as u64 <= file_len {
        if block_at(at, file_len, read_at) {
            match first {
                None => {
                    first = Some(at);
                    if hint.is_some() {
                        break;
                    }
                }
                Some(f) => gcd = gcd_u64(gcd, at - f),
            }
        }
        at += BLOCK_ALIGN;
    }
    let data_offset = first?;
    let block_size = hint.unwrap_or_else(|| {
        if gcd == 0 {
            return DEFAULT_BLOCK_SIZE;
        }
        let pow = 1u64 << gcd.trailing_zeros().min(31);
        (pow.min(*BLOCK_SIZES.end() as u64) as u32).max(*BLOCK_SIZES.start())
    });
    Some(Layout::Blocks {
        data_offset,
        block_size,
    })
}

fn gcd_u64(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd_u64(b, a % b) }
}

fn put_str32(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}
