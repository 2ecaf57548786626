//! Version 2 storage: fixed-size blocks, each filled by one thread, and the compact records
//! inside them.
//!
//! A version 2 file is its header ([`crate::Header::encode_blocks`]) and then blocks of
//! `block_size` bytes from `data_offset` on. Block `i` is at `data_offset + i * block_size`.
//! The writer reserves the file's space before handing blocks out, so a fresh block reads as
//! zeros.
//!
//! Block: `[magic u32][tid u32][seq u64][base_t_ns u64][crc32 of bytes 4..24 u32][flags u32]`,
//! then records. The writer stores the magic last, so a block whose magic is zero holds nothing.
//! `seq` is the global order in which blocks were taken (or reused); a thread writes up to three
//! streams, its never-dropped blocks (flags 0), its droppable tensor-level blocks
//! ([`BLOCK_DROPPABLE`]) and its signal handler's ([`BLOCK_SIGNAL`]), and each stream's blocks
//! in `seq` order are its records in the order it wrote them. Under a size budget the writer reuses the oldest droppable blocks: a reused block
//! gets a new header (a later `seq`), and a DROPPED record says what it held.
//!
//! Record: `[tag u8][payload length, LEB128][payload]`. The tag is the record's kind
//! ([`crate::kind`], never zero). The writer writes length and payload first and stores the
//! tag last with release ordering, so a zero tag means "nothing more in this block (yet)": a
//! record cut short by a crash is never seen, and a reader following the live file never reads
//! a half-written one.
//!
//! Payloads: events use the compact encoding of [`encode_event`]; every other kind keeps its
//! version 1 payload ([`crate::Record::encode`] without the frame header).

use crate::api::Api;
use crate::crc::crc32;
use crate::record::{Event, EventKind, MemKind, Record, kind};

/// First four bytes of every written block.
pub const BLOCK_MAGIC: [u8; 4] = *b"VTB2";
/// Bytes in a block header.
pub const BLOCK_HEADER_LEN: usize = 32;
/// The block size the preload writes: large enough that taking a block is rare (about five
/// thousand events), small enough that a reader holds one per live thread.
pub const DEFAULT_BLOCK_SIZE: u32 = 64 << 10;
/// Room an encoded event record needs at most (tag, length and payload).
pub const MAX_EVENT_RECORD_LEN: usize = 112;

/// [`BlockHeader::flags`]: the block holds tensor-level records only, and may be reused under a
/// size budget (its thread's droppable stream).
pub const BLOCK_DROPPABLE: u32 = 1;
/// [`BlockHeader::flags`]: the block holds what a signal handler wrote on that thread (a flight
/// record on `SIGUSR2`), a stream of its own so that it never interleaves with the records the
/// interrupted code was writing.
pub const BLOCK_SIGNAL: u32 = 2;

/// The header of one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BlockHeader {
    /// Kernel thread id of the thread that owns the block.
    pub tid: u32,
    /// Global order in which the block was taken (its index in the file, for the preload).
    pub seq: u64,
    /// A time no later than any time in the block; events' times are deltas starting here.
    pub base_t_ns: u64,
    /// [`BLOCK_DROPPABLE`], [`BLOCK_SIGNAL`] or 0 (written before flags existed: 0).
    pub flags: u32,
}

/// Why a block header is not usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadBlock {
    /// The magic is neither zero nor [`BLOCK_MAGIC`], or the checksum does not match.
    Corrupt,
    /// The file ends inside the header.
    Short,
}

impl BlockHeader {
    /// The header's bytes. The writer stores bytes `4..` first and the magic (`0..4`) last.
    pub fn encode(&self) -> [u8; BLOCK_HEADER_LEN] {
        let mut b = [0u8; BLOCK_HEADER_LEN];
        b[0..4].copy_from_slice(&BLOCK_MAGIC);
        b[4..8].copy_from_slice(&self.tid.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.base_t_ns.to_le_bytes());
        let crc = crc32(&b[4..24]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        b[28..32].copy_from_slice(&self.flags.to_le_bytes());
        b
    }

    /// The stream the block belongs to: its thread, and which of the thread's streams (its
    /// never-dropped records, its droppable ones, its signal handler's). Each stream's blocks in
    /// `seq` order are in time order.
    pub fn stream(&self) -> (u32, u32) {
        (self.tid, self.flags & (BLOCK_DROPPABLE | BLOCK_SIGNAL))
    }

    /// `Ok(None)` for a block nobody wrote (zero magic).
    pub(crate) fn decode(b: &[u8]) -> Result<Option<BlockHeader>, BadBlock> {
        if b.len() < 4 {
            return if b.iter().all(|&x| x == 0) {
                Ok(None)
            } else {
                Err(BadBlock::Short)
            };
        }
        if b[0..4] == [0; 4] {
            return Ok(None);
        }
        if b[0..4] != BLOCK_MAGIC {
            return Err(BadBlock::Corrupt);
        }
        if b.len() < BLOCK_HEADER_LEN {
            return Err(BadBlock::Short);
        }
        let crc = u32::from_le_bytes(b[24..28].try_into().unwrap());
        if crc32(&b[4..24]) != crc {
            return Err(BadBlock::Corrupt);
        }
        Ok(Some(BlockHeader {
            tid: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            seq: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            base_t_ns: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            flags: u32::from_le_bytes(b[28..32].try_into().unwrap()),
        }))
    }
}

/// What an event is encoded against: the previous event of the same block (time and pointer).
/// The writer keeps one per thread and resets it whenever it starts a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Deltas {
    /// Time of the previous event (the block's base time at its start).
    pub t_ns: u64,
    /// Pointer of the previous event (0 at the start of a block).
    pub ptr: u64,
}

impl Deltas {
    /// The state at the start of a block with this header.
    pub fn at_block_start(h: &BlockHeader) -> Deltas {
        Deltas {
            t_ns: h.base_t_ns,
            ptr: 0,
        }
    }
}

/// Flags byte of a compact event: which optional fields follow.
mod has {
    pub const DEVICE: u8 = 1;
    pub const SIZE: u8 = 2;
    pub const STACK: u8 = 4;
    pub const LABEL: u8 = 8;
    pub const STREAM: u8 = 16;
    pub const AUX: u8 = 32;
    pub const RESULT: u8 = 64;
    pub const MEM_INFO: u8 = 128;
}

/// Writes LEB128 `v` at `out[*pos..]`. The caller guarantees room (10 bytes at most).
#[inline(always)]
fn put_varint(out: &mut [u8], pos: &mut usize, mut v: u64) {
    while v >= 0x80 {
        out[*pos] = v as u8 | 0x80;
        *pos += 1;
        v >>= 7;
    }
    out[*pos] = v as u8;
    *pos += 1;
}

#[inline(always)]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline(always)]
fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Encodes `ev` as one complete block record (`[tag][length][payload]`) into `out` and returns
/// its length; `deltas` moves on to this event. The thread id is not encoded (the block's
/// header has it). Never allocates: the preload calls it in hooks.
///
/// Payload: `kind | mem << 4` u8, flags u8 (which optional fields follow), api (LEB128), time
/// delta (zigzag LEB128), pointer delta (zigzag LEB128, wrapping), then in this order and only
/// when nonzero: device (zigzag), size, stack, label, stream, aux, result (zigzag), and free and
/// total together.
#[inline]
pub fn encode_event(
    ev: &Event,
    deltas: &mut Deltas,
    out: &mut [u8; MAX_EVENT_RECORD_LEN],
) -> usize {
    // Payload starts at 2: its length is below 128, so the length takes one byte.
    let mut p = 2;
    out[p] = ev.kind as u8 | (ev.mem as u8) << 4;
    let flags_at = p + 1;
    p += 2;
    put_varint(out, &mut p, ev.api.0 as u64);
    put_varint(
        out,
        &mut p,
        zigzag(ev.t_ns.wrapping_sub(deltas.t_ns) as i64),
    );
    put_varint(out, &mut p, zigzag(ev.ptr.wrapping_sub(deltas.ptr) as i64));
    let mut flags = 0u8;
    if ev.device != 0 {
        flags |= has::DEVICE;
        put_varint(out, &mut p, zigzag(ev.device as i64));
    }
    if ev.size != 0 {
        flags |= has::SIZE;
        put_varint(out, &mut p, ev.size);
    }
    if ev.stack != 0 {
        flags |= has::STACK;
        put_varint(out, &mut p, ev.stack as u64);
    }
    if ev.label != 0 {
        flags |= has::LABEL;
        put_varint(out, &mut p, ev.label as u64);
    }
    if ev.stream != 0 {
        flags |= has::STREAM;
        put_varint(out, &mut p, ev.stream);
    }
    if ev.aux != 0 {
        flags |= has::AUX;
        put_varint(out, &mut p, ev.aux);
    }
    if ev.result != 0 {
        flags |= has::RESULT;
        put_varint(out, &mut p, zigzag(ev.result as i64));
    }
    if ev.free_bytes != 0 || ev.total_bytes != 0 {
        flags |= has::MEM_INFO;
        put_varint(out, &mut p, ev.free_bytes);
        put_varint(out, &mut p, ev.total_bytes);
    }
    out[flags_at] = flags;
    out[0] = kind::EVENT;
    out[1] = (p - 2) as u8;
    deltas.t_ns = ev.t_ns;
    deltas.ptr = ev.ptr;
    p
}

/// Frames a version 1 payload of `kind` as a block record (`[tag][length][payload]`) into
/// `out`; returns its length, or `None` if `out` is too small. Never allocates.
pub fn frame_record(kind: u8, payload: &[u8], out: &mut [u8]) -> Option<usize> {
    let mut len = [0u8; 10];
    let mut n = 0;
    put_varint(&mut len, &mut n, payload.len() as u64);
    let total = 1 + n + payload.len();
    if kind == 0 || out.len() < total {
        return None;
    }
    out[0] = kind;
    out[1..1 + n].copy_from_slice(&len[..n]);
    out[1 + n..total].copy_from_slice(payload);
    Some(total)
}

/// The time carried inside a version 1 payload of a timed side record (annotation, range,
/// mark, note), for a writer that needs a block's base time. `None` for untimed kinds.
pub fn payload_time(kind_byte: u8, payload: &[u8]) -> Option<u64> {
    match kind_byte {
        kind::ANNOTATE
        | kind::OP_OUTPUT
        | kind::RANGE_PUSH
        | kind::RANGE_POP
        | kind::MARK
        | kind::NOTE
        | kind::DROPPED
        | kind::TENSOR_COMPACT
        | kind::TENSOR => Some(u64::from_le_bytes(payload.get(..8)?.try_into().ok()?)),
        _ => None,
    }
}

/// Reads LEB128 values from a payload, bounds-checked.
struct Varints<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Varints<'_> {
    #[inline(always)]
    fn u8(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    #[inline(always)]
    fn u64(&mut self) -> Option<u64> {
        let b = self.u8()?;
        if b < 0x80 {
            return Some(b as u64);
        }
        let mut v = (b & 0x7f) as u64;
        let mut shift = 7;
        loop {
            let b = self.u8()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Some(v);
            }
            shift += 7;
            if shift >= 64 {
                return None;
            }
        }
    }

    #[inline(always)]
    fn i64(&mut self) -> Option<i64> {
        self.u64().map(unzigzag)
    }
}

/// Decodes a compact event payload into `ev` (every field written but `tid`, which the block
/// header gives). `None` when it is malformed; `Some(false)` for an event of a kind this reader
/// does not know (skipped, like an unknown record). Decoding in place, rather than returning
/// an `Event`, keeps its fields' stores aligned with the loads that move it on.
#[inline(always)]
fn decode_event(payload: &[u8], deltas: &mut Deltas, ev: &mut Event) -> Option<bool> {
    let mut c = Varints {
        buf: payload,
        pos: 0,
    };
    let km = c.u8()?;
    let flags = c.u8()?;
    ev.api = Api(c.u64()?.try_into().ok()?);
    ev.t_ns = deltas.t_ns.wrapping_add(c.i64()? as u64);
    ev.ptr = deltas.ptr.wrapping_add(c.i64()? as u64);
    let opt = |c: &mut Varints, bit: u8| -> Option<u64> {
        if flags & bit != 0 { c.u64() } else { Some(0) }
    };
    ev.device = if flags & has::DEVICE != 0 {
        c.i64()?.try_into().ok()?
    } else {
        0
    };
    ev.size = opt(&mut c, has::SIZE)?;
    ev.stack = opt(&mut c, has::STACK)?.try_into().ok()?;
    ev.label = opt(&mut c, has::LABEL)?.try_into().ok()?;
    ev.stream = opt(&mut c, has::STREAM)?;
    ev.aux = opt(&mut c, has::AUX)?;
    ev.result = if flags & has::RESULT != 0 {
        c.i64()?.try_into().ok()?
    } else {
        0
    };
    (ev.free_bytes, ev.total_bytes) = if flags & has::MEM_INFO != 0 {
        (c.u64()?, c.u64()?)
    } else {
        (0, 0)
    };
    deltas.t_ns = ev.t_ns;
    deltas.ptr = ev.ptr;
    let (Some(kind), Some(mem)) = (EventKind::from_u8(km & 0xf), MemKind::from_u8(km >> 4)) else {
        return Some(false);
    };
    ev.kind = kind;
    ev.mem = mem;
    Some(true)
}

/// What reading one step of a block found.
#[derive(Debug)]
pub(crate) enum Step {
    /// A record at this file offset.
    Record(u64, Record),
    /// A record of a known kind whose payload is malformed (skipped; reading goes on).
    Malformed(u64, u8),
    /// Nothing more in the block for now: a zero tag, or (for a growing file) a record whose
    /// bytes have not all been read yet. Reading again later may find more.
    Pending,
    /// The block ends here for good: it is full, or its bytes are not records (reported).
    Done,
}

/// What [`BlockCursor::step_into`] found: [`Step`] with the record left in place.
#[derive(Debug)]
pub(crate) enum Found {
    /// A record at this file offset, decoded into the caller's record.
    Record(u64),
    /// See [`Step::Malformed`].
    Malformed(u64, u8),
    /// See [`Step::Pending`].
    Pending,
    /// See [`Step::Done`].
    Done,
}

/// A position inside one block, decoding its records in order.
#[derive(Clone, Debug)]
pub(crate) struct BlockCursor {
    /// File offset of the block.
    pub(crate) offset: u64,
    /// The block's header.
    pub(crate) header: BlockHeader,
    block_size: usize,
    /// Next record's offset inside the block.
    pos: usize,
    deltas: Deltas,
}

impl BlockCursor {
    pub(crate) fn new(offset: u64, header: BlockHeader, block_size: u32) -> BlockCursor {
        BlockCursor {
            offset,
            header,
            block_size: block_size as usize,
            pos: BLOCK_HEADER_LEN,
            deltas: Deltas::at_block_start(&header),
        }
    }

    /// Offset inside the block of the next record to read.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Decodes the next record from `bytes`, the block's bytes from its start (shorter than the
    /// block when the file ends inside it). `complete`: the file will not grow (a finished
    /// trace), so a record cut by the end of the file, or bytes after a zero tag, are a torn
    /// record and are reported as such in `problems`; otherwise they are awaited.
    #[inline]
    pub(crate) fn step(
        &mut self,
        bytes: &[u8],
        complete: bool,
        problems: &mut Vec<crate::Problem>,
    ) -> Step {
        let mut r = Record::Unknown { kind: 0 };
        match self.step_into(bytes, complete, problems, &mut r) {
            Found::Record(at) => Step::Record(at, r),
            Found::Malformed(at, tag) => Step::Malformed(at, tag),
            Found::Pending => Step::Pending,
            Found::Done => Step::Done,
        }
    }

    /// [`BlockCursor::step`] decoding the record into `out` (only meaningful when
    /// [`Found::Record`] is returned). An event decodes field by field into the event `out`
    /// already holds: a record is not moved on through a return value, whose copy right after
    /// its fields were stored one by one stalls the load on the stores.
    #[inline]
    pub(crate) fn step_into(
        &mut self,
        bytes: &[u8],
        complete: bool,
        problems: &mut Vec<crate::Problem>,
        out: &mut Record,
    ) -> Found {
        let at = self.offset + self.pos as u64;
        if self.pos >= self.block_size {
            return Found::Done;
        }
        let Some(&tag) = bytes.get(self.pos) else {
            return Found::Pending;
        };
        if tag == 0 {
            if complete {
                // A zero tag ends the records; anything nonzero after it is a record whose tag
                // was never stored (the writer died while writing it).
                let rest = &bytes[self.pos..];
                if let Some(last) = rest.iter().rposition(|&b| b != 0) {
                    problems.push(crate::Problem::TornTail {
                        offset: at,
                        bytes: last as u64 + 1,
                    });
                }
                return Found::Done;
            }
            return Found::Pending;
        }
        let mut c = Varints {
            buf: &bytes[..bytes.len().min(self.block_size)],
            pos: self.pos + 1,
        };
        let len = c.u64();
        let start = c.pos;
        let end = len.and_then(|l| start.checked_add(usize::try_from(l).ok()?));
        match end {
            Some(end) if end <= bytes.len() && end <= self.block_size => {
                let payload = &bytes[start..end];
                self.pos = end;
                if tag == kind::EVENT {
                    if !matches!(out, Record::Event(_)) {
                        *out = Record::Event(Event::default());
                    }
                    let Record::Event(ev) = out else {
                        unreachable!("set just above")
                    };
                    ev.tid = self.header.tid;
                    match decode_event(payload, &mut self.deltas, ev) {
                        Some(true) => {}
                        Some(false) => *out = Record::Unknown { kind: tag },
                        None => return Found::Malformed(at, tag),
                    }
                } else {
                    match Record::decode(tag, payload) {
                        Some(r) => *out = r,
                        None => return Found::Malformed(at, tag),
                    }
                }
                Found::Record(at)
            }
            Some(end) if end <= self.block_size => {
                // The file ends inside this record.
                if complete {
                    problems.push(crate::Problem::TornTail {
                        offset: at,
                        bytes: (bytes.len() - self.pos) as u64,
                    });
                    Found::Done
                } else {
                    Found::Pending
                }
            }
            None if bytes.len() < self.block_size && !complete => Found::Pending,
            None if bytes.len() < self.block_size => {
                problems.push(crate::Problem::TornTail {
                    offset: at,
                    bytes: (bytes.len() - self.pos) as u64,
                });
                Found::Done
            }
            _ => {
                // A length that runs past the block: not something the writer produces.
                problems.push(crate::Problem::Corrupt {
                    offset: at,
                    bytes: (self.block_size - self.pos) as u64,
                });
                self.pos = self.block_size;
                Found::Done
            }
        }
    }
}

/// Builds a version 2 file in memory, laid out as the preload lays it out: one block per
/// thread at a time, taken in order. For tests and tools; allocates freely.
#[derive(Debug)]
pub struct BlockFileWriter {
    bytes: Vec<u8>,
    data_offset: usize,
    block_size: usize,
    /// Per thread: its block's start, its next record's position, its deltas.
    threads: Vec<(u32, usize, usize, Deltas)>,
    next_seq: u64,
}

impl BlockFileWriter {
    /// A file with this header and block size (a power of two in [`crate::BLOCK_SIZES`]).
    pub fn new(header: &crate::Header, block_size: u32) -> BlockFileWriter {
        let mut bytes = Vec::new();
        let data_offset = header.encode_blocks(block_size, &mut bytes) as usize;
        bytes.resize(data_offset, 0);
        BlockFileWriter {
            bytes,
            data_offset,
            block_size: block_size as usize,
            threads: Vec::new(),
            next_seq: 0,
        }
    }

    /// Appends `record` to thread `tid`'s block (taking a new block when it is full) and returns
    /// the record's file offset and length. Events are stored under `tid` whatever their own
    /// `tid` field says. `None` if the record cannot fit in a block.
    pub fn push(&mut self, tid: u32, record: &Record) -> Option<(u64, usize)> {
        let mut buf = vec![0u8; self.block_size + 16];
        let t = crate::time_of(record);
        let slot = match self.threads.iter().position(|th| th.0 == tid) {
            Some(i) => i,
            None => {
                self.threads
                    .push((tid, 0, self.block_size, Deltas::default()));
                self.threads.len() - 1
            }
        };
        for attempt in 0..2 {
            let (_, start, pos, mut deltas) = self.threads[slot];
            let n = match record {
                Record::Event(ev) => {
                    let mut rec = [0u8; MAX_EVENT_RECORD_LEN];
                    let n = encode_event(ev, &mut deltas, &mut rec);
                    buf[..n].copy_from_slice(&rec[..n]);
                    n
                }
                other => {
                    let mut v1 = vec![0u8; crate::FRAME_HEADER_LEN + crate::MAX_PAYLOAD];
                    let frame = other.encode(&mut v1);
                    frame_record(frame[1], &frame[crate::FRAME_HEADER_LEN..], &mut buf)?
                }
            };
            if pos + n <= self.block_size {
                self.bytes[start + pos..start + pos + n].copy_from_slice(&buf[..n]);
                self.threads[slot].2 = pos + n;
                self.threads[slot].3 = deltas;
                return Some(((start + pos) as u64, n));
            }
            if attempt == 1 {
                return None;
            }
            // Take a new block.
            let start = self.bytes.len();
            debug_assert_eq!((start - self.data_offset) % self.block_size, 0);
            let h = BlockHeader {
                tid,
                seq: self.next_seq,
                base_t_ns: t.unwrap_or(self.threads[slot].3.t_ns),
                flags: 0,
            };
            self.next_seq += 1;
            self.bytes.resize(start + self.block_size, 0);
            self.bytes[start..start + BLOCK_HEADER_LEN].copy_from_slice(&h.encode());
            self.threads[slot] = (tid, start, BLOCK_HEADER_LEN, Deltas::at_block_start(&h));
        }
        None
    }

    /// The file's bytes so far (every block full size, zeros after its last record).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The file's bytes.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}
