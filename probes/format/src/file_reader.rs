//! Streaming reads of a whole trace file of any supported version.
//!
//! [`FileReader`] opens a file and reads its header; [`FileReader::records`] then streams every
//! record once in storage order (for side tables: strings, stacks, modules, devices), and
//! [`FileReader::timed`] streams the timed records (events, annotations, ranges, marks) in time
//! order.
//!
//! Memory: for version 2, `records` holds one block and `timed` one block per thread whose
//! records overlap the current time (a k-way merge over the threads' block chains, each chain
//! started only once the merge reaches its first block's base time), plus 16 bytes per block
//! for the chains' block lists. Version 1 `records` holds one chunk; version 1 `timed` reads the
//! timed records whole and sorts them (stable), because a version 1 file is only nearly in time
//! order: threads race between taking the time and writing.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::block::{BLOCK_HEADER_LEN, BlockCursor, BlockHeader, Found, Step};
use crate::header::{Header, Layout};
use crate::reader::{Problem, ReadError, block_header, scan_records};
use crate::record::Record;

/// Bytes read per step when streaming a version 1 file.
const V1_CHUNK: usize = 1 << 20;
/// Headers larger than this are refused as corrupt (a command line of megabytes is not real).
const MAX_HEADER: usize = 16 << 20;

/// A trace file of any supported version, opened for streaming.
#[derive(Debug)]
pub struct FileReader {
    path: PathBuf,
    header: Header,
    layout: Layout,
    /// What was wrong with the header (reported first by [`Records`] and [`Timed`]).
    damage: Option<Problem>,
}

impl FileReader {
    /// Opens a trace file and reads its header.
    pub fn open(path: &Path) -> Result<FileReader, ReadError> {
        let io = |e| ReadError::Io(path.to_path_buf(), e);
        let mut file = File::open(path).map_err(io)?;
        let bytes = read_header_bytes(&mut file).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let rec = Header::decode_lenient(&bytes, len, &mut |at, buf| {
            file.read_exact_at(buf, at).is_ok()
        })
        .map_err(|e| ReadError::Header(path.to_path_buf(), e))?;
        Ok(FileReader {
            path: path.to_path_buf(),
            header: rec.header,
            layout: rec.layout,
            damage: rec.damage,
        })
    }

    /// The file's header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every record once, in storage order, for building side tables (strings, stacks,
    /// modules, devices, driver version). Streaming.
    pub fn records(&self) -> Result<Records, ReadError> {
        let damage = self.damage.iter().cloned();
        Ok(Records {
            inner: match self.layout {
                Layout::Stream { start } => {
                    let mut s = V1Stream::open(&self.path, start)?;
                    s.problems.extend(damage);
                    RecordsInner::V1(s)
                }
                Layout::Blocks {
                    data_offset,
                    block_size,
                } => {
                    let mut s = V2Stream::open(&self.path, data_offset, block_size)?;
                    s.problems.extend(damage);
                    RecordsInner::V2(s)
                }
            },
        })
    }

    /// What was wrong with the file's header, if anything ([`Problem::DamagedHeader`]); the
    /// streams of [`FileReader::records`] and [`FileReader::timed`] report it first too.
    pub fn header_damage(&self) -> Option<&Problem> {
        self.damage.as_ref()
    }

    /// The timed records ([`Record::Event`], [`Record::Annotate`], [`Record::RangePush`],
    /// [`Record::RangePop`], [`Record::Mark`], [`Record::Tensor`]) in time order; records
    /// with equal times keep their storage order.
    pub fn timed(&self) -> Result<Timed, ReadError> {
        let start = match self.layout {
            Layout::Stream { start } => start,
            Layout::Blocks {
                data_offset,
                block_size,
            } => {
                let mut m = Merge::open(&self.path, data_offset, block_size)?;
                m.problems.splice(0..0, self.damage.iter().cloned());
                return Ok(Timed {
                    inner: TimedInner::V2(m),
                });
            }
        };
        let mut all = V1Stream::open(&self.path, start)?;
        all.problems.extend(self.damage.iter().cloned());
        let mut timed: Vec<Record> = all.by_ref().filter(|r| time_of(r).is_some()).collect();
        // Stable: equal times keep their file order.
        timed.sort_by_key(|r| time_of(r).unwrap_or(0));
        Ok(Timed {
            inner: TimedInner::V1(timed.into_iter(), all.problems),
        })
    }
}

/// The time of a timed record; `None` for side records (strings, stacks, devices, ...).
pub fn time_of(r: &Record) -> Option<u64> {
    match r {
        Record::Event(e) => Some(e.t_ns),
        Record::Annotate(a) => Some(a.t_ns),
        Record::RangePush { t_ns, .. }
        | Record::RangePop { t_ns, .. }
        | Record::Mark { t_ns, .. } => Some(*t_ns),
        Record::Tensor(t) => Some(t.t_ns),
        _ => None,
    }
}

/// Reads the header's bytes (and nothing much more) from the start of `file`.
fn read_header_bytes(file: &mut File) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(4096);
    file.by_ref().take(16).read_to_end(&mut bytes)?;
    if bytes.len() == 16 {
        let body = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        // At least a page or so more: a damaged body length must not hide the fields.
        let want = (body + 4).clamp(64 << 10, MAX_HEADER);
        file.by_ref().take(want as u64).read_to_end(&mut bytes)?;
    }
    Ok(bytes)
}

/// Every record of a file in storage order; see [`FileReader::records`].
#[derive(Debug)]
pub struct Records {
    inner: RecordsInner,
}

#[derive(Debug)]
enum RecordsInner {
    V1(V1Stream),
    V2(V2Stream),
}

impl Records {
    /// Problems met so far (complete once the iterator has ended).
    pub fn problems(&self) -> &[Problem] {
        match &self.inner {
            RecordsInner::V1(s) => &s.problems,
            RecordsInner::V2(s) => &s.problems,
        }
    }

    /// A version 1 stream's work so far: the bytes it has scanned over every chunk and the most
    /// it buffered at once (`None` for version 2, which reads whole blocks).
    #[cfg(test)]
    pub(crate) fn work(&self) -> Option<(u64, usize)> {
        match &self.inner {
            RecordsInner::V1(s) => Some((s.scanned, s.most_buffered)),
            RecordsInner::V2(_) => None,
        }
    }
}

impl Iterator for Records {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        match &mut self.inner {
            RecordsInner::V1(s) => s.next(),
            RecordsInner::V2(s) => s.next(),
        }
    }
}

/// The timed records of a file in time order; see [`FileReader::timed`].
#[derive(Debug)]
pub struct Timed {
    inner: TimedInner,
}

#[derive(Debug)]
enum TimedInner {
    V1(std::vec::IntoIter<Record>, Vec<Problem>),
    V2(Merge),
}

impl Timed {
    /// Problems met so far (complete once the iterator has ended).
    pub fn problems(&self) -> &[Problem] {
        match &self.inner {
            TimedInner::V1(_, p) => p,
            TimedInner::V2(m) => &m.problems,
        }
    }
}

impl Iterator for Timed {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        match &mut self.inner {
            TimedInner::V1(r, _) => r.next(),
            TimedInner::V2(m) => m.next(),
        }
    }
}

/// A version 1 file read a chunk at a time.
#[derive(Debug)]
struct V1Stream {
    file: File,
    /// Bytes read and not yet consumed; `buf[0]` is at file offset `offset`.
    buf: Vec<u8>,
    offset: u64,
    ready: VecDeque<Record>,
    problems: Vec<Problem>,
    eof: bool,
    /// Bytes dropped from `buf` because no record can start in them ([`crate::reader::Scan::dead`]): their
    /// file offset and length, reported once the stream knows whether a record follows
    /// (corruption in the middle) or not (the torn tail).
    dead: Option<(u64, u64)>,
    /// Bytes handed to [`scan_records`] so far, over every chunk: the stream's work, which stays
    /// within a small multiple of the file's length (a test bounds it by that, not by a clock).
    scanned: u64,
    /// The most bytes `buf` held at once: the stream's memory.
    most_buffered: usize,
}

impl V1Stream {
    fn open(path: &Path, start: u64) -> Result<V1Stream, ReadError> {
        use std::io::{Seek, SeekFrom};
        let io = |e| ReadError::Io(path.to_path_buf(), e);
        let mut file = File::open(path).map_err(io)?;
        file.seek(SeekFrom::Start(start)).map_err(io)?;
        Ok(V1Stream {
            file,
            buf: Vec::new(),
            offset: start,
            ready: VecDeque::new(),
            problems: Vec::new(),
            eof: false,
            dead: None,
            scanned: 0,
            most_buffered: 0,
        })
    }

    /// Reads the next chunk and decodes the records it completes.
    fn fill(&mut self) {
        let before = self.buf.len();
        let read = self
            .file
            .by_ref()
            .take(V1_CHUNK as u64)
            .read_to_end(&mut self.buf);
        if read.is_err() || self.buf.len() == before {
            self.eof = true;
        }
        self.scanned += self.buf.len() as u64;
        self.most_buffered = self.most_buffered.max(self.buf.len());
        let mut scan = scan_records(&self.buf, self.offset);
        if let Some((at, bytes)) = self.dead.take() {
            // Bytes dropped earlier: corruption before whatever this scan consumed, merged with
            // corruption it found right where they end; else still pending.
            if scan.consumed > 0 {
                match scan.problems.first_mut() {
                    Some(Problem::Corrupt { offset, bytes: b }) if *offset == at + bytes => {
                        *offset = at;
                        *b += bytes;
                    }
                    _ => scan
                        .problems
                        .insert(0, Problem::Corrupt { offset: at, bytes }),
                }
            } else {
                self.dead = Some((at, bytes));
            }
        }
        self.ready.extend(scan.records.into_iter().map(|(_, r)| r));
        self.problems.extend(scan.problems);
        self.buf.drain(..scan.consumed);
        self.offset += scan.consumed as u64;
        if scan.dead > 0 && !self.eof {
            let at = self.offset;
            let d = self.dead.get_or_insert((at, 0));
            d.1 += scan.dead as u64;
            self.buf.drain(..scan.dead);
            self.offset += scan.dead as u64;
        }
        if self.eof && (!self.buf.is_empty() || self.dead.is_some()) {
            let (offset, dead) = self.dead.take().unwrap_or((self.offset, 0));
            self.problems.push(Problem::TornTail {
                offset,
                bytes: dead + self.buf.len() as u64,
            });
            self.buf.clear();
        }
    }
}

impl Iterator for V1Stream {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        while self.ready.is_empty() && !self.eof {
            self.fill();
        }
        self.ready.pop_front()
    }
}

/// Reads `len` bytes at `offset` (fewer at the end of the file) into `buf`.
fn read_block(file: &File, offset: u64, len: usize, buf: &mut Vec<u8>) -> std::io::Result<()> {
    buf.clear();
    buf.resize(len, 0);
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(())
}

/// A version 2 file's records block by block, in file order.
#[derive(Debug)]
struct V2Stream {
    file: File,
    len: u64,
    block_size: u32,
    /// File offset of the next block to open.
    next_block: u64,
    cur: Option<BlockCursor>,
    buf: Vec<u8>,
    problems: Vec<Problem>,
}

impl V2Stream {
    fn open(path: &Path, data_offset: u64, block_size: u32) -> Result<V2Stream, ReadError> {
        let io = |e| ReadError::Io(path.to_path_buf(), e);
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        Ok(V2Stream {
            file,
            len,
            block_size,
            next_block: data_offset,
            cur: None,
            buf: Vec::new(),
            problems: Vec::new(),
        })
    }
}

impl Iterator for V2Stream {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        loop {
            if let Some(cur) = &mut self.cur {
                match cur.step(&self.buf, true, &mut self.problems) {
                    Step::Record(_, r) => return Some(r),
                    Step::Malformed(offset, kind) => {
                        self.problems.push(Problem::Malformed { offset, kind })
                    }
                    Step::Pending | Step::Done => self.cur = None,
                }
                continue;
            }
            if self.next_block >= self.len {
                return None;
            }
            let offset = self.next_block;
            self.next_block += self.block_size as u64;
            let want = (self.len - offset).min(self.block_size as u64) as usize;
            if let Err(e) = read_block(&self.file, offset, want, &mut self.buf) {
                self.problems.push(Problem::Unreadable {
                    offset,
                    error: e.to_string(),
                });
                continue;
            }
            if let Some(h) =
                block_header(&self.buf, offset, self.block_size, true, &mut self.problems)
            {
                self.cur = Some(BlockCursor::new(offset, h, self.block_size));
            }
        }
    }
}

/// One thread's blocks, in the order it filled them, read one at a time.
#[derive(Debug)]
struct Chain {
    blocks: VecDeque<(u64, BlockHeader)>,
    cur: Option<BlockCursor>,
    buf: Vec<u8>,
}

/// Where the chains' blocks are read from.
#[derive(Debug)]
struct BlockSource {
    file: File,
    len: u64,
    block_size: u32,
}

impl BlockSource {
    /// Decodes the next timed record of `chain` into `out`; its time and file offset.
    #[inline]
    fn advance(
        &self,
        chain: &mut Chain,
        problems: &mut Vec<Problem>,
        out: &mut Record,
    ) -> Option<(u64, u64)> {
        loop {
            if let Some(cur) = &mut chain.cur {
                match cur.step_into(&chain.buf, true, problems, out) {
                    Found::Record(at) => match crate::time_of(out) {
                        Some(t) => return Some((t, at)),
                        None => continue,
                    },
                    Found::Malformed(offset, kind) => {
                        problems.push(Problem::Malformed { offset, kind });
                        continue;
                    }
                    Found::Pending | Found::Done => chain.cur = None,
                }
            }
            let (offset, h) = chain.blocks.pop_front()?;
            let want = (self.len - offset).min(self.block_size as u64) as usize;
            if let Err(e) = read_block(&self.file, offset, want, &mut chain.buf) {
                problems.push(Problem::Unreadable {
                    offset,
                    error: e.to_string(),
                });
                continue;
            }
            chain.cur = Some(BlockCursor::new(offset, h, self.block_size));
        }
    }
}

/// A started chain and its next timed record, decoded in place.
#[derive(Debug)]
struct Head {
    chain: Chain,
    record: Record,
}

/// The timed records of a version 2 file in time order: a k-way merge over its threads' chains.
///
/// One chain is current: the one whose next record is the earliest. Its records flow with one
/// comparison against the heap's top and no heap operation while they stay the earliest
/// (threads write in runs); the heap holds the other started chains' next records and is
/// touched only when another chain becomes the earliest.
#[derive(Debug)]
struct Merge {
    src: BlockSource,
    /// Chains not started yet, by (first base time, first block offset), latest first.
    waiting: Vec<(u64, u64, Chain)>,
    /// Started chains; `None` once exhausted (its slot is reused).
    heads: Vec<Option<Head>>,
    /// The current chain's next record's key (time, file offset, slot); `None` only when no
    /// started chain has a record left.
    current: Option<(u64, u64, usize)>,
    /// The other started chains' next records, keyed by (time, file offset, slot).
    others: BinaryHeap<Reverse<(u64, u64, usize)>>,
    problems: Vec<Problem>,
}

impl Merge {
    fn open(path: &Path, data_offset: u64, block_size: u32) -> Result<Merge, ReadError> {
        let io = |e| ReadError::Io(path.to_path_buf(), e);
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut problems = Vec::new();
        // One pass over the block headers finds each stream's chain (a thread's never-dropped
        // blocks, and its droppable ones).
        let mut by_tid: HashMap<(u32, u32), Vec<(u64, BlockHeader)>> = HashMap::new();
        let mut buf = Vec::with_capacity(BLOCK_HEADER_LEN);
        let mut offset = data_offset;
        while offset < len {
            let want = (len - offset).min(BLOCK_HEADER_LEN as u64) as usize;
            read_block(&file, offset, want, &mut buf).map_err(io)?;
            if let Some(h) = block_header(&buf, offset, block_size, true, &mut problems) {
                by_tid.entry(h.stream()).or_default().push((offset, h));
            }
            offset += block_size as u64;
        }
        let mut waiting: Vec<(u64, u64, Chain)> = by_tid
            .into_values()
            .map(|mut blocks| {
                blocks.sort_by_key(|(off, h)| (h.seq, *off));
                (
                    blocks[0].1.base_t_ns,
                    blocks[0].0,
                    Chain {
                        blocks: blocks.into(),
                        cur: None,
                        buf: Vec::new(),
                    },
                )
            })
            .collect();
        waiting.sort_by_key(|w| Reverse((w.0, w.1)));
        Ok(Merge {
            src: BlockSource {
                file,
                len,
                block_size,
            },
            waiting,
            heads: Vec::new(),
            current: None,
            others: BinaryHeap::new(),
            problems,
        })
    }

    /// Starts the next waiting chain: its first record becomes current if it is the earliest,
    /// else it joins the others.
    fn start_next(&mut self) {
        let Some((_, _, mut chain)) = self.waiting.pop() else {
            return;
        };
        let mut record = Record::Unknown { kind: 0 };
        let Some((t, at)) = self
            .src
            .advance(&mut chain, &mut self.problems, &mut record)
        else {
            return;
        };
        let slot = match self.heads.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.heads.push(None);
                self.heads.len() - 1
            }
        };
        self.heads[slot] = Some(Head { chain, record });
        let key = (t, at, slot);
        match self.current {
            Some(cur) if cur < key => self.others.push(Reverse(key)),
            Some(cur) => {
                self.others.push(Reverse(cur));
                self.current = Some(key);
            }
            None => self.current = Some(key),
        }
    }
}

impl Iterator for Merge {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        // Start every chain that may hold a record before the earliest head.
        while let Some(first) = self.waiting.last().map(|w| (w.0, w.1)) {
            match self.current {
                Some((t, at, _)) if first > (t, at) => break,
                _ => self.start_next(),
            }
        }
        let (_, _, slot) = self.current?;
        let head = self.heads[slot]
            .as_mut()
            .expect("the current chain is started");
        // The record goes out; its slot is left an event, ready to be decoded into again.
        let out = std::mem::replace(&mut head.record, Record::Event(Default::default()));
        match self
            .src
            .advance(&mut head.chain, &mut self.problems, &mut head.record)
        {
            Some((t, at)) => {
                let key = (t, at, slot);
                self.current = Some(key);
                if let Some(mut top) = self.others.peek_mut()
                    && top.0 < key
                {
                    // Another chain is earlier now: it becomes current, this one waits.
                    let Reverse(next) = std::mem::replace(&mut *top, Reverse(key));
                    self.current = Some(next);
                }
            }
            None => {
                self.heads[slot] = None;
                self.current = self.others.pop().map(|Reverse(k)| k);
            }
        }
        Some(out)
    }
}
