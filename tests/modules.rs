//! The house has no circles: in each crate of the workspace, no module reaches back to itself
//! through the modules it uses (`use crate::…`, `super::…` and paths written in place, test
//! modules left out). A circle means two modules that can only be understood, changed and
//! tested together; when one appears, this test names the modules on it.
//!
//! The graph is read from the sources, one module a file (`a/b.rs` and `a/b/mod.rs` are
//! `crate::a::b`); a path names the longest module that it starts with. The same holds between
//! each crate's top-level modules (each with every module under it): they stand in layers,
//! and no arrow goes back up (`docs/ARCHITECTURE.md` lists `combd-shards`' layers).

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// The crates' source roots, from the workspace's root.
const CRATES: &[&str] = &[
    "src",
    "kernel/src",
    "shards/src",
    "fleet/src",
    "wasm/src",
    "testkit/src",
];

/// Every module file under `root`, by its module path.
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut m: Module = rel
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                m.pop();
            }
            // A file of tests is a test module.
            if m.last().is_some_and(|l| l == "tests") {
                continue;
            }
            out.insert(m, path);
        }
    }
    out
}

/// The source without comments and without its test module.
fn product_text(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reads identifiers and punctuation of a path from `s` at `i`.
struct Scanner<'a> {
    s: &'a [u8],
    i: usize,
}

impl Scanner<'_> {
    fn skip_space(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, t: &str) -> bool {
        self.skip_space();
        if self.s[self.i..].starts_with(t.as_bytes()) {
            self.i += t.len();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<String> {
        self.skip_space();
        let start = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
        {
            self.i += 1;
        }
        (self.i > start).then(|| String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    /// The paths that `prefix` continues into here: `a::b`, `a::{b, c::{d, e}}`, `self`, `*`.
    fn paths(&mut self, prefix: Module, out: &mut Vec<Module>) {
        let mut path = prefix;
        loop {
            if self.eat("{") {
                loop {
                    if self.eat("}") {
                        return;
                    }
                    self.paths(path.clone(), out);
                    self.eat(",");
                    if self.i >= self.s.len() {
                        return;
                    }
                }
            }
            if self.eat("*") {
                out.push(path);
                return;
            }
            match self.ident() {
                Some(id) if id == "self" => {}
                Some(id) => path.push(id),
                None => {
                    out.push(path);
                    return;
                }
            }
            if !self.eat("::") {
                out.push(path);
                return;
            }
        }
    }
}

/// The paths `text` (the module `m`'s product source) names, each from the crate's root.
fn named_paths(m: &Module, text: &str) -> Vec<Module> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(start) {
            let i = from + at;
            from = i + start.len();
            let boundary = i == 0
                || !(bytes[i - 1].is_ascii_alphanumeric()
                    || bytes[i - 1] == b'_'
                    || bytes[i - 1] == b':');
            if !boundary {
                continue;
            }
            // Where the path starts from: the root, this module, or its parent (a file's
            // module is its file; `super` of `a/b.rs` and of `a/b/mod.rs` is `a`).
            let mut base: Module = match start {
                "crate::" => Vec::new(),
                "self::" => m.clone(),
                _ => m[..m.len().saturating_sub(1)].to_vec(),
            };
            let mut sc = Scanner { s: bytes, i: from };
            // `super::super::…`
            while sc.eat("super::") {
                base.pop();
            }
            let mut found = Vec::new();
            sc.paths(base, &mut found);
            out.extend(found);
        }
    }
    out
}

/// The longest module `path` starts with.
fn resolve(mods: &BTreeMap<Module, PathBuf>, path: &Module) -> Module {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| mods.contains_key(p))
        .unwrap_or_default()
}

/// Each module's arrows: the other modules (not the crate's root) it names.
fn graph(root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mods = modules(root);
    let mut edges = BTreeMap::new();
    for (m, file) in &mods {
        let text = product_text(&std::fs::read_to_string(file).unwrap());
        let to: BTreeSet<Module> = named_paths(m, &text)
            .iter()
            .map(|p| resolve(&mods, p))
            .filter(|t| !t.is_empty() && t != m)
            .collect();
        edges.insert(m.clone(), to);
    }
    edges
}

/// The circles: each set of two or more modules that reach each other (Tarjan's strongly
/// connected components).
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let Some((w, _)) = self.edges.get_key_value(w) else {
                    continue;
                };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[v].min(self.low[w]);
                    self.low.insert(v, l);
                } else if self.on.contains(w) {
                    let l = self.low[v].min(self.index[w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.out
}

/// The arrows between top-level modules: each module with every module under it, the arrows
/// within one left out.
fn top_level(edges: &BTreeMap<Module, BTreeSet<Module>>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut out: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, to) in edges {
        let top = m[..1.min(m.len())].to_vec();
        let arrows = out.entry(top.clone()).or_default();
        arrows.extend(to.iter().map(|t| t[..1].to_vec()).filter(|t| *t != top));
    }
    out
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_crate_has_a_module_import_circle() {
    let found = every_crates_circles(|edges| edges);
    assert!(
        found.is_empty(),
        "module import circles:\n{}",
        found.join("\n")
    );
}

/// Every crate's circles in the graph `of` makes from its modules' graph, named.
fn every_crates_circles(
    of: impl Fn(BTreeMap<Module, BTreeSet<Module>>) -> BTreeMap<Module, BTreeSet<Module>>,
) -> Vec<String> {
    let mut found = Vec::new();
    for krate in CRATES {
        let edges = graph(&workspace().join(krate));
        assert!(edges.len() > 3, "{krate}: its modules were not found");
        for c in circles(&of(edges)) {
            let names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
            found.push(format!("{krate}: {}", names.join(" ↔ ")));
        }
    }
    found
}

#[test]
fn no_crate_has_an_arrow_back_up_between_its_top_level_modules() {
    let found = every_crates_circles(|edges| top_level(&edges));
    assert!(
        found.is_empty(),
        "top-level modules that reach each other:\n{}",
        found.join("\n")
    );
}

/// The check finds a circle when there is one: through a `use` group, a `super::` path and a
/// path written in place, and not through a test module or a comment.
#[test]
fn the_check_finds_a_planted_circle_and_nothing_else() {
    let dir = std::env::temp_dir().join(format!("combd-modules-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    let write = |p: &str, t: &str| std::fs::write(dir.join(p), t).unwrap();
    write("lib.rs", "mod a;\nmod c;\nmod d;\n");
    write("a/mod.rs", "mod b;\nuse crate::{d::{X, Y}, c};\n");
    write("a/b.rs", "fn f() { super::super::c::g(); }\n");
    // c names a::b in place, which names c: a circle.
    write("c.rs", "pub fn g() { crate::a::b::h(); }\n");
    // d names c only in a comment and in its tests.
    write(
        "d.rs",
        "// crate::c::g()\npub struct X;\npub struct Y;\n#[cfg(test)]\nmod tests {\n    use crate::c;\n}\n",
    );
    let edges = graph(&dir);
    let key = |s: &str| -> Module { s.split("::").map(String::from).collect() };
    assert_eq!(edges[&key("a")], [key("c"), key("d")].into_iter().collect());
    assert!(edges[&key("d")].is_empty(), "{:?}", edges[&key("d")]);
    assert_eq!(circles(&edges), vec![vec![key("a::b"), key("c")]]);
    assert_eq!(circles(&top_level(&edges)), vec![vec![key("a"), key("c")]]);
    // Without a::b's arrow to c, no circle of files remains, but a and c still reach each
    // other as top-level modules (a names c, c names a::b).
    write("a/b.rs", "fn f() {}\n");
    let edges = graph(&dir);
    assert!(circles(&edges).is_empty());
    assert_eq!(circles(&top_level(&edges)), vec![vec![key("a"), key("c")]]);
    let _ = std::fs::remove_dir_all(&dir);
}
