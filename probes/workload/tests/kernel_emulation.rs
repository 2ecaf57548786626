//! Runs the real `kernels.cu` on the CPU, through the same `Session`, stage
//! code and `check` comparisons as `--check` on a GPU, so the kernels' index
//! math, barriers, launch configurations and argument order are tested in CI.
//!
//! `tests/emulator/` emulates the bit of CUDA the kernels use (threads,
//! `__syncthreads`, `__shfl_xor_sync`, `__shared__`); it is compiled here with
//! the system C++ compiler (C++20) for bf16 and f32 storage. The f16 path needs
//! PTX `cvt` instructions and is left to the GPU. Skipped, saying so, when no
//! C++20 compiler is found.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int};
use std::path::Path;
use std::process::Command;

use vramtrace_workload::backend::{AllocError, Arg, Backend, DevicePtr, Kernel, LaunchConfig};
use vramtrace_workload::fa::{self, FaApi, FaConfig};
use vramtrace_workload::gdn::{self, GdnConfig};
use vramtrace_workload::{DType, Error, Result, Session, check};

/// Say a test skipped where a plain `cargo test` shows it: libtest captures
/// `println!`, not writes to the stderr handle.
fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {why}");
}

type LaunchFn =
    unsafe extern "C" fn(*const c_char, *const u32, *const u32, *const u64, c_int) -> c_int;

/// Host memory standing in for device memory; kernels run in the emulator.
struct Emulator {
    launch: LaunchFn,
    memory: RefCell<HashMap<DevicePtr, Vec<u64>>>,
}

impl Emulator {
    /// Compile the emulator for `dtype`, or say why not.
    fn build(dtype: DType) -> Option<Self> {
        let define = match dtype {
            DType::BF16 => 0,
            DType::F32 => 2,
            _ => return None,
        };
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out_dir = std::env::temp_dir().join(format!("vt-emu-{}", std::process::id()));
        std::fs::create_dir_all(&out_dir).ok()?;
        // One file per build: tests run in parallel threads of this process, and a library being
        // written by one must never be dlopened by another.
        static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let lib = out_dir.join(format!("emu_{define}_{n}.so"));
        let compiler = ["c++", "g++", "clang++"].into_iter().find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
        let Some(compiler) = compiler else {
            skipped("kernel emulation: no C++ compiler (c++, g++ or clang++) to build it");
            return None;
        };
        let out = Command::new(compiler)
            .args(["-std=c++20", "-O1", "-fPIC", "-shared", "-pthread"])
            .arg(format!("-DVT_DTYPE={define}"))
            .arg(format!("-I{}", root.join("src").display()))
            .arg(format!("-I{}", root.join("tests/emulator").display()))
            .arg(root.join("tests/emulator/launch.cpp"))
            .arg("-o")
            .arg(&lib)
            .output()
            .ok()?;
        if !out.status.success() {
            skipped(&format!(
                "kernel emulation: {compiler} could not build it (C++20 <barrier> needed):\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
            return None;
        }
        Some(Self::load(&lib))
    }

    fn load(lib: &Path) -> Self {
        let path = CString::new(lib.to_str().unwrap()).unwrap();
        // Safety: loading a library this test just built; it has no
        // constructors beyond the C++ runtime's.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {}", lib.display());
        // Safety: `handle` is live; the name is NUL-terminated.
        let sym = unsafe { libc::dlsym(handle, c"vt_emu_launch".as_ptr()) };
        assert!(!sym.is_null(), "vt_emu_launch missing");
        Self {
            // Safety: launch.cpp defines vt_emu_launch with exactly this C signature.
            launch: unsafe { std::mem::transmute::<*mut libc::c_void, LaunchFn>(sym) },
            memory: RefCell::new(HashMap::new()),
        }
    }

    fn with_block<R>(&self, ptr: DevicePtr, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut mem = self.memory.borrow_mut();
        let block = mem.get_mut(&ptr).expect("a live allocation");
        // Safety: a Vec<u64> viewed as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(block.as_mut_ptr() as *mut u8, block.len() * 8)
        };
        f(bytes)
    }
}

impl Backend for Emulator {
    fn alloc(&self, bytes: usize) -> std::result::Result<DevicePtr, AllocError> {
        let mut block = vec![0xdead_beef_dead_beef_u64; bytes.div_ceil(8)];
        let ptr = block.as_mut_ptr() as DevicePtr;
        self.memory.borrow_mut().insert(ptr, block);
        Ok(ptr)
    }
    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.memory
            .borrow_mut()
            .remove(&ptr)
            .map(|_| ())
            .ok_or(Error::InvalidShape("double free".into()))
    }
    fn memset_zero(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.with_block(ptr, |b| b[..bytes].fill(0));
        Ok(())
    }
    fn upload(&self, ptr: DevicePtr, data: &[u8]) -> Result<()> {
        self.with_block(ptr, |b| b[..data.len()].copy_from_slice(data));
        Ok(())
    }
    fn download(&self, ptr: DevicePtr, out: &mut [u8]) -> Result<()> {
        self.with_block(ptr, |b| out.copy_from_slice(&b[..out.len()]));
        Ok(())
    }
    fn launch(&self, kernel: Kernel, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        let slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p,
                Arg::I32(v) => v as u32 as u64,
                Arg::I64(v) => v as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        let name = CString::new(kernel.symbol()).unwrap();
        // Tests run in parallel; one emulated launch at a time keeps them fast
        // to reason about (each launch already uses a thread per CUDA thread).
        static ONE_LAUNCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = ONE_LAUNCH.lock().unwrap_or_else(|p| p.into_inner());
        let grid = [cfg.grid.0, cfg.grid.1, cfg.grid.2];
        let block = [cfg.block.0, cfg.block.1, cfg.block.2];
        // Safety: every pointer argument is a live allocation of this backend
        // (kernels only touch memory of the tensors they are given); the
        // arrays outlive the synchronous call.
        let rc = unsafe {
            (self.launch)(
                name.as_ptr(),
                grid.as_ptr(),
                block.as_ptr(),
                slots.as_ptr(),
                slots.len() as c_int,
            )
        };
        assert_eq!(rc, 0, "{} rejected its launch", kernel.symbol());
        Ok(())
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn executes_kernels(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        "CPU emulation of kernels.cu".into()
    }
}

fn gdn_case(emu: &Emulator, cfg: &GdnConfig, seed: u64) {
    let host = gdn::generate_inputs(cfg, seed);
    let session = Session::new(emu, true);
    gdn::run(&session, cfg, Some(&host)).unwrap();
    let rows = check::gdn(cfg, &host, &session.captured());
    let (text, ok) = check::render(&format!("emulated gdn {cfg:?}"), &rows);
    println!("{text}");
    assert!(ok, "{text}");
    assert!(rows.len() >= 8, "every stage compared: {text}");
    assert!(emu.memory.borrow().is_empty(), "everything freed");
}

fn gdn_configs(dtype: DType) -> Vec<GdnConfig> {
    let base = GdnConfig {
        seqlens: vec![1, 63, 64, 65, 130],
        varlen: true,
        heads: 4,
        key_heads: 2,
        key_dim: 40,
        value_dim: 36,
        dtype,
        scale: None,
        qk_l2norm: false,
        initial_state: true,
    };
    vec![
        base.clone(),
        GdnConfig {
            seqlens: vec![150],
            varlen: false,
            heads: 2,
            key_heads: 2,
            key_dim: 64,
            value_dim: 64,
            qk_l2norm: true,
            initial_state: false,
            ..base.clone()
        },
        GdnConfig {
            seqlens: vec![70],
            heads: 1,
            key_heads: 1,
            key_dim: 256,
            value_dim: 8,
            scale: Some(0.25),
            ..base
        },
    ]
}

#[test]
fn gdn_kernels_match_the_cpu_reference_bf16() {
    let Some(emu) = Emulator::build(DType::BF16) else {
        return;
    };
    for (i, cfg) in gdn_configs(DType::BF16).iter().enumerate() {
        gdn_case(&emu, cfg, 10 + i as u64);
    }
}

#[test]
fn gdn_kernels_match_the_cpu_reference_f32() {
    let Some(emu) = Emulator::build(DType::F32) else {
        return;
    };
    for (i, cfg) in gdn_configs(DType::F32).iter().enumerate() {
        gdn_case(&emu, cfg, 20 + i as u64);
    }
}

#[test]
fn flash_attention_kernel_matches_the_cpu_reference() {
    let Some(emu) = Emulator::build(DType::BF16) else {
        return;
    };
    let base = FaConfig {
        seqlens_q: vec![1, 9, 40],
        seqlens_k: vec![1, 9, 40],
        heads: 4,
        kv_heads: 2,
        head_dim: 72,
        dtype: DType::BF16,
        causal: true,
        softmax_scale: None,
        padded_lse: false,
        max_seqlen_q: None,
        max_seqlen_k: None,
        api: FaApi::Torch,
        preallocated_out: false,
    };
    let cases = [
        base.clone(),
        FaConfig {
            seqlens_q: vec![3, 20],
            seqlens_k: vec![50, 20],
            head_dim: 256,
            kv_heads: 4,
            ..base.clone()
        },
        FaConfig {
            causal: false,
            padded_lse: true,
            max_seqlen_q: Some(48),
            api: FaApi::FlashAttn,
            preallocated_out: true,
            ..base.clone()
        },
        // More queries than keys: the first queries see no key (lse = +inf, out = 0).
        FaConfig {
            seqlens_q: vec![12],
            seqlens_k: vec![5],
            ..base
        },
    ];
    for (i, cfg) in cases.iter().enumerate() {
        let host = fa::generate_inputs(cfg, 30 + i as u64);
        let session = Session::new(&emu, true);
        fa::run(&session, cfg, Some(&host)).unwrap();
        let rows = check::fa(cfg, &host, &session.captured());
        let (text, ok) = check::render(&format!("emulated fa {cfg:?}"), &rows);
        println!("{text}");
        assert!(ok, "{text}");
        assert_eq!(rows.len(), 3, "{text}");
    }
}
