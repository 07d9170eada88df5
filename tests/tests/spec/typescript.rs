//! The TypeScript types for frontends: `client/typescript/src/schema.d.ts` is what openapi-typescript makes of
//! the spec today, and the example that uses it type-checks with `tsc --noEmit`.

use std::process::Command;

use kiln_tests::{npm_tool, repo_root};

#[test]
fn typescript_types_are_current() {
    let out = std::env::temp_dir().join(format!("kiln-schema-{}.d.ts", std::process::id()));
    let status = Command::new(npm_tool("openapi-typescript"))
        .current_dir(repo_root())
        .arg("spec/openapi.yaml")
        .arg("-o")
        .arg(&out)
        .output()
        .expect("openapi-typescript runs");
    assert!(
        status.status.success(),
        "openapi-typescript failed: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let fresh = std::fs::read_to_string(&out).expect("generated types readable");
    let _ = std::fs::remove_file(&out);
    let committed = std::fs::read_to_string(repo_root().join("client/typescript/src/schema.d.ts"))
        .unwrap_or_default();
    assert!(
        fresh == committed,
        "client/typescript/src/schema.d.ts is out of date: run `npm run gen:ts` and commit it"
    );
}

#[test]
fn typescript_example_typechecks() {
    let output = Command::new(npm_tool("tsc"))
        .current_dir(repo_root())
        .args(["--noEmit", "-p", "client/typescript"])
        .output()
        .expect("tsc runs");
    assert!(
        output.status.success(),
        "tsc --noEmit failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
