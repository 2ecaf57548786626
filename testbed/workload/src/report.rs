//! What a run prints: the tensors it allocated (in order, with when each was
//! freed), the peak, and the timing; as a table or as JSON.

use serde_json::{Value, json};
use vramtrace_models::units::ByteUnit;

use crate::gdn::RunTiming;
use crate::tensor::{LedgerEvent, TensorSpec};

/// One allocated tensor and its lifetime, in ledger sequence numbers (1-based).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRow {
    /// Name, dtype, shape.
    pub spec: TensorSpec,
    /// Device pointer.
    pub ptr: u64,
    /// Range path open at allocation.
    pub stage: String,
    /// Position of the allocation in the ledger.
    pub alloc_seq: usize,
    /// Position of the free, if it was freed.
    pub free_seq: Option<usize>,
}

/// Everything the report needs about one run.
pub struct Report {
    /// `gdn` or `fa`.
    pub kernel: &'static str,
    /// The upstream code whose allocations were followed.
    pub variant: String,
    /// The problem, as JSON.
    pub config: Value,
    /// The device description.
    pub device: String,
    /// Whether kernels ran.
    pub simulated: bool,
    /// Whether the preload's annotation ABI was found.
    pub annotated: bool,
    /// The session ledger.
    pub ledger: Vec<LedgerEvent>,
    /// Input and forward wall time.
    pub timing: RunTiming,
    /// Per-range wall time.
    pub stages: Vec<(String, f64)>,
}

/// Peak live bytes and the ledger index (0-based) where it was reached.
pub fn peak(ledger: &[LedgerEvent]) -> (usize, usize) {
    let (mut live, mut best, mut at) = (0usize, 0usize, 0usize);
    for (i, e) in ledger.iter().enumerate() {
        match e {
            LedgerEvent::Alloc { spec, .. } => {
                live += spec.bytes();
                if live > best {
                    best = live;
                    at = i;
                }
            }
            LedgerEvent::Free { spec, .. } => live -= spec.bytes(),
        }
    }
    (best, at)
}

/// Tensors in allocation order with their lifetimes.
pub fn tensors(ledger: &[LedgerEvent]) -> Vec<TensorRow> {
    let mut rows: Vec<TensorRow> = Vec::new();
    for (i, e) in ledger.iter().enumerate() {
        match e {
            LedgerEvent::Alloc { spec, ptr, stage } => rows.push(TensorRow {
                spec: spec.clone(),
                ptr: *ptr,
                stage: stage.clone(),
                alloc_seq: i + 1,
                free_seq: None,
            }),
            LedgerEvent::Free { ptr, .. } => {
                if let Some(r) = rows
                    .iter_mut()
                    .rev()
                    .find(|r| r.ptr == *ptr && r.free_seq.is_none())
                {
                    r.free_seq = Some(i + 1);
                }
            }
        }
    }
    rows
}

/// `b` in MiB with one decimal: `97.5 MiB`.
fn mib(b: usize) -> String {
    ByteUnit::MiB.format(b as f64, 1)
}

impl Report {
    fn input_bytes(&self) -> usize {
        tensors(&self.ledger)
            .iter()
            .filter(|r| r.stage == "inputs")
            .map(|r| r.spec.bytes())
            .sum()
    }

    /// The machine-readable report: `tensors` in allocation order with `name`,
    /// `shape`, `dtype`, `bytes` (as `vramtrace model --json` lists them), plus
    /// pointers, lifetimes, the event list, the peak and the timing.
    pub fn to_json(&self) -> Value {
        let (peak_bytes, peak_at) = peak(&self.ledger);
        let tensors: Vec<Value> = tensors(&self.ledger)
            .iter()
            .map(|r| {
                json!({
                    "name": r.spec.name,
                    "dtype": r.spec.dtype.name(),
                    "shape": r.spec.shape,
                    "bytes": r.spec.bytes(),
                    "ptr": format!("{:#x}", r.ptr),
                    "stage": r.stage,
                    "alloc_seq": r.alloc_seq,
                    "free_seq": r.free_seq,
                })
            })
            .collect();
        let events: Vec<Value> = self
            .ledger
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let (kind, spec, ptr, stage) = match e {
                    LedgerEvent::Alloc { spec, ptr, stage } => ("alloc", spec, ptr, stage),
                    LedgerEvent::Free { spec, ptr, stage } => ("free", spec, ptr, stage),
                };
                json!({
                    "seq": i + 1,
                    "kind": kind,
                    "name": spec.name,
                    "bytes": spec.bytes(),
                    "ptr": format!("{ptr:#x}"),
                    "stage": stage,
                })
            })
            .collect();
        let stages: Vec<Value> = self
            .stages
            .iter()
            .map(|(n, ms)| json!({"stage": n, "ms": ms}))
            .collect();
        let inputs = self.input_bytes();
        json!({
            "kernel": self.kernel,
            "variant": self.variant,
            "config": self.config,
            "device": self.device,
            "simulated": self.simulated,
            "annotated": self.annotated,
            "tensors": tensors,
            "events": events,
            "peak_bytes": peak_bytes,
            "peak_seq": peak_at + 1,
            "input_bytes": inputs,
            "peak_bytes_above_inputs": peak_bytes.saturating_sub(inputs),
            "timing_ms": {
                "inputs": self.timing.inputs_ms,
                "forward": self.timing.forward_ms,
                "stages": stages,
            },
        })
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let rows = tensors(&self.ledger);
        s += &format!("{} ({})\n", self.kernel, self.variant);
        s += &format!("{}\n", self.device);
        s += &format!(
            "annotations: {}\n\n",
            if self.annotated {
                "vramtrace_annotate found: every tensor below is named in the trace"
            } else {
                "the vramtrace preload is not loaded (run under `vramtrace run` to trace)"
            }
        );
        s += &format!(
            "{:>3}  {:<22} {:<5} {:<22} {:>12} {:>10}  {:<18} {:>5} {:>5}  {}\n",
            "#", "tensor", "dtype", "shape", "bytes", "MiB", "pointer", "alloc", "free", "stage"
        );
        for (i, r) in rows.iter().enumerate() {
            s += &format!(
                "{:>3}  {:<22} {:<5} {:<22} {:>12} {:>10}  {:<18} {:>5} {:>5}  {}\n",
                i + 1,
                r.spec.name,
                r.spec.dtype.name(),
                format!("{:?}", r.spec.shape),
                r.spec.bytes(),
                ByteUnit::MiB.number(r.spec.bytes() as f64, 2),
                format!("{:#x}", r.ptr),
                r.alloc_seq,
                r.free_seq.map_or("-".to_string(), |f| f.to_string()),
                r.stage
            );
        }
        let (peak_bytes, at) = peak(&self.ledger);
        let inputs = self.input_bytes();
        let at_name = match &self.ledger.get(at) {
            Some(LedgerEvent::Alloc { spec, .. }) => spec.name.clone(),
            _ => "-".into(),
        };
        s += &format!(
            "\n(alloc / free: position in the {} driver calls of the run)\n",
            self.ledger.len()
        );
        s += &format!(
            "peak live: {} bytes ({}) when `{}` was allocated; {} bytes ({}) above the {} of inputs\n",
            peak_bytes,
            mib(peak_bytes),
            at_name,
            peak_bytes.saturating_sub(inputs),
            mib(peak_bytes.saturating_sub(inputs)),
            mib(inputs)
        );
        if self.simulated {
            s += &format!(
                "timing: inputs {:.1} ms, call {:.1} ms (simulated: allocations only)\n",
                self.timing.inputs_ms, self.timing.forward_ms
            );
        } else {
            s += &format!(
                "timing: inputs {:.1} ms, call {:.1} ms (synchronised after each stage)\n",
                self.timing.inputs_ms, self.timing.forward_ms
            );
            for (name, ms) in &self.stages {
                if name != "inputs" {
                    s += &format!("  {ms:>9.3} ms  {name}\n");
                }
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn alloc(name: &str, bytes: usize, ptr: u64, stage: &str) -> LedgerEvent {
        LedgerEvent::Alloc {
            spec: TensorSpec::new(name, DType::U64, &[bytes / 8]),
            ptr,
            stage: stage.into(),
        }
    }
    fn free(name: &str, bytes: usize, ptr: u64) -> LedgerEvent {
        LedgerEvent::Free {
            spec: TensorSpec::new(name, DType::U64, &[bytes / 8]),
            ptr,
            stage: String::new(),
        }
    }

    #[test]
    fn peak_and_lifetimes() {
        let ledger = vec![
            alloc("x", 800, 1, "inputs"),
            alloc("a", 80, 2, "f"),
            alloc("b", 160, 3, "f"),
            free("a", 80, 2),
            alloc("c", 16, 4, "f"),
            free("b", 160, 3),
            free("c", 16, 4),
            free("x", 800, 1),
        ];
        assert_eq!(peak(&ledger), (1040, 2));
        let rows = tensors(&ledger);
        assert_eq!(rows.len(), 4);
        assert_eq!((rows[1].alloc_seq, rows[1].free_seq), (2, Some(4)));
        assert_eq!((rows[3].alloc_seq, rows[3].free_seq), (5, Some(7)));
        let report = Report {
            kernel: "gdn",
            variant: "test".into(),
            config: json!({}),
            device: "none".into(),
            simulated: true,
            annotated: false,
            ledger,
            timing: RunTiming::default(),
            stages: vec![],
        };
        let j = report.to_json();
        assert_eq!(j["peak_bytes"], 1040);
        assert_eq!(j["peak_bytes_above_inputs"], 240);
        assert_eq!(j["tensors"][2]["name"], "b");
        assert_eq!(j["tensors"][2]["bytes"], 160);
        assert_eq!(j["events"].as_array().unwrap().len(), 8);
        let text = report.to_text();
        assert!(text.contains("peak live: 1040 bytes"), "{text}");
        assert!(text.contains("when `b` was allocated"), "{text}");
    }
}
