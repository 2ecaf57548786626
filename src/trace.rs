//! A recorded trace: one file per traced process, read from a trace directory (or one file).
//!
//! Opening a trace reads each file once and keeps only what its timed records refer to: the
//! header, devices, driver version, interned strings, stacks and modules. The timed records
//! themselves (events, annotations, ranges, marks) are never held: every analysis asks for a
//! fresh pass over them, merged in time order across processes ([`Trace::items`]), and folds
//! it into what it needs (a live set, peaks, a few snapshots). Memory therefore follows the
//! live set and the stack table, not the length of the trace.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use vramtrace_format::{
    Annotation, DeviceInfo, Event, FILE_EXTENSION, FileReader, Header, ModuleInfo, Problem, Record,
    TensorEvent, TraceFile,
};

use crate::error::Error;

/// A timed record: something that happened at a moment on a thread of one process.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// An allocation-family event.
    Event(Event),
    /// A name, dtype and shape given to a live allocation.
    Annotate(Annotation),
    /// A named range pushed on a thread (NVTX or the annotation ABI).
    RangePush {
        /// When.
        t_ns: u64,
        /// On which thread.
        tid: u32,
        /// Interned id of the range's name.
        name: u32,
    },
    /// The innermost range of a thread popped.
    RangePop {
        /// When.
        t_ns: u64,
        /// On which thread.
        tid: u32,
    },
    /// An instantaneous named mark.
    Mark {
        /// When.
        t_ns: u64,
        /// On which thread.
        tid: u32,
        /// Interned id of the mark's text.
        name: u32,
    },
    /// A tensor allocated, freed or refused inside PyTorch's caching allocator (see
    /// [`crate::torch_replay`]).
    Tensor(TensorEvent),
}

impl Item {
    /// The timed part of a record; `None` for side-table records (strings, stacks, ...).
    pub fn from_record(r: Record) -> Option<Item> {
        Some(match r {
            Record::Event(e) => Item::Event(e),
            Record::Annotate(a) => Item::Annotate(a),
            Record::RangePush { t_ns, tid, name } => Item::RangePush { t_ns, tid, name },
            Record::RangePop { t_ns, tid } => Item::RangePop { t_ns, tid },
            Record::Mark { t_ns, tid, name } => Item::Mark { t_ns, tid, name },
            Record::Tensor(t) => Item::Tensor(t),
            _ => return None,
        })
    }

    /// When it happened.
    pub fn t_ns(&self) -> u64 {
        match self {
            Item::Event(e) => e.t_ns,
            Item::Annotate(a) => a.t_ns,
            Item::RangePush { t_ns, .. }
            | Item::RangePop { t_ns, .. }
            | Item::Mark { t_ns, .. } => *t_ns,
            Item::Tensor(t) => t.t_ns,
        }
    }
}

/// A stream of one process's timed items, in time order.
pub type ItemStream<'a> = Box<dyn Iterator<Item = Item> + 'a>;

/// Where one process's records come from: a trace file, or records held in memory (tests,
/// a live view that has decoded them already).
pub trait Source: fmt::Debug + Send + Sync {
    /// Calls `f` with every record once, in storage order; returns what was stepped over.
    fn for_each_record(&self, f: &mut dyn FnMut(Record)) -> Result<Vec<Problem>, Error>;
    /// The timed records, in time order (ties: storage order). Each call starts a new pass.
    fn timed(&self) -> Result<ItemStream<'_>, Error>;
}

/// A trace file on disk, streamed by the format crate's reader.
struct FileSource(FileReader);

impl fmt::Debug for FileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FileSource")
    }
}

impl Source for FileSource {
    fn for_each_record(&self, f: &mut dyn FnMut(Record)) -> Result<Vec<Problem>, Error> {
        let mut records = self.0.records()?;
        for r in records.by_ref() {
            f(r);
        }
        Ok(records.problems().to_vec())
    }

    fn timed(&self) -> Result<ItemStream<'_>, Error> {
        Ok(Box::new(self.0.timed()?.filter_map(Item::from_record)))
    }
}

/// Records held in memory; the timed ones are kept apart, sorted by time (stable).
#[derive(Debug, Default)]
pub struct MemorySource {
    records: Vec<Record>,
    timed: Vec<Item>,
    problems: Vec<Problem>,
}

impl MemorySource {
    /// Holds `records` (in storage order) and the problems their reader met.
    pub fn new(records: Vec<Record>, problems: Vec<Problem>) -> MemorySource {
        let mut timed = Vec::new();
        let mut side = Vec::new();
        for r in records {
            match Item::from_record(r.clone()) {
                Some(it) => timed.push(it),
                None => side.push(r),
            }
        }
        timed.sort_by_key(Item::t_ns);
        MemorySource {
            records: side,
            timed,
            problems,
        }
    }
}

impl Source for MemorySource {
    fn for_each_record(&self, f: &mut dyn FnMut(Record)) -> Result<Vec<Problem>, Error> {
        for r in &self.records {
            f(r.clone());
        }
        Ok(self.problems.clone())
    }

    fn timed(&self) -> Result<ItemStream<'_>, Error> {
        Ok(Box::new(self.timed.iter().cloned()))
    }
}

/// One traced process: its header, the tables its timed records refer to, and where to read
/// those records again.
#[derive(Debug, Clone)]
pub struct Process {
    /// The file it was read from.
    pub path: PathBuf,
    /// Static facts: pid, ppid, command line, start time.
    pub header: Header,
    /// Driver version the process reported, if it got that far.
    pub driver_version: Option<i32>,
    /// Devices the process reported, by ordinal.
    pub devices: Vec<DeviceInfo>,
    /// Interned strings (labels, names, dtypes) by id.
    pub strings: HashMap<u32, String>,
    /// Native stacks by id, innermost frame first.
    pub stacks: HashMap<u32, Vec<u64>>,
    /// The Python frames of a stack id (PY_STACK records), innermost first.
    pub py_stacks: HashMap<u32, Vec<vramtrace_format::PyFrame>>,
    /// Modules the process had loaded, in record order (later records for a range win).
    pub modules: Vec<ModuleInfo>,
    /// What the reader had to step over (a torn tail after a crash).
    pub problems: Vec<Problem>,
    /// The recorder's and the probes' NOTE records (time, text), in record order: why
    /// something was not recorded, whether the PyTorch probe started.
    pub notes: Vec<(u64, String)>,
    /// The tensor-level blocks the recorder dropped to stay within its size budget (DROPPED
    /// records): the writing thread, and the first and last times they covered.
    pub dropped: Vec<(u32, u64, u64)>,
    /// Frames symbolised where the trace was made (`<pid>.symbols.json` beside its file,
    /// [`StoredSymbols`]), for modules this machine does not hold.
    pub stored_symbols: Arc<StoredSymbols>,
    source: Arc<dyn Source>,
}

/// One native frame as it was symbolised where the trace was made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredFrame {
    /// The module's GNU build id in hex, or its path when it has none.
    pub module: String,
    /// The address inside the module (the return address moved into its call, minus the
    /// module's load bias).
    pub offset: u64,
    /// The function, demangled.
    pub function: String,
    /// The source file, if debug info had it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The source line, if debug info had it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// The frames of a process symbolised where it ran (`vramtrace run` writes them when the
/// program exits): a trace read on another machine, or after the program's libraries are
/// gone, still names its native frames.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredSymbols {
    /// The frames, in no particular order.
    pub frames: Vec<StoredFrame>,
    /// The same, by (module, offset).
    #[serde(skip)]
    pub by_key: HashMap<(String, u64), usize>,
}

impl StoredSymbols {
    /// The file beside a trace file that holds its stored frames.
    pub fn path_for(trace_file: &Path) -> PathBuf {
        trace_file.with_extension("symbols.json")
    }

    /// Reads the stored frames of `trace_file`; none when the file is absent. A file that
    /// cannot be read or parsed is an error: a trace must not quietly lose its names.
    pub fn read_for(trace_file: &Path) -> Result<StoredSymbols, Error> {
        let path = Self::path_for(trace_file);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(StoredSymbols::default());
            }
            Err(e) => return Err(Error::Io(path, e)),
        };
        let mut s: StoredSymbols =
            serde_json::from_str(&text).map_err(|e| Error::BadSymbols(path.clone(), e))?;
        s.index();
        Ok(s)
    }

    /// Builds the lookup by (module, offset).
    pub fn index(&mut self) {
        self.by_key = self
            .frames
            .iter()
            .enumerate()
            .map(|(i, f)| ((f.module.clone(), f.offset), i))
            .collect();
    }

    /// The stored frame of `offset` in `module`.
    pub fn get(&self, module: &str, offset: u64) -> Option<&StoredFrame> {
        self.by_key
            .get(&(module.to_string(), offset))
            .map(|&i| &self.frames[i])
    }
}

impl Process {
    /// Reads the side tables of `source` in one pass; its timed records stay where they are.
    pub fn from_source(
        path: PathBuf,
        header: Header,
        source: Arc<dyn Source>,
    ) -> Result<Process, Error> {
        let mut p = Process {
            path,
            header,
            driver_version: None,
            devices: Vec::new(),
            strings: HashMap::new(),
            stacks: HashMap::new(),
            py_stacks: HashMap::new(),
            modules: Vec::new(),
            problems: Vec::new(),
            notes: Vec::new(),
            dropped: Vec::new(),
            stored_symbols: Arc::default(),
            source: source.clone(),
        };
        p.problems = source.for_each_record(&mut |r| p.note(r))?;
        Ok(p)
    }

    /// Opens one trace file.
    pub fn open(path: &Path) -> Result<Process, Error> {
        let reader = FileReader::open(path)?;
        let header = reader.header().clone();
        let mut p = Process::from_source(path.to_path_buf(), header, Arc::new(FileSource(reader)))?;
        p.stored_symbols = Arc::new(StoredSymbols::read_for(path)?);
        Ok(p)
    }

    /// A process from a file decoded whole (tests, tools); its header, devices and driver
    /// version are taken as given.
    pub fn from_file(f: TraceFile) -> Process {
        let source = MemorySource::new(f.records, f.problems);
        let mut p = Process {
            path: f.path,
            header: f.header,
            driver_version: f.driver_version,
            devices: f.devices,
            strings: HashMap::new(),
            stacks: HashMap::new(),
            py_stacks: HashMap::new(),
            modules: Vec::new(),
            problems: source.problems.clone(),
            notes: Vec::new(),
            dropped: Vec::new(),
            stored_symbols: Arc::default(),
            source: Arc::new(MemorySource::default()),
        };
        for r in &source.records {
            p.note_table(r.clone());
        }
        p.source = Arc::new(source);
        p
    }

    fn note(&mut self, r: Record) {
        match r {
            Record::Driver { version } => self.driver_version = Some(version),
            Record::Device(d) => match self.devices.iter_mut().find(|o| o.ordinal == d.ordinal) {
                Some(old) => *old = d,
                None => {
                    self.devices.push(d);
                    self.devices.sort_by_key(|d| d.ordinal);
                }
            },
            r => self.note_table(r),
        }
    }

    fn note_table(&mut self, r: Record) {
        match r {
            Record::String { id, text } => {
                self.strings.insert(id, text);
            }
            Record::Stack { id, frames } => {
                self.stacks.insert(id, frames);
            }
            Record::PyStack { stack, frames } => {
                self.py_stacks.insert(stack, frames);
            }
            Record::Module(m) => self.modules.push(m),
            Record::Note { t_ns, text } => self.notes.push((t_ns, text)),
            Record::Dropped {
                tid,
                from_t_ns,
                to_t_ns,
                ..
            } => self.dropped.push((tid, from_t_ns, to_t_ns)),
            _ => {}
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.header.pid
    }

    /// A new pass over this process's timed records, in time order.
    pub fn items(&self) -> Result<ItemStream<'_>, Error> {
        self.source.timed()
    }

    /// An interned string, or `None` for id 0 or an id never defined.
    pub fn string(&self, id: u32) -> Option<&str> {
        if id == 0 {
            return None;
        }
        self.strings.get(&id).map(String::as_str)
    }

    /// A short name for the process: its program name and pid.
    pub fn display_name(&self) -> String {
        let prog = self
            .header
            .cmdline
            .first()
            .map(|a| {
                Path::new(a)
                    .file_name()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or(a.clone())
            })
            .unwrap_or_else(|| "?".into());
        format!("{prog}[{}]", self.header.pid)
    }

    /// `name dtype[d0, d1, ...]` for an annotation, with its strings resolved.
    pub fn tensor_name(&self, a: &Annotation) -> String {
        let name = self.string(a.name).unwrap_or("?");
        let dims: Vec<String> = a.shape.iter().map(i64::to_string).collect();
        match self.string(a.dtype) {
            Some(dt) => format!("{name} {dt}[{}]", dims.join(", ")),
            None if a.shape.is_empty() => name.to_string(),
            None => format!("{name} [{}]", dims.join(", ")),
        }
    }

    /// The name of a device as the process reported it.
    pub fn device_name(&self, ordinal: i32) -> Option<&str> {
        self.devices
            .iter()
            .find(|d| d.ordinal == ordinal)
            .map(|d| d.name.as_str())
    }
}

/// A whole trace: every process recorded into one directory.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Processes ordered by start time, then pid.
    pub processes: Vec<Process>,
    /// Files of the directory that could not be read, with why, in name order. A process killed
    /// between creating its file and writing the header leaves an empty one; they never hide
    /// the good files beside them.
    pub unreadable: Vec<Unreadable>,
}

/// A trace file that was skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unreadable {
    /// The file.
    pub file: PathBuf,
    /// Why it was skipped, as a sentence.
    pub reason: String,
}

/// Says on stderr which files of a trace directory were skipped (for commands whose stdout is
/// data, not a report).
pub fn warn_unreadable(trace: &Trace) {
    for u in &trace.unreadable {
        eprintln!(
            "vramtrace: warning: skipped {}: {}",
            u.file.display(),
            u.reason
        );
    }
    warn_dropped(trace);
}

/// Says on stderr, per process, which time range lost tensor events to the recorder's size
/// budget (DROPPED records): every command that reads a trace says it.
pub fn warn_dropped(trace: &Trace) {
    let t0 = trace.start_ns();
    for p in &trace.processes {
        let from = p.dropped.iter().map(|d| d.1).min();
        let to = p.dropped.iter().map(|d| d.2).max();
        if let (Some(from), Some(to)) = (from, to) {
            eprintln!(
                "vramtrace: {}: tensor events from {:.3} s to {:.3} s were dropped to keep the trace within its size budget ({} blocks; driver events, failures and the live tensors were kept)",
                p.path.display(),
                from.saturating_sub(t0) as f64 / 1e9,
                to.saturating_sub(t0) as f64 / 1e9,
                p.dropped.len()
            );
        }
    }
}

/// An error and its causes, joined: `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Refuses what is not a regular file before opening it: opening a FIFO blocks until a
/// writer comes, and a device (`/dev/zero`) never ends.
fn check_regular(path: &Path) -> Result<(), Error> {
    let meta = std::fs::metadata(path).map_err(|e| Error::Io(path.to_path_buf(), e))?;
    if meta.is_file() {
        return Ok(());
    }
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    let what = if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else {
        "something else"
    };
    Err(Error::NotRegular(path.to_path_buf(), what))
}

/// Opens one file of a trace directory, or says why it cannot be read.
fn open_file(path: &Path) -> Result<Process, Error> {
    check_regular(path)?;
    match std::fs::metadata(path) {
        Ok(m) if m.len() == 0 => return Err(Error::EmptyTraceFile),
        _ => {}
    }
    Process::open(path)
}

impl Trace {
    /// Opens a trace directory (every `*.vtr` file in it) or a single trace file, reading the
    /// side tables of each. In a directory, files that cannot be read are skipped and listed in
    /// [`Trace::unreadable`]; only a directory with no readable file is an error. A path that
    /// is not a directory or a regular file (a FIFO, a device) is refused without being opened.
    pub fn open(path: &Path) -> Result<Trace, Error> {
        let meta = std::fs::metadata(path).map_err(|e| Error::Io(path.to_path_buf(), e))?;
        if !meta.is_dir() {
            check_regular(path)?;
            return Ok(Trace::from_processes(vec![Process::open(path)?]));
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| Error::Io(path.to_path_buf(), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == FILE_EXTENSION))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(Error::EmptyTraceDir(path.to_path_buf()));
        }
        let mut processes = Vec::new();
        let mut unreadable = Vec::new();
        for f in files {
            match open_file(&f) {
                Ok(p) => processes.push(p),
                Err(e) => unreadable.push(Unreadable {
                    file: f,
                    reason: chain(&e),
                }),
            }
        }
        if processes.is_empty() {
            let list: Vec<String> = unreadable
                .iter()
                .map(|u| format!("{}: {}", u.file.display(), u.reason))
                .collect();
            return Err(Error::NoReadableTrace(path.to_path_buf(), list.join("; ")));
        }
        let mut t = Trace::from_processes(processes);
        t.unreadable = unreadable;
        Ok(t)
    }

    /// Builds a trace from processes already in memory (tests, the live view).
    pub fn from_processes(mut processes: Vec<Process>) -> Trace {
        processes.sort_by_key(|p| (p.header.start_mono_ns, p.header.pid));
        Trace {
            processes,
            unreadable: Vec::new(),
        }
    }

    /// Builds a trace from decoded files.
    pub fn from_files(files: Vec<TraceFile>) -> Trace {
        Trace::from_processes(files.into_iter().map(Process::from_file).collect())
    }

    /// The process with this pid, if recorded.
    pub fn process(&self, pid: u32) -> Option<&Process> {
        self.processes.iter().find(|p| p.pid() == pid)
    }

    /// When the earliest process started (`CLOCK_MONOTONIC` ns): time 0 of the trace.
    pub fn start_ns(&self) -> u64 {
        self.processes
            .iter()
            .map(|p| p.header.start_mono_ns)
            .min()
            .unwrap_or(0)
    }

    /// A new pass over every timed item of every process, each with the index of its process,
    /// in time order; ties go to the earlier process, then to storage order.
    pub fn items(&self) -> Result<Items<'_>, Error> {
        let mut streams = Vec::with_capacity(self.processes.len());
        for p in &self.processes {
            streams.push(p.items()?);
        }
        Ok(Items::new(streams))
    }

    /// Calls `f` with every timed item in time order (see [`Trace::items`]) until it breaks.
    pub fn for_each_item(
        &self,
        mut f: impl FnMut(usize, Item) -> ControlFlow<()>,
    ) -> Result<(), Error> {
        for (pi, it) in self.items()? {
            if f(pi, it).is_break() {
                break;
            }
        }
        Ok(())
    }
}

/// The k-way merge behind [`Trace::items`]: one head item per process, the process whose head
/// is earliest ("current"), and a binary heap of (time, process) over the other heads. While the
/// current process's next item is still the earliest, items flow with one comparison and no heap
/// operation: processes write in runs. One process needs no heap.
pub struct Items<'a> {
    streams: Vec<ItemStream<'a>>,
    heads: Vec<Option<Item>>,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    current: Option<usize>,
}

impl<'a> Items<'a> {
    fn new(mut streams: Vec<ItemStream<'a>>) -> Items<'a> {
        let mut heads = Vec::with_capacity(streams.len());
        let mut heap = BinaryHeap::with_capacity(streams.len());
        if streams.len() > 1 {
            for (i, s) in streams.iter_mut().enumerate() {
                let h = s.next();
                if let Some(it) = &h {
                    heap.push(Reverse((it.t_ns(), i)));
                }
                heads.push(h);
            }
        }
        let current = heap.pop().map(|Reverse((_, i))| i);
        Items {
            streams,
            heads,
            heap,
            current,
        }
    }
}

impl Iterator for Items<'_> {
    type Item = (usize, Item);

    fn next(&mut self) -> Option<(usize, Item)> {
        if self.streams.len() == 1 {
            return self.streams[0].next().map(|it| (0, it));
        }
        let i = self.current?;
        let it = self.heads[i].take()?;
        match self.streams[i].next() {
            Some(n) => {
                let key = (n.t_ns(), i);
                self.heads[i] = Some(n);
                if let Some(mut top) = self.heap.peek_mut()
                    && top.0 < key
                {
                    // Another process is earlier now: it becomes current, this one waits.
                    let Reverse((_, j)) = std::mem::replace(&mut *top, Reverse(key));
                    self.current = Some(j);
                }
            }
            None => self.current = self.heap.pop().map(|Reverse((_, j))| j),
        }
        Some((i, it))
    }
}
