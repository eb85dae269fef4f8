//! The lines of every source file, and the ratchet on the long ones.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::MAX_LINES;

/// Every `.rs` file of `src/`, `tests/` and `crates/*/src/` under `root`, with its lines.
pub(crate) fn file_lengths(root: &Path) -> BTreeMap<String, usize> {
    let mut dirs = vec![root.join("src"), root.join("tests")];
    if let Ok(entries) = std::fs::read_dir(root.join("crates")) {
        dirs.extend(entries.map(|entry| entry.unwrap().path().join("src")));
    }
    let mut lengths = BTreeMap::new();
    for dir in dirs {
        for file in rust_files(&dir) {
            let text = std::fs::read_to_string(&file).unwrap();
            lengths.insert(relative(root, &file), text.lines().count());
        }
    }
    lengths
}

pub(crate) fn check_lengths(
    lengths: &BTreeMap<String, usize>,
    long_files: &[(&str, usize)],
) -> Vec<String> {
    let mut failures = Vec::new();
    let listed: BTreeMap<&str, usize> = long_files.iter().copied().collect();
    for (file, &lines) in lengths {
        match listed.get(file.as_str()) {
            None if lines > MAX_LINES => failures.push(format!(
                "{file} has {lines} lines, over {MAX_LINES}: split it by theme"
            )),
            Some(&most) if lines > most => failures.push(format!(
                "{file} has {lines} lines, more than the {most} LONG_FILES allows it: it may only shrink"
            )),
            _ => {}
        }
    }
    for &file in listed.keys() {
        match lengths.get(file) {
            None => failures.push(format!(
                "{file} is listed in LONG_FILES but is gone: remove it"
            )),
            Some(&lines) if lines <= MAX_LINES => failures.push(format!(
                "{file} has {lines} lines now, within {MAX_LINES}: remove it from LONG_FILES"
            )),
            _ => {}
        }
    }
    failures
}

/// Every `.rs` file under `dir`, sorted; hidden directories and `target` left out.
pub(crate) fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                files.extend(rust_files(&path));
            }
        } else if name.ends_with(".rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// `file` relative to `root`, with `/` between its parts.
pub(crate) fn relative(root: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(root).unwrap_or(file);
    relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}
