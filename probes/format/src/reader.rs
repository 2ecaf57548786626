//! Reading traces: whole files after the fact, or the growing tail of a live one.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::FileExt;

use crate::block::{BLOCK_HEADER_LEN, BadBlock, BlockCursor, BlockHeader, Step};
use crate::header::{Header, HeaderError, Layout};
use crate::record::{DeviceInfo, FRAME_HEADER_LEN, FRAME_MAGIC, FrameCheck, Record, frame_at};

/// Something wrong with the bytes of a trace that the reader stepped over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The file ends inside a record: the writer died while writing it (or, for a live file,
    /// is still writing it). The partial record is dropped, never decoded.
    TornTail {
        /// File offset where the partial record starts.
        offset: u64,
        /// How many bytes of it there are.
        bytes: u64,
    },
    /// Bytes that are not a valid record, followed by valid records again (skipped).
    Corrupt {
        /// File offset where the bad bytes start.
        offset: u64,
        /// How many bytes were skipped.
        bytes: u64,
    },
    /// A version 2 block whose header is not a block header (bad magic or checksum): the
    /// whole block is skipped.
    BadBlock {
        /// File offset of the block.
        offset: u64,
        /// Its size.
        bytes: u64,
    },
    /// Part of the file could not be read (an I/O error while streaming); skipped.
    Unreadable {
        /// File offset of the part.
        offset: u64,
        /// The error, as the system described it.
        error: String,
    },
    /// The file header's checksum failed (or its fields did not parse): the header fields that
    /// could be read are kept but may be wrong, and the records after it are still read.
    DamagedHeader {
        /// Header fields that could not be read at all (left empty or zero).
        unread: Vec<&'static str>,
        /// The header could not say where the blocks are (version 2): they were found by
        /// scanning for block magics from the first page boundary.
        scanned: bool,
    },
    /// A record whose checksum is right but whose payload is shorter than its kind needs.
    Malformed {
        /// File offset of the record.
        offset: u64,
        /// Its kind byte.
        kind: u8,
    },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::TornTail { offset, bytes } => write!(
                f,
                "torn last record at byte {offset} ({bytes} bytes, dropped): the process died while writing it"
            ),
            Problem::Corrupt { offset, bytes } => {
                write!(f, "{bytes} corrupt bytes at byte {offset} skipped")
            }
            Problem::BadBlock { offset, bytes } => write!(
                f,
                "block of {bytes} bytes at byte {offset} is not a block (bad magic or checksum), skipped"
            ),
            Problem::Unreadable { offset, error } => {
                write!(f, "cannot read at byte {offset} ({error}), skipped")
            }
            Problem::DamagedHeader { unread, scanned } => {
                write!(
                    f,
                    "damaged file header (checksum failed): pid, ppid, start time, host and command line may be wrong"
                )?;
                if !unread.is_empty() {
                    write!(f, "; unreadable: {}", unread.join(", "))?;
                }
                if *scanned {
                    write!(f, "; blocks found by scanning for block magics")?;
                }
                write!(f, "; the records after it were read")
            }
            Problem::Malformed { offset, kind } => {
                write!(
                    f,
                    "malformed record of kind {kind} at byte {offset} skipped"
                )
            }
        }
    }
}

/// The result of scanning a buffer of records.
#[derive(Debug, Default)]
pub struct Scan {
    /// Decoded records with their file offsets, in file order.
    pub records: Vec<(u64, Record)>,
    /// Bytes of the buffer consumed by complete records (and skipped corruption). Anything after
    /// this is an incomplete last record.
    pub consumed: usize,
    /// Corruption found in the middle.
    pub problems: Vec<Problem>,
    /// Of the unconsumed bytes after `consumed`, how many can never start a valid record
    /// whatever follows them (no frame magic, or a frame that is already complete and bad). A
    /// streaming reader may drop them (remembering their offset) instead of scanning them again
    /// with the next chunk: that keeps it linear and bounded over a body of zeros.
    pub dead: usize,
}

/// The first position at or after `from` holding [`FRAME_MAGIC`].
fn magic_from(buf: &[u8], from: usize) -> Option<usize> {
    let rest = buf.get(from..)?;
    // Eight bytes at a time: a word with no byte equal to the magic is skipped whole.
    let pattern = u64::from_ne_bytes([FRAME_MAGIC; 8]);
    let mut i = 0;
    while i + 8 <= rest.len() {
        let w = u64::from_ne_bytes(rest[i..i + 8].try_into().unwrap()) ^ pattern;
        if (w.wrapping_sub(0x0101_0101_0101_0101) & !w & 0x8080_8080_8080_8080) != 0 {
            break;
        }
        i += 8;
    }
    rest[i..]
        .iter()
        .position(|&b| b == FRAME_MAGIC)
        .map(|k| from + i + k)
}

/// Scans `buf` (which starts at file offset `base`) for records. Stops before an incomplete last
/// record; skips (and reports) corrupt bytes between valid records.
pub fn scan_records(buf: &[u8], base: u64) -> Scan {
    let mut scan = Scan::default();
    let mut pos = 0usize;
    while pos < buf.len() {
        match frame_at(buf, pos) {
            FrameCheck::Ok { kind, total } => {
                let payload = &buf[pos + FRAME_HEADER_LEN..pos + total];
                match Record::decode(kind, payload) {
                    Some(r) => scan.records.push((base + pos as u64, r)),
                    None => scan.problems.push(Problem::Malformed {
                        offset: base + pos as u64,
                        kind,
                    }),
                }
                pos += total;
                scan.consumed = pos;
            }
            FrameCheck::Incomplete => break,
            FrameCheck::Bad => {
                // Look for the next valid frame. If none follows, the bad bytes are the tail
                // (a record torn in the middle of its header or payload) and stay unconsumed.
                let start = pos;
                let mut next = None;
                let mut p = pos + 1;
                // Jump from one frame magic to the next (a body of zeros has none).
                while let Some(q) = magic_from(buf, p) {
                    if matches!(frame_at(buf, q), FrameCheck::Ok { .. }) {
                        next = Some(q);
                        break;
                    }
                    p = q + 1;
                }
                match next {
                    Some(p) => {
                        scan.problems.push(Problem::Corrupt {
                            offset: base + start as u64,
                            bytes: (p - start) as u64,
                        });
                        pos = p;
                        scan.consumed = pos;
                    }
                    None => {
                        // Bytes before the first position where a frame could still complete
                        // with more data are dead: nothing can start there.
                        let mut live = buf.len();
                        let mut q = start + 1;
                        while let Some(m) = magic_from(buf, q) {
                            if matches!(frame_at(buf, m), FrameCheck::Incomplete) {
                                live = m;
                                break;
                            }
                            q = m + 1;
                        }
                        scan.dead = live - start;
                        break;
                    }
                }
            }
        }
    }
    scan
}

/// Why a trace file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be opened or read.
    Io(PathBuf, io::Error),
    /// The header is not a valid vramtrace header.
    Header(PathBuf, HeaderError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(p, _) => write!(f, "cannot read {}", p.display()),
            ReadError::Header(p, _) => write!(f, "{} is not a readable trace", p.display()),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io(_, e) => Some(e),
            ReadError::Header(_, e) => Some(e),
        }
    }
}

/// One process's trace file, read whole.
#[derive(Debug, Clone)]
pub struct TraceFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// The static header.
    pub header: Header,
    /// The driver version, once the process reported it.
    pub driver_version: Option<i32>,
    /// The devices the process reported, by ordinal.
    pub devices: Vec<DeviceInfo>,
    /// Every record (device and driver records included): in file order for version 1; for
    /// version 2 in time order across threads, each thread's untimed records (strings, stacks)
    /// where it wrote them between its timed ones, ties in file order.
    pub records: Vec<Record>,
    /// Problems met while reading (a torn tail after a crash is the common one).
    pub problems: Vec<Problem>,
}

impl TraceFile {
    /// Reads and decodes a trace file.
    pub fn read(path: &Path) -> Result<TraceFile, ReadError> {
        let bytes = std::fs::read(path).map_err(|e| ReadError::Io(path.to_path_buf(), e))?;
        Self::from_bytes(path, &bytes)
    }

    /// Decodes a trace from its bytes (`path` only names it in messages).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<TraceFile, ReadError> {
        let rec = Header::decode_lenient(bytes, bytes.len() as u64, &mut |at, buf| {
            read_slice(bytes, at, buf)
        })
        .map_err(|e| ReadError::Header(path.to_path_buf(), e))?;
        let (header, layout) = (rec.header, rec.layout);
        let (records, mut problems) = match layout {
            Layout::Stream { start } => {
                let start = start as usize;
                let scan = scan_records(&bytes[start..], start as u64);
                let mut problems = scan.problems;
                let tail_at = start + scan.consumed;
                if tail_at < bytes.len() {
                    problems.push(Problem::TornTail {
                        offset: tail_at as u64,
                        bytes: (bytes.len() - tail_at) as u64,
                    });
                }
                (scan.records, problems)
            }
            Layout::Blocks {
                data_offset,
                block_size,
            } => decode_blocks(bytes, data_offset, block_size),
        };
        if let Some(d) = rec.damage {
            problems.insert(0, d);
        }
        let mut t = TraceFile {
            path: path.to_path_buf(),
            header,
            driver_version: None,
            devices: Vec::new(),
            records: Vec::with_capacity(records.len()),
            problems,
        };
        for (_, r) in records {
            t.note(&r);
            t.records.push(r);
        }
        Ok(t)
    }

    fn note(&mut self, r: &Record) {
        match r {
            Record::Driver { version } => self.driver_version = Some(*version),
            Record::Device(d) => {
                if let Some(old) = self.devices.iter_mut().find(|o| o.ordinal == d.ordinal) {
                    *old = d.clone();
                } else {
                    self.devices.push(d.clone());
                    self.devices.sort_by_key(|d| d.ordinal);
                }
            }
            _ => {}
        }
    }
}

/// Decodes the blocks of a whole version 2 file held in memory. The records come in time
/// order across threads, as a version 1 file has them: each record is keyed by its time (an
/// untimed one, such as a string or a stack, by the time of its thread's record before it, so it
/// stays where its thread wrote it), ties in file order.
fn decode_blocks(
    bytes: &[u8],
    data_offset: u64,
    block_size: u32,
) -> (Vec<(u64, Record)>, Vec<Problem>) {
    let mut keyed = Vec::new();
    let mut problems = Vec::new();
    let mut last_t: HashMap<(u32, u32), u64> = HashMap::new();
    let mut offset = data_offset;
    while offset < bytes.len() as u64 {
        let end = (offset + block_size as u64).min(bytes.len() as u64);
        let block = &bytes[offset as usize..end as usize];
        if let Some(h) = block_header(block, offset, block_size, true, &mut problems) {
            let t = last_t.entry(h.stream()).or_insert(0);
            *t = (*t).max(h.base_t_ns);
            let mut cur = BlockCursor::new(offset, h, block_size);
            loop {
                match cur.step(block, true, &mut problems) {
                    Step::Record(at, r) => {
                        if let Some(rt) = crate::time_of(&r) {
                            *t = rt;
                        }
                        keyed.push((*t, at, r));
                    }
                    Step::Malformed(offset, kind) => {
                        problems.push(Problem::Malformed { offset, kind })
                    }
                    Step::Pending | Step::Done => break,
                }
            }
        }
        offset += block_size as u64;
    }
    keyed.sort_by_key(|(t, at, _)| (*t, *at));
    (
        keyed.into_iter().map(|(_, at, r)| (at, r)).collect(),
        problems,
    )
}

/// Follows a trace file while its process is still writing it: each [`Follower::poll`] returns
/// the records completed since the last one. An incomplete last record is kept back until it is
/// finished, so a growing file is never misread.
///
/// Version 2 files: each poll re-reads the unread rest of every block still open (the newest
/// block of each thread, and blocks taken but not yet started), so a poll costs about one block
/// per writing thread. Records come block by block, each thread's in its order.
#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    file: File,
    /// File offset of `pending[0]`.
    offset: u64,
    pending: Vec<u8>,
    header: Option<Header>,
    /// Set once the header says the file is made of blocks.
    blocks: Option<BlockFollower>,
}

/// How many blocks past the last started one a poll looks at: blocks are taken in file order,
/// so one taken but not yet started is at most about one block per writing thread further on.
const LOOKAHEAD_BLOCKS: u64 = 64;

/// Reads bytes `from..upto` of the block at `offset` (as far as the file of length `len` has
/// them) into `buf[from..]`; `buf` ends where the read ended.
fn reread(
    file: &File,
    buf: &mut Vec<u8>,
    offset: u64,
    from: usize,
    upto: usize,
    len: u64,
) -> io::Result<()> {
    let upto = upto.min(len.saturating_sub(offset) as usize);
    buf.resize(from, 0);
    if upto <= from {
        return Ok(());
    }
    buf.resize(upto, 0);
    let mut got = from;
    while got < upto {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(())
}

/// The state of following a version 2 file.
#[derive(Debug)]
struct BlockFollower {
    data_offset: u64,
    block_size: u32,
    /// Open blocks by index: the cursor (once started) and the block's bytes as last read.
    open: BTreeMap<u64, (Option<BlockCursor>, Vec<u8>)>,
    /// Every block below this index is open or closed for good.
    scanned: u64,
    /// Each stream's newest block (a thread's never-dropped and droppable blocks): its index
    /// and sequence number.
    newest: HashMap<(u32, u32), (u64, u64)>,
    /// The sequence number each block had when last started, so that a block reopened after
    /// a DROPPED record is read again only if it was reused since.
    seen: HashMap<u64, u64>,
}

impl BlockFollower {
    fn poll(&mut self, file: &File, len: u64) -> io::Result<(Vec<Record>, Vec<Problem>)> {
        let bs = self.block_size as u64;
        let blocks_in_file = len.saturating_sub(self.data_offset).div_ceil(bs);
        // Look at new blocks as far as the lookahead past the newest started block allows.
        let newest_started = self.newest.values().map(|n| n.0).max().map_or(0, |i| i + 1);
        let horizon = blocks_in_file.min(newest_started.max(self.scanned) + LOOKAHEAD_BLOCKS);
        while self.scanned < horizon {
            self.open.insert(self.scanned, (None, Vec::new()));
            self.scanned += 1;
        }
        let mut records = Vec::new();
        let mut problems = Vec::new();
        let mut closed = Vec::new();
        // Blocks reused under a size budget (DROPPED records): read again from their new start.
        let mut reopen = Vec::new();
        let indices: Vec<u64> = self.open.keys().copied().collect();
        for index in indices {
            let offset = self.data_offset + index * bs;
            let (cur, buf) = self.open.get_mut(&index).expect("listed above");
            if let Some(c) = cur {
                // A droppable block may have been reused since (a size budget): a new header
                // means new records from its start; a zero magic, one being reset.
                let mut h = Vec::new();
                reread(
                    file,
                    &mut h,
                    offset,
                    0,
                    BLOCK_HEADER_LEN.min(bs as usize),
                    len,
                )?;
                let now = crate::block::BlockHeader::decode(&h).ok().flatten();
                if now.map(|h| h.seq) != Some(c.header.seq) {
                    *cur = None;
                    buf.clear();
                }
            }
            if cur.is_none() {
                // Not started when last looked at: its header first, then its records.
                reread(file, buf, offset, 0, BLOCK_HEADER_LEN.min(bs as usize), len)?;
                match block_header(buf, offset, self.block_size, false, &mut problems) {
                    Some(h) if self.seen.get(&index).is_some_and(|&s| s >= h.seq) => {
                        // Read already under this header (reopened after a DROPPED record that
                        // this poll had read past).
                        self.open.remove(&index);
                        continue;
                    }
                    Some(h) => {
                        self.seen.insert(index, h.seq);
                        *cur = Some(BlockCursor::new(offset, h, self.block_size));
                        if let Some(old) = self.newest.insert(h.stream(), (index, h.seq)) {
                            // The thread moved on: its older block is complete (read it once
                            // more below, then close it).
                            if old.1 < h.seq {
                                if old.0 != index {
                                    closed.push(old.0);
                                }
                            } else {
                                self.newest.insert(h.stream(), old);
                            }
                        }
                    }
                    None => {
                        if buf.len() >= 4 && buf[..4] != [0; 4] {
                            closed.push(index); // a bad block, reported
                        }
                        continue;
                    }
                }
            }
            let c = cur.as_mut().expect("started above");
            // Re-read from the first byte not yet decoded: zeros read before may be records now.
            reread(file, buf, offset, c.pos(), bs as usize, len)?;
            loop {
                match c.step(buf, false, &mut problems) {
                    Step::Record(_, r) => {
                        if let Record::Dropped { index: reused, .. } = r {
                            reopen.push(reused);
                        }
                        records.push(r)
                    }
                    Step::Malformed(offset, kind) => {
                        problems.push(Problem::Malformed { offset, kind })
                    }
                    Step::Pending => break,
                    Step::Done => {
                        closed.push(index);
                        break;
                    }
                }
            }
        }
        for index in closed {
            // A thread's older block may still hold records written before it moved on.
            if let Some((Some(c), buf)) = self.open.get_mut(&index) {
                let offset = c.offset;
                reread(file, buf, offset, c.pos(), bs as usize, len)?;
                loop {
                    match c.step(buf, false, &mut problems) {
                        Step::Record(_, r) => {
                            if let Record::Dropped { index: reused, .. } = r {
                                reopen.push(reused);
                            }
                            records.push(r)
                        }
                        Step::Malformed(offset, kind) => {
                            problems.push(Problem::Malformed { offset, kind })
                        }
                        Step::Pending | Step::Done => break,
                    }
                }
            }
            self.open.remove(&index);
        }
        for index in reopen {
            if index < self.scanned && !self.open.contains_key(&index) {
                self.open.insert(index, (None, Vec::new()));
            }
        }
        Ok((records, problems))
    }
}

impl Follower {
    /// Opens a trace file to follow. The header may not be complete yet.
    pub fn open(path: &Path) -> Result<Follower, ReadError> {
        let file = File::open(path).map_err(|e| ReadError::Io(path.to_path_buf(), e))?;
        Ok(Follower {
            path: path.to_path_buf(),
            file,
            offset: 0,
            pending: Vec::new(),
            header: None,
            blocks: None,
        })
    }

    /// The header, once it has been read.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }

    /// The file being followed.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes read so far and not yet consumed (an unfinished record).
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Reads what was appended since the last call; returns the newly completed records and any
    /// corruption met.
    pub fn poll(&mut self) -> Result<(Vec<Record>, Vec<Problem>), ReadError> {
        let io = |e| ReadError::Io(self.path.clone(), e);
        if let Some(b) = &mut self.blocks {
            let len = self.file.metadata().map_err(io)?.len();
            return b
                .poll(&self.file, len)
                .map_err(|e| ReadError::Io(self.path.clone(), e));
        }
        let read_from = self.offset + self.pending.len() as u64;
        self.file.seek(SeekFrom::Start(read_from)).map_err(io)?;
        self.file
            .read_to_end(&mut self.pending)
            .map_err(|e| ReadError::Io(self.path.clone(), e))?;
        if self.header.is_none() {
            let len = self.pending.len() as u64;
            let pending = &self.pending;
            let decoded =
                Header::decode_lenient(pending, len, &mut |at, buf| read_slice(pending, at, buf));
            match decoded {
                Ok(rec) => {
                    self.header = Some(rec.header);
                    let damage: Vec<Problem> = rec.damage.into_iter().collect();
                    match rec.layout {
                        Layout::Stream { start } => {
                            let start = (start as usize).min(self.pending.len());
                            self.pending.drain(..start);
                            self.offset += start as u64;
                            let (records, mut problems) = self.scan_pending();
                            problems.splice(0..0, damage);
                            return Ok((records, problems));
                        }
                        Layout::Blocks {
                            data_offset,
                            block_size,
                        } => {
                            self.pending = Vec::new();
                            self.offset = data_offset;
                            self.blocks = Some(BlockFollower {
                                data_offset,
                                block_size,
                                open: BTreeMap::new(),
                                scanned: 0,
                                newest: HashMap::new(),
                                seen: HashMap::new(),
                            });
                            let (records, mut problems) = self.poll()?;
                            problems.splice(0..0, damage);
                            return Ok((records, problems));
                        }
                    }
                }
                Err(HeaderError::Truncated) => return Ok((Vec::new(), Vec::new())),
                Err(e) => return Err(ReadError::Header(self.path.clone(), e)),
            }
        }
        Ok(self.scan_pending())
    }

    /// Decodes the complete records of a version 1 file read so far.
    fn scan_pending(&mut self) -> (Vec<Record>, Vec<Problem>) {
        let scan = scan_records(&self.pending, self.offset);
        self.pending.drain(..scan.consumed);
        self.offset += scan.consumed as u64;
        (
            scan.records.into_iter().map(|(_, r)| r).collect(),
            scan.problems,
        )
    }
}

/// Copies `buf.len()` bytes of `bytes` from `at` into `buf`; false when they are not all there.
pub(crate) fn read_slice(bytes: &[u8], at: u64, buf: &mut [u8]) -> bool {
    let Ok(at) = usize::try_from(at) else {
        return false;
    };
    match bytes.get(at..at.saturating_add(buf.len())) {
        Some(s) if s.len() == buf.len() => {
            buf.copy_from_slice(s);
            true
        }
        _ => false,
    }
}

/// Reads block `offset`'s header: `None` for a block nobody wrote or one that is bad (reported).
pub(crate) fn block_header(
    bytes: &[u8],
    offset: u64,
    block_size: u32,
    complete: bool,
    problems: &mut Vec<Problem>,
) -> Option<BlockHeader> {
    match BlockHeader::decode(&bytes[..bytes.len().min(BLOCK_HEADER_LEN)]) {
        Ok(h) => h,
        Err(BadBlock::Corrupt) => {
            problems.push(Problem::BadBlock {
                offset,
                bytes: block_size as u64,
            });
            None
        }
        Err(BadBlock::Short) => {
            if complete {
                problems.push(Problem::TornTail {
                    offset,
                    bytes: bytes.len() as u64,
                });
            }
            None
        }
    }
}
