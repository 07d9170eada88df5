//! The declarations against ComfyUI: the golden captures where one exists (`KSampler`,
//! `CheckpointLoaderSimple`), the key facts of `nodes.py` and `comfy_extras` for the others.

use serde_json::{Value as Json, json};

use super::*;
use crate::nodes::InputType;

/// The samplers Kiln implements, in ComfyUI's order.
const SAMPLERS: &[&str] =
    &["euler", "euler_ancestral", "heun", "dpmpp_2m", "dpmpp_2m_sde", "lcm", "res_multistep"];
/// The schedulers Kiln implements, in ComfyUI's order.
const SCHEDULERS: &[&str] = &["simple", "sgm_uniform", "karras", "exponential", "beta", "normal"];

/// The `object_info` entry of `class` in its golden capture.
fn golden(class: &str) -> Json {
    let dir =
        std::env::var_os("KILN_GOLDEN_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/comfyui")
        });
    let path = dir.join(format!("get_object_info_{class}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let capture: Json = serde_json::from_str(&text).expect("a JSON capture");
    capture["response"]["body"]["json"][class].clone()
}

/// `expected` with its legacy-combo choices cut down to `keep`, in their order.
fn filter_choices(expected: &Json, keep: &[&str]) -> Json {
    let mut out = expected.clone();
    if let Some(list) = out[0].as_array_mut() {
        list.retain(|c| c.as_str().is_some_and(|c| keep.contains(&c)));
    }
    out
}

/// Compares a spec with a golden `object_info` entry: every input (type, options and their key order, input
/// order), outputs, names, texts and search aliases. `adjust` may rewrite a golden input spec first.
fn assert_matches_golden(spec: &NodeSpec, golden: &Json, adjust: impl Fn(&str, &Json) -> Json) {
    let class = &spec.name;
    let required = golden["input"]["required"].as_object().expect("required inputs");
    let names: Vec<&str> = spec.required.iter().map(|d| d.name.as_str()).collect();
    let order: Vec<&str> = golden["input_order"]["required"]
        .as_array()
        .expect("order")
        .iter()
        .filter_map(Json::as_str)
        .collect();
    assert_eq!(names, order, "{class}: input order");
    for def in &spec.required {
        let mut expected = adjust(&def.name, &required[&def.name]);
        if expected.as_array().is_some_and(|a| a.len() == 1) {
            expected.as_array_mut().expect("array").push(json!({}));
        }
        // Strings compare key order too.
        assert_eq!(
            serde_json::to_string(&def.config_json()).expect("JSON"),
            serde_json::to_string(&expected).expect("JSON"),
            "{class}: input {}",
            def.name
        );
    }
    assert!(spec.optional.is_empty() && golden["input"].get("optional").is_none(), "{class}");
    let types: Vec<&str> = spec.outputs.iter().map(|o| o.ty.as_str()).collect();
    let output_names: Vec<&str> = spec.outputs.iter().map(|o| o.name.as_str()).collect();
    let tooltips: Vec<&str> = spec.outputs.iter().filter_map(|o| o.tooltip.as_deref()).collect();
    assert_eq!(json!(types), golden["output"], "{class}: outputs");
    assert_eq!(json!(output_names), golden["output_name"], "{class}: output names");
    assert_eq!(json!(tooltips), golden["output_tooltips"], "{class}: output tooltips");
    assert!(spec.outputs.iter().all(|o| !o.is_list) && spec.extra_output_tooltips.is_empty());
    assert_eq!(json!(spec.display_name), golden["display_name"], "{class}");
    assert_eq!(json!(spec.description), golden["description"], "{class}");
    assert_eq!(json!(spec.category), golden["category"], "{class}");
    assert_eq!(json!(spec.python_module), golden["python_module"], "{class}");
    assert_eq!(json!(spec.search_aliases), golden["search_aliases"], "{class}");
    assert_eq!(
        spec.essentials_category.as_deref(),
        golden["essentials_category"].as_str(),
        "{class}"
    );
    assert_eq!(json!(spec.output_node), golden["output_node"], "{class}");
    assert_eq!(json!(spec.is_input_list), golden["is_input_list"], "{class}");
    assert!(!spec.v3, "{class} is a V1 node");
}

#[test]
fn ksampler_matches_the_golden_capture_with_kilns_samplers() {
    let spec = ksampler(SAMPLERS, SCHEDULERS);
    assert_matches_golden(&spec, &golden("KSampler"), |name, expected| match name {
        "sampler_name" => filter_choices(expected, SAMPLERS),
        "scheduler" => filter_choices(expected, SCHEDULERS),
        _ => expected.clone(),
    });
    // Every sampler and scheduler Kiln lists is one of ComfyUI's.
    let golden = golden("KSampler");
    for (input, listed) in [("sampler_name", SAMPLERS), ("scheduler", SCHEDULERS)] {
        let all = golden["input"]["required"][input][0].as_array().expect("choices");
        assert!(listed.iter().all(|s| all.contains(&json!(s))), "{input}");
    }
}

#[test]
fn checkpoint_loader_matches_the_golden_capture() {
    // The capture was taken with an empty models folder; with files, the list is the caller's.
    assert_matches_golden(
        &checkpoint_loader_simple(Vec::new()),
        &golden("CheckpointLoaderSimple"),
        |_, e| e.clone(),
    );
    let files = vec!["a.safetensors".to_owned(), "sub/b.ckpt".to_owned()];
    let spec = checkpoint_loader_simple(files.clone());
    assert_eq!(spec.required[0].choices_list(), Some(vec!["a.safetensors", "sub/b.ckpt"]));
}

/// `[TYPE, options]` of an input.
fn config(spec: &NodeSpec, name: &str) -> Json {
    spec.input_def(name).unwrap_or_else(|| panic!("{}: no input {name}", spec.name)).0.config_json()
}

#[test]
fn loaders_list_the_given_files_and_comfyuis_choices() {
    let files = vec!["z_image_turbo_bf16.safetensors".to_owned()];
    let unet = unet_loader(files.clone());
    assert_eq!(
        (unet.display_name.as_str(), unet.category.as_str()),
        ("Load Diffusion Model", "model/loaders")
    );
    assert_eq!(config(&unet, "unet_name"), json!([["z_image_turbo_bf16.safetensors"], {}]));
    assert_eq!(
        serde_json::to_string(&config(&unet, "weight_dtype")).expect("JSON"),
        r#"[["default","fp8_e4m3fn","fp8_e4m3fn_fast","fp8_e5m2"],{"advanced":true}]"#
    );
    assert_eq!(unet.outputs, vec![OutputDef::new("MODEL")]);

    let clip = clip_loader(vec!["qwen_3_4b.safetensors".to_owned()]);
    assert_eq!(clip.display_name, "Load CLIP");
    let types = clip.input_def("type").expect("type").0.choices_list().expect("combo");
    assert_eq!(types.len(), 28);
    assert_eq!((types[0], types[8], types[27]), ("stable_diffusion", "lumina2", "minimax"));
    let (device, required) = clip.input_def("device").expect("device");
    assert!(!required);
    assert_eq!(device.config_json(), json!([["default", "cpu"], {"advanced": true}]));
    assert!(clip.description.starts_with("Recipes:\nsd: clip-l\n"));
    assert!(clip.description.contains("\nlumina2: gemma 2 2B\n"));
    assert_eq!(clip.outputs[0].ty, "CLIP");

    let vae = vae_loader(vec!["ae.safetensors".to_owned()]);
    assert_eq!((vae.display_name.as_str(), vae.outputs[0].ty.as_str()), ("Load VAE", "VAE"));
    assert_eq!(config(&vae, "vae_name"), json!([["ae.safetensors"], {}]));

    let lora = lora_loader_model_only(Vec::new());
    assert_eq!(lora.display_name, "Load LoRA");
    assert_eq!(
        serde_json::to_string(&config(&lora, "strength_model")).expect("JSON"),
        r#"["FLOAT",{"default":1.0,"min":-100.0,"max":100.0,"step":0.01}]"#
    );
    assert_eq!(lora.outputs.len(), 1);
    assert_eq!(lora.extra_output_tooltips, vec!["The modified CLIP model."]);
    assert_eq!(lora.essentials_category.as_deref(), Some("Image Generation"));
}

#[test]
fn model_and_conditioning_nodes_declare_comfyuis_inputs() {
    let aura = model_sampling_aura_flow();
    assert_eq!(aura.display_name, "ModelSamplingAuraFlow");
    assert_eq!(aura.python_module, "comfy_extras.nodes_model_advanced");
    assert_eq!(aura.category, "model/patch");
    assert_eq!(
        serde_json::to_string(&config(&aura, "shift")).expect("JSON"),
        r#"["FLOAT",{"default":1.73,"min":0.0,"max":100.0,"step":0.01}]"#
    );

    let encode = clip_text_encode();
    assert_eq!(
        serde_json::to_string(&config(&encode, "text")).expect("JSON"),
        r#"["STRING",{"multiline":true,"dynamicPrompts":true,"tooltip":"The text to be encoded."}]"#
    );
    assert_eq!(encode.search_aliases.len(), 8);
    assert_eq!(encode.outputs[0].ty, "CONDITIONING");
    assert!(encode.outputs[0].tooltip.is_some());

    let zero = conditioning_zero_out();
    assert_eq!(zero.search_aliases, vec!["null conditioning", "clear conditioning"]);
    let combine = conditioning_combine();
    assert_eq!(combine.display_name, "Conditioning (Combine)");
    assert_eq!(combine.essentials_category.as_deref(), Some("Image Generation"));
    assert_eq!(combine.required.len(), 2);
}

#[test]
fn empty_sd3_latent_image_is_a_v3_node_without_a_display_name() {
    let spec = empty_sd3_latent_image();
    assert!(spec.v3);
    assert_eq!(spec.declared_display_name(), None);
    assert_eq!(spec.python_module, "comfy_extras.nodes_sd3");
    assert_eq!(spec.category, "model/latent/stable diffusion");
    assert_eq!(
        serde_json::to_string(&config(&spec, "width")).expect("JSON"),
        r#"["INT",{"default":1024,"min":16,"max":16384,"step":16}]"#
    );
    assert_eq!(config(&spec, "batch_size"), json!(["INT", {"default": 1, "min": 1, "max": 4096}]));
    assert_eq!(spec.outputs, vec![OutputDef::new("LATENT")]);
    assert!(spec.search_aliases.is_empty() && spec.description.is_empty());
}

#[test]
fn samplers_and_vae_nodes_declare_comfyuis_inputs() {
    let advanced = ksampler_advanced(SAMPLERS, SCHEDULERS);
    assert_eq!(advanced.display_name, "KSampler (Advanced)");
    let names: Vec<&str> = advanced.required.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "model",
            "add_noise",
            "noise_seed",
            "steps",
            "cfg",
            "sampler_name",
            "scheduler",
            "positive",
            "negative",
            "latent_image",
            "start_at_step",
            "end_at_step",
            "return_with_leftover_noise",
        ]
    );
    assert_eq!(
        serde_json::to_string(&config(&advanced, "noise_seed")).expect("JSON"),
        r#"["INT",{"default":0,"min":0,"max":18446744073709551615,"control_after_generate":true}]"#
    );
    assert_eq!(config(&advanced, "sampler_name")[0], json!(SAMPLERS));
    assert_eq!(
        config(&advanced, "end_at_step"),
        json!(["INT", {"default": 10000, "min": 0, "max": 10000, "advanced": true}])
    );
    assert!(matches!(
        advanced.input_def("scheduler").expect("scheduler").0.ty,
        InputType::Choices(_)
    ));

    let decode = vae_decode();
    assert_eq!(
        (decode.display_name.as_str(), decode.category.as_str()),
        ("VAE Decode", "model/latent")
    );
    assert_eq!(decode.outputs[0].ty, "IMAGE");
    assert_eq!(decode.outputs[0].tooltip.as_deref(), Some("The decoded image."));
    let encode = vae_encode();
    assert_eq!(
        encode.required.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["pixels", "vae"]
    );
    assert_eq!(encode.outputs[0].ty, "LATENT");
}
