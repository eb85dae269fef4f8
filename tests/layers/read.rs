//! Reading a file as text: its tokens, its `use` trees, and the paths it names from its crate's
//! root.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq)]
enum Token {
    /// An identifier, keyword or number.
    Word(String),
    /// `::`.
    PathSep,
    Punct(char),
    /// The text of a doc comment.
    Doc(String),
}

/// The tokens of `text` with their lines: comments but doc comments, strings and characters left
/// out, lifetimes reduced to their name.
fn tokens(text: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut at = 0;
    // Skips from `at` to past the closing quote of a string whose opening quote is at `at`.
    let skip_string = |at: &mut usize, line: &mut usize| {
        *at += 1;
        while *at < chars.len() && chars[*at] != '"' {
            if chars[*at] == '\\' {
                *at += 1;
            }
            if chars.get(*at) == Some(&'\n') {
                *line += 1;
            }
            *at += 1;
        }
        *at += 1;
    };
    while at < chars.len() {
        let c = chars[at];
        let next = chars.get(at + 1).copied();
        if c == '\n' {
            line += 1;
            at += 1;
        } else if c.is_whitespace() {
            at += 1;
        } else if c == '/' && next == Some('/') {
            let end = (at..chars.len())
                .find(|&i| chars[i] == '\n')
                .unwrap_or(chars.len());
            let comment: String = chars[at..end].iter().collect();
            if (comment.starts_with("///") && !comment.starts_with("////"))
                || comment.starts_with("//!")
            {
                tokens.push((Token::Doc(comment[3..].to_owned()), line));
            }
            at = end;
        } else if c == '/' && next == Some('*') {
            let start = at;
            let start_line = line;
            let mut depth = 0;
            while at < chars.len() {
                if chars[at] == '/' && chars.get(at + 1) == Some(&'*') {
                    depth += 1;
                    at += 2;
                } else if chars[at] == '*' && chars.get(at + 1) == Some(&'/') {
                    depth -= 1;
                    at += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[at] == '\n' {
                        line += 1;
                    }
                    at += 1;
                }
            }
            let comment: String = chars[start..at].iter().collect();
            if (comment.starts_with("/**") && !comment.starts_with("/***") && comment != "/**/")
                || comment.starts_with("/*!")
            {
                tokens.push((Token::Doc(comment), start_line));
            }
        } else if c == '"' {
            skip_string(&mut at, &mut line);
        } else if c == '\'' {
            if next == Some('\\') {
                // A character escape: past the escaped character, up to the closing quote.
                at += 3;
                while at < chars.len() && chars[at] != '\'' {
                    at += 1;
                }
                at += 1;
            } else if chars.get(at + 2) == Some(&'\'') {
                at += 3;
            } else {
                // A lifetime or a label: its name follows as a word.
                at += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = at;
            while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_') {
                at += 1;
            }
            let word: String = chars[start..at].iter().collect();
            let here = chars.get(at).copied();
            match (word.as_str(), here) {
                ("r" | "br" | "cr", Some('#')) if chars.get(at + 1) != Some(&'"') => {
                    let after = chars.get(at + 1).copied();
                    if word == "r" && after.is_some_and(|c| c.is_alphabetic() || c == '_') {
                        // A raw identifier, `r#type`: the word follows.
                        at += 1;
                    } else {
                        // A raw string with several hashes: find its end.
                        let hashes = (at..chars.len()).take_while(|&i| chars[i] == '#').count();
                        at = raw_string_end(&chars, at + hashes, hashes, &mut line);
                    }
                }
                ("r" | "br" | "cr", Some('#' | '"')) => {
                    let hashes = (at..chars.len()).take_while(|&i| chars[i] == '#').count();
                    at = raw_string_end(&chars, at + hashes, hashes, &mut line);
                }
                ("b" | "c", Some('"')) => skip_string(&mut at, &mut line),
                ("b", Some('\'')) => {
                    at += 1;
                    if chars.get(at) == Some(&'\\') {
                        at += 1;
                    }
                    at += 1;
                    while at < chars.len() && chars[at] != '\'' {
                        at += 1;
                    }
                    at += 1;
                }
                _ => tokens.push((Token::Word(word), line)),
            }
        } else if c == ':' && next == Some(':') {
            tokens.push((Token::PathSep, line));
            at += 2;
        } else {
            tokens.push((Token::Punct(c), line));
            at += 1;
        }
    }
    tokens
}

/// Past the end of a raw string whose opening quote is at `quote`, closed by a quote and `hashes`
/// hashes.
fn raw_string_end(chars: &[char], quote: usize, hashes: usize, line: &mut usize) -> usize {
    let mut at = quote + 1;
    while at < chars.len() {
        if chars[at] == '"' && (1..=hashes).all(|i| chars.get(at + i) == Some(&'#')) {
            return at + 1 + hashes;
        }
        if chars[at] == '\n' {
            *line += 1;
        }
        at += 1;
    }
    at
}

/// A path a file names, resolved from the crate's root, and the line it is on.
#[derive(Debug, PartialEq)]
pub(crate) struct Reference {
    pub(crate) path: Vec<String>,
    pub(crate) line: usize,
    /// Written from `crate::`, `super::` or `self::`; otherwise the path was written from a name
    /// in scope (`child::f()`, `use child::X`, or `std::…`, which resolves to nothing of the
    /// crate's) and is taken from the module it is written in.
    pub(crate) anchored: bool,
    pub(crate) how: How,
}

/// Where a path is named.
#[derive(Debug, PartialEq)]
pub(crate) enum How {
    /// In a `use` tree; `reexport` holds the name a `pub use` binds (`*` for a glob), which is an
    /// import of the file's own only if its code names it.
    Use {
        glob: bool,
        reexport: Option<String>,
    },
    /// In code.
    Code,
    /// In a doc comment.
    Doc,
}

/// What one module (a file's, or an inline `mod x { … }` in it) declares.
#[derive(Debug, Default)]
pub(crate) struct Declarations {
    /// The items it defines: structs, enums, functions, traits, types, constants, statics, macros.
    pub(crate) items: BTreeSet<String>,
    /// Its child modules that only tests compile (`#[cfg(test)] mod tests;`).
    pub(crate) test_modules: BTreeSet<String>,
    /// The names its `use` declarations bind, each with the path it stands for from the root.
    pub(crate) uses: BTreeMap<String, Vec<String>>,
    /// The modules its glob imports (`use x::*`) read, from the root.
    pub(crate) globs: Vec<Vec<String>>,
}

/// All a file says about its crate's modules.
#[derive(Debug, Default)]
pub(crate) struct Reading {
    pub(crate) references: Vec<Reference>,
    /// Each module written in the file, its own and its inline ones, with what it declares.
    pub(crate) scopes: BTreeMap<Vec<String>, Declarations>,
    /// Every word of the file's code outside `use` trees and doc comments: a name a `pub use`
    /// binds is used by the file itself only if it is among them.
    pub(crate) words: BTreeSet<String>,
}

/// The keywords that open an item with a name of a module's namespace.
const ITEMS: &[&str] = &[
    "struct", "enum", "union", "fn", "trait", "type", "const", "static",
];

/// The paths the file of `module` names from its crate's root, resolved, in `use` trees, in code
/// and in doc comments.
pub(crate) fn references(text: &str, module: &[String]) -> Vec<Reference> {
    read(text, module).references
}

/// What the file of `module` names and declares. Items under `#[cfg(test)]` (the `tests` module,
/// a helper compiled only for them) are left out: tests may import anything.
pub(crate) fn read(text: &str, module: &[String]) -> Reading {
    let tokens = tokens(text);
    let mut reading = Reading::default();
    reading
        .scopes
        .insert(module.to_vec(), Declarations::default());
    // The inline modules open around the current token: their name and the depth of their brace.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut at = 0;
    let current = |inline: &[(String, usize)]| -> Vec<String> {
        let mut current = module.to_vec();
        current.extend(inline.iter().map(|(name, _)| name.clone()));
        current
    };
    let word = |at: usize| match tokens.get(at) {
        Some((Token::Word(word), _)) => Some(word.as_str()),
        _ => None,
    };
    let token = |at: usize| tokens.get(at).map(|t| &t.0);
    while at < tokens.len() {
        let (this, line) = &tokens[at];
        let previous = at.checked_sub(1).map(|i| &tokens[i].0);
        // The depth of the items of the innermost module open here.
        let item_depth = inline.last().map_or(0, |(_, open)| open + 1);
        match this {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                depth -= 1;
                if inline.last().is_some_and(|(_, open)| *open == depth) {
                    inline.pop();
                }
            }
            Token::Punct('#') if token(at + 1) == Some(&Token::Punct('[')) => {
                let close = closing(&tokens, at + 1);
                if is_test_cfg(&tokens[at + 2..close]) {
                    let end = item_end(&tokens, close + 1);
                    // `#[cfg(test)] mod name;`: the file of `name` is tests' only.
                    if let [.., (Token::Word(keyword), _), (Token::Word(name), _), _] =
                        &tokens[close + 1..end]
                        && keyword == "mod"
                        && depth == item_depth
                    {
                        let scope = reading.scopes.entry(current(&inline)).or_default();
                        scope.test_modules.insert(name.clone());
                    }
                    at = end;
                    continue;
                }
            }
            Token::Word(keyword)
                if keyword == "mod" && token(at + 2) == Some(&Token::Punct('{')) =>
            {
                if let Some(name) = word(at + 1) {
                    inline.push((name.to_owned(), depth));
                    reading.scopes.entry(current(&inline)).or_default();
                }
            }
            Token::Word(keyword)
                if keyword == "use" && token(at + 1) != Some(&Token::Punct('<')) =>
            {
                let reexport = is_pub(&tokens, at);
                let mut paths = Vec::new();
                at += 1;
                use_tree(&tokens, &mut at, Vec::new(), &mut paths);
                let current = current(&inline);
                for (path, line, bind) in paths {
                    let Some(first) = path.first() else { continue };
                    let anchored = is_anchor(first);
                    let Some(path) = from_root(&current, &path) else {
                        continue;
                    };
                    // Only a module's own `use` declarations bind names others can reach; one in
                    // a function's body binds them for that body.
                    if depth == item_depth {
                        let scope = reading.scopes.entry(current.clone()).or_default();
                        match &bind {
                            Bind::Name(name) => {
                                scope.uses.insert(name.clone(), path.clone());
                            }
                            Bind::Glob => scope.globs.push(path.clone()),
                            Bind::Nothing => {}
                        }
                    }
                    let reexport = reexport.then(|| match &bind {
                        Bind::Name(name) => name.clone(),
                        Bind::Glob | Bind::Nothing => "*".to_owned(),
                    });
                    let how = How::Use {
                        glob: bind == Bind::Glob,
                        reexport,
                    };
                    reading.references.push(Reference {
                        path,
                        line,
                        anchored,
                        how,
                    });
                }
                continue;
            }
            Token::Word(keyword)
                if depth == item_depth
                    && ITEMS.contains(&keyword.as_str())
                    && previous != Some(&Token::PathSep) =>
            {
                reading.words.insert(keyword.clone());
                // `static mut NAME`; `const fn name` is the function's, named after `fn`.
                let name = match word(at + 1) {
                    Some("mut") => word(at + 2),
                    Some("fn" | "unsafe" | "async" | "extern") if keyword == "const" => None,
                    name => name,
                };
                if let Some(name) = name {
                    let scope = reading.scopes.entry(current(&inline)).or_default();
                    scope.items.insert(name.to_owned());
                }
            }
            Token::Word(keyword)
                if keyword == "macro_rules" && token(at + 1) == Some(&Token::Punct('!')) =>
            {
                if let Some(name) = word(at + 2) {
                    let scope = reading.scopes.entry(current(&inline)).or_default();
                    scope.items.insert(name.to_owned());
                }
            }
            Token::Word(first)
                if token(at + 1) == Some(&Token::PathSep)
                    && word(at + 2).is_some()
                    && previous != Some(&Token::PathSep) =>
            {
                let mut path = vec![first.clone()];
                while token(at + 1) == Some(&Token::PathSep) {
                    let Some(next) = word(at + 2) else { break };
                    path.push(next.to_owned());
                    at += 2;
                }
                reading.words.extend(path.iter().cloned());
                let anchored = is_anchor(first);
                if let Some(path) = from_root(&current(&inline), &path) {
                    reading.references.push(Reference {
                        path,
                        line: *line,
                        anchored,
                        how: How::Code,
                    });
                }
            }
            Token::Word(word) => {
                reading.words.insert(word.clone());
            }
            Token::Doc(doc) => {
                for path in doc_paths(doc) {
                    if let Some(path) = resolve(&current(&inline), &path) {
                        reading.references.push(Reference {
                            path,
                            line: *line,
                            anchored: true,
                            how: How::Doc,
                        });
                    }
                }
            }
            _ => {}
        }
        at += 1;
    }
    reading
}

fn is_anchor(first: &str) -> bool {
    ["crate", "super", "self"].contains(&first)
}

/// `path` from the crate's root as named in `current`: resolved if it starts with `crate::`,
/// `super::` or `self::`, otherwise taken from `current`, where a name in scope is found.
fn from_root(current: &[String], path: &[String]) -> Option<Vec<String>> {
    if is_anchor(&path[0]) {
        resolve(current, path)
    } else {
        let mut from_root = current.to_vec();
        from_root.extend(path.iter().cloned());
        Some(from_root)
    }
}

/// The index of the bracket that closes the one at `open`.
fn closing(tokens: &[(Token, usize)], open: usize) -> usize {
    let mut depth = 0;
    for (at, (token, _)) in tokens.iter().enumerate().skip(open) {
        match token {
            Token::Punct('[' | '(' | '{') => depth += 1,
            Token::Punct(']' | ')' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return at;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// Whether an attribute's tokens (inside `#[…]`) compile its item for tests only: `cfg(test)`,
/// or `cfg(all(test, …))`; `cfg(any(test, …))` compiles it elsewhere too.
fn is_test_cfg(attribute: &[(Token, usize)]) -> bool {
    let words: Vec<&Token> = attribute.iter().map(|(token, _)| token).collect();
    let test = Token::Word("test".to_owned());
    match words.as_slice() {
        [Token::Word(cfg), Token::Punct('('), only, Token::Punct(')')] => {
            cfg == "cfg" && **only == test
        }
        [
            Token::Word(cfg),
            Token::Punct('('),
            Token::Word(all),
            Token::Punct('('),
            rest @ ..,
        ] => cfg == "cfg" && all == "all" && rest.contains(&&test),
        _ => false,
    }
}

/// Past the end of the item that starts at `at` (after its attributes, if any): its first `;`
/// outside brackets, or the brace that closes its body.
fn item_end(tokens: &[(Token, usize)], mut at: usize) -> usize {
    while at < tokens.len() {
        match tokens[at].0 {
            Token::Punct(';') => return at + 1,
            Token::Punct('{') => return closing(tokens, at) + 1,
            Token::Punct('[' | '(') => at = closing(tokens, at) + 1,
            _ => at += 1,
        }
    }
    at
}

/// Whether the `use` at `at` is `pub`, `pub(crate)`, `pub(super)` or `pub(in …)`: a re-export.
fn is_pub(tokens: &[(Token, usize)], at: usize) -> bool {
    let pub_word = Some(&Token::Word("pub".to_owned()));
    let before = |at: usize| at.checked_sub(1).and_then(|i| tokens.get(i)).map(|t| &t.0);
    match before(at) {
        Some(Token::Punct(')')) => {
            let open = (0..at).rev().find(|&i| tokens[i].0 == Token::Punct('('));
            open.is_some_and(|open| before(open) == pub_word)
        }
        token => token == pub_word,
    }
}

/// The name a path of a `use` tree binds.
#[derive(Debug, PartialEq)]
enum Bind {
    Name(String),
    /// `x::*`: every public name of `x`.
    Glob,
    /// `x as _`: none.
    Nothing,
}

/// Reads a `use` tree from `at` (just past `use`, or inside its braces) to its end, pushing every
/// path it names (a glob or a `self` names its module) onto `paths`, with its line and the name
/// it binds.
fn use_tree(
    tokens: &[(Token, usize)],
    at: &mut usize,
    mut prefix: Vec<String>,
    paths: &mut Vec<(Vec<String>, usize, Bind)>,
) {
    let braced_self = !prefix.is_empty();
    while let Some((token, line)) = tokens.get(*at) {
        match token {
            Token::PathSep => *at += 1,
            Token::Punct('{') => {
                *at += 1;
                while let Some((token, _)) = tokens.get(*at) {
                    match token {
                        Token::Punct('}') => {
                            *at += 1;
                            break;
                        }
                        Token::Punct(',') => *at += 1,
                        _ => {
                            let before = *at;
                            use_tree(tokens, at, prefix.clone(), paths);
                            if *at == before {
                                *at += 1;
                            }
                        }
                    }
                }
                return;
            }
            Token::Punct('*') => {
                *at += 1;
                paths.push((prefix, *line, Bind::Glob));
                return;
            }
            Token::Word(word) if word == "self" && braced_self => {
                // `a::{self, …}`: the module itself.
                *at += 1;
                let bind = bound(tokens, at, prefix.last().unwrap());
                paths.push((prefix, *line, bind));
                return;
            }
            Token::Word(word) => {
                prefix.push(word.clone());
                *at += 1;
                if tokens.get(*at).map(|t| &t.0) != Some(&Token::PathSep) {
                    let bind = bound(tokens, at, word);
                    paths.push((prefix, *line, bind));
                    return;
                }
            }
            // `;`, or anything a `use` tree does not hold: the tree ends here.
            _ => return,
        }
    }
}

/// The name a path whose last segment is `last` binds, past its `as` if it has one.
fn bound(tokens: &[(Token, usize)], at: &mut usize, last: &str) -> Bind {
    if tokens.get(*at).map(|t| &t.0) != Some(&Token::Word("as".to_owned())) {
        return Bind::Name(last.to_owned());
    }
    *at += 2;
    match tokens.get(*at - 1) {
        Some((Token::Word(name), _)) if name != "_" => Bind::Name(name.clone()),
        _ => Bind::Nothing,
    }
}

/// The paths a doc comment names from `crate::`, `super::` or `self::` (links, or code in
/// backticks).
fn doc_paths(doc: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = doc.chars().collect();
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut paths = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        let starts_word = at == 0 || !(is_word(chars[at - 1]) || chars[at - 1] == ':');
        if !starts_word || !is_word(chars[at]) {
            at += 1;
            continue;
        }
        let mut path = Vec::new();
        let mut end = at;
        loop {
            let start = end;
            while end < chars.len() && is_word(chars[end]) {
                end += 1;
            }
            if start == end {
                break;
            }
            path.push(chars[start..end].iter().collect::<String>());
            if chars.get(end) == Some(&':') && chars.get(end + 1) == Some(&':') {
                end += 2;
            } else {
                break;
            }
        }
        if path.len() > 1 && ["crate", "super", "self"].contains(&path[0].as_str()) {
            paths.push(path);
        }
        at = end.max(at + 1);
    }
    paths
}

/// `path` from the crate's root, as named in `current`: from `crate::`, `self::` or `super::`
/// (as many as it has); `None` for any other path (another crate's, or a name in scope).
fn resolve(current: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" => current.to_vec(),
        "super" => {
            let mut base = current.to_vec();
            base.pop()?;
            base
        }
        _ => return None,
    };
    let mut rest = path[1..].iter().peekable();
    while let Some(segment) = rest.next_if(|segment| *segment == "super" || *segment == "self") {
        if segment == "super" {
            base.pop()?;
        }
    }
    base.extend(rest.cloned());
    Some(base)
}
