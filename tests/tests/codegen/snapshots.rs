//! insta snapshots of the generated sources, so a spec change is a reviewable diff, and the check that the
//! committed files are what kiln-codegen generates today.

use kiln_tests::repo_root;

#[test]
fn committed_generated_files_are_current() {
    let root = repo_root();
    let spec = std::fs::read_to_string(root.join("spec/openapi.yaml")).expect("spec readable");
    for file in kiln_codegen::generate_all(&spec, &root).expect("generation succeeds") {
        let committed = std::fs::read_to_string(root.join(&file.path)).unwrap_or_default();
        assert!(
            committed == file.contents,
            "{} is out of date: run `cargo run -p kiln-codegen`",
            file.path.display()
        );
        let name = file.path.to_string_lossy().replace(['/', '.'], "_");
        insta::assert_snapshot!(name, file.contents);
    }
}
