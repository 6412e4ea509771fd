//! rdma-core's provider libraries load over the drop-in `libibverbs.so.1`, on the host (Debian
//! 12's, which the harness installs with libibverbs-dev): `libmlx5.so.1`, `libefa.so.1` and
//! the other libraries programs link directly (UCX's modules, libfabric, perftest), and every
//! `libibverbs/*-rdmav34.so` plugin. All are bound at load (`BIND_NOW`), so each loads only if
//! the drop-in exports every provider-ABI name it imports, at `IBVERBS_PRIVATE_34`. Then a
//! provider's probe of the drop-in's device answers "not this device".
//!
//! Its own test binary: the drop-in is loaded into the process's global scope under its soname,
//! where the providers' `libibverbs.so.1` dependency finds it (and no system libibverbs is
//! loaded, as `capi_helpers` does). Debian 13's providers (the test VM's root file system) are
//! loaded the same way by the tree's own Python (ctypes), chrooted into the tree in a private
//! mount namespace where the drop-in is bind-mounted.

mod common;

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// What the chrooted Python runs: the drop-in (argument 1) into the global scope, then every
/// provider; prints one line per failure and `mlx5 refuses vrdma0` at the end.
const CHROOT_CHECK: &str = r#"
import ctypes, glob, sys
ours = ctypes.CDLL(sys.argv[1], mode=2 | ctypes.RTLD_GLOBAL)
libs = ["/usr/lib/x86_64-linux-gnu/" + n for n in ("libmlx5.so.1", "libmlx4.so.1", "libefa.so.1", "libhns.so.1", "libmana.so.1")]
libs += sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libibverbs/*-rdmav34.so"))
for lib in libs:
    try:
        ctypes.CDLL(lib, mode=2)
    except OSError as e:
        print("FAILED", lib, e)
print("loaded", len(libs))
mlx5 = ctypes.CDLL("/usr/lib/x86_64-linux-gnu/libmlx5.so.1", mode=2)
ours.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
count = ctypes.c_int(0)
devices = ours.ibv_get_device_list(ctypes.byref(count))
mlx5.mlx5dv_is_supported.restype = ctypes.c_bool
if count.value == 1 and not mlx5.mlx5dv_is_supported(ctypes.c_void_p(devices[0])):
    print("mlx5 refuses vrdma0")
"#;

/// Debian 13's providers, from the VM's root file system.
#[test]
fn debian_13_providers_load_over_the_dropin_too() {
    let Some(root) = common::vm_root() else {
        return;
    };
    let (_, dropin) = vrdma_qemu_tests::cli::host::dropin_library()
        .expect("libvrdma_ibverbs.so next to the tests: run `cargo test --workspace`");
    let dir = std::env::temp_dir().join(format!("vrdma-provider-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&dropin, dir.join("libibverbs.so.1")).unwrap();
    std::fs::write(dir.join("check.py"), CHROOT_CHECK).unwrap();
    let mount_point = root.tree.join("mnt");
    // The tree is the VM's shared (read-only) root: nothing is written into it; the bind mount
    // lives only in this command's mount namespace.
    let script = format!(
        "mount --bind {dir} {mnt} && exec chroot {tree} python3 /mnt/check.py /mnt/libibverbs.so.1",
        dir = dir.display(),
        mnt = mount_point.display(),
        tree = root.tree.display(),
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("VRDMA_SOCKET", "/nonexistent/vrdma.sock")
        .output()
        .expect("unshare (util-linux)");
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{}: {text}", out.status);
    assert!(!text.contains("FAILED"), "{text}");
    assert!(text.contains("mlx5 refuses vrdma0"), "{text}");
    let loaded: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("loaded "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(loaded >= 15, "{text}");
}
