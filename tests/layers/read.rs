//! Reading a file as text: its tokens, its `use` trees, and the paths it names from its crate's
//! root.

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
}

/// The paths the file of `module` names from its crate's root, resolved, in `use` trees, in code
/// and in doc comments.
pub(crate) fn references(text: &str, module: &[String]) -> Vec<Reference> {
    let tokens = tokens(text);
    let mut references = Vec::new();
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
    while at < tokens.len() {
        let (token, line) = &tokens[at];
        let previous = at.checked_sub(1).map(|i| &tokens[i].0);
        match token {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                depth -= 1;
                if inline.last().is_some_and(|(_, open)| *open == depth) {
                    inline.pop();
                }
            }
            Token::Word(keyword)
                if keyword == "mod"
                    && tokens.get(at + 2).map(|t| &t.0) == Some(&Token::Punct('{')) =>
            {
                if let Some(name) = word(at + 1) {
                    inline.push((name.to_owned(), depth));
                }
            }
            Token::Word(keyword)
                if keyword == "use"
                    && tokens.get(at + 1).map(|t| &t.0) != Some(&Token::Punct('<')) =>
            {
                let mut paths = Vec::new();
                at += 1;
                use_tree(&tokens, &mut at, Vec::new(), &mut paths);
                let current = current(&inline);
                for (path, line) in paths {
                    if let Some(path) = resolve(&current, &path) {
                        references.push(Reference { path, line });
                    }
                }
                continue;
            }
            Token::Word(first)
                if ["crate", "super", "self"].contains(&first.as_str())
                    && tokens.get(at + 1).map(|t| &t.0) == Some(&Token::PathSep)
                    && previous != Some(&Token::PathSep) =>
            {
                let mut path = vec![first.clone()];
                while tokens.get(at + 1).map(|t| &t.0) == Some(&Token::PathSep) {
                    let Some(next) = word(at + 2) else { break };
                    path.push(next.to_owned());
                    at += 2;
                }
                if let Some(path) = resolve(&current(&inline), &path) {
                    references.push(Reference { path, line: *line });
                }
            }
            Token::Doc(doc) => {
                for path in doc_paths(doc) {
                    if let Some(path) = resolve(&current(&inline), &path) {
                        references.push(Reference { path, line: *line });
                    }
                }
            }
            _ => {}
        }
        at += 1;
    }
    references
}

/// Reads a `use` tree from `at` (just past `use`, or inside its braces) to its end, pushing every
/// path it names (a glob or a `self` names its module) onto `paths`, with its line.
fn use_tree(
    tokens: &[(Token, usize)],
    at: &mut usize,
    mut prefix: Vec<String>,
    paths: &mut Vec<(Vec<String>, usize)>,
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
                paths.push((prefix, *line));
                return;
            }
            Token::Word(word) if word == "self" && braced_self => {
                // `a::{self, …}`: the module itself.
                *at += 1;
                skip_rename(tokens, at);
                paths.push((prefix, *line));
                return;
            }
            Token::Word(word) => {
                prefix.push(word.clone());
                *at += 1;
                if tokens.get(*at).map(|t| &t.0) != Some(&Token::PathSep) {
                    skip_rename(tokens, at);
                    paths.push((prefix, *line));
                    return;
                }
            }
            // `;`, or anything a `use` tree does not hold: the tree ends here.
            _ => return,
        }
    }
}

fn skip_rename(tokens: &[(Token, usize)], at: &mut usize) {
    if tokens.get(*at).map(|t| &t.0) == Some(&Token::Word("as".to_owned())) {
        *at += 2;
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
