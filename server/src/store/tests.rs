//! Two nodes with their own local folders over one store, a real S3 server (s3s over s3s-fs) and a `file://`
//! folder: uploads named against the store, files brought in where prompts and `/view` need them, stale copies
//! replaced, save-node names claimed once.

use std::sync::Arc;

use kiln_engine::nodes::FileKind;
use kiln_engine::roots::{Roots, SharedFiles as _};
use kiln_tests::s3::{ACCESS_KEY, S3Server, SECRET_KEY};
use serde_json::json;

use super::{Store, WorkspaceFiles};
use crate::files::{Upload, ViewError, ViewRequest, store_upload, view_stored};

/// A node's local folders.
fn roots(dir: &std::path::Path, node: &str) -> Roots {
    let roots = Roots {
        input: dir.join(node).join("input"),
        output: dir.join(node).join("output"),
        temp: dir.join(node).join("temp"),
    };
    for folder in [&roots.input, &roots.output, &roots.temp] {
        std::fs::create_dir_all(folder).expect("a folder");
    }
    roots
}

fn upload<'a>(name: &'a str, bytes: &'a [u8], overwrite: bool) -> Upload<'a> {
    Upload { filename: name, bytes, kind: FileKind::Input, subfolder: "", overwrite }
}

/// What the two nodes see, through the store at `url`.
fn two_nodes_share_files(url: String) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let store: Arc<Store> = runtime.block_on(Store::open(&url)).expect("the store opens");
    let dir = tempfile::tempdir().expect("a folder");
    let (roots_a, roots_b) = (roots(dir.path(), "a"), roots(dir.path(), "b"));
    let a = WorkspaceFiles::new(store.clone(), "default".into(), roots_a.clone());
    let b = WorkspaceFiles::new(store.clone(), "default".into(), roots_b.clone());

    // Uploads are named against the store: another node's file of that name counts.
    let stored = store_upload(&roots_a, &upload("cat.png", b"first", false), Some(&a)).expect("up");
    assert_eq!(stored.name, "cat.png");
    let stored = store_upload(&roots_b, &upload("cat.png", b"other", false), Some(&b)).expect("up");
    assert_eq!(stored.name, "cat (1).png");
    let stored = store_upload(&roots_b, &upload("cat.png", b"first", false), Some(&b)).expect("up");
    assert_eq!(stored.name, "cat.png", "the same bytes reuse the name");

    // A prompt naming a file brings it in; a stale copy is replaced.
    let prompt = json!({"1": {"class_type": "LoadImage", "inputs": {"image": "cat (1).png"}},
                        "2": {"class_type": "LoadImage", "inputs": {"image": "cat.png"}},
                        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat on a mat."}}});
    a.bring_named(&prompt).expect("brought");
    assert_eq!(std::fs::read(roots_a.input.join("cat (1).png")).expect("copy"), b"other");
    store_upload(&roots_b, &upload("cat.png", b"replaced", true), Some(&b)).expect("overwrite");
    assert_eq!(std::fs::read(roots_a.input.join("cat.png")).expect("copy"), b"first");
    a.bring_named(&prompt).expect("brought");
    assert_eq!(std::fs::read(roots_a.input.join("cat.png")).expect("copy"), b"replaced");

    // A third node's listing brings the input folder in.
    let roots_c = roots(dir.path(), "c");
    let c = WorkspaceFiles::new(store.clone(), "default".into(), roots_c.clone());
    c.bring_folder(FileKind::Input).expect("listed");
    let mut listed: Vec<String> = std::fs::read_dir(&roots_c.input)
        .expect("the folder")
        .map(|e| e.expect("an entry").file_name().into_string().expect("a name"))
        .collect();
    listed.sort();
    assert_eq!(listed, ["cat (1).png", "cat.png"]);

    // Save nodes: a name is claimed once across nodes, and the file published is what /view serves elsewhere.
    assert!(a.claim(FileKind::Output, "", "ComfyUI_00001_.png").expect("claimed"));
    assert!(!b.claim(FileKind::Output, "", "ComfyUI_00001_.png").expect("asked"), "claimed once");
    let written = roots_a.output.join("ComfyUI_00001_.png");
    std::fs::write(&written, b"pixels").expect("written");
    a.publish(FileKind::Output, "", "ComfyUI_00001_.png", &written).expect("published");
    assert_eq!(b.names(FileKind::Output, "", "ComfyUI").expect("names"), ["ComfyUI_00001_.png"]);
    let request = ViewRequest {
        filename: Some("ComfyUI_00001_.png".to_owned()),
        kind: Some(FileKind::Output),
        ..ViewRequest::default()
    };
    let served = view_stored(&roots_b, Some(&b), &request).expect("served from the store");
    assert_eq!(served.bytes, b"pixels");
    assert!(!roots_b.output.join("ComfyUI_00001_.png").exists(), "read from the store, not copied");
    let range = ViewRequest { range: Some("bytes=1-3".to_owned()), ..request.clone() };
    let served = view_stored(&roots_b, Some(&b), &range).expect("a range from the store");
    assert_eq!(
        (served.bytes.as_slice(), served.extent.content_range()),
        (&b"ixe"[..], Some("bytes 1-3/6".to_owned()))
    );
    let escape = ViewRequest { subfolder: Some("../../a/input".to_owned()), ..request.clone() };
    assert_eq!(view_stored(&roots_b, Some(&b), &escape).unwrap_err(), ViewError::OutsideRoot);
    // A subfolder's names, and a claim given up.
    assert!(a.claim(FileKind::Temp, "previews", "p_00001_.png").expect("claimed"));
    assert_eq!(b.names(FileKind::Temp, "previews", "p_").expect("names"), ["p_00001_.png"]);
    a.release(FileKind::Temp, "previews", "p_00001_.png");
    assert!(b.names(FileKind::Temp, "previews", "p_").expect("names").is_empty());
    // Another workspace sees none of it.
    let other = WorkspaceFiles::new(store, "other".into(), roots(dir.path(), "d"));
    assert!(other.names(FileKind::Output, "", "ComfyUI").expect("names").is_empty());
}

#[test]
fn nodes_share_files_through_s3() {
    let server = S3Server::start("store");
    let url =
        format!("{}&access_key_id={ACCESS_KEY}&secret_access_key={SECRET_KEY}", server.store_url());
    two_nodes_share_files(url);
    assert!(server.object_file("default/input/cat.png").is_file(), "keys are workspace/kind/name");
}

#[test]
fn an_unchanged_copy_is_not_fetched_again() {
    let server = S3Server::start("fresh");
    let url =
        format!("{}&access_key_id={ACCESS_KEY}&secret_access_key={SECRET_KEY}", server.store_url());
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let store: Arc<Store> = runtime.block_on(Store::open(&url)).expect("the store opens");
    let dir = tempfile::tempdir().expect("a folder");
    let (roots_a, roots_b) = (roots(dir.path(), "a"), roots(dir.path(), "b"));
    let a = WorkspaceFiles::new(store.clone(), "default".into(), roots_a.clone());
    let b = WorkspaceFiles::new(store, "default".into(), roots_b.clone());
    store_upload(&roots_a, &upload("dog.png", b"woof", false), Some(&a)).expect("up");
    let prompt = json!({"1": {"class_type": "LoadImage", "inputs": {"image": "dog.png"}}});
    let gets = server.gets();
    b.bring_named(&prompt).expect("brought");
    assert_eq!(server.gets(), gets + 1, "fetched once");
    b.bring_named(&prompt).expect("brought");
    b.bring_folder(FileKind::Input).expect("listed");
    a.bring_named(&prompt).expect("brought");
    assert_eq!(server.gets(), gets + 1, "neither node fetches a copy it has again");
    // An upload of other bytes under the same name (overwrite) is fetched once more, by the other node only.
    store_upload(&roots_a, &upload("dog.png", b"grr", true), Some(&a)).expect("overwrite");
    b.bring_named(&prompt).expect("brought");
    a.bring_named(&prompt).expect("brought");
    assert_eq!(server.gets(), gets + 2);
    assert_eq!(std::fs::read(roots_b.input.join("dog.png")).expect("copy"), b"grr");
    // A claimed name whose file never came is no file to bring or serve.
    assert!(a.claim(FileKind::Output, "", "x_00001_.png").expect("claimed"));
    assert!(!b.bring(FileKind::Output, "x_00001_.png").expect("asked"));
    assert_eq!(b.size(FileKind::Output, "x_00001_.png").expect("asked"), None);
}

#[test]
fn nodes_share_files_through_a_folder() {
    let dir = tempfile::tempdir().expect("a folder");
    two_nodes_share_files(format!("file://{}", dir.path().join("store").display()));
    assert!(dir.path().join("store/default/output/ComfyUI_00001_.png").is_file());
}

#[test]
fn store_urls_kiln_does_not_read_are_refused_by_name() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let refused = |url: &str| runtime.block_on(Store::open(url)).expect_err(url).to_string();
    assert!(refused("gs://bucket").contains("not gs://"), "{}", refused("gs://bucket"));
    assert!(refused("s3://kiln?colour=blue").contains("unknown S3 setting `colour`"));
    assert!(refused("no url").contains("--store"));
    // A store that cannot be reached stops the start, naming it.
    let unreachable = "s3://kiln?endpoint=http://127.0.0.1:9&allow_http=true&region=us-east-1\
                       &access_key_id=a&secret_access_key=b";
    assert!(
        refused(unreachable).contains("the object store s3://kiln"),
        "{}",
        refused(unreachable)
    );
}

#[test]
fn an_upload_whose_name_is_a_folder_in_the_store_takes_the_next_name() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let dir = tempfile::tempdir().expect("a folder");
    let url = format!("file://{}", dir.path().join("store").display());
    let store: Arc<Store> = runtime.block_on(Store::open(&url)).expect("the store opens");
    let (roots_a, roots_b) = (roots(dir.path(), "a"), roots(dir.path(), "b"));
    let a = WorkspaceFiles::new(store.clone(), "default".into(), roots_a.clone());
    let b = WorkspaceFiles::new(store, "default".into(), roots_b.clone());
    let in_folder = Upload { subfolder: "pic.png", ..upload("x.png", b"x", false) };
    store_upload(&roots_a, &in_folder, Some(&a)).expect("up");
    let stored = store_upload(&roots_b, &upload("pic.png", b"y", false), Some(&b)).expect("up");
    assert_eq!(stored.name, "pic (1).png");
}
