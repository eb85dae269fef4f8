//! The layers the compiler holds: the top-level modules of each crate (`payments`, `http`,
//! `webhooks`…; a file directly in `src/`, like `config.rs`, is one too) must not import each other
//! in a cycle, nor may the files of a crate, within one module or across; and no `.rs` file under
//! `src/`, `tests/` or `crates/*/src/` may run over [`MAX_LINES`] lines; and idempay's domains read
//! the processor's types through `downstream` only ([`NAME_THE_PROCESSOR`]); and `src/lib.rs`'s
//! doc comment names each of its modules, each crate's README.md each of its (`maps`). `cargo test
//! --test layers` runs it: no database, a second or so.
//!
//! The sources are read as text: each file is mapped to its module path (`src/payments/mod.rs` is
//! `payments`, `crates/idempotency/src/store/recovery.rs` is `store::recovery`), with the items it
//! defines and the names its `use` declarations bind; every path it names (in `use` trees, braces
//! nested or not, and in code) is followed to the file that defines the item, through the `use`
//! and `pub use` declarations on the way, as the compiler resolves it: a `crate::RecoveryPoint`
//! the root re-exports leads to the file that defines `RecoveryPoint`, not to `lib.rs`. A file
//! imports the files its paths lead to (`graph::imports` says what counts); declaring a child
//! module is no import, a doc link is none (it compiles to nothing), and what only tests compile
//! (`#[cfg(test)]`) is left out: tests may import anything. The top-level graph is the file
//! graph's edges between top-level modules, `lib.rs` and `main.rs` left out (they assemble
//! everything); the file graph keeps them, since an item they define is imported like any other.
//!
//! The checks are ratchets, for the refactor that takes today's cycles apart: [`BACK_EDGES`] and
//! [`FILE_BACK_EDGES`] list the edges that still close a cycle, and [`LONG_FILES`] the files still
//! over the limit, each with its length today. A cycle through any other edge fails, and so does a
//! listed file that grows; an entry that is no longer needed fails too (its edge is gone, or closes
//! no cycle the others leave; its file is within the limit), until it is removed. The lists can
//! only shrink.

use std::path::Path;

mod checker;
mod graph;
mod lengths;
mod maps;
mod modules;
mod read;

use graph::Graph;
use lengths::{check_lengths, file_lengths};

/// The most lines a `.rs` file may have.
const MAX_LINES: usize = 800;

/// The top-level edges allowed to close a cycle, `(from, to)`, each with the sentence that says why.
/// None is: the import graph of every crate is acyclic, and a new cycle fails with its files and
/// names. A module of a crate under `crates/` is named `crates/NAME:module`.
const BACK_EDGES: &[(&str, &str)] = &[];

/// The file edges allowed to close a cycle, `(from, to)` by path from the workspace's root, each
/// with the sentence that says why. None is: within a crate no file imports another that imports
/// it back, directly or through others.
const FILE_BACK_EDGES: &[(&str, &str)] = &[];

/// The files over [`MAX_LINES`] today, with the lines they have: none may grow, and an entry goes
/// once its file is short enough.
const LONG_FILES: &[(&str, usize)] = &[];

#[test]
fn the_top_level_modules_import_each_other_in_no_cycle_but_through_the_listed_back_edges() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let graph = Graph::of(root);
    // A reader that found nothing would pass whatever the code does.
    assert!(
        graph.edges.len() > 20,
        "only {} top-level edges found: the sources were not read",
        graph.edges.len()
    );
    println!("{}", graph.summary());
    println!("{}", graph.cycles_closed_by(BACK_EDGES));
    let failures = graph.check(BACK_EDGES);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_files_of_each_crate_import_each_other_in_no_cycle_but_through_the_listed_back_edges() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let graph = Graph::of_files(root);
    // A reader that found nothing would pass whatever the code does.
    assert!(
        graph.edges.len() > 200,
        "only {} file edges found: the sources were not read",
        graph.edges.len()
    );
    println!("{}", graph.cycles_closed_by(FILE_BACK_EDGES));
    let failures = graph.check(FILE_BACK_EDGES);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn no_source_file_is_over_800_lines_but_the_listed_ones_and_none_of_those_grows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lengths = file_lengths(root);
    assert!(lengths.len() > 100, "the sources were not found");
    let failures = check_lengths(&lengths, LONG_FILES);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Where idempay may name the processor's crate: the module that talks to it (`downstream`, which
/// re-exports its wire types for the domains) and the wiring that embeds or starts it.
const NAME_THE_PROCESSOR: &[&str] = &[
    "src/downstream/",
    "src/app.rs",
    "src/cli.rs",
    "src/config.rs",
    "src/dev/",
];

#[test]
fn idempay_s_domains_read_the_processor_only_through_downstream() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lengths = file_lengths(root);
    let mut read = 0;
    let mut naming = Vec::new();
    for file in lengths.keys().filter(|file| file.starts_with("src/")) {
        read += 1;
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            // `processor::` at the start of a path: not `crate::downstream::processor::` nor a
            // name that ends in `processor`.
            let names_it = line.match_indices("processor::").any(|(at, _)| {
                !line[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            });
            if names_it
                && !NAME_THE_PROCESSOR
                    .iter()
                    .any(|place| file.starts_with(place))
            {
                naming.push(format!("{file}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(read > 50, "only {read} files of src/ were read");
    assert!(
        naming.is_empty(),
        "these name the processor's crate; read its types from crate::downstream:\n{}",
        naming.join("\n")
    );
}
