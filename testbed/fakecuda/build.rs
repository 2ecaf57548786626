//! Link flags that make the cdylib a believable `libcuda.so.1`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    // The loader and `dlopen("libcuda.so.1")` find the library by this name.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // cuGetProcAddress hands out the addresses of our own exports. Without this
    // flag those addresses are resolved through the GOT and an LD_PRELOADed
    // interposer exporting the same names would be returned instead, so the
    // interposer would end up wrapping itself.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
