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
    /// The Python frames of a stack id: the interpreter's frames of the thread that made the
    /// event, beside the native frames of the STACK record with the same id.
    pub const PY_STACK: u8 = 12;
    /// A tensor allocated or freed inside PyTorch's caching allocator, or an allocation the
    /// allocator refused ([`crate::TensorEvent`]).
    pub const TENSOR: u8 = 13;
    /// An operator's output tensor (`vramtrace run --torch-shapes`): the operator's name, the
    /// dtype and shape, with the same payload as [`ANNOTATE`]. Not a name someone gave the
    /// allocation, so attribution matches it by size and weighs its shape as evidence.
    pub const OP_OUTPUT: u8 = 14;
    /// Tensor-level records of one block the writer dropped to stay within its size budget
    /// (`vramtrace run --max-size`): whose thread, and the time range they covered
    /// ([`crate::Record::Dropped`]). Never itself dropped.
    pub const DROPPED: u8 = 15;
    /// A tensor event without operator, dtype, shape or PyTorch's failure numbers, in about a
    /// third of a [`TENSOR`]'s bytes: the time as 8 bytes, then LEB128 varints for the thread,
    /// the device + 1, the action, pointer, size, requested bytes, stack id and segment. Read
    /// as a [`crate::Record::Tensor`] with those fields zero. Blocks handed out and taken back,
    /// and the restated live tensors, are written this way.
    pub const TENSOR_COMPACT: u8 = 16;
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
    /// A handle to physical memory this process did not allocate: imported from another
    /// process (`cuMemImportFromShareableHandle`) or retained again from a mapped address
    /// (`cuMemRetainAllocationHandle`). Never this process's device bytes; the size is not
    /// known at the call (0) and is what the handle is mapped as.
    Imported = 7,
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
            7 => Self::Imported,
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
            Self::Imported => "imported",
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
    /// Appends an unsigned LEB128 varint. Written in place, and never inlined: a tensor record
    /// takes nine, and with the bytes staged in an array and copied (a call to `memcpy`) each
    /// inlined copy was some 150 bytes of code, the encoding 40 instruction-cache misses per
    /// tensor when a model's work has evicted it between two tensors (docs/performance.md,
    /// "Cold caches").
    #[inline(never)]
    pub fn varint(&mut self, mut v: u64) -> &mut Self {
        const MAX: usize = 10;
        if self.remaining() < MAX {
            // Near the end: staged, so that a varint that does not fit leaves nothing behind.
            let mut b = [0u8; MAX];
            let mut n = 0;
            while v >= 0x80 {
                b[n] = v as u8 | 0x80;
                v >>= 7;
                n += 1;
            }
            b[n] = v as u8;
            return self.bytes(&b[..=n]);
        }
        let out = &mut self.buf[self.len..self.len + MAX];
        let mut n = 0;
        while v >= 0x80 && n < MAX - 1 {
            out[n] = v as u8 | 0x80;
            v >>= 7;
            n += 1;
        }
        out[n] = v as u8;
        self.len += n + 1;
        self
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

    /// The record for a writer that keeps only its kind and payload (format version 2 blocks,
    /// whose records carry no checksum of their own): the frame header as [`Encoder::finish`]
    /// writes it but with a zero checksum, which is not computed. A version 1 stream needs
    /// [`Encoder::finish`].
    pub fn finish_without_checksum(&mut self, kind: u8) -> &[u8] {
        let payload_len = (self.len - FRAME_HEADER_LEN) as u16;
        self.buf[0] = FRAME_MAGIC;
        self.buf[1] = kind;
        self.buf[2..4].copy_from_slice(&payload_len.to_le_bytes());
        self.buf[4..8].fill(0);
        &self.buf[..self.len]
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

/// What lies at a position of a record stream.
pub(crate) enum FrameCheck {
    Ok { kind: u8, total: usize },
    Incomplete,
    Bad,
}

/// Is there a complete, checksum-valid frame at `pos`? Returns its total length.
pub(crate) fn frame_at(buf: &[u8], pos: usize) -> FrameCheck {
    let rest = &buf[pos..];
    if rest.is_empty() {
        return FrameCheck::Incomplete;
    }
    if rest[0] != FRAME_MAGIC {
        return FrameCheck::Bad;
    }
    if rest.len() < FRAME_HEADER_LEN {
        return FrameCheck::Incomplete;
    }
    let kind = rest[1];
    let len = u16::from_le_bytes([rest[2], rest[3]]);
    let total = FRAME_HEADER_LEN + len as usize;
    if rest.len() < total {
        return FrameCheck::Incomplete;
    }
    let crc = u32::from_le_bytes(rest[4..8].try_into().unwrap());
    if frame_crc(kind, len, &rest[FRAME_HEADER_LEN..total]) != crc {
        return FrameCheck::Bad;
    }
    FrameCheck::Ok { kind, total }
}

/// Most dimensions a TENSOR record keeps.
pub const MAX_TENSOR_RANK: usize = 16;
/// Largest TENSOR record, frame included.
pub const TENSOR_RECORD_MAX_LEN: usize =
    FRAME_HEADER_LEN + 8 + 4 + 4 + 1 + 8 * 7 + 4 * 3 + 2 + 8 * MAX_TENSOR_RANK + 8 + 8;

/// Largest TENSOR_COMPACT record, frame included.
pub const TENSOR_COMPACT_MAX_LEN: usize = FRAME_HEADER_LEN + 8 + 10 * 9;

impl TensorEvent {
    /// Whether the event fits a TENSOR_COMPACT record (no operator, dtype, shape or failure
    /// numbers).
    pub fn is_compact(&self) -> bool {
        self.op == 0
            && self.dtype == 0
            && self.shape.is_empty()
            && self.allocated == 0
            && self.reserved == 0
            && self.limit == 0
            && self.free == 0
    }

    /// Appends the TENSOR_COMPACT payload (see [`kind::TENSOR_COMPACT`]); only what
    /// [`TensorEvent::is_compact`] allows is kept.
    pub fn encode_compact_payload(&self, e: &mut Encoder<'_>) {
        e.u64(self.t_ns)
            .varint(self.tid as u64)
            .varint((self.device as i64 + 1) as u64)
            .varint(self.action as u64)
            .varint(self.ptr)
            .varint(self.size)
            .varint(self.requested)
            .varint(self.stack as u64)
            .varint(self.segment);
        // The stream last, and only when known: a record without it reads as stream 0.
        if self.stream != 0 {
            e.varint(self.stream);
        }
    }

    /// Appends the payload (without allocating; the shape is cut to [`MAX_TENSOR_RANK`]).
    pub fn encode_payload(&self, e: &mut Encoder<'_>) {
        self.encode_payload_with_shape(e, &self.shape);
    }

    /// [`TensorEvent::encode_payload`] with `shape` in place of the event's own (a writer that
    /// must not allocate keeps its shape in an array).
    pub fn encode_payload_with_shape(&self, e: &mut Encoder<'_>, shape: &[i64]) {
        let shape = &shape[..shape.len().min(MAX_TENSOR_RANK)];
        e.u64(self.t_ns)
            .u32(self.tid)
            .i32(self.device)
            .u8(self.action as u8)
            .u64(self.ptr)
            .u64(self.size)
            .u64(self.segment)
            .u64(self.allocated)
            .u64(self.reserved)
            .u64(self.limit)
            .u64(self.free)
            .u32(self.stack)
            .u32(self.op)
            .u32(self.dtype)
            .u16(shape.len() as u16);
        for &d in shape {
            e.i64(d);
        }
        e.u64(self.requested).u64(self.stream);
    }
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
    /// An operator's output ([`kind::OP_OUTPUT`]): `name` is the operator (`empty_like`), not a
    /// tensor name.
    pub op: bool,
}

/// One Python frame: where the interpreter was in one function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PyFrame {
    /// Interned id of the code object's file name (`co_filename`).
    pub file: u32,
    /// Interned id of the function's name (`co_name`).
    pub function: u32,
    /// The line being executed (0 when unknown).
    pub line: u32,
}

/// Bytes of one [`PyFrame`] in a PY_STACK payload.
pub const PY_FRAME_LEN: usize = 12;

/// What a tensor event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum TensorAction {
    /// The caching allocator handed out a block.
    #[default]
    Alloc = 1,
    /// A block went back to the cache.
    Free = 2,
    /// The allocator raised an out-of-memory error for a request of `size` bytes.
    AllocFailed = 3,
    /// The block at `ptr` is live at `t_ns`: a restatement, written when the record of its
    /// allocation was dropped to stay within the size budget, or one entry of a flight record
    /// (the whole live set, at a failure or on request). `stack` is the allocation's. A reader
    /// that has the block live already ignores it; one that does not takes it as allocated
    /// then. Readers older than this action skip it.
    Live = 4,
}

impl TensorAction {
    /// Decodes the byte; `None` for actions this reader does not know.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Alloc,
            2 => Self::Free,
            3 => Self::AllocFailed,
            4 => Self::Live,
            _ => return None,
        })
    }

    /// The name used in `vramtrace events` output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Alloc => "tensor_alloc",
            Self::Free => "tensor_free",
            Self::AllocFailed => "tensor_alloc_failed",
            Self::Live => "tensor_live",
        }
    }
}

/// A tensor-level event reported by the Python probe from inside PyTorch: a block of the
/// caching allocator handed out or returned (inside a segment the driver events show), or a
/// request the allocator refused, with the allocator's own numbers at that moment.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TensorEvent {
    /// `CLOCK_MONOTONIC` in nanoseconds, the clock of every other record.
    pub t_ns: u64,
    /// Kernel thread id of the reporting thread.
    pub tid: u32,
    /// Device ordinal, -1 if unknown.
    pub device: i32,
    /// What happened.
    pub action: TensorAction,
    /// The tensor's data pointer (0 for a failed request).
    pub ptr: u64,
    /// Bytes: the block's size for an allocation, 0 for a free (the reader pairs it), the
    /// requested bytes for a failure.
    pub size: u64,
    /// Base address of the segment holding the block, 0 if unknown (the reader finds it among
    /// the driver's allocations).
    pub segment: u64,
    /// Bytes the allocator had allocated to tensors at a failure, else 0.
    pub allocated: u64,
    /// Bytes the allocator had reserved from the driver at a failure, else 0.
    pub reserved: u64,
    /// The allocator's limit at a failure (`set_per_process_memory_fraction`), 0 for none.
    pub limit: u64,
    /// Free device memory the driver reported at a failure, else 0.
    pub free: u64,
    /// Id of the stack ([`Record::Stack`], with its [`Record::PyStack`]), 0 for none.
    pub stack: u32,
    /// Interned id of the operator that produced the tensor, 0 if unknown.
    pub op: u32,
    /// Interned id of the dtype, 0 if unknown.
    pub dtype: u32,
    /// The shape, outermost first; empty if unknown.
    pub shape: Vec<i64>,
    /// For an allocation, the bytes the program asked for (PyTorch's `requested_bytes`
    /// counter), 0 if unknown; `size` is the block, rounded up by the allocator (to 512 bytes,
    /// and a large block is not split when less than 1 MiB would remain). Stored after the
    /// shape: traces written before it read as 0.
    pub requested: u64,
    /// The CUDA stream the block was allocated for (`cudaStream_t`, 0 for the default stream
    /// or unknown), as PyTorch's caching allocator records it. Stored after `requested`:
    /// traces written before it read as 0.
    pub stream: u64,
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
    /// The Python frames of a stack.
    PyStack {
        /// The id of the STACK record these frames go with.
        stack: u32,
        /// Python frames, innermost first.
        frames: Vec<PyFrame>,
    },
    /// A tensor allocated, freed or refused inside PyTorch's caching allocator.
    Tensor(TensorEvent),
    /// Tensor-level records dropped by the writer to stay within its size budget: one block of
    /// thread `tid`'s, covering `from_t_ns..=to_t_ns`, dropped at `t_ns`.
    Dropped {
        /// When the block was dropped.
        t_ns: u64,
        /// The thread that had written it.
        tid: u32,
        /// Base time of the block (no record in it is earlier).
        from_t_ns: u64,
        /// Time of its last record.
        to_t_ns: u64,
        /// The block's index in the file (reused at once: a follower reads it again).
        index: u64,
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
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
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
    pub(crate) fn varint(&mut self) -> Result<u64, Short> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(Short)
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
            kind::ANNOTATE | kind::OP_OUTPUT => {
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
                    op: kind_byte == kind::OP_OUTPUT,
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
            kind::TENSOR_COMPACT => {
                let t_ns = c.u64()?;
                let tid = c.varint()? as u32;
                let device = (c.varint()? as i64 - 1) as i32;
                let Some(action) = u8::try_from(c.varint()?)
                    .ok()
                    .and_then(TensorAction::from_u8)
                else {
                    return Ok(Record::Unknown { kind: kind_byte });
                };
                Record::Tensor(TensorEvent {
                    t_ns,
                    tid,
                    device,
                    action,
                    ptr: c.varint()?,
                    size: c.varint()?,
                    requested: c.varint()?,
                    stack: c.varint()? as u32,
                    segment: c.varint()?,
                    stream: if c.remaining() > 0 { c.varint()? } else { 0 },
                    ..TensorEvent::default()
                })
            }
            kind::DROPPED => Record::Dropped {
                t_ns: c.u64()?,
                tid: c.u32()?,
                from_t_ns: c.u64()?,
                to_t_ns: c.u64()?,
                index: c.u64()?,
            },
            kind::NOTE => Record::Note {
                t_ns: c.u64()?,
                text: String::from_utf8_lossy(c.rest()).into_owned(),
            },
            kind::PY_STACK => {
                let stack = c.u32()?;
                let frames = c
                    .rest()
                    .chunks_exact(PY_FRAME_LEN)
                    .map(|b| PyFrame {
                        file: u32::from_le_bytes(b[0..4].try_into().unwrap()),
                        function: u32::from_le_bytes(b[4..8].try_into().unwrap()),
                        line: u32::from_le_bytes(b[8..12].try_into().unwrap()),
                    })
                    .collect();
                Record::PyStack { stack, frames }
            }
            kind::TENSOR => {
                let t_ns = c.u64()?;
                let tid = c.u32()?;
                let device = c.i32()?;
                let Some(action) = TensorAction::from_u8(c.u8()?) else {
                    return Ok(Record::Unknown { kind: kind_byte });
                };
                let mut t = TensorEvent {
                    t_ns,
                    tid,
                    device,
                    action,
                    ptr: c.u64()?,
                    size: c.u64()?,
                    segment: c.u64()?,
                    allocated: c.u64()?,
                    reserved: c.u64()?,
                    limit: c.u64()?,
                    free: c.u64()?,
                    stack: c.u32()?,
                    op: c.u32()?,
                    dtype: c.u32()?,
                    shape: Vec::new(),
                    requested: 0,
                    stream: 0,
                };
                let rank = c.u16()? as usize;
                for _ in 0..rank.min(64) {
                    t.shape.push(c.i64()?);
                }
                if c.remaining() >= 8 {
                    t.requested = c.u64()?;
                }
                if c.remaining() >= 8 {
                    t.stream = c.u64()?;
                }
                Record::Tensor(t)
            }
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
                if a.op {
                    kind::OP_OUTPUT
                } else {
                    kind::ANNOTATE
                }
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
            Record::Dropped {
                t_ns,
                tid,
                from_t_ns,
                to_t_ns,
                index,
            } => {
                e.u64(*t_ns)
                    .u32(*tid)
                    .u64(*from_t_ns)
                    .u64(*to_t_ns)
                    .u64(*index);
                kind::DROPPED
            }
            Record::PyStack { stack, frames } => {
                e.u32(*stack);
                for f in frames {
                    e.u32(f.file).u32(f.function).u32(f.line);
                }
                kind::PY_STACK
            }
            Record::Tensor(t) => {
                t.encode_payload(&mut e);
                kind::TENSOR
            }
            Record::Unknown { kind } => *kind,
        };
        let len = e.finish(k).len();
        &buf[..len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BlockFileWriter, Header, TraceFile};

    /// Every length of varint, written in place, reads back; near the buffer's end (where it is
    /// staged) one that does not fit leaves nothing behind.
    #[test]
    fn varints_read_back_written_in_place_or_near_the_end() {
        let values = [
            0,
            1,
            127,
            128,
            300,
            1 << 35,
            (1 << 56) - 1,
            1 << 63,
            u64::MAX,
        ];
        let mut buf = [0u8; FRAME_HEADER_LEN + 128];
        let mut e = Encoder::new(&mut buf);
        for &v in &values {
            e.varint(v);
        }
        let len = e.len;
        let mut c = Cursor::new(&buf[FRAME_HEADER_LEN..len]);
        for &v in &values {
            assert_eq!(c.varint().ok(), Some(v));
        }
        assert_eq!(c.remaining(), 0);
        for room in 0..12 {
            let mut buf = [0xaau8; FRAME_HEADER_LEN + 12];
            let mut e = Encoder::new(&mut buf[..FRAME_HEADER_LEN + room]);
            e.varint(u64::MAX);
            assert_eq!(e.overflow, room < 10, "room {room}");
            let written = e.len - FRAME_HEADER_LEN;
            assert_eq!(written, if room < 10 { 0 } else { 10 }, "room {room}");
            if room >= 10 {
                let mut c = Cursor::new(&buf[FRAME_HEADER_LEN..FRAME_HEADER_LEN + written]);
                assert_eq!(c.varint().ok(), Some(u64::MAX));
            }
        }
    }

    /// Every length of varint, at and around each boundary, byte for byte LEB128, whatever room
    /// follows it.
    #[test]
    fn varints_are_leb128_at_every_length() {
        fn leb128(mut v: u64) -> Vec<u8> {
            let mut out = Vec::new();
            while v >= 0x80 {
                out.push(v as u8 | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
            out
        }
        let mut values = vec![0u64, 1, 0x5150, 0x7e00_0000_0000, u64::MAX];
        for k in 1..10 {
            let edge = 1u64 << (7 * k);
            values.extend([edge - 1, edge, edge + 1, edge | 0x55]);
        }
        // And values of every bit length, each bit pattern a different one (xorshift).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for bits in 1..=64 {
            for _ in 0..8 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                values.push((x >> (64 - bits)) | (1 << (bits - 1)));
            }
        }
        for &v in &values {
            let mut want = leb128(v);
            want.push(3);
            // From the least room both fit in (staged near the end) to plenty (in place).
            for room in want.len()..20 {
                let mut buf = [0xaau8; FRAME_HEADER_LEN + 20];
                let mut e = Encoder::new(&mut buf[..FRAME_HEADER_LEN + room]);
                e.varint(v).varint(3);
                assert!(!e.overflowed(), "{v:#x}, room {room}");
                let len = e.len;
                assert_eq!(
                    &buf[FRAME_HEADER_LEN..len],
                    &want[..],
                    "{v:#x}, room {room}"
                );
            }
        }
    }

    fn py_stack() -> Record {
        Record::PyStack {
            stack: 7,
            frames: vec![
                PyFrame {
                    file: 3,
                    function: 4,
                    line: 565,
                },
                PyFrame {
                    file: 5,
                    function: 6,
                    line: 1,
                },
            ],
        }
    }

    #[test]
    fn a_compact_tensor_keeps_its_stream() {
        let t = TensorEvent {
            t_ns: 5,
            tid: 1,
            action: TensorAction::Alloc,
            ptr: 0x7f00_0000_0000,
            size: 512,
            requested: 500,
            stream: 0x5555_0000_1230,
            ..TensorEvent::default()
        };
        assert!(t.is_compact());
        let mut buf = [0u8; TENSOR_COMPACT_MAX_LEN];
        let mut e = Encoder::new(&mut buf);
        t.encode_compact_payload(&mut e);
        let frame = e.finish(kind::TENSOR_COMPACT).to_vec();
        assert_eq!(
            Record::decode(kind::TENSOR_COMPACT, &frame[FRAME_HEADER_LEN..]),
            Some(Record::Tensor(t))
        );
    }

    #[test]
    fn a_compact_tensor_reads_back_as_the_same_event_in_a_third_of_the_bytes() {
        for (device, action) in [(0, TensorAction::Alloc), (-1, TensorAction::Live)] {
            let t = TensorEvent {
                t_ns: 1_234_567_890_123,
                tid: 4242,
                device,
                action,
                ptr: 0x7f00_1234_5600,
                size: 3 << 20,
                requested: (3 << 20) - 7,
                stack: 77,
                ..TensorEvent::default()
            };
            assert!(t.is_compact());
            let mut buf = [0u8; TENSOR_COMPACT_MAX_LEN];
            let mut e = Encoder::new(&mut buf);
            t.encode_compact_payload(&mut e);
            let frame = e.finish(kind::TENSOR_COMPACT).to_vec();
            assert_eq!(
                frame.len() - FRAME_HEADER_LEN,
                8 + 2 + 1 + 1 + 7 + 4 + 4 + 1 + 1
            );
            assert_eq!(
                Record::decode(kind::TENSOR_COMPACT, &frame[FRAME_HEADER_LEN..]),
                Some(Record::Tensor(t))
            );
        }
        let refused = TensorEvent {
            action: TensorAction::AllocFailed,
            allocated: 1,
            ..TensorEvent::default()
        };
        assert!(
            !refused.is_compact(),
            "PyTorch's numbers need the full record"
        );
    }

    fn tensor() -> Record {
        Record::Tensor(TensorEvent {
            t_ns: 1_000,
            tid: 42,
            device: 0,
            action: TensorAction::AllocFailed,
            ptr: 0,
            size: 50_724_864,
            segment: 0,
            allocated: 17 << 30,
            reserved: 18 << 30,
            limit: 18 << 30,
            free: 100 << 30,
            stack: 7,
            op: 8,
            dtype: 9,
            shape: vec![1, 4128, 48, 128],
            requested: 50_724_860,
            stream: 0x5555_0000_1230,
        })
    }

    #[test]
    fn py_stack_and_tensor_round_trip_in_both_layouts() {
        let mut buf = vec![0u8; 4096];
        for r in [py_stack(), tensor()] {
            let frame = r.encode(&mut buf).to_vec();
            assert_eq!(
                Record::decode(frame[1], &frame[FRAME_HEADER_LEN..]),
                Some(r.clone())
            );
        }
        let mut w = BlockFileWriter::new(&Header::default(), 1 << 16);
        w.push(42, &py_stack()).unwrap();
        w.push(42, &tensor()).unwrap();
        let t = TraceFile::from_bytes("t".as_ref(), &w.finish()).unwrap();
        assert!(t.problems.is_empty(), "{:?}", t.problems);
        assert_eq!(t.records, vec![py_stack(), tensor()]);
    }

    #[test]
    fn a_tensor_record_fits_its_maximum_and_keeps_sixteen_dimensions() {
        let Record::Tensor(mut t) = tensor() else {
            unreachable!()
        };
        t.shape = (0..40).collect();
        let mut buf = [0u8; TENSOR_RECORD_MAX_LEN];
        let mut e = Encoder::new(&mut buf);
        t.encode_payload(&mut e);
        assert!(!e.overflowed());
        let frame = e.finish(kind::TENSOR).to_vec();
        assert_eq!(frame.len(), TENSOR_RECORD_MAX_LEN);
        let Some(Record::Tensor(back)) = Record::decode(kind::TENSOR, &frame[FRAME_HEADER_LEN..])
        else {
            panic!("not a tensor record")
        };
        assert_eq!(back.shape, (0..16).collect::<Vec<i64>>());
    }

    #[test]
    fn a_tensor_record_written_before_requested_reads_as_unknown_request() {
        let mut buf = vec![0u8; 4096];
        let frame = tensor().encode(&mut buf).to_vec();
        let old = &frame[FRAME_HEADER_LEN..frame.len() - 16];
        let Some(Record::Tensor(back)) = Record::decode(kind::TENSOR, old) else {
            panic!("not a tensor record")
        };
        assert_eq!(back.requested, 0);
        assert_eq!(back.stream, 0);
        assert_eq!(back.shape, vec![1, 4128, 48, 128]);
    }

    #[test]
    fn a_tensor_record_written_before_stream_reads_as_unknown_stream() {
        let mut buf = vec![0u8; 4096];
        let frame = tensor().encode(&mut buf).to_vec();
        let old = &frame[FRAME_HEADER_LEN..frame.len() - 8];
        let Some(Record::Tensor(back)) = Record::decode(kind::TENSOR, old) else {
            panic!("not a tensor record")
        };
        assert_eq!(back.requested, 50_724_860);
        assert_eq!(back.stream, 0);
    }

    #[test]
    fn an_unknown_tensor_action_is_skipped_not_misread() {
        let mut buf = vec![0u8; 4096];
        let mut frame = tensor().encode(&mut buf).to_vec();
        frame[FRAME_HEADER_LEN + 16] = 99; // the action byte
        assert_eq!(
            Record::decode(kind::TENSOR, &frame[FRAME_HEADER_LEN..]),
            Some(Record::Unknown { kind: kind::TENSOR })
        );
    }
}
