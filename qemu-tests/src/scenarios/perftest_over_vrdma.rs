//! `perftest-over-vrdma`: Debian's unmodified perftest binaries over vrdma's drop-in
//! `libibverbs.so.1`, inside the VM, next to the native run from the same boot.
//!
//! Three configurations of the same [`perftest::BASELINE`]: both sides native on rxe0; the
//! client over vrdma (process transport) against a native server; both sides over vrdma through
//! one vrdma-backend. The vrdma side finds the drop-in through `LD_LIBRARY_PATH`, in a directory
//! prepared on the host ([`prepare_library_dir`]). The vendor libraries perftest links directly
//! (`libmlx5.so.1`, `libefa.so.1`, `libhns.so.1`) are Debian's own, which load over the drop-in
//! (its provider ABI) and leave vrdma0 alone.

use std::path::{Path, PathBuf};

use super::backend::Backend;
use crate::error::{Error, IoContext, Result};
use crate::inside::DEVICE;
use crate::native;
use crate::perftest::{self, Row, Side};

/// Row labels of the three configurations, in the order they run.
pub const NATIVE: &str = "native";
pub const VRDMA_CLIENT: &str = "vrdma-client";
pub const VRDMA_BOTH: &str = "vrdma-both";

/// Stand-ins for the vendor libraries perftest links, which earlier versions put in the
/// drop-in's directory before the drop-in had the provider ABI; removed from a directory an
/// older build left, so that Debian's own are the ones loaded.
const FORMER_STANDINS: &[&str] = &["libmlx5.so.1", "libefa.so.1", "libhns.so.1"];

/// The LD_PRELOAD helper in the drop-in's directory that makes a client's `rdma_connect` wait
/// for a listener on its destination port (`native/preload/connect_after_listen.c`).
pub const CONNECT_AFTER_LISTEN: &str = "libvrdma-connect-after-listen.so";

/// Prepares (on the host) `<target_dir>/native/vrdma-dropin/`: `libibverbs.so.1` and
/// `librdmacm.so.1` linking to `dropin` (the `libvrdma_ibverbs.so` cargo built) and the
/// perftest -R clients' helper, built with the system C compiler. Returns the directory, for
/// `LD_LIBRARY_PATH`.
pub fn prepare_library_dir(target_dir: &Path, dropin: &Path) -> Result<PathBuf> {
    let dir = target_dir.join("native").join("vrdma-dropin");
    for former in FORMER_STANDINS {
        // The library and its build stamp (`native::build_shared_object`).
        for path in [dir.join(former), dir.join(format!("{former}.stamp"))] {
            if path.exists() {
                std::fs::remove_file(&path).context(|| format!("removing {}", path.display()))?;
            }
        }
    }
    // The perftest -R clients' helper (scenarios::perftest_rdma_cm).
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("native/preload");
    native::build_shared_object(
        &dir,
        &sources.join("connect_after_listen.c"),
        &sources.join("connect_after_listen.map"),
        CONNECT_AFTER_LISTEN,
    )?;
    // One file under both names: the loader loads it once (see guest-driver/capi/src/rdmacm).
    for name in ["libibverbs.so.1", "librdmacm.so.1"] {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(dropin) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(dropin, &link)
                .context(|| format!("linking {} to {}", link.display(), dropin.display()))?;
        }
    }
    Ok(dir)
}

/// Runs the baseline natively, then client over vrdma, then both over vrdma (inside the VM);
/// the rows carry the configuration as their label.
pub fn run(backend_binary: &Path, library_dir: &Path) -> Result<Vec<Row>> {
    if !library_dir.join("libibverbs.so.1").exists() {
        return Err(Error::Scenario(format!(
            "{} has no libibverbs.so.1",
            library_dir.display()
        )));
    }
    let native = Side::native(DEVICE);
    let mut backend = Backend::start(backend_binary, "vrdma-perftest-backend", &[], "warn")?;
    let vrdma = Side::over_dropin(&backend.socket, library_dir);
    let configurations = [
        (NATIVE, &native, &native),
        (VRDMA_CLIENT, &native, &vrdma),
        (VRDMA_BOTH, &vrdma, &vrdma),
    ];
    let mut rows = Vec::new();
    for (label, server, client) in configurations {
        println!(
            "== {label}: server on {}, client on {}",
            server.device, client.device
        );
        for case in perftest::BASELINE {
            println!(
                "running {} size {} x{} …",
                case.tool.command(),
                case.size,
                case.iterations
            );
            let mut row = perftest::run_case(case, server, client, 18515)?;
            row.label = label.into();
            rows.push(row);
        }
    }
    backend.check_alive("the run")?;
    Ok(rows)
}
