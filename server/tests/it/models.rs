//! Model folders on the real binary: ComfyUI's folder list, and the directories of ComfyUI
//! `extra_model_paths.yaml` files (`--extra-model-paths-config`) on every route that lists or reads models.
//! See: issue 9, item 5.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::binary::{start_with, temp_dir};
use crate::golden::golden;

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("directories");
    std::fs::write(path, bytes).expect("file written");
}

/// A safetensors file with no tensors and this `__metadata__`.
fn safetensors(metadata: Value) -> Vec<u8> {
    let header = json!({ "__metadata__": metadata }).to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes
}

async fn get(http: &reqwest::Client, addr: &str, path: &str) -> (u16, String) {
    let response = http.get(format!("http://{addr}{path}")).send().await.expect("kiln answers");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a body"))
}

async fn get_json(http: &reqwest::Client, addr: &str, path: &str) -> Value {
    let (status, body) = get(http, addr, path).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_9_models_lists_comfyuis_folders_in_its_order() {
    let data_dir = temp_dir("model-folders");
    let (_server, addr) = start_with(&data_dir, &[]);
    let (status, body) = get(&reqwest::Client::new(), &addr, "/models").await;
    assert_eq!(status, 200);
    let recorded = &golden("get_models")["response"]["body"]["json"];
    assert_eq!(recorded.as_array().map(Vec::len), Some(27));
    // The same names in the same order, byte for byte (Kiln writes JSON without spaces).
    assert_eq!(body, recorded.to_string());
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_9_extra_model_paths_files_add_their_directories_everywhere() {
    let root = temp_dir("extra-model-paths");
    let data_dir = root.join("kiln-data");
    let comfy = root.join("ComfyUI");
    let fast = root.join("fast");
    let shared_loras = root.join("shared-loras");
    write(&comfy.join("models/checkpoints/sd15.safetensors"), &safetensors(json!({})));
    write(&comfy.join("models/checkpoints/notes.txt"), b"not a model");
    write(&comfy.join("models/unet/flux.safetensors"), &safetensors(json!({"arch": "flux"})));
    write(&comfy.join("models/clip/t5.safetensors"), b"x");
    write(&comfy.join("models/loras/style.pt"), b"x");
    write(&comfy.join("models/embeddings/sub/easy.pt"), b"x");
    write(&shared_loras.join("detail.safetensors"), b"x");
    write(&fast.join("sd15.safetensors"), &safetensors(json!({"copy": "fast"})));
    write(&fast.join("turbo.ckpt"), b"x");
    write(&fast.join("turbo.webp"), b"RIFF-preview");
    write(&root.join("conf/ipa/face.bin"), b"x");
    write(&root.join("conf/ipa/readme.txt"), b"x");

    // The first file: a base path relative to the file, a multi-line value with a relative and an absolute
    // directory, legacy folder names, and a default section searched first.
    let first = root.join("conf/extra_model_paths.yaml");
    let text = format!(
        "comfyui:\n    base_path: ../ComfyUI\n    checkpoints: models/checkpoints\n    unet: models/unet\n    \
         loras: |\n        models/loras\n        {}\n    embeddings: models/embeddings\n\
         fast:\n    is_default: true\n    checkpoints: {}\n",
        shared_loras.display(),
        fast.display(),
    );
    write(&first, text.as_bytes());
    // The second: no base path (relative to the file), a legacy name, a folder ComfyUI does not know.
    let second = root.join("conf/more.yaml");
    write(&second, b"other:\n    clip: ../ComfyUI/models/clip\n    ipadapter: ipa\n");

    let flag = OsStr::new("--extra-model-paths-config");
    let args = [flag, first.as_os_str(), flag, second.as_os_str()];
    let (_server, addr) = start_with(&data_dir, &args);
    let http = reqwest::Client::new();
    let http = &http;

    let names = get_json(http, &addr, "/models").await;
    let names = names.as_array().expect("a list");
    assert_eq!(names.len(), 28);
    assert_eq!(names.last(), Some(&json!("ipadapter")), "an unknown folder comes last");
    assert_eq!(
        get_json(http, &addr, "/models/checkpoints").await,
        json!(["sd15.safetensors", "turbo.ckpt"]),
        "both directories, merged and sorted, models only"
    );
    let diffusion = get_json(http, &addr, "/models/diffusion_models").await;
    assert_eq!(diffusion, json!(["flux.safetensors"]), "`unet:` adds to diffusion_models");
    assert_eq!(get_json(http, &addr, "/models/text_encoders").await, json!(["t5.safetensors"]));
    assert_eq!(
        get_json(http, &addr, "/models/loras").await,
        json!(["detail.safetensors", "style.pt"]),
        "both lines of a multi-line value"
    );
    assert_eq!(get_json(http, &addr, "/models/ipadapter").await, json!(["face.bin", "readme.txt"]));
    assert_eq!(get_json(http, &addr, "/embeddings").await, json!(["sub/easy"]));
    // Listings know only real names, as ComfyUI's `folder in folder_names_and_paths`.
    assert_eq!(get(http, &addr, "/models/unet").await.0, 404);
    assert_eq!(get(http, &addr, "/experiment/models/clip").await.0, 404);

    let paths = get_json(http, &addr, "/internal/folder_paths").await;
    let ours = |sub: &str| data_dir.join(sub).display().to_string();
    let comfy_models = |sub: &str| comfy.join("models").join(sub).display().to_string();
    assert_eq!(
        paths["checkpoints"],
        json!([
            fast.display().to_string(),
            ours("models/checkpoints"),
            comfy_models("checkpoints"),
            ours("output/checkpoints")
        ]),
        "the default section's directory first, the others in order, then the output folder (as ComfyUI)"
    );
    assert_eq!(
        paths["diffusion_models"],
        json!([
            ours("models/unet"),
            ours("models/diffusion_models"),
            comfy_models("unet"),
            ours("output/diffusion_models")
        ])
    );
    assert_eq!(paths["ipadapter"], json!([root.join("conf/ipa").display().to_string()]));

    let experiment = get_json(http, &addr, "/experiment/models").await;
    let experiment = experiment.as_array().expect("a list");
    let checkpoints = experiment.iter().find(|f| f["name"] == "checkpoints").expect("checkpoints");
    assert_eq!(checkpoints["folders"], paths["checkpoints"]);
    assert!(experiment.iter().all(|f| f["name"] != "configs" && f["name"] != "custom_nodes"));
    let details = get_json(http, &addr, "/experiment/models/checkpoints").await;
    let found: Vec<(String, i64)> = details
        .as_array()
        .expect("a list")
        .iter()
        .map(|f| {
            (f["name"].as_str().expect("name").to_owned(), f["pathIndex"].as_i64().expect("index"))
        })
        .collect();
    assert_eq!(
        found,
        [
            ("sd15.safetensors".to_owned(), 0),
            ("turbo.ckpt".to_owned(), 0),
            ("sd15.safetensors".to_owned(), 2)
        ]
    );

    let (status, preview) =
        get(http, &addr, "/experiment/models/preview/checkpoints/0/turbo.ckpt").await;
    assert_eq!((status, preview.as_str()), (200, "RIFF-preview"));
    assert_eq!(
        get(http, &addr, "/experiment/models/preview/checkpoints/4/turbo.ckpt").await.0,
        404,
        "no directory at that index: nothing there"
    );
    let escape = "/experiment/models/preview/checkpoints/2/..%2F..%2F..%2Ffast%2Fturbo.ckpt";
    assert_eq!(get(http, &addr, escape).await.0, 403);

    // Metadata reads map legacy names (ComfyUI's `get_full_path`) and search the default directory first.
    let flux = json!({"arch": "flux"});
    for folder in ["unet", "diffusion_models"] {
        let path = format!("/view_metadata/{folder}?filename=flux.safetensors");
        assert_eq!(get_json(http, &addr, &path).await, flux, "{folder}");
    }
    let first_found =
        get_json(http, &addr, "/view_metadata/checkpoints?filename=sd15.safetensors").await;
    assert_eq!(first_found, json!({"copy": "fast"}));
    let outside = "/view_metadata/checkpoints?filename=../../fast/sd15.safetensors";
    assert_eq!(get(http, &addr, outside).await.0, 404);
    let _ = std::fs::remove_dir_all(&root);
}

/// Runs kiln with one extra model paths file; returns its stderr after checking that it failed.
fn refused(config: &Path) -> String {
    // What a user sees: without a backtrace requested (the test runner asks for one).
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .args(["--port", "0", "--data-dir"])
        .arg(temp_dir("bad-extra-model-paths-data"))
        .arg("--extra-model-paths-config")
        .arg(config)
        .output()
        .expect("kiln runs");
    assert!(!output.status.success(), "kiln started with {}", config.display());
    String::from_utf8_lossy(&output.stderr).trim().to_owned()
}

#[test]
fn issue_9_a_bad_extra_model_paths_file_stops_kiln_with_one_line_naming_it() {
    let dir = temp_dir("bad-extra-model-paths");
    let missing = dir.join("missing.yaml");
    let not_yaml = dir.join("not_yaml.yaml");
    write(&not_yaml, b"comfyui:\n  checkpoints: [unclosed\n");
    let wrong_shape = dir.join("wrong_shape.yaml");
    write(&wrong_shape, b"comfyui:\n  base_path: ~/ComfyUI\n  checkpoints: [a, b]\n");
    for (file, problem) in [
        (&missing, "cannot read it"),
        (&not_yaml, "not valid YAML"),
        (&wrong_shape, "`comfyui.checkpoints` is not a path"),
    ] {
        let stderr = refused(file);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&file.display().to_string()), "{stderr}");
        assert!(stderr.contains(problem), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
