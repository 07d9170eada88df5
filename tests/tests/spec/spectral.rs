//! Spectral on the spec (0 errors, 0 warnings, snapshotted), and one bad-spec fixture per custom rule proving
//! the rule fires. Fixtures live in `spec/fixtures/<rule>/<case>.yaml`; each breaks exactly one rule.

use std::collections::BTreeSet;

use kiln_tests::{repo_root, spectral};

/// The rules `spec/.spectral.yaml` defines itself (those with a `given`), as opposed to severity overrides of
/// `spectral:oas` rules.
fn custom_rules() -> BTreeSet<String> {
    let text =
        std::fs::read_to_string(repo_root().join("spec/.spectral.yaml")).expect("ruleset readable");
    let ruleset: serde_yaml::Value = serde_yaml::from_str(&text).expect("ruleset is YAML");
    ruleset
        .get("rules")
        .and_then(serde_yaml::Value::as_mapping)
        .expect("ruleset has rules")
        .iter()
        .filter(|(_, rule)| rule.get("given").is_some())
        .filter_map(|(name, _)| name.as_str().map(str::to_owned))
        .collect()
}

/// `spec/fixtures/<rule>/<case>.yaml` for every fixture, as (rule, path relative to the root).
fn fixtures() -> Vec<(String, String)> {
    let dir = repo_root().join("spec/fixtures");
    let mut out = Vec::new();
    for rule in std::fs::read_dir(&dir).expect("spec/fixtures exists").flatten() {
        if !rule.path().is_dir() {
            continue;
        }
        let rule_name = rule.file_name().to_string_lossy().into_owned();
        for case in std::fs::read_dir(rule.path()).expect("fixture dir readable").flatten() {
            let file = case.file_name().to_string_lossy().into_owned();
            out.push((rule_name.clone(), format!("spec/fixtures/{rule_name}/{file}")));
        }
    }
    out.sort();
    out
}

#[test]
fn spec_lints_clean() {
    let results = spectral(&["spec/openapi.yaml"]);
    insta::assert_json_snapshot!("spectral_result", results);
    assert!(results.is_empty(), "spectral found problems in spec/openapi.yaml: {results:#?}");
}

#[test]
fn every_custom_rule_has_a_fixture_that_breaks_it_and_nothing_else() {
    let rules = custom_rules();
    let fixtures = fixtures();
    let covered: BTreeSet<_> = fixtures.iter().map(|(rule, _)| rule.clone()).collect();
    let uncovered: Vec<_> = rules.difference(&covered).collect();
    assert!(uncovered.is_empty(), "custom rules without a fixture: {uncovered:?}");
    let unknown: Vec<_> = covered.difference(&rules).collect();
    assert!(unknown.is_empty(), "fixture folders that name no custom rule: {unknown:?}");

    let mut files: Vec<&str> = fixtures.iter().map(|(_, path)| path.as_str()).collect();
    files.push("spec/fixtures/valid.yaml");
    let results = spectral(&files);
    let fired_in = |path: &str| -> BTreeSet<String> {
        results
            .iter()
            .filter(|r| r["source"].as_str().is_some_and(|s| s.ends_with(path)))
            .filter_map(|r| r["code"].as_str().map(str::to_owned))
            .filter(|code| rules.contains(code))
            .collect()
    };
    assert_eq!(
        fired_in("spec/fixtures/valid.yaml"),
        BTreeSet::new(),
        "the valid base fixture must lint clean"
    );
    for (rule, path) in &fixtures {
        assert_eq!(
            fired_in(path),
            BTreeSet::from([rule.clone()]),
            "{path} must break exactly `{rule}`"
        );
    }
}
