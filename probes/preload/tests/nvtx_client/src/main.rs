//! Pushes NVTX ranges (CORE: `nvtxRangePushA`, `nvtxRangePushEx`, `nvtxRangePushW`; CORE2:
//! `nvtxDomainRangePushEx`) and marks, allocating device memory inside them through the driver,
//! and prints "name ptr" for each allocation for the test to compare with the trace.

use std::ffi::{c_int, c_void};

type Alloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;

struct Driver {
    alloc: Alloc,
}

fn driver() -> Driver {
    // Safety: plain dlopen/dlsym of the driver and calls with their documented signatures.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "no libcuda.so.1");
        let sym = |name: &std::ffi::CStr| {
            let p = libc::dlsym(h, name.as_ptr());
            assert!(!p.is_null(), "{name:?} missing");
            p
        };
        let init: unsafe extern "C" fn(u32) -> c_int = std::mem::transmute(sym(c"cuInit"));
        let get: unsafe extern "C" fn(*mut c_int, c_int) -> c_int =
            std::mem::transmute(sym(c"cuDeviceGet"));
        let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int =
            std::mem::transmute(sym(c"cuDevicePrimaryCtxRetain"));
        let set: unsafe extern "C" fn(*mut c_void) -> c_int =
            std::mem::transmute(sym(c"cuCtxSetCurrent"));
        assert_eq!(init(0), 0);
        let mut dev = 0;
        assert_eq!(get(&mut dev, 0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, dev), 0);
        assert_eq!(set(ctx), 0);
        Driver {
            alloc: std::mem::transmute::<*mut c_void, Alloc>(sym(c"cuMemAlloc_v2")),
        }
    }
}

fn alloc(d: &Driver, name: &str, size: usize) {
    let mut p = 0u64;
    // Safety: the driver's cuMemAlloc_v2 with a valid out-pointer.
    assert_eq!(unsafe { (d.alloc)(&mut p, size) }, 0);
    println!("{name} {p}");
}

fn main() {
    let d = driver();
    nvtx::mark(c"start");
    {
        let _outer = nvtx::LocalRange::new(c"step");
        alloc(&d, "A", 1000);
        {
            let _inner = nvtx::LocalRange::new(
                nvtx::EventAttributes::builder()
                    .message(c"attention")
                    .payload(7)
                    .build(),
            );
            alloc(&d, "B", 2000);
            {
                let _wide = nvtx::LocalRange::new(nvtx::Str::from_str_lossy("wide\u{e9}"));
                alloc(&d, "C", 3000);
            }
        }
        let domain = nvtx::Domain::new(c"vramtrace-test");
        {
            let _r = domain.local_range(c"dom");
            alloc(&d, "D", 4000);
            domain.mark(c"in-domain");
        }
    }
    alloc(&d, "E", 5000);
}
