//! The checker itself, on trees and texts of its own: it finds what it should, and fails.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::graph::Graph;
use crate::lengths::check_lengths;
use crate::read::references;

/// A directory of its own under the system's temporary directory, removed when dropped.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str, files: &[(&str, &str)]) -> Tree {
        let root =
            std::env::temp_dir().join(format!("idempay-layers-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        Tree(root)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Four layers, `config` under `store` under `payments`, and `web` over all; `store` reaches back
/// up to `web` through a path in code, and `payments` to `web` through a nested `use` tree, which
/// closes two cycles; `config`'s doc link up to `web` closes none, a doc link being no import. A
/// crate under `crates/` has a cycle of its own.
fn layered_tree(name: &str) -> Tree {
    Tree::new(
        name,
        &[
            (
                "src/lib.rs",
                "pub mod config; pub mod payments; pub mod store; pub mod web;",
            ),
            ("src/main.rs", "use crate::web::serve;"),
            (
                "src/config.rs",
                "/// Read by [`crate::web::serve`].\npub struct Settings;\n// crate::web::Nothing: a comment only\n",
            ),
            (
                "src/store.rs",
                "mod pool;\nuse crate::config::Settings;\n/// Called by [`crate::web::serve`].\npub fn open() { crate::web::serve(); }\n",
            ),
            (
                "src/store/pool.rs",
                "use super::super::config::Settings;\npub fn pool() { let _ = \"crate::web\"; }\n",
            ),
            (
                "src/payments/mod.rs",
                "pub mod charging;\nuse crate::{store::{self, open}, web::{AppState, extract::{Json, Query}}};\n\
                 use self::charging::charge;\n#[cfg(test)]\nmod tests { use super::*; }\n",
            ),
            (
                "src/payments/charging.rs",
                "pub fn charge() { super::super::store::open(); super::charge_more(); }\n",
            ),
            (
                "src/web/mod.rs",
                "pub mod extract;\npub struct AppState;\npub fn serve() { crate::payments::charging::charge(); }\n",
            ),
            (
                "src/web/extract.rs",
                "use crate::config::Settings as S;\npub struct Json; pub struct Query;\n",
            ),
            ("crates/other/src/lib.rs", "pub mod a; pub mod b;"),
            ("crates/other/src/a.rs", "use crate::b::B; pub struct A;"),
            ("crates/other/src/b.rs", "pub struct B(crate::a::A);"),
        ],
    )
}

fn edges_of(graph: &Graph) -> Vec<String> {
    graph
        .edges
        .keys()
        .map(|(from, to)| format!("{from} -> {to}"))
        .collect()
}

#[test]
fn the_graph_of_a_tree_has_its_edges_from_use_trees_and_paths_but_not_doc_links() {
    let tree = layered_tree("edges");
    let graph = Graph::of(&tree.0);
    assert_eq!(
        edges_of(&graph),
        [
            "crates/other:a -> crates/other:b",
            "crates/other:b -> crates/other:a",
            "payments -> store",
            "payments -> web",
            "store -> config",
            "store -> web",
            "web -> config",
            "web -> payments",
        ]
    );
    let names = |from: &str, to: &str, file: &str| -> Vec<String> {
        graph.edges[&(from.to_owned(), to.to_owned())][file]
            .keys()
            .cloned()
            .collect()
    };
    let expected: [(&str, &str, &str, &[&str]); 6] = [
        (
            "payments",
            "web",
            "src/payments/mod.rs",
            &["web::AppState", "web::extract::Json", "web::extract::Query"],
        ),
        // `store::{self}` binds a name: the path through it is the import.
        ("payments", "store", "src/payments/mod.rs", &["store::open"]),
        (
            "payments",
            "store",
            "src/payments/charging.rs",
            &["store::open"],
        ),
        ("store", "web", "src/store.rs", &["web::serve"]),
        (
            "store",
            "config",
            "src/store/pool.rs",
            &["config::Settings"],
        ),
        ("web", "config", "src/web/extract.rs", &["config::Settings"]),
    ];
    for (from, to, file, imported) in expected {
        assert_eq!(names(from, to, file), imported, "{from} -> {to} in {file}");
    }
}

#[test]
fn the_checker_fails_on_a_cycle_naming_each_edge_s_files_and_names() {
    let tree = layered_tree("cycle");
    let graph = Graph::of(&tree.0);
    let failures = graph.check(&[]);
    let report = failures.join("\n\n");
    assert_eq!(failures.len(), 3, "{report}");
    assert!(
        report.contains("  payments -> web -> payments\n"),
        "{report}"
    );
    assert!(
        report.contains("  payments -> store -> web -> payments\n"),
        "{report}"
    );
    assert!(
        report.contains("    src/store.rs: web::serve (line 4)\n"),
        "{report}"
    );
    assert!(
        report.contains(
            "    src/payments/mod.rs: web::AppState (line 2), web::extract::Json (line 2), \
             web::extract::Query (line 2)\n"
        ),
        "{report}"
    );
    assert!(
        report.contains("  crates/other:a -> crates/other:b -> crates/other:a\n"),
        "{report}"
    );
}

#[test]
fn listed_back_edges_pass_and_a_stale_entry_fails() {
    let tree = layered_tree("ratchet");
    let graph = Graph::of(&tree.0);
    let back_edges = [
        ("payments", "web"),
        ("store", "web"),
        ("crates/other:b", "crates/other:a"),
    ];
    assert_eq!(graph.check(&back_edges), Vec::<String>::new());
    let mut gone = back_edges.to_vec();
    gone.push(("config", "web"));
    assert_eq!(
        graph.check(&gone),
        ["the listed back edge config -> web is gone from the code: remove it from BACK_EDGES"]
    );
    let mut acyclic = back_edges.to_vec();
    acyclic.push(("store", "config"));
    assert_eq!(
        graph.check(&acyclic),
        [
            "the listed back edge store -> config closes no cycle the other listed edges leave: \
             remove it from BACK_EDGES"
        ]
    );
}

#[test]
fn strings_comments_and_lifetimes_hide_no_path_and_invent_none() {
    let text = r##"
        fn f<'a>(x: &'a str) -> char { let _ = r#"crate::hidden"#; let _ = b"crate::hidden"; 'c' }
        // crate::hidden
        /* crate::hidden /* nested */ crate::hidden */
        fn g() -> char { '\'' }
        //! see [`crate::docs::Shown`] and super::up::Shown
        pub(crate) fn h() { let r#type = crate::code::Shown; crate::macros::shown!(); }
        pub(super) fn i() {}
        use crate::a::{b::{c, d as e}, f::*, self as g};
        impl Trait for X where Y: Z + use<'a> {}
    "##;
    let module = vec!["m".to_owned(), "n".to_owned()];
    let found: Vec<String> = references(text, &module)
        .into_iter()
        .filter(|reference| reference.anchored)
        .map(|reference| format!("{}:{}", reference.path.join("::"), reference.line))
        .collect();
    assert_eq!(
        found,
        [
            "docs::Shown:6",
            "m::up::Shown:6",
            "code::Shown:7",
            "macros::shown:7",
            "a::b::c:9",
            "a::b::d:9",
            "a::f:9",
            "a:9",
        ]
    );
}

/// A crate like the mechanism's: the root re-exports `recovery`'s items, `store/recovery.rs` uses
/// them through the root, and `store.rs` hands on what its child defines. With `closed`,
/// `lease.rs` imports `recovery.rs`'s `EarlierCalls` through the root's `pub use` while
/// `recovery.rs` imports `lease.rs`'s `HeldLease`, and `store/recovery.rs` uses its parent's
/// `Store` in code while the parent uses the child's `Resume`: two cycles. Without it the same
/// names stand only where no import is made: a doc link, a test, a `pub use` no code of its file
/// names.
fn files_tree(name: &str, closed: bool) -> Tree {
    let (lease, child) = if closed {
        (
            "use crate::{EarlierCalls as Calls};\npub struct HeldLease;\nfn f(_: Calls) {}\n",
            "use crate::RecoveryPoint;\npub struct Resume(RecoveryPoint);\n\
             fn g() { let _ = super::Store; }\n",
        )
    } else {
        (
            "/// Held while [`crate::EarlierCalls`] are read.\npub struct HeldLease;\n",
            "use crate::RecoveryPoint;\n/// Resumed by [`super::Store`].\n\
             pub struct Resume(RecoveryPoint);\n",
        )
    };
    Tree::new(
        name,
        &[
            (
                "crates/mechanism/src/lib.rs",
                "mod lease;\nmod recovery;\nmod store;\npub use recovery::{EarlierCalls, RecoveryPoint};\n\
                 pub use store::{Resume, Store};\n",
            ),
            (
                "crates/mechanism/src/recovery.rs",
                "use super::lease::HeldLease;\npub struct RecoveryPoint(HeldLease);\n\
                 pub struct EarlierCalls;\n#[cfg(test)]\nmod tests {\n    use crate::store::Store;\n}\n",
            ),
            ("crates/mechanism/src/lease.rs", lease),
            (
                "crates/mechanism/src/store.rs",
                "mod recovery;\n#[cfg(test)]\nmod tests;\npub use self::recovery::Resume;\n\
                 pub struct Store;\npub fn resume() -> Option<Resume> { None }\n",
            ),
            ("crates/mechanism/src/store/recovery.rs", child),
            (
                "crates/mechanism/src/store/tests.rs",
                "use crate::lease::HeldLease;\nuse super::Store;\n",
            ),
        ],
    )
}

#[test]
fn the_file_graph_finds_a_cycle_through_the_root_s_pub_use_and_one_between_parent_and_child() {
    let tree = files_tree("file-cycle", true);
    let graph = Graph::of_files(&tree.0);
    let failures = graph.check(&[]);
    let report = failures.join("\n\n");
    assert_eq!(failures.len(), 2, "{report}");
    let src = "crates/mechanism/src";
    assert!(
        report.contains(&format!(
            "  {src}/lease.rs -> {src}/recovery.rs -> {src}/lease.rs\n\
             \x20 {src}/lease.rs -> {src}/recovery.rs: EarlierCalls (line 1)\n\
             \x20 {src}/recovery.rs -> {src}/lease.rs: lease::HeldLease (line 1)\n"
        )),
        "{report}"
    );
    assert!(
        report.contains(&format!(
            "  {src}/store.rs -> {src}/store/recovery.rs -> {src}/store.rs\n\
             \x20 {src}/store.rs -> {src}/store/recovery.rs: store::recovery::Resume (line 4)\n\
             \x20 {src}/store/recovery.rs -> {src}/store.rs: store::Store (line 3)\n"
        )),
        "{report}"
    );
    // Listed, the two edges that close them let the check pass.
    let listed = [
        (
            "crates/mechanism/src/lease.rs",
            "crates/mechanism/src/recovery.rs",
        ),
        (
            "crates/mechanism/src/store/recovery.rs",
            "crates/mechanism/src/store.rs",
        ),
    ];
    assert_eq!(graph.check(&listed), Vec::<String>::new());
}

#[test]
fn the_file_graph_of_a_crate_without_a_cycle_passes_with_its_edges_found() {
    let tree = files_tree("file-acyclic", false);
    let graph = Graph::of_files(&tree.0);
    assert_eq!(
        edges_of(&graph),
        [
            "crates/mechanism/src/recovery.rs -> crates/mechanism/src/lease.rs",
            "crates/mechanism/src/store.rs -> crates/mechanism/src/store/recovery.rs",
            "crates/mechanism/src/store/recovery.rs -> crates/mechanism/src/recovery.rs",
        ]
    );
    assert_eq!(graph.check(&[]), Vec::<String>::new());
}

#[test]
fn a_module_a_use_binds_leads_through_the_path_named_and_tests_and_unused_reexports_import_nothing()
{
    let tree = Tree::new(
        "file-paths",
        &[
            (
                "crates/m/src/lib.rs",
                "mod a; mod b; mod c;\npub use a::inner::A;\nuse c::C;\npub fn root() -> C { C }\n",
            ),
            ("crates/m/src/a.rs", "pub mod inner;\npub struct Outer;\n"),
            ("crates/m/src/a/inner.rs", "pub struct A;\n"),
            (
                "crates/m/src/b.rs",
                "use crate::a;\npub fn f() -> a::inner::A { a::inner::A }\n\
                 #[cfg(test)]\nfn helper() { let _ = crate::c::C; }\n",
            ),
            ("crates/m/src/c.rs", "pub struct C;\n"),
        ],
    );
    let graph = Graph::of_files(&tree.0);
    // `b.rs` names `a/inner.rs`'s `A` through the module `a` it binds, not `a.rs`; its test helper
    // names `c.rs` and counts for nothing; the root's `use c::C` is an import of its own, its
    // `pub use` of `A`, which its code does not name, is not.
    assert_eq!(
        edges_of(&graph),
        [
            "crates/m/src/b.rs -> crates/m/src/a/inner.rs",
            "crates/m/src/lib.rs -> crates/m/src/c.rs",
        ]
    );
}

#[test]
fn file_lengths_are_held_by_the_limit_and_the_listed_ceilings() {
    let lengths: BTreeMap<String, usize> = [
        ("src/short.rs", 10),
        ("src/long.rs", 900),
        ("src/listed.rs", 850),
        ("src/grown.rs", 870),
        ("src/shrunk.rs", 700),
        ("src/lowered.rs", 820),
    ]
    .into_iter()
    .map(|(file, lines)| (file.to_owned(), lines))
    .collect();
    let listed = [
        ("src/listed.rs", 850),
        ("src/grown.rs", 860),
        ("src/shrunk.rs", 810),
        ("src/lowered.rs", 830),
        ("src/gone.rs", 900),
    ];
    assert_eq!(
        check_lengths(&lengths, &listed),
        [
            "src/grown.rs has 870 lines, more than the 860 LONG_FILES allows it: it may only shrink",
            "src/long.rs has 900 lines, over 800: split it by theme",
            "src/gone.rs is listed in LONG_FILES but is gone: remove it",
            "src/shrunk.rs has 700 lines now, within 800: remove it from LONG_FILES",
        ]
    );
}
