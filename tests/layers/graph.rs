//! The top-level module graph of each crate, and the ratchet on its cycles.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::lengths::{relative, rust_files};
use crate::read::references;

/// What one file names of another top-level module: each path as resolved, with its first line.
pub(crate) type Names = BTreeMap<String, usize>;

/// The top-level edges of every crate, each with the files that make it and what they name.
pub(crate) struct Graph {
    pub(crate) edges: BTreeMap<(String, String), BTreeMap<String, Names>>,
}

impl Graph {
    /// The graph of the root package's `src/` and of every `crates/*/src/` under `root`.
    pub(crate) fn of(root: &Path) -> Graph {
        let mut graph = Graph {
            edges: BTreeMap::new(),
        };
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
        for (prefix, src) in crates {
            graph.add_crate(root, &prefix, &src);
        }
        graph
    }

    fn add_crate(&mut self, root: &Path, prefix: &str, src: &Path) {
        let files = module_files(src);
        let modules: BTreeSet<Vec<String>> = files.values().cloned().collect();
        for (file, module) in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let shown = relative(root, file);
            for reference in references(&text, module) {
                let Some(target) = longest_module(&modules, &reference.path) else {
                    continue;
                };
                if target.starts_with(module) || target[0] == module[0] {
                    continue;
                }
                self.edges
                    .entry((
                        format!("{prefix}{}", module[0]),
                        format!("{prefix}{}", target[0]),
                    ))
                    .or_default()
                    .entry(shown.clone())
                    .or_default()
                    .entry(reference.path.join("::"))
                    .or_insert(reference.line);
            }
        }
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
                    "the listed back edge {from} -> {to} is gone from the code: remove it from BACK_EDGES"
                ));
            } else if Self::path(&self.successors(&others), to, from).is_none() {
                failures.push(format!(
                    "the listed back edge {from} -> {to} closes no cycle the other listed edges leave: \
                     remove it from BACK_EDGES"
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
                    "a cycle among the top-level modules (cut one of its edges, or, for a leak \
                     being cut elsewhere, list it in BACK_EDGES):\n{}",
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
            let _ = writeln!(text, "  {} -> {}:", pair[0], pair[1]);
            for (file, names) in files {
                let names: Vec<String> = names
                    .iter()
                    .map(|(name, line)| format!("{name} (line {line})"))
                    .collect();
                let _ = writeln!(text, "    {file}: {}", names.join(", "));
            }
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

    /// The top-level edges, one line per module.
    pub(crate) fn summary(&self) -> String {
        let mut text = format!("{} top-level edges:\n", self.edges.len());
        for (node, next) in self.successors(&BTreeSet::new()) {
            if !next.is_empty() {
                let _ = writeln!(text, "  {node} -> {}", next.join(" "));
            }
        }
        text
    }
}

/// Every `.rs` file of a crate's `src/` but its roots, with its module path; `src/bin/` holds
/// crates of their own and is left out.
fn module_files(src: &Path) -> BTreeMap<PathBuf, Vec<String>> {
    let mut files = BTreeMap::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).unwrap();
        let mut module: Vec<String> = relative
            .with_extension("")
            .components()
            .map(|part| part.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module[0] == "bin" || module == ["lib"] || module == ["main"] {
            continue;
        }
        if module.last().is_some_and(|last| last == "mod") {
            module.pop();
        }
        files.insert(file, module);
    }
    files
}

/// The longest prefix of `path` that is a module, if any is.
fn longest_module(modules: &BTreeSet<Vec<String>>, path: &[String]) -> Option<Vec<String>> {
    (1..=path.len())
        .rev()
        .map(|length| path[..length].to_vec())
        .find(|prefix| modules.contains(prefix))
}
