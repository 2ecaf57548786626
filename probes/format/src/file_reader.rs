//! Streaming reads of a whole trace file of any supported version.
//!
//! [`FileReader`] opens a file and reads its header; [`FileReader::records`] then streams every
//! record once in storage order (for side tables: strings, stacks, modules, devices), and
//! [`FileReader::timed`] streams the timed records (events, annotations, ranges, marks) in time
//! order. Both hold memory bounded by what one step needs, not by the trace length, except for
//! version 1 traces, whose `timed` order is only known after reading them whole (they were
//! written by a single `write(2)` per record, so the file is already close to time order, but
//! not exactly: threads race between taking the time and writing).

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::header::Header;
use crate::reader::{Problem, ReadError, scan_records};
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
    /// File offset of the first record.
    start: u64,
}

impl FileReader {
    /// Opens a trace file and reads its header.
    pub fn open(path: &Path) -> Result<FileReader, ReadError> {
        let io = |e| ReadError::Io(path.to_path_buf(), e);
        let mut file = File::open(path).map_err(io)?;
        let bytes = read_header_bytes(&mut file).map_err(io)?;
        let (header, start) =
            Header::decode(&bytes).map_err(|e| ReadError::Header(path.to_path_buf(), e))?;
        Ok(FileReader {
            path: path.to_path_buf(),
            header,
            start: start as u64,
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
        Ok(Records {
            inner: V1Stream::open(&self.path, self.start)?,
        })
    }

    /// The timed records ([`Record::Event`], [`Record::Annotate`], [`Record::RangePush`],
    /// [`Record::RangePop`], [`Record::Mark`]) in time order; records with equal times keep
    /// their storage order.
    pub fn timed(&self) -> Result<Timed, ReadError> {
        let mut all = V1Stream::open(&self.path, self.start)?;
        let mut timed: Vec<Record> = all.by_ref().filter(|r| time_of(r).is_some()).collect();
        // Stable: equal times keep their file order.
        timed.sort_by_key(|r| time_of(r).unwrap_or(0));
        Ok(Timed {
            records: timed.into_iter(),
            problems: all.problems,
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
        _ => None,
    }
}

/// Reads the header's bytes (and nothing much more) from the start of `file`.
fn read_header_bytes(file: &mut File) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(4096);
    file.by_ref().take(16).read_to_end(&mut bytes)?;
    if bytes.len() == 16 {
        let body = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        let want = (body + 4).min(MAX_HEADER);
        file.by_ref().take(want as u64).read_to_end(&mut bytes)?;
    }
    Ok(bytes)
}

/// Every record of a file in storage order; see [`FileReader::records`].
#[derive(Debug)]
pub struct Records {
    inner: V1Stream,
}

impl Records {
    /// Problems met so far (complete once the iterator has ended).
    pub fn problems(&self) -> &[Problem] {
        &self.inner.problems
    }
}

impl Iterator for Records {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        self.inner.next()
    }
}

/// The timed records of a file in time order; see [`FileReader::timed`].
#[derive(Debug)]
pub struct Timed {
    records: std::vec::IntoIter<Record>,
    problems: Vec<Problem>,
}

impl Timed {
    /// Problems met so far (complete once the iterator has ended).
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }
}

impl Iterator for Timed {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        self.records.next()
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
        let scan = scan_records(&self.buf, self.offset);
        self.ready.extend(scan.records.into_iter().map(|(_, r)| r));
        self.problems.extend(scan.problems);
        self.buf.drain(..scan.consumed);
        self.offset += scan.consumed as u64;
        if self.eof && !self.buf.is_empty() {
            self.problems.push(Problem::TornTail {
                offset: self.offset,
                bytes: self.buf.len() as u64,
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
