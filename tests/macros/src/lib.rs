//! `#[api_test]` for the black-box suite in `tests/api/`: the attribute on an `async fn` is the
//! only place a test is named. It keeps the function as written and adds, next to it, its entry in
//! the suite's list of tests (a `linkme` distributed slice, `support::harness::TESTS`), which the
//! runner reads at start. A test is named `module::function`, as `cargo test --test api -- NAME`
//! filters it.
//!
//! ```ignore
//! #[api_test]
//! async fn a_payment_is_created_with_201_and_its_location() { ... }
//! ```
//!
//! expands to the function unchanged, and:
//!
//! ```ignore
//! const _: () = {
//!     #[linkme::distributed_slice(crate::support::harness::TESTS)]
//!     static TEST: crate::support::harness::Test = crate::support::harness::Test {
//!         module: module_path!(),
//!         name: "a_payment_is_created_with_201_and_its_location",
//!         citus: false,
//!         citus_only: false,
//!         bench: false,
//!         run: || Box::pin(a_payment_is_created_with_201_and_its_location()),
//!     };
//! };
//! ```
//!
//! A `#[cfg(...)]` on the function applies to its entry too.
//!
//! `#[api_test(citus)]` also puts the test in the cluster suite (`IDEMPAY_TEST_CITUS=1`, which
//! runs only those tests, on a Citus cluster); `#[api_test(citus_only)]` puts it there alone: a
//! test of the cluster itself, ignored on a single server. `#[api_test(bench)]` is a measurement
//! a bench script runs with `--ignored` against a database it started: ignored by the suite.

use proc_macro::{Delimiter, TokenStream, TokenTree};

#[proc_macro_attribute]
pub fn api_test(arguments: TokenStream, function: TokenStream) -> TokenStream {
    let (citus, citus_only, bench) = match arguments.to_string().trim() {
        "" => (false, false, false),
        "citus" => (true, false, false),
        "citus_only" => (true, true, false),
        "bench" => (false, false, true),
        _ => return error("#[api_test] takes no argument, `citus`, `citus_only` or `bench`"),
    };
    let tokens: Vec<TokenTree> = function.clone().into_iter().collect();
    let Some(name) = name_of(&tokens) else {
        return error("#[api_test] goes on an `async fn` with no arguments");
    };
    let cfgs: String = cfg_attributes(&tokens).concat();
    let entry = format!(
        "{cfgs} const _: () = {{
            #[::linkme::distributed_slice(crate::support::harness::TESTS)]
            static TEST: crate::support::harness::Test = crate::support::harness::Test {{
                module: ::core::module_path!(),
                name: \"{name}\",
                citus: {citus},
                citus_only: {citus_only},
                bench: {bench},
                run: || ::std::boxed::Box::pin({name}()),
            }};
        }};"
    );
    let mut expanded = function;
    expanded.extend(
        entry
            .parse::<TokenStream>()
            .expect("the entry is valid Rust"),
    );
    expanded
}

/// The name of the function, if it is an `async fn` without parameters.
fn name_of(tokens: &[TokenTree]) -> Option<String> {
    let at = tokens
        .iter()
        .position(|token| matches!(token, TokenTree::Ident(ident) if ident.to_string() == "fn"))?;
    let is_async = tokens[..at]
        .iter()
        .any(|token| matches!(token, TokenTree::Ident(ident) if ident.to_string() == "async"));
    let name = match tokens.get(at + 1)? {
        TokenTree::Ident(name) => name.to_string(),
        _ => return None,
    };
    let no_parameters = matches!(
        tokens.get(at + 2)?,
        TokenTree::Group(group) if group.delimiter() == Delimiter::Parenthesis && group.stream().is_empty()
    );
    (is_async && no_parameters).then_some(name)
}

/// The `#[cfg(...)]` attributes on the function, as written.
fn cfg_attributes(tokens: &[TokenTree]) -> Vec<String> {
    tokens
        .windows(2)
        .filter_map(|pair| match pair {
            [TokenTree::Punct(hash), TokenTree::Group(group)]
                if hash.as_char() == '#'
                    && group.delimiter() == Delimiter::Bracket
                    && group
                        .stream()
                        .into_iter()
                        .next()
                        .is_some_and(|first| first.to_string() == "cfg") =>
            {
                Some(format!("#{group}"))
            }
            _ => None,
        })
        .collect()
}

fn error(message: &str) -> TokenStream {
    format!("::core::compile_error!({message:?});")
        .parse()
        .expect("compile_error! is valid Rust")
}
