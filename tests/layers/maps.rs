//! The maps of the modules: `src/lib.rs`'s doc comment names each module the crate declares, and
//! each crate under `crates/` names its modules in its README.md, so that a reader who starts from
//! either finds every part.

use std::path::Path;

/// The modules a crate root declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`), outside those
/// only tests compile (`#[cfg(test)]` on the line before): inline modules (`mod x { … }`) are not
/// files of their own.
pub(crate) fn declared_modules(root: &str) -> Vec<String> {
    let mut modules = Vec::new();
    let mut test_only = false;
    for line in root.lines().map(str::trim) {
        if line.starts_with("#[") {
            test_only |= line == "#[cfg(test)]";
            continue;
        }
        let rest = line
            .strip_prefix("pub ")
            .or_else(|| line.strip_prefix("pub(crate) "))
            .unwrap_or(line);
        if let Some(name) = rest
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(';'))
        {
            if !test_only {
                modules.push(name.trim().to_owned());
            }
        }
        test_only = false;
    }
    modules
}

/// Whether `text` names the module `name` as the maps do: in backquotes (`` `x` ``, also as a doc
/// link), or as its file or folder (`x.rs`, `x/`), not as the end of a longer name.
pub(crate) fn mentions(text: &str, name: &str) -> bool {
    if text.contains(&format!("`{name}`")) {
        return true;
    }
    [format!("{name}.rs"), format!("{name}/")]
        .iter()
        .any(|form| {
            text.match_indices(form.as_str()).any(|(at, _)| {
                !text[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        })
}

/// The module doc comment of a crate root: its `//!` lines.
fn doc_comment(root: &str) -> String {
    root.lines()
        .filter_map(|line| line.trim_start().strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules of the crate root at `root_file` that `map` does not mention, each as `where: x`.
fn unmapped(root_file: &Path, map: &str, place: &str) -> Vec<String> {
    let root = std::fs::read_to_string(root_file).unwrap();
    declared_modules(&root)
        .into_iter()
        .filter(|name| !mentions(map, name))
        .map(|name| format!("{place}: `{name}`"))
        .collect()
}

#[test]
fn src_lib_s_map_names_every_module_and_each_crate_s_readme_its_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = root.join("src/lib.rs");
    let mut missing = unmapped(
        &lib,
        &doc_comment(&std::fs::read_to_string(&lib).unwrap()),
        "src/lib.rs's doc comment",
    );
    let mut crates: Vec<_> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    crates.sort();
    let mut read = 0;
    for dir in crates {
        let Some(root_file) = ["src/lib.rs", "src/main.rs"]
            .iter()
            .map(|file| dir.join(file))
            .find(|file| file.is_file())
        else {
            continue;
        };
        read += 1;
        let readme = dir.join("README.md");
        let map = std::fs::read_to_string(&readme).unwrap_or_default();
        let place = readme.strip_prefix(root).unwrap().display().to_string();
        missing.extend(unmapped(&root_file, &map, &place));
    }
    assert!(read >= 5, "only {read} crates under crates/ were read");
    assert!(
        missing.is_empty(),
        "modules their map does not name (as `x`, x.rs or x/):\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_module_is_declared_by_mod_and_mentioned_in_backquotes_or_as_its_file() {
    let root = "//! [`a`]\npub mod a;\nmod b;\npub(crate) mod c;\n#[cfg(test)]\nmod tests;\n\
                #[cfg(feature = \"dev\")]\npub mod dev;\nmod inline {}\n";
    assert_eq!(declared_modules(root), ["a", "b", "c", "dev"]);
    assert!(mentions("the [`a`] map", "a"));
    assert!(mentions("lives in b.rs and c/", "b") && mentions("lives in c/", "c"));
    assert!(!mentions("`ab` and sub.rs and xc/", "b"));
    assert!(!mentions("a dev tool", "dev"));
}
