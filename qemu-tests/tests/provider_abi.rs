//! rdma-core's provider libraries load over the drop-in `libibverbs.so.1`, on the host (Debian
//! 12's, which the harness installs with libibverbs-dev): `libmlx5.so.1`, `libefa.so.1` and
//! the other libraries programs link directly (UCX's modules, libfabric, perftest), and every
//! `libibverbs/*-rdmav34.so` plugin. All are bound at load (`BIND_NOW`), so each loads only if
//! the drop-in exports every provider-ABI name it imports, at `IBVERBS_PRIVATE_34`. Then a
//! provider's probe of the drop-in's device answers "not this device".
//!
//! Its own test binary: the drop-in is loaded into the process's global scope under its soname,
//! where the providers' `libibverbs.so.1` dependency finds it (and no system libibverbs is
//! loaded, as `capi_helpers` does).

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

const LIBRARY_DIR: &str = "/usr/lib/x86_64-linux-gnu";

/// Providers that programs link by name, and what each must export.
const LINKED_PROVIDERS: &[&str] = &["libmlx5.so.1", "libmlx4.so.1", "libefa.so.1"];

fn dlopen(path: &Path, flags: c_int) -> Result<*mut c_void, String> {
    let name = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    let handle = unsafe { libc::dlopen(name.as_ptr(), flags) };
    if handle.is_null() {
        // SAFETY: dlerror returns the last error as a C string, or null.
        let error = unsafe { libc::dlerror() };
        let why = if error.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null, NUL-terminated, valid until the next dl call on this thread.
            unsafe { CStr::from_ptr(error) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(why);
    }
    Ok(handle)
}

fn symbol(handle: *mut c_void, name: &str) -> *mut c_void {
    let symbol = CString::new(name).unwrap();
    // SAFETY: a live handle and a NUL-terminated name.
    let address = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
    assert!(!address.is_null(), "{name} not found");
    address
}

#[test]
fn rdma_core_providers_load_over_the_dropin_and_do_not_claim_its_device() {
    vrdma_qemu_tests::native::ensure_prerequisites().expect("installing libibverbs-dev");
    let (_, dropin) = vrdma_qemu_tests::cli::host::dropin_library()
        .expect("libvrdma_ibverbs.so next to the tests: run `cargo test --workspace`");
    // The device list names vrdma0 without contacting a backend (process transport).
    std::env::set_var("VRDMA_SOCKET", "/nonexistent/vrdma.sock");
    let ours = dlopen(&dropin, libc::RTLD_NOW | libc::RTLD_GLOBAL).expect("the drop-in loads");

    let plugins_dir = Path::new(LIBRARY_DIR).join("libibverbs");
    let mut plugins: Vec<PathBuf> = std::fs::read_dir(&plugins_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", plugins_dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with("-rdmav34.so"))
        .collect();
    plugins.sort();
    assert!(plugins.len() >= 10, "rdma-core's plugins: {plugins:?}");
    let linked = LINKED_PROVIDERS
        .iter()
        .map(|name| Path::new(LIBRARY_DIR).join(name));
    let failed: Vec<String> = linked
        .chain(plugins)
        .filter_map(|path| {
            dlopen(&path, libc::RTLD_NOW | libc::RTLD_LOCAL)
                .err()
                .map(|why| format!("{}: {why}", path.display()))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "providers that do not load:\n{}",
        failed.join("\n")
    );

    // mlx5's probe reads the device's `verbs_device.ops`: not its own.
    let mlx5 = dlopen(&Path::new(LIBRARY_DIR).join("libmlx5.so.1"), libc::RTLD_NOW).unwrap();
    type DeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
    type IsSupported = unsafe extern "C" fn(*mut c_void) -> bool;
    // SAFETY: the C types of `ibv_get_device_list` and `mlx5dv_is_supported`.
    let (device_list, is_supported): (DeviceList, IsSupported) = unsafe {
        (
            std::mem::transmute::<*mut c_void, DeviceList>(symbol(ours, "ibv_get_device_list")),
            std::mem::transmute::<*mut c_void, IsSupported>(symbol(mlx5, "mlx5dv_is_supported")),
        )
    };
    let mut count = 0;
    // SAFETY: a valid out-pointer; the list is the drop-in's and stays allocated.
    let list = unsafe { device_list(&mut count) };
    assert_eq!(count, 1, "the drop-in lists vrdma0");
    // SAFETY: the first entry of a list of one device.
    let device = unsafe { *list };
    // SAFETY: the drop-in's device, laid out as a `struct verbs_device`.
    assert!(!unsafe { is_supported(device) }, "mlx5 claims vrdma0");
}
