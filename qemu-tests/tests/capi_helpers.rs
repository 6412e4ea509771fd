//! The drop-in `libibverbs.so.1` against the system's own (Debian's rdma-core), on the host:
//! - every public symbol of the system library (Debian 12's, and Debian 13's from the VM's root
//!   file system) is exported by the drop-in at the same version, and so is every symbol of its
//!   provider ABI (`IBVERBS_PRIVATE_34`),
//!   except the ones listed as not provided yet, and each of those is indeed still missing (so
//!   the list can only shrink);
//! - the string and rate helpers answer exactly what the system library answers, for every
//!   value in and around their ranges.
//!
//! The system library comes with libibverbs-dev, which the harness installs (as root) like it
//! does for the C layout test; without it the test is skipped with a message unless `CI` is set.

mod common;

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Public symbols of rdma-core's libibverbs that the drop-in does not export yet: none. A symbol
/// a newer rdma-core adds may wait here while it is built; the test fails once it is exported.
const NOT_YET_PROVIDED: &[&str] = &[];

const SYSTEM_LIBRARY_DIRS: &[&str] = &["/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"];

/// The system library, installed once per test process: the tests here run on parallel
/// threads, and two concurrent apt-get runs would fight over the dpkg lock.
fn system_library() -> Option<PathBuf> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND.get_or_init(find_system_library).clone()
}

fn find_system_library() -> Option<PathBuf> {
    if let Err(e) = vrdma_qemu_tests::native::ensure_prerequisites() {
        eprintln!("cannot install the system libibverbs: {e}");
    }
    let found = SYSTEM_LIBRARY_DIRS
        .iter()
        .map(|dir| Path::new(dir).join("libibverbs.so.1"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "no system libibverbs.so.1 in {SYSTEM_LIBRARY_DIRS:?}"
        );
        eprintln!("skipped: no system libibverbs.so.1");
    }
    found
}

/// The drop-in cdylib `cargo test --workspace` built next to this test.
fn dropin_library() -> PathBuf {
    vrdma_qemu_tests::cli::host::dropin_library()
        .expect("libvrdma_ibverbs.so next to the tests: run `cargo test --workspace`")
        .1
}

/// Default-version (`name@@VERSION`) function and object symbols a library defines, outside
/// rdma-core's private interface.
fn public_symbols(library: &Path) -> Vec<(String, String)> {
    let mut symbols = defined_symbols(library);
    symbols.retain(|(_, version)| !version.starts_with("IBVERBS_PRIVATE_"));
    symbols
}

/// The same of rdma-core's private interface (the provider ABI).
fn private_symbols(library: &Path) -> Vec<(String, String)> {
    let mut symbols = defined_symbols(library);
    symbols.retain(|(_, version)| version.starts_with("IBVERBS_PRIVATE_"));
    symbols
}

/// Default-version function and object symbols a library defines.
fn defined_symbols(library: &Path) -> Vec<(String, String)> {
    let out = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(library)
        .output()
        .expect("readelf (binutils, installed with the C compiler)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut symbols: Vec<(String, String)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            let defined = cols.len() >= 8 && cols[6] != "UND";
            let kind = defined && matches!(cols[3], "FUNC" | "OBJECT");
            (kind && matches!(cols[4], "GLOBAL" | "WEAK")).then(|| cols[7])
        })
        .filter_map(|name| name.split_once("@@"))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    symbols.sort();
    symbols
}

/// Fails unless every public symbol of `system` is exported by the drop-in at the same version
/// or listed in NOT_YET_PROVIDED, and every listed one is still missing.
fn assert_exports_everything_of(system: &Path) {
    let ours = public_symbols(&dropin_library());
    let theirs = public_symbols(system);
    assert!(theirs.len() > 50, "{}: {theirs:?}", system.display());
    let missing: Vec<&(String, String)> = theirs
        .iter()
        .filter(|s| !ours.contains(s) && !NOT_YET_PROVIDED.contains(&s.0.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "missing from the drop-in ({}): {missing:?}",
        system.display()
    );
    let provided_now: Vec<&&str> = NOT_YET_PROVIDED
        .iter()
        .filter(|name| ours.iter().any(|(n, _)| n == *name))
        .collect();
    assert!(
        provided_now.is_empty(),
        "exported now, remove from NOT_YET_PROVIDED: {provided_now:?}"
    );
}

/// Fails unless the drop-in exports every symbol of rdma-core's provider ABI that `system`
/// exports, at the same version (what providers bind at load: `tests/provider_abi.rs`).
fn assert_exports_the_provider_abi_of(system: &Path) {
    let ours = private_symbols(&dropin_library());
    let theirs = private_symbols(system);
    assert!(theirs.len() > 60, "{}: {theirs:?}", system.display());
    let missing: Vec<&(String, String)> = theirs.iter().filter(|s| !ours.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "provider ABI missing from the drop-in ({}): {missing:?}",
        system.display()
    );
}

/// Debian 12's rdma-core (44), this machine's.
#[test]
fn every_public_symbol_of_the_host_library_is_exported_at_its_version() {
    let Some(system) = system_library() else {
        return;
    };
    assert_exports_everything_of(&system);
    assert_exports_the_provider_abi_of(&system);
}

/// Debian 13's rdma-core (56), the one in the test VM's root file system (read from the
/// prepared tree on the host: the same file the VM's programs load).
#[test]
fn every_public_symbol_of_the_vm_library_is_exported_at_its_version() {
    let Some(root) = common::vm_root() else {
        return;
    };
    let system = SYSTEM_LIBRARY_DIRS
        .iter()
        .map(|dir| {
            root.tree
                .join(dir.trim_start_matches('/'))
                .join("libibverbs.so.1")
        })
        .find(|p| p.exists())
        .expect("libibverbs.so.1 in the VM's root file system");
    assert_exports_everything_of(&system);
    assert_exports_the_provider_abi_of(&system);
}

/// A library opened with `dlopen`, closed on drop.
struct Library(*mut c_void);

impl Library {
    fn open(path: &Path) -> Library {
        let name = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; RTLD_LOCAL keeps its symbols out of this process's
        // global scope, so the lookups below find the system library's own definitions.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {}", path.display());
        Library(handle)
    }

    /// The address of `name` in this library, as a function of type `F`.
    ///
    /// # Safety
    /// `F` is the C type of the function `name`.
    unsafe fn function<F: Copy>(&self, name: &str) -> F {
        let symbol = CString::new(name).unwrap();
        // SAFETY: a live handle and a NUL-terminated name.
        let address = unsafe { libc::dlsym(self.0, symbol.as_ptr()) };
        assert!(!address.is_null(), "{name} not in the library");
        assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
        // SAFETY: the caller names the function's type; function pointers and data pointers
        // have the same size and representation on this platform (checked above).
        unsafe { std::mem::transmute_copy(&address) }
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and no function of it is used after this.
        unsafe { libc::dlclose(self.0) };
    }
}

type NameOf<T> = unsafe extern "C" fn(T) -> *const c_char;
type Convert<A, R> = unsafe extern "C" fn(A) -> R;

fn text(p: *const c_char) -> String {
    assert!(!p.is_null());
    // SAFETY: both libraries return pointers to static NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Calls `name` in both libraries for every input and compares the answers.
fn same_answers<A: Copy + std::fmt::Debug, R, T: PartialEq + std::fmt::Debug>(
    ours: &Library,
    theirs: &Library,
    name: &str,
    inputs: impl IntoIterator<Item = A>,
    answer: impl Fn(Convert<A, R>, A) -> T,
) {
    // SAFETY: every name below is called with its C signature.
    let (f_ours, f_theirs) = unsafe {
        (
            ours.function::<Convert<A, R>>(name),
            theirs.function::<Convert<A, R>>(name),
        )
    };
    for input in inputs {
        assert_eq!(
            answer(f_ours, input),
            answer(f_theirs, input),
            "{name}({input:?})"
        );
    }
}

#[test]
fn string_and_rate_helpers_answer_as_the_system_library() {
    let Some(system) = system_library() else {
        return;
    };
    let ours = Library::open(&dropin_library());
    let theirs = Library::open(&system);
    // The helpers take plain integers and return static strings or integers: any input is
    // valid, which is what the comparison relies on.
    let name = |f: NameOf<u32>, v: u32| {
        // SAFETY: see above.
        text(unsafe { f(v) })
    };
    same_answers(&ours, &theirs, "ibv_wc_status_str", 0..40u32, name);
    same_answers(&ours, &theirs, "ibv_event_type_str", 0..40u32, name);
    same_answers(&ours, &theirs, "ibv_port_state_str", 0..20u32, name);
    let signed_name = |f: NameOf<c_int>, v: c_int| {
        // SAFETY: see above.
        text(unsafe { f(v) })
    };
    same_answers(&ours, &theirs, "ibv_node_type_str", -3..20, signed_name);
    let call = |f: Convert<u32, c_int>, v: u32| {
        // SAFETY: see above.
        unsafe { f(v) }
    };
    same_answers(&ours, &theirs, "ibv_rate_to_mult", 0..40u32, call);
    same_answers(&ours, &theirs, "ibv_rate_to_mbps", 0..40u32, call);
    let reverse = |f: Convert<c_int, u32>, v: c_int| {
        // SAFETY: see above.
        unsafe { f(v) }
    };
    same_answers(&ours, &theirs, "mult_to_ibv_rate", -2..300, reverse);
    // Every speed either library knows, and their neighbours.
    // SAFETY: ibv_rate_to_mbps's C type.
    let to_mbps: Convert<u32, c_int> = unsafe { theirs.function("ibv_rate_to_mbps") };
    let speeds: Vec<c_int> = (0..40u32)
        .map(|rate| {
            // SAFETY: see above.
            unsafe { to_mbps(rate) }
        })
        .flat_map(|mbps| [mbps - 1, mbps, mbps + 1])
        .chain([0, -1, 100_000])
        .collect();
    same_answers(&ours, &theirs, "mbps_to_ibv_rate", speeds, reverse);
}
