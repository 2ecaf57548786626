//! A moment's rows: the live tensors and allocations, their segments' reserve, the untraced
//! bytes, each in a category with what it rests on, summing to the whole.

use std::collections::BTreeMap;

use serde::Serialize;
use vramtrace_models::units::fmt_bytes;

use super::{Category, Evidence, Facts, base, categorise};
use Category as C;

/// One tensor live at the moment (PyTorch's caching allocator), inside some allocation.
#[derive(Debug, Clone)]
pub struct LiveTensor<'a> {
    /// Its address.
    pub ptr: u64,
    /// The facts (`bytes` the block's).
    pub facts: Facts<'a>,
}

/// One driver allocation live at the moment, of the process the moment is about.
#[derive(Debug, Clone)]
pub struct LiveAllocation<'a> {
    /// Its address (a segment's base); for a physical handle not mapped, the handle.
    pub ptr: u64,
    /// A physical handle (`cuMemCreate`) not mapped anywhere: bytes, but no address a tensor
    /// could be at.
    pub handle: bool,
    /// The facts (`bytes` the allocation's).
    pub facts: Facts<'a>,
}

/// The device's memory at the moment, as the driver said at a failure (`cuMemGetInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Total bytes.
    pub total: u64,
    /// Free bytes.
    pub free: u64,
}

/// NVML's per-process figure (live).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlProcess {
    /// The process.
    pub pid: u32,
    /// Bytes NVML says it uses on the device.
    pub used: u64,
    /// Bytes traced of it on the device (0 if not traced).
    pub traced: u64,
}

/// Bytes expected from the model's config (`vramtrace-models`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expectations {
    /// The weights' bytes.
    pub weight_bytes: Option<u64>,
    /// KV bytes per token (every layer) and the tokens cached at the moment.
    pub kv: Option<(u64, u64)>,
    /// The recurrent state's bytes (every GDN layer, every sequence).
    pub state_bytes: Option<u64>,
}

impl Expectations {
    /// What `cfg` gives on one rank of `tp`: its weights in `format`
    /// (`vramtrace_models::weight_bytes`), its KV cache in `kv_dtype` for `tokens` cached tokens
    /// (`kv_cache_per_token`; none for 0 tokens), and its GDN state for `seqs` sequences with a bf16 conv state and
    /// an fp32 recurrent state (`gdn_state_per_seq`; fla's `final_state` is fp32).
    pub fn from_config(
        cfg: &vramtrace_models::ModelConfig,
        tp: u64,
        format: vramtrace_models::WeightFormat,
        kv_dtype: vramtrace_models::DType,
        tokens: u64,
        seqs: u64,
    ) -> Result<Expectations, vramtrace_models::ModelError> {
        use vramtrace_models::DType;
        let weights = vramtrace_models::weight_bytes(cfg, format, tp)?;
        let kv = vramtrace_models::kv_cache_per_token(cfg, tp, kv_dtype)?;
        let state = vramtrace_models::gdn_state_per_seq(cfg, tp, DType::BF16, DType::F32, 0)?;
        Ok(Expectations {
            weight_bytes: Some(weights.bytes),
            kv: (tokens > 0).then_some((kv.bytes_per_token, tokens)),
            state_bytes: (state.layers > 0).then(|| state.bytes_per_seq.saturating_mul(seqs)),
        })
    }
}

/// How close a group's bytes must be to the config's figure for the config to name it: 2 %
/// (the caching allocator's 512-byte rounding and a few buffers, not another component).
pub const CONFIG_TOLERANCE: f64 = 0.02;

fn near(observed: u64, expected: u64) -> bool {
    expected > 0 && (observed as f64 - expected as f64).abs() <= CONFIG_TOLERANCE * expected as f64
}

/// The live set at one moment, for one process and device.
#[derive(Debug, Clone, Default)]
pub struct MomentFacts<'a> {
    /// The process.
    pub pid: u32,
    /// Its live driver allocations on the device (segments and the rest).
    pub allocations: Vec<LiveAllocation<'a>>,
    /// Its live tensors (PyTorch's caching allocator); with none recorded, every allocation is
    /// categorised by its own facts.
    pub tensors: Vec<LiveTensor<'a>>,
    /// True when the process reported tensors at all (then an allocation holding none, made by
    /// PyTorch's allocator, is reserve, not something its frames name).
    pub tensors_recorded: bool,
    /// Other traced processes' live bytes on the device, by pid.
    pub other_traced: Vec<(u32, u64)>,
    /// The device's memory, at a failure.
    pub device: Option<DeviceMemory>,
    /// NVML's processes on the device, live (this one included).
    pub nvml: Vec<NvmlProcess>,
    /// What the config expects.
    pub expect: Expectations,
}

/// One line of evidence under a row: bytes and count resting on the same thing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EvidenceLine {
    /// What it rests on.
    pub evidence: Evidence,
    /// Bytes.
    pub bytes: u64,
    /// Allocations or tensors (0 for arithmetic).
    pub count: usize,
}

/// One category at a moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The category.
    pub category: Category,
    /// Its bytes.
    pub bytes: u64,
    /// Allocations or tensors in it (0 for arithmetic rows).
    pub count: usize,
    /// What it rests on, most bytes first ('unnamed': one line per Python line).
    pub evidence: Vec<EvidenceLine>,
}

/// The rows of a moment, summing to [`Breakdown::total`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    /// Rows with bytes, in [`Category::ALL`] order.
    pub rows: Vec<Row>,
    /// Their sum: the device's used memory (total − free) at a failure, else the traced bytes
    /// plus what NVML adds.
    pub total: u64,
    /// The process's segments (PyTorch's caching allocator), each with its reserve and largest
    /// free block, most reserve first.
    pub segments: Vec<SegmentReserve>,
}

impl Breakdown {
    /// The bytes of a category (0 when it has no row).
    pub fn bytes(&self, c: Category) -> u64 {
        self.rows
            .iter()
            .find(|r| r.category == c)
            .map_or(0, |r| r.bytes)
    }
}

/// One segment's reserve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentReserve {
    /// Base address.
    pub base: u64,
    /// Bytes.
    pub size: u64,
    /// Bytes of live tensors inside.
    pub tensor_bytes: u64,
    /// Reserved but unallocated.
    pub reserve: u64,
    /// Its largest gap between live tensors.
    pub largest_free_block: u64,
}

/// True for an allocation PyTorch's caching allocator made (a segment): a native frame in
/// `libc10_cuda`, or a segment of PyTorch's snapshot seeded at an attach (labelled
/// [`super::BEFORE_ATTACH`]: the attach seeds nothing else as a driver allocation).
fn is_pytorch_segment(f: &Facts<'_>) -> bool {
    f.label == Some(super::BEFORE_ATTACH)
        || f.native
            .iter()
            .any(|n| base(n.module).starts_with("libc10_cuda"))
}

#[derive(Default)]
struct Acc {
    bytes: u64,
    count: usize,
    lines: Vec<EvidenceLine>,
}

impl Acc {
    fn add(&mut self, evidence: Evidence, bytes: u64, count: usize) {
        self.bytes += bytes;
        self.count += count;
        // Evidence lines group by what they rest on, the line of a frame aside (a rule over a
        // function holds at many lines of it) and the size of a config check.
        let key = group_key(&evidence);
        match self
            .lines
            .iter_mut()
            .find(|l| group_key(&l.evidence) == key)
        {
            Some(l) => {
                l.bytes += bytes;
                l.count += count;
            }
            None => self.lines.push(EvidenceLine {
                evidence,
                bytes,
                count,
            }),
        }
    }
}

fn group_key(e: &Evidence) -> String {
    match e {
        Evidence::Frame {
            file,
            function,
            line,
            ..
        } => format!("frame {file} {function} {line}"),
        Evidence::Native { module, symbol, .. } => {
            format!(
                "native {} {}",
                base(module),
                symbol.as_deref().unwrap_or("")
            )
        }
        Evidence::Label { text, .. } => format!("label {text}"),
        other => format!("{other:?}"),
    }
}

/// Every byte of the moment in a row. Tensors are placed in the allocations holding them
/// (the last allocation starting at or below the tensor's address, if the tensor starts inside
/// it); an allocation's bytes not in its tensors are [`Category::AllocatorReserve`] when it is a
/// PyTorch segment in a process that reported tensors; other allocations are categorised by
/// their own facts. At a failure, the device's used memory not traced is
/// [`Category::Context`] (NVML's processes split it, when known); other traced processes are
/// [`Category::OtherProcess`].
pub fn categorise_moment(m: &MomentFacts<'_>) -> Breakdown {
    categorise_moment_placing(m, &mut |_| {})
}

/// Where [`categorise_moment`] put one live thing of its [`MomentFacts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// The tensor at this index of [`MomentFacts::tensors`] went to the category.
    Tensor(usize, Category),
    /// The allocation at this index of [`MomentFacts::allocations`] went to the category by its
    /// own facts (a PyTorch segment is not placed: its tensors and reserve are).
    Allocation(usize, Category),
}

/// [`categorise_moment`], telling `place` the category of every tensor and of every allocation
/// categorised by its own facts.
pub fn categorise_moment_placing(m: &MomentFacts<'_>, place: &mut dyn FnMut(Placed)) -> Breakdown {
    let mut acc: BTreeMap<Category, Acc> = BTreeMap::new();
    let mut allocs: Vec<(usize, &LiveAllocation<'_>)> = m
        .allocations
        .iter()
        .enumerate()
        .filter(|(_, a)| !a.handle)
        .collect();
    allocs.sort_by_key(|(_, a)| a.ptr);
    let mut inside: Vec<Vec<&LiveTensor<'_>>> = vec![Vec::new(); allocs.len()];
    let mut outside_tensors: Vec<&LiveTensor<'_>> = Vec::new();
    for t in &m.tensors {
        let i = allocs.partition_point(|(_, a)| a.ptr <= t.ptr);
        match i.checked_sub(1) {
            Some(i) if t.ptr < allocs[i].1.ptr.saturating_add(allocs[i].1.facts.bytes) => {
                inside[i].push(t)
            }
            _ => outside_tensors.push(t),
        }
    }
    // Tensors: every one by its own facts.
    for (ti, t) in m.tensors.iter().enumerate() {
        let v = categorise(&t.facts);
        place(Placed::Tensor(ti, v.category));
        acc.entry(v.category)
            .or_default()
            .add(v.evidence, t.facts.bytes, 1);
    }
    // Allocations: a segment's reserve, or the allocation by its own facts.
    let mut segments = Vec::new();
    let mut traced = 0u64;
    for (&(ai, a), ts) in allocs.iter().zip(inside.iter_mut()) {
        traced += a.facts.bytes;
        let segment = m.tensors_recorded && (!ts.is_empty() || is_pytorch_segment(&a.facts));
        if !segment {
            let v = categorise(&a.facts);
            place(Placed::Allocation(ai, v.category));
            acc.entry(v.category)
                .or_default()
                .add(v.evidence, a.facts.bytes, 1);
            continue;
        }
        ts.sort_by_key(|t| t.ptr);
        let end = a.ptr.saturating_add(a.facts.bytes);
        let mut cursor = a.ptr;
        let mut largest = 0u64;
        let mut tensor_bytes = 0u64;
        for t in ts.iter() {
            largest = largest.max(t.ptr.saturating_sub(cursor));
            let t_end = t.ptr.saturating_add(t.facts.bytes).min(end);
            tensor_bytes += t_end.saturating_sub(t.ptr);
            cursor = cursor.max(t_end);
        }
        largest = largest.max(end.saturating_sub(cursor));
        segments.push(SegmentReserve {
            base: a.ptr,
            size: a.facts.bytes,
            tensor_bytes,
            reserve: a.facts.bytes.saturating_sub(tensor_bytes),
            largest_free_block: largest,
        });
    }
    // Handles not mapped: bytes by their own facts.
    for (ai, a) in m.allocations.iter().enumerate().filter(|(_, a)| a.handle) {
        traced += a.facts.bytes;
        let v = categorise(&a.facts);
        place(Placed::Allocation(ai, v.category));
        acc.entry(v.category)
            .or_default()
            .add(v.evidence, a.facts.bytes, 1);
    }
    // Tensors in no live allocation were counted above but hold no traced driver bytes of
    // theirs (made before recording began): the traced total counts them.
    traced += outside_tensors.iter().map(|t| t.facts.bytes).sum::<u64>();
    let seg_bytes: u64 = segments.iter().map(|s| s.size).sum();
    let seg_tensor_bytes: u64 = segments.iter().map(|s| s.tensor_bytes).sum();
    let reserve: u64 = segments.iter().map(|s| s.reserve).sum();
    if reserve > 0 {
        acc.entry(C::AllocatorReserve).or_default().add(
            Evidence::SegmentArithmetic {
                segments: segments.len(),
                segment_bytes: seg_bytes,
                tensor_bytes: seg_tensor_bytes,
                largest_free_block: segments
                    .iter()
                    .map(|s| s.largest_free_block)
                    .max()
                    .unwrap_or(0),
            },
            reserve,
            0,
        );
    }
    // Other traced processes.
    let mut others = 0u64;
    for &(pid, bytes) in &m.other_traced {
        if bytes > 0 {
            others += bytes;
            acc.entry(C::OtherProcess)
                .or_default()
                .add(Evidence::OtherTraced { pid }, bytes, 0);
        }
    }
    let mut total = traced + others;
    // Untraced: the driver's figures at a failure, else NVML's per process.
    if let Some(d) = m.device {
        let used = d.total.saturating_sub(d.free);
        let untraced = used.saturating_sub(traced + others);
        if untraced > 0 {
            acc.entry(C::Context).or_default().add(
                Evidence::Untraced {
                    total: d.total,
                    free: d.free,
                    traced: traced + others,
                },
                untraced,
                0,
            );
        }
        total = total.max(used);
    } else {
        for p in &m.nvml {
            let extra = p.used.saturating_sub(p.traced);
            if extra == 0 {
                continue;
            }
            let c = if p.pid == m.pid || p.traced > 0 {
                C::Context
            } else {
                C::OtherProcess
            };
            acc.entry(c).or_default().add(
                Evidence::Nvml {
                    pid: p.pid,
                    used: p.used,
                    traced: p.traced,
                },
                extra,
                0,
            );
            total += extra;
        }
    }
    // The config names an unnamed line whose bytes are its weights', KV cache's or state's.
    if let Some(un) = acc.get_mut(&C::Unnamed) {
        let mut moved: Vec<(Category, EvidenceLine, u64)> = Vec::new();
        let targets = [
            (C::Weights, m.expect.weight_bytes),
            (C::KvCache, m.expect.kv.map(|(p, t)| p.saturating_mul(t))),
            (C::State, m.expect.state_bytes),
        ];
        un.lines.retain(|l| {
            let hit = targets
                .iter()
                .find(|(_, e)| e.is_some_and(|e| near(l.bytes, e)));
            match hit {
                Some(&(c, Some(expected))) => {
                    moved.push((
                        c,
                        EvidenceLine {
                            evidence: l.evidence.clone(),
                            bytes: l.bytes,
                            count: l.count,
                        },
                        expected,
                    ));
                    false
                }
                _ => true,
            }
        });
        for (c, line, expected) in moved {
            let un = acc.get_mut(&C::Unnamed).expect("moved from it");
            un.bytes -= line.bytes;
            un.count -= line.count;
            if un.bytes == 0 && un.lines.is_empty() {
                acc.remove(&C::Unnamed);
            }
            let site = match &line.evidence {
                Evidence::Site { site } => site.clone(),
                other => other.to_string(),
            };
            acc.entry(c).or_default().add(
                Evidence::ConfigSize {
                    site,
                    expected,
                    observed: line.bytes,
                },
                line.bytes,
                line.count,
            );
        }
    }
    // The config's figures beside the rows they check.
    if let Some(w) = m.expect.weight_bytes {
        let observed = acc.get(&C::Weights).map_or(0, |a| a.bytes);
        acc.entry(C::Weights).or_default().lines.push(EvidenceLine {
            evidence: Evidence::Config {
                expected: w,
                observed,
            },
            bytes: 0,
            count: 0,
        });
    }
    if let Some((per_token, tokens)) = m.expect.kv {
        let observed = acc.get(&C::KvCache).map_or(0, |a| a.bytes);
        acc.entry(C::KvCache).or_default().lines.push(EvidenceLine {
            evidence: Evidence::Config {
                expected: per_token.saturating_mul(tokens),
                observed,
            },
            bytes: 0,
            count: 0,
        });
    }
    if let Some(expected) = m.expect.state_bytes {
        let observed = acc.get(&C::State).map_or(0, |a| a.bytes);
        acc.entry(C::State).or_default().lines.push(EvidenceLine {
            evidence: Evidence::Config { expected, observed },
            bytes: 0,
            count: 0,
        });
    }
    segments.sort_by(|a, b| b.reserve.cmp(&a.reserve).then(a.base.cmp(&b.base)));
    let rows = Category::ALL
        .into_iter()
        .filter_map(|c| {
            let a = acc.remove(&c)?;
            let mut lines = a.lines;
            lines.sort_by_key(|l| std::cmp::Reverse(l.bytes));
            Some(Row {
                category: c,
                bytes: a.bytes,
                count: a.count,
                evidence: lines,
            })
        })
        .collect();
    Breakdown {
        rows,
        total,
        segments,
    }
}

/// Evidence lines shown under a row; the rest are summed in one line.
pub const SHOWN_EVIDENCE: usize = 6;

/// The rows as text, one per category with its bytes, share of the whole and count, and under
/// each what it rests on (at most [`SHOWN_EVIDENCE`] lines, the rest summed), every line
/// starting with `indent`.
pub fn render(b: &Breakdown, indent: &str) -> String {
    let mut out = String::new();
    let share = |x: u64| {
        if b.total == 0 {
            0.0
        } else {
            x as f64 * 100.0 / b.total as f64
        }
    };
    for r in &b.rows {
        let count = if r.count > 0 {
            format!(" in {}", r.count)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{indent}{:<18} {:>11} {:>6.2}%{count}\n",
            r.category.title(),
            fmt_bytes(r.bytes),
            share(r.bytes)
        ));
        let mut rest = (0u64, 0usize, 0usize);
        for (i, l) in r.evidence.iter().enumerate() {
            if i >= SHOWN_EVIDENCE {
                rest = (rest.0 + l.bytes, rest.1 + l.count, rest.2 + 1);
                continue;
            }
            let what = if l.bytes == 0 && l.count == 0 {
                String::new()
            } else if l.count > 0 {
                format!("{} in {}: ", fmt_bytes(l.bytes), l.count)
            } else {
                format!("{}: ", fmt_bytes(l.bytes))
            };
            out.push_str(&format!("{indent}    {what}{}\n", l.evidence));
        }
        if rest.2 > 0 {
            out.push_str(&format!(
                "{indent}    {} in {} under {} more lines\n",
                fmt_bytes(rest.0),
                rest.1,
                rest.2
            ));
        }
    }
    out.push_str(&format!(
        "{indent}{:<18} {:>11}\n",
        "total",
        fmt_bytes(b.total)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::categoriser::{NativeFrame, PyFrame};

    const MIB: u64 = 1 << 20;

    fn py<'a>(file: &'a str, function: &'a str, line: u32) -> PyFrame<'a> {
        PyFrame {
            file,
            function,
            line,
        }
    }

    fn tensor(ptr: u64, bytes: u64, python: Vec<PyFrame<'static>>) -> LiveTensor<'static> {
        LiveTensor {
            ptr,
            facts: Facts {
                bytes,
                python,
                ..Default::default()
            },
        }
    }

    fn segment(ptr: u64, bytes: u64) -> LiveAllocation<'static> {
        LiveAllocation {
            ptr,
            handle: false,
            facts: Facts {
                bytes,
                python: vec![py("/w/app.py", "main", 1)],
                native: vec![
                    NativeFrame {
                        module: "libcudart.so.13",
                        symbol: None,
                    },
                    NativeFrame {
                        module: "libc10_cuda.so",
                        symbol: None,
                    },
                ],
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_segment_seeded_at_an_attach_with_no_live_block_is_reserve() {
        // PyTorch's snapshot at the attach: two segments seeded as driver allocations labelled
        // `before attach` (no frames); one holds a seeded block, the other none.
        let seeded = |ptr: u64, bytes: u64| LiveAllocation {
            ptr,
            handle: false,
            facts: Facts {
                bytes,
                label: Some(crate::categoriser::BEFORE_ATTACH),
                ..Default::default()
            },
        };
        let m = MomentFacts {
            pid: 7,
            tensors_recorded: true,
            allocations: vec![seeded(0x1000_0000, 20 * MIB), seeded(0x2000_0000, 2 * MIB)],
            tensors: vec![LiveTensor {
                ptr: 0x1000_0000,
                facts: Facts {
                    bytes: 4 * MIB,
                    label: Some(crate::categoriser::BEFORE_ATTACH),
                    ..Default::default()
                },
            }],
            ..Default::default()
        };
        let b = categorise_moment(&m);
        assert_eq!(b.total, 22 * MIB);
        assert_eq!(b.bytes(Category::Unnamed), 4 * MIB);
        assert_eq!(b.bytes(Category::AllocatorReserve), 18 * MIB);
        assert_eq!(b.bytes(Category::Activations), 0);
        assert_eq!(b.segments.len(), 2);
    }

    #[test]
    fn a_failure_moment_sums_to_the_device_used_memory() {
        let model = "/v/site-packages/transformers/models/m/modeling_m.py";
        let linear = "/v/site-packages/torch/nn/modules/linear.py";
        let module = "/v/site-packages/torch/nn/modules/module.py";
        let mut m = MomentFacts {
            pid: 7,
            tensors_recorded: true,
            allocations: vec![
                // A 20 MiB segment: weights 4 MiB at +0, an activation 2 MiB at +8 MiB.
                segment(0x1000_0000, 20 * MIB),
                // An empty 2 MiB segment.
                segment(0x2000_0000, 2 * MIB),
                // cuBLAS's workspace.
                LiveAllocation {
                    ptr: 0x3000_0000,
                    handle: false,
                    facts: Facts {
                        bytes: 64 * MIB,
                        native: vec![NativeFrame {
                            module: "libcublas.so.13",
                            symbol: None,
                        }],
                        ..Default::default()
                    },
                },
            ],
            tensors: vec![
                tensor(0x1000_0000, 4 * MIB, vec![py(linear, "__init__", 106)]),
                tensor(
                    0x1000_0000 + 8 * MIB,
                    2 * MIB,
                    vec![py(model, "forward", 10), py(module, "_call_impl", 1775)],
                ),
                tensor(
                    0x1000_0000 + 6 * MIB,
                    MIB,
                    vec![py("/w/app.py", "step", 40)],
                ),
            ],
            other_traced: vec![(8, 100 * MIB)],
            device: Some(DeviceMemory {
                total: 1 << 30,
                free: (1 << 30) - 500 * MIB,
            }),
            expect: Expectations {
                weight_bytes: Some(4 * MIB),
                kv: None,
                state_bytes: None,
            },
            ..Default::default()
        };
        let b = categorise_moment(&m);
        assert_eq!(b.total, 500 * MIB);
        assert_eq!(b.rows.iter().map(|r| r.bytes).sum::<u64>(), 500 * MIB);
        assert_eq!(b.bytes(Category::Weights), 4 * MIB);
        assert_eq!(b.bytes(Category::Activations), 2 * MIB);
        assert_eq!(b.bytes(Category::Unnamed), MIB);
        assert_eq!(
            b.bytes(Category::Context),
            64 * MIB + (500 - 100 - 86) * MIB
        );
        assert_eq!(b.bytes(Category::OtherProcess), 100 * MIB);
        // 22 MiB of segments − 7 MiB of tensors.
        assert_eq!(b.bytes(Category::AllocatorReserve), 15 * MIB);
        assert_eq!(
            b.segments[0],
            SegmentReserve {
                base: 0x1000_0000,
                size: 20 * MIB,
                tensor_bytes: 7 * MIB,
                reserve: 13 * MIB,
                largest_free_block: 10 * MIB,
            }
        );
        assert_eq!(b.segments[1].largest_free_block, 2 * MIB);
        let unnamed = b
            .rows
            .iter()
            .find(|r| r.category == Category::Unnamed)
            .unwrap();
        assert_eq!(
            unnamed.evidence[0].evidence,
            Evidence::Site {
                site: "app.py:40 step".to_string()
            }
        );
        let weights = b
            .rows
            .iter()
            .find(|r| r.category == Category::Weights)
            .unwrap();
        assert!(weights.evidence.contains(&EvidenceLine {
            evidence: Evidence::Config {
                expected: 4 * MIB,
                observed: 4 * MIB
            },
            bytes: 0,
            count: 0
        }));
        // Without tensor records, a segment is what its own frames say.
        m.tensors.clear();
        m.tensors_recorded = false;
        let b = categorise_moment(&m);
        assert_eq!(b.bytes(Category::AllocatorReserve), 0);
        assert_eq!(b.bytes(Category::Unnamed), 22 * MIB);
        assert_eq!(b.rows.iter().map(|r| r.bytes).sum::<u64>(), 500 * MIB);
    }

    #[test]
    fn the_config_names_an_unnamed_line_of_its_size() {
        let t = |ptr: u64, bytes: u64, line: u32| {
            tensor(ptr, bytes, vec![py("/w/loader.py", "load", line)])
        };
        let m = MomentFacts {
            tensors: vec![
                // 3 × 100 MiB at line 10: the weights are 300 MiB + 1 MiB by the config.
                t(0x1_0000_0000, 100 * MIB, 10),
                t(0x2_0000_0000, 100 * MIB, 10),
                t(0x3_0000_0000, 100 * MIB, 10),
                // 8 MiB at line 20: 4096 tokens × 2 KiB.
                t(0x4_0000_0000, 8 * MIB, 20),
                // 5 MiB at line 30: nothing the config gives.
                t(0x5_0000_0000, 5 * MIB, 30),
            ],
            expect: Expectations {
                weight_bytes: Some(301 * MIB),
                kv: Some((2048, 4096)),
                state_bytes: None,
            },
            ..Default::default()
        };
        let b = categorise_moment(&m);
        assert_eq!(b.bytes(Category::Weights), 300 * MIB);
        assert_eq!(b.bytes(Category::KvCache), 8 * MIB);
        assert_eq!(b.bytes(Category::Unnamed), 5 * MIB);
        let w = b
            .rows
            .iter()
            .find(|r| r.category == Category::Weights)
            .unwrap();
        assert_eq!(w.count, 3);
        assert_eq!(
            w.evidence[0].evidence,
            Evidence::ConfigSize {
                site: "loader.py:10 load".to_string(),
                expected: 301 * MIB,
                observed: 300 * MIB,
            }
        );
        assert_eq!(b.total, 313 * MIB);
        // 2 % off is the edge: 301 MiB × 0.98 = 294.98 MiB.
        assert!(near(295 * MIB, 301 * MIB) && !near(294 * MIB, 301 * MIB));
    }

    #[test]
    fn rows_render_with_their_evidence() {
        let m = MomentFacts {
            tensors: (0..8)
                .map(|i| {
                    tensor(
                        0x1_0000_0000 + i * 0x1000_0000,
                        MIB,
                        vec![py("/w/app.py", "step", 10 + i as u32)],
                    )
                })
                .collect(),
            ..Default::default()
        };
        let text = render(&categorise_moment(&m), "  ");
        assert_eq!(
            text,
            "  unnamed               8.00 MiB 100.00% in 8\n\
             \x20     1.00 MiB in 1: no rule; at app.py:10 step\n\
             \x20     1.00 MiB in 1: no rule; at app.py:11 step\n\
             \x20     1.00 MiB in 1: no rule; at app.py:12 step\n\
             \x20     1.00 MiB in 1: no rule; at app.py:13 step\n\
             \x20     1.00 MiB in 1: no rule; at app.py:14 step\n\
             \x20     1.00 MiB in 1: no rule; at app.py:15 step\n\
             \x20     2.00 MiB in 2 under 2 more lines\n\
             \x20 total                 8.00 MiB\n"
        );
    }

    #[test]
    fn nvml_splits_the_untraced_when_live() {
        let m = MomentFacts {
            pid: 7,
            allocations: vec![LiveAllocation {
                ptr: 0x1000,
                handle: false,
                facts: Facts {
                    bytes: 10 * MIB,
                    label: Some("kv"),
                    ..Default::default()
                },
            }],
            nvml: vec![
                NvmlProcess {
                    pid: 7,
                    used: 600 * MIB,
                    traced: 10 * MIB,
                },
                NvmlProcess {
                    pid: 9,
                    used: 300 * MIB,
                    traced: 0,
                },
            ],
            ..Default::default()
        };
        let b = categorise_moment(&m);
        assert_eq!(b.bytes(Category::KvCache), 10 * MIB);
        assert_eq!(b.bytes(Category::Context), 590 * MIB);
        assert_eq!(b.bytes(Category::OtherProcess), 300 * MIB);
        assert_eq!(b.total, 900 * MIB);
    }
}
