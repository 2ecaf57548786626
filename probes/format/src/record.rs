//! Records: the framed, checksummed units that follow the header.
//!
//! Frame: `[FRAME_MAGIC u8][kind u8][payload length u16 LE][crc32 u32 LE][payload]`. The CRC covers
//! the kind, the length and the payload, so a record cut short by a crash (or never finished) is
//! recognised and dropped instead of being read as garbage. Payloads are little-endian fields in
//! a fixed order; variable parts (strings, frames, shapes) come last with a length prefix.
//! Unknown kinds are skipped by their length, so older readers read newer traces.

use crate::api::Api;
use crate::crc::Crc32;

/// First byte of every record frame.
pub const FRAME_MAGIC: u8 = 0xE7;
/// Bytes in a frame header (magic, kind, length, crc).
pub const FRAME_HEADER_LEN: usize = 8;
/// Largest payload a frame can carry.
pub const MAX_PAYLOAD: usize = u16::MAX as usize;

/// The kind byte of a record.
pub mod kind {
    /// An allocation, free, mapping or failure ([`crate::Event`]).
    pub const EVENT: u8 = 1;
    /// A device: ordinal, total memory, name.
    pub const DEVICE: u8 = 2;
    /// The driver version (`cuDriverGetVersion`).
    pub const DRIVER: u8 = 3;
    /// An interned string: id and UTF-8 bytes.
    pub const STRING: u8 = 4;
    /// A native stack: id and return addresses, innermost first.
    pub const STACK: u8 = 5;
    /// A loaded module: address range, file offset, path, build id.
    pub const MODULE: u8 = 6;
    /// A name, dtype and shape given to a live allocation.
    pub const ANNOTATE: u8 = 7;
    /// A named range pushed on a thread.
    pub const RANGE_PUSH: u8 = 8;
    /// The innermost range of a thread popped.
    pub const RANGE_POP: u8 = 9;
    /// An instantaneous named mark.
    pub const MARK: u8 = 10;
    /// A message from the recorder itself (e.g. why recording stopped).
    pub const NOTE: u8 = 11;
}

/// What an event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum EventKind {
    /// Memory (or a handle, or address space) was obtained.
    #[default]
    Alloc = 1,
    /// Memory was released.
    Free = 2,
    /// An allocation returned a non-zero result; carries free/total memory at that moment.
    AllocFailed = 3,
    /// Physical memory mapped into reserved address space (`cuMemMap`).
    Map = 4,
    /// A mapping removed (`cuMemUnmap`).
    Unmap = 5,
    /// A release call (free, unmap, ...) returned a non-zero result.
    FreeFailed = 6,
}

impl EventKind {
    /// Decodes the byte; `None` for kinds this reader does not know.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Alloc,
            2 => Self::Free,
            3 => Self::AllocFailed,
            4 => Self::Map,
            5 => Self::Unmap,
            6 => Self::FreeFailed,
            _ => return None,
        })
    }

    /// The name used in `vramtrace events` output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Alloc => "alloc",
            Self::Free => "free",
            Self::AllocFailed => "alloc_failed",
            Self::Map => "map",
            Self::Unmap => "unmap",
            Self::FreeFailed => "free_failed",
        }
    }
}

/// Which kind of memory an event concerns. Physical device memory, address space and pinned
/// host memory are never summed together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(u8)]
pub enum MemKind {
    /// Physical device memory (`cuMemAlloc*`, `cuMemCreate`, async/pool allocations).
    #[default]
    Device = 1,
    /// Unified memory (`cuMemAllocManaged`).
    Managed = 2,
    /// Page-locked host memory (`cuMemAllocHost`, `cuMemHostAlloc`).
    Host = 3,
    /// CUDA arrays (`cuArrayCreate`, `cuArray3DCreate`): device memory of unknown exact size.
    Array = 4,
    /// Virtual address space only (`cuMemAddressReserve`).
    Address = 5,
    /// A view of physical memory inside reserved address space (`cuMemMap`).
    Mapping = 6,
}

impl MemKind {
    /// Decodes the byte; `None` for kinds this reader does not know.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Device,
            2 => Self::Managed,
            3 => Self::Host,
            4 => Self::Array,
            5 => Self::Address,
            6 => Self::Mapping,
            _ => return None,
        })
    }

    /// The name used in `vramtrace events` output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Device => "device",
            Self::Managed => "managed",
            Self::Host => "host",
            Self::Array => "array",
            Self::Address => "address",
            Self::Mapping => "mapping",
        }
    }
}

/// One driver call that obtained, released or failed to obtain memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Event {
    /// `CLOCK_MONOTONIC` in nanoseconds (system-wide, so processes compare).
    pub t_ns: u64,
    /// Kernel thread id of the caller.
    pub tid: u32,
    /// Device ordinal, or -1 where none applies (host memory) or it could not be learned.
    pub device: i32,
    /// What happened.
    pub kind: EventKind,
    /// Which memory.
    pub mem: MemKind,
    /// The driver function.
    pub api: Api,
    /// The driver's `CUresult`, passed through to the caller unchanged.
    pub result: i32,
    /// Device pointer, virtual address, host pointer, or handle (`cuMemCreate`, arrays).
    pub ptr: u64,
    /// Requested bytes (for a free: 0 here; the reader pairs it with its allocation).
    pub size: u64,
    /// The stream (`CUstream` as an integer) for stream-ordered calls, else 0.
    pub stream: u64,
    /// Extra operand: the physical handle for `cuMemMap`, the pool for
    /// `cuMemAllocFromPoolAsync`, the pitch for `cuMemAllocPitch`, the flags for host allocations.
    pub aux: u64,
    /// Free device memory reported by `cuMemGetInfo_v2` at a failure, else 0.
    pub free_bytes: u64,
    /// Total device memory reported by `cuMemGetInfo_v2` at a failure, else 0.
    pub total_bytes: u64,
    /// Id of the native stack ([`Record::Stack`]), 0 for none.
    pub stack: u32,
    /// Id of the interned label ([`Record::String`]) active on the thread, 0 for none.
    pub label: u32,
}

/// Payload bytes of an [`Event`] record.
pub const EVENT_PAYLOAD_LEN: usize = 80;
/// Total bytes of an encoded [`Event`] record, frame included.
pub const EVENT_RECORD_LEN: usize = FRAME_HEADER_LEN + EVENT_PAYLOAD_LEN;

/// Builds one record in a caller-provided buffer without allocating (usable inside the preload's
/// hooks). Fields that do not fit are dropped and [`Encoder::overflowed`] turns true; variable
/// fields should be clamped by the caller first.
pub struct Encoder<'a> {
    buf: &'a mut [u8],
    len: usize,
    overflow: bool,
}

impl<'a> Encoder<'a> {
    /// Starts a record in `buf` (which must hold at least the frame header).
    pub fn new(buf: &'a mut [u8]) -> Self {
        assert!(
            buf.len() >= FRAME_HEADER_LEN,
            "buffer shorter than a frame header"
        );
        Encoder {
            buf,
            len: FRAME_HEADER_LEN,
            overflow: false,
        }
    }

    /// Payload bytes still free in the buffer.
    pub fn remaining(&self) -> usize {
        (self.buf.len().min(FRAME_HEADER_LEN + MAX_PAYLOAD)).saturating_sub(self.len)
    }

    /// True if something did not fit.
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// Appends raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        if b.len() > self.remaining() {
            self.overflow = true;
        } else {
            self.buf[self.len..self.len + b.len()].copy_from_slice(b);
            self.len += b.len();
        }
        self
    }

    /// Appends a little-endian u8.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes(&[v])
    }
    /// Appends a little-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    /// Appends a little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    /// Appends a little-endian i32.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    /// Appends a little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    /// Appends a little-endian i64.
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    /// Appends a string with a u16 length prefix, cut to what fits (on a char boundary).
    pub fn str(&mut self, s: &str) -> &mut Self {
        let room = self.remaining().saturating_sub(2).min(u16::MAX as usize);
        let mut end = s.len().min(room);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.bytes(&s.as_bytes()[..end])
    }

    /// Writes the frame header for `kind` and returns the finished record.
    pub fn finish(&mut self, kind: u8) -> &[u8] {
        let payload_len = (self.len - FRAME_HEADER_LEN) as u16;
        self.buf[0] = FRAME_MAGIC;
        self.buf[1] = kind;
        self.buf[2..4].copy_from_slice(&payload_len.to_le_bytes());
        let crc = frame_crc(kind, payload_len, &self.buf[FRAME_HEADER_LEN..self.len]);
        self.buf[4..8].copy_from_slice(&crc.to_le_bytes());
        &self.buf[..self.len]
    }
}

pub(crate) fn frame_crc(kind: u8, len: u16, payload: &[u8]) -> u32 {
    let mut c = Crc32::new();
    let l = len.to_le_bytes();
    c.update(&[kind, l[0], l[1]]);
    c.update(payload);
    c.finish()
}

impl Event {
    /// Encodes the event as one complete record into `out`.
    pub fn encode(&self, out: &mut [u8; EVENT_RECORD_LEN]) {
        let mut e = Encoder::new(out);
        e.u64(self.t_ns)
            .u32(self.tid)
            .i32(self.device)
            .u8(self.kind as u8)
            .u8(self.mem as u8)
            .u16(self.api.0)
            .i32(self.result)
            .u64(self.ptr)
            .u64(self.size)
            .u64(self.stream)
            .u64(self.aux)
            .u64(self.free_bytes)
            .u64(self.total_bytes)
            .u32(self.stack)
            .u32(self.label);
        debug_assert!(!e.overflowed());
        e.finish(kind::EVENT);
    }
}

/// A device as the driver described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: i32,
    /// Total memory in bytes (`cuDeviceTotalMem_v2`).
    pub total_bytes: u64,
    /// Device name (`cuDeviceGetName`).
    pub name: String,
}

/// A shared object mapped into the traced process, for offline symbolisation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Lowest mapped address of the module's executable segment(s).
    pub start: u64,
    /// One past the highest address.
    pub end: u64,
    /// The load bias: runtime address minus the address in the file's program headers.
    pub bias: u64,
    /// Path of the file as the loader saw it (empty for the main program on some systems).
    pub path: String,
    /// GNU build id, empty if the module has none.
    pub build_id: Vec<u8>,
}

/// A name, dtype and shape given to a live allocation through the annotation ABI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Annotation {
    /// When it was given.
    pub t_ns: u64,
    /// Thread that gave it.
    pub tid: u32,
    /// The allocation's pointer.
    pub ptr: u64,
    /// Interned id of the tensor name.
    pub name: u32,
    /// Interned id of the dtype (`bf16`, `f32`, ...), 0 if none.
    pub dtype: u32,
    /// The shape, outermost first.
    pub shape: Vec<i64>,
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// An allocation-family event.
    Event(Event),
    /// A device description.
    Device(DeviceInfo),
    /// The driver version.
    Driver {
        /// As `cuDriverGetVersion` reports it (e.g. 13000).
        version: i32,
    },
    /// An interned string.
    String {
        /// Id referenced by other records (never 0).
        id: u32,
        /// The text.
        text: String,
    },
    /// An interned native stack.
    Stack {
        /// Id referenced by events (never 0).
        id: u32,
        /// Return addresses, innermost first.
        frames: Vec<u64>,
    },
    /// A loaded module.
    Module(ModuleInfo),
    /// An allocation named.
    Annotate(Annotation),
    /// A range pushed.
    RangePush {
        /// When.
        t_ns: u64,
        /// On which thread.
        tid: u32,
        /// Interned id of the range's name.
        name: u32,
    },
    /// A range popped.
    RangePop {
        /// When.
        t_ns: u64,
        /// On which thread.
        tid: u32,
    },
    /// A mark.
    Mark {
        /// When.
        t_ns: u64,
        /// On which thread.
        tid: u32,
        /// Interned id of the mark's text.
        name: u32,
    },
    /// A message from the recorder.
    Note {
        /// When.
        t_ns: u64,
        /// The message.
        text: String,
    },
    /// A record of a kind this reader does not know; skipped.
    Unknown {
        /// Its kind byte.
        kind: u8,
    },
}

/// Reads little-endian fields from a payload; every read is bounds-checked.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

#[derive(Debug)]
pub(crate) struct Short;

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Short> {
        let end = self.pos.checked_add(n).ok_or(Short)?;
        let s = self.buf.get(self.pos..end).ok_or(Short)?;
        self.pos = end;
        Ok(s)
    }
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Short> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, Short> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Short> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub(crate) fn i32(&mut self) -> Result<i32, Short> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Short> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub(crate) fn i64(&mut self) -> Result<i64, Short> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub(crate) fn str16(&mut self) -> Result<String, Short> {
        let n = self.u16()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    pub(crate) fn str32(&mut self) -> Result<String, Short> {
        let n = self.u32()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
}

impl Record {
    /// Decodes a payload of the given kind. `None` when the payload is shorter than its kind
    /// requires (a writer bug, never a torn tail: the CRC already vouched for the bytes).
    pub fn decode(kind_byte: u8, payload: &[u8]) -> Option<Record> {
        Self::decode_inner(kind_byte, payload).ok()
    }

    fn decode_inner(kind_byte: u8, payload: &[u8]) -> Result<Record, Short> {
        let mut c = Cursor::new(payload);
        Ok(match kind_byte {
            kind::EVENT => {
                let t_ns = c.u64()?;
                let tid = c.u32()?;
                let device = c.i32()?;
                let k = c.u8()?;
                let m = c.u8()?;
                let api = Api(c.u16()?);
                let result = c.i32()?;
                let (Some(kind), Some(mem)) = (EventKind::from_u8(k), MemKind::from_u8(m)) else {
                    return Ok(Record::Unknown { kind: kind_byte });
                };
                Record::Event(Event {
                    t_ns,
                    tid,
                    device,
                    kind,
                    mem,
                    api,
                    result,
                    ptr: c.u64()?,
                    size: c.u64()?,
                    stream: c.u64()?,
                    aux: c.u64()?,
                    free_bytes: c.u64()?,
                    total_bytes: c.u64()?,
                    stack: c.u32()?,
                    label: c.u32()?,
                })
            }
            kind::DEVICE => Record::Device(DeviceInfo {
                ordinal: c.i32()?,
                total_bytes: c.u64()?,
                name: c.str16()?,
            }),
            kind::DRIVER => Record::Driver { version: c.i32()? },
            kind::STRING => Record::String {
                id: c.u32()?,
                text: String::from_utf8_lossy(c.rest()).into_owned(),
            },
            kind::STACK => {
                let id = c.u32()?;
                let rest = c.rest();
                let frames = rest
                    .chunks_exact(8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                Record::Stack { id, frames }
            }
            kind::MODULE => {
                let start = c.u64()?;
                let end = c.u64()?;
                let bias = c.u64()?;
                let path = c.str16()?;
                let n = c.u16()? as usize;
                let build_id = c.take(n)?.to_vec();
                Record::Module(ModuleInfo {
                    start,
                    end,
                    bias,
                    path,
                    build_id,
                })
            }
            kind::ANNOTATE => {
                let t_ns = c.u64()?;
                let tid = c.u32()?;
                let ptr = c.u64()?;
                let name = c.u32()?;
                let dtype = c.u32()?;
                let rank = c.u16()? as usize;
                let mut shape = Vec::with_capacity(rank.min(64));
                for _ in 0..rank {
                    shape.push(c.i64()?);
                }
                Record::Annotate(Annotation {
                    t_ns,
                    tid,
                    ptr,
                    name,
                    dtype,
                    shape,
                })
            }
            kind::RANGE_PUSH => Record::RangePush {
                t_ns: c.u64()?,
                tid: c.u32()?,
                name: c.u32()?,
            },
            kind::RANGE_POP => Record::RangePop {
                t_ns: c.u64()?,
                tid: c.u32()?,
            },
            kind::MARK => Record::Mark {
                t_ns: c.u64()?,
                tid: c.u32()?,
                name: c.u32()?,
            },
            kind::NOTE => Record::Note {
                t_ns: c.u64()?,
                text: String::from_utf8_lossy(c.rest()).into_owned(),
            },
            other => Record::Unknown { kind: other },
        })
    }

    /// Encodes the record into `buf` and returns the finished frame (used by tests and tools;
    /// the preload encodes its hot-path records directly with [`Encoder`]).
    pub fn encode<'b>(&self, buf: &'b mut [u8]) -> &'b [u8] {
        let mut e = Encoder::new(buf);
        let k = match self {
            Record::Event(ev) => {
                let mut tmp = [0u8; EVENT_RECORD_LEN];
                ev.encode(&mut tmp);
                e.bytes(&tmp[FRAME_HEADER_LEN..]);
                kind::EVENT
            }
            Record::Device(d) => {
                e.i32(d.ordinal).u64(d.total_bytes).str(&d.name);
                kind::DEVICE
            }
            Record::Driver { version } => {
                e.i32(*version);
                kind::DRIVER
            }
            Record::String { id, text } => {
                e.u32(*id).bytes(text.as_bytes());
                kind::STRING
            }
            Record::Stack { id, frames } => {
                e.u32(*id);
                for f in frames {
                    e.u64(*f);
                }
                kind::STACK
            }
            Record::Module(m) => {
                e.u64(m.start).u64(m.end).u64(m.bias).str(&m.path);
                e.u16(m.build_id.len() as u16).bytes(&m.build_id);
                kind::MODULE
            }
            Record::Annotate(a) => {
                e.u64(a.t_ns).u32(a.tid).u64(a.ptr).u32(a.name).u32(a.dtype);
                e.u16(a.shape.len() as u16);
                for d in &a.shape {
                    e.i64(*d);
                }
                kind::ANNOTATE
            }
            Record::RangePush { t_ns, tid, name } => {
                e.u64(*t_ns).u32(*tid).u32(*name);
                kind::RANGE_PUSH
            }
            Record::RangePop { t_ns, tid } => {
                e.u64(*t_ns).u32(*tid);
                kind::RANGE_POP
            }
            Record::Mark { t_ns, tid, name } => {
                e.u64(*t_ns).u32(*tid).u32(*name);
                kind::MARK
            }
            Record::Note { t_ns, text } => {
                e.u64(*t_ns).bytes(text.as_bytes());
                kind::NOTE
            }
            Record::Unknown { kind } => *kind,
        };
        let len = e.finish(k).len();
        &buf[..len]
    }
}
