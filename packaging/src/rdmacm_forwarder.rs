//! `librdmacm.so.1` for the dynamic loader's cache.
//!
//! The drop-in is one file that is both `libibverbs.so.1` and `librdmacm.so.1` (one state for
//! both APIs: `rdma_cm` ids hold the very contexts `ibv_*` calls take). Under
//! `LD_LIBRARY_PATH` the loader finds it by file name under either name. Installed for every
//! program, it is found through `ldconfig`'s cache, which lists a shared object only under its
//! soname, `libibverbs.so.1`: a second name of the same file is not in the cache, so programs
//! would get rdma-core's `librdmacm.so.1` (from the system directory) beside the drop-in.
//!
//! So the package ships a *forwarder*: a shared object with soname `librdmacm.so.1`, no code,
//! the drop-in as its only `NEEDED` entry and librdmacm's version nodes defined (the loader
//! checks that the library a program names defines the versions it needs). The symbols
//! themselves (`rdma_create_id@RDMACM_1.0`, ...) are found in the drop-in, which defines them
//! with those versions: glibc matches a versioned reference by version name in every object
//! of the lookup scope, the way glibc's own `libpthread.so.0` forwards to `libc.so.6` since
//! 2.34.

use std::path::Path;
use std::process::Command;

use crate::error::{run, Error, Result};

/// The drop-in's version script, where librdmacm's nodes are defined once.
const DROPIN_VERSION_SCRIPT: &str = include_str!("../../guest-driver/capi/libibverbs.map");
/// The prefix of librdmacm's version nodes.
const RDMACM_NODE: &str = "RDMACM_";
/// The soname the forwarder answers to.
pub const SONAME: &str = "librdmacm.so.1";

/// A version script defining librdmacm's nodes of `script` (each with its parent, no symbols).
fn forwarder_script(script: &str) -> Result<String> {
    let mut out = String::new();
    let mut open: Option<&str> = None;
    for line in script.lines().map(str::trim) {
        if let Some(name) = line.strip_suffix('{').map(str::trim) {
            open = Some(name);
        } else if let Some(close) = line.strip_prefix('}') {
            let Some(name) = open.take() else {
                return Err(Error::Input(format!("unbalanced version script: {line}")));
            };
            if !name.starts_with(RDMACM_NODE) {
                continue;
            }
            let parent = close.trim().trim_end_matches(';').trim();
            let body = if out.is_empty() { " local: *; " } else { " " };
            let inherits = if parent.is_empty() {
                String::new()
            } else {
                format!(" {parent}")
            };
            out.push_str(&format!("{name} {{{body}}}{inherits};\n"));
        }
    }
    if out.is_empty() {
        return Err(Error::Input(format!(
            "no {RDMACM_NODE}* node in the drop-in's version script"
        )));
    }
    Ok(out)
}

/// Links the forwarder at `out` against the drop-in at `dropin` with the C compiler `cc`
/// (the linker driver cargo uses too); `scratch` holds the version script.
pub fn build(cc: &str, dropin: &Path, out: &Path, scratch: &Path) -> Result<()> {
    let script_path = scratch.join("rdmacm-forwarder.map");
    std::fs::write(&script_path, forwarder_script(DROPIN_VERSION_SCRIPT)?)
        .map_err(crate::error::at(&script_path))?;
    let linked = run(Command::new(cc)
        .args(["-shared", "-nostdlib"])
        .arg(format!("-Wl,-soname,{SONAME}"))
        .arg(format!("-Wl,--version-script={}", script_path.display()))
        // Without object files the linker writes no GNU_STACK header, and glibc then gives
        // every program that loads the forwarder an executable stack (and glibc 2.41 refuses
        // to dlopen it): say it needs none. Hardened as Debian's libraries are.
        .args(["-Wl,-z,noexecstack", "-Wl,-z,relro", "-Wl,-z,now"])
        // The drop-in must be NEEDED although nothing here refers to it.
        .arg("-Wl,--no-as-needed")
        .arg(dropin)
        .arg("-o")
        .arg(out));
    let _ = std::fs::remove_file(&script_path);
    linked.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forwarder_defines_every_rdmacm_node_of_the_dropin_with_its_parent() {
        let script = forwarder_script(DROPIN_VERSION_SCRIPT).unwrap();
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(lines[0], "RDMACM_1.0 { local: *; };");
        assert!(lines.contains(&"RDMACM_1.1 { } RDMACM_1.0;"), "{script}");
        assert!(!script.contains("IBVERBS"), "{script}");
        // One line per node of the drop-in's script.
        let nodes = DROPIN_VERSION_SCRIPT
            .lines()
            .filter(|l| l.starts_with(RDMACM_NODE) && l.trim_end().ends_with('{'))
            .count();
        assert_eq!(lines.len(), nodes);
        assert!(nodes >= 4);
    }

    #[test]
    fn a_script_without_rdmacm_nodes_or_balance_is_refused() {
        assert!(forwarder_script("IBVERBS_1.0 {\n global: a;\n};\n").is_err());
        assert!(forwarder_script("};\n").is_err());
    }
}
