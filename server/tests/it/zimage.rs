//! Issue #11 through the real `kiln` binary (behind the contract proxy): the frontend's default Z-Image-Turbo
//! workflow, on tiny random-weight files saved under the released file names, runs to an image; a second
//! prompt with the same models loads nothing; files Kiln cannot run fail with a message naming them.

use kiln_client::{Client, types};
use kiln_models::synth::{self, SynthDtype, ZImageTurboSet};
use serde_json::{Value, json};

use crate::binary::{start, temp_dir};

fn client(addr: &str) -> Client {
    Client::with_timeout(&format!("http://{addr}"), std::time::Duration::from_secs(300))
        .expect("client")
}

/// The default graph's prompt as the frontend sends it (models.md §1.1), at `size`² and `steps` steps.
fn default_workflow(seed: u64, size: u32, steps: u32) -> Value {
    json!({
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["65", 0]}},
        "62": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_3_4b.safetensors", "type": "lumina2", "device": "default"}},
        "63": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "65": {"class_type": "VAEDecode", "inputs": {"samples": ["70", 0], "vae": ["63", 0]}},
        "66": {"class_type": "UNETLoader", "inputs": {"unet_name": "z_image_turbo_bf16.safetensors", "weight_dtype": "default"}},
        "67": {"class_type": "CLIPTextEncode", "inputs": {"text": "anime RPG game style, cute anime girl", "clip": ["62", 0]}},
        "68": {"class_type": "EmptySD3LatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "69": {"class_type": "ModelSamplingAuraFlow", "inputs": {"shift": 3, "model": ["66", 0]}},
        "70": {"class_type": "KSampler", "inputs": {"seed": seed, "steps": steps, "cfg": 1, "sampler_name": "res_multistep", "scheduler": "simple", "denoise": 1, "model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["68", 0]}},
        "71": {"class_type": "CLIPTextEncode", "inputs": {"text": "low quality, bad anatomy", "clip": ["62", 0]}},
    })
}

fn request(prompt: Value) -> types::PromptRequest {
    serde_json::from_value(json!({"prompt": prompt})).expect("a prompt request")
}

fn cached_nodes(run: &kiln_client::PromptRun) -> Vec<String> {
    let messages = &run.history.status.messages;
    let cached = messages.iter().find(|m| m.0[0].0.as_str() == Some("execution_cached"));
    let nodes = cached.map(|m| m.0[1].0["nodes"].clone()).unwrap_or_default();
    let mut nodes: Vec<String> = serde_json::from_value(nodes).unwrap_or_default();
    nodes.sort();
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_11_the_default_workflow_runs_on_tiny_synthetic_files() {
    let data_dir = temp_dir("zimage");
    let models = data_dir.join("models");
    synth::write_models_dir(&models, &ZImageTurboSet::tiny(), SynthDtype::Bf16, 7, &mut |_, _| {})
        .expect("tiny files");
    let (server, addr) = start(&data_dir);
    let kiln = client(&addr);

    // The loaders list the files found.
    let info = kiln.get_node_info("UNETLoader").await.expect("object_info").into_inner();
    assert!(
        serde_json::to_string(&info).expect("json").contains("z_image_turbo_bf16.safetensors"),
        "UNETLoader lists the file"
    );

    let run = kiln.run_prompt(request(default_workflow(42, 64, 2))).await.expect("the prompt runs");
    assert_eq!(
        run.history.status.status_str,
        types::HistoryStatusStr::Success,
        "{:?}",
        run.history
    );
    let image = &run.history.outputs["9"].images[0];
    assert_eq!(image.filename, "ComfyUI_00001_.png");
    let png = kiln
        .view_file(None, Some(&image.filename), None, None, Some(types::FileType::Output), None)
        .await
        .expect("view");
    use futures::TryStreamExt as _;
    let png: Vec<u8> =
        png.into_inner().into_inner().try_collect::<Vec<_>>().await.expect("body").concat();
    let decoded = image::load_from_memory(&png).expect("a PNG").to_rgb8();
    assert_eq!(decoded.dimensions(), (64, 64));
    let pixels = decoded.as_raw();
    assert!(
        pixels.iter().any(|&p| p != pixels[0]),
        "a random-weight model still draws something that is not one flat colour"
    );

    // Another seed: the loaders, the text encodes and the empty latent come from the cache (no disk read).
    let again = kiln.run_prompt(request(default_workflow(43, 64, 2))).await.expect("runs again");
    assert_eq!(again.history.status.status_str, types::HistoryStatusStr::Success);
    assert_eq!(cached_nodes(&again), ["62", "63", "66", "67", "68", "69", "71"]);

    // /free unloads the models' weights; the next prompt runs.
    let answer = reqwest::Client::new()
        .post(format!("http://{addr}/api/free"))
        .json(&json!({"unload_models": true}))
        .send()
        .await
        .expect("kiln answers");
    assert_eq!(answer.status(), 200);
    let mut freed = None;
    for _ in 0..100 {
        freed = server.log().iter().find_map(|line| {
            let rest = line.split("freed=").nth(1)?;
            line.contains("unloaded every model").then(|| {
                rest.split(|c: char| !c.is_ascii_digit()).next().unwrap_or("0").parse::<u64>().ok()
            })?
        });
        if freed.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // On the CPU the weights are read where they lie in their files, so there are no device pages to free:
    // the unload runs and reports what it freed (0 here).
    assert!(freed.is_some(), "weights were unloaded: {:?}", server.log());
    let after =
        kiln.run_prompt(request(default_workflow(44, 64, 2))).await.expect("runs after /free");
    assert_eq!(after.history.status.status_str, types::HistoryStatusStr::Success);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_11_a_file_of_another_kind_fails_with_a_message_naming_it() {
    let data_dir = temp_dir("zimage-wrong-file");
    let models = data_dir.join("models");
    synth::write_models_dir(&models, &ZImageTurboSet::tiny(), SynthDtype::Bf16, 7, &mut |_, _| {})
        .expect("tiny files");
    // A VAE saved where a diffusion model belongs.
    std::fs::copy(
        models.join(synth::VAE_FILE),
        models.join("diffusion_models/not_a_dit.safetensors"),
    )
    .expect("copy");
    let (_server, addr) = start(&data_dir);
    let kiln = client(&addr);
    let mut prompt = default_workflow(1, 64, 1);
    prompt["66"]["inputs"]["unet_name"] = json!("not_a_dit.safetensors");
    let error = match kiln.run_prompt(request(prompt)).await {
        Err(kiln_client::RunError::Execution(error)) => error,
        other => panic!("expected an execution error, got {other:?}"),
    };
    assert_eq!(error.node_id, "66");
    assert_eq!(error.exception_type, "RuntimeError");
    let message = &error.exception_message;
    assert!(
        message.contains("not_a_dit.safetensors") && message.contains("autoencoder"),
        "the message names the file and what it is: {message}"
    );

    // An unknown sampler is refused before anything runs, naming the input.
    let mut prompt = default_workflow(1, 64, 1);
    prompt["70"]["inputs"]["sampler_name"] = json!("dpmpp_4m_sde");
    match kiln.execute_prompt(None, &request(prompt)).await {
        Err(progenitor_client::Error::ErrorResponse(e)) => {
            assert_eq!(e.status().as_u16(), 400);
            let errors = &e.node_errors["70"].errors;
            assert_eq!(errors[0].type_, "value_not_in_list", "{errors:?}");
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_11_latent_previews_reach_the_socket_when_the_prompt_asks_for_them() {
    use futures::StreamExt as _;
    use kiln_client::Event;

    let data_dir = temp_dir("zimage-previews");
    synth::write_models_dir(
        &data_dir.join("models"),
        &ZImageTurboSet::tiny(),
        SynthDtype::Bf16,
        7,
        &mut |_, _| {},
    )
    .expect("tiny files");
    let (_server, addr) = start(&data_dir);
    let kiln = client(&addr);
    let client_id = "previewer";
    let mut events = kiln.events(client_id).await.expect("a socket");
    // The greeting `status` says the socket is registered.
    while let Some(event) = events.next().await {
        if matches!(event.expect("an event"), Event::Message(m) if matches!(*m, types::WsMessage::StatusMessage(_)))
        {
            break;
        }
    }
    let request: types::PromptRequest = serde_json::from_value(json!({
        "prompt": default_workflow(5, 64, 3),
        "client_id": client_id,
        "extra_data": {"preview_method": "latent2rgb"},
    }))
    .expect("a prompt request");
    kiln.execute_prompt(None, &request).await.expect("accepted");
    let mut previews = Vec::new();
    while let Some(event) = events.next().await {
        match event.expect("an event") {
            Event::Binary { event_type, payload } => previews.push((event_type, payload)),
            Event::Message(m) => {
                if let types::WsMessage::ExecutingMessage(m) = *m
                    && m.data.node.is_none()
                {
                    break;
                }
            }
            Event::Other(_) => {}
        }
    }
    assert_eq!(previews.len(), 3, "one preview per step");
    for (event_type, payload) in &previews {
        assert_eq!(*event_type, 1, "PREVIEW_IMAGE");
        assert_eq!(payload[..4], 1u32.to_be_bytes(), "JPEG");
        let image = image::load_from_memory(&payload[4..]).expect("a JPEG");
        assert_eq!((image.width(), image.height()), (8, 8), "at latent resolution");
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// `kiln model synth --family F --name PATH` writes one file of that family under the name a template asks for,
/// inside the models folder only.
#[test]
fn model_synth_writes_one_file_of_a_family_under_any_name() {
    let data_dir = temp_dir("synth-family");
    let models = data_dir.join("models");
    let synth = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["model", "synth", "--size", "tiny", "--models-dir"])
            .arg(&models)
            .args(args)
            .output()
            .expect("kiln runs")
    };
    let name = "loras/pixel_art_style_z_image_turbo.safetensors";
    let output = synth(&["--family", "z-image-lora", "--name", name]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let file = kiln_engine::kiln_compute::memory::SafetensorsFile::open(models.join(name))
        .expect("a safetensors file");
    assert!(
        file.tensors()
            .all(|(key, _)| key.starts_with("diffusion_model.") && key.contains(".lora_"))
    );

    let output = synth(&["--family", "qwen3", "--name", "../escaped.safetensors"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("a path inside the models folder"), "{stderr}");
    assert!(!data_dir.join("escaped.safetensors").exists());
    let output = synth(&["--family", "qwen3"]);
    assert!(!output.status.success(), "--family needs --name");
    let output = synth(&["--family", "sd15", "--name", "checkpoints/x.safetensors"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("unknown family `sd15`"), "{stderr}");
    let _ = std::fs::remove_dir_all(&data_dir);
}
