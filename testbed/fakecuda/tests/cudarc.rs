//! cudarc 0.19 (dynamic loading, as the reference workload uses it) against
//! the stand-in, found through `LD_LIBRARY_PATH` like a real driver: context,
//! streams, allocation, out-of-memory at the configured capacity,
//! `mem_get_info`, copies, pinned memory, several devices and threads.

mod common;

use std::ffi::{CStr, c_char};
use std::sync::Arc;

use common::{is_child, loader_dir, run_child_ok};
use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
const OOM: DriverError = DriverError(sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY);

/// Runs the calling test in a child whose loader path holds the stand-in.
fn in_child(name: &str, env: &[(&str, &str)]) {
    let dir = loader_dir();
    let path = dir.path().to_str().unwrap().to_owned();
    let mut env = env.to_vec();
    env.push(("LD_LIBRARY_PATH", &path));
    run_child_ok(name, &env);
}

/// How often the stand-in's export `name` was called (cudarc opened it as `libcuda.so`).
fn calls(name: &CStr) -> u64 {
    // Safety: RTLD_NOLOAD only finds the library cudarc already loaded; the
    // symbol has the signature `uint64_t (const char *)`.
    unsafe {
        let handle = libc::dlopen(c"libcuda.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        assert!(!handle.is_null(), "cudarc has not loaded the stand-in");
        let count = libc::dlsym(handle, c"vramtrace_fake_call_count".as_ptr());
        assert!(!count.is_null(), "the loaded libcuda is not the stand-in");
        let count: unsafe extern "C" fn(*const c_char) -> u64 = std::mem::transmute(count);
        let n = count(name.as_ptr());
        libc::dlclose(handle);
        n
    }
}

fn free(ctx: &Arc<CudaContext>) -> usize {
    ctx.mem_get_info().unwrap().0
}

#[test]
fn context_stream_alloc_oom_and_free() {
    if !is_child() {
        return in_child(
            "context_stream_alloc_oom_and_free",
            &[
                ("VRAMTRACE_FAKE_CAPACITY", "1GiB"),
                ("VRAMTRACE_FAKE_NAME", "cudarc test GPU"),
            ],
        );
    }
    // Safety: only probes whether the library can be opened.
    assert!(unsafe { sys::is_culib_present() });
    assert_eq!(CudaContext::device_count().unwrap(), 1);
    let ctx = CudaContext::new(0).unwrap();
    assert_eq!(ctx.name().unwrap(), "cudarc test GPU");
    assert_eq!(ctx.total_mem().unwrap(), GIB);
    assert_eq!(ctx.compute_capability().unwrap(), (9, 0));
    assert!(
        ctx.has_async_alloc(),
        "memory pools are supported, as on an H200"
    );
    assert_eq!(ctx.mem_get_info().unwrap(), (GIB, GIB));

    let stream: Arc<CudaStream> = ctx.new_stream().unwrap();
    // Copies run, and device memory reads back as zeros.
    let uploaded = stream.clone_htod(&[1.5f32; 1024]).unwrap();
    let copy = uploaded.try_clone().unwrap();
    assert_eq!(stream.clone_dtoh(&copy).unwrap(), vec![0.0f32; 1024]);
    drop((uploaded, copy));
    assert_eq!(free(&ctx), GIB);

    let a = stream.alloc_zeros::<f32>(64 * MIB).unwrap(); // 256 MiB
    // Safety: never read.
    let b = unsafe { stream.alloc::<u8>(512 * MIB) }.unwrap();
    assert_eq!(ctx.mem_get_info().unwrap(), (256 * MIB, GIB));

    // One byte more than is free: out of memory, and nothing changes.
    let error = stream.alloc_zeros::<u8>(256 * MIB + 1).unwrap_err();
    assert_eq!(error, OOM);
    assert!(format!("{error:?}").contains("out of memory"), "{error:?}");
    assert_eq!(free(&ctx), 256 * MIB);
    // Exactly what is free fits.
    let c = stream.alloc_zeros::<u8>(256 * MIB).unwrap();
    assert_eq!(free(&ctx), 0);
    assert_eq!(stream.alloc_zeros::<u8>(1).unwrap_err(), OOM);

    drop(c);
    assert_eq!(free(&ctx), 256 * MIB);
    drop(b);
    drop(a);
    stream.synchronize().unwrap();
    assert_eq!(ctx.mem_get_info().unwrap(), (GIB, GIB));

    // Empty slices: the stream-ordered allocator accepts zero bytes.
    let empty = stream.alloc_zeros::<f32>(0).unwrap();
    assert_eq!(stream.clone_dtoh(&empty).unwrap(), Vec::<f32>::new());
    drop(empty);
    drop(stream.null::<u8>().unwrap());

    // The default (null) stream works the same way.
    let d = ctx.default_stream().alloc_zeros::<u64>(1000).unwrap();
    assert_eq!(free(&ctx), GIB - 8000);
    drop(d);
    assert_eq!(free(&ctx), GIB);
    ctx.synchronize().unwrap();
    ctx.check_err().unwrap();

    // cudarc allocates stream-ordered when pools are supported, and frees what it allocated.
    assert_eq!(calls(c"cuMemAlloc_v2"), 0);
    assert_eq!(calls(c"cuMemAllocAsync"), 10);
    assert_eq!(calls(c"cuMemFreeAsync"), 8);
    assert_eq!(
        calls(c"cuMemsetD8Async"),
        4,
        "one per alloc_zeros that succeeded"
    );
    assert!(
        calls(c"cuEventCreate") >= 14,
        "two tracking events per slice"
    );
    assert!(
        calls(c"cuStreamWaitEvent") > 0,
        "multi-stream mode waits on the slice events"
    );
    assert_eq!(calls(c"cuDevicePrimaryCtxRetain"), 1);
    drop(stream);
    drop(ctx);
    assert_eq!(calls(c"cuDevicePrimaryCtxRelease_v2"), 1);
}

#[test]
fn synchronous_allocation_and_pinned_host_memory() {
    if !is_child() {
        return in_child(
            "synchronous_allocation_and_pinned_host_memory",
            &[("VRAMTRACE_FAKE_CAPACITY", "100MiB")],
        );
    }
    let ctx = CudaContext::new(0).unwrap();
    // Safety: raw driver calls on the bound context; the pointers are freed once.
    unsafe {
        let a = result::malloc_sync(60 * MIB).unwrap();
        assert_eq!(result::malloc_sync(40 * MIB + 1), Err(OOM));
        let b = result::malloc_sync(40 * MIB).unwrap();
        assert_eq!(free(&ctx), 0);
        result::free_sync(b).unwrap();
        result::free_sync(a).unwrap();
        assert_eq!(
            result::free_sync(a),
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE)),
            "double free"
        );
    }
    assert_eq!(free(&ctx), 100 * MIB);

    // Pinned memory is real host memory, and not device memory.
    // Safety: written before it is read.
    let mut pinned = unsafe { ctx.alloc_pinned::<u32>(1 << 20) }.unwrap();
    pinned.as_mut_slice().unwrap().fill(7);
    assert!(pinned.as_slice().unwrap().iter().all(|&v| v == 7));
    assert_eq!(free(&ctx), 100 * MIB);
    let stream = ctx.default_stream();
    let on_device = stream.clone_htod(&pinned).unwrap();
    assert_eq!(free(&ctx), 100 * MIB - 4 * MIB);
    stream.memcpy_dtoh(&on_device, &mut pinned).unwrap();
    assert!(pinned.as_slice().unwrap().iter().all(|&v| v == 0));
    drop(on_device);
    drop(pinned);
    assert_eq!(calls(c"cuMemHostAlloc"), 1);
    assert_eq!(calls(c"cuMemFreeHost"), 1);
    assert_eq!(calls(c"cuMemAlloc_v2"), 3);
}

#[test]
fn several_devices_have_their_own_memory() {
    if !is_child() {
        return in_child(
            "several_devices_have_their_own_memory",
            &[("VRAMTRACE_FAKE_CAPACITY", "1GiB,2GiB")],
        );
    }
    assert_eq!(CudaContext::device_count().unwrap(), 2);
    let first = CudaContext::new(0).unwrap();
    let second = CudaContext::new(1).unwrap();
    assert_eq!(second.total_mem().unwrap(), 2 * GIB);
    let big = second.default_stream().alloc_zeros::<u8>(2 * GIB).unwrap();
    assert_eq!(second.mem_get_info().unwrap(), (0, 2 * GIB));
    assert_eq!(first.mem_get_info().unwrap(), (GIB, GIB));
    assert_eq!(
        first
            .default_stream()
            .alloc_zeros::<u8>(2 * GIB)
            .unwrap_err(),
        OOM
    );
    let small = first.default_stream().alloc_zeros::<u8>(GIB).unwrap();
    assert_eq!(first.mem_get_info().unwrap(), (0, GIB));
    drop((big, small));
    assert_eq!(second.mem_get_info().unwrap(), (2 * GIB, 2 * GIB));
    assert_eq!(
        CudaContext::new(2).unwrap_err(),
        DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_DEVICE)
    );
}

#[test]
fn threads_share_a_context() {
    if !is_child() {
        return in_child(
            "threads_share_a_context",
            &[("VRAMTRACE_FAKE_CAPACITY", "1GiB")],
        );
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let stream = stream.clone();
            std::thread::spawn(move || {
                // Each allocation binds the context to this thread first.
                let slices: Vec<_> = (0..8)
                    .map(|_| stream.alloc_zeros::<u8>((i + 1) * MIB).unwrap())
                    .collect();
                slices.len()
            })
        })
        .collect();
    let made: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(made, 32);
    // Everything made on the workers was freed as their slices dropped.
    assert_eq!(ctx.mem_get_info().unwrap(), (GIB, GIB));
    assert_eq!(calls(c"cuMemAllocAsync"), 32);
    assert_eq!(calls(c"cuMemFreeAsync"), 32);
}
