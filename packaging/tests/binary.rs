//! `vrdma-deb` end to end on stand-in artifacts (a shared object with the drop-in's soname,
//! a program for the agent): the archive `dpkg-deb` reads back holds every file where the
//! package says, the librdmacm forwarder forwards to the drop-in, and the control files are
//! what dpkg needs. Installing it is the real-guest suite's job (it installs the real one with
//! dpkg in a Debian guest and runs programs through it).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn run(command: &mut Command) -> String {
    let output = command.output().expect("the tool runs");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vrdma-deb-test-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Stand-ins for cargo's build: the drop-in's soname and a librdmacm symbol at its version.
fn artifacts(dir: &Path) {
    let source = dir.join("dropin.c");
    fs::write(&source, "int rdma_create_id(void) { return 0; }\n").unwrap();
    let map = dir.join("dropin.map");
    fs::write(&map, "RDMACM_1.0 { global: rdma_create_id; local: *; };\n").unwrap();
    run(Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libibverbs.so.1"])
        .arg(format!("-Wl,--version-script={}", map.display()))
        .arg(&source)
        .arg("-o")
        .arg(dir.join("libvrdma_ibverbs.so")));
    let agent = dir.join("agent.c");
    fs::write(&agent, "int main(void) { return 0; }\n").unwrap();
    run(Command::new("cc")
        .arg(&agent)
        .arg("-o")
        .arg(dir.join("vrdma-guestd")));
}

#[test]
fn the_package_holds_the_dropin_the_forwarder_and_the_agent_with_their_control_files() {
    let dir = scratch("build");
    artifacts(&dir);
    let out = dir.join("out");
    let printed = run(Command::new(env!("CARGO_BIN_EXE_vrdma-deb"))
        .arg("--artifacts")
        .arg(&dir)
        .arg("--out")
        .arg(&out)
        .args(["--package-version", "9.8.7", "--compression", "gzip"]));
    let deb = PathBuf::from(printed.trim());
    assert_eq!(deb, out.join("vrdma-guest_9.8.7_amd64.deb"));

    let field = |name: &str| run(Command::new("dpkg-deb").arg("-f").arg(&deb).arg(name));
    assert_eq!(field("Package").trim(), "vrdma-guest");
    assert_eq!(field("Version").trim(), "9.8.7");
    let depends = field("Depends");
    assert!(depends.starts_with("libc6 (>= 2."), "{depends}");
    assert!(depends.trim_end().ends_with(", passwd"), "{depends}");

    // Directories as Debian ships them, whatever the umask of the build.
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    for line in listing.lines().filter(|l| l.starts_with('d')) {
        assert!(line.starts_with("drwxr-xr-x root/root"), "{line}");
    }
    // Unpacked as dpkg would: files, links, control files.
    let root = dir.join("root");
    run(Command::new("dpkg-deb").arg("-R").arg(&deb).arg(&root));
    let libs = root.join("usr/lib/x86_64-linux-gnu/vrdma");
    for (link, target) in [
        ("libibverbs.so.1", "libvrdma-ibverbs.so.9.8.7"),
        ("librdmacm.so.1", "libvrdma-rdmacm.so.9.8.7"),
    ] {
        assert_eq!(fs::read_link(libs.join(link)).unwrap(), Path::new(target));
    }
    let conf = fs::read_to_string(root.join("etc/ld.so.conf.d/00-vrdma.conf")).unwrap();
    assert!(
        conf.lines().any(|l| l == "/usr/lib/x86_64-linux-gnu/vrdma"),
        "{conf}"
    );
    assert!(root.join("usr/sbin/vrdma-guestd").is_file());
    let unit =
        fs::read_to_string(root.join("usr/lib/systemd/system/vrdma-guestd.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/sbin/vrdma-guestd "), "{unit}");
    assert!(root.join("etc/default/vrdma-guestd").is_file());
    assert!(root.join("usr/share/doc/vrdma-guest/copyright").is_file());
    let conffiles = fs::read_to_string(root.join("DEBIAN/conffiles")).unwrap();
    assert_eq!(
        conffiles,
        "/etc/ld.so.conf.d/00-vrdma.conf\n/etc/default/vrdma-guestd\n"
    );
    assert_eq!(
        fs::read_to_string(root.join("DEBIAN/triggers")).unwrap(),
        "activate-noawait ldconfig\n"
    );
    // md5sums lists what it should, and the sums hold.
    run(Command::new("md5sum")
        .args(["--check", "--quiet", "DEBIAN/md5sums"])
        .current_dir(&root));

    // The forwarder: soname librdmacm.so.1, the drop-in NEEDED, librdmacm's versions defined.
    let forwarder = libs.join("libvrdma-rdmacm.so.9.8.7");
    let dynamic = run(Command::new("readelf").arg("-dW").arg(&forwarder));
    assert!(
        dynamic.contains("Library soname: [librdmacm.so.1]"),
        "{dynamic}"
    );
    assert!(
        dynamic.contains("Shared library: [libibverbs.so.1]"),
        "{dynamic}"
    );
    // A non-executable stack (without the header glibc would make the stack executable, and
    // refuse to dlopen it since 2.41).
    let headers = run(Command::new("readelf").arg("-lW").arg(&forwarder));
    let stack = headers
        .lines()
        .find(|l| l.trim_start().starts_with("GNU_STACK"))
        .unwrap_or_else(|| panic!("no GNU_STACK header:\n{headers}"));
    // Type, offset, addresses, sizes, then the flags.
    assert_eq!(stack.split_whitespace().nth(6), Some("RW"), "{stack}");
    let versions = run(Command::new("readelf").arg("-VW").arg(&forwarder));
    for node in ["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"] {
        assert!(versions.contains(&format!("Name: {node}")), "{versions}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_artifacts_are_a_clear_error() {
    let dir = scratch("missing");
    let output = Command::new(env!("CARGO_BIN_EXE_vrdma-deb"))
        .arg("--artifacts")
        .arg(&dir)
        .arg("--out")
        .arg(dir.join("out"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("libvrdma_ibverbs.so"), "{stderr}");
    fs::remove_dir_all(&dir).unwrap();
}
