//! Device tensors with explicit lifetimes, and the session that records them.
//!
//! Each [`DeviceTensor`] is exactly one driver allocation, made when it is
//! created and freed when it is dropped, so the order of `let` and `drop` in the
//! workload code *is* the allocation trace. The [`Session`] keeps a ledger of
//! allocations and frees (for the report and the tests), names each tensor
//! through the preload's annotation ABI, and opens the stage ranges.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use crate::annotate;
use crate::backend::{Arg, Backend, DevicePtr, Kernel, LaunchConfig};
use crate::dtype::DType;
use crate::error::{AllocFailure, Error, Result};

/// Name, element type and shape of a tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// The name fla / FlashAttention gives it (`A`, `h`, `softmax_lse`, ...).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost first (rank 0 for a scalar).
    pub shape: Vec<i64>,
}

impl TensorSpec {
    /// A new spec.
    pub fn new(name: impl Into<String>, dtype: DType, shape: &[usize]) -> Self {
        Self {
            name: name.into(),
            dtype,
            shape: shape.iter().map(|&d| d as i64).collect(),
        }
    }

    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    /// Bytes the tensor occupies.
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

impl fmt::Display for TensorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {:?}", self.name, self.dtype, self.shape)
    }
}

/// One entry of the session ledger.
#[derive(Clone, Debug, PartialEq)]
pub enum LedgerEvent {
    /// A tensor was allocated.
    Alloc {
        /// What was allocated.
        spec: TensorSpec,
        /// The pointer the driver returned.
        ptr: DevicePtr,
        /// The innermost open range ("" when none).
        stage: String,
    },
    /// A tensor was freed.
    Free {
        /// What was freed.
        spec: TensorSpec,
        /// Its pointer.
        ptr: DevicePtr,
        /// The innermost open range ("" when none).
        stage: String,
    },
}

/// Tensors copied to the host, by name: their spec and little-endian bytes.
pub type Captured = BTreeMap<String, (TensorSpec, Vec<u8>)>;

/// The most bytes a session held at once, and the allocation that got there.
#[derive(Clone, Debug, PartialEq)]
pub struct PeakMark {
    /// Live bytes right after the allocation.
    pub bytes: usize,
    /// The tensor whose allocation set the peak.
    pub spec: TensorSpec,
    /// The range path open at that allocation.
    pub stage: String,
}

/// The context every tensor of one run belongs to.
pub struct Session<'b> {
    backend: &'b dyn Backend,
    ledger: RefCell<Vec<LedgerEvent>>,
    ranges: RefCell<Vec<(String, Instant)>>,
    timings: RefCell<Vec<(String, f64)>>,
    capture: Option<RefCell<Captured>>,
    live: Cell<usize>,
    peak: RefCell<Option<PeakMark>>,
    window_peak: Cell<usize>,
}

impl<'b> Session<'b> {
    /// A session on `backend`. With `capture`, [`Session::capture`] copies
    /// tensors to the host before they are freed (for `--dump` and `--check`).
    pub fn new(backend: &'b dyn Backend, capture: bool) -> Self {
        Self {
            backend,
            ledger: RefCell::new(Vec::new()),
            ranges: RefCell::new(Vec::new()),
            timings: RefCell::new(Vec::new()),
            capture: capture.then(|| RefCell::new(BTreeMap::new())),
            live: Cell::new(0),
            peak: RefCell::new(None),
            window_peak: Cell::new(0),
        }
    }

    /// Bytes of the tensors alive now.
    pub fn live_bytes(&self) -> usize {
        self.live.get()
    }

    /// The most bytes held at once so far, and by which allocation.
    pub fn peak(&self) -> Option<PeakMark> {
        self.peak.borrow().clone()
    }

    /// The most bytes held at once since the previous call (or since the
    /// session began); the next window starts from the bytes alive now.
    pub fn take_window_peak(&self) -> usize {
        self.window_peak.replace(self.live.get())
    }

    /// The device.
    pub fn backend(&self) -> &'b dyn Backend {
        self.backend
    }

    /// Whether kernels really run, so input data is worth generating.
    pub fn executes_kernels(&self) -> bool {
        self.backend.executes_kernels()
    }

    /// Allocate an uninitialised tensor (`torch.empty`).
    pub fn empty(&self, spec: TensorSpec) -> Result<DeviceTensor<'_, 'b>> {
        let bytes = spec.bytes();
        if bytes == 0 {
            return Err(Error::InvalidShape(format!(
                "tensor {spec} would be empty; every dimension must be at least 1"
            )));
        }
        let ptr = self.backend.alloc(bytes).map_err(|e| {
            Error::Alloc(Box::new(AllocFailure {
                name: spec.name.clone(),
                dtype: spec.dtype.name().into(),
                shape: spec.shape.clone(),
                bytes,
                message: e.message,
                out_of_memory: e.out_of_memory,
                stage: self.current_range(),
                live_bytes: self.live.get(),
                device_free: self.backend.mem_info().map(|(free, _)| free),
            }))
        })?;
        annotate::annotate(ptr, &spec.name, spec.dtype.name(), &spec.shape);
        let stage = self.current_range();
        let live = self.live.get() + bytes;
        self.live.set(live);
        self.window_peak.set(self.window_peak.get().max(live));
        if self.peak.borrow().as_ref().is_none_or(|p| live > p.bytes) {
            *self.peak.borrow_mut() = Some(PeakMark {
                bytes: live,
                spec: spec.clone(),
                stage: stage.clone(),
            });
        }
        self.ledger.borrow_mut().push(LedgerEvent::Alloc {
            spec: spec.clone(),
            ptr,
            stage,
        });
        Ok(DeviceTensor {
            session: self,
            ptr,
            spec,
        })
    }

    /// Allocate and zero a tensor (`torch.zeros`, `new_zeros`).
    pub fn zeros(&self, spec: TensorSpec) -> Result<DeviceTensor<'_, 'b>> {
        let t = self.empty(spec)?;
        self.backend.memset_zero(t.ptr, t.bytes())?;
        Ok(t)
    }

    /// Allocate a tensor and fill it from host bytes (skipped when kernels do
    /// not run and `data` is empty).
    pub fn from_host(&self, spec: TensorSpec, data: &[u8]) -> Result<DeviceTensor<'_, 'b>> {
        let t = self.empty(spec)?;
        if !data.is_empty() {
            debug_assert_eq!(data.len(), t.bytes());
            self.backend.upload(t.ptr, data)?;
        }
        Ok(t)
    }

    /// Allocate a caller's input and fill it from `data` like
    /// [`Session::from_host`], recording the bytes as captured when capturing
    /// (the inputs' bytes are ours, so they are not read back).
    pub fn input(&self, spec: TensorSpec, data: &[u8]) -> Result<DeviceTensor<'_, 'b>> {
        if !data.is_empty() && self.is_capturing() {
            self.capture_host(&spec, data.to_vec());
        }
        self.from_host(spec, data)
    }

    /// Open a named range (a stage); it closes when the guard drops, and its
    /// wall time (synchronised when kernels run) goes into [`Session::timings`].
    pub fn range(&self, name: &str) -> RangeGuard<'_, 'b> {
        annotate::range_push(name);
        self.ranges
            .borrow_mut()
            .push((name.to_string(), Instant::now()));
        RangeGuard { session: self }
    }

    fn current_range(&self) -> String {
        let ranges = self.ranges.borrow();
        let names: Vec<&str> = ranges.iter().map(|(n, _)| n.as_str()).collect();
        names.join("/")
    }

    /// Each closed range's full path and wall time in milliseconds, in the
    /// order they closed.
    pub fn timings(&self) -> Vec<(String, f64)> {
        self.timings.borrow().clone()
    }

    /// Copy `bytes` from `src` at byte `src_offset` to `dst` at byte
    /// `dst_offset`, on the device (`cuMemcpyDtoD_v2`).
    pub fn copy(
        &self,
        dst: &DeviceTensor<'_, '_>,
        dst_offset: usize,
        src: &DeviceTensor<'_, '_>,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        for (t, off) in [(dst, dst_offset), (src, src_offset)] {
            if off + bytes > t.bytes() {
                return Err(Error::InvalidShape(format!(
                    "copying {bytes} bytes at offset {off} would run past {} ({} bytes)",
                    t.spec,
                    t.bytes()
                )));
            }
        }
        self.backend.copy_device(
            dst.ptr + dst_offset as u64,
            src.ptr + src_offset as u64,
            bytes,
        )
    }

    /// Whether tensors are being copied to the host for `--dump` / `--check`.
    pub fn is_capturing(&self) -> bool {
        self.capture.is_some()
    }

    /// Launch a kernel.
    pub fn launch(&self, kernel: Kernel, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        self.backend.launch(kernel, cfg, args)
    }

    /// Copy a tensor's bytes to the host under its name, when capturing.
    pub fn capture(&self, t: &DeviceTensor<'_, '_>) -> Result<()> {
        self.capture_as(t, &t.spec.name)
    }

    /// Copy a tensor's bytes to the host under `key`, when capturing.
    pub fn capture_as(&self, t: &DeviceTensor<'_, '_>, key: &str) -> Result<()> {
        let Some(cap) = &self.capture else {
            return Ok(());
        };
        let mut bytes = vec![0u8; t.bytes()];
        self.backend.download(t.ptr, &mut bytes)?;
        cap.borrow_mut()
            .insert(key.to_string(), (t.spec.clone(), bytes));
        Ok(())
    }

    /// Record host data as if captured (inputs, whose bytes we generated).
    pub fn capture_host(&self, spec: &TensorSpec, bytes: Vec<u8>) {
        if let Some(cap) = &self.capture {
            cap.borrow_mut()
                .insert(spec.name.clone(), (spec.clone(), bytes));
        }
    }

    /// Everything captured so far, by name.
    pub fn captured(&self) -> Captured {
        self.capture
            .as_ref()
            .map(|c| c.borrow().clone())
            .unwrap_or_default()
    }

    /// The ledger so far.
    pub fn ledger(&self) -> Vec<LedgerEvent> {
        self.ledger.borrow().clone()
    }
}

/// Closes a range opened with [`Session::range`].
pub struct RangeGuard<'s, 'b> {
    session: &'s Session<'b>,
}

impl Drop for RangeGuard<'_, '_> {
    fn drop(&mut self) {
        let s = self.session;
        if s.backend.executes_kernels() {
            // Timing only: an error here resurfaces at the next driver call.
            let _ = s.backend.synchronize();
        }
        let path = s.current_range();
        if let Some((_, start)) = s.ranges.borrow_mut().pop() {
            let ms = start.elapsed().as_secs_f64() * 1e3;
            s.timings.borrow_mut().push((path, ms));
        }
        annotate::range_pop();
    }
}

/// One driver allocation holding one tensor; freed on drop.
pub struct DeviceTensor<'s, 'b> {
    session: &'s Session<'b>,
    ptr: DevicePtr,
    spec: TensorSpec,
}

impl DeviceTensor<'_, '_> {
    /// The device pointer.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The pointer as a kernel argument.
    pub fn arg(&self) -> Arg {
        Arg::Ptr(self.ptr)
    }

    /// Name, dtype and shape.
    pub fn spec(&self) -> &TensorSpec {
        &self.spec
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.spec.bytes()
    }
}

/// The pointer of an optional tensor, 0 when absent (kernels test for null).
pub fn opt_arg(t: Option<&DeviceTensor<'_, '_>>) -> Arg {
    Arg::Ptr(t.map_or(0, |t| t.ptr))
}

impl Drop for DeviceTensor<'_, '_> {
    fn drop(&mut self) {
        let s = self.session;
        if let Err(e) = s.backend.free(self.ptr) {
            // Drop cannot fail; say so rather than abort the run.
            eprintln!("warning: freeing {}: {e}", self.spec);
        }
        s.live.set(s.live.get() - self.spec.bytes());
        s.ledger.borrow_mut().push(LedgerEvent::Free {
            spec: self.spec.clone(),
            ptr: self.ptr,
            stage: s.current_range(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Recorded, RecordingBackend};

    #[test]
    fn drop_frees_and_ledger_records_stage() {
        let rec = RecordingBackend::new();
        let s = Session::new(&rec, false);
        {
            let _r = s.range("outer");
            let a = s.zeros(TensorSpec::new("a", DType::F32, &[4, 8])).unwrap();
            let b = s.empty(TensorSpec::new("b", DType::BF16, &[3])).unwrap();
            drop(a);
            drop(b);
        }
        let log = rec.log();
        assert!(matches!(log[0], Recorded::Alloc { bytes: 128, .. }));
        assert!(matches!(log[1], Recorded::Memset { bytes: 128, .. }));
        assert!(matches!(log[2], Recorded::Alloc { bytes: 6, .. }));
        assert!(matches!(log[3], Recorded::Free { .. }));
        assert!(matches!(log[4], Recorded::Free { .. }));
        let ledger = s.ledger();
        assert_eq!(ledger.len(), 4);
        match &ledger[0] {
            LedgerEvent::Alloc { spec, stage, .. } => {
                assert_eq!(spec.name, "a");
                assert_eq!(stage, "outer");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(rec.live_bytes(), 0);
    }

    #[test]
    fn failed_allocation_names_the_tensor() {
        let rec = RecordingBackend::with_capacity(100);
        let s = Session::new(&rec, false);
        let err = s
            .empty(TensorSpec::new("h", DType::BF16, &[10, 10]))
            .err()
            .unwrap();
        let msg = err.to_string();
        assert!(
            msg.contains("allocating h (bf16 [10, 10], 200 bytes)"),
            "{msg}"
        );
        assert!(msg.contains("OOM"), "{msg}");
    }

    #[test]
    fn scalar_spec_has_one_element() {
        let s = TensorSpec::new("philox_offset", DType::U64, &[]);
        assert_eq!(s.numel(), 1);
        assert_eq!(s.bytes(), 8);
    }
}
