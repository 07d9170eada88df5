//! Every operation has a generated trait method, a route and a client method: counted from the generated
//! sources against the spec.

use kiln_server::api::OPERATIONS;
use kiln_tests::{load_spec, operations, repo_root};

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path))
        .unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

#[test]
fn every_operation_has_a_trait_method_a_route_and_a_client_method() {
    let spec_ops = operations(&load_spec());
    assert_eq!(OPERATIONS.len(), spec_ops.len(), "OPERATIONS lists every spec operation");

    let server = read("server/src/api/generated.rs");
    // One method per operation across the three traits (shared, local-only, cloud-only).
    let trait_body: String = ["pub trait SharedApi", "pub trait LocalApi", "pub trait CloudApi"]
        .iter()
        .map(|name| {
            server
                .split(name)
                .nth(1)
                .and_then(|rest| rest.split("\n}\n").next())
                .expect("the trait")
        })
        .collect();
    let trait_methods = trait_body.matches("\n    fn ").count();
    assert_eq!(trait_methods, spec_ops.len(), "one trait method per operation");
    let handlers = server.matches("\nasync fn handle_").count();
    assert_eq!(handlers, spec_ops.len(), "one handler (route) per operation");

    let client = read("client/src/generated.rs");
    let generated = client.matches("pub async fn ").count();
    let hand_written = kiln_codegen::HAND_WRITTEN.len();
    assert_eq!(
        generated + hand_written,
        spec_ops.len(),
        "one client method per operation (generated or by hand)"
    );
    for op in &spec_ops {
        let snake = heck_snake(op.operation_id());
        let by_hand = kiln_codegen::HAND_WRITTEN.iter().any(|(id, _)| *id == op.operation_id());
        assert!(
            by_hand || client.contains(&format!("pub async fn {snake}<")),
            "no generated client method for {}",
            op.operation_id()
        );
        assert!(
            trait_body.contains(&format!("fn {snake}(")),
            "no trait method for {}",
            op.operation_id()
        );
    }
}

/// camelCase → snake_case, as the generators name methods.
fn heck_snake(id: &str) -> String {
    let mut out = String::new();
    for (i, c) in id.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
