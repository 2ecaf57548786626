//! A client that reaches the driver through cudarc's own loader (`libloading`: `dlopen` +
//! `dlsym` on the handle, each entry point on first use). The preload's tests run it under
//! `LD_PRELOAD` and compare what it prints with the trace.

use cudarc::driver::{result, sys};

fn main() {
    // Safety: only probes for the library.
    if !unsafe { sys::is_culib_present() } {
        eprintln!("cudarc_client: no libcuda on the loader path");
        std::process::exit(12);
    }
    result::init().expect("cuInit");
    let dev = result::device::get(0).expect("cuDeviceGet");
    // Safety: a valid device; the context is released at exit.
    unsafe {
        let ctx = result::primary_ctx::retain(dev).expect("cuDevicePrimaryCtxRetain");
        result::ctx::set_current(ctx).expect("cuCtxSetCurrent");
    }
    let stream = result::stream::create(result::stream::StreamKind::NonBlocking).expect("stream");
    // Safety: plain allocations and frees of the memory just obtained.
    unsafe {
        let a = result::malloc_sync(3 << 20).expect("cuMemAlloc_v2");
        println!("cuMemAlloc_v2 {a} {}", 3 << 20);
        let b = result::malloc_async(stream, 12345).expect("cuMemAllocAsync");
        println!("cuMemAllocAsync {b} 12345 {}", stream as usize);
        let h = result::malloc_host(4096, 0).expect("cuMemHostAlloc");
        println!("cuMemHostAlloc {} 4096", h as usize);
        result::free_async(b, stream).expect("cuMemFreeAsync");
        result::free_sync(a).expect("cuMemFree_v2");
        result::free_host(h).expect("cuMemFreeHost");
    }
}
