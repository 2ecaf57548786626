//! Reading traces: whole files after the fact, or the growing tail of a live one.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::header::{Header, HeaderError};
use crate::record::{DeviceInfo, FRAME_HEADER_LEN, FRAME_MAGIC, Record, frame_crc};

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
}

/// Is there a complete, checksum-valid frame at `pos`? Returns its total length.
fn frame_at(buf: &[u8], pos: usize) -> FrameCheck {
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

enum FrameCheck {
    Ok { kind: u8, total: usize },
    Incomplete,
    Bad,
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
                while p < buf.len() {
                    if buf[p] == FRAME_MAGIC && matches!(frame_at(buf, p), FrameCheck::Ok { .. }) {
                        next = Some(p);
                        break;
                    }
                    p += 1;
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
                    None => break,
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
    /// Every record in file order (device and driver records included).
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
        let (header, start) =
            Header::decode(bytes).map_err(|e| ReadError::Header(path.to_path_buf(), e))?;
        let scan = scan_records(&bytes[start..], start as u64);
        let mut problems = scan.problems;
        let tail_at = start + scan.consumed;
        if tail_at < bytes.len() {
            problems.push(Problem::TornTail {
                offset: tail_at as u64,
                bytes: (bytes.len() - tail_at) as u64,
            });
        }
        let mut t = TraceFile {
            path: path.to_path_buf(),
            header,
            driver_version: None,
            devices: Vec::new(),
            records: Vec::with_capacity(scan.records.len()),
            problems,
        };
        for (_, r) in scan.records {
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

/// Follows a trace file while its process is still writing it: each [`Follower::poll`] returns
/// the records completed since the last one. An incomplete last record is kept back until it is
/// finished, so a growing file is never misread.
#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    file: File,
    /// File offset of `pending[0]`.
    offset: u64,
    pending: Vec<u8>,
    header: Option<Header>,
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
        let read_from = self.offset + self.pending.len() as u64;
        self.file.seek(SeekFrom::Start(read_from)).map_err(io)?;
        self.file
            .read_to_end(&mut self.pending)
            .map_err(|e| ReadError::Io(self.path.clone(), e))?;
        if self.header.is_none() {
            match Header::decode(&self.pending) {
                Ok((h, start)) => {
                    self.header = Some(h);
                    self.pending.drain(..start);
                    self.offset += start as u64;
                }
                Err(HeaderError::Truncated) => return Ok((Vec::new(), Vec::new())),
                Err(e) => return Err(ReadError::Header(self.path.clone(), e)),
            }
        }
        let scan = scan_records(&self.pending, self.offset);
        self.pending.drain(..scan.consumed);
        self.offset += scan.consumed as u64;
        Ok((
            scan.records.into_iter().map(|(_, r)| r).collect(),
            scan.problems,
        ))
    }
}
