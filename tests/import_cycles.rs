//! Imports among the files of `src/` go one way: no two files import each
//! other, directly or through others (docs/ARCHITECTURE.md).
//!
//! Each non-test `.rs` file of `src/` is a node (test files — `tests.rs`
//! and files under a `tests/` folder — are left out, and so are the crate
//! roots `lib.rs` and `main.rs`, which every module descends from). Its
//! references are the paths that start with `crate::`, `super::` or
//! `self::`, in `use` items (groups such as `use super::{a, b::{c, d}}`
//! expanded) and in qualified names (`crate::x::y(..)`), outside comments,
//! string and character literals and `#[cfg(test)]` items. A path is
//! resolved from the module it is written in (an inline `mod x { .. }`
//! included) to the deepest module that has a file; a reference to the
//! file itself or to one of its ancestors (a parent's items, often
//! re-exports of its children) is no edge. The strongly connected
//! components of more than one file (Tarjan) are the circles.
//!
//! Not seen: paths that start with a module's name alone (`use child::X`
//! after `mod child;`, `jurystream::x` in the binary's files).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// A module's path from the crate root: `[]` for the root,
/// `["engine", "learn"]` for src/engine/learn.rs.
type ModPath = Vec<String>;

// ---------------------------------------------------------------------------
// Tokens

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The identifiers, `::` and punctuation of a Rust file; comments, string,
/// byte-string, raw-string and character literals and numbers are dropped.
fn lex(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // past a quoted literal whose opening quote is at `i`; `\` escapes
    let skip_quoted = |mut i: usize, line: &mut usize, quote: char| -> usize {
        i += 1;
        while i < c.len() && c[i] != quote {
            if c[i] == '\\' {
                i += 1;
            }
            if c.get(i) == Some(&'\n') {
                *line += 1;
            }
            i += 1;
        }
        i + 1
    };
    // past a raw string r#..#"..."#..#: `i` at the first `#` or the quote
    let skip_raw = |mut i: usize, line: &mut usize| -> usize {
        let mut hashes = 0;
        while c.get(i) == Some(&'#') {
            hashes += 1;
            i += 1;
        }
        i += 1; // the opening quote
        while i < c.len() {
            if c[i] == '"' && (1..=hashes).all(|h| c.get(i + h) == Some(&'#')) {
                return i + 1 + hashes;
            }
            if c[i] == '\n' {
                *line += 1;
            }
            i += 1;
        }
        i
    };
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 1;
            i += 2;
            while i < c.len() && depth > 0 {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_quoted(i, &mut line, '"');
        } else if ch == '\'' {
            if next == Some('\\') {
                // an escaped character literal: '\n', '\'', '\u{..}'
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3; // 'x'
            } else {
                // a lifetime or a label: its name follows
                out.push(Token {
                    tok: Tok::Punct('\''),
                    line,
                });
                i += 1;
            }
        } else if is_ident_start(ch) {
            let start = i;
            while i < c.len() && is_ident_char(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let after = c.get(i).copied();
            let after2 = c.get(i + 1).copied();
            match (word.as_str(), after) {
                // b"..", c"..": strings; b'..': a byte
                ("b" | "c", Some('"')) => i = skip_quoted(i, &mut line, '"'),
                ("b", Some('\'')) => i = skip_quoted(i, &mut line, '\''),
                // r"..", r#".."#, br.., cr..: raw strings
                ("r" | "br" | "cr", Some('"')) => i = skip_raw(i, &mut line),
                ("r" | "br" | "cr", Some('#')) if matches!(after2, Some('"' | '#')) => {
                    i = skip_raw(i, &mut line)
                }
                // r#ident: a raw identifier
                ("r", Some('#')) if after2.is_some_and(is_ident_start) => {
                    let start = i + 1;
                    i = start;
                    while i < c.len() && is_ident_char(c[i]) {
                        i += 1;
                    }
                    out.push(Token {
                        tok: Tok::Ident(c[start..i].iter().collect()),
                        line,
                    });
                }
                _ => out.push(Token {
                    tok: Tok::Ident(word.clone()),
                    line,
                }),
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && is_ident_char(c[i]) {
                i += 1;
            }
        } else if ch == ':' && next == Some(':') {
            out.push(Token {
                tok: Tok::PathSep,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(ch),
                line,
            });
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// References

/// A path written in a file.
#[derive(Clone, Debug)]
struct Ref {
    /// The segments as written, from `crate`, `super` or `self` on.
    path: Vec<String>,
    /// The module it is written in (an inline module's path included).
    scope: ModPath,
    line: usize,
}

fn tok_at(toks: &[Token], i: usize) -> Option<&Tok> {
    toks.get(i).map(|t| &t.tok)
}

fn is_punct(toks: &[Token], i: usize, p: char) -> bool {
    tok_at(toks, i) == Some(&Tok::Punct(p))
}

fn ident_at(toks: &[Token], i: usize) -> Option<&str> {
    match tok_at(toks, i) {
        Some(Tok::Ident(s)) => Some(s.as_str()),
        _ => None,
    }
}

/// The index of the bracket closing the one at `open` (`(`, `[`, `{`
/// nest), or the end.
fn matching_close(toks: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, t) in toks.iter().enumerate().skip(open) {
        match t.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

/// Past the item that starts at `i` (it follows a `#[cfg(test)]`): its `;`,
/// its `{ .. }` body, or the `,` that ends a field or an arm; a bracket that
/// closes around it is not consumed.
fn skip_item(toks: &[Token], mut i: usize) -> usize {
    let mut nest = 0usize;
    while i < toks.len() {
        match toks[i].tok {
            Tok::Punct('(' | '[' | '{') => nest += 1,
            Tok::Punct(c @ (')' | ']' | '}')) => {
                if nest == 0 {
                    return i;
                }
                nest -= 1;
                if nest == 0 && c == '}' {
                    return i + 1;
                }
            }
            Tok::Punct(';' | ',') if nest == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// The leaves of a use tree's group `{ .. }` whose first token is at `i`,
/// each the prefix and its own segments (`self` is the prefix itself).
/// Returns the index past the closing `}`.
fn parse_group(
    toks: &[Token],
    mut i: usize,
    prefix: &[String],
    leaves: &mut Vec<Vec<String>>,
) -> usize {
    while let Some(tok) = tok_at(toks, i) {
        match tok {
            Tok::Punct('}') => return i + 1,
            Tok::Punct('{') => i = parse_group(toks, i + 1, prefix, leaves),
            Tok::Punct('*') => {
                leaves.push(prefix.to_vec());
                i += 1;
            }
            Tok::Ident(first) => {
                let mut segs = prefix.to_vec();
                if first != "self" {
                    segs.push(first.clone());
                }
                i += 1;
                let mut nested = false;
                while tok_at(toks, i) == Some(&Tok::PathSep) {
                    match tok_at(toks, i + 1) {
                        Some(Tok::Ident(s)) => {
                            segs.push(s.clone());
                            i += 2;
                        }
                        Some(Tok::Punct('{')) => {
                            i = parse_group(toks, i + 2, &segs, leaves);
                            nested = true;
                            break;
                        }
                        Some(Tok::Punct('*')) => {
                            // `::*`: the module itself
                            i += 2;
                            break;
                        }
                        _ => {
                            i += 1;
                            break;
                        }
                    }
                }
                if !nested {
                    leaves.push(segs);
                }
                if ident_at(toks, i) == Some("as") {
                    i += 2;
                }
            }
            _ => i += 1,
        }
    }
    i
}

/// The path that starts at `i` (`crate`, `super` or `self`, then `::`):
/// its leaves, and the index past it.
fn parse_path(toks: &[Token], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut segs = vec![ident_at(toks, i).unwrap_or_default().to_string()];
    i += 1;
    while tok_at(toks, i) == Some(&Tok::PathSep) {
        match tok_at(toks, i + 1) {
            Some(Tok::Ident(s)) => {
                segs.push(s.clone());
                i += 2;
            }
            Some(Tok::Punct('{')) => {
                let mut leaves = Vec::new();
                let next = parse_group(toks, i + 2, &segs, &mut leaves);
                return (leaves, next);
            }
            // `::*`, a turbofish `::<`
            _ => break,
        }
    }
    (vec![segs], i)
}

/// The `crate::`, `super::` and `self::` paths of a file whose module is
/// `file_mod`.
fn references(text: &str, file_mod: &ModPath) -> Vec<Ref> {
    let toks = lex(text);
    let mut refs = Vec::new();
    // `{` nesting
    let mut depth = 0usize;
    // inline modules: their path and the depth inside their body
    let mut scopes: Vec<(ModPath, usize)> = Vec::new();
    let mut skip_next_item = false;
    let mut i = 0;
    while i < toks.len() {
        // attributes: #[..] and #![..]
        if is_punct(&toks, i, '#') {
            let inner = is_punct(&toks, i + 1, '!');
            let open = i + 1 + usize::from(inner);
            if is_punct(&toks, open, '[') {
                let close = matching_close(&toks, open);
                let cfg_test = toks.get(open + 1..close).is_some_and(|body| {
                    body.iter().map(|t| &t.tok).eq([
                        Tok::Ident("cfg".into()),
                        Tok::Punct('('),
                        Tok::Ident("test".into()),
                        Tok::Punct(')'),
                    ]
                    .iter())
                });
                if cfg_test && inner {
                    if scopes.is_empty() && depth == 0 {
                        return Vec::new(); // the whole file is test code
                    }
                    // the rest of the enclosing block
                    let mut d = 0usize;
                    i = close + 1;
                    while i < toks.len() {
                        match toks[i].tok {
                            Tok::Punct('{') => d += 1,
                            Tok::Punct('}') if d == 0 => break,
                            Tok::Punct('}') => d -= 1,
                            _ => {}
                        }
                        i += 1;
                    }
                    continue;
                }
                skip_next_item |= cfg_test;
                i = close + 1;
                continue;
            }
        }
        if skip_next_item {
            skip_next_item = false;
            i = skip_item(&toks, i);
            continue;
        }
        match &toks[i].tok {
            Tok::Ident(w) if w == "mod" => {
                if let (Some(name), true) = (ident_at(&toks, i + 1), is_punct(&toks, i + 2, '{')) {
                    let mut path = scopes.last().map_or(file_mod, |s| &s.0).clone();
                    path.push(name.to_string());
                    depth += 1;
                    scopes.push((path, depth));
                    i += 3;
                    continue;
                }
                i += 1;
            }
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                if scopes.last().is_some_and(|s| s.1 == depth) {
                    scopes.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(w)
                if (w == "crate" || w == "super" || w == "self")
                    && tok_at(&toks, i + 1) == Some(&Tok::PathSep) =>
            {
                // `pub(in crate::x)` names a visibility, not an import
                let visibility =
                    i >= 2 && ident_at(&toks, i - 1) == Some("in") && is_punct(&toks, i - 2, '(');
                let line = toks[i].line;
                let scope = scopes.last().map_or(file_mod, |s| &s.0);
                let (leaves, next) = parse_path(&toks, i);
                if !visibility {
                    refs.extend(leaves.into_iter().map(|path| Ref {
                        path,
                        scope: scope.clone(),
                        line,
                    }));
                }
                i = next;
            }
            _ => i += 1,
        }
    }
    refs
}

/// The deepest module with a file that `r` names, if any but the root.
fn resolve(r: &Ref, modules: &BTreeMap<ModPath, usize>) -> Option<usize> {
    let first = r.path.first()?;
    let (mut full, mut k) = if first == "crate" {
        (Vec::new(), 1)
    } else {
        (r.scope.clone(), 0)
    };
    while k < r.path.len() && (r.path[k] == "super" || r.path[k] == "self") {
        if r.path[k] == "super" {
            full.pop();
        }
        k += 1;
    }
    full.extend(r.path[k..].iter().cloned());
    (1..=full.len())
        .rev()
        .find_map(|n| modules.get(&full[..n]).copied())
}

// ---------------------------------------------------------------------------
// The graph

/// A file of src/ and its module.
struct File {
    /// Relative to src/'s parent: `src/engine/learn.rs`.
    name: String,
    path: PathBuf,
    module: ModPath,
}

/// The non-test `.rs` files under `src`, with their modules; the crate
/// roots left out.
fn source_files(src: &Path) -> io::Result<Vec<File>> {
    fn walk(
        dir: &Path,
        rel: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, PathBuf)>,
    ) -> io::Result<()> {
        let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if path.is_dir() {
                if name == "tests" {
                    continue; // a tests/ folder: test files
                }
                rel.push(name);
                walk(&path, rel, out)?;
                rel.pop();
            } else if let Some(stem) = name.strip_suffix(".rs") {
                if stem == "tests" {
                    continue;
                }
                let mut module = rel.clone();
                if stem != "mod" {
                    module.push(stem.to_string());
                }
                out.push((module, path));
            }
        }
        Ok(())
    }
    let mut found = Vec::new();
    walk(src, &mut Vec::new(), &mut found)?;
    let base = src.parent().unwrap_or(src);
    Ok(found
        .into_iter()
        .filter(|(module, _)| !(module.len() == 1 && (module[0] == "lib" || module[0] == "main")))
        .map(|(module, path)| File {
            name: path
                .strip_prefix(base)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned(),
            path,
            module,
        })
        .collect())
}

/// An import circle: its files, and for each edge between them the first
/// reference that makes it.
#[derive(Debug)]
struct Circle {
    files: Vec<String>,
    edges: Vec<String>,
}

/// The strongly connected components of a graph (Tarjan).
fn strongly_connected(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct Tarjan<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        components: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            let edges = self.edges;
            for &w in &edges[v] {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                self.components.push(component);
            }
        }
    }
    let n = edges.len();
    let mut t = Tarjan {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        components: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    t.components
}

/// The import circles among the files of `src` (a crate's src/ folder),
/// and how many files were read.
fn import_circles(src: &Path) -> (Vec<Circle>, usize) {
    let files = source_files(src).unwrap_or_else(|e| panic!("cannot read {}: {e}", src.display()));
    let modules: BTreeMap<ModPath, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    let mut edges = vec![BTreeSet::new(); files.len()];
    // the first reference behind each edge, for the report
    let mut why: BTreeMap<(usize, usize), String> = BTreeMap::new();
    for (from, file) in files.iter().enumerate() {
        let text = fs::read_to_string(&file.path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.path.display()));
        for r in references(&text, &file.module) {
            let Some(to) = resolve(&r, &modules) else {
                continue;
            };
            // itself, or an ancestor (its parent's items): no edge
            if file.module.starts_with(&files[to].module) {
                continue;
            }
            edges[from].insert(to);
            why.entry((from, to)).or_insert_with(|| {
                format!(
                    "{}:{} `{}` -> {}",
                    file.name,
                    r.line,
                    r.path.join("::"),
                    files[to].name
                )
            });
        }
    }
    let mut circles: Vec<Circle> = strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let members: BTreeSet<usize> = c.iter().copied().collect();
            let mut names: Vec<String> = c.iter().map(|&i| files[i].name.clone()).collect();
            names.sort();
            let edges = why
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .map(|(_, w)| w.clone())
                .collect();
            Circle {
                files: names,
                edges,
            }
        })
        .collect();
    circles.sort_by(|a, b| a.files.cmp(&b.files));
    (circles, files.len())
}

fn describe(circles: &[Circle]) -> String {
    circles
        .iter()
        .map(|c| {
            format!(
                "circle: {}\n  {}",
                c.files.join(" <-> "),
                c.edges.join("\n  ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn src_has_no_import_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (circles, files) = import_circles(&src);
    assert!(files > 10, "only {files} files found in {}", src.display());
    assert!(
        circles.is_empty(),
        "{} import circles among the {files} files of src/ (each file of a circle imports, \
         through the others, from itself):\n{}",
        circles.len(),
        describe(&circles)
    );
}

/// The detector on a small tree with two circles and several references
/// that must not count.
#[test]
fn the_detector_finds_circles_in_a_synthetic_tree() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let files: &[(&str, &str)] = &[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod d;\npub mod e;\npub mod g;\npub mod h;\nuse crate::a::A;\n"),
        // a -> b, b -> a (through a group): a circle
        ("a.rs", "use crate::b::Thing;\npub struct A;\nuse crate::e::tests::T;\n"),
        ("b.rs", "use super::{c, a::A};\npub struct Thing;\n"),
        // c names d only in a comment, a string, a char and test code
        (
            "c.rs",
            "// use crate::d::X;\n/* crate::d::X /* nested */ crate::d::X */\n\
             const S: &str = \"crate::d::X\";\nconst R: &str = r#\"crate::d::X\"#;\n\
             const Q: char = '{';\nfn f<'a>(x: &'a str) -> &'a str { x }\n\
             #[cfg(test)]\nmod tests {\n    use crate::d::X;\n}\n\
             #[cfg(test)]\nuse crate::d::Y;\n\
             pub(in crate::d) struct V;\npub struct C;\n",
        ),
        ("d.rs", "use crate::c::C;\npub struct X;\n"),
        // e's parent items and its child: no circle
        ("e/mod.rs", "pub mod f;\nuse self::f::F;\npub struct E;\n"),
        ("e/f.rs", "use super::E;\npub struct F;\n"),
        // a test file is no node: a -> e only
        ("e/tests.rs", "use crate::a::A;\npub struct T;\n"),
        // g -> h through a qualified name; h -> g, e, e/f through nested groups
        ("g.rs", "pub fn g() { crate::h::h() }\n"),
        ("h.rs", "use crate::{e::{self, f::F as G}, g};\npub fn h() {}\n"),
        // an inline module: super:: is the file's module
        ("i.rs", "mod inner {\n    use super::super::a::A;\n    use super::I;\n}\npub struct I;\n"),
    ];
    for (name, text) in files {
        let path = src.join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, text).unwrap();
    }
    let (circles, count) = import_circles(&src);
    assert_eq!(count, 9, "lib.rs and tests.rs are no nodes");
    let found: Vec<Vec<String>> = circles.iter().map(|c| c.files.clone()).collect();
    assert_eq!(
        found,
        vec![
            vec!["src/a.rs".to_string(), "src/b.rs".to_string()],
            vec!["src/g.rs".to_string(), "src/h.rs".to_string()],
        ],
        "{}",
        describe(&circles)
    );
    assert!(
        circles[1]
            .edges
            .iter()
            .any(|e| e == "src/g.rs:1 `crate::h::h` -> src/h.rs"),
        "{:?}",
        circles[1].edges
    );

    // i.rs's inline module reaches a.rs: with a -> i, a third circle
    fs::write(
        src.join("a.rs"),
        "use crate::b::Thing;\npub struct A;\nuse crate::i::I;\n",
    )
    .unwrap();
    let (circles, _) = import_circles(&src);
    let found: Vec<Vec<String>> = circles.iter().map(|c| c.files.clone()).collect();
    assert_eq!(
        found,
        vec![
            vec![
                "src/a.rs".to_string(),
                "src/b.rs".to_string(),
                "src/i.rs".to_string()
            ],
            vec!["src/g.rs".to_string(), "src/h.rs".to_string()],
        ],
        "{}",
        describe(&circles)
    );
}

#[test]
fn groups_and_scopes_are_read() {
    let refs = references(
        "use super::{a, b::{c, d as e}, self as me, f::*};\nmod m { use self::x::Y; }\n",
        &vec!["p".to_string(), "q".to_string()],
    );
    let got: Vec<(String, String)> = refs
        .iter()
        .map(|r| (r.path.join("::"), r.scope.join("::")))
        .collect();
    let want: Vec<(String, String)> = [
        ("super::a", "p::q"),
        ("super::b::c", "p::q"),
        ("super::b::d", "p::q"),
        ("super", "p::q"),
        ("super::f", "p::q"),
        ("self::x::Y", "p::q::m"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(got, want);
}
