//! A crate's modules as its files declare them, and where a path from its root leads: to the
//! file that defines the item, through the `use` declarations (`pub use` re-exports included)
//! that stand for it on the way.

use std::collections::BTreeMap;
use std::path::Path;

use crate::lengths::{relative, rust_files};
use crate::read::{Declarations, Reading, read};

/// One file of a crate.
pub(crate) struct File {
    /// Its path from the workspace's root, `/` between its parts.
    pub(crate) shown: String,
    /// Its module path: `src/store/recovery.rs` is `store::recovery`, the root's is empty.
    pub(crate) module: Vec<String>,
    pub(crate) reading: Reading,
    /// Compiled for tests only (`#[cfg(test)] mod name;` declared it, or one of its parents).
    pub(crate) test: bool,
}

/// Where a path leads.
#[derive(Debug, PartialEq)]
pub(crate) enum Found {
    /// An item the file defines.
    Item,
    /// The module the file is.
    Module,
    /// A name the reading does not know (a macro's output, another crate's name through a
    /// `use`): the file of the deepest module the path reached is the best that is known.
    Unknown,
}

/// A crate: its files, and each module (inline ones too) with the file it is written in.
pub(crate) struct Crate {
    pub(crate) files: Vec<File>,
    scopes: BTreeMap<Vec<String>, (usize, Declarations)>,
}

/// More `use` hops than any real chain of re-exports has: past it, a path is taken as unknown
/// rather than followed around a loop of globs.
const MOST_HOPS: usize = 16;

impl Crate {
    /// The library crate under `src` (its `main.rs`, a crate of its own that imports the library
    /// by name, left out when a `lib.rs` is there), or the binary one when only `main.rs` is;
    /// `src/bin/` holds crates of their own and is left out too.
    pub(crate) fn read(root: &Path, src: &Path) -> Crate {
        let has_lib = src.join("lib.rs").is_file();
        let mut files = Vec::new();
        for file in rust_files(src) {
            let relative_path = file.strip_prefix(src).unwrap();
            let mut module: Vec<String> = relative_path
                .with_extension("")
                .components()
                .map(|part| part.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module[0] == "bin" || (has_lib && module == ["main"]) {
                continue;
            }
            if module == ["lib"] || module == ["main"] {
                module.clear();
            } else if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let reading = read(&text, &module);
            files.push(File {
                shown: relative(root, &file),
                module,
                reading,
                test: false,
            });
        }
        let mut scopes = BTreeMap::new();
        for (index, file) in files.iter_mut().enumerate() {
            for (module, declarations) in std::mem::take(&mut file.reading.scopes) {
                scopes.insert(module, (index, declarations));
            }
        }
        let mut krate = Crate { files, scopes };
        let test: Vec<bool> = krate
            .files
            .iter()
            .map(|file| krate.tests_only(&file.module))
            .collect();
        for (file, test) in krate.files.iter_mut().zip(test) {
            file.test = test;
        }
        krate
    }

    fn tests_only(&self, module: &[String]) -> bool {
        (1..=module.len()).any(|length| {
            self.scopes
                .get(&module[..length - 1])
                .is_some_and(|(_, parent)| parent.test_modules.contains(&module[length - 1]))
        })
    }

    /// The file `path` (from the root) leads to, and what it is there. A segment is a child
    /// module, an item the module defines (what follows is a field, a variant or an associated
    /// item of it), or a name one of its `use` declarations binds, which is followed to where it
    /// leads; a glob import is tried last, as the compiler does.
    pub(crate) fn locate(&self, path: &[String]) -> Option<(&File, Found)> {
        let (index, found) = self.locate_from(path, 0)?;
        Some((&self.files[index], found))
    }

    fn locate_from(&self, path: &[String], hops: usize) -> Option<(usize, Found)> {
        if hops > MOST_HOPS {
            return None;
        }
        let mut module: Vec<String> = Vec::new();
        for (at, segment) in path.iter().enumerate() {
            let (file, declarations) = self.scopes.get(&module)?;
            let mut child = module.clone();
            child.push(segment.clone());
            if self.scopes.contains_key(&child) {
                module = child;
                continue;
            }
            if declarations.items.contains(segment) {
                return Some((*file, Found::Item));
            }
            if let Some(target) = declarations.uses.get(segment) {
                let mut next = target.clone();
                next.extend(path[at + 1..].iter().cloned());
                // `use foo::bar` of another crate's `foo` stands for `module::foo::bar`, which
                // leads back here: the name is unknown, not a loop to follow.
                if next != path {
                    if let Some(found) = self.locate_from(&next, hops + 1) {
                        return Some(found);
                    }
                }
            }
            for glob in &declarations.globs {
                let mut next = glob.clone();
                next.extend(path[at..].iter().cloned());
                if let Some(found @ (_, Found::Item)) = self.locate_from(&next, hops + 1) {
                    return Some(found);
                }
            }
            return Some((*file, Found::Unknown));
        }
        self.scopes
            .get(&module)
            .map(|(file, _)| (*file, Found::Module))
    }
}
