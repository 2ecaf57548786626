//! The CUDA source of the workload's kernels and its compilation with NVRTC.

use cudarc::nvrtc::{self, CompileOptions, Ptx};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The kernel source (`kernels.cu`), one kernel per fla / FlashAttention stage.
pub const SOURCE: &str = include_str!("kernels.cu");

/// Whether `libnvrtc` can be loaded. Checked before any NVRTC call, because
/// cudarc's dynamic loader panics on a missing library.
pub fn nvrtc_present() -> bool {
    // Safety: only tries to dlopen the candidate library names; loads nothing
    // into cudarc's global state.
    unsafe { nvrtc::sys::is_culib_present() }
}

/// The `-DVT_DTYPE` value selecting the storage type of `kernels.cu`.
fn dtype_define(dtype: DType) -> Result<u32> {
    match dtype {
        DType::BF16 => Ok(0),
        DType::F16 => Ok(1),
        DType::F32 => Ok(2),
        other => Err(Error::InvalidShape(format!(
            "the kernels compute in bf16, f16 or f32, not {other}"
        ))),
    }
}

/// Compile the kernels for storage type `dtype` to PTX for `arch`
/// (`compute_90`, ...; `None` for NVRTC's default).
pub fn compile(dtype: DType, arch: Option<&str>) -> Result<Ptx> {
    if !nvrtc_present() {
        return Err(Error::NoNvrtc);
    }
    let mut options = vec![format!("-DVT_DTYPE={}", dtype_define(dtype)?)];
    if let Some(arch) = arch {
        options.push(format!("--gpu-architecture={arch}"));
    }
    let opts = CompileOptions {
        options,
        name: Some("vramtrace_workload_kernels.cu".into()),
        ..Default::default()
    };
    nvrtc::compile_ptx_with_opts(SOURCE, opts).map_err(|e| Error::Compile {
        what: format!("dtype {dtype}, arch {}", arch.unwrap_or("default")),
        log: match e {
            nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Kernel;

    /// Compiles the kernels to PTX for every dtype when NVRTC is on the loader
    /// path (CI installs the `nvidia-cuda-nvrtc` wheel); says so and passes
    /// when it is not.
    #[test]
    fn kernels_compile_to_ptx_with_nvrtc() {
        if !nvrtc_present() {
            // CI installs NVRTC and requires it, so a broken set-up fails instead of skipping.
            vramtrace_testkit::skip(
                "VRAMTRACE_REQUIRE_NVRTC",
                &format!(
                    "kernels_compile_to_ptx_with_nvrtc: libnvrtc.so.13 is not on the loader path \
                     (pip install nvidia-cuda-nvrtc==13.0.88 and add nvidia/cu13/lib to \
                     LD_LIBRARY_PATH={:?} to run it)",
                    std::env::var("LD_LIBRARY_PATH").unwrap_or_default()
                ),
            );
            return;
        }
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for arch in [Some("compute_90"), Some("compute_80")] {
                let ptx = match compile(dtype, arch) {
                    Ok(p) => p,
                    Err(e) => panic!("{e}"),
                };
                let text = ptx.to_src();
                for k in Kernel::ALL {
                    assert!(
                        text.contains(&format!(".entry {}", k.symbol())),
                        "PTX for {dtype} {arch:?} lacks {}",
                        k.symbol()
                    );
                }
                if let Some(arch) = arch {
                    let target = format!(".target {}", arch.replace("compute_", "sm_"));
                    assert!(text.contains(&target), "PTX lacks `{target}`");
                }
                println!(
                    "compiled kernels for {dtype} {}: {} bytes of PTX",
                    arch.unwrap_or("default"),
                    text.len()
                );
            }
        }
    }

    #[test]
    fn every_kernel_symbol_is_in_the_source() {
        for k in Kernel::ALL {
            assert!(
                SOURCE.contains(&format!("void {}(", k.symbol())),
                "{} missing from kernels.cu",
                k.symbol()
            );
        }
    }
}
