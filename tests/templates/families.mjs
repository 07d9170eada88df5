// What the template suite knows of model files: which family a file belongs to (by its name, for the report
// and for "missing family"), which files Kiln can run and so `kiln model synth --family` writes, and which
// weight formats Kiln cannot read yet.
//
// A template's files are the strings its nodes' widgets hold that end in a model file extension, in the folder
// the template's `properties.models` entry names (else the folder the loader's widget reads).

/** File extensions of model files. */
const modelFile = /\.(safetensors|sft|gguf|ckpt|pt|pth|bin)$/i;

/** The model folder a node type's widget reads where it differs from `widgetFolders`. */
const nodeWidgetFolders = {
  'CLIPVisionLoader.clip_name': 'clip_vision',
  'LatentUpscaleModelLoader.model_name': 'latent_upscale_models',
  'ModelPatchLoader.name': 'model_patches',
  'StyleModelLoader.style_model_name': 'style_models',
};

/** The model folder a loader widget reads, for files a template does not list with a folder. */
const widgetFolders = {
  unet_name: 'diffusion_models',
  ckpt_name: 'checkpoints',
  clip_name: 'text_encoders',
  clip_name1: 'text_encoders',
  clip_name2: 'text_encoders',
  clip_name3: 'text_encoders',
  clip_name4: 'text_encoders',
  text_encoder: 'text_encoders',
  vae_name: 'vae',
  lora_name: 'loras',
  control_net_name: 'controlnet',
  style_model_name: 'style_models',
  model_name: 'upscale_models',
};

/** The folders whose file names the model a template runs (its family). */
const mainFolders = ['diffusion_models', 'checkpoints', 'unet'];

/**
 * The files Kiln runs, as `kiln model synth --family` writes them: the folder, how the name starts, and the
 * family. The rest of the name says the dtype (`_fp16` is f16, and so on; bf16 when it says nothing; the Flux
 * VAE is f32, as released) or a format Kiln cannot read yet. A file no entry matches makes its template
 * `missing family`. A synthetic file has the keys Kiln's synth writes for the family (a LoRA: diffusers' names),
 * which need not be the layout of the file the template links to: the suite measures nodes and networks, the
 * families' own tests the layouts.
 */
const kilnFiles = [
  { folder: 'diffusion_models', stem: /^z_image(_turbo)?[_.]/, family: 'z-image' },
  { folder: 'text_encoders', stem: /^qwen_3_4b[_.]/, family: 'qwen3' },
  { folder: 'vae', stem: /^ae\.safetensors$/, family: 'flux-vae', dtype: 'f32' },
  { folder: 'loras', stem: /z[_-]?image/i, family: 'z-image-lora' },
  // Qwen-Image's MMDiT (Edit 2511's synthetic file lacks its `__index_timestep_zero__` marker, so it runs with
  // the `index` reference method; the model's own tests cover the marker); Layered's has its own keys, and its
  // VAE reads and writes RGBA.
  { folder: 'diffusion_models', stem: /^qwen_image_layered/i, family: 'qwen-image-layered' },
  { folder: 'vae', stem: /^qwen_image_layered_vae\.safetensors$/, family: 'qwen-image-layered-vae' },
  { folder: 'diffusion_models', stem: /^qwen_image(?!.*layered)[_.]/i, family: 'qwen-image' },
  // FireRed-Image-Edit: a fine-tune of Qwen-Image-Edit (the same MMDiT).
  { folder: 'diffusion_models', stem: /^firered-image-edit/i, family: 'qwen-image' },
  // Chroma (Chroma1-HD): a FLUX.1 DiT on T5-XXL alone (CLIPLoader type `chroma`); Chroma Radiance, its trunk in
  // pixel space with a NeRF head (VAELoader's `pixel_space`).
  { folder: 'diffusion_models', stem: /^chroma1-hd[-_.]/i, family: 'chroma' },
  { folder: 'diffusion_models', stem: /^chroma-radiance/i, family: 'chroma-radiance' },
  // LongCat-Image (and its Edit model): a FLUX.1 DiT that ComfyUI tells by its 3584-wide text, so its
  // Qwen2.5-VL is written at that width (one layer, the real vocabulary: about 1 GB) and kept apart from the tiny
  // Qwen-Image one of the same name: under `longcat/`, the template's prompt naming it there (`beside`: only in
  // a template whose main model the rule matches).
  { folder: 'diffusion_models', stem: /^longcat_image(_edit)?[_.]/i, family: 'longcat-image' },
  { folder: 'text_encoders', stem: /^qwen_2\.5_vl_7b[_.]/, family: 'qwen25vl-longcat', beside: /^longcat_image/i, under: 'longcat' },
  { folder: 'text_encoders', stem: /^qwen_2\.5_vl_7b[_.]/, family: 'qwen25vl' },
  { folder: 'vae', stem: /^(qwen_image_vae|wan_2\.1_vae|Wan2_1_VAE_bf16)\.safetensors$/, family: 'wan21-vae' },
  // Qwen-Image's LoRAs, whatever their authors call them. Qwen 360 Diffusion's `int8-bf16` names the int8 base
  // it was trained against (its model card, and the template's note on the "int8-trained" LoRA); the file is bf16.
  { folder: 'loras', stem: /^qwen-360-diffusion/i, family: 'qwen-image-lora', dtype: 'bf16' },
  { folder: 'loras', stem: /qwen[_-]?image|qwen[_-]edit|_qwen\.|^firered-image-edit/i, family: 'qwen-image-lora' },
  // Qwen-Image's ControlNets: InstantX's (the inpainting one with its mask channel) and VideoX-Fun's.
  { folder: 'controlnet', stem: /^qwen-image-instantx-controlnet-inpainting/i, family: 'qwen-image-controlnet-inpaint' },
  { folder: 'controlnet', stem: /^qwen-image-instantx-controlnet/i, family: 'qwen-image-controlnet-instantx' },
  { folder: 'controlnet', stem: /^qwen-image(-2512)?-fun-controlnet/i, family: 'qwen-image-controlnet-fun' },
  // DiffSynth's block-wise ControlNets for Qwen-Image (model patches).
  { folder: 'model_patches', stem: /^qwen_image_.*diffsynth_controlnet/i, family: 'qwen-image-diffsynth-controlnet' },
  // FLUX.1: dev and its dev-architecture fine-tunes (Kontext, Krea), schnell (no guidance embedding), Fill (96
  // input channels); its text encoders, CLIP-L and T5-XXL (`DualCLIPLoader`, type `flux`).
  { folder: 'diffusion_models', stem: /^flux1-schnell[_.]/i, family: 'flux1-schnell' },
  { folder: 'checkpoints', stem: /^flux1-schnell[_.-]/i, family: 'flux1-schnell-checkpoint' },
  { folder: 'checkpoints', stem: /^flux1-dev[_.-]/i, family: 'flux1-dev-checkpoint' },
  // USO's style projector (its DiT LoRA is a FLUX.1 LoRA by name).
  { folder: 'model_patches', stem: /^uso-flux1-projector/i, family: 'uso-flux1-projector' },
  { folder: 'diffusion_models', stem: /^flux(1|\.1)-fill/i, family: 'flux1-fill' },
  { folder: 'diffusion_models', stem: /^flux1-(canny|depth)-dev[_.]/i, family: 'flux1-canny' },
  { folder: 'diffusion_models', stem: /^flux1-(dev|krea-dev)[_.-]/i, family: 'flux1' },
  { folder: 'loras', stem: /flux1[-_.]|flux\.1|removal_timestep_alpha/i, family: 'flux1-lora' },
  { folder: 'text_encoders', stem: /^clip_l\.safetensors$/, family: 'clip-l' },
  { folder: 'text_encoders', stem: /^t5xxl_(fp16|fp8_e4m3fn|fp8_e4m3fn_scaled)\.safetensors$/, family: 't5xxl' },
  // HiDream-I1 (full, dev, fast) and E1 (O1 is another model), and its four text encoders (QuadrupleCLIPLoader):
  // the long CLIP-L and CLIP-G, T5-XXL (FLUX.1's file) and Llama 3.1 8B Instruct.
  { folder: 'diffusion_models', stem: /^hidream_(i1|e1)_/i, family: 'hidream' },
  { folder: 'text_encoders', stem: /^clip_l_hidream\.safetensors$/, family: 'clip-l' },
  { folder: 'text_encoders', stem: /^clip_g_hidream\.safetensors$/, family: 'clip-g' },
  { folder: 'text_encoders', stem: /^llama_3\.1_8b_instruct[_.]/, family: 'llama3' },
  // CLIP vision towers (CLIPVisionLoader) and FLUX.1 Redux (StyleModelLoader).
  // ESRGAN upscale models (Real-ESRGAN ×4's RRDBNet; its ×2 and the ESRGAN+ variants are refused by name).
  { folder: 'upscale_models', stem: /^(RealESRGAN_x4plus(_anime_6B)?|4x[-_]?(UltraSharp|NMKD|foolhardy|Remacri)|ESRGAN_4x|BSRGAN)[_.]/i, family: 'esrgan-x4' },
  { folder: 'clip_vision', stem: /^clip_vision_h\.safetensors$/, family: 'clip-vision-h' },
  { folder: 'clip_vision', stem: /^clip_vision_g\.safetensors$/, family: 'clip-vision-g' },
  { folder: 'clip_vision', stem: /^sigclip_vision_patch14_384\.safetensors$/, family: 'siglip-384' },
  { folder: 'style_models', stem: /^flux1-redux-dev\.safetensors$/, family: 'flux1-redux' },
  // FLUX.2: dev (its Mistral Small encoder, whose Tekken tokenizer the synthetic file carries too, and its turbo
  // LoRAs) and Klein (4B and 9B, base and distilled, the KV variant) with its Qwen3 encoders (CLIPLoader type
  // `flux2`; the 8B file is Qwen3's shape at another width); the FLUX.2 VAE (the small-decoder release too).
  { folder: 'diffusion_models', stem: /^flux2_dev[_.]/i, family: 'flux2-dev' },
  { folder: 'text_encoders', stem: /^mistral_3_small_flux2[_.]/i, family: 'mistral3' },
  { folder: 'loras', stem: /flux[_-]?2.*lora|flux2turbo/i, family: 'flux2-lora' },
  { folder: 'diffusion_models', stem: /^flux-2-klein-(base-)?9b/i, family: 'flux2-klein-9b' },
  { folder: 'diffusion_models', stem: /^flux-2-klein-/i, family: 'flux2' },
  { folder: 'text_encoders', stem: /^qwen_3_8b[_.]/, family: 'qwen3' },
  { folder: 'vae', stem: /^(flux2-vae|full_encoder_small_decoder)\.safetensors$/, family: 'flux2-vae' },
  // Wan 2.1 and 2.2: the DiTs by variant (the 2.1 T2V 14B and the A14B T2V experts share a structure; the high-
  // and low-noise experts differ only in their weights), umT5-XXL (CLIPLoader type `wan`), the Wan 2.2 VAE, and
  // the step-distillation and CausVid LoRAs (the tiny 14B and 1.3B DiTs share their widths).
  { folder: 'diffusion_models', stem: /^wan2\.1_t2v_1\.3B[_.]/i, family: 'wan21-t2v-1.3b' },
  // Causal Forcing: Wan 2.1 T2V 1.3B's weights, marked causal in the file's metadata (the ar_video sampler).
  { folder: 'diffusion_models', stem: /^causal_forcing-(framewise|chunkwise)[_.]/i, family: 'wan21-causal-t2v-1.3b' },
  { folder: 'diffusion_models', stem: /^wan2\.1_t2v_14B[_.]/i, family: 'wan22-t2v-a14b' },
  { folder: 'diffusion_models', stem: /^(wan2\.1_i2v_(480p|720p)_14B|Wan2_1-I2V-14B-(480p|720p))[_.]/i, family: 'wan21-i2v-14b' },
  { folder: 'diffusion_models', stem: /^wan2\.1_flf2v_720p_14B[_.]/i, family: 'wan21-flf2v-14b' },
  { folder: 'diffusion_models', stem: /^wan2\.2_ti2v_5B[_.]/i, family: 'wan22-ti2v-5b' },
  { folder: 'diffusion_models', stem: /^wan2\.2_t2v_(high|low)_noise_14B[_.]/i, family: 'wan22-t2v-a14b' },
  // Bernini-R: a fine-tune of the A14B T2V pair that reads BerniniConditioning's in-context latents.
  { folder: 'diffusion_models', stem: /^wan2\.2_bernini_r_(high|low)_noise[_.]/i, family: 'wan22-t2v-a14b' },
  { folder: 'diffusion_models', stem: /^wan2\.2_(i2v|fun_inpaint)_(high|low)_noise_14B[_.]/i, family: 'wan22-i2v-a14b' },
  // Wan 2.1 Fun InP 1.3B: the I2V structure (36 channels in, the CLIP branch) at 1.3B's widths.
  { folder: 'diffusion_models', stem: /^wan2\.1_fun_inp_1\.3B[_.]/i, family: 'wan21-i2v-14b' },
  // The Fun Control models (2.1 1.3B with the CLIP branch; 2.2 A14B and 5B with the reference convolution) and
  // 2.2 Fun InP 5B.
  { folder: 'diffusion_models', stem: /^wan2\.1_fun_control_1\.3B[_.]/i, family: 'wan21-fun-control-1.3b' },
  { folder: 'diffusion_models', stem: /^wan2\.2_fun_control_(high|low)_noise_14B[_.]/i, family: 'wan22-fun-control-a14b' },
  { folder: 'diffusion_models', stem: /^wan2\.2_fun_control_5B[_.]/i, family: 'wan22-fun-control-5b' },
  { folder: 'diffusion_models', stem: /^wan2\.2_fun_inpaint_5B[_.]/i, family: 'wan22-fun-inpaint-5b' },
  // Wan 2.1 VACE 14B (the 14B T2V structure and the VACE branch).
  { folder: 'diffusion_models', stem: /^wan2\.1_vace_14B[_.]/i, family: 'wan21-vace-14b' },
  // HuMo 17B (a Wan 2.1 14B body with HuMo's audio branch) and the Whisper large-v3 encoder whose states it reads.
  { folder: 'diffusion_models', stem: /^humo_17B[_.]/i, family: 'humo-17b' },
  // Wan 2.2 S2V 14B (a Wan 2.1 14B body with S2V's audio encoder and injectors, frame packer and control encoder).
  { folder: 'diffusion_models', stem: /^wan2\.2_s2v_14B[_.]/i, family: 'wan22-s2v-14b' },
  // Wan Animate 2 (and its distilled release): Wan 2.1 I2V 14B's structure, marked Animate 2 in its metadata.
  { folder: 'diffusion_models', stem: /^wan_animate_2(_distill)?[_.]/i, family: 'wan21-animate2-14b' },
  // WanDancer's global and local models (Wan 2.1 I2V 14B's structure with the music branch).
  { folder: 'diffusion_models', stem: /^wan2\.2_dancer_14b_(global|local)[_.]/i, family: 'wan22-dancer-14b' },
  { folder: 'audio_encoders', stem: /^whisper_large_v3[_.]/i, family: 'whisper-large-v3' },
  // The wav2vec2 encoders of Wan 2.2 S2V (large, English) and InfiniteTalk (base, Chinese).
  { folder: 'audio_encoders', stem: /^wav2vec2_large_english[_.]/i, family: 'wav2vec2-large-english' },
  { folder: 'audio_encoders', stem: /^wav2vec2-chinese-base[_.]/i, family: 'wav2vec2-chinese-base' },
  // InfiniteTalk's patches for Wan 2.1 I2V 14B (one speaker, two speakers: one layout).
  { folder: 'model_patches', stem: /^wan2\.1_infiniteTalk_(single|multi)[_.]/i, family: 'wan21-infinitetalk' },
  // The Fun Camera models: 2.1 (1.3B and 14B, whose tiny widths are the same) with the CLIP branch, 2.2's A14B
  // experts without it.
  { folder: 'diffusion_models', stem: /^wan2\.1_fun_camera_v1\.1_(1\.3B|14B)[_.]/i, family: 'wan21-fun-camera-1.3b' },
  { folder: 'diffusion_models', stem: /^wan2\.2_fun_camera_(high|low)_noise_14B[_.]/i, family: 'wan22-fun-camera-a14b' },
  // ChronoEdit 14B, ATI 14B and Wan Move: finetunes of Wan 2.1 I2V 14B (its structure, the CLIP branch; ATI's and
  // Wan Move's tracks enter through the conditioning latent), and ChronoEdit's distillation LoRA.
  { folder: 'diffusion_models', stem: /^(chrono_edit_14B|Wan2_1-I2V-ATI-14B|Wan21-WanMove)[_.]/i, family: 'wan21-i2v-14b' },
  { folder: 'text_encoders', stem: /^umt5_xxl_(fp16|bf16|fp8_e4m3fn_scaled)\.safetensors$/, family: 'umt5-xxl' },
  { folder: 'vae', stem: /^wan2\.2_vae\.safetensors$/, family: 'wan22-vae' },
  { folder: 'loras', stem: /lightx2v|causvid|^chronoedit_distill_lora/i, family: 'wan21-lora' },
  // Wan-Alpha (RGBA video from Wan 2.1 T2V 14B): a DoRA on the DiT (written here as a plain LoRA of the same
  // layout; DoRA's magnitudes go through the same adapter code, tested on its own) and two Wan 2.1 VAEs whose
  // decoders were tuned for the RGB and the alpha channel.
  { folder: 'loras', stem: /^wan_alpha_2\.1_rgba_lora\.safetensors$/, family: 'wan21-lora' },
  { folder: 'vae', stem: /^wan_alpha_2\.1_vae_(rgb|alpha)_channel\.safetensors$/, family: 'wan21-vae' },
  // The Z-Image Fun ControlNet's first release (its 2.1 releases are refused by name).
  { folder: 'model_patches', stem: /^z-image-turbo-fun-controlnet-union\.safetensors$/i, family: 'z-image-fun-controlnet' },
  // Lotus depth (SD 2's UNet, discrete-time sampling) and the SD VAE its templates decode with (f32 as released).
  { folder: 'diffusion_models', stem: /^lotus-depth-d-v1-1[_.]/i, family: 'lotus-depth' },
  { folder: 'vae', stem: /^vae-ft-mse-840000-ema-pruned\.safetensors$/, family: 'sd-vae', dtype: 'f32' },
  // SDXL 1.0's all-in-one checkpoints (UNet, CLIP-L and OpenCLIP's CLIP-G, SD VAE), SDXL Turbo's (the base's
  // shape) and the refiner's (CLIP-G alone).
  { folder: 'checkpoints', stem: /^sd_xl_(base_1\.0|turbo_1\.0)[_.]/i, family: 'sdxl' },
  { folder: 'checkpoints', stem: /^sd_xl_refiner_1\.0[_.]/i, family: 'sdxl-refiner' },
  // SD3.5 Large's all-in-one checkpoint (the MMDiT, CLIP-L, CLIP-G and T5-XXL, the 16-channel VAE).
  { folder: 'checkpoints', stem: /^sd3\.5_large_fp8_scaled\.safetensors$/, family: 'sd3.5' },
  // Ovis-Image's DiT (FLUX.1 with SwiGLU MLPs) and Ovis 2.5, a Qwen3 file CLIPLoader's type `ovis` makes its encoder.
  { folder: 'diffusion_models', stem: /^ovis_image_/i, family: 'ovis-image' },
  { folder: 'text_encoders', stem: /^ovis_2\.5\.safetensors$/, family: 'qwen3' },
  // Its ControlNets (the control type is in the file).
  { folder: 'controlnet', stem: /^sd3\.5_large_controlnet_blur\.safetensors$/, family: 'sd3.5-controlnet-blur' },
  { folder: 'controlnet', stem: /^sd3\.5_large_controlnet_canny\.safetensors$/, family: 'sd3.5-controlnet-canny' },
  { folder: 'controlnet', stem: /^sd3\.5_large_controlnet_depth\.safetensors$/, family: 'sd3.5-controlnet-depth' },
  // Kandinsky 5 Lite's image DiT (its encoders: the Qwen2.5-VL and CLIP-L above; the Flux VAE).
  { folder: 'diffusion_models', stem: /^kandinsky5lite_t2i\.safetensors$/, family: 'kandinsky5-image' },
  // Anima (Cosmos Predict2's DiT with an LLM adapter), its turbo LoRA, and Qwen3 0.6B, which ComfyUI makes its
  // encoder by its width (so the tiny one is 1024 wide); its VAE is Qwen-Image's (Wan 2.1's) above.
  { folder: 'diffusion_models', stem: /^anima-(preview|base)/i, family: 'anima' },
  { folder: 'loras', stem: /^anima-turbo-lora/i, family: 'anima-lora' },
  { folder: 'text_encoders', stem: /^qwen_3_06b_base\.safetensors$/, family: 'qwen3-0.6b' },
  // Anima's ControlNet-LLLites: the control image's (canny, depth, ...) and the inpainting one, which reads a mask.
  { folder: 'model_patches', stem: /^anima-lllite-inpainting/i, family: 'anima-lllite-inpaint' },
  { folder: 'model_patches', stem: /^anima-lllite-/i, family: 'anima-lllite' },
  // Lumina Image 2.0's all-in-one checkpoints (NetaYume Lumina: the NextDiT, Gemma 2 2B with its SentencePiece
  // model, the Flux VAE), and Gemma 2 2B on its own (CLIPLoader type `lumina2`).
  { folder: 'checkpoints', stem: /^netayume.*all_in_one|^lumina_2[_.]/i, family: 'lumina2' },
  { folder: 'text_encoders', stem: /^gemma_2_2b[_.]/i, family: 'gemma2-2b' },
  // OmniGen2's DiT and its Qwen2.5-VL 3B (two key/value heads make it OmniGen2's encoder whatever CLIPLoader's
  // type); the Flux VAE.
  { folder: 'diffusion_models', stem: /^omnigen2[_.]/i, family: 'omnigen2' },
  { folder: 'text_encoders', stem: /^qwen_2\.5_vl_fp16\.safetensors$/, family: 'qwen25vl-3b' },
  // Boogu-Image's DiT (OmniGen2's with double-stream blocks) and Qwen3-VL 8B, which CLIPLoader's type `boogu`
  // makes its encoder (the tiny Qwen3-VL 4B file stands in, the DiT reading its width).
  { folder: 'diffusion_models', stem: /^boogu_image_/i, family: 'boogu' },
  { folder: 'text_encoders', stem: /^qwen3vl_8b[_.]/i, family: 'qwen3vl-4b' },
  // Krea 2's single-stream DiT and its LoRAs, on Qwen3-VL 4B (a transformers-layout file CLIPLoader's type
  // `krea2` makes its encoder) and the Qwen-Image VAE above; Mage-Flow's MMDiT (Qwen-Image's blocks at patch 1) and
  // its one-step diffusion VAE, on the same Qwen3-VL 4B (type `mage`).
  { folder: 'diffusion_models', stem: /^krea2_/i, family: 'krea2' },
  { folder: 'loras', stem: /^krea2_/i, family: 'krea2-lora' },
  { folder: 'text_encoders', stem: /^qwen3vl_4b[_.]/i, family: 'qwen3vl-4b' },
  { folder: 'diffusion_models', stem: /^mage_flow_/i, family: 'mage-flow' },
  { folder: 'vae', stem: /^mage_flow_vae[_.]/i, family: 'mage-flow-vae' },
  // JoyAI Image Edit's MMDiT (Wan 2.1's latent space) on Qwen3-VL 8B, which CLIPLoader's type `joyimage` makes its
  // encoder (the qwen3vl_8b rule above: the tiny 4B stands in).
  { folder: 'diffusion_models', stem: /^joyai_image_edit/i, family: 'joyimage' },
  // ERNIE-Image (and Turbo): its single-stream DiT in FLUX.2's latent space, on Ministral 3 3B (the file alone
  // makes it ERNIE-Image's encoder; the prompt enhancer is another Ministral 3 3B, which TextGenerate runs).
  { folder: 'diffusion_models', stem: /^ernie-image/i, family: 'ernie-image' },
  { folder: 'text_encoders', stem: /^(ministral-3-3b|ernie-image-prompt-enhancer)[_.]/i, family: 'ministral3-3b' },
  // PixelDiT: its pixel-space DiT (patch tokens, then per-pixel blocks) on Gemma 2 2B (the gemma_2_2b rule above;
  // CLIPLoader type `pixeldit`), with VAELoader's `pixel_space`.
  { folder: 'diffusion_models', stem: /^pixeldit_/i, family: 'pixeldit' },
  // HunyuanVideo 1.5 (text and image to video, 720p) and Capybara (its architecture: image and video editing,
  // text to image), their 32-channel, 16× VAE, and ByT5 small glyph, the second of their text encoders
  // (DualCLIPLoader type `hunyuan_video_15`, beside the Qwen2.5-VL 7B above).
  { folder: 'diffusion_models', stem: /^hunyuanvideo1\.5_(480p|720p)_(t2v|i2v)[_.]/i, family: 'hunyuan-video15' },
  { folder: 'diffusion_models', stem: /^capybara_v0\.1[_.]/i, family: 'hunyuan-video15' },
  { folder: 'vae', stem: /^hunyuanvideo15_vae[_.]/i, family: 'hunyuan-video15-vae' },
  { folder: 'text_encoders', stem: /^byt5_small_glyphxl[_.]/i, family: 'byt5-small-glyph' },
  // HunyuanVideo 1.0's text-to-video DiT and its VAE (which Kandinsky 5's video models use too); its text encoders
  // are CLIP-L and LLaVA-Llama 3 8B (DualCLIPLoader type `hunyuan_video`).
  { folder: 'diffusion_models', stem: /^hunyuan_video_t2v_720p[_.]/i, family: 'hunyuan-video' },
  { folder: 'vae', stem: /^hunyuan_video_vae[_.]/i, family: 'hunyuan-video-vae' },
  { folder: 'text_encoders', stem: /^llava_llama3[_.]/i, family: 'llama3' },
  // Kandinsky 5 Lite's video DiTs (text and image to video), on the Qwen2.5-VL and CLIP-L above.
  { folder: 'diffusion_models', stem: /^kandinsky5lite_(t2v|i2v)[_.]/i, family: 'kandinsky5-video' },
];

/** Weight formats Kiln cannot read yet, by what the file name says. */
const unsupportedFormats = [
  [/nvfp4_awq|(?<!nv)fp4|w4a8|gptq|awq/i, '4-bit'],
  [/\.gguf$/i, 'GGUF'],
  [/\.(ckpt|pt|pth|bin)$/i, 'pickle'],
];

/** Model families by file name, first match wins: the report's groups, and what a `missing family` names. */
const familyRules = [
  [/z[_-]?image|pid_flux1/i, 'Z-Image'],
  [/^qwen_3_/i, 'Qwen3 text encoder'],
  [/qwen[_-]?image[_-]?2\.1|qwen3\.5_9b_qwen_image_2\.1/i, 'Qwen-Image 2.1'],
  [/qwen[_-]?image|qwen-edit|qwen_edit|firered|gummycandy_qwen|illustration-1\.0-qwen|qwen-360|marigold/i, 'Qwen-Image'],
  [/flux[-_]?2|flux\.2/i, 'Flux.2'],
  [/flux3/i, 'FLUX 3'],
  [/chroma/i, 'Chroma'],
  [/flux|uso-flux1|removal_timestep/i, 'Flux.1'],
  [/wan2|wan_2|wan21|wan_alpha|wan_animate|humo_|chrono_?edit|causal_forcing|lightx2v|causvid/i, 'Wan 2.x'],
  [/ltx-?2|ltx2|ltx_2/i, 'LTX-2.x'],
  [/ltx-video/i, 'LTX-Video 0.9'],
  [/hunyuan3d|hunyuan_3d/i, 'Hunyuan3D'],
  [/hunyuan/i, 'HunyuanVideo'],
  [/hidream/i, 'HiDream'],
  [/sd_xl|sdxl|svd_xt|clip_vision_g/i, 'SDXL'],
  [/sd3\.5|sd3/i, 'SD3.5'],
  [/lotus|vae-ft-mse-840000/i, 'Lotus depth'],
  [/ace_?step|acestep|ace_1\.5|ace15/i, 'ACE-Step'],
  [/stable[-_]audio/i, 'Stable Audio'],
  [/minimax_h3|fasth3/i, 'MiniMax H3'],
  [/minimax_music/i, 'MiniMax Music 3'],
  [/anima/i, 'Anima'],
  [/moss_image/i, 'MOSS-Image'],
  [/mage_flow/i, 'Mage-Flow'],
  [/capybara/i, 'Capybara'],
  [/kandinsky/i, 'Kandinsky 5'],
  [/boogu/i, 'Boogu'],
  [/krea2/i, 'Krea 2'],
  [/omnigen/i, 'OmniGen2'],
  [/seedvr/i, 'SeedVR2'],
  [/lens_/i, 'Lens'],
  [/ernie/i, 'ERNIE-Image'],
  [/fibo/i, 'Fibo 2'],
  [/ideogram/i, 'Ideogram 4'],
  [/ming_image/i, 'Ming Image'],
  [/longcat/i, 'LongCat'],
  [/newbie/i, 'NewBie'],
  [/pixeldit/i, 'PixelDiT'],
  [/ovis/i, 'Ovis-Image'],
  [/joyai|joyimage/i, 'JoyAI Image Edit'],
  [/netayume|lumina/i, 'Lumina 2'],
  [/yue2|sheetsage/i, 'YuE2'],
  [/trellis|pixal3d|triposplat|sam_3d/i, '3D (TRELLIS.2, Pixal3D, TripoSplat, SAM 3D)'],
  [/moge/i, 'MoGe'],
  [/sam3/i, 'SAM3'],
  [/sdpose/i, 'SDPose'],
  [/depth_anything/i, 'Depth Anything 3'],
  [/birefnet/i, 'BiRefNet'],
  [/esrgan/i, 'ESRGAN upscalers'],
  [/film_net|rife/i, 'Frame interpolation'],
  [/void_pass|cogvideox/i, 'VOID'],
  [/gemma|qwen3\.5|qwen3vl|gpt_oss|llama/i, 'LLM'],
  [/^ae\.safetensors$/i, 'Flux VAE'],
];

/** The family of a model file by its name, or `other (<name>)`. */
export function familyOf(name) {
  const base = name.split(/[\\/]/).pop();
  return familyRules.find(([rule]) => rule.test(base))?.[1] ?? `other (${base})`;
}

/** The format Kiln cannot read that a file name says the file has, or null. */
function unsupportedFormat(name) {
  return unsupportedFormats.find(([rule]) => rule.test(name))?.[1] ?? null;
}

/**
 * What Kiln makes of `file` (`{ name, folder }`) in a template whose main model is `main` (a file name, see
 * `mainModel`): `{ family, dtype, under }` to write with `kiln model synth` (`under`: a subfolder to write it in
 * instead, which the template's prompt is pointed at), `{ family, unsupported }` for a file of a family Kiln runs
 * in a format it cannot read yet, or null for a family Kiln does not run.
 */
export function kilnFile(file, main = '') {
  const base = file.name.split(/[\\/]/).pop();
  const mainBase = main.split(/[\\/]/).pop();
  const known = kilnFiles.find(
    (k) => k.folder === file.folder && k.stem.test(base) && (!k.beside || k.beside.test(mainBase)),
  );
  if (!known) return null;
  const unsupported = unsupportedFormat(base);
  if (unsupported) return { family: known.family, unsupported };
  const under = known.under ?? null;
  if (known.dtype) return { family: known.family, dtype: known.dtype, under };
  // A plain `fp8` is e4m3fn, as ComfyUI's fp8 files are; `_scaled` and `mixed` files carry per-tensor scales
  // in ComfyUI's two encodings; `int8`/`convrot` files are ComfyUI's int8 with ConvRot, `mxfp8` its MXFP8 and
  // `nvfp4` its NVFP4 (AWQ-smoothed `nvfp4_awq` and the other 4-bit formats are refused).
  const dtypes = [
    [/int8|convrot/i, 'int8_convrot'],
    [/mxfp8/i, 'mxfp8'],
    [/nvfp4/i, 'nvfp4'],
    [/fp8_?mixed/i, 'fp8_mixed'],
    [/_scaled/i, 'fp8_scaled'],
    [/fp8_e5m2/, 'fp8_e5m2'],
    [/fp8/, 'fp8_e4m3fn'],
    [/fp32/, 'f32'],
    [/fp16/, 'f16'],
  ];
  return { family: known.family, dtype: dtypes.find(([rule]) => rule.test(base))?.[1] ?? 'bf16', under };
}

/**
 * The model files the nodes of a converted template name (`nodes` as `convertInPage` gives them), each once:
 * `{ name, folder }` (folder null when neither the template nor the widget says it).
 */
export function modelFiles(nodes) {
  const files = new Map();
  for (const node of nodes) {
    const folders = new Map(node.models.map((m) => [m.name, m.directory]));
    const named = node.known
      ? node.widgets.filter(([, value]) => typeof value === 'string')
      : node.values.filter((value) => typeof value === 'string').map((value) => [null, value]);
    for (const [widget, value] of named) {
      if (!modelFile.test(value)) continue;
      const folder =
        folders.get(value) ?? nodeWidgetFolders[`${node.type}.${widget}`] ?? widgetFolders[widget] ?? null;
      const key = `${folder}/${value}`;
      if (!files.has(key)) files.set(key, { name: value, folder });
    }
  }
  return [...files.values()];
}

/** A template's main model file name (a file in a main model folder, else any file's), or ''. */
export function mainModel(files) {
  return (files.find((f) => mainFolders.includes(f.folder)) ?? files[0])?.name ?? '';
}

/** A template's family: its main model's, else `No model`. */
export function templateFamily(files) {
  const main = mainModel(files);
  return main ? familyOf(main) : 'No model';
}
