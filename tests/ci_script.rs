//! `.ci/run` against the tests it runs: every `*_REQUIRE_*` variable a test reads to turn a visible
//! skip into a failure is exported there (a test whose variable CI forgot would skip in CI
//! instead of failing), and it runs the README's test command.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, skipping build output.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target" && name != ".git" && name != "fuzz" {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The quoted `VRAMTRACE_…REQUIRE_…` names in `text`.
fn required_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, _) in text.match_indices("\"VRAMTRACE_") {
        let rest = &text[i + 1..];
        let end = rest
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(rest.len());
        let name = &rest[..end];
        if name.contains("REQUIRE_") && rest[end..].starts_with('"') {
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn ci_sets_every_require_variable_the_tests_read() {
    let mut files = Vec::new();
    for dir in ["src", "tests", "testbed", "probes", "viewer", "models"] {
        rust_files(&root().join(dir), &mut files);
    }
    let mut read = BTreeSet::new();
    for f in &files {
        if f.ends_with("tests/ci_script.rs") {
            continue;
        }
        read.extend(required_names(&std::fs::read_to_string(f).unwrap()));
    }
    // The scan finds the ones known to exist: a scan that found none would pass vacuously.
    for known in [
        "VRAMTRACE_REQUIRE_ROOT",
        "VRAMTRACE_REQUIRE_SCRIPT",
        "VRAMTRACE_TEST_REQUIRE_PYTHON",
        "VRAMTRACE_REQUIRE_LDD",
    ] {
        assert!(read.contains(known), "{known} not found among {read:?}");
    }
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    let exported: BTreeSet<&str> = ci
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("export "))
        .flat_map(str::split_whitespace)
        .filter_map(|kv| kv.strip_suffix("=1"))
        .collect();
    let missing: Vec<&String> = read
        .iter()
        .filter(|n| !exported.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        ".ci/run does not export {missing:?}=1: those tests would skip in CI instead of failing"
    );
}

#[test]
fn ci_runs_the_readme_test_command() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let at = readme
        .find("Run the tests:")
        .expect("README says how to run the tests");
    let block = &readme[at..];
    let start = block.find("```sh\n").unwrap() + "```sh\n".len();
    let command = block[start..].lines().next().unwrap().trim();
    assert!(command.starts_with("cargo test"), "{command}");
    assert!(command.contains("--no-fail-fast"), "{command}");
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim() == command),
        ".ci/run does not run the README's `{command}`"
    );
}
