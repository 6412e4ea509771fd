//! `cargo test --workspace` builds a package's binaries only when the package has integration
//! tests (they may run them). The VM suites run every binary of the workspace from the target
//! directory, so a package that ships a binary and has no integration test leaves those suites
//! without it on a clean clone. Each such package here has at least one.

use std::fs;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support sits in the workspace")
        .to_owned()
}

/// Whether the package at `dir` defines a binary target.
fn has_binary(dir: &Path, manifest: &toml::Table) -> bool {
    manifest.contains_key("bin")
        || dir.join("src/main.rs").is_file()
        || dir.join("src/bin").is_dir()
}

/// Whether the package at `dir` has an integration test: `tests/*.rs` or `tests/*/main.rs`.
fn has_integration_test(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir.join("tests")) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let path = entry.path();
        path.extension().is_some_and(|e| e == "rs") || path.join("main.rs").is_file()
    })
}

/// The workspace's members: path (as the workspace lists it), directory and manifest.
fn members(root: &Path) -> Vec<(String, PathBuf, toml::Table)> {
    let workspace: toml::Table = fs::read_to_string(root.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    workspace["workspace"]["members"]
        .as_array()
        .expect("workspace members")
        .iter()
        .map(|member| {
            let member = member.as_str().expect("member path").to_string();
            let dir = root.join(&member);
            let manifest = fs::read_to_string(dir.join("Cargo.toml"))
                .unwrap()
                .parse()
                .unwrap();
            (member, dir, manifest)
        })
        .collect()
}

#[test]
fn every_package_with_a_binary_has_an_integration_test() {
    let mut with_binary = 0;
    let mut missing = Vec::new();
    for (member, dir, manifest) in members(&workspace_root()) {
        if !has_binary(&dir, &manifest) {
            continue;
        }
        with_binary += 1;
        if !has_integration_test(&dir) {
            missing.push(member);
        }
    }
    // The back-end, the keeper, the agent, the tools and vrdma-vm at least.
    assert!(
        with_binary >= 5,
        "found {with_binary} packages with binaries"
    );
    assert!(
        missing.is_empty(),
        "packages whose binaries `cargo test --workspace` does not build: {missing:?}"
    );
}

/// The packages `vrdma-vm` builds before it runs a suite (`qemu-tests/src/workspace.rs`).
fn built_by_vrdma_vm(root: &Path) -> Vec<String> {
    let source = fs::read_to_string(root.join("qemu-tests/src/workspace.rs")).unwrap();
    let start = source
        .find("const PACKAGES: &[&str] = &[")
        .expect("workspace.rs lists PACKAGES");
    let list = &source[start..];
    let list = &list[..list.find("];").expect("the list ends")];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

/// `cargo run … vrdma-vm -- demo` (the README's first command) on a fresh clone has only what
/// `vrdma-vm` builds itself: every binary of the workspace must be among it.
#[test]
fn vrdma_vm_builds_every_binary_its_suites_may_start() {
    let root = workspace_root();
    let built = built_by_vrdma_vm(&root);
    assert!(built.iter().any(|p| p == "vrdma-backend"), "{built:?}");
    let mut missing = Vec::new();
    for (_, dir, manifest) in members(&root) {
        let name = manifest["package"]["name"].as_str().unwrap().to_string();
        // vrdma-vm itself is what runs.
        if has_binary(&dir, &manifest) && name != "vrdma-qemu-tests" && !built.contains(&name) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "binaries `vrdma-vm` does not build before a suite: {missing:?}"
    );
}
