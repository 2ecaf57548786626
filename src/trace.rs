//! A recorded trace: one file per traced process, read from a trace directory (or one file).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use vramtrace_format::{
    Annotation, DeviceInfo, Event, FILE_EXTENSION, Header, Problem, Record, TraceFile,
};

/// A timed record that changes or describes the live set.
#[derive(Debug, Clone, Copy)]
pub enum Item<'a> {
    /// An allocation-family event.
    Event(&'a Event),
    /// A name, dtype and shape given to a live allocation.
    Annotate(&'a Annotation),
}

impl Item<'_> {
    /// When it happened.
    pub fn t_ns(&self) -> u64 {
        match self {
            Item::Event(e) => e.t_ns,
            Item::Annotate(a) => a.t_ns,
        }
    }
}

use crate::error::Error;

/// One traced process: its header, its records, and the tables its events refer to.
#[derive(Debug, Clone)]
pub struct Process {
    /// The file it was read from.
    pub path: PathBuf,
    /// Static facts: pid, ppid, command line, start time.
    pub header: Header,
    /// Driver version the process reported, if it got that far.
    pub driver_version: Option<i32>,
    /// Devices the process reported.
    pub devices: Vec<DeviceInfo>,
    /// All records in file order.
    pub records: Vec<Record>,
    /// Interned strings (labels, names, dtypes) by id.
    pub strings: HashMap<u32, String>,
    /// Native stacks by id, innermost frame first.
    pub stacks: HashMap<u32, Vec<u64>>,
    /// What the reader had to step over (a torn tail after a crash).
    pub problems: Vec<Problem>,
}

impl Process {
    fn from_file(f: TraceFile) -> Process {
        let mut strings = HashMap::new();
        let mut stacks = HashMap::new();
        for r in &f.records {
            match r {
                Record::String { id, text } => {
                    strings.insert(*id, text.clone());
                }
                Record::Stack { id, frames } => {
                    stacks.insert(*id, frames.clone());
                }
                _ => {}
            }
        }
        Process {
            path: f.path,
            header: f.header,
            driver_version: f.driver_version,
            devices: f.devices,
            records: f.records,
            strings,
            stacks,
            problems: f.problems,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.header.pid
    }

    /// The allocation-family events in file order.
    pub fn events(&self) -> impl Iterator<Item = &Event> + '_ {
        self.records.iter().filter_map(|r| match r {
            Record::Event(e) => Some(e),
            _ => None,
        })
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
}

impl Trace {
    /// Reads a trace directory (every `*.vtr` file in it) or a single trace file.
    pub fn open(path: &Path) -> Result<Trace, Error> {
        let meta = std::fs::metadata(path).map_err(|e| Error::Io(path.to_path_buf(), e))?;
        let files = if meta.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| Error::Io(path.to_path_buf(), e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == FILE_EXTENSION))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(Error::EmptyTraceDir(path.to_path_buf()));
            }
            files
        } else {
            vec![path.to_path_buf()]
        };
        let mut processes = Vec::with_capacity(files.len());
        for f in files {
            let t = TraceFile::read(&f).map_err(Error::Read)?;
            processes.push(Process::from_file(t));
        }
        Ok(Trace::from_processes(processes))
    }

    /// Builds a trace from processes already in memory (tests, the live view).
    pub fn from_processes(mut processes: Vec<Process>) -> Trace {
        processes.sort_by_key(|p| (p.header.start_mono_ns, p.header.pid));
        Trace { processes }
    }

    /// Builds a trace from decoded files.
    pub fn from_files(files: Vec<TraceFile>) -> Trace {
        Trace::from_processes(files.into_iter().map(Process::from_file).collect())
    }

    /// The process with this pid, if recorded.
    pub fn process(&self, pid: u32) -> Option<&Process> {
        self.processes.iter().find(|p| p.pid() == pid)
    }

    /// Every event and annotation of every process, each with the index of its process, in time
    /// order (ties keep file order).
    pub fn timeline(&self) -> Vec<(usize, Item<'_>)> {
        let mut all: Vec<(usize, Item<'_>)> = self
            .processes
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                p.records.iter().filter_map(move |r| match r {
                    Record::Event(e) => Some((i, Item::Event(e))),
                    Record::Annotate(a) => Some((i, Item::Annotate(a))),
                    _ => None,
                })
            })
            .collect();
        all.sort_by_key(|(i, it)| (it.t_ns(), *i));
        all
    }

    /// Every event of every process, each with the index of its process, in time order
    /// (ties keep file order).
    pub fn events_in_time_order(&self) -> Vec<(usize, &Event)> {
        self.timeline()
            .into_iter()
            .filter_map(|(i, it)| match it {
                Item::Event(e) => Some((i, e)),
                Item::Annotate(_) => None,
            })
            .collect()
    }
}
