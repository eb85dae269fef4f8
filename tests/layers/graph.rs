//! The import graphs of each crate, top-level modules' and files', and the ratchet on their
//! cycles.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::modules::{Crate, File, Found};
use crate::read::How;

/// What one file names of another node: each path as resolved, with its first line.
pub(crate) type Names = BTreeMap<String, usize>;

/// The edges of an import graph, each with the files that make it and what they name, and how
/// its nodes and its list of allowed edges are called in what it reports.
pub(crate) struct Graph {
    pub(crate) edges: BTreeMap<(String, String), BTreeMap<String, Names>>,
    nodes: &'static str,
    list: &'static str,
}

/// The root package's `src/` and every `crates/*/src/` under `root`, each with the prefix its
/// top-level modules are named with (a crate under `crates/` is `crates/NAME:`).
fn crates(root: &Path) -> Vec<(String, PathBuf)> {
    let mut crates = vec![(String::new(), root.join("src"))];
    if let Ok(entries) = std::fs::read_dir(root.join("crates")) {
        let mut dirs: Vec<PathBuf> = entries.map(|entry| entry.unwrap().path()).collect();
        dirs.sort();
        for dir in dirs {
            if dir.join("src").is_dir() {
                let name = dir.file_name().unwrap().to_string_lossy();
                crates.push((format!("crates/{name}:"), dir.join("src")));
            }
        }
    }
    crates
}

impl Graph {
    fn add(&mut self, from: String, to: String, file: &str, name: String, line: usize) {
        self.edges
            .entry((from, to))
            .or_default()
            .entry(file.to_owned())
            .or_default()
            .entry(name)
            .or_insert(line);
    }

    /// The top-level module graph of every crate under `root`: the layers. Its edges are the
    /// file graph's between files of different top-level modules; the crate's root assembles
    /// everything and is left out.
    pub(crate) fn of(root: &Path) -> Graph {
        let mut graph = Graph {
            edges: BTreeMap::new(),
            nodes: "top-level modules",
            list: "BACK_EDGES",
        };
        for (prefix, src) in crates(root) {
            let krate = Crate::read(root, &src);
            for (from, to, name, line) in imports(&krate) {
                let (from_module, to_module) = (&from.module, &to.module);
                if from_module.is_empty() || to_module.is_empty() || from_module[0] == to_module[0]
                {
                    continue;
                }
                graph.add(
                    format!("{prefix}{}", from_module[0]),
                    format!("{prefix}{}", to_module[0]),
                    &from.shown,
                    name,
                    line,
                );
            }
        }
        graph
    }

    /// The file graph of every crate under `root`, its root included: an item the root defines
    /// is imported like any other.
    pub(crate) fn of_files(root: &Path) -> Graph {
        let mut graph = Graph {
            edges: BTreeMap::new(),
            nodes: "files",
            list: "FILE_BACK_EDGES",
        };
        for (_, src) in crates(root) {
            let krate = Crate::read(root, &src);
            for (from, to, name, line) in imports(&krate) {
                graph.add(
                    from.shown.clone(),
                    to.shown.clone(),
                    &from.shown,
                    name,
                    line,
                );
            }
        }
        graph
    }

    fn successors(&self, skip: &BTreeSet<(String, String)>) -> BTreeMap<&str, Vec<&str>> {
        let mut successors: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (from, to) in self.edges.keys() {
            successors.entry(to).or_default();
            if !skip.contains(&(from.clone(), to.clone())) {
                successors.entry(from).or_default().push(to);
            }
        }
        successors
    }

    /// The shortest path from `from` to `to` over `successors`, both ends included.
    fn path<'a>(
        successors: &BTreeMap<&'a str, Vec<&'a str>>,
        from: &'a str,
        to: &'a str,
    ) -> Option<Vec<&'a str>> {
        let mut before: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([from]);
        while let Some(node) = queue.pop_front() {
            if node == to {
                let mut path = vec![to];
                while let Some(&previous) = before.get(path.last().unwrap()) {
                    path.push(previous);
                    if previous == from {
                        break;
                    }
                }
                path.reverse();
                return Some(path);
            }
            for &next in &successors[node] {
                if next != from && !before.contains_key(next) {
                    before.insert(next, node);
                    queue.push_back(next);
                }
            }
        }
        None
    }

    /// Every failure of the ratchet: a listed edge that is gone, or that closes no cycle the other
    /// listed edges leave (so the list stays the fewest edges that take today's cycles apart), and
    /// each cycle left once the listed edges are taken out, edge by edge with files and names.
    pub(crate) fn check(&self, back_edges: &[(&str, &str)]) -> Vec<String> {
        let mut failures = Vec::new();
        let listed: BTreeSet<(String, String)> = back_edges
            .iter()
            .map(|&(from, to)| (from.to_owned(), to.to_owned()))
            .collect();
        for (from, to) in &listed {
            let mut others = listed.clone();
            others.remove(&(from.clone(), to.clone()));
            if !self.edges.contains_key(&(from.clone(), to.clone())) {
                failures.push(format!(
                    "the listed back edge {from} -> {to} is gone from the code: remove it from {}",
                    self.list
                ));
            } else if Self::path(&self.successors(&others), to, from).is_none() {
                failures.push(format!(
                    "the listed back edge {from} -> {to} closes no cycle the other listed edges leave: \
                     remove it from {}",
                    self.list
                ));
            }
        }
        let rest = self.successors(&listed);
        let mut seen = BTreeSet::new();
        for (from, to) in self.edges.keys() {
            if listed.contains(&(from.clone(), to.clone())) {
                continue;
            }
            let Some(back) = Self::path(&rest, to, from) else {
                continue;
            };
            let mut cycle: Vec<&str> = vec![from];
            cycle.extend(back);
            // One report per cycle, whichever of its edges found it.
            let mut key = cycle[..cycle.len() - 1].to_vec();
            let first = (0..key.len()).min_by_key(|&at| key[at]).unwrap();
            key.rotate_left(first);
            if seen.insert(key) {
                failures.push(format!(
                    "a cycle among the {} (cut one of its edges, or, for a leak being cut \
                     elsewhere, list it in {}):\n{}",
                    self.nodes,
                    self.list,
                    self.describe(&cycle)
                ));
            }
        }
        failures
    }

    /// `cycle` (its first node repeated last), then each edge's files and names.
    fn describe(&self, cycle: &[&str]) -> String {
        let mut text = format!("  {}\n", cycle.join(" -> "));
        for pair in cycle.windows(2) {
            let files = &self.edges[&(pair[0].to_owned(), pair[1].to_owned())];
            let _ = write!(text, "  {} -> {}:", pair[0], pair[1]);
            for (file, names) in files {
                let names: Vec<String> = names
                    .iter()
                    .map(|(name, line)| format!("{name} (line {line})"))
                    .collect();
                // In the file graph the edge's only file is its first node.
                if file == pair[0] {
                    let _ = write!(text, " {}", names.join(", "));
                } else {
                    let _ = write!(text, "\n    {file}: {}", names.join(", "));
                }
            }
            text.push('\n');
        }
        text
    }

    /// Each listed edge with the shortest cycle it closes today.
    pub(crate) fn cycles_closed_by(&self, back_edges: &[(&str, &str)]) -> String {
        let all = self.successors(&BTreeSet::new());
        let mut text = format!("{} listed back edges:\n", back_edges.len());
        for &(from, to) in back_edges {
            // A listed edge that is gone closes nothing (`check` says to remove it).
            if !self.edges.contains_key(&(from.to_owned(), to.to_owned())) {
                continue;
            }
            if let Some(back) = Self::path(&all, to, from) {
                let mut cycle = vec![from];
                cycle.extend(back);
                text.push_str(&self.describe(&cycle));
            }
        }
        text
    }

    /// The edges, one line per node.
    pub(crate) fn summary(&self) -> String {
        let mut text = format!("{} edges among the {}:\n", self.edges.len(), self.nodes);
        for (node, next) in self.successors(&BTreeSet::new()) {
            if !next.is_empty() {
                let _ = writeln!(text, "  {node} -> {}", next.join(" "));
            }
        }
        text
    }
}

/// Every import of one file of `krate` by another, with the path named (from the root) and its
/// line. File A imports file B when A names an item B defines, however A reaches it: a `pub use`
/// of the root or of any module on the way is followed to the file that defines the item. A file
/// that declares a child module does not import it by that; its `use` of a module binds a name,
/// and the paths through that name are its imports. A doc link is no import (it compiles to
/// nothing), nor is what only tests compile; and a `pub use` is an import of its own file only
/// if that file's code names what it binds: otherwise it only passes the name on.
fn imports(krate: &Crate) -> Vec<(&File, &File, String, usize)> {
    let mut imports = Vec::new();
    for file in krate.files.iter().filter(|file| !file.test) {
        for reference in &file.reading.references {
            match &reference.how {
                How::Doc => continue,
                How::Use {
                    reexport: Some(name),
                    ..
                } if !file.reading.words.contains(name) => continue,
                _ => {}
            }
            let Some((target, found)) = krate.locate(&reference.path) else {
                continue;
            };
            let binds_module = matches!(reference.how, How::Use { glob: false, .. });
            if (found == Found::Module && binds_module) || target.shown == file.shown {
                continue;
            }
            imports.push((file, target, reference.path.join("::"), reference.line));
        }
    }
    imports
}
