//! Link settings of the drop-in library: soname and rdma-core's symbol versions.
//!
//! The versions come from `libibverbs.map`; the exported names are defined in `src/export.rs`
//! as aliases that rustc does not list in its own (anonymous) version script, so the named
//! nodes of ours apply to them. This needs a linker that merges both scripts, as LLD does
//! (the default linker of x86_64-unknown-linux-gnu since Rust 1.90); GNU ld refuses to
//! combine an anonymous version script with named ones.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let map = format!("{dir}/libibverbs.map");
    println!("cargo:rerun-if-changed={map}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={map}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
