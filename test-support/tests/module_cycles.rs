//! No crate of the workspace has an import cycle between its modules, nor between its
//! top-level modules (the folders and files under `src/`), and the crates whose layers
//! ARCHITECTURE.md lists import only downwards: a top-level module names items of its own
//! layer or of layers below it, never of one above.
//!
//! A module A depends on a module B when A's non-test code names an item of B, through `use` or
//! a path (`crate::b::x`, `super::x`, `self::child::x`, `child::x`). Declaring `mod child;` is
//! not a dependency; a child naming an item its parent *defines* is. A name that a module
//! re-exports with `pub use` counts as a dependency on the module that defines it. Items under
//! `#[cfg(test)]` (and the files declared there) and `src/bin` are left out; a `lib.rs` and a
//! `main.rs` in one tree are two crates, each checked. The scan is textual (comments removed),
//! which is enough for this code base: it has no macros that generate paths between modules.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

type ModPath = Vec<String>;

/// The source trees of the workspace's crates, relative to the workspace root. Each of their
/// crate roots (`lib.rs`, `main.rs`) is checked as the crate it is: a binary beside a library
/// reaches the library only as another crate.
const CRATE_SOURCES: &[&str] = &[
    "spec/src",
    "host-device/src",
    "keeper/src",
    "backend/src",
    "guest-driver/src",
    "guest-driver/capi/src",
    "guest-driver/tools/src",
    "guest-driver/agent/src",
    "packaging/src",
    "qemu-tests/src",
    "test-support/src",
];

struct Crate {
    /// Source text (comments and `#[cfg(test)]` items removed) of each module.
    modules: BTreeMap<ModPath, String>,
    /// Per module: name it re-exports -> the path it re-exports.
    reexports: HashMap<ModPath, HashMap<String, Vec<String>>>,
    /// Per module: every path it names.
    paths: HashMap<ModPath, Vec<Vec<String>>>,
}

fn module_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).expect("file under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("file name");
    let stem = last.trim_end_matches(".rs").to_string();
    if !(parts.is_empty() && (stem == "lib" || stem == "main")) && stem != "mod" {
        parts.push(stem);
    }
    parts
}

/// Removes comments and every item preceded by `#[cfg(test)]`.
fn strip(text: &str) -> String {
    let mut no_comments = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if bytes[i..].starts_with(b"/*") {
            i += 2;
            while i < bytes.len() && !bytes[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if bytes[i] == b'"' {
            // String literals may contain `::` or `//`; keep them out of the scan.
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                if bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            no_comments.push_str("\"\"");
        } else {
            no_comments.push(bytes[i] as char);
            i += 1;
        }
    }
    let mut out = String::with_capacity(no_comments.len());
    let mut rest = no_comments.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (k, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Expands a use tree (`a::{b, c::{d as e, f}}`) into paths; an alias is returned beside it.
fn expand_use_tree(tree: &str) -> Vec<(Vec<String>, Option<String>)> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree = tree.replace(" as ", "@").replace(' ', "");
    fn parse(s: &str) -> Vec<(Vec<String>, Option<String>)> {
        if let Some(open) = s.find('{') {
            let close = s.rfind('}').unwrap_or(s.len());
            let prefix: Vec<String> = s[..open]
                .split("::")
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect();
            let inner = &s[open + 1..close];
            let mut items = Vec::new();
            let (mut depth, mut start) = (0i32, 0usize);
            for (k, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(&inner[start..k]);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            items.push(&inner[start..]);
            items
                .into_iter()
                .filter(|i| !i.is_empty())
                .flat_map(|item| {
                    parse(item).into_iter().map(|(tail, alias)| {
                        let mut full = prefix.clone();
                        full.extend(tail);
                        (full, alias)
                    })
                })
                .collect()
        } else {
            let (path, alias) = match s.split_once('@') {
                Some((p, a)) => (p, Some(a.to_string())),
                None => (s, None),
            };
            let segs = path
                .split("::")
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect();
            vec![(segs, alias)]
        }
    }
    parse(&tree)
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `use` statements of a module: (is `pub`, use tree).
fn use_statements(text: &str) -> Vec<(bool, String)> {
    let mut found = Vec::new();
    let mut search = 0;
    while let Some(rel) = text[search..].find("use ") {
        let at = search + rel;
        search = at + 4;
        let before = text[..at].trim_end();
        if at > 0 && text[..at].chars().last().is_some_and(is_ident_char) {
            continue;
        }
        let statement_start = before
            .rfind([';', '{', '}', ']'])
            .map(|p| p + 1)
            .unwrap_or(0);
        let qualifiers = before[statement_start..].trim();
        if !(qualifiers.is_empty() || qualifiers.starts_with("pub")) {
            continue;
        }
        let Some(end) = text[search..].find(';') else {
            break;
        };
        found.push((
            qualifiers.starts_with("pub"),
            text[search..search + end].to_string(),
        ));
    }
    found
}

/// Paths starting with `crate::`, `super::` or `self::` anywhere in the text.
fn qualified_paths(text: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for root in ["crate::", "super::", "self::"] {
        let mut search = 0;
        while let Some(rel) = text[search..].find(root) {
            let at = search + rel;
            search = at + root.len();
            if at > 0 && text[..at].chars().last().is_some_and(is_ident_char) {
                continue;
            }
            let end = text[at..]
                .find(|c: char| !(is_ident_char(c) || c == ':'))
                .map(|e| at + e)
                .unwrap_or(text.len());
            if text[at..end].ends_with("::") {
                // `crate::{a, b}`: a use tree, expanded by `use_statements`.
                continue;
            }
            found.push(
                text[at..end]
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            );
        }
    }
    found
}

/// Every `mod NAME` item of `text` (stripped): its name and the text after the name.
fn mod_items(text: &str) -> Vec<(String, &str)> {
    let mut items = Vec::new();
    let mut search = 0;
    while let Some(rel) = text[search..].find("mod ") {
        let at = search + rel;
        search = at + 4;
        if at > 0 && text[..at].chars().last().is_some_and(is_ident_char) {
            continue;
        }
        let rest = text[search..].trim_start();
        let name: String = rest.chars().take_while(|&c| is_ident_char(c)).collect();
        if !name.is_empty() {
            let after = &rest[name.len()..];
            items.push((name, after));
        }
    }
    items
}

fn inline_modules(text: &str) -> Vec<String> {
    mod_items(text)
        .into_iter()
        .filter(|(_, after)| after.trim_start().starts_with('{'))
        .map(|(name, _)| name)
        .collect()
}

/// Whether `text` (stripped) declares the module `name` (`mod name;` or `mod name {`).
fn declares_module(text: &str, name: &str) -> bool {
    mod_items(text).iter().any(|(declared, _)| declared == name)
}

/// The crate roots of the source trees, as `<src>/lib.rs` and `<src>/main.rs`.
fn crate_roots(root: &Path) -> Vec<String> {
    let mut roots = Vec::new();
    for src in CRATE_SOURCES {
        assert!(root.join(src).is_dir(), "{src} is not a directory");
        for file in ["lib.rs", "main.rs"] {
            if root.join(src).join(file).is_file() {
                roots.push(format!("{src}/{file}"));
            }
        }
    }
    roots
}

/// The crate whose root file is `crate_root` (`<src>/lib.rs` or `<src>/main.rs`): the files
/// under `<src>` that the root declares, directly or through the modules it declares.
fn load(root: &Path, crate_root: &str) -> Crate {
    let root_file = root.join(crate_root);
    let src = root_file
        .parent()
        .expect("a crate root has a directory")
        .to_path_buf();
    let mut files = Vec::new();
    collect(&src, &src, &mut files);
    files.retain(|file| {
        file == &root_file
            || !(file.parent() == Some(src.as_path())
                && file
                    .file_name()
                    .is_some_and(|n| n == "lib.rs" || n == "main.rs"))
    });
    let mut modules = BTreeMap::new();
    for file in files {
        let text = strip(&fs::read_to_string(&file).expect("readable source"));
        let path = module_path(&src, &file);
        for inline in inline_modules(&text) {
            let mut child = path.clone();
            child.push(inline);
            modules.entry(child).or_insert_with(String::new);
        }
        modules.insert(path, text);
    }
    // A file whose `mod` declaration is test code (`#[cfg(test)] mod tests;`, removed by
    // `strip`) is test code too, and so is everything below it; a file no module declares
    // belongs to another crate root of the tree.
    let declared = |module: &ModPath, modules: &BTreeMap<ModPath, String>| {
        let Some((child, parent)) = module.split_last() else {
            return true;
        };
        modules
            .get(parent)
            .is_some_and(|text| declares_module(text, child))
    };
    let test_only: Vec<ModPath> = modules
        .keys()
        .filter(|m| (1..=m.len()).any(|n| !declared(&m[..n].to_vec(), &modules)))
        .cloned()
        .collect();
    for module in test_only {
        modules.remove(&module);
    }
    let mut reexports = HashMap::new();
    let mut paths = HashMap::new();
    for (module, text) in &modules {
        let mut named = qualified_paths(text);
        let mut exported = HashMap::new();
        for (public, tree) in use_statements(text) {
            for (path, alias) in expand_use_tree(&tree) {
                if public {
                    if let Some(last) = alias.clone().or_else(|| path.last().cloned()) {
                        exported.insert(last, path.clone());
                    }
                }
                named.push(path);
            }
        }
        reexports.insert(module.clone(), exported);
        paths.insert(module.clone(), named);
    }
    Crate {
        modules,
        reexports,
        paths,
    }
}

fn collect(src: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            if !(dir == src && path.file_name().is_some_and(|n| n == "bin")) {
                collect(src, &path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

impl Crate {
    /// The module defining the item `path` names from `from`; `None` for other crates.
    fn resolve(&self, from: &ModPath, path: &[String], depth: usize) -> Option<ModPath> {
        let first = path.first()?;
        let (mut current, rest): (ModPath, &[String]) = match first.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "super" | "self" => {
                let mut base = from.clone();
                let mut k = 0;
                while k < path.len() && (path[k] == "super" || path[k] == "self") {
                    if path[k] == "super" {
                        base.pop();
                    }
                    k += 1;
                }
                (base, &path[k..])
            }
            name => {
                let mut child = from.clone();
                child.push(name.to_string());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                (from.clone(), path)
            }
        };
        let mut k = 0;
        while k < rest.len() {
            let mut next = current.clone();
            next.push(rest[k].clone());
            if !self.modules.contains_key(&next) {
                break;
            }
            current = next;
            k += 1;
        }
        if k < rest.len() && depth < 8 && &current != from {
            if let Some(target) = self.reexports.get(&current).and_then(|e| e.get(&rest[k])) {
                return self.resolve(&current, target, depth + 1);
            }
        }
        Some(current)
    }

    fn edges(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let mut edges = BTreeMap::new();
        for module in self.modules.keys() {
            let targets: BTreeSet<ModPath> = self.paths[module]
                .iter()
                .filter_map(|path| {
                    let mut path = path.clone();
                    if path.last().is_some_and(|s| s == "*") {
                        path.pop();
                        path.push("*".into());
                    }
                    self.resolve(module, &path, 0)
                })
                .filter(|target| target != module)
                .collect();
            edges.insert(module.clone(), targets);
        }
        edges
    }
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: HashMap<&'a ModPath, usize>,
        low: HashMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        found: Vec<Vec<ModPath>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a ModPath) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let Some((w, _)) = self.edges.get_key_value(w) else {
                    continue;
                };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().expect("on stack");
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

fn name(module: &ModPath) -> String {
    if module.is_empty() {
        "crate".into()
    } else {
        module.join("::")
    }
}

/// Edges between top-level modules: from, to, and the module-level edges behind each.
type FolderEdges = BTreeMap<ModPath, BTreeMap<ModPath, Vec<(ModPath, ModPath)>>>;

/// The top-level module (a folder or a file under `src/`) of every module but the root.
fn top_level(module: &ModPath) -> Option<ModPath> {
    module.first().map(|top| vec![top.clone()])
}

/// The edges between top-level modules, each with the module-level edges behind it.
fn top_level_edges(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> FolderEdges {
    let mut folded: FolderEdges = BTreeMap::new();
    for (from, targets) in edges {
        let Some(from_top) = top_level(from) else {
            continue;
        };
        let entry = folded.entry(from_top.clone()).or_default();
        for to in targets {
            match top_level(to) {
                Some(to_top) if to_top != from_top => entry
                    .entry(to_top)
                    .or_default()
                    .push((from.clone(), to.clone())),
                _ => {}
            }
        }
    }
    folded
}

/// The layer orders ARCHITECTURE.md declares, by crate source tree: a fenced block opened with
/// `layers <src>`, one layer per line from the top, the layer's top-level modules separated
/// by spaces.
fn declared_layers(architecture: &str) -> BTreeMap<String, Vec<Vec<String>>> {
    let mut declared = BTreeMap::new();
    let mut lines = architecture.lines();
    while let Some(line) = lines.next() {
        let Some(src) = line.trim().strip_prefix("```layers ") else {
            continue;
        };
        let layers = lines
            .by_ref()
            .take_while(|l| l.trim() != "```")
            .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
            .filter(|layer| !layer.is_empty())
            .collect();
        declared.insert(src.trim().to_string(), layers);
    }
    declared
}

/// What breaks a declared layer order: an import from a layer above, a top-level module that
/// takes part in imports without being declared, or a declared name that is no top-level
/// module of the crate (`tops`).
fn layer_violations(
    folded: &FolderEdges,
    layers: &[Vec<String>],
    tops: &BTreeSet<String>,
) -> Vec<String> {
    let layer_of = |module: &ModPath| {
        layers
            .iter()
            .position(|layer| layer.iter().any(|m| m == &module[0]))
    };
    let mut found: Vec<String> = layers
        .iter()
        .flatten()
        .filter(|m| !tops.contains(*m))
        .map(|m| format!("{m} is declared but is no top-level module"))
        .collect();
    for (from, targets) in folded {
        for (to, behind) in targets {
            match (layer_of(from), layer_of(to)) {
                (Some(a), Some(b)) if a <= b => {}
                (Some(_), Some(_)) => {
                    let (file, named) = &behind[0];
                    found.push(format!(
                        "{} imports {}, a layer above it ({} names {})",
                        name(from),
                        name(to),
                        name(file),
                        name(named)
                    ));
                }
                (a, b) => {
                    for (module, layer) in [(from, a), (to, b)] {
                        if layer.is_none() {
                            found.push(format!("{} is in no declared layer", name(module)));
                        }
                    }
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn no_crate_has_a_cycle_between_its_folders() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut report = String::new();
    for src in crate_roots(&root) {
        let folded = top_level_edges(&load(&root, &src).edges());
        let edges: BTreeMap<ModPath, BTreeSet<ModPath>> = folded
            .iter()
            .map(|(from, targets)| (from.clone(), targets.keys().cloned().collect()))
            .collect();
        for component in cycles(&edges) {
            report.push_str(&format!("{src}: cycle among folders\n"));
            for module in &component {
                for (to, behind) in &folded[module] {
                    if component.contains(to) {
                        let (file, named) = &behind[0];
                        report.push_str(&format!(
                            "  {} -> {} ({} names {})\n",
                            name(module),
                            name(to),
                            name(file),
                            name(named)
                        ));
                    }
                }
            }
        }
    }
    assert!(report.is_empty(), "folder cycles:\n{report}");
}

#[test]
fn declared_layers_import_only_downwards() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let architecture =
        fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md is readable");
    let declared = declared_layers(&architecture);
    assert!(
        declared.contains_key("backend/src/lib.rs"),
        "ARCHITECTURE.md declares the backend's layers"
    );
    let roots = crate_roots(&root);
    let mut report = String::new();
    for (src, layers) in &declared {
        assert!(
            roots.contains(src),
            "ARCHITECTURE.md declares layers of {src}, which is not a crate root"
        );
        let krate = load(&root, src);
        let tops = krate
            .modules
            .keys()
            .filter_map(|m| m.first().cloned())
            .collect();
        let folded = top_level_edges(&krate.edges());
        for violation in layer_violations(&folded, layers, &tops) {
            report.push_str(&format!("{src}: {violation}\n"));
        }
    }
    assert!(report.is_empty(), "layer violations:\n{report}");
}

#[test]
fn the_layer_check_refuses_an_import_from_above_and_an_undeclared_folder() {
    let module = |m: &str| vec![m.to_string()];
    let edge = |from: &str, to: &str| {
        let behind = vec![(module(from), module(to))];
        (module(to), behind)
    };
    let mut folded = BTreeMap::new();
    folded.insert(module("control"), BTreeMap::from([edge("control", "host")]));
    let layers = declared_layers("```layers backend/src\ncontrol\nhost memory\n```\n")
        .remove("backend/src")
        .unwrap();
    assert_eq!(layers, vec![vec!["control"], vec!["host", "memory"]]);
    let tops = ["control", "host", "memory", "stray"]
        .map(String::from)
        .into();
    assert!(layer_violations(&folded, &layers, &tops).is_empty());
    folded.insert(module("host"), BTreeMap::from([edge("host", "control")]));
    folded.insert(module("memory"), BTreeMap::from([edge("memory", "stray")]));
    assert_eq!(
        layer_violations(&folded, &layers, &tops),
        [
            "host imports control, a layer above it (host names control)",
            "stray is in no declared layer",
        ]
    );
    let without_memory = ["control", "host", "stray"].map(String::from).into();
    assert!(layer_violations(&folded, &layers, &without_memory)
        .contains(&"memory is declared but is no top-level module".to_string()));
}

#[test]
fn no_crate_has_a_module_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut report = String::new();
    for src in crate_roots(&root) {
        let krate = load(&root, &src);
        let edges = krate.edges();
        for component in cycles(&edges) {
            report.push_str(&format!("{src}: cycle among\n"));
            for module in &component {
                let within: Vec<String> = edges[module]
                    .iter()
                    .filter(|t| component.contains(t))
                    .map(name)
                    .collect();
                report.push_str(&format!("  {} -> {}\n", name(module), within.join(", ")));
            }
        }
    }
    assert!(report.is_empty(), "module cycles:\n{report}");
}

#[test]
fn the_scan_finds_a_cycle_through_a_parent_helper_and_ignores_test_code() {
    let mut krate = Crate {
        modules: BTreeMap::new(),
        reexports: HashMap::new(),
        paths: HashMap::new(),
    };
    let sources = [
        (vec![], "mod a; pub use a::Thing; fn helper() {}"),
        (
            vec!["a".to_string()],
            "use super::helper; pub struct Thing;",
        ),
        (
            vec!["b".to_string()],
            "use crate::Thing;\n#[cfg(test)]\nmod tests { use crate::c::X; }",
        ),
        (vec!["c".to_string()], "use crate::b::Y; pub struct X;"),
    ];
    for (module, text) in sources {
        let text = strip(text);
        let mut named = qualified_paths(&text);
        let mut exported = HashMap::new();
        for (public, tree) in use_statements(&text) {
            for (path, alias) in expand_use_tree(&tree) {
                if public {
                    exported.insert(
                        alias.unwrap_or_else(|| path.last().unwrap().clone()),
                        path.clone(),
                    );
                }
                named.push(path);
            }
        }
        krate.modules.insert(module.clone(), text);
        krate.reexports.insert(module.clone(), exported);
        krate.paths.insert(module, named);
    }
    let edges = krate.edges();
    // b names crate::Thing, which is a's: an edge to a, not to the root.
    assert!(edges[&vec!["b".to_string()]].contains(&vec!["a".to_string()]));
    // The test module of b names c, c names b: not a cycle, because test code is left out.
    let found = cycles(&edges);
    assert_eq!(found.len(), 1, "{found:?}");
    let mut component = found[0].clone();
    component.sort();
    assert_eq!(component, vec![vec![], vec!["a".to_string()]]);
}
