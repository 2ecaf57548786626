//! A PyTorch memory snapshot (`torch.cuda.memory._snapshot()`, pickled) as a vramtrace trace.
//!
//! The pickle is decoded into plain values by a reader that knows only plain-data opcodes
//! (`unpickle`): no Python runs and no class is instantiated (a global reference in the
//! stream is refused). Anything that is not a snapshot
//! dict (`segments` and `device_traces` lists) is refused with a sentence saying why.
//!
//! What each part becomes, in one version 2 trace file written with the format crate's encoder:
//! - `segment_alloc` / `segment_free`: a driver allocation / release (`cuMemAlloc_v2` /
//!   `cuMemFree_v2`) of the segment's address and size; `segment_map` / `segment_unmap`
//!   (expandable segments): a `cuMemCreate` of the bytes mapped with a `cuMemMap` of the range,
//!   and their release (touching mappings read as one segment, see [`crate::torch_replay`]).
//! - `alloc` / `free_completed`: a TENSOR record allocated / freed at the block's address (a
//!   `free_requested` waits for its completion: the block is reusable only then).
//! - `oom`: a TENSOR record the allocator refused, with the request, the driver's free memory
//!   (`device_free`), and the allocated and reserved bytes as the snapshot replays to then.
//! - `frames`: the Python frames (file names ending in `.py`) as a PY_STACK with its strings;
//!   native frames are not kept (a snapshot has no addresses to symbolise).
//! - What was live before the history began (a release whose allocation is not in the trace, a
//!   segment or block of `segments` the trace never allocated) is allocated at the start.
//! - Our own exporter's frames (`filename: "vramtrace"`, see [`crate::export`]'s PyTorch
//!   snapshot): `tensor NAME DTYPE[SHAPE]` becomes an annotation of the block (name, dtype and
//!   shape), given right after its allocation; `label L` does too when the block has no tensor
//!   name (a TENSOR record has no label of its own, so the label reads as the block's name). A
//!   name found on any entry of a block (its alloc, its release, its block in `segments`)
//!   names it, so `export --format pytorch` then `import` keeps the names.
//!
//! Times are `time_us` (wall clock, µs) in ns; a snapshot without times gets one µs per entry.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_pickle::{HashableValue, Value};

mod unpickle;
use vramtrace_format::{
    Annotation, Api, BlockFileWriter, Event, EventKind, Header, MemKind, PyFrame, Record,
    TensorAction, TensorEvent,
};

/// Why a file could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read.
    #[error("cannot read {0}: {1}")]
    Io(std::path::PathBuf, std::io::Error),
    /// The bytes are not a pickle serde-pickle decodes without running code.
    #[error(
        "{0} is not a pickle that can be read safely: {1} (only plain values are decoded; nothing in the file is run)"
    )]
    Pickle(std::path::PathBuf, unpickle::PickleError),
    /// A pickle, but not a snapshot.
    #[error("{0} is not a PyTorch memory snapshot: {1}")]
    NotSnapshot(std::path::PathBuf, String),
    /// A record too large for a trace block.
    #[error("a record of {0} does not fit a trace block")]
    TooLarge(std::path::PathBuf),
    /// The trace could not be written.
    #[error(transparent)]
    Write(#[from] std::io::Error),
}

/// What an import produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imported {
    /// Segments allocated (including those live when the history began).
    pub segments: usize,
    /// Tensor allocations.
    pub tensors: usize,
    /// Tensor frees.
    pub frees: usize,
    /// Out-of-memory entries.
    pub ooms: usize,
    /// Devices with a trace.
    pub devices: usize,
}

fn key<'a>(d: &'a BTreeMap<HashableValue, Value>, k: &str) -> Option<&'a Value> {
    d.get(&HashableValue::String(k.to_string()))
}

/// A block of `segments`: its size, the bytes asked for (`requested_size`, since PyTorch 2.1;
/// else the size) and its stack.
fn block_sizes(b: &BTreeMap<HashableValue, Value>, stack: u32) -> (u64, u64, u32) {
    let size = int(key(b, "size")).unwrap_or(0);
    (size, int(key(b, "requested_size")).unwrap_or(size), stack)
}

fn int(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::I64(i) => u64::try_from(*i).ok(),
        Value::Int(b) => b.to_string().parse().ok(),
        // A u64 above i64::MAX (LONG1 of 9 bytes) comes as an i128 cast to f64: exact only
        // below 2^53, which addresses and sizes are.
        Value::F64(f) if *f >= 0.0 && f.is_finite() => Some(*f as u64),
        Value::Bool(b) => Some(u64::from(*b)),
        _ => None,
    }
}

fn text(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        _ => None,
    }
}

fn list(v: Option<&Value>) -> Option<&[Value]> {
    match v? {
        Value::List(l) | Value::Tuple(l) => Some(l),
        _ => None,
    }
}

fn dict(v: &Value) -> Option<&BTreeMap<HashableValue, Value>> {
    match v {
        Value::Dict(d) => Some(d),
        _ => None,
    }
}

/// Decodes a snapshot pickle and checks its shape.
pub fn read_snapshot(path: &Path) -> Result<Value, ImportError> {
    let bytes = std::fs::read(path).map_err(|e| ImportError::Io(path.to_path_buf(), e))?;
    let v = unpickle::loads(&bytes).map_err(|e| ImportError::Pickle(path.to_path_buf(), e))?;
    let not = |why: &str| ImportError::NotSnapshot(path.to_path_buf(), why.to_string());
    let d = dict(&v).ok_or_else(|| not("the pickle holds no dict"))?;
    if list(key(d, "segments")).is_none() {
        return Err(not("it has no `segments` list"));
    }
    if list(key(d, "device_traces")).is_none() {
        return Err(not("it has no `device_traces` list"));
    }
    Ok(v)
}

/// What our own exporter wrote into an entry's frames (`filename: "vramtrace"`): the tensor's
/// name (`tensor ...`) and the label (`label ...`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct OurNames {
    tensor: Option<String>,
    label: Option<String>,
}

impl OurNames {
    fn of(frames: Option<&[Value]>) -> OurNames {
        let mut n = OurNames::default();
        for f in frames.unwrap_or_default() {
            let Some(f) = dict(f) else { continue };
            if text(key(f, "filename")) != Some("vramtrace") {
                continue;
            }
            let name = text(key(f, "name")).unwrap_or("");
            if let Some(t) = name.strip_prefix("tensor ") {
                n.tensor.get_or_insert_with(|| t.to_string());
            } else if let Some(l) = name.strip_prefix("label ") {
                n.label.get_or_insert_with(|| l.to_string());
            }
        }
        n
    }

    /// Fills what `self` lacks from `other`.
    fn merge(&mut self, other: OurNames) {
        if self.tensor.is_none() {
            self.tensor = other.tensor;
        }
        if self.label.is_none() {
            self.label = other.label;
        }
    }

    /// The annotation's (name, dtype, shape): the tensor name as the exporter wrote it
    /// (`NAME`, `NAME [d0, d1]` or `NAME DTYPE[d0, d1]`), else the label.
    fn annotation(&self) -> Option<(String, Option<String>, Vec<i64>)> {
        if let Some(t) = &self.tensor {
            return Some(parse_tensor_name(t));
        }
        self.label.clone().map(|l| (l, None, Vec::new()))
    }
}

/// Splits `Process::tensor_name`'s text back into name, dtype and shape; a text that is not in
/// its shape is all name.
fn parse_tensor_name(s: &str) -> (String, Option<String>, Vec<i64>) {
    let whole = || (s.to_string(), None, Vec::new());
    let Some(body) = s.strip_suffix(']') else {
        return whole();
    };
    let Some(lb) = body.rfind('[') else {
        return whole();
    };
    let dims = &body[lb + 1..];
    let shape: Option<Vec<i64>> = if dims.trim().is_empty() {
        Some(Vec::new())
    } else {
        dims.split(',').map(|d| d.trim().parse().ok()).collect()
    };
    let Some(shape) = shape else {
        return whole();
    };
    let prefix = &body[..lb];
    if let Some(name) = prefix.strip_suffix(' ') {
        if name.is_empty() {
            return whole();
        }
        return (name.to_string(), None, shape);
    }
    match prefix.rsplit_once(' ') {
        Some((name, dtype)) if !name.is_empty() && !dtype.is_empty() => {
            (name.to_string(), Some(dtype.to_string()), shape)
        }
        _ => whole(),
    }
}

/// Interns strings and Python stacks for the records.
#[derive(Default)]
struct Tables {
    strings: HashMap<String, u32>,
    stacks: HashMap<Vec<PyFrame>, u32>,
    out: Vec<Record>,
}

impl Tables {
    fn string(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        let id = self.strings.len() as u32 + 1;
        self.strings.insert(s.to_string(), id);
        self.out.push(Record::String {
            id,
            text: s.to_string(),
        });
        id
    }

    /// The stack id of a snapshot entry's `frames` (Python frames only), 0 for none.
    fn stack(&mut self, frames: Option<&[Value]>) -> u32 {
        let mut py = Vec::new();
        for f in frames.unwrap_or_default() {
            let Some(f) = dict(f) else { continue };
            let Some(file) = text(key(f, "filename")) else {
                continue;
            };
            if !file.ends_with(".py") {
                continue;
            }
            let function = text(key(f, "name")).unwrap_or("?");
            let line = int(key(f, "line")).unwrap_or(0) as u32;
            py.push(PyFrame {
                file: self.string(file),
                function: self.string(function),
                line,
            });
            if py.len() == 256 {
                break;
            }
        }
        if py.is_empty() {
            return 0;
        }
        if let Some(&id) = self.stacks.get(&py) {
            return id;
        }
        let id = self.stacks.len() as u32 + 1;
        self.stacks.insert(py.clone(), id);
        self.out.push(Record::Stack {
            id,
            frames: Vec::new(),
        });
        self.out.push(Record::PyStack {
            stack: id,
            frames: py,
        });
        id
    }
}

/// One entry of a device trace, decoded.
struct Entry<'a> {
    action: &'a str,
    addr: u64,
    size: u64,
    t_ns: u64,
    frames: Option<&'a [Value]>,
    device_free: u64,
}

fn api(name: &str) -> Api {
    Api::from_name(name).unwrap_or_default()
}

fn event(
    t_ns: u64,
    device: i32,
    kind: EventKind,
    mem: MemKind,
    f: &str,
    ptr: u64,
    size: u64,
) -> Event {
    Event {
        t_ns,
        tid: 1,
        device,
        kind,
        mem,
        api: api(f),
        ptr,
        size,
        ..Event::default()
    }
}

/// Per device: our exporter's names by the index of the `alloc` entry they name.
type NamesAt = Vec<HashMap<usize, OurNames>>;
/// Per device: our exporter's names of blocks live before the history began, by address.
type NamesBefore = Vec<HashMap<u64, OurNames>>;
/// Per device: segments live before the history began, address → (size, expandable, stack).
type SegmentsBefore = Vec<BTreeMap<u64, (u64, bool, u32)>>;
/// Per device: blocks live before the history began, address → (size, requested, stack).
type BlocksBefore = Vec<BTreeMap<u64, (u64, u64, u32)>>;
/// Per device: blocks allocated at the end (`segments`), address → (size, requested).
type BlocksAtEnd = Vec<HashMap<u64, (u64, u64)>>;

/// The entries of every device's trace, decoded, and the time of the first one (1 µs when no
/// entry has a time). Entries without a time get 1 µs steps of their own.
fn decode_traces(traces: &[Value]) -> Result<(Vec<Vec<Entry<'_>>>, u64), String> {
    let mut first_t = u64::MAX;
    // Per device: the entries, decoded.
    let mut per_device: Vec<Vec<Entry>> = Vec::new();
    let mut tick = 1u64;
    for (dev, tr) in traces.iter().enumerate() {
        let entries = match tr {
            Value::List(l) | Value::Tuple(l) => l,
            _ => return Err(format!("device_traces[{dev}] is not a list")),
        };
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let e =
                dict(e).ok_or_else(|| format!("an entry of device_traces[{dev}] is not a dict"))?;
            let action = text(key(e, "action"))
                .ok_or_else(|| format!("an entry of device_traces[{dev}] has no action"))?;
            let t_ns = match int(key(e, "time_us")) {
                Some(us) if us > 0 => us.saturating_mul(1000),
                _ => {
                    tick += 1000;
                    tick
                }
            };
            first_t = first_t.min(t_ns);
            out.push(Entry {
                action,
                addr: int(key(e, "addr")).unwrap_or(0),
                size: int(key(e, "size")).unwrap_or(0),
                t_ns,
                frames: list(key(e, "frames")),
                device_free: int(key(e, "device_free")).unwrap_or(0),
            });
        }
        per_device.push(out);
    }
    if first_t == u64::MAX {
        first_t = 1000;
    }
    Ok((per_device, first_t))
}

/// Our exporter's names, per device: by the index of the `alloc` entry they name, and for
/// blocks live before the history began, by address.
fn our_names(
    per_device: &[Vec<Entry<'_>>],
    segments: &[Value],
    traces: &[Value],
) -> (NamesAt, NamesBefore) {
    let mut names_at: Vec<HashMap<usize, OurNames>> = vec![HashMap::new(); per_device.len()];
    let mut names_before: Vec<HashMap<u64, OurNames>> = vec![HashMap::new(); per_device.len()];
    for (dev, entries) in per_device.iter().enumerate() {
        let mut open: HashMap<u64, usize> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            let found = OurNames::of(e.frames);
            match e.action {
                "alloc" => {
                    open.insert(e.addr, i);
                    names_at[dev].entry(i).or_default().merge(found);
                }
                "free_requested" | "free_completed" => {
                    match open.get(&e.addr) {
                        Some(&a) => names_at[dev].entry(a).or_default().merge(found),
                        None => names_before[dev].entry(e.addr).or_default().merge(found),
                    }
                    if e.action == "free_completed" {
                        open.remove(&e.addr);
                    }
                }
                _ => {}
            }
        }
        for s in segments {
            let Some(s) = dict(s) else { continue };
            if int(key(s, "device")).unwrap_or(0) as usize != dev {
                continue;
            }
            for b in list(key(s, "blocks")).unwrap_or_default() {
                let Some(b) = dict(b) else { continue };
                let a = int(key(b, "address")).unwrap_or(0);
                let found = OurNames::of(list(key(b, "frames")));
                match open.get(&a) {
                    Some(&i) => names_at[dev].entry(i).or_default().merge(found),
                    None => names_before[dev].entry(a).or_default().merge(found),
                }
            }
        }
    }
    if traces.is_empty() {
        for s in segments {
            let Some(s) = dict(s) else { continue };
            let dev = int(key(s, "device")).unwrap_or(0) as usize;
            if names_before.len() <= dev {
                names_before.resize(dev + 1, HashMap::new());
            }
            for b in list(key(s, "blocks")).unwrap_or_default() {
                let Some(b) = dict(b) else { continue };
                let a = int(key(b, "address")).unwrap_or(0);
                names_before[dev]
                    .entry(a)
                    .or_default()
                    .merge(OurNames::of(list(key(b, "frames"))));
            }
        }
    }
    (names_at, names_before)
}

/// What was live when the history began, per device: segments (address → (size,
/// expandable, stack)) and blocks (address → (size, requested, stack)); and the blocks
/// allocated at the end (address → (size, requested)).
fn live_before(
    t: &mut Tables,
    per_device: &[Vec<Entry<'_>>],
    segments: &[Value],
    traces: &[Value],
) -> (SegmentsBefore, BlocksBefore, BlocksAtEnd) {
    let mut seg_before: Vec<BTreeMap<u64, (u64, bool, u32)>> =
        vec![BTreeMap::new(); per_device.len()];
    let mut blk_before: Vec<BTreeMap<u64, (u64, u64, u32)>> =
        vec![BTreeMap::new(); per_device.len()];
    // The blocks allocated at the end (address → (size, requested)): a trace entry gives only
    // the request, so the block of the last allocation at an address that is still allocated
    // comes from here.
    let mut blk_final: BlocksAtEnd = vec![HashMap::new(); per_device.len()];
    for (dev, entries) in per_device.iter().enumerate() {
        let mut seen_seg: HashMap<u64, bool> = HashMap::new();
        let mut seen_blk: HashMap<u64, bool> = HashMap::new();
        for e in entries {
            match e.action {
                "segment_alloc" | "segment_map" => {
                    seen_seg.entry(e.addr).or_insert(false);
                }
                "segment_free" | "segment_unmap" => {
                    if let std::collections::hash_map::Entry::Vacant(v) = seen_seg.entry(e.addr) {
                        v.insert(true);
                        seg_before[dev].insert(e.addr, (e.size, e.action == "segment_unmap", 0));
                    }
                }
                "alloc" => {
                    seen_blk.entry(e.addr).or_insert(false);
                }
                "free_requested" | "free_completed" => {
                    if let std::collections::hash_map::Entry::Vacant(v) = seen_blk.entry(e.addr) {
                        v.insert(true);
                        blk_before[dev].insert(e.addr, (e.size, e.size, 0));
                    }
                }
                _ => {}
            }
        }
        // The final state: what the trace never allocated was there from the start.
        for s in segments {
            let Some(s) = dict(s) else { continue };
            if int(key(s, "device")).unwrap_or(0) as usize != dev {
                continue;
            }
            let addr = int(key(s, "address")).unwrap_or(0);
            let size = int(key(s, "total_size")).unwrap_or(0);
            let expandable = matches!(key(s, "is_expandable"), Some(Value::Bool(true)));
            if !seen_seg.contains_key(&addr) {
                let stack = t.stack(list(key(s, "frames")));
                seg_before[dev].insert(addr, (size, expandable, stack));
            }
            for b in list(key(s, "blocks")).unwrap_or_default() {
                let Some(b) = dict(b) else { continue };
                let state = text(key(b, "state")).unwrap_or("");
                if !state.starts_with("active") {
                    continue;
                }
                let a = int(key(b, "address")).unwrap_or(0);
                let (size, requested, _) = block_sizes(b, 0);
                blk_final[dev].insert(a, (size, requested));
                if !seen_blk.contains_key(&a) {
                    let stack = t.stack(list(key(b, "frames")));
                    blk_before[dev].insert(a, block_sizes(b, stack));
                }
            }
        }
    }
    if traces.is_empty() {
        // A snapshot without history: its segments are the state at one moment.
        let mut devs: BTreeMap<usize, ()> = BTreeMap::new();
        for s in segments {
            if let Some(s) = dict(s) {
                devs.insert(int(key(s, "device")).unwrap_or(0) as usize, ());
            }
        }
        let max = devs.keys().next_back().map_or(0, |d| d + 1);
        seg_before.resize(max, BTreeMap::new());
        blk_before.resize(max, BTreeMap::new());
        for s in segments {
            let Some(s) = dict(s) else { continue };
            let dev = int(key(s, "device")).unwrap_or(0) as usize;
            let addr = int(key(s, "address")).unwrap_or(0);
            let expandable = matches!(key(s, "is_expandable"), Some(Value::Bool(true)));
            let stack = t.stack(list(key(s, "frames")));
            seg_before[dev].insert(
                addr,
                (int(key(s, "total_size")).unwrap_or(0), expandable, stack),
            );
            for b in list(key(s, "blocks")).unwrap_or_default() {
                let Some(b) = dict(b) else { continue };
                if !text(key(b, "state")).unwrap_or("").starts_with("active") {
                    continue;
                }
                let stack = t.stack(list(key(b, "frames")));
                blk_before[dev].insert(int(key(b, "address")).unwrap_or(0), block_sizes(b, stack));
            }
        }
    }
    (seg_before, blk_before, blk_final)
}

/// The records of a segment's allocation: `cuMemCreate` and `cuMemMap` for an expandable
/// segment, `cuMemAlloc_v2` otherwise.
fn segment_events(
    t_ns: u64,
    dev: i32,
    addr: u64,
    size: u64,
    expandable: bool,
    stack: u32,
) -> Vec<Record> {
    let mut v = Vec::new();
    if expandable {
        let mut c = event(
            t_ns,
            dev,
            EventKind::Alloc,
            MemKind::Device,
            "cuMemCreate",
            addr,
            size,
        );
        c.stack = stack;
        v.push(Record::Event(c));
        let mut m = event(
            t_ns,
            dev,
            EventKind::Map,
            MemKind::Mapping,
            "cuMemMap",
            addr,
            size,
        );
        m.aux = addr;
        v.push(Record::Event(m));
    } else {
        let mut a = event(
            t_ns,
            dev,
            EventKind::Alloc,
            MemKind::Device,
            "cuMemAlloc_v2",
            addr,
            size,
        );
        a.stack = stack;
        v.push(Record::Event(a));
    }
    v
}

/// A TENSOR record: `size` the block's (or the request's where the snapshot gives no block),
/// `requested` the bytes asked for (0 for a release or a refusal).
fn tensor(
    t_ns: u64,
    dev: i32,
    action: TensorAction,
    ptr: u64,
    (size, requested): (u64, u64),
    stack: u32,
) -> Record {
    Record::Tensor(TensorEvent {
        t_ns,
        tid: 1,
        device: dev,
        action,
        ptr,
        size,
        requested,
        stack,
        ..TensorEvent::default()
    })
}

/// The annotation our exporter's names give a tensor, if they give one.
fn annotate(t: &mut Tables, t_ns: u64, ptr: u64, names: Option<&OurNames>) -> Option<Record> {
    let (name, dtype, shape) = names.and_then(OurNames::annotation)?;
    Some(Record::Annotate(Annotation {
        t_ns,
        tid: 1,
        ptr,
        name: t.string(&name),
        dtype: dtype.map_or(0, |d| t.string(&d)),
        shape,
        op: false,
    }))
}

/// Converts a decoded snapshot into the records of one trace file, and its header.
pub fn convert(
    v: &Value,
    pid: u32,
    source: &str,
) -> Result<(Header, Vec<Record>, Imported), String> {
    let d = dict(v).ok_or("the pickle holds no dict")?;
    let segments = list(key(d, "segments")).ok_or("no `segments` list")?;
    let traces = list(key(d, "device_traces")).ok_or("no `device_traces` list")?;
    let mut t = Tables::default();
    let mut n = Imported::default();
    let mut timed: Vec<Record> = Vec::new();
    let (per_device, first_t) = decode_traces(traces)?;
    let (names_at, names_before) = our_names(&per_device, segments, traces);
    let t_start = first_t.saturating_sub(1);
    let (seg_before, blk_before, blk_final) = live_before(&mut t, &per_device, segments, traces);
    // A snapshot without history has devices only in `segments`.
    let devices = per_device.len().max(seg_before.len());
    let no_entries: Vec<Entry> = Vec::new();
    for dev in 0..devices {
        let entries = per_device.get(dev).unwrap_or(&no_entries);
        let di = dev as i32;
        // Replayed state, for the allocated and reserved bytes at an `oom`.
        let mut blocks: HashMap<u64, u64> = HashMap::new();
        let mut segs: HashMap<u64, (u64, bool)> = HashMap::new();
        for (&a, &(size, exp, stack)) in &seg_before[dev] {
            timed.extend(segment_events(t_start, di, a, size, exp, stack));
            segs.insert(a, (size, exp));
            n.segments += 1;
        }
        for (&a, &(size, requested, stack)) in &blk_before[dev] {
            timed.push(tensor(
                t_start,
                di,
                TensorAction::Alloc,
                a,
                (size, requested),
                stack,
            ));
            let names = names_before.get(dev).and_then(|m| m.get(&a));
            timed.extend(annotate(&mut t, t_start, a, names));
            blocks.insert(a, size);
            n.tensors += 1;
        }
        if !entries.is_empty() || !seg_before[dev].is_empty() {
            n.devices += 1;
        }
        let mut last_alloc: HashMap<u64, usize> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            if e.action == "alloc" {
                last_alloc.insert(e.addr, i);
            }
        }
        for (i, e) in entries.iter().enumerate() {
            match e.action {
                "segment_alloc" | "segment_map" => {
                    let exp = e.action == "segment_map";
                    let stack = t.stack(e.frames);
                    timed.extend(segment_events(e.t_ns, di, e.addr, e.size, exp, stack));
                    segs.insert(e.addr, (e.size, exp));
                    n.segments += 1;
                }
                "segment_free" | "segment_unmap" => {
                    let exp = segs
                        .remove(&e.addr)
                        .map_or(e.action == "segment_unmap", |s| s.1);
                    if exp {
                        timed.push(Record::Event(event(
                            e.t_ns,
                            di,
                            EventKind::Unmap,
                            MemKind::Mapping,
                            "cuMemUnmap",
                            e.addr,
                            0,
                        )));
                        timed.push(Record::Event(event(
                            e.t_ns,
                            di,
                            EventKind::Free,
                            MemKind::Device,
                            "cuMemRelease",
                            e.addr,
                            0,
                        )));
                    } else {
                        timed.push(Record::Event(event(
                            e.t_ns,
                            di,
                            EventKind::Free,
                            MemKind::Device,
                            "cuMemFree_v2",
                            e.addr,
                            0,
                        )));
                    }
                }
                "alloc" => {
                    let stack = t.stack(e.frames);
                    // A trace entry's size is the request; the block is not in the entry. Still
                    // allocated at the end, it is in `segments`. A block that fills its segment
                    // exactly is a segment of its own (our driver-level export, or a caching-off
                    // run): the request. Else it is the request rounded up to the allocator's
                    // 512-byte unit (c10/cuda/CUDACachingAllocator.cpp round_size); a large
                    // block left unsplit (less than 1 MiB would remain) is not known.
                    let whole = segs.get(&e.addr).is_some_and(|s| s.0 == e.size);
                    let rounded = if whole {
                        e.size
                    } else {
                        e.size.max(1).div_ceil(512) * 512
                    };
                    let sizes = blk_final
                        .get(dev)
                        .and_then(|f| f.get(&e.addr))
                        .filter(|_| last_alloc.get(&e.addr) == Some(&i))
                        .copied()
                        .unwrap_or((rounded, e.size));
                    timed.push(tensor(
                        e.t_ns,
                        di,
                        TensorAction::Alloc,
                        e.addr,
                        sizes,
                        stack,
                    ));
                    let names = names_at[dev].get(&i);
                    timed.extend(annotate(&mut t, e.t_ns, e.addr, names));
                    blocks.insert(e.addr, sizes.0);
                    n.tensors += 1;
                }
                "free_completed" => {
                    timed.push(tensor(e.t_ns, di, TensorAction::Free, e.addr, (0, 0), 0));
                    blocks.remove(&e.addr);
                    n.frees += 1;
                }
                "oom" => {
                    let stack = t.stack(e.frames);
                    let Record::Tensor(mut r) =
                        tensor(e.t_ns, di, TensorAction::AllocFailed, 0, (e.size, 0), stack)
                    else {
                        unreachable!()
                    };
                    r.free = e.device_free;
                    r.allocated = blocks.values().sum();
                    r.reserved = segs.values().map(|s| s.0).sum();
                    timed.push(Record::Tensor(r));
                    n.ooms += 1;
                }
                // free_requested (the block is reusable at free_completed), snapshot markers.
                _ => {}
            }
        }
    }
    let header = Header {
        pid,
        ppid: 0,
        start_unix_ns: t_start,
        start_mono_ns: t_start,
        hostname: String::new(),
        cmdline: vec!["vramtrace-import".into(), source.to_string()],
        ..Header::default()
    };
    let mut records = t.out;
    records.extend(timed);
    Ok((header, records, n))
}

/// Imports `snapshot` into the trace directory `out` (created if needed) as `<pid>.vtr`.
pub fn import(
    snapshot: &Path,
    out: &Path,
    pid: u32,
) -> Result<(std::path::PathBuf, Imported), ImportError> {
    let v = read_snapshot(snapshot)?;
    let (header, records, n) = convert(&v, pid, &snapshot.display().to_string())
        .map_err(|why| ImportError::NotSnapshot(snapshot.to_path_buf(), why))?;
    let mut w = BlockFileWriter::new(&header, 1 << 16);
    for r in &records {
        if w.push(1, r).is_none() {
            return Err(ImportError::TooLarge(snapshot.to_path_buf()));
        }
    }
    std::fs::create_dir_all(out)?;
    let path = out.join(format!("{pid}.{}", vramtrace_format::FILE_EXTENSION));
    std::fs::write(&path, w.finish())?;
    Ok((path, n))
}

#[cfg(test)]
mod tests {
    use super::parse_tensor_name;

    #[test]
    fn tensor_names_parse_back() {
        let p = |s: &str| parse_tensor_name(s);
        assert_eq!(
            p("o bf16[1, 4128, 48, 128]"),
            ("o".into(), Some("bf16".into()), vec![1, 4128, 48, 128])
        );
        assert_eq!(
            p("input g [4128, 48]"),
            ("input g".into(), None, vec![4128, 48])
        );
        assert_eq!(p("h"), ("h".into(), None, vec![]));
        assert_eq!(p("kv f32[]"), ("kv".into(), Some("f32".into()), vec![]));
        assert_eq!(p("odd [x]"), ("odd [x]".into(), None, vec![]));
        assert_eq!(p("[3]"), ("[3]".into(), None, vec![]));
    }
}
