//! NVML sampling for the live view: device and per-process memory as the driver sees it.

use vramtrace::live::DeviceMemory;
use vramtrace_viewer::model::{NvmlPanel, NvmlProcess};

/// NVML, opened once.
pub struct Nvml(nvml_wrapper::Nvml);

/// Opens NVML, or says why it cannot be (no driver here is the usual reason).
pub fn open() -> Result<Box<dyn DeviceMemory>, String> {
    nvml_wrapper::Nvml::init()
        .map(|n| Box::new(Nvml(n)) as Box<dyn DeviceMemory>)
        .map_err(|e| match e {
            nvml_wrapper::error::NvmlError::LibloadingError(_) => {
                "libnvidia-ml.so.1 cannot be loaded (no NVIDIA driver here)".to_string()
            }
            e => e.to_string(),
        })
}

impl DeviceMemory for Nvml {
    fn panel(&self, ordinal: u32) -> NvmlPanel {
        // NVML numbers devices by PCI order, CUDA by CUDA_VISIBLE_DEVICES / speed: the same
        // index only when neither reorders. The reading is labelled with NVML's name.
        let read = || -> Result<NvmlPanel, nvml_wrapper::error::NvmlError> {
            let d = self.0.device_by_index(ordinal)?;
            let m = d.memory_info()?;
            let processes = d
                .running_compute_processes()?
                .into_iter()
                .map(|p| NvmlProcess {
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b,
                        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
                    },
                })
                .collect();
            Ok(NvmlPanel::Available {
                used_bytes: m.used,
                total_bytes: m.total,
                processes,
            })
        };
        read().unwrap_or_else(|e| NvmlPanel::Unavailable(format!("NVML device {ordinal}: {e}")))
    }
}
