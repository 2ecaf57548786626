//! Runs the real `kernels.cu` on the CPU, through the same `Session`, stage
//! code and `check` comparisons as `--check` on a GPU, so the kernels' index
//! math, barriers, launch configurations and argument order are tested in CI.
//!
//! `tests/emulator/` emulates the bit of CUDA the kernels use (threads,
//! `__syncthreads`, `__shfl_xor_sync`, `__shared__`); it is compiled here with
//! the system C++ compiler (C++20) for bf16 and f32 storage. The f16 path needs
//! PTX `cvt` instructions and is left to the GPU. Skipped, saying so, when no
//! C++20 compiler is found.

mod common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int};
use std::path::Path;
use std::process::Command;

use common::skipped;
use vramtrace_workload::backend::{AllocError, Arg, Backend, DevicePtr, Kernel, LaunchConfig};
use vramtrace_workload::fa::{self, FaApi, FaConfig};
use vramtrace_workload::gdn::{self, GdnConfig};
use vramtrace_workload::prefill::{self, KvCacheMode, PrefillOptions, PrefillPlan};
use vramtrace_workload::{DType, Error, Result, Session, check, gdn_ref};

/// Whether `compiler` builds a C++20 program using `<barrier>`, the one
/// header the emulator needs that older compilers lack.
fn has_cxx20_barrier(compiler: &str, probe: &Path) -> bool {
    std::fs::write(
        probe,
        "#include <barrier>\nint main() { std::barrier b(1); }\n",
    )
    .expect("write the compiler probe");
    Command::new(compiler)
        .args(["-std=c++20", "-fsyntax-only"])
        .arg(probe)
        .output()
        .is_ok_and(|o| o.status.success())
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
        std::fs::create_dir_all(&out_dir).expect("create the emulator's build directory");
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
            skipped(
                "VRAMTRACE_REQUIRE_EMULATOR",
                "kernel emulation: no C++ compiler (c++, g++ or clang++) to build it",
            );
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
            .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
        if !out.status.success() {
            // A compiler without C++20 <barrier> is a missing prerequisite; any
            // other failure is a broken kernels.cu or emulator, never a skip.
            if !has_cxx20_barrier(compiler, &out_dir.join(format!("probe_{n}.cpp"))) {
                skipped(
                    "VRAMTRACE_REQUIRE_EMULATOR",
                    &format!("kernel emulation: {compiler} has no C++20 <barrier>"),
                );
                return None;
            }
            panic!(
                "kernel emulation: {compiler} could not build the emulator:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
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

    /// The bytes of the live allocation holding `ptr`, from `ptr` on (copies
    /// into a KV block start inside it).
    fn with_block<R>(&self, ptr: DevicePtr, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut mem = self.memory.borrow_mut();
        let (base, block) = mem
            .iter_mut()
            .find(|(base, block)| ptr >= **base && ptr < **base + block.len() as u64 * 8)
            .expect("a live allocation");
        let offset = (ptr - base) as usize;
        // Safety: a Vec<u64> viewed as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(block.as_mut_ptr() as *mut u8, block.len() * 8)
        };
        f(&mut bytes[offset..])
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
    let base = FaConfig::new(&[1, 9, 40], 4, 2, 72, DType::BF16);
    let cases = [
        base.clone(),
        FaConfig::new(&[3, 20], 4, 4, 256, DType::BF16).with_kv_seqlens(&[50, 20]),
        base.clone()
            .with_causal(false)
            .with_padded_lse(true)
            .with_max_seqlen_q(Some(48))
            .with_api(FaApi::FlashAttn)
            .with_preallocated_out(true),
        // More queries than keys: the first queries see no key (lse = +inf, out = 0).
        base.with_seqlens(&[12]).with_kv_seqlens(&[5]),
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

/// A two-chunk prefill of a tiny hybrid model on the emulated kernels: each GDN
/// layer's recurrent state, carried from chunk to chunk through
/// `initial_state` / `final_state` copies, ends equal to the exact recurrence
/// over the whole prompt, and each attention layer's KV block holds the
/// chunk's K then V, byte for byte.
#[test]
fn prefill_carries_the_gdn_state_and_writes_the_kv_cache() {
    let Some(emu) = Emulator::build(DType::BF16) else {
        return;
    };
    let cfg = vramtrace_models::ModelConfig::from_path(common::TINY_CONFIG).unwrap();
    // A short second chunk, so that the state carried in from the first one
    // has decayed little by the end (fla's gates decay it by 0.5..0.73 a token).
    let (t, rest, seed) = (40, 3, 7);
    let plan = PrefillPlan::new(
        &cfg,
        PrefillOptions {
            prompt_tokens: t + rest,
            chunk: t,
            weights: vramtrace_models::WeightFormat::Bf16,
            kv_cache: KvCacheMode::Grow,
            kv_dtype: DType::BF16,
            seed,
        },
    )
    .unwrap();
    let session = Session::new(&emu, true);
    let out = prefill::run(&session, &plan, 0, &mut |_| {}).unwrap();
    assert!(out.failure.is_none());
    assert_eq!(out.chunks.len(), 2);
    assert!(emu.memory.borrow().is_empty(), "everything freed");
    let captured = session.captured();

    // Each chunk length gets its own generated inputs, the same in every layer.
    let inputs = |tokens| {
        let c = GdnConfig {
            initial_state: false,
            ..plan.gdn_config(tokens)
        };
        gdn::generate_inputs(&c, seed)
    };
    let (a, b) = (inputs(t), inputs(rest));
    let join = |x: &Vec<f32>, y: &Vec<f32>| [x.as_slice(), y.as_slice()].concat();
    let whole = gdn::GdnHostInputs {
        q: join(&a.q, &b.q),
        k: join(&a.k, &b.k),
        v: join(&a.v, &b.v),
        g: join(&a.g, &b.g),
        beta: join(&a.beta, &b.beta),
        h0: None,
    };
    let whole_cfg = GdnConfig {
        initial_state: false,
        ..plan.gdn_config(t + rest)
    };
    let (_, exact) = gdn_ref::naive_recurrent(&whole_cfg, &whole);
    // Without the carry the state would be the second chunk's alone.
    let last_cfg = GdnConfig {
        initial_state: false,
        ..plan.gdn_config(rest)
    };
    let (_, uncarried) = gdn_ref::naive_recurrent(&last_cfg, &b);
    let (apart, _) = gdn_ref::max_abs_diff(&uncarried, &exact);
    for layer in [0, 2] {
        let (spec, bytes) = &captured[&format!("layer.{layer}.ssm_state")];
        let got = spec.dtype.decode(bytes);
        let (diff, max_ref) = gdn_ref::max_abs_diff(&got, &exact);
        let tol = check::gdn_tolerance(DType::BF16) * max_ref.max(1.0);
        assert!(
            diff <= tol,
            "layer {layer}: state differs from the recurrence by {diff} (tolerance {tol})"
        );
        assert!(
            apart > 4.0 * tol,
            "the carried part is visible: {apart} against a tolerance of {tol}"
        );
    }

    for (chunk, tokens) in [(0, t), (1, rest)] {
        let kv = fa::generate_inputs(&plan.fa_config(tokens), seed).encode(DType::BF16);
        for layer in [1, 3] {
            let (_, block) = &captured[&format!("layer.{layer}.kv.chunk.{chunk}")];
            assert_eq!(block.len(), kv.k.len() + kv.v.len());
            assert!(block[..kv.k.len()] == kv.k[..], "K of layer {layer}");
            assert!(block[kv.k.len()..] == kv.v[..], "V of layer {layer}");
        }
    }
}
