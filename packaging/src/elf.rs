//! What a shared object or program needs at run time, read with binutils' `readelf`: the
//! libraries it names (`NEEDED`) and the glibc symbol versions it requires, from which the
//! package's `Depends` is derived (what `dpkg-shlibdeps` would compute for these two libraries,
//! without needing `dpkg-dev`).

use std::path::Path;
use std::process::Command;

use crate::error::{run, Error, Result};

/// The sonames a file names in its dynamic section's `NEEDED` entries.
pub fn needed(path: &Path) -> Result<Vec<String>> {
    let dynamic = run(Command::new("readelf").arg("-dW").arg(path))?;
    Ok(bracketed(&dynamic, "(NEEDED)"))
}

/// The values in `[...]` of `readelf -d` lines of the given tag.
fn bracketed(dynamic: &str, tag: &str) -> Vec<String> {
    dynamic
        .lines()
        .filter(|line| line.contains(tag))
        .filter_map(|line| {
            let (_, rest) = line.split_once('[')?;
            Some(rest.split_once(']')?.0.to_string())
        })
        .collect()
}

/// The highest `GLIBC_x.y` version a file requires, as `(x, y)`.
pub fn newest_glibc(path: &Path) -> Result<Option<(u32, u32)>> {
    let versions = run(Command::new("readelf").arg("-VW").arg(path))?;
    Ok(newest_glibc_in(&versions))
}

fn newest_glibc_in(versions: &str) -> Option<(u32, u32)> {
    versions
        .split_whitespace()
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter_map(|version| {
            let mut parts = version.split('.').map(str::parse::<u32>);
            let major = parts.next()?.ok()?;
            let minor = parts.next().unwrap_or(Ok(0)).ok()?;
            Some((major, minor))
        })
        .max()
}

/// The Debian package that provides a soname of the C runtime; `None` for any other.
fn runtime_package(soname: &str) -> Option<&'static str> {
    match soname {
        "libc.so.6" | "libm.so.6" | "libdl.so.2" | "libpthread.so.0" | "librt.so.1" => {
            Some("libc6")
        }
        name if name.starts_with("ld-linux") => Some("libc6"),
        "libgcc_s.so.1" => Some("libgcc-s1"),
        _ => None,
    }
}

/// The `Depends` of files that need `needed` (sonames, the package's own `shipped` ones
/// excluded) and at least glibc `glibc`.
pub fn depends(
    needed: &[String],
    shipped: &[String],
    glibc: Option<(u32, u32)>,
) -> Result<Vec<String>> {
    let mut packages = Vec::new();
    for soname in needed.iter().filter(|n| !shipped.contains(n)) {
        let package = runtime_package(soname).ok_or_else(|| {
            Error::Input(format!(
                "{soname} is needed, and no package is known to provide it"
            ))
        })?;
        if !packages.contains(&package) {
            packages.push(package);
        }
    }
    packages.sort_unstable();
    Ok(packages
        .into_iter()
        .map(|package| match (package, glibc) {
            ("libc6", Some((major, minor))) => format!("libc6 (>= {major}.{minor})"),
            (package, _) => package.to_string(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_glibc_version_is_found_among_all() {
        let versions = "  0x0010:   Name: GLIBC_2.2.5  Flags: none  Version: 3\n\
                        0x0020:   Name: GLIBC_2.34  Flags: none  Version: 5\n\
                        0x0030:   Name: GLIBC_2.9  Flags: none  Version: 4\n\
                        0x0040:   Name: GCC_3.0  Flags: none  Version: 2\n";
        assert_eq!(newest_glibc_in(versions), Some((2, 34)));
        assert_eq!(newest_glibc_in("Name: GCC_4.2.0"), None);
    }

    #[test]
    fn dynamic_entries_are_read_between_brackets() {
        let dynamic = " 0x0000000000000001 (NEEDED)  Shared library: [libgcc_s.so.1]\n \
                       0x0000000000000001 (NEEDED)  Shared library: [libc.so.6]\n \
                       0x000000000000000e (SONAME)  Library soname: [libibverbs.so.1]\n";
        assert_eq!(
            bracketed(dynamic, "(NEEDED)"),
            ["libgcc_s.so.1", "libc.so.6"]
        );
        assert_eq!(bracketed(dynamic, "(SONAME)"), ["libibverbs.so.1"]);
    }

    #[test]
    fn depends_names_each_runtime_package_once_and_skips_what_is_shipped() {
        let needed = [
            "libc.so.6",
            "libgcc_s.so.1",
            "ld-linux-x86-64.so.2",
            "libibverbs.so.1",
        ]
        .map(String::from);
        let shipped = ["libibverbs.so.1".to_string()];
        assert_eq!(
            depends(&needed, &shipped, Some((2, 34))).unwrap(),
            ["libc6 (>= 2.34)", "libgcc-s1"]
        );
        let unknown = ["libssl.so.3".to_string()];
        assert!(depends(&unknown, &shipped, None).is_err());
    }
}
