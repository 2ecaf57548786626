//! The facts of a moment read from a [`Trace`]: one replay up to the moment gives the live
//! driver allocations and tensors of one process and device, their frames (symbolised), labels
//! and lifetimes ([`Steps`]), the device's free and total memory when the moment is a failure,
//! and the other traced processes' live bytes; [`categorise_moment`] turns them into rows.

use std::collections::HashMap;
use std::ops::ControlFlow;

use vramtrace_format::{EventKind, TensorAction};

use super::{
    Breakdown, Category, DeviceMemory, Expectations, Facts, Lifetime, LiveAllocation, LiveTensor,
    MomentFacts, NativeFrame, Placed, PyFrame, Steps, Verdict, categorise,
    categorise_moment_placing,
};
use crate::Error;
use crate::replay::{Pool, Replayer};
use crate::symbolize::{Frame, StackSymbolizer};
use crate::torch_replay::TensorReplay;
use crate::trace::{Item, Process, Trace};

/// Where a moment is: a process, a device, and the replay index of an item (the moment is
/// right after it is applied; at a failed allocation, the failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    /// Index of the process in the trace.
    pub process: usize,
    /// Device ordinal.
    pub device: i32,
    /// Replay index (every timed item of the trace counts one, in [`Trace::items`] order).
    pub seq: usize,
}

/// The first out-of-memory of the trace (a driver call that answered
/// `CUDA_ERROR_OUT_OF_MEMORY`, or a request PyTorch's caching allocator refused), as a moment.
pub fn first_failure(trace: &Trace) -> Result<Option<At>, Error> {
    let mut found = None;
    let mut i = 0usize;
    trace.for_each_item(|pi, it| {
        let hit = match &it {
            Item::Event(e) => (e.kind == EventKind::AllocFailed
                && crate::cu_result::is_out_of_memory(e.result))
            .then_some(e.device),
            Item::Tensor(t) => (t.action == TensorAction::AllocFailed).then_some(t.device),
            _ => None,
        };
        if let Some(device) = hit {
            found = Some(At {
                process: pi,
                device,
                seq: i,
            });
            return ControlFlow::Break(());
        }
        i += 1;
        ControlFlow::Continue(())
    })?;
    Ok(found)
}

/// The moment the device memory of one process was highest (driver-level, its first peak).
pub fn peak(trace: &Trace, process: usize, device: i32) -> Result<Option<At>, Error> {
    let mut r = Replayer::new();
    let mut i = 0usize;
    trace.for_each_item(|pi, it| {
        if let Item::Event(e) = &it {
            r.apply(pi, i, e);
        }
        i += 1;
        ControlFlow::Continue(())
    })?;
    let l = r.level(process, device, Pool::Device);
    Ok((l.peak > 0).then_some(At {
        process,
        device,
        seq: l.peak_seq,
    }))
}

/// Which moment of a device a breakdown is at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MomentKind {
    /// Its first out-of-memory.
    Failure,
    /// Its highest device memory (no out-of-memory).
    Peak,
}

/// The moment to break down for each process and device with device memory: its first
/// out-of-memory, else its peak; one pass over the trace, in process then device order.
pub fn moments(trace: &Trace) -> Result<Vec<(At, MomentKind)>, Error> {
    let mut r = Replayer::new();
    let mut failures: std::collections::BTreeMap<(usize, i32), usize> = Default::default();
    let mut i = 0usize;
    trace.for_each_item(|pi, it| {
        match &it {
            Item::Event(e) => {
                r.apply(pi, i, e);
                if e.kind == EventKind::AllocFailed
                    && crate::cu_result::is_out_of_memory(e.result)
                    && e.device >= 0
                {
                    failures.entry((pi, e.device)).or_insert(i);
                }
            }
            Item::Tensor(t) if t.action == TensorAction::AllocFailed && t.device >= 0 => {
                failures.entry((pi, t.device)).or_insert(i);
            }
            _ => {}
        }
        i += 1;
        ControlFlow::Continue(())
    })?;
    let mut keys: std::collections::BTreeSet<(usize, i32)> = failures.keys().copied().collect();
    for ((pi, device, pool), l) in r.levels() {
        if pool == Pool::Device && l.peak > 0 && device >= 0 {
            keys.insert((pi, device));
        }
    }
    Ok(keys
        .into_iter()
        .map(|(process, device)| match failures.get(&(process, device)) {
            Some(&seq) => (
                At {
                    process,
                    device,
                    seq,
                },
                MomentKind::Failure,
            ),
            None => (
                At {
                    process,
                    device,
                    seq: r.level(process, device, Pool::Device).peak_seq,
                },
                MomentKind::Peak,
            ),
        })
        .collect())
}

/// One live thing with owned frames and strings, before it is borrowed as [`Facts`].
struct Owned {
    ptr: u64,
    /// The stack id it was made at.
    stack: u32,
    bytes: u64,
    frames: Vec<Frame>,
    label: Option<String>,
    name: Option<String>,
    lifetime: Lifetime,
}

impl Owned {
    fn facts(&self) -> Facts<'_> {
        let python = self
            .frames
            .iter()
            .filter(|f| f.is_python())
            .map(|f| PyFrame {
                file: f.file.as_deref().unwrap_or("?"),
                function: f.function.as_deref().unwrap_or("?"),
                line: f.line.unwrap_or(0),
            })
            .collect();
        let native = self
            .frames
            .iter()
            .filter(|f| !f.is_python())
            .map(|f| NativeFrame {
                module: &f.module,
                symbol: f.function.as_deref(),
            })
            .collect();
        Facts {
            bytes: self.bytes,
            python,
            native,
            label: self.label.as_deref(),
            name: self.name.as_deref(),
            lifetime: self.lifetime,
            in_graph_pool: false,
        }
    }
}

/// The Python frames of a stack id straight from the process's tables (no symbolising).
pub fn py_frames(p: &Process, stack: u32) -> Vec<PyFrame<'_>> {
    p.py_stacks
        .get(&stack)
        .map(|fs| {
            fs.iter()
                .map(|f| PyFrame {
                    file: p.string(f.file).unwrap_or("?"),
                    function: p.string(f.function).unwrap_or("?"),
                    line: f.line,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The rows of the moment `at`: one replay of `trace` up to it.
pub fn breakdown_at(trace: &Trace, at: At, expect: Expectations) -> Result<Breakdown, Error> {
    Ok(breakdown_placing(trace, at, expect)?.0)
}

/// The categoriser's verdicts at each moment of a trace ([`moments`]: the first failure, else
/// the peak) by process and stack: what an offline timeline stacks every tensor and allocation
/// made at the same stack by, at any time, so it agrees with the breakdown at the moment
/// (lifetimes included, which [`categorise_stack`] cannot know when a tensor is made).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackCategories {
    tensors: HashMap<(usize, u32), Category>,
    allocations: HashMap<(usize, u32), Category>,
}

impl StackCategories {
    /// The category of the tensors process `process` made at `stack`, when some were live at
    /// a moment.
    pub fn tensor(&self, process: usize, stack: u32) -> Option<Category> {
        self.tensors.get(&(process, stack)).copied()
    }

    /// The category of the driver allocations process `process` made at `stack`, when one
    /// categorised by its own facts (not a PyTorch segment) was live at a moment.
    pub fn allocation(&self, process: usize, stack: u32) -> Option<Category> {
        self.allocations.get(&(process, stack)).copied()
    }

    /// True when no stack has a verdict.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty() && self.allocations.is_empty()
    }
}

/// The [`StackCategories`] of `trace`: one replay per moment of [`moments`]. A stack whose live
/// things at a moment went to several categories (their labels or names differ) takes the
/// one with the most bytes; a stack live at several moments takes its first moment's.
pub fn stack_categories(trace: &Trace) -> Result<StackCategories, Error> {
    let mut out = StackCategories::default();
    for (at, _) in moments(trace)? {
        let (_, placed) = breakdown_placing(trace, at, Expectations::default())?;
        // Bytes by category per (is a tensor, stack), in a fixed order.
        let mut by: std::collections::BTreeMap<
            (bool, u32),
            std::collections::BTreeMap<Category, u64>,
        > = Default::default();
        for (tensor, stack, bytes, c) in placed {
            *by.entry((tensor, stack)).or_default().entry(c).or_default() += bytes;
        }
        for ((tensor, stack), cats) in by {
            let mut best: Option<(Category, u64)> = None;
            for (c, b) in cats {
                if best.is_none_or(|(_, bb)| b > bb) {
                    best = Some((c, b));
                }
            }
            let map = if tensor {
                &mut out.tensors
            } else {
                &mut out.allocations
            };
            if let Some((c, _)) = best {
                map.entry((at.process, stack)).or_insert(c);
            }
        }
    }
    Ok(out)
}

/// Where the things of one moment went: (a tensor, stack id, bytes, category).
type PlacedByStack = Vec<(bool, u32, u64, Category)>;

/// [`breakdown_at`], with the category of every live tensor and allocation categorised by its
/// own facts, by stack.
fn breakdown_placing(
    trace: &Trace,
    at: At,
    expect: Expectations,
) -> Result<(Breakdown, PlacedByStack), Error> {
    let p = &trace.processes[at.process];
    let mut r = Replayer::new();
    let mut t = TensorReplay::new();
    let mut tensor_steps = Steps::new();
    // Tensors whose allocation this replay saw and that are not freed yet.
    let mut followed: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut driver_steps = Steps::new();
    let mut ranges: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut tensor_label: HashMap<u64, u32> = HashMap::new();
    let mut names: HashMap<u64, String> = HashMap::new();
    let mut failure: Option<DeviceMemory> = None;
    let total_of = |device: i32| {
        p.devices
            .iter()
            .find(|d| d.ordinal == device)
            .map(|d| d.total_bytes)
    };
    let mut i = 0usize;
    trace.for_each_item(|pi, it| {
        let ours = pi == at.process;
        match &it {
            Item::Event(e) => {
                r.apply(pi, i, e);
                if ours && e.device == at.device {
                    match e.kind {
                        EventKind::Alloc | EventKind::Map => {
                            driver_steps
                                .alloc_keyed(e.ptr, e.stack.into(), || py_frames(p, e.stack))
                        }
                        EventKind::Free | EventKind::Unmap => driver_steps.free(e.ptr),
                        EventKind::AllocFailed if i == at.seq => {
                            failure = Some(DeviceMemory {
                                total: e.total_bytes,
                                free: e.free_bytes,
                            })
                        }
                        _ => {}
                    }
                }
            }
            Item::Tensor(te) => {
                t.apply(pi, i, te);
                if ours && te.device == at.device {
                    // A restated live tensor (`Live`, written when a size budget may have
                    // dropped its allocation) is an allocation only when its own was dropped,
                    // as the tensor replay takes it.
                    let action = match te.action {
                        TensorAction::Live if !followed.contains(&te.ptr) => TensorAction::Alloc,
                        a => a,
                    };
                    match action {
                        TensorAction::Live => {}
                        TensorAction::Alloc => {
                            followed.insert(te.ptr);
                            tensor_steps
                                .alloc_keyed(te.ptr, te.stack.into(), || py_frames(p, te.stack));
                            match ranges.get(&te.tid).and_then(|s| s.last()) {
                                Some(&l) => tensor_label.insert(te.ptr, l),
                                // A block seeded at an attach: its operator says so.
                                None if te.op != 0
                                    && p.string(te.op) == Some(super::BEFORE_ATTACH) =>
                                {
                                    tensor_label.insert(te.ptr, te.op)
                                }
                                None => tensor_label.remove(&te.ptr),
                            };
                            names.remove(&te.ptr);
                        }
                        TensorAction::Free => {
                            followed.remove(&te.ptr);
                            tensor_steps.free(te.ptr)
                        }
                        TensorAction::AllocFailed if i == at.seq => {
                            if let Some(total) = total_of(te.device) {
                                failure = Some(DeviceMemory {
                                    total,
                                    free: te.free,
                                })
                            }
                        }
                        TensorAction::AllocFailed => {}
                    }
                }
            }
            Item::Annotate(a) => {
                r.annotate(pi, a);
                if ours {
                    names.insert(a.ptr, trace.processes[pi].tensor_name(a));
                }
            }
            Item::RangePush { tid, name, .. } if ours => {
                ranges.entry(*tid).or_default().push(*name);
            }
            Item::RangePop { tid, .. } if ours => {
                if let Some(s) = ranges.get_mut(tid) {
                    s.pop();
                }
            }
            _ => {}
        }
        i += 1;
        if i > at.seq {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;

    // A block seeded at an attach is named by the Python objects holding it once the probe's
    // walk has found them, which may be after this moment: its first name while it stays the
    // same block (not freed, its address not handed out again) is its name now too.
    let mut unnamed_seeds: std::collections::HashSet<u64> = t
        .live_set(at.process, at.device)
        .into_iter()
        .map(|lt| lt.event.ptr)
        .filter(|ptr| {
            !names.contains_key(ptr)
                && tensor_label
                    .get(ptr)
                    .is_some_and(|&l| p.string(l) == Some(super::BEFORE_ATTACH))
        })
        .collect();
    if !unnamed_seeds.is_empty() {
        let mut j = 0usize;
        trace.for_each_item(|pi, it| {
            j += 1;
            if j <= at.seq + 1 || pi != at.process {
                return ControlFlow::Continue(());
            }
            match &it {
                Item::Tensor(te) if te.device == at.device => {
                    if matches!(te.action, TensorAction::Alloc | TensorAction::Free) {
                        unnamed_seeds.remove(&te.ptr);
                    }
                }
                Item::Annotate(a) if !a.op && unnamed_seeds.remove(&a.ptr) => {
                    names.insert(a.ptr, p.tensor_name(a));
                }
                _ => {}
            }
            if unnamed_seeds.is_empty() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
    }
    let tensors_recorded = t.level_if_any(at.process, at.device).is_some();
    let tensor_life = tensor_steps.lifetimes();
    let driver_life = driver_steps.lifetimes();
    let mut sym = StackSymbolizer::new(p);
    let label = |id: u32| p.string(id).filter(|s| !s.is_empty()).map(str::to_string);

    // Driver allocations: device memory at an address; physical handles (cuMemCreate) are
    // counted where they are mapped (touching mappings joined: expandable segments grow by
    // mapping the next chunk at the end), and by themselves where they are not.
    let mut allocs: Vec<(Owned, bool)> = Vec::new();
    let mut handles: Vec<crate::replay::LiveAlloc> = Vec::new();
    for a in r.live_set(at.process, at.device, Pool::Device) {
        if a.event.api.name() == "cuMemCreate" {
            handles.push(a);
            continue;
        }
        if a.event.ptr == 0 {
            continue;
        }
        allocs.push((
            Owned {
                ptr: a.event.ptr,
                stack: a.event.stack,
                bytes: a.event.size,
                frames: sym.stack(a.event.stack),
                label: label(a.event.label),
                name: a.annotation.as_ref().map(|n| p.tensor_name(n)),
                lifetime: if tensors_recorded {
                    Lifetime::Unknown
                } else {
                    driver_life
                        .get(&a.event.ptr)
                        .copied()
                        .unwrap_or(Lifetime::Unknown)
                },
            },
            false,
        ));
    }
    let mut mapped = r.live_set(at.process, at.device, Pool::Mapped);
    mapped.sort_by_key(|a| a.event.ptr);
    let mapped_handles: std::collections::HashSet<u64> =
        mapped.iter().map(|a| a.event.aux).collect();
    let first_mapping = allocs.len();
    for a in mapped {
        if let Some((last, _)) = allocs[first_mapping..]
            .last_mut()
            .filter(|(l, _)| l.ptr + l.bytes == a.event.ptr)
        {
            last.bytes += a.event.size;
            continue;
        }
        allocs.push((
            Owned {
                ptr: a.event.ptr,
                stack: a.event.stack,
                bytes: a.event.size,
                frames: sym.stack(a.event.stack),
                label: label(a.event.label),
                name: None,
                lifetime: Lifetime::Unknown,
            },
            false,
        ));
    }
    for h in handles {
        if mapped_handles.contains(&h.event.ptr) {
            continue;
        }
        allocs.push((
            Owned {
                ptr: h.event.ptr,
                stack: h.event.stack,
                bytes: h.event.size,
                frames: sym.stack(h.event.stack),
                label: label(h.event.label),
                name: None,
                lifetime: Lifetime::Unknown,
            },
            true,
        ));
    }
    let tensors: Vec<Owned> = t
        .live_set(at.process, at.device)
        .into_iter()
        .map(|lt| Owned {
            ptr: lt.event.ptr,
            stack: lt.event.stack,
            bytes: lt.event.size,
            frames: sym.stack(lt.event.stack),
            label: tensor_label.get(&lt.event.ptr).and_then(|&l| label(l)),
            name: names.get(&lt.event.ptr).cloned(),
            lifetime: tensor_life
                .get(&lt.event.ptr)
                .copied()
                .unwrap_or(Lifetime::Unknown),
        })
        .collect();
    let other_traced = (0..trace.processes.len())
        .filter(|&pi| pi != at.process)
        .map(|pi| {
            (
                trace.processes[pi].pid(),
                r.level(pi, at.device, Pool::Device).live,
            )
        })
        .filter(|&(_, b)| b > 0)
        .collect();
    let m = MomentFacts {
        pid: p.pid(),
        allocations: allocs
            .iter()
            .map(|(o, handle)| LiveAllocation {
                ptr: o.ptr,
                handle: *handle,
                facts: o.facts(),
            })
            .collect(),
        tensors: tensors
            .iter()
            .map(|o| LiveTensor {
                ptr: o.ptr,
                facts: o.facts(),
            })
            .collect(),
        tensors_recorded,
        other_traced,
        device: failure,
        nvml: Vec::new(),
        expect,
    };
    let mut placed = Vec::new();
    let b = categorise_moment_placing(&m, &mut |pl| match pl {
        Placed::Tensor(i, c) => placed.push((true, tensors[i].stack, tensors[i].bytes, c)),
        Placed::Allocation(i, c) => placed.push((false, allocs[i].0.stack, allocs[i].0.bytes, c)),
    });
    Ok((b, placed))
}

/// The category of an allocation as it is made, from what is known then: its Python frames,
/// the modules of its native frames (no symbols: cheap enough for every allocation of a
/// timeline), its label and annotated name; its lifetime is not known yet.
pub fn categorise_stack(
    p: &Process,
    stack: u32,
    bytes: u64,
    label: Option<&str>,
    name: Option<&str>,
) -> Verdict {
    let native: Vec<NativeFrame<'_>> = p
        .stacks
        .get(&stack)
        .map(|addrs| {
            addrs
                .iter()
                .filter_map(|&a| {
                    p.modules
                        .iter()
                        .rev()
                        .find(|m| m.start <= a && a < m.end)
                        .map(|m| NativeFrame {
                            module: m.path.as_str(),
                            symbol: None,
                        })
                })
                .collect()
        })
        .unwrap_or_default();
    categorise(&Facts {
        bytes,
        python: py_frames(p, stack),
        native,
        label,
        name,
        lifetime: Lifetime::Unknown,
        in_graph_pool: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::categoriser::Category;

    #[test]
    fn a_stack_by_its_modules_and_python_frames() {
        let mut p = Trace::from_files(vec![vramtrace_format::TraceFile {
            path: "t".into(),
            header: Default::default(),
            driver_version: None,
            devices: Vec::new(),
            records: Vec::new(),
            problems: Vec::new(),
        }])
        .processes
        .remove(0);
        p.modules.push(vramtrace_format::ModuleInfo {
            start: 0x1000,
            end: 0x2000,
            bias: 0,
            path: "/usr/lib/x86_64-linux-gnu/libnccl.so.2".into(),
            build_id: Vec::new(),
        });
        p.stacks.insert(7, vec![0x1800, 0x9000]);
        let v = categorise_stack(&p, 7, 2 << 20, Some("ncclCommInitRankConfig"), None);
        assert_eq!(v.category, Category::Communication);
        p.strings
            .insert(1, "/w/site-packages/transformers/cache_utils.py".into());
        p.strings.insert(2, "update".into());
        p.py_stacks.insert(
            8,
            vec![vramtrace_format::PyFrame {
                file: 1,
                function: 2,
                line: 120,
            }],
        );
        assert_eq!(
            categorise_stack(&p, 8, 1, None, None).category,
            Category::KvCache
        );
        assert_eq!(
            categorise_stack(&p, 9, 1, None, None).category,
            Category::Unnamed
        );
    }
}
