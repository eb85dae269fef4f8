//! tests/README.md maps every claim to the tests that prove it, by name: a name that resolves to
//! no test is a claim proven by nothing. This reads the map and resolves each name it cites.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use idempay_test_macros::api_test;

/// Where `*(unit)*` starts the unit tests of a "proven by" cell: the names before it are
/// black-box tests of this suite, those after it unit tests in `src/` or in a crate of `crates/`.
const UNIT_MARK: &str = "*(unit)*";

#[api_test]
async fn every_test_the_readme_names_is_a_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let map = std::fs::read_to_string(root.join("tests/README.md")).expect("tests/README.md");
    let cited = cited_names(&map);
    let api_tests = test_functions(&root.join("tests/api"), &["#[api_test"]);
    // The service's unit tests, and those of the crates beside it (the client's).
    let unit_tests: BTreeSet<String> = ["src", "crates"]
        .into_iter()
        .flat_map(|dir| {
            test_functions(
                &root.join(dir),
                &["#[test]", "#[tokio::test", "#[sqlx::test"],
            )
        })
        .collect();

    let cited_unit = cited.iter().filter(|name| name.unit).count();
    eprintln!(
        "test map: {} names cited ({cited_unit} unit), {} black-box tests and {} unit tests found",
        cited.len(),
        api_tests.len(),
        unit_tests.len()
    );
    // A reader that found nothing would pass whatever the map says.
    assert!(
        cited.len() - cited_unit > 200 && cited_unit > 50,
        "the map's names were not found"
    );
    assert!(
        api_tests.len() > 200 && unit_tests.len() > 100,
        "the tests were not found"
    );
    let unresolved: Vec<String> = cited
        .iter()
        .filter(|name| {
            let tests = if name.unit { &unit_tests } else { &api_tests };
            !tests.contains(&name.name)
        })
        .map(|name| {
            let (kind, other, others) = if name.unit {
                (
                    "unit test in src/ or crates/",
                    "a black-box test",
                    &api_tests,
                )
            } else {
                ("#[api_test] in tests/api/", "a unit test", &unit_tests)
            };
            let hint = if others.contains(&name.name) {
                format!(" (it is {other}: cite it on the other side of {UNIT_MARK})")
            } else {
                String::new()
            };
            format!("line {}: `{}` is no {kind}{hint}", name.line, name.name)
        })
        .collect();
    assert!(
        unresolved.is_empty(),
        "tests/README.md cites {} names that resolve to no test:\n{}",
        unresolved.len(),
        unresolved.join("\n")
    );
}

/// A test name the map cites, where, and on which side of [`UNIT_MARK`].
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cited {
    name: String,
    line: usize,
    unit: bool,
}

/// The backticked snake_case names in the last cell of every row of a table whose last column is
/// "proven by".
fn cited_names(map: &str) -> BTreeSet<Cited> {
    let mut cited = BTreeSet::new();
    let mut proving_table = false;
    let mut previous_was_row = false;
    for (index, line) in map.lines().enumerate() {
        let line = line.trim();
        let is_row = line.starts_with('|');
        if !is_row {
            previous_was_row = false;
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let last = cells.last().copied().unwrap_or_default();
        if !previous_was_row {
            // A table's first row is its header.
            proving_table = last == "proven by";
            previous_was_row = true;
            continue;
        }
        if !proving_table || last.starts_with("---") {
            continue;
        }
        let (black_box, unit) = last.split_once(UNIT_MARK).unwrap_or((last, ""));
        for (part, is_unit) in [(black_box, false), (unit, true)] {
            for name in backticked(part) {
                cited.insert(Cited {
                    name,
                    line: index + 1,
                    unit: is_unit,
                });
            }
        }
    }
    cited
}

/// The `snake_case` names between backticks in `text`: a test's name, not a command or a path.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| {
            word.contains('_')
                && word.starts_with(|c: char| c.is_ascii_lowercase())
                && word
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_owned)
        .collect()
}

/// The names of the functions under one of `attributes` in the `.rs` files under `dir`: the
/// first `fn` after the attribute (past doc comments and other attributes).
fn test_functions(dir: &Path, attributes: &[&str]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for file in rust_files(dir) {
        let source = std::fs::read_to_string(&file).expect("a source file");
        let mut marked = false;
        for line in source.lines().map(str::trim) {
            if attributes
                .iter()
                .any(|attribute| line.starts_with(attribute))
            {
                marked = true;
            }
            if !marked {
                continue;
            }
            if let Some(name) = function_name(line) {
                names.insert(name);
                marked = false;
            }
        }
    }
    names
}

/// The name of the function a line declares, if it declares one.
fn function_name(line: &str) -> Option<String> {
    let (_, after) = line.split_once("fn ")?;
    if !line.starts_with("fn ") && !line.contains(" fn ") {
        return None;
    }
    let name: String = after
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                files.push(path);
            }
        }
    }
    files
}
